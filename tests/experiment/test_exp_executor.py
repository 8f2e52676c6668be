"""The local executor with the model-free runner: order of release, skill slots, resume, retries, exclusion, caps, reruns."""

from __future__ import annotations

import polars as pl
import pytest

from mkb.events import read
from mkb.experiment import build_plan, choose_placebo, count_tokens
from mkb.experiment._executor import Executor
from mkb.experiment._fake import FakeGrader, FakeRunner, demo_config
from mkb.experiment._state import read_state


def _run(store, cfg=None, runner=None, **kw):
    plan = build_plan(cfg or demo_config())
    runner = runner or FakeRunner()
    logs: list[str] = []
    ex = Executor(plan, store=store, runner=runner, versions=kw.pop("versions", {"v": 1}), poll_s=0.05, ttl_s=5.0,
                  sleep=lambda s: None, log=logs.append, **kw)
    if kw.get("pair_regrade", True):
        ex.grader = FakeGrader(ex.writer)
    rep = ex.run()
    return plan, ex, rep, runner, logs


def _starts(store):
    s = read("attempt_started", store).sort("ts", "seq")
    return s


def _one_scored_each(plan, store):
    st = read_state(store, plan.config.name)
    for c in plan.coordinates:
        cs = st.coord(c.key)
        fin = [a for a in cs.attempts if a.status in ("finished", "budget_exhausted") and not a.superseded]
        assert len(fin) == 1 and cs.scored is fin[0], c.label
    return st


def test_full_run_order_slots_and_events(tmp_path):
    store = str(tmp_path / "s")
    plan, ex, rep, runner, _ = _run(store)
    assert rep.complete and rep.done == 40 and rep.ran == 40 and not rep.excluded
    st = _one_scored_each(plan, store)
    starts = _starts(store)
    arms = starts["arm_kind"].to_list()
    # solos first: all 8 solos start before any skill arm
    assert arms[:8] == ["solo"] * 8 and "solo" not in arms[8:]
    # each block's arms are released together in the plan's seeded order, and start together (adjacent starts)
    order = [(r["model"], r["problem"], r["replicate"], r["target_dsl"], r["arm_kind"], r["source_dsl"])
             for r in starts.iter_rows(named=True) if r["arm_kind"] != "solo"]
    for block, cs in plan.blocks.items():
        idx = [ex.launched.index(c.key) for c in cs]
        assert idx == list(range(idx[0], idx[0] + len(cs))), block
        idx = sorted(order.index((*block, c.arm_kind, c.source_dsl)) for c in cs)
        assert idx == list(range(idx[0], idx[0] + len(cs))), block
    # skill slots: transfer and wrong carry their source solo's skill; same takes replicate (r+1) mod R; placebo matches length
    by_id = {r["attempt_id"]: r for r in starts.iter_rows(named=True)}
    skills = {r["attempt_id"]: r for r in read("skill", store).iter_rows(named=True)}
    solo_id = {(r["problem"], r["target_dsl"], r["replicate"]): r["attempt_id"] for r in by_id.values() if r["arm_kind"] == "solo"}
    for r in by_id.values():
        k = r["arm_kind"]
        if k in ("transfer", "wrong", "same"):
            p = r["wrong_source_problem"] if k == "wrong" else r["problem"]
            rep_ = (r["replicate"] + 1) % 2 if k == "same" else r["replicate"]
            src = solo_id[(p, r["source_dsl"], rep_)]
            assert r["skill_source_attempt"] == src and r["skill_sha256"] == skills[src]["sha256"]
        if k == "placebo":
            src = solo_id[(r["problem"], r["source_dsl"], r["replicate"])]
            want = count_tokens(skills[src]["text"])
            assert r["skill_sha256"] == choose_placebo(want).sha256 and r["skill_source_attempt"] is None
    assert {r["wrong_source_problem"] for r in by_id.values() if r["arm_kind"] == "wrong"} == {28, 72}
    # the pair re-grade: every final kernel of every (model, problem, replicate), one batch each
    v = read("verdict", store).filter(pl.col("scope") == "pair")
    assert v.height == 40 and rep.pair_batches == 4 and len(ex.grader.batches) == 4
    assert all(len(b) == 10 for b in ex.grader.batches)
    assert read("plan", store).height == 1


def test_resume_skips_finished(tmp_path):
    store = str(tmp_path / "s")
    _run(store)
    plan, _, rep, runner, _ = _run(store)
    assert rep.complete and rep.ran == 0 and runner.log == [] and rep.pair_batches == 0
    assert read("attempt_started", store).height == 40 and read("plan", store).height == 1


