"""S_sol and speedup over torch.compile (mkb.scoring) and the torch-free peaks table (mkb.peaks)."""

import subprocess
import sys

import polars as pl
import pytest

from mkb.scoring import SOL_THRESHOLDS, s_score, s_sol, sol_fraction, speedup_over_compile


def test_s_sol_ladder():
    assert SOL_THRESHOLDS[0] == 0.0
    assert s_sol(False, 0.9) == 0.0
    assert s_sol(True, None) == 20.0
    assert s_sol(True, 0.1) == 20.0
    assert s_sol(True, 0.125) == 40.0
    assert s_sol(True, 0.3) == 60.0
    assert s_sol(True, 0.5) == 80.0
    assert s_sol(True, 0.75) == 100.0


def test_s_sol_does_not_saturate_where_s_does():
    # problem 28 (issue #14): eager 1119 us, a fused kernel 82 us; speed of light ~ 40 us
    good, great = 82.0, 45.0
    assert s_score(True, 1119 / good) == s_score(True, 1119 / great) == 100.0
    assert s_sol(True, sol_fraction(good, 40.0)) < s_sol(True, sol_fraction(great, 40.0))


@pytest.mark.parametrize("cand,ref", [(None, 1.0), (1.0, None), (0.0, 1.0), (1.0, 0.0)])
def test_unknown_times_give_none(cand, ref):
    assert sol_fraction(cand, ref) is None and speedup_over_compile(cand, ref) is None


def test_speedup_over_compile():
    assert speedup_over_compile(50.0, 100.0) == 2.0


def test_peaks_table_is_torch_free_and_still_reexported():
    code = ("import sys; import mkb.peaks, mkb.scoring; assert 'torch' not in sys.modules; "
            "print(mkb.peaks.gpu_peaks('NVIDIA H200').hbm_bytes_per_s)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    from mkb.measure import GPU_PEAKS, gpu_peaks
    from mkb.peaks import GPU_PEAKS as P2

    assert GPU_PEAKS is P2 and gpu_peaks("H200") is P2["H200"]


def test_analysis_s_sol_equals_mkb_scoring_per_attempt(tmp_path):
    from mkb.analysis import load_tables
    from mkb.analysis.synthetic import SynthSpec, write_synthetic

    write_synthetic(SynthSpec(models=("m",), n_problems=12, replicates=2, seed=4), str(tmp_path / "d"))
    a = load_tables(str(tmp_path / "d")).included
    assert a["S_sol"].null_count() == 0 and a["S_compile"].null_count() == a.height  # no torch.compile time: absent
    vals = set()
    for r in a.iter_rows(named=True):
        exp = s_sol(r["passed"], sol_fraction(r["candidate_us"], r["sol_us"]))
        assert r["S_sol"] == exp, r
        vals.add(exp)
    assert len(vals) >= 4  # the ladder is exercised, not saturated


def tc_row(**kw):
    """A torch_compile event payload (schema torch_compile 1.0) with the required columns filled."""
    row = dict(problem=1, problem_name="x", family="f", problem_hash="h", size="full", mode="default", backend="inductor",
               gpu="NVIDIA H200", gpu_model="H200", torch_version="2.11.0", status="ok", ok=True, median_us=100.0,
               eager_median_us=200.0, speedup_over_eager=2.0, compile_s=10.0)
    row.update(kw)
    row["ok"] = row["status"] == "ok"
    return row


def test_s_compile_uses_the_faster_ok_mode_of_the_same_problem_hash_and_gpu_model(tmp_path):
    from mkb.analysis import load_tables
    from mkb.analysis.synthetic import SynthSpec, write_synthetic
    from mkb.events import EventWriter

    store = str(tmp_path / "d")
    write_synthetic(SynthSpec(models=("m",), n_problems=6, replicates=2, seed=4), store)
    a0 = load_tables(store).included
    passed = a0.filter(pl.col("passed")).sort("problem")
    p1 = passed.row(0, named=True)
    others = passed.filter(pl.col("problem") != p1["problem"])
    p2 = others.row(0, named=True)
    with EventWriter(store) as w:
        h1 = p1["problem_hash"]
        w.emit("torch_compile", **tc_row(problem=p1["problem"], problem_hash=h1, mode="default", median_us=300.0))
        w.emit("torch_compile", **tc_row(problem=p1["problem"], problem_hash=h1, mode="max-autotune-no-cudagraphs", median_us=150.0))
    with EventWriter(store) as w:  # later: supersedes the autotune row above, so the default mode's 300 us counts
        w.emit("torch_compile", **tc_row(problem=p1["problem"], problem_hash=h1, mode="max-autotune-no-cudagraphs",
                                         median_us=None, status="timeout", error_class="CompileTimeout"))
        # another problem version and another GPU model: never used
        w.emit("torch_compile", **tc_row(problem=p2["problem"], problem_hash="stale", median_us=1.0))
        w.emit("torch_compile", **tc_row(problem=p2["problem"], problem_hash=p2["problem_hash"], gpu="NVIDIA B200", gpu_model="B200",
                                         median_us=1.0))
    a = load_tables(store).included
    mine = a.filter(pl.col("problem_hash") == h1)
    assert mine.height >= 1
    for r in mine.iter_rows(named=True):
        exp = s_score(r["passed"], speedup_over_compile(r["candidate_us"], 300.0))  # the timeout superseded autotune
        assert r["S_compile"] == exp, r
    assert a.filter(pl.col("problem_hash") != h1)["S_compile"].null_count() == a.height - mine.height
