"""The DESIGN Definitions as computations: lift, relative lift, rates, standing, bootstrap CIs and tests."""

from __future__ import annotations

import functools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from mkb.analysis._tables import ENGINE, NOISE_ARM, _text

DEFAULT_SEED = 20261129
DEFAULT_RESAMPLES = 10_000
DETECT_LIFT = 0.10  # a cell whose relative-lift CI half-width exceeds this could not detect a 10% lift
ARM_ORDER = ("transfer", "placebo", "same", "wrong", NOISE_ARM)
_EPS = 1e-9
BLOCK_BYTES = 24 * 2**20  # resampled sums held at once by each bootstrap thread (bounds its memory at any number of cells)
# the buffers of the last `cluster_bootstrap_many`'s threads (~30 MiB a thread), taken by the next call's: a call's threads are
# new, and the buffers a thread made were given back to the system when it ended, then faulted in again by the next call's
# threads a page per 4 KiB (at 1M events ~40k page faults over the lift and contrast tables' three calls). Bounded: a set
# keeps only the kinds of buffer its last call used, and the sets kept hold at most SPARE_MAX_BYTES in all (a machine of
# many cores runs many threads a call; what is kept stays for the process's life, inside the analysis' 1 GiB)
_SPARE: list[dict] = []
SPARE_MAX_BYTES = 128 * 2**20


@dataclass(frozen=True)
class BootstrapSpec:
    """How CIs are computed; printed with every table so a result can be reproduced."""

    seed: int = DEFAULT_SEED
    resamples: int = DEFAULT_RESAMPLES
    level: float = 0.95

    def describe(self) -> str:
        return (f"{self.level:.0%} CIs: problem-clustered percentile bootstrap, {self.resamples} resamples, "
                f"seed {self.seed}")


@dataclass(frozen=True)
class Ratio:
    """The statistic (sums[num] - sums[sub]) / sums[den], NaN where the denominator is <= 0.

    Every ratio of the lift, contrast and two-part tables has this form, and saying so lets the bootstrap select
    its percentiles in float32. With integer sums whose resampled values stay below 2^24, numerator and
    denominator are exact in float32 and in float64, so each precision's value is the correctly rounded division
    of one exact quotient; rounding is monotone, so float32 values order the resamples as the float64 values do,
    up to ties. `_order_stats` brackets the tails in float32 and computes float64 values for the candidates only:
    the same float64 percentiles as a float64 pass over every resample, at a fraction of the memory traffic.
    """

    num: str
    den: str
    sub: str | None = None

    @property
    def operands(self) -> tuple[str, ...]:
        return tuple(x for x in (self.num, self.sub, self.den) if x is not None)

    def __call__(self, **sums):
        num = sums[self.num] if self.sub is None else sums[self.num] - sums[self.sub]
        return _ratio(num, sums[self.den])


def _cluster_weights(n: int, spec: BootstrapSpec, rng: np.random.Generator) -> np.ndarray:
    """[resamples, n] counts: how often each of n clusters is drawn in each resample."""
    return _cluster_counts(n, spec, rng).astype(np.float64)


def _cluster_counts(n: int, spec: BootstrapSpec, rng: np.random.Generator) -> np.ndarray:
    """`_cluster_weights` as integers (the bootstrap casts them once, to the dtype of its products)."""
    idx = rng.integers(0, n, size=(spec.resamples, n))
    idx += np.arange(spec.resamples)[:, None] * n  # each resample's draws in a range of its own, in place
    return np.bincount(idx.ravel(), minlength=spec.resamples * n).reshape(spec.resamples, n)


def _percentiles(x: np.ndarray, qs: list[float], *, exact=None) -> np.ndarray:
    """[len(qs), rows]: np.quantile(x, qs, axis=1) (method "linear") of a NaN-free [rows, resamples] array.

    The needed order statistics of each row (`_order_stats`), then numpy's own interpolation (`_lerp`)
    written out: the same values as np.quantile (a test checks). With `exact` (see `_order_stats`), x is a
    float32 stand-in and the percentiles are those of the float64 values `exact` gives.
    """
    x = np.ascontiguousarray(x)
    n = x.shape[1]
    virtual = (n - 1) * np.asarray(qs, dtype=np.float64)
    prev = np.floor(virtual)
    top = virtual >= n - 1
    prev[top] = -1.0  # numpy takes the maximum there (and its gamma then multiplies a zero difference)
    gamma = virtual - prev
    pi = prev.astype(np.intp) % n
    ni = np.where(top, -1, pi + 1) % n
    kth = np.unique(np.concatenate([pi, ni]))
    stats = _order_stats(x, kth, exact=exact)
    at = {int(k): i for i, k in enumerate(kth)}
    a, b = stats[[at[int(k)] for k in pi]], stats[[at[int(k)] for k in ni]]
    g = gamma[:, None]
    diff = b - a
    out = a + diff * g
    np.subtract(b, diff * (1 - g), out=out, where=np.broadcast_to(g >= 0.5, out.shape))
    return out


_PILOT = 500  # resamples that bracket a tail in `_order_stats`
_TAIL_CAP = 2500  # candidates per row and tail past which a row is selected in full (heavy ties)
_ROW_BLOCK = 128  # rows at a time: a block's values and masks stay in cache


def _order_stats(x: np.ndarray, ks: np.ndarray, *, exact=None) -> np.ndarray:
    """[len(ks), rows]: the k-th smallest value (0-based k) of each row of a NaN-free C-contiguous [rows, n] array, exact.

    A percentile CI needs a few order statistics in the two tails of each row, and a full selection
    (np.partition) costs ~30x a comparison per value. So each tail is bracketed by an order statistic of
    the first 500 resamples (independent draws like any other; one vectorised sort of them): one comparison
    pass finds the values beyond either bracket (~5% of a row each), and those alone are sorted, row by row
    (numpy's vectorised sort: several times cheaper than np.partition's selection of a few ranks). The bottom
    tail's k-th smallest is then read off the sorted candidates at k, the top tail's at k minus the values
    between the brackets; a row whose bracket holds too few values (probability ~1%) or too many (ties) is
    selected in full.

    `exact(positions)` -> the float64 values at these flat positions of x, when x holds float32 values that order
    the positions as those float64 values do, up to ties (x_i < x_j implies value_i <= value_j, and value_i <
    value_j implies x_i <= x_j: both correctly rounded from one exact quantity, see `Ratio`). Then x brackets the
    tails and selects among the candidates, and only the candidates from x's smallest to its largest wanted order
    statistic (its ties: usually one value of x at a few positions) are computed in float64: every candidate below that
    window is below each of its float64 values, so the k-th smallest float64 value of a row is read off the window's
    sorted float64 values at its place among the sorted candidates minus the count below. The result is the float64
    order statistics.
    """
    rows, n = x.shape
    ks = np.asarray(ks, dtype=np.intp)
    tail = np.minimum(ks, n - 1 - ks)
    if n < 8 * _PILOT or rows == 0 or tail.max() >= n // 20:  # a short row, or a rank far from both ends: select in full
        if not rows:
            return np.empty((len(ks), 0))
        full = x if exact is None else exact(np.arange(rows * n)).reshape(rows, n)
        return np.partition(full, ks, axis=1)[:, ks].T
    out = np.empty((len(ks), rows))
    for r0 in range(0, rows, _ROW_BLOCK):
        sub = None if exact is None else (lambda pos, off=r0 * n: exact(pos + off))
        out[:, r0:r0 + _ROW_BLOCK] = _order_stats_block(x[r0:r0 + _ROW_BLOCK], ks, exact=sub)
    return out


