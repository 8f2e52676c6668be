"""The agent's tools (read/write/edit a file, bash, check, submit, finish), confined to one workspace.

Every result is text capped at 16 KiB (head and tail kept, a marker says how many bytes were
elided). File tools resolve paths inside the workspace, refuse anything that resolves outside it
(a symlink included) and refuse writes under `problem/` and `docs/` (read-only copies of the task
and the doc pack). bash and check run in the sandbox; submit grades a snapshot of kernel.py.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

RESULT_CAP_BYTES = 16 * 1024
BASH_TIMEOUT_CAP_S = 300.0
CHECK_TIMEOUT_S = 300.0
READ_ONLY_DIRS = ("problem", "docs")
KERNEL = "kernel.py"
SKILL = "SKILL.md"


def cap_text(text: str, cap: int = RESULT_CAP_BYTES) -> tuple[str, int, int]:
    """(text as the model sees it, full bytes, bytes elided): head and tail kept around one marker."""
    raw = text.encode(errors="replace")
    if len(raw) <= cap:
        return text, len(raw), 0
    marker_room = 80
    half = (cap - marker_room) // 2
    elided = len(raw) - 2 * half
    head = raw[:half].decode(errors="ignore")
    tail = raw[-half:].decode(errors="ignore")
    return f"{head}\n[... mkb: {elided} bytes elided ...]\n{tail}", len(raw), elided


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": properties, "required": required,
                                                            "additionalProperties": False}}}


_S = {"type": "string"}
_I = {"type": "integer"}
TOOL_SPECS: dict[str, dict] = {
    "read_file": _fn("read_file", "Read a text file in the workspace (paths are relative to it). offset/limit are line numbers (0-based) and a line count.",
                     {"path": _S, "offset": _I, "limit": _I}, ["path"]),
    "write_file": _fn("write_file", "Create or overwrite a file in the workspace (not under problem/ or docs/).", {"path": _S, "content": _S}, ["path", "content"]),
    "edit_file": _fn("edit_file", "Replace the one occurrence of `old` with `new` in a workspace file.", {"path": _S, "old": _S, "new": _S}, ["path", "old", "new"]),
    "bash": _fn("bash", "Run a bash command in the sandboxed workspace (no network, no GPU). timeout_s at most 300.",
                {"command": _S, "timeout_s": {"type": "number"}}, ["command"]),
    "check": _fn("check", "Free: static rules and a CPU compile of kernel.py (nothing runs on a GPU). Does not use a submission.", {}, []),
    "submit": _fn("submit", "Grade the current kernel.py on the GPU (uses one submission). Returns passed, reason, times and speedup.", {}, []),
    "finish": _fn("finish", "End the attempt now (kernel.py as it is is the final kernel).", {}, []),
}
MAIN_TOOLS = ("read_file", "write_file", "edit_file", "bash", "check", "submit", "finish")
CLOSING_TOOLS = ("write_file",)


def toolset(names: tuple[str, ...]) -> list[dict]:
    return [TOOL_SPECS[n] for n in names]


def toolset_sha256(names: tuple[str, ...]) -> str:
    return hashlib.sha256(json.dumps(toolset(names), sort_keys=True).encode()).hexdigest()


class ToolError(Exception):
    """A refused or failed call; its message is what the model sees."""


@dataclass
class ToolOutcome:
    result: str
    ok: bool = True
    exit_code: int | None = None
    counted: bool = False
    finish: bool = False
    queue_wait_s: float | None = None
    evaluation_id: str | None = None
    verdict: Any = None
    sandboxed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def resolve_in(workspace: Path, path: str, *, write: bool) -> Path:
    """The real path of `path` inside `workspace`, or ToolError (outside, through a symlink, or read-only)."""
    if not isinstance(path, str) or not path.strip():
        raise ToolError("path must be a non-empty string")
    if "\x00" in path:
        raise ToolError("path contains a NUL byte")
    ws = workspace.resolve()
    p = Path(path)
    if p.is_absolute():
        for prefix in ("/workspace", str(ws)):
            if p == Path(prefix) or p.is_relative_to(prefix):
                p = p.relative_to(prefix)
                break
        else:
            raise ToolError(f"{path}: outside the workspace (paths are relative to it)")
    full = (ws / p).resolve()
    if not full.is_relative_to(ws) or full == ws and write:
        raise ToolError(f"{path}: resolves outside the workspace (symlinks cannot leave it)")
    rel = full.relative_to(ws)
    if write and rel.parts and rel.parts[0] in READ_ONLY_DIRS:
        raise ToolError(f"{path}: {rel.parts[0]}/ is read-only")
    return full


class ToolBox:
    """The tools of one attempt. `submit_fn` grades a snapshot path and returns a ToolOutcome."""

    def __init__(self, workspace: Path, *, sandbox: Any, check_fn: Callable[[], ToolOutcome], submit_fn: Callable[[], ToolOutcome],
                 on_write: Callable[[Path], None] | None = None) -> None:
        self.workspace = Path(workspace).resolve()
        self.sandbox = sandbox
        self.check_fn = check_fn
        self.submit_fn = submit_fn
        self.on_write = on_write or (lambda p: None)
        self.frozen: set[str] = set()  # paths write tools refuse (kernel.py during the closing turn)
        self.write_only: str | None = None  # the one path write tools accept (SKILL.md during the closing turn)

    def call(self, name: str, arguments: str, *, allowed: tuple[str, ...]) -> ToolOutcome:
        """Run one call; every failure becomes an error result the model sees (never an exception)."""
        if name not in allowed:
            known = name in TOOL_SPECS
            return ToolOutcome(f"error: {'tool not available now' if known else 'unknown tool'}: {name!r}; available: {', '.join(allowed)}", ok=False)
        try:
            args = json.loads(arguments) if arguments and arguments.strip() else {}
        except (json.JSONDecodeError, TypeError) as exc:
            return ToolOutcome(f"error: arguments are not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc}); send a JSON object", ok=False)
        if not isinstance(args, dict):
            return ToolOutcome("error: arguments must be a JSON object", ok=False)
        try:
            return getattr(self, f"_t_{name}")(**args)
        except ToolError as exc:
            return ToolOutcome(f"error: {exc}", ok=False)
        except TypeError as exc:
            return ToolOutcome(f"error: bad arguments for {name}: {exc}", ok=False)
        except (OSError, UnicodeError, ValueError) as exc:
            return ToolOutcome(f"error: {name}: {exc}", ok=False)

    def _t_read_file(self, path: str, offset: int = 0, limit: int | None = None) -> ToolOutcome:
        p = resolve_in(self.workspace, path, write=False)
        if not p.is_file():
            raise ToolError(f"{path}: no such file")
        with p.open("rb") as f:
            data = f.read(64 << 20)  # a model-written multi-GB file is read no further than this
        lines = data.decode(errors="replace").splitlines(keepends=True)
        offset = max(0, int(offset or 0))
        chunk = lines[offset: offset + int(limit)] if limit is not None else lines[offset:]
        return ToolOutcome("".join(chunk) if chunk else "(empty)")

    def _write_target(self, path: str) -> Path:
        p = resolve_in(self.workspace, path, write=True)
        rel = p.relative_to(self.workspace).as_posix()
        if rel in self.frozen:
            raise ToolError(f"{rel} is frozen now")
        if self.write_only is not None and rel != self.write_only:
            raise ToolError(f"only {self.write_only} can be written now")
        return p

    def _t_write_file(self, path: str, content: str) -> ToolOutcome:
        if not isinstance(content, str):
            raise ToolError("content must be a string")
        p = self._write_target(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink():
            p.unlink()  # writing through a link could leave the workspace
        p.write_text(content)
        self.on_write(p)
        return ToolOutcome(f"wrote {len(content.encode())} bytes to {p.relative_to(self.workspace)}")

    def _t_edit_file(self, path: str, old: str, new: str) -> ToolOutcome:
        p = self._write_target(path)
        if not p.is_file():
            raise ToolError(f"{path}: no such file")
        text = p.read_text()
        n = text.count(old) if old else 0
        if n != 1:
            raise ToolError(f"{path}: `old` occurs {n} times (must occur exactly once)")
        p.write_text(text.replace(old, new, 1))
        self.on_write(p)
        return ToolOutcome(f"edited {p.relative_to(self.workspace)}")

    def _t_bash(self, command: str, timeout_s: float = 120.0) -> ToolOutcome:
        if not isinstance(command, str):
            raise ToolError("command must be a string")
        timeout_s = min(float(timeout_s), BASH_TIMEOUT_CAP_S)
        r = self.sandbox.run(command, timeout_s=timeout_s)
        head = "" if r.exit_code == 0 else (f"[exit {r.exit_code}]\n" if r.exit_code is not None else "[killed at the time limit]\n")
        return ToolOutcome(head + (r.output or "(no output)"), ok=r.exit_code == 0, exit_code=r.exit_code, sandboxed=not self.sandbox.unsafe)

    def _t_check(self) -> ToolOutcome:
        return self.check_fn()

    def _t_submit(self) -> ToolOutcome:
        return self.submit_fn()

    def _t_finish(self) -> ToolOutcome:
        return ToolOutcome("finishing: kernel.py as it is now is the final kernel", finish=True)


def snapshot(kernel: Path, folder: Path, index: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / f"{index:03d}_kernel.py"
    shutil.copyfile(kernel, dest)
    return dest


def monotonic() -> float:
    return time.monotonic()
