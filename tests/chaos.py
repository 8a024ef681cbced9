"""Chaos on a real broker: what an operator's bad day does to running workers, and whether
exactly once (at least once) still holds.

Scenarios (``SCENARIOS``; ``make chaos`` runs each in both delivery modes unless it says
otherwise, ``make test`` its short form in exactly_once, and pause in at_least_once too):

- ``pause``: one worker alone in its group, SIGSTOP for 8-9 s (past ``session.timeout.ms``
  6000) at random moments, then SIGCONT: a long GC pause, a frozen VM, CPU throttling;
- ``pause-points``: the same pause landed at a chosen point of the loop (``worker.chaos``):
  inside a poll, while scoring, while a commit is in flight;
- ``poll-interval``: the loop's thread stalled past ``max.poll.interval.ms`` (7 s) while
  librdkafka's threads go on heartbeating (a SIGSTOP past it is past the session too, since
  librdkafka wants ``max.poll.interval.ms >= session.timeout.ms``): the client leaves the
  group and joins again;
- ``pause-two``: two workers, a random one paused past its session: the other takes its
  partitions, and the paused one comes back as a zombie;
- ``join-leave``: a second worker joins under load and leaves, by SIGTERM and by SIGKILL in
  turn (cooperative-sticky, the default assignor);
- ``add-partitions``: partitions added to the input topic while it is read;
- ``zombie``: exactly once only: a worker paused with its transaction open past
  ``transaction.timeout.ms``: the broker aborts the transaction and fences the producer; the
  worker exits 1 and is started again, as an orchestrator would;
- ``broker-restart``: the broker stopped and started again under load (with one pause);
- ``swap-rebalance``: the model file replaced (``model.reload``) while a second worker joins;
- ``net-*`` (issue 53): network faults between the workers and the three-node cluster, through
  Toxiproxy (tests/toxiproxy.py): ``net-latency`` (0.5-3 s each way), ``net-bandwidth``
  (1 KB/s), ``net-blackhole`` (10-20 s, both ways, requests only or answers only, the
  connections held open), ``net-reset-peer``, ``net-slicer``, ``net-limit-data`` (every
  connection closed after 1 B-500 KB), ``net-broker-down`` (one node unreachable for the
  worker alone, 10-20 s), ``net-flapping`` (links down and up every 0.5-2 s); after each
  fault the output must flow again before the next. ``make test`` runs one of each in one
  run a mode (``NETWORK_ALL``, tests/test_network.py), ``make chaos-network`` ten of each.

Input: one-row messages (id i in message i, features seeded i) at 50 messages/s, round-robin
over the input's partitions, from an idempotent acks=all producer. At the end every worker gets
SIGTERM; the whole output topic is read under read_committed, and a run passes when every id
came out exactly once (at least once), every output's scores are those of the model its
``model_id`` header names (computed offline with ``score_batch``), nothing went to the
dead-letter topic, and the group's committed offsets equal the input's end offsets.

    python -m tests.chaos [--long] [--scenario NAME ...] [--mode exactly_once|at_least_once]
                          [--seed N] [--bootstrap HOST:PORT] [--worker-tree DIR]

``make test`` runs the short forms (tests/test_chaos.py, tests/test_network.py); ``make
chaos`` (bench/chaos.py) the long ones (50 pauses in ``pause`` in each mode) and writes
bench/CHAOS-RESULTS.md, ``make chaos-network`` bench/NETWORK-RESULTS.md. Every random
choice comes from ``--seed`` (printed), so a failure replays. ``--worker-tree`` runs the
workers from another checkout (with its extensions built), to measure a commit before a fix.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests import kafka_util as K  # noqa: E402
from tests.kafka_broker import BROKER_SCRIPT, create_topic, delete_topics  # noqa: E402

MODES = ("exactly_once", "at_least_once")
SESSION_MS = 6000  # the broker's smallest (group.min.session.timeout.ms)
RATE = 50.0  # input messages a second


def say(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- input


def row_table(i: int) -> pa.Table:
    """Message i's one row (id i): the same every time it is made."""
    return K.input_table(i, 1, seed=i)


