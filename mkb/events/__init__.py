"""The event store: schemas, writer, reader, ids and compaction."""

from mkb.events._ids import uuid7
from mkb.events._reader import NewerSchemaError, ScanReport, read, scan
from mkb.events._schema import KindSchema, SchemaError, schema_for, schemas
from mkb.events._store import Store, resolve_store
from mkb.events._writer import EventWriter, write_table

__all__ = [
    "EventWriter", "KindSchema", "NewerSchemaError", "ScanReport", "SchemaError", "Store",
    "read", "resolve_store", "scan", "schema_for", "schemas", "uuid7", "write_table",
]
