"""Derives the attempts and pairs tables from an event store: the only place events become analysis rows."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import polars as pl

from mkb.events import ScanReport, Store, read_batches, resolve_store, schema_for
from mkb.events._reader import BATCH_ROWS
from mkb.scoring import R_COLS, SOL_THRESHOLDS, THRESHOLDS

SCORED_STATUSES = ("finished", "budget_exhausted")
NOISE_ARM = "solo_noise"  # the solo-vs-solo pseudo-arm that measures the noise floor (see build_pairs)
SENSITIVE_FLAGS = ("code_block", "problem_identity")  # skill hygiene flags the sensitivity row leaves out
PAIR_IDS = ("attempt_id", "base_attempt", "source_attempt")  # a pair's attempts: the arm's, its solo's, its skill source's
# what no lift, standing, contrast, power or report table reads of a pair (the two-part table of `models`, which reads the
# full tables, reads the speedups); the lean pairs leave them out
PAIR_UNREAD = ("speedup", "speedup_solo", "served_solo", "S_source", "ref_mean")
READ_BATCH_ROWS = BATCH_ROWS  # rows of a kind read (and reduced to what the tables keep) at a time

# started's text columns of a few distinct values, held as categoricals (4 bytes a row, not a 16-byte view and the text)
# from the read until the pairs are built, and text again in the tables
_CODED = ("model", "family", "problem_hash", "target_dsl", "source_dsl", "arm_kind", "gpu", "experiment", "mkb_version",
          "grader_version", "dsl_version", "doc_pack_version")
_KINDS = ("attempt_started", "attempt_finished", "verdict", "annotation", "characterisation", "skill", "torch_compile", "plan")
VERSION_KEYS = {  # what must not mix, and within what it must not mix
    "grader_version": (),
    "mkb_version": (),
    "dsl_version": ("target_dsl",),
    "doc_pack_version": ("target_dsl",),
    "problem_hash": ("problem", "target_dsl"),
}


# polars 2.1's default ("auto") engine is the streaming one, about twice as slow as in-memory on these
# few-hundred-thousand-row joins and scans on 2 cores; the tables fit in memory by design
ENGINE = "in-memory"


def _latest(df: pl.DataFrame, *, keep: str) -> pl.DataFrame:
    """One row per attempt_id: the first or last by `ts`. Skips the sort and hash pass when ids are already unique
    (the usual case: duplicates need a retried write), which returns the same rows."""
    ids = df["attempt_id"]
    # distinct 64-bit hashes imply distinct ids (8x cheaper than counting the strings); only a collision or a real
    # duplicate pays the exact count
    if ids.hash().n_unique() == df.height or ids.n_unique() == df.height:
        return df
    return df.sort("ts").unique(subset="attempt_id", keep=keep)


class MixedVersionsError(ValueError):
    """The dataset mixes grader, DSL, doc-pack, problem or mkb versions and was not told to stratify."""


# the score an analysis reports: S over mkb's baseline (`eager`) or over upstream MetaKernelBench's (the problem's fp32
# `reference`, timed as upstream times it). Each names the verdict columns it is read from; both go through the one
# definition below (R@t and S recomputed from passed and that speedup, mkb.scoring), so only the baseline differs.
SCORES = {"s": ("speedup", "s"), "s_upstream": ("speedup_upstream", "s_upstream")}
SCORE_LABELS = {"s": "S (speedup over eager, mkb's baseline)",
                "s_upstream": "S_upstream (speedup over the problem's fp32 reference, timed as upstream MetaKernelBench times it)"}


class ScoreError(ValueError):
    """The score asked for cannot be read from the store, or its experiments' plans name different scores."""


@dataclass
class Tables:
    """The derived tables and what was left out of them, with the reasons."""

    attempts: pl.DataFrame  # one row per attempt, with `excluded` (null when it counts)
    pairs: pl.DataFrame  # one row per non-solo arm (plus the solo noise-floor pseudo-arm) and its baseline solo
    store: str
    stratified: bool
    version_mix: dict[str, list[str]] = field(default_factory=dict)
    skipped_files: dict[str, str] = field(default_factory=dict)
    event_counts: dict[str, int] = field(default_factory=dict)
    score: str = "s"  # which score `S` (and `speedup`, the R@t columns) holds: a key of SCORES
    score_from: str = "default"  # why: "--score", "plan of <experiment>[, ...]" or "default" (no plan names one)
    _summary: tuple | None = field(default=None, init=False, repr=False, compare=False)  # (weakref to the attempts, counts)

    def score_note(self) -> str:
        return f"score: {SCORE_LABELS[self.score]}; from {self.score_from}"

    @property
    def included(self) -> pl.DataFrame:
        return self.attempts.filter(pl.col("excluded").is_null())

    def summary(self) -> dict[str, int]:
        # counts in one pass, no filtered copy of the attempts (at experiment scale, 150 MB a copy); kept for the same
        # attempts frame (a command's header, verdict note and output each ask: 0.15 s a pass at 10M events)
        if self._summary is not None and self._summary[0]() is self.attempts:
            return dict(self._summary[1])
        counted, why = pl.col("excluded").is_null(), pl.col("excluded").cast(pl.String).str.split(":").list.first()
        got = self.attempts.select(
            attempts=pl.len(), included=counted.sum(),
            **{f"verdict_{v}": (counted & (pl.col("verdict_source") == v)).sum() for v in ("pair", "attempt", "none")},
            **{k: (why == k).sum() for k in ("infra_error", "unfinished", "annotated", "ungraded")},
            s_mismatch=pl.col("s_mismatch").sum()).row(0, named=True)
        out = {k: int(v or 0) for k, v in got.items()}
        self._summary = (weakref.ref(self.attempts), out)
        return dict(out)

    def verdict_note(self) -> str:
        s = self.summary()
        return (f"verdict counted: the pair re-grade (scope=pair) where present ({s['verdict_pair']} attempts), "
                f"else the attempt's own verdict ({s['verdict_attempt']}); {s['verdict_none']} ended without a kernel "
                "or verdict and count as passed=false, S=0")


