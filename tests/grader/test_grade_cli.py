"""`mkb-run grade` prints a readable verdict and exits 0 only when the kernel passed."""

from __future__ import annotations

from typer.testing import CliRunner

from fake_dsl import TORCH_BASELINE_28
from mkb.cli.run import app


def test_grade_command_prints_the_verdict_and_sets_the_exit_status(tmp_path, fake_dsl, store):
    good = tmp_path / "good.py"
    good.write_text(TORCH_BASELINE_28)
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\n\n\ndef solve(x, residual, weight):\n    return torch.zeros_like(x)\n")
    args = ["grade", "--problem", "28", "--dsl", fake_dsl, "--device", "cpu", "--size", "smoke", "--quick", "--store", store]
    r = CliRunner().invoke(app, args + [str(good)])
    assert r.exit_code == 0, r.output
    assert "PASSED" in r.output and "verification" in r.output and "(fake)" in r.output
    r = CliRunner().invoke(app, args + [str(bad)])
    assert r.exit_code == 1
    assert "FAILED" in r.output and "all_zero" in r.output


def test_grade_command_takes_many_kernels_through_one_queue(tmp_path, fake_dsl, store):
    good = tmp_path / "good.py"
    good.write_text(TORCH_BASELINE_28)
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\n\n\ndef solve(x, residual, weight):\n    return torch.zeros_like(x)\n")
    args = ["grade", "--problem", "28", "--dsl", fake_dsl, "--device", "cpu", "--size", "smoke", "--quick", "--store", store]
    r = CliRunner().invoke(app, args + [str(good), str(bad)])
    assert r.exit_code == 1, r.output
    assert "1 of 2 passed" in r.output and "all_zero" in r.output and "passed" in r.output


def test_baselines_are_discovered_from_the_problem_folders_not_listed():
    from mkb.cli._grade import _jobs
    from mkb.dsl import baseline_files
    from mkb.problems import discover

    expected = {(int(p.parent.name[:2]), dsl, p.parent / name) for p in discover() for name, dsl in baseline_files().items()
                if (p.parent / name).is_file()}
    jobs = _jobs([], baselines=True, problem=None, dsl=None)
    assert expected and {(j.problem, j.dsl, j.kernel_path) for j in jobs} == expected
    some = sorted({e[0] for e in expected})[:1]
    sub = _jobs([str(n) for n in some], baselines=True, problem=None, dsl=None)
    assert {j.problem for j in sub} == set(some)
    one_dsl = next(iter(baseline_files().values()))
    assert {j.dsl for j in _jobs([], baselines=True, problem=None, dsl=one_dsl)} == {one_dsl}


def test_bad_names_are_one_line_errors(tmp_path):
    for args in (["grade", "--baselines", "--dsl", "nodsl"], ["grade", "--baselines", "99"], ["grade", str(tmp_path / "x.py")],
                 ["grade"], ["grade", "--device", "gpu", "--baselines"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert "error:" in r.output and "Traceback" not in r.output, (args, r.output)
    k = tmp_path / "kernel.py"
    k.write_text("def solve(*a):\n    pass\n")
    r = CliRunner().invoke(app, ["grade", str(k)])
    assert r.exit_code == 2 and "--problem" in r.output, r.output


def test_confined_grading_is_refused_up_front_on_a_kernel_without_landlock(tmp_path, fake_dsl, store, monkeypatch):
    from mkb.grader import _confine

    good = tmp_path / "good.py"
    good.write_text(TORCH_BASELINE_28)
    args = ["grade", "--problem", "28", "--dsl", fake_dsl, "--device", "cpu", "--size", "smoke", "--quick", "--store", store,
            "--confined", str(good)]
    if _confine.landlock_abi() >= 1 and _confine.seccomp_unavailable() is None:  # here --confined grades as usual
        r = CliRunner().invoke(app, args + ["--json"])
        assert r.exit_code == 0, r.output
        import json
        from pathlib import Path

        import pyarrow.parquet as pq

        (v,) = json.loads(r.output)
        assert v["passed"]
        (row,) = [r for f in Path(store).rglob("kind=verdict/*.parquet") for r in pq.read_table(f).to_pylist()]
        overrides = json.loads(row["details"])["config_overrides"]  # graded under them, and recorded
        assert overrides["fs_guard"] == overrides["syscall_guard"] == "required"
    monkeypatch.setattr(_confine, "landlock_abi", lambda: 0)
    r = CliRunner().invoke(app, args)
    assert r.exit_code != 0 and "has no Landlock" in r.output and "hint:" in r.output


def test_a_grader_spec_is_read_in_one_place_and_refuses_what_it_does_not_know(monkeypatch):
    import pytest

    from mkb.experiment._graders import grader_from_spec
    from mkb.grader import ConfinementUnavailable, _confine

    assert grader_from_spec("none", None) is None
    with pytest.raises(ValueError, match="gpu:confined"):
        grader_from_spec("gpu:strict", None)
    monkeypatch.setattr(_confine, "seccomp_unavailable", lambda: "seccomp filters unavailable: EINVAL (test)")
    with pytest.raises(ConfinementUnavailable, match="cannot be refused .seccomp filters unavailable: EINVAL"):
        grader_from_spec("gpu:confined", None)  # before any GPU is looked for
    monkeypatch.setattr(_confine, "landlock_abi", lambda: 0)
    with pytest.raises(ConfinementUnavailable, match="has no Landlock.*; the calls a candidate must not make"):
        grader_from_spec("gpu:confined", None)  # every guard it lacks, named
