"""mkb-analyze end to end (typer), the report and export, and the read side's independence from torch/DSLs/litellm."""

import subprocess
import sys
import textwrap

import polars as pl
import pytest
from typer.testing import CliRunner

from mkb.analysis._mixed import fit_all
from mkb.analysis import load_tables
from mkb.cli.analyze import app
from mkb.events import EventWriter

runner = CliRunner()


def test_read_side_runs_with_torch_dsls_and_litellm_blocked(planted_lift):
    code = textwrap.dedent(f"""
        import sys
        BLOCKED = {{"torch", "cutlass", "tvm", "tvm_ffi", "litellm", "ray"}}

        class Block:  # as if not installed (sys.modules[m] = None trips scipy's own torch probe)
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)

        sys.meta_path.insert(0, Block())
        import mkb.analysis, mkb.cli.analyze
        from mkb.analysis import lift_table, load_tables, standing_table, BootstrapSpec
        t = load_tables({planted_lift.store!r})
        lt = lift_table(t.pairs, spec=BootstrapSpec(resamples=200))
        assert standing_table(t.pairs, spec=BootstrapSpec(resamples=200)).height > 0
        assert not BLOCKED & set(sys.modules)
        print("OK", lt.height)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OK")


def test_lift_standing_attempts_commands(planted_lift):
    r = runner.invoke(app, ["lift", "--store", planted_lift.store, "--resamples", "500", "--by-family"])
    assert r.exit_code == 0, r.output
    assert "pair re-grade" in r.output and "infra_error" in r.output and "seed" in r.output
    assert "could not detect a 10% lift" in r.output or "CI half-width" in r.output
    r = runner.invoke(app, ["standing", "--store", planted_lift.store, "--resamples", "500", "--naive"])
    assert r.exit_code == 0, r.output
    assert "NAIVE" in r.output and "solo_noise" in r.output
    r = runner.invoke(app, ["attempts", "--store", planted_lift.store, "--excluded"])
    assert r.exit_code == 0 and "annotated:reward_hack" in r.output


def test_mixed_models_report_diagnostics(planted_lift):
    fits = fit_all(load_tables(planted_lift.store).attempts)
    assert {f.estimator for f in fits} == {"REML (bfgs)", "VB"}
    for f in fits:
        tr = f.effects.filter(pl.col("term").str.contains("transfer")).row(0, named=True)
        assert tr["estimate"] > 0  # planted positive transfer effect, both on pass and on log-speedup
        assert all(v > 0 for v in f.variance.values())


def test_report_and_export(planted_lift, tmp_path):
    r = runner.invoke(app, ["report", "--store", planted_lift.store, "--out", str(tmp_path / "rep"), "--resamples", "300",
                            "--format", "svg"])
    assert r.exit_code == 0, r.output
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "vegaEmbed('#lift_by_model'" in html and "cdn.jsdelivr" not in html and len(html) > 500_000
    assert (tmp_path / "rep" / "lift_vs_standing.svg").exists()
    r = runner.invoke(app, ["export", "--store", planted_lift.store, "--out", str(tmp_path / "hf")])
    assert r.exit_code == 0, r.output
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "config_name: verdict" in card and "| `speedup` | float64 |" in card
    assert pl.read_parquet(tmp_path / "hf" / "data" / "attempt_started" / "events.parquet").height == 2 * 74 * 3 * 10
    assert pl.read_csv(tmp_path / "hf" / "derived" / "pairs.csv").height > 0


def test_mixed_versions_cli_refuses_with_hint(tmp_path):
    from mkb.analysis.synthetic import SynthSpec, write_synthetic

    store = str(tmp_path / "mixed")
    small = dict(models=("m",), model_means=(0.7,), n_problems=6, replicates=2)
    write_synthetic(SynthSpec(seed=1, **small), store)
    write_synthetic(SynthSpec(seed=2, doc_pack_version="docs-2", **small), store)
    r = runner.invoke(app, ["lift", "--store", store])
    assert r.exit_code == 2 and "--stratify" in r.output
    r = runner.invoke(app, ["lift", "--store", store, "--stratify", "--resamples", "200"])
    assert r.exit_code == 0 and "stratified" in r.output


def test_characterisation_only_dataset_prints_the_problems(tmp_path):
    store = str(tmp_path / "char")
    with EventWriter(store) as w:
        for p, eager in ((28, 180.0), (29, 95.5)):
            w.emit("characterisation", problem=p, problem_name=f"{p}_x", family="mlp_norm", problem_hash=f"h{p}", size="full",
                   gpu="NVIDIA H200", ok=True, eager_median_us=eager, peak_memory_bytes=3 << 30, fp64_gap=1.5e-3,
                   sol_us=40.0, sol_ratio=40.0 / eager, within_band=True)
    for args in (["--store", store], ["problems", "--store", store], ["lift", "--store", store]):
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output
        assert "180.0" in r.output and "3072.0" in r.output and "1.50e-03" in r.output


def test_synth_command_writes_a_dataset(tmp_path):
    r = runner.invoke(app, ["synth", "--store", str(tmp_path / "s"), "--models", "1", "--problems", "8", "--replicates", "2"])
    assert r.exit_code == 0, r.output
    assert "planted transfer relative lift" in r.output
    assert load_tables(str(tmp_path / "s")).attempts.height == 8 * 2 * 10


@pytest.mark.parametrize("module,var,ours,users", [
    ("polars", "_RJEM_MALLOC_CONF", "dirty_decay_ms:50,muzzy_decay_ms:0", "dirty_decay_ms:1000"),  # freed pages back after ~50 ms
    ("numpy", "NUMPY_MADVISE_HUGEPAGE", "0", "1"),  # numpy's arrays on small pages
])
def test_cli_sets_an_allocator_setting_before_its_library_loads_and_keeps_the_users(module, var, ours, users):
    """`mkb-analyze` sets polars' jemalloc give-back and numpy's page size, each read once when the library loads:
    importing the CLI sets it without loading the library, and a value the user set is kept."""
    import os

    probe = f"import os, sys, mkb.cli.analyze; print({module!r} in sys.modules, os.environ[{var!r}])"
    env = {k: v for k, v in os.environ.items() if k != var}
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True).stdout.split()
    assert got == ["False", ours]
    env[var] = users
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True).stdout.split()
    assert got == ["False", users]
