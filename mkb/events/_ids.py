"""Event ids: uuid7 (RFC 9562), time-ordered so files and rows sort by creation time."""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def uuid7() -> str:
    """A new uuid7 string, monotonic within this process.

    Python < 3.14 has no uuid.uuid7; this follows RFC 9562 method 1 (a 12-bit counter in rand_a,
    re-seeded each millisecond) so ids written in the same millisecond still sort in order.
    """
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms, _counter = ms, int.from_bytes(os.urandom(2), "big") & 0x7FF
        else:
            _counter += 1
            if _counter > 0xFFF:  # counter overflow: borrow the next millisecond
                _last_ms, _counter = _last_ms + 1, 0
            ms = _last_ms
        rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
        value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | _counter << 64 | 0b10 << 62 | rand_b
    return str(uuid.UUID(int=value))
