"""The built-in loop end to end through litellm and the scripted OpenAI-compatible server: arms, stop reasons, closing turn, retries."""

from __future__ import annotations

import json

import pytest

from mkb.agent import Budget
from mkb.agent._loop import CLOSING_PROMPT, NUDGE
from mkb.agent._workspace import NEUTRAL_HEADER

from agent_helpers import GOOD, WRONG, FakeGrader

pytestmark = pytest.mark.usefixtures("sandbox_available")


def write(path, content):
    return {"name": "write_file", "arguments": {"path": path, "content": content}}


SUBMIT = {"name": "submit", "arguments": {}}
FINISH = {"name": "finish", "arguments": {}}
SKILL_TEXT = "Fusing the residual add into the normalisation pass halves the memory traffic; a row per block was fastest."
CLOSING = {"tool_calls": [write("SKILL.md", SKILL_TEXT)]}


def demo_steps():
    """Wrong first submission on purpose, then the right kernel after the verdict says so."""
    return [
        {"tool_calls": [write("kernel.py", WRONG), SUBMIT], "reasoning": "start simple"},
        {"branch": [{"contains": "passed: false", "then": {"tool_calls": [write("kernel.py", GOOD), SUBMIT]}}], "else": {"tool_calls": [FINISH]}},
        {"tool_calls": [write("SKILL.md", "draft")]},
        {"tool_calls": [FINISH]},
        CLOSING,
    ]


@pytest.mark.parametrize("arm", ["solo", "transfer", "placebo", "same", "wrong"])
def test_full_attempt_of_each_arm(runner, arm):
    res = runner.run(demo_steps(), arm=arm)
    assert res.stop_reason == "finished" and res.status == "finished"
    assert res.submissions == 2 and res.turns == 4 and res.closing_turn
    assert res.skill_text == SKILL_TEXT
    assert runner.grader.sources == [WRONG, GOOD]
    started = runner.events("attempt_started").to_dicts()[0]
    assert started["arm_kind"] == arm and started["budget_submissions"] == 10 and started["budget_turns"] == 80
    assert started["litellm_version"] and started["price_map"].startswith("litellm==") and started["tokenizer"].startswith("tiktoken==")
    assert started["sandbox"].startswith("bubblewrap")
    first_user = runner.server.requests[0]["body"]["messages"][1]["content"]
    if arm == "solo":
        assert started["skill_sha256"] is None and NEUTRAL_HEADER not in first_user
    else:
        assert NEUTRAL_HEADER in first_user and "Tile rows across blocks" in first_user
        assert started["skill_source_attempt"] == "src-1"
    turns = runner.events("turn")
    assert turns["turn"].to_list() == [1, 2, 3, 4, 5] and turns["phase"].to_list() == ["main"] * 4 + ["closing"]
    calls = runner.events("tool_call")
    assert calls.filter(calls["name"] == "submit")["counted"].to_list() == [True, True]
    assert runner.events("submission")["kernel_source"].to_list() == [WRONG, GOOD]
    fin = runner.events("attempt_finished").to_dicts()[0]
    assert fin["stop_reason"] == "finished" and fin["best_passed"] and fin["best_speedup"] == 1.5
    assert fin["closing_output_tokens"] > 0 and fin["turns_used"] == 4
    skill = runner.events("skill").to_dicts()[0]
    assert skill["text"] == SKILL_TEXT and skill["source_attempt"] == res.attempt_id and skill["hygiene_flags"] == []


def test_header_gives_no_arm_away(runner):
    bodies = {}
    for arm in ("transfer", "placebo", "same", "wrong"):
        runner.run([{"tool_calls": [FINISH]}], arm=arm, skill="same notes")
        bodies[arm] = runner.server.requests[0]["body"]["messages"][1]["content"]
    assert len(set(bodies.values())) == 1


def test_reasoning_survives_the_tool_round_trip(runner):
    runner.run(demo_steps())
    second = runner.server.requests[1]["body"]["messages"]
    assistant = [m for m in second if m["role"] == "assistant"][0]
    assert assistant["reasoning_content"] == "start simple"
    assert [m["role"] for m in second[-2:]] == ["tool", "tool"]