class Input(threading.Thread):
    """One-row messages at RATE a second, message i to partition i % ``partitions`` (which a
    scenario may raise once the topic has more), until ``stop`` is set."""

    def __init__(self, bootstrap: str, topic: str, partitions: int):
        super().__init__(name="input", daemon=True)
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.sent = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                  "acks": "all", "linger.ms": 2,
                                  "message.timeout.ms": 300_000})

    def widen(self, partitions: int) -> None:
        """Produce to ``partitions`` partitions once this producer's metadata has them."""
        deadline = time.monotonic() + 60
        while len(self.producer.list_topics(self.topic, timeout=10)
                  .topics[self.topic].partitions) < partitions:
            assert time.monotonic() < deadline, "the new partitions never showed"
            time.sleep(0.5)
        self.partitions = partitions

    def run(self) -> None:
        try:
            t0 = time.monotonic()
            i = 0
            while not self.stop.is_set():
                self.producer.produce(self.topic, value=K.arrow_bytes(row_table(i)),
                                      key=f"card-{i}".encode(), partition=i % self.partitions)
                self.producer.poll(0)
                i = self.sent = i + 1
                time.sleep(max(0.0, t0 + i / RATE - time.monotonic()))
            assert self.producer.flush(120) == 0, "input not all acknowledged"
        except BaseException as exc:  # noqa: BLE001 (reported by the run)
            self.error = exc


# ---------------------------------------------------------------- workers


