"""load_tables reads each kind batch by batch (mkb.events.read_batches) and keeps only what the tables need of a batch:
the tables and every figure are the same whether a kind is read in one batch or in many."""

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import mkb.analysis._tables as tables_mod
from mkb.analysis._tables import _text
from mkb.analysis import BootstrapSpec, contrast_table, lift_table, load_tables, standing_table
from mkb.analysis.synthetic import SynthSpec, write_synthetic


@pytest.fixture(scope="module")
def many_files(tmp_path_factory):
    """Attempt-only verdicts beside pair re-grades, flagged skills, exclusions, and ~20 files per large kind."""
    spec = SynthSpec(seed=31, models=("m-a", "m-b"), model_means=(0.45, 0.7), n_problems=12, replicates=3,
                     p_infra=0.02, p_unfinished=0.02, n_annotated=3, p_pair_regrade=0.6, p_skill_flagged=0.2)
    res = write_synthetic(spec, str(tmp_path_factory.mktemp("batched") / "ds"), chunk=40)
    assert len(res.files) > 80
    return res.store


def _load(store, batch_rows, monkeypatch, **kw):
    monkeypatch.setattr(tables_mod, "READ_BATCH_ROWS", batch_rows)
    return load_tables(store, **kw)


@pytest.mark.parametrize("columns", ["all", "lift"])
def test_tables_read_in_many_batches_equal_those_read_in_one(many_files, monkeypatch, columns):
    one = _load(many_files, 10**12, monkeypatch, columns=columns)  # every kind in one batch: the whole-table path
    many = _load(many_files, 50, monkeypatch, columns=columns)  # ~one file a batch
    assert_frame_equal(_text(many.attempts), _text(one.attempts))
    assert_frame_equal(_text(many.pairs), _text(one.pairs))
    assert many.summary() == one.summary() and many.event_counts == one.event_counts
    assert one.summary()["verdict_attempt"] > 0 and one.pairs["skill_flagged"].any()  # both verdict paths and the flag are exercised
    spec = BootstrapSpec(seed=7, resamples=400)
    assert_frame_equal(lift_table(many.pairs, spec=spec, pooled=True), lift_table(one.pairs, spec=spec, pooled=True))
    assert_frame_equal(contrast_table(many.pairs, spec=spec), contrast_table(one.pairs, spec=spec))
    assert_frame_equal(standing_table(many.pairs, spec=spec), standing_table(one.pairs, spec=spec))


def test_lean_tables_carry_text_not_categoricals(many_files, monkeypatch):
    """The few-valued columns are categoricals only while the full tables are built: they hold text, as before; the lean
    tables keep their text as categoricals (what lift reads at scale), and every table made from them holds text."""
    for columns in ("all", "lift"):
        t = _load(many_files, 50, monkeypatch, columns=columns)
        if columns == "all":
            for df in (t.attempts, t.pairs):
                assert not [c for c, ty in df.schema.items() if isinstance(ty, pl.Categorical)]
            assert t.attempts.schema["model"] == pl.String
        else:
            for df in (t.attempts, t.pairs):
                assert not [c for c, ty in df.schema.items() if ty == pl.String]
                assert isinstance(df.schema["model"], pl.Categorical)
            assert t.pairs.schema["direction"] == t.pairs.schema["model"]
            for table in (lift_table(t.pairs, spec=BootstrapSpec(seed=1, resamples=50), pooled=True),
                          contrast_table(t.pairs, spec=BootstrapSpec(seed=1, resamples=50))):
                assert not [c for c, ty in table.schema.items() if isinstance(ty, pl.Categorical)]


def test_a_corrupt_file_found_while_reading_is_named_in_the_tables(many_files, tmp_path, monkeypatch):
    import shutil
    from pathlib import Path

    store = tmp_path / "copy"
    shutil.copytree(many_files, store)
    victim = sorted((store / "kind=attempt_finished").glob("*.parquet"))[3]
    data = victim.read_bytes()
    footer = int.from_bytes(data[-8:-4], "little") + 8
    victim.write_bytes(data[:4] + bytes((b * 7 + 13) & 0xFF for b in data[4:len(data) - footer - 1]) + data[len(data) - footer - 1:])
    with pytest.warns(UserWarning, match="corrupt data pages"):
        t = _load(str(store), 50, monkeypatch, columns="lift")
    assert any(Path(p).name == victim.name and "corrupt data pages" in why for p, why in t.skipped_files.items())


@pytest.mark.parametrize("p_flagged", [0.0, 0.2])
def test_lean_tables_mark_flagged_skills_as_the_full_tables_do_with_or_without_any(tmp_path, p_flagged):
    """The lean tables read the skills' hashes only when a flag is raised (a first read of the flags alone): with none,
    no attempt is marked; with some, the same attempts as the full tables' join by hash."""
    spec = SynthSpec(seed=5, models=("m",), model_means=(0.5,), n_problems=10, replicates=3, p_skill_flagged=p_flagged)
    store = write_synthetic(spec, str(tmp_path / "ds")).store
    full, lean = load_tables(store), load_tables(store, columns="lift")
    cols = ["model", "problem", "replicate", "target_dsl", "arm_kind", "skill_flagged"]
    assert_frame_equal(_text(lean.attempts).select(cols).sort(cols), full.attempts.select(cols).sort(cols))
    assert_frame_equal(_text(lean.pairs).select(cols).sort(cols), full.pairs.select(cols).sort(cols))
    assert lean.pairs["skill_flagged"].any() == (p_flagged > 0) and full.attempts["skill_sha256"].is_not_null().any()
