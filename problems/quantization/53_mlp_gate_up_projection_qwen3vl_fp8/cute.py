"""cute_wgmma.py plus TMA multicast: CTA pairs (clusters of 2 along M) share each weight tile, fp8 wgmma, SiLU gate.

The only difference from cute_wgmma.py (same tiles, pipeline, promotion and epilogue; read that
file's docstring first): CTAs run in clusters of CM = 2 along M. The pair owns row tiles 2p and
2p + 1 of the same 64 output columns, so it needs the same weight tile: each CTA loads 32 of the
64 rows of the gate box and of the up box (`CopyBulkTensorTileG2SMulticastOp`, `tma_partition`
with the CTA's rank in the cluster) and multicasts them into the same stage of both CTAs, while
each loads its own 128-row activation tile. That cuts the L2 -> SM traffic per CTA and stage
from 32 KiB to 24 KiB (the effective tile is 256 x 128 x 128 per 48 KiB of L2 reads). The full
barrier still expects 32 KiB a stage per CTA. A stage may be refilled only when the consumers of
BOTH CTAs released it, so the empty barriers count 16 arrivals (lanes 0 and 1 of each of the 8
consumer warps arrive on the barrier of cluster rank 0 and 1: `mapa` + `mbarrier.arrive.shared::cluster`
in the PTX), and `PipelineTmaAsync.create` ends with a cluster barrier so that no multicast reaches
a peer whose barriers are not initialised. Both CTAs of a pair walk the same pair tiles and K
blocks, which the multicast needs. Expect 10-25% faster than cute_wgmma.py if that one is bound
by L2 bandwidth, and the same if it is not.

Extra risks, beyond cute_wgmma.py's: the cluster launch (`cluster=[2, 1, 1]`, grid 2 x min(pair
tiles, 66): all 66 pairs must be co-resident; GPCs have whole TPCs of 2 SMs, so they should be);
the consumer-release arithmetic above (taken from the library's `init_empty_barrier_arrive_signal`
for a (1, 2, 1, 1) cluster layout); with an odd number of row tiles (the smoke size: M = 8, one
row tile) the second CTA of the pair loads an activation box that lies entirely past M, which
TMA should zero-fill (the full size has 68 row tiles, an even number).

Below: cute_wgmma.py's docstring, which holds for this file too.

Strategy. One CTA of 3 warpgroups owns a 128-row x 64-column tile of the output and computes that
tile of BOTH gate and up. The B operand of each K block is one 128 x 128 fp8 shared-memory tile
whose rows 0..63 are w_gate rows n0..n0+63 and rows 64..127 are w_up rows n0..n0+63 (two 64-row
TMA boxes into the two halves of one 128B-swizzled, K-major tile), so one wgmma m64n128k32 per
warpgroup and k-step multiplies the activation by both weights at once and its accumulator
holds gate in columns 0..63 and up in columns 64..127 of the same threads' registers.
- Warpgroup 0, warp 0: the TMA producer. Per 128-wide K block (one scale block) it loads the
  128 x 128 activation tile and the two 64 x 128 weight halves into one stage of a STAGES-deep
  ring (32 KiB a stage), on a `PipelineTmaAsync` (full barriers count the TMA bytes, empty
  barriers one arrive per consumer warp). Its registers are given back (setmaxnreg 40).
- Warpgroups 1 and 2: rows 0..63 and 64..127 of the tile (setmaxnreg 232). Per K block: wait for
  the stage, 4 wgmma k-steps (k 32 each) into a fresh fp32 accumulator `blk` (ACCUMULATE off on
  the first), commit; then on the next block, after `wait_group(0)`, release the stage and
  promote: tot += blk * x_scale[row, kb] * w_scale[n0 // 128, kb] (w_gate_scale for columns
  < 64, w_up_scale for the rest) in fp32 registers (the DeepGEMM recipe: one fp32 promotion
  per 128-wide K block, so the tensor core's limited-precision fp8 accumulation never spans
  more than 128 products). With two math warpgroups one promotes while the other's wgmmas run.
- Epilogue: out = silu(gate) * up in fp32 from the pair (column c, column c + 64) that each
  thread holds (silu through ex2.approx and rcp.approx, asked for by name), rounded once to bf16;
  two adjacent columns go out as one 4-byte store (the output is passed as an int32 view).
- Persistent: min(tiles, 132) CTAs walk the tiles M-fastest (tile % M-tiles is the row tile), so
  the ~132 resident CTAs share 2-3 weight tiles, the 31 MB fp8 activation stays in L2 and the
  weights stream from HBM once; the producer warp runs ahead into the next tile while the math
  warpgroups run the epilogue, so the TMA latency of each tile's first blocks is hidden. The
  promotion factors of block kb - 1 are loaded before the waits that precede their use.

Accumulator coordinates come from the tiled MMA itself (`partition_C` of an identity tensor), not
from hand-written fragment tables. Checked on the CPU by tracing the same tiled MMA for threads 0,
1, 5, 37, 100, 128, 131, 255: each thread's 64 fp32 elements are ((2 columns, 2 rows, 16 column
groups), 1, 1); flat element i and i + 32 are the same row and columns c and c + 64 (gate, up);
i % 4 < 2 is row g, else g + 8. A numpy model of the per-thread promotion/epilogue built on that
mapping (TMA zero fill, guarded scale reads and stores) matched the problem's reference at
M, K, N = 8, 256, 256 and 200, 384, 320. ptxas (sm_90a): 168 registers, no spills; the PTX holds
wgmma.mma_async.m64n128k32.f32.e4m3.e4m3 and cp.async.bulk.tensor with complete_tx mbarriers.

Bound: compute. 2 x 2 x 8704 x 3584 x 18944 = 2.36 TFLOP; at the H200's ~1979 TFLOP/s dense fp8
peak that is ~1.2 ms (the 330 MB bf16 output, 136 MB of weights and 31 MB of activation are
~0.1 ms of HBM time, overlapped). Expect 45-65% of peak (~1.9-2.7 ms). What keeps it from more: the effective
128 x 128 x 128 tile per stage is 32 KiB for 4.2 MFLOP (128 FLOP/byte of L2 -> SM traffic, ~15 TB/s
at peak, above what L2 delivers; no TMA multicast across a cluster), the math warpgroups stall on
`wait_group(0)` every K block to promote (DeepGEMM's cost too; the other warpgroup's wgmmas cover
part of it), and the epilogue leaves the tensor cores idle (no ping-pong between the warpgroups).
Registers (ptxas -v, sm_90a): 168 a thread before setmaxnreg, no spills; shared memory 193 KiB.

Risks I could not check without a GPU:
- the shared-memory aliasing of the 128-row B tile and its 64-row TMA halves (`sBh` made on
  `sB.iterator` with layout tile_to_shape(atom, (64, 128, 2 * STAGES))): right only if the
  128B-swizzle atom tiles rows first in both, so stage s half h starts at byte s*16384 + h*8192
  (the two layouts print as ((8,16),(128,1),(1,6)):((128,1024),(1,0),(0,16384)) and
  ((8,8),(128,1),(1,12)):((128,1024),(1,0),(0,8192)), both on the same S<3,4,3>-swizzled pointer,
  which is that aliasing; not checked with data);
- the pipeline protocol (consumer arrive count 8 = one elected lane per consumer warp; the stage
  of block kb-1 is released only after `wait_group(0)` retired its wgmmas);
- TMA boxes that reach past M (M % 128 != 0; the smoke size has M = 8): rows past the end are
  zero-filled by TMA and the stores are guarded, as in the CUTLASS examples;
- fp8 tensors cross the FFI as uint8 views and are recast to Float8E4M3FN in the jit function.
"""

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
import torch
from cutlass import Float32, Int32

