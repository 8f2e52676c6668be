"""The paged/ragged structure helpers give page tables a kernel cannot get right by ignoring them."""

from __future__ import annotations

import numpy as np

from mkb.problems.paged import cu_seqlens, draw_lengths, page_table, structure_rng, token_slots


def test_the_same_key_draws_the_same_structure_and_another_key_does_not():
    a = page_table(structure_rng(3, "full"), draw_lengths(structure_rng(3, "full"), 8, 10, 500), 16)
    b = page_table(structure_rng(3, "full"), draw_lengths(structure_rng(3, "full"), 8, 10, 500), 16)
    c = page_table(structure_rng(4, "full"), draw_lengths(structure_rng(4, "full"), 8, 10, 500), 16)
    assert a == b
    assert a != c


def test_page_table_reconstructs_every_length_and_is_not_the_identity():
    rng = structure_rng(1, "test")
    lens = draw_lengths(rng, 16, 1, 1000)
    for page_size in (1, 64):
        pt = page_table(rng, lens, page_size)
        for b, n in enumerate(lens):
            pages = pt.indptr[b + 1] - pt.indptr[b]
            assert (pages - 1) * page_size + pt.last_page_len[b] == n
            assert 1 <= pt.last_page_len[b] <= page_size
        assert list(pt.indices) != sorted(pt.indices)
        assert len(set(pt.indices)) == len(pt.indices)  # no page is shared
        assert pt.num_pages > len(pt.indices)  # spare pages exist


def test_block_table_rows_match_the_csr_table_and_pad_with_an_unowned_page():
    rng = structure_rng(2, "test")
    pt = page_table(rng, draw_lengths(rng, 6, 1, 300), 64)
    for b in range(pt.batch):
        own = pt.indices[pt.indptr[b] : pt.indptr[b + 1]]
        assert pt.block_table[b][: len(own)] == own
        assert all(p == pt.pad for p in pt.block_table[b][len(own) :])
    assert pt.pad not in pt.indices


def test_token_slots_cover_each_sequence_in_order_without_overlap():
    rng = structure_rng(5, "test")
    lens = draw_lengths(rng, 5, 1, 200)
    pt = page_table(rng, lens, 16)
    slots = token_slots(pt)
    assert [len(s) for s in slots] == lens
    flat = np.concatenate(slots)
    assert len(np.unique(flat)) == len(flat)
    assert flat.max() < pt.num_pages * pt.page_size


def test_lengths_stay_in_range_and_differ():
    lens = draw_lengths(structure_rng(7, "x"), 50, 3, 4096)
    assert min(lens) >= 3 and max(lens) <= 4096
    assert len(set(lens)) > 1
    assert cu_seqlens([3, 1, 4]) == [0, 3, 4, 8]


def test_padded_slots_are_distinct_with_a_padded_tail_and_change_with_the_seed():
    import torch

    from mkb.problems.paged import padded_slots

    a = padded_slots(torch.Generator().manual_seed(1), 64, 40, 8)
    b = padded_slots(torch.Generator().manual_seed(2), 64, 40, 8)
    assert a.dtype == torch.int64 and a.shape == (40,)
    real = a[a >= 0]
    pads = int((a < 0).sum())
    assert 1 <= pads <= 8 and bool((a[40 - pads :] == -1).all())  # padding only at the end
    assert len(set(real.tolist())) == real.numel() and int(real.max()) < 64
    assert not torch.equal(a, b)
    assert int((padded_slots(torch.Generator().manual_seed(1), 64, 40) < 0).sum()) == 0
    import pytest

    with pytest.raises(ValueError, match="hint"):
        padded_slots(torch.Generator(), 10, 11)


def test_random_cuts_sum_to_the_total_and_move_with_the_seed():
    import torch

    from mkb.problems.paged import random_cuts

    a = random_cuts(torch.Generator().manual_seed(3), 641, 3)
    b = random_cuts(torch.Generator().manual_seed(4), 641, 3)
    assert a.dtype == torch.int32 and int(a.sum()) == 641 and bool((a >= 1).all())
    assert not torch.equal(a, b)
    assert random_cuts(torch.Generator(), 5, 5).tolist() == [1] * 5


def test_pool_indices_are_distinct_pages_of_the_pool_redrawn_per_seed():
    from mkb.problems.paged import pool_indices

    a, b = pool_indices(0, 100, 60), pool_indices(1, 100, 60)
    assert len(set(a.tolist())) == 60 and int(a.max()) < 100
    assert a.tolist() != b.tolist() and a.tolist() == pool_indices(0, 100, 60).tolist()


def test_neox_rotation_preserves_the_norm_of_each_pair_and_matches_the_angle():
    import math

    import torch

    from mkb.problems.rope import cos_sin_cache, neox_rotate

    table = cos_sin_cache(16, 8, 10000.0)
    assert table.dtype == torch.bfloat16 and table.shape == (16, 8)
    x = torch.randn(3, 8, dtype=torch.float64)
    pos = 5
    cos, sin = table[pos, :4].double(), table[pos, 4:].double()
    y = neox_rotate(x, cos, sin)
    pairs_x = x[:, :4] ** 2 + x[:, 4:] ** 2
    pairs_y = y[:, :4] ** 2 + y[:, 4:] ** 2
    assert torch.allclose(pairs_x * (cos**2 + sin**2), pairs_y)
    assert abs(float(table[pos, 0]) - math.cos(pos)) < 1e-2  # the first frequency is 1


def test_gqa_decode_eager_agrees_with_the_reference_padded_and_per_sequence(monkeypatch):
    """The decode eager pads to one batch or, for very unequal lengths (the captured traces), runs per sequence."""
    import mkb.problems.gqa as gqa
    from mkb.measure import clone_inputs, compare, expect
    from mkb.problems import get_problem

    for number in (2, 3):
        p = get_problem(number)
        x = p.make_inputs(0, device="cpu", size="smoke")
        exp = expect(p.module, x)
        for pad_factor in (100.0, 0.0):
            monkeypatch.setattr(gqa, "PAD_FACTOR", pad_factor)
            y = clone_inputs(x)
            verdict = compare(exp, p.module.eager(*y), inputs_after=y, input_names=p.meta.inputs)
            assert verdict.ok, (number, pad_factor, verdict.message)
