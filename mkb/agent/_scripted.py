"""A scripted model: a standard-library HTTP server on 127.0.0.1 that speaks the OpenAI chat-completions protocol.

litellm calls it as an ordinary OpenAI-compatible endpoint (`openai/<name>` with `api_base`), so
tests and the demo run litellm's real request path. The script is JSON: a list of steps, one per
request. A step is one of
- `{"tool_calls": [{"name": "write_file", "arguments": {...} | "raw string"}], "content": "...",
   "reasoning": "...", "usage": {"completion_tokens": N, "reasoning_tokens": M}}` (a reply),
- `{"http_error": 429, "body": "..."}` (an error status; the next request gets the next step),
- `{"delay_s": 2.0, ...reply}` (answer late, e.g. past the client's timeout),
- `{"branch": [{"contains": "passed=false", "then": STEP}, ...], "else": STEP}`: picks a step by
  a substring of the last tool result in the request (how a scripted agent reacts to a verdict).
`{"repeat": STEP}` answers every remaining request with STEP (e.g. a model that never stops). When the
script is exhausted every request gets a `finish` call. Each request and the step it got are recorded
(`requests`) so a test can check what litellm sent, e.g. that reasoning survived a tool round-trip.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def _last_tool_result(messages: list[dict]) -> str:
    for m in reversed(messages):
        if m.get("role") == "tool":
            c = m.get("content")
            return c if isinstance(c, str) else json.dumps(c)
        if m.get("role") == "assistant":
            break
    return ""


def _resolve(step: dict, messages: list[dict]) -> dict:
    while "branch" in step:
        last = _last_tool_result(messages)
        chosen = step.get("else", {})
        for arm in step["branch"]:
            if arm["contains"] in last:
                chosen = arm["then"]
                break
        step = chosen
    return step


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def completion_body(step: dict, *, model: str, prompt_tokens: int, call_index: int) -> dict:
    """The chat.completion JSON for one reply step."""
    tool_calls = []
    for i, tc in enumerate(step.get("tool_calls", [])):
        args = tc.get("arguments", {})
        tool_calls.append({
            "id": tc.get("id", f"call_{call_index}_{i}"), "type": "function",
            "function": {"name": tc["name"], "arguments": args if isinstance(args, str) else json.dumps(args)},
        })
    message: dict[str, Any] = {"role": "assistant", "content": step.get("content")}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if step.get("reasoning"):
        message["reasoning_content"] = step["reasoning"]
    usage = step.get("usage", {})
    reasoning_tokens = int(usage.get("reasoning_tokens", _estimate_tokens(step.get("reasoning", "")) if step.get("reasoning") else 0))
    visible = json.dumps(tool_calls) + (step.get("content") or "")
    completion_tokens = int(usage.get("completion_tokens", _estimate_tokens(visible) + reasoning_tokens))
    return {
        "id": f"chatcmpl-scripted-{call_index}", "object": "chat.completion", "created": int(time.time()),
        "model": step.get("served_model", model), "system_fingerprint": "scripted-v1",
        "choices": [{"index": 0, "message": message,
                     "finish_reason": step.get("finish_reason", "tool_calls" if tool_calls else "stop")}],
        "usage": {
            "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "prompt_tokens_details": {"cached_tokens": int(usage.get("cached_tokens", 0))},
        },
    }


FINISH_STEP = {"tool_calls": [{"name": "finish", "arguments": {}}]}


class ScriptedModel:
    """Serves `steps` on 127.0.0.1:<free port>; use as a context manager, point litellm at `api_base`."""

    def __init__(self, steps: list[dict] | str | Path, *, model: str = "scripted") -> None:
        if isinstance(steps, (str, Path)):
            steps = json.loads(Path(steps).read_text())
        if not isinstance(steps, list):
            raise ValueError("a model script is a JSON list of steps")
        self.steps = steps
        self.model = model
        self.requests: list[dict] = []  # {"body": request JSON, "step": the step served}
        self._cursor = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def api_base(self) -> str:
        assert self._server is not None, "start the server first"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    def _next_step(self) -> dict:
        with self._lock:
            if self._cursor < len(self.steps):
                step = self.steps[self._cursor]
                if "repeat" in step:
                    return copy.deepcopy(step["repeat"])
                self._cursor += 1
                return copy.deepcopy(step)
            return copy.deepcopy(FINISH_STEP)

    def handle(self, body: dict) -> tuple[int, dict, float]:
        """(status, JSON body, delay) for one chat-completions request."""
        messages = body.get("messages", [])
        step = _resolve(self._next_step(), messages)
        with self._lock:
            self.requests.append({"body": body, "step": step})
            index = len(self.requests)
        delay = float(step.get("delay_s", 0.0))
        if "http_error" in step:
            status = int(step["http_error"])
            return status, {"error": {"message": step.get("body", f"scripted HTTP {status}"), "type": "scripted", "code": status}}, delay
        prompt_tokens = int(step.get("usage", {}).get("prompt_tokens", _estimate_tokens(json.dumps(messages))))
        return 200, completion_body(step, model=body.get("model", self.model), prompt_tokens=prompt_tokens, call_index=index), delay

    def start(self) -> "ScriptedModel":
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet: tests read `requests`
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("content-length", 0))
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    body = {}
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    status, payload, delay = 404, {"error": {"message": f"no route {self.path}"}}, 0.0
                else:
                    status, payload, delay = owner.handle(body)
                if delay:
                    time.sleep(delay)
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and went away

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="mkb-scripted-model", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "ScriptedModel":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
