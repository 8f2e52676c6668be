#!/usr/bin/env python
"""Print each problem's full-size memory: one input set, its fp64 anchor inputs, and what a grading holds at most.

No GPU and no values: shapes come from make_inputs on the meta device, output shapes from the reference on the
meta device where it runs there (data-dependent references, e.g. routing with nonzero, report "?", and the
figure is then a lower bound). The grader's trusted plan (mkb.grader._harness._Plan) computes the expectation
(reference outputs and, for float outputs, their fp64 anchors) of every correctness draw, re-check set and the
final draw before the candidate is imported and keeps them through timing; it keeps their secret seeds, not
their inputs, and makes a set again where it is used. With the default GraderConfig that is
draws + ceil(recheck_fraction x n_timed) + 1 expectations; on top of them at most: the compile set, the timing
ring (InputStream keeps >= 3 sets) and, while an anchor is computed, a set and its fp64 copy. The last column
compares that bound with an H200's 141 GB (139.8 GiB usable).

    PYTHONPATH=$PWD python benchmarks/full_size_memory.py [--over-only]

--audit N measures instead the peak of problem N's full-size audit (mkb.problems._audit) on the CPU: the audit runs
at a probe size (AUDIT_PROBES: the full size's dimensions scaled down so that every large tensor keeps its
proportion to the others, e.g. 50's tokens : expert weights), every storage an op allocates is counted while it
lives (a TorchDispatchMode with a finaliser per storage: the bytes torch.cuda.max_memory_allocated would see,
without the allocator's rounding), and the peak, as a multiple of one input set, is scaled to the full-size set
(shapes on the meta device). 50 at its old 2048 tokens and the audit before the one-swapped-input change predicts
the 121 GiB allocated + 8 GiB requested of its H200 out-of-memory failure (events/h200-characterisation-3):

    PYTHONPATH=$PWD python benchmarks/full_size_memory.py --audit 50 [--audit 51] [--probe 50=4,64,16,32]
"""

from __future__ import annotations

import argparse
import math

import torch

H200_GIB = 139.8


def _bytes(values) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def _f64_bytes(values) -> int:
    return sum(v.numel() * 8 for v in values if isinstance(v, torch.Tensor) and v.is_floating_point())


# probe dimensions, in the order of the problem's SIZES tuple, with the full size's proportions between its large
# tensors: 50 (T, H, I, E): T / (E I) = 1024 / (256 x 1024) = 1 / 256 at full size and 2 / (32 x 16) here;
# 51 (T, H, I, E): T / (E I) = 4096 / (128 x 2880) ~ 1 / 90 at full size, 3 / (8 x 32) here, H = I as at full size
AUDIT_PROBES: dict[int, tuple[int, ...]] = {50: (2, 64, 16, 32), 51: (3, 32, 32, 8)}