# what the lift, standing, contrast, power and report tables read of an attempt (`load_tables(columns="lift")`)
LIFT_COLUMNS = ("model", "problem", "family", "target_dsl", "source_dsl", "arm_kind", "replicate", "skill_flagged",
                "served_model", "S", "passed", "speedup", "S_sol", "S_compile", "excluded", "verdict_source", "s_mismatch",
                "stratum")
_LINKS = ("attempt_id", "skill_source_attempt")  # what build_pairs joins by; the lean attempts table leaves them out after


class _KeyClash(Exception):
    """Two distinct attempt ids (or one id twice) share a hashed key: the lean tables are built on the text ids instead."""


def _id_key(col: str, seed: int) -> pl.Expr:
    """A 64-bit hash of an attempt id (null for a null id): what the lean tables join attempts by (see load_tables)."""
    return pl.when(pl.col(col).is_not_null()).then(pl.col(col).hash(seed))


def load_tables(store: str | Store | None = None, *, stratify: bool = False, columns: str = "all",
                score: str | None = None) -> Tables:
    """Read a store and build the tables; refuse mixed versions unless `stratify` (then every key carries a stratum).

    `score` picks the baseline every S, speedup and R@t column of the tables is read against (a key of SCORES); None
    takes the one the plans of the store's experiments name (`s` where none does) and refuses plans that disagree.
    The verdict counted is the same under either score; a counted verdict that recorded no such score refuses the
    store (never read as 0).

    `columns="lift"` builds the same pairs table without its attempt ids (`PAIR_IDS`: what links a pair to its
    attempts, which no lift, standing, power or report figure reads) and the columns those tables do not read (`PAIR_UNREAD`) and an attempts table of `LIFT_COLUMNS`
    only: the columns nothing of it reads (token counts, errors, budgets, names, ids) are not read from the store, and
    of a kernel hash only whether it is there, which at experiment scale is most of the memory and a third of the time.
    Both lean tables hold their text as categoricals (`_text` gives the text; every table made from them holds text).
    Its attempts are joined by a 64-bit hash of their ids rather than the text (`_id_key`; a tenth of the cost per
    join), and each joined row's second hash (another seed) must match too: two ids that share the first hash, or an
    id started twice, make it build the tables on the text ids instead (the same tables; only ids that share both
    hashes, probability ~n^2 / 2^129, could be mistaken for one).
    """
    if columns not in ("all", "lift"):
        raise ValueError(f"columns={columns!r}: 'all' or 'lift'")
    if score is not None and score not in SCORES:
        raise ScoreError(f"unknown score {score!r}\nhint: one of {', '.join(SCORES)}")
    if columns == "lift":
        try:
            return _load_tables(store, stratify=stratify, lean=True, hashed=True, score=score)
        except _KeyClash:
            pass
    return _load_tables(store, stratify=stratify, lean=columns == "lift", hashed=False, score=score)


