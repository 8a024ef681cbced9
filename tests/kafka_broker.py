"""Pytest plugin: a real Apache Kafka broker for the tests.

Register from tests/conftest.py with ``pytest_plugins = ["tests.kafka_broker"]``.

Fixtures
--------
kafka_bootstrap (session)
    Bootstrap address. Uses ``$SCORING_WORKER_TEST_BOOTSTRAP`` if set; otherwise runs
    ``deploy/kafka-local/broker start`` (a local single-node KRaft broker from Maven Central
    jars) and takes the last line of its stdout. A broker started by this fixture is stopped
    at the end of the session unless ``KAFKA_LOCAL_KEEP=1``; a broker that was already running
    is left alone.
kafka_cluster (session)
    The three-node cluster (``broker --brokers 3``) with ``kill(n)``, ``restart(n)`` and
    ``leader(topic, partition)``; ``cluster_topic_factory`` makes topics on it (replication
    factor 3, ``min.insync.replicas`` 2).
toxiproxy (session)
    Toxiproxy in front of the cluster's nodes (tests/toxiproxy.py): network faults between a
    worker and its brokers.
topic_factory (function)
    ``topic_factory(partitions=1, prefix="test", config=None) -> str`` creates a uniquely named
    topic, waits until all its partitions have leaders, and deletes it at teardown.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

REPO_ROOT = Path(__file__).resolve().parent.parent
BROKER_SCRIPT = REPO_ROOT / "deploy" / "kafka-local" / "broker"
BOOTSTRAP_ENV = "SCORING_WORKER_TEST_BOOTSTRAP"
KEEP_ENV = "KAFKA_LOCAL_KEEP"

# Cold start may download ~45 MB of jars with Maven before the broker's own ~120 s readiness wait.
BROKER_START_TIMEOUT_S = 600


def _broker(cmd: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BROKER_SCRIPT), cmd],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_local_broker() -> tuple[str, bool]:
    """Start (or reuse) the local broker. Returns (bootstrap, started_by_us)."""
    already_running = _broker("status", timeout=30).returncode == 0
    proc = _broker("start", timeout=BROKER_START_TIMEOUT_S)
    lines = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"{BROKER_SCRIPT} start failed (exit {proc.returncode}).\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return lines[-1], not already_running


@pytest.fixture(scope="session")
def kafka_bootstrap():
    env = os.environ.get(BOOTSTRAP_ENV, "").strip()
    if env:
        yield env
        return
    bootstrap, started = start_local_broker()
    try:
        yield bootstrap
    finally:
        if started and os.environ.get(KEEP_ENV, "") not in ("1", "true", "yes"):
            _broker("stop", timeout=120)


def _wait_topic_ready(admin: AdminClient, topic: str, partitions: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            md = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
            if (
                md is not None
                and md.error is None
                and len(md.partitions) == partitions
                and all(p.leader >= 0 and p.error is None for p in md.partitions.values())
            ):
                return
        except KafkaException:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic} not ready after {timeout}s")
        time.sleep(0.1)


def create_topic(
    admin: AdminClient,
    name: str,
    partitions: int = 1,
    config: dict | None = None,
    timeout: float = 30.0,
    replication: int = 1,
    replicas: list[list[int]] | None = None,
) -> str:
    """``replicas``: each partition's replicas (the first its preferred leader) instead of
    ``partitions`` x ``replication`` placed by the broker."""
    topic = (NewTopic(name, num_partitions=len(replicas), replication_factor=-1,
                      replica_assignment=replicas, config=config or {}) if replicas
             else NewTopic(name, num_partitions=partitions, replication_factor=replication,
                           config=config or {}))
    partitions = len(replicas) if replicas else partitions
    futures = admin.create_topics(
        [topic],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    futures[name].result(timeout=timeout)
    _wait_topic_ready(admin, name, partitions, timeout)
    return name


def delete_topics(admin: AdminClient, names: list[str], timeout: float = 15.0) -> None:
    """Best effort."""
    if not names:
        return
    # Teardown must not fail the test.
    with contextlib.suppress(Exception):
        futures = admin.delete_topics(names, operation_timeout=timeout, request_timeout=timeout)
        for fut in futures.values():
            with contextlib.suppress(Exception):
                fut.result(timeout=timeout)


@pytest.fixture
def topic_factory(kafka_bootstrap):
    # A client per test: a session-wide one would outlive the broker and log reconnect errors.
    # Held in a list so teardown can drop it (AdminClient has no close()): pytest keeps `factory`
    # alive until after session teardown, when the broker may already be stopped.
    clients = [AdminClient({"bootstrap.servers": kafka_bootstrap})]
    created: list[str] = []

    def factory(partitions: int = 1, prefix: str = "test", config: dict | None = None) -> str:
        name = f"{prefix}-{uuid.uuid4().hex}"
        create_topic(clients[0], name, partitions=partitions, config=config)
        created.append(name)
        return name

    yield factory
    delete_topics(clients[0], created)
    clients.clear()


class LocalCluster:
    """The three-node local cluster (``broker --brokers 3``): node N is broker id N."""

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap

    def _run(self, *args: str, timeout: float = 180) -> str:
        proc = subprocess.run([str(BROKER_SCRIPT), "--brokers", "3", *args], capture_output=True,
                              text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"broker --brokers 3 {' '.join(args)} failed "
                               f"(exit {proc.returncode}):\n{proc.stderr}")
        return proc.stdout

    def kill(self, node: int) -> None:
        """SIGKILL one node (a crash: no controlled shutdown)."""
        self._run("kill", str(node))

    def pause(self, node: int) -> None:
        """SIGSTOP one node: it stops answering, its connections open (a blackhole)."""
        self._run("pause", str(node))

    def resume(self, node: int) -> None:
        self._run("resume", str(node))

    def coordinator(self, group: str, timeout: float = 30) -> int:
        """The node coordinating ``group`` (FindCoordinator, through a describe)."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        return admin.describe_consumer_groups([group])[group].result(timeout).coordinator.id

    def restart(self, node: int) -> None:
        """Start the node again and wait until it serves. On a loaded machine a node started
        right after its kill can fail to register with the controller quorum in time (it
        exits): it is started once more."""
        try:
            self._run("restart", str(node))
        except RuntimeError:
            time.sleep(3)
            self._run("restart", str(node))

    def start(self) -> None:
        """Start every node that is not running and wait until all serve."""
        self._run("start", timeout=BROKER_START_TIMEOUT_S)

    def leader(self, topic: str, partition: int = 0, timeout: float = 30) -> int:
        """The node leading a partition (internal topics too: __transaction_state[0] is every
        transaction's coordinator, __consumer_offsets[0] every group's)."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(KafkaException):
                md = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
                if md is not None and md.error is None and partition in md.partitions \
                        and md.partitions[partition].leader > 0:
                    return md.partitions[partition].leader
            if time.monotonic() > deadline:
                raise TimeoutError(f"no leader for {topic}[{partition}] after {timeout}s")
            time.sleep(0.2)


def _start(*options: str) -> tuple[list[str], str, bool]:
    """``broker OPTIONS start``: (the command's prefix, the bootstrap address, whether it was
    running before)."""
    run = [str(BROKER_SCRIPT), *options]
    already = subprocess.run([*run, "status"], capture_output=True, timeout=30).returncode == 0
    proc = subprocess.run([*run, "start"], capture_output=True, text=True,
                          timeout=BROKER_START_TIMEOUT_S, check=False)
    lines = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"broker {' '.join(options)} start failed (exit "
                           f"{proc.returncode}):\n{proc.stderr}")
    return run, lines[-1], already


@pytest.fixture(scope="session")
def kafka_cluster():
    """The local three-node KRaft cluster, started for the session (stopped at its end unless
    it was already running or ``KAFKA_LOCAL_KEEP=1``)."""
    run, bootstrap, already = _start("--brokers", "3")
    try:
        yield LocalCluster(bootstrap)
    finally:
        if not already and os.environ.get(KEEP_ENV, "") not in ("1", "true", "yes"):
            subprocess.run([*run, "stop"], capture_output=True, timeout=180, check=False)


@pytest.fixture
def cluster_topic_factory(kafka_cluster):
    """Topics on the cluster: replication factor 3, min.insync.replicas 2. Every node is
    started first if one is down (a test before this one that failed mid-way left it so)."""
    kafka_cluster.start()
    clients = [AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})]
    created: list[str] = []

    def factory(partitions: int = 1, prefix: str = "test", config: dict | None = None,
                leaders: list[int] | None = None) -> str:
        """``leaders``: partition i led by node leaders[i % len(leaders)] (replicas on all
        three nodes); by default the brokers place them."""
        name = f"{prefix}-{uuid.uuid4().hex}"
        replicas = None if not leaders else [
            [leaders[i % len(leaders)]] + [n for n in (1, 2, 3) if n != leaders[i % len(leaders)]]
            for i in range(partitions)]
        create_topic(clients[0], name, partitions=partitions,
                     config={"min.insync.replicas": "2", **(config or {})}, replication=3,
                     replicas=replicas)
        created.append(name)
        return name

    yield factory
    delete_topics(clients[0], created)
    clients.clear()


@pytest.fixture(scope="session")
def toxiproxy(kafka_cluster, tmp_path_factory):
    """Toxiproxy in front of the cluster's nodes (tests/toxiproxy.py): a worker bootstrapped
    at ``toxiproxy.bootstrap`` reaches the brokers only through it. Built with Go on first
    use; without Go the tests that need it skip, saying so."""
    from tests import toxiproxy as T

    try:
        proxy = T.Toxiproxy(tmp_path_factory.mktemp("toxiproxy") / "toxiproxy.log")
    except T.Unavailable as exc:
        pytest.skip(str(exc))
    try:
        yield proxy
    finally:
        proxy.close()


class SecureBroker:
    """A secured single broker (``broker --security sasl_ssl|mtls``): its client listener
    takes only that protocol, the StandardAuthorizer is on and no ACL means no access. Users:
    ``admin`` (super user), ``worker`` (no ACLs until a test grants them), ``intruder``."""

    def __init__(self, security: str, bootstrap: str):
        self.security, self.bootstrap = security, bootstrap
        self._configs: dict[str, dict] = {}

    def client(self, user: str) -> dict:
        """``user``'s librdkafka settings (from ``broker client-config USER``), bootstrap
        included."""
        if user not in self._configs:
            out = subprocess.run([str(BROKER_SCRIPT), "--security", self.security,
                                  "client-config", user], capture_output=True, text=True,
                                 timeout=30, check=True).stdout
            conf = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
            self._configs[user] = {"bootstrap.servers": self.bootstrap, **conf}
        return dict(self._configs[user])

    def admin(self) -> AdminClient:
        return AdminClient(self.client("admin"))


def _secure_broker(security: str):
    run, bootstrap, already = _start("--security", security)
    try:
        yield SecureBroker(security, bootstrap)
    finally:
        if not already and os.environ.get(KEEP_ENV, "") not in ("1", "true", "yes"):
            subprocess.run([*run, "stop"], capture_output=True, timeout=180, check=False)


@pytest.fixture(scope="session")
def sasl_ssl_broker():
    """The SASL_SSL broker (SCRAM-SHA-512/256 and PLAIN over TLS), for the session."""
    yield from _secure_broker("sasl_ssl")


@pytest.fixture(scope="session")
def mtls_broker():
    """The mutual-TLS broker (a client certificate per user), for the session."""
    yield from _secure_broker("mtls")
