"""Upstream compatibility: the preset's problem set and rules, and the importer of upstream's results.json."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from mkb.events import read
from mkb.experiment import build_plan, load_config
from mkb.experiment._upstream import UPSTREAM_SHIPPED, UpstreamFormatError, import_results

ROOT = Path(__file__).resolve().parents[2]


def test_preset():
    cfg = load_config(ROOT / "configs" / "upstream-compatible.toml")
    assert cfg.problems == UPSTREAM_SHIPPED and len(UPSTREAM_SHIPPED) == 32
    assert cfg.replicates == 1 and cfg.arms == ("solo", "transfer") and cfg.header == "upstream" and cfg.missing_skill == "skip"
    assert cfg.budget.wall_clock_s == 2400.0 and cfg.budget.submissions == 10
    assert cfg.score == "s_upstream"  # scored as upstream scores: over the problem's reference
    plan = build_plan(cfg)
    assert len(plan.coordinates) == 32 * 2 * 2


def _record(passed, speedup, **kw):
    return {"rewards": {"passed": 1.0 if passed else 0.0, "speedup_vs_eager": speedup}, "timed_out": False, "error": None,
            "skipped": None, "usage": {"n_input_tokens": 1000, "n_cache_tokens": 0, "n_output_tokens": 200, "cost_usd": 0.5,
                                       "agent_sec": 300.0}, **kw}


def _results():
    """Shaped as upstream's metakernelbench/results.py writes it (cells x replicates of source/base/skill records)."""
    cells = []
    for prob, cat in (("28_fused_add_rmsnorm_h4096_llama31_8b_bf16", "mlp_norm"), ("72_gdn_decode_qwen3next_bf16", "linear_attention")):
        solo = {"cutedsl": _record(True, 1.5), "tirx": _record(False, None)}
        for src, tgt in (("cutedsl", "tirx"), ("tirx", "cutedsl")):
            skill = _record(True, 2.5) if src == "cutedsl" else _record(False, None, skipped="source wrote no SKILL.md")
            if prob.startswith("72") and src == "cutedsl":
                skill = _record(False, None, error="RuntimeError: harbor trial crashed")
            cells.append({"cell": {"problem": prob, "category": cat, "direction": f"{src}2{tgt}", "source_task": f"{prob}_{src}",
                                   "target_task": f"{prob}_{tgt}"},
                          "replicates": [{"resolved": True, "n_replicate": 1, "source": solo[src], "base": solo[tgt], "skill": skill}]})
    return {"legend": {}, "model": "openai/glm-5.3", "harbor_version": "0.1", "overall": {}, "cells": cells}


def test_import_results(tmp_path):
    p = tmp_path / "results.json"
    p.write_text(json.dumps(_results()))
    store = str(tmp_path / "s")
    rep = import_results(p, store)
    # per problem: 2 solos + 1 transfer imported (the other was skipped upstream); 72's transfer errored
    assert rep.attempts == 6 and rep.skipped_skill == 2 and rep.errors == 1 and rep.verdicts == 5
    a = read("attempt_started", store)
    assert sorted(a["arm_kind"].to_list()) == ["solo"] * 4 + ["transfer"] * 2
    assert set(a["gpu"]) == {"NVIDIA B200"} and set(a["replicate"]) == {0}
    from mkb.analysis import load_tables

    t = load_tables(store)
    pairs = t.pairs.filter(t.pairs["arm_kind"] == "transfer")
    # problem 28 cute->tirx: transfer passed at 2.5x (S=80: R@0..R@2) over a failed tirx solo (S=0)
    assert pairs.height == 1 and pairs["lift"].to_list() == [80.0]
    # upstream's speedup is over its reference: the same figures read as S_upstream
    up = load_tables(store, score="s_upstream").pairs.filter(pl.col("arm_kind") == "transfer")
    assert up["lift"].to_list() == [80.0] and up["speedup"].to_list() == [2.5]
    # importing again adds nothing new to the analysis: attempt ids are derived from the coordinates
    import_results(p, store)
    assert read("attempt_started", store)["attempt_id"].n_unique() == 6


@pytest.mark.parametrize("body, msg", [("{", "not JSON"), ("[]", "not an upstream results.json"),
                                       ('{"model": "m", "cells": [{"cell": {}}]}', "missing or malformed")])
def test_bad_results_named(tmp_path, body, msg):
    p = tmp_path / "results.json"
    p.write_text(body)
    with pytest.raises(UpstreamFormatError, match=msg):
        import_results(p, str(tmp_path / "s"))


def test_the_presets_problem_list_is_the_problems_own_upstream_records():
    """The preset keeps its list torch-free; the problems' `META.upstream.source` is the authority it must equal."""
    from mkb.experiment._upstream import UPSTREAM_SHIPPED
    from mkb.problems import problems

    shipped = tuple(p.meta.number for p in problems() if p.meta.upstream and p.meta.upstream.source == "shipped")
    assert shipped == tuple(UPSTREAM_SHIPPED)