def _load_tables(store, *, stratify: bool, lean: bool, hashed: bool, score: str | None) -> Tables:
    store = store if isinstance(store, Store) else resolve_store(store)
    canon = {kind: schema_for(kind).polars() for kind in _KINDS}
    reports = {kind: ScanReport() for kind in _KINDS}
    # few-valued text as categoricals of this call's own categories (freed with the tables, not a process-wide map that
    # only grows). The attempt ids stay text or become hashed keys (`hashed`): casting 8M ids to categoricals at 10M
    # events cost more than the joins it would speed up
    coded = pl.Categorical(pl.Categories.random())

    def key(name: str, check: str, alias: str = "attempt_id") -> list:
        """An attempt id column: its text, or (`hashed`) its 64-bit key and, as `check`, its second hash."""
        return [pl.col(name).alias(alias)] if not hashed else [_id_key(name, 0).alias(alias), _id_key(name, 1).alias(check)]

    def read(kind: str, cols: list[str], reduce) -> pl.DataFrame:
        """What `reduce` keeps of every row of `kind`, built batch by batch (the rows of a kind are never all held at once).

        No event_id de-duplication here: every kind is reduced to one row per attempt (latest) below, which a
        duplicated event cannot change, and it saves a hash pass over every row.
        """
        return read_batches(kind, store, columns=cols, reduce=reduce, report=reports[kind], dedupe=False, batch_rows=READ_BATCH_ROWS)

    absent: dict[str, pl.DataType] = {}  # the columns the lean tables do not read: typed nulls after the joins

    def col(kind: str, name: str, alias: str | None = None, *, joined_as: tuple[str, ...] = ()) -> pl.Expr | None:
        """A column the lean tables do not carry is never read from the store (None here): it enters the plan after the joins
        as a typed null (under `joined_as` where the joins rename it), where the lean select drops it unmaterialised."""
        if not lean:
            return pl.col(name).alias(alias or name)
        absent.update({n: canon[kind][name] for n in joined_as or (alias or name,)})
        return None

    def present(kind: str, name: str) -> pl.Expr:
        """A kernel hash: the lean tables need only whether it is there."""
        return pl.when(pl.col(name).is_not_null()).then(pl.lit("k", coded)).alias(name) if lean else pl.col(name)

    def inputs(exprs) -> list[str]:
        return list(dict.fromkeys(n for e in exprs if e is not None for n in (e.meta.root_names() if isinstance(e, pl.Expr) else [e])))

    # skills whose hygiene checks raised a flag the sensitivity row leaves out: only the flagged ones are kept, and every
    # attempt is marked by a left join to them (read first, so each batch of attempts is marked as it is read). Whether
    # any is flagged is read off the flags alone first: a store with none (the usual case) then decodes no skill's hash,
    # nor (lean) any started row's, each a 64-character text of no pattern a row (at 10M events ~0.1 s and ~0.06 s of a
    # read that runs on one core; the flags alone ~0.03 s)
    flag = pl.col("hygiene_flags").list.eval(pl.element().is_in(list(SENSITIVE_FLAGS))).list.any().fill_null(False)
    flagged = read("skill", ["hygiene_flags"], lambda lf: lf.select(flag).filter(pl.col("hygiene_flags")).head(1)).height > 0
    skill_flags = read("skill", ["sha256", "hygiene_flags"],
                       lambda lf: lf.select(skill_sha256="sha256", skill_flagged=flag).filter(pl.col("skill_flagged"))) \
        if flagged else pl.DataFrame(schema={"skill_sha256": canon["skill"]["sha256"], "skill_flagged": pl.Boolean})
    skill_flags = skill_flags.group_by("skill_sha256").agg(pl.col("skill_flagged").any())
    by_hash = flagged or not lean  # the started rows' skill hashes are read (the full tables carry them)
    started_cols = [
        *key("attempt_id", "_chk"), "ts", "mkb_version", "experiment", "model", "problem",
        col("attempt_started", "problem_name"), "family", "problem_hash", "target_dsl", "source_dsl", "arm_kind", "replicate",
        "gpu", *(col("attempt_started", c) for c in ("budget_submissions", "budget_turns", "budget_output_tokens", "budget_wall_s")),
        "grader_version", "dsl_version", "doc_pack_version", "skill_sha256" if by_hash else None,
        *key("skill_source_attempt", "_chk_src", "skill_source_attempt"),
        col("attempt_started", "skill_empty"), col("attempt_started", "wrong_source_problem"),
    ]
    started_cols = [c for c in started_cols if c is not None]
    flags = skill_flags.lazy()

    def started_rows(lf: pl.LazyFrame) -> pl.LazyFrame:
        lf = lf.select(started_cols).filter(pl.col("attempt_id").is_not_null())
        if not by_hash:  # no skill is flagged
            return lf.with_columns(skill_flagged=pl.lit(False)).with_columns(pl.col(c).cast(coded) for c in _CODED)
        lf = lf.join(flags, on="skill_sha256", how="left", maintain_order="left").with_columns(pl.col("skill_flagged").fill_null(False))
        lf = lf.with_columns(pl.col(c).cast(coded) for c in _CODED)
        return lf.drop("skill_sha256") if lean else lf  # the lean tables need only the flag

    started = read("attempt_started", inputs(started_cols), started_rows)
    if hashed:
        # an id started twice (the text path keeps its first) or two ids of one key: built on the text ids instead
        if started["attempt_id"].n_unique() != started.height:
            raise _KeyClash
        src = started.select("skill_source_attempt", "_chk_src").drop_nulls("skill_source_attempt").join(
            started.select("attempt_id", "_chk"), left_on="skill_source_attempt", right_on="attempt_id", how="inner")
        if (src["_chk_src"] != src["_chk"]).any():
            raise _KeyClash
        started = started.drop("_chk_src")
        del src
    plans = read("plan", ["experiment", "ts", "score"], None)  # the score each experiment's plan names
    score, score_from = (score, "--score") if score is not None else _plan_score(
        store, started["experiment"].unique().to_list(), plans)
    sp_col, s_col = SCORES[score]
    served = pl.col("served_model") if "served_model" in canon["attempt_finished"] else pl.lit(None, pl.Utf8)  # attempt_finished >= 1.2
    fin_cols = [
        *key("attempt_id", "_chk_f"), "ts", "status",
        *(col("attempt_finished", c) for c in ("submissions_used", "turns_used", "input_tokens", "output_tokens", "cost_usd", "wall_s")),
        present("attempt_finished", "final_kernel_sha256"), col("attempt_finished", "error"), (served.cast(coded) if lean else served).alias("served_model")]
    fin_cols = [c for c in fin_cols if c is not None]
    fin = read("attempt_finished", inputs(fin_cols), lambda lf: lf.select(fin_cols))
    # the score's columns only (the plan's score is known by now), as `speedup` and `s`
    ver_cols = [*key("attempt_id", "_chk_v"), "ts", pl.col("scope").cast(coded), "passed", col("verdict", "reason", joined_as=("pv_reason", "av_reason")),
                present("verdict", "kernel_sha256"), "candidate_median_us", pl.col(sp_col).alias("speedup"), pl.col(s_col).alias("s")]
    ver_cols = [c for c in ver_cols if c is not None]
    ver = read("verdict", inputs(ver_cols), lambda lf: lf.filter(pl.col("scope").is_in(["attempt", "pair"])).select(ver_cols))
    ann_cols = [c for c in (*key("target_attempt_id", "_chk_a"), "ts", "label", col("annotation", "reason", "annotation_reason")) if c is not None]
    ann = read("annotation", inputs(ann_cols), lambda lf: lf.select(ann_cols))
    char = read("characterisation", ["size", "ok", "ts", "problem", "gpu", "flops", "bytes", "peak"],
                lambda lf: lf.filter((pl.col("size") == "full") & pl.col("ok").fill_null(False)).select(
                    "ts", "problem", "gpu", "flops", "bytes", "peak"))
    tc = read("torch_compile", None, lambda lf: lf.filter(pl.col("size") == "full"))
    skipped: dict[str, str] = {}
    for kind in _KINDS:
        skipped.update(reports[kind].skipped)
    counts = {"attempt_started": started.height, "attempt_finished": fin.height, "verdict": ver.height, "annotation": ann.height}
    started = _latest(started, keep="first").drop("ts")
    started_gpus = started["gpu"].unique().to_list()
    # one row per started attempt, as in `attempts` (the joins below add columns, never rows): the versions it mixes are
    # known here, and the lean tables then carry the version columns through the joins only when strata need them
    mix = _version_mix(started)
    fin = _latest(fin, keep="last").drop("ts")
    ann = _latest(ann, keep="last").drop("ts")
    # one row per (attempt, scope): the latest verdict of each scope
    v_pair = _latest(ver.filter(pl.col("scope") == "pair"), keep="last").drop("ts", "scope") \
        .rename(lambda c: c if c == "attempt_id" else f"pv_{c}")
    ver = ver.filter(pl.col("scope") == "attempt")  # the pair verdicts kept are in v_pair: the rest let go at once
    # an attempt's own verdict is read only where it has no pair re-grade: only those rows are joined
    v_att = _latest(ver, keep="last").drop("ts", "scope") \
        .join(v_pair.select("attempt_id"), on="attempt_id", how="anti").rename(lambda c: c if c == "attempt_id" else f"av_{c}")
    del ver  # the verdicts kept are in v_pair and v_att: let the rest go before the joins
    if lean and not mix:  # the versions and the experiment have been read off: the lean tables carry them no further
        started = started.drop("mkb_version", "grader_version", "dsl_version", "doc_pack_version", "experiment")
    rights = [fin, v_pair, v_att, ann]
    del fin, v_pair, v_att  # held by `rights` alone, which the join empties: each frame let go once gathered
    a = _join_unique(started, rights)
    if hashed:  # a row joined to an attempt whose second hash differs: two ids of one key (checked before anything is derived)
        checks = ("_chk_f", "pv__chk_v", "av__chk_v", "_chk_a")
        if a.select(pl.any_horizontal((pl.col(c) != pl.col("_chk")).fill_null(False) for c in checks).any()).item():
            raise _KeyClash
        a = a.drop("_chk", *checks)
    a = a.lazy()
    a = a.with_columns(pl.lit(None, dtype).alias(name) for name, dtype in absent.items())
    has_pv = pl.col("pv_passed").is_not_null()
    has_av = pl.col("av_passed").is_not_null()
    pick = lambda c: pl.when(has_pv).then(pl.col(f"pv_{c}")).otherwise(pl.col(f"av_{c}"))  # noqa: E731
    a = a.with_columns(
        verdict_source=pl.when(has_pv).then(pl.lit("pair")).when(has_av).then(pl.lit("attempt")).otherwise(pl.lit("none")),
        v_passed=pick("passed"), v_speedup=pick("speedup"), v_s=pick("s"), v_kernel=pick("kernel_sha256"),
        v_reason=pick("reason"), v_candidate_us=pick("candidate_median_us"),
    )
    has_kernel = pl.col("final_kernel_sha256").is_not_null() | pl.col("v_kernel").is_not_null()
    a = a.with_columns(
        family=pl.col("family").fill_null("unknown"),
        status=pl.col("status").fill_null("unfinished"),
        has_kernel=has_kernel,
        passed=(pl.col("v_passed").fill_null(False) & has_kernel),
    )
    a = a.with_columns(speedup=pl.when(pl.col("passed")).then(pl.col("v_speedup")))
    r_exprs = [(pl.col("passed") & (pl.col("speedup") >= t).fill_null(False)).alias(c) for t, c in zip(THRESHOLDS, R_COLS)]
    a = a.with_columns(r_exprs).with_columns(S=20.0 * pl.sum_horizontal([pl.col(c).cast(pl.Int32) for c in R_COLS]))
    a = _add_sol(a, char, tc, gpus=started_gpus).with_columns(candidate_us=pl.col("v_candidate_us"))
    a = a.with_columns(
        s_mismatch=(pl.col("v_s").is_not_null() & ((pl.col("v_s") - pl.col("S")).abs() > 1e-6)),
        excluded=pl.when(pl.col("status") == "unfinished").then(pl.lit("unfinished"))
        .when(pl.col("status") == "infra_error").then(pl.lit("infra_error"))
        .when(pl.col("label").is_not_null() & (pl.col("label") != "clean")).then(pl.lit("annotated:") + pl.col("label"))
        .when(has_kernel & (pl.col("verdict_source") == "none")).then(pl.lit("ungraded"))
        .when(~pl.col("status").is_in(SCORED_STATUSES)).then(pl.lit("unknown_status:") + pl.col("status")),
        verdict=pl.when(pl.col("passed")).then(pl.lit("passed")).when(~has_kernel).then(pl.lit("no_kernel"))
        .otherwise(pl.col("v_reason").fill_null("failed")),
        budget_used=pl.col("submissions_used") / pl.col("budget_submissions"),
        # a counted verdict that recorded no score of this kind (every grader since it existed records it, null or not)
        score_unrecorded=(pl.col("verdict_source") != "none") & pl.col("v_s").is_null(),
    )
    a = a.drop([c for c in a.collect_schema().names() if c.startswith(("pv_", "av_"))] + ["v_passed", "v_speedup", "v_kernel", "v_candidate_us"])
    if lean:  # what the lift tables read, and what the version check and the strata need
        a = a.select(*_LINKS, *(c for c in LIFT_COLUMNS if c != "stratum"),
                     *(dict.fromkeys(c for k, within in VERSION_KEYS.items() for c in (k, *within) if c not in LIFT_COLUMNS) if mix else ()),
                     "score_unrecorded")
    attempts = a.collect(engine=ENGINE)  # the categoricals stay until the pairs are built from them
    unrecorded = attempts.filter(pl.col("score_unrecorded") & pl.col("excluded").is_null()).height
    if unrecorded:
        counted = attempts.filter((pl.col("verdict_source") != "none") & pl.col("excluded").is_null()).height
        raise ScoreError(
            f"store {store.url}: {unrecorded} of {counted} counted verdicts have no {s_col} column (graded before the verdict "
            f"recorded it), so {SCORE_LABELS[score].split(' (')[0]} cannot be computed\nhint: re-grade the final kernels under "
            "the current grader (`mkb-run regrade`), or analyse with --score s")
    attempts = attempts.drop("score_unrecorded")
    # the frames read are in `attempts` now: let them go before the pairs are built (at experiment scale they are
    # gigabytes, and the peak would otherwise hold both)
    del a, started, ann, skill_flags, char, tc
    if mix and not stratify:
        lines = "\n".join(f"  {k}: {', '.join(v[:6])}{' ...' if len(v) > 6 else ''}" for k, v in mix.items())
        raise MixedVersionsError(
            f"the dataset mixes versions:\n{lines}\n"
            "hint: re-run stale coordinates (`mkb-run run --rerun-stale`), point --store at one version, "
            "or pass --stratify to analyse each version stratum separately")
    if mix:
        attempts = _text(attempts)
    attempts = _add_stratum(attempts, stratify=bool(mix))
    pairs = build_pairs(attempts, ids=not lean, text=not lean, unread=not lean)
    # the lean tables keep their text as categoricals (what lift reads at scale: a quarter of the memory), the full ones text
    attempts = _coded(attempts.select(LIFT_COLUMNS)) if lean else _text(attempts)
    return Tables(attempts, pairs, store.url, bool(mix), mix, skipped, counts, score=score, score_from=score_from)


