"""Event ids: uuid7 (RFC 9562), time-ordered so files and rows sort by creation time."""

from __future__ import annotations

import os
import random
import threading
import time

_lock = threading.Lock()
_last_ms = 0
_counter = 0
_rng = random.Random(os.urandom(32))


def _reseed() -> None:
    # a forked child must not repeat its parent's random tail
    global _rng, _last_ms, _counter, _lock
    _rng, _last_ms, _counter, _lock = random.Random(os.urandom(32)), 0, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed)


def uuid7() -> str:
    """A new uuid7 string, monotonic within this process.

    Python < 3.14 has no uuid.uuid7; this follows RFC 9562 method 1 (a 12-bit counter in rand_a,
    re-seeded each millisecond) so ids written in the same millisecond still sort in order. The
    62 random bits come from a per-process generator seeded from os.urandom (and re-seeded in a
    forked child): ids need to be unique, not secret, and a syscall per id halved emit throughput.
    """
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms, _counter = ms, _rng.getrandbits(11)
        else:
            _counter += 1
            if _counter > 0xFFF:  # counter overflow: borrow the next millisecond
                _last_ms, _counter = _last_ms + 1, 0
            ms = _last_ms
        rand_b = _rng.getrandbits(62)
        value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | _counter << 64 | 0b10 << 62 | rand_b
    h = f"{value:032x}"  # str(uuid.UUID(int=...)) costs 3x more
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def uuid7_time(value: str) -> float | None:
    """Creation time (epoch seconds) of a uuid7 string, or None when it is not one; file names are uuid7s, so a file's age is in its name."""
    h = value.replace("-", "")[:32]
    if len(h) != 32 or h[12] != "7":
        return None
    try:
        return int(h[:12], 16) / 1000
    except ValueError:
        return None
