"""The replay grader (recorded H200 verdicts by problem hash and kernel sha256) and the scripted demo run on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from mkb.agent import GradeJob
from mkb.events import EventWriter, read
from mkb.experiment._replay import ReplayError, ReplayGrader
from mkb.experiment._scripted import baseline_path

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "events" / "replay-demo"


def test_replays_known_kernels_and_marks_every_verdict(tmp_path):
    store = str(tmp_path / "s")
    with EventWriter(store) as w:
        g = ReplayGrader.load(DEMO, writer=w)
        assert g.version.startswith("replay:")
        v = g.submit(GradeJob(problem=28, dsl="cute", kernel_path=baseline_path(28, "cute"), attempt_id="a1")).result()
        assert v.passed and v.speedup > 1 and v.evaluation_id.startswith("replay-")
        batch = g.submit_batch([GradeJob(problem=72, dsl=d, kernel_path=baseline_path(72, d), attempt_id=f"p{d}", scope="pair")
                                for d in ("cute", "tirx")])
        assert all(f.result().passed for f in batch)
    rows = read("verdict", store)
    assert rows.height == 3 and sorted(rows["scope"]) == ["pair", "pair", "submission"]
    for d in rows["details"]:
        d = json.loads(d)
        assert d["grader"] == "replay" and d["replayed_evaluation_id"] and d["problem_hash"]
    # the replayed figures are the recorded ones, not new measurements
    source = json.loads((DEMO / "replay.json").read_text())["source"]  # the dataset the index was recorded from
    src = read("verdict", str(ROOT / source))
    rec = {r["evaluation_id"]: r for r in src.iter_rows(named=True)}
    for r in rows.iter_rows(named=True):
        assert r["speedup"] == rec[json.loads(r["details"])["replayed_evaluation_id"]]["speedup"]


def test_unknown_kernel_is_an_error(tmp_path):
    g = ReplayGrader.load(DEMO)
    k = tmp_path / "kernel.py"
    k.write_text(baseline_path(28, "cute").read_text() + "\n# edited\n")
    with pytest.raises(ReplayError, match="no recorded verdict for problem 28 cute kernel .*only the demo kernels"):
        g.submit(GradeJob(problem=28, dsl="cute", kernel_path=k)).result()
    with pytest.raises(ReplayError, match="no recorded verdict for problem 29"):
        g.submit(GradeJob(problem=29, dsl="cute", kernel_path=baseline_path(29, "cute"))).result()


def test_changed_problem_is_an_error(tmp_path):
    doc = json.loads((DEMO / "replay.json").read_text())
    doc["kernels"][0]["problem_hash"] = "0" * 64
    doc["source"] = str(ROOT / doc["source"])
    (tmp_path / "replay.json").write_text(json.dumps(doc))
    with pytest.raises(ReplayError, match="problem 28 changed since its verdicts were recorded.*\nhint: re-record"):
        ReplayGrader.load(tmp_path)
    with pytest.raises(ReplayError, match="no replay index"):
        ReplayGrader.load(tmp_path / "nope")


def test_scripted_experiment_on_the_replay_grader(tmp_path):
    """The README's main job without a GPU, through the GPU script's own code path (its CPU test)."""
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_experiment_run.py"), "--out", str(out),
                        "--grader", f"replay:{DEMO}"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["ok"] and s["done"] == 40 and s["pair_batches"] == 4
    import tarfile

    with tarfile.open(out / "events.tar.gz") as t:
        t.extractall(tmp_path / "x", filter="data")
    store = str(tmp_path / "x" / "events")
    started = read("attempt_started", store)
    assert started.height == 40 and set(started["grader_version"]) == {ReplayGrader.load(DEMO).version}  # replay:<recorded grader>
    assert sorted(started["arm_kind"].unique()) == ["placebo", "same", "solo", "transfer", "wrong"]
    v = read("verdict", store)
    assert v.filter(pl.col("scope") == "pair").height == 40
    # a scripted model's lift is zero by construction: every arm scores as its solo
    from mkb.analysis import load_tables

    pairs = load_tables(store).pairs
    assert pairs.height > 0 and pairs["lift"].abs().max() == 0
