"""Offline tables: read Arrow IPC (stream or file) or Parquet; write Arrow IPC files."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa


def read_table(path: str | Path) -> pa.Table:
    path = Path(path)
    if path.suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        return pq.read_table(path)
    if path.suffix == ".csv":  # a reference profile's rows (compile --reference)
        import pyarrow.csv as pcsv

        return pcsv.read_csv(path)
    with pa.memory_map(str(path)) as source:
        try:
            return pa.ipc.open_file(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_stream(source).read_all()


def write_table(path: str | Path, table: pa.Table) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        pq.write_table(table, path)
        return
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
