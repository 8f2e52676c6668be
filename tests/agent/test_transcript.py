"""Transcripts rebuilt from events alone (terminal and HTML, kernel diffs), and `export --redact`."""

from __future__ import annotations

import polars as pl
import pytest

from mkb.analysis._transcript import TranscriptError, load_transcript, redact_frame, render_html, render_text

from test_loop import demo_steps

pytestmark = pytest.mark.usefixtures("sandbox_available")


def test_transcript_from_events(runner):
    res = runner.run(demo_steps())
    t = load_transcript(runner.store, res.attempt_id)
    text = render_text(t)
    assert f"transcript of attempt {res.attempt_id}" in text
    assert "[reasoning] start simple" in text and "> submit(" in text and "passed: false" in text
    assert "--- turn 5 (closing)" in text and "finished: finished" in text
    diffs = t.kernel_diffs()
    assert len(diffs) == 1 and any(ln.startswith("-") and "WRONG" in ln for ln in diffs[0][1])
    page = render_html(t)
    assert page.startswith("<!doctype html>") and "<script" not in page and "submission 1 &rarr; 2" in page
    with pytest.raises(TranscriptError, match="no attempt_started"):
        load_transcript(runner.store, "not-an-attempt")


def test_redact_keeps_counts_drops_text(runner):
    res = runner.run(demo_steps())
    for kind, col in (("turn", "reply"), ("tool_call", "result"), ("submission", "kernel_source"), ("skill", "text")):
        df = runner.events(kind, res.attempt_id)
        red = redact_frame(kind, df)
        assert red.height == df.height and red.columns == df.columns
        assert all(v is None or v.startswith("[redacted: ") for v in red[col].to_list())
    calls = redact_frame("tool_call", runner.events("tool_call"))
    assert calls["result_bytes"].to_list() == runner.events("tool_call")["result_bytes"].to_list()


def test_export_redact_cli(runner, tmp_path):
    import subprocess
    import sys

    res = runner.run(demo_steps())
    out = tmp_path / "hf"
    r = subprocess.run([sys.executable, "-m", "mkb.cli.analyze", "export", "--store", runner.store, "--out", str(out), "--redact"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    sub = pl.read_parquet(out / "data" / "submission" / "events.parquet")
    assert sub["kernel_source"].str.starts_with("[redacted: ").all() and sub["kernel_bytes"].min() > 0
    turn = pl.read_parquet(out / "data" / "turn" / "events.parquet")
    assert not any("WRONG" in (v or "") for v in turn["request_messages"].to_list() + turn["reply"].to_list())
    assert res.attempt_id in turn["attempt_id"].to_list()


def test_replay_reproduces_the_recorded_attempt(runner, tmp_path):
    from mkb.agent._replay import ReplayError, replay_attempt, replay_script
    from mkb.events import EventWriter

    from agent_helpers import FakeGrader

    res = runner.run(demo_steps(), arm="transfer")
    # the source skill must be in the store for a non-solo replay: record one for the slot's source attempt
    with EventWriter(runner.store) as w:
        w.emit("skill", attempt_id="src-1", text="Tile rows across blocks; fuse the add.", sha256=runner.events("attempt_started")["skill_sha256"][0],
               source_attempt="src-1")
    assert len(replay_script(runner.store, res.attempt_id)) == 5
    grader = FakeGrader()
    with EventWriter(runner.store) as w:
        again = replay_attempt(runner.store, res.attempt_id, workspace=tmp_path / "replay" / "workspace", grader=grader, writer=w)
    assert again.attempt_id != res.attempt_id
    assert (again.stop_reason, again.submissions, again.turns, again.final_kernel_sha256, again.skill_sha256) == (
        res.stop_reason, res.submissions, res.turns, res.final_kernel_sha256, res.skill_sha256)
    assert grader.sources == runner.grader.sources
    started = runner.events("attempt_started", again.attempt_id).to_dicts()[0]
    assert started["attempt_kind"] == "replay" and started["replay_of"] == res.attempt_id and started["arm_kind"] == "transfer"
    with pytest.raises(ReplayError):
        replay_script(runner.store, "missing")