def test_changed_config_is_refused(tmp_path):
    from mkb.experiment._executor import PlanMismatch

    store = str(tmp_path / "s")
    _run(store)
    with pytest.raises(PlanMismatch, match="a changed config is a new experiment"):
        _run(store, demo_config(seed=3))


def test_empty_source_gives_flagged_empty_slot(tmp_path):
    store = str(tmp_path / "s")
    runner = FakeRunner(no_skill=lambda s: s.arm_kind == "solo" and s.problem == 28 and s.target_dsl == "tirx")
    _run(store, runner=runner)
    s = read("attempt_started", store).filter((pl.col("problem") == 28) & (pl.col("target_dsl") == "cute")
                                              & pl.col("arm_kind").is_in(["transfer", "placebo"]))
    assert s.height == 4 and s["skill_empty"].to_list() == [True] * 4
    # the upstream convention instead leaves every arm that needs that skill out (excluded, lift 0 in upstream's analysis):
    # transfer and placebo of 28 cute, same of 28 tirx, wrong of 72 cute (pi(72) = 28), each at both replicates
    store2 = str(tmp_path / "s2")
    _, _, rep, _, _ = _run(store2, demo_config(missing_skill="skip"), runner=FakeRunner(no_skill=runner.no_skill))
    assert rep.excluded_by_arm == {"transfer": 2, "placebo": 2, "same": 2, "wrong": 2} and rep.done == 32


def test_infra_error_retried_then_succeeds(tmp_path):
    store = str(tmp_path / "s")
    runner = FakeRunner(infra=lambda s, n: s.arm_kind == "solo" and s.problem == 28 and n < 2)
    _, _, rep, _, logs = _run(store, demo_config(infra_backoff_s=0.0), runner=runner)
    assert rep.complete and not rep.excluded and rep.ran == 40 + 4 * 2
    assert sum("infra_error (" in m for m in logs) == 8


def test_persistent_infra_error_excludes_the_block(tmp_path):
    store = str(tmp_path / "s")
    runner = FakeRunner(infra=lambda s, n: s.arm_kind == "transfer" and s.problem == 72 and s.target_dsl == "cute" and s.replicate == 0)
    plan, _, rep, _, logs = _run(store, demo_config(infra_backoff_s=0.0, max_infra_retries=2), runner=runner)
    assert rep.excluded_by_arm == {"transfer": 1} and rep.blocks_excluded == 1 and rep.done == 39
    assert any("excluded (infra_error after 3 tries)" in m for m in logs)
    ann = read("annotation", store)
    # the block's other three arms are annotated excluded; nothing is deleted
    starts = read("attempt_started", store).filter((pl.col("problem") == 72) & (pl.col("target_dsl") == "cute")
                                                   & (pl.col("replicate") == 0) & (pl.col("arm_kind") != "solo")
                                                   & (pl.col("arm_kind") != "transfer"))
    assert set(ann["target_attempt_id"]) == set(starts["attempt_id"]) and starts.height == 3
    assert "excluded per arm: transfer 1 (1 block(s))" in "\n".join(rep.lines())


def test_usd_cap_pauses_with_a_message(tmp_path):
    store = str(tmp_path / "s")
    cfg = demo_config()
    from dataclasses import replace
    cfg = replace(cfg, models=(replace(cfg.models[0], usd_cap=0.05, concurrency=1),))
    _, _, rep, runner, logs = _run(store, cfg, runner=FakeRunner(cost_usd=0.01))
    assert rep.ran == 5 and not rep.complete and rep.waiting == 35
    assert "scripted/fake paused: spent $0.05 of its $0.05 cap; 35 attempt(s) wait" in rep.paused["scripted/fake"]
    assert "hint: raise usd_cap" in rep.paused["scripted/fake"]


