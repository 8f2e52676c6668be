"""Locates the data folders (`schemas/`, `problems/`) in a source checkout and in an installed wheel."""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PKG = Path(__file__).resolve().parent


@cache
def data_dir(name: str) -> Path:
    """The folder `name` shipped with mkb.

    A wheel carries the repository's top-level `schemas/` and `problems/` under `mkb/_data/`
    (hatch force-include); a source checkout or editable install has them beside `mkb/`.
    Both are looked up here so that no other module knows which case it is in.
    """
    for candidate in (_PKG / "_data" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"mkb data folder {name!r} not found under {_PKG / '_data'} or {_PKG.parent}.\n"
        "hint: reinstall mkb (the wheel carries it under mkb/_data) or run from a source checkout."
    )
