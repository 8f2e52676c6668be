"""An attempt's transcript rebuilt from its events alone: every turn, tool call, verdict and the diff of kernel.py between submissions.

Reads only the event store (no torch, DSL or litellm), so anyone holding a dataset can read how an
attempt went. The conversation comes from `turn.request_messages` + `turn.reply`; kernels from
`submission.kernel_source`; verdicts from the grader's `verdict` events of the attempt.
"""

from __future__ import annotations

import difflib
import html
import json
from dataclasses import dataclass, field
from typing import Any

from mkb.events import read


class TranscriptError(ValueError):
    """The attempt is not in the store (or has no events of the agent)."""


@dataclass
class Transcript:
    attempt_id: str
    started: dict[str, Any]
    finished: dict[str, Any] | None
    turns: list[dict[str, Any]]
    calls: dict[int, list[dict[str, Any]]]
    submissions: list[dict[str, Any]]
    verdicts: dict[str, dict[str, Any]]  # evaluation_id -> verdict row
    skill: dict[str, Any] | None
    redacted: bool = False
    notes: list[str] = field(default_factory=list)

    def kernel_diffs(self) -> list[tuple[int, list[str]]]:
        """(submission index, unified diff against the previous submission) for every submission after the first."""
        out = []
        prev = None
        for s in self.submissions:
            cur = s.get("kernel_source") or ""
            if prev is not None:
                out.append((s["submission_index"], list(difflib.unified_diff(prev.splitlines(), cur.splitlines(),
                                                                             f"submission {s['submission_index'] - 1}", f"submission {s['submission_index']}",
                                                                             lineterm=""))))
            prev = cur
        return out


def _rows(kind: str, store, attempt_id: str) -> list[dict[str, Any]]:
    try:
        df = read(kind, store)
    except Exception:  # noqa: BLE001 - a kind the store has no file of reads as empty
        return []
    if df.height == 0 or "attempt_id" not in df.columns:
        return []
    df = df.filter(df["attempt_id"] == attempt_id)
    return df.sort("seq").to_dicts() if "seq" in df.columns else df.to_dicts()


def load_transcript(store, attempt_id: str) -> Transcript:
    started = _rows("attempt_started", store, attempt_id)
    turns = _rows("turn", store, attempt_id)
    if not started and not turns:
        raise TranscriptError(f"attempt {attempt_id} has no attempt_started or turn events in {store or 'the default store'}\n"
                              "hint: `mkb-analyze attempts --store URL` lists the attempts")
    calls: dict[int, list[dict]] = {}
    for c in _rows("tool_call", store, attempt_id):
        calls.setdefault(int(c["turn"]), []).append(c)
    verdicts = {v["evaluation_id"]: v for v in _rows("verdict", store, attempt_id) if v.get("evaluation_id")}
    fin = _rows("attempt_finished", store, attempt_id)
    skill = _rows("skill", store, attempt_id)
    t = Transcript(attempt_id, started[0] if started else {}, fin[-1] if fin else None, turns, calls, _rows("submission", store, attempt_id),
                   verdicts, skill[-1] if skill else None)
    t.redacted = any(str(x.get("reply") or "").startswith("[redacted") for x in turns)
    if not fin:
        t.notes.append("no attempt_finished event: the attempt was interrupted or is still running")
    return t


def _messages(turn: dict) -> tuple[list[dict], dict | None]:
    try:
        req = json.loads(turn.get("request_messages") or "[]")
    except json.JSONDecodeError:
        req = [{"role": "note", "content": turn.get("request_messages")}]
    try:
        reply = json.loads(turn["reply"]) if turn.get("reply") else None
    except json.JSONDecodeError:
        reply = {"role": "assistant", "content": turn.get("reply")}
    return req, reply


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return json.dumps(content, indent=1)