def _state(pid: int) -> str:
    """The process state letter (T: stopped), '' once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2]


@dataclass
class WorkerProc:
    name: str
    config: Path
    log: Path
    env: dict
    tree: Path
    proc: subprocess.Popen | None = None
    starts: int = 0
    exits: list[int] = field(default_factory=list)  # exit codes the run did not ask for

    def start(self) -> None:
        self.starts += 1
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "--config", str(self.config)],
            cwd=self.tree, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
            env={**os.environ, "PYTHONPATH": str(self.tree), **self.env})

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Run:
    """One scenario in one delivery mode: topics, input, workers, faults, then the check."""

    def __init__(self, bootstrap: str, workdir: Path, models: dict[str, Path], mode: str,
                 seed: int, partitions: int = 2, tree: Path = REPO, client: dict | None = None,
                 delivery: dict | None = None, reload: bool = False, proxy=None):
        self.bootstrap, self.workdir, self.mode = bootstrap, workdir, mode
        # network scenarios: the workers reach the (three-node) cluster through Toxiproxy
        # (tests/toxiproxy.py); the input, the checks and the brokers talk directly
        self.proxy = proxy
        self.worker_bootstrap = proxy.bootstrap if proxy is not None else bootstrap
        self.models = models  # model_id -> artifact
        self.rng = random.Random(seed)
        self.tree = tree
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        tag = uuid.uuid4().hex[:10]
        self.topics = {"in": f"chaos-in-{tag}", "out": f"chaos-out-{tag}",
                       "dlq": f"chaos-dlq-{tag}"}
        for key, n in (("in", partitions), ("out", 2), ("dlq", 1)):
            if proxy is None:
                create_topic(self.admin, self.topics[key], partitions=n)
            else:  # the cluster: every partition on all three nodes, two in sync to write
                create_topic(self.admin, self.topics[key], partitions=n, replication=3,
                             config={"min.insync.replicas": "2"})
        self.group = f"chaos-{tag}"
        self.model_path = workdir / "live.model"
        shutil.copyfile(next(iter(models.values())), self.model_path)
        self.client = {"session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 1000,
                       **(client or {})}
        self.delivery = {"transaction_timeout_ms": 10_000, **(delivery or {})}
        self.reload = reload
        self.control = workdir / "chaos-control"  # worker/chaos.py: what SIGUSR1 arms
        self.env = {"SCORING_WORKER_CHAOS": str(self.control)}
        self.workers: dict[str, WorkerProc] = {}
        self.input = Input(bootstrap, self.topics["in"], partitions)
        self.cycles = 0  # faults injected
        self.events: list[str] = []
        self._expected_exit: set[str] = set()
        self._lock = threading.Lock()  # starts and stops, against the watcher's restarts
        self._watch = threading.Event()
        self._watcher = threading.Thread(target=self._restart_exited, daemon=True)

    # -- workers
    def add_worker(self, name: str) -> WorkerProc:
        cfg = K.write_config(self.workdir / f"{name}.yaml", self.worker_bootstrap,
                             self.model_path,
                             self.topics["in"], self.topics["out"], self.topics["dlq"],
                             group=self.group, mode=self.mode, client=self.client,
                             **self.delivery)
        if self.reload:
            data = yaml.safe_load(cfg.read_text())
            data["model"].update({"reload": True, "reload_interval_ms": 200})
            cfg.write_text(yaml.safe_dump(data))
        with self._lock:
            w = self.workers.get(name) or WorkerProc(name, cfg, self.workdir / f"{name}.log",
                                                     self.env, self.tree)
            self.workers[name] = w
            w.start()
            self._expected_exit.discard(name)
        return w

    def stop_worker(self, name: str, sig=signal.SIGTERM) -> int:
        w = self.workers[name]
        with self._lock:
            self._expected_exit.add(name)
        if w.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.proc.pid, signal.SIGCONT)  # a stopped process cannot stop
                w.proc.send_signal(sig)
        return w.proc.wait(90)

    def _restart_exited(self) -> None:
        """What an orchestrator does: a worker that exits by itself (a fenced zombie exits
        1) is started again; the exit code is recorded."""
        while not self._watch.wait(0.5):
            with self._lock:
                for name, w in list(self.workers.items()):
                    if name in self._expected_exit or w.proc is None:
                        continue
                    rc = w.proc.poll()
                    if rc is not None:
                        w.exits.append(rc)
                        self.events.append(f"{name} exited {rc}: restarted")
                        say(f"{name} exited {rc}: restarted")
                        w.start()

    # -- faults
    def pause(self, name: str, seconds: float, point: str | None = None) -> None:
        """SIGSTOP now (or at the next pass through ``point``), SIGCONT ``seconds`` later."""
        w = self.workers[name]
        pid = w.proc.pid
        if point is None:
            os.kill(pid, signal.SIGSTOP)
        else:
            self.control.write_text(f"pause {point}")
            os.kill(pid, signal.SIGUSR1)
            deadline = time.monotonic() + 60
            while _state(pid) != "T":
                assert w.alive(), f"{name} exited while a pause at {point} was armed"
                assert time.monotonic() < deadline, f"{name} never reached {point}"
                time.sleep(0.005)
        self.cycles += 1
        self.events.append(f"{name} paused {seconds:.1f} s at {point or 'a random moment'}")
        time.sleep(seconds)
        os.kill(pid, signal.SIGCONT)

    def stall(self, name: str, point: str, seconds: float) -> None:
        """The thread that passes ``point`` next sleeps ``seconds`` there (the process runs
        on); returns once that stall is over."""
        w = self.workers[name]
        said = w.log.read_text(errors="replace").count(f"chaos: stall at {point}")
        self.control.write_text(f"stall {point} {seconds}")
        os.kill(w.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 60
        while w.log.read_text(errors="replace").count(f"chaos: stall at {point}") == said:
            assert w.alive(), f"{name} exited while a stall at {point} was armed"
            assert time.monotonic() < deadline, f"{name} never reached {point}"
            time.sleep(0.05)
        self.cycles += 1
        self.events.append(f"{name} stalled {seconds:.1f} s at {point}")
        time.sleep(seconds)

    def wait_output(self, at_least: int, timeout: float = 120) -> None:
        """Until the output topic holds ``at_least`` more records than now (it flows)."""
        target = K.high_watermarks(self.bootstrap, self.topics["out"]) + at_least
        deadline = time.monotonic() + timeout
        while K.high_watermarks(self.bootstrap, self.topics["out"]) < target:
            assert time.monotonic() < deadline, "no output progress"
            time.sleep(0.2)

    def add_partitions(self, total: int) -> None:
        self.admin.create_partitions([NewPartitions(self.topics["in"], total)])[
            self.topics["in"]].result(30)
        self.input.widen(total)
        self.cycles += 1
        self.events.append(f"input topic widened to {total} partitions")

    def swap_model(self) -> str:
        """Replace the live model file by the next model (atomic rename): its id."""
        ids = list(self.models)
        current = next(i for i in ids if self.models[i].read_bytes()
                       == self.model_path.read_bytes())
        nxt = ids[(ids.index(current) + 1) % len(ids)]
        tmp = self.model_path.with_suffix(".tmp")
        shutil.copyfile(self.models[nxt], tmp)
        os.replace(tmp, self.model_path)
        self.cycles += 1
        self.events.append(f"model swapped to {nxt[:12]}")
        return nxt

    # -- the run
    def start(self, workers: int = 1) -> None:
        for k in range(workers):
            self.add_worker(f"w{k + 1}")
        self._watcher.start()
        self.input.start()
        self.wait_output(20)

    def finish(self, timeout: float = 240) -> dict:
        if self.proxy is not None:
            self.proxy.reset()  # (a scenario that failed mid-fault left one)
        self.input.stop.set()
        self.input.join(180)
        assert self.input.error is None, self.input.error
        ends = self._ends()
        deadline = time.monotonic() + timeout
        while self._committed() != ends:
            for w in self.workers.values():  # nobody stays stopped
                if w.alive() and _state(w.proc.pid) == "T":
                    os.kill(w.proc.pid, signal.SIGCONT)
            if time.monotonic() > deadline:
                say(f"committed offsets {self._committed()} never reached {ends}")
                break
            time.sleep(0.5)
        self._watch.set()
        self._watcher.join(5)
        rcs = {name: self.stop_worker(name) for name, w in self.workers.items() if w.alive()}
        return self.check(ends, rcs)

    def _ends(self) -> dict[int, int]:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"wm-{uuid.uuid4().hex}"})
        try:
            md = c.list_topics(self.topics["in"], timeout=10).topics[self.topics["in"]]
            return {p: K.high_watermark(c, TopicPartition(self.topics["in"], p))
                    for p in md.partitions}
        finally:
            c.close()

    def _committed(self) -> dict[int, int]:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group})
        try:
            parts = [TopicPartition(self.topics["in"], p) for p in self._ends()]
            return {tp.partition: tp.offset for tp in c.committed(parts, timeout=10)}
        except Exception:  # noqa: BLE001 (the coordinator is away: not yet)
            return {}
        finally:
            c.close()

    def check(self, ends: dict[int, int], rcs: dict[str, int]) -> dict:
        import worker

        n = self.input.sent
        msgs = K.read_topic(self.bootstrap, self.topics["out"], expect_messages=n,
                            timeout=120, idle=3)
        ids, scores, named = [], [], []
        for m in msgs:
            t = pa.ipc.open_stream(m.value()).read_all()
            ids.append(t.column("id").to_numpy())
            scores.append(t.column("score").to_numpy())
            mid = dict(m.headers() or []).get("model_id", b"").decode()
            named.append(np.full(t.num_rows, mid, dtype=object))
        ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        scores = np.concatenate(scores) if scores else np.zeros(0)
        named = np.concatenate(named) if named else np.zeros(0, object)
        table = pa.concat_tables([row_table(i) for i in range(n)]).drop_columns(["txn_id"])
        want = {mid: worker.load_model(path).score_batch(table).score
                for mid, path in self.models.items()}
        inside = (ids >= 0) & (ids < n)
        wrong = int((~inside).sum())
        for mid, w in want.items():
            sel = inside & (named == mid)
            wrong += int((scores[sel] != w[ids[sel]]).sum())
        wrong += int((inside & ~np.isin(named, list(want))).sum())
        counts = np.bincount(ids[inside], minlength=n)
        dead = K.read_topic(self.bootstrap, self.topics["dlq"], timeout=5, idle=1)
        committed = self._committed()
        return {"ids": n, "lost": int((counts == 0).sum()),
                "models_named": len(set(named.tolist())),
                "duplicated": int((counts > 1).sum()), "wrong_model": wrong,
                "dead_letters": len(dead), "offsets_at_end": committed == ends,
                "committed": committed, "ends": ends, "cycles": self.cycles,
                "exits": {k: w.exits for k, w in self.workers.items() if w.exits},
                "stop_codes": rcs, "events": self.events}

    def close(self) -> None:
        self._watch.set()
        if self.proxy is not None:
            self.proxy.reset()
        for w in self.workers.values():
            if w.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.proc.pid, signal.SIGCONT)
                    w.proc.kill()
                w.proc.wait(30)
        self.input.stop.set()
        delete_topics(self.admin, list(self.topics.values()))


def passed(result: dict, mode: str, models: int = 1) -> bool:
    """``models``: how many models the outputs must name at least (2 after swaps)."""
    return (result["lost"] == 0 and result["models_named"] >= models and result["wrong_model"] == 0
            and result["dead_letters"] == 0 and result["offsets_at_end"]
            and (mode == "at_least_once" or result["duplicated"] == 0)
            and all(rc == 0 for rc in result["stop_codes"].values()))


# ---------------------------------------------------------------- scenarios
# Each takes the run (started by the scenario) and its size: pauses or faults to inject.


def _between(run: Run, lo: float = 1.0, hi: float = 4.0) -> None:
    time.sleep(run.rng.uniform(lo, hi))


def s_pause(run: Run, n: int) -> None:
    run.start(1)
    for _ in range(n):
        _between(run, 0.5, 4.0)
        run.pause("w1", run.rng.uniform(8.0, 9.0))
        _between(run, 1.0, 3.0)


def s_pause_points(run: Run, n: int) -> None:
    run.start(1)
    points = ("poll", "score", "commit")
    for k in range(n):
        _between(run)
        run.pause("w1", run.rng.uniform(8.0, 9.0), point=points[k % 3])
        _between(run, 1.0, 3.0)


def s_poll_interval(run: Run, n: int) -> None:
    run.start(1)
    for k in range(n):
        _between(run)
        run.stall("w1", ("score", "poll")[k % 2], run.rng.uniform(8.0, 9.0))
        _between(run, 2.0, 4.0)


def s_pause_two(run: Run, n: int) -> None:
    run.start(2)
    for _ in range(n):
        _between(run, 2.0, 5.0)
        run.pause(run.rng.choice(["w1", "w2"]), run.rng.uniform(8.0, 9.0))
        _between(run, 2.0, 5.0)


def s_join_leave(run: Run, n: int) -> None:
    run.start(1)
    for k in range(n):
        run.add_worker("w2")
        run.events.append("w2 joined")
        run.wait_output(50)
        _between(run, 1.0, 4.0)
        sig = signal.SIGTERM if k % 2 == 0 else signal.SIGKILL
        rc = run.stop_worker("w2", sig)
        run.cycles += 1
        run.events.append(f"w2 left by {sig.name} (exit {rc})")
        assert sig == signal.SIGKILL or rc == 0, f"w2 exited {rc} on SIGTERM"
        _between(run, 2.0, 5.0)


def s_add_partitions(run: Run, n: int) -> None:
    run.start(2 if n > 1 else 1)
    total = 2
    for _ in range(n):
        _between(run, 2.0, 5.0)
        total += 1 if total < 4 else 2
        run.add_partitions(total)
        run.wait_output(50)


def s_zombie(run: Run, n: int) -> None:
    run.start(1)
    for _ in range(n):
        _between(run)
        # the transaction is open: paused past transaction.timeout.ms (10 s) and the broker's
        # check for expired transactions (every 10 s), the broker aborts it and bumps the
        # producer's epoch, so the worker, resumed, is fenced
        run.pause("w1", run.rng.uniform(22.0, 25.0), point="commit")
        run.wait_output(20, timeout=180)


def s_broker_restart(run: Run, n: int) -> None:
    run.start(1)
    for _ in range(n):
        _between(run, 2.0, 5.0)
        subprocess.run([str(BROKER_SCRIPT), "stop"], check=True, capture_output=True,
                       timeout=180)
        time.sleep(run.rng.uniform(1.0, 4.0))
        subprocess.run([str(BROKER_SCRIPT), "start"], check=True, capture_output=True,
                       timeout=600)
        run.cycles += 1
        run.events.append("broker restarted")
        run.wait_output(50, timeout=180)
        run.pause("w1", run.rng.uniform(8.0, 9.0))
        run.wait_output(20, timeout=180)


def s_swap_rebalance(run: Run, n: int) -> None:
    run.start(1)
    for k in range(n):
        _between(run, 1.0, 3.0)
        name = "w2"
        if k % 2 == 0:
            run.add_worker(name)
            run.events.append("w2 joined")
            time.sleep(run.rng.uniform(0.0, 2.0))  # inside the join's rebalance
            run.swap_model()
        else:
            run.swap_model()
            time.sleep(run.rng.uniform(0.0, 1.0))
            run.stop_worker(name)
            run.events.append("w2 left")
        run.wait_output(50)


# ---------------------------------------------------------------- network faults
# Through Toxiproxy between the workers and the three-node cluster (tests/toxiproxy.py). Each
# fault is one cycle: applied to every node's proxy (or one node's), held for a while, taken
# away, then the output must flow again before the next. Directions: upstream is the worker's
# requests, downstream the brokers' answers.


def _hold(run: Run, lo: float, hi: float) -> float:
    held = run.rng.uniform(lo, hi)
    time.sleep(held)
    return held


def _toxic_everywhere(run: Run, kind: str, streams, **attributes) -> list[tuple[int, str]]:
    return [(node, run.proxy.add(node, kind, stream, **attributes))
            for node in (1, 2, 3) for stream in streams]


def _after_fault(run: Run, what: str) -> None:
    run.proxy.reset()
    run.cycles += 1
    run.events.append(what)
    run.wait_output(20, timeout=240)  # it flows again


def f_latency(run: Run) -> None:
    ms = run.rng.randint(500, 3000)
    _toxic_everywhere(run, "latency", ("upstream", "downstream"), latency=ms, jitter=ms // 4)
    held = _hold(run, 4, 8)
    _after_fault(run, f"latency {ms} ms each way, {held:.1f} s")


def f_bandwidth(run: Run) -> None:
    _toxic_everywhere(run, "bandwidth", ("upstream", "downstream"), rate=1)  # KB/s
    held = _hold(run, 4, 8)
    _after_fault(run, f"bandwidth 1 KB/s, {held:.1f} s")


def f_blackhole(run: Run) -> None:
    """Nothing passes (both ways, requests only, or answers only) and the connections stay
    open: the brokers' silence a worker cannot tell from slowness. 10-20 s: past the session
    (6 s) and the transaction timeout (10 s)."""
    streams = run.rng.choice([("upstream", "downstream"), ("upstream",), ("downstream",)])
    _toxic_everywhere(run, "timeout", streams, timeout=0)
    held = _hold(run, 10, 20)
    _after_fault(run, f"blackhole {'+'.join(streams)}, {held:.1f} s")


def f_reset_peer(run: Run) -> None:
    ms = run.rng.choice([0, 100, 500, 2000])
    _toxic_everywhere(run, "reset_peer", ("upstream",), timeout=ms)
    held = _hold(run, 3, 6)
    _after_fault(run, f"reset_peer after {ms} ms, {held:.1f} s")


def f_slicer(run: Run) -> None:
    size = run.rng.choice([1, 16, 64, 256])
    _toxic_everywhere(run, "slicer", ("upstream", "downstream"), average_size=size,
                      size_variation=size // 2, delay=run.rng.choice([0, 100, 1000]))
    held = _hold(run, 5, 8)
    _after_fault(run, f"slicer {size} B, {held:.1f} s")


def f_limit_data(run: Run) -> None:
    """Every connection closed after a few bytes (and again after reconnecting)."""
    n = run.rng.choice([1, 100, 2_000, 50_000, 500_000])
    stream = run.rng.choice(["upstream", "downstream"])
    _toxic_everywhere(run, "limit_data", (stream,), bytes=n)
    held = _hold(run, 5, 8)
    _after_fault(run, f"limit_data {n} B {stream}, {held:.1f} s")


def f_broker_down(run: Run) -> None:
    """One broker unreachable for the worker alone (the cluster sees it well: it leads its
    partitions and coordinates what it coordinated)."""
    node = run.rng.choice([1, 2, 3])
    run.proxy.enable(node, False)
    held = _hold(run, 10, 20)
    _after_fault(run, f"node {node} unreachable for the worker, {held:.1f} s")


def f_flapping(run: Run) -> None:
    """A node's link going down and up every 0.5-2 s for ~10 s."""
    t_end = time.monotonic() + run.rng.uniform(8, 12)
    flaps = 0
    while time.monotonic() < t_end:
        node = run.rng.choice([1, 2, 3])
        run.proxy.enable(node, False)
        time.sleep(run.rng.uniform(0.5, 2.0))
        run.proxy.enable(node, True)
        time.sleep(run.rng.uniform(0.5, 2.0))
        flaps += 1
    _after_fault(run, f"flapping: {flaps} links down and up")


