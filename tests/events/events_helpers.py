"""Helpers for the event-store tests: valid example rows and child processes that write or compact."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def example_value(typ: str, i: int):
    return {
        "string": f"s{i}", "json": json.dumps({"i": i}), "bool": i % 2 == 0, "int64": i, "float64": i + 0.5,
        "timestamp": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i),
        "list[string]": ["a", f"{i}"], "list[float64]": [1.0, float(i)],
    }[typ]


def example_rows(kind: str, n: int) -> list[dict]:
    """`n` valid payloads of `kind`: every column filled, nullable ones null on odd rows."""
    from mkb.events import schema_for

    schema = schema_for(kind)
    rows = []
    for i in range(n):
        row = {}
        for c in schema.columns:
            if c.name in schema.envelope and c.name != "attempt_id":
                continue
            row[c.name] = None if (c.nullable and i % 2) else example_value(c.type, i)
        rows.append(row)
    return rows


def run_child(code: str, *args: str, wait: bool = True, timeout: float = 60) -> subprocess.Popen | subprocess.CompletedProcess:
    """Run `code` in a fresh Python process (args in sys.argv[1:]); env (store credentials) is inherited."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-c", textwrap.dedent(code), *args]
    if wait:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"child exited {proc.returncode} before {path.name}: {proc.stderr.read()}")
        if time.time() > deadline:
            proc.kill()
            raise AssertionError(f"child did not reach {path.name} in {timeout}s")
        time.sleep(0.02)
