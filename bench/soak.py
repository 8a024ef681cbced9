"""Soak: a million records through two exactly-once workers on the local three-node cluster,
while workers are SIGKILLed and paused past their session and brokers crash; every id must
arrive exactly once, with the offline score.

    .venv/bin/python bench/soak.py [--records 1000000] [--worker-kills 20] [--broker-kills 3]
                                   [--worker-pauses 10] [--seed 0] [--out bench/SOAK-RESULTS.md]

1. The cluster: `deploy/kafka-local/broker --brokers 3 start` (KAFKA_LOCAL_CLUSTER_PORT is
   passed through, so a second cluster can run beside another one); stopped at the end only
   if this run started it. Topics with replication factor 3 and min.insync.replicas 2: input
   (4 partitions), output (4), dead letters (1).
2. The model: tests/models.py's `xgb-binary-logistic` (25 trees of depth 4, 7 features),
   compiled into out/soak/model.bin.
3. The input: messages of 100 rows (`tests.kafka_util.input_table`, ids 0..N-1), produced by an
   idempotent acks=all producer at an even pace over --produce-seconds, so every fault lands
   under load.
4. Two workers (`python -m worker.cli`, one consumer group, delivery exactly_once, the config
   `tests.kafka_util.write_config` writes: a random transactional id per process, the 60 s
   transaction timeout). A seeded schedule spreads the faults over the production window:
   --worker-kills SIGKILLs of a random worker, each restarted after a random 0.5-5 s pause,
   --broker-kills SIGKILLs of a random node (`broker --brokers 3 kill N`), restarted after
   a random 3-10 s (`restart N`; retried, and reported, when the node cannot bind its port),
   and --worker-pauses SIGSTOPs of a random worker for a random 12-15 s, past its 10 s session
   timeout (a GC pause, a frozen VM, CPU throttling), then SIGCONT: it comes back as a zombie
   whose partitions were given to the other worker.
   A worker that exits by itself is an unexpected exit: recorded, restarted.
5. A read_committed reader counts the output rows every second (the throughput curve) and
   which ids it has seen; peak RSS (VmHWM) of every worker process is read every second, just
   before it is killed, and before the final stop.
6. The end: once every id is committed (or --catchup-timeout passes) both workers get SIGTERM
   (exit 0 expected); after the open transactions of killed workers have been aborted, the
   whole output topic is read under read_committed and checked: every id exactly once (lost,
   duplicated), no dead letters, every score equal (exactly) to offline `score_batch`.

Writes --out (bench/SOAK-RESULTS.md) and soak.png beside it; worker logs, configs, the model
and results.json under out/soak/. Exit 0 only if nothing was lost or duplicated, every score
is the offline one, no dead letter was written and no worker exited by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "bench"))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from confluent_kafka import (  # noqa: E402
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient  # noqa: E402

from tests import kafka_util as K  # noqa: E402
from tests.kafka_broker import create_topic, delete_topics  # noqa: E402

OUT = REPO / "out" / "soak"
BROKER = REPO / "deploy" / "kafka-local" / "broker"
ROWS = 100  # rows per input message
PARTITIONS = {"input": 4, "output": 4, "dlq": 1}
WORKERS = 2
WORKER_PAUSE_S = (0.5, 5.0)  # a killed worker is restarted after this long
BROKER_DOWN_S = (3.0, 10.0)  # a killed node is restarted after this long
WORKER_STOPPED_S = (12.0, 15.0)  # a paused worker is resumed after this long (session: 10 s)
# librdkafka's logs of this script's own clients (a killed broker's "connection refused"
# lines) go to out/soak/clients.log, not among the progress lines
CLIENT_LOG = logging.getLogger("soak.kafka")


def client(conf: dict) -> dict:
    """A client configuration that logs to CLIENT_LOG."""
    return {**conf, "logger": CLIENT_LOG}


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- cluster


class Cluster:
    """`deploy/kafka-local/broker --brokers 3`, with the caller's environment (so
    KAFKA_LOCAL_CLUSTER_PORT picks the cluster)."""

    def __init__(self):
        self.started_here = False
        self.bootstrap = ""

    def _run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(BROKER), "--brokers", "3", *args], capture_output=True,
                              text=True, timeout=timeout, check=False)

    def _ok(self, *args: str, timeout: float = 300) -> str:
        proc = self._run(*args, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"broker --brokers 3 {' '.join(args)} failed "
                               f"(exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        return proc.stdout

    def start(self) -> str:
        self.started_here = self._run("status", timeout=60).returncode != 0
        lines = self._ok("start", timeout=600).split()
        if not lines:
            raise RuntimeError("broker --brokers 3 start printed no bootstrap address")
        self.bootstrap = lines[-1]
        return self.bootstrap

    def kill(self, node: int) -> None:
        self._ok("kill", str(node), timeout=60)

    def restart(self, node: int) -> None:
        self._ok("restart", str(node), timeout=300)

    def stop(self) -> None:
        self._run("stop", timeout=300)

    def port_holders(self, node: int) -> list[str]:
        """`ss` lines of the sockets on the node's client and controller ports (not those in
        TIME-WAIT, which do not keep a listener from binding)."""
        port = int(self.bootstrap.split(",")[node - 1].rsplit(":", 1)[1])
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            lines = subprocess.run(["ss", "-tanp"], capture_output=True, text=True,
                                   timeout=10).stdout.splitlines()
            ends = (f":{port}", f":{port + 100}")
            return [" ".join(line.split()) for line in lines
                    if len(line.split()) > 3 and line.split()[3].endswith(ends)
                    and not line.startswith("TIME-WAIT")]
        return []

    def roles(self, node: int, topics: list[str]) -> list[str]:
        """What the node leads: the transaction or group coordinator (partition 0 of the
        internal topics, one partition each on this cluster) and partitions of ``topics``."""
        out = []
        with contextlib.suppress(Exception):
            md = AdminClient(client({"bootstrap.servers": self.bootstrap})).list_topics(timeout=5)
            for name, label in (("__transaction_state", "transaction coordinator"),
                                ("__consumer_offsets", "group coordinator")):
                t = md.topics.get(name)
                if t is not None and 0 in t.partitions and t.partitions[0].leader == node:
                    out.append(label)
            for name in topics:
                t = md.topics.get(name)
                led = sorted(p for p, m in (t.partitions.items() if t else []) if m.leader == node)
                if led:
                    out.append(f"{name.split('-')[1]} leader of {led}")
        return out


# ---------------------------------------------------------------- input


def message_plan(records: int) -> list[tuple[int, int]]:
    """(first id, rows) of every input message: ROWS rows each, the last one the rest."""
    return [(first, min(ROWS, records - first)) for first in range(0, records, ROWS)]


def message_table(first: int, rows: int, seed: int) -> pa.Table:
    """The input rows of one message (regenerated, the same, for the offline scores)."""
    return K.input_table(first, rows, seed=[seed, first])


class PacedProducer(threading.Thread):
    """Every input message, at an even pace over ``seconds`` (idempotent, acks=all, so the
    input has no duplicates and loses nothing through broker kills); ``acked`` counts
    acknowledged rows, ``failed`` the messages that could not be delivered."""

    def __init__(self, bootstrap: str, topic: str, plan: list[tuple[int, int]], seed: int,
                 seconds: float):
        super().__init__(name="producer", daemon=True)
        self.bootstrap, self.topic, self.plan, self.seed = bootstrap, topic, plan, seed
        self.interval = seconds / max(len(plan), 1)
        self.t0 = 0.0
        self.sent = self.acked = self.failed = 0
        self.done = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            p = Producer(client({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                                 "acks": "all", "linger.ms": 5,
                                 "message.timeout.ms": 300_000}))
            self.t0 = time.monotonic()
            for i, (first, rows) in enumerate(self.plan):
                if self.stop.is_set():
                    break
                # poll returns at the first delivery report: wait out the pace in steps
                while (wait := self.t0 + i * self.interval - time.monotonic()) > 0:
                    p.poll(min(wait, 0.05))
                value = K.arrow_bytes(message_table(first, rows, self.seed))
                while True:
                    try:
                        p.produce(self.topic, value=value, key=f"card-{i}".encode(),
                                  partition=i % PARTITIONS["input"],
                                  on_delivery=lambda err, msg, n=rows: self._delivered(err, n))
                        break
                    except BufferError:
                        p.poll(0.1)
                self.sent += 1
                p.poll(0)
            left = p.flush(300)
            if left:
                self.failed += left
        except BaseException as exc:  # noqa: BLE001 (reported by main)
            self.error = exc
        finally:
            self.done.set()

    def _delivered(self, err, rows: int) -> None:
        if err is None:
            self.acked += rows
        else:
            self.failed += 1


# ---------------------------------------------------------------- workers


def vm_hwm_kb(pid: int) -> int:
    """The process's peak resident set (VmHWM) in kB; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class WorkerSlot:
    """One of the two workers, across its restarts. Every process is a ``life``: its pid,
    start and end (seconds into the run), how it ended, its peak RSS."""

    def __init__(self, name: str, config: Path, log_path: Path, clock):
        self.name, self.config, self.log_path, self.clock = name, config, log_path, clock
        self.lock = threading.RLock()
        self.proc: subprocess.Popen | None = None
        self.lives: list[dict] = []
        self.unexpected: list[dict] = []

    @property
    def life(self) -> dict:
        return self.lives[-1]

    def start(self) -> None:
        with self.lock:
            with open(self.log_path, "a") as f:
                f.write(f"\n===== soak: {self.name} start #{len(self.lives) + 1} "
                        f"at t={self.clock():.1f}s =====\n")
            self.proc = K.start_worker(self.config, self.log_path)
            self.lives.append({"pid": self.proc.pid, "start": self.clock(), "end": None,
                               "ended_by": None, "rc": None, "peak_rss_kb": 0})

    def sample_rss(self) -> None:
        with self.lock:
            if self.proc is not None:
                self.life["peak_rss_kb"] = max(self.life["peak_rss_kb"],
                                               vm_hwm_kb(self.proc.pid))

    def _ended(self, how: str, rc: int) -> None:
        self.life.update(end=self.clock(), ended_by=how, rc=rc)
        self.proc = None

    def kill(self) -> int:
        """SIGKILL (its VmHWM read just before); returns the pid."""
        with self.lock:
            self.sample_rss()
            pid = self.proc.pid
            self.proc.send_signal(signal.SIGKILL)
            self._ended("SIGKILL", self.proc.wait(30))
            return pid

    def check(self) -> dict | None:
        """A process that exited without being told to: recorded, then restarted."""
        with self.lock:
            if self.proc is None or self.proc.poll() is None:
                return None
            rc = self.proc.returncode
            pid = self.proc.pid
            self._ended("exited by itself", rc)
            event = {"t": self.clock(), "worker": self.name, "pid": pid, "rc": rc,
                     "log_tail": tail(self.log_path, 40)}
            self.unexpected.append(event)
            log(f"UNEXPECTED: {self.name} (pid {pid}) exited with {rc}; restarting it")
            self.start()
            return event

    def stop(self, timeout: float = 120) -> int | None:
        """SIGTERM and wait; the exit code (None: still running after ``timeout``, killed)."""
        with self.lock:
            if self.proc is None:
                return None
            self.sample_rss()
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self._ended("SIGKILL after a SIGTERM timeout", -9)
                return None
            self._ended("SIGTERM", rc)
            return rc

    def peak_rss_kb(self) -> int:
        return max((life["peak_rss_kb"] for life in self.lives), default=0)


def tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# ---------------------------------------------------------------- the committed output


def output_consumer(bootstrap: str, topic: str, partitions: int, eof: bool = False):
    """A read_committed reader of every partition from the start (assigned: no group)."""
    c = Consumer(client({"bootstrap.servers": bootstrap,
                         "group.id": f"soak-reader-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": eof}))
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    return c


def message_ids(value: bytes) -> np.ndarray:
    return pa.ipc.open_stream(value).read_all().column("id").to_numpy()


class Monitor(threading.Thread):
    """Once a second: the committed output rows (a read_committed reader of the output topic),
    how many distinct ids of 0..N-1 it has seen, the acknowledged input rows; also reads every
    worker's VmHWM and restarts a worker that exited by itself."""

    def __init__(self, bootstrap: str, topic: str, records: int, slots: list[WorkerSlot],
                 producer: PacedProducer, clock):
        super().__init__(name="monitor", daemon=True)
        self.consumer = output_consumer(bootstrap, topic, PARTITIONS["output"])
        self.records, self.slots, self.producer, self.clock = records, slots, producer, clock
        self.seen = np.zeros(records, dtype=bool)
        self.distinct = self.rows = 0
        self.samples: list[tuple[float, int, int, int]] = []  # t, output rows, distinct, input
        self.watch_workers = True
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            next_sample = self.clock()
            while not self.stop.is_set():
                for m in self.consumer.consume(1000, 0.2):
                    if m.error() is None:
                        ids = message_ids(m.value())
                        self.rows += len(ids)
                        ids = ids[(ids >= 0) & (ids < self.records)]
                        self.seen[ids] = True
                if self.clock() >= next_sample:
                    self.distinct = int(np.count_nonzero(self.seen))
                    self.samples.append((round(self.clock(), 2), self.rows, self.distinct,
                                         self.producer.acked))
                    next_sample += 1.0
                    for s in self.slots:
                        s.sample_rss()
                        if self.watch_workers:
                            s.check()
        except BaseException as exc:  # noqa: BLE001 (reported by main)
            self.error = exc
        finally:
            self.consumer.close()