def _order_stats_block(x: np.ndarray, ks: np.ndarray, *, exact=None) -> np.ndarray:
    rows, n = x.shape
    out = np.empty((len(ks), rows))
    pilot = np.sort(x[:, :_PILOT], axis=1)  # a sort of 500 (vectorised) is ~8x cheaper than np.partition's selection of two
    tails = []  # (low, which ks, their depths from this tail's end, the bracket)
    for low in (True, False):
        sel = ks < n // 2 if low else ks >= n // 2
        if sel.any():
            depth = ks[sel] if low else n - 1 - ks[sel]
            r = min(_PILOT - 1, int(np.ceil(_PILOT * 1.8 * (depth.max() + 1) / n)) + 3)
            tails.append((low, sel, depth, pilot[:, r if low else _PILOT - 1 - r]))
    # both tails' candidates in one scan (row-major: each row's together); their count per row read off the sorted positions
    low0, _, _, b0 = tails[0]
    m = x <= b0[:, None] if low0 else x >= b0[:, None]
    if len(tails) == 2:
        m |= x >= tails[1][3][:, None]
    flat = np.flatnonzero(m)
    per_row = np.diff(np.searchsorted(flat, np.arange(rows + 1) * n))
    good = per_row <= len(tails) * _TAIL_CAP
    if len(tails) == 2:
        good &= tails[0][3] < tails[1][3]  # brackets apart (met, every resample is a candidate): the tails' are disjoint
    rs = np.flatnonzero(good)
    if len(rs):
        if len(rs) < rows:
            flat = flat[np.repeat(good, per_row)]
        cnt = per_row[rs]
        start = np.cumsum(cnt) - cnt
        W = int(cnt.max())
        # each row's candidates in a row of `pad` (+inf after them), then sorted: one vectorised sort of ~5-10% of the row
        pad = np.full((len(rs), W), np.inf, dtype=x.dtype)
        pad.ravel()[np.arange(flat.size) + np.repeat(np.arange(len(rs)) * W - start, cnt)] = x.ravel().take(flat)
        srt = np.sort(pad, axis=1)
        if len(tails) == 2:
            b_lo = tails[0][3][rs, None]
            c_lo = np.count_nonzero(srt <= b_lo, axis=1)  # b_lo < b_hi on these rows, so never +inf: the padding never counts
            counts = (c_lo, cnt - c_lo)
        else:
            counts = (cnt,)
        ok = np.ones(len(rs), bool)
        for (low, sel, depth, _), c in zip(tails, counts):
            ok &= (c > depth.max()) & (c <= _TAIL_CAP)
        if not ok.all():  # a bracket that holds too few or too many: those rows are selected in full below
            good[rs[~ok]] = False
            rs, cnt, start, pad, srt = rs[ok], cnt[ok], start[ok], pad[ok], srt[ok]
        for low, sel, depth, _ in tails:
            if not len(rs):
                break
            # [depths, rows]: the wanted order statistics' places among each row's sorted candidates
            pos = np.broadcast_to(depth[:, None] if low else cnt[None, :] - 1 - depth[:, None], (len(depth), len(rs)))
            got = np.take_along_axis(srt, pos.T, axis=1).T
            if exact is not None:
                # x orders the values as their float64 values do, up to ties: the wanted order statistics' float64 values are
                # among the candidates from x's smallest to its largest one wanted (below: how many sorted candidates precede
                # them), and only those are computed in float64 (usually one value of x, a few positions)
                lo_v, hi_v = got.min(0)[:, None], got.max(0)[:, None]
                below = _count_below(srt, pos.min(0), lo_v[:, 0])
                win = (pad >= lo_v) & (pad <= hi_v)
                if np.isinf(hi_v).any():  # the padding (+inf) too: only the candidates
                    win &= np.arange(W) < cnt[:, None]
                # row-major: each row's window together (a flat scan of the sparse mask: np.nonzero's two indices cost ~4x)
                wr, wc = np.divmod(np.flatnonzero(win), W)
                e = exact(flat[start[wr] + wc])
                order = np.lexsort((e, wr))  # by row, then value
                first = np.searchsorted(wr[order], np.arange(len(rs)))
                e = e[order]
                got = e[first[None, :] + pos - below[None, :]]
            out[np.ix_(np.flatnonzero(sel), rs)] = got
    bad = np.flatnonzero(~good)
    if len(bad):
        full = x[bad] if exact is None else exact((bad[:, None] * n + np.arange(n)).ravel()).reshape(len(bad), n)
        out[:, bad] = np.partition(full, ks, axis=1)[:, ks].T
    return out


