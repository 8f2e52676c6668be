"""A dataset small enough to compute by hand: S, lift, relative lift, rates, standing classes, exclusions."""

import pyarrow as pa
import polars as pl
import pytest

from mkb.analysis import BootstrapSpec, MixedVersionsError, lift_table, load_tables, standing_table
from mkb.analysis.synthetic import SynthSpec, write_synthetic
from mkb.events import EventWriter, schema_for, write_table, resolve_store

VERS = dict(grader_version="g1", dsl_version="d1", doc_pack_version="p1")
SPEC = BootstrapSpec(seed=1, resamples=500)


def _attempt(w, aid, *, problem, tgt, arm, r, src=None, src_attempt=None, status="finished", kernel=True,
             verdicts=(), family="attention"):
    w.emit("attempt_started", attempt_id=aid, experiment="hand", model="m", problem=problem, problem_hash=f"h{problem}{tgt}",
           target_dsl=tgt, source_dsl=src, arm_kind=arm, replicate=r, gpu="H200", budget_submissions=10, budget_turns=10,
           budget_output_tokens=1000, budget_wall_s=10.0, skill_source_attempt=src_attempt, family=family, **VERS)
    if status is None:
        return
    w.emit("attempt_finished", attempt_id=aid, status=status, final_kernel_sha256="k" + aid if kernel else None)
    for scope, passed, speedup in verdicts:
        w.emit("verdict", attempt_id=aid, scope=scope, problem=problem, dsl=tgt, passed=passed, speedup=speedup,
               kernel_sha256="k" + aid, s=0.0, gpu="H200")


def write_hand(store):
    with EventWriter(store) as w:
        A = "attempt"
        # problem 1
        _attempt(w, "t1s0", problem=1, tgt="tirx", arm="solo", r=0, verdicts=[(A, True, 1.5)])  # S 60
        _attempt(w, "t1s1", problem=1, tgt="tirx", arm="solo", r=1, verdicts=[(A, True, 0.7)])  # S 40
        _attempt(w, "c1s0", problem=1, tgt="cute", arm="solo", r=0, verdicts=[(A, True, 3.0)])  # S 80
        _attempt(w, "c1s1", problem=1, tgt="cute", arm="solo", r=1, verdicts=[(A, False, None)])  # S 0
        # the pair re-grade (speedup 5, S 100) counts over the attempt verdict (speedup 1.2, S 60)
        _attempt(w, "t1x0", problem=1, tgt="tirx", arm="transfer", r=0, src="cute", src_attempt="c1s0",
                 verdicts=[(A, True, 1.2), ("pair", True, 5.0)])
        _attempt(w, "t1x1", problem=1, tgt="tirx", arm="transfer", r=1, src="cute", src_attempt="c1s1", kernel=False)  # no kernel: S 0
        _attempt(w, "t1p0", problem=1, tgt="tirx", arm="placebo", r=0, src="cute", status="infra_error", kernel=False)
        _attempt(w, "t1p1", problem=1, tgt="tirx", arm="placebo", r=1, src="cute", status=None)  # unfinished
        # problem 2
        _attempt(w, "t2s0", problem=2, tgt="tirx", arm="solo", r=0, verdicts=[(A, False, None)])  # S 0
        _attempt(w, "t2s1", problem=2, tgt="tirx", arm="solo", r=1, verdicts=[(A, True, 2.0)])  # S 80
        _attempt(w, "c2s0", problem=2, tgt="cute", arm="solo", r=0, verdicts=[(A, True, 0.5)])  # S 40
        _attempt(w, "c2s1", problem=2, tgt="cute", arm="solo", r=1, verdicts=[(A, True, 1.0)])  # S 60
        _attempt(w, "t2x0", problem=2, tgt="tirx", arm="transfer", r=0, src="cute", src_attempt="c2s0", verdicts=[(A, True, 1.0)])  # S 60
        _attempt(w, "t2x1", problem=2, tgt="tirx", arm="transfer", r=1, src="cute", src_attempt="c2s1",
                 status="budget_exhausted", kernel=False)  # S 0
        _attempt(w, "t2p0", problem=2, tgt="tirx", arm="placebo", r=0, src="cute", verdicts=[(A, True, 4.0)])
        _attempt(w, "t2p1", problem=2, tgt="tirx", arm="placebo", r=1, src="cute", verdicts=[(A, True, 1.0)])  # S 60
        w.emit("annotation", target_attempt_id="t2p0", label="reward_hack", reason="hand", annotator="test")


@pytest.fixture()
def hand(tmp_path):
    store = str(tmp_path / "hand")
    write_hand(store)
    return load_tables(store)


def test_s_follows_the_definitions(hand):
    S = dict(zip(hand.attempts["attempt_id"], hand.attempts["S"]))
    assert {k: S[k] for k in ("t1s0", "t1s1", "c1s0", "c1s1", "t1x0", "t1x1", "t2s0", "t2s1", "c2s0", "c2s1", "t2x0", "t2x1")} == {
        "t1s0": 60, "t1s1": 40, "c1s0": 80, "c1s1": 0, "t1x0": 100, "t1x1": 0,
        "t2s0": 0, "t2s1": 80, "c2s0": 40, "c2s1": 60, "t2x0": 60, "t2x1": 0}
    src = dict(zip(hand.attempts["attempt_id"], hand.attempts["verdict_source"]))
    assert src["t1x0"] == "pair" and src["t1s0"] == "attempt" and src["t1x1"] == "none"
    assert "pair re-grade" in hand.verdict_note()


