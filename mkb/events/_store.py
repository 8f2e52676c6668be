"""Resolves where events live: a dataset root URL on any fsspec filesystem."""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import fsspec

DEFAULT_STORE = "events/local"
ENV_VAR = "MKB_STORE"
READ_ONLY_PROTOCOLS = ("hf",)
LS_ATTEMPTS = 20  # memory:// listings raced by removals (Store.ls)


class StoreError(ValueError):
    """The store URL cannot be used the way it was asked for."""


@dataclass(frozen=True)
class Store:
    """A dataset root: `<root>/kind=<kind>/<uuid7>.parquet` below it."""

    url: str
    # an fsspec filesystem, or for a plain local path `_LocalFS`: a stand-in that forwards every method to fsspec's
    # LocalFileSystem (imported on first use) but is no instance of it; pass `filesystem()` where a real one is needed
    fs: fsspec.AbstractFileSystem
    root: str  # path within fs, no trailing slash

    def filesystem(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem itself (a local store's `fs` is only a stand-in for method calls): for code that
        checks its type or hands it to another library (pyarrow's `filesystem=`, isinstance checks)."""
        if isinstance(self.fs, _LocalFS):
            from fsspec.implementations.local import LocalFileSystem

            return LocalFileSystem()
        return self.fs

    @property
    def is_local(self) -> bool:
        return "file" in _protocols(self.fs)

    def kind_dir(self, kind: str) -> str:
        return f"{self.root}/kind={kind}"

    def ls(self, path: str, *, detail: bool = False, refresh: bool = False) -> list:
        """fsspec's `ls(path)`, listed again when memory:// raced a removal: its listing copies the key names, then
        looks each one up, so a file another thread removes in between raises KeyError (a lease claim, a compacted
        segment) where a real filesystem would simply not list it."""
        kw = {"refresh": True} if refresh else {}
        for attempt in range(LS_ATTEMPTS):
            try:
                return self.fs.ls(path, detail=detail, **kw)
            except KeyError:
                if attempt == LS_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def kinds(self) -> list[str]:
        """The kinds that have a folder in this store."""
        try:
            entries = self.ls(self.root)
        except FileNotFoundError:
            return []
        names = (str(p).rstrip("/").rsplit("/", 1)[-1] for p in entries)
        return sorted(n[len("kind="):] for n in names if n.startswith("kind="))

    def require_exists(self) -> None:
        """Raise StoreError naming the path when a local store folder does not exist: a typo must not read as "no data".

        Object stores have no folders (an empty prefix and a missing one look alike), so only local paths are checked.
        """
        if self.is_local and not os.path.isdir(self.root):
            raise StoreError(
                f"store {self.root} does not exist\n"
                "hint: check the path (--store / $MKB_STORE); a store is created by its first write"
            )

    def staging_dir(self) -> str:
        """Local staging lies beside the dataset, never inside it, so readers cannot see torn files."""
        parent, name = os.path.split(self.root)
        return os.path.join(parent, ".staging", name)


class _LocalFS:
    """fsspec's local filesystem, made the first time anything but its protocol is asked of it.

    A local store is listed (os.scandir) and read (polars opens the paths) without fsspec, and fsspec's import (its
    registry, asyncio, ssl: ~40 ms) was a tenth of a local `mkb-analyze lift` at 1M events spent before any event was read.
    Writers, indexes and the torch_compile reader ask for methods: those come from the real filesystem, imported then.
    """

    protocol = ("file", "local")  # LocalFileSystem.protocol: what `_protocols` and `Store.is_local` read

    def __reduce__(self) -> str:
        return "_LOCAL"  # one instance, pickled and copied by name: stores compare equal across processes, as fsspec's do

    def __getattr__(self, name: str):
        from fsspec.implementations.local import LocalFileSystem

        return getattr(LocalFileSystem(), name)  # fsspec caches the instance: one filesystem, as url_to_fs gives


_LOCAL = _LocalFS()


def _local_path(url: str) -> bool:
    """Whether url_to_fs would take `url` for a plain local path (no protocol, chain, or file:/local:/data: prefix)."""
    return "://" not in url and "::" not in url and not url.startswith(("file:", "local:", "data:"))


def _protocols(fs) -> tuple[str, ...]:
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


def _package_dirs() -> list[str]:
    """Folders an installed mkb lives in; events are never written below them."""
    import mkb

    dirs = {str(Path(mkb.__file__).resolve().parent)}
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            dirs.add(str(Path(p).resolve()))
    return sorted(dirs)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _read_only(url: str) -> StoreError:
    return StoreError(
        f"{url!r} is readable but not a live append target (the Hub limits commits per hour)\n"
        "hint: write to a local or object-store dataset and publish it with `mkb-analyze export`"
    )


def resolve_store(url: str | os.PathLike | Store | None = None, *, for_writing: bool = False) -> Store:
    """The store `url` names, else $MKB_STORE, else `events/local` under the working directory.

    A relative local path is taken against the working directory, never the package, so an
    installed mkb writes where the user runs it and not into site-packages; a path that still
    lands in site-packages (or the package folder) is refused for writing.
    """
    if isinstance(url, Store):
        return url
    url = os.fspath(url) if url else (os.environ.get(ENV_VAR) or DEFAULT_STORE)  # a pathlib.Path names a local store
    if for_writing and url.split("://", 1)[0] in READ_ONLY_PROTOCOLS:  # before url_to_fs: huggingface_hub may not be installed
        raise _read_only(url)
    if _local_path(url):
        fs, root = _LOCAL, url  # url_to_fs's LocalFileSystem and path, made absolute and resolved below alike
    else:
        import fsspec

        fs, root = fsspec.core.url_to_fs(url)
    if "file" in _protocols(fs):
        root = str(Path(root).expanduser().resolve())
        if for_writing:
            for folder in _package_dirs():
                if _inside(root, folder):
                    raise StoreError(
                        f"refusing to write events to {root}: it is inside the installed package area {folder}\n"
                        f"hint: run from a project folder, or pass --store / set {ENV_VAR} to a writable dataset folder"
                    )
    if for_writing and any(p in READ_ONLY_PROTOCOLS for p in _protocols(fs)):
        raise _read_only(url)
    return Store(url=url, fs=fs, root=root.rstrip("/"))
