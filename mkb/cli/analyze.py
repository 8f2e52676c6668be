"""`mkb-analyze`: the read side's command line (thin: it parses, calls mkb.analysis and prints rich tables)."""

from __future__ import annotations

import os
import sys
from typing import Optional

# polars' allocator (jemalloc) keeps the pages of freed frames for ~10 s before it gives them back: an analysis makes and
# drops frames of millions of rows one after another, and at 10M events the pages held that way were a quarter of the
# process's peak memory (1.16 -> 0.93 GiB). Given back after ~50 ms instead, for more system time (the pages faulted in
# again: at 10M events ~2 s of CPU, ~1 s wall, measured 2026-12-02). Read when polars loads, so set before anything
# imports it; a value the user set is kept
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:50,muzzy_decay_ms:0")
# numpy asks the kernel for huge pages on every array of 4 MiB or more (the bootstrap's product buffers, ~25 MiB a thread,
# its resample weights), and a kernel that compacts memory on such faults (THP defrag "madvise") stalls in them: a process
# running the lift table's bootstrap at 10M events spent ~1.3 s in system time on huge pages, ~0.9 s on small ones. Read
# when numpy loads, so set before anything imports it; a value the user set is kept. (glibc's malloc thresholds fixed as
# well took it to ~0.3 s, but the freed blocks kept in the heap raised the peak at 10M events to 0.99-1.04 GiB: not set.)
os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")

import typer  # noqa: E402
from rich.console import Console

app = typer.Typer(
    name="mkb-analyze",
    help="Analyse an mkb event store (any fsspec URL): lift, standing, mixed models, reports, exports.",
    no_args_is_help=False, invoke_without_command=True, pretty_exceptions_show_locals=False,
)
console = Console(width=200)


class Table:
    """A rich Table for a screenful of rows; past that, the same box drawn as plain lines (cell markup dropped).

    Rich measures and wraps every cell (~0.3 ms each): a few hundred rows of a 15-column table took seconds,
    most of `lift`'s time at experiment scale. Print it with `_print_table`, which lets long lines run past the
    console width rather than cropping them.
    """

    FAST_ROWS = 60

    def __init__(self, title: str | None = None, **kw) -> None:
        self.title, self.kw = title, kw
        self.columns: list[tuple[str, str]] = []
        self.rows: list[tuple[str, ...]] = []

    def add_column(self, header: str, justify: str = "left", **kw) -> None:
        self.columns.append((header, justify))

    def add_row(self, *cells: str) -> None:
        self.rows.append(tuple("" if c is None else str(c) for c in cells))

    def rich(self):
        from rich.table import Table as _RichTable  # here: a command whose tables are all long draws none (~5 ms of import)

        t = _RichTable(title=self.title, **self.kw)
        for h, j in self.columns:
            t.add_column(h, justify=j)
        for r in self.rows:
            t.add_row(*r)
        return t

    def plain(self) -> str:
        from rich.text import Text

        rows = [tuple(Text.from_markup(c).plain if "[" in c else c for c in r) for r in self.rows]
        w = [max([len(h)] + [len(r[i]) for r in rows]) for i, (h, _) in enumerate(self.columns)]
        cell = lambda v, i: v.rjust(w[i]) if self.columns[i][1] == "right" else v.ljust(w[i])  # noqa: E731
        line = lambda l, m, r, f: l + m.join(f * (x + 2) for x in w) + r  # noqa: E731
        out = [line("┏", "┳", "┓", "━"), "┃" + "┃".join(f" {h.ljust(w[i])} " for i, (h, _) in enumerate(self.columns)) + "┃",
               line("┡", "╇", "┩", "━")]
        out += ["│" + "│".join(f" {cell(v, i)} " for i, v in enumerate(r)) + "│" for r in rows]
        out.append(line("└", "┴", "┘", "─"))
        if self.title:
            out.insert(0, self.title.center(len(out[0])))
        return "\n".join(out)


def _print_table(tbl: Table) -> None:
    if len(tbl.rows) <= Table.FAST_ROWS:
        console.print(tbl.rich())
    else:
        console.print(tbl.plain(), markup=False, highlight=False, soft_wrap=True)

STORE = typer.Option(None, "--store", help="Event store URL (local path, s3://, gs://, hf://...); default $MKB_STORE or events/local.")
STRATIFY = typer.Option(False, "--stratify", help="Analyse each version stratum separately instead of refusing mixed versions.")
SEED = typer.Option(20261129, "--seed", help="Bootstrap seed (recorded in the output).")
RESAMPLES = typer.Option(10_000, "--resamples", help="Bootstrap resamples.")
SCORE = typer.Option(None, "--score", help="The score every S, speedup and R@t is read as: s (speedup over eager, mkb's S) or "
                     "s_upstream (over the problem's fp32 reference timed as upstream MetaKernelBench times it). "
                     "Default: the one the experiment's plan names (s without a plan).")


from mkb.cli._exit import BAD_INPUT as EXIT_BAD_INPUT, ERROR as EXIT_ERROR, NO_DATA as EXIT_NO_DATA  # the one table (DESIGN)


def _fail(msg: str, code: int = EXIT_BAD_INPUT) -> None:
    console.print(f"[red]error:[/red] {msg}")
    raise typer.Exit(code)


def _need_arms(t) -> None:
    """Lift, standing and reports compare arms with solos: a store of solos alone has nothing to compare."""
    import polars as pl

    if not t.pairs.select((pl.col("arm_kind") != "solo_noise").any()).item():  # no filtered copy of the pairs
        kinds = sorted(t.included["arm_kind"].unique().to_list())
        what = ("holds only solo attempts: there is no arm to compare with a solo" if kinds == ["solo"] else
                f"has no arm paired with a solo of its target DSL, same model, problem and replicate (arms: {', '.join(kinds)})")
        _fail(f"store {t.store} {what}\nhint: `mkb-analyze attempts --store {t.store}` lists what is there; a block's skill "
              "arms run after its solos",
              EXIT_NO_DATA)


def _counts(store) -> dict[str, int]:
    import warnings

    import polars as pl

    from mkb.events import resolve_store, scan, schemas

    st = resolve_store(store)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # skipped files are reported by the commands that read them
        for kind in sorted(schemas()):
            n = scan(kind, st, dedupe=False).select(pl.len()).collect().item()
            if n:
                out[kind] = n
    return out


