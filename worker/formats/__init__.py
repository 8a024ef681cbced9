"""Message formats in and out (``base.Format``, ``base.OutputFormat``), by name."""

from __future__ import annotations

from .base import Format, Gathered, InvalidMessage, Message, OutputFormat

__all__ = ["Format", "Gathered", "InvalidMessage", "Message", "OutputFormat", "input_format",
           "output_format"]


def input_format(name: str, model, id_column: str | None, max_rows: int | None,
                 max_bytes: int, fields: dict[str, str] | None = None, **schemas) -> Format:
    """The reader of ``name`` for ``model``'s features (``fields``: key paths of features
    and the id, for formats with nested events; ``schemas``: Avro's schemas_dir)."""
    if name == "arrow":
        from .arrow import ArrowFormat

        return ArrowFormat(model, id_column, max_rows, max_bytes)
    if name == "json":
        from .json import JsonFormat

        return JsonFormat(model, id_column, max_rows, max_bytes, fields)
    if name == "avro":
        from .avro import AvroFormat

        return AvroFormat(model, id_column, max_rows, max_bytes, fields, **schemas)
    raise ValueError(f"unknown message format {name!r} (arrow, json, avro)")


def output_format(name: str, model, id_column: str | None = None, **metadata) -> OutputFormat:
    """The writer of ``name`` for ``model``'s scores."""
    if name == "arrow":
        from .arrow import ArrowOutput

        return ArrowOutput(model, **metadata)
    if name == "json":
        from .json import JsonOutput

        return JsonOutput(model, id_column)
    raise ValueError(f"unknown output format {name!r} (arrow, json)")
