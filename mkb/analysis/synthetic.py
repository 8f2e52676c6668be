"""Synthetic mkb datasets with planted truth, so the analysis can be checked against known answers.

Every attempt has a latent quality z = model + problem + problem x DSL + arm effect + noise. It
passes when z > 0, and its speedup is exp(z - 1), so R@t holds exactly when z exceeds
max(0, 1 + ln t) and E[S] is a sum of normal CDFs: the planted relative lift is known in closed
form. The transfer effect may also grow with the source solo's own noise (`standing_slope`), which
plants a standing effect; its population value comes from a large Monte Carlo of the same model,
scored by a small numpy implementation independent of the polars tables.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from mkb.scoring import THRESHOLDS, s_upstream

ARM_KINDS = ("solo", "transfer", "placebo", "same", "wrong")
# z thresholds at which R@t switches on: passed (z > 0) and speedup = exp(z - 1) >= t
Z_CUTS = np.array([max(0.0, 1.0 + math.log(t)) if t > 0 else 0.0 for t in THRESHOLDS])
# catalog families by problem number (problem-catalog.md)
_FAMILY_RANGES = (("attention", 1, 18), ("kv_cache", 19, 26), ("mlp_norm", 27, 43), ("moe", 44, 51),
                  ("quantization", 52, 61), ("linear_attention", 62, 74))


def sol_ratio_of(spec: "SynthSpec", problem: int) -> float:
    """A problem's speed-of-light time as a share of its eager time (0.08 to 0.58, fixed by seed and problem)."""
    return 0.08 + 0.5 * int(_sha("sol", spec.seed, problem)[:8], 16) / 2**32


def family_of(problem: int) -> str:
    """The catalog family of a problem number; numbers past 74 wrap around the catalog."""
    n = (problem - 1) % 74 + 1
    return next(f for f, lo, hi in _FAMILY_RANGES if lo <= n <= hi)


@dataclass(frozen=True)
class SynthSpec:
    """What to generate and what truth to plant. Effects are shifts of the latent z (noise sd = `noise`)."""

    models: tuple[str, ...] = ("synth/model-a", "synth/model-b")
    n_problems: int = 74
    replicates: int = 3
    dsls: tuple[str, ...] = ("cute", "tirx")
    seed: int = 0
    model_means: tuple[float, ...] = (0.9, 0.5)
    problem_sd: float = 1.0
    problem_dsl_sd: float = 0.3
    noise: float = 0.7
    effects: dict[str, float] = field(default_factory=lambda: {"transfer": 0.35, "placebo": 0.0, "same": 0.2, "wrong": 0.0})
    harmed_share: float = 0.0  # share of problems on which every non-zero effect is reversed in sign
    standing_slope: float = 0.0  # transfer z += slope x (source solo's noise)
    # the experiment's scheduler: per (model, problem, replicate) the solos of each DSL run first, the skill arms of
    # a block (model, problem, replicate, target DSL) later and together. `replicate_shock` is shared by every
    # attempt of a replicate (solos and the skill arms of its blocks); `block_shock` by the skill arms of one block.
    replicate_shock: float = 0.0
    block_shock: float = 0.0
    p_skill_flagged: float = 0.0  # share of skills whose hygiene check flags a code block (the sensitivity row)
    characterise: bool = True  # write one characterisation per problem (speed of light: S_sol)
    p_no_kernel: float = 0.3  # share of failing attempts that end with no kernel at all
    p_budget_exhausted: float = 0.2  # share of no-kernel attempts that ran out of budget
    p_infra: float = 0.0
    p_unfinished: float = 0.0
    p_pair_regrade: float = 1.0
    n_annotated: int = 0
    experiment: str = "synthetic"
    grader_version: str = "grader-1"
    dsl_versions: dict[str, str] = field(default_factory=lambda: {"cute": "4.8.1", "tirx": "0.27.0.post1"})
    doc_pack_version: str = "docs-1"
    problem_hash_salt: str = ""
    # upstream's baseline: the problem's reference takes this many times eager's time, so speedup_upstream = factor x
    # speedup (and S_upstream differs from S where it crosses a threshold); None writes verdicts without it, as graders
    # did before verdict 1.3
    upstream_factor: float | None = None

    def model_mean(self, i: int) -> float:
        return self.model_means[i % len(self.model_means)]


