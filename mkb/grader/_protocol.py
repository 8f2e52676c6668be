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


class LineReader:
    """Reads JSON lines from a pipe with a deadline; EOF and timeouts are reported, never raised."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""
        self.eof = False
        self.bad_lines: list[str] = []

    def read(self, deadline: float) -> dict | None | str:
        """The next message, "eof", or "timeout" at `deadline` (time.monotonic())."""
        while True:
            if b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                try:
                    msg = json.loads(line)
                except ValueError:
                    self.bad_lines.append(line[:500].decode(errors="replace"))
                    continue
                if isinstance(msg, dict):
                    return msg
                self.bad_lines.append(line[:500].decode(errors="replace"))
                continue
            if self.eof:
                return "eof"
            left = deadline - time.monotonic()
            if left <= 0:  # one look at the pipe first: a deadline already passed polls (a worker's yield point)
                r, _, _ = select.select([self.fd], [], [], 0)
                if not r:
                    return "timeout"
                left = 0.0
            r, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if r:
                chunk = os.read(self.fd, 1 << 16)
                if not chunk:
                    self.eof = True
                else:
                    self.buf += chunk
