"""Plan construction: config validation, the cross-family derangement, coordinates and dependencies, the plan event."""

from __future__ import annotations

import json
import random

import pytest

from mkb.events import EventWriter, read
from mkb.experiment import ConfigError, build_plan, cross_family_derangement, load_config, parse_config
from mkb.experiment._fake import demo_config
from mkb.experiment._problems import all_problems


def _cfg(**exp):
    models = exp.pop("models", [{"name": "openai/x"}])
    return parse_config({"experiment": {"name": "t", "problems": [28, 72], "replicates": 2, **exp}, "models": models})


def test_counts_and_sources():
    plan = build_plan(demo_config())
    cs = plan.coordinates
    assert len(cs) == 40  # 2 problems x 2 replicates x 2 DSLs x (solo + transfer + placebo + same + wrong)
    assert [c.arm_kind for c in cs[:8]] == ["solo"] * 8 and all(c.arm_kind != "solo" for c in cs[8:])
    assert len({c.key for c in cs}) == 40
    by = {(c.problem, c.target_dsl, c.arm_kind, c.replicate): c for c in cs}
    t = by[(28, "cute", "transfer", 0)]
    assert plan.sources(t) == (plan.solo("scripted/fake", 28, "tirx", 0),)
    assert plan.sources(by[(28, "cute", "placebo", 0)]) == plan.sources(t)  # placebo length matches the transfer skill
    assert plan.sources(by[(28, "cute", "same", 1)]) == (plan.solo("scripted/fake", 28, "cute", 0),)  # (r+1) mod R
    w = by[(28, "tirx", "wrong", 1)]
    assert w.source_problem == plan.derangement[28] == 72 and plan.sources(w) == (plan.solo("scripted/fake", 72, "cute", 1),)
    assert all(c.problem_hash == all_problems()[c.problem].hash for c in cs)


def test_block_order_is_seeded_and_stable():
    a, b = build_plan(demo_config()), build_plan(demo_config())
    assert a.blocks == b.blocks and a.sha256 == b.sha256
    orders = {tuple(c.arm_kind for c in arms) for arms in a.blocks.values()}
    assert len(orders) > 1  # not one fixed arm order for every block
    c = build_plan(demo_config(seed=7))
    assert c.blocks != a.blocks and c.sha256 != a.sha256
    assert all(set(x.key for x in a.blocks[k]) == set(x.key for x in c.blocks[k]) for k in a.blocks)


def test_closure_of_a_solo_is_every_arm_that_consumed_its_skill():
    plan = build_plan(demo_config())
    s = plan.solo("scripted/fake", 28, "cute", 1)
    got = {(c.problem, c.target_dsl, c.arm_kind, c.replicate) for c in plan.closure([s.key])}
    assert got == {(28, "cute", "solo", 1), (28, "tirx", "transfer", 1), (28, "tirx", "placebo", 1),
                   (28, "cute", "same", 0), (72, "tirx", "wrong", 1)}
    arm = next(c for c in plan.coordinates if c.arm_kind == "transfer")
    assert plan.closure([arm.key]) == (arm,)


def test_derangement_full_catalog():
    fam = {p: r.family for p, r in all_problems().items()}
    for seed in range(5):
        pi = cross_family_derangement(fam, seed)
        assert sorted(pi) == sorted(pi.values()) == sorted(fam)
        assert all(fam[pi[p]] != fam[p] for p in fam)
    assert cross_family_derangement(fam, 1) == cross_family_derangement(fam, 1)
    assert cross_family_derangement(fam, 1) != cross_family_derangement(fam, 2)


def test_derangement_random_family_mixes():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(2, 20)
        fam = {p: rng.choice("abcd") for p in range(n)}
        big = max(list(fam.values()).count(f) for f in set(fam.values()))
        if 2 * big > n:
            with pytest.raises(ConfigError, match="cross-family derangement"):
                cross_family_derangement(fam, 0)
        else:
            pi = cross_family_derangement(fam, rng.randint(0, 99))
            assert sorted(pi.values()) == sorted(fam) and all(fam[pi[p]] != fam[p] for p in fam)


def test_wrong_arm_needs_two_families():
    with pytest.raises(ConfigError, match="family mlp_norm"):
        build_plan(_cfg(problems=[28, 29]))
    build_plan(_cfg(problems=[28, 29], arms=["solo", "transfer", "placebo", "same"]))


