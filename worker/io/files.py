"""File source and sink (the embedded default): recorded topics in, recorded topics out."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from .records import RECORD_SCHEMA, Record, RecordWriter, read_records


class FileSource:
    """Replays a recorded topic (.arrows) as if consumed; ends when the file does."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"source.path: {self.path} does not exist")
        with pa.memory_map(str(self.path)) as src:
            reader = pa.ipc.open_stream(src)
            missing = set(RECORD_SCHEMA.names) - set(reader.schema.names)
            if missing:
                raise ValueError(f"source.path: {self.path} is not a recorded topic "
                                 f"(no {sorted(missing)} columns)")
            self.total = sum(b.num_rows for b in reader)
        self._it = read_records(self.path)
        self.exhausted = False

    def poll(self, max_messages: int, timeout_s: float) -> list[Record]:
        out = []
        for r in self._it:
            out.append(r)
            if len(out) >= max_messages:
                break
        else:
            self.exhausted = True
        return out

    def commit(self, batch: list[Record]) -> None:
        """Nothing to commit: a file is replayed from its start."""

    def take_revoked(self) -> set:
        """A file has no partitions to lose."""
        return set()

    def rewind(self) -> None:
        raise RuntimeError("a file source cannot re-read a batch")

    def lag(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        self._it.close()


class FileSink:
    """Scores and dead letters as recorded topics, one row per output message."""

    def __init__(self, path: str | Path, dlq_path: str | Path, topic: str = "scores",
                 dlq_topic: str = "scores-dlq"):
        self.topic, self.dlq_topic = topic, dlq_topic
        self._out = RecordWriter(path)
        self._dlq_path = Path(dlq_path)
        self._dlq: RecordWriter | None = None
        self.path = Path(path)

    def write(self, outputs: list[Record], dead: list[Record]) -> None:
        self._out.write(outputs)
        if dead:
            if self._dlq is None:
                self._dlq = RecordWriter(self._dlq_path)
            self._dlq.write(dead)

    def flush(self, timeout_s: float = 0) -> None:
        """Batches are written as they come; nothing is buffered here."""

    @property
    def dead_letter_path(self) -> Path | None:
        return self._dlq_path if self._dlq is not None else None

    def close(self) -> None:
        self._out.close()
        if self._dlq is not None:
            self._dlq.close()