def _join_unique(left: pl.DataFrame, rights: list[pl.DataFrame], on: str = "attempt_id") -> pl.DataFrame:
    """`left` left-joined to each of `rights` on `on`, every right frame holding each key at most once (the latest row
    per attempt): the same rows and order as the chain of left joins, but the key columns alone are joined and each
    right frame's columns gathered once, where each join of the chain copied every column joined so far. `rights` is
    emptied as they are gathered, so a caller that holds them only there has each let go once gathered."""
    keys = left.select(on)
    parts = [left]
    while rights:
        right = rights.pop(0)
        at = keys.join(right.select(on).with_row_index("_at"), on=on, how="left", maintain_order="left")["_at"]
        parts.append(right.drop(on).select(pl.all().gather(at)))  # a null position (no such key) gathers nulls
        del right, at
    return pl.concat(parts, how="horizontal")


def _categories(df: pl.DataFrame) -> pl.Categorical:
    """The categorical type `df`'s categoricals use (a new one where it has none)."""
    return next((ty for ty in df.schema.values() if isinstance(ty, pl.Categorical)), None) or pl.Categorical(pl.Categories.random())


def _coded(df: pl.DataFrame, coded: pl.Categorical | None = None) -> pl.DataFrame:
    """The text columns of `df` as categoricals, of the categories its categoricals already use (else its own)."""
    return df.with_columns(pl.col(pl.String).cast(coded or _categories(df)))


