"""torch.compile on the read side: the one reduction (the faster ok mode, newest row per mode) and the problems table."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import polars as pl
from typer.testing import CliRunner

from mkb.analysis import problems_table
from mkb.analysis._compile import compile_times
from mkb.events import EventWriter

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)


def tc(i, **kw):
    row = dict(ts=T0 + timedelta(seconds=i), problem=1, problem_hash="h", size="full", mode="default", gpu="NVIDIA H200",
               gpu_model="H200", status="ok", median_us=100.0, eager_median_us=300.0, speedup_over_eager=3.0, compile_s=5.0,
               error_class=None)
    row.update(kw)
    row["ok"] = row["status"] == "ok"
    return row


def test_the_faster_ok_mode_counts_and_the_newest_row_of_a_mode_supersedes_older_ones():
    rows = [tc(0, mode="default", median_us=100.0),
            tc(1, mode="max-autotune-no-cudagraphs", median_us=80.0, speedup_over_eager=3.75),
            tc(2, problem=2, problem_hash="g", mode="default", median_us=50.0),
            tc(3, problem=2, problem_hash="g", mode="max-autotune-no-cudagraphs", median_us=10.0, status="mismatch",
               error_class="Mismatch(wrong_values)"),
            tc(4, problem=3, problem_hash="k", mode="default", median_us=40.0),
            tc(5, problem=3, problem_hash="k", mode="default", median_us=None, status="timeout", error_class="CompileTimeout"),
            tc(6, problem=1, problem_hash="h", gpu="NVIDIA B200", gpu_model="B200", median_us=1.0)]
    ct = compile_times(pl.DataFrame(rows))
    by = {(r["problem"], r["machine"]): r for r in ct.iter_rows(named=True)}
    assert by[(1, "H200")]["compile_us"] == 80.0 and by[(1, "H200")]["compile_mode"] == "max-autotune-no-cudagraphs"
    assert by[(1, "H200")]["compile_speedup_over_eager"] == 3.75 and by[(1, "H200")]["default_us"] == 100.0
    assert by[(1, "B200")]["compile_us"] == 1.0  # kept apart per GPU model
    assert by[(2, "H200")]["compile_us"] == 50.0 and by[(2, "H200")]["autotune_status"] == "mismatch"  # a wrong kernel is no baseline
    assert by[(3, "H200")]["compile_us"] is None and by[(3, "H200")]["default_status"] == "timeout"  # absent, not zero
    assert compile_times(pl.DataFrame()).height == 0


def test_problems_table_and_cli_show_torch_compile_beside_eager(tmp_path):
    from mkb.cli.analyze import app

    store = str(tmp_path / "d")
    with EventWriter(store) as w:
        w.emit("characterisation", problem=1, problem_name="01_x", family="attention", problem_hash="h", size="full",
               gpu="NVIDIA H200", ok=True, eager_median_us=310.0, sol_us=10.0, sol_ratio=10 / 310)
        w.emit("characterisation", problem=2, problem_name="02_y", family="attention", problem_hash="g", size="full",
               gpu="NVIDIA H200", ok=True, eager_median_us=90.0)
        for r in (tc(0, median_us=100.0), tc(1, problem=9, problem_hash="z", problem_name="09_z")):
            r = {k: v for k, v in r.items() if k != "ts"}
            w.emit("torch_compile", **{"problem_name": "01_x", "family": "attention", "backend": "inductor",
                                       "torch_version": "2.11.0", **r})
    p = problems_table(store)
    by = {r["problem"]: r for r in p.iter_rows(named=True)}
    assert by[1]["compile_us"] == 100.0 and by[1]["speedup_compile_vs_eager"] == 3.0 and by[1]["eager_median_us"] == 310.0
    assert by[2]["compile_us"] is None  # not recorded: shown as "—"
    assert by[9]["compile_us"] == 100.0 and by[9]["eager_median_us"] is None  # torch.compile only: still a row
    out = CliRunner().invoke(app, ["problems", "--store", store])
    assert out.exit_code == 0, out.output
    assert "compile us" in out.output and "—" in out.output


def test_the_problems_table_shows_only_the_latest_version_of_a_problem(tmp_path):
    # a store holding torch.compile rows of an earlier version of a problem (its hash changed since) shows one row,
    # the current version's, as it does for the characterisation
    import time

    from mkb.analysis import problems_table
    from mkb.events import EventWriter

    store = str(tmp_path / "ds")
    with EventWriter(store) as w:
        for h, us in (("old-hash", 500.0), ("new-hash", 300.0)):
            w.emit("torch_compile", problem=50, problem_name="p50", family="moe", problem_hash=h, size="full", mode="default",
                   backend="inductor", gpu="NVIDIA H200", gpu_model="H200", torch_version="9.9", status="ok", ok=True,
                   compile_cap_s=240.0, median_us=us, eager_median_us=600.0, speedup_over_eager=600.0 / us)
            time.sleep(0.01)
    t = problems_table(store)
    assert t.height == 1
    assert t.row(0, named=True)["problem_hash"] == "new-hash" and t.row(0, named=True)["compile_us"] == 300.0