NETWORK_FAULTS = {"latency": f_latency, "bandwidth": f_bandwidth, "blackhole": f_blackhole,
                  "reset-peer": f_reset_peer, "slicer": f_slicer, "limit-data": f_limit_data,
                  "broker-down": f_broker_down, "flapping": f_flapping}


def network_scenario(faults: list):
    def play_faults(run: Run, n: int) -> None:
        run.start(1)
        for k in range(n):
            _between(run, 1.0, 3.0)
            faults[k % len(faults)](run)
    return play_faults


@dataclass
class Scenario:
    name: str
    play: object
    short: int  # pauses or faults in `make test`
    long: int  # in `make chaos`
    short_modes: tuple[str, ...] = ("exactly_once",)  # delivery modes in `make test`
    long_modes: tuple[str, ...] = MODES  # in `make chaos`
    client: dict = field(default_factory=dict)
    reload: bool = False
    broker: bool = False  # restarts the broker: only on a broker the run started
    network: bool = False  # through Toxiproxy to the three-node cluster (tests/test_network.py)


SCENARIOS = [
    Scenario("pause", s_pause, 2, 50, short_modes=MODES),
    Scenario("pause-points", s_pause_points, 3, 15),
    Scenario("poll-interval", s_poll_interval, 2, 8, client={"max.poll.interval.ms": 7000}),
    Scenario("pause-two", s_pause_two, 1, 10),
    Scenario("join-leave", s_join_leave, 2, 10),
    Scenario("add-partitions", s_add_partitions, 1, 3,
             client={"topic.metadata.refresh.interval.ms": 2000}),
    Scenario("zombie", s_zombie, 1, 4, long_modes=("exactly_once",)),
    Scenario("broker-restart", s_broker_restart, 1, 3, broker=True),
    Scenario("swap-rebalance", s_swap_rebalance, 2, 8, reload=True),
] + [
    # make chaos: ten faults of each type in each mode; make test: NETWORK_ALL
    Scenario(f"net-{name}", network_scenario([fault]), 1, 10, short_modes=(), network=True)
    for name, fault in NETWORK_FAULTS.items()]