def _load(store, stratify: bool, *, columns: str = "all", score: str | None = None, score_from: str | None = None):
    """The tables, or None after printing what the store holds when it has no attempts (`columns`, `score`: see load_tables;
    `score_from`: where a `score` the command chose came from)."""
    from mkb.analysis import MixedVersionsError, ScoreError, load_tables

    try:
        t = load_tables(store, stratify=stratify, columns=columns, score=score)
    except (MixedVersionsError, ScoreError) as exc:
        _fail(str(exc))
    if score_from is not None:
        t.score_from = score_from
    if t.attempts.height == 0:
        counts = _counts(store)
        console.print(f"store {t.store}: no attempts (events: {counts or 'none'})")
        if counts.get("characterisation") or counts.get("torch_compile"):
            console.print("this is a characterisation dataset; its problems:")
            _print_problems(store)
        elif counts.get("verdict"):
            console.print("this is a grading dataset (verdicts without attempts); its verdicts:")
            _print_verdicts(store)
        else:
            console.print("hint: write a demo dataset with `mkb-analyze synth --store DIR`")
        return None
    _header(t)
    return t


def _header(t) -> None:
    s = t.summary()
    console.print(f"[bold]store[/bold] {t.store}  attempts {s['attempts']}, counted {s['included']}"
                  + ("  [yellow]stratified by version[/yellow]" if t.stratified else "") + f"  {t.score_note()}")
    console.print(t.verdict_note())
    ex = t.attempts.filter(t.attempts["excluded"].is_not_null())
    if ex.height:
        console.print(f"excluded and reported: infra_error {s['infra_error']}, unfinished {s['unfinished']}, "
                      f"annotated {s['annotated']}, ungraded {s['ungraded']} (list them: `mkb-analyze attempts --excluded`)")
    if s["s_mismatch"]:
        console.print(f"[yellow]note:[/yellow] {s['s_mismatch']} verdicts stored an S that differs from S recomputed from passed/speedup; "
                      "the recomputed one is used")
    for path, why in t.skipped_files.items():
        console.print(f"[yellow]skipped file[/yellow] {path}: {why}")


JSON = typer.Option(None, "--json", help="Write every table of this command as JSON to this file ('-': stdout, nothing else printed).")
CSV = typer.Option(None, "--csv", help="Write the main table as CSV to this file (other tables beside it as <stem>.<table>.csv).")


def _quiet(json_path: str | None) -> None:
    """`--json -` owns stdout: the human tables are not printed."""
    console.quiet = json_path == "-"


def _emit(tables: dict, *, json_path: str | None, csv_path: str | None, meta: dict | None = None) -> None:
    """The machine-readable output every command offers: all its tables as JSON, and as CSV (the first is the main one)."""
    import json
    import math
    from pathlib import Path

    import polars as pl

    tables = {k: v for k, v in tables.items() if v is not None}
    if json_path:
        def clean(v):
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if isinstance(v, list):
                return [clean(x) for x in v]
            return v

        def rows(df: pl.DataFrame) -> list[dict]:
            # NaN and infinities become null in polars (JSON has no such numbers); only list columns need the Python walk
            floats = [c for c, ty in df.schema.items() if ty in (pl.Float32, pl.Float64)]
            out = df.with_columns(pl.when(pl.col(c).is_finite()).then(pl.col(c)).alias(c) for c in floats).to_dicts()
            if any(isinstance(ty, pl.List) for ty in df.schema.values()):
                out = [{c: clean(x) for c, x in row.items()} for row in out]
            return out

        def write(out) -> None:
            """json.dumps({**meta, "tables": {name: rows}}, default=str), written a slice of rows at a time: the same text
            without a table's rows all held as dicts and the document as one string (the output's peak memory at scale)."""
            enc = lambda v: json.dumps(v, default=str)  # noqa: E731  (no indent: the C encoder, several times faster)
            head = {k: v for k, v in (meta or {}).items() if k != "tables"}
            out.write("{" + "".join(f"{enc(k)}: {enc(v)}, " for k, v in head.items()) + '"tables": {')
            for i, (name, df) in enumerate(tables.items()):
                out.write((", " if i else "") + enc(name) + ": [")
                sep = ""
                for part in df.iter_slices(4096):
                    body = enc(rows(part))[1:-1]  # a slice's rows as the list's encoder writes them, brackets off
                    if body:
                        out.write(sep + body)
                        sep = ", "
                out.write("]")
            out.write("}}")

        if json_path == "-":
            console.quiet = False
            write(sys.stdout)
            sys.stdout.write("\n")
        else:
            with open(json_path, "w") as f:
                write(f)
    if csv_path:
        base = Path(csv_path)
        for i, (name, df) in enumerate(tables.items()):
            flat = df.select([c for c, ty in df.schema.items() if not isinstance(ty, (pl.List, pl.Struct, pl.Object))])
            path = base if i == 0 else base.with_name(f"{base.stem}.{name}{base.suffix or '.csv'}")
            flat.write_csv(path)


def _meta(t, spec=None) -> dict:
    out = {"store": t.store, "stratified": t.stratified, "score": t.score, "score_from": t.score_from, "summary": t.summary()}
    if spec is not None:
        out["bootstrap"] = {"seed": spec.seed, "resamples": spec.resamples, "level": spec.level, "method": spec.describe()}
    return out


def _pct(v) -> str:
    return "" if v is None else f"{100 * v:+.1f}%"


def _f(v, nd=1) -> str:
    return "" if v is None else f"{v:.{nd}f}"


def _p(v) -> str:
    return "" if v is None else (f"{v:.3f}" if v >= 0.001 else f"{v:.1e}")


