"""Publishing one file: the local fallbacks when hard links are missing, and backends that cannot create exclusively."""

from __future__ import annotations

import errno
import os

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

import mkb.events._commit as commit_mod
from mkb.events import EventWriter, ExclusiveCreateUnsupported, Store, read, resolve_store


def _no_links(*_a, **_k):
    raise OSError(errno.EPERM, "Operation not permitted (no hard links here)")


@pytest.mark.parametrize("fallback", ["renameat2", "placeholder"])
def test_local_publish_without_hard_links_still_never_overwrites(tmp_path, monkeypatch, fallback):
    monkeypatch.setattr(commit_mod.os, "link", _no_links)
    if fallback == "placeholder":
        monkeypatch.setattr(commit_mod, "_rename_noreplace", lambda src, dst: False)
    url = str(tmp_path / "ds")
    with EventWriter(url) as w:
        w.emit("annotation", target_attempt_id="t", label="clean", reason="r", annotator="a")
    [path] = w.files_written
    before = open(path, "rb").read()
    store = resolve_store(url)
    with pytest.raises(FileExistsError, match="never overwrites"):
        commit_mod.commit(store, path, b"other bytes")
    assert open(path, "rb").read() == before
    assert read("annotation", url).height == 1
    assert os.listdir(store.staging_dir()) == []  # nothing left behind in staging


def test_renameat2_refuses_an_existing_target(tmp_path):
    src, dst = tmp_path / "a", tmp_path / "b"
    src.write_bytes(b"new")
    dst.write_bytes(b"old")
    try:
        ok = commit_mod._rename_noreplace(str(src), str(dst))
    except FileExistsError:
        ok = None
    if ok is False:
        pytest.skip("renameat2 unavailable on this kernel/filesystem")
    assert ok is None and dst.read_bytes() == b"old"


class _SilentOverwriteFS(MemoryFileSystem):
    """A backend that ignores the exclusive flag, as some S3-compatible servers ignore If-None-Match."""

    protocol = ("lyingmem",)

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        return super().pipe_file(path, value, mode="overwrite", **kwargs)


def test_a_backend_that_ignores_exclusive_create_is_refused_before_anything_is_written():
    fs = _SilentOverwriteFS(skip_instance_cache=True)
    store = Store(url="lyingmem://bucket/ds", fs=fs, root="/bucket/ds")
    w = EventWriter(store)
    w.emit("annotation", target_attempt_id="t", label="clean", reason="r", annotator="a")
    with pytest.raises(ExclusiveCreateUnsupported, match=r"ignores If-None-Match[\s\S]*hint:"):
        w.flush()
    assert not fs.exists("/bucket/ds/kind=annotation")
    assert not fs.find("/bucket/ds/.mkb-probe")


def test_an_object_store_flush_that_fails_keeps_the_buffer_for_a_retry(monkeypatch):
    url = "memory://mkb-retry/ds"
    w = EventWriter(url)
    w.emit("annotation", target_attempt_id="t", label="clean", reason="r", annotator="a")
    real = commit_mod._create
    calls = {"n": 0}

    def flaky(fs, path, data):
        if ".mkb-probe" not in path and calls["n"] == 0:
            calls["n"] += 1
            raise ConnectionError("network down")
        return real(fs, path, data)

    monkeypatch.setattr(commit_mod, "_create", flaky)
    with pytest.raises(ConnectionError):
        w.flush()
    assert w.flush() and read("annotation", url).height == 1
    fsspec.filesystem("memory").rm("/mkb-retry", recursive=True)


def test_a_put_that_landed_but_reported_failure_is_not_written_twice(monkeypatch):
    url = "memory://mkb-landed/ds"
    w = EventWriter(url)
    w.emit("annotation", target_attempt_id="t", label="clean", reason="r", annotator="a")
    real = commit_mod._create
    calls = {"n": 0}

    def lands_then_times_out(fs, path, data):
        real(fs, path, data)
        if ".mkb-probe" not in path and calls["n"] == 0:
            calls["n"] += 1
            raise TimeoutError("read timeout after the server stored the object")

    monkeypatch.setattr(commit_mod, "_create", lands_then_times_out)
    with pytest.raises(TimeoutError):
        w.flush()
    assert w.pending_events == 1
    w.flush()  # retried under the same name: the existing identical object counts as done
    assert w.pending_events == 0
    assert read("annotation", url, dedupe=False).height == 1
    assert len(fsspec.filesystem("memory").ls("/mkb-landed/ds/kind=annotation")) == 1
    fsspec.filesystem("memory").rm("/mkb-landed", recursive=True)
