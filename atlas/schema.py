"""The atlas' row format, schema 1: defined in store/row_format.py (the store reads and writes share files, and
the atlas is above the store), re-exported here under its old name."""
from trainscout.store.row_format import (HARDWARE_FIELDS, LOCAL_FIELDS, SCHEMA, UNKNOWN, VERSION_FIELDS, SchemaError,
                                         content_hash, make_row, migrate, model_name, provenance_of, scrub,
                                         search_command, shareable_record)

__all__ = ["HARDWARE_FIELDS", "LOCAL_FIELDS", "SCHEMA", "UNKNOWN", "VERSION_FIELDS", "SchemaError", "content_hash",
           "make_row", "migrate", "model_name", "provenance_of", "scrub", "search_command", "shareable_record"]