def test_exclusions_are_listed(hand):
    ex = dict(hand.attempts.filter(pl.col("excluded").is_not_null()).select("attempt_id", "excluded").iter_rows())
    assert ex == {"t1p0": "infra_error", "t1p1": "unfinished", "t2p0": "annotated:reward_hack"}
    s = hand.summary()
    assert (s["infra_error"], s["unfinished"], s["annotated"]) == (1, 1, 1)


def test_lift_relative_lift_and_rates(hand):
    lt = lift_table(hand.pairs, spec=SPEC)
    tr = lt.filter(pl.col("arm_kind") == "transfer").row(0, named=True)
    assert tr["n_pairs"] == 4 and tr["n_problems"] == 2
    assert tr["lift"] == pytest.approx(-5.0)  # (40 - 40 + 60 - 80) / 4
    assert tr["rel_lift"] == pytest.approx((160 - 180) / 180)
    assert (tr["regression_rate"], tr["improvement_rate"], tr["tie_rate"]) == (0.5, 0.0, 0.5)
    assert (tr["pair_regress"], tr["pair_improve"], tr["pair_tie"]) == (0.5, 0.5, 0.0)
    assert (tr["mcnemar_b"], tr["mcnemar_c"]) == (2, 1)  # solo pass/arm fail: P1r1, P2r1; solo fail/arm pass: P2r0
    pl_ = lt.filter(pl.col("arm_kind") == "placebo").row(0, named=True)
    assert pl_["n_pairs"] == 1 and pl_["lift"] == pytest.approx(-20.0)  # only P2 r1 survives the exclusions


def test_standing_classes(hand):
    p = hand.pairs.filter(pl.col("arm_kind") == "transfer").sort("problem", "replicate")
    assert p["standing"].to_list() == ["above", "below", "below", "above"]
    assert p["standing_naive"].to_list() == ["above", "below", "above", "below"]
    assert p["outcome"].to_list() == ["improve", "regress", "improve", "regress"]
    st = standing_table(hand.pairs, spec=SPEC).filter(pl.col("arm_kind") == "transfer").row(0, named=True)
    assert st["effect"] == pytest.approx(0.0)
    naive = standing_table(hand.pairs, spec=SPEC, naive=True).filter(pl.col("arm_kind") == "transfer").row(0, named=True)
    assert naive["effect"] == pytest.approx(2.0)


def test_a_file_without_newer_nullable_columns_still_analyses(tmp_path):
    store = str(tmp_path / "old")
    write_hand(store)
    sch = schema_for("attempt_started")
    old_cols = [f for f in sch.arrow() if f.name not in ("problem_name", "family", "skill_empty", "wrong_source_problem", "plan_sha256")]
    row = dict(event_id="0190aaaa-0000-7000-8000-000000000001", kind="attempt_started", schema_version="1.0",
               ts=__import__("datetime").datetime(2026, 1, 1, tzinfo=__import__("datetime").timezone.utc), run_id="old",
               attempt_id="t3s0", seq=0, writer="old", mkb_version="0.1.0", experiment="hand", model="m", problem=3,
               problem_hash="h3tirx", target_dsl="tirx", source_dsl=None, arm_kind="solo", replicate=0, gpu="H200",
               budget_submissions=10, budget_turns=10, budget_output_tokens=1000, budget_wall_s=10.0,
               skill_sha256=None, skill_source_attempt=None, **VERS)
    old = pa.schema(old_cols, metadata={b"mkb.kind": b"attempt_started", b"mkb.schema_version": b"1.0"})
    table = pa.table({f.name: pa.array([row.get(f.name)], type=f.type) for f in old_cols}, schema=old)
    write_table(resolve_store(store, for_writing=True), "attempt_started", table)
    with EventWriter(store) as w:
        w.emit("attempt_finished", attempt_id="t3s0", status="finished", final_kernel_sha256="k")
        w.emit("verdict", attempt_id="t3s0", scope="attempt", problem=3, dsl="tirx", passed=True, speedup=2.0, s=80.0, gpu="H200")
    t = load_tables(store)
    r = t.attempts.filter(pl.col("attempt_id") == "t3s0").row(0, named=True)
    assert r["S"] == 80 and r["family"] == "unknown" and r["excluded"] is None
    assert lift_table(t.pairs, spec=SPEC).height == 2


def test_mixed_versions_are_refused_unless_stratified(tmp_path):
    store = str(tmp_path / "mixed")
    small = dict(models=("m",), model_means=(0.7,), n_problems=12, replicates=2)
    write_synthetic(SynthSpec(seed=1, grader_version="grader-1", **small), store)
    write_synthetic(SynthSpec(seed=2, grader_version="grader-2", **small), store)
    with pytest.raises(MixedVersionsError, match="grader_version.*\n.*hint: .*--stratify"):
        load_tables(store)
    t = load_tables(store, stratify=True)
    assert t.stratified
    lt = lift_table(t.pairs, spec=SPEC)
    assert sorted(lt["stratum"].str.extract(r"grader=(\S+)").unique().to_list()) == ["grader-1", "grader-2"]
    assert lt.filter(pl.col("arm_kind") == "transfer").height == 4  # 2 strata x 2 directions


def test_mixed_dsl_versions_name_the_dsl(tmp_path):
    store = str(tmp_path / "mixed_dsl")
    small = dict(models=("m",), model_means=(0.7,), n_problems=6, replicates=2)
    write_synthetic(SynthSpec(seed=1, **small), store)
    write_synthetic(SynthSpec(seed=2, dsl_versions={"cute": "4.9.0", "tirx": "0.27.0.post1"}, **small), store)
    with pytest.raises(MixedVersionsError, match=r"dsl_version \[target_dsl=cute\]: 4.8.1, 4.9.0"):
        load_tables(store)
