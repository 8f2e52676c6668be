"""The grader with sampled expectations (grader 2.3) on the CPU: forced with GraderConfig(expectations="sampled") and a
small `sample_positions`, since "auto" samples only where the whole expectations do not fit a GPU."""

from __future__ import annotations

import random

import pytest

from fake_dsl import TORCH_BASELINE_28
from mkb.grader import GraderConfig, grade
from mkb.grader._harness import _Plan, needs_sampling
from mkb.grader._problems import load_problem

GiB = 2**30
K = 64  # positions per sampled output; problem 28's smoke output has 67 x 256 = 17152 elements


def _kernel(tmp_path, source: str, name: str = "kernel.py"):
    p = tmp_path / name
    p.write_text(source)
    return p


def _sampled(cpu_config: GraderConfig) -> GraderConfig:
    return GraderConfig.from_dict({**cpu_config.as_dict(), "expectations": "sampled", "sample_positions": K})


def _plan(cfg: GraderConfig, secret: int) -> tuple[_Plan, random.Random]:
    mod = load_problem(28)
    rng = random.Random(secret)
    return _Plan(mod, cfg, rng, lambda s: tuple(mod.make_inputs(s, device="cpu", size="smoke")),
                 lambda: rng.getrandbits(62)), random.Random(secret)


def test_a_correct_kernel_passes_and_the_verification_says_the_expectations_were_sampled(tmp_path, fake_dsl, cpu_config, store):
    v = grade(28, fake_dsl, _kernel(tmp_path, TORCH_BASELINE_28), store=store, config=_sampled(cpu_config))
    assert v.passed, v.message
    f = v.stage("verification").typed
    assert f.expectations == "sampled" and f.sampled_positions == {"y": K}
    assert all(c["max_abs_err"] <= c["tolerance"] for d in f.details for c in d["checks"])
    assert f.expectations_kept_bytes < f.expectations_whole_bytes
    # the verdict event records it (its details; the verification event's details hold the draws)
    import glob
    import json

    import pyarrow.parquet as pq

    (row,) = [r for f_ in sorted(glob.glob(f"{store}/kind=verdict/*.parquet")) for r in pq.read_table(f_).to_pylist()]
    details = json.loads(row["details"])
    from mkb.grader import GRADER_VERSION

    assert details["grader_version"] == GRADER_VERSION and tuple(map(int, GRADER_VERSION.split("."))) >= (2, 3)
    assert details["expectations"]["expectations"] == "sampled"
    assert details["expectations"]["sampled_positions"] == {"y": K}


def test_a_whole_grading_records_whole(tmp_path, fake_dsl, cpu_config, store):
    v = grade(28, fake_dsl, _kernel(tmp_path, TORCH_BASELINE_28), store=store, config=cpu_config)
    assert v.passed, v.message
    f = v.stage("verification").typed
    assert f.expectations == "whole" and f.sampled_positions == {}
    assert f.expectations_kept_bytes == f.expectations_whole_bytes and f.device_free_bytes is None


@pytest.mark.parametrize("body, reason", [
    ("    y = _real(x, residual, weight)\n    y[:, ::3] += 1\n    return y\n", "wrong_output"),
    ("    return torch.zeros_like(x)\n", "all_zero"),
    ("    return torch.full_like(x, 0.5)\n", "constant"),
    ("    y = _real(x, residual, weight)\n    y[3, 17] = float('nan')\n    return y\n", "nan"),
    ("    return _real(x, residual, weight)[:, :-1]\n", "wrong_shape"),
    ("    return _real(x, residual, weight).float()\n", "wrong_shape"),
], ids=["many_wrong", "zeros", "constant", "one_nan", "shape", "dtype"])
def test_wrong_kernels_fail_with_the_whole_comparisons_reason(tmp_path, fake_dsl, cpu_config, store, body, reason):
    src = TORCH_BASELINE_28.replace("def solve(", "def _real(") + "\n\ndef solve(x, residual, weight):\n" + body
    v = grade(28, fake_dsl, _kernel(tmp_path, src), store=store, config=_sampled(cpu_config))
    assert not v.passed and v.reason == reason, v.message