def test_rerun_of_a_solo_reruns_its_closure(tmp_path):
    store = str(tmp_path / "s")
    plan, _, _, _, _ = _run(store)
    solo = plan.solo("scripted/fake", 28, "cute", 1)
    runner = FakeRunner()
    ex = Executor(plan, store=store, runner=runner, versions={"v": 1}, poll_s=0.05, sleep=lambda s: None, pair_regrade=False)
    rep = ex.run(rerun=[solo])
    ran = sorted(l for _, _, l in runner.log)
    assert ran == sorted(["28|cute|solo|None|1", "28|tirx|transfer|cute|1", "28|tirx|placebo|cute|1",
                          "28|cute|same|cute|0", "72|tirx|wrong|cute|1"])
    assert rep.complete and rep.superseded == 5
    st = _one_scored_each(plan, store)
    # the re-run arms took the new solo's skill
    new_solo = st.coord(solo.key).scored.attempt_id
    tr = read("attempt_started", store).filter(pl.col("skill_source_attempt") == new_solo)
    assert tr.height == 3  # transfer, same, wrong
    assert read("annotation", store).height == 5
    # a resume after the rerun runs nothing
    r2 = FakeRunner()
    Executor(plan, store=store, runner=r2, versions={"v": 1}, poll_s=0.05, sleep=lambda s: None, pair_regrade=False).run()
    assert r2.log == []


def test_rerun_stale_acts_on_versions(tmp_path):
    store = str(tmp_path / "s")
    plan, _, _, _, _ = _run(store, demo_config(arms=("solo", "transfer")))
    r = FakeRunner()
    rep = Executor(plan, store=store, runner=r, versions={"v": 2}, poll_s=0.05, sleep=lambda s: None,
                   pair_regrade=False).run(rerun_stale=True)
    assert len(r.log) == 16 and rep.superseded == 16 and rep.complete
    r2 = FakeRunner()
    Executor(plan, store=store, runner=r2, versions={"v": 2}, poll_s=0.05, sleep=lambda s: None, pair_regrade=False).run(rerun_stale=True)
    assert r2.log == []


def test_subset_runs_only_its_closure(tmp_path):
    store = str(tmp_path / "s")
    plan = build_plan(demo_config())
    r = FakeRunner()
    only = plan.select(problems=[28], dsls=["cute"], arms=["solo"], replicates=[0])
    rep = Executor(plan, store=store, runner=r, versions={"v": 1}, poll_s=0.05, sleep=lambda s: None,
                   pair_regrade=False).run(only=only)
    # the solo, the arms that consume its skill, and the solos those arms also need (none here)
    assert rep.total == len(plan.closure([only[0].key])) == 5 and rep.complete
    assert "28|cute|solo|None|0" in {l for _, _, l in r.log} and len(r.log) == 5
    # a transfer arm alone brings the solo it needs
    r2 = FakeRunner()
    t = plan.select(problems=[72], dsls=["cute"], arms=["transfer"], replicates=[1])
    rep = Executor(plan, store=str(tmp_path / "s2"), runner=r2, versions={"v": 1}, poll_s=0.05, sleep=lambda s: None,
                   pair_regrade=False).run(only=t)
    assert rep.complete and sorted(l for _, _, l in r2.log) == ["72|cute|transfer|tirx|1", "72|tirx|solo|None|1"]


def test_regrade_under_a_newer_grader_adds_a_set(tmp_path):
    store = str(tmp_path / "s")
    plan, ex, rep, _, _ = _run(store, demo_config(arms=("solo", "transfer")))
    assert rep.pair_batches == 4
    ex2 = Executor(plan, store=store, runner=FakeRunner(), versions={"v": 1}, sleep=lambda s: None)
    ex2.grader = FakeGrader(ex2.writer, version="fake-2")
    assert ex2.regrade_pairs(read_state(store, plan.config.name), fresh_grader=True) == 4
    ex2.writer.flush()
    v = read("verdict", store).filter(pl.col("scope") == "pair")
    assert v.height == 32 and read("attempt_started", store).height == 16  # attempts untouched
    assert ex2.regrade_pairs(read_state(store, plan.config.name), fresh_grader=True) == 0
    assert ex2.regrade_pairs(read_state(store, plan.config.name)) == 0


def test_progress_reports(tmp_path):
    seen = []
    plan = build_plan(demo_config(arms=("solo", "transfer")))
    Executor(plan, store=str(tmp_path / "s"), runner=FakeRunner(), versions={"v": 1}, poll_s=0.05, sleep=lambda s: None,
             pair_regrade=False, progress=seen.append).run()
    assert seen[0].total == 16 and seen[0].done == 0
    assert max(p.done for p in seen) >= 8 and all(p.done + p.running + p.waiting + p.excluded == 16 for p in seen)
    assert seen[0].line().startswith("0/16 done") and "output tokens" in seen[-1].line()


