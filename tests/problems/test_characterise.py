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
