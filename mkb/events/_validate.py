"""Checks event rows against their kind's schema in plain Python, before anything is buffered or written.

Converting each row to Arrow to check it cost ~50 us a row; these are type tests on the values
present (a few us a row), and they accept exactly what the column-wise Arrow conversion at flush
accepts, so a row that passes here cannot fail there and a bad value fails at its call site.
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import numbers
from typing import Any, Callable, Iterable

from mkb.events._schema import KindSchema, SchemaError

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _is_int(v: Any) -> bool:
    if type(v) is int:
        return _INT64_MIN <= v <= _INT64_MAX
    return type(v) is not bool and isinstance(v, numbers.Integral) and _INT64_MIN <= int(v) <= _INT64_MAX


def _is_bool(v: Any) -> bool:
    return type(v) is bool or type(v).__name__ == "bool_"  # numpy.bool_ without importing numpy


def _is_float(v: Any) -> bool:
    t = type(v)
    if t is int:  # Arrow converts ints to float64 only within int64
        return _INT64_MIN <= v <= _INT64_MAX
    return t is float or (t is not bool and isinstance(v, numbers.Real) and not _is_bool(v))


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_ts(v: Any) -> bool:
    return isinstance(v, dt.datetime) and v.tzinfo is not None and v.utcoffset() is not None


def _list_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    def is_list(v: Any) -> bool:
        return isinstance(v, (list, tuple)) and all(x is None or check(x) for x in v)

    return is_list


_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "string": (_is_str, "a str"),
    "json": (_is_str, "a JSON str (or a dict/list, which is serialised)"),
    "bool": (_is_bool, "a bool"),
    "int64": (_is_int, "an int within int64"),
    "float64": (_is_float, "a float or int"),
    "timestamp": (_is_ts, "a timezone-aware datetime"),
    "list[string]": (_list_of(_is_str), "a list of str"),
    "list[float64]": (_list_of(_is_float), "a list of float"),
}
# exact Python types that need no further test (the common case; ints still get a range check)
_FAST: dict[str, tuple[type, ...]] = {"string": (str,), "json": (str,), "bool": (bool,), "float64": (float,)}


class _Plan:
    __slots__ = ("names", "required", "checks", "fast", "types", "json_cols")

    def __init__(self, schema: KindSchema) -> None:
        self.names = frozenset(schema.names)
        self.required = frozenset(c.name for c in schema.columns if not c.nullable)
        self.checks = {c.name: _CHECKS[c.type][0] for c in schema.columns}
        self.fast = {c.name: _FAST.get(c.type, ()) for c in schema.columns}
        self.types = {c.name: c.type for c in schema.columns}
        self.json_cols = frozenset(c.name for c in schema.columns if c.type == "json")


_plans: dict[int, tuple[KindSchema, _Plan]] = {}


def _plan(schema: KindSchema) -> _Plan:
    hit = _plans.get(id(schema))
    if hit is None or hit[0] is not schema:
        hit = _plans[id(schema)] = (schema, _Plan(schema))
    return hit[1]


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def unknown_column_error(schema: KindSchema, unknown: Iterable[str], where: str) -> SchemaError:
    parts = []
    for name in sorted(unknown):
        close = difflib.get_close_matches(name, schema.names, n=1)
        parts.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return SchemaError(
        f"{schema.kind} {where}: unknown column {', '.join(parts)}\n"
        f"hint: add it to schemas/{schema.kind}.json as a nullable column (minor version bump) or drop it"
    )


def _missing(schema: KindSchema, where: str, name: str) -> SchemaError:
    return SchemaError(
        f"{schema.kind} {where}: required column {name!r} is missing or null\n"
        f"hint: every {schema.kind} event needs {name} ({schema.column(name).doc})"
    )


def check_row(schema: KindSchema, row: dict[str, Any], *, where: str = "row", user: dict[str, Any] | None = None) -> dict[str, Any]:
    """Raise SchemaError naming `where`, the column and the value when `row` does not fit; else return it.

    Names and required columns are checked on the whole row; value types only on `user` (the
    caller's values; default the whole row), since the envelope the writer fills in is right by
    construction. JSON columns given a dict or list are serialised into `row`, so what is checked is what is written.
    """
    plan = _plan(schema)
    keys = row.keys()
    if not plan.names.issuperset(keys):
        raise unknown_column_error(schema, set(keys) - plan.names, where)
    if not plan.required.issubset(keys):
        raise _missing(schema, where, sorted(plan.required - set(keys))[0])
    fast, checks = plan.fast, plan.checks
    for name, v in (row if user is None else user).items():
        if v is None:
            if name in plan.required:
                raise _missing(schema, where, name)
            continue
        if type(v) in fast[name]:
            continue
        if name in plan.json_cols and isinstance(v, (dict, list)):
            try:
                row[name] = json.dumps(v, allow_nan=True, default=str)
            except (TypeError, ValueError) as exc:
                raise SchemaError(f"{schema.kind} {where}: column {name!r} holds a value JSON cannot encode: {exc}") from None
            continue
        if not checks[name](v):
            typ = plan.types[name]
            raise SchemaError(
                f"{schema.kind} {where}: column {name!r} expects {_CHECKS[typ][1]} ({typ}), got {type(v).__name__} {_short(v)}"
                + ("\nhint: pass datetime.datetime.now(datetime.timezone.utc), not a naive datetime" if typ == "timestamp" and isinstance(v, dt.datetime) else "")
            )
    return row


# value types whose check_row verdict the type alone decides (ints: up to their range): a writer checks a payload of
# such values in full once per shape of keys and types (EventWriter._fast_keys)
_SHAPE_TYPES = frozenset({str, bool, float, int, type(None)})


def check_rows(schema: KindSchema, rows: list[dict[str, Any]]) -> None:
    """Check every row (all or nothing); the error names the row's index in the batch."""
    for i, row in enumerate(rows):
        check_row(schema, row, where=f"row {i}")
