"""`pack_dataset`: a run's store handed back as one tar.gz of compacted files that read the same rows."""

from __future__ import annotations

import tarfile

import pytest

from mkb.events import EventWriter, pack_dataset, read


def _store_of_small_files(url: str, n: int) -> None:
    for k in range(n):  # one writer per event: n files per kind, as a run's flushes leave them
        with EventWriter(url) as w:
            w.emit("annotation", target_attempt_id=f"t{k}", label="clean", reason="r", annotator="a")


def test_a_store_of_many_small_files_is_packed_compacted_with_the_same_rows(tmp_path):
    url = tmp_path / "ds"
    _store_of_small_files(str(url), 5)
    before = read("annotation", str(url)).sort("event_id")
    assert len(list((url / "kind=annotation").glob("*.parquet"))) == 5
    out = pack_dataset(url, tmp_path / "events.tar.gz", arcname="h200-test")
    with tarfile.open(out) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "x", filter="data")
    assert [n for n in names if n.endswith(".parquet")] and all(n.startswith("h200-test") for n in names)
    assert len([n for n in names if n.endswith(".parquet")]) == 1  # one file for the kind
    assert not any("_leases" in n for n in names)  # the compaction's lease records describe this host only
    assert read("annotation", str(tmp_path / "x" / "h200-test")).sort("event_id").equals(before)
    assert not (tmp_path / "events.tar.gz.tmp").exists()


def test_packing_again_replaces_the_tar_whole_and_a_missing_store_is_named(tmp_path):
    url = tmp_path / "ds"
    _store_of_small_files(str(url), 2)
    tar_path = pack_dataset(url, tmp_path / "events.tar.gz", arcname="d")
    _store_of_small_files(str(url), 1)  # the run wrote more after its first save
    pack_dataset(url, tar_path, arcname="d")
    with tarfile.open(tar_path) as tar:
        tar.extractall(tmp_path / "y", filter="data")
    assert read("annotation", str(tmp_path / "y" / "d")).height == 3
    with pytest.raises(FileNotFoundError, match="no event store at .*hint"):
        pack_dataset(tmp_path / "missing", tmp_path / "m.tar.gz", arcname="m")


def test_a_host_without_polars_packs_the_files_as_written_and_says_how_to_compact(tmp_path, monkeypatch):
    """The lent H200 hosts have pyarrow but not polars: the run's dataset is packed whole, not lost to the import."""
    import mkb.events._pack as P

    url = tmp_path / "ds"
    _store_of_small_files(str(url), 3)
    before = read("annotation", str(url)).sort("event_id")
    monkeypatch.setattr(P, "_can_compact", lambda: False)
    said: list[str] = []
    out = pack_dataset(url, tmp_path / "events.tar.gz", arcname="h200-raw", log=said.append)
    with tarfile.open(out) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    assert len(list((tmp_path / "x" / "h200-raw" / "kind=annotation").glob("*.parquet"))) == 3  # as written
    assert read("annotation", str(tmp_path / "x" / "h200-raw")).sort("event_id").equals(before)
    assert len(said) == 1 and "not compacted" in said[0] and "mkb-run compact" in said[0]
