"""The one place mkb imports litellm: offline settings, one completion with mkb's own retries, usage and cost."""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from mkb.agent._pace import PacingUnavailable, limiter_for
from mkb.agent._types import ModelConfig

# Before litellm is imported: use the price map bundled with the pinned version (no remote fetch at import).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@cache
def litellm():
    import litellm as _litellm

    _litellm.telemetry = False
    _litellm.suppress_debug_info = True
    _litellm.num_retries = 0
    _litellm.drop_params = True  # a provider that lacks a sampling setting gets it dropped, not a 400
    return _litellm


def litellm_version() -> str:
    from importlib.metadata import version

    return version("litellm")


@cache
def price_map_revision() -> str:
    """litellm version + sha256 of the bundled price map it prices from (recorded on attempt_started)."""
    import importlib.util

    spec = importlib.util.find_spec("litellm")
    path = Path(list(spec.submodule_search_locations)[0]) / "model_prices_and_context_window_backup.json"  # type: ignore[union-attr]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else "missing"
    return f"litellm=={litellm_version()}:model_prices_backup:{digest}"


class ContextExhausted(Exception):
    """The provider refused the request as longer than the model's context window."""


class InfraError(Exception):
    """The model API failed and kept failing through every retry (or refused the request for good)."""


@dataclass
class Completion:
    message: dict[str, Any]  # the assistant message as appended (nothing dropped but None fields)
    tool_calls: list[dict[str, Any]]
    finish_reason: str | None
    served_model: str | None
    system_fingerprint: str | None
    prompt_tokens: int | None
    completion_tokens: int
    reasoning_tokens: int | None
    cached_tokens: int | None
    cost_usd: float | None
    latency_s: float
    retries: int
    backoff_s: float
    last_error: str | None


def _transient(exc: BaseException) -> bool:
    ll = litellm()
    if isinstance(exc, (ll.RateLimitError, ll.Timeout, ll.APIConnectionError, ll.ServiceUnavailableError, ll.InternalServerError,
                        ll.BadGatewayError)):
        return True
    status = getattr(exc, "status_code", None)
    return isinstance(status, int) and (status == 429 or status >= 500)


def _message_dict(msg: Any) -> dict[str, Any]:
    d = msg.model_dump() if hasattr(msg, "model_dump") else dict(msg)
    out = {k: v for k, v in d.items() if v is not None}
    out["role"] = "assistant"
    out.setdefault("content", None)
    return out


def _usage(resp: Any) -> tuple[int | None, int, int | None, int | None]:
    u = getattr(resp, "usage", None)
    if u is None:
        return None, 0, None, None
    details = getattr(u, "completion_tokens_details", None)
    pdetails = getattr(u, "prompt_tokens_details", None)
    return (getattr(u, "prompt_tokens", None), int(getattr(u, "completion_tokens", 0) or 0),
            getattr(details, "reasoning_tokens", None) if details else None, getattr(pdetails, "cached_tokens", None) if pdetails else None)


def _cost(resp: Any) -> float | None:
    try:
        c = litellm().completion_cost(completion_response=resp)
    except Exception:  # noqa: BLE001 - an unpriced model has no cost, not an error
        return None
    return float(c) if c else None


def complete(model: ModelConfig, messages: list[dict], tools: list[dict], *, max_tokens: int, seed: int | None = None,
             sleep=time.sleep, rng: random.Random | None = None) -> Completion:
    """One completion, retried with exponential backoff on 429, 5xx, timeouts and connection errors.

    Retries are mkb's own (litellm's and the OpenAI client's are off) so that their count and the
    time spent waiting are recorded and kept out of the working time.
    """
    ll = litellm()
    rng = rng or random.Random()
    kwargs: dict[str, Any] = {"model": model.name, "messages": messages, "max_tokens": max_tokens, "timeout": model.request_timeout_s,
                              "temperature": model.temperature, "max_retries": 0, "num_retries": 0}
    if tools:
        kwargs["tools"] = tools
    if model.api_base:
        kwargs["api_base"] = model.api_base
    if model.api_key_env:
        key = os.environ.get(model.api_key_env)
        if not key:
            raise InfraError(f"environment variable {model.api_key_env} (the API key) is not set")
        kwargs["api_key"] = key
    elif model.scripted:
        kwargs["api_key"] = "scripted"
    if model.reasoning_effort:
        kwargs["reasoning_effort"] = model.reasoning_effort
    if seed is not None and not model.scripted:
        kwargs["seed"] = seed
    retries = 0
    backoff = 0.0
    last_error: str | None = None
    limiter = limiter_for(model.name, model.api_base)
    while True:
        entry = None
        if limiter is not None:  # the provider's rpm/tpm (set by the experiment): waiting counts as backoff
            try:
                entry, waited = limiter.acquire(max_tokens + len(json.dumps(messages)) // 4)
            except PacingUnavailable as exc:  # an unpaced request could break the cluster's limits: fail, never send
                raise InfraError(str(exc)) from None
            backoff += waited
        t0 = time.monotonic()
        try:
            resp = ll.completion(**kwargs)
        except ll.ContextWindowExceededError as exc:
            raise ContextExhausted(_one_line(exc)) from None
        except Exception as exc:  # noqa: BLE001 - classified below
            last_error = f"{type(exc).__name__}: {_one_line(exc)}"
            if not _transient(exc):
                raise InfraError(last_error) from None
            if retries >= model.max_retries:
                raise InfraError(f"{last_error} (after {retries} retries)") from None
            wait = min(model.retry_cap_s, model.retry_base_s * (2 ** retries)) * (0.5 + rng.random() / 2)
            retries += 1
            backoff += wait
            sleep(wait)
            continue
        latency = time.monotonic() - t0
        choice = resp.choices[0]
        msg = _message_dict(choice.message)
        calls = []
        for tc in msg.get("tool_calls") or []:
            fn = tc.get("function") or {}
            calls.append({"id": tc.get("id") or "", "name": fn.get("name") or "", "arguments": fn.get("arguments") or ""})
        prompt, completion, reasoning, cached = _usage(resp)
        if entry is not None:
            limiter.settle(entry, (prompt or 0) + (completion or 0))
        return Completion(msg, calls, getattr(choice, "finish_reason", None), getattr(resp, "model", None), getattr(resp, "system_fingerprint", None),
                          prompt, completion, reasoning, cached, _cost(resp), latency, retries, backoff, last_error)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:500]
