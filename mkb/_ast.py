"""Parses Python source into an AST correctly from many threads at once (every `ast.parse` in mkb goes through here).

Why: before CPython 3.12.2 / 3.11.8 the AST constructor keeps its recursion counter in interpreter-wide state, so two
threads parsing at once (a grading queue's producers, the precompiler's slots, agents run in threads) can corrupt
each other's count; one of them then raises `SystemError: AST constructor recursion depth mismatch` (or a false
`RecursionError`) on a kernel that is fine, and a correct kernel would fail its static check (python/cpython#106905;
CI hit it on 3.11.7). A lock makes mkb's own parses take turns; a parse that still collides with one outside mkb
(a library parsing beside it) is made again, since the source is unchanged and the collision is not its fault.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()
ATTEMPTS = 5
_COLLISIONS = ("AST constructor recursion depth mismatch", "during ast construction")


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(source, filename)`, safe beside other threads; a `SyntaxError` is the source's own and raised as is."""
    for attempt in range(ATTEMPTS):
        try:
            with _LOCK:
                return ast.parse(source, filename)
        except (SystemError, RecursionError) as exc:
            if attempt == ATTEMPTS - 1 or not any(s in str(exc) for s in _COLLISIONS):
                raise
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises
