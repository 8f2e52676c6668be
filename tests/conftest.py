"""What every test folder shares: loading one of the repository's scripts (benchmarks/, scripts/) as a module."""

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo_script():
    """`repo_script("benchmarks/x.py")` -> the script as a module: scripts are files, not a package, and their tests
    call their functions. Registered in sys.modules (a script's dataclasses resolve their module through it)."""

    def load(rel: str):
        path = REPO / rel
        spec = importlib.util.spec_from_file_location(f"_mkb_script_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        return mod

    return load
