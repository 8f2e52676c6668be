"""analysis/rebuild.py (polars + numpy, no mkb) rebuilds mkb-analyze's lift, standing and regression tables.

Run on the synthetic demo dataset and on every committed experiment dataset (`events/*` with attempts),
each exported with `mkb-analyze export` (Parquet files + schema card) and read back without mkb.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mkb.cli.analyze import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
RESAMPLES = "400"
LIFT_COLS = ("n_pairs", "n_problems", "S_arm", "S_solo", "lift", "lift_lo", "lift_hi", "rel_lift", "rel_lo", "rel_hi",
             "regression_rate", "regression_rate_lo", "regression_rate_hi", "improvement_rate", "improvement_rate_lo",
             "improvement_rate_hi", "tie_rate", "tie_rate_lo", "tie_rate_hi", "pair_regress", "regression_noise_floor")
STANDING_COLS = ("n_pairs", "n_above", "n_tie", "n_below", "improve_above", "regress_above", "improve_below", "regress_below",
                 "effect", "effect_lo", "effect_hi", "effect_S", "effect_S_lo", "effect_S_hi")


def _kit(export: Path) -> dict:
    """Run the kit in a process where mkb cannot be imported."""
    code = textwrap.dedent(f"""
        import json, sys
        sys.path = [p for p in sys.path if p not in ("", {str(ROOT)!r})]
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "mkb":
                    raise ModuleNotFoundError("mkb is blocked", name=name)
        sys.meta_path.insert(0, Block())
        sys.path.insert(0, {str(ROOT / "analysis")!r})
        import rebuild
        t = rebuild.rebuild({str(export)!r}, resamples={RESAMPLES})
        assert not any(m.split(".")[0] == "mkb" for m in sys.modules)
        print(json.dumps({{k: v.to_dicts() for k, v in t.items()}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def _mkb(store: str, cmd: str) -> list[dict]:
    r = runner.invoke(app, [cmd, "--store", store, "--resamples", RESAMPLES, "--json", "-"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["tables"][cmd]


def _same(kit_rows, mkb_rows, keys, cols):
    k = {tuple(r[c] for c in keys): r for r in kit_rows}
    m = {tuple(r[c] for c in keys): r for r in mkb_rows}
    assert k.keys() == m.keys() and len(m) >= 6
    for key in m:
        for c in cols:
            a, b = k[key][c], m[key][c]
            assert (a is None) == (b is None), (key, c, a, b)
            if a is not None:
                assert a == pytest.approx(b, abs=1e-9), (key, c, a, b)


def _check(store: str, tmp: Path) -> None:
    exp = tmp / "export"
    r = runner.invoke(app, ["export", "--store", store, "--out", str(exp)])
    assert r.exit_code == 0, r.output
    kit = _kit(exp)
    lift = _mkb(store, "lift")
    _same(kit["lift"], lift, ("model", "arm_kind", "direction"), LIFT_COLS)
    _same(kit["regression"], lift, ("model", "arm_kind", "direction"), ("regression_rate", "regression_rate_lo", "regression_noise_floor"))
    _same(kit["standing"], _mkb(store, "standing"), ("arm_kind", "direction"), STANDING_COLS)


def test_kit_equals_mkb_analyze_on_the_synthetic_demo(tmp_path):
    store = str(tmp_path / "demo")
    r = runner.invoke(app, ["synth", "--store", store, "--problems", "30", "--models", "2"])
    assert r.exit_code == 0, r.output
    _check(store, tmp_path)


def test_kit_equals_mkb_analyze_under_the_plans_upstream_score(tmp_path):
    """A plan naming s_upstream: the kit and mkb-analyze both default to it, and agree."""
    from mkb.analysis.synthetic import SynthSpec, write_synthetic
    from mkb.events import EventWriter
    from mkb.experiment import build_plan, parse_config

    store = str(tmp_path / "up")
    write_synthetic(SynthSpec(models=("m",), model_means=(0.7,), n_problems=16, replicates=3, seed=4, upstream_factor=4.0), store)
    cfg = parse_config({"experiment": {"name": "synthetic", "problems": [28, 72], "replicates": 2, "score": "s_upstream"},
                        "models": [{"name": "m"}]})
    with EventWriter(store) as w:
        w.emit("plan", **build_plan(cfg).event())
    _check(store, tmp_path)
    assert "Derived tables: score: S_upstream" in (tmp_path / "export" / "README.md").read_text()
    up, eager = _mkb(store, "lift"), _mkb_score(store, "s")
    assert [r["S_solo"] for r in up] != [r["S_solo"] for r in eager]


def _mkb_score(store: str, score: str) -> list[dict]:
    r = runner.invoke(app, ["lift", "--store", store, "--resamples", RESAMPLES, "--score", score, "--json", "-"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["score"] == score
    return doc["tables"]["lift"]


def _experiment_datasets() -> list[Path]:
    """Datasets an experiment made: they carry its plan (a single-attempt demo such as h200-agent-demo has attempts
    but no plan and no re-graded final verdicts, so it has no pairs to analyse)."""
    return sorted(d for d in (ROOT / "events").glob("*") if (d / "kind=plan").is_dir())


@pytest.mark.parametrize("dataset", _experiment_datasets() or [None], ids=lambda d: d.name if d else "none-committed-yet")
def test_kit_equals_mkb_analyze_on_every_committed_experiment_dataset(dataset, tmp_path):
    if dataset is None:
        # the repository holds no experiment dataset yet: assert that (so adding one makes this test run on it)
        assert not any((d / "kind=plan").is_dir() for d in (ROOT / "events").glob("*"))
        return
    _check(str(dataset), tmp_path)


def test_notebook_cells_run_on_an_export(tmp_path):
    store = str(tmp_path / "demo")
    assert runner.invoke(app, ["synth", "--store", store, "--problems", "12", "--models", "1"]).exit_code == 0
    assert runner.invoke(app, ["export", "--store", store, "--out", str(tmp_path / "exp")]).exit_code == 0
    nb = json.loads((ROOT / "analysis" / "reanalysis.ipynb").read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    code[0] = f"DATASET = {str(tmp_path / 'exp')!r}\nSEED, RESAMPLES = 1, 200"
    script = "\n".join(code) + "\nprint('OK', lift.height, standing.height)"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT / "analysis")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1].startswith("OK")
