"""Skips `dsl`-marked tests where the CuTe DSL / TVM packages are not installed (checked without importing them)."""

from __future__ import annotations

import importlib.util

import pytest


def _have(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


HAVE_DSLS = _have("cutlass") and _have("tvm") and _have("torch")


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs nvidia-cutlass-dsl and apache-tvm (pip install mkb[dsl])")
    for item in items:
        if "dsl" in item.keywords and not HAVE_DSLS and str(item.fspath).startswith(str(__file__).rsplit("/", 1)[0]):
            item.add_marker(skip)
