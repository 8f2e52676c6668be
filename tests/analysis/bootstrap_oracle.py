"""The cluster bootstrap as it was before the vectorised one: the oracle the bootstrap tests compare against."""

import numpy as np

from mkb.analysis._stats import _cluster_weights


def reference_cluster_bootstrap(cells, problems, sums, stat, spec):
    """The implementation before the vectorised one (commit 5eecaf9), kept verbatim as the oracle."""
    rng = np.random.default_rng(spec.seed)
    C = len(cells)
    est = stat(**{k: v.sum(1) for k, v in sums.items()})
    lo = np.full(C, np.nan)
    hi = np.full(C, np.nan)
    present = sums["n"] > 0
    groups: dict[bytes, list[int]] = {}
    for c in range(C):
        groups.setdefault(present[c].tobytes(), []).append(c)
    a = (1 - spec.level) / 2
    for key in sorted(groups):
        cs = groups[key]
        cols = np.flatnonzero(present[cs[0]])
        if len(cols) < 2:
            continue
        w = _cluster_weights(len(cols), spec, rng)
        boot = stat(**{k: w @ v[np.ix_(cs, cols)].T for k, v in sums.items()})  # [resamples, len(cs)]
        with np.errstate(invalid="ignore"):
            q = np.quantile(boot, [a, 1 - a], axis=0) if not np.isnan(boot).any() else np.nanquantile(boot, [a, 1 - a], axis=0)
        lo[cs], hi[cs] = q[0], q[1]
    return est, lo, hi