def _text(df):
    """The categoricals of `df` as text again: what the tables hold (and every table made from lean pairs)."""
    return df.with_columns(pl.col(pl.Categorical).cast(pl.String))


def _plan_score(store: Store, experiments: list[str | None], plans: pl.DataFrame) -> tuple[str, str]:
    """The score the plans of the store's experiments name (plan >= 1.1; `s` before), and where it came from.

    An experiment's plan is its latest `plan` event (a store holds one plan per experiment name); an experiment
    without a plan (a synthetic or imported dataset) is scored by `s`. Experiments scored differently in one store
    are refused: their rows would mix baselines in one table.
    """
    plans = plans.sort("ts").unique(subset="experiment", keep="last")
    named = {e: sc or "s" for e, sc in plans.select("experiment", "score").iter_rows()}
    used = {e or "(none)": named.get(e, "s") for e in experiments}
    bad = sorted({sc for sc in used.values() if sc not in SCORES})
    if bad:
        raise ScoreError(f"store {store.url}: a plan names an unknown score {bad[0]!r}\nhint: pass --score s or --score s_upstream")
    scores = sorted(set(used.values()))
    if len(scores) > 1:
        by = "; ".join(f"{e}: {sc}{'' if e in named else ' (no plan)'}" for e, sc in sorted(used.items()))
        raise ScoreError(f"store {store.url}: its experiments are scored differently ({by})\n"
                         "hint: pass --score s or --score s_upstream, or point --store at one experiment")
    from_plan = sorted(e for e in used if e in named)
    if not from_plan:
        return "s", "the default (no plan names a score)"
    return scores[0], "the plan of " + ", ".join(from_plan)


