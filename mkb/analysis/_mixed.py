"""Secondary, model-based estimates: MixedLM on log-speedup among passes, BinomialBayesMixedGLM (fit_vb) on pass.

Problem is a random effect and model a fixed effect (few levels). Every fit returns its diagnostics
(converged, optimizer, captured warnings, variance components) and flags the known failure modes:
a variance component stuck at exactly 0 (a boundary fit) and fixed effects returned as exactly 0.0
(statsmodels#10239: lbfgs zero-fills between-group effects when the random-effect variance collapses).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import polars as pl


@dataclass
class FitResult:
    """One mixed-model fit: estimates of the arm effects and what to distrust about them."""

    name: str
    target_dsl: str
    formula: str
    estimator: str
    n_rows: int
    n_problems: int
    effects: pl.DataFrame  # term, estimate, se (or posterior sd), lo, hi
    variance: dict[str, float]
    converged: bool | None
    seconds: float
    warnings: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)


def _frame(attempts: pl.DataFrame, target: str, *, passes_only: bool) -> "pd.DataFrame":  # noqa: F821
    a = attempts.filter(pl.col("excluded").is_null() & (pl.col("target_dsl") == target))
    if passes_only:
        a = a.filter(pl.col("passed") & (pl.col("speedup") > 0))
    a = a.select(pl.col("arm_kind").alias("arm"), "model", pl.col("problem").cast(pl.Utf8), pl.col("replicate").cast(pl.Utf8),
                 pl.col("passed").cast(pl.Float64).alias("pass_"), pl.col("speedup").log().alias("log_speedup"))
    return a.to_pandas()


def fit_mixedlm(attempts: pl.DataFrame, target: str) -> FitResult | None:
    """log(speedup) ~ arm + model among passes, problem random intercept (REML)."""
    import statsmodels.formula.api as smf

    df = _frame(attempts, target, passes_only=True)
    if len(df) < 10 or df["arm"].nunique() < 2 or df["problem"].nunique() < 3:
        return None
    # model x arm interaction where there are several models: does the arm effect differ between models?
    model_term = " + C(model) + C(arm, Treatment('solo')):C(model)" if df["model"].nunique() > 1 else ""
    formula = f"log_speedup ~ C(arm, Treatment('solo')){model_term}"
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # lbfgs (statsmodels' usual first choice) collapsed the problem variance to 0 with llf=inf on our
        # synthetic data; bfgs found the interior optimum. A boundary or non-finite fit is refit with powell.
        # random effects: problem, and replicate within problem (a variance component inside each problem group)
        mdl = smf.mixedlm(formula, df, groups=df["problem"], re_formula="1", vc_formula={"replicate": "0 + C(replicate)"})
        res = mdl.fit(reml=True, method=["bfgs", "powell"])  # statsmodels tries them in turn until one converges
        refit = None
        if not np.isfinite(res.llf) or float(np.asarray(res.cov_re).ravel()[0]) == 0.0:
            alt = mdl.fit(reml=True, method=["powell"])
            if np.isfinite(alt.llf) and (not np.isfinite(res.llf) or alt.llf > res.llf):
                res, refit = alt, "refit with powell after a boundary/non-finite bfgs fit"
    secs = time.perf_counter() - t0
    ci = res.conf_int()
    terms = [t for t in res.fe_params.index]
    eff = pl.DataFrame({"term": terms, "estimate": [float(res.fe_params[t]) for t in terms],
                        "se": [float(res.bse_fe[t]) for t in terms], "lo": [float(ci.loc[t, 0]) for t in terms],
                        "hi": [float(ci.loc[t, 1]) for t in terms]})
    var = {"problem": float(np.asarray(res.cov_re).ravel()[0]), "replicate_in_problem": float(np.asarray(res.vcomp).ravel()[0]),
           "residual": float(res.scale)}
    flags = _flags(var, eff) + ([refit] if refit else [])
    flags.append("estimates are conditioned on passing (log-speedup among passed attempts); read them with the pass "
                 "model and the two-part summary (pass rate, then speedup among passes)")
    return FitResult("MixedLM log-speedup | passed", target, formula + "  (groups: problem; vc: replicate within problem)", "REML (bfgs)", len(df),
                     df["problem"].nunique(), eff, var, bool(res.converged), secs,
                     sorted({str(w.message).splitlines()[0] for w in caught}), flags)


def fit_binomial_vb(attempts: pl.DataFrame, target: str) -> FitResult | None:
    """pass ~ arm + model with problem random intercept, by variational Bayes (fit_vb; never the Laplace fit())."""
    from statsmodels.genmod.bayes_mixed_glm import BinomialBayesMixedGLM

    df = _frame(attempts, target, passes_only=False)
    if len(df) < 10 or df["arm"].nunique() < 2 or df["problem"].nunique() < 3:
        return None
    model_term = " + C(model) + C(arm, Treatment('solo')):C(model)" if df["model"].nunique() > 1 else ""
    formula = f"pass_ ~ C(arm, Treatment('solo')){model_term}"
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        glm = BinomialBayesMixedGLM.from_formula(formula, {"problem": "0 + C(problem)"}, df)
        res = glm.fit_vb()
    secs = time.perf_counter() - t0
    k = glm.k_fep
    names = glm.exog_names[:k] if hasattr(glm, "exog_names") else [f"fe{i}" for i in range(k)]
    mean, sd = res.fe_mean, res.fe_sd
    eff = pl.DataFrame({"term": list(names), "estimate": mean.tolist(), "se": sd.tolist(),
                        "lo": (mean - 1.96 * sd).tolist(), "hi": (mean + 1.96 * sd).tolist()})
    var = {"problem_sd": float(np.exp(res.vcp_mean[0]))}
    flags = _flags({"problem": var["problem_sd"]}, eff)
    flags.append("posterior SDs are mean-field VB: approximate, usually too small; read beside the bootstrap")
    opt = getattr(res, "optim_retvals", None)
    conv = None
    if opt is not None:
        conv = bool(getattr(opt, "success", True)) if not isinstance(opt, dict) else bool(opt.get("success", True))
    return FitResult("BinomialBayesMixedGLM pass (fit_vb)", target, formula + "  (vc: problem)", "VB", len(df),
                     df["problem"].nunique(), eff, var, conv, secs,
                     sorted({str(w.message).splitlines()[0] for w in caught}), flags)


def _flags(var: dict[str, float], eff: pl.DataFrame) -> list[str]:
    out = []
    for k, v in var.items():
        if v == 0.0 or (k.endswith("sd") and v < 1e-6):
            out.append(f"WARNING: variance of {k} is stuck at exactly 0 (boundary fit); its SEs are not meaningful")
    zero = eff.filter(pl.col("estimate") == 0.0)["term"].to_list()
    if zero:
        out.append(f"WARNING: fixed effects exactly 0.0: {zero} (statsmodels#10239 zero-fill?); refit with method='bfgs'")
    return out


def fit_all(attempts: pl.DataFrame) -> list[FitResult]:
    """Both fits for each target DSL (and each stratum is the caller's business)."""
    out = []
    for tgt in sorted(attempts["target_dsl"].unique().to_list()):
        for fn in (fit_mixedlm, fit_binomial_vb):
            r = fn(attempts, tgt)
            if r is not None:
                out.append(r)
    return out