def wrong_derangement(problems: list[int], seed: int) -> dict[int, int]:
    """pi: a seeded derangement mapping each problem to one of another family where the sizes allow.

    Families are put in a random order, shuffled inside, and the list is rotated by the largest
    family's size, so no problem lands in its own family (as long as that family is at most half).
    """
    rng = np.random.default_rng(seed + 7919)
    fams: dict[str, list[int]] = {}
    for p in problems:
        fams.setdefault(family_of(p), []).append(p)
    order = [fams[f] for f in rng.permutation(sorted(fams))]
    seq = [p for group in order for p in rng.permutation(group).tolist()]
    n, biggest = len(seq), max(len(g) for g in order)
    shift = biggest if biggest <= n - biggest else 1
    return {seq[i]: seq[(i + shift) % n] for i in range(n)}


@dataclass
class Simulation:
    """The latent draws of one dataset: z[model, problem, dsl, replicate, arm] (arm index in ARM_KINDS)."""

    spec: SynthSpec
    problems: list[int]
    base: np.ndarray  # [M, P, D]
    sign: np.ndarray  # [P]: -1 on harmed problems
    z: np.ndarray  # [M, P, D, R, A]
    wrong_of: dict[int, int]


def _arm_effect(spec: SynthSpec, kind: str) -> float:
    return 0.0 if kind == "solo" else float(spec.effects.get(kind, 0.0))


def simulate(spec: SynthSpec, *, replicates: int | None = None, rng: np.random.Generator | None = None,
             base: np.ndarray | None = None, sign: np.ndarray | None = None) -> Simulation:
    """Draw every latent z; `replicates`, `base` and `sign` let the Monte Carlo reuse a dataset's problems."""
    rng = rng or np.random.default_rng(spec.seed)
    M, P, D = len(spec.models), spec.n_problems, len(spec.dsls)
    R = replicates or spec.replicates
    problems = list(range(1, P + 1))
    if base is None:
        means = np.array([spec.model_mean(i) for i in range(M)])
        a = rng.normal(0, spec.problem_sd, P)
        b = rng.normal(0, spec.problem_dsl_sd, (P, D))
        base = means[:, None, None] + a[None, :, None] + b[None, :, :]
        harmed = rng.permutation(P)[: int(round(spec.harmed_share * P))]
        sign = np.ones(P)
        sign[harmed] = -1.0
    eps = rng.normal(0, spec.noise, (M, P, D, R, len(ARM_KINDS)))
    z = base[:, :, :, None, None] + eps
    if spec.replicate_shock:
        z += rng.normal(0, spec.replicate_shock, (M, P, 1, R, 1))
    if spec.block_shock:
        z[..., 1:] += rng.normal(0, spec.block_shock, (M, P, D, R, 1))
    for k, kind in enumerate(ARM_KINDS):
        z[..., k] += _arm_effect(spec, kind) * sign[None, :, None, None]
    if spec.standing_slope and D > 1:
        ti = ARM_KINDS.index("transfer")
        for d in range(D):
            src = (d + 1) % D  # the other DSL (the next one round the list for > 2 DSLs)
            z[:, :, d, :, ti] += spec.standing_slope * eps[:, :, src, :, 0]
    wrong_of = wrong_derangement(problems, spec.seed)
    return Simulation(spec, problems, base, sign, z, wrong_of)


def s_of_z(z: np.ndarray) -> np.ndarray:
    """S for latent z: 20 points per threshold t with passed and speedup >= t."""
    return 20.0 * (z[..., None] > Z_CUTS).sum(-1)


def expected_s(mean: np.ndarray, sd: float) -> np.ndarray:
    from scipy.stats import norm

    return 20.0 * norm.sf((Z_CUTS - mean[..., None]) / sd).sum(-1)


def true_relative_lift(sim: Simulation, *, kind: str = "transfer") -> dict[tuple[str, str, str], float]:
    """Planted relative lift per (model, source_dsl, target_dsl) cell, in closed form given the problems drawn."""
    spec = sim.spec
    out = {}
    eff = _arm_effect(spec, kind) * sim.sign[None, :, None]
    sd_solo = math.sqrt(spec.noise**2 + spec.replicate_shock**2)
    sd_arm = math.sqrt(spec.noise**2 * (1 + (spec.standing_slope**2 if kind == "transfer" else 0.0))
                       + spec.replicate_shock**2 + spec.block_shock**2)
    es_solo = expected_s(sim.base, sd_solo)  # [M, P, D]
    es_arm = expected_s(sim.base + eff, sd_arm)
    for m, model in enumerate(spec.models):
        for d, tgt in enumerate(spec.dsls):
            src = _source_dsl(spec, kind, d)
            out[(model, src, tgt)] = float(es_arm[m, :, d].sum() / es_solo[m, :, d].sum() - 1)
    return out


def _source_dsl(spec: SynthSpec, kind: str, d: int) -> str | None:
    D = len(spec.dsls)
    if kind == "solo":
        return None
    if kind == "same":
        return spec.dsls[d]
    return spec.dsls[(d + 1) % D]


