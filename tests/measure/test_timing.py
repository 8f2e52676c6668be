"""Timing policy on the CPU path (CUDA timing is covered by the gpu-marked test) and the input stream."""

from __future__ import annotations

import pytest
import torch

from mkb.measure import InputStream, speed_of_light, summarize, time_calls, time_problem_fn, gpu_state, gpu_peaks


def test_summary_statistics_match_their_definitions():
    t = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert t.median_us == 3.0
    assert t.iqr_us == pytest.approx(4.0 - 2.0)
    assert t.cv == pytest.approx(torch.tensor([1.0, 2, 3, 4, 100]).std().item() / 22.0)
    assert t.n_timed == 5


def test_warmups_are_not_timed_and_every_timed_call_is_reported():
    calls, seen = [], []
    t = time_calls(lambda x: calls.append(x), lambda i: (i,), warmup=10, timed=50, device="cpu",
                   on_timed=lambda k, r, a: seen.append((k, a[0])))
    assert len(calls) == 60 and t.n_timed == 50 and t.n_warmup == 10
    assert seen[0] == (0, 10) and seen[-1] == (49, 59)
    assert t.clock == "perf_counter"


def _make(seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1000, generator=g),)


def test_every_call_gets_fresh_values_and_fresh_addresses_when_the_pool_fits():
    s = InputStream(_make, n_calls=20)
    assert s.premade and s.capacity == 20
    ptrs = {s(i)[0].data_ptr() for i in range(20)}
    firsts = {float(s(i)[0][0]) for i in range(20)}
    assert len(ptrs) == 20 and len(firsts) == 20


def test_a_bounded_ring_still_gives_fresh_values_and_never_repeats_recent_addresses():
    s = InputStream(_make, n_calls=200, max_bytes=4 * 4000)  # room for 4 sets of 4000 bytes
    assert s.capacity == 4 and not s.premade
    history, values = [], set()
    for i in range(200):
        x = s(i)[0]
        assert x.data_ptr() not in history[-3:]
        history.append(x.data_ptr())
        values.add(float(x[0]))
    assert len(values) == 200


def _recording_make(calls: list, alive: list):
    import weakref

    def make(seed):
        calls.append((seed, sum(r() is not None for r in alive)))  # the seed, and how many earlier sets still live
        x = _make(seed)
        alive.append(weakref.ref(x[0]))
        return x
    return make


@pytest.mark.parametrize("n_calls,max_bytes,cap", [(20, None, 20), (200, 4 * 4000, 4)])
def test_recycled_sets_are_made_once_dropped_and_made_again(monkeypatch, n_calls, max_bytes, cap):
    """Policy v5 (an A/B arm since v6): the first `capacity` sets are made, all dropped, then made again from the same seeds."""
    import mkb.measure._timing as timing

    monkeypatch.setattr(timing, "_on_cuda", lambda inputs: True)  # the placement step runs only for GPU tensors
    calls, alive = [], []
    s = InputStream(_recording_make(calls, alive), n_calls=n_calls, base_seed=50, max_bytes=max_bytes, first_pass="make")
    assert s.recycled and s.capacity == cap
    seeds = [c[0] for c in calls]
    once = list(range(50, 50 + cap))
    assert seeds[:cap] == once and seeds[cap] == 50  # made once, then again from the first seed
    assert seeds[cap:] == (once if s.premade else [50])
    assert calls[cap][1] == 0, "every set of the first pass is dropped before the second pass starts"
    for i in range(min(n_calls, 6)):
        assert torch.equal(s(i)[0], _make(50 + i)[0])  # the values are the seeds', whichever pass made them


@pytest.mark.parametrize("recycle,expected", [(True, 20), (False, 19)])
def test_new_segments_counts_what_the_timed_sets_took(monkeypatch, recycle, expected):
    """The window is the making of the sets that are timed: the second pass when recycled, after the first set if not."""
    import mkb.measure._timing as timing

    count = [0]

    def make(seed):
        count[0] += 1  # a stand-in allocator that creates one segment per set
        return _make(seed)

    monkeypatch.setattr(timing, "_on_cuda", lambda inputs: True)
    monkeypatch.setattr(timing, "_segments_allocated", lambda: count[0])
    s = InputStream(make, n_calls=20, first_pass="make" if recycle else None)
    assert s.new_segments == expected and count[0] == (40 if recycle else 20)
    assert s.first_pass_new_segments == (20 if recycle else 1)  # the first set and the first pass, before the timed sets


def test_new_segments_is_none_off_the_gpu():
    s = InputStream(_make, n_calls=5)
    assert s.new_segments is None and s.first_pass_new_segments is None


def test_an_allocating_first_pass_makes_each_set_once_into_dropped_blocks(monkeypatch):
    """Policy v6, the default: the first set is made, `capacity` blank copies of it allocated, all dropped, then the sets made."""
    import mkb.measure._timing as timing

    monkeypatch.setattr(timing, "_on_cuda", lambda inputs: True)
    calls, alive = [], []
    s = InputStream(_recording_make(calls, alive), n_calls=10, base_seed=3)
    assert s.recycled and [c[0] for c in calls] == [3] + list(range(3, 13))
    assert calls[1][1] == 0, "the first set and the blanks are dropped before the sets are made"
    assert torch.equal(s(4)[0], _make(7)[0])
    with pytest.raises(ValueError, match="first_pass"):
        InputStream(_make, n_calls=3, first_pass="twice")


