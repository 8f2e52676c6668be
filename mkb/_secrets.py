"""Tells credential-looking environment variables apart, so that no grading process inherits one and no event keeps one.

Why: a run of the experiment holds model API keys (and whatever cloud or SSH credentials the user's shell has) in its
environment, and the kernels it grades are written by the models under test. A worker that inherited them could put
one into its exception text, which the grader writes into the events a user publishes; a kernel can also read its
parent's environment through /proc. So the grader's workers and precompile forks start without them, and every
string the grader writes from a worker's output has their values replaced (`[redacted:NAME]`), as the agent's
events already have (mkb.agent's SafeWriter).
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION)", re.I)
# names that match but hold no secret: redacting their values (a word, a socket path) would rewrite ordinary text,
# what the model reads included, differently on every host (`UV_KEYRING_PROVIDER=subprocess`)
NOT_SECRET_NAME = re.compile(r"^(XDG_|DBUS_|GIT_AUTHOR_|GIT_COMMITTER_|TIKTOKEN_)|KEYRING|^SSH_AUTH_SOCK$|^XAUTHORITY$|"
                             r"^SESSION_MANAGER$|^KRB5CCNAME$", re.I)
_PLAIN = re.compile(r"[a-z]+|/[^\s]*")  # a plain lowercase word or an absolute path: not a credential's value
MIN_SECRET_CHARS = 8  # shorter values ("1", "true") would redact ordinary text


def secret_values(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Values to redact, name by value: those of variables whose names look like credentials, at least
    MIN_SECRET_CHARS long and neither a plain word nor a path (the variables are withheld from workers all the same)."""
    env = os.environ if environ is None else environ
    return {v: k for k, v in env.items() if SECRET_NAME.search(k) and not NOT_SECRET_NAME.search(k)
            and len(v) >= MIN_SECRET_CHARS and not _PLAIN.fullmatch(v)}


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` less every variable whose name looks like a credential (a grading process needs none)."""
    return {k: v for k, v in environ.items() if not SECRET_NAME.search(k)}


def redact(value: Any, secrets: Mapping[str, str] | None = None) -> Any:
    """`value` with each secret's value replaced by `[redacted:NAME]` in every string, also inside lists and dicts
    (keys too); `secrets` (value -> name) defaults to this process's environment's."""
    secrets = secret_values() if secrets is None else secrets
    if not secrets:
        return value
    return _redact(value, sorted(secrets.items(), key=lambda kv: -len(kv[0])))


def _redact(value: Any, secrets: list[tuple[str, str]]) -> Any:
    if isinstance(value, str):
        for secret, name in secrets:
            if secret in value:
                value = value.replace(secret, f"[redacted:{name}]")
        return value
    if isinstance(value, dict):
        return {_redact(k, secrets): _redact(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, secrets) for v in value]
    if isinstance(value, tuple):
        items = [_redact(v, secrets) for v in value]
        return value._make(items) if hasattr(value, "_make") else tuple(items)  # a namedtuple keeps its type
    return value