def test_reply_without_tool_call_is_nudged_and_counted(runner):
    res = runner.run([{"content": "let me think"}, {"tool_calls": [FINISH]}, CLOSING])
    assert res.turns == 2
    assert runner.server.requests[1]["body"]["messages"][-1] == {"role": "user", "content": NUDGE}


def test_stop_submissions(runner):
    steps = [{"tool_calls": [write("kernel.py", WRONG), SUBMIT]}, {"tool_calls": [SUBMIT, SUBMIT]}, CLOSING]
    res = runner.run(steps, budget=Budget(submissions=2))
    assert res.stop_reason == "submissions" and res.submissions == 2 and res.closing_turn
    calls = runner.events("tool_call").filter(runner.events("tool_call")["name"] == "submit")
    assert calls["counted"].to_list() == [True, True, False]
    assert "no submissions left" in calls["result"].to_list()[2]
    assert runner.events("attempt_finished")["status"].to_list() == ["budget_exhausted"]


def test_stop_turns_then_closing_turn_freezes_kernel(runner):
    steps = [{"tool_calls": [write("kernel.py", GOOD)]}, {"content": "hm"}, {"content": "hm"},
             {"tool_calls": [write("kernel.py", WRONG), write("SKILL.md", SKILL_TEXT)]}]
    res = runner.run(steps, budget=Budget(turns=3))
    assert res.stop_reason == "turns" and res.turns == 3 and res.closing_turn
    assert res.final_kernel_path.read_text() == GOOD
    closing_req = runner.server.requests[3]["body"]
    assert closing_req["messages"][-1]["content"] == CLOSING_PROMPT.format(reason="turns")
    assert [t["function"]["name"] for t in closing_req["tools"]] == ["write_file"]
    assert closing_req["max_tokens"] == Budget().closing_tokens
    calls = runner.events("tool_call").filter(runner.events("tool_call")["phase"] == "closing").to_dicts()
    assert not calls[0]["ok"] and "frozen" in calls[0]["result"] and calls[1]["ok"]
    assert res.skill_text == SKILL_TEXT
    assert (runner.tmp / f"ws{runner.n}" / "workspace" / "kernel.py").read_text() == GOOD


def test_stop_output_tokens_and_max_tokens_shrinks(runner):
    steps = [{"tool_calls": [write("kernel.py", GOOD)], "usage": {"completion_tokens": 700}},
             {"tool_calls": [write("x.txt", "y")], "usage": {"completion_tokens": 400}}, CLOSING]
    res = runner.run(steps, budget=Budget(output_tokens=1000), model_kw={"max_tokens_per_turn": 800})
    assert res.stop_reason == "output_tokens" and res.output_tokens == 1100
    assert [r["body"]["max_tokens"] for r in runner.server.requests[:2]] == [800, 300]
    fin = runner.events("attempt_finished").to_dicts()[0]
    assert fin["output_tokens"] == 1100 and fin["closing_output_tokens"] > 0


def test_stop_working_time(runner):
    res = runner.run([CLOSING], budget=Budget(working_time_s=0.0))
    assert res.stop_reason == "working_time" and res.turns == 0 and res.closing_turn


def test_stop_wall_clock_preset(runner):
    res = runner.run([CLOSING], budget=Budget(wall_clock_s=0.0))
    assert res.stop_reason == "wall_clock"
    assert runner.events("attempt_started")["budget_wall_clock_s"].to_list() == [0.0]


def test_retries_on_429_and_503_are_not_charged(runner):
    steps = [{"http_error": 429}, {"http_error": 503}, {"tool_calls": [FINISH]}, CLOSING]
    res = runner.run(steps)
    assert res.stop_reason == "finished" and res.turns == 1
    t = runner.events("turn").to_dicts()[0]
    assert t["retries"] == 2 and t["backoff_s"] > 0
    fin = runner.events("attempt_finished").to_dicts()[0]
    assert fin["backoff_s"] == pytest.approx(t["backoff_s"])


