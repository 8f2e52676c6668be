"""load_tables(columns="lift"), what lift, standing, power and report read: the same pairs (less their attempt ids) and figures as the full tables."""

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from mkb.analysis import BootstrapSpec, lift_table, load_tables, standing_table
from mkb.analysis._tables import LIFT_COLUMNS, PAIR_IDS, PAIR_UNREAD, _text

PAIR_KEY = ["stratum", "model", "problem", "replicate", "target_dsl", "arm_kind"]  # one pair per block and arm


def test_lean_tables_hold_the_same_pairs_and_lift_columns(planted_lift):
    full, lean = load_tables(planted_lift.store), load_tables(planted_lift.store, columns="lift")
    assert lean.attempts.columns == list(LIFT_COLUMNS) and len(full.attempts.columns) > len(LIFT_COLUMNS) + 20
    assert_frame_equal(_text(lean.attempts).sort(LIFT_COLUMNS), full.attempts.select(LIFT_COLUMNS).sort(LIFT_COLUMNS))
    assert_frame_equal(_text(lean.pairs).sort(PAIR_KEY), full.pairs.drop(*PAIR_IDS, *PAIR_UNREAD).sort(PAIR_KEY))
    assert not set(PAIR_IDS) & set(lean.pairs.columns) and not set(PAIR_UNREAD) & set(lean.pairs.columns)
    assert not any(ty == pl.String for ty in lean.pairs.schema.values())  # the lean pairs' text is categoricals
    assert lean.summary() == full.summary() and lean.verdict_note() == full.verdict_note()
    spec = BootstrapSpec(seed=4, resamples=300)
    assert_frame_equal(lift_table(lean.pairs, spec=spec, pooled=True), lift_table(full.pairs, spec=spec, pooled=True))
    assert_frame_equal(standing_table(lean.pairs, spec=spec), standing_table(full.pairs, spec=spec))
    # every table made from the lean (categorical) pairs holds the text the full pairs give
    from mkb.analysis import contrast_table, power_table, problem_table, variance_components

    assert_frame_equal(lift_table(lean.pairs, by=("family",), spec=spec, tests=False),
                       lift_table(full.pairs, by=("family",), spec=spec, tests=False))
    assert_frame_equal(standing_table(lean.pairs, spec=spec, pooled=False, naive=True, over_directions=True),
                       standing_table(full.pairs, spec=spec, pooled=False, naive=True, over_directions=True))
    assert_frame_equal(contrast_table(lean.pairs, spec=spec), contrast_table(full.pairs, spec=spec))
    for fn in (problem_table, variance_components):
        assert_frame_equal(fn(lean.pairs), fn(full.pairs))
    lt = lift_table(full.pairs, spec=spec, tests=False)
    assert_frame_equal(power_table(lt, lean.pairs), power_table(lt, full.pairs))


def test_lean_tables_still_refuse_mixed_versions_and_stratify(tmp_path):
    from mkb.analysis import MixedVersionsError
    from mkb.analysis.synthetic import SynthSpec, write_synthetic

    store = str(tmp_path / "mixed")
    base = dict(models=("m",), model_means=(0.6,), n_problems=6, replicates=3)
    write_synthetic(SynthSpec(seed=1, **base), store)
    write_synthetic(SynthSpec(seed=2, grader_version="grader-2", experiment="again", **base), store)
    with pytest.raises(MixedVersionsError, match="grader_version"):
        load_tables(store, columns="lift")
    full, lean = load_tables(store, stratify=True), load_tables(store, stratify=True, columns="lift")
    assert lean.stratified and sorted(lean.attempts["stratum"].unique()) == sorted(full.attempts["stratum"].unique())
    assert any("grader=grader-2" in x for x in lean.attempts["stratum"].unique())
    assert_frame_equal(_text(lean.pairs).sort(PAIR_KEY), full.pairs.drop(*PAIR_IDS, *PAIR_UNREAD).sort(PAIR_KEY))


def test_unknown_columns_mode_is_refused():
    with pytest.raises(ValueError, match="'all' or 'lift'"):
        load_tables("/nonexistent", columns="some")


def _load_paths(monkeypatch):
    """The key paths load_tables took: True for the hashed ids, False for the text ids."""
    import mkb.analysis._tables as T

    taken, inner = [], T._load_tables

    def spy(*a, **k):
        taken.append(k["hashed"])
        return inner(*a, **k)

    monkeypatch.setattr(T, "_load_tables", spy)
    return taken


def _text_tables(store, monkeypatch):
    """The lean tables built on the text ids (the hashed path refused)."""
    import mkb.analysis._tables as T

    def clash(*a, **k):
        raise T._KeyClash

    with monkeypatch.context() as m:
        m.setattr(T, "_id_key", clash)
        return load_tables(store, columns="lift")


def test_hashed_ids_build_the_tables_the_text_ids_build(planted_lift, monkeypatch):
    taken = _load_paths(monkeypatch)
    hashed = load_tables(planted_lift.store, columns="lift")
    assert taken == [True]
    text = _text_tables(planted_lift.store, monkeypatch)
    assert taken[1:] == [True, False]
    assert_frame_equal(_text(hashed.attempts), _text(text.attempts))
    assert_frame_equal(_text(hashed.pairs), _text(text.pairs))
    assert hashed.summary() == text.summary() and hashed.event_counts == text.event_counts