def open_transactions(bootstrap: str, topic: str, partitions: int) -> int:
    """Partitions whose last stable offset is behind the high watermark (a transaction still
    open: a killed worker's, until the broker aborts it at its timeout)."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    ends = {}
    for iso in ("read_committed", "read_uncommitted"):
        c = Consumer(client({"bootstrap.servers": bootstrap,
                             "group.id": f"soak-wm-{uuid.uuid4().hex}", "isolation.level": iso}))
        try:
            ends[iso] = [c.get_watermark_offsets(tp, timeout=10)[1] for tp in tps]
        finally:
            c.close()
    return sum(a < b for a, b in zip(ends["read_committed"], ends["read_uncommitted"],
                                     strict=True))


def read_all(bootstrap: str, topic: str, partitions: int, timeout: float = 300) -> list:
    """Every committed message of the topic: read until each partition reports its end."""
    c = output_consumer(bootstrap, topic, partitions, eof=True)
    out, at_end = [], set()
    deadline = time.monotonic() + timeout
    try:
        while len(at_end) < partitions:
            if time.monotonic() > deadline:
                missing = set(range(partitions)) - at_end
                raise TimeoutError(f"{topic}: partitions {missing} not read to their end "
                                   f"after {timeout}s")
            for m in c.consume(1000, 0.5):
                err = m.error()
                if err is None:
                    out.append(m)
                    at_end.discard(m.partition())
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(m.partition())
    finally:
        c.close()
    return out


# ---------------------------------------------------------------- faults


def fault_schedule(rng, worker_kills: int, broker_kills: int, window: float,
                   worker_pauses: int = 0) -> list[dict]:
    """Seconds (from the first committed output) and kind of every fault, inside 5%..95% of
    the window: broker kills one in each of ``broker_kills`` equal parts of it (never two
    close together: a restarted node needs a moment to rejoin the ISR), worker kills and
    pauses at uniform random times."""
    lo, hi = 0.05 * window, 0.95 * window
    faults = [{"at": float(t), "kind": "worker"} for t in rng.uniform(lo, hi, worker_kills)]
    faults += [{"at": float(t), "kind": "pause"} for t in rng.uniform(lo, hi, worker_pauses)]
    part = (hi - lo) / max(broker_kills, 1)
    faults += [{"at": lo + part * (k + rng.uniform(0.2, 0.8)), "kind": "broker"}
               for k in range(broker_kills)]
    return sorted(faults, key=lambda f: f["at"])


class Faults(threading.Thread):
    """Carries out the schedule, one fault at a time (a fault that comes due while the one
    before is still running, a broker restart, say, follows it at once)."""

    def __init__(self, schedule: list[dict], rng, cluster: Cluster, slots: list[WorkerSlot],
                 topics: list[str], clock, start_at: float):
        super().__init__(name="faults", daemon=True)
        self.schedule, self.rng, self.cluster, self.slots = schedule, rng, cluster, slots
        self.topics, self.clock, self.start_at = topics, clock, start_at
        self.done: list[dict] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for f in self.schedule:
                if self.stop.wait(max(self.start_at + f["at"] - self.clock(), 0)):
                    return
                {"worker": self._worker, "broker": self._broker,
                 "pause": self._pause}[f["kind"]](f)
        except BaseException as exc:  # noqa: BLE001 (reported by main)
            self.error = exc

    def _worker(self, f: dict) -> None:
        slot = self.slots[int(self.rng.integers(len(self.slots)))]
        pause = float(self.rng.uniform(*WORKER_PAUSE_S))
        t = self.clock()
        with slot.lock:  # not while the monitor restarts it
            if slot.proc is None:
                return
            pid = slot.kill()
            rss = slot.life["peak_rss_kb"]
        log(f"fault: SIGKILL {slot.name} (pid {pid}, peak RSS {rss / 1024:.0f} MB); "
            f"restart in {pause:.1f}s")
        self.stop.wait(pause)
        slot.start()
        self.done.append({"t": t, "kind": "worker kill", "target": slot.name, "pid": pid,
                          "down_s": round(self.clock() - t, 1), "restarted": self.clock()})

    def _pause(self, f: dict) -> None:
        slot = self.slots[int(self.rng.integers(len(self.slots)))]
        stopped = float(self.rng.uniform(*WORKER_STOPPED_S))
        t = self.clock()
        with slot.lock:
            if slot.proc is None:
                return
            pid = slot.proc.pid
            os.kill(pid, signal.SIGSTOP)
        log(f"fault: SIGSTOP {slot.name} (pid {pid}); SIGCONT in {stopped:.1f}s")
        self.stop.wait(stopped)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        self.done.append({"t": t, "kind": "worker pause", "target": slot.name, "pid": pid,
                          "down_s": round(self.clock() - t, 1), "restarted": self.clock()})

    def _broker(self, f: dict) -> None:
        node = int(self.rng.integers(1, 4))
        down = float(self.rng.uniform(*BROKER_DOWN_S))
        roles = self.cluster.roles(node, self.topics)
        t = self.clock()
        self.cluster.kill(node)
        log(f"fault: SIGKILL broker node {node} ({', '.join(roles) or 'no leadership'}); "
            f"restart in {down:.1f}s")
        self.stop.wait(down)
        t_restart = self.clock()
        failures = self._restart(node)
        log(f"broker node {node} serving again (restart took {self.clock() - t_restart:.1f}s)")
        self.done.append({"t": t, "kind": "broker kill", "target": f"node {node}",
                          "roles": roles, "down_s": round(self.clock() - t, 1),
                          "restarted": self.clock(), "restart_failures": failures})

    def _restart(self, node: int, attempts: int = 8) -> list[dict]:
        """`restart N`, again after a failure. The first full run failed here: the cluster's
        ports were then in the kernel's ephemeral range (39192..), and while a node was down a
        client's outgoing connection took its port (BindException). The default is now
        29192, below that range; a failure is still retried and kept with who held the
        ports."""
        failures = []
        for attempt in range(1, attempts + 1):
            try:
                self.cluster.restart(node)
                return failures
            except RuntimeError as exc:
                bind = "Address already in use" in str(exc)
                holders = self.cluster.port_holders(node)
                failures.append({"t": self.clock(), "bind_error": bind, "holders": holders})
                log(f"restart of node {node} failed (attempt {attempt}"
                    f"{', address already in use' if bind else ''}); sockets on its ports: "
                    f"{holders or 'none now'}")
                if attempt == attempts:
                    raise
                self.stop.wait(10)
        return failures


# ---------------------------------------------------------------- the run


def compile_model(path: Path) -> Path:
    import worker
    from tests import models as M

    worker.compile_model(M.xgboost_models()["xgb-binary-logistic"]).save(path)
    return path


def offline_scores(model_path: Path, plan: list[tuple[int, int]], seed: int) -> np.ndarray:
    """`score_batch` on every input row, outside the worker: the score of id i at [i]."""
    import worker

    table = pa.concat_tables([message_table(first, rows, seed) for first, rows in plan])
    assert np.array_equal(table.column("txn_id").to_numpy(), np.arange(table.num_rows))
    return worker.load_model(model_path).score_batch(table.drop_columns(["txn_id"])).score


def where_from(ids: np.ndarray, copies: list[tuple]) -> list[dict]:
    """Duplicated (or lost) ids by the input partition and offset they came from (message i,
    ids 100i.., went to partition i % 4 at offset i // 4: one idempotent producer), with where
    and when their output copies were committed (``copies``: (id, output partition, offset,
    timestamp ms) of each copy, for duplicates)."""
    n_in = PARTITIONS["input"]
    msgs = np.unique(ids // ROWS)
    out = []
    for p in range(n_in):
        mine = msgs[msgs % n_in == p]
        if not len(mine):
            continue
        entry = {"input_partition": p, "messages": int(len(mine)),
                 "input_offsets": [int(mine.min() // n_in), int(mine.max() // n_in)]}
        later = [c for c in copies if (c[0] // ROWS) % n_in == p]
        if later:
            stamps = [c[3] for c in later]
            entry["later_copies_committed"] = [time.strftime("%H:%M:%S", time.localtime(
                t / 1000)) for t in (min(stamps), max(stamps))]
            entry["output_partitions"] = sorted({c[1] for c in later})
        out.append(entry)
    return out


def check_output(messages: list, want: np.ndarray) -> dict:
    """Lost, duplicated and out-of-range ids, and scores that differ from ``want``."""
    n = len(want)
    if messages:
        tables = [pa.ipc.open_stream(m.value()).read_all().replace_schema_metadata(None)
                  for m in messages]
        got = pa.concat_tables(tables)
        ids = got.column("id").to_numpy()
        scores = got.column("score").to_numpy()
    else:
        tables, ids, scores = [], np.zeros(0, np.int64), np.zeros(0)
    inside = (ids >= 0) & (ids < n)
    counts = np.bincount(ids[inside], minlength=n)
    ok_ids, ok_scores = ids[inside], scores[inside]
    unequal = ok_scores != want[ok_ids]
    # the copies of duplicated output messages (by their first id), each but the earliest
    copies: dict[int, list[tuple]] = {}
    for m, t in zip(messages, tables, strict=True):
        first = int(t.column("id")[0].as_py()) if t.num_rows else -1
        if 0 <= first < n and counts[first] > 1:
            copies.setdefault(first, []).append((first, m.partition(), m.offset(),
                                                 m.timestamp()[1]))
    later = [c for cs in copies.values() for c in sorted(cs, key=lambda c: c[3])[1:]]
    return {"output_rows": int(len(ids)), "output_messages": len(messages),
            "duplicates_from": where_from(np.flatnonzero(counts > 1), later),
            "lost_from": where_from(np.flatnonzero(counts == 0), []),
            "lost": int(np.count_nonzero(counts == 0)),
            "duplicated": int(np.sum(np.maximum(counts - 1, 0))),
            "out_of_range": int(np.count_nonzero(~inside)),
            "scores_unequal": int(np.count_nonzero(unequal)),
            "scores_array_equal": bool(np.array_equal(ok_scores, want[ok_ids])),
            "lost_ids": np.flatnonzero(counts == 0)[:50].tolist(),
            "duplicated_ids": np.flatnonzero(counts > 1)[:50].tolist(),
            "unequal_ids": ok_ids[unequal][:50].tolist()}


def run(args) -> dict:
    OUT.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(OUT / "clients.log", mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    CLIENT_LOG.addHandler(handler)
    CLIENT_LOG.setLevel(logging.DEBUG)
    CLIENT_LOG.propagate = False
    t_begin = time.monotonic()
    rng = np.random.default_rng(args.seed)
    plan = message_plan(args.records)
    res = {"args": vars(args).copy(), "command": command_line(),
           "cluster_port": os.environ.get("KAFKA_LOCAL_CLUSTER_PORT", "29192 (default)"),
           "messages": len(plan), "rows_per_message": ROWS}
    cluster = Cluster()
    slots: list[WorkerSlot] = []
    threads: list = []
    topics: dict[str, str] = {}
    admin = None
    try:
        log("starting the three-node cluster ...")
        bootstrap = cluster.start()
        log(f"cluster at {bootstrap} ({'started here' if cluster.started_here else 'reused'})")
        admin = AdminClient(client({"bootstrap.servers": bootstrap}))
        run_id = uuid.uuid4().hex[:8]
        for key, prefix in (("input", "soak-in"), ("output", "soak-out"), ("dlq", "soak-dlq")):
            topics[key] = create_topic(admin, f"{prefix}-{run_id}", PARTITIONS[key],
                                       {"min.insync.replicas": "2"}, replication=3)
        res["topics"] = topics
        model_path = compile_model(OUT / "model.bin")
        for old in OUT.glob("worker-*.log"):
            old.unlink()
        cfg = K.write_config(OUT / "worker.yaml", bootstrap, model_path, topics["input"],
                             topics["output"], topics["dlq"], group=f"soak-{run_id}",
                             mode="exactly_once")

        t_zero = time.monotonic()

        def clock() -> float:  # seconds since the producer started
            return time.monotonic() - t_zero

        slots = [WorkerSlot(f"worker-{k}", cfg, OUT / f"worker-{k}.log", clock)
                 for k in range(WORKERS)]
        for s in slots:
            s.start()
        producer = PacedProducer(bootstrap, topics["input"], plan, args.seed,
                                 args.produce_seconds)
        monitor = Monitor(bootstrap, topics["output"], args.records, slots, producer, clock)
        threads = [producer, monitor]
        producer.start()
        monitor.start()
        log(f"producing {args.records:,} records in {len(plan):,} messages over "
            f"{args.produce_seconds:.0f}s; two workers, group soak-{run_id}")

        # faults start once output flows (both workers are up and scoring)
        while monitor.rows == 0:
            if clock() > 180:
                raise RuntimeError("no output 180 s after the start: see out/soak/worker-*.log")
            time.sleep(0.5)
        t_first = clock()
        schedule = fault_schedule(rng, args.worker_kills, args.broker_kills,
                                  args.produce_seconds - t_first, args.worker_pauses)
        faults = Faults(schedule, rng, cluster, slots, list(topics.values()), clock, t_first)
        threads.append(faults)
        faults.start()
        log(f"first output at {t_first:.1f}s; {len(schedule)} faults scheduled")

        last_log = 0.0
        while not (producer.done.is_set() and not faults.is_alive()):
            for t in threads:
                if t.error is not None:
                    raise RuntimeError(f"{t.name} failed: {t.error!r}") from t.error
            if clock() - last_log >= 30 and monitor.samples:
                last_log = clock()
                at, rows, distinct, acked = monitor.samples[-1]
                log(f"t={at:.0f}s input {acked:,} rows acked, output {rows:,} rows committed "
                    f"({distinct:,} distinct ids), {len(faults.done)}/{len(schedule)} faults")
            time.sleep(0.5)
        if producer.error is not None:
            raise RuntimeError(f"producer failed: {producer.error!r}") from producer.error
        if faults.error is not None:
            raise RuntimeError(f"fault thread failed: {faults.error!r}") from faults.error
        t_produced = clock()
        log(f"all input produced ({producer.acked:,} rows acked, {producer.failed} failed) "
            f"and every fault done at {t_produced:.0f}s; waiting for the output to catch up")

        deadline = clock() + args.catchup_timeout
        while monitor.distinct < args.records and clock() < deadline:
            if monitor.error is not None:
                raise RuntimeError(f"monitor failed: {monitor.error!r}") from monitor.error
            time.sleep(0.5)
        t_caught_up = clock()
        caught_up = monitor.distinct >= args.records
        log(f"{'caught up' if caught_up else 'CATCH-UP TIMED OUT'} at {t_caught_up:.0f}s "
            f"({monitor.distinct:,} of {args.records:,} ids committed)")

        monitor.watch_workers = False
        time.sleep(1.5)  # the monitor's last look at the workers is over
        stop_rc = {s.name: s.stop() for s in slots}
        log(f"workers stopped with SIGTERM: exit codes {stop_rc}")
        monitor.stop.set()
        monitor.join(30)

        # a killed worker's transaction stays open until the broker aborts it at the timeout
        # (60 s): read only once none is, so nothing committed hides behind it
        deadline = time.monotonic() + 150
        while any(open_transactions(bootstrap, topics[k], PARTITIONS[k])
                  for k in ("output", "dlq")) and time.monotonic() < deadline:
            time.sleep(2)
        log("reading the whole output topic under read_committed ...")
        out = read_all(bootstrap, topics["output"], PARTITIONS["output"])
        dead = read_all(bootstrap, topics["dlq"], PARTITIONS["dlq"], timeout=60)
        check = check_output(out, offline_scores(model_path, plan, args.seed))
        check["dead_letters"] = len(dead)

        unexpected = [e for s in slots for e in s.unexpected]
        res.update(
            bootstrap=bootstrap, started_cluster=cluster.started_here, check=check,
            input_acked=producer.acked, input_failed=producer.failed,
            first_output_s=t_first, produced_s=t_produced, caught_up=caught_up,
            caught_up_s=t_caught_up, monitor_rows=monitor.rows, stop_rc=stop_rc,
            schedule=schedule, faults=faults.done,
            unexpected_exits=unexpected, samples=monitor.samples,
            lives={s.name: s.lives for s in slots},
            peak_rss_mb=max(s.peak_rss_kb() for s in slots) / 1024,
            wall_s=time.monotonic() - t_begin)
        # keep the topics of a failed run for a look; a clean run's are deleted
        if verdict(res)[0]:
            delete_topics(admin, list(topics.values()))
        return res
    finally:
        for t in threads:
            if hasattr(t, "stop"):
                t.stop.set()
        for s in slots:
            with contextlib.suppress(Exception):
                if s.proc is not None:
                    s.proc.kill()
                    s.proc.wait(30)
        if cluster.started_here:
            log("stopping the cluster (this run started it) ...")
            cluster.stop()


def verdict(res: dict) -> tuple[bool, list[str]]:
    """Passed, and every reason it did not."""
    c, why = res["check"], []
    if c["lost"]:
        why.append(f"{c['lost']} ids lost")
    if c["duplicated"]:
        why.append(f"{c['duplicated']} duplicated rows")
    if c["out_of_range"]:
        why.append(f"{c['out_of_range']} rows with ids outside 0..N-1")
    if c["scores_unequal"] or not c["scores_array_equal"]:
        why.append(f"{c['scores_unequal']} scores unequal to offline")
    if c["dead_letters"]:
        why.append(f"{c['dead_letters']} dead letters")
    if res["unexpected_exits"]:
        why.append(f"{len(res['unexpected_exits'])} unexpected worker exits")
    if res["input_failed"]:
        why.append(f"{res['input_failed']} input messages not acknowledged")
    bad_stop = {k: v for k, v in res["stop_rc"].items() if v != 0}
    if bad_stop:
        why.append(f"final SIGTERM exit codes {bad_stop}")
    return not why, why


# ---------------------------------------------------------------- report


def command_line() -> str:
    return " ".join([".venv/bin/python", "bench/soak.py", *map(shlex.quote, sys.argv[1:])])


def machine() -> dict:
    import confluent_kafka
    from report import machine as base

    info = base()
    with contextlib.suppress(OSError, ValueError, IndexError):
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        kb = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
        info["ram_gib"] = kb / 2**20
    v = confluent_kafka.version()  # a string in some releases, (string, int) in others
    info["confluent_kafka"] = v if isinstance(v, str) else v[0]
    info["librdkafka"] = confluent_kafka.libversion()[0]
    home = Path(os.environ.get("KAFKA_LOCAL_HOME",
                               Path.home() / ".cache" / "scoring-worker" / "kafka-local"))
    jars = sorted((home / "jars").glob("kafka_2.13-*.jar"))
    info["kafka"] = jars[0].stem.split("-", 1)[1] if jars else "?"
    return info


def write_report(res: dict, out: Path) -> None:
    m, c = res["machine"], res["check"]
    ok, why = verdict(res)
    faults = res["faults"]
    n_worker = sum(f["kind"] == "worker kill" for f in faults)
    n_broker = sum(f["kind"] == "broker kill" for f in faults)
    n_pause = sum(f["kind"] == "worker pause" for f in faults)
    span = res["caught_up_s"]
    rate = res["args"]["records"] / span if span > 0 else 0
    png = out.with_name("soak.png")
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Soak: exactly once through worker crashes and pauses and broker crashes", "",
        f"Produced by `{res['command']}`"
        + (f" (with `KAFKA_LOCAL_CLUSTER_PORT={res['cluster_port']}`)"
           if "default" not in str(res["cluster_port"]) else "")
        + f" on {m['date']}; every figure from that run.", "",
        f"Machine: {m.get('Model name', '?')}, {m.get('CPU(s)', '?')} CPUs "
        f"({m['cpus_usable']} usable), {m.get('ram_gib', 0):.1f} GiB RAM; Python "
        f"{m['python']}, confluent-kafka {m['confluent_kafka']} (librdkafka "
        f"{m['librdkafka']}), Apache Kafka {m['kafka']} (three KRaft nodes on loopback, "
        "`deploy/kafka-local/broker --brokers 3`). Load average before the run "
        f"{m['load_before'][0]:.2f}.", "",
        "Setup: input topic of 4 partitions, output 4, dead letters 1, all with replication "
        "factor 3 and `min.insync.replicas` 2. "
        f"{res['args']['records']:,} records in {res['messages']:,} Arrow IPC messages of "
        f"{res['rows_per_message']} rows (`txn_id` and 7 float32 features, 5% missing), "
        "produced by an idempotent `acks=all` producer at an even pace over "
        f"{res['args']['produce_seconds']:.0f} s. Two workers (`python -m worker.cli`) in one "
        "consumer group, `delivery.mode: exactly_once` (a random transactional id per "
        "process, 60 s transaction timeout, 10 s session timeout), model "
        "`xgb-binary-logistic` of tests/models.py (25 trees, depth 4). Faults at seeded "
        f"random times (seed {res['args']['seed']}) between 5% and 95% of the production "
        "window: SIGKILL of a random worker, restarted after 0.5-5 s; SIGKILL of a random "
        "broker node (`broker --brokers 3 kill N`), restarted (`restart N`) after 3-10 s; "
        "SIGSTOP of a random worker for 12-15 s, past its session timeout, then SIGCONT. "
        "The check reads the whole output topic under `read_committed` after both workers "
        "stopped on SIGTERM.", "",
        f"**Verdict: {'PASSED' if ok else 'FAILED: ' + '; '.join(why)}.**", "",
        "| measure | value |", "|---|---|",
        f"| records | {res['args']['records']:,} |",
        f"| worker kills survived (SIGKILL + restart) | {n_worker} of "
        f"{res['args']['worker_kills']} |",
        f"| broker kills survived (SIGKILL + restart) | {n_broker} of "
        f"{res['args']['broker_kills']} |",
        f"| worker pauses survived (SIGSTOP past the session timeout + SIGCONT) | {n_pause} "
        f"of {res['args'].get('worker_pauses', 0)} |",
        f"| unexpected worker exits | {len(res['unexpected_exits'])} |",
        f"| lost | {c['lost']:,} |",
        f"| duplicated | {c['duplicated']:,} |",
        f"| dead letters | {c['dead_letters']:,} |",
        f"| scores unequal to offline `score_batch` (exact) | {c['scores_unequal']:,} |",
        f"| peak worker RSS (max VmHWM over {sum(len(v) for v in res['lives'].values())} "
        f"worker processes) | {res['peak_rss_mb']:.0f} MB |",
        f"| wall time (cluster start to verdict) | {res['wall_s'] / 60:.1f} min |",
        f"| mean throughput (records / time from the first produce to the last id "
        f"committed, {span:.0f} s) | {rate:,.0f} records/s |",
        "",
        f"Output: {c['output_rows']:,} rows in {c['output_messages']:,} committed messages; "
        f"ids outside 0..N-1: {c['out_of_range']}; input messages not acknowledged: "
        f"{res['input_failed']}; final SIGTERM exit codes: "
        + ", ".join(f"{k} {v}" for k, v in res["stop_rc"].items())
        + f". Committed output rate, best 10 s: {best_rate(res['samples']):,.0f} records/s "
        f"(the input arrives at {res['args']['records'] / res['args']['produce_seconds']:,.0f}"
        " records/s: above that is catching up after a stall)"
        + f". The first output was committed {res['first_output_s']:.1f} s after the first "
        f"produce, the last input acknowledged (and the last fault over) at "
        f"{res['produced_s']:.0f} s, every id committed at {res['caught_up_s']:.0f} s.", "",
        f"![committed records/s over the run, faults marked]({png.name})", "",
        "## Faults", "",
        "| t (s) | fault | target | down (s) | what the node led |", "|---|---|---|---|---|"]
    for f in faults:
        lines.append(f"| {f['t']:.1f} | {f['kind']} | {f['target']}"
                     + (f" (pid {f['pid']})" if "pid" in f else "")
                     + f" | {f['down_s']:.1f} | {', '.join(f.get('roles', [])) or '-'} |")
    restarts = [(f, r) for f in faults for r in f.get("restart_failures", [])]
    if restarts:
        lines += ["", "Broker restarts that failed and were retried (10 s later): the node's "
                  "ports are in the kernel's ephemeral port range (32768-60999 here), so while "
                  "it is down an outgoing connection of any process may take one:", ""]
        for f, r in restarts:
            why = "address already in use" if r["bind_error"] else "see the broker's logs"
            lines.append(f"- {f['target']} killed at {f['t']:.1f} s: restart failed at "
                         f"{r['t']:.1f} s ({why}); sockets on its ports then: "
                         f"{'; '.join(r['holders']) or 'none left'}")
    if res["unexpected_exits"]:
        lines += ["", "## Unexpected worker exits", ""]
        for e in res["unexpected_exits"]:
            lines += [f"- t={e['t']:.1f}s {e['worker']} (pid {e['pid']}) exit {e['rc']}; "
                      "log tail:", "", "```", e["log_tail"], "```"]
    if c["lost"] or c["duplicated"] or c["scores_unequal"]:
        lines += ["", "## Ids", "",
                  f"- lost (first 50): {c['lost_ids']}",
                  f"- duplicated (first 50): {c['duplicated_ids']}",
                  f"- score unequal (first 50): {c['unequal_ids']}", ""]
        for key, what in (("duplicates_from", "duplicated"), ("lost_from", "lost")):
            for d in c.get(key, []):
                lo, hi = d["input_offsets"]
                when = (f"; the later copies committed {' - '.join(d['later_copies_committed'])}"
                        f" to output partitions {d['output_partitions']}"
                        if "later_copies_committed" in d else "")
                lines.append(f"- {what}: {d['messages']} input messages of input partition "
                             f"{d['input_partition']}, offsets {lo}..{hi}{when}")
    lines += ["", "Worker logs, configuration and `results.json` (samples, every worker "
              "process's pid, lifetime and peak RSS): `out/soak/` (not committed).", ""]
    out.write_text("\n".join(lines))
    plot(res, png)


def best_rate(samples: list, window: int = 10) -> float:
    """The highest committed output rate over ``window`` consecutive one-second samples."""
    s = np.array(samples, dtype=float).reshape(-1, 4)
    if len(s) <= window:
        return 0.0
    rows, t = s[:, 1], s[:, 0]
    return float(np.max((rows[window:] - rows[:-window]) / (t[window:] - t[:-window])))


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    s = np.array(res["samples"], dtype=float).reshape(-1, 4)
    t, out_rows, in_rows = s[:, 0], s[:, 1], s[:, 3]
    dt = np.diff(t)
    rate = np.diff(out_rows) / np.where(dt > 0, dt, 1)
    k = min(10, len(t) - 1)  # trailing means over the k seconds up to each sample
    span = np.where(t[k:] > t[:-k], t[k:] - t[:-k], 1)
    smooth = (out_rows[k:] - out_rows[:-k]) / span
    in_smooth = (in_rows[k:] - in_rows[:-k]) / span
    # the axis fits the 10 s means: a 1 s sample right after a stall (a backlog released at
    # once) may be far above them and is cut off
    top = 1.3 * max(float(smooth.max(initial=0)), float(in_smooth.max(initial=0)), 1.0)
    clipped = bool((rate > top).any())
    fig, ax = plt.subplots(figsize=(11, 5))
    ax.plot(t[1:], rate, color="#9ecae1", lw=0.6,
            label="committed output records/s (1 s" + (", peaks cut off)" if clipped else ")"))
    ax.plot(t[k:], smooth, color="#08519c", lw=1.6, label=f"committed output, {k} s mean")
    ax.plot(t[k:], in_smooth, color="#31a354", lw=1.0, ls="--",
            label=f"input acknowledged, {k} s mean")
    for f in res["faults"]:
        if f["kind"] == "worker kill":
            ax.axvline(f["t"], color="#e6550d", ls="--", lw=0.9, alpha=0.8)
        elif f["kind"] == "worker pause":
            ax.axvspan(f["t"], f["restarted"], color="#756bb1", alpha=0.15)
        else:
            ax.axvspan(f["t"], f["restarted"], color="#d62728", alpha=0.12)
            ax.axvline(f["t"], color="#d62728", ls="-", lw=1.8)
    for e in res["unexpected_exits"]:
        ax.axvline(e["t"], color="black", ls=":", lw=1.5)
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], color="#e6550d", ls="--", label="worker SIGKILL"),
                Line2D([], [], color="#d62728", ls="-", lw=1.8,
                       label="broker SIGKILL (shaded: until it serves again)"),
                Patch(color="#756bb1", alpha=0.3, label="worker SIGSTOP until SIGCONT")]
    if res["unexpected_exits"]:
        handles.append(Line2D([], [], color="black", ls=":", label="unexpected worker exit"))
    ax.legend(handles=handles, fontsize=8, loc="upper left")
    ax.set_xlabel("seconds since the first produce")
    ax.set_ylabel("records/s")
    ax.set_ylim(0, top)
    c = res["check"]
    ax.set_title(f"Soak: {res['args']['records']:,} records, {len(res['faults'])} faults; "
                 f"lost {c['lost']}, duplicated {c['duplicated']} (exactly once, read_committed)")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--worker-kills", type=int, default=20)
    ap.add_argument("--broker-kills", type=int, default=3)
    ap.add_argument("--worker-pauses", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "SOAK-RESULTS.md")
    ap.add_argument("--produce-seconds", type=float, default=None,
                    help="production window (default: 600 s per million records, at least "
                         "60 s and 15 s per fault)")
    ap.add_argument("--catchup-timeout", type=float, default=240,
                    help="seconds to wait, after the last input and fault, for every id")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite --out and the PNG from out/soak/results.json")
    args = ap.parse_args()
    if args.report_only:
        res = json.loads((OUT / "results.json").read_text())
    else:
        if args.produce_seconds is None:
            args.produce_seconds = max(60.0, 600 * args.records / 1e6,
                                       15.0 * (args.worker_kills + args.broker_kills)
                                       + 20.0 * args.worker_pauses)
        args.out = args.out.resolve()
        info = machine()
        res = run(args)
        res["machine"] = info
        res["args"]["out"] = str(args.out)
        (OUT / "results.json").write_text(json.dumps(res, indent=1, default=str))
    out = Path(res["args"]["out"])
    write_report(res, out)
    ok, why = verdict(res)
    c = res["check"]
    log(f"{'PASSED' if ok else 'FAILED: ' + '; '.join(why)}: lost {c['lost']}, duplicated "
        f"{c['duplicated']}, unequal scores {c['scores_unequal']}, dead letters "
        f"{c['dead_letters']}, unexpected exits {len(res['unexpected_exits'])}, peak RSS "
        f"{res['peak_rss_mb']:.0f} MB, wall {res['wall_s'] / 60:.1f} min; wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
