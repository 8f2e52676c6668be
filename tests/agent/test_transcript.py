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
