"""What TLS and SASL cost: exactly-once throughput of one-row messages, PLAINTEXT against
SASL_SSL (SCRAM-SHA-512 over TLS, the README's ACLs only), in one run, alternating.

    python bench/tls_cost.py [--messages 50000] [--rounds 3] [--out bench/SECURITY-RESULTS.md]

Starts (or reuses) `deploy/kafka-local/broker start` and `broker --security sasl_ssl start`.
Each round publishes ``--messages`` one-row Arrow messages (two partitions) on each broker,
runs one worker (exactly_once, one scoring thread) until every id is readable under
read_committed, and reports two rates: steady (from the first committed output to the last:
what a running worker sustains) and whole (from the worker's start: start-up, the access
check, the group join and the first transaction included).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from confluent_kafka import Consumer, Producer  # noqa: E402
from report import machine  # noqa: E402 (bench/report.py: the machine description)

from tests import kafka_util as K  # noqa: E402
from tests import models as M  # noqa: E402
from tests.kafka_broker import SecureBroker, create_topic  # noqa: E402
from tests.test_security import acls_for, bindings, grant, worker_config  # noqa: E402

BROKER = REPO / "deploy" / "kafka-local" / "broker"


def start(*args: str) -> str:
    return subprocess.run([str(BROKER), *args, "start"], capture_output=True, text=True,
                          check=True).stdout.split()[-1]


def one_round(kind: str, client: dict, broker, model: Path, n: int, tmp: Path) -> dict:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(client)
    u = uuid.uuid4().hex[:8]
    names = {"in": f"tls-in-{u}", "out": f"tls-out-{u}", "dlq": f"tls-dlq-{u}",
             "shadow": f"tls-shadow-{u}", "group": f"tls-g-{u}"}
    names["txn_prefix"] = f"{names['group']}-"
    create_topic(admin, names["in"], partitions=2)
    create_topic(admin, names["out"], partitions=2)
    create_topic(admin, names["dlq"])
    p = Producer({**client, "linger.ms": 20, "enable.idempotence": True})
    for i in range(n):
        p.produce(names["in"], value=K.arrow_bytes(K.input_table(i, 1, i)), partition=i % 2)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(120) == 0
    if broker is None:
        cfg = K.write_config(tmp / f"{kind}-{u}.yaml", client["bootstrap.servers"], model,
                             names["in"], names["out"], names["dlq"], group=names["group"])
        env = {}
    else:
        grant(admin, bindings(acls_for("exactly_once"), names))
        cfg, env = worker_config(tmp / f"{kind}-{u}.yaml", broker, names, model,
                                 "exactly_once")
    reader = Consumer({**client, "group.id": f"r-{u}", "auto.offset.reset": "earliest",
                       "isolation.level": "read_committed", "enable.auto.commit": False})
    reader.subscribe([names["out"]])
    t0 = time.monotonic()
    proc = K.start_worker(cfg, tmp / f"{kind}-{u}.log", env)
    seen, first, last = 0, None, None
    try:
        deadline = t0 + 600
        while seen < n and time.monotonic() < deadline:
            for m in reader.consume(1000, 0.2):
                if m.error() is None:
                    seen += len(K.output_ids([m]))
                    now = time.monotonic()
                    first = first or now
                    last = now
    finally:
        K.stop_worker(proc)
        reader.close()
    assert seen >= n, f"{kind}: {seen} of {n} ids"
    return {"kind": kind, "messages": n, "whole_per_s": n / (last - t0),
            "steady_per_s": (n - 1) / (last - first) if last > first else float("nan")}


def noise_line(table: dict) -> str:
    """Whether the rounds' spread is larger than the difference of the medians (written from
    the figures, never by hand)."""
    runs = table["PLAINTEXT"]["runs"] + table["SASL_SSL"]["runs"]
    widest = max(max(t["runs"]) - min(t["runs"]) for t in table.values())
    gap = abs(table["PLAINTEXT"]["steady_per_s"] - table["SASL_SSL"]["steady_per_s"])
    if widest >= gap:
        return (f"The spread between one broker's rounds (up to {widest:,} records/s) is at "
                f"least the difference between the medians ({gap:,.0f}): with "
                f"{len(runs) // 2} rounds the cost is not distinguishable from none; more "
                "rounds (--rounds) on a quiet machine would tell.")
    return (f"The difference between the medians ({gap:,.0f} records/s) is larger than the "
            f"spread between one broker's rounds (up to {widest:,}).")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=50000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "bench" / "SECURITY-RESULTS.md"))
    args = ap.parse_args()
    plain = {"bootstrap.servers": start()}
    sasl = SecureBroker("sasl_ssl", start("--security", "sasl_ssl"))
    load = os.getloadavg()[0]
    results = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        import worker

        model = tmp / "fraud.model"  # the tests' XGBoost model (7 features)
        worker.compile_model(M.xgboost_models()["xgb-binary-logistic"]).save(model)
        for r in range(args.rounds):
            order = [("PLAINTEXT", plain, None), ("SASL_SSL", sasl.client("admin"), sasl)]
            if r % 2:
                order.reverse()
            for kind, client, broker in order:
                res = one_round(kind, client, broker, model, args.messages, tmp)
                print(json.dumps(res), flush=True)
                results.append(res)
    table = {}
    for kind in ("PLAINTEXT", "SASL_SSL"):
        rs = [r for r in results if r["kind"] == kind]
        table[kind] = {k: statistics.median(r[k] for r in rs)
                       for k in ("steady_per_s", "whole_per_s")}
        table[kind]["runs"] = [round(r["steady_per_s"]) for r in rs]
    cost_steady = 1 - table["SASL_SSL"]["steady_per_s"] / table["PLAINTEXT"]["steady_per_s"]
    cost_whole = 1 - table["SASL_SSL"]["whole_per_s"] / table["PLAINTEXT"]["whole_per_s"]
    import confluent_kafka

    lines = [
        "# What TLS costs: exactly-once one-row throughput, PLAINTEXT against SASL_SSL",
        "",
        f"`python bench/tls_cost.py --messages {args.messages} --rounds {args.rounds}`, "
        f"{time.strftime('%Y-%m-%d')}. Machine: {machine().get('Model name', platform.machine())}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, confluent-kafka "
        f"{confluent_kafka.__version__} / librdkafka {confluent_kafka.libversion()[0]}, "
        f"Apache Kafka 4.1.1 (one KRaft node each, loopback). Load average before: {load:.2f}.",
        "",
        "One worker, `delivery.mode: exactly_once`, one scoring thread, "
        f"{args.messages:,} one-row Arrow messages on two partitions per run, rounds alternating "
        "which broker goes first. SASL_SSL: SCRAM-SHA-512 over TLS (EC P-256 certificates, "
        "the JVM and OpenSSL defaults negotiated), "
        "the StandardAuthorizer with exactly the README's ACLs. Medians of the rounds.",
        "",
        "| broker | steady records/s (first output to last) | whole records/s (from start) | "
        "steady, each round |",
        "|---|---:|---:|---|",
    ]
    for kind in ("SASL_SSL", "PLAINTEXT"):
        t = table[kind]
        lines.append(f"| {kind} | {t['steady_per_s']:,.0f} | {t['whole_per_s']:,.0f} | "
                     f"{', '.join(f'{x:,}' for x in t['runs'])} |")
    lines += ["", f"TLS and SASL cost {cost_steady:.1%} of steady throughput and "
              f"{cost_whole:.1%} of whole-run throughput (start-up includes the TLS handshakes, "
              "the SCRAM exchange and the access check)."]
    lines += ["", noise_line(table)]
    Path(args.out).write_text("\n".join(lines) + "\n")
    Path(args.out).with_suffix(".json").write_text(json.dumps(
        {"results": results, "table": table, "load": load}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
