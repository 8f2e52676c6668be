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

# Parquet key-value metadata keys every event file carries (the reader trusts the footer, not the path).
META_KIND = b"mkb.kind"
META_VERSION = b"mkb.schema_version"
META_COMPACTED_FROM = b"mkb.compacted_from"


class SchemaError(ValueError):
    """A row or file does not match the canonical schema of its kind."""


class NewerSchemaError(SchemaError):
    """A file was written with a newer major schema version than this mkb knows."""


def parse_version(version: str) -> tuple[int, int]:
    """`"1.2"` -> (1, 2); raises SchemaError on anything else, so a garbled footer is not read as 0.0."""
    try:
        major, minor = version.split(".")
        return int(major), int(minor)
    except (ValueError, AttributeError):
        raise SchemaError(f"schema version {version!r} is not 'major.minor'") from None


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
    envelope: tuple[str, ...] = ()

    def __hash__(self) -> int:
        # the generated hash walks every Column on each call; caches keyed by schema made emit 2x slower
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.kind, self.version, self.columns))
            object.__setattr__(self, "_hash", h)
        return h

    @property
    def major(self) -> int:
        return parse_version(self.version)[0]

    @property
    def minor(self) -> int:
        return parse_version(self.version)[1]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)

    def arrow(self) -> pa.Schema:
        """The canonical Arrow schema; the version travels in the file's key-value metadata too."""
        return _arrow(self)

    def polars(self) -> dict[str, Any]:
        """The canonical polars schema, built from the type names (pl.from_arrow would import pandas)."""
        return {c.name: _polars_type(c.type) for c in self.columns}


def _polars_type(name: str):
    import polars as pl

    return {
        "string": pl.String, "json": pl.String, "bool": pl.Boolean, "int64": pl.Int64, "float64": pl.Float64,
        "timestamp": pl.Datetime("us", "UTC"), "list[string]": pl.List(pl.String), "list[float64]": pl.List(pl.Float64),
    }[name]


@cache
def _arrow(schema: KindSchema) -> pa.Schema:
    fields = [pa.field(c.name, _ARROW_TYPES[c.type], nullable=c.nullable) for c in schema.columns]
    return pa.schema(fields, metadata={META_KIND: schema.kind.encode(), META_VERSION: schema.version.encode()})


def _load(path) -> dict:
    data = json.loads(path.read_text())
    for key in ("kind", "version", "columns"):
        if key not in data:
            raise SchemaError(f"schema file {path} lacks {key!r}")
    parse_version(data["version"])
    seen = set()
    for col in data["columns"]:
        if col["type"] not in _ARROW_TYPES:
            raise SchemaError(f"schema file {path}: column {col['name']!r} has unknown type {col['type']!r}; known: {sorted(_ARROW_TYPES)}")
        if col["name"] in seen:
            raise SchemaError(f"schema file {path}: column {col['name']!r} appears twice")
        seen.add(col["name"])
    return data


@cache
def envelope() -> tuple[str, str, tuple[Column, ...]]:
    """(version, doc, columns) of the envelope every kind starts with."""
    env = _load(data_dir("schemas") / "_envelope.json")
    return env["version"], env.get("doc", ""), tuple(Column(**c) for c in env["columns"])


@cache
def schemas() -> dict[str, KindSchema]:
    """Every event kind's schema, keyed by kind, read once from `schemas/`."""
    folder = data_dir("schemas")
    _, _, env_cols = envelope()
    env_names = tuple(c.name for c in env_cols)
    out: dict[str, KindSchema] = {}
    for path in sorted(folder.glob("*.json")):
        if path.name.startswith("_"):
            continue
        data = _load(path)
        if data["kind"] != path.stem:
            raise SchemaError(f"schema file {path} declares kind {data['kind']!r}\nhint: name the file {data['kind']}.json")
        payload = [Column(**c) for c in data["columns"]]
        clash = {c.name for c in payload} & set(env_names)
        if clash:
            raise SchemaError(f"schema file {path}: payload columns {sorted(clash)} clash with the envelope")
        out[data["kind"]] = KindSchema(data["kind"], data["version"], data.get("doc", ""), tuple(env_cols) + tuple(payload), env_names)
    return out


def schema_for(kind: str) -> KindSchema:
    """The schema of `kind`, with a hint listing the known kinds when it is unknown."""
    try:
        return schemas()[kind]
    except KeyError:
        raise SchemaError(f"unknown event kind {kind!r}\nhint: known kinds are {', '.join(sorted(schemas()))}") from None
