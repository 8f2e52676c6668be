"""Renders the event schemas (schemas/*.json) as the markdown reference docs/schemas.md."""

from __future__ import annotations

from mkb.events._schema import envelope, schemas

HEADER = """# Event schemas

Generated from `schemas/*.json` by `mkb-run schemas --write`; do not edit by hand (a test checks it is current).

Every event is one row of a Parquet file `<store>/kind=<kind>/<uuid7>.parquet`. A file holds one
kind; its footer carries `mkb.kind` and `mkb.schema_version`. Columns are only ever added (nullable,
minor version bump); a reader fills columns missing from older files with null and refuses files
of a newer major version. Types: `string`, `json` (a JSON document stored as a string), `bool`,
`int64`, `float64`, `timestamp` (UTC, microseconds), `list[string]`, `list[float64]`.

How files get there (`mkb.events`): one immutable file per writer flush, named by a fresh uuid7 and
never overwritten. On local disk it is written to `<parent>/.staging/<dataset>/`, fsynced, hard-linked
into place (exclusive) and the folder fsynced; on object stores it is one PUT with `If-None-Match: *`
(a backend that ignores it is detected and refused). Readers check every footer (or what the store's
footer index `_index/kind=<kind>/*.arrow` recorded of it): a torn or foreign file is skipped and named;
rows are de-duplicated on `event_id`. `mkb-run compact` merges small files:
the merged file (footer `mkb.compacted_from`) is published before its sources are deleted, so a
compaction killed at any point changes nothing a reader sees.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(columns) -> list[str]:
    lines = ["| column | type | required | meaning |", "|---|---|---|---|"]
    for c in columns:
        lines.append(f"| `{c.name}` | {c.type} | {'no' if c.nullable else 'yes'} | {_cell(c.doc)} |")
    return lines


def render_markdown() -> str:
    """The whole reference, deterministic (kinds sorted) so the committed copy can be compared byte for byte."""
    version, doc, cols = envelope()
    out = [HEADER, f"## Envelope (version {version})", "", _cell(doc), "", *_table(cols), ""]
    kinds = schemas()
    out += ["## Kinds", "", "| kind | version | columns | what it records |", "|---|---|---|---|"]
    for k, s in kinds.items():
        out.append(f"| [`{k}`](#{k}) | {s.version} | {len(s.columns) - len(s.envelope)} | {_cell(s.doc)} |")
    out.append("")
    for k, s in kinds.items():
        payload = [c for c in s.columns if c.name not in s.envelope]
        out += [f"## {k}", "", f"Version {s.version}. {_cell(s.doc)}", "", *_table(payload), ""]
    return "\n".join(out).rstrip() + "\n"
