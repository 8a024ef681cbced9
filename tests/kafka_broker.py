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
) -> str:
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
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
