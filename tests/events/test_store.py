"""Where events go: --store / MKB_STORE resolution and the places mkb refuses to write."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from mkb.events import EventWriter, StoreError, resolve_store


def test_default_store_is_events_local_under_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MKB_STORE", raising=False)
    store = resolve_store(for_writing=True)
    assert store.root == str(tmp_path.resolve() / "events" / "local")
    assert store.is_local


def test_mkb_store_environment_variable_is_used_when_no_url_is_given(tmp_path, monkeypatch):
    monkeypatch.setenv("MKB_STORE", str(tmp_path / "elsewhere"))
    assert resolve_store().root == str((tmp_path / "elsewhere").resolve())
    assert resolve_store(str(tmp_path / "explicit")).root == str((tmp_path / "explicit").resolve())


def test_hf_urls_are_refused_as_append_targets_with_a_hint():
    with pytest.raises(StoreError, match=r"not a live append target[\s\S]*hint: .*mkb-analyze export"):
        resolve_store("hf://datasets/someone/mkb-events", for_writing=True)


def test_an_installed_mkb_never_writes_into_site_packages(monkeypatch):
    site = Path(sysconfig.get_paths()["purelib"])
    monkeypatch.chdir(site)
    monkeypatch.delenv("MKB_STORE", raising=False)
    with pytest.raises(StoreError, match=r"inside the installed package area[\s\S]*hint: .*--store"):
        EventWriter()
    assert not (site / "events").exists()


def test_staging_lies_outside_the_dataset(tmp_path):
    store = resolve_store(str(tmp_path / "events" / "local"))
    assert Path(store.staging_dir()) == tmp_path.resolve() / "events" / ".staging" / "local"
    assert not Path(store.staging_dir()).is_relative_to(Path(store.root))


def test_clean_staging_removes_only_old_leftovers(tmp_path):
    import os
    import time

    from mkb.events._compact import clean_staging

    store = resolve_store(str(tmp_path / "ds"))
    os.makedirs(store.staging_dir())
    old, young = (Path(store.staging_dir()) / n for n in ("a.parquet.1.x.partial", "b.parquet.2.y.partial"))
    old.write_bytes(b"half")
    young.write_bytes(b"half")
    past = time.time() - 7200
    os.utime(old, (past, past))
    assert clean_staging(store) == [str(old)]
    assert young.exists() and not old.exists()


def test_polars_schema_matches_the_arrow_schema_for_every_kind():
    import polars as pl

    from mkb.events import schemas

    for kind, sc in schemas().items():
        assert sc.polars() == dict(pl.Schema(pl.from_arrow(sc.arrow().empty_table()).schema)), kind


@pytest.mark.parametrize("url", ["events/local", "./a/b", "../a/b/", "~/x", "//tmp//a/./b/", "a b/c"])
def test_a_local_path_resolves_where_fsspec_resolves_it(url, tmp_path, monkeypatch):
    """A plain local path skips fsspec (_store._LocalFS): the same root as url_to_fs's path made absolute, and a
    filesystem that lists, writes and reads there like fsspec's own."""
    import fsspec

    (tmp_path / "w").mkdir()
    monkeypatch.chdir(tmp_path / "w")
    store = resolve_store(url)
    fs, root = fsspec.core.url_to_fs(url)
    assert store.root == str(Path(root).expanduser().resolve()).rstrip("/")
    assert store.is_local and isinstance(store.filesystem(), type(fs))  # the real one, for isinstance and pyarrow
    assert resolve_store(Path(url)).root == store.root  # a pathlib.Path names the same store
    assert resolve_store(f"file://{store.root}").root == store.root  # a file:// URL still goes through fsspec
    import copy
    import pickle

    assert pickle.loads(pickle.dumps(store)) == store == copy.deepcopy(store)  # as fsspec's cached filesystems compare
    here = resolve_store(str(tmp_path / "w" / "s"))
    here.fs.makedirs(f"{here.root}/kind=demo", exist_ok=True)
    here.fs.pipe_file(f"{here.root}/kind=demo/x.bin", b"12")
    assert here.kinds() == ["demo"] and here.fs.cat_file(f"{here.root}/kind=demo/x.bin") == b"12"


def test_reading_a_local_store_imports_no_fsspec(tmp_path):
    """fsspec's import (~40 ms: its registry, asyncio) is left to the stores that need it: a local store is listed and
    read without it."""
    import subprocess
    import sys

    from mkb.analysis.synthetic import SynthSpec, write_synthetic

    write_synthetic(SynthSpec(n_problems=4, replicates=1), str(tmp_path / "s"))
    code = ("import sys\nfrom mkb.analysis import load_tables\n"
            f"t = load_tables({str(tmp_path / 's')!r})\nassert t.attempts.height > 0\nprint('fsspec' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.stdout.strip() == "False"


def test_a_memory_listing_raced_by_removals_lists_again_instead_of_raising(monkeypatch):
    """memory:// copies its key names and then looks each up; a file removed in between raised KeyError in a compactor
    claiming a lease (CI). Here a removal lands inside every first listing: `Store.ls` lists again and sees the rest."""
    import uuid

    store = resolve_store(f"memory://mkb-{uuid.uuid4().hex}", for_writing=True)
    folder = f"{store.root}/_leases/x"
    for i in range(4):
        store.fs.pipe_file(f"{folder}/{i:012d}.claim", b"{}")
    real_ls, calls = type(store.fs).ls, []

    def ls_raced(self, path, detail=True, **kw):
        calls.append(path)
        if len(calls) == 1:  # the removal happens after the key names were copied, before they are looked up
            victim = f"{folder}/000000000000.claim"
            keys = [k for k in self.store if k.startswith(folder)]
            self.rm_file(victim)
            return [{"name": k, "size": self.store[k].size} for k in keys]  # the KeyError fsspec raises here
        return real_ls(self, path, detail=detail, **kw)

    monkeypatch.setattr(type(store.fs), "ls", ls_raced)
    names = sorted(p.rsplit("/", 1)[-1] for p in store.ls(folder))
    assert names == [f"{i:012d}.claim" for i in (1, 2, 3)]
    assert len(calls) == 2

    def always(self, path, detail=True, **kw):
        raise KeyError(path)

    monkeypatch.setattr(type(store.fs), "ls", always)
    with pytest.raises(KeyError):  # a filesystem that keeps raising is not hidden
        store.ls(folder)
