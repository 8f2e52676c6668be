"""The stream-window policy's pieces that run without a GPU: the side-work figure, the flush kinds, the policy id."""

from __future__ import annotations

import pytest

from mkb.measure import FLUSH_KIND, TIMING_POLICY, L2Flusher, side_work_us, summarize


def test_side_work_is_the_median_tail_beyond_an_empty_calls():
    assert side_work_us([10.0, 11.0, 12.0], [10.0, 11.0, 12.0]) == 0.0
    assert side_work_us([210.0, 211.0, 12.0], [10.0, 11.0, 12.0]) == pytest.approx(199.0)
    assert side_work_us([], [1.0]) == 0.0


def test_unknown_flush_kind_is_refused_with_a_hint():
    with pytest.raises(ValueError, match="hint"):
        L2Flusher("cpu", kind="bogus")


def test_the_policy_is_named_in_every_summary():
    t = summarize([1.0, 2.0, 3.0], tail_us_median=5.0)
    assert t.policy == TIMING_POLICY and t.tail_us_median == 5.0
    assert FLUSH_KIND in TIMING_POLICY
