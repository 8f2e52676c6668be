"""Index structure for paged and ragged layouts: lengths, page tables, block tables, cu_seqlens.

Shapes depend only on `size`; the structure itself is drawn from a generator the problem seeds,
from a fixed key (`structure_rng(number, size)`: the same structure for every seed) or from the
value seed (redrawn on every draw, as upstream MetaKernelBench does). These helpers draw it on the
CPU and hand back plain Python lists or CPU tensors that a problem moves to its device. Pages are placed in a shuffled pool with
spare (unreferenced) pages, so a page table is never the identity and a kernel that ignores it
reads the wrong rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "PageTable",
    "structure_rng",
    "draw_lengths",
    "page_table",
    "cu_seqlens",
    "token_slots",
    "padded_slots",
    "random_cuts",
    "pool_indices",
]


def structure_rng(*key: int | str) -> np.random.Generator:
    """A generator seeded from a key: (problem number, size name) for a fixed structure, or include the seed."""
    words = [k if isinstance(k, int) else int.from_bytes(str(k).encode()[:8].ljust(8, b"\0"), "little") for k in key]
    return np.random.default_rng(words)


def draw_lengths(rng: np.random.Generator, n: int, lo: int, hi: int, *, distinct: bool = True) -> list[int]:
    """`n` lengths in [lo, hi], log-uniform (serving traffic mixes short and long requests).

    With `distinct`, the first two are forced apart so a batch never has equal lengths throughout.
    """
    if not 1 <= lo <= hi:
        raise ValueError(f"lengths need 1 <= lo <= hi, got lo={lo}, hi={hi}; hint: pass positive bounds")
    vals = np.exp(rng.uniform(math.log(lo), math.log(hi + 1), size=n)).astype(np.int64)
    vals = np.clip(vals, lo, hi)
    if distinct and n >= 2 and lo < hi and len(set(vals.tolist())) == 1:
        vals[0] = lo
        vals[-1] = hi
    return [int(v) for v in vals]


@dataclass(frozen=True)
class PageTable:
    """FlashInfer-style CSR page table (indptr/indices/last_page_len) and the equivalent vLLM block table.

    Sequence b owns pages indices[indptr[b]:indptr[b+1]] in order; token t of b lives in page
    indices[indptr[b] + t // page_size], row t % page_size. The block table holds the same page
    ids row by row, padded with `pad` (a valid page id that the sequence does not own).
    """

    page_size: int
    num_pages: int  # size of the page pool (pages referenced + spare)
    kv_lens: tuple[int, ...]
    indptr: tuple[int, ...]
    indices: tuple[int, ...]
    last_page_len: tuple[int, ...]
    block_table: tuple[tuple[int, ...], ...]
    pad: int

    @property
    def batch(self) -> int:
        return len(self.kv_lens)

    @property
    def max_pages(self) -> int:
        return max(len(r) for r in self.block_table)


def page_table(
    rng: np.random.Generator, kv_lens: list[int], page_size: int, *, spare: float = 0.25
) -> PageTable:
    """Place the pages of each sequence at random in a pool with `spare` extra unreferenced pages."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}; hint: FlashInfer uses 1 or 16-128")
    pages_per_seq = [max(1, -(-n // page_size)) for n in kv_lens]
    needed = sum(pages_per_seq)
    num_pages = needed + max(1, int(math.ceil(needed * spare)))
    pool = rng.permutation(num_pages)
    indptr = [0]
    for p in pages_per_seq:
        indptr.append(indptr[-1] + p)
    indices = [int(x) for x in pool[:needed]]
    last = [n - (p - 1) * page_size for n, p in zip(kv_lens, pages_per_seq)]
    pad = int(pool[needed])  # an unreferenced page: padding that a kernel must not read
    width = max(pages_per_seq)
    table = tuple(
        tuple(indices[indptr[b] : indptr[b + 1]] + [pad] * (width - pages_per_seq[b])) for b in range(len(kv_lens))
    )
    return PageTable(
        page_size=page_size,
        num_pages=num_pages,
        kv_lens=tuple(int(n) for n in kv_lens),
        indptr=tuple(indptr),
        indices=tuple(indices),
        last_page_len=tuple(int(x) for x in last),
        block_table=table,
        pad=pad,
    )


def cu_seqlens(lens: list[int]) -> list[int]:
    """Exclusive prefix sum with a leading 0 (FlashAttention cu_seqlens, FlashInfer qo_indptr)."""
    out = [0]
    for n in lens:
        out.append(out[-1] + int(n))
    return out


def token_slots(pt: PageTable) -> list[np.ndarray]:
    """Per sequence, the flat slot (page * page_size + row) of each of its tokens, in order."""
    out = []
    for b, n in enumerate(pt.kv_lens):
        t = np.arange(n)
        pages = np.asarray(pt.indices[pt.indptr[b] : pt.indptr[b + 1]], dtype=np.int64)
        out.append(pages[t // pt.page_size] * pt.page_size + t % pt.page_size)
    return out


def padded_slots(gen, num_slots: int, tokens: int, max_pad: int = 0):
    """int64 [tokens] distinct cache slots drawn from a pool of `num_slots`, the last 1..max_pad of them -1.

    vLLM's slot_mapping for a batch padded to a captured size (CUDA-graph padding): padding tokens
    have slot -1 and write nothing. `gen` is a torch.Generator (CPU) seeded by the caller.
    """
    import torch

    if tokens > num_slots:
        raise ValueError(f"{tokens} tokens need distinct slots but the pool has {num_slots}; hint: enlarge the pool")
    slots = torch.randperm(num_slots, generator=gen)[:tokens]
    if max_pad > 0:
        pads = int(torch.randint(1, max_pad + 1, (1,), generator=gen))
        slots[tokens - pads :] = -1
    return slots


def random_cuts(gen, total: int, parts: int):
    """int32 [parts] lengths >= 1 summing to `total`: `parts - 1` distinct cut points drawn uniformly.

    A batch of fixed total tokens whose split into requests changes with every draw (upstream's
    sequence cuts); `gen` is a torch.Generator (CPU) seeded by the caller.
    """
    import torch

    if not 1 <= parts <= total:
        raise ValueError(f"cannot cut {total} tokens into {parts} non-empty parts; hint: need 1 <= parts <= total")
    cuts = (torch.randperm(total - 1, generator=gen)[: parts - 1] + 1).sort().values
    bounds = torch.cat([torch.zeros(1, dtype=cuts.dtype), cuts, torch.full((1,), total, dtype=cuts.dtype)])
    return bounds.diff().to(torch.int32)


def pool_indices(seed: int, num_pages: int, nnz: int):
    """int32 [nnz] page ids: the first nnz entries of a random permutation of a pool of `num_pages`.

    Upstream MetaKernelBench's page assignment for captured FlashInfer traces, redrawn on every draw
    from the value seed (drawn on the CPU, so it is the same on every device).
    """
    import torch

    if nnz > num_pages:
        raise ValueError(f"{nnz} pages referenced but the pool has {num_pages}; hint: enlarge the pool")
    return torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))[:nnz].to(torch.int32)
