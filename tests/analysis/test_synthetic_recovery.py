"""Planted truths in synthetic datasets are recovered by the analysis (fixed seeds)."""

import numpy as np
import polars as pl

from mkb.analysis import BootstrapSpec, lift_table, load_tables, standing_table
from mkb.analysis.synthetic import (
    ARM_KINDS, SynthSpec, s_of_z, standing_effect_numpy, true_regression_share, true_relative_lift,
    true_standing_effect, write_synthetic,
)

SPEC = BootstrapSpec(seed=5, resamples=4000)


def test_attempt_s_equals_the_planted_latent_score(planted_lift):
    t = load_tables(planted_lift.store)
    sim = planted_lift.simulation
    s = s_of_z(sim.z)
    inc = t.included.filter(pl.col("verdict_source") == "pair")  # the attempt verdicts carry timing jitter
    assert inc.height > 3500
    spec = sim.spec
    exp = [s[spec.models.index(r["model"]), r["problem"] - 1, spec.dsls.index(r["target_dsl"]), r["replicate"],
             ARM_KINDS.index(r["arm_kind"])] for r in inc.iter_rows(named=True)]
    assert np.array_equal(inc["S"].to_numpy(), np.array(exp))


def test_exclusions_are_reported_not_dropped(planted_lift):
    t = load_tables(planted_lift.store)
    s = t.summary()
    assert s["infra_error"] == len(planted_lift.infra) > 0
    assert s["unfinished"] == len(planted_lift.unfinished) > 0
    assert s["annotated"] == len(planted_lift.annotated) > 0
    assert s["attempts"] == 2 * 74 * 3 * 10
    excluded = set(t.attempts.filter(pl.col("excluded").is_not_null())["attempt_id"])
    assert set(planted_lift.annotated) <= excluded
    assert not (set(t.pairs["attempt_id"]) | set(t.pairs["base_attempt"])) & excluded
    assert s["verdict_attempt"] > 0 and s["verdict_pair"] > 0  # p_pair_regrade=0.9: both sources occur


def test_planted_relative_lift_is_inside_the_bootstrap_ci(planted_lift):
    t = load_tables(planted_lift.store)
    lt = lift_table(t.pairs, spec=SPEC)
    truth = true_relative_lift(planted_lift.simulation)
    tr = lt.filter(pl.col("arm_kind") == "transfer")
    assert tr.height == 4
    for r in tr.iter_rows(named=True):
        true = truth[(r["model"], r["source_dsl"], r["target_dsl"])]
        assert true > 0.12
        assert r["rel_lo"] <= true <= r["rel_hi"], (r, true)
        assert r["rel_lo"] > 0  # detected
        assert 0.05 < r["rel_halfwidth"] < 0.15  # DESIGN: about +-8 to +-11 points at 74 x 3
    placebo = lt.filter(pl.col("arm_kind") == "placebo")
    assert all(r["rel_lo"] <= 0 <= r["rel_hi"] for r in placebo.iter_rows(named=True))


def test_planted_regression_share_is_recovered(tmp_path):
    spec = SynthSpec(seed=3, n_problems=74, replicates=3, models=("m",), model_means=(0.8,), noise=0.4,
                     effects={"transfer": 1.2, "placebo": 0.0, "same": 0.0, "wrong": 0.0}, harmed_share=0.3)
    res = write_synthetic(spec, str(tmp_path / "ds"))
    t = load_tables(str(tmp_path / "ds"))
    lt = lift_table(t.pairs, spec=SPEC).filter(pl.col("arm_kind") == "transfer")
    truth = true_regression_share(res.simulation)
    for r in lt.iter_rows(named=True):
        true = truth[(r["model"], r["target_dsl"])]
        assert 0.2 < true < 0.32
        assert abs(r["regression_rate"] - true) < 0.09, (r["regression_rate"], true)
        assert abs(r["regression_rate"] + r["improvement_rate"] + r["tie_rate"] - 1) < 1e-12


def test_planted_standing_effect_is_recovered(tmp_path):
    spec = SynthSpec(seed=9, standing_slope=1.0, noise=0.8, effects={"transfer": 0.2, "placebo": 0.0, "same": 0.0, "wrong": 0.0})
    res = write_synthetic(spec, str(tmp_path / "ds"))
    t = load_tables(str(tmp_path / "ds"))
    st = standing_table(t.pairs, spec=SPEC)
    truth = true_standing_effect(res.simulation, n_mc=1000)
    assert truth > 0.2
    tr = st.filter(pl.col("arm_kind") == "transfer")
    for r in tr.iter_rows(named=True):
        assert r["effect_lo"] <= truth <= r["effect_hi"], (r["effect"], r["effect_lo"], r["effect_hi"], truth)
        assert r["effect_lo"] > 0
    # the placebo and the noise floor carry no planted standing effect
    for kind in ("placebo", "solo_noise"):
        for r in st.filter(pl.col("arm_kind") == kind).iter_rows(named=True):
            assert r["effect_lo"] <= 0 <= r["effect_hi"], (kind, r)


def test_corrected_standing_shows_no_effect_where_the_naive_one_does(zero_effect_noisy):
    t = load_tables(zero_effect_noisy.store)
    st = standing_table(t.pairs, spec=SPEC).filter(pl.col("arm_kind") == "transfer")
    naive = standing_table(t.pairs, spec=SPEC, naive=True).filter(pl.col("arm_kind") == "transfer")
    for r in st.iter_rows(named=True):
        assert r["effect_lo"] <= 0 <= r["effect_hi"], r
        # with no effect, each class shows improve ~ regress (ties take the rest), not 50/50
        assert abs(r["improve_above"] - r["regress_above"]) < 0.15
        assert abs(r["improve_below"] - r["regress_below"]) < 0.15
    for r in naive.iter_rows(named=True):
        assert r["effect_lo"] > 0.3
        assert r["improve_above"] - r["regress_above"] > 0.25  # the built-in regression to the mean
        assert r["regress_below"] - r["improve_below"] > 0.15
    # the independent numpy scorer agrees in sign and size on the population
    sim = zero_effect_noisy.simulation
    assert abs(true_standing_effect(sim, n_mc=500)) < 0.03
    assert true_standing_effect(sim, naive=True, n_mc=500) > 0.3
    pooled = standing_effect_numpy(s_of_z(sim.z), naive=True)
    assert abs(pooled - float(naive["effect"].mean())) < 0.1
