"""The torch.compile time of a problem version on a GPU model: the one reduction of `torch_compile` events every table reads.

Per (problem, problem hash, size, GPU model) and mode, the newest row counts (a re-run with a newer torch or a
larger cap supersedes the old one). The torch.compile time is the faster of the modes whose newest row is ok
(compiled, matched the reference, timed): the best a user gets from torch.compile without an agent, so a kernel
"beats torch.compile" only if it beats its better mode. Absent, never zero, where no mode is ok.
"""

from __future__ import annotations

import polars as pl

MODE_KEYS: dict[str, str] = {"default": "default", "max-autotune-no-cudagraphs": "autotune"}  # mode -> column prefix
KEYS = ["problem", "problem_hash", "size", "machine"]

_EMPTY = {
    "problem": pl.Int64, "problem_hash": pl.Utf8, "size": pl.Utf8, "machine": pl.Utf8, "problem_name": pl.Utf8, "family": pl.Utf8,
    "compile_us": pl.Float64,
    "compile_mode": pl.Utf8, "compile_speedup_over_eager": pl.Float64, "compile_eager_us": pl.Float64,
    **{f"{k}_{c}": t for k in MODE_KEYS.values() for c, t in (("status", pl.Utf8), ("us", pl.Float64), ("compile_s", pl.Float64),
                                                              ("error_class", pl.Utf8))},
}


def machine_expr(gpu: str = "gpu", gpu_model: str | None = "gpu_model") -> pl.Expr:
    """`mkb.measure.machine_of` as a column: the row's `gpu_model`, else the model in its driver name, else that
    name (the same rule and order as the scalar one, tested equal). `gpu_model=None` for a kind without that column."""
    from mkb.measure import GPU_MODELS

    up = pl.col(gpu).str.to_uppercase()
    by_name = pl.lit(None, pl.Utf8)
    for m in reversed(GPU_MODELS):  # built inside out, so the first entry of GPU_MODELS is tested first
        by_name = pl.when(up.str.contains(m.model, literal=True)).then(pl.lit(m.model)).otherwise(by_name)
    return pl.coalesce(*([pl.col(gpu_model)] if gpu_model else []), by_name, pl.col(gpu))


def compile_times(tc: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """One row per (problem, problem_hash, size, machine: `machine_expr`): per-mode status, median and compile
    seconds, and `compile_us` / `compile_mode` / `compile_speedup_over_eager` of the faster ok mode."""
    tc = tc.lazy().collect() if isinstance(tc, pl.LazyFrame) else tc
    if tc.height == 0:
        return pl.DataFrame(schema=_EMPTY)
    newest = (tc.with_columns(machine=machine_expr()).sort("ts")
              .unique(subset=[*KEYS, "mode"], keep="last"))
    out = newest.group_by(KEYS).agg(pl.col("problem_name").drop_nulls().last(), pl.col("family").drop_nulls().last()) \
        if {"problem_name", "family"} <= set(newest.columns) else newest.select(KEYS).unique().with_columns(
            problem_name=pl.lit(None, pl.Utf8), family=pl.lit(None, pl.Utf8))
    for mode, key in MODE_KEYS.items():
        m = newest.filter(pl.col("mode") == mode).select(
            *KEYS, pl.col("status").alias(f"{key}_status"), pl.when(pl.col("ok")).then(pl.col("median_us")).alias(f"{key}_us"),
            pl.col("compile_s").alias(f"{key}_compile_s"), pl.col("error_class").alias(f"{key}_error_class"))
        out = out.join(m, on=KEYS, how="left")
    best = (newest.filter(pl.col("ok") & (pl.col("median_us") > 0)).sort("median_us").unique(subset=KEYS, keep="first")
            .select(*KEYS, compile_us="median_us", compile_mode="mode", compile_speedup_over_eager="speedup_over_eager",
                    compile_eager_us="eager_median_us"))
    out = out.join(best, on=KEYS, how="left")
    return out.select(list(_EMPTY)).sort("problem", "machine")