# make test (tests/test_network.py): one fault of each type, in one run a mode
NETWORK_ALL = Scenario("net-all", network_scenario(list(NETWORK_FAULTS.values())),
                       len(NETWORK_FAULTS), len(NETWORK_FAULTS), network=True)
BY_NAME = {s.name: s for s in SCENARIOS}


def compile_models(workdir: Path) -> dict[str, Path]:
    """Two models of the same features (the second for swaps): model_id -> artifact."""
    import worker
    from tests import models as M

    out = {}
    for name in ("xgb-binary-logistic", "xgb-parallel-tree"):
        m = worker.compile_model(M.xgboost_models()[name])
        path = workdir / f"{name}.model"
        m.save(path)
        out[m.model_id] = path
    return out


def play(scenario: Scenario, mode: str, bootstrap: str, workdir: Path, models: dict,
         seed: int, long: bool = False, tree: Path = REPO, cycles: int | None = None,
         proxy=None) -> dict:
    """One scenario in one mode (``cycles`` pauses or faults instead of its short or long
    form's): the result row (see Run.check) with its seed. A network scenario needs
    ``proxy`` (a tests.toxiproxy.Toxiproxy) and ``bootstrap`` the cluster's."""
    if scenario.network and proxy is None:
        raise ValueError(f"{scenario.name} runs through Toxiproxy: no proxy given")
    workdir.mkdir(parents=True, exist_ok=True)
    n = cycles or (scenario.long if long else scenario.short)
    say(f"{scenario.name} ({mode}, {n} cycles, seed {seed}) in {workdir}")
    run = Run(bootstrap, workdir, models, mode, seed, tree=tree, client=scenario.client,
              reload=scenario.reload, proxy=proxy if scenario.network else None)
    t0 = time.monotonic()
    try:
        scenario.play(run, n)
        result = run.finish()
    finally:
        run.close()
    result.update(scenario=scenario.name, mode=mode, seed=seed,
                  seconds=round(time.monotonic() - t0, 1))
    result["passed"] = passed(result, mode, 2 if scenario.reload else 1)
    say(f"{scenario.name} ({mode}): ids {result['ids']}, lost {result['lost']}, duplicated "
        f"{result['duplicated']}, wrong model {result['wrong_model']}, offsets at end "
        f"{result['offsets_at_end']}: {'passed' if result['passed'] else 'FAILED'}")
    return result


