"""Resolves where events live: a dataset root URL on any fsspec filesystem."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import fsspec

DEFAULT_STORE = "events/local"
ENV_VAR = "MKB_STORE"
READ_ONLY_PROTOCOLS = ("hf",)


@dataclass(frozen=True)
class Store:
    """A dataset root: `<root>/kind=<kind>/<uuid7>.parquet` below it."""

    url: str
    fs: fsspec.AbstractFileSystem
    root: str  # path within fs, no trailing slash

    @property
    def is_local(self) -> bool:
        return "file" in _protocols(self.fs)

    def kind_dir(self, kind: str) -> str:
        return f"{self.root}/kind={kind}"

    def staging_dir(self) -> str:
        """Local staging lies beside the dataset, never inside it, so readers cannot see torn files."""
        parent, name = os.path.split(self.root)
        return os.path.join(parent, ".staging", name)


def _protocols(fs) -> tuple[str, ...]:
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


def resolve_store(url: str | None = None, *, for_writing: bool = False) -> Store:
    """The store `url` names, else $MKB_STORE, else `events/local` under the working directory.

    A relative local path is taken against the working directory, never the package, so an
    installed mkb writes where the user runs it and not into site-packages.
    """
    url = url or os.environ.get(ENV_VAR) or DEFAULT_STORE
    fs, root = fsspec.core.url_to_fs(url)
    if "file" in _protocols(fs):
        root = str(Path(root).expanduser().resolve())
        import mkb

        pkg = str(Path(mkb.__file__).resolve().parent)
        if for_writing and "site-packages" in pkg and root.startswith(pkg):
            raise ValueError(f"refusing to write events into the installed package at {root}\nhint: pass --store or set {ENV_VAR}")
    if for_writing and any(p in READ_ONLY_PROTOCOLS for p in _protocols(fs)):
        raise ValueError(
            f"{url!r} is readable but not a live append target (the Hub limits commits per hour)\n"
            "hint: write to a local or object-store dataset and publish it with `mkb-analyze export`"
        )
    return Store(url=url, fs=fs, root=root.rstrip("/"))
