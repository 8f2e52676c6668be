"""A small run of the committed coverage simulation (benchmarks/analysis_coverage.py): CIs cover planted truth."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "analysis_coverage.py"


def _load():
    spec = importlib.util.spec_from_file_location("analysis_coverage", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rate_lift_and_contrast_cis_cover_the_planted_truth():
    cov = _load().coverage(6, problems=30, resamples=500)
    assert set(cov) == {"rel_lift", "regression_rate", "improvement_rate", "tie_rate", "transfer - placebo"}
    for fig, (c, n) in cov.items():
        assert n == 12, fig
        # nominal 95%; 12 intervals: at or below 9 of 12 would be a real undercoverage signal (P < 2% at 95%)
        assert c >= 10 / 12, (fig, c)
