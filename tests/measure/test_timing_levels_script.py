"""The GPU experiment's table in benchmarks/timing_repeatability.py separates arms (hold, placement, hold length) and
puts each arm's spread where it is: between processes or between the reps of one process."""

from __future__ import annotations

import random


def _grading(kernel: str, level: float, *, placement: str = "fixed", hold_us: float = 300.0, rep: int = 0,
             rng: random.Random) -> dict:
    times = [level * (1 + rng.gauss(0, 0.002)) for _ in range(100)]
    return {"kernel": kernel, "hold": "hold", "placement": placement, "hold_us": hold_us, "rep": rep,
            "median_us": sorted(times)[50], "times_us": times, "tail_us_median": 1.0, "input_sets": 110, "out_addrs": 1}


def _result(gradings_per_process: list[list[dict]], hold_us: list[float]) -> dict:
    procs = [{"process": i, "grader_hold": {"grid": 264, "block": 1024, "cycles": 1}, "quiet_error": None, "wall_s": 20.0,
              "gradings": gs} for i, gs in enumerate(gradings_per_process)]
    return {"args": {"hold_us": hold_us}, "processes": procs, "errors": [], "elapsed_s": 60.0}


def test_a_level_per_process_under_fixed_placement_and_none_under_jitter_show_as_such(repo_script, capsys) -> None:
    tr = repo_script("benchmarks/timing_repeatability.py")
    rng = random.Random(1)
    procs = []
    for level in (20.0, 20.8, 20.4):  # the process's level, seen by both of its fixed-placement reps
        procs.append([_grading("25/cute", level, rep=r, rng=rng) for r in range(2)]
                     + [_grading("25/cute", 20.4, placement="jitter", rep=r, rng=rng) for r in range(2)])
    tr.summarise(_result(procs, [300.0]))
    rows = {line.split()[1]: line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("25/cute")}
    assert set(rows) == {"hold", "hold+jitter"}
    sd_process_means = {arm: float(r[6].rstrip("%")) for arm, r in rows.items()}
    assert sd_process_means["hold"] > 1.0  # 20.0 / 20.8 / 20.4: sd 2% of the mean
    assert sd_process_means["hold+jitter"] < 0.2


def test_several_hold_lengths_are_separate_arms_and_an_old_result_still_prints(repo_script, capsys) -> None:
    tr = repo_script("benchmarks/timing_repeatability.py")
    rng = random.Random(2)
    procs = [[_grading("28/cute", 82.0 + 0.4 * (us > 200), hold_us=us, rep=r, rng=rng) for us in (150.0, 600.0)
              for r in range(2)] for _ in range(2)]
    tr.summarise(_result(procs, [150.0, 600.0]))
    arms = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("28/cute")]
    assert arms == ["hold@150", "hold@600"]
    old = _result(procs[:1], [300.0])
    old["args"]["hold_us"] = 300.0  # before --hold-us took several lengths
    for g in old["processes"][0]["gradings"]:
        del g["placement"], g["hold_us"]
    old["processes"][0]["jiterator_hold"] = old["processes"][0].pop("grader_hold")
    tr.summarise(old)
    assert "jiterator" in capsys.readouterr().out


def test_the_repeat_section_reads_the_shipped_gradings_by_policy(repo_script, capsys) -> None:
    """`--section repeat` over the committed datasets: per timing policy, today's baseline files' shipped-config gradings
    (A/B arms left out: an arm's verdict records its config overrides)."""
    from pathlib import Path

    tr = repo_script("benchmarks/timing_repeatability.py")
    tr.section_repeat(Path(tr.__file__).resolve().parents[1] / "events")
    rows = {tuple(line.split()[:3]): line.split() for line in capsys.readouterr().out.splitlines()
            if line.startswith(("v4 ", "v5 "))}
    n_v5_28 = int(rows[("v5", "28", "cute")][3])
    assert n_v5_28 >= 9  # h200-checks-ab-v5's A gradings (not its B arm), h200-grader-2-6's two, the bench's
    assert ("v4", "25", "cute") in rows
    for r in rows.values():  # "k/n": k gradings of n within 0.5% of their median
        k, n = map(int, r[-1].split("/"))
        assert n == int(r[3]) and 0 <= k <= n