def print_lift(lift, *, spec, title="Lift", max_rows: int | None = 120, notes: bool = True) -> None:
    full = lift
    if max_rows is not None and lift.height > max_rows:
        lift = lift.head(max_rows)
    multi = full["stratum"].n_unique() > 1
    tbl = Table(title=title, show_lines=False)
    for c in (("stratum",) if multi else ()) + ("model", "arm", "direction", "pairs", "probs", "S solo", "S arm", "lift [95% CI]",
              "rel. lift [95% CI]", "±", "reg/imp/tie (problems)", "pairs reg/imp/tie", "p Wilcoxon (Holm)", "p McNemar (Holm)",
              "p pass, by problem (Holm)", "10%?"):
        tbl.add_column(c, justify="right" if c not in ("model", "arm", "direction", "stratum") else "left")
    for r in lift.iter_rows(named=True):
        tbl.add_row(*([r["stratum"]] if multi else []), r["model"], r["arm_kind"], r["direction"], str(r["n_pairs"]), str(r["n_problems"]),
                    _f(r["S_solo"]), _f(r["S_arm"]), f"{_f(r['lift'], 2)} [{_f(r['lift_lo'], 2)}, {_f(r['lift_hi'], 2)}]",
                    f"{_pct(r['rel_lift'])} [{_pct(r['rel_lo'])}, {_pct(r['rel_hi'])}]", _f(100 * r["rel_halfwidth"]) if r["rel_halfwidth"] is not None else "",
                    f"{_f(100 * r['regression_rate'], 0)}/{_f(100 * r['improvement_rate'], 0)}/{_f(100 * r['tie_rate'], 0)}%",
                    f"{_f(100 * r['pair_regress'], 0)}/{_f(100 * r['pair_improve'], 0)}/{_f(100 * r['pair_tie'], 0)}%",
                    _p(r.get("p_wilcoxon_holm")), _p(r.get("p_mcnemar_holm")), _p(r.get("p_pass_clustered_holm")),
                    "yes" if r["detects_10pct"] else "[red]no[/red]")
    _print_table(tbl)
    if not notes:
        return
    if full.height > lift.height:
        console.print(f"[yellow]showing {lift.height} of {full.height} cells[/yellow] (ordered by arm, then model): "
                      "--all prints every one, --csv FILE writes them")
    lift = full
    hw = lift["rel_halfwidth"].drop_nulls()
    console.print(f"{spec.describe()}. CI half-width of relative lift: median {100 * hw.median():.1f} points "
                  f"(range {100 * hw.min():.1f}-{100 * hw.max():.1f})." if hw.len() else spec.describe())
    under = lift.filter(~lift["detects_10pct"].fill_null(False))
    if under.height:
        console.print(f"[yellow]{under.height} of {lift.height} cells could not detect a 10% lift[/yellow] at 80% power "
                      "(95% CI half-width > 7 points; `mkb-analyze power` says what would): "
                      + ", ".join(f"{r['model']} {r['arm_kind']} {r['direction']}" for r in under.head(20).iter_rows(named=True))
                      + (" ..." if under.height > 20 else ""))
    console.print("Wilcoxon: signed-rank, zero_method='pratt', normal approximation, on problem replicate-mean lift; McNemar: exact, pass vs pass "
                  "of pairs; Holm across the model x direction cells of each arm kind.")


@app.callback()
def main_callback(ctx: typer.Context, store: Optional[str] = STORE) -> None:
    """With no command: what the store holds (and, for a characterisation dataset, its problems)."""
    if ctx.invoked_subcommand is not None:
        return
    counts = _counts(store)
    from mkb.events import resolve_store

    console.print(f"store {resolve_store(store).url}: events {counts or 'none'}")
    if counts.get("attempt_started"):
        console.print("commands: lift, standing, models, attempts, report, export (see --help)")
    elif counts.get("characterisation") or counts.get("torch_compile"):
        _print_problems(store)
    else:
        console.print("hint: write a demo dataset with `mkb-analyze synth --store DIR`")


def _spec(seed, resamples):
    from mkb.analysis import BootstrapSpec

    return BootstrapSpec(seed=seed, resamples=resamples)


@app.command()
def lift(store: Optional[str] = STORE, stratify: bool = STRATIFY, seed: int = SEED, resamples: int = RESAMPLES,
         by_family: bool = typer.Option(False, "--by-family", help="Also per problem family."),
         by_problem: bool = typer.Option(False, "--by-problem", help="Also one row per problem (model x arm x direction x problem)."),
         all_rows: bool = typer.Option(False, "--all", help="Print every cell (default: the first 120)."),
         score: Optional[str] = SCORE, json_out: Optional[str] = JSON, csv: Optional[str] = CSV) -> None:
    """Lift and relative lift per model x arm x direction (and pooled), with problem-clustered CIs on lift and rates,
    the regression rate's noise floor, S_sol, the time-matched contrast (transfer - placebo, transfer - wrong) and a
    sensitivity row without flagged skills."""
    _quiet(json_out)
    t = _load(store, stratify, columns="lift", score=score)
    if t is None:
        return
    _need_arms(t)
    import polars as pl

    from mkb.analysis import contrast_table, lift_table, problem_table
    from mkb.analysis._tables import SENSITIVE_FLAGS

    spec = _spec(seed, resamples)
    # what the output records of the attempts, read off now: nothing below reads them, so they are let go before the
    # tables are made (at 10M events, 2M rows held through every bootstrap otherwise)
    meta = _meta(t, spec)
    t.attempts = t.attempts.clear()
    lt = lift_table(t.pairs, spec=spec, pooled=True)
    print_lift(lt, spec=spec, max_rows=None if all_rows else 120)
    limit = None if all_rows else 120
    print_rates(lt, max_rows=limit)
    ct = contrast_table(t.pairs, spec=spec)
    print_contrast(ct, max_rows=limit)
    flagged = t.pairs.filter(pl.col("skill_flagged") & pl.col("arm_kind").is_in(["transfer", "same", "wrong"]))
    sens = None
    if flagged.height:
        sens = lift_table(t.pairs.filter(~pl.col("skill_flagged")), spec=spec, tests=False).filter(pl.col("arm_kind") == "transfer")
        print_lift(sens, spec=spec, title=f"Sensitivity: transfer without the {flagged.height} arms given a skill flagged "
                   f"{' or '.join(SENSITIVE_FLAGS)}", max_rows=None, notes=False)
    else:
        console.print(f"sensitivity: no arm received a skill flagged {' or '.join(SENSITIVE_FLAGS)} (the row would equal the table)")
    fam = None
    if by_family:
        fam = lift_table(t.pairs, by=("family",), spec=spec, tests=False)
        tbl = Table(title="Relative lift by family")
        for c in ("model", "arm", "direction", "family", "pairs", "rel. lift [95% CI]", "10%?"):
            tbl.add_column(c)
        for r in fam.iter_rows(named=True):
            tbl.add_row(r["model"], r["arm_kind"], r["direction"], r["family"], str(r["n_pairs"]),
                        f"{_pct(r['rel_lift'])} [{_pct(r['rel_lo'])}, {_pct(r['rel_hi'])}]", "yes" if r["detects_10pct"] else "no")
        _print_table(tbl)
    prob = None
    if by_problem:
        prob = problem_table(t.pairs)
        tbl = Table(title=f"Per problem ({prob.height} rows)")
        for c in ("model", "arm", "direction", "problem", "family", "pairs", "S solo", "S arm", "lift", "lift S_sol"):
            tbl.add_column(c)
        for r in prob.head(None if all_rows else 200).iter_rows(named=True):
            tbl.add_row(r["model"], r["arm_kind"], r["direction"], str(r["problem"]), r["family"], str(r["n_pairs"]), _f(r["S_solo"]),
                        _f(r["S_arm"]), _f(r["lift"]), _f(r["lift_sol"]))
        _print_table(tbl)
    _emit({"lift": lt, "contrast": ct if ct.height else None, "sensitivity": sens, "family": fam, "problems": prob},
          json_path=json_out, csv_path=csv, meta=meta)


