"""`one_cpu_thread`: input sets are made with one intra-op thread, the same values, and the pool restored after."""

from __future__ import annotations

import types

import pytest
import torch

from mkb.grader import _harness
from mkb.grader._config import GraderConfig
from mkb.measure import one_cpu_thread
from mkb.problems import get_problem
from mkb.problems.paged import pool_indices


@pytest.fixture
def three_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # the suite runs with OMP_NUM_THREADS=1, where the context would have nothing to do
    yield
    torch.set_num_threads(before)


def test_one_thread_inside_and_the_pool_restored_after(three_threads):
    with one_cpu_thread():
        assert torch.get_num_threads() == 1
        with one_cpu_thread():  # nested: still one, and the outer restore is the one that counts
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 3


def test_the_pool_is_restored_when_the_body_raises(three_threads):
    with pytest.raises(RuntimeError, match="make failed"):
        with one_cpu_thread():
            raise RuntimeError("make failed")
    assert torch.get_num_threads() == 3


def test_a_rebound_torch_attribute_is_not_what_it_calls(three_threads, monkeypatch):
    """Bound at import: a kernel that rebinds torch.set_num_threads learns nothing of when sets are made."""
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    with one_cpu_thread():
        pass
    assert calls == []
    assert torch.get_num_threads() == 3


def test_page_orders_and_a_paged_problem_s_sets_are_the_same_with_one_thread(three_threads):
    """Problem 1's page order is a CPU randperm per draw, the work that made its sets slow on a busy host."""
    many = pool_indices(1234, 68237, 58966)
    with one_cpu_thread():
        one = pool_indices(1234, 68237, 58966)
    assert torch.equal(many, one)
    prob = get_problem(1)
    many_set = prob.make_inputs(7, device="cpu", size="smoke")
    with one_cpu_thread():
        one_set = prob.make_inputs(7, device="cpu", size="smoke")
    assert len(many_set) == len(one_set)
    for a, b in zip(many_set, one_set):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_the_worker_makes_every_set_with_one_thread_and_gives_the_pool_back(three_threads):
    seen = []

    def make_inputs(seed, *, device, size):
        seen.append(torch.get_num_threads())
        return (torch.full((4,), float(seed)),)

    mod = types.SimpleNamespace(make_inputs=make_inputs)
    make = _harness._maker(mod, _harness._Device("cpu"), GraderConfig(device="cpu", size="smoke"))
    assert torch.equal(make(5)[0], torch.full((4,), 5.0))
    make(6)
    assert seen == [1, 1]
    assert torch.get_num_threads() == 3
