"""`mkb-run grade`: grade kernels (files, or the baselines found in the problem folders) through one grading queue."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

STORE_HELP = "Dataset URL the events go to; default $MKB_STORE, else events/local under the working directory."


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(2)


def _jobs(targets: list[str], *, baselines: bool, problem: Optional[int], dsl: Optional[str]) -> list:
    """The GradeJobs the command line names (a bad name is a one-line error, never a traceback)."""
    from mkb.dsl import baseline_files
    from mkb.grader import GradeJob
    from mkb.problems import ProblemError, baselines as find_baselines, find_problem

    if baselines:
        if problem is not None:
            targets = [*targets, str(problem)]
        try:
            found = find_baselines(targets or None, dsls=[dsl] if dsl else None)
        except (ProblemError, ValueError) as exc:
            _fail(str(exc))
        if not found:
            _fail("no baseline kernels found\nhint: baselines are <dsl>.py files beside a problem's problem.py")
        return [GradeJob(b.problem, b.dsl, b.path, experiment="baselines") for b in found]
    files = baseline_files()
    if not targets:
        _fail(f"name the kernel files to grade, or pass --baselines\nhint: mkb-run grade --problem NN --dsl {'|'.join(files.values())} kernel.py")
    jobs = []
    for t in targets:
        path = Path(t)
        if not path.is_file():
            _fail(f"{t}: no such kernel file")
        p, d = problem, dsl
        if p is None or d is None:  # a baseline's own path says both: problems/<family>/NN_name/<dsl>.py
            try:
                inferred_p = int(find_problem(path.resolve().parent).parent.name.split("_")[0])
            except (ProblemError, ValueError):
                inferred_p = None
            p = p if p is not None else inferred_p
            d = d if d is not None else files.get(path.name)
        if p is None or d is None:
            _fail(f"{t}: which problem and DSL is this kernel for?\nhint: pass --problem NN and --dsl {'|'.join(files.values())}")
        jobs.append(GradeJob(p, d, path.resolve(), experiment="cli"))
    return jobs


def grade_cmd(
    targets: Optional[list[str]] = typer.Argument(None, help="Kernel files; with --baselines, problem numbers or names (none: all)."),
    problem: Optional[int] = typer.Option(None, "--problem", help="Problem number (NN) of the kernel files (read from a baseline's folder if left out)."),
    dsl: Optional[str] = typer.Option(None, "--dsl", help="DSL of the kernel files (a baseline's file name says it); with --baselines, only this DSL."),
    baselines: bool = typer.Option(False, "--baselines", help="Grade the baseline solutions found in the problem folders."),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    size: str = typer.Option("full", "--size", help="Input size: full (graded) or smoke (a quick look)."),
    device: str = typer.Option("cuda", "--device", help="cuda or cuda:N; cpu only for smoke runs without a GPU (no profiler)."),
    quick: bool = typer.Option(False, "--quick", help="A short policy (3 draws, 6 timed calls): never a reported verdict."),
    as_json: bool = typer.Option(False, "--json", help="Print the verdicts as JSON instead of tables."),
    confined: bool = typer.Option(False, "--confined", help="Refuse to grade where a worker cannot be confined (a kernel "
                                  "without Landlock or seccomp filters); by default such a grading goes on and its "
                                  "verdict says so."),
    problems_root: Optional[Path] = typer.Option(
        None, "--problems-root", help="Grade against the problems under this folder instead of the catalog, e.g. a doc "
        "pack's worked examples (mkb/dsl/docs/<dsl>/examples); sets $MKB_PROBLEMS_ROOT for the run and its workers."),
) -> None:
    """Grade kernels: static rules, then a single-use worker each for compile, correctness, timing and integrity.

    Every kernel goes through one grading queue on DEVICE (workers started ahead, one eager timing per
    problem for the run). Exits 0 only when every kernel passed.
    """
    from rich.console import Console

    from mkb.grader import GraderConfig, GradingQueue
    from mkb.grader._pool import device_kind

    if problems_root is not None:
        import os

        from mkb.problems._loader import PROBLEMS_ROOT_ENV

        if not problems_root.is_dir():
            _fail(f"--problems-root {problems_root}: no such folder\nhint: a folder of <family>/NN_name/problem.py")
        os.environ[PROBLEMS_ROOT_ENV] = str(problems_root.resolve())  # the workers inherit it
    jobs = _jobs(list(targets or []), baselines=baselines, problem=problem, dsl=dsl)
    try:
        kind = device_kind(device)
    except ValueError as exc:
        _fail(str(exc))
    cfg = GraderConfig.quick(size=size, device=kind) if quick else GraderConfig(size=size, device=kind)
    if confined:
        from dataclasses import replace

        from mkb.grader import ConfinementUnavailable
        from mkb.grader._confine import require_confinement

        cfg = replace(cfg, fs_guard="required", syscall_guard="required")
        try:
            require_confinement(cfg)  # before any worker starts
        except ConfinementUnavailable as exc:
            _fail(str(exc))
    console = Console()
    results: list = []
    dsls = tuple(dict.fromkeys(j.dsl for j in jobs))
    # spares per DSL: enough to keep the queue fed (batched refill), never more than the kernels of that DSL
    per_dsl = max(sum(1 for j in jobs if j.dsl == d) for d in dsls)
    depth = min(3, per_dsl)
    with console.status(f"grading {len(jobs)} kernel(s) on {device}", spinner="dots"):
        with GradingQueue(device=device, store=store, config=cfg, dsls=dsls, depth=depth,
                          low_water=min(1, depth - 1)) as q:
            futures = [q.submit(j) for j in jobs]
            for j, f in zip(jobs, futures):
                try:
                    results.append((j, f.result(), None))
                except Exception as exc:  # noqa: BLE001 - an unreadable kernel or unknown DSL: named, and the rest go on
                    results.append((j, None, str(exc).splitlines()[0]))
    if as_json:
        print(json.dumps([v.as_dict() if v is not None else {"kernel": str(j.kernel_path), "error": e}
                          for j, v, e in results], default=str, indent=1))
    elif len(results) == 1 and results[0][1] is not None:
        print_verdict(results[0][1], console)
    else:
        print_table(results, console)
    for j, v, e in results:
        if e is not None:
            typer.echo(f"error: {j.kernel_path}: {e}", err=True)
    raise typer.Exit(0 if all(v is not None and v.passed for _, v, _ in results) else 1)


def print_table(results: list, console=None) -> None:
    """One row per kernel: problem, DSL, outcome, speedup, medians, wall time."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    t = Table(show_header=True, header_style="bold")
    for c in ("problem", "dsl", "kernel", "verdict", "speedup", "candidate us", "eager us", "wall s"):
        t.add_column(c, justify="right" if c in ("problem", "speedup", "candidate us", "eager us", "wall s") else "left")
    for j, v, e in results:
        kernel = escape(_short(j.kernel_path))
        if v is None:
            t.add_row(str(j.problem), escape(j.dsl), kernel, f"[red]error[/] {escape(e or '')[:60]}", "", "", "", "")
            continue
        t.add_row(str(v.problem), escape(v.dsl), kernel, "[green]passed[/]" if v.passed else f"[red]{escape(v.reason or '')}[/]",
                  f"{v.speedup:.2f}x" if v.speedup else "", f"{v.candidate_median_us:.1f}" if v.candidate_median_us else "",
                  f"{v.eager_median_us:.1f}" if v.eager_median_us else "", f"{v.wall_s:.1f}" if v.wall_s is not None else "")
    console.print(t)
    n_pass = sum(1 for _, v, _ in results if v is not None and v.passed)
    console.print(f"{n_pass} of {len(results)} passed")


def _short(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


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