def print_rates(lt, *, max_rows: int | None = 120) -> None:
    """Printing is the slow part at scale (rich renders row by row): like the lift table, the first `max_rows` cells."""
    full = lt
    lt = lt.head(max_rows) if max_rows is not None else lt
    tbl = Table(title="Rates per cell (share of problems; 95% CIs), the regression rate's noise floor and its shrinkage estimate")
    for c in ("model", "arm", "direction", "probs", "regression [CI]", "noise floor", "true share (EB)", "improvement [CI]",
              "tie [CI]", "S_sol solo", "S_sol arm", "lift S_sol [CI]"):
        tbl.add_column(c, justify="left" if c in ("model", "arm", "direction") else "right")
    ci = lambda r, k: f"{_f(100 * r[k], 0)}% [{_f(100 * r[k + '_lo'], 0) if r[k + '_lo'] is not None else ''}, {_f(100 * r[k + '_hi'], 0) if r[k + '_hi'] is not None else ''}]"  # noqa: E731
    for r in lt.iter_rows(named=True):
        tbl.add_row(r["model"], r["arm_kind"], r["direction"], str(r["n_problems"]), ci(r, "regression_rate"),
                    _f(100 * r["regression_noise_floor"], 0) + "%" if r["regression_noise_floor"] is not None else "",
                    _f(100 * r["regression_true_share"], 0) + "%" if r["regression_true_share"] is not None else "n/a",
                    ci(r, "improvement_rate"), ci(r, "tie_rate"), _f(r["S_sol_solo"]), _f(r["S_sol_arm"]),
                    f"{_f(r['lift_sol'], 2)} [{_f(r['lift_sol_lo'], 2)}, {_f(r['lift_sol_hi'], 2)}]" if r["lift_sol"] is not None else "n/a")
    _print_table(tbl)
    if full.height > lt.height:
        console.print(f"[yellow]showing {lt.height} of {full.height} cells[/yellow]: --all prints every one, --json/--csv FILE writes them")
    console.print("noise floor: the regression rate if the arm were one more solo (same replicates); true share (EB): "
                  "empirical-Bayes share of problems whose true lift < 0, n/a where the between-problem variance is not above "
                  "the noise. S_sol: S on the fraction of speed of light (n/a: the store has no characterisation).")


def print_contrast(ct, *, max_rows: int | None = 120) -> None:
    if ct.height == 0:
        console.print("time-matched contrast: no block has both a transfer arm and a placebo or wrong arm")
        return
    full = ct
    ct = ct.head(max_rows) if max_rows is not None else ct
    tbl = Table(title="Time-matched contrast (skill arms of a block run together, after its solos): the skill's content")
    for c in ("model", "contrast", "direction", "blocks", "probs", "S transfer", "S other", "diff [95% CI]", "rel. diff [95% CI]",
              "lift vs solo", "served model changed"):
        tbl.add_column(c)
    for r in ct.iter_rows(named=True):
        tbl.add_row(r["model"], r["contrast"], r["direction"], str(r["n_blocks"]), str(r["n_problems"]), _f(r["S_transfer"]),
                    _f(r["S_other"]), f"{_f(r['diff'], 2)} [{_f(r['diff_lo'], 2)}, {_f(r['diff_hi'], 2)}]",
                    f"{_pct(r['rel_diff'])} [{_pct(r['rel_lo'])}, {_pct(r['rel_hi'])}]", _f(r["lift_vs_solo"], 2),
                    f"{r['served_changed']} of {r['served_recorded']}" if r["served_recorded"] else "not recorded")
    _print_table(tbl)
    if full.height > ct.height:
        console.print(f"[yellow]showing {ct.height} of {full.height} contrasts[/yellow]: --all prints every one, --json/--csv FILE writes them")


@app.command()
def standing(store: Optional[str] = STORE, stratify: bool = STRATIFY, seed: int = SEED, resamples: int = RESAMPLES,
             per_model: bool = typer.Option(False, "--per-model"),
             naive: bool = typer.Option(False, "--naive", help="Also show the biased table (standing vs the solo the lift subtracts)."),
             score: Optional[str] = SCORE, json_out: Optional[str] = JSON, csv: Optional[str] = CSV) -> None:
    """Lift by the source's standing (above/tie/below the target's other solo replicates), with the standing effect."""
    _quiet(json_out)
    t = _load(store, stratify, columns="lift", score=score)
    if t is None:
        return
    _need_arms(t)
    from mkb.analysis import standing_table

    spec = _spec(seed, resamples)
    out = {}
    for is_naive in ((False, True) if naive else (False,)):
        st = standing_table(t.pairs, spec=spec, pooled=not per_model, naive=is_naive, over_directions=True)
        if st.height == 0:
            _fail("no standing classes: needs R >= 2 solo replicates and source attempts", EXIT_NO_DATA)
        out["naive" if is_naive else "standing"] = st
        title = ("NAIVE standing (vs the solo the lift subtracts: builds in regression to the mean)" if is_naive
                 else "Standing: source solo S vs mean S of the target DSL's other solo replicates")
        tbl = Table(title=title)
        cols = ["arm", "direction"] + (["model"] if per_model else []) + [
            "above n", "above imp/reg/tie", "tie n", "tie imp/reg/tie", "below n", "below imp/reg/tie", "effect [95% CI]",
            "effect in S points [95% CI]"]
        for c in cols:
            tbl.add_column(c)
        for r in st.iter_rows(named=True):
            row = [r["arm_kind"], r["direction"]] + ([r["model"]] if per_model else [])
            for c in ("above", "tie", "below"):
                row += [str(r[f"n_{c}"]), "/".join(_f(100 * r[f"{k}_{c}"], 0) if r[f"{k}_{c}"] is not None else "-" for k in ("improve", "regress", "tie"))]
            row.append(f"{_f(r['effect'], 3)} [{_f(r['effect_lo'], 3)}, {_f(r['effect_hi'], 3)}]")
            row.append(f"{_f(r['effect_S'], 2)} [{_f(r['effect_S_lo'], 2)}, {_f(r['effect_S_hi'], 2)}]")
            tbl.add_row(*row)
        _print_table(tbl)
    console.print("standing effect = (improve - regress share | above) - (same | below); in S points: (mean lift | above) - "
                  "(mean lift | below). solo_noise = the target's solo at r+1 vs its solo at r, source the source DSL's solo "
                  f"at r+2 (the noise floor, with the arms' dependence; needs R >= 3). With no effect each class shows "
                  f"improve ~ regress. CIs on every class share are in --json/--csv. {spec.describe()}.")
    _emit(out, json_path=json_out, csv_path=csv, meta=_meta(t, spec))


