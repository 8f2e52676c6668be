"""Benchmarks pacing's own cost: a reservation in the book, and a round trip to the cluster's pacing actor on Ray.

Run: `python benchmarks/pace_bench.py [--n 20000] [--ray]`.
- book: `PaceBook.reserve` + `settle` with a full window (rpm = n, so every reservation sees up to n entries), on a
  fake clock: the actor's work per request, which bounds how many requests per second one actor can pace.
- --ray: the same through `RayLimiter.acquire` against a local one-CPU Ray (start-up excluded): what an attempt pays
  per request beyond the wait itself (charged as backoff, with the wait).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mkb.agent._pace import PaceBook  # noqa: E402


def book(n: int) -> None:
    b = PaceBook(rpm=n, tpm=n * 1000, window_s=60.0)
    t0 = time.perf_counter()
    for i in range(n):
        r = b.reserve(i * (30.0 / n), 800)  # n requests in half a window: the window fills up
        b.settle(r.id, 500)
    full = time.perf_counter() - t0
    t0 = time.perf_counter()
    m = min(n, 2000)
    for i in range(m):  # the window is full: each one books past the end and drops what left
        r = b.reserve(30.0 + i * 1e-3, 800)
        b.settle(r.id, 500)
    past = time.perf_counter() - t0
    print(f"book: {n} reservations filling the window: {full / n * 1e6:.1f} us each; "
          f"{m} more past a full window of {n}: {past / m * 1e6:.1f} us each")


def ray_round_trip(n: int) -> None:
    import ray

    from mkb.experiment._fake import demo_config
    from mkb.experiment._ray_pace import ray_limiters, start_pacers

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        m = replace(demo_config("pace-bench").models[0], rpm=10 * n)  # never binding: measures the round trip alone
        pacers = start_pacers("pace-bench", [m])
        (lim,) = ray_limiters(pacers, "pace-bench").values()
        lim.acquire(1)  # warm
        rtts = []
        for _ in range(n):
            t0 = time.perf_counter()
            r, waited = lim.acquire(100)
            rtts.append(time.perf_counter() - t0)
            lim.settle(r, 80)
            assert waited == 0.0
        rtts.sort()
        print(f"ray: {n} acquire+settle through the actor: median {statistics.median(rtts) * 1e3:.2f} ms, "
              f"p99 {rtts[int(0.99 * (n - 1))] * 1e3:.2f} ms, {n / sum(rtts):.0f} requests/s from one caller")
    finally:
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--ray", action="store_true")
    a = ap.parse_args()
    book(a.n)
    if a.ray:
        ray_round_trip(min(a.n, 2000))


if __name__ == "__main__":
    main()
