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


def main() -> None:
    from mkb.grader import GraderConfig
    from mkb.measure import as_tuple
    from mkb.problems import problems

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--over-only", action="store_true", help="only problems whose grading may exceed an H200")
    a = ap.parse_args()
    cfg = GraderConfig()
    n_exp = cfg.draws + max(1, round(cfg.recheck_fraction * cfg.n_timed)) + 1
    print(f"# grading: {n_exp} expectations kept (GraderConfig draws={cfg.draws}, n_timed={cfg.n_timed}, "
          f"recheck_fraction={cfg.recheck_fraction}), plus at most 4 input sets and one fp64 copy")
    print(f"{'problem':58s} {'inputs GiB':>10s} {'fp64 in GiB':>11s} {'outputs GiB':>11s} {'peak GiB':>9s}  fits H200")
    over = 0
    for p in problems():
        try:
            inputs = p.make_inputs(0, device="meta", size="full")
        except Exception:  # make_inputs that needs a real generator: no shapes here
            print(f"{p.slug:58s} {'?':>10s}")
            continue
        ib, fb = _bytes(inputs) / 2**30, _f64_bytes(inputs) / 2**30
        try:
            outs = as_tuple(p.reference(*inputs))
            ob = _bytes(outs) / 2**30
            ob64 = _f64_bytes(outs) / 2**30
        except Exception:  # data-dependent reference: no shapes without values
            ob = ob64 = math.nan
        # per expectation: the reference's outputs and their fp64 anchors (plus mutated inputs, counted in the set)
        # unknown outputs count as 0: the figure is then a lower bound (">=")
        known = not math.isnan(ob)
        peak = n_exp * (ob + ob64 if known else 0.0) + 4 * ib + fb
        fits = "NO" if peak >= H200_GIB else ("yes" if known else "?")
        over += fits == "NO"
        if a.over_only and fits != "NO":
            continue
        fmt = lambda x: "?" if math.isnan(x) else f"{x:.1f}"  # noqa: E731
        print(f"{p.slug:58s} {ib:10.2f} {fb:11.2f} {fmt(ob):>11s} {('' if known else '>=') + f'{peak:.1f}':>9s}  {fits}")
    print(f"# {over} problems' gradings may exceed an H200 at full size")


if __name__ == "__main__":
    main()