def test_auto_keeps_a_small_problem_whole_and_draws_the_same_seeds_as_before(cpu_config):
    plan, rng = _plan(cpu_config, 1234)
    assert cpu_config.expectations == "auto" and plan.expectations == "whole"
    assert plan.sampled_positions == {} and all(not e.sampled for _, e in plan.draws)
    # the trusted rng's sequence is grader 2.2's: draws, compile set, warm-ups, re-check positions, their seeds, final
    assert [s for s, _ in plan.draws] == [rng.getrandbits(62) for _ in range(cpu_config.draws)]
    rng.getrandbits(62)
    assert plan.n_warm == cpu_config.n_warmup + rng.randrange(cpu_config.warmup_jitter + 1)
    n = cpu_config.n_timed
    re = set(rng.sample(range(n - 1), min(max(1, round(cpu_config.recheck_fraction * n)), n - 1))) | {n - 1}
    assert sorted(plan.recheck_sets) == sorted(re)
    assert [plan.recheck_sets[k][0] for k in sorted(re)] == [rng.getrandbits(62) for _ in re]
    assert plan.final_seed == rng.getrandbits(62)
    assert len(plan.draws) + len(plan.recheck_sets) + 1 == cpu_config.n_expectations


def test_positions_differ_between_the_expectations_of_a_grading_and_between_gradings(cpu_config):
    cfg = _sampled(cpu_config)
    a, _ = _plan(cfg, 1)
    b, _ = _plan(cfg, 2)
    assert a.expectations == b.expectations == "sampled"
    kept = [e for _, e in a.draws] + [e for _, e in a.recheck_sets.values()] + [a.final_expected]
    pos = [tuple(e.sampled[0].positions().tolist()) for e in kept]
    assert len(set(pos)) == len(pos) == cfg.n_expectations
    assert tuple(b.draws[0][1].sampled[0].positions().tolist()) not in set(pos)
    assert a.kept_bytes == cfg.n_expectations * K * (2 + 8)  # bf16 reference + fp64 anchor at K positions


def test_needs_sampling():
    fit = dict(n_expectations=17, working_bytes=10 * GiB, free_bytes=139 * GiB)
    assert not needs_sampling("auto", expectation_bytes=5 * GiB, **fit)  # 56: ~85 GiB of whole expectations fit
    assert needs_sampling("auto", expectation_bytes=25 * GiB, **fit)  # 34, 38
    assert needs_sampling("auto", expectation_bytes=36 * GiB, **fit)  # 50
    assert not needs_sampling("auto", expectation_bytes=36 * GiB, n_expectations=17, working_bytes=None, free_bytes=None)
    assert needs_sampling("sampled", expectation_bytes=0, n_expectations=17, working_bytes=None, free_bytes=None)
    assert not needs_sampling("whole", expectation_bytes=36 * GiB, **fit)


def test_the_config_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="expectations"):
        GraderConfig(expectations="some")
    with pytest.raises(ValueError, match="sample_positions"):
        GraderConfig(sample_positions=0)


def test_the_gpu_runs_script_logic_on_the_cpu(tmp_path):
    """scripts/gpu_sampled_run.py (the H200 run of 50, 34, 38 at full size) as a CPU dry run at smoke size."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(repo / "scripts" / "gpu_sampled_run.py"), "--device", "cpu", "--size", "smoke",
                        "--expectations", "sampled", "--sample-positions", "64", "--problems", "38", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(repo)})
    assert r.returncode == 0, r.stderr[-2000:]
    (row,) = json.loads((tmp_path / "summary.json").read_text())["problems"]
    assert row["ok"] and row["eager_ok"], row.get("error")
    assert row["plan"]["expectations"] == "sampled" and row["plan"]["n_expectations"] == 17
    assert all(c["rejected_as_wanted"] for c in row["negative_controls"])
    assert len(row["checks"]) == 2 * 17 and all(c["ok"] for c in row["checks"])
