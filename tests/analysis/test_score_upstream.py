"""The score option: S over eager or S_upstream over upstream's baseline, read through the one S definition; the plan's default."""

from __future__ import annotations

import shutil

import polars as pl
import pytest
from typer.testing import CliRunner

from mkb.analysis import BootstrapSpec, ScoreError, lift_table, load_tables
from mkb.analysis.synthetic import SynthSpec, write_synthetic
from mkb.cli.analyze import app
from mkb.events import EventWriter, read
from mkb.scoring import s_score

SMALL = dict(models=("synth/m",), model_means=(0.7,), n_problems=10, replicates=3, seed=5)
SPEC = BootstrapSpec(resamples=200)
runner = CliRunner()


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("score")
    out = {}
    for name, factor in (("x4", 4.0), ("x1", 1.0), ("old", None)):
        out[name] = str(root / name)
        write_synthetic(SynthSpec(upstream_factor=factor, **SMALL), out[name])
    return out


def _lift(store, **kw):
    return lift_table(load_tables(store, **kw).pairs, spec=SPEC, pooled=True).sort("arm_kind", "direction")


def _figures(lt: pl.DataFrame) -> pl.DataFrame:
    return lt.select("arm_kind", "direction", "S_solo", "S_arm", "lift", "lift_lo", "lift_hi", "rel_lift", "rel_lo", "rel_hi",
                     "regression_rate", "improvement_rate")


def test_upstream_score_is_s_over_the_reference_speedup(stores):
    """Each attempt's S_upstream is S recomputed from the same counted verdict's speedup_upstream (and matches the stored one)."""
    t = load_tables(stores["x4"], score="s_upstream")
    assert t.score == "s_upstream" and t.score_from == "--score"
    v = read("verdict", stores["x4"]).filter(pl.col("scope") == "pair").select("attempt_id", "speedup_upstream", "s_upstream")
    a = t.attempts.join(v, on="attempt_id")
    assert a.height == t.attempts.height > 0
    want = [s_score(p, sp) for p, sp in zip(a["passed"], a["speedup_upstream"])]
    assert a["S"].to_list() == want
    assert (a["S"] == a["s_upstream"]).all() and not a["s_mismatch"].any()
    s = load_tables(stores["x4"], score="s").attempts.join(a.select("attempt_id", S_up="S"), on="attempt_id")
    # the reference is 4x slower than eager: S_upstream is never below S, and above it somewhere
    assert (s["S_up"] >= s["S"]).all() and (s["S_up"] > s["S"]).any()


def test_lift_differs_by_score_where_the_scores_differ(stores):
    eager, upstream = _figures(_lift(stores["x4"], score="s")), _figures(_lift(stores["x4"], score="s_upstream"))
    assert eager.height == upstream.height > 0
    assert eager["S_solo"].to_list() != upstream["S_solo"].to_list()
    assert eager["lift"].to_list() != upstream["lift"].to_list()


def test_lift_is_identical_when_the_scores_are_equal(stores):
    eager, upstream = _figures(_lift(stores["x1"], score="s")), _figures(_lift(stores["x1"], score="s_upstream"))
    assert eager.equals(upstream)


def test_a_store_without_s_upstream_is_refused_never_zero(stores):
    with pytest.raises(ScoreError, match=r"store .*old: (\d+) of \1 counted verdicts have no s_upstream column"):
        load_tables(stores["old"], score="s_upstream")
    assert load_tables(stores["old"]).score == "s"  # mkb's S still reads it
    r = runner.invoke(app, ["lift", "--store", stores["old"], "--score", "s_upstream"])
    assert r.exit_code == 2 and "no s_upstream column" in r.output and "hint:" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["standing", "--store", stores["old"], "--score", "nope"])
    assert r.exit_code == 2 and "unknown score 'nope'" in r.output


