"""The hand-written Wilcoxon (pratt), McNemar and Holm agree with scipy and statsmodels."""

import numpy as np
from scipy.stats import binomtest, wilcoxon
from statsmodels.stats.multitest import multipletests

from mkb.analysis._stats import holm, mcnemar_exact, wilcoxon_pratt


def test_wilcoxon_pratt_matches_scipy_on_tied_lifts_with_zeros():
    rng = np.random.default_rng(0)
    for _ in range(200):
        d = np.round(rng.integers(-5, 6, rng.integers(5, 80)) * 20 / 3, 9)
        if np.all(d == 0):
            continue
        assert abs(wilcoxon(d, zero_method="pratt", method="asymptotic").pvalue - wilcoxon_pratt(d)) < 1e-9


def test_mcnemar_and_holm_match_references():
    rng = np.random.default_rng(1)
    for b, c in rng.integers(0, 60, (200, 2)):
        if b + c:
            assert abs(binomtest(int(c), int(b + c), 0.5).pvalue - mcnemar_exact(int(b), int(c))) < 1e-9
    p = rng.random(17) ** 3
    assert np.allclose(holm(p), multipletests(p, method="holm")[1])