class LiveBytes:
    """Counts the bytes of every tensor storage created inside it while that storage lives, and their peak."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        live = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in torch.utils._pytree.tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor) and t.device.type != "meta":
                        live._track(t.untyped_storage())
                return out

        self._mode = _Mode()
        self._sizes: dict[int, int] = {}
        self.current = self.peak = 0

    def _track(self, storage) -> None:
        import weakref

        key, n = storage.data_ptr(), storage.nbytes()
        if n == 0 or key in self._sizes:
            return
        self._sizes[key] = n
        self.current += n
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.current -= self._sizes.pop(key, 0)

    def __enter__(self) -> "LiveBytes":
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)


def audit_peak(number: int, dims: tuple[int, ...]) -> tuple[int, int, int, object]:
    """(peak bytes of the audit at the probe size, one probe input set's bytes, one full-size set's bytes, report)."""
    from mkb.problems import get_problem
    from mkb.problems._audit import audit_problem

    p = get_problem(number)
    sizes = getattr(p.module, "SIZES", None)
    if not isinstance(sizes, dict) or len(sizes["full"]) != len(dims):
        raise SystemExit(f"problem {number}: no SIZES dict with {len(dims)} dimensions to probe\n"
                         "hint: --audit works for problems whose make_inputs reads SIZES[size]")
    full_set = _bytes(p.make_inputs(0, device="meta", size="full"))
    sizes["probe"] = tuple(dims)
    try:
        probe_set = _bytes(p.make_inputs(0, device="meta", size="probe"))
        with LiveBytes() as live:
            report = audit_problem(p, size="probe", device="cpu")
    finally:
        del sizes["probe"]
    return live.peak, probe_set, full_set, report


def audit_main(numbers: list[int], probes: dict[int, tuple[int, ...]]) -> None:
    print(f"{'problem':52s} {'probe':>16s} {'probe peak':>10s} {'x sets':>6s} {'full set GiB':>12s} "
          f"{'full peak GiB':>13s}  fits H200  audit at probe size")
    for n in numbers:
        dims = probes.get(n) or AUDIT_PROBES.get(n)
        if dims is None:
            raise SystemExit(f"problem {n}: no probe dimensions\nhint: pass --probe {n}=d1,d2,...")
        peak, probe_set, full_set, rep = audit_peak(n, dims)
        ratio = peak / probe_set
        full_peak = ratio * full_set / 2**30
        status = "ok" if rep.ok else "FAIL: " + rep.failures().splitlines()[0][:80]
        print(f"{rep.slug[:52]:52s} {','.join(map(str, dims)):>16s} {peak / 2**10:8.0f}KB {ratio:6.2f} "
              f"{full_set / 2**30:12.2f} {full_peak:13.1f}  {'yes' if full_peak < H200_GIB else 'NO':9s}  {status}")


def main() -> None:
    from mkb.grader import GraderConfig
    from mkb.grader._harness import needs_sampling
    from mkb.problems import problems

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--over-only", action="store_true", help="only problems whose grading may exceed an H200")
    ap.add_argument("--audit", type=int, action="append", default=[], metavar="N",
                    help="measure problem N's full-size audit peak instead (CPU, at a probe size; repeatable)")
    ap.add_argument("--probe", action="append", default=[], metavar="N=D1,D2,...",
                    help="probe dimensions for --audit N, in the order of the problem's SIZES tuple")
    a = ap.parse_args()
    if a.audit:
        probes = {}
        for item in a.probe:
            num, _, dims = item.partition("=")
            try:
                probes[int(num)] = tuple(int(d) for d in dims.split(","))
            except ValueError:
                raise SystemExit(f"--probe {item!r}: expected N=D1,D2,... (integers)") from None
        audit_main(a.audit, probes)
        return
    cfg = GraderConfig()
    n_exp = cfg.n_expectations
    print(f"# grading: {n_exp} expectations kept (GraderConfig draws={cfg.draws}, n_timed={cfg.n_timed}, "
          f"recheck_fraction={cfg.recheck_fraction}: {cfg.draws} draws, the re-check sets, the final draw), plus at most "
          f"4 input sets and one fp64 copy; 'sampled': the same with every allclose output over {SAMPLE_K} elements "
          f"kept at {SAMPLE_K} positions (DESIGN, full-size memory), beside the larger of the trusted phase (the compile "
          f"set, a set, its fp64 copy, the one full expectation being computed) and the timing phase (4 sets); 'auto': what grader 2.3 "
          f"picks on an H200 (mkb.grader._harness.needs_sampling, with that trusted-phase figure as the working peak)")
    print(f"{'problem':58s} {'inputs GiB':>10s} {'fp64 in GiB':>11s} {'outputs GiB':>11s} {'peak GiB':>9s}  fits H200"
          f"  {'sampled GiB':>11s}  auto")
    over = 0
    for p in problems():
        try:
            inputs = p.make_inputs(0, device="meta", size="full")
        except Exception:  # make_inputs that needs a real generator: no shapes here
            print(f"{p.slug:58s} {'?':>10s}")
            continue
        ib, fb = _bytes(inputs) / 2**30, _f64_bytes(inputs) / 2**30
        outs, approx = _output_shapes(p, inputs)
        known = outs is not None
        # per expectation: the reference's outputs and their fp64 anchors (plus mutated inputs, counted in the set)
        # unknown outputs count as 0: the figure is then a lower bound (">=")
        ob = sum(n * e for n, e, _, _ in outs) / 2**30 if known else math.nan
        ob64 = sum(n * 8 for n, _, f, _ in outs if f) / 2**30 if known else math.nan
        peak = n_exp * (ob + ob64 if known else 0.0) + 4 * ib + fb
        # sampled: the kept expectations beside the larger of the trusted phase (the plan's compile set, one set, its
        # fp64 copy and the full expectation being computed, before it is sampled) and the timing phase (the compile
        # set and a ring of 3)
        kept = n_exp * sum((min(n, SAMPLE_K) if f and m == "allclose" else n) * (e + 8 * f)
                           for n, e, f, m in outs) / 2**30 if known else math.nan
        sampled = kept + max(2 * ib + fb + ob + ob64, 4 * ib)
        auto = "?" if not known else ("sampled" if needs_sampling(
            "auto", n_expectations=n_exp, expectation_bytes=round((ob + ob64) * 2**30),
            working_bytes=round((ib + fb + ob + ob64) * 2**30), free_bytes=round(H200_GIB * 2**30)) else "whole")
        fits = "NO" if peak >= H200_GIB else ("yes" if known else "?")
        over += fits == "NO"
        if a.over_only and fits != "NO":
            continue
        fmt = lambda x: "?" if math.isnan(x) else ("~" if approx else "") + f"{x:.1f}"  # noqa: E731
        print(f"{p.slug:58s} {ib:10.2f} {fb:11.2f} {fmt(ob):>11s} {('' if known else '>=') + fmt(peak):>9s}  "
              f"{fits:9s}  {fmt(sampled):>11s}  {auto}")
    print(f"# {over} problems' gradings may exceed an H200 at full size (~: outputs scaled from the audit probe size)")


def _sample_k() -> int:
    from mkb.measure import SAMPLE_POSITIONS

    return SAMPLE_POSITIONS


SAMPLE_K = _sample_k()  # positions kept per sampled output (DESIGN, Problem contract, full-size memory)


def _modes(p, n: int) -> list[str]:
    """The compare mode of each of the reference's n outputs (META.outputs order)."""
    outs = list(getattr(p.meta, "outputs", ()))
    return [getattr(o, "compare", "allclose") for o in outs[:n]] + ["allclose"] * max(0, n - len(outs))


