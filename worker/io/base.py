"""What the run loop needs of a source and a sink, and the errors they speak in.

The sink owns delivery: ``deliver`` writes one batch's outputs and dead letters and commits the
batch's input offsets, as one transaction (exactly once) or in that order (at least once). The
run loop only calls it and reads the outcome:

* returns: delivered and committed;
* ``BatchRolledBack``: nothing of the batch is visible and the source is rewound to its
  committed offsets: the same messages come again;
* ``FatalError``: this worker cannot go on (fenced, a fatal client error): exit 1 for a
  restart.

A sink may also split its delivery (the Kafka sink does): ``send`` produces the batch and
returns a delivery whose ``wait`` (the commit or flush; it touches only the producer and never
raises) may run in another thread while the loop prepares the next batch, and whose
``finish``, on the loop's thread, ends it as ``deliver`` would (returns, or raises one of the
two errors above).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .records import Record


class StartupError(Exception):
    """A source or sink cannot start. ``exit_code`` 2: the configuration names something that
    cannot work (``field`` says which); 1: a dependency is down."""

    def __init__(self, field: str, message: str, exit_code: int = 2):
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.exit_code = field, message, exit_code


class BatchRolledBack(RuntimeError):
    """The batch was not delivered; the source was rewound (``transaction``: an aborted Kafka
    transaction, else a failed at-least-once delivery).

    ``refused`` names the inputs whose output or dead letter the broker refused for what the
    message is (too large, an invalid record): {(topic, partition, offset): (reason code,
    whether it was the dead letter)}; the next attempt dead-letters them instead (poison pills
    never loop). ``retriable``: the failure was the broker's or the network's (back off and
    try the same batch again), not a message's."""

    def __init__(self, reason: str, transaction: bool, refused: dict | None = None,
                 retriable: bool = True):
        super().__init__(reason)
        self.transaction = transaction
        self.refused = refused or {}
        self.retriable = retriable


class FatalError(RuntimeError):
    """Unrecoverable: fenced by a newer instance, or a fatal client error."""


_KAFKA_ACLS_FLAG = {"topic": "--topic", "group": "--group",
                    "transactional-id": "--transactional-id", "cluster": "--cluster"}


@dataclass(frozen=True)
class Permission:
    operation: str  # READ, WRITE, DESCRIBE_CONFIGS (the broker's AclOperation names)
    resource: str  # topic, group, transactional-id
    name: str
    prefixed: bool = False  # a prefix ACL (transactional ids: <group_id>-...)
    why: str = ""

    def __str__(self) -> str:
        name = f"{self.name}* (prefixed)" if self.prefixed else self.name
        return f"{self.operation} on {self.resource} {name}"

    def kafka_acls(self, principal: str) -> str:
        """The kafka-acls arguments that grant it."""
        op = "".join(w.capitalize() for w in self.operation.split("_"))
        flag = _KAFKA_ACLS_FLAG[self.resource]
        target = "" if self.resource == "cluster" else f" {self.name}"
        prefix = " --resource-pattern-type prefixed" if self.prefixed else ""
        return f"--add --allow-principal {principal} --operation {op} {flag}{target}{prefix}"


class NotAuthorized(FatalError):
    """The brokers refuse this principal an operation the worker needs: exit 1, one line."""

    def __init__(self, missing: list[Permission] | Permission, principal: str,
                 detail: str = ""):
        missing = [missing] if isinstance(missing, Permission) else missing
        self.missing, self.principal = missing, principal
        what = "; ".join(str(p) for p in missing)
        grant = missing[0].kafka_acls(principal)
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        text = (f"kafka: {principal} is not authorized: {what} "
                f"(kafka-acls {grant}{more}; docs/operations.md, Security, lists what the "
                f"worker needs)")
        super().__init__(f"{text}: {detail}" if detail else text)


class CredentialsRejected(FatalError):
    """The brokers have refused this worker's credentials for longer than the bound while it
    ran (a revoked user, a rotated password, a certificate no longer trusted): exit 1."""


class Source(Protocol):
    exhausted: bool  # a file source that has been read to its end
    total: int | None  # messages in a file source (progress bars), None for a stream

    def poll(self, max_messages: int, timeout_s: float) -> list[Record]:
        """Up to ``max_messages`` records, waiting at most ``timeout_s`` for the first."""

    def take_revoked(self) -> bool:
        """Whether a partition was revoked or lost to a rebalance since the last call."""

    def owns(self, rec: Record) -> bool:
        """``rec`` was read under its partition's present assignment: still ours to deliver
        (after take_revoked() said a rebalance ran)."""

    def commit(self, batch: list[Record]) -> None:
        """Commit the offsets after ``batch`` (at-least-once delivery)."""

    def rewind(self) -> None:
        """Go back to the committed offsets (after a rolled-back batch)."""

    def lag(self) -> dict[str, int]:
        """Messages behind the end of each owned partition."""

    def close(self) -> None: ...


class Sink(Protocol):
    topic: str  # the output topic named in score messages

    def deliver(self, source: Source, batch: list[Record], outputs: list[Record],
                dead: list[Record]) -> None:
        """Publish ``outputs`` and ``dead`` letters and commit ``batch``'s offsets; raises
        BatchRolledBack or FatalError (see the module docstring)."""

    def close(self) -> None: ...
