"""Parses Python source into an AST correctly from many threads at once (every `ast.parse` in mkb goes through here).

Why: before CPython 3.12.2 / 3.11.8 the AST constructor keeps its recursion counter in interpreter-wide state, so two
threads parsing at once (a grading queue's producers, the precompiler's slots, agents run in threads) can corrupt
each other's count; one of them then raises `SystemError: AST constructor recursion depth mismatch` (or a false
`RecursionError`) on a kernel that is fine, and a correct kernel would fail its static check (python/cpython#106905;
CI hit it on 3.11.7). A lock makes mkb's own parses take turns. Parses outside mkb still run beside them (3.11's
traceback formatting parses source lines for its carets; a library may parse), so a parse that collides with one is
made again after a short pause: the source is unchanged and the collision is not its fault. A source that really
nests too deeply to parse is a `SyntaxError` of that source, not a failure of the caller.
"""

from __future__ import annotations

import ast
import threading
import time

_LOCK = threading.Lock()
ATTEMPTS = 5
_COLLISIONS = ("AST constructor recursion depth mismatch", "during ast construction")


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(source, filename)`, safe beside other threads; raises only `SyntaxError` for the source's own faults
    (too deep a nesting included)."""
    for attempt in range(ATTEMPTS):
        try:
            with _LOCK:
                return ast.parse(source, filename)
        except (SystemError, RecursionError) as exc:
            if attempt < ATTEMPTS - 1 and any(s in str(exc) for s in _COLLISIONS):
                time.sleep(0.002 * (attempt + 1))  # let the parse outside mkb it collided with end
                continue
            if isinstance(exc, RecursionError):
                raise _too_deep(filename, exc) from exc
            raise
        except MemoryError as exc:  # the parser's own stack ran out ("source too complex")
            raise _too_deep(filename, exc) from exc
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def _too_deep(filename: str, exc: BaseException) -> SyntaxError:
    err = SyntaxError(f"the source nests too deeply to parse ({type(exc).__name__}: {exc})")
    err.filename, err.lineno = filename, 1
    return err