def true_regression_share(sim: Simulation, *, kind: str = "transfer", n_mc: int = 400) -> dict[tuple[str, str], float]:
    """Population regression rate per (model, target_dsl): P(replicate-mean lift < 0), averaged over problems."""
    spec = sim.spec
    rng = np.random.default_rng(spec.seed + 1_000_003)
    k = ARM_KINDS.index(kind)
    acc = np.zeros((len(spec.models), spec.n_problems, len(spec.dsls)))
    for _ in range(max(1, n_mc // 50)):
        mc = simulate(spec, replicates=spec.replicates * 50, rng=rng, base=sim.base, sign=sim.sign)
        s = s_of_z(mc.z)  # [M, P, D, R*50, A]
        lift = (s[..., k] - s[..., 0]).reshape(*s.shape[:3], 50, spec.replicates).mean(-1)
        acc += (lift < -1e-9).mean(-1)
    acc /= max(1, n_mc // 50)
    return {(model, tgt): float(acc[m, :, d].mean()) for m, model in enumerate(spec.models) for d, tgt in enumerate(spec.dsls)}


def true_rates(sim: Simulation, *, kind: str = "transfer", n_mc: int = 400) -> dict[tuple[str, str], tuple[float, float, float]]:
    """Population (regression, improvement, tie) rates per (model, target_dsl), as `true_regression_share`."""
    spec = sim.spec
    rng = np.random.default_rng(spec.seed + 1_000_003)
    k = ARM_KINDS.index(kind)
    acc = np.zeros((3, len(spec.models), spec.n_problems, len(spec.dsls)))
    batches = max(1, n_mc // 50)
    for _ in range(batches):
        mc = simulate(spec, replicates=spec.replicates * 50, rng=rng, base=sim.base, sign=sim.sign)
        s = s_of_z(mc.z)
        lift = (s[..., k] - s[..., 0]).reshape(*s.shape[:3], 50, spec.replicates).mean(-1)
        acc[0] += (lift < -1e-9).mean(-1)
        acc[1] += (lift > 1e-9).mean(-1)
        acc[2] += (np.abs(lift) <= 1e-9).mean(-1)
    acc /= batches
    return {(model, tgt): tuple(float(acc[i, m, :, d].mean()) for i in range(3))
            for m, model in enumerate(spec.models) for d, tgt in enumerate(spec.dsls)}


def true_contrast(sim: Simulation, *, other: str = "placebo") -> dict[tuple[str, str], float]:
    """Planted relative difference transfer vs `other` per (model, target_dsl): sum E[S_transfer] / sum E[S_other] - 1."""
    spec = sim.spec
    sd_t = math.sqrt(spec.noise**2 * (1 + spec.standing_slope**2) + spec.replicate_shock**2 + spec.block_shock**2)
    sd_o = math.sqrt(spec.noise**2 + spec.replicate_shock**2 + spec.block_shock**2)
    es_t = expected_s(sim.base + _arm_effect(spec, "transfer") * sim.sign[None, :, None], sd_t)
    es_o = expected_s(sim.base + _arm_effect(spec, other) * sim.sign[None, :, None], sd_o)
    return {(model, tgt): float(es_t[m, :, d].sum() / es_o[m, :, d].sum() - 1)
            for m, model in enumerate(spec.models) for d, tgt in enumerate(spec.dsls)}


def standing_effect_numpy(s: np.ndarray, *, kind: str = "transfer", naive: bool = False) -> float:
    """Standing effect of `kind` pooled over models and DSLs, from S[M, P, D, R, A]; the test's independent scorer.

    Source = the other DSL's solo, same replicate. Corrected reference: mean of the target's solo
    replicates other than r; naive reference: the solo at r (the one the lift subtracts).
    """
    M, P, D, R, _ = s.shape
    k = ARM_KINDS.index(kind)
    imp_reg = {"above": [0, 0, 0], "below": [0, 0, 0]}
    solo = s[..., 0]
    for d in range(D):
        src = solo[:, :, (d + 1) % D, :]  # [M, P, R]
        tgt = solo[:, :, d, :]
        if naive:
            ref = tgt
        else:
            ref = (tgt.sum(-1, keepdims=True) - tgt) / (R - 1)
        lift = s[:, :, d, :, k] - tgt
        for cls, mask in (("above", src > ref + 1e-9), ("below", src < ref - 1e-9)):
            imp_reg[cls][0] += int((lift[mask] > 0).sum())
            imp_reg[cls][1] += int((lift[mask] < 0).sum())
            imp_reg[cls][2] += int(mask.sum())
    a, b = imp_reg["above"], imp_reg["below"]
    return (a[0] - a[1]) / a[2] - (b[0] - b[1]) / b[2]


def true_standing_effect(sim: Simulation, *, kind: str = "transfer", naive: bool = False, n_mc: int = 2000) -> float:
    """Population standing effect by Monte Carlo over fresh replicates of the dataset's own problems."""
    spec = sim.spec
    rng = np.random.default_rng(spec.seed + 2_000_003)
    vals = [standing_effect_numpy(s_of_z(_mc_batch(spec, sim, rng, 100)), kind=kind, naive=naive)
            for _ in range(max(1, n_mc // 100))]
    return float(np.mean(vals))


def _mc_batch(spec: SynthSpec, sim: Simulation, rng: np.random.Generator, copies: int) -> np.ndarray:
    """z for `copies` independent re-runs of the whole design (stacked along the model axis)."""
    big = replace(spec, models=tuple(f"{m}#{c}" for c in range(copies) for m in spec.models))
    base = np.concatenate([sim.base] * copies, axis=0)
    return simulate(big, rng=rng, base=base, sign=sim.sign).z


# --------------------------------------------------------------------------- writing events


def _sha(*parts: Any) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()


@dataclass
class SynthResult:
    """Where the dataset went and what was planted in it."""

    store: str
    simulation: Simulation
    events: int
    files: list[str]
    attempt_ids: dict[tuple[str, int, str, int, str], str]  # (model, problem, target, replicate, arm) -> id
    infra: list[str]
    unfinished: list[str]
    annotated: list[str]


class _Sink:
    """Buffers rows per kind, each built by the one envelope builder (`mkb.events._envelope.Envelope`), and writes
    them with the writer's functions.

    EventWriter.emit type-checks each row as its own table (about 240 us a row), too slow for the
    million-event benchmark; this validates all rows of a flush at once through the same
    `rows_to_table` and writes the same atomic immutable files through `write_table`. Timestamps are
    one microsecond apart from the start, in emission order, so a dataset's rows sort as they were made.
    """

    def __init__(self, writer, *, via_emit: bool, chunk: int) -> None:
        from mkb.events._envelope import Envelope

        self.writer, self.via_emit, self.chunk = writer, via_emit, chunk
        self.env = Envelope(run_id=writer.run_id)
        self.rows: dict[str, list[dict]] = {}
        self.versions: dict[str, str] = {}
        self.n = 0
        self.files: list[str] = []
        self.t0 = dt.datetime.now(dt.timezone.utc)

    def emit(self, kind: str, attempt_id: str | None, **payload: Any) -> None:
        self.n += 1
        if self.via_emit:
            self.writer.emit(kind, attempt_id=attempt_id, **payload)
            return
        version = self.versions.get(kind)
        if version is None:
            from mkb.events import schema_for

            version = self.versions[kind] = schema_for(kind).version
        self.env.check_payload(payload)
        row = self.env.row(kind, version, attempt_id, payload, self.t0 + dt.timedelta(microseconds=self.n))
        self.env.number([row])
        buf = self.rows.setdefault(kind, [])
        buf.append(row)
        if len(buf) >= self.chunk:
            self._flush(kind)

    def _flush(self, kind: str) -> None:
        from mkb.events import schema_for, write_table
        from mkb.events._writer import rows_to_table

        rows = self.rows.pop(kind, [])
        if rows:
            self.files.append(write_table(self.writer.store, kind, rows_to_table(schema_for(kind), rows)))

    def close(self) -> None:
        if self.via_emit:
            self.files += self.writer.flush()
        for kind in list(self.rows):
            self._flush(kind)


def write_synthetic(spec: SynthSpec, store: str, *, via_emit: bool = False, chunk: int = 200_000) -> SynthResult:
    """Write a complete event log for `spec` into `store` and return it with its simulation.

    Per (model, problem, replicate) and target DSL: solo, transfer, placebo, same and wrong arms,
    each with attempt_started, skill, attempt_finished, verdict (scope=attempt) and, for a share
    `p_pair_regrade` of coordinates, verdict (scope=pair). `via_emit` sends every row through
    EventWriter.emit (slow; for small datasets and the equivalence test).
    """
    from mkb.events import EventWriter

    sim = simulate(spec)
    rng = np.random.default_rng(spec.seed + 17)
    writer = EventWriter(store, run_id=f"synth-{spec.seed}", flush_every=10**9)
    sink = _Sink(writer, via_emit=via_emit, chunk=chunk)
    M, P, D, R = len(spec.models), spec.n_problems, len(spec.dsls), spec.replicates
    ids: dict[tuple, str] = {}
    for m, model in enumerate(spec.models):
        for p in sim.problems:
            for r in range(R):
                for d, tgt in enumerate(spec.dsls):
                    for kind in ARM_KINDS:
                        ids[(model, p, tgt, r, kind)] = _sha("attempt", spec.seed, model, p, tgt, r, kind)[:32]
    infra, unfinished, annotated = [], [], []
    s_all = s_of_z(sim.z)
    for m, model in enumerate(spec.models):
        for pi_, p in enumerate(sim.problems):
            fam = family_of(p)
            for r in range(R):
                pair_regrade = rng.random() < spec.p_pair_regrade
                pair_id = _sha("pair", model, p, r)[:16]
                for d, tgt in enumerate(spec.dsls):
                    for k, kind in enumerate(ARM_KINDS):
                        aid = ids[(model, p, tgt, r, kind)]
                        src = _source_dsl(spec, kind, d)
                        if kind in ("transfer", "wrong"):
                            sp = p if kind == "transfer" else sim.wrong_of[p]
                            skill_src = ids[(model, sp, src, r, "solo")]
                        elif kind == "same":
                            skill_src = ids[(model, p, tgt, (r + 1) % R, "solo")]
                        else:
                            skill_src = None
                        sink.emit("attempt_started", aid, experiment=spec.experiment, model=model, problem=p,
                                  problem_name=f"{p:02d}_synthetic_{fam}", family=fam,
                                  problem_hash=_sha("problem", p, tgt, spec.problem_hash_salt), target_dsl=tgt,
                                  source_dsl=src, arm_kind=kind, replicate=r, gpu="NVIDIA H200",
                                  budget_submissions=10, budget_turns=60, budget_output_tokens=200_000,
                                  budget_wall_s=3600.0, grader_version=spec.grader_version,
                                  dsl_version=spec.dsl_versions.get(tgt, "0"), doc_pack_version=spec.doc_pack_version,
                                  skill_sha256=_sha("skill", skill_src) if skill_src else (_sha("placebo", p) if kind == "placebo" else None),
                                  skill_source_attempt=skill_src, skill_empty=False if kind != "solo" else None,
                                  wrong_source_problem=sim.wrong_of[p] if kind == "wrong" else None,
                                  plan_sha256=_sha("plan", spec.seed))
                        u = rng.random(3)
                        if u[0] < spec.p_unfinished:
                            unfinished.append(aid)
                            continue
                        zval = sim.z[m, pi_, d, r, k]
                        s_val = float(s_all[m, pi_, d, r, k])
                        passed = bool(zval > 0)
                        has_kernel = passed or u[1] >= spec.p_no_kernel
                        sha = _sha("kernel", aid) if has_kernel else None
                        flagged = int(_sha("flag", aid)[:8], 16) / 2**32 < spec.p_skill_flagged
                        sink.emit("skill", aid, text=f"# SKILL.md of {aid}\nsynthetic notes.", sha256=_sha("skill", aid),
                                  token_length=int(400 + 100 * u[2]), tokenizer="synthetic",
                                  hygiene_flags=["code_block"] if flagged else [],
                                  source_attempt=aid)
                        if u[1] < spec.p_infra and not passed:
                            infra.append(aid)
                            sink.emit("attempt_finished", aid, status="infra_error", submissions_used=1, turns_used=3,
                                      error="synthetic: model API unavailable")
                            continue
                        status = "finished" if has_kernel or u[2] >= spec.p_budget_exhausted else "budget_exhausted"
                        tokens = int(20_000 + 60_000 * u[2])
                        sink.emit("attempt_finished", aid, status=status, submissions_used=int(1 + 9 * u[2]),
                                  turns_used=int(5 + 50 * u[2]), input_tokens=tokens * 4, output_tokens=tokens,
                                  cost_usd=round(tokens * 1.5e-5, 6), wall_s=float(600 + 2400 * u[2]),
                                  final_kernel_sha256=sha)
                        speed = math.exp(zval - 1.0) if passed else None
                        jitter = math.exp(rng.normal(0, 0.03)) if passed else 1.0
                        for scope in ("attempt", "pair"):
                            if scope == "pair" and not pair_regrade:
                                continue
                            sp_ = speed * jitter if (speed is not None and scope == "attempt") else speed
                            rat = [passed and sp_ is not None and sp_ >= t for t in THRESHOLDS] if has_kernel else [False] * 5
                            up = {}
                            if spec.upstream_factor is not None:
                                sp_up = sp_ * spec.upstream_factor if sp_ is not None else None
                                up = {"reference_median_us": 100.0 * spec.upstream_factor if passed else None,
                                      "speedup_upstream": sp_up, "s_upstream": s_upstream(passed and has_kernel, sp_up)}
                            sink.emit("verdict", aid, evaluation_id=_sha("eval", aid, scope)[:16], scope=scope, problem=p,
                                      dsl=tgt, kernel_sha256=sha, passed=passed,
                                      reason=None if passed else ("no_kernel" if not has_kernel else "wrong_output"),
                                      speedup=sp_, eager_median_us=100.0 if passed else None,
                                      candidate_median_us=100.0 / sp_ if sp_ else None,
                                      r_at_0=rat[0], r_at_0_5=rat[1], r_at_1=rat[2], r_at_2=rat[3], r_at_4=rat[4],
                                      s=20.0 * sum(rat) if scope == "attempt" else s_val, gpu="NVIDIA H200",
                                      pair_id=pair_id if scope == "pair" else None, **up)
    if spec.characterise:
        for p in sim.problems:
            # a memory-bound problem whose speed of light on the H200 is rho x the eager time (100 us in the verdicts)
            sol = 100.0 * sol_ratio_of(spec, p)
            sink.emit("characterisation", None, problem=p, problem_name=f"{p:02d}_synthetic_{family_of(p)}", family=family_of(p),
                      problem_hash=_sha("problem", p, "char", spec.problem_hash_salt), size="full", gpu="NVIDIA H200",
                      ok=True, eager_median_us=100.0, flops=0.0, bytes=sol * 1e-6 * 4.8e12, peak="memory", sol_us=sol,
                      sol_ratio=sol / 100.0, within_band=True)
    order = rng.permutation(len(ids))
    keys = list(ids)
    for i in order[: spec.n_annotated]:
        aid = ids[keys[i]]
        if aid in unfinished:
            continue
        annotated.append(aid)
        sink.emit("annotation", None, target_attempt_id=aid, label="reward_hack", reason="synthetic audit finding",
                  annotator="synthetic")
    sink.close()
    return SynthResult(store, sim, sink.n, sink.files, {k: v for k, v in ids.items()}, infra, unfinished, annotated)
