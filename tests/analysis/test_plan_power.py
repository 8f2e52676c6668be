"""`mkb-analyze power --plan`: the power a planned experiment will have, from a store's variance components or stated defaults."""

import json

import polars as pl
import pytest
from typer.testing import CliRunner

from mkb.analysis import BootstrapSpec, DEFAULT_COMPONENTS, PlanDesign, lift_table, load_tables, plan_power_table, variance_components
from mkb.cli.analyze import app

runner = CliRunner()


def _config(tmp_path, *, models=("synth/model-a", "synth/model-b"), problems='"all"', replicates=3, arms=None):
    arms_line = f"arms = {json.dumps(list(arms))}\n" if arms else ""
    body = (f'[experiment]\nname = "planned"\nproblems = {problems}\nreplicates = {replicates}\n{arms_line}'
            + "".join(f'[[models]]\nname = "{m}"\n' for m in models))
    path = tmp_path / f"plan-{replicates}-{len(models)}.toml"
    path.write_text(body)
    return str(path)


def test_a_plan_of_the_stores_own_design_predicts_its_observed_ci_width(planted_lift, tmp_path):
    t = load_tables(planted_lift.store)
    observed = lift_table(t.pairs, spec=BootstrapSpec(seed=2, resamples=2000), tests=False).filter(pl.col("direction") != "pooled")
    r = runner.invoke(app, ["power", "--plan", _config(tmp_path), "--store", planted_lift.store, "--json", str(tmp_path / "p.json")])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["components"] == "store" and doc["problems"] == 74 and doc["replicates"] == 3
    planned = pl.DataFrame(doc["tables"]["power"])
    assert planned.height == 2 * 8 and set(planned["components_from"]) == {"store: this cell"}
    j = planned.join(observed.select("model", "arm_kind", "direction", obs="rel_halfwidth"), on=["model", "arm_kind", "direction"])
    assert j.height == planned.height
    ratio = j["rel_halfwidth"] / j["obs"]
    # the delta-method SE of the ratio against its bootstrap: close (each bootstrap half-width is itself noisy)
    assert 0.8 < ratio.median() < 1.2 and ratio.min() > 0.65 and ratio.max() < 1.5, ratio.to_list()


def test_a_plan_without_a_store_uses_and_names_the_stated_defaults(tmp_path):
    r = runner.invoke(app, ["power", "--plan", _config(tmp_path, models=("x/m",)), "--json", "-"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    rows = doc["tables"]["power"]
    assert doc["components"] == "defaults" and len(rows) == 8
    assert all(x["components_from"].startswith("stated defaults") and x["tau2"] == DEFAULT_COMPONENTS.tau2 for x in rows)
    r = runner.invoke(app, ["power", "--plan", _config(tmp_path, models=("x/m",)), "--sigma2", "0", "--tau2", "10", "--json", "-"])
    rows = json.loads(r.stdout)["tables"]["power"]
    assert all(x["sigma2"] == 0 and x["tau2"] == 10 and "set: tau2=10, sigma2=0" in x["components_from"] for x in rows)


def test_plan_cells_follow_the_plans_arms_and_directions(tmp_path):
    from mkb.experiment._config import load_config

    d = PlanDesign.from_config(load_config(_config(tmp_path, models=("x/m",), arms=("solo", "transfer", "same"), problems="[1, 2, 3]")))
    assert d.n_problems == 3 and set(d.cells) == {("transfer", "tirx", "cute"), ("transfer", "cute", "tirx"),
                                                  ("same", "cute", "cute"), ("same", "tirx", "tirx")}


def test_problems_and_replicates_needed_reach_the_power_and_one_fewer_does_not(planted_lift):
    comps = variance_components(load_tables(planted_lift.store).pairs)
    base = PlanDesign(("synth/model-a",), 74, 3, (("transfer", "cute", "tirx"),))
    row = plan_power_table(base, comps, target=0.10, power=0.8).row(0, named=True)
    need_p, need_r = row["problems_needed"], row["replicates_needed"]
    assert need_p > 74 and row["power_at_target"] < 0.8  # this design cannot detect 10% at 80%
    at = lambda P, R: plan_power_table(PlanDesign(base.models, P, R, base.cells), comps).row(0, named=True)["power_at_target"]  # noqa: E731
    assert at(need_p, 3) >= 0.8 > at(need_p - 1, 3)
    if need_r is not None:
        assert at(74, need_r) >= 0.8 > at(74, need_r - 1)
    # more replicates never help past the between-problem variance
    big_tau = plan_power_table(base, comps.with_columns(tau2=pl.lit(1e6)), target=0.10).row(0, named=True)
    assert big_tau["replicates_needed"] is None and big_tau["problems_needed"] > need_p


def test_plan_power_bad_inputs_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[experiment]\nname = 'x'\n")
    r = runner.invoke(app, ["power", "--plan", str(bad)])
    assert r.exit_code == 2 and "problems is required" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["power", "--plan", str(tmp_path / "missing.toml")])
    assert r.exit_code == 2 and "no such config file" in r.output
    r = runner.invoke(app, ["power", "--tau2", "3"])
    assert r.exit_code == 2 and "--plan" in r.output
    r = runner.invoke(app, ["power", "--plan", _config(tmp_path, models=("x/m",)), "--s-solo", "0"])
    assert r.exit_code == 2 and "positive" in r.output