def _head(s: dict) -> list[tuple[str, str]]:
    f = s
    return [("attempt", s.get("attempt_id", "")), ("model", f.get("model", "")), ("problem", f"{f.get('problem')} {f.get('problem_name') or ''}"),
            ("arm", f"{f.get('arm_kind')} -> {f.get('target_dsl')}" + (f" (skill from {f.get('source_dsl')})" if f.get("source_dsl") else "")),
            ("budget", f"{f.get('budget_submissions')} submissions, {f.get('budget_turns')} turns, {f.get('budget_output_tokens')} output tokens"),
            ("sandbox", str(f.get("sandbox") or ("unsafe-no-sandbox" if f.get("unsafe_no_sandbox") else "?")))]


def render_text(t: Transcript, *, width: int = 2000) -> str:
    """A plain-text transcript (the terminal view prints it through rich)."""
    out = [f"# transcript of attempt {t.attempt_id}"]
    out += [f"{k}: {v}" for k, v in _head({**t.started, "attempt_id": t.attempt_id})]
    out += [f"note: {n}" for n in t.notes]
    sub_by_eval = {s.get("evaluation_id"): s for s in t.submissions}
    for turn in t.turns:
        req, reply = _messages(turn)
        out.append(f"\n--- turn {turn['turn']} ({turn['phase']}) tokens out {turn.get('completion_tokens')} "
                   f"(reasoning {turn.get('reasoning_tokens')}), latency {turn.get('latency_s', 0):.1f} s, retries {turn.get('retries')}"
                   + (f", ERROR {turn['error']}" if turn.get("error") else ""))
        for m in req:
            if m.get("role") == "tool":
                continue  # shown with its call below the previous turn
            out.append(f"[{m.get('role')}] {_text(m.get('content'))[:width]}")
        if reply is not None:
            if reply.get("reasoning_content"):
                out.append(f"[reasoning] {_text(reply['reasoning_content'])[:width]}")
            if reply.get("content"):
                out.append(f"[assistant] {_text(reply['content'])[:width]}")
        for c in t.calls.get(int(turn["turn"]), []):
            out.append(f"  > {c['name']}({c['arguments'][:width]})" + ("" if c["ok"] else "  [failed]") + (" [counted]" if c["counted"] else ""))
            out.append("    " + c["result"][:width].replace("\n", "\n    "))
            if c["name"] == "submit" and c.get("evaluation_id") in sub_by_eval:
                v = t.verdicts.get(c["evaluation_id"])
                if v:
                    out.append(f"    verdict (grader event): passed={v.get('passed')} reason={v.get('reason')} speedup={v.get('speedup')}")
    for idx, diff in t.kernel_diffs():
        out.append(f"\n--- kernel.py diff, submission {idx - 1} -> {idx}")
        out += diff or ["(identical)"]
    if t.skill:
        out.append(f"\n--- SKILL.md ({t.skill.get('token_length')} tokens; flags: {', '.join(t.skill.get('hygiene_flags') or []) or 'none'})")
        out.append(t.skill.get("text") or "(empty)")
    if t.finished:
        f = t.finished
        out.append(f"\n--- finished: {f.get('stop_reason')} ({f.get('status')}); submissions {f.get('submissions_used')}, turns {f.get('turns_used')}, "
                   f"output tokens {f.get('output_tokens')} (+{f.get('closing_output_tokens')} closing), working {f.get('working_s')} s"
                   + (f"; error: {f['error']}" if f.get("error") else ""))
    return "\n".join(out)


_CSS = """body{font:14px/1.45 system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
pre{white-space:pre-wrap;background:#f6f6f6;padding:.6em;border-radius:4px;overflow-x:auto}
.turn{border-left:3px solid #888;padding-left:1em;margin:1.5em 0}.closing{border-color:#c80}
.call{margin:.5em 0 .5em 1em}.fail{color:#b00}.meta{color:#666;font-size:12px}.reason{color:#555;font-style:italic}
.add{background:#e6ffe6}.del{background:#ffe6e6}table.head td{padding:2px 8px}"""