# ---------------------------------------------------------------- make chaos


def table(results: list[dict]) -> str:
    lines = ["| scenario | mode | cycles | ids | lost | duplicated | wrong model | dead letters "
             "| offsets at end | worker exits | seed | s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|"]
    for r in results:
        exits = ", ".join(f"{k}: {v}" for k, v in r["exits"].items()) or "-"
        lines.append(f"| {r['scenario']} | {r['mode']} | {r['cycles']} | {r['ids']:,} | "
                     f"{r['lost']} | {r['duplicated']} | {r['wrong_model']} | "
                     f"{r['dead_letters']} | {'yes' if r['offsets_at_end'] else 'no'} | "
                     f"{exits} | {r['seed']} | {r['seconds']:.0f} |")
    return "\n".join(lines)


@contextlib.contextmanager
def network_harness(workdir: Path):
    """The three-node cluster (started, and stopped at the end if it was not running) and
    Toxiproxy in front of it: (the cluster's bootstrap, the proxy)."""
    from tests.toxiproxy import Toxiproxy

    run = [str(BROKER_SCRIPT), "--brokers", "3"]
    already = subprocess.run([*run, "status"], capture_output=True, timeout=30).returncode == 0
    proc = subprocess.run([*run, "start"], capture_output=True, text=True, timeout=900)
    lines = [x.strip() for x in proc.stdout.splitlines() if x.strip()]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"broker --brokers 3 start failed:\n{proc.stderr}")
    proxy = Toxiproxy(workdir / "toxiproxy.log")
    try:
        yield lines[-1], proxy
    finally:
        proxy.close()
        if not already:
            subprocess.run([*run, "stop"], capture_output=True, timeout=180)


