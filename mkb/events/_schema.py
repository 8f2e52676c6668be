"""The event schemas: loads `schemas/*.json` into the Arrow and Polars schemas writer and reader share."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any

import pyarrow as pa

from mkb._resources import data_dir

_ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "json": pa.string(),
    "bool": pa.bool_(),
    "int64": pa.int64(),
    "float64": pa.float64(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "list[string]": pa.list_(pa.string()),
    "list[float64]": pa.list_(pa.float64()),
}


class SchemaError(ValueError):
    """A row or file does not match the canonical schema of its kind."""


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    nullable: bool
    doc: str


@dataclass(frozen=True)
class KindSchema:
    """One event kind: its version and its columns (envelope first, then payload)."""

    kind: str
    version: str
    doc: str
    columns: tuple[Column, ...]

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def arrow(self) -> pa.Schema:
        """The canonical Arrow schema; the version travels in the file's key-value metadata too."""
        fields = [pa.field(c.name, _ARROW_TYPES[c.type], nullable=c.nullable) for c in self.columns]
        return pa.schema(fields, metadata={b"mkb.kind": self.kind.encode(), b"mkb.schema_version": self.version.encode()})

    def polars(self) -> dict[str, Any]:
        import polars as pl

        return dict(pl.Schema(pl.from_arrow(self.arrow().empty_table()).schema))


def _load(path) -> dict:
    data = json.loads(path.read_text())
    for key in ("kind", "version", "columns"):
        if key not in data:
            raise SchemaError(f"schema file {path} lacks {key!r}")
    for col in data["columns"]:
        if col["type"] not in _ARROW_TYPES:
            raise SchemaError(f"schema file {path}: column {col['name']!r} has unknown type {col['type']!r}; known: {sorted(_ARROW_TYPES)}")
    return data


@cache
def schemas() -> dict[str, KindSchema]:
    """Every event kind's schema, keyed by kind, read once from `schemas/`."""
    folder = data_dir("schemas")
    env = _load(folder / "_envelope.json")
    envelope = [Column(**c) for c in env["columns"]]
    out: dict[str, KindSchema] = {}
    for path in sorted(folder.glob("*.json")):
        if path.name.startswith("_"):
            continue
        data = _load(path)
        payload = [Column(**c) for c in data["columns"]]
        clash = {c.name for c in payload} & {c.name for c in envelope}
        if clash:
            raise SchemaError(f"schema file {path}: payload columns {sorted(clash)} clash with the envelope")
        out[data["kind"]] = KindSchema(data["kind"], data["version"], data.get("doc", ""), tuple(envelope + payload))
    return out


def schema_for(kind: str) -> KindSchema:
    """The schema of `kind`, with a hint listing the known kinds when it is unknown."""
    try:
        return schemas()[kind]
    except KeyError:
        raise SchemaError(f"unknown event kind {kind!r}\nhint: known kinds are {', '.join(sorted(schemas()))}") from None
