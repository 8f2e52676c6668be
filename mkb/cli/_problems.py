"""`mkb-run problems ...` (list, show, prompt, audit, diff-upstream, speed-table), `mkb-run characterise` and `mkb-run torch-compile`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="List, show, audit and render the benchmark problems.", no_args_is_help=True)
    app.add_typer(group, name="problems")

    @group.command("list")
    def list_(family: Optional[str] = typer.Option(None, "--family", "-f", help="Only this family."),
              gpu: str = typer.Option("H200", help="GPU whose peaks give the speed-of-light column.")) -> None:
        """Table of problems: number, family, name, dtypes, FLOPs, bytes, peak, speed of light."""
        from rich.console import Console
        from rich.table import Table

        from mkb.problems import problems
        from mkb.problems._catalog import catalog_row, si

        t = Table(title=f"mkb problems (speed of light on {gpu})")
        for col in ("#", "family", "name", "dtypes", "FLOPs", "bytes", "peak", "SoL us"):
            t.add_column(col, justify="right" if col in ("#", "FLOPs", "bytes", "SoL us") else "left")
        ps = problems(family=family)
        for p in ps:
            r = catalog_row(p, gpu=gpu)
            t.add_row(f"{r.number:02d}", r.family, r.name, r.dtypes, si(r.flops), si(r.bytes, "B"), r.peak, f"{r.sol_us:.1f}")
        c = Console(width=max(Console().width, 150))
        c.print(t)
        counts: dict[str, int] = {}
        for p in ps:
            counts[p.meta.family] = counts.get(p.meta.family, 0) + 1
        c.print(f"{len(ps)} problems: " + ", ".join(f"{fam} {n}" for fam, n in counts.items()))

    @group.command("show")
    def show(problem: str = typer.Argument(..., help="Number (28), name or NN_name.")) -> None:
        """One problem in full: metadata, input shapes (smoke and full), compare modes, source config."""
        from rich.console import Console

        from mkb.measure import speed_of_light
        from mkb.problems import get_problem
        from mkb.problems._catalog import describe_inputs, format_shape, si

        p = get_problem(problem)
        m = p.meta
        sol = speed_of_light(flops=m.flops, bytes=m.bytes, peak=m.peak)
        c = Console(highlight=False)
        c.print(f"[bold]{m.number:02d} {m.name}[/bold]  ({m.family}; {', '.join(m.dtypes)})")
        c.print(f"file: {p.path}\nhash: {p.hash}")
        c.print(f"source: {m.source_model}\nconfig: {m.source_config}")
        c.print(f"FLOPs {si(m.flops)}, bytes {si(m.bytes, 'B')}, peak {m.peak}; speed of light (H200) {sol.us:.1f} us ({sol.bound}-bound)")
        c.print("outputs: " + ", ".join(f"{o.name} ({o.compare})" for o in m.outputs))
        c.print(f"mutates: {', '.join(m.mutates) or '-'}   structure inputs: {', '.join(m.structure_inputs) or '-'}"
                f"   fixed inputs: {', '.join(m.fixed_inputs) or '-'}")
        if m.upstream is not None:
            c.print(f"upstream ({m.upstream.source}): matches {', '.join(m.upstream.matches) or '-'}; differs "
                    f"{', '.join(a for a, _ in m.upstream.differs) or '-'} (`mkb-run problems diff-upstream` says why)")
        c.print(f"eager: {'own eager()' if p.has_eager else 'the reference'}   exact: {m.exact_reason or '-'}")
        for name, why in m.insensitive_inputs:
            c.print(f"insensitive at full size (audit-exempt): {name}: {why}")
        for size in ("smoke", "full"):
            c.print(f"{size} inputs:")
            for s in describe_inputs(p, size=size):
                c.print(f"  {format_shape(s)}")
        if m.notes:
            c.print(f"notes: {m.notes}")

    @group.command("prompt")
    def prompt(problem: str = typer.Argument(...), dsl: str = typer.Option(..., "--dsl", help="cute, tirx, ...")) -> None:
        """Print the task statement of a problem for one DSL."""
        from mkb.problems import get_problem
        from mkb.problems._prompts import task_statement

        typer.echo(task_statement(get_problem(problem), dsl).text)

    @group.command("audit")
    def audit(family: Optional[str] = typer.Option(None, "--family", "-f"),
              problem: Optional[str] = typer.Option(None, "--problem", "-p"),
              size: str = typer.Option("smoke", help="smoke (CPU, CI) or full (the GPU host)."),
              device: str = typer.Option("cpu", help="cpu or cuda.")) -> None:
        """Run the audit (degenerate outputs fail, sensitivity, per-draw structure, fp64 gap, smoke speed, eager)."""
        from rich.console import Console

        from mkb.problems import get_problem, problems
        from mkb.problems._audit import audit_many

        if size not in ("smoke", "full"):
            typer.echo(f"unknown size {size!r}\nhint: smoke or full", err=True)
            raise typer.Exit(2)
        ps = (get_problem(problem),) if problem else problems(family=family)
        c = Console()
        bad = 0
        for p, rep, secs in audit_many(ps, size=size, device=device):
            bad += not rep.ok
            ref = f"reference {rep.reference_s * 1e3:.1f} ms" if size == "smoke" else f"{secs:.1f} s"
            c.print(f"{'[green]ok[/green]  ' if rep.ok else '[red]FAIL[/red]'} {p.slug}  ({ref})")
            for ch in rep.checks:
                if not ch.ok:
                    c.print(f"      {ch.name}: {ch.detail}")
        raise typer.Exit(1 if bad else 0)

    @group.command("diff-upstream")
    def diff_upstream(
        markdown: bool = typer.Option(False, "--markdown", help="Print the markdown table instead of text."),
        write: bool = typer.Option(False, "--write", help="Write the table into --out (between its markers)."),
        check: bool = typer.Option(False, "--check", help="Exit 1 when --out's table differs from the problems (for CI)."),
        out: Optional[Path] = typer.Option(None, "--out", help="The README holding the table (default: problems/README.md)."),
        family: Optional[str] = typer.Option(None, "--family", "-f", help="Only this family (printing only)."),
    ) -> None:
        """Per problem, what matches upstream MetaKernelBench and what differs, with the reason."""
        from mkb.problems import problems
        from mkb.problems._loader import problems_root
        from mkb.problems._upstream import render_markdown, render_readme, render_text, upstream_rows

        if (write or check) and family:
            typer.echo("--family selects what is printed; the README table covers every problem\n"
                       "hint: drop --family with --write/--check", err=True)
            raise typer.Exit(2)
        rows = upstream_rows(problems(family=family))
        if write or check:
            target = out or (problems_root() / "README.md")
            current = target.read_text() if target.exists() else ""
            text = render_readme(current, rows)
            if check:
                if current != text:
                    typer.echo(f"{target} is out of date\nhint: run `mkb-run problems diff-upstream --write`", err=True)
                    raise typer.Exit(1)
                typer.echo(f"{target} is up to date")
                return
            target.write_text(text)
            typer.echo(f"wrote {target}")
            return
        typer.echo(render_markdown(rows) if markdown else render_text(rows), nl=False)

    @group.command("speed-table")
    def speed_table(
        write: bool = typer.Option(False, "--write", help="Write the table into --out (between its markers)."),
        check: bool = typer.Option(False, "--check", help="Exit 1 when --out's table differs from the datasets (for CI)."),
        out: Optional[Path] = typer.Option(None, "--out", help="The README holding the table (default: problems/README.md)."),
        store: Optional[list[str]] = typer.Option(None, "--store", help="Datasets to read (repeatable; default: every events/h200-*)."),
    ) -> None:
        """Per baseline: median us, speedup vs eager and vs torch.compile, fraction of speed of light, from the GPU datasets."""
        from mkb.cli._exit import BAD_INPUT, CHECK_FAILED, fail
        from mkb.problems._loader import problems_root
        from mkb.problems._speed import default_stores, render_markdown, render_readme, speed_rows

        stores = list(store) if store else default_stores()
        if not stores:
            fail(BAD_INPUT, "no dataset to read\nhint: pass --store, or run from a checkout with events/h200-*")
        rows, missing = speed_rows(stores)
        if not (write or check):
            typer.echo(render_markdown(rows, missing), nl=False)
            return
        target = out or (problems_root() / "README.md")
        current = target.read_text() if target.exists() else ""
        text = render_readme(current, rows, missing)
        if check:
            if current != text:
                typer.echo(f"{target} is out of date\nhint: run `mkb-run problems speed-table --write`", err=True)
                raise typer.Exit(CHECK_FAILED)
            typer.echo(f"{target} is up to date")
            return
        target.write_text(text)
        typer.echo(f"wrote {target}")

    @app.command("characterise")
    def characterise(
        store: Optional[str] = typer.Option(None, "--store", help="Event store URL (default: MKB_STORE or events/local)."),
        size: str = typer.Option("full", help="full (GPU) or smoke."),
        device: Optional[str] = typer.Option(None, help="cuda (default when available) or cpu."),
        family: Optional[str] = typer.Option(None, "--family", "-f"),
        problem: Optional[list[str]] = typer.Option(None, "--problem", "-p", help="Only these problems (repeatable)."),
        budget_s: float = typer.Option(330.0, help="Total wall-clock budget; slow problems get fewer timed calls."),
    ) -> None:
        """Measure every problem (eager median, peak memory, fp64 gap, speed of light) and write characterisation events."""
        from mkb.problems._characterise import run_characterisation

        run_characterisation(store=store, size=size, device=device, family=family, only=problem, budget_s=budget_s)

    @app.command("torch-compile")
    def torch_compile_cmd(
        store: Optional[str] = typer.Option(None, "--store", help="Event store URL (default: MKB_STORE or events/local)."),
        size: str = typer.Option("full", help="full (GPU) or smoke."),
        device: Optional[str] = typer.Option(None, help="cuda (default when available) or cpu."),
        family: Optional[str] = typer.Option(None, "--family", "-f"),
        problem: Optional[list[str]] = typer.Option(None, "--problem", "-p", help="Only these problems (repeatable)."),
        mode: Optional[list[str]] = typer.Option(None, "--mode", "-m", help="default, max-autotune-no-cudagraphs (repeatable; default both)."),
        cap_default_s: float = typer.Option(240.0, "--cap-default-s", help="Per-problem compile cap of mode default."),
        cap_autotune_s: float = typer.Option(150.0, "--cap-autotune-s", help="Per-problem compile cap of max-autotune-no-cudagraphs."),
        budget_s: float = typer.Option(480.0, "--budget-s", help="Wall-clock budget: stops cleanly before it; the next run resumes."),
        concurrency: Optional[int] = typer.Option(None, "--concurrency", help="Compile workers at once (default 3/4 of the cores)."),
        compile_threads: int = typer.Option(1, "--compile-threads", help="TORCHINDUCTOR_COMPILE_THREADS per worker."),
        cache_dir: Optional[str] = typer.Option(None, "--cache-dir", help="The run's shared inductor/triton cache (default: a fresh temp dir)."),
        worker_log: Optional[str] = typer.Option(None, "--worker-log", help="Where the workers' output goes (default: this terminal)."),
        peaks_from: Optional[list[str]] = typer.Option(None, "--peaks-from", help="Characterisation datasets whose eager peaks estimate each task's GPU memory (repeatable)."),
        memory_fraction: float = typer.Option(0.85, "--memory-fraction", help="Share of the GPU's memory the running tasks' expected peaks may sum to."),
        gpu_memory_gib: Optional[float] = typer.Option(None, "--gpu-memory-gib", help="The GPU's memory (default: nvidia-smi's figure)."),
    ) -> None:
        """torch.compile each problem's eager (per mode), check it, time it beside eager on a quiet GPU: torch_compile events.

        Resumable: what the store already holds for this problem hash, torch version, GPU model and mode is skipped.
        Workers start only as far as their expected GPU memory peaks fit beside the running ones; one too big runs alone.
        """
        from mkb.cli._exit import BAD_INPUT, fail
        from mkb.problems._torch_compile import MODES, run_torch_compile

        try:
            run_torch_compile(store=store, size=size, device=device, family=family, only=problem,
                                    modes=tuple(mode) if mode else MODES, budget_s=budget_s, concurrency=concurrency,
                                    compile_threads=compile_threads, cache_dir=cache_dir, worker_log=worker_log,
                                    caps={"default": cap_default_s, "max-autotune-no-cudagraphs": cap_autotune_s},
                                    peak_stores=peaks_from or (), memory_fraction=memory_fraction,
                                    device_memory_bytes=int(gpu_memory_gib * 2**30) if gpu_memory_gib else None)
        except ValueError as exc:
            fail(BAD_INPUT, str(exc))