def _output_shapes(p, inputs) -> tuple[list[tuple[int, int, bool, str]] | None, bool]:
    """[(numel, element bytes, is float, compare mode)] of the reference's full-size outputs, and whether they are scaled from the
    audit probe size: a data-dependent reference (routing by nonzero/unique) cannot run on the meta device, so one in
    AUDIT_PROBES runs on the CPU at its probe size and each output's size is scaled by full set / probe set."""
    from mkb.measure import as_tuple

    try:
        outs = as_tuple(p.reference(*inputs))
        return [(o.numel(), o.element_size(), o.is_floating_point(), m) for o, m in zip(outs, _modes(p, len(outs)))
                if isinstance(o, torch.Tensor)], False
    except Exception:  # noqa: BLE001 - data-dependent on meta
        pass
    dims = AUDIT_PROBES.get(p.number)
    sizes = getattr(p.module, "SIZES", None)
    if dims is None or not isinstance(sizes, dict):
        return None, False
    sizes["probe"] = dims
    try:
        small = p.make_inputs(0, device="cpu", size="probe")
        scale = _bytes(inputs) / _bytes(small)
        outs = as_tuple(p.reference(*small))
    finally:
        del sizes["probe"]
    return [(round(o.numel() * scale), o.element_size(), o.is_floating_point(), m) for o, m in zip(outs, _modes(p, len(outs)))
            if isinstance(o, torch.Tensor)], True


if __name__ == "__main__":
    main()