def _add_sol(a: pl.LazyFrame, char: pl.DataFrame, tc: pl.DataFrame | None = None, *,
             gpus: list | None = None) -> pl.LazyFrame:
    """S_sol and S over torch.compile (mkb.scoring), from the characterisation's FLOPs, bytes and peak class and
    the `torch_compile` events (mkb.analysis._compile: the faster ok mode).

    The speed of light is recomputed for the GPU that timed each attempt (`mkb.peaks`), so a characterisation
    measured on one GPU model serves attempts graded on another. The torch.compile time is a time, so it is
    taken only from the attempt's GPU model and the attempt's problem hash. Null where the store holds no
    characterisation of the problem (S_sol) or no torch.compile time (S_compile): absent, never a fabricated zero.
    """
    from mkb.analysis._compile import compile_times
    from mkb.peaks import gpu_peaks

    if gpus is None:  # the callers that have the started rows pass their GPUs (no second run of the join plan)
        gpus = a.select("gpu").unique().collect(engine=ENGINE)["gpu"].to_list()
    models = {}
    for g in gpus:
        try:
            models[g] = gpu_peaks(g or "")
        except KeyError:
            models[g] = None  # no peaks for this GPU model: its attempts get no S_sol
    rows = []
    if char.height:
        # one row per problem: its latest full-size characterisation (FLOPs and bytes do not depend on the GPU)
        char = char.sort("ts").unique(subset="problem", keep="last").drop("ts", "gpu")
        for g, peaks in models.items():
            if peaks is None:
                continue
            for r in char.iter_rows(named=True):
                try:
                    sol = max(r["flops"] / peaks.compute(r["peak"]), r["bytes"] / peaks.hbm_bytes_per_s) * 1e6
                except (TypeError, ValueError):
                    continue
                rows.append({"gpu": g, "problem": r["problem"], "sol_us": sol})
    sol = pl.DataFrame(rows, schema={"gpu": pl.Utf8, "problem": pl.Int64, "sol_us": pl.Float64})
    ct = compile_times(tc if tc is not None else pl.DataFrame())
    machine = pl.DataFrame({"gpu": list(models), "machine": [p.model if p is not None else g for g, p in models.items()]},
                           schema={"gpu": pl.Utf8, "machine": pl.Utf8})
    comp = machine.join(ct.filter(pl.col("size") == "full").select("machine", "problem_hash", "compile_us"), on="machine").drop("machine")
    types = a.collect_schema()
    for key, table in ((("gpu", "problem"), sol), (("gpu", "problem_hash"), comp)):
        value = table.columns[-1]
        if table.select(key).is_duplicated().any():  # never by construction; a join would repeat the attempt's row
            a = a.join(table.lazy().with_columns(pl.col(c).cast(types[c]) for c in key), on=list(key), how="left")
        else:
            a = a.with_columns(_lookup(key, table, types).alias(value))
    cand = pl.when(pl.col("v_candidate_us") > 0).then(pl.col("v_candidate_us"))
    frac = pl.when(pl.col("sol_us") > 0).then(pl.col("sol_us") / cand)
    hits = [(pl.col("passed") & ((frac >= f).fill_null(False) if f > 0 else pl.lit(True))).cast(pl.Int32) for f in SOL_THRESHOLDS]
    sc = pl.when(pl.col("compile_us") > 0).then(pl.col("compile_us") / cand)
    hits_c = [(pl.col("passed") & (sc >= t).fill_null(False)).cast(pl.Int32) for t in THRESHOLDS]
    return a.with_columns(
        sol_fraction=pl.when(pl.col("passed")).then(frac),
        S_sol=pl.when(pl.col("sol_us").is_not_null()).then(100.0 / len(SOL_THRESHOLDS) * pl.sum_horizontal(hits)),
        speedup_compile=pl.when(pl.col("passed")).then(sc),
        S_compile=pl.when(pl.col("compile_us").is_not_null()).then(100.0 / len(THRESHOLDS) * pl.sum_horizontal(hits_c)),
    ).drop("compile_us")


def _lookup(key: tuple[str, str], table: pl.DataFrame, types) -> pl.Expr:
    """The last column of `table` at each row's (gpu, `key[1]`), null where it has none: the left join of a small table
    of unique keys as an expression, a lookup per row where the join would copy every column of the 2M-row frame."""
    gpu, k = key
    out = pl.lit(None, table.schema[table.columns[-1]])
    coded = isinstance(types[k], pl.Categorical)  # compared by code: the table's values cast into the frame's categories
    at = pl.col(k).to_physical() if coded else pl.col(k)
    for (g,), rows in table.partition_by(gpu, as_dict=True, maintain_order=True).items():
        rows = rows.drop_nulls(k)  # a null key matches nothing in a join
        if g is None or not rows.height:
            continue
        old = rows[k].cast(types[k])
        out = pl.when(pl.col(gpu) == g).then(at.replace_strict(old.to_physical() if coded else old, rows[table.columns[-1]],
                                                                 default=None)).otherwise(out)
    return out


def _version_mix(a: pl.DataFrame) -> dict[str, list[str]]:
    # the distinct combinations hold every set of values the checks below collect: one pass over the attempts
    a = a.select(list(dict.fromkeys(c for col, within in VERSION_KEYS.items() for c in (col, *within)))).unique() \
        .with_columns(pl.col(pl.Categorical).cast(pl.String))
    out = {}
    for col, within in VERSION_KEYS.items():
        if within:
            g = a.group_by(list(within)).agg(pl.col(col).unique().sort().alias("vals")).filter(pl.col("vals").list.len() > 1)
            for row in g.sort(list(within)).iter_rows(named=True):
                where = ",".join(f"{k}={row[k]}" for k in within)
                out[f"{col} [{where}]"] = [str(v) for v in row["vals"]]
        else:
            vals = a[col].unique().drop_nulls().sort().to_list()
            if len(vals) > 1:
                out[col] = [str(v) for v in vals]
    return out


def _add_stratum(a: pl.DataFrame, *, stratify: bool) -> pl.DataFrame:
    """The stratum of an attempt: its versions; a problem's hashes are numbered by first appearance (generation)."""
    if not stratify:
        return a.with_columns(stratum=pl.lit("all"))
    gen = (a.group_by("problem", "target_dsl", "problem_hash").len().sort("problem_hash")
           .with_columns(problem_gen=pl.col("problem_hash").rank("dense").over("problem", "target_dsl").cast(pl.Int64))
           .select("problem", "target_dsl", "problem_hash", "problem_gen"))
    a = a.join(gen, on=["problem", "target_dsl", "problem_hash"], how="left")
    return a.with_columns(stratum=pl.format("grader={} mkb={} dsl={} doc={} problem_gen={}", "grader_version", "mkb_version",
                                            "dsl_version", "doc_pack_version", "problem_gen")).drop("problem_gen")


