"""Produce Arrow inputs, run the worker as a process, read outputs back (real broker)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import yaml
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from tests import models as M

REPO = Path(__file__).resolve().parent.parent


def client(bootstrap: str | dict) -> dict:
    """A client configuration from a bootstrap address, or a whole configuration (a secured
    broker's: security protocol, credentials)."""
    return dict(bootstrap) if isinstance(bootstrap, dict) else {"bootstrap.servers": bootstrap}


def arrow_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def input_table(first_id: int, n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, M.N_FEATURES)).astype(np.float32)
    X[rng.random(X.shape) < 0.05] = np.nan
    cols = {"txn_id": pa.array(np.arange(first_id, first_id + n, dtype=np.int64))}
    cols.update({f"feat_{j}": pa.array(X[:, j]) for j in range(M.N_FEATURES)})
    return pa.table(cols)


def produce_inputs(bootstrap: str | dict, topic: str, n_messages: int, rows: int,
                   partitions: int = 2) -> pa.Table:
    """Messages of ``rows`` rows each, ids 0..n*rows-1; returns every row produced."""
    p = Producer({**client(bootstrap), "enable.idempotence": True, "linger.ms": 5})
    tables = []
    for i in range(n_messages):
        t = input_table(i * rows, rows, seed=i)
        tables.append(t)
        p.produce(topic, value=arrow_bytes(t), key=f"card-{i}".encode(),
                  partition=i % partitions)
        p.poll(0)
    assert p.flush(60) == 0
    return pa.concat_tables(tables)


def write_config(path: Path, bootstrap: str, model: Path, source: str, sink: str, dlq: str,
                 group: str, mode: str = "exactly_once", metrics_port: int = 0,
                 client: dict | None = None, kafka: dict | None = None, **delivery) -> Path:
    cfg = {
        "source": {"type": "kafka", "topic": source},
        "sink": {"type": "kafka", "topic": sink, "dead_letter_topic": dlq},
        "kafka": {"bootstrap_servers": bootstrap, "group_id": group,
                  "client": {"session.timeout.ms": 10000, "heartbeat.interval.ms": 1000,
                             **(client or {})}, **(kafka or {})},
        "model": {"path": str(model)},
        "scoring": {"id_column": "txn_id", "thresholds": [0.5, 0.9], "threads": 1},
        "delivery": {"mode": mode, "max_wait_ms": 20, **delivery},
        "logging": {"level": "INFO", "format": "console", "progress": False},
        "metrics": {"port": metrics_port},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def start_worker(config: Path, log: Path, env: dict | None = None) -> subprocess.Popen:
    return start_worker_args(["--config", str(config)], log, env)


def start_worker_args(args: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """`scoring-worker ARGS` in the background, its output appended to ``log``."""
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli", *args],
        cwd=REPO, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})})


def stop_worker(proc: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 60) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    return proc.wait(timeout)


def timed_stop(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, float]:
    """SIGTERM a running worker: (its exit code, seconds from the signal to the exit)."""
    assert proc.poll() is None, "the worker had exited already"
    t0 = time.monotonic()
    rc = stop_worker(proc, timeout=timeout)
    return rc, time.monotonic() - t0