def test_timeout_is_retried(runner):
    steps = [{"delay_s": 3.0, "tool_calls": [write("late.txt", "x")]}, {"tool_calls": [FINISH]}, CLOSING]
    res = runner.run(steps, model_kw={"request_timeout_s": 1.0})
    assert res.stop_reason == "finished"
    t = runner.events("turn").to_dicts()[0]
    assert t["retries"] == 1 and not (runner.tmp / f"ws{runner.n}" / "workspace" / "late.txt").exists()


def test_outage_outlasting_retries_is_infra_error_without_closing(runner):
    res = runner.run([{"repeat": {"http_error": 500}}], model_kw={"max_retries": 2})
    assert res.stop_reason == "infra_error" and not res.closing_turn
    fin = runner.events("attempt_finished").to_dicts()[0]
    assert fin["status"] == "infra_error" and fin["closing_skipped_reason"] == "infra_error" and "after 2 retries" in fin["error"]
    turn = runner.events("turn").to_dicts()[0]
    assert turn["reply"] is None and "InternalServerError" in turn["error"]
    assert runner.events("skill").height == 1


def test_grader_failure_is_infra_error(runner):
    res = runner.run([{"tool_calls": [write("kernel.py", GOOD), SUBMIT]}], grader=FakeGrader(fail_with=RuntimeError("GPU lost")))
    assert res.stop_reason == "infra_error"
    assert "GPU lost" in runner.events("attempt_finished")["error"].to_list()[0]


def test_context_overflow_elides_oldest_tool_output_then_exhausts(runner):
    ctx = {"http_error": 400, "body": "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."}
    steps = [{"tool_calls": [{"name": "bash", "arguments": {"command": "seq 1 2000"}}]}, ctx, {"tool_calls": [write("a.txt", "1")]}, ctx, ctx]
    res = runner.run(steps)
    assert res.stop_reason == "context_exhausted" and not res.closing_turn
    second = runner.server.requests[2]["body"]["messages"]
    tool_msgs = [m for m in second if m["role"] == "tool"]
    assert tool_msgs[0]["content"].startswith("[mkb: this tool output was elided")
    turns = runner.events("turn")
    assert turns["elided_tool_messages"].to_list()[-1] >= 1 and "context_exhausted" in turns["error"].to_list()[-1]
    assert runner.events("attempt_finished")["closing_skipped_reason"].to_list() == ["context_exhausted"]


def test_malformed_tool_calls_are_answered_not_fatal(runner):
    steps = [{"tool_calls": [{"name": "write_file", "arguments": "{not json"}, {"name": "no_such_tool", "arguments": {}},
                             {"name": "write_file", "arguments": {"path": 3}}, {"name": "read_file", "arguments": "[1,2]"},
                             {"name": "edit_file", "arguments": {"path": "SKILL.md", "old": "", "new": "x"}}]},
             {"tool_calls": [FINISH]}, CLOSING]
    res = runner.run(steps)
    assert res.stop_reason == "finished"
    calls = runner.events("tool_call").to_dicts()[:5]
    assert [c["ok"] for c in calls] == [False] * 5
    assert "not valid JSON" in calls[0]["result"] and "unknown tool" in calls[1]["result"]
    assert calls[0]["arguments"] == "{not json"


def test_huge_tool_output_is_capped_head_and_tail(runner):
    steps = [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo HEAD; head -c 5000000 /dev/zero | tr '\\\\0' a; echo; echo TAIL"}}]},
             {"tool_calls": [FINISH]}, CLOSING]
    runner.run(steps)
    call = runner.events("tool_call").to_dicts()[0]
    assert call["result_bytes"] > 5_000_000 and call["bytes_elided"] > 4_900_000
    assert len(call["result"].encode()) <= 16 * 1024 and call["result"].startswith("HEAD") and call["result"].rstrip().endswith("TAIL")
    sent = runner.server.requests[1]["body"]["messages"][-1]["content"]
    assert sent == call["result"]