class _BlockKeys:
    """A block (model, problem, replicate, DSL, stratum) and a group (the same without the replicate) as one join key each:
    the five (four) values packed into one integer, exactly, when the ranges of the attempts' values fit in 63 bits
    (always, short of billions of codes); else a struct of them (the same matches: a multi-column join's cost).

    A block's key can be taken with another DSL or replicate column (a source DSL's solo, the noise floor's r+2): values
    outside the attempts' range match nothing, like the columns they stand for.
    """

    def __init__(self, attempts: pl.DataFrame) -> None:
        types = attempts.schema
        cats = {c: types[c] for c in ("model", "target_dsl", "source_dsl", "stratum") if isinstance(types[c], pl.Categorical)}
        # DSLs compared across the two columns: one code space (the frame's categories, or a local one for text)
        self.local = pl.Categorical(pl.Categories.random())
        same = len({cats.get("target_dsl"), cats.get("source_dsl")}) == 1 and "target_dsl" in cats
        self.code = {c: (pl.col(c).to_physical() if c in cats and (same or c in ("model", "stratum")) else pl.col(c).cast(self.local).to_physical())
                     .cast(pl.Int64) for c in ("model", "target_dsl", "source_dsl", "stratum")}
        got = attempts.select(m=self.code["model"].max(), d=pl.max_horizontal(self.code["target_dsl"].max(), self.code["source_dsl"].max()),
                              s=self.code["stratum"].max(), p0=pl.col("problem").min(), p1=pl.col("problem").max(),
                              r0=pl.col("replicate").min(), r1=pl.col("replicate").max()).row(0, named=True)
        self.packed = attempts.height > 0 and None not in got.values()
        if self.packed:
            self.p0, self.r0 = got["p0"], got["r0"]
            self.n = [got["m"] + 1, got["p1"] - got["p0"] + 1, got["r1"] - got["r0"] + 1, got["d"] + 1, got["s"] + 1]
            self.packed = math.prod(self.n) < 2**63

    def block(self, *, replicate: str = "replicate", dsl: str = "target_dsl") -> pl.Expr:
        if not self.packed:
            return pl.struct("model", "problem", pl.col(replicate).alias("replicate"), pl.col(dsl).cast(pl.String).alias("dsl"),
                             pl.col("stratum").cast(pl.String))
        m, p, r, d, s = self.n
        rep = pl.col(replicate).cast(pl.Int64) - self.r0
        v = (((self.code["model"] * p + (pl.col("problem") - self.p0)) * r + rep) * d + self.code[dsl]) * s + self.code["stratum"]
        return pl.when((rep >= 0) & (rep < r)).then(v)

    def group(self) -> pl.Expr:
        if not self.packed:
            return pl.struct("model", "problem", pl.col("target_dsl").cast(pl.String), pl.col("stratum").cast(pl.String))
        m, p, _, d, s = self.n
        return ((self.code["model"] * p + (pl.col("problem") - self.p0)) * d + self.code["target_dsl"]) * s + self.code["stratum"]


