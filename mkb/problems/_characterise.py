"""Characterisation: every problem measured at one size on one device, written as `characterisation` events.

For each problem: the eager median under the grader's timing policy (mkb.measure), the peak memory of
one eager call, the observed fp64 gap (reference in its dtype vs the reference on fp64 copies) and
the speed-of-light ratio. One failing problem is recorded (ok=false, with the error) and the run
goes on. Runs on the GPU host with torch, pyarrow, fsspec, typer and rich only (no polars).
"""

from __future__ import annotations

import gc
import json
import math
import time
import traceback
from typing import Any, Sequence

import torch

from mkb.measure import clone_inputs, compare, expect, gpu_name, gpu_state, speed_of_light, time_problem_fn
from mkb.problems._loader import Problem, get_problem, problems

BAND_US = (50.0, 50_000.0)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _free(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()


def _plan_calls(est_s: float, share_s: float) -> tuple[int, int]:
    """(warmup, timed) calls that fit `share_s`: 10 + 50 where feasible, never fewer than 3 + 20."""
    per_call = max(est_s, 1e-6) * 1.3 + 2e-4  # the window's syncs, flush and input hand-over
    fit = int(share_s / per_call)
    if fit >= 60:
        return 10, 50
    return 3, max(20, fit - 3)


def characterise_problem(problem: Problem, *, size: str = "full", device: str | torch.device = "cuda",
                         share_s: float = 5.0, gpu: str | None = None) -> dict[str, Any]:
    """One `characterisation` event payload for `problem` (ok=false with the error if anything fails)."""
    dev = torch.device(device)
    m = problem.meta
    gpu = gpu or gpu_name(dev if dev.type == "cuda" else None)
    row: dict[str, Any] = {
        "problem": m.number, "problem_name": problem.slug, "family": m.family, "problem_hash": problem.hash,
        "size": size, "gpu": gpu, "ok": False, "error": None, "peak": m.peak, "torch_version": torch.__version__,
        "eager_source": "eager" if problem.has_eager else "reference",
    }
    t_start = time.perf_counter()
    try:
        inputs = problem.make_inputs(0, device=dev, size=size)
        fn = problem.eager
        # peak memory of one eager call, inputs included (after a first call that pays one-off costs)
        fn(*inputs)
        _sync(dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        out = fn(*inputs)
        _sync(dev)
        est = time.perf_counter() - t0
        if dev.type == "cuda":
            row["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(dev))
        del out, inputs
        _free(dev)
        # fp64 gap on a fresh draw
        inputs = problem.make_inputs(1, device=dev, size=size)
        exp = expect(problem.module, inputs)
        gaps = exp.fp64_gap()
        row["fp64_gap"] = max(gaps.values()) if gaps else (0.0 if m.exact_reason else None)
        row["fp64_gap_detail"] = json.dumps(gaps)
        if problem.has_eager:  # the baseline every speedup divides by must itself be correct at full size
            cand_inputs = clone_inputs(inputs)
            verdict = compare(exp, fn(*cand_inputs), inputs_after=cand_inputs, input_names=m.inputs)
            row["eager_ok"] = verdict.ok
            if not verdict.ok:
                raise AssertionError(f"eager disagrees with reference at size={size}: {verdict.reason}: {verdict.message}")
            del cand_inputs, verdict
        del exp, inputs
        _free(dev)
        # eager timing under the grader's policy
        warmup, timed = _plan_calls(est, share_s)
        timing = time_problem_fn(fn, lambda s: problem.make_inputs(s, device=dev, size=size),
                                 warmup=warmup, timed=timed, device=dev)
        row.update(eager_median_us=timing.median_us, eager_iqr_us=timing.iqr_us, eager_cv=timing.cv,
                   n_timed=timing.n_timed, n_warmup=timing.n_warmup, timing_policy=timing.policy or None)
        if size == "full":
            row.update(flops=float(m.flops), bytes=float(m.bytes))
            if dev.type == "cuda":
                try:
                    sol = speed_of_light(flops=m.flops, bytes=m.bytes, peak=m.peak, gpu=gpu)
                    row.update(sol_us=sol.us, sol_ratio=sol.us / timing.median_us)
                except KeyError:
                    pass  # no peak table for this GPU: SoL left empty
                row["within_band"] = BAND_US[0] <= timing.median_us <= BAND_US[1]
        row["ok"] = True
    except Exception as exc:  # recorded, and the run goes on
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
        row["error"] = f"{type(exc).__name__}: {exc}\n{''.join(tb[-4:])}"[:4000]
    finally:
        _free(dev)
    if dev.type == "cuda":
        row["gpu_state"] = json.dumps(gpu_state(dev).as_dict())
    row["seconds"] = time.perf_counter() - t_start
    return row


def _print_table(rows: Sequence[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    def f(v, fmt):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    t = Table(title=title)
    for col in ("#", "problem", "ok", "eager us", "IQR us", "CV", "n", "peak MiB", "fp64 gap", "SoL us", "SoL ratio", "band", "s"):
        t.add_column(col, justify="left" if col in ("problem", "ok") else "right")
    for r in rows:
        mem = r.get("peak_memory_bytes")
        t.add_row(
            f"{r['problem']:02d}", r["problem_name"], "ok" if r["ok"] else f"[red]{(r['error'] or '').splitlines()[0][:60]}[/red]",
            f(r.get("eager_median_us"), ".1f"), f(r.get("eager_iqr_us"), ".1f"), f(r.get("eager_cv"), ".3f"),
            f(r.get("n_timed"), "d"), f(mem / 2**20 if mem is not None else None, ".0f"), f(r.get("fp64_gap"), ".2e"),
            f(r.get("sol_us"), ".1f"), f(r.get("sol_ratio"), ".3f"),
            "-" if r.get("within_band") is None else ("yes" if r["within_band"] else "[red]NO[/red]"), f(r.get("seconds"), ".1f"),
        )
    Console(width=220).print(t)


def run_characterisation(*, store: str | None = None, size: str = "full", device: str | None = None,
                         family: str | None = None, only: Sequence[str] | None = None, budget_s: float = 330.0,
                         write: bool = True, print_table: bool = True) -> list[dict[str, Any]]:
    """Characterise the selected problems, emit one event per problem to `store`, print a table."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # the eager baseline's numerics (DESIGN: reference numerics)
        torch.backends.cudnn.allow_tf32 = False
    ps = [get_problem(k) for k in only] if only else list(problems(family=family))
    writer = None
    if write:
        from mkb.events import EventWriter

        writer = EventWriter(store)
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for i, p in enumerate(ps):
        left = max(budget_s - (time.perf_counter() - t0), 1.0)
        share = left / (len(ps) - i)
        row = characterise_problem(p, size=size, device=dev, share_s=share)
        rows.append(row)
        if writer is not None:
            writer.emit("characterisation", **row)
        status = "ok" if row["ok"] else f"FAILED: {(row['error'] or '').splitlines()[0]}"
        print(f"[{i + 1}/{len(ps)}] {p.slug}: {status} ({row['seconds']:.1f} s)", flush=True)
    if writer is not None:
        files = writer.flush()
        print(f"wrote {len(rows)} characterisation events to {writer.store.url if hasattr(writer.store, 'url') else writer.store}: {files}")
    if print_table:
        _print_table(rows, f"characterisation: size={size}, device={dev}, {rows[0]['gpu'] if rows else ''}, "
                           f"{time.perf_counter() - t0:.0f} s")
    return rows
