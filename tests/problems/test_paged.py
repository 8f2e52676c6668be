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
