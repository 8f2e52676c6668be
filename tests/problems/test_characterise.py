"""The characterisation job on the CPU at smoke size: everything but CUDA timing, errors recorded per problem."""

from __future__ import annotations

import pyarrow.parquet as pq

from mkb.events import schema_for
from mkb.problems import get_problem
from mkb.problems._characterise import _plan_calls, characterise_problem, run_characterisation


def test_smoke_run_writes_one_valid_event_per_problem(tmp_path, capsys):
    rows = run_characterisation(store=str(tmp_path), size="smoke", device="cpu", only=["28", "29"], budget_s=20)
    assert [r["problem"] for r in rows] == [28, 29] and all(r["ok"] for r in rows)
    assert all(r["n_timed"] >= 50 and r["eager_median_us"] > 0 and r["fp64_gap"] > 0 for r in rows)
    files = list(tmp_path.rglob("kind=characterisation/*.parquet"))
    assert len(files) == 1
    table = pq.read_table(files[0])
    assert table.num_rows == 2 and set(schema_for("characterisation").names) == set(table.column_names)
    assert "characterisation" in capsys.readouterr().out


def test_a_failing_problem_is_recorded_and_does_not_stop_the_rest(monkeypatch, tmp_path):
    p = get_problem(28)
    monkeypatch.setattr(p.module, "reference", lambda *a: (_ for _ in ()).throw(RuntimeError("kaput")))
    row = characterise_problem(p, size="smoke", device="cpu", share_s=1.0)
    assert row["ok"] is False and "kaput" in row["error"]
    rows = run_characterisation(store=str(tmp_path), size="smoke", device="cpu", only=["28", "29"], budget_s=20,
                                print_table=False)
    assert [r["ok"] for r in rows] == [False, True]


def test_slow_problems_get_fewer_timed_calls_but_never_below_twenty():
    assert _plan_calls(1e-4, 5.0) == (10, 50)
    w, n = _plan_calls(0.05, 2.0)
    assert w == 3 and 20 <= n < 50
    assert _plan_calls(1.0, 5.0) == (3, 20)


def test_the_gpu_script_packs_the_store_and_writes_one_audit_line_per_problem(tmp_path):
    """scripts/characterise.py on the CPU at smoke size: what the lead runs on the H200 at full size."""
    import json
    import subprocess
    import sys
    import tarfile
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    store, pack, audit = tmp_path / "ds", tmp_path / "ds.tar", tmp_path / "audit.jsonl"
    env = {"PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, str(repo / "scripts" / "characterise.py"), "--size", "smoke", "--device", "cpu",
                        "--problem", "25", "--problem", "24", "--budget-s", "10", "--store", str(store),
                        "--pack", str(pack), "--audit-out", str(audit)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    with tarfile.open(pack) as tar:
        assert any("kind=characterisation" in n and n.endswith(".parquet") for n in tar.getnames())
    rows = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(x["problem"], x["ok"], x["skipped"]) for x in rows] == [(25, True, False), (24, True, False)]
    assert "audit: 2 ok, 0 failed, 0 skipped" in r.stdout


def test_an_audit_over_budget_skips_the_rest_and_says_so():
    from mkb.problems._audit import audit_many

    seen = []
    res = audit_many([get_problem(25), get_problem(24)], budget_s=-1.0, on_report=lambda p, r, s: seen.append(r))
    assert [r for _, r, _ in res] == [None, None] and seen == [None, None]