@app.command()
def power(store: Optional[str] = STORE, stratify: bool = STRATIFY, seed: int = SEED, resamples: int = RESAMPLES,
          target: float = typer.Option(0.10, "--lift", help="Relative lift to detect (0.10 = 10%)."),
          power_: float = typer.Option(0.80, "--power", help="Power of a two-sided 5% test."),
          plan: Optional[str] = typer.Option(None, "--plan", help="An experiment config (TOML): the power its plan will have. "
                                             "Variance components from --store when given, else stated defaults."),
          tau2: Optional[float] = typer.Option(None, "--tau2", help="With --plan: between-problem variance of the lift (S points^2)."),
          sigma2: Optional[float] = typer.Option(None, "--sigma2", help="With --plan: within-problem variance of a pair's lift."),
          s_solo: Optional[float] = typer.Option(None, "--s-solo", help="With --plan: mean solo S."),
          score: Optional[str] = SCORE, json_out: Optional[str] = JSON, csv: Optional[str] = CSV) -> None:
    """Problems or replicates needed to detect a relative lift at a given power, from the observed variance components
    (of a store's cells, or of a planned experiment with --plan)."""
    _quiet(json_out)
    if not 0 < target < 10 or not 0.5 <= power_ < 1:
        _fail(f"--lift {target} / --power {power_} out of range\nhint: --lift 0.10 --power 0.80")
    override = {k: v for k, v in (("tau2", tau2), ("sigma2", sigma2), ("s_solo", s_solo)) if v is not None}
    if plan is not None:
        _plan_power(plan, store, stratify, target=target, power_=power_, override=override, json_out=json_out, csv=csv,
                    score=score)
        return
    if override:
        _fail("--tau2, --sigma2 and --s-solo describe a planned experiment\nhint: pass --plan CONFIG.toml with them")
    t = _load(store, stratify, columns="lift", score=score)
    if t is None:
        return
    _need_arms(t)
    from mkb.analysis import lift_table, power_table

    spec = _spec(seed, resamples)
    pt = power_table(lift_table(t.pairs, spec=spec, tests=False), t.pairs, target=target, power=power_)
    tbl = Table(title=f"Power to detect a {100 * target:.0f}% relative lift at {100 * power_:.0f}% power (two-sided 5%)")
    for c in ("model", "arm", "direction", "problems", "replicates", "rel. lift ±", "power now", "between-problem var", "within var",
              "problems needed", "replicates needed"):
        tbl.add_column(c)
    for r in pt.iter_rows(named=True):
        tbl.add_row(r["model"], r["arm_kind"], r["direction"], str(r["n_problems"]), _f(r["R"], 0),
                    _f(100 * r["rel_halfwidth"]) if r["rel_halfwidth"] is not None else "", _pct(r["power_at_target"]).lstrip("+"),
                    _f(r["tau2"]), _f(r["sigma2"]), str(r["problems_needed"] or ""),
                    str(r["replicates_needed"]) if r["replicates_needed"] is not None else "not by replicates")
    _print_table(tbl)
    console.print("SE of relative lift scales as sqrt((tau2 + sigma2/R) / P) (problem-clustered); needed: SE <= lift / (z_0.975 + z_power). "
                  "Problems needed keep R; replicates needed keep the problems.")
    _emit({"power": pt}, json_path=json_out, csv_path=csv, meta=_meta(t, spec))


def _plan_power(plan: str, store, stratify: bool, *, target: float, power_: float, override: dict, json_out, csv,
                score: str | None = None) -> None:
    """`power --plan`: the plan's cells and size, with variance components from --store (when given) or the stated defaults."""
    from mkb.analysis._stats import DEFAULT_COMPONENTS, PlanDesign, plan_power_table, variance_components
    from mkb.experiment._config import ConfigError, load_config

    for k, v in override.items():
        if not v >= 0 or (k == "s_solo" and not v > 0):
            _fail(f"--{k.replace('_', '-')} {v}: must be {'positive' if k == 's_solo' else 'non-negative'}")
    try:
        cfg = load_config(plan)
        design = PlanDesign.from_config(cfg)
    except ConfigError as exc:
        _fail(str(exc))
    if not design.cells:
        _fail(f"{plan}: the plan has no arm besides solo: nothing to compare\nhint: add arms = [\"solo\", \"transfer\", ...]")
    comps, meta = None, {"plan": plan, "problems": design.n_problems, "replicates": design.replicates, "models": list(design.models)}
    if store is not None:
        # the components are read under the score the plan will be analysed by, unless --score says otherwise
        t = _load(store, stratify, columns="lift", score=score or cfg.score, score_from=None if score else f"the config {plan}")
        if t is None:
            raise typer.Exit(EXIT_NO_DATA)
        _need_arms(t)
        comps = variance_components(t.pairs)
        meta |= _meta(t)
        console.print(f"variance components: measured in {t.store} ({comps.height} cells)")
    else:
        d = DEFAULT_COMPONENTS
        console.print(f"variance components: stated defaults, not measurements (tau2={d.tau2:g}, sigma2={d.sigma2:g}, "
                      f"S_solo={d.s_solo:g}; the scale of `mkb-analyze synth`): pass --store URL to use a store's")
    pt = plan_power_table(design, comps, target=target, power=power_, override=override or None)
    tbl = Table(title=f"Plan {plan}: {design.n_problems} problems x {design.replicates} replicates; power to detect a "
                      f"{100 * target:.0f}% relative lift at {100 * power_:.0f}% power (two-sided 5%)")
    for c in ("model", "arm", "direction", "rel. lift ±", "power", "tau2", "sigma2", "S solo", "problems needed",
              "replicates needed", "components from"):
        tbl.add_column(c)
    for r in pt.iter_rows(named=True):
        tbl.add_row(r["model"], r["arm_kind"], r["direction"], _f(100 * r["rel_halfwidth"]), _pct(r["power_at_target"]).lstrip("+"),
                    _f(r["tau2"]), _f(r["sigma2"]), _f(r["S_solo"]), str(r["problems_needed"]),
                    str(r["replicates_needed"]) if r["replicates_needed"] is not None else "not by replicates", r["components_from"])
    _print_table(tbl)
    console.print("SE of relative lift = sqrt((tau2 + sigma2/R) / P) / S_solo (the delta method on the problem-clustered ratio); "
                  "needed: SE <= lift / (z_0.975 + z_power). Problems needed keep R; replicates needed keep the problems.")
    meta["components"] = "store" if comps is not None else "defaults"
    meta["score"] = score or cfg.score
    _emit({"power": pt}, json_path=json_out, csv_path=csv, meta=meta)


