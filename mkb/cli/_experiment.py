"""`mkb-run plan | run | status | regrade`: experiment commands (thin: the work is in mkb.experiment)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

STORE_HELP = "Dataset URL the events go to; default $MKB_STORE, else events/local under the working directory."


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(2)


class _errors:
    """Known failures (a bad store URL, a changed plan, a replay miss) as one named line and exit 2, never a traceback."""

    def __enter__(self):
        return self

    def __exit__(self, tp, exc, tb):
        if exc is None:
            return False
        from mkb.events import StoreError
        from mkb.experiment import ConfigError
        from mkb.experiment._executor import PlanMismatch
        from mkb.experiment._replay import ReplayError
        from mkb.experiment._upstream import UpstreamFormatError

        if isinstance(exc, (StoreError, ConfigError, PlanMismatch, ReplayError, UpstreamFormatError, FileNotFoundError)):
            _fail(str(exc))
        return False


def _load(config: Path):
    from mkb.experiment import ConfigError, build_plan, load_config

    try:
        return build_plan(load_config(config))
    except ConfigError as exc:
        _fail(str(exc))


def print_estimate(plan, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    from mkb.experiment import estimate

    console = console or Console()
    cfg = plan.config
    console.print(f"[bold]experiment {cfg.name}[/]  plan {plan.sha256[:12]}  models {', '.join(m.name for m in cfg.models)}  "
                  f"problems {len(plan.problems)}  DSLs {', '.join(cfg.dsls)}  R={cfg.replicates}  arms {', '.join(cfg.arms)}")
    t = Table(show_header=True, header_style="bold")
    for c in ("figure", "estimate", "upper bound", "how"):
        t.add_column(c, overflow="fold")
    for e in estimate(plan):
        t.add_row(e.name, f"{e.value:,.1f}", "" if e.bound is None else f"{e.bound:,.1f}", e.how)
    console.print(t)


def plan_cmd(
    config: Path = typer.Argument(..., help="Experiment config (TOML)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only print the plan and its estimate; write nothing."),
    list_: bool = typer.Option(False, "--list", help="Also list every coordinate, in release order of the solos."),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
) -> None:
    """Build the plan of CONFIG and print attempts, gradings, GPU-hours, tokens and cost, with how each was estimated."""
    plan = _load(config)
    print_estimate(plan)
    if list_:
        for c in plan.coordinates:
            typer.echo(c.key)
    if not dry_run:
        from mkb.experiment._executor import Executor, PlanMismatch

        try:
            Executor(plan, store=store).publish_plan()
        except PlanMismatch as exc:
            _fail(str(exc))
        typer.echo(f"plan {plan.sha256[:12]} recorded in {store or 'the default store'}")


def _grader(spec: str, store: Optional[str]):
    """The grader `--grader` names (mkb.experiment._graders.grader_from_spec), its errors as CLI errors."""
    from mkb.experiment._graders import grader_from_spec
    from mkb.experiment._replay import ReplayError

    try:
        return grader_from_spec(spec, store)
    except (ReplayError, ValueError) as exc:
        _fail(str(exc))
    except ImportError as exc:
        _fail(f"cannot grade on this host: {exc}\nhint: install the problems and dsl extras, or use --grader replay:DATASET")
    except RuntimeError as exc:
        _fail(str(exc))


def run_cmd(
    config: Path = typer.Argument(..., help="Experiment config (TOML)."),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    grader: str = typer.Option("gpu", "--grader", help="gpu (this host's GPUs), gpu:confined (the same, refusing to grade where a worker cannot be confined), replay:DATASET (recorded verdicts) or none."),
    executor: str = typer.Option("local", "--executor", help="local (one process) or ray (the cluster RAY_ADDRESS names)."),
    rerun_stale: bool = typer.Option(False, "--rerun-stale", help="Re-run coordinates graded under older grader/DSL/doc-pack versions, with their dependents."),
    rerun: bool = typer.Option(False, "--rerun", help="Re-run the --subset (and the arms that consumed its skills) even if finished."),
    subset: List[str] = typer.Option([], "--subset", help="Restrict to coordinates matching KEY=VALUE (model, problem, dsl, arm, replicate); repeatable."),
    ttl_s: float = typer.Option(60.0, "--ttl", help="Claim lease time-to-live in seconds (renewed every ttl/3)."),
    workdir: Optional[Path] = typer.Option(None, "--workdir", help="Where attempt workspaces go (default: a temporary folder)."),
) -> None:
    """Run CONFIG: solos first, then each block's skill arms together; resumable, any number of hosts on one store."""
    from mkb.agent._pace import PacingUnavailable
    from mkb.experiment._executor import Executor, PlanMismatch

    plan = _load(config)
    only = _subset(plan, subset) if subset else None
    if rerun and only is None:
        _fail("--rerun needs a --subset (a rerun of everything is a new experiment)")
    if executor not in ("local", "ray"):
        _fail(f"--executor must be local or ray, not {executor!r}")
    g = _grader(grader, store) if executor == "local" else None  # on Ray each grader actor builds its own
    if executor == "ray" and grader.startswith("replay:"):
        _grader(grader, None)  # a wrong replay dataset is refused here, not inside an actor
    try:
        if executor == "ray":
            from mkb.experiment._ray import run_on_ray

            rep = run_on_ray(plan, store=store, grader_spec=grader, only=only, rerun=only if rerun else (), rerun_stale=rerun_stale)
        elif executor == "local":
            with _live() as (log, progress):
                ex = Executor(plan, store=store, grader=g, ttl_s=ttl_s, workdir=workdir, log=log, progress=progress)
                rep = ex.run(only=only, rerun=only if rerun else (), rerun_stale=rerun_stale)
        else:
            _fail(f"--executor must be local or ray, not {executor!r}")
    except (PlanMismatch, PacingUnavailable) as exc:  # a pacer that cannot start or died: one line, not a traceback
        _fail(str(exc))
    finally:
        if g is not None and hasattr(g, "close"):
            g.close()
    for line in rep.lines():
        typer.echo(line)
    raise typer.Exit(0 if rep.complete else 1)


