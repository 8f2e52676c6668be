"""Packs a local event store as one tar.gz of compacted files: how a run hands its dataset back to be committed."""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path

from mkb.events._compact import compact


def _can_compact() -> bool:
    """Whether this host has what the store's compaction reads with (polars; a GPU host may have pyarrow only)."""
    try:
        import polars  # noqa: F401
    except ImportError:
        return False
    return True


def pack_dataset(store: str | os.PathLike, tar_path: str | os.PathLike, *, arcname: str, log=print) -> Path:
    """Compact `store` (the store's own compaction, no grace: nothing else reads it now) and write it to `tar_path`
    under the folder `arcname`, beside the old copy and renamed over it, so a run killed mid-write keeps the last whole
    one. Returns `tar_path`.

    Why compacted: a run's writer flushes many small files (up to 57 per kind in a committed dataset), each with its own
    schema and footer; one file per kind reads the same rows at about a quarter of the bytes (the committed datasets:
    46.7 -> 23.7 MB of tree with their logs), and every GPU call carries the tree beside a wheel part under 64 MiB.
    The lease records a compaction leaves are dropped when the store had none before (they describe this host only).
    Where polars is missing (the lent H200 hosts have pyarrow only) the files are packed as written, and `log` says
    so with the command that compacts them once extracted: a run's dataset is never lost to packing it."""
    root = Path(store)
    if not root.is_dir():
        raise FileNotFoundError(f"no event store at {root}; hint: pass the folder the run's EventWriter wrote")
    had_leases = (root / "_leases").exists()
    if _can_compact():
        compact(str(root), grace_s=0)
        if not had_leases:
            shutil.rmtree(root / "_leases", ignore_errors=True)
    else:
        log(f"[pack] {root}: packed as written, not compacted (no polars on this host); hint: once extracted, run "
            f"`mkb-run compact --store <the extracted folder> --grace-s 0` (and remove its `_leases`) before committing it")
    tar_path = Path(tar_path)
    tmp = tar_path.with_name(tar_path.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(root, arcname=arcname)
    os.replace(tmp, tar_path)
    return tar_path