def _count_below(srt: np.ndarray, at: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Per row of `srt` (each row sorted ascending, `srt[r, at[r]] == v[r]`): how many values are below v[r].

    Usually `at` itself (no tie just before it): read off one value a row, not counted over the row's candidates; a row
    whose value ties the one before is counted in full.
    """
    rows = np.arange(len(at))
    below = at.copy()
    tied = np.flatnonzero((at > 0) & (srt[rows, np.maximum(at - 1, 0)] >= v))
    if len(tied):
        below[tied] = np.count_nonzero(srt[tied] < v[tied, None], axis=1)
    return below


def _count_percentiles(counts: np.ndarray, n: int, qs: list[float], *, scratch: np.ndarray | None = None) -> np.ndarray:
    """[len(qs), rows]: np.quantile(counts / n, qs, axis=1) of a [rows, resamples] array of integers in 0..n.

    A share of problems resampled with replacement is a count over a fixed number n of drawn problems: small integers,
    so each row is sorted as bytes (numpy's stable sort of 8- and 16-bit integers is a radix sort: two passes, no
    comparison) and its order statistics read off by place: the same values as `_percentiles` (numpy's interpolation
    written out), several times faster than a partition. (A histogram per row, np.bincount over intp keys, moved 8 bytes
    a value through memory: ~1.6x the time of the byte sort.) `scratch`: a reused buffer of at least 2 x counts.size
    bytes (a fresh one costs a page fault per 4 KiB, more than the sorting).
    """
    rows, B = counts.shape
    # float32 counts are the exact (integer) products of the float32 path; float64 ones may carry rounding: rounded
    src = counts if counts.dtype == np.float32 else np.rint(counts)
    dtype = np.uint8 if n < 2**8 else np.uint16 if n < 2**16 else np.int64
    size = counts.size * np.dtype(dtype).itemsize
    buf = None if scratch is None else scratch.reshape(-1).view(np.uint8)
    if buf is None or buf.size < size or dtype is np.int64:
        c = np.empty((rows, B), dtype=dtype)
    else:
        c = buf[:size].view(dtype).reshape(rows, B)
    np.copyto(c, src, casting="unsafe")
    c.sort(axis=1, kind="stable")
    virtual = (B - 1) * np.asarray(qs, dtype=np.float64)
    prev = np.floor(virtual)
    top = virtual >= B - 1
    prev[top] = -1.0
    gamma = virtual - prev
    pi = np.where(top, B - 1, prev.astype(np.intp))
    ni = np.where(top, B - 1, pi + 1)
    out = np.empty((len(qs), rows))
    for i in range(len(qs)):
        a, b, g = c[:, pi[i]] / n, c[:, ni[i]] / n, gamma[i]  # the order statistics as shares
        diff = b - a
        out[i] = b - diff * (1 - g) if g >= 0.5 else a + diff * g
    return out


def cluster_bootstrap_many(cells: list, problems: np.ndarray, sums: dict[str, np.ndarray], stats: dict, spec: BootstrapSpec,
                           shares: dict | None = None):
    """Several statistics from the same resamples: {name: (estimate, lo, hi)}, each as `cluster_bootstrap` returns it.

    Every statistic sees exactly the resamples a separate `cluster_bootstrap` call with the same spec
    would draw (one generator per statistic, seeded alike), so sharing them changes no number. Cells whose
    present problems are the same share one resample matrix, applied to all their cells and sums in one
    matrix product. `shares` are statistics that are shares of problems: `f(**sums)` gives the count of
    drawn problems with the property (an integer), divided by the cell's number of present problems,
    which every resample draws exactly; their percentiles are counted, not partitioned. A statistic that is
    a `Ratio` of integer sums has its percentiles selected in float32 and read off in float64 (see `Ratio`).
    """
    shares = shares or {}
    C = len(cells)
    present = sums["n"] > 0
    totals = {k: v.sum(1) for k, v in sums.items()}
    n_present = present.sum(1)
    est = {name: stat(**totals) for name, stat in stats.items()}
    with np.errstate(divide="ignore", invalid="ignore"):
        est |= {name: np.where(n_present > 0, f(n_present=n_present, **totals) / np.maximum(n_present, 1), np.nan)
                for name, f in shares.items()}
    lo = {name: np.full(C, np.nan) for name in [*stats, *shares]}
    hi = {name: np.full(C, np.nan) for name in [*stats, *shares]}
    groups: dict[bytes, list[int]] = {}
    for c in range(C):
        groups.setdefault(present[c].tobytes(), []).append(c)
    a = (1 - spec.level) / 2
    rng = np.random.default_rng(spec.seed)
    names = list(sums)
    B = spec.resamples
    P = max(1, present.shape[1])
    big = {k: float(np.abs(m).max(initial=0.0)) for k, m in sums.items()}
    # float32 products when they are exact: integer-valued sums (S is a multiple of 20, the rest counts) whose every
    # partial sum over a resample (at most max|v| x problems, since a resample's counts add up to the problems) stays
    # below 2^24. Then every product equals the float64 one bit for bit, at a third of its cost.
    exact32 = all(np.array_equal(m, np.rint(m)) and big[k] * P < 2**24 for k, m in sums.items())
    # ratios selected in float32: their numerator (a difference of two such sums) exact in float32 too
    fast = {name: st for name, st in stats.items()
            if exact32 and _fast(st) and (big[st.num] + (big[st.sub] if st.sub else 0.0)) * P < 2**24}
    slow = {name: st for name, st in stats.items() if name not in fast}
    wide = bool(slow) or not exact32  # the resampled sums are needed in float64
    # cells in blocks, so the resampled sums stay under ~BLOCK_BYTES however many cells share these problems (the
    # draws are the group's, so blocking changes no number); blocks run on a thread per core (numpy releases the
    # GIL in its products, selections and element-wise loops), each with buffers reused for all its blocks:
    # fresh arrays of this size cost a page fault per 4 KiB, which took longer than filling them
    block = max(1, int(BLOCK_BYTES // (len(names) * spec.resamples * (8 if wide else 4))))
    local = threading.local()
    used: list[dict] = []  # the buffer sets this call's threads took: the next call's spares

    def run(cb: list[int], cols: np.ndarray, wt: np.ndarray) -> None:
        # a sum equal to an earlier one on these cells (the pairs with S_sol are often all of them: n_sol = n) is not
        # resampled again: it reads the earlier one's resampled rows
        sub = {k: sums[k][np.ix_(cb, cols)] for k in names}
        alias: dict[str, str] = {}
        for i, k in enumerate(names):
            alias[k] = next((j for j in names[:i] if alias[j] == j and np.array_equal(sub[j], sub[k])), k)
        own = [k for k in names if alias[k] == k]
        v = np.concatenate([sub[k] for k in own])  # [sums x cells, problems]
        rows = len(names) * block
        if not getattr(local, "ready", False):  # this thread's first block: its buffers, an earlier call's where there are
            local.ready = True
            try:
                spare = _SPARE.pop()
            except IndexError:
                spare = {}
            for kind, wanted in (("buf", wide), ("buf32", exact32), ("r32", fast), ("bins", shares)):
                if not wanted:  # an earlier call's kind this call does not use is given back, not carried on
                    spare.pop(kind, None)
            used.append(spare)
            local.buf = _buffer(spare, "buf", (rows, B), np.float64) if wide else None
            local.buf32 = _buffer(spare, "buf32", (rows, B), np.float32) if exact32 else None
            local.r32 = _buffer(spare, "r32", (block, B), np.float32) if fast else None
            local.bins = _buffer(spare, "bins", (2 * block * B,), np.uint8) if shares else None
        # one product for every sum and cell, laid out [cells, resamples] so each cell's resamples are contiguous for
        # the percentiles; the sums mkb passes are integer-valued (S is a multiple of 20, the rest counts), so every
        # product is exact and equals the former per-sum `w @ v.T` bit for bit
        k = len(cb)
        if exact32:
            summed32 = local.buf32[:v.shape[0]]
            np.matmul(v.astype(np.float32), wt, out=summed32)
            parts32 = {name: summed32[i * k:(i + 1) * k] for i, name in enumerate(own)}  # [cells, resamples] views
            parts32 |= {name: parts32[alias[name]] for name in names}
        if wide:
            summed = local.buf[:v.shape[0]]
            if exact32:
                summed[...] = summed32
            else:
                np.matmul(v, wt, out=summed)
            parts = {name: summed[i * k:(i + 1) * k] for i, name in enumerate(own)}
            parts |= {name: parts[alias[name]] for name in names}
        for name, stat in slow.items():
            lo[name][cb], hi[name][cb] = _ci_rows(np.asarray(stat(**parts)), a)  # the statistics are element-wise
        for name, st in fast.items():
            x = local.r32[:k]
            if st.sub is None:
                x[...] = parts32[st.num]
            else:
                np.subtract(parts32[st.num], parts32[st.sub], out=x)
            den = parts32[st.den]
            with np.errstate(divide="ignore", invalid="ignore"):
                np.divide(x, den, out=x)
            undefined = den.min(1) <= 0  # a cell with a resample whose ratio is undefined (NaN): float64 throughout
            q = np.empty((2, k))
            rs = np.flatnonzero(~undefined)
            if len(rs):
                def exact(pos, rs=rs, st=st, every=len(rs) == k):  # the float64 statistic at flat positions of x[rs]
                    at = pos if every else rs[pos // B] * B + pos % B
                    return st(**{n: parts32[n].reshape(-1).take(at).astype(np.float64) for n in st.operands})
                q[:, rs] = _percentiles(x if len(rs) == k else x[rs], [a, 1 - a], exact=exact)
            rs = np.flatnonzero(undefined)
            if len(rs):
                q[:, rs] = _ci_rows(np.asarray(st(**{n: parts32[n][rs].astype(np.float64) for n in st.operands})), a)
            lo[name][cb], hi[name][cb] = q[0], q[1]
        for name, f in shares.items():
            cnt = np.asarray(f(n_present=len(cols), **(parts32 if exact32 else parts)))  # [cells, resamples] integer counts
            q = _count_percentiles(cnt, len(cols), [a, 1 - a], scratch=local.bins)
            lo[name][cb], hi[name][cb] = q[0], q[1]

    workers = min(os.cpu_count() or 1, max(1, -(-C // block)))
    pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None
    # a thread per core runs the blocks: BLAS threads of its own inside each product would oversubscribe the cores
    # (OpenBLAS's spin-waiting threads cost ~10% of the bootstrap's CPU on 2 cores)
    limits = None
    if pool is not None:
        from threadpoolctl import threadpool_limits

        limits = threadpool_limits(limits=1, user_api="blas")
    try:
        for key in sorted(groups):
            cs = groups[key]
            cols = np.flatnonzero(present[cs[0]])
            if len(cols) < 2:
                continue
            w = _cluster_counts(len(cols), spec, rng)  # [resamples, problems], drawn in group order whatever the threads
            wt = np.ascontiguousarray(w.T, dtype=np.float32 if exact32 else np.float64)
            del w
            blocks = [cs[b0:b0 + block] for b0 in range(0, len(cs), block)]
            if pool is None or len(blocks) == 1:
                for cb in blocks:
                    run(cb, cols, wt)
            else:
                for f in [pool.submit(run, cb, cols, wt) for cb in blocks]:
                    f.result()
    finally:
        if pool is not None:
            pool.shutdown()
        if limits is not None:
            limits.restore_original_limits()
        _SPARE[:] = _within(used, SPARE_MAX_BYTES)  # the first of this call's sets, at most SPARE_MAX_BYTES in all
    return {name: (est[name], lo[name], hi[name]) for name in [*stats, *shares]}


def _within(sets: list[dict], limit: int) -> list[dict]:
    """The leading buffer sets whose bytes add up to at most `limit` (the rest are dropped to the allocator)."""
    kept, total = [], 0
    for spare in sets:
        total += sum(a.nbytes for a in spare.values())
        if total > limit:
            break
        kept.append(spare)
    return kept


def _buffer(spare: dict, name: str, shape: tuple, dtype) -> np.ndarray:
    """A [shape] array of `dtype` on the bytes of `spare[name]`, made (and kept there) when it holds too few."""
    n = math.prod(shape) * np.dtype(dtype).itemsize
    if name not in spare or spare[name].size < n:
        spare[name] = np.empty(n, dtype=np.uint8)
    return spare[name][:n].view(dtype).reshape(shape)


def _fast(stat) -> bool:
    """Whether a statistic may have its percentiles selected in float32 (a `Ratio`: see there)."""
    return isinstance(stat, Ratio)


def _ci_rows(boot: np.ndarray, a: float) -> np.ndarray:
    """[2, rows]: the (a, 1 - a) percentiles of each row of [rows, resamples] float64 statistics; a row undefined in
    every resample stays NaN (reported null), one undefined in some is read over the rest (no warnings filter: not
    thread-safe)."""
    nan = np.isnan(boot)
    if not nan.any():
        return _percentiles(boot, [a, 1 - a])
    q = np.full((2, boot.shape[0]), np.nan)
    some = ~nan.all(1)
    if some.any():
        with np.errstate(invalid="ignore"):
            q[:, some] = np.nanquantile(boot[some], [a, 1 - a], axis=1)
    return q


def cluster_bootstrap(cells: list, problems: np.ndarray, sums: dict[str, np.ndarray], stat, spec: BootstrapSpec):
    """Resample problems within each cell; `sums[name]` is [cells, problems]; `stat(**summed)` is element-wise.

    Cells whose present problems are the same share one set of resamples (one matrix product for all);
    a problem is present in a cell when `sums["n"]` is positive there.
    """
    return cluster_bootstrap_many(cells, problems, sums, {"stat": stat}, spec)["stat"]


def _matrices(df: pl.DataFrame, cell_cols: list[str], values: dict[str, pl.Expr]):
    """Sum `values` per cell and problem into dense [cells, problems] arrays."""
    return _dense(df.group_by(*cell_cols, "problem").agg(**values), cell_cols, list(values))


def _dense(agg: pl.DataFrame, cell_cols: list[str], names: list[str]):
    """[cells, problems] arrays of the columns `names` of a per-(cell, problem) table; cells sorted."""
    cells_df = agg.select(cell_cols).unique().sort(cell_cols)
    cells_df = cells_df.with_row_index("_cell")
    problems = np.sort(agg["problem"].unique().to_numpy())
    agg = agg.join(cells_df, on=cell_cols, how="left", nulls_equal=True)
    # each row's flat place in a [cells, problems] array: one index for every column (a 2-D fancy assignment cost ~8x)
    at = agg["_cell"].to_numpy().astype(np.intp) * len(problems) + np.searchsorted(problems, agg["problem"].to_numpy())
    out = {}
    for name in names:
        m = np.zeros((cells_df.height, len(problems)))
        m.reshape(-1)[at] = agg[name].to_numpy().astype(np.float64)
        out[name] = m
    return cells_df.drop("_cell"), problems, out


def _rel(SA, SB, n):
    return _ratio(SA - SB, SB)


def _mean_lift(SA, SB, n):
    with np.errstate(divide="ignore", invalid="ignore"):
        return (SA - SB) / n


def _ratio(num, den):
    """num / den, NaN where den <= 0 (one division and one masked fill: these run on [resamples, cells] arrays)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.divide(num, den)
    bad = den <= 0
    if np.ndim(out) and bad.any():
        out[bad] = np.nan
    elif not np.ndim(out) and bad:
        out = np.nan
    return out


POWER_Z = 1.959963984540054 + 0.8416212335729143  # two-sided 5% test at 80% power: z_0.975 + z_0.80
DETECT_HALFWIDTH = DETECT_LIFT * 1.959963984540054 / POWER_Z  # 95% CI half-width at which a 10% lift has 80% power


def lift_table(pairs: pl.DataFrame, *, by: tuple[str, ...] = (), spec: BootstrapSpec = BootstrapSpec(),
               tests: bool = True, pooled: bool = False) -> pl.DataFrame:
    """One row per cell (stratum x model x arm x direction [x by]): lift, relative lift with CIs, rates, tests.

    relative lift = (sum S_arm - sum S_solo) / sum S_solo; rates are shares of problems whose
    replicate-mean lift is < 0 (regression), > 0 (improvement) or 0 (tie), each with its problem-clustered
    CI, pair-level shares beside. The same lift in S_sol points (and S over torch.compile) where the store
    characterises the problems. `pooled` adds a row per model and arm pooled over directions (direction
    "pooled"; a problem's pairs from both directions form one cluster).
    """
    arm = pl.col("arm_kind") != NOISE_ARM
    if not pairs.select(arm.any()).item():  # solos alone (or arms without their solo): no cell to report
        return pl.DataFrame()
    arms = pairs.lazy().filter(arm)  # filtered inside each group-by's plan: no copy of the (2M-row) pairs
    out, per_problem = _lift_cells(arms, by=by, spec=spec, tests=tests)
    if pooled:
        # the pooled cell's labels in the pairs' own types (a categorical's 4 bytes a row, not text's 16, at 2M pairs)
        labels = {"direction": pl.lit("pooled", pairs.schema["direction"]), "source_dsl": pl.lit("*", pairs.schema["source_dsl"]),
                  "target_dsl": pl.lit("*", pairs.schema["target_dsl"])}
        pp = arms.with_columns(**labels)
        # a pooled cell's per-problem sums are its directions' sums added: exact, so the same numbers as grouping the pairs
        # again, when every score is integer-valued (S, S_sol: multiples of 20)
        exact = pairs.select(pl.all_horizontal((pl.col(c) == pl.col(c).round()).all(ignore_nulls=True)
                                               for c in ("S", "S_solo", "S_sol", "S_sol_solo"))).item()
        pool = _pooled_per_problem(per_problem, labels, by=by) if exact else None
        out = pl.concat([out, _lift_cells(pp, by=by, spec=spec, tests=tests, per_problem=pool)[0]], how="diagonal_relaxed")
    cell = ["stratum", "model", "arm_kind", "direction", "source_dsl", "target_dsl", *by]
    order = {k: i for i, k in enumerate(ARM_ORDER)}
    return _text(out).with_columns(_o=pl.col("arm_kind").replace_strict(order, default=99),
                            _p=pl.col("direction") == "pooled").sort("_o", "_p", *cell).drop("_o", "_p")


def _pooled_per_problem(per_problem: pl.DataFrame, labels: dict, *, by) -> pl.DataFrame:
    """The per-problem sums of the cells pooled over directions (`labels`: their direction and DSL columns), from those of
    the cells by direction (`_lift_cells`' second value): every column a sum over the pairs, added, and the mean lift
    their summed lift over their summed count, as polars' mean makes it. The same table as grouping the pooled pairs,
    to the bit, where the sums are exact (integer-valued scores)."""
    sums = [c for c in per_problem.columns if c not in (*labels, "stratum", "model", "arm_kind", *by, "problem", "mean_lift")]
    out = per_problem.group_by("stratum", "model", "arm_kind", *by, "problem").agg(pl.col(sums).sum())
    out = out.with_columns(mean_lift=pl.col("L") / pl.col("n"), **labels)
    return out.select(per_problem.columns).cast(per_problem.schema)


def _lift_cells(lp: pl.LazyFrame, *, by, spec, tests, per_problem: pl.DataFrame | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The cells' table, and the per-problem sums it was made from (`per_problem`: those sums given, pooled over
    directions by `_pooled_per_problem`, and not grouped from the pairs again)."""
    cell = ["stratum", "model", "arm_kind", "direction", "source_dsl", "target_dsl", *by]
    # one pass over the pairs per grouping, both collected together (in-memory engine: see _tables.ENGINE)
    has_sol = pl.col("S_sol").is_not_null() & pl.col("S_sol_solo").is_not_null()
    # a problem's pair lifts in S steps enter only the noise floor, through their multiset: counted per step size
    # (a handful of sums) rather than gathered into a list per problem
    step = (pl.col("lift").abs() / 20.0).round().cast(pl.Int64)
    if per_problem is None:
        top = int(lp.select(step.max()).collect(engine=ENGINE).item() or 0)
        steps = [f"_steps{k}" for k in range(top + 1)]
    else:
        steps = [c for c in per_problem.columns if c.startswith("_steps")]
    per_problem_q = lp.group_by(*cell, "problem").agg(
        SA=pl.col("S").sum(), SB=pl.col("S_solo").sum(), n=pl.len(), L=pl.col("lift").sum(),
        mean_lift=pl.col("lift").mean(), sq_lift=(pl.col("lift") ** 2).sum(),
        b=(pl.col("passed_solo") & ~pl.col("passed")).sum(), c=(~pl.col("passed_solo") & pl.col("passed")).sum(),
        SA_sol=pl.col("S_sol").filter(has_sol).sum(), SB_sol=pl.col("S_sol_solo").filter(has_sol).sum(),
        n_sol=has_sol.sum(), **{name: (step == k).sum() for k, name in enumerate(steps)})
    pair_rates_q = lp.group_by(cell).agg(
        n_pairs=pl.len(), S_arm=pl.col("S").mean(), S_solo=pl.col("S_solo").mean(),
        S_sol_arm=pl.col("S_sol").mean(), S_sol_solo=pl.col("S_sol_solo").mean(),
        S_compile_arm=pl.col("S_compile").mean(), S_compile_solo=pl.col("S_compile_solo").mean(),
        pass_arm=pl.col("passed").mean(), pass_solo=pl.col("passed_solo").mean(),
        pair_regress=(pl.col("lift") < -_EPS).mean(), pair_improve=(pl.col("lift") > _EPS).mean(),
        pair_tie=(pl.col("lift").abs() <= _EPS).mean(), served_changed=pl.col("served_changed").sum(),
        served_recorded=pl.col("served_changed").is_not_null().sum())
    if per_problem is None:
        per_problem, pair_rates = pl.collect_all([per_problem_q, pair_rates_q], engine=ENGINE)
    else:
        pair_rates = pair_rates_q.collect(engine=ENGINE)
    sums = per_problem
    per_problem = per_problem.drop("L")
    # P(replicate-mean lift == 0) under the sign-flip null, once per distinct multiset of step sizes
    multisets = per_problem.select(steps).unique()
    zero = [_zero_prob_steps(tuple(k for k, c in enumerate(row) for _ in range(c))) for row in multisets.iter_rows()]
    per_problem = per_problem.join(multisets.with_columns(_zero=pl.Series(zero, dtype=pl.Float64)), on=steps, how="left").drop(steps)
    per_problem = per_problem.with_columns(
        reg=(pl.col("mean_lift") < -_EPS).cast(pl.Float64), imp=(pl.col("mean_lift") > _EPS).cast(pl.Float64),
    )
    names = ["SA", "SB", "n", "reg", "imp"]
    sol = per_problem["n_sol"].sum() > 0
    if sol:
        names += ["SA_sol", "SB_sol", "n_sol"]
    cells, problems, m = _dense(per_problem, cell, names)
    stats = {"rel": Ratio("SA", sub="SB", den="SB"), "mean": Ratio("SA", sub="SB", den="n")}
    # shares of problems: counts of drawn problems (a problem's replicate-mean lift is < 0, > 0 or 0)
    shares = {"reg": lambda reg, **_: reg, "imp": lambda imp, **_: imp, "tie": lambda reg, imp, n_present, **_: n_present - reg - imp}
    if sol:
        stats["rel_sol"] = Ratio("SA_sol", sub="SB_sol", den="SB_sol")
        stats["mean_sol"] = Ratio("SA_sol", sub="SB_sol", den="n_sol")
    boot = cluster_bootstrap_many(cells, problems, m, stats, spec, shares=shares)
    cols = {}
    for name, (lo_name) in (("mean", "lift"), ("rel", "rel_lift"), ("reg", "regression_rate"), ("imp", "improvement_rate"),
                            ("tie", "tie_rate"), ("mean_sol", "lift_sol"), ("rel_sol", "rel_lift_sol")):
        est, lo, hi = boot.get(name, (np.full(cells.height, np.nan),) * 3)
        base = {"lift": "lift", "rel_lift": "rel"}.get(lo_name, lo_name)
        cols[lo_name] = pl.Series(est, dtype=pl.Float64)
        cols[f"{base}_lo"] = pl.Series(lo, dtype=pl.Float64)
        cols[f"{base}_hi"] = pl.Series(hi, dtype=pl.Float64)
    # each cell's per-problem lists in problem order, so the sums over them (shrinkage, noise floor) do not depend on the
    # order a parallel group-by happened to produce: the same figures to the last bit on every run
    extra = per_problem.group_by(cell).agg(
        n_problems=pl.len(), problem_lifts=pl.col("mean_lift").sort_by("problem"),
        problem_pass_diffs=((pl.col("c") - pl.col("b")) / pl.col("n")).sort_by("problem"), mcnemar_b=pl.col("b").sum(),
        mcnemar_c=pl.col("c").sum(), **_floor_aggs())
    out = cells.with_columns(**cols).with_columns(pl.col(pl.Float64).fill_nan(None))
    out = out.join(pair_rates, on=cell, how="left", nulls_equal=True).join(extra, on=cell, how="left", nulls_equal=True)
    out = out.with_columns(rel_halfwidth=(pl.col("rel_hi") - pl.col("rel_lo")) / 2)
    # 80% power for a 10% relative lift: 2.80 SE <= 10 points, i.e. a 95% half-width <= 7 points
    out = out.with_columns(detects_10pct=pl.col("rel_halfwidth") <= DETECT_HALFWIDTH)
    out = _add_shrinkage(out)
    if tests:
        out = add_tests(out, group=["stratum", "arm_kind", *by])
    else:
        out = out.drop("problem_lifts", "problem_pass_diffs")
    return out, sums


def _floor_aggs() -> dict:
    """Per-cell inputs of the regression rate's noise floor and of the shrinkage estimate (see `_add_shrinkage`)."""
    return {"_zero": pl.col("_zero").sort_by("problem"), "_n": pl.col("n").sort_by("problem"),
            "_sq": pl.col("sq_lift").sort_by("problem")}


def _zero_prob(lifts: list[float]) -> float:
    """See `_zero_prob_steps`; lifts are multiples of 20 (S steps), so problems share a handful of step multisets."""
    return _zero_prob_steps(tuple(sorted(int(round(abs(d) / 20.0)) for d in lifts)))


@functools.lru_cache(maxsize=None)
def _zero_prob_steps(steps: tuple[int, ...]) -> float:
    """P(replicate-mean lift == 0) when each pair's arm and solo are exchangeable (no effect on this problem).

    Conditional on the pairs' absolute lifts, each lift's sign is then a fair coin (the sign-flip null), so
    the summed lift's distribution is exact by convolution (S is a multiple of 20); by symmetry
    P(< 0) = (1 - P(0)) / 2. It uses the spread the pairs actually show, where resampling three solo values
    would understate it.
    """
    dist = np.array([1.0])
    for k in steps:
        step = np.zeros(2 * k + 1)
        step[0] += 0.5
        step[-1] += 0.5
        dist = np.convolve(dist, step)
    return float(dist[(len(dist) - 1) // 2])


def _flat(lists: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """(values, lengths) of a list column of numbers without nulls."""
    lens = lists.list.len().fill_null(0).to_numpy().astype(np.int64)
    return np.ascontiguousarray(lists.explode(empty_as_null=False).to_numpy(), dtype=np.float64), lens


def _by_length(lens: np.ndarray, *flats: np.ndarray):
    """The rows of ragged values (`_flat`) as [rows, L] matrices, one per distinct length L: yields (row indices, *matrices).

    Each matrix is C-contiguous, so a reduction along its rows runs numpy's pairwise sum over each row exactly as
    over that row alone: per-row figures equal those of a loop over rows bit for bit, in one call per length.
    """
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    for L in np.unique(lens):
        rows = np.flatnonzero(lens == L)
        at = starts[rows][:, None] + np.arange(L)
        yield (rows, *(f[at] for f in flats))


def _add_shrinkage(out: pl.DataFrame) -> pl.DataFrame:
    """The regression rate's noise floor and an empirical-Bayes estimate of the true share of negative lifts.

    Noise floor: the regression rate expected if the arm were one more solo (arm and solo exchangeable in
    each pair: the sign-flip null of `_zero_prob`), averaged over the cell's problems. A regression rate near
    it is what noise alone produces at this number of replicates.
    Shrinkage: problem mean lifts d_p with sampling variance s2/n_p (s2 pooled within problems) and a
    between-problem variance tau2 = var(d_p) - mean(s2/n_p) (method of moments); each problem's true lift
    is N(mu + (1 - B_p)(d_p - mu), (1 - B_p) s2/n_p) with B_p = (s2/n_p) / (s2/n_p + tau2), and the true
    share is the mean of P(true lift < 0). Null unless tau2 exceeds three times the variance ratio's null SE
    (the variance components do not allow it: with no real spread between problems the share is noise).
    Computed for all cells of one problem count at once (`_by_length`): the arithmetic of a loop over cells.
    """
    from math import erf, sqrt

    C = out.height
    floor, shrink, tau = np.full(C, np.nan), np.full(C, np.nan), np.full(C, np.nan)
    zero = _flat(out["_zero"])[0]  # each problem's P(mean lift == 0) under the sign-flip null (`_zero_prob_steps`)
    d_all, lens = _flat(out["problem_lifts"])
    n_all, sq_all = _flat(out["_n"])[0], _flat(out["_sq"])[0]
    has_shrink = np.zeros(C, bool)
    for rows, d, n, sq, z in _by_length(lens, d_all, n_all, sq_all, zero):
        P = d.shape[1]
        if P == 0:
            continue
        floor[rows] = ((1 - z) / 2).mean(1)
        within = sq - n * d**2  # sum of squared deviations per problem
        dof = (n - 1).sum(1)
        ok = dof > 0
        if P < 3 or not ok.any():
            continue
        rows, d, n, within, dof = rows[ok], d[ok], n[ok], within[ok], dof[ok]
        s2 = within.sum(1) / dof
        se2 = s2[:, None] / n
        t2 = d.var(axis=1, ddof=1) - se2.mean(1)
        # only where the between-problem variance clearly exceeds the noise: the variance ratio var(d) / mean(se2)
        # above 1 + 3 SE under no spread, SE^2 = 2 / (P - 1) + excess kurtosis / P (S lifts are discrete and
        # heavy-tailed, which widens the ratio's null); with no real spread any share of "negative true lifts" is noise
        c = d - d.mean(1)[:, None]
        m2 = (c**2).mean(1) ** 2
        k = (c**4).mean(1) / np.where(1e-300 > m2, 1e-300, m2) - 3.0
        kurt = np.where(k > 0.0, k, 0.0)  # max(0.0, k) as Python takes it
        tau[rows] = 0.0
        go = ~(t2 <= 3 * np.sqrt(2 / (P - 1) + kurt / P) * se2.mean(1))
        if not go.any():
            continue
        rows, d, se2, t2 = rows[go], d[go], se2[go], t2[go]
        mu = d.mean(1)[:, None]
        B = se2 / (se2 + t2[:, None])
        mean = mu + (1 - B) * (d - mu)
        sd = np.sqrt((1 - B) * se2)
        with np.errstate(divide="ignore", invalid="ignore"):
            arg = (0 - mean) / (sd * sqrt(2))
        pneg = np.where(sd > 0, 0.5 * (1 + np.frompyfunc(erf, 1, 1)(np.where(sd > 0, arg, 0.0)).astype(np.float64)),
                        (mean < 0).astype(np.float64))
        shrink[rows] = pneg.mean(1)
        has_shrink[rows] = True
        tau[rows] = np.sqrt(t2)
    return out.drop("_zero", "_n", "_sq").with_columns(
        regression_noise_floor=pl.Series(floor, dtype=pl.Float64).fill_nan(None),
        regression_true_share=pl.Series(np.where(has_shrink, shrink, np.nan), dtype=pl.Float64).fill_nan(None),
        between_problem_sd=pl.Series(tau, dtype=pl.Float64).fill_nan(None))


def wilcoxon_pratt(d: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p-value, zero_method="pratt", normal approximation with tie correction.

    The same arithmetic as scipy.stats.wilcoxon(d, zero_method="pratt", method="asymptotic") (a test
    checks they agree); written out so that `mkb-analyze lift` need not import scipy.stats (~1 s).
    """
    d = np.asarray(d, dtype=float)
    n = len(d)
    if n == 0 or np.all(d == 0):
        return math.nan if n == 0 else 1.0
    a = np.abs(d)
    order = np.argsort(a, kind="stable")
    sa = a[order]
    # average ranks over ties
    uniq, first, counts = np.unique(sa, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    r = np.empty(n)
    r[order] = np.repeat(avg, counts)
    r_plus, r_minus = r[d > 0].sum(), r[d < 0].sum()
    n_zero = int((d == 0).sum())
    mn = n * (n + 1) / 4.0 - n_zero * (n_zero + 1) / 4.0
    se = n * (n + 1) * (2 * n + 1) - n_zero * (n_zero + 1) * (2 * n_zero + 1)
    nz_counts = counts[uniq != 0]
    se -= 0.5 * float((nz_counts * (nz_counts * nz_counts - 1)).sum())
    se = math.sqrt(se / 24.0)
    if se == 0:
        return 1.0
    z = (min(r_plus, r_minus) - mn) / se
    return float(math.erfc(abs(z) / math.sqrt(2.0)))


def _wilcoxon_pratt_rows(d: np.ndarray) -> np.ndarray:
    """`wilcoxon_pratt` of each row of a [rows, n] array at once, with its arithmetic (a test checks: bit for bit).

    Ranks are half-integers, so their sums are exact in any order; every other step is the same operation on
    the same operands, element by element.
    """
    rows, n = d.shape
    out = np.full(rows, math.nan)
    if n == 0:
        return out
    a = np.abs(d)
    order = np.argsort(a, axis=1, kind="stable")
    sa, sd = np.take_along_axis(a, order, 1), np.take_along_axis(d, order, 1)
    pos = np.arange(n)
    start = np.ones((rows, n), bool)  # the first of a run of tied |d|
    start[:, 1:] = sa[:, 1:] != sa[:, :-1]
    end = np.ones((rows, n), bool)
    end[:, :-1] = start[:, 1:]
    first = np.maximum.accumulate(np.where(start, pos, 0), axis=1)
    last = np.minimum.accumulate(np.where(end, pos, n)[:, ::-1], axis=1)[:, ::-1]
    counts = last - first + 1
    avg = first + (counts + 1) / 2.0  # average ranks over ties
    r_plus, r_minus = np.where(sd > 0, avg, 0.0).sum(1), np.where(sd < 0, avg, 0.0).sum(1)
    n_zero = (d == 0).sum(1)
    mn = n * (n + 1) / 4.0 - n_zero * (n_zero + 1) / 4.0
    se = n * (n + 1) * (2 * n + 1) - n_zero * (n_zero + 1) * (2 * n_zero + 1)
    se = se - 0.5 * np.where(start & (sa != 0), counts * (counts * counts - 1), 0).sum(1).astype(np.float64)
    se = np.sqrt(se / 24.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (np.minimum(r_plus, r_minus) - mn) / se
    p = np.frompyfunc(lambda v: math.erfc(abs(v) / math.sqrt(2.0)), 1, 1)(np.where(se == 0, 0.0, z)).astype(np.float64)
    out[:] = np.where(se == 0, 1.0, p)
    out[n_zero == n] = 1.0
    return out


def _wilcoxon_lists(lists: pl.Series) -> np.ndarray:
    """`wilcoxon_pratt` of each list (values rounded to 9 decimals, as the tests take them); NaN for a null list."""
    out = np.full(len(lists), math.nan)
    valid = np.flatnonzero(lists.is_not_null().to_numpy())
    if len(valid):
        flat, lens = _flat(lists.gather(valid))
        for rows, m in _by_length(lens, flat):
            out[valid[rows]] = _wilcoxon_pratt_rows(np.round(m, 9))
    return out


@functools.lru_cache(maxsize=None)
def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value: binomial test of c successes in b + c discordant pairs at 1/2."""
    n = b + c
    if n == 0 or b == c:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return float(min(1.0, 2.0 * tail))


def add_tests(cells: pl.DataFrame, *, group: list[str]) -> pl.DataFrame:
    """Wilcoxon (pratt) on problem-mean lifts, exact McNemar on pass, and Wilcoxon (pratt) on each problem's net pass
    change, each Holm-adjusted across the cells of a group.

    Why the third: McNemar counts discordant pairs as if independent, but a problem's replicates share the
    problem (one easy problem can supply every discordant pair); the per-problem net change (pairs gaining a
    pass minus pairs losing one, over the problem's pairs) is one number per problem, the unit that is sampled.
    """
    # normal approximation: with zeros and ties (the rule for S lifts) an exact null does not apply
    pw = _wilcoxon_lists(cells["problem_lifts"])
    pm = [mcnemar_exact(int(b), int(c)) for b, c in zip(cells["mcnemar_b"].to_list(), cells["mcnemar_c"].to_list())]
    pp = _wilcoxon_lists(cells["problem_pass_diffs"]) if "problem_pass_diffs" in cells.columns else np.full(cells.height, np.nan)
    cells = cells.drop("problem_lifts", "problem_pass_diffs", strict=False).with_columns(
        p_wilcoxon=pl.Series(pw, dtype=pl.Float64), p_mcnemar=pl.Series(pm, dtype=pl.Float64),
        p_pass_clustered=pl.Series(pp, dtype=pl.Float64))
    cells = cells.with_row_index("_i")
    adj = []
    for _, g in cells.group_by(group, maintain_order=True):
        row = {"_i": g["_i"]}
        for col in ("p_wilcoxon", "p_mcnemar", "p_pass_clustered"):
            p = g[col].to_numpy()
            ok = ~np.isnan(p)
            h = np.full(len(p), np.nan)
            if ok.any():
                h[ok] = holm(p[ok])
            row[f"{col}_holm"] = h
        adj.append(pl.DataFrame(row))
    return cells.join(pl.concat(adj), on="_i").drop("_i")


def holm(p: np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values (as statsmodels' multipletests(method="holm"), without importing it)."""
    p = np.asarray(p, dtype=float)
    m = len(p)
    order = np.argsort(p, kind="stable")
    adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adj
    return out


def _standing_stat(ia, ra, na, ib, rb, nb):
    with np.errstate(divide="ignore", invalid="ignore"):
        return (ia - ra) / na - (ib - rb) / nb


def standing_table(pairs: pl.DataFrame, *, naive: bool = False, pooled: bool = True,
                   spec: BootstrapSpec = BootstrapSpec(), over_directions: bool = False) -> pl.DataFrame:
    """The standing table: per arm kind and direction (pooled over models, or per model), each class's
    improve/regress/tie shares (with CIs) and the standing effect = (improve - regress | above) - (same | below),
    with its CI, and the same effect in S points: (mean lift | above) - (mean lift | below).

    `naive` classifies against the solo the lift subtracts (biased; shown for contrast only);
    `over_directions` adds a row per arm pooled over directions (direction "pooled").
    """
    col = "standing_naive" if naive else "standing"
    p = pairs.filter(pl.col(col).is_not_null())
    if p.height == 0:
        return pl.DataFrame()
    out = _standing_cells(p, col=col, pooled=pooled, spec=spec)
    if over_directions:
        out = pl.concat([out, _standing_cells(p.with_columns(direction=pl.lit("pooled")), col=col, pooled=pooled, spec=spec)],
                        how="diagonal_relaxed")
    cell = ["stratum", "arm_kind", "direction"] + ([] if pooled else ["model"])
    order = {k: i for i, k in enumerate(ARM_ORDER)}
    out = _text(out).with_columns(classified_against=pl.lit("solo the lift subtracts (naive)" if naive else "mean of other target solo replicates"))
    return out.with_columns(_o=pl.col("arm_kind").replace_strict(order, default=99),
                            _p=pl.col("direction") == "pooled").sort("_o", "_p", *cell).drop("_o", "_p")


def _standing_cells(p: pl.DataFrame, *, col: str, pooled: bool, spec: BootstrapSpec) -> pl.DataFrame:
    cell = ["stratum", "arm_kind", "direction"] + ([] if pooled else ["model"])
    imp, reg = pl.col("outcome") == "improve", pl.col("outcome") == "regress"
    vals = {}
    for c in ("above", "tie", "below"):
        inc = pl.col(col) == c
        vals[f"n_{c}"] = inc.sum()
        vals[f"imp_{c}"] = (inc & imp).sum()
        vals[f"reg_{c}"] = (inc & reg).sum()
        vals[f"lift_{c}"] = pl.col("lift").filter(inc).sum()
    vals["n"] = pl.len()
    cells, problems, m = _matrices(p, cell, vals)
    stats = {"effect": lambda imp_above, reg_above, n_above, imp_below, reg_below, n_below, **_:
             _standing_stat(imp_above, reg_above, n_above, imp_below, reg_below, n_below),
             "effect_S": lambda lift_above, n_above, lift_below, n_below, **_:
             _ratio(lift_above, n_above) - _ratio(lift_below, n_below)}
    for c in ("above", "tie", "below"):
        stats[f"improve_{c}"] = Ratio(f"imp_{c}", den=f"n_{c}")
        stats[f"regress_{c}"] = Ratio(f"reg_{c}", den=f"n_{c}")
    boot = cluster_bootstrap_many(cells, problems, m, stats, spec)
    tot = {k: v.sum(1) for k, v in m.items()}
    out = cells.with_columns(n_pairs=pl.Series(tot["n"].astype(int)))
    for c in ("above", "tie", "below"):
        n = tot[f"n_{c}"]
        with np.errstate(divide="ignore", invalid="ignore"):
            out = out.with_columns(**{
                f"n_{c}": pl.Series(n.astype(int)),
                f"improve_{c}": pl.Series(tot[f"imp_{c}"] / n), f"regress_{c}": pl.Series(tot[f"reg_{c}"] / n),
                f"tie_{c}": pl.Series((n - tot[f"imp_{c}"] - tot[f"reg_{c}"]) / n)})
        for k in ("improve", "regress"):
            _, lo, hi = boot[f"{k}_{c}"]
            out = out.with_columns(**{f"{k}_{c}_lo": pl.Series(lo, dtype=pl.Float64), f"{k}_{c}_hi": pl.Series(hi, dtype=pl.Float64)})
    for name in ("effect", "effect_S"):
        est, lo, hi = boot[name]
        out = out.with_columns(**{name: pl.Series(est, dtype=pl.Float64), f"{name}_lo": pl.Series(lo, dtype=pl.Float64),
                                  f"{name}_hi": pl.Series(hi, dtype=pl.Float64)})
    return out.with_columns(pl.col(pl.Float64).fill_nan(None))


def contrast_table(pairs: pl.DataFrame, *, against: tuple[str, ...] = ("placebo", "wrong"), spec: BootstrapSpec = BootstrapSpec(),
                   pooled: bool = True) -> pl.DataFrame:
    """The time-matched contrast: transfer - placebo (and transfer - wrong) within each block.

    A block's skill arms run together, after its solos (DESIGN): transfer and placebo share the block's
    time, served model and queue, so their difference isolates the skill's content, where lift vs solo
    also carries whatever changed between the solo phase and the block. Per (model, direction): mean
    difference in S, relative difference (sum S_transfer - sum S_other) / sum S_other, problem-clustered CIs,
    and the blocks whose served model changed between the solo and the skill arms (null: not recorded).
    """
    key = ["stratum", "model", "problem", "replicate", "target_dsl"]
    tr = pairs.filter(pl.col("arm_kind") == "transfer").select(*key, "direction", "source_dsl", S_tr="S", lift_tr="lift",
                                                              changed="served_changed")
    cell = ["stratum", "model", "contrast", "direction", "source_dsl", "target_dsl"]
    # per (cell, problem) sums, from which every figure below is made; the pooled cell (direction "pooled") sums them
    # over directions rather than copying the blocks. S and lift are multiples of 20, so the sums (and the means made
    # from them) are exact whatever the order of the additions.
    sums = {"SA": pl.col("S_tr").sum(), "SB": pl.col("S_ot").sum(), "n": pl.len(), "L": pl.col("lift_tr").sum(),
            "ch": pl.col("changed").sum(), "rec": pl.col("changed").is_not_null().sum()}
    parts = []
    for other in against:
        ot = pairs.filter(pl.col("arm_kind") == other).select(*key, S_ot="S")
        j = tr.join(ot, on=key, how="inner")
        if j.height:
            parts.append(j.group_by(*[c for c in cell if c != "contrast"], "problem").agg(**sums)
                         .with_columns(contrast=pl.lit(f"transfer - {other}")))
    if not parts:
        return pl.DataFrame()
    agg = pl.concat(parts, how="vertical_relaxed")
    if pooled:
        agg = pl.concat([agg, agg.group_by("stratum", "model", "contrast", "problem").agg(pl.col(list(sums)).sum()).with_columns(
            direction=pl.lit("pooled"), source_dsl=pl.lit("*"), target_dsl=pl.lit("*"))], how="diagonal_relaxed")
    cells, problems, m = _dense(agg, cell, ["SA", "SB", "n"])
    boot = cluster_bootstrap_many(cells, problems, m, {"rel": Ratio("SA", sub="SB", den="SB"), "mean": Ratio("SA", sub="SB", den="n")},
                                  spec)
    info = agg.group_by(cell).agg(n_blocks=pl.col("n").sum(), n_problems=pl.len(), S_transfer=pl.col("SA").sum() / pl.col("n").sum(),
                                  S_other=pl.col("SB").sum() / pl.col("n").sum(), lift_vs_solo=pl.col("L").sum() / pl.col("n").sum(),
                                  served_changed=pl.col("ch").sum(), served_recorded=pl.col("rec").sum())
    (rel, rlo, rhi), (ml, mlo, mhi) = boot["rel"], boot["mean"]
    out = cells.with_columns(diff=pl.Series(ml), diff_lo=pl.Series(mlo), diff_hi=pl.Series(mhi), rel_diff=pl.Series(rel),
                             rel_lo=pl.Series(rlo), rel_hi=pl.Series(rhi)).with_columns(pl.col(pl.Float64).fill_nan(None))
    out = _text(out.join(info, on=cell, how="left", nulls_equal=True))
    return out.with_columns(_p=pl.col("direction") == "pooled").sort("contrast", "_p", *cell).drop("_p")


def two_part_table(pairs: pl.DataFrame, *, spec: BootstrapSpec = BootstrapSpec()) -> pl.DataFrame:
    """The two-part summary beside the mixed models: pass rate arm vs solo, then geometric-mean speedup among passes.

    The pass difference gets a problem-clustered bootstrap CI: the complement to McNemar (which treats a
    problem's replicates as independent pairs) that respects replicates clustered in problems. The speedup
    part is conditioned on passing and labelled so: arms that pass more often may pass harder problems.
    """
    p = pairs.filter(pl.col("arm_kind") != NOISE_ARM)
    if p.height == 0:
        return pl.DataFrame()
    cell = ["stratum", "model", "arm_kind", "direction"]
    cells, problems, m = _matrices(p, cell, {"PA": pl.col("passed").cast(pl.Int64).sum(), "PB": pl.col("passed_solo").cast(pl.Int64).sum(),
                                             "n": pl.len()})
    est, lo, hi = cluster_bootstrap(cells, problems, m, Ratio("PA", sub="PB", den="n"), spec)
    sp = p.group_by(cell).agg(
        pass_arm=pl.col("passed").mean(), pass_solo=pl.col("passed_solo").mean(),
        gm_speedup_arm_given_pass=pl.col("speedup").filter(pl.col("passed") & (pl.col("speedup") > 0)).log().mean().exp(),
        gm_speedup_solo_given_pass=pl.col("speedup_solo").filter(pl.col("passed_solo") & (pl.col("speedup_solo") > 0)).log().mean().exp())
    out = cells.with_columns(pass_diff=pl.Series(est), pass_diff_lo=pl.Series(lo), pass_diff_hi=pl.Series(hi)) \
        .with_columns(pl.col(pl.Float64).fill_nan(None))
    return _text(out.join(sp, on=cell, how="left", nulls_equal=True))


def problem_table(pairs: pl.DataFrame) -> pl.DataFrame:
    """One row per (stratum, model, arm, direction, problem): pairs, mean S of arm and solo, mean lift (S and S_sol)."""
    p = pairs.filter(pl.col("arm_kind") != NOISE_ARM)
    if p.height == 0:
        return pl.DataFrame()
    cell = ["stratum", "model", "arm_kind", "direction", "problem"]
    out = p.group_by(cell).agg(family=pl.col("family").first(), n_pairs=pl.len(), S_solo=pl.col("S_solo").mean(),
                               S_arm=pl.col("S").mean(), lift=pl.col("lift").mean(), lift_sol=pl.col("lift_sol").mean(),
                               pass_solo=pl.col("passed_solo").mean(), pass_arm=pl.col("passed").mean())
    order = {k: i for i, k in enumerate(ARM_ORDER)}
    return _text(out).with_columns(_o=pl.col("arm_kind").replace_strict(order, default=99)).sort("_o", *cell).drop("_o")


def power_table(lift: pl.DataFrame, pairs: pl.DataFrame, *, target: float = DETECT_LIFT, power: float = 0.80) -> pl.DataFrame:
    """Problems or replicates needed to detect a relative lift of `target` at `power` (two-sided 5%), per cell.

    From the observed variance components: a cell's relative-lift SE is its 95% CI half-width / 1.96; the
    variance of a problem's replicate-mean lift is tau2 + sigma2 / R (between problems, within a problem), so
    SE scales as sqrt((tau2 + sigma2/R') / (tau2 + sigma2/R) x P / P'). Needed: SE <= target / (z_0.975 + z_power).
    Replicates alone cannot help past tau2: then `replicates_needed` is null ("not by replicates").
    """
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.975) + NormalDist().inv_cdf(power)
    need_se = target / z
    cells = lift.filter(pl.col("direction") != "pooled") if "direction" in lift.columns else lift
    # within-problem variance of pair lifts and the replicates per problem, per cell
    cell = ["stratum", "model", "arm_kind", "direction"]
    # sums in problem order (and pairs in replicate order), so the figures do not depend on a parallel group-by's order
    comp = pairs.filter(pl.col("arm_kind") != NOISE_ARM).sort("replicate").group_by(*cell, "problem").agg(
        v=pl.col("lift").var(ddof=1), n=pl.len(), d=pl.col("lift").mean()).group_by(cell).agg(
        sigma2=pl.col("v").sort_by("problem").mean(), R=pl.col("n").median(), var_d=pl.col("d").sort_by("problem").var(ddof=1), P=pl.len())
    out = _text(cells.select(*cell, "n_problems", "rel_lift", "rel_halfwidth")).join(_text(comp), on=cell, how="left", nulls_equal=True)
    rows = []
    for r in out.iter_rows(named=True):
        se = (r["rel_halfwidth"] or float("nan")) / 1.959963984540054
        P, R, s2 = r["P"], r["R"], r["sigma2"] or 0.0
        tau2 = max(0.0, (r["var_d"] or 0.0) - s2 / R) if R else 0.0
        cur = tau2 + s2 / R if R else float("nan")
        p_need = r_need = None
        achieved = None
        if se == se and se > 0 and cur > 0:
            p_need = int(np.ceil(P * (se / need_se) ** 2))
            # SE(R') = se * sqrt((tau2 + s2/R') / cur); solve for R' at fixed P
            goal = (need_se / se) ** 2 * cur - tau2
            if goal > 0 and s2 > 0:
                r_need = int(np.ceil(s2 / goal))
            elif s2 == 0 and tau2 <= (need_se / se) ** 2 * cur:
                r_need = int(R)
            from statistics import NormalDist as _N

            achieved = float(_N().cdf(target / se - 1.959963984540054))
        rows.append({**r, "se_rel": se if se == se else None, "tau2": tau2, "problems_needed": p_need,
                     "replicates_needed": r_need, "power_at_target": achieved})
    return pl.DataFrame(rows, infer_schema_length=None)


@dataclass(frozen=True)
class VarianceComponents:
    """What a planned cell's precision rests on, per problem's linearised relative lift u = lift - rel x S_solo.

    tau2: between problems (of the true u), sigma2: within a problem (of one pair's u), s_solo: mean solo S
    (the ratio's denominator). At rel = 0, u is the lift in S points.
    """

    tau2: float
    sigma2: float
    s_solo: float


# Stated defaults for planning before any data: the scale of `mkb-analyze synth`'s demo dataset (pair lifts
# spread ~28 S points within a problem, true lifts ~4.5 points between problems, solo S ~45). Placeholders,
# not measurements: `power --plan --store URL` uses a store's own components instead.
DEFAULT_COMPONENTS = VarianceComponents(tau2=20.0, sigma2=800.0, s_solo=45.0)


@dataclass(frozen=True)
class PlanDesign:
    """The cells an experiment plan will produce and their size: what `plan_power_table` needs of a config."""

    models: tuple[str, ...]
    n_problems: int
    replicates: int
    cells: tuple[tuple[str, str, str], ...]  # (arm_kind, source_dsl, target_dsl), as the plan builds them
    source: str = ""

    @classmethod
    def from_config(cls, cfg) -> "PlanDesign":
        """From an `mkb.experiment.ExperimentConfig` (duck-typed: the analysis does not import the experiment)."""
        cells = []
        for arm in cfg.arms:
            for t in cfg.dsls:
                if arm == "same":
                    cells.append((arm, t, t))
                elif arm != "solo":
                    cells += [(arm, s, t) for s in cfg.dsls if s != t]
        return cls(tuple(m.name for m in cfg.models), len(cfg.problems), cfg.replicates, tuple(cells), cfg.source)


def variance_components(pairs: pl.DataFrame) -> pl.DataFrame:
    """Per cell (stratum, model, arm, direction): tau2, sigma2 and s_solo of `VarianceComponents`, with P and R.

    u = lift - rel x S_solo linearises the relative lift (sum S_arm - sum S_solo) / sum S_solo around the
    cell's estimate, so SE(rel) = sqrt((tau2 + sigma2 / R) / P) / s_solo is its delta-method SE, which the
    problem-clustered bootstrap approximates; sigma2 is the mean within-problem variance of u over problems
    with two or more pairs, tau2 = var(problem mean u) - sigma2 / R (method of moments, floored at 0).
    """
    p = pairs.filter(pl.col("arm_kind") != NOISE_ARM)
    cell = ["stratum", "model", "arm_kind", "direction"]
    rel = (pl.col("S").sum() - pl.col("S_solo").sum()) / pl.col("S_solo").sum()
    p = p.with_columns(_u=pl.col("lift") - rel.over(cell).fill_nan(0.0).fill_null(0.0) * pl.col("S_solo"))
    comp = p.sort("replicate").group_by(*cell, "problem").agg(v=pl.col("_u").var(ddof=1), n=pl.len(), u=pl.col("_u").mean(),
                                                             b=pl.col("S_solo").mean()) \
        .group_by(cell).agg(sigma2=pl.col("v").sort_by("problem").mean(), R=pl.col("n").median(),
                            var_u=pl.col("u").sort_by("problem").var(ddof=1), P=pl.len(), s_solo=pl.col("b").sort_by("problem").mean())
    comp = _text(comp).with_columns(sigma2=pl.col("sigma2").fill_null(0.0))
    return comp.with_columns(tau2=pl.max_horizontal(pl.lit(0.0), pl.col("var_u") - pl.col("sigma2") / pl.col("R")).fill_null(0.0)).sort(cell)


def _needed(c: VarianceComponents, P: int, R: int, *, target: float, power: float) -> dict:
    """SE, CI half-width and power of a design of P problems x R replicates, and the P (at R) or R (at P) it needs."""
    from statistics import NormalDist

    z975 = NormalDist().inv_cdf(0.975)
    z = z975 + NormalDist().inv_cdf(power)
    var_u = c.tau2 + c.sigma2 / R
    se = math.sqrt(var_u / P) / c.s_solo if c.s_solo > 0 and P > 0 else math.nan
    out = {"se_rel": se, "rel_halfwidth": z975 * se, "power_at_target": NormalDist().cdf(target / se - z975) if se > 0 else None,
           "problems_needed": None, "replicates_needed": None}
    if not se > 0:
        return out
    goal = P * (target * c.s_solo / z) ** 2  # the largest tau2 + sigma2 / R' that P problems allow
    out["problems_needed"] = int(math.ceil(var_u * (z / (target * c.s_solo)) ** 2))
    if goal > c.tau2:
        out["replicates_needed"] = max(1, int(math.ceil(c.sigma2 / (goal - c.tau2)))) if c.sigma2 > 0 else 1
    return out


def plan_power_table(design: PlanDesign, components: pl.DataFrame | None = None, *, target: float = DETECT_LIFT,
                     power: float = 0.80, defaults: VarianceComponents = DEFAULT_COMPONENTS,
                     override: dict[str, float] | None = None) -> pl.DataFrame:
    """Per planned cell (model x arm x direction): the relative-lift SE and power the plan will have, and the
    problems or replicates it would need to detect `target` at `power` (two-sided 5%).

    Components per cell, and `components_from` says which: the store's cell of the same model, arm and
    direction; else the store's cells of that arm pooled (mean); else all the store's cells pooled; else the
    stated `defaults`. `override` (tau2, sigma2, s_solo) replaces a component everywhere and is named too.
    """
    comps = components if components is not None and components.height else None
    rows = []
    for model in design.models:
        for arm, src, tgt in design.cells:
            direction = f"{src}->{tgt}"
            c, where = None, f"stated defaults (tau2={defaults.tau2:g}, sigma2={defaults.sigma2:g}, S_solo={defaults.s_solo:g})"
            if comps is not None:
                for sel, label in (((pl.col("model") == model) & (pl.col("arm_kind") == arm) & (pl.col("direction") == direction),
                                    "store: this cell"),
                                   (pl.col("arm_kind") == arm, f"store: {arm} cells pooled"), (pl.lit(True), "store: all cells pooled")):
                    got = comps.filter(sel)
                    if got.height:
                        c = VarianceComponents(float(got["tau2"].mean()), float(got["sigma2"].mean()), float(got["s_solo"].mean()))
                        where = label + (f" ({got.height})" if got.height > 1 else "")
                        break
            c = c or defaults
            if override:
                c = replace(c, **override)
                where += "; set: " + ", ".join(f"{k}={v:g}" for k, v in override.items())
            rows.append({"model": model, "arm_kind": arm, "direction": direction, "n_problems": design.n_problems,
                         "replicates": design.replicates, "tau2": c.tau2, "sigma2": c.sigma2, "S_solo": c.s_solo,
                         "components_from": where,
                         **_needed(c, design.n_problems, design.replicates, target=target, power=power)})
    out = pl.DataFrame(rows, infer_schema_length=None)
    return out.with_columns(detects_target=pl.col("power_at_target") >= power)


def cell_lift_simple(S_arm: list[float], S_solo: list[float]) -> tuple[float, float]:
    """(mean lift, relative lift) of paired S lists: the DESIGN formulas, for hand checks."""
    a, b = np.asarray(S_arm, float), np.asarray(S_solo, float)
    return float((a - b).mean()), float((a.sum() - b.sum()) / b.sum())