@app.command()
def models(store: Optional[str] = STORE, stratify: bool = STRATIFY,
           mixed: bool = typer.Option(True, "--mixed/--no-mixed", help="Fit the mixed models (secondary estimates)."),
           score: Optional[str] = SCORE, json_out: Optional[str] = JSON, csv: Optional[str] = CSV) -> None:
    """Per-model summary (pass rate, mean S per arm, tokens, cost) and the mixed-model fits with diagnostics."""
    _quiet(json_out)
    t = _load(store, stratify, score=score)
    if t is None:
        return
    import polars as pl

    inc = t.included
    summ = inc.group_by("model", "arm_kind").agg(n=pl.len(), pass_rate=pl.col("passed").mean(), S=pl.col("S").mean(),
                                                 S_sol=pl.col("S_sol").mean(), S_compile=pl.col("S_compile").mean(),
                                                 out_tokens=pl.col("output_tokens").mean(), cost=pl.col("cost_usd").sum(),
                                                 budget_used=pl.col("budget_used").mean()).sort("model", "arm_kind")
    tbl = Table(title="Models")
    for c in ("model", "arm", "attempts", "pass rate", "mean S", "mean output tokens", "cost USD", "submissions used"):
        tbl.add_column(c)
    for r in summ.iter_rows(named=True):
        tbl.add_row(r["model"], r["arm_kind"], str(r["n"]), _pct(r["pass_rate"]).lstrip("+"), _f(r["S"]),
                    _f(r["out_tokens"], 0), _f(r["cost"], 2), _pct(r["budget_used"]).lstrip("+"))
    _print_table(tbl)
    from mkb.analysis import BootstrapSpec, two_part_table

    tp = two_part_table(t.pairs, spec=BootstrapSpec(resamples=2000)) if t.pairs.height else pl.DataFrame()
    if tp.height:
        tt = Table(title="Two-part summary: pass rate (difference with a problem-clustered CI), then speedup among passes")
        for c in ("model", "arm", "direction", "pass solo", "pass arm", "pass diff [95% CI]", "gm speedup | passed, solo",
                  "gm speedup | passed, arm"):
            tt.add_column(c)
        for r in tp.iter_rows(named=True):
            tt.add_row(r["model"], r["arm_kind"], r["direction"], _pct(r["pass_solo"]).lstrip("+"), _pct(r["pass_arm"]).lstrip("+"),
                       f"{_pct(r['pass_diff'])} [{_pct(r['pass_diff_lo'])}, {_pct(r['pass_diff_hi'])}]",
                       _f(r["gm_speedup_solo_given_pass"], 2), _f(r["gm_speedup_arm_given_pass"], 2))
        _print_table(tt)
        console.print("speedup columns are conditioned on passing (geometric mean among passed attempts); the pass-difference CI "
                      "resamples problems (2,000 resamples), so it respects replicates clustered in problems, unlike McNemar.")
    fits_rows = []
    if not mixed:
        _emit({"models": summ, "two_part": tp if tp.height else None}, json_path=json_out, csv_path=csv, meta=_meta(t))
        return
    from mkb.analysis._mixed import fit_all

    for stratum in sorted(t.attempts["stratum"].unique().to_list()):
        for fit in fit_all(t.attempts.filter(pl.col("stratum") == stratum)):
            fits_rows += [{"stratum": stratum, "fit": fit.name, "target_dsl": fit.target_dsl, "formula": fit.formula,
                           "estimator": fit.estimator, "converged": fit.converged, **r,
                           "variance": "; ".join(f"{k}={v:.6g}" for k, v in fit.variance.items()),
                           "flags": " | ".join(fit.flags + fit.warnings)} for r in fit.effects.iter_rows(named=True)]
            ft = Table(title=f"{fit.name}, target {fit.target_dsl}" + (f", stratum {stratum}" if t.stratified else ""))
            for c in ("term", "estimate", "SE / post. SD", "95% interval"):
                ft.add_column(c)
            for r in fit.effects.iter_rows(named=True):
                ft.add_row(r["term"], f"{r['estimate']:.3f}", f"{r['se']:.3f}", f"[{r['lo']:.3f}, {r['hi']:.3f}]")
            _print_table(ft)
            console.print(f"  {fit.formula}; {fit.estimator}; rows {fit.n_rows}, problems {fit.n_problems}; "
                          f"variance {', '.join(f'{k}={v:.4g}' for k, v in fit.variance.items())}; converged {fit.converged}; "
                          f"{fit.seconds:.1f} s")
            for w in fit.warnings:
                console.print(f"  [yellow]warning:[/yellow] {w}")
            for fl in fit.flags:
                console.print(f"  [yellow]{fl}[/yellow]")
    _emit({"models": summ, "two_part": tp if tp.height else None, "fits": pl.DataFrame(fits_rows) if fits_rows else None},
          json_path=json_out, csv_path=csv, meta=_meta(t))


@app.command()
def attempts(store: Optional[str] = STORE, stratify: bool = STRATIFY,
             excluded: bool = typer.Option(False, "--excluded", help="List the excluded attempts and why."),
             limit: int = typer.Option(30, "--limit"), json_out: Optional[str] = JSON,
             csv: Optional[str] = typer.Option(None, "--csv", help="Write every attempt (all columns) as CSV to this file."),
             score: Optional[str] = SCORE) -> None:
    """The attempts table: counts by arm, status and verdict; or the excluded attempts."""
    _quiet(json_out)
    t = _load(store, stratify, score=score)
    if t is None:
        return
    import polars as pl

    a = t.attempts
    if excluded:
        ex = a.filter(pl.col("excluded").is_not_null()).select("attempt_id", "model", "problem", "target_dsl", "arm_kind",
                                                              "replicate", "excluded", "annotation_reason", "error")
        tbl = Table(title=f"Excluded attempts ({ex.height})")
        for c in ex.columns:
            tbl.add_column(c)
        for r in ex.head(limit).iter_rows():
            tbl.add_row(*["" if v is None else str(v) for v in r])
        _print_table(tbl)
    else:
        g = a.group_by("arm_kind", "target_dsl", "status", "verdict").len().sort("arm_kind", "target_dsl", "status", "verdict")
        tbl = Table(title="Attempts by arm, target, status and verdict")
        for c in ("arm", "target", "status", "verdict", "n"):
            tbl.add_column(c)
        for r in g.iter_rows():
            tbl.add_row(*[str(v) for v in r])
        _print_table(tbl)
    flat = a.select([c for c, ty in a.schema.items() if not isinstance(ty, pl.List)])
    _emit({"attempts": flat}, json_path=json_out, csv_path=csv, meta=_meta(t))


