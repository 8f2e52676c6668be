"""S_sol and speedup over torch.compile (mkb.scoring) and the torch-free peaks table (mkb.peaks)."""

import subprocess
import sys

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
