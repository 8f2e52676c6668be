"""The A/B comparison of scripts/gpu_checks_ab.py (issue #9's unchanged-median evidence) judges what it should."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import gpu_checks_ab as ab  # noqa: E402


def _v(us: float, *, passed: bool = True, calls: int = 100) -> dict:
    return {"passed": passed, "median_us": us, "timed_calls": calls, "n_timed_planned": 100}


def test_the_b_mean_is_compared_with_the_a_mean_and_each_arm_has_its_spread() -> None:
    (r,) = ab.compare({"28/cute": {"A1": _v(100.0), "B1": _v(100.4), "B2": _v(100.6), "A2": _v(100.2)}})
    assert r["all_passed"] and r["full_calls"]
    assert abs(r["a_vs_b"] - 0.4 / 100.1) < 1e-12
    assert abs(r["a1_vs_a2"] - 0.002) < 1e-12 and abs(r["b1_vs_b2"] - 0.2 / 100.4) < 1e-12
    assert r["within_tol"]


def test_the_first_runs_b_tag_reads_as_b1() -> None:
    (r,) = ab.compare({"28/cute": {"A1": _v(100.0), "B": _v(100.4), "A2": _v(100.2)}})
    assert abs(r["a_vs_b"] - 0.3 / 100.1) < 1e-12 and r["b1_vs_b2"] is None


def test_a_median_moved_by_more_than_half_a_percent_is_outside() -> None:
    (r,) = ab.compare({"25/tirx": {"A1": _v(20.0), "B": _v(20.2), "A2": _v(20.0)}})
    assert abs(r["a_vs_b"] - 0.01) < 1e-12
    assert not r["within_tol"]


def test_a_failed_or_missing_grading_is_never_within_tolerance() -> None:
    rows = ab.compare({"1/cute": {"A1": _v(10.0), "B1": _v(10.0, passed=False), "A2": _v(10.0)},
                       "1/tirx": {"A1": _v(10.0), "A2": _v(10.0)}})
    assert [r["all_passed"] for r in rows] == [False, False]
    assert [r["within_tol"] for r in rows] == [False, False]


def test_an_early_stop_on_a_baseline_is_reported() -> None:
    (r,) = ab.compare({"53/tirx": {"A1": _v(10.0, calls=51), "B": _v(10.0), "A2": _v(10.0)}})
    assert not r["full_calls"]


def test_without_the_second_pass_b_is_compared_with_a1() -> None:
    (r,) = ab.compare({"72/cute": {"A1": _v(300.0), "B1": _v(301.0)}})
    assert r["all_passed"] and r["a1_vs_a2"] is None
    assert abs(r["a_vs_b"] - 1.0 / 300.0) < 1e-12 and r["within_tol"]


def test_a_config_records_only_what_differs_from_the_shipped_one() -> None:
    from mkb.grader import GraderConfig

    assert GraderConfig().overrides() == {}
    assert GraderConfig(early_stop=False, n_profiled=0).overrides() == {"early_stop": False, "n_profiled": 0}


def test_the_within_arm_spreads_are_set_beside_an_earlier_runs() -> None:
    new = ab.compare({"28/cute": {"A1": _v(82.0), "B1": _v(82.1), "B2": _v(82.0), "A2": _v(82.082)},
                      "25/cute": {"A1": _v(20.6), "B1": _v(20.6), "B2": _v(20.64), "A2": _v(20.62)},
                      "72/cute": {"A1": _v(290.0), "B1": _v(290.0, passed=False), "B2": _v(290.0), "A2": _v(290.0)}})
    old = ab.compare({"28/cute": {"A1": _v(82.29), "B1": _v(83.42), "B2": _v(83.36), "A2": _v(83.33)},
                      "25/cute": {"A1": _v(20.64), "B1": _v(21.57), "B2": _v(21.47), "A2": _v(21.12)},
                      "1/cute": {"A1": _v(102.0), "B1": _v(103.4), "B2": _v(102.5), "A2": _v(102.7)}})
    res = ab.against(new, old)
    assert [r["key"] for r in res["rows"]] == ["28/cute", "25/cute"]  # a failed grading has no spread; 1 is not in new
    r28 = res["rows"][0]
    assert r28["new"] == [pytest.approx(0.001), pytest.approx(0.1 / 82.1)]
    assert r28["old"] == [pytest.approx(1.04 / 82.29), pytest.approx(0.06 / 83.42)]
    assert res["new"]["pairs"] == res["old"]["pairs"] == 4
    assert res["new"]["within_0_5pct"] == 4 and res["old"]["within_0_5pct"] == 2
    assert res["new"]["median"] < res["old"]["median"]


def test_the_report_reads_two_summaries_without_a_gpu(tmp_path, capsys) -> None:
    import json

    rows = {"28/cute": {"A1": _v(82.0), "B1": _v(82.1), "B2": _v(82.0), "A2": _v(82.5)}}
    for name in ("new", "old"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"compare": ab.compare(rows)}))
    assert ab.main(["--report", str(tmp_path / "new.json"), "--against", str(tmp_path / "old.json")]) == 0
    out = capsys.readouterr().out
    assert "SPREAD 28/cute" in out and "SPREAD new: 2 pairs" in out and "1 within 0.5%" in out
    with pytest.raises(SystemExit):
        ab.main(["--report", str(tmp_path / "new.json")])


def test_rounds_are_abba_repeated_so_each_arm_opens_a_pass_equally_often() -> None:
    assert ab.tags(1) == [("A1", "B1"), ("B2", "A2")]
    order = ab.tags(2)
    assert order == [("A1", "B1"), ("B2", "A2"), ("A3", "B3"), ("B4", "A4")]
    assert sum(p[0][0] == "A" for p in order) == sum(p[0][0] == "B" for p in order)


def test_with_two_rounds_every_grading_counts_and_the_difference_gets_a_standard_error() -> None:
    a = [100.0, 100.2, 100.1, 99.9]
    b = [100.3, 100.5, 100.4, 100.2]
    rows = {"28/cute": {**{f"A{i + 1}": _v(x) for i, x in enumerate(a)}, **{f"B{i + 1}": _v(x) for i, x in enumerate(b)}}}
    (r,) = ab.compare(rows)
    assert r["a_us"] == a and r["b_us"] == b  # in tag order, A10 after A9 would sort the same way
    assert r["a_vs_b"] == pytest.approx(0.3 / 100.05)
    sd = (sum((x - 100.05) ** 2 for x in a) / 3) ** 0.5 / 100.05
    assert r["sd_a"] == pytest.approx(sd)
    pooled = ((3 * r["sd_a"] ** 2 + 3 * r["sd_b"] ** 2) / 6) ** 0.5
    assert r["a_vs_b_se"] == pytest.approx(pooled * 0.5 ** 0.5)


def test_one_grading_per_arm_has_no_spread_and_no_standard_error() -> None:
    (r,) = ab.compare({"72/cute": {"A1": _v(300.0), "B1": _v(301.0)}})
    assert r["sd_a"] is None and r["a_vs_b_se"] is None


def test_the_eager_arm_goes_first_so_the_shipped_arm_always_reads_the_cache() -> None:
    assert ab.tags(2, first="B") == [("B1", "A1"), ("A2", "B2"), ("B3", "A3"), ("A4", "B4")]


def test_the_eager_arm_grades_with_an_empty_cache_and_hands_what_it_measured_to_the_pools() -> None:
    from types import SimpleNamespace

    from mkb.grader._session import TrustedCache

    shared = TrustedCache()
    shared.put("eager-of-28", {"median_us": 1.0})
    pool = SimpleNamespace(trusted=shared)
    with ab._eager_here(pool, on=True):
        assert pool.trusted is not shared and pool.trusted.get("eager-of-28") is None  # the worker must time it
        pool.trusted.put("eager-of-28", {"median_us": 2.0})
        pool.trusted.put("eager-of-25", {"median_us": 3.0})
    assert pool.trusted is shared
    assert shared.get("eager-of-28") == {"median_us": 1.0}  # what was there stays
    assert shared.get("eager-of-25") == {"median_us": 3.0}  # what the eager arm measured is added
    with ab._eager_here(pool, on=False):
        assert pool.trusted is shared


def test_runs_of_one_arm_pair_pool_into_one_comparison_and_other_arms_are_refused() -> None:
    run1 = {"configs": {"A": {}, "B": {"n_profiled": 0}}, "versions": {"timing_policy": "p/v6"},
            "rows": {"1/tirx": {"A1": _v(100.0), "B1": _v(101.0)}}}
    run2 = {"configs": {"A": {"floor_hold_us": None}, "B": {"n_profiled": 0}}, "versions": {"timing_policy": "p/v6"}, "rows": {"1/tirx": {"A1": _v(102.0), "B1": _v(101.0), "B2": _v(101.0),
                                                                    "A2": _v(100.0)}}}
    (r,) = ab.pool_runs([run1, run2])
    assert r["a_us"] == [100.0, 102.0, 100.0] and r["b_us"] == [101.0, 101.0, 101.0]  # run 1's rounds first
    assert abs(r["a_vs_b"] - (101.0 - 302.0 / 3) / (302.0 / 3)) < 1e-12 and r["a_vs_b_se"] is not None
    assert r["a1_vs_a2"] == 0.02  # the first two A gradings: run 1's, then run 2's first
    with pytest.raises(SystemExit, match="different configurations"):
        ab.pool_runs([run1, {**run2, "configs": {"A": {}, "B": {"set_first_pass": "make"}}}])
    with pytest.raises(SystemExit, match="grader versions"):  # one arm pair, but another grader
        ab.pool_runs([{**run1, "versions": {"mkb_grader": "2.8", "timing_policy": "p/v6"}},
                      {**run2, "versions": {"mkb_grader": "2.9", "timing_policy": "p/v6"}}])
    with pytest.raises(SystemExit, match="does not say which timing policy"):  # never pooled blindly
        ab.pool_runs([run1, {**run2, "versions": {}}])


def test_across_graders_pools_versions_of_one_timing_policy_and_still_refuses_another_policy() -> None:
    def run(grader: str, policy: str, a_us: float) -> dict:
        return {"configs": {"A": {}, "B": {"n_profiled": 0}}, "versions": {"mkb_grader": grader, "timing_policy": policy},
                "rows": {"1/tirx": {"A1": _v(a_us), "B1": _v(101.0)}}}

    (r,) = ab.pool_runs([run("2.8", "p/v6", 100.0), run("2.9", "p/v6", 102.0)], across_graders=True)
    assert r["a_us"] == [100.0, 102.0] and r["b_us"] == [101.0, 101.0]
    with pytest.raises(SystemExit, match="timing policies"):
        ab.pool_runs([run("2.8", "p/v5", 100.0), run("2.9", "p/v6", 102.0)], across_graders=True)
    with pytest.raises(SystemExit, match="different configurations"):  # the arms still have to be one pair
        ab.pool_runs([run("2.8", "p/v6", 100.0), {**run("2.9", "p/v6", 102.0), "configs": {"A": {}, "B": {"early_stop": False}}}],
                     across_graders=True)


@pytest.mark.parametrize("arm", sorted(ab.B_ARMS))
def test_every_b_arm_is_a_valid_config_that_differs_from_the_shipped_one_or_is_the_eager_arm(arm) -> None:
    from mkb.grader import GraderConfig

    cfg = GraderConfig(**ab.B_ARMS[arm])
    assert (cfg.overrides() == ab.B_ARMS[arm]) or arm == "allocate"  # allocate is the default since grader 2.8
    assert arm != "eager" or cfg.overrides() == {}


def test_a_summary_that_is_missing_torn_or_of_another_script_is_named_in_one_line(tmp_path) -> None:
    with pytest.raises(SystemExit, match=r"--pool .*missing.json: cannot read it"):
        ab.read_summary(str(tmp_path / "missing.json"), "--pool")
    torn = tmp_path / "torn.json"
    torn.write_text('{"rows": {')
    with pytest.raises(SystemExit, match="torn.json: cannot read it"):
        ab.read_summary(str(torn), "--against")
    other = tmp_path / "other.json"
    other.write_text('{"serial": {}}')
    with pytest.raises(SystemExit, match="not a gpu_checks_ab summary"):
        ab.read_summary(str(other), "--report")
    with pytest.raises(SystemExit, match="no `rows`"):
        ab.read_summary(str(other), "--pool", needs="rows")


def test_a_summary_without_a_recorded_policy_gets_the_one_its_timing_events_name(tmp_path) -> None:
    ds = Path(ab.__file__).resolve().parents[1] / "events" / "h200-checks-ab-v6b"  # committed, graded under grader 2.8
    summary = json.loads((ds / "logs" / "summary.json").read_text())
    assert not summary["versions"].get("timing_policy")  # a run from before grader 2.9
    policy = ab.policy_of_store(str(ds / "logs" / "summary.json"), summary)
    assert policy.endswith("/preallocated-sets/v6")
    foreign = {"rows": {"1/tirx": {"A1": {**_v(1.0), "evaluation_id": "not-in-this-store"}}}}
    with pytest.raises(SystemExit, match="name none; hint: pool the summary.json that sits in its dataset"):
        ab.policy_of_store(str(ds / "logs" / "summary.json"), foreign)
    with pytest.raises(SystemExit, match="timing events in .* name none"):  # a summary outside any dataset
        (tmp_path / "logs").mkdir()
        ab.policy_of_store(str(tmp_path / "logs" / "summary.json"), summary)


def test_the_arms_effect_is_read_over_the_baselines_that_only_work_on_the_device() -> None:
    rows = ab.compare({"1/cute": {"A1": _v(100.0), "B1": _v(101.0), "B2": _v(101.0), "A2": _v(100.0)},
                       "28/cute": {"A1": _v(80.0), "B1": _v(79.6), "B2": _v(79.6), "A2": _v(80.0)},
                       "23/cute": {"A1": _v(100.0), "B1": _v(200.0), "B2": _v(200.0), "A2": _v(100.0)},
                       "72/cute": {"A1": _v(290.0), "B1": _v(290.0)}})
    e = ab.arm_effect(rows, {"1/cute": 0, "28/cute": 0, "23/cute": 3})
    assert e["baselines"] == 2 and e["left_out_host"] == ["23/cute"] and e["left_out_unknown"] == ["72/cute"]
    assert abs(e["mean"] - (0.01 - 0.005) / 2) < 1e-12  # 23's doubling is not in it
    assert abs(e["se"] - 0.0075) < 1e-12  # +1% and -0.5%: sd 0.015 / sqrt(2), over sqrt(2) baselines
    assert not e["within_tol"]  # |0.25%| + 2 x 0.75% reaches past 0.5%
    assert ab.arm_effect(rows, {}) is None  # nothing known to be device-only: no effect claimed
    failed = ab.compare({"1/cute": {"A1": _v(100.0), "B1": _v(100.0, passed=False)},
                         "28/cute": {"A1": _v(80.0), "B1": _v(80.0), "B2": _v(80.0), "A2": _v(80.0)}})
    e2 = ab.arm_effect(failed, {"1/cute": 0, "28/cute": 0})
    assert e2["baselines"] == 1 and e2["left_out_failed"] == ["1/cute"] and e2["mean"] == 0.0
    assert ab.arm_effect(failed[:1], {"1/cute": 0}) is None


def test_the_host_reads_come_from_the_summarys_dataset() -> None:
    ds = Path(ab.__file__).resolve().parents[1] / "events" / "h200-checks-ab-clockwarm"  # committed, grader 2.23
    summary = json.loads((ds / "logs" / "summary.json").read_text())
    host = ab.host_reading(str(ds / "logs" / "summary.json"), summary)
    assert set(host) == set(summary["rows"])
    assert host["23/cute"] > 0 and host["23/tirx"] > 0 and host["28/cute"] == 0 and host["72/tirx"] == 0
    assert ab.host_reading("/nonexistent/logs/summary.json", summary) == {}