class _live:
    """A rich status line (done / running / waiting, gradings queued, tokens, cost, ETA) above the log lines."""

    def __enter__(self):
        from rich.console import Console
        from rich.live import Live

        self.console = Console(stderr=True)
        self.live = Live("", console=self.console, transient=True, refresh_per_second=2)
        self.live.start()
        return (lambda s: self.live.console.print(s, markup=False, highlight=False)), (lambda p: self.live.update(p.line()))

    def __exit__(self, *exc):
        self.live.stop()


def _subset(plan, items: list[str]):
    keys = {"model": "models", "problem": "problems", "dsl": "dsls", "arm": "arms", "replicate": "replicates"}
    f: dict[str, list] = {}
    for it in items:
        k, _, v = it.partition("=")
        if k not in keys or not v:
            _fail(f"--subset {it!r}: expected KEY=VALUE with KEY one of {', '.join(keys)}")
        f.setdefault(keys[k], []).extend(int(x) if k in ("problem", "replicate") else x for x in v.split(","))
    sel = plan.select(**f)
    if not sel:
        _fail(f"--subset {' '.join(items)} matches no coordinate of the plan")
    return sel


def status_cmd(store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
               experiment: Optional[str] = typer.Option(None, "--experiment", help="Which experiment (default: every one in the store).")) -> None:
    """Progress of a running or finished experiment, and the provisional lift of the blocks complete so far."""
    from mkb.experiment._status import print_status

    try:
        print_status(store, experiment=experiment)
    except (FileNotFoundError, ValueError) as exc:
        _fail(str(exc))


def regrade_cmd(config: Path = typer.Argument(..., help="The experiment's config (TOML)."),
                store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
                grader: str = typer.Option("gpu", "--grader", help="gpu, gpu:confined or replay:DATASET.")) -> None:
    """Pair re-grade every complete (model, problem, replicate) not yet re-graded by this grader: a new stratum, attempts untouched."""
    from mkb.experiment._executor import Executor
    from mkb.experiment._state import read_state

    plan = _load(config)
    g = _grader(grader, store)
    if g is None:
        _fail("regrade needs a grader")
    try:
        ex = Executor(plan, store=store, grader=g, log=typer.echo, versions={})
        n = ex.regrade_pairs(read_state(ex.store, plan.config.name), fresh_grader=True)
    finally:
        if hasattr(g, "close"):
            g.close()
    typer.echo(f"{n} pair batch(es) re-graded")