def test_cpu_sets_are_made_once():
    calls, alive = [], []
    s = InputStream(_recording_make(calls, alive), n_calls=20, base_seed=7)
    assert not s.recycled and [c[0] for c in calls] == list(range(7, 27))
    assert not InputStream(_make, n_calls=3, first_pass=None).recycled


def test_inputs_made_splits_the_phase_and_reads_the_allocators_counters(monkeypatch):
    """What tells problem 1's slow `timing_inputs` from its fast ones: the seconds of the first pass and of the sets,
    the CPU seconds, and the allocator's mallocs, frees and retries over the construction (None off the GPU)."""
    import time as _time

    import mkb.measure._timing as timing

    s = InputStream(_make, n_calls=6, base_seed=1)
    m = s.made
    assert m.sets_made == 6 and m.device_mallocs is None and m.device_frees is None and m.alloc_retries is None
    assert m.first_pass_s >= 0 and m.make_s >= 0 and m.cpu_s >= 0

    counters = {"device_mallocs": 10, "device_frees": 2, "alloc_retries": 0}

    def make(seed):  # a stand-in allocator: each set takes one malloc; the fourth set ran out and freed the cache
        counters["device_mallocs"] += 1
        if seed == 4:
            counters["device_frees"] += 7
            counters["alloc_retries"] += 1
        _time.sleep(0.03)  # off the CPU: wall time the CPU seconds do not see
        return _make(seed)

    monkeypatch.setattr(timing, "_on_cuda", lambda inputs: True)
    monkeypatch.setattr(timing, "_allocator_counts", lambda: dict(counters))
    s = InputStream(make, n_calls=5, base_seed=1)  # "allocate": the first set, blanks, then sets 1..5 made again
    m = s.made
    assert m.sets_made == 6 and m.device_mallocs == 6 and m.device_frees == 7 and m.alloc_retries == 1
    assert m.first_pass_s >= 0.06 and m.make_s >= 0.12  # two sets before the timed ones are made, four after
    assert m.cpu_s < m.first_pass_s + m.make_s - 0.1
    d = m.as_dict()
    assert set(d) == {"first_pass_s", "make_s", "sets_made", "cpu_s", "device_mallocs", "device_frees", "alloc_retries"}

    monkeypatch.setattr(timing, "_allocator_counts", lambda: None)  # a torch without the counters: none, no failure
    assert InputStream(make, n_calls=2).made.device_frees is None


@pytest.mark.gpu
def test_gpu_recycled_sets_lie_in_blocks_the_allocator_already_had():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    torch.cuda.empty_cache()
    seen: dict = {}

    def make(seed):
        if seed == 0 and "first" in seen:  # the second pass begins: the first pass's blocks are cached, not freed
            seen["reserved_before_second"] = torch.cuda.memory_reserved()
        seen.setdefault("first", True)
        g = torch.Generator(device="cuda").manual_seed(seed)
        return (torch.randn(3_000_000, device="cuda", generator=g), torch.randn(1000, device="cuda", generator=g))

    s = InputStream(make, n_calls=30, base_seed=0)
    assert s.recycled and s.premade
    assert torch.cuda.memory_reserved() == seen["reserved_before_second"]  # no new segment for the timed sets
    assert s.new_segments == 0
    assert s.made.device_mallocs is not None and s.made.alloc_retries == 0 and s.made.sets_made == 31
    del s
    torch.cuda.empty_cache()
    fresh = InputStream(make, n_calls=30, base_seed=100, first_pass=None)
    assert fresh.new_segments and fresh.new_segments > 0  # fresh blocks: the state v5 avoids, and the figure says so


def test_time_problem_fn_times_a_function_on_cpu():
    t = time_problem_fn(lambda x: x * 2, _make, warmup=10, timed=50, device="cpu")
    assert t.n_timed == 50 and t.median_us > 0 and t.input_sets == 60


def test_speed_of_light_takes_the_binding_limit_of_compute_and_memory():
    sol = speed_of_light(flops=2 * 4096**3, bytes=3 * 4096 * 4096 * 2, peak="bf16_tc", gpu="NVIDIA H200")
    assert sol.bound == "compute" and sol.seconds == pytest.approx(2 * 4096**3 / 989e12)
    mem = speed_of_light(flops=6.0 * 14509 * 4096, bytes=3 * 14509 * 4096 * 2, peak="memory")
    assert mem.bound == "memory" and mem.us == pytest.approx(3 * 14509 * 4096 * 2 / 4.8e12 * 1e6)
    with pytest.raises(KeyError, match="hint"):
        gpu_peaks("Radeon 7900")
    with pytest.raises(ValueError, match="hint"):
        speed_of_light(flops=1, bytes=1, peak="int4_tc")


def test_gpu_state_degrades_gracefully_without_a_gpu():
    s = gpu_state()
    assert s.name
    if not torch.cuda.is_available():
        assert s.name == "cpu" and s.sm_clock_mhz is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_timing_follows_the_policy():
    t = time_problem_fn(lambda x: x * 2, lambda s: (torch.randn(1 << 20, device="cuda", generator=torch.Generator("cuda").manual_seed(s)),),
                        device="cuda")
    assert t.clock == "cuda_event" and t.l2_flushed and t.n_timed >= 50 and t.median_us > 0
    st = gpu_state()
    assert st.source in ("pynvml", "nvidia-smi", "torch")