def build_pairs(attempts: pl.DataFrame, *, ids: bool = True, text: bool = True, unread: bool = True) -> pl.DataFrame:
    """Each non-solo arm against the solo of its target DSL (same model, problem, replicate, stratum), with standing.

    Standing compares the source's solo S with the mean S of the target DSL's *other* solo
    replicates: neither the solo the lift subtracts nor the source itself enters that mean, so no
    regression to the mean is built in. `standing_naive` (source vs the subtracted solo) is kept
    only to show the bias. Without `ids` the pairs leave out the attempt ids that link them to their attempts
    (`PAIR_IDS`; a third of the table's memory at experiment scale). Without `text` their text columns are categoricals
    (a quarter of the memory, and the tables' group-bys a quarter faster at scale); every table of mkb.analysis made
    from them holds text, as from text pairs. Without `unread` they leave out `PAIR_UNREAD`.
    """
    # one lazy plan, collected once: polars shares the scans of `solos` and runs the independent joins in parallel.
    # Blocks and groups are joined by one key column each (`_BlockKeys`), not by their five and four columns
    bk = _BlockKeys(attempts)
    inc = attempts.lazy().filter(pl.col("excluded").is_null()).with_columns(_k=bk.block(), _g=bk.group())
    key = ["model", "problem", "replicate", "target_dsl", "stratum"]
    solos = inc.filter(pl.col("arm_kind") == "solo")
    base = solos.select("_k", base_attempt=pl.col("attempt_id"), S_solo="S", passed_solo="passed", speedup_solo="speedup",
                        S_sol_solo="S_sol", S_compile_solo="S_compile", served_solo="served_model")
    arms = inc.filter(pl.col("arm_kind") != "solo").select(
        *key, "_k", "family", "arm_kind", "source_dsl", "attempt_id", "skill_source_attempt", "S", "passed", "speedup",
        "S_sol", "S_compile", "skill_flagged", "served_model")
    # a placebo may carry no source_dsl (the schema allows it: it has no source attempt); it belongs to the
    # direction of its block's transfer arm, whose source it stands in for
    block_src = arms.filter(pl.col("arm_kind") == "transfer").group_by("_k").agg(block_src=pl.col("source_dsl").drop_nulls().first())
    arms = arms.join(block_src, on="_k", how="left").with_columns(
        source_dsl=pl.when(pl.col("arm_kind") == "placebo").then(pl.coalesce("source_dsl", "block_src"))
        .otherwise(pl.col("source_dsl"))).drop("block_src")
    # placebo carries no source attempt: its standing is that of the transfer arm's source (the other DSL's solo, same replicate)
    solo_ids = solos.select(_kk="_k", solo_id="attempt_id")  # a solo by its block: the source DSL's solo is at (.., source_dsl, ..)
    arms = arms.with_columns(_ks=bk.block(dsl="source_dsl")).join(solo_ids, left_on="_ks", right_on="_kk", how="left").drop("_ks")
    arms = arms.with_columns(source_attempt=pl.coalesce("skill_source_attempt",
                                                        pl.when(pl.col("arm_kind") == "placebo").then(pl.col("solo_id"))))
    arms = arms.drop("solo_id", "skill_source_attempt")
    # the noise floor, built with the dependence of the arms it is read against (DESIGN, Definitions): in block
    # (model, problem, r, target) the pseudo-arm is the target's solo at r+1, the subtracted solo is the target's
    # solo at r, and the source is the source DSL's solo at r+2, classified against the mean of the target's solos
    # other than r and r+1 (so it includes r+2). A shock shared by every attempt of a replicate then enters the
    # pseudo-arm's lift (r+1 vs r) and its standing (r+2 vs a mean holding r+2) independently, as it enters a
    # transfer arm's lift (arm and solo both at r) and standing independently. Needs R >= 3.
    nrep = solos.group_by("_g").agg(R=pl.col("replicate").max() + 1)
    nxt = solos.join(nrep, on="_g").filter(pl.col("R") >= 3).with_columns(prev=(pl.col("replicate") - 1) % pl.col("R"))
    noise = nxt.select(pl.col("model"), pl.col("problem"), pl.col("prev").alias("replicate"), "target_dsl", "stratum", "family",
                       pl.lit(NOISE_ARM, attempts.schema["arm_kind"]).alias("arm_kind"), "attempt_id", "S", "passed", "speedup", "S_sol", "S_compile",
                       "skill_flagged", "served_model", "R").with_columns(_k=bk.block())
    # the source DSL of a block: its transfer arm's (any DSL other than the target when there is none)
    tsrc = arms.filter(pl.col("arm_kind") == "transfer").group_by("_k").agg(source_dsl=pl.col("source_dsl").drop_nulls().first())
    noise = noise.join(tsrc, on="_k", how="left")
    noise = noise.with_columns(src_rep=(pl.col("replicate") + 2) % pl.col("R"))
    noise = noise.with_columns(_ks=bk.block(replicate="src_rep", dsl="source_dsl")).join(
        solo_ids, left_on="_ks", right_on="_kk", how="left")
    noise = noise.rename({"solo_id": "source_attempt"}).drop("R", "src_rep", "_ks")
    noise = noise.select(arms.collect_schema().names())
    pairs = pl.concat([arms, noise], how="vertical_relaxed").join(base, on="_k", how="inner")
    # source S and whether the source is itself one of the target's solo replicates (same arm, noise floor)
    src = attempts.lazy().select(source_attempt="attempt_id", S_source="S", source_excluded="excluded",
                          src_model="model", src_problem="problem", src_tgt="target_dsl", src_kind="arm_kind",
                          src_rep="replicate")
    pairs = pairs.join(src, on="source_attempt", how="left")
    tot = solos.group_by("_g").agg(sum_S=pl.col("S").sum(), n_solo=pl.len())
    pairs = pairs.with_columns(_g=bk.group()).join(tot, on="_g", how="left")
    src_in_group = ((pl.col("src_kind") == "solo") & (pl.col("src_model") == pl.col("model")) & (pl.col("src_problem") == pl.col("problem"))
                    & (pl.col("src_tgt") == pl.col("target_dsl")) & (pl.col("src_rep") != pl.col("replicate"))).fill_null(False)
    # the noise floor's pseudo-arm is a target solo too: leave it out of the reference mean as well
    arm_in_group = pl.col("arm_kind") == NOISE_ARM
    num = pl.col("sum_S") - pl.col("S_solo") - pl.when(src_in_group).then(pl.col("S_source")).otherwise(0.0) \
        - pl.when(arm_in_group).then(pl.col("S")).otherwise(0.0)
    den = pl.col("n_solo") - 1 - src_in_group.cast(pl.Int64) - arm_in_group.cast(pl.Int64)
    pairs = pairs.with_columns(ref_mean=pl.when(den > 0).then(num / den.cast(pl.Float64)), lift=pl.col("S") - pl.col("S_solo"))
    usable = pl.col("S_source").is_not_null() & pl.col("source_excluded").is_null()
    # the labels as the pairs will hold them: text, or categoricals made as such (2M rows of text never materialised)
    coded = None if text else _categories(attempts)
    lit = (lambda v: pl.lit(v)) if text else (lambda v: pl.lit(v, coded))  # noqa: E731

    def cls(ref):
        d = pl.col("S_source") - ref
        return (pl.when(~usable | ref.is_null()).then(None).when(d > 1e-9).then(lit("above"))
                .when(d < -1e-9).then(lit("below")).otherwise(lit("tie")))

    direction = pl.format("{}->{}", pl.col("source_dsl").fill_null("-"), pl.col("target_dsl"))
    pairs = pairs.with_columns(standing=cls(pl.col("ref_mean")), standing_naive=cls(pl.col("S_solo")),
                               outcome=pl.when(pl.col("lift") > 1e-9).then(lit("improve"))
                               .when(pl.col("lift") < -1e-9).then(lit("regress")).otherwise(lit("tie")),
                               direction=direction if text else direction.cast(coded),
                               lift_sol=pl.col("S_sol") - pl.col("S_sol_solo"),
                               # the served model changed between the block's solo and its skill arm (null: not recorded)
                               served_changed=pl.col("served_model") != pl.col("served_solo"))
    pairs = pairs.drop("_k", "_g", "src_model", "src_problem", "src_tgt", "src_kind", "src_rep", "sum_S", "n_solo", "source_excluded",
                       *(() if ids else PAIR_IDS), *(() if unread else PAIR_UNREAD))
    if text:
        return _text(pairs).collect(engine=ENGINE)  # attempts may hold categoricals (load_tables): the pairs hold text
    return _coded(pairs.collect(engine=ENGINE), coded)