@app.command()
def report(store: Optional[str] = STORE, out: str = typer.Option("mkb-report", "--out"), stratify: bool = STRATIFY,
           seed: int = SEED, resamples: int = RESAMPLES,
           fmt: list[str] = typer.Option([], "--format", help="Also save each chart as png and/or svg (vl-convert)."),
           json_out: Optional[str] = typer.Option(None, "--json", help="Write what was written (every file, its size) as JSON ('-': stdout)."),
           csv: Optional[str] = typer.Option(None, "--csv", help="Write the list of files written as CSV."),
           score: Optional[str] = SCORE) -> None:
    """An offline HTML report with inline altair charts (and PNG/SVG with --format)."""
    _quiet(json_out)
    t = _load(store, stratify, columns="lift", score=score)
    if t is None:
        return
    _need_arms(t)
    from mkb.analysis._report import write_report

    bad = set(fmt) - {"png", "svg", "pdf"}
    if bad:
        _fail(f"unknown --format {sorted(bad)}\nhint: png, svg or pdf")
    spec = _spec(seed, resamples)
    res = write_report(t, out, spec=spec, formats=tuple(fmt))
    console.print(f"wrote {res.html} and {len(res.files)} files beside it")
    _emit({"files": _files_table([res.html, *res.files])}, json_path=json_out, csv_path=csv,
          meta={**_meta(t, spec), "report": str(res.html)})


def _files_table(paths):
    """Path and size of each file a command wrote: what report, export and synth say they produced."""
    import polars as pl
    from fsspec.core import url_to_fs

    rows = []
    for p in paths:
        fs, path = url_to_fs(str(p))
        rows.append({"path": str(p), "bytes": int(fs.size(path))})
    return pl.DataFrame(rows, schema={"path": pl.Utf8, "bytes": pl.Int64})


@app.command()
def export(store: Optional[str] = STORE, out: str = typer.Option(..., "--out", help="Folder or fsspec URL to write."),
           stratify: bool = STRATIFY,
           redact: bool = typer.Option(False, "--redact", help="Drop message and code text (turns, tool calls, kernels, skills); keep counts."),
           json_out: Optional[str] = typer.Option(None, "--json", help="Write what was exported (rows per kind, every file) as JSON ('-': stdout)."),
           csv: Optional[str] = typer.Option(None, "--csv", help="Write rows per kind as CSV (the files beside it as <stem>.files.csv).")) -> None:
    """A Hugging Face dataset layout (data/<kind>/, README card with the schema) plus derived CSVs."""
    _quiet(json_out)
    from mkb.analysis import MixedVersionsError, ScoreError, export_dataset, load_tables

    try:
        t = load_tables(store, stratify=stratify)
    except (MixedVersionsError, ScoreError) as exc:
        _fail(str(exc))
    kinds = export_dataset(t.store, out, tables=t if t.attempts.height else None, redact=redact)
    console.print(f"wrote {out}: " + ", ".join(f"{k} {n}" for k, n in kinds.items()))
    if json_out or csv:
        import polars as pl
        from fsspec.core import url_to_fs

        fs, root = url_to_fs(out)
        base = out.rstrip("/")
        paths = [f"{base}/data/{k}/events.parquet" for k in kinds] + [f"{base}/README.md"]
        paths += [f"{base}/derived/{n}.csv" for n in ("attempts", "pairs", "lift", "standing") if fs.exists(f"{root}/derived/{n}.csv")]
        rows = pl.DataFrame({"kind": list(kinds), "rows": list(kinds.values())}, schema={"kind": pl.Utf8, "rows": pl.Int64})
        _emit({"kinds": rows, "files": _files_table(paths)}, json_path=json_out, csv_path=csv,
              meta={"store": t.store, "out": out, "redacted": redact, "stratified": t.stratified})


@app.command()
def synth(store: str = typer.Option(..., "--store", help="Where to write the synthetic dataset."),
          models_: int = typer.Option(2, "--models"), problems: int = typer.Option(74, "--problems"),
          replicates: int = typer.Option(3, "--replicates"), seed: int = typer.Option(0, "--seed"),
          transfer: float = typer.Option(0.35, "--transfer-effect", help="Latent shift of the transfer arm."),
          standing_slope: float = typer.Option(0.0, "--standing-slope"), noise: float = typer.Option(0.7, "--noise"),
          p_infra: float = typer.Option(0.01, "--p-infra"), p_unfinished: float = typer.Option(0.005, "--p-unfinished"),
          annotated: int = typer.Option(3, "--annotated"),
          json_out: Optional[str] = typer.Option(None, "--json", help="Write the planted truth, the spec and the files written as JSON ('-': stdout)."),
          csv: Optional[str] = typer.Option(None, "--csv", help="Write the planted truth as CSV (the files as <stem>.files.csv).")) -> None:
    """Write a synthetic dataset with planted truth (for demos and tests) and print the truth."""
    _quiet(json_out)
    from dataclasses import asdict

    from mkb.analysis.synthetic import SynthSpec, true_relative_lift, write_synthetic

    spec = SynthSpec(models=tuple(f"synth/model-{chr(97 + i)}" for i in range(models_)), n_problems=problems,
                     replicates=replicates, seed=seed, effects={"transfer": transfer, "placebo": 0.0, "same": 0.2, "wrong": 0.0},
                     standing_slope=standing_slope, noise=noise, p_infra=p_infra, p_unfinished=p_unfinished,
                     n_annotated=annotated, model_means=tuple(0.9 - 0.4 * i / max(1, models_ - 1) for i in range(models_)))
    res = write_synthetic(spec, store)
    console.print(f"wrote {res.events} events in {len(res.files)} files to {store}")
    planted = sorted(true_relative_lift(res.simulation).items())
    for (m, s, tg), v in planted:
        console.print(f"  planted transfer relative lift {m} {s}->{tg}: {100 * v:+.1f}%")
    if json_out or csv:
        import polars as pl

        truth = pl.DataFrame([{"model": m, "arm_kind": "transfer", "direction": f"{s}->{tg}", "source_dsl": s, "target_dsl": tg,
                               "planted_rel_lift": v} for (m, s, tg), v in planted])
        _emit({"planted": truth, "files": _files_table(res.files)}, json_path=json_out, csv_path=csv,
              meta={"store": store, "events": res.events, "spec": asdict(spec), "infra_error": len(res.infra),
                    "unfinished": len(res.unfinished), "annotated": len(res.annotated)})


