"""Claims across processes: 4 executors on one store, and runs SIGKILLed at random moments then resumed."""

from __future__ import annotations

import polars as pl

from mkb.events import read
from mkb.experiment._killtest import check, finish, kill_cycles, start


def test_four_processes_claim_each_coordinate_once(tmp_path):
    store = str(tmp_path / "s")
    procs = [start(store, sleep_s=0.1, ttl_s=5.0) for _ in range(4)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outs
    c = check(store)
    assert c.ok and c.claimed == c.coordinates == 40, c
    started = read("attempt_started", store)
    assert started.height == 40 and started["attempt_id"].n_unique() == 40
    # the work was shared: more than one process ran attempts
    writers = read("claim", store).filter(pl.col("action") == "claimed")["holder"].n_unique()
    assert writers >= 2


def test_sigkill_and_resume_five_times(tmp_path):
    store = str(tmp_path / "s")
    kill_cycles(store, cycles=5, seed=1, sleep_s=0.3, ttl_s=1.0, kill_after=(0.3, 2.0), log=lambda s: None)  # from the first attempt: a run takes ~3 s
    mid = check(store)
    finish(store, ttl_s=1.0)
    c = check(store)
    assert c.ok, c
    assert c.abandoned >= 1 and c.abandoned == c.claimed - c.finished  # killed attempts are kept, as abandoned
    assert c.abandoned >= mid.claimed - mid.finished - 0  # every attempt the kills cut short was found
    started = read("attempt_started", store)
    fin = read("attempt_finished", store)
    assert fin["attempt_id"].n_unique() == fin.height  # no attempt finished twice
    assert set(fin["attempt_id"]) <= set(started["attempt_id"])
