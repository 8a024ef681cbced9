"""The test broker supports idempotent producers, transactions and read_committed consumers."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

pytestmark = pytest.mark.kafka


def _delivery_checker(errors: list):
    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)

    return on_delivery


def test_transactions_read_committed(kafka_bootstrap, topic_factory):
    topic = topic_factory(partitions=2, prefix="txn-check")
    errors: list = []
    on_delivery = _delivery_checker(errors)

    # 10 plain messages through an idempotent producer, spread over both partitions.
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for i in range(10):
        producer.produce(topic, f"plain-{i}".encode(), partition=i % 2, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert errors == []

    # A transactional producer: commit 5, abort 3.
    txn = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "transactional.id": f"txn-check-{uuid.uuid4().hex}",
            "transaction.timeout.ms": 60000,
        }
    )
    t0 = time.monotonic()
    txn.init_transactions(120)
    print(f"init_transactions took {time.monotonic() - t0:.2f}s")

    txn.begin_transaction()
    for i in range(5):
        txn.produce(topic, f"committed-{i}".encode(), partition=i % 2, on_delivery=on_delivery)
    txn.commit_transaction(60)

    txn.begin_transaction()
    for i in range(3):
        txn.produce(topic, f"aborted-{i}".encode(), partition=i % 2, on_delivery=on_delivery)
    txn.flush(30)  # make sure the aborted records really reach the log before the abort
    txn.abort_transaction(60)
    # Deliveries of aborted messages may report errors; only committed ones must succeed.
    assert not [e for e in errors if e.code() != KafkaError._PURGE_QUEUE]

    expected = {f"plain-{i}" for i in range(10)} | {f"committed-{i}" for i in range(5)}

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"txn-check-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.subscribe([topic])
        received: list[str] = []
        eof: set[int] = set()
        deadline = time.monotonic() + 60
        # Read until both partitions reached their end (the last stable offset), then a little more
        # to catch anything that should not be there.
        while time.monotonic() < deadline and len(eof) < 2:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(msg.partition())
                    continue
                raise KafkaException(msg.error())
            eof.discard(msg.partition())
            received.append(msg.value().decode())
        assert len(eof) == 2, f"did not reach the end of both partitions; got {received}"
        extra_until = time.monotonic() + 2
        while time.monotonic() < extra_until:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                received.append(msg.value().decode())
    finally:
        consumer.close()

    assert len(received) == 15, received
    assert set(received) == expected
