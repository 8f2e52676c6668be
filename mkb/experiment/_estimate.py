"""Estimates what a plan costs before it runs (attempts, gradings, GPU-hours, tokens, USD, wall clock), saying how."""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from mkb.experiment._plan import Plan


@dataclass(frozen=True)
class Estimate:
    """One figure, its upper bound where the budget gives one, and the sentence saying how it was made."""

    name: str
    value: float
    bound: float | None
    how: str


@cache
def _litellm_prices() -> dict:
    # litellm's bundled price map, read as a file: importing litellm fetches a fresh map over the network
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(spec.submodule_search_locations[0]) / "model_prices_and_context_window_backup.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def model_prices(name: str, price_in: float | None, price_out: float | None) -> tuple[float | None, float | None, str]:
    """USD per million (input, output) tokens and where they came from."""
    if price_in is not None and price_out is not None:
        return price_in, price_out, "config price"
    table = _litellm_prices()
    for key in (name, name.split("/", 1)[-1]):
        row = table.get(key)
        if row and row.get("input_cost_per_token") is not None and row.get("output_cost_per_token") is not None:
            return row["input_cost_per_token"] * 1e6, row["output_cost_per_token"] * 1e6, f"litellm's bundled price map ({key})"
    return None, None, "no price (set price_in_per_mtok / price_out_per_mtok in the config)"


def estimate(plan: Plan) -> list[Estimate]:
    """The dry-run figures. Every assumption comes from the config's [assumptions] table and is printed."""
    cfg, a, b = plan.config, plan.config.assumptions, plan.config.budget
    n = len(plan.coordinates)
    blocks = {(c.model, c.problem, c.replicate) for c in plan.coordinates}
    subs, subs_bound = n * b.submissions * a.submissions_share, n * b.submissions
    pair = n + len(blocks)  # every final kernel once, plus one eager timing per (model, problem, replicate) batch
    out: list[Estimate] = [
        Estimate("attempts", n, None, f"{len(cfg.models)} model(s) x {len(plan.problems)} problem(s) x {cfg.replicates} replicate(s) "
                                      f"x {len(cfg.dsls)} DSL(s) x arms {', '.join(cfg.arms)} (one per source DSL)"),
        Estimate("gradings", subs + pair, subs_bound + pair,
                 f"submissions: attempts x {b.submissions} budget x {a.submissions_share:.0%} used (assumption); "
                 f"pair re-grade: one per final kernel + one eager timing per (model, problem, replicate)"),
    ]
    out.append(Estimate("GPU-hours", (subs + pair) * a.grading_s / 3600, (subs_bound + pair) * a.grading_s / 3600,
                        f"gradings x {a.grading_s:g} s per grading (assumption: grader overhead ~1.1 s measured on the H200 "
                        "+ compile, correctness and timing of eager and candidate)"))
    out_tok = n * b.output_tokens * a.output_tokens_share
    out.append(Estimate("output tokens", out_tok, n * b.output_tokens,
                        f"attempts x {b.output_tokens:,} budget x {a.output_tokens_share:.0%} used (assumption); reasoning tokens count"))
    out.append(Estimate("input tokens", out_tok * a.input_tokens_per_output_token, None,
                        f"output tokens x {a.input_tokens_per_output_token:g} (assumption: each turn re-sends the conversation)"))
    total, total_bound, hows, known = 0.0, 0.0, [], True
    for m in cfg.models:
        nm = sum(1 for c in plan.coordinates if c.model == m.name)
        pin, pout, how = model_prices(m.name, m.price_in_per_mtok, m.price_out_per_mtok)
        if pin is None:
            known = False
            hows.append(f"{m.name}: {how}")
            continue
        o = nm * b.output_tokens * a.output_tokens_share
        total += (o * a.input_tokens_per_output_token * pin + o * pout) / 1e6
        ob = nm * b.output_tokens
        total_bound += (ob * a.input_tokens_per_output_token * pin + ob * pout) / 1e6
        cap = f", cap ${m.usd_cap:,.0f}" if m.usd_cap is not None else ""
        hows.append(f"{m.name}: ${pin:g}/${pout:g} per Mtok in/out from {how}{cap}")
    out.append(Estimate("cost USD" if known else "cost USD (priced models only)", total, total_bound, "; ".join(hows)))
    waves = 0.0
    for m in cfg.models:
        ns = sum(1 for c in plan.coordinates if c.model == m.name and c.arm_kind == "solo")
        na = sum(1 for c in plan.coordinates if c.model == m.name and c.arm_kind != "solo")
        waves = max(waves, (math.ceil(ns / m.concurrency) + math.ceil(na / m.concurrency)) * a.attempt_wall_s)
    out.append(Estimate("wall-clock hours", waves / 3600, None,
                        f"per model: ceil(solos / concurrency) + ceil(skill arms / concurrency) waves x {a.attempt_wall_s:g} s "
                        "per attempt (assumption); models run side by side; grading assumed not to be the bottleneck"))
    return out
