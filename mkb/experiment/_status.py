"""What an experiment's store says now: progress per arm, spend, live claims, and the provisional lift of complete blocks."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table


def print_status(store: str | None, *, experiment: str | None = None, console: Console | None = None) -> None:
    import polars as pl

    from mkb.events import Lease, read, resolve_store
    from mkb.experiment._executor import lease_name
    from mkb.experiment._state import read_state

    console = console or Console()
    st_ = resolve_store(store)
    plans = read("plan", st_)
    if experiment:
        plans = plans.filter(pl.col("experiment") == experiment)
    if plans.height == 0:
        raise ValueError(f"no experiment plan in {st_.url}" + (f" named {experiment!r}" if experiment else "")
                         + "\nhint: `mkb-run run CONFIG --store URL` writes one")
    for row in plans.sort("ts").iter_rows(named=True):
        name = row["experiment"]
        s = read_state(st_, name)
        keys = row["coordinates"]
        t = Table(title=f"experiment {name} (plan {row['plan_sha256'][:12]})", header_style="bold")
        for c in ("arm", "planned", "done", "running", "waiting", "excluded", "abandoned"):
            t.add_column(c, justify="right" if c != "arm" else "left")
        agg: dict[str, list[int]] = {}
        for k in keys:
            arm = k.split("|")[4]
            cs = s.coord(k)
            a = agg.setdefault(arm, [0, 0, 0, 0, 0, 0])
            a[0] += 1
            if cs.scored is not None:
                a[1] += 1
            elif cs.excluded:
                a[4] += 1
            elif cs.attempts and cs.attempts[-1].status is None and Lease.peek(st_, lease_name(k)) is not None:
                a[2] += 1
            else:
                a[3] += 1
            a[5] += sum(1 for x in cs.attempts if x.abandoned)
        for arm, a in agg.items():
            t.add_row(arm, *map(str, a))
        console.print(t)
        cfg = json.loads(row["config"])
        spend: dict[str, float] = {}
        for k in keys:
            for x in s.coord(k).attempts:
                m = k.split("|")[1]
                spend[m] = spend.get(m, 0.0) + s.cost_of(x)
        caps = {m["config"]["name"]: m.get("usd_cap") for m in cfg.get("models", [])}
        console.print("spend: " + ", ".join(f"{m} ${v:,.2f}" + (f" of ${caps[m]:,.2f} cap" if caps.get(m) else "")
                                            for m, v in spend.items()))
    _provisional_lift(st_, console)


def _provisional_lift(store, console: Console) -> None:
    """Lift over the blocks whose every arm and target solo has a verdict: provisional until the experiment ends."""
    import polars as pl

    from mkb.analysis import NOISE_ARM, load_tables

    try:
        tables = load_tables(store, stratify=True)
    except Exception as exc:  # no attempts yet, or nothing graded
        console.print(f"provisional lift: not available yet ({str(exc).splitlines()[0]})")
        return
    pairs = tables.pairs.filter(pl.col("arm_kind") != NOISE_ARM)
    if pairs.height == 0:
        console.print("provisional lift: no complete block yet")
        return
    blk = ["model", "problem", "replicate", "target_dsl", "stratum"]
    n_arms = pairs.group_by(blk).agg(pl.col("arm_kind").n_unique().alias("n"))
    full = n_arms.filter(pl.col("n") == n_arms["n"].max()).drop("n")
    p = pairs.join(full, on=blk, how="inner")
    cell = p.group_by("model", "arm_kind", "direction").agg(
        pl.len().alias("pairs"), pl.col("problem").n_unique().alias("problems"), pl.col("lift").mean().alias("mean_lift"),
        ((pl.col("S").sum() - pl.col("S_solo").sum()) / pl.col("S_solo").sum()).alias("rel_lift")).sort("model", "arm_kind", "direction")
    t = Table(title=f"provisional lift over {full.height} complete block(s) (no CI: see mkb-analyze lift when done); {tables.score_note()}", header_style="bold")
    for c in cell.columns:
        t.add_column(c)
    for r in cell.iter_rows():
        t.add_row(*[f"{v:.3g}" if isinstance(v, float) else str(v) for v in r])
    console.print(t)
