"""benchmarks/full_size_memory.py --audit: the live-bytes count it scales to the full size is right on the CPU."""

import pytest
import torch



@pytest.fixture
def fsm(repo_script):
    return repo_script("benchmarks/full_size_memory.py")


def test_live_bytes_counts_each_storage_once_while_it_lives(fsm):
    with fsm.LiveBytes() as live:
        a = torch.zeros(1000, dtype=torch.float32)  # 4000 B
        b = a * 2  # 4000 B
        v = b[:10]  # a view: no new storage
        a.add_(1)  # in place: no new storage
        assert live.current == 8000
        del b
        assert live.current == 8000  # the view keeps b's storage alive
        del v
        assert live.current == 4000
        c = torch.empty(3000, dtype=torch.float64)  # 24000 B
        assert live.current == 28000
        del a, c
    assert live.current == 0 and live.peak == 28000


def test_the_audit_peak_is_measured_at_the_probe_size_and_the_probe_is_removed(fsm):
    peak, probe_set, full_set, rep = fsm.audit_peak(50, fsm.AUDIT_PROBES[50])
    assert rep.ok, rep.failures()
    # at least the first set, the expectation (outputs and their fp64 anchors) and the fp64 anchor's inputs
    assert peak > 3 * probe_set and full_set > 2**33
    from mkb.problems import get_problem

    assert "probe" not in get_problem(50).module.SIZES


def test_audit_peak_refuses_a_problem_without_sizes(fsm):
    with pytest.raises(SystemExit, match="SIZES"):
        fsm.audit_peak(1, (1, 2))


def test_a_data_dependent_reference_gets_its_output_sizes_from_the_audit_probe(fsm):
    from mkb.problems import get_problem

    p = get_problem(50)
    full = p.make_inputs(0, device="meta", size="full")
    outs, approx = fsm._output_shapes(p, full)
    assert approx and "probe" not in p.module.SIZES
    t, h, i, e = p.module.SIZES["full"]
    # the three weight gradients are [E, I, H] / [E, H, I] fp32 at full size; scaled by the whole set's ratio, which
    # the probe's small index tensors move a little ("~" in the table)
    assert all(abs(n / (e * i * h) - 1) < 1e-3 for n in sorted(n for n, _, _, _ in outs)[-3:])
    assert all(size == 4 and is_float and mode == "allclose" for _, size, is_float, mode in outs)
