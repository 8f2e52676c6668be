"""`mkb-run grade`: grade one kernel.py against a problem in one DSL and print the verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

STORE_HELP = "Dataset URL the events go to; default $MKB_STORE, else events/local under the working directory."


def grade_cmd(
    kernel: Path = typer.Argument(..., exists=True, dir_okay=False, help="The kernel.py to grade."),
    problem: int = typer.Option(..., "--problem", help="Problem number (NN)."),
    dsl: str = typer.Option(..., "--dsl", help="DSL of the kernel: cute or tirx."),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    size: str = typer.Option("full", "--size", help="Input size: full (graded) or smoke (a quick look)."),
    device: str = typer.Option("cuda", "--device", help="cuda; cpu only for smoke runs without a GPU (no profiler)."),
    quick: bool = typer.Option(False, "--quick", help="A short policy (3 draws, 6 timed calls): never a reported verdict."),
    as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON instead of a table."),
) -> None:
    """Grade KERNEL: static rules, then a single-use worker for compile, correctness, timing and integrity."""
    from rich.console import Console

    from mkb.grader import GraderConfig, grade

    cfg = GraderConfig.quick(size=size, device=device) if quick else GraderConfig(size=size, device=device)
    console = Console()
    with console.status(f"grading {kernel} (problem {problem}, {dsl})", spinner="dots"):
        v = grade(problem, dsl, kernel, store=store, config=cfg)
    if as_json:
        print(json.dumps(v.as_dict(), default=str, indent=1))
    else:
        print_verdict(v, console)
    raise typer.Exit(0 if v.passed else 1)


def print_verdict(v, console=None) -> None:
    """A readable verdict: one line of outcome, one row per stage, the first failure's message."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    head = "[bold green]PASSED[/]" if v.passed else f"[bold red]FAILED[/] [red]{v.reason}[/]"
    speed = f"speedup {v.speedup:.2f}x" if v.speedup else ""
    times = (f"candidate {v.candidate_median_us:.1f} us, eager {v.eager_median_us:.1f} us"
             if v.candidate_median_us and v.eager_median_us else "")
    console.print(f"{head}  problem {v.problem} ({escape(v.dsl)}) on {escape(v.gpu)}  {speed}  {times}  S={v.s:.0f}")
    t = Table(show_header=True, header_style="bold")
    for c in ("stage", "ok", "reason", "figures"):
        t.add_column(c)
    for s in v.stages:
        f = s.figures
        if s.stage == "compile":
            fig = f"compile {f.get('compile_s', 0) or 0:.2f} s" if "compile_s" in f else ", ".join(f.get("static_rules", []))
        elif s.stage == "verification":
            fig = f"{f.get('draws')} draws, max |err| {f.get('max_abs_err') or 0:.3g} (tol {f.get('tolerance') or 0:.3g})" if f else ""
        elif s.stage == "timing":
            fig = (f"median {f.get('median_us', 0):.1f} us, IQR {f.get('iqr_us', 0):.1f}, CV {f.get('cv', 0):.3f}, "
                   f"{f.get('n_timed')} timed after {f.get('n_warmup')} warm-ups, floor {f.get('launch_floor_us') or 0:.1f} us") if f else ""
        else:
            ks = f.get("kernels_seen") or []
            fig = f"{len(ks)} kernel name(s): {', '.join(k[:40] for k in ks[:3])}" if f else ""
        t.add_row(s.stage, "[green]yes[/]" if s.ok else "[red]no[/]", s.reason or "", escape(fig))
    console.print(t)
    if not v.passed and v.message:
        console.print(v.message[:3000], markup=False, highlight=False)
    if v.wall_s is not None:
        console.print(f"[dim]evaluation {v.evaluation_id}: {v.wall_s:.1f} s request to verdict, grader overhead {v.overhead_s:.1f} s[/]")


def register(app: typer.Typer) -> None:
    app.command("grade")(grade_cmd)