def _dup_store(tmp_path, *, orphan: bool, twice: bool):
    from tests.analysis.test_defects import _attempt
    from mkb.events import EventWriter

    store = str(tmp_path / f"ds-{orphan}-{twice}")
    with EventWriter(store) as w:
        for p in (1, 2, 3):
            for r in (0, 1, 2):
                _attempt(w, f"c{p}{r}", problem=p, tgt="cute", arm="solo", r=r, speedup=[0.6, 1.2, 2.5][(p + r) % 3])
                _attempt(w, f"t{p}{r}", problem=p, tgt="tirx", arm="solo", r=r, speedup=[0.6, 1.2, 2.5][(p + 2 * r) % 3])
                _attempt(w, f"x{p}{r}", problem=p, tgt="tirx", arm="transfer", r=r, src="cute", src_attempt=f"c{p}{r}",
                         speedup=2.5 if p != 2 else None)
        if orphan:  # a verdict and a finish of an attempt that never started (the text ids join it to nothing)
            w.emit("attempt_finished", attempt_id="orphan", status="infra_error")
            w.emit("verdict", attempt_id="orphan", scope="pair", problem=1, dsl="tirx", passed=False, s=0.0, gpu="H200")
        if twice:  # an attempt started twice (a retried write): the text path keeps its first
            _attempt(w, "x11", problem=1, tgt="tirx", arm="transfer", r=1, src="cute", src_attempt="c11", speedup=2.5)
    return store


def test_a_clash_of_the_first_hash_falls_back_to_the_text_ids(tmp_path, monkeypatch):
    import mkb.analysis._tables as T

    store = _dup_store(tmp_path, orphan=True, twice=False)
    text = _text_tables(store, monkeypatch)
    real = T._id_key

    def weak(col, seed):  # the orphan's first hash is that of a started attempt's id; its second hash is its own
        return pl.when(pl.col(col) == "orphan").then(pl.lit("x21").hash(seed)).otherwise(real(col, seed)) if seed == 0 else real(col, seed)

    monkeypatch.setattr(T, "_id_key", weak)
    taken = _load_paths(monkeypatch)
    got = load_tables(store, columns="lift")
    assert taken == [True, False]  # the clash was seen, and the text ids built the tables
    assert_frame_equal(_text(got.attempts), _text(text.attempts))
    assert_frame_equal(_text(got.pairs), _text(text.pairs))


@pytest.mark.parametrize("case", ["weak", "twice"])
def test_ids_that_share_a_key_or_start_twice_are_read_as_text(tmp_path, monkeypatch, case):
    import mkb.analysis._tables as T

    store = _dup_store(tmp_path, orphan=False, twice=case == "twice")
    text = _text_tables(store, monkeypatch)
    if case == "weak":  # every id of 7 keys: started ids share them
        real = T._id_key
        monkeypatch.setattr(T, "_id_key", lambda col, seed: real(col, seed) % 7 if seed == 0 else real(col, seed))
    taken = _load_paths(monkeypatch)
    got = load_tables(store, columns="lift")
    assert taken == [True, False]
    # (an attempt started twice leaves the rows' order to the de-duplication: compared as sets of rows)
    assert_frame_equal(_text(got.attempts).sort(pl.all()), _text(text.attempts).sort(pl.all()))
    assert_frame_equal(_text(got.pairs).sort(pl.all()), _text(text.pairs).sort(pl.all()))
    assert got.attempts.height == 27


def _mixed_store(tmp_path):
    from mkb.analysis.synthetic import SynthSpec, write_synthetic

    store = str(tmp_path / "mixed")
    base = dict(models=("m", "n"), model_means=(0.6, 0.5), n_problems=6, replicates=4)
    write_synthetic(SynthSpec(seed=1, **base), store)
    write_synthetic(SynthSpec(seed=2, grader_version="grader-2", experiment="again", **base), store)
    return store


@pytest.mark.parametrize("case", ["planted", "stratified"])
def test_blocks_joined_by_packed_keys_pair_as_by_their_columns(planted_lift, tmp_path, monkeypatch, case):
    """build_pairs joins blocks by one packed integer; the same pairs as joined by the columns (the struct fallback)."""
    import mkb.analysis._tables as T

    store, kw = (planted_lift.store, {}) if case == "planted" else (_mixed_store(tmp_path), {"stratify": True})
    packed = {c: load_tables(store, columns=c, **kw) for c in ("all", "lift")}
    init = T._BlockKeys.__init__

    def unpacked(self, attempts):
        init(self, attempts)
        assert self.packed  # the data fit: the packed path was the one taken above
        self.packed = False

    monkeypatch.setattr(T._BlockKeys, "__init__", unpacked)
    for c, t in packed.items():
        other = load_tables(store, columns=c, **kw)
        assert_frame_equal(_text(t.pairs).sort(pl.all()), _text(other.pairs).sort(pl.all()))
        assert t.pairs.height > 0 and (_text(t.pairs)["arm_kind"] == "solo_noise").any()


def test_summary_is_counted_once_per_attempts_frame(planted_lift):
    """The header, the verdict note and the output all ask for the counts: kept for the same attempts frame, counted
    again for another (a command that replaces or clears the attempts never reads stale counts)."""
    t = load_tables(planted_lift.store, columns="lift")
    first = t.summary()
    first["attempts"] = -1  # a caller's copy: changing it changes nothing kept
    assert t.summary()["attempts"] == t.attempts.height > 0
    t.attempts = t.attempts.filter(pl.col("excluded").is_null())
    assert t.summary()["attempts"] == t.summary()["included"] == t.attempts.height
    t.attempts = t.attempts.clear()
    assert t.summary()["attempts"] == 0
