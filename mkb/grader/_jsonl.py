"""A stand-in event writer for a GPU host without pyarrow: complete rows (envelope included) as JSON lines,
turned into the Parquet store later with `jsonl_to_store` where pyarrow is installed."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import threading
from pathlib import Path
from typing import Any

import mkb
from mkb._resources import data_dir


def _ids_module():
    """mkb/events/_ids.py without importing the mkb.events package (whose __init__ needs pyarrow)."""
    path = Path(mkb.__file__).resolve().parent / "events" / "_ids.py"
    spec = importlib.util.spec_from_file_location("mkb_events_ids_standalone", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _envelope_module():
    """mkb/events/_envelope.py (the one envelope builder) without importing the mkb.events package."""
    try:
        import mkb.events._envelope as env
        return env
    except ImportError:
        path = Path(mkb.__file__).resolve().parent / "events" / "_envelope.py"
        spec = importlib.util.spec_from_file_location("mkb_events_envelope_standalone", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


def uuid7() -> str:
    try:
        from mkb.events import uuid7 as u
    except ImportError:
        u = _ids_module().uuid7
    return u()


def _versions() -> dict[str, str]:
    out = {}
    for p in Path(data_dir("schemas")).glob("*.json"):
        d = json.loads(p.read_text())
        if "kind" in d:
            out[d["kind"]] = d["version"]
    return out


class JsonlWriter:
    """EventWriter's emit/flush/close on a JSON-lines file; rows are validated when converted."""

    def __init__(self, path: str | Path, *, run_id: str | None = None) -> None:
        self.path = Path(path)
        self._env = _envelope_module().Envelope(run_id=run_id)
        self.run_id, self.writer_id = self._env.run_id, self._env.writer
        self._buf: list[dict] = []
        self._versions = _versions()
        self._lock = threading.Lock()

    def emit(self, kind: str, *, attempt_id: str | None = None, **payload: Any) -> str:
        self._env.check_payload(payload)
        row = self._env.row(kind, self._versions[kind], attempt_id, payload, dt.datetime.now(dt.timezone.utc).isoformat())
        with self._lock:
            self._env.number([row])
            self._buf.append(row)
            return row["event_id"]

    def flush(self) -> None:
        with self._lock:
            rows, self._buf = self._buf, []
        with open(self.path, "a") as f:
            for r in rows:
                f.write(json.dumps(r, default=str) + "\n")

    def close(self) -> None:
        self.flush()


def jsonl_to_store(path: str | Path, store: str) -> list[str]:
    """Write the rows of a JsonlWriter file into `store` as one Parquet file per kind; returns the files."""
    from mkb.events import resolve_store, rows_to_table, schema_for, write_table

    by_kind: dict[str, list[dict]] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            r["ts"] = dt.datetime.fromisoformat(r["ts"])
            by_kind.setdefault(r["kind"], []).append(r)
    st = resolve_store(store, for_writing=True)
    return [write_table(st, kind, rows_to_table(schema_for(kind), rows)) for kind, rows in by_kind.items()]