def render_html(t: Transcript) -> str:
    """A self-contained HTML page (no scripts, no network)."""
    e = html.escape
    parts = [f"<!doctype html><meta charset=utf-8><title>mkb transcript {e(t.attempt_id)}</title><style>{_CSS}</style>",
             f"<h1>Attempt {e(t.attempt_id)}</h1><table class=head>"]
    parts += [f"<tr><td>{e(k)}</td><td>{e(str(v))}</td></tr>" for k, v in _head({**t.started, "attempt_id": t.attempt_id})]
    parts.append("</table>")
    parts += [f"<p class=fail>{e(n)}</p>" for n in t.notes]
    for turn in t.turns:
        req, reply = _messages(turn)
        cls = "turn closing" if turn["phase"] == "closing" else "turn"
        parts.append(f"<div class='{cls}'><h3>Turn {turn['turn']} <span class=meta>{e(turn['phase'])}; out {turn.get('completion_tokens')} tokens "
                     f"(reasoning {turn.get('reasoning_tokens')}); {turn.get('latency_s', 0):.1f} s; retries {turn.get('retries')}</span></h3>")
        if turn.get("error"):
            parts.append(f"<p class=fail>error: {e(turn['error'])}</p>")
        for m in req:
            if m.get("role") != "tool":
                parts.append(f"<details{' open' if m.get('role') != 'system' else ''}><summary>{e(str(m.get('role')))}</summary><pre>{e(_text(m.get('content')))}</pre></details>")
        if reply is not None:
            if reply.get("reasoning_content"):
                parts.append(f"<p class=reason>{e(_text(reply['reasoning_content']))}</p>")
            if reply.get("content"):
                parts.append(f"<pre>{e(_text(reply['content']))}</pre>")
        for c in t.calls.get(int(turn["turn"]), []):
            flag = "" if c["ok"] else " <span class=fail>failed</span>"
            parts.append(f"<div class=call><b>{e(c['name'])}</b>{flag}{' (counted)' if c['counted'] else ''}"
                         f"<details><summary>arguments</summary><pre>{e(c['arguments'])}</pre></details><pre>{e(c['result'])}</pre></div>")
        parts.append("</div>")
    diffs = t.kernel_diffs()
    if diffs:
        parts.append("<h2>kernel.py between submissions</h2>")
        for idx, diff in diffs:
            lines = []
            for ln in diff or ["(identical)"]:
                cls = "add" if ln.startswith("+") and not ln.startswith("+++") else "del" if ln.startswith("-") and not ln.startswith("---") else ""
                lines.append(f"<span class='{cls}'>{e(ln)}</span>")
            parts.append(f"<h3>submission {idx - 1} &rarr; {idx}</h3><pre>" + "\n".join(lines) + "</pre>")
    if t.skill:
        parts.append(f"<h2>SKILL.md</h2><p class=meta>{t.skill.get('token_length')} tokens; flags: {e(', '.join(t.skill.get('hygiene_flags') or []) or 'none')}</p>"
                     f"<pre>{e(t.skill.get('text') or '(empty)')}</pre>")
    if t.finished:
        f = t.finished
        parts.append(f"<h2>Finished: {e(str(f.get('stop_reason')))}</h2><p>{e(str(f.get('status')))}; submissions {f.get('submissions_used')}, turns "
                     f"{f.get('turns_used')}, output tokens {f.get('output_tokens')} (+{f.get('closing_output_tokens')} closing)"
                     + (f"; error: {e(str(f['error']))}" if f.get("error") else "") + "</p>")
    return "\n".join(parts)


REDACTED_COLUMNS: dict[str, tuple[str, ...]] = {
    "turn": ("request_messages", "reply"),
    "tool_call": ("arguments", "result"),
    "submission": ("kernel_source",),
    "skill": ("text", "text_untruncated"),
}


def redact_frame(kind: str, df):
    """Message and code text replaced by `[redacted: N bytes]`; every count, hash and verdict kept (export --redact)."""
    import polars as pl

    cols = [c for c in REDACTED_COLUMNS.get(kind, ()) if c in df.columns]
    if not cols:
        return df
    return df.with_columns([
        pl.when(pl.col(c).is_null()).then(None).otherwise(pl.lit("[redacted: ") + pl.col(c).str.len_bytes().cast(pl.Utf8) + pl.lit(" bytes]")).alias(c)
        for c in cols
    ])
