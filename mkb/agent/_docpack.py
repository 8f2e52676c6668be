"""Where an attempt's DSL doc pack comes from and what version it is (the version is part of every coordinate)."""

from __future__ import annotations

from pathlib import Path


def doc_pack_dir(dsl: str) -> Path:
    from mkb.dsl import get_backend

    folder = get_backend(dsl).doc_pack()
    if folder is None or not Path(folder).is_dir():
        raise FileNotFoundError(f"no doc pack for DSL {dsl!r}\nhint: run `mkb-run docpack build --dsl {dsl}`")
    return Path(folder)


def doc_pack_version(dsl: str) -> str:
    from mkb.dsl import get_backend

    return get_backend(dsl).doc_pack_version()