def play_all(bootstrap: str, seed: int, names=None, modes=None, long: bool = False,
             tree: Path = REPO, restart_broker: bool = True,
             cycles: int | None = None) -> list[dict]:
    """Every scenario named (all by default) in each of its delivery modes (those of its
    short or long form; only ``modes`` if given). The network scenarios run on the
    three-node cluster through Toxiproxy, started here when the first of them comes."""
    workdir = REPO / "out" / "chaos"
    workdir.mkdir(parents=True, exist_ok=True)
    say(f"seed {seed}, broker {bootstrap}, workers from {tree}")
    models = compile_models(workdir)
    results = []
    with contextlib.ExitStack() as stack:
        network = None
        for k, sc in enumerate(BY_NAME[n] for n in (names or list(BY_NAME))):
            for mode in sc.long_modes if long else sc.short_modes:
                if modes and mode not in modes:
                    continue
                if sc.broker and not restart_broker:
                    say(f"{sc.name}: not run (it restarts the broker, which this run did not "
                        "start)")
                    continue
                if sc.network and network is None:
                    network = stack.enter_context(network_harness(workdir))
                b, proxy = network if sc.network else (bootstrap, None)
                results.append(play(sc, mode, b, workdir / f"{sc.name}-{mode}", models,
                                    seed + 1000 * k + MODES.index(mode), long, tree, cycles,
                                    proxy=proxy))
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n")[0])
    ap.add_argument("--long", action="store_true", help="the long forms (make chaos)")
    ap.add_argument("--scenario", action="append", choices=list(BY_NAME))
    ap.add_argument("--mode", action="append", choices=MODES)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--bootstrap", help="a running broker (default: the local one, started "
                                        "and stopped here)")
    ap.add_argument("--worker-tree", type=Path, default=REPO)
    args = ap.parse_args(argv)
    started = False
    bootstrap = args.bootstrap
    if not bootstrap:
        from tests.kafka_broker import start_local_broker

        bootstrap, started = start_local_broker()
    try:
        results = play_all(bootstrap, args.seed, args.scenario, args.mode, args.long,
                           args.worker_tree, restart_broker=not args.bootstrap)
    finally:
        if started:
            subprocess.run([str(BROKER_SCRIPT), "stop"], capture_output=True, timeout=180)
    print(table(results))
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