def test_no_secret_reaches_an_event(runner, monkeypatch):
    secret = "sk-test-0123456789abcdef-SECRET"
    monkeypatch.setenv("MKB_TEST_PROVIDER_API_KEY", secret)
    steps = [{"tool_calls": [write("notes.txt", f"key={secret}"), {"name": "bash", "arguments": {"command": "env; echo [$MKB_TEST_PROVIDER_API_KEY]"}},
                             {"name": "bash", "arguments": {"command": "cat notes.txt"}}],
              "content": f"I found {secret}"},
             {"tool_calls": [FINISH]}, {"tool_calls": [write("SKILL.md", f"the key is {secret}")]}]
    runner.run(steps, model_kw={"api_key_env": "MKB_TEST_PROVIDER_API_KEY"})
    assert runner.server.requests[0]["body"]  # the key went to the server as auth, never into a body we log
    for kind in ("attempt_started", "turn", "tool_call", "skill", "attempt_finished"):
        blob = json.dumps(runner.events(kind).to_dicts(), default=str)
        assert secret not in blob, kind
    bash = runner.events("tool_call").to_dicts()[1]
    assert "[]" in bash["result"] and "MKB_TEST_PROVIDER_API_KEY" not in bash["result"]
    assert "[redacted:MKB_TEST_PROVIDER_API_KEY]" in runner.events("skill")["text"].to_list()[0]
    # nor does a tool result carry it back to the model (a graded kernel can print what it read of the parent's /proc)
    tool_msgs = [m for r in runner.server.requests for m in r["body"]["messages"] if m.get("role") == "tool"]
    assert any("key=[redacted:MKB_TEST_PROVIDER_API_KEY]" in str(m["content"]) for m in tool_msgs)
    assert not any(secret in str(m["content"]) for m in tool_msgs)


def test_turn_events_rebuild_the_conversation(runner):
    runner.run(demo_steps())
    msgs = []
    for t in runner.events("turn").to_dicts():
        msgs += json.loads(t["request_messages"])
        msgs.append(json.loads(t["reply"]))
    last = runner.server.requests[-1]["body"]["messages"]
    assert [m["role"] for m in msgs[: len(last)]] == [m["role"] for m in last]
    assert msgs[0]["role"] == "system" and msgs[1]["role"] == "user"


@pytest.mark.dsl
@pytest.mark.slow
@pytest.mark.parametrize("dsl", ["cute", "tirx"])
def test_check_compiles_the_baseline_in_the_sandbox(runner, dsl):
    """The free check really compiles (CPU, compile-only) inside the sandbox, whose runtime holds no baselines."""
    pytest.importorskip("cutlass" if dsl == "cute" else "tvm")
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    good = next(root.glob(f"problems/mlp_norm/28_*/{dsl}.py")).read_text()
    broken = good.replace("def solve(", "def solve_(", 1)
    steps = [{"tool_calls": [write("kernel.py", good), {"name": "check", "arguments": {}}, write("kernel.py", broken), {"name": "check", "arguments": {}},
                             write("kernel.py", "import subprocess\n" + good), {"name": "check", "arguments": {}}]},
             {"tool_calls": [FINISH]}, CLOSING]
    runner.run(steps, dsl=dsl)
    calls = runner.events("tool_call").filter(runner.events("tool_call")["name"] == "check").to_dicts()
    assert calls[0]["ok"] and calls[0]["sandboxed"] and "compiled" in calls[0]["result"], calls[0]["result"]
    assert not calls[1]["ok"] and "solve" in calls[1]["result"]
    assert not calls[2]["ok"] and "static rules" in calls[2]["result"]
    assert not calls[0]["counted"] and runner.grader.jobs == []


def test_attempt_finished_names_the_served_model_the_turns_saw(runner):
    """The analysis flags blocks whose served model changed between solo and skill arms: it reads this column."""
    res = runner.run([{"tool_calls": [FINISH]}, CLOSING])
    assert res.stop_reason == "finished"
    served = [m for m in runner.events("turn")["served_model"].to_list() if m]
    fin = runner.events("attempt_finished").to_dicts()[0]
    assert served and fin["served_model"] == "|".join(dict.fromkeys(served))