def _print_problems(store) -> None:
    from mkb.analysis import problems_table

    p = problems_table(store)
    if p.height == 0:
        console.print("no characterisation events")
        return
    tbl = Table(title=f"Problems ({p.height} measurements)")
    for c in ("problem", "name", "family", "size", "gpu", "ok", "eager us", "peak MiB", "fp64 gap", "SOL us", "SOL ratio", "in band",
              "compile us", "x eager", "compile s (default/autotune)"):
        tbl.add_column(c)

    def mode(r, key):
        st = r[f"{key}_status"]
        if st is None:
            return "—"
        return _f(r[f"{key}_compile_s"], 0) if st == "ok" else f"[red]{st}[/red]"

    for r in p.iter_rows(named=True):
        ok = "" if r["ok"] is None else ("yes" if r["ok"] else f"no: {r['error'] or ''}"[:40])
        tbl.add_row(str(r["problem"]), r["problem_name"] or "", r["family"] or "", r["size"], r["gpu"] or "", ok,
                    _f(r["eager_median_us"]), _f(r["peak_memory_bytes"] / 2**20) if r["peak_memory_bytes"] is not None else "",
                    f"{r['fp64_gap']:.2e}" if r["fp64_gap"] is not None else "", _f(r["sol_us"]), _f(r["sol_ratio"], 3),
                    "" if r["within_band"] is None else ("yes" if r["within_band"] else "[red]no[/red]"),
                    "—" if r["compile_us"] is None else f"{_f(r['compile_us'])} ({'autotune' if r['compile_mode'] != 'default' else 'default'})",
                    "—" if r["speedup_compile_vs_eager"] is None else _f(r["speedup_compile_vs_eager"], 2),
                    f"{mode(r, 'default')}/{mode(r, 'autotune')}")
    _print_table(tbl)
    console.print("compile us: the faster torch.compile mode that matched the reference (newest row per mode, same problem "
                  "hash and GPU model); x eager: its speedup over eager timed back to back; — : not recorded")


def _print_verdicts(store) -> None:
    from mkb.analysis import verdicts_table

    v = verdicts_table(store)
    if v.height == 0:
        console.print("no verdict events")
        return
    tbl = Table(title=f"Verdicts ({v.height}; {int(v['passed'].sum())} passed)")
    for c in ("ts", "scope", "problem", "dsl", "passed", "reason", "speedup", "candidate us", "eager us", "S"):
        tbl.add_column(c)
    for r in v.iter_rows(named=True):
        tbl.add_row(r["ts"].strftime("%Y-%m-%d %H:%M:%S"), r["scope"], str(r["problem"]), r["dsl"],
                    "yes" if r["passed"] else "[red]no[/red]", r["reason"] or "", _f(r["speedup"], 2),
                    _f(r["candidate_median_us"]), _f(r["eager_median_us"]), _f(r["s"]))
    _print_table(tbl)


@app.command("verdicts")
def verdicts_cmd(store: Optional[str] = STORE, json_out: Optional[str] = JSON, csv: Optional[str] = CSV) -> None:
    """Every verdict in the store (stand-alone gradings, red-team and benchmark runs), oldest first."""
    from mkb.analysis import verdicts_table

    _quiet(json_out)
    _print_verdicts(store)
    _emit({"verdicts": verdicts_table(store)}, json_path=json_out, csv_path=csv)


@app.command("problems")
def problems_cmd(store: Optional[str] = STORE, json_out: Optional[str] = JSON, csv: Optional[str] = CSV) -> None:
    """The characterisation table: eager time, peak memory, fp64 gap, speed-of-light ratio, torch.compile time and speedup per problem."""
    from mkb.analysis import problems_table

    _quiet(json_out)
    _print_problems(store)
    _emit({"problems": problems_table(store)}, json_path=json_out, csv_path=csv)


@app.command("transcript")
def transcript_cmd(attempt_id: str = typer.Argument(..., help="The attempt to show."), store: Optional[str] = STORE,
                   html: Optional[str] = typer.Option(None, "--html", help="Also write a self-contained HTML page here."),
                   json_out: Optional[str] = typer.Option(None, "--json", help="Write the attempt's events (turns, tool calls, submissions, "
                                                          "verdicts, skill) as JSON ('-': stdout)."),
                   csv: Optional[str] = typer.Option(None, "--csv", help="Write the turns as CSV (the other events as <stem>.<kind>.csv).")) -> None:
    """One attempt rebuilt from its events: turns, tool calls, verdicts, kernel.py diffs between submissions, SKILL.md."""
    from mkb.analysis._transcript import TranscriptError, load_transcript, render_html, render_text

    _quiet(json_out)
    try:
        t = load_transcript(store, attempt_id)
    except TranscriptError as exc:
        _fail(str(exc))
    console.print(render_text(t), markup=False, highlight=False)
    if html:
        from pathlib import Path

        Path(html).write_text(render_html(t))
        console.print(f"wrote {html}")
    if json_out or csv:
        import polars as pl

        frame = lambda rows: pl.DataFrame(rows, infer_schema_length=None, strict=False) if rows else None  # noqa: E731
        tables = {"turns": frame(t.turns), "tool_calls": frame([c for turn in sorted(t.calls) for c in t.calls[turn]]),
                  "submissions": frame(t.submissions), "verdicts": frame(list(t.verdicts.values())),
                  "attempt_started": frame([t.started] if t.started else []), "attempt_finished": frame([t.finished] if t.finished else []),
                  "skill": frame([t.skill] if t.skill else [])}
        _emit(tables, json_path=json_out, csv_path=csv, meta={"attempt_id": t.attempt_id, "redacted": t.redacted, "notes": t.notes})


def main() -> None:
    from mkb.cli._exit import run_cli

    run_cli(app)


if __name__ == "__main__":
    sys.exit(main())
