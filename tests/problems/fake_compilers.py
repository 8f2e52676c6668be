"""Fake torch.compile stand-ins for the torch.compile characterisation's tests (resolved by name in spawned workers).

The behaviour per problem number comes from $MKB_FAKE_COMPILE (JSON {"28": "ok", ...}), which the workers inherit.
"""

from __future__ import annotations

import json
import os
import time


class FakeCompilerError(RuntimeError):
    """What the `raise` behaviour throws (its class must reach the event as error_class)."""


def _behaviour(fn) -> str:
    plan = json.loads(os.environ.get("MKB_FAKE_COMPILE", "{}"))
    meta = getattr(fn, "__globals__", {}).get("META")
    return plan.get(str(meta.number) if meta is not None else "warm", "ok")


def _timed_row_in(folder: str) -> bool:
    """Whether a recorded row has a median: a task whose timing windows ran (this busy task has no row yet)."""
    from pathlib import Path

    import pyarrow.parquet as pq

    for f in Path(folder).glob("*.parquet"):
        try:
            if any(m is not None for m in pq.read_table(f, columns=["median_us"]).column("median_us").to_pylist()):
                return True
        except OSError:  # a file being renamed into place: seen on the next poll
            continue
    return False


def _after_first_beat(limit_s: float = 120.0) -> None:
    """Wait (with $MKB_FAKE_DYNAMO_AFTER_BEAT set) until a busy compile has beaten once, so this task's timing windows
    come while that compile is alive: on a loaded 2-core CI machine the busy task's worker once started only after
    every other task had timed, and the overlap the test needs never happened."""
    if not os.environ.get("MKB_FAKE_DYNAMO_AFTER_BEAT"):
        return
    beats, end = os.environ.get("MKB_FAKE_HEARTBEAT", ""), time.monotonic() + limit_s
    while time.monotonic() < end and not (os.path.exists(beats) and os.path.getsize(beats) > 0):
        time.sleep(0.02)


def fake(fn, *, mode: str, backend: str):
    how = _behaviour(fn)
    if how == "raise":
        raise FakeCompilerError("the fake compiler refuses this graph")
    if how == "dynamo":  # the real torch.compile path, with the cheap eager backend
        from mkb.problems._torch_compile import torch_compile

        _after_first_beat()

        return torch_compile(fn, mode=mode, backend="eager")
    if how == "die":  # the process ends in the middle of the compile, as a segfault in a compiler would end it
        os._exit(3)
    if how == "oom":  # torch's own exception and message, as the CUDA caching allocator raises it
        import torch

        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 100.00 GiB "
                                     "of which 1.50 GiB is free. Including non-PyTorch memory, this process has 1.00 GiB "
                                     "memory in use.")
    if how == "wrong":
        return lambda *a: fn(*a) * 1.5 + 1.0
    if how in ("busy", "hang"):
        first = [True]

        def slow(*a):
            if first[0]:  # the first call is the compile (torch.compile is lazy)
                first[0] = False
                beats = os.environ.get("MKB_FAKE_HEARTBEAT")
                # busy at least until another task's timed row is in the store (so its timing windows ran while this
                # compile was alive, however slowly a loaded machine started them), or 120 s of active time
                until = os.environ.get("MKB_FAKE_BUSY_UNTIL_ROWS_IN")
                n, seen = 0, not until
                while how == "hang" or n < 1000 or (not seen and n < 12000):
                    time.sleep(0.01)  # 1000 x 10 ms of sleeps: ~10 s of active time, however long it is paused
                    n += 1
                    if not seen and n % 50 == 0:
                        seen = _timed_row_in(until)
                    if beats:
                        with open(beats, "a") as fh:
                            fh.write(f"{time.monotonic()}\n")
            return fn(*a)

        return slow
    return fn