@pytest.mark.parametrize("exp, models, msg", [
    ({}, [{"name": "m", "temperature": 0.0}], "temperature 0.0 with 2 replicates"),
    ({}, [{"name": "m", "api_key": "sk-123"}], "api_key must not be written"),
    ({"arms": ["solo", "same"], "replicates": 1}, [{"name": "m", "temperature": 0.0}], "needs replicates >= 2"),
    ({"arms": ["transfer"]}, [{"name": "m"}], "must include solo"),
    ({"problems": [28, 999]}, [{"name": "m"}], "no problem numbered 999"),
    ({"colour": 1}, [{"name": "m"}], "unknown key"),
    ({}, [{"name": "m", "concurrency": 0}], "concurrency must be >= 1"),
    ({}, [{"name": "m"}, {"name": "m"}], "listed twice"),
    ({"arms": ["solo", "bogus"]}, [{"name": "m"}], "unknown arm"),
    ({}, [], "at least one"),
])
def test_config_errors_name_the_field(exp, models, msg):
    with pytest.raises(ConfigError, match=msg):
        _cfg(models=models, **exp)


def test_temperature_zero_is_fine_with_one_replicate():
    _cfg(models=[{"name": "m", "temperature": 0.0}], replicates=1, arms=["solo", "transfer"])


def test_load_config_file(tmp_path):
    p = tmp_path / "exp.toml"
    p.write_text('[experiment]\nname = "x"\nproblems = [28, 72]\nreplicates = 2\n\n[budget]\nsubmissions = 5\n\n'
                 '[[models]]\nname = "openai/gpt-5"\napi_key_env = "OPENAI_API_KEY"\nconcurrency = 2\nusd_cap = 10.0\n')
    cfg = load_config(p)
    assert cfg.budget.submissions == 5 and cfg.models[0].usd_cap == 10.0 and cfg.models[0].config.api_key_env == "OPENAI_API_KEY"
    p.write_text("[experiment\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(p)
    with pytest.raises(ConfigError, match="no such config"):
        load_config(tmp_path / "nope.toml")


def test_plan_event_round_trips(tmp_path):
    plan = build_plan(demo_config())
    with EventWriter(str(tmp_path / "s")) as w:
        w.emit("plan", **plan.event())
    df = read("plan", str(tmp_path / "s"))
    assert df["plan_sha256"].to_list() == [plan.sha256]
    assert df["coordinates"].to_list()[0] == [c.key for c in plan.coordinates]
    assert df["derangement"].to_list()[0] == '{"28": 72, "72": 28}'
    assert "01_short.md" in json.loads(df["placebo_notes"][0])


def test_operational_settings_are_not_the_plan():
    from dataclasses import replace

    a = demo_config()
    b = replace(a, models=(replace(a.models[0], usd_cap=5.0, concurrency=9, rpm=10),), max_infra_retries=7)
    assert build_plan(a).sha256 == build_plan(b).sha256
    c = replace(a, budget=replace(a.budget, submissions=4))
    assert build_plan(c).sha256 != build_plan(a).sha256


def test_score_is_recorded_and_a_default_keeps_the_plan_hash(tmp_path):
    """`score` names what the analysis reports; a config that does not set it hashes as before the setting existed."""
    from dataclasses import replace

    plain = _cfg()
    assert plain.score == "s" and "score" not in plain.identity()
    assert _cfg(score="s").sha256() == plain.sha256() and build_plan(_cfg(score="s")).sha256 == build_plan(plain).sha256
    up = _cfg(score="s_upstream")
    assert up.identity()["score"] == "s_upstream" and build_plan(up).sha256 != build_plan(plain).sha256
    with pytest.raises(ConfigError, match="score must be s .* or s_upstream"):
        _cfg(score="S")
    ev = build_plan(up).event()
    assert ev["score"] == "s_upstream" and json.loads(ev["config"])["score"] == "s_upstream"
    with EventWriter(str(tmp_path / "s")) as w:
        w.emit("plan", **ev)
    assert read("plan", str(tmp_path / "s"))["score"].to_list() == ["s_upstream"]
    # a plan event written before the setting existed rebuilds (replay) with the default, under the same hash
    from mkb.experiment._config import config_from_dict

    old = json.loads(build_plan(plain).event()["config"])
    old.pop("score")
    assert config_from_dict(old).score == "s" and build_plan(config_from_dict(old)).sha256 == build_plan(plain).sha256
    assert replace(plain, score="s_upstream").sha256() == up.sha256()
