"""The event store: schemas, writer, reader, ids, compaction and packing a dataset."""

from mkb.events._commit import ExclusiveCreateUnsupported
from mkb.events._envelope import SeqBlock, SeqExhausted
from mkb.events._ids import uuid7
from mkb.events._lease import Lease, LeaseInfo, LeaseLost
from mkb.events._pack import pack_dataset
from mkb.events._reader import FileInfo, ListingChanged, ScanReport, iter_batches, read, read_batches, scan
from mkb.events._schema import KindSchema, NewerSchemaError, SchemaError, schema_for, schemas
from mkb.events._store import Store, StoreError, resolve_store
from mkb.events._upcast import register_upcaster
from mkb.events._writer import EventWriter, rows_to_table, write_table

__all__ = [
    "EventWriter", "ExclusiveCreateUnsupported", "FileInfo", "KindSchema", "Lease", "LeaseInfo", "LeaseLost", "ListingChanged", "NewerSchemaError", "ScanReport",
    "SchemaError", "SeqBlock", "SeqExhausted", "Store", "StoreError", "iter_batches", "pack_dataset", "read", "read_batches", "register_upcaster", "resolve_store", "rows_to_table", "scan", "schema_for",
    "schemas", "uuid7", "write_table",
]
