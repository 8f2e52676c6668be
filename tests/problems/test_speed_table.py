"""The baseline speed table in problems/README.md: generated from verdict and torch_compile events, `--check` fails when stale."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from mkb.cli.run import app
from mkb.events import EventWriter
from mkb.problems import baselines, get_problem
from mkb.problems._speed import kernel_sha256, speed_rows

README = "# Problems\n\nintro\n"


def _verdict(w, b, *, median, problem_hash, passed=True, gpu_model="H200", details=None, scope="attempt"):
    w.emit("verdict", evaluation_id=f"e-{median}", scope=scope, problem=b.problem, dsl=b.dsl, kernel_sha256=kernel_sha256(b.path),
           passed=passed, reason=None if passed else "wrong_values", speedup=1000.0 / median if passed else None,
           eager_median_us=1000.0, candidate_median_us=median, r_at_0=passed, r_at_0_5=passed, r_at_1=passed, r_at_2=passed,
           r_at_4=passed, s=100.0 if passed else 0.0, gpu=f"NVIDIA {gpu_model}", gpu_model=gpu_model, problem_hash=problem_hash,
           details=details)


def _cli(*args):
    return CliRunner().invoke(app, ["problems", "speed-table", *args])


def test_rows_take_every_grading_of_the_newest_dataset_under_the_current_hash_and_torch_compile_of_the_same_version(tmp_path):
    b = next(x for x in baselines([28]) if x.dsl == "cute")
    p = get_problem(28)
    older, newer = str(tmp_path / "h200-a"), str(tmp_path / "h200-b")
    with EventWriter(older) as w:
        _verdict(w, b, median=90.0, problem_hash=p.hash)
    with EventWriter(newer) as w:
        _verdict(w, b, median=1.0, problem_hash="an-older-version")  # another version of the problem: never shown
        _verdict(w, b, median=80.0, problem_hash=p.hash)
        _verdict(w, b, median=84.0, problem_hash=p.hash)  # the newer dataset's gradings, all of them: a level per process
        w.emit("torch_compile", problem=28, problem_name=p.slug, family=p.family, problem_hash=p.hash, size="full", mode="default",
               backend="inductor", gpu="NVIDIA H200", gpu_model="H200", torch_version="2.11.0", status="ok", ok=True,
               median_us=164.0, eager_median_us=1000.0, speedup_over_eager=6.25)
    rows, missing = speed_rows([older, newer])
    assert [(r.problem, r.dsl, r.gpu_model, r.median_us, r.n, r.min_us, r.max_us) for r in rows] == [
        (28, "cute", "H200", 82.0, 2, 80.0, 84.0)]
    r = rows[0]
    assert r.speedup_eager == (1000 / 80 + 1000 / 84) / 2 and r.speedup_compile == 2.0 and r.compile_mode == "default"
    assert r.dataset == "h200-b" and 0 < r.sol_fraction < 1
    assert (28, "tirx") in {(m.problem, m.dsl) for m in missing}


def test_a_failed_grading_among_the_newest_makes_the_row_failed(tmp_path):
    b = next(x for x in baselines([28]) if x.dsl == "cute")
    p = get_problem(28)
    store = str(tmp_path / "h200-f")
    with EventWriter(store) as w:
        _verdict(w, b, median=80.0, problem_hash=p.hash)
        _verdict(w, b, median=81.0, problem_hash=p.hash, passed=False)
    (r,), _ = speed_rows([store])
    assert not r.passed and r.reason == "wrong_values" and r.median_us is None and r.n == 2


def test_a_verdict_under_a_changed_grader_config_is_never_shown(tmp_path):
    b = next(x for x in baselines([28]) if x.dsl == "cute")
    p = get_problem(28)
    store = str(tmp_path / "h200-ab")
    with EventWriter(store) as w:
        _verdict(w, b, median=90.0, problem_hash=p.hash, details='{"grader_version": "2.2", "config_overrides": {}}')
    with EventWriter(store) as w:  # newer, but an A/B arm: not the grader as shipped
        _verdict(w, b, median=70.0, problem_hash=p.hash,
                 details='{"grader_version": "2.2", "config_overrides": {"n_profiled": 0, "early_stop": false}}')
    rows, _ = speed_rows([store])
    assert [r.median_us for r in rows] == [90.0]


def test_a_verdict_graded_beside_another_or_set_aside_is_never_shown(tmp_path):
    b = next(x for x in baselines([28]) if x.dsl == "cute")
    p = get_problem(28)
    store = str(tmp_path / "h200-overlap")
    with EventWriter(store) as w:
        _verdict(w, b, median=90.0, problem_hash=p.hash, details='{"grader_version": "2.12", "in_flight": {"queue": 1}}')
        _verdict(w, b, median=70.0, problem_hash=p.hash, details='{"grader_version": "2.12", "in_flight": {"queue": 2}}')
        _verdict(w, b, median=60.0, problem_hash=p.hash, passed=False, scope="superseded")
    (r,), _ = speed_rows([store])
    assert (r.median_us, r.n, r.passed) == (90.0, 1, True)


def test_check_fails_when_the_table_is_stale_and_passes_after_write(tmp_path):
    b = next(x for x in baselines([28]) if x.dsl == "tirx")
    p = get_problem(28)
    store, readme = str(tmp_path / "h200-y"), tmp_path / "README.md"
    readme.write_text(README)
    with EventWriter(store) as w:
        _verdict(w, b, median=85.0, problem_hash=p.hash)
    assert _cli("--check", "--out", str(readme), "--store", store).exit_code == 1  # no table yet
    out = _cli("--write", "--out", str(readme), "--store", store)
    assert out.exit_code == 0, out.output
    text = readme.read_text()
    assert text.startswith(README) and "## Baseline speed" in text and f"| {p.slug} | tirx | H200 | yes | 85.0 | 1 |" in text
    assert _cli("--check", "--out", str(readme), "--store", store).exit_code == 0
    with EventWriter(store) as w:  # a newer grading: the committed table no longer says what the datasets say
        _verdict(w, b, median=70.0, problem_hash=p.hash)
    stale = _cli("--check", "--out", str(readme), "--store", store)
    assert stale.exit_code == 1 and "out of date" in stale.output
    assert _cli("--write", "--out", str(readme), "--store", store).exit_code == 0
    assert "| 77.5 | 2 (70.0-85.0) |" in readme.read_text() and readme.read_text().count("speed-table:begin") == 1


def test_the_committed_table_is_up_to_date():
    readme = Path(__file__).resolve().parents[2] / "problems" / "README.md"
    out = _cli("--check", "--out", str(readme))
    assert out.exit_code == 0, out.output