def reproduce_cmd(
    dataset: str = typer.Argument(..., help="A dataset (store URL) holding an experiment's plan event."),
    store: Optional[str] = typer.Option(None, "--store", help="Where the re-run writes; " + STORE_HELP),
    experiment: Optional[str] = typer.Option(None, "--experiment", help="Which experiment of DATASET (default: its only one)."),
    grader: str = typer.Option("gpu", "--grader", help="gpu, gpu:confined, replay:DATASET or none."),
    subset: List[str] = typer.Option([], "--subset", help="KEY=VALUE (model, problem, dsl, arm, replicate); repeatable."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and its estimate only."),
) -> None:
    """Re-run the experiment recorded in DATASET from its plan event (same config, seeds, derangement, placebo notes)."""
    import json

    import polars as pl

    from mkb.events import read
    from mkb.experiment import ConfigError, build_plan
    from mkb.experiment._config import config_from_dict
    from mkb.experiment._executor import Executor, PlanMismatch

    try:
        plans = read("plan", dataset)
    except Exception as exc:  # noqa: BLE001 - a wrong path or an unreadable store: one line, named
        _fail(f"{dataset}: cannot read its plan events: {str(exc).splitlines()[0]}")
    if experiment:
        plans = plans.filter(pl.col("experiment") == experiment)
    names = sorted(set(plans["experiment"]))
    if len(names) != 1:
        _fail(f"{dataset}: {'no experiment plan' if not names else 'experiments ' + ', '.join(names)}"
              + ("" if not names else "\nhint: pick one with --experiment"))
    row = plans.sort("ts").row(0, named=True)
    try:
        plan = build_plan(config_from_dict(json.loads(row["config"])))
    except (ConfigError, TypeError, KeyError) as exc:
        _fail(f"{dataset}: its plan cannot be rebuilt here: {exc}")
    if plan.sha256 != row["plan_sha256"]:
        then = dict(zip(row["problems"], row["problem_hashes"]))
        changed = [p for p, h in then.items() if plan.problems[int(p)].hash != h]
        typer.echo(f"note: this re-run's plan is {plan.sha256[:12]}, the dataset's {row['plan_sha256'][:12]}"
                   + (f": problem(s) {', '.join(changed)} changed since (the analysis stratifies by problem hash)" if changed else
                      " (the plan definition, placebo notes, tokenizer or derangement differ)"))
    print_estimate(plan)
    if dry_run:
        return
    only = _subset(plan, subset) if subset else None
    g = _grader(grader, store)
    try:
        rep = Executor(plan, store=store, grader=g, log=typer.echo).run(only=only)
    except PlanMismatch as exc:
        _fail(str(exc))
    finally:
        if g is not None and hasattr(g, "close"):
            g.close()
    for line in rep.lines():
        typer.echo(line)
    raise typer.Exit(0 if rep.complete else 1)


def import_upstream_cmd(
    results: Path = typer.Argument(..., help="Upstream's results.json (YIGE24/MetaKernelBench `metakernelbench results`)."),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    experiment: Optional[str] = typer.Option(None, "--experiment", help="Experiment name for the imported attempts."),
) -> None:
    """Import upstream MetaKernelBench's results.json as mkb events, so its numbers can be analysed beside mkb's."""
    from mkb.experiment._upstream import UpstreamFormatError, import_results

    try:
        rep = import_results(results, store, experiment=experiment)
    except UpstreamFormatError as exc:
        _fail(str(exc))
    typer.echo(rep.line())


def _guarded(fn):
    import functools

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        with _errors():
            return fn(*a, **kw)

    return wrapper


def register(app: typer.Typer) -> None:
    for name, fn in (("plan", plan_cmd), ("run", run_cmd), ("status", status_cmd), ("regrade", regrade_cmd),
                     ("reproduce", reproduce_cmd), ("import-upstream", import_upstream_cmd)):
        app.command(name)(_guarded(fn))
