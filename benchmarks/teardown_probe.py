"""What a finished grading's kill costs its parent thread with and without starting a thread, beside busy threads.

Why: `parent.teardown` took ~1 ms or 11-30 ms per grading on the H200 (events/h200-grader-bench-2-22..2-24, either DSL),
and until grader 2.25 `Worker.kill(wait=False)` started a reaper thread per kill. `Thread.start()` returns only once
the new thread has run, which needs the GIL: each busy Python thread of the process can hold it for a switch interval
(5 ms). Grader 2.25 hands the worker to one reaper thread started with the first worker (`SimpleQueue.put`). This
prints both on this CPU, with 0, 1 and 2 threads spinning in Python beside the caller; it does not time a grading.

    python3 benchmarks/teardown_probe.py [--n 200]
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import threading
import time


def _spin(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(1000):
            x += 1


def _time(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
        time.sleep(0.002)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200, help="kills timed per case")
    a = ap.parse_args(argv)
    q: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=lambda: [q.get() for _ in iter(int, 1)], daemon=True).start()  # the one reaper, draining
    print(f"python {sys.version.split()[0]}, switch interval {sys.getswitchinterval() * 1e3:.0f} ms, {a.n} calls per case")
    for busy in (0, 1, 2):
        stop = threading.Event()
        spinners = [threading.Thread(target=_spin, args=(stop,), daemon=True) for _ in range(busy)]
        for t in spinners:
            t.start()
        time.sleep(0.05)
        start = _time(lambda: threading.Thread(target=lambda: None, daemon=True).start(), a.n)
        put = _time(lambda: q.put(object()), a.n)
        stop.set()
        for t in spinners:
            t.join()
        for name, xs in (("thread per kill (<= 2.24)", start), ("queue to one reaper (2.25)", put)):
            xs = sorted(xs)
            print(f"FIGURE {busy} busy threads, {name}: median {statistics.median(xs):.3f} ms, "
                  f"p90 {xs[int(0.9 * len(xs))]:.3f} ms, max {xs[-1]:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