def read_topic(bootstrap: str | dict, topic: str, expect_messages: int | None = None,
               timeout: float = 120, committed: bool = True, idle: float = 3.0) -> list:
    """Every message of a topic, read from the start by a fresh group."""
    c = Consumer({**client(bootstrap), "group.id": f"reader-{uuid.uuid4().hex}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "isolation.level": "read_committed" if committed else "read_uncommitted"})
    c.subscribe([topic])
    out, deadline, last = [], time.monotonic() + timeout, time.monotonic()
    try:
        while time.monotonic() < deadline:
            msgs = c.consume(500, 0.5)
            got = [m for m in msgs if m.error() is None]
            out.extend(got)
            if got:
                last = time.monotonic()
            if expect_messages is not None and len(out) >= expect_messages and \
                    time.monotonic() - last > idle:
                break
            if expect_messages is None and out and time.monotonic() - last > idle:
                break
    finally:
        c.close()
    return out


def output_ids(messages) -> np.ndarray:
    ids = [pa.ipc.open_stream(m.value()).read_all().column("id").to_numpy() for m in messages]
    return np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)


def wait_for_ids(bootstrap: str | dict, topic: str, n_ids: int, timeout: float = 180,
                 proc: subprocess.Popen | None = None, ids_of=None) -> list:
    """Read committed output until n_ids distinct ids arrived (or time out, or ``proc``, the
    worker, exits). ``ids_of``: a message's ids (default: an Arrow output's id column)."""
    ids_of = ids_of or (lambda m: output_ids([m]).tolist())
    deadline = time.monotonic() + timeout
    c = Consumer({**client(bootstrap), "group.id": f"reader-{uuid.uuid4().hex}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    c.subscribe([topic])
    out, seen = [], set()
    try:
        while time.monotonic() < deadline and len(seen) < n_ids:
            if proc is not None and proc.poll() is not None:
                break
            for m in c.consume(500, 0.5):
                if m.error() is None:
                    out.append(m)
                    seen.update(ids_of(m))
        # linger briefly: anything duplicated would arrive now
        end = time.monotonic() + 2
        while time.monotonic() < end:
            out.extend(m for m in c.consume(500, 0.5) if m.error() is None)
    finally:
        c.close()
    return out


def high_watermarks(bootstrap: str, topic: str, consumer=None) -> int:
    """Sum of high watermarks (includes transaction markers and uncommitted records)."""
    from confluent_kafka import TopicPartition

    c = consumer or Consumer({"bootstrap.servers": bootstrap,
                              "group.id": f"wm-{uuid.uuid4().hex}"})
    try:
        meta = c.list_topics(topic, timeout=10).topics[topic]
        total = 0
        for p in meta.partitions:
            total += max(high_watermark(c, TopicPartition(topic, p)), 0)
        return total
    finally:
        if consumer is None:
            c.close()


# while a broker of a cluster is killed or restarts, a partition's leadership moves: the
# cluster answers these until its metadata settles (_DESTROY_BROKER: the client dropped its
# handle of a broker the metadata no longer listed, as a restarted node registers again;
# _UNKNOWN_PARTITION: the client's metadata of the topic was dropped and not yet fetched again;
# OFFSET_NOT_AVAILABLE: a new leader whose high watermark has not caught up)
_MOVING = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
           KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TRANSPORT, KafkaError._TIMED_OUT,
           KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_COORDINATOR,
           KafkaError._DESTROY_BROKER, KafkaError._ALL_BROKERS_DOWN,
           KafkaError._UNKNOWN_PARTITION, KafkaError.OFFSET_NOT_AVAILABLE}


def high_watermark(c, tp, settle: float = 30.0) -> int:
    deadline = time.monotonic() + settle
    while True:
        try:
            return c.get_watermark_offsets(tp, timeout=10)[1]
        except KafkaException as exc:
            if exc.args[0].code() not in _MOVING or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class SteadyProducer(threading.Thread):
    """Messages of ``rows`` rows (ids from 0, message i seeded i) at ``rate`` messages/s over
    two partitions until ``done`` is set (acks=all, idempotent, so the input itself has no
    duplicates through broker kills); ``sent`` counts them, ``error`` keeps a failure."""

    def __init__(self, bootstrap: str, topic: str, rows: int = 10, rate: float = 40):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.rows, self.rate = bootstrap, topic, rows, rate
        self.sent = 0
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self):
        try:
            p = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                          "acks": "all", "linger.ms": 2, "message.timeout.ms": 120000})
            i = 0
            while not self.done.is_set():
                p.produce(self.topic, value=arrow_bytes(input_table(i * self.rows, self.rows,
                                                                    i)),
                          key=f"card-{i}".encode(), partition=i % 2)
                p.poll(0)
                i = self.sent = i + 1
                time.sleep(1 / self.rate)
            assert p.flush(120) == 0, "input not all acknowledged"
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            self.error = exc


def free_port() -> int:
    """A loopback port free now (a fixed one in the ephemeral range can be any connection's)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