def _with_plan(src: str, dst, score: str | None, *, experiment: str = "synthetic") -> str:
    """A copy of `src` with the plan event an experiment config writes (score None: a plan written before plan 1.1)."""
    from mkb.experiment import build_plan, parse_config

    store = str(dst)
    shutil.copytree(src, store)
    exp = {"name": experiment, "problems": [28, 72], "replicates": 2, **({"score": score} if score else {})}
    ev = build_plan(parse_config({"experiment": exp, "models": [{"name": "synth/m"}]})).event()
    if score is None:
        ev.pop("score")
    with EventWriter(store) as w:
        w.emit("plan", **ev)
    return store


def test_the_plans_score_is_the_default(stores, tmp_path):
    store = _with_plan(stores["x4"], tmp_path / "planned", "s_upstream")
    t = load_tables(store)
    assert t.score == "s_upstream" and t.score_from == "the plan of synthetic"
    assert _figures(_lift(store)).equals(_figures(_lift(stores["x4"], score="s_upstream")))
    assert _figures(_lift(store, score="s")).equals(_figures(_lift(stores["x4"], score="s")))  # --score overrides the plan
    r = runner.invoke(app, ["lift", "--store", store, "--resamples", "200", "--json", "-"])
    assert r.exit_code == 0 and '"score": "s_upstream"' in r.output
    r = runner.invoke(app, ["lift", "--store", store, "--resamples", "200"])
    assert r.exit_code == 0 and "score: S_upstream (speedup over the problem's fp32 reference" in r.output.splitlines()[0]
    assert "from the plan of synthetic" in r.output
    r = runner.invoke(app, ["models", "--store", store, "--no-mixed", "--score", "s"])
    assert r.exit_code == 0 and "score: S (speedup over eager" in r.output


def test_a_plan_before_the_setting_scores_s(stores, tmp_path):
    store = _with_plan(stores["x4"], tmp_path / "old_plan", None)
    assert read("plan", store)["score"].to_list() == [None]
    t = load_tables(store)
    assert t.score == "s" and t.score_from == "the plan of synthetic"


def test_experiments_scored_differently_are_refused(stores, tmp_path):
    store = _with_plan(stores["x4"], tmp_path / "two", "s_upstream")
    write_synthetic(SynthSpec(upstream_factor=4.0, experiment="other", **{**SMALL, "seed": 6}), store)
    with pytest.raises(ScoreError, match=r"scored differently \(other: s \(no plan\); synthetic: s_upstream\)"):
        load_tables(store)
    assert load_tables(store, score="s_upstream").score == "s_upstream"


def test_power_of_a_plan_reads_the_store_under_the_plans_score(stores):
    from pathlib import Path

    preset = str(Path(__file__).resolve().parents[2] / "configs" / "upstream-compatible.toml")
    r = runner.invoke(app, ["power", "--plan", preset, "--store", stores["x4"], "--resamples", "200", "--json", "-"])
    assert r.exit_code == 0, r.output
    import json

    doc = json.loads(r.stdout)
    assert doc["score"] == "s_upstream" and doc["score_from"] == f"the config {preset}"
    r = runner.invoke(app, ["power", "--plan", preset, "--store", stores["old"]])
    assert r.exit_code == 2 and "no s_upstream column" in r.output
    r = runner.invoke(app, ["power", "--plan", preset, "--store", stores["old"], "--score", "s", "--json", "-"])
    assert r.exit_code == 0 and json.loads(r.stdout)["score"] == "s"


def test_the_report_says_which_score(stores, tmp_path):
    out = tmp_path / "rep"
    r = runner.invoke(app, ["report", "--store", stores["x4"], "--out", str(out), "--resamples", "200", "--score", "s_upstream"])
    assert r.exit_code == 0, r.output
    html = (out / "report.html").read_text()
    assert "score: S_upstream (speedup over the problem&#x27;s fp32 reference" in html and "from --score" in html
    # its tables are the S_upstream ones
    assert sorted(pl.read_csv(out / "lift.csv")["S_solo"].to_list()) == sorted(_lift(stores["x4"], score="s_upstream")["S_solo"].to_list())
