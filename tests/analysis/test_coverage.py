"""A small run of the committed coverage simulation (benchmarks/analysis_coverage.py): CIs cover planted truth."""

import pytest


@pytest.fixture
def cov_script(repo_script):
    return repo_script("benchmarks/analysis_coverage.py")


def test_rate_lift_and_contrast_cis_cover_the_planted_truth(cov_script):
    cov = cov_script.coverage(6, problems=30, resamples=500)
    assert set(cov) == {"rel_lift", "regression_rate", "improvement_rate", "tie_rate", "transfer - placebo"}
    for fig, (c, n) in cov.items():
        assert n == 12, fig
        # nominal 95%; 12 intervals: at or below 9 of 12 would be a real undercoverage signal (P < 2% at 95%)
        assert c >= 10 / 12, (fig, c)
