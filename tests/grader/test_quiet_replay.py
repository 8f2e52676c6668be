"""`replay_phases`: a run's record of the quiet rule, replayed, finds a timing phase beside another or a warm-up."""

from __future__ import annotations

import time

from fake_dsl import TORCH_BASELINE_28
from mkb.grader import GradeJob, GradingQueue
from mkb.grader._pool import quiet_for, replay_phases


def test_the_replay_names_every_break_of_the_rule():
    r = replay_phases([(1.0, "hold:timing", 1), (2.0, "hold:timing", 2), (3.0, "release", 1), (4.0, "go", 9),
                       (5.0, "release", 2), (6.0, "go", 8), (7.0, "hold:trusted_timing", 1), (8.0, "warmed", 8),
                       (9.0, "release", 1), (10.0, "prepare", 7), (11.0, "forgotten", 7), (12.0, "hold:timing", 3)])
    assert r.beside_timing == ("hold:timing of 2 at 2.000000 beside the hold of [1]",)
    assert r.go_beside_timing == ("go of 9 at 4.000000 beside the hold of [2]",)
    # 9 never warmed: the holds at 7 and 12 were entered beside its warm-up (8's ended at 8; 7 was forgotten)
    assert r.timing_phases == 4 and r.warm_ups_beside_timing == 2
    assert replay_phases([(1.0, "hold:timing", 1), (5.0, "hold:timing", 2)], since=2.0).beside_timing == ()
    torn = replay_phases([(1.0, "teardown", 5), (2.0, "hold:timing", 1), (3.0, "release", 1), (4.0, "reaped", 5),
                          (5.0, "hold:timing", 1)])
    assert torn.beside_teardown == 1 and torn.beside_timing == ()


def test_a_real_queue_run_replays_clean(tmp_path, fake_dsl, cpu_config, store):
    good = tmp_path / "good.py"
    good.write_text(TORCH_BASELINE_28)
    quiet = quiet_for("cpu:61")
    with GradingQueue(device="cpu:61", store=store, config=cpu_config, dsls=(fake_dsl,), depth=2) as q:
        q.pool.wait_warm(120)
        since = time.monotonic()
        verdicts = [f.result(300) for f in [q.submit(GradeJob(28, fake_dsl, good, experiment=e)) for e in "ABC"]]
    assert all(v.passed for v in verdicts), [v.message for v in verdicts]
    r = replay_phases(list(quiet.history), since=since)
    assert r.beside_timing == () and r.go_beside_timing == ()
    assert r.timing_phases >= 4  # the first grading's trusted timing, then each grading's timing loop
    events = [e for t, e, _ in quiet.history if t >= since]
    assert events.count("teardown") >= 3 and events.count("reaped") >= 3  # every graded worker's teardown recorded
