"""Publishes one file into a store atomically and exclusively: readers see all of it or nothing, and nothing is overwritten.

Local disk: the bytes go to a staging folder beside the dataset (never inside it: polars would scan
a temp file), are fsynced, then hard-linked to the final name (link fails if the name exists, so it
is an exclusive create), and the folder is fsynced. Filesystems without hard links (some FUSE, SMB,
exFAT mounts) use renameat2(RENAME_NOREPLACE); where that is missing too, an O_EXCL placeholder is
created and atomically replaced, so for an instant an empty file is visible (readers skip and
report it). Object stores: one PUT with If-None-Match: * through fsspec's `pipe_file(mode="create")`,
after a one-time probe that the backend really refuses a second create (some S3-compatible
servers ignore the header; writing to one would silently overwrite).
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import warnings

from mkb.events._ids import uuid7
from mkb.events._store import Store

# errnos meaning "this filesystem cannot hard-link", not "the name exists"
_NO_LINK = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK}


class ExclusiveCreateUnsupported(OSError):
    """The backend cannot create a file only if it is absent, so writing could overwrite."""


def already_exists(target: str) -> FileExistsError:
    return FileExistsError(errno.EEXIST, f"event file {target} already exists; mkb never overwrites\nhint: every flush gets a fresh uuid7 name; do not reuse names", target)


# ---------------------------------------------------------------- local


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_fully(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


_libc = None


def _rename_noreplace(src: str, dst: str) -> bool:
    """renameat2(RENAME_NOREPLACE); False when the kernel or filesystem lacks it."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        fn = _libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_noreplace = -100, 1
    if fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), rename_noreplace) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EEXIST:
        raise already_exists(dst)
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), dst)


def _publish_local(src: str, dst: str) -> str:
    """Move the fsynced staging file `src` to `dst` without ever replacing an existing `dst`; returns the method used."""
    try:
        os.link(src, dst)
        return "link"
    except FileExistsError:
        raise already_exists(dst) from None
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            raise OSError(
                errno.EXDEV, f"staging folder {os.path.dirname(src)} is on another filesystem than {dst}\n"
                "hint: make the store a folder inside a filesystem, not a mount point itself",
            ) from None
        if exc.errno not in _NO_LINK:
            raise
    if _rename_noreplace(src, dst):
        return "renameat2"
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # claims the name, or FileExistsError
    os.close(fd)
    os.replace(src, dst)
    return "placeholder"


def _commit_local(store: Store, target: str, data: bytes) -> None:
    folder = os.path.dirname(target)
    staging = store.staging_dir()
    os.makedirs(staging, exist_ok=True)
    os.makedirs(folder, exist_ok=True)
    if os.path.exists(target):
        raise already_exists(target)
    tmp = os.path.join(staging, f"{os.path.basename(target)}.{os.getpid()}.{uuid7()[-12:]}.partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            _write_fully(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        _publish_local(tmp, target)
        _fsync_dir(folder)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


# ---------------------------------------------------------------- object stores

_probed: dict[tuple, bool] = {}
_probe_lock = threading.Lock()


def _is_precondition_failure(exc: BaseException) -> bool:
    """s3fs maps a 412 to FileExistsError on some servers and to a bare OSError(EINVAL) on others (SeaweedFS)."""
    if isinstance(exc, FileExistsError):
        return True
    for e in (exc, exc.__cause__, exc.__context__):
        resp = getattr(e, "response", None)
        if isinstance(resp, dict):
            code = resp.get("Error", {}).get("Code")
            status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                return True
    return "pre-conditions you specified did not hold" in str(exc)


def _create(fs, path: str, data: bytes) -> None:
    try:
        fs.pipe_file(path, data, mode="create")
    except TypeError as exc:
        if "mode" in str(exc):
            raise ExclusiveCreateUnsupported(
                f"{type(fs).__name__}.pipe_file has no exclusive mode, so mkb cannot append to {path} without risking an overwrite\n"
                "hint: upgrade fsspec and the backend package (s3fs >= 2024.12 supports it), or write to a local store"
            ) from None
        raise
    except Exception as exc:
        if _is_precondition_failure(exc):
            raise already_exists(path) from None
        raise


def probe_exclusive_create(store: Store) -> None:
    """Check once per backend and bucket that a second exclusive create of one key is refused.

    moto >= 5.1, SeaweedFS 4.x and AWS S3 refuse it (HTTP 412); a server that ignores If-None-Match
    would accept it and a writer there could overwrite; that is refused here, before any event is written.
    """
    key = (type(store.fs).__name__, store.url.split("/")[0], store.root.split("/")[0])
    with _probe_lock:
        if _probed.get(key):
            return
        path = f"{store.root}/.mkb-probe/{uuid7()}"
        _create(store.fs, path, b"1")
        try:
            try:
                _create(store.fs, path, b"2")
            except FileExistsError:
                _probed[key] = True
                return
            raise ExclusiveCreateUnsupported(
                f"{store.url}: the backend accepted a second exclusive create of {path} (it ignores If-None-Match), so writers could overwrite each other\n"
                "hint: use AWS S3, a server that supports conditional writes (moto >= 5.1, SeaweedFS, MinIO), or a local store"
            )
        finally:
            try:
                store.fs.rm_file(path)
            except Exception as exc:  # the probe object is outside every kind= folder; readers never see it
                warnings.warn(f"mkb: could not remove probe object {path}: {exc}", stacklevel=2)


def commit(store: Store, target: str, data: bytes) -> None:
    """Make `data` visible at `target` in one step, or raise (FileExistsError if `target` exists) leaving nothing visible."""
    if store.is_local:
        _commit_local(store, target, data)
        return
    probe_exclusive_create(store)
    parent = target.rsplit("/", 1)[0]
    try:
        store.fs.makedirs(parent, exist_ok=True)  # a no-op on object stores; creates pseudo-dirs on memory://
    except Exception:
        pass
    _create(store.fs, target, data)