def test_concurrency_limit_holds_with_blocks_larger_than_it(tmp_path):
    from dataclasses import replace

    cfg = demo_config()
    cfg = replace(cfg, models=(replace(cfg.models[0], concurrency=2),))
    runner = FakeRunner(sleep_s=0.05)
    plan, ex, rep, _, _ = _run(str(tmp_path / "s"), cfg, runner=runner, pair_regrade=False)
    assert rep.complete and runner.max_active == 2
    # each block's arms still start in the plan's seeded order
    for block, cs in plan.blocks.items():
        idx = [ex.launched.index(c.key) for c in cs]
        assert idx == sorted(idx)


def test_killed_attempt_is_abandoned_with_its_spend(tmp_path):
    """An attempt claimed by an executor that died: kept as attempt_abandoned, its turns' cost counted against the cap."""
    from dataclasses import replace

    from mkb.events import EventWriter

    store = str(tmp_path / "s")
    cfg = demo_config(arms=("solo", "transfer"))
    cfg = replace(cfg, models=(replace(cfg.models[0], usd_cap=100.0),))
    plan = build_plan(cfg)
    c = plan.coordinates[0]
    dead = Executor(plan, store=store, runner=FakeRunner(), versions={"v": 1})
    dead.publish_plan()
    with EventWriter(store) as w:  # what a killed executor left: its claim and two turns, no attempt_finished
        w.emit("claim", attempt_id="dead-1", **dead._claim_row(c, "claimed", token=1, try_index=0, versions='{"v": 1}'))
        for t in (1, 2):
            w.emit("turn", attempt_id="dead-1", turn=t, phase="main", model=c.model, prefix_sha256="p", request_messages="[]",
                   n_tool_calls=0, max_tokens=100, latency_s=1.0, retries=0, backoff_s=0.0, cost_usd=1.25, completion_tokens=40)
    _, _, rep, runner, _ = _run(store, cfg, pair_regrade=False)
    ab = read("attempt_abandoned", store)
    assert ab.height == 1 and ab["attempt_id"][0] == "dead-1" and ab["cost_usd"][0] == 2.5 and ab["output_tokens"][0] == 80
    assert ab["reason"][0] == "lease_expired" and rep.abandoned == 1 and rep.complete
    assert rep.cost_by_model[c.model] == pytest.approx(2.5 + 16 * 0.01)


def test_a_failing_claim_step_is_retried(tmp_path, monkeypatch):
    plan = build_plan(demo_config(arms=("solo", "transfer")))
    ex = Executor(plan, store=str(tmp_path / "s"), runner=FakeRunner(), versions={"v": 1}, poll_s=0.01, sleep=lambda s: None,
                  pair_regrade=False, log=(logs := []).append)
    real, calls = ex.run_coordinate, {"n": 0}

    def flaky(c):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("store briefly unreachable")
        return real(c)

    monkeypatch.setattr(ex, "run_coordinate", flaky)
    rep = ex.run()
    assert rep.complete and any("store briefly unreachable; trying again" in m for m in logs)


def test_a_models_rpm_and_tpm_pace_its_attempts_in_this_process(tmp_path):
    from dataclasses import replace

    from mkb.agent._pace import limiter_for, set_rate_limits

    cfg = demo_config()
    m = cfg.models[0]
    cfg = replace(cfg, models=(replace(m, rpm=30, tpm=90_000),))
    plan = build_plan(cfg)
    try:
        Executor(plan, store=str(tmp_path / "s"), runner=FakeRunner(), versions={"v": 1}, sleep=lambda s: None)
        lim = limiter_for(m.config.name, m.config.api_base)
        assert lim is not None and (lim.rpm, lim.tpm) == (30, 90_000)
    finally:
        set_rate_limits(m.config.name, m.config.api_base)


def test_limiters_given_to_an_executor_replace_the_local_books(tmp_path):
    from dataclasses import replace

    from mkb.agent._pace import RateLimiter, limiter_for, set_rate_limits

    cfg = demo_config()
    m = cfg.models[0]
    key = (m.config.name, m.config.api_base)
    shared = RateLimiter(rpm=7)  # stands for the Ray executor's cluster-wide limiter
    try:
        Executor(build_plan(replace(cfg, models=(replace(m, rpm=30),))), store=str(tmp_path / "s"), runner=FakeRunner(),
                 versions={"v": 1}, sleep=lambda s: None, limiters={key: shared})
        assert limiter_for(*key) is shared
        Executor(build_plan(cfg), store=str(tmp_path / "s2"), runner=FakeRunner(), versions={"v": 1}, sleep=lambda s: None)
        assert limiter_for(*key) is None  # this config sets no limits: an earlier executor's pacing does not linger
    finally:
        set_rate_limits(*key)
