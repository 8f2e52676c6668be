"""load_tables(columns="lift"), what lift, standing, power and report read: the same pairs (less their attempt ids) and figures as the full tables."""

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from mkb.analysis import BootstrapSpec, lift_table, load_tables, standing_table
from mkb.analysis._tables import LIFT_COLUMNS, PAIR_IDS

PAIR_KEY = ["stratum", "model", "problem", "replicate", "target_dsl", "arm_kind"]  # one pair per block and arm


def test_lean_tables_hold_the_same_pairs_and_lift_columns(planted_lift):
    full, lean = load_tables(planted_lift.store), load_tables(planted_lift.store, columns="lift")
    assert lean.attempts.columns == list(LIFT_COLUMNS) and len(full.attempts.columns) > len(LIFT_COLUMNS) + 20
    assert_frame_equal(lean.attempts.sort("attempt_id"), full.attempts.select(LIFT_COLUMNS).sort("attempt_id"))
    assert_frame_equal(lean.pairs.sort(PAIR_KEY), full.pairs.drop(PAIR_IDS).sort(PAIR_KEY))
    assert not set(PAIR_IDS) & set(lean.pairs.columns)
    assert lean.summary() == full.summary() and lean.verdict_note() == full.verdict_note()
    spec = BootstrapSpec(seed=4, resamples=300)
    assert_frame_equal(lift_table(lean.pairs, spec=spec, pooled=True), lift_table(full.pairs, spec=spec, pooled=True))
    assert_frame_equal(standing_table(lean.pairs, spec=spec), standing_table(full.pairs, spec=spec))


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
    assert_frame_equal(lean.pairs.sort(PAIR_KEY), full.pairs.drop(PAIR_IDS).sort(PAIR_KEY))


def test_unknown_columns_mode_is_refused():
    with pytest.raises(ValueError, match="'all' or 'lift'"):
        load_tables("/nonexistent", columns="some")
