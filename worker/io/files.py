"""File source and sink (the embedded default): recorded topics in, recorded topics out."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from .base import StartupError
from .records import (
    JSON_LINES,
    RECORD_SCHEMA,
    Record,
    RecordWriter,
    read_json_lines,
    read_messages,
)


class FileSource:
    """Replays a recorded topic (.arrows), or JSON lines (.jsonl: one message a line), as if
    consumed; ends when the file does."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise StartupError("source.path", f"{self.path} does not exist")
        if self.path.suffix in JSON_LINES:
            try:
                self.total = sum(1 for _ in read_json_lines(self.path))
            except OSError as exc:
                raise StartupError("source.path", f"cannot read {self.path}: {exc}") from None
            self._it = read_messages(self.path)
            self.exhausted = False
            self._read = self._committed = 0
            return
        try:
            with pa.memory_map(str(self.path)) as src:
                reader = pa.ipc.open_stream(src)
                missing = set(RECORD_SCHEMA.names) - set(reader.schema.names)
                if missing:
                    raise StartupError("source.path", f"{self.path} is not a recorded topic "
                                       f"(no {sorted(missing)} columns)")
                self.total = sum(b.num_rows for b in reader)  # reads it whole: not truncated
        except (OSError, pa.ArrowException) as exc:
            raise StartupError("source.path", f"{self.path} is not a readable recorded topic "
                               "(or name JSON lines .jsonl): "
                               f"{str(exc).splitlines()[0] if str(exc) else exc}") from None
        self._it = read_messages(self.path)
        self.exhausted = False
        self._read = self._committed = 0  # messages read; messages delivered

    def poll(self, max_messages: int, timeout_s: float) -> list[Record]:
        out = []
        for r in self._it:
            out.append(r)
            if len(out) >= max_messages:
                break
        else:
            self.exhausted = True
        self._read += len(out)
        return out

    def commit(self, batch: list[Record]) -> None:
        """The run's position: a batch that is not delivered is read again from here (a
        file is replayed from its start by the next run)."""
        self._committed += len(batch)

    def take_revoked(self) -> bool:
        """A file has no partitions to lose."""
        return False

    def owns(self, rec: Record) -> bool:
        return True

    def rewind(self) -> None:
        """Back to the first message not delivered (a replay to a topic whose delivery
        failed reads that batch again)."""
        self._it.close()
        self._it = read_messages(self.path)
        for _ in range(self._committed):
            next(self._it)
        self._read = self._committed
        self.exhausted = self._committed >= (self.total or 0)

    def lag(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        self._it.close()


class FileSink:
    """Scores and dead letters as recorded topics, one row per output message."""

    def __init__(self, path: str | Path, dead_letter_path: str | Path, topic: str = "scores",
                 shadow_path: str | Path | None = None):
        self.topic = topic
        self.path = Path(path)
        self._dead_letter_path = Path(dead_letter_path)
        self._dead: RecordWriter | None = None
        self._shadow_path = Path(shadow_path) if shadow_path else None
        self._shadow: RecordWriter | None = None
        try:
            self._out = RecordWriter(path)
        except OSError as exc:
            raise StartupError("sink.path", f"cannot write {path}: {exc.strerror or exc}") \
                from None

    def deliver(self, source, batch: list[Record], outputs: list[Record],
                dead: list[Record]) -> None:
        """Write the batch's scores and dead letters, then commit its input. From a Kafka
        source (at least once) the files are fsynced first: a committed offset never points
        past what a crash of the machine could lose."""
        shadow = [r for r in outputs if r.topic == "shadow"]
        if shadow:  # a shadow model's scores: their own file
            outputs = [r for r in outputs if r.topic != "shadow"]
            if self._shadow is None:
                self._shadow = RecordWriter(self._shadow_path or
                                            self.path.with_name(self.path.stem + "-shadow"
                                                                + self.path.suffix))
            self._shadow.write(shadow)
        self._out.write(outputs)
        if dead:
            if self._dead is None:
                self._dead = RecordWriter(self._dead_letter_path)
            self._dead.write(dead)
        if hasattr(source, "consumer"):
            for w in (self._out, self._dead, self._shadow):
                if w is not None:
                    w.sync()
        source.commit(batch)

    @property
    def dead_letter_path(self) -> Path | None:
        return self._dead_letter_path if self._dead is not None else None

    def close(self) -> None:
        self._out.close()
        if self._dead is not None:
            self._dead.close()
        if self._shadow is not None:
            self._shadow.close()
