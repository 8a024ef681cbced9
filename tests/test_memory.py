"""Bounded memory under a backlog (real broker): a topic holding several times the worker's
memory budget in large ZSTD-compressed messages is drained with the worker's peak RSS (VmHWM,
from /proc, less the file-backed pages of its libraries) under
``delivery.memory_budget_mb``; a message larger than the per-message limit is dead-lettered
(``too_large``), not scored."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer

from tests import kafka_util as K
from tests import models as M

pytestmark = pytest.mark.kafka

BUDGET_MB = 256
ROWS, MESSAGES = 20_000, 750  # a 20,000-row message scores into ~840 KB (under 1 MB)
ROW_BYTES = 4 * M.N_FEATURES + 8  # float32 features and an int64 id, decoded


def _compressed(n: int, seed: int, levels: int = 4) -> bytes:
    """n rows, features on a grid of ``levels`` values (as binned fraud features are), ZSTD
    compressed (65,536 levels: to ~60%; one level: to almost nothing)."""
    rng = np.random.default_rng(seed)
    ids = np.arange(n, dtype=np.int64) if levels > 1 else np.zeros(n, dtype=np.int64)
    cols = {"txn_id": pa.array(ids)}
    for j in range(M.N_FEATURES):
        cols[f"feat_{j}"] = pa.array(rng.integers(0, levels, n).astype(np.float32))
    table = pa.table(cols)
    sink = pa.BufferOutputStream()
    opts = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, table.schema, options=opts) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _peak_rss_mb(pid: int) -> float:
    """The worker's peak resident memory (VmHWM) less the file-backed pages of the code it
    maps (RssFile: numpy's, pyarrow's, librdkafka's libraries). Those vary with the page
    cache, not with the backlog: the same commit measured 233 MB in one checkout and 251 MB in
    a fresh clone of it, the whole difference in RssFile (59 against 78 MB)."""
    status = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    if "VmHWM" not in status or "RssFile" not in status:
        raise AssertionError("no VmHWM or RssFile in /proc/<pid>/status")
    kb = int(status["VmHWM"].split()[0]) - int(status["RssFile"].split()[0])
    return kb / 1024


def test_a_backlog_larger_than_the_budget_drains_within_it(tmp_path, kafka_bootstrap,
                                                           topic_factory, model_path):
    topics = {"in": topic_factory(partitions=2, prefix="in"),
              "out": topic_factory(partitions=2, prefix="scores"),
              "dlq": topic_factory(partitions=1, prefix="dlq")}
    value = _compressed(ROWS, 1, levels=1 << 16)
    # 1,000,000 rows (within max_message_rows), 36 MB decoded: over the budget's 32 MB a message
    too_large = _compressed(1_000_000, 2, levels=1)
    p = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 20})
    for i in range(MESSAGES):
        p.produce(topics["in"], value=value, partition=i % 2)
        if i == MESSAGES // 2:
            p.produce(topics["in"], value=too_large, partition=0)
        p.poll(0)
    assert p.flush(60) == 0
    # the backlog is over the budget even compressed: a prefetch that is not bounded by the
    # budget (queued.max.messages.kbytes 1 GB through kafka.client) peaked at 425 MB RSS here
    assert len(value) * MESSAGES > (BUDGET_MB << 20)
    cfg = K.write_config(tmp_path / "w.yaml", kafka_bootstrap, model_path, topics["in"],
                         topics["out"], topics["dlq"], group=f"g-{topics['in']}",
                         memory_budget_mb=BUDGET_MB)
    log = tmp_path / "w.log"
    proc = K.start_worker(cfg, log)
    peak, seen = 0.0, 0
    reader = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"r-{topics['out']}",
                       "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    reader.subscribe([topics["out"]])
    try:
        deadline = time.monotonic() + 300
        while seen < MESSAGES:  # every output committed, sampling the worker's peak RSS
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"the backlog did not drain ({seen} out)"
            seen += sum(m.error() is None for m in reader.consume(500, 0.5))
            peak = max(peak, _peak_rss_mb(proc.pid))
        dlq = K.read_topic(kafka_bootstrap, topics["dlq"], expect_messages=1, timeout=30)
    finally:
        reader.close()
        rc = K.stop_worker(proc)
    assert rc == 0, log.read_text()[-3000:]
    decoded = MESSAGES * ROWS * ROW_BYTES
    assert decoded > 2 * (BUDGET_MB << 20)
    print(f"peak RSS {peak:.0f} MB for a backlog of {decoded / 2**20:.0f} MB "
          f"decoded ({MESSAGES * len(value) / 2**20:.0f} MB compressed), budget {BUDGET_MB} MB")
    assert peak < BUDGET_MB, f"peak RSS {peak:.0f} MB over the {BUDGET_MB} MB budget"
    assert [dict(m.headers())["error_code"] for m in dlq] == [b"too_large"]
    assert seen == MESSAGES