BM, BN, BK = 128, 64, 128  # CTA tile: 128 rows, 64 output columns (64 gate + 64 up weight rows), one scale block of K
STAGES = 6  # 6 x 32 KiB of the 227 KiB of shared memory
NUM_MMA_WG = 2
NT = 128 * (1 + NUM_MMA_WG)
NUM_SMS = 132  # H100/H200 SXM: one persistent CTA per SM (fewer SMs only means more tiles per CTA)
CM = 2  # CTAs per cluster, along M: the pair shares (multicasts) the weight tile
F8 = cutlass.Float8E4M3FN
_CACHE = {}


class _GateUp:
    """Host-side setup (layouts, TMA atoms) and the kernel; attributes are trace-time constants."""

    @cute.jit
    def __call__(self, mXb: cute.Tensor, mXs: cute.Tensor, mGb: cute.Tensor, mGs: cute.Tensor, mUb: cute.Tensor,
                 mUs: cute.Tensor, mOutW: cute.Tensor, stream):
        mX = cute.recast_tensor(mXb, F8)
        mG = cute.recast_tensor(mGb, F8)
        mU = cute.recast_tensor(mUb, F8)
        kmaj = cute.nvgpu.OperandMajorMode.K
        self.tiled_mma = sm90_utils.make_trivial_tiled_mma(F8, F8, kmaj, kmaj, Float32, (NUM_MMA_WG, 1, 1),
                                                           tiler_mn=(64, 2 * BN))
        atom = cute.nvgpu.warpgroup.make_smem_layout_atom(cute.nvgpu.warpgroup.SmemLayoutAtomKind.K_SW128, F8)
        a_layout = cute.tile_to_shape(atom, (BM, BK, STAGES), order=(0, 1, 2))
        b_layout = cute.tile_to_shape(atom, (2 * BN, BK, STAGES), order=(0, 1, 2))
        bh_layout = cute.tile_to_shape(atom, (BN, BK, 2 * STAGES), order=(0, 1, 2))  # the same bytes, 64-row halves
        op = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
        mc = cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp()
        tma_a, tA = cute.nvgpu.cpasync.make_tiled_tma_atom(op, mX, cute.slice_(a_layout, (None, None, 0)),
                                                           (BM, BK))
        # each CTA of the pair loads half of each weight box (32 rows) and multicasts it to both
        tma_g, tG = cute.nvgpu.cpasync.make_tiled_tma_atom(mc, mG, cute.slice_(bh_layout, (None, None, 0)),
                                                           (BN, BK), num_multicast=CM)
        tma_u, tU = cute.nvgpu.cpasync.make_tiled_tma_atom(mc, mU, cute.slice_(bh_layout, (None, None, 0)),
                                                           (BN, BK), num_multicast=CM)
        M = mX.shape[0]
        N = mG.shape[0]
        ptiles = ((M + CM * BM - 1) // (CM * BM)) * ((N + BN - 1) // BN)  # tiles of the pair: CM * BM rows
        self.kernel(tma_a, tA, tma_g, tG, tma_u, tU, mXs, mGs, mUs, mOutW, self.tiled_mma, a_layout, b_layout,
                    bh_layout).launch(
            grid=[cutlass.min(ptiles, NUM_SMS // CM) * CM, 1, 1], block=[NT, 1, 1], cluster=[CM, 1, 1],
            min_blocks_per_mp=1, stream=stream
        )

    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, tA: cute.Tensor, tma_g: cute.CopyAtom, tG: cute.Tensor,
               tma_u: cute.CopyAtom, tU: cute.Tensor, mXs: cute.Tensor, mGs: cute.Tensor, mUs: cute.Tensor,
               mOutW: cute.Tensor, tiled_mma: cute.TiledMma, a_layout: cute.ComposedLayout,
               b_layout: cute.ComposedLayout, bh_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        nctas, _, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // 128)
        M = mXs.shape[0]
        N = mOutW.shape[1] * 2  # mOutW is the bf16 output as int32 words (2 columns each)
        KB = mXs.shape[1]
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())  # = bid % CM
        cid = bid // CM
        ncl = nctas // CM
        mpairs = (M + CM * BM - 1) // (CM * BM)
        ptiles = mpairs * ((N + BN - 1) // BN)
        if warp == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_g)
            cute.nvgpu.cpasync.prefetch_descriptor(tma_u)

        smem = cutlass.utils.SmemAllocator()
        bars = smem.allocate_array(cutlass.Int64, 2 * STAGES)
        sA = smem.allocate_tensor(F8, a_layout.outer, byte_alignment=1024, swizzle=a_layout.inner)
        sB = smem.allocate_tensor(F8, b_layout.outer, byte_alignment=1024, swizzle=b_layout.inner)
        sBh = cute.make_tensor(sB.iterator, bh_layout.outer)
        stage_bytes = (BM + 2 * BN) * BK  # fp8: one byte per code
        pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=bars,
            num_stages=STAGES,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            # a stage may be refilled only when the consumer warps of BOTH CTAs released it (the peer's TMA
            # writes into this CTA's stage too): lanes 0 and 1 of each consumer warp arrive on ranks 0 and 1
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, CM * NUM_MMA_WG * 4),
            tx_count=stage_bytes,
            cta_layout_vmnk=cute.make_layout((1, CM, 1, 1)),
        )  # (defer_sync off: ends with a cluster-wide barrier, so the peer's barriers are initialised)

        # TMA views: all row tiles over all K blocks, and the ring's stage buffers
        gA = cute.local_tile(tA, (BM, BK), (None, None))  # (BM, BK, M tiles, KB)
        gG = cute.local_tile(tG, (BN, BK), (None, None))  # (BN, BK, N tiles, KB)
        gU = cute.local_tile(tU, (BN, BK), (None, None))
        tAs, tAg = cute.nvgpu.cpasync.tma_partition(tma_a, 0, cute.make_layout(1), cute.group_modes(sA, 0, 2),
                                                    cute.group_modes(gA, 0, 2))
        tGs, tGg = cute.nvgpu.cpasync.tma_partition(tma_g, rank, cute.make_layout(CM), cute.group_modes(sBh, 0, 2),
                                                    cute.group_modes(gG, 0, 2))
        tUs, tUg = cute.nvgpu.cpasync.tma_partition(tma_u, rank, cute.make_layout(CM), cute.group_modes(sBh, 0, 2),
                                                    cute.group_modes(gU, 0, 2))
        mask = cutlass.Int16((1 << CM) - 1)  # multicast to every CTA of the pair (cluster ranks 0..CM-1)

        # pair tiles are taken M-fastest; CTA rank r of the pair owns row tile CM * (tile % mpairs) + r, and
        # both CTAs of a cluster walk the same tiles and K blocks (the multicast needs both in step)
        if wg == 0:
            cute.arch.warpgroup_reg_dealloc(40)
            if warp == 0:
                prod = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, STAGES)
                for tile in range(cid, ptiles, ncl):
                    bm = (tile % mpairs) * CM + rank
                    bn = tile // mpairs
                    for kb in range(KB):
                        pipe.producer_acquire(prod)
                        bar = pipe.producer_get_barrier(prod)
                        s = prod.index
                        cute.copy(tma_a, tAg[(None, bm, kb)], tAs[(None, s)], tma_bar_ptr=bar)
                        cute.copy(tma_g, tGg[(None, bn, kb)], tGs[(None, 2 * s)], tma_bar_ptr=bar, mcast_mask=mask)
                        cute.copy(tma_u, tUg[(None, bn, kb)], tUs[(None, 2 * s + 1)], tma_bar_ptr=bar,
                                  mcast_mask=mask)
                        pipe.producer_commit(prod)
                        prod.advance()
                pipe.producer_tail(prod)
        else:
            cute.arch.warpgroup_reg_alloc(232)
            mt = tidx - 128  # thread index among the 256 math threads
            wg_slice = tiled_mma.get_slice((wg - 1) * 128)  # wgmma partitions shared memory per warpgroup
            tCsA = wg_slice.partition_A(sA)
            tCsB = wg_slice.partition_B(sB)
            tCrA = tiled_mma.make_fragment_A(tCsA)
            tCrB = tiled_mma.make_fragment_B(tCsB)
            thr = tiled_mma.get_slice(mt)
            cC = thr.partition_C(cute.make_identity_tensor((BM, 2 * BN)))  # (row, col) of each accumulator element
            blk = cute.make_rmem_tensor(cC.shape, Float32)
            tot = cute.make_rmem_tensor(cC.shape, Float32)
            pair = cute.make_rmem_tensor(cute.make_layout(2), cutlass.BFloat16)
            pair_w = cute.recast_tensor(pair, Int32)
            nacc = cute.size(tot)
            half = nacc // 2
            kst = cute.size(tCrA, mode=[2])
            rd = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, STAGES)
            rel = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, STAGES)
            for tile in range(cid, ptiles, ncl):
                bm = (tile % mpairs) * CM + rank
                bn = tile // mpairs
                for i in cutlass.range_constexpr(nacc):
                    tot[i] = Float32(0.0)
                # the two activation rows this thread accumulates (rows g and g + 8 of its warp's 16)
                r0 = bm * BM + cC[0][0]
                r1 = bm * BM + cC[2][0]
                nsb = (bn * BN) // 128
                # block 0, then per block kb: retire block kb - 1's wgmmas, free its stage, promote it, issue block kb
                pipe.consumer_wait(rd)
                cute.nvgpu.warpgroup.fence()
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
                for k in cutlass.range_constexpr(kst):
                    crd = (None, None, k, rd.index)
                    cute.gemm(tiled_mma, blk, tCrA[crd], tCrB[crd], blk)
                    tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                cute.nvgpu.warpgroup.commit_group()
                rd.advance()
                for kb in range(1, KB):
                    g0, g1, u0, u1 = _scales(mXs, mGs, mUs, r0, r1, nsb, kb - 1, M)  # loads in flight over the waits
                    pipe.consumer_wait(rd)
                    cute.nvgpu.warpgroup.wait_group(0)
                    pipe.consumer_release(rel)
                    rel.advance()
                    _promote(blk, tot, g0, g1, u0, u1, half)
                    cute.nvgpu.warpgroup.fence()
                    tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
                    for k in cutlass.range_constexpr(kst):
                        crd = (None, None, k, rd.index)
                        cute.gemm(tiled_mma, blk, tCrA[crd], tCrB[crd], blk)
                        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                    cute.nvgpu.warpgroup.commit_group()
                    rd.advance()
                g0, g1, u0, u1 = _scales(mXs, mGs, mUs, r0, r1, nsb, KB - 1, M)
                cute.nvgpu.warpgroup.wait_group(0)
                pipe.consumer_release(rel)
                rel.advance()
                _promote(blk, tot, g0, g1, u0, u1, half)
                # epilogue (the producer is already loading the next tile): flat element i (gate, column c)
                # pairs with i + half (up, column c + 64); elements i, i + 1 are columns c, c + 1 of one row,
                # stored as one 4-byte word
                for i in cutlass.range_constexpr(0, half, 2):
                    row = bm * BM + cC[i][0]
                    col = bn * BN + cC[i][1]
                    if row < M and col < N:
                        for c2 in cutlass.range_constexpr(2):
                            gv = tot[i + c2]
                            uv = tot[i + c2 + half]
                            # silu(g) = g * 1 / (1 + e^-g): ex2.approx and rcp.approx, asked for by name (the
                            # epilogue runs while the tensor cores idle; IEEE exp + div cost ~40 instructions)
                            sig = cute.arch.rcp_approx(Float32(1.0) + cute.math.exp(-gv, fastmath=True))
                            pair[c2] = (gv * sig * uv).to(cutlass.BFloat16)
                        mOutW[row, col // 2] = pair_w[0]


@cute.jit
def _scales(mXs: cute.Tensor, mGs: cute.Tensor, mUs: cute.Tensor, r0: Int32, r1: Int32, nsb: Int32, kb: Int32,
            M: Int32):
    """The four promotion factors of K block kb: x_scale[row, kb] * w_scale[nsb, kb] for rows r0, r1 and gate, up."""
    s0 = Float32(0.0)
    s1 = Float32(0.0)
    if r0 < M:
        s0 = mXs[r0, kb]
    if r1 < M:
        s1 = mXs[r1, kb]
    sg = mGs[nsb, kb]
    su = mUs[nsb, kb]
    return s0 * sg, s1 * sg, s0 * su, s1 * su


@cute.jit
def _promote(blk: cute.Tensor, tot: cute.Tensor, g0: Float32, g1: Float32, u0: Float32, u1: Float32,
             half: cutlass.Constexpr):
    """tot += blk * factor: gate factors for the first half (columns < 64), up factors for the rest.

    Flat accumulator element i sits in row g (i % 4 < 2) or g + 8 (i % 4 >= 2) of the thread's
    warp slice: the wgmma C fragment is ((2 columns, 2 rows, n/8 column groups), 1, 1).
    """
    for i in cutlass.range_constexpr(half):
        if cutlass.const_expr(i % 4 < 2):
            tot[i] = tot[i] + blk[i] * g0
            tot[i + half] = tot[i + half] + blk[i + half] * u0
        else:
            tot[i] = tot[i] + blk[i] * g1
            tot[i + half] = tot[i + half] + blk[i + half] * u1


def _kernel(k: int):
    """Compiled for one K (static: the TMA strides and the K-block count are known); M and N are dynamic."""
    fn = _CACHE.get(k)
    if fn is None:
        m, n, nb = cute.sym_int(), cute.sym_int(), cute.sym_int()
        x = cute.runtime.make_fake_compact_tensor(cutlass.Uint8, (m, k), stride_order=(1, 0), assumed_align=16)
        xs = cute.runtime.make_fake_compact_tensor(Float32, (m, k // BK), stride_order=(1, 0))
        w_g = cute.runtime.make_fake_compact_tensor(cutlass.Uint8, (n, k), stride_order=(1, 0), assumed_align=16)
        w_u = cute.runtime.make_fake_compact_tensor(cutlass.Uint8, (n, k), stride_order=(1, 0), assumed_align=16)
        ws_g = cute.runtime.make_fake_compact_tensor(Float32, (nb, k // BK), stride_order=(1, 0))
        ws_u = cute.runtime.make_fake_compact_tensor(Float32, (nb, k // BK), stride_order=(1, 0))
        n2 = cute.sym_int()
        out = cute.runtime.make_fake_compact_tensor(Int32, (m, n2), stride_order=(1, 0))  # bf16 pairs
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        fn = cute.compile(_GateUp(), x, xs, w_g, ws_g, w_u, ws_u, out, stream, options="--enable-tvm-ffi")
        _CACHE[k] = fn
    return fn


def solve(x, x_scale, w_gate, w_gate_scale, w_up, w_up_scale):
    m, k = x.shape
    n = w_gate.shape[0]
    if k % BK or n % BN or tuple(w_up.shape) != (n, k):
        raise ValueError(f"need K a multiple of 128, N of 64 and matching gate/up weights, got x {tuple(x.shape)}, "
                         f"w_gate {tuple(w_gate.shape)}, w_up {tuple(w_up.shape)}")
    out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    codes = [t.contiguous().view(torch.uint8) for t in (x, w_gate, w_up)]  # fp8 crosses the FFI as bytes
    _kernel(k)(codes[0], x_scale.contiguous(), codes[1], w_gate_scale.contiguous(), codes[2],
               w_up_scale.contiguous(), out.view(torch.int32))
    return out
