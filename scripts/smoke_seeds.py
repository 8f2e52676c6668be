#!/usr/bin/env python
"""Check every problem's seed-dependent smoke checks over many seeds on the CPU (issue 16, item 4).

The audit (mkb.problems._audit) runs each problem at two seeds. A check whose outcome depends on the
drawn values (eager agrees with reference within the grader's tolerance, the reference's outputs are
finite and pass their own comparison, a second seed changes the outputs) can pass there and fail on a
fresh machine's seed. This script runs those checks for N seeds per problem and prints one line per
failure and a summary; it exits 1 if anything failed. The tolerance rule is the grader's, unchanged
(mkb.measure.compare): a problem that fails here gets better-conditioned inputs or a better eager,
never a looser check.

    PYTHONPATH=$PWD python scripts/smoke_seeds.py --seeds 20 [--problem N ...] [--log FILE]

tests/problems/test_smoke_seeds.py runs the same checks for 3 seeds in CI.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SeedCheck:
    """The outcome of the seed-dependent smoke checks of one problem at one seed."""

    problem: str
    seed: int
    ok: bool
    failures: tuple[str, ...]
    seconds: float


def check_seed(problem, seed: int) -> SeedCheck:
    """Run the value-dependent smoke checks of `problem` at `seed` (and seed + 1 for the seed dependence)."""
    from mkb.measure import as_tuple, clone_inputs, compare, expect

    fails: list[str] = []
    t0 = time.perf_counter()
    names = problem.meta.inputs
    try:
        a = problem.make_inputs(seed, device="cpu", size="smoke")
        exp = expect(problem.module, a)
        args = clone_inputs(a)
        r = compare(exp, problem.reference(*args), inputs_after=args, input_names=names)
        if not r.ok:
            fails.append(f"reference_self_consistent: {r.message}")
        if problem.has_eager:
            args = clone_inputs(a)
            r = compare(exp, problem.module.eager(*args), inputs_after=args, input_names=names)
            if not r.ok:
                fails.append(f"eager_agrees: {r.message}")
        b = problem.make_inputs(seed + 1, device="cpu", size="smoke")
        args = clone_inputs(b)
        r = compare(exp, problem.reference(*args), inputs_after=args, input_names=names)
        if r.ok:
            fails.append(f"output_depends_on_seed: seeds {seed} and {seed + 1} give outputs within tolerance")
        for k, o in enumerate(problem.meta.outputs):
            ref = as_tuple(exp.reference)[k]
            if isinstance(ref, torch.Tensor) and ref.numel() > 0:
                outs = list(as_tuple(exp.reference)[: exp.n_outputs])
                outs[k] = torch.zeros_like(ref)
                args = clone_inputs(a)
                problem.reference(*args)  # the mutated inputs' correct state, so only the zeroed output is wrong
                r = compare(exp, tuple(outs) if len(outs) > 1 else outs[0], inputs_after=args, input_names=names)
                if r.ok:
                    fails.append(f"fails_on[{o.name}: all zeros]: the comparison accepted it")
    except Exception as exc:  # a crash at one seed is a failure of that seed, reported, not a traceback
        fails.append(f"crashed: {type(exc).__name__}: {exc}")
    return SeedCheck(problem.slug, seed, not fails, tuple(fails), time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    from mkb.problems import discover, load_problem, problem_hash

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20, help="seeds 0..N-1 per problem (default 20)")
    ap.add_argument("--problem", type=int, action="append", default=None, help="only this problem number (repeatable)")
    ap.add_argument("--log", default=None, help="also write the report to this file")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    lines: list[str] = []

    def say(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    say(f"# smoke seed check: seeds 0..{a.seeds - 1} per problem, torch {torch.__version__}")
    n_bad = n_runs = 0
    bad_problems = []
    t0 = time.perf_counter()
    for path in discover():
        p = load_problem(path)
        if a.problem and p.number not in a.problem:
            continue
        res = [check_seed(p, s) for s in range(a.seeds)]
        bad = [r for r in res if not r.ok]
        n_runs += len(res)
        n_bad += len(bad)
        secs = sum(r.seconds for r in res)
        say(f"{p.slug} [{problem_hash(path.parent)[:12]}]: {len(res) - len(bad)}/{len(res)} seeds ok ({secs:.1f} s)")
        for r in bad:
            for f in r.failures:
                say(f"  seed {r.seed}: {f}")
        if bad:
            bad_problems.append(p.slug)
    say(f"# {n_runs - n_bad}/{n_runs} problem-seeds ok in {time.perf_counter() - t0:.0f} s; "
        f"failing problems: {', '.join(bad_problems) if bad_problems else 'none'}")
    if a.log:
        with open(a.log, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.exit(main())
