"""Turns a DSL compiler exception into a few short `file:line: message` lines an agent can act on.

Why: both DSLs raise errors wrapped in ANSI colours, caret snippets, MLIR dumps, generated CUDA
source and internal stack frames; pages of that waste an agent's context and hide the one line
that matters. We keep the candidate's own frames and the first meaningful lines of the message.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# lines that are noise for an agent: MLIR locations and ops, generated source, banners, tracebacks
_NOISE = re.compile(
    r"^\s*(loc\(|#loc|%\w+ = |\"?builtin\.module|module attributes|func\.func|cuda_|extern \"C\"|__global__|"
    r"#include|#define|\}|\{|//|Traceback|File \"|\^+\s*$|-+\s*$|=+\s*$|\d+:\s|💥|Stack trace|\[bt\])"
)
# markers after which the rest is a source dump or a backtrace
_CUT_AFTER = ("Generated CUDA", "CUDA source:", "Source code:", "Stack trace:", "\n#include")
# TVM's device-compiler failures put the whole generated source first, then the compiler's log
_LOG_AFTER = ("\nCompilation error:\n", "NVRTC compilation failed:\n")
_LOCATION_PATTERNS = (
    re.compile(r"-->\s*(?P<file>[^:\s]+):(?P<line>\d+)(?::\d+)?"),  # TVMScript diagnostics
    re.compile(r"File \"(?P<file>[^\"]+)\", line (?P<line>\d+)"),
    re.compile(r"(?P<file>[\w./-]+\.py):(?P<line>\d+)"),
)
MAX_LINES = 8
MAX_CHARS = 300


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


_SNIPPET = re.compile(r"^(\d+)\s*\|")
_CARET_OR_BAR = re.compile(r"^\|\s*[\^~-]*\s*$|^-->\s")


def _message_lines(text: str, line: int | None = None) -> list[str]:
    text = strip_ansi(text)
    compiler_log = False
    for marker in _LOG_AFTER:
        i = text.find(marker)
        if i >= 0:
            text = marker.strip() + "\n" + text[i + len(marker) :]
            compiler_log = True
    for marker in _CUT_AFTER:
        i = text.find(marker)
        if i > 0:
            text = text[:i]
    out: list[str] = []
    lineno = line
    for raw in text.splitlines():
        line = raw.strip()
        if not line or _NOISE.match(line) or _CARET_OR_BAR.match(line):
            continue
        m = _SNIPPET.match(line)
        if m and (lineno is None or int(m.group(1)) != lineno):
            continue
        if len(line) > MAX_CHARS:
            line = line[: MAX_CHARS - 3] + "..."
        if line not in out:
            out.append(line)
    if compiler_log:
        errors = [ln for ln in out[1:] if "error" in ln.lower()]
        out = out[:1] + (errors or out[1:])
    return out


def _candidate_line(exc: BaseException, path: Path) -> int | None:
    """The deepest line of the candidate's file in the traceback, else one named in the message."""
    name = path.name
    text = strip_ansi(str(exc))
    # a DSL diagnostic's own location (`--> kernel.py:LINE`) is more precise than the frame that called the compiler
    for m in _LOCATION_PATTERNS[0].finditer(text):
        if Path(m.group("file")).name == name:
            return int(m.group("line"))
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).name == name:
            line = frame.lineno
    if line is not None:
        return line
    for pat in _LOCATION_PATTERNS[1:]:
        for m in pat.finditer(text):
            if Path(m.group("file")).name == name:
                return int(m.group("line"))
    return None


def format_exception(exc: BaseException, path: Path, *, max_lines: int = MAX_LINES) -> tuple[str, ...]:
    """Short, ANSI-free `kernel.py:LINE: Type: message` lines for one exception (and its cause)."""
    name = path.name
    line = _candidate_line(exc, path)
    chain: list[BaseException] = [exc]
    cause = exc.__cause__ or exc.__context__
    if cause is not None and cause is not exc:
        chain.append(cause)
    lines: list[str] = []
    for e in chain:
        body = _message_lines(str(e), line) or [""]
        head = f"{name}:{line}: " if line is not None else f"{name}: "
        first = f"{head}{type(e).__name__}: {body[0]}".rstrip(": ")
        lines.append(first)
        lines.extend(f"  {b}" for b in body[1:])
        if line is None:
            line = _candidate_line(e, path)
    lines = [ln if len(ln) <= MAX_CHARS else ln[: MAX_CHARS - 3] + "..." for ln in lines]
    if len(lines) > max_lines:
        lines = lines[: max_lines - 1] + [f"  ... ({len(lines) - max_lines + 1} more lines)"]
    return tuple(lines)
