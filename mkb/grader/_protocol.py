"""The worker <-> parent wire: one JSON object per line on a private pipe, stage and completion messages carrying a nonce.

Why a nonce: the candidate runs in the worker and can write to any of its file descriptors, so a
forged "passed" line (kernelbot's cheat-fd) must be told apart from the harness's own messages. The
nonce is sent with the job after the candidate-free warm start and never printed; a line without
it, or a worker that exits without the completion message, fails the evaluation.
"""

from __future__ import annotations

import json
import os
import select
import time
from typing import Any


def write_msg(fd: int, msg: dict[str, Any]) -> None:
    data = (json.dumps(msg, default=_default) + "\n").encode()
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _default(o: Any) -> Any:
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
    except ImportError:
        pass
    if isinstance(o, float) and o != o:
        return None
    return str(o)


LINE_MAX = 8 << 20
"""The longest line the parent reads as one message; the harness's own lines are kilobytes."""

BAD_LINES_KEPT = 20


class LineReader:
    """Reads JSON lines from a pipe with a deadline; EOF and timeouts are reported, never raised.

    The candidate can write to this pipe, so nothing it writes may hold the reader past the
    deadline: a passed deadline gets one look at the pipe (a reply already written is still read),
    and a line longer than LINE_MAX is dropped as a bad line rather than buffered without end.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        self.eof = False
        self.bad_lines: list[str] = []
        self.bad_count = 0
        self._skipping = False  # inside an over-long line: drop bytes up to its newline
        self._scanned = 0  # bytes of buf already known to hold no newline (a flood is scanned once)

    def _bad(self, line: bytes) -> None:
        self.bad_count += 1
        if len(self.bad_lines) < BAD_LINES_KEPT:
            self.bad_lines.append(line[:500].decode(errors="replace"))

    def read(self, deadline: float) -> dict | None | str:
        """The next message, "eof", or "timeout" at `deadline` (time.monotonic())."""
        polled = False
        while True:
            nl = self.buf.find(b"\n", self._scanned)
            if nl >= 0:
                line = bytes(self.buf[:nl])
                del self.buf[: nl + 1]
                self._scanned = 0
                if self._skipping:
                    self._skipping = False
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    self._bad(line)
                    continue
                if isinstance(msg, dict):
                    return msg
                self._bad(line)
                continue
            self._scanned = len(self.buf)
            if len(self.buf) > LINE_MAX:
                if not self._skipping:
                    self._bad(f"({len(self.buf)}+ bytes without a newline) ".encode() + bytes(self.buf[:400]))
                self._skipping = True
                self.buf.clear()
                self._scanned = 0
            if self.eof:
                return "eof"
            left = deadline - time.monotonic()
            if left <= 0:  # a passed deadline looks at the pipe once per call, never again
                if polled:
                    return "timeout"
                polled = True
                left = 0.0
            r, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if r:
                chunk = os.read(self.fd, 1 << 16)
                if not chunk:
                    self.eof = True
                else:
                    self.buf += chunk
