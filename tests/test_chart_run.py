"""The Helm chart's config runs, not only validates: the chart is rendered for an Arrow, a JSON
and an Avro worker and for `serve` (each with its own `config:` value), the rendered ConfigMap's
files and the container's environment are laid out as the pod would have them (mount paths
mapped to this test's folders), the worker is started from them against the local broker (or
`serve` on a local port), and its scores are compared with XGBoost's own. Also: the generated
values.schema.json is what the settings generate, and `helm lint`/`helm template` refuse an
unknown or mistyped key and a key the chart's values own."""

from __future__ import annotations

import io
import json
import math
import re
import shutil
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import yaml
from confluent_kafka import Producer

from tests import kafka_util as K
from tests import models as M
from tests.test_deploy import CHART, _helm
from worker.chartschema import AVRO_ID

REPO = K.REPO


def _render(tmp_path: Path, values: dict) -> list[dict]:
    vf = tmp_path / "values.yaml"
    vf.write_text(yaml.safe_dump(values))
    out = subprocess.run([_helm(), "template", "fraud", str(CHART), "-f", str(vf)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _refused(*args) -> str:
    out = subprocess.run([_helm(), "template", "fraud", str(CHART), *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0, out.stdout[:500]
    return out.stderr


def _lay_out_pod(tmp_path: Path, docs: list[dict], model_path: Path) -> tuple[list, dict]:
    """The pod's files here: the ConfigMap's keys in a folder for its mount, the model in one
    for the models' mount, every mount path in the config rewritten to its folder; the
    container's environment resolved as the kubelet does (fieldRefs, $(VAR) expansion).
    Returns (the container's args with paths mapped, the environment)."""
    kind = "Deployment" if any(d["kind"] == "Deployment" for d in docs) else "StatefulSet"
    work = next(d for d in docs if d["kind"] == kind)
    pod = work["spec"]["template"]["spec"]
    c = pod["containers"][0]
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    local = {}
    for path, name in mounts.items():
        d = tmp_path / "pod" / name
        d.mkdir(parents=True, exist_ok=True)
        local[path] = str(d)
    conf_dir = Path(local[next(p for p, n in mounts.items() if n == "config")])
    model_dir = Path(local[next(p for p, n in mounts.items() if n == "models")])
    shutil.copy(model_path, model_dir / "fraud.model")

    pattern = re.compile("|".join(re.escape(p) for p in sorted(local, key=len, reverse=True)))

    def mapped(text: str) -> str:  # one pass: a mapped path is not mapped again
        return pattern.sub(lambda m: local[m.group(0)], text)

    for key, text in cm["data"].items():
        (conf_dir / key).write_text(mapped(text))
    env = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], e["value"])
        else:
            ref = e["valueFrom"]["fieldRef"]["fieldPath"]
            env[e["name"]] = {"metadata.name": "fraud-scoring-worker-0",
                              "status.podIP": "127.0.0.1"}[ref]
    return [mapped(a) for a in c["args"]], env


def _values(kafka_bootstrap, topics, port, config, **more) -> dict:
    return {"kafka": {"bootstrapServers": kafka_bootstrap, "securityProtocol": "PLAINTEXT",
                      "groupId": f"g-{topics['in']}"},
            "topics": {"input": topics["in"], "scores": topics["out"],
                       "deadLetters": topics["dlq"], "shadow": topics["out"] + "-shadow"},
            "keda": {"enabled": False}, "metricsPort": port,
            "scoring": {"threads": 1, "lazy": "off"},  # exact scores to compare
            "config": config, **more}


def _events(n: int, seed: int):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, M.N_FEATURES)).astype(np.float32)
    X[rng.random(X.shape) < 0.1] = np.nan
    return X


def _json_rows(m) -> list[dict]:
    doc = json.loads(m.value())
    return [doc] if isinstance(doc, dict) else doc


AVRO_SCHEMA = {"type": "record", "name": "Txn", "fields": [
    {"name": "id", "type": "string"},
    *({"name": f"feat_{j}", "type": ["null", "float"]} for j in range(M.N_FEATURES))]}


@pytest.mark.kafka
@pytest.mark.parametrize("fmt", ["arrow", "json", "avro"])
def test_the_rendered_worker_runs_and_scores_as_xgboost(tmp_path, kafka_bootstrap,
                                                        topic_factory, model_path, fmt):
    topics = {"in": topic_factory(partitions=2, prefix="in"),
              "out": topic_factory(partitions=2, prefix="scores"),
              "dlq": topic_factory(partitions=1, prefix="dlq")}
    n = 60
    X = _events(n, seed=11)
    config = {"delivery": {"max_wait_ms": 20},
              "kafka": {"client": {"session.timeout.ms": 10000}}}
    more = {}
    if fmt == "json":
        config.update(source={"format": "json", "fields": {"txn_id": "txn.id"}},
                      sink={"format": "json"})
    elif fmt == "avro":
        config.update(source={"format": "avro", "fields": {"txn_id": "id"}},
                      sink={"format": "json"})
        more["avroSchemas"] = {"5": AVRO_SCHEMA}
    docs = _render(tmp_path, _values(kafka_bootstrap, topics, K.free_port(), config, **more))
    args, env = _lay_out_pod(tmp_path, docs, model_path)
    assert args[0] == "--config"
    rendered = yaml.safe_load(Path(args[1]).read_text())
    assert rendered["source"].get("format", "arrow") == fmt  # the config value is in it

    p = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for i in range(n):
        feats = {f"feat_{j}": (None if math.isnan(v) else v)
                 for j, v in enumerate(X[i].tolist())}
        if fmt == "arrow":
            value = K.arrow_bytes(_arrow_row(i, X[i]))
        elif fmt == "json":
            value = json.dumps({"txn": {"id": f"t{i}"}, **feats}).encode()
        else:
            import fastavro

            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, fastavro.parse_schema(AVRO_SCHEMA),
                                       {"id": f"t{i}", **feats})
            value = b"\0" + struct.pack(">I", 5) + buf.getvalue()
        p.produce(topics["in"], value=value, key=f"k{i}".encode(), partition=i % 2)
    assert p.flush(60) == 0

    log = tmp_path / "w.log"
    proc = K.start_worker_args(args, log, env)
    try:
        if fmt == "arrow":
            msgs = K.wait_for_ids(kafka_bootstrap, topics["out"], n, proc=proc)
            ids = K.output_ids(msgs).tolist()
            scores = np.concatenate([pa.ipc.open_stream(m.value()).read_all()
                                     .column("score").to_numpy() for m in msgs])
            by_id = dict(zip([f"t{i}" for i in ids], scores.tolist(), strict=True))
        else:
            msgs = K.wait_for_ids(kafka_bootstrap, topics["out"], n, proc=proc,
                                  ids_of=lambda m: [r["txn_id"] for r in _json_rows(m)])
            by_id = {r["txn_id"]: r["score"] for m in msgs for r in _json_rows(m)}
    finally:
        rc = K.stop_worker(proc)
    text = log.read_text()
    assert rc == 0, text[-3000:]
    ref = M.xgboost_models()["xgb-binary-logistic"].inplace_predict(X)
    np.testing.assert_allclose([by_id[f"t{i}"] for i in range(n)], ref, rtol=2e-7)
    assert len(msgs) == n  # exactly once (the chart's delivery mode)


def _arrow_row(i: int, x: np.ndarray):
    cols = {"txn_id": pa.array([i], pa.int64())}
    cols.update({f"feat_{j}": pa.array([x[j]], pa.float32()) for j in range(M.N_FEATURES)})
    return pa.table(cols)


def test_the_rendered_serve_runs_and_scores_as_xgboost(tmp_path, model_path):
    port = K.free_port()
    docs = _render(tmp_path, {"mode": "serve", "serve": {"port": port, "modelName": "fraud"},
                              "scoring": {"lazy": "off"},  # exact scores to compare
                              "config": {"serve": {"access_log": True,
                                                   "allow_missing": False}}})
    args, env = _lay_out_pod(tmp_path, docs, model_path)
    assert args[:2] == ["serve", "--config"]
    log = tmp_path / "serve.log"
    proc = K.start_worker_args(args, log, env)
    X = _events(5, seed=3)
    X[np.isnan(X)] = 0.25  # serve refuses missing inputs unless allowed
    body = {"inputs": [{"name": f"feat_{j}", "shape": [5], "datatype": "FP32",
                        "data": X[:, j].tolist()} for j in range(M.N_FEATURES)]}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/fraud/infer",
                                             data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
                answer = json.loads(urllib.request.urlopen(req, timeout=10).read())
                break
            except (ConnectionError, urllib.error.URLError):
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
    finally:
        rc = K.stop_worker(proc)
    assert rc == 0, log.read_text()[-3000:]
    score = next(o for o in answer["outputs"] if o["name"] == "score")["data"]
    ref = M.xgboost_models()["xgb-binary-logistic"].inplace_predict(X)
    np.testing.assert_allclose(score, ref, rtol=2e-7)
    # config.serve.access_log applied: the 200 logged too
    assert '"method": "POST", "path": "/v2/models/fraud/infer", "status": 200' in log.read_text()


def test_the_schema_is_generated_from_the_settings():
    r = subprocess.run([sys.executable, "-m", "worker.chartschema", "--check",
                        str(CHART / "values.schema.json")], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args,says", [
    (["--set", "config.sorce.type=kafka"], "additional properties 'sorce' not allowed"),
    (["--set", "config.scoring.explian.top_k=3"], "'explian' not allowed"),
    (["--set", "config.source.format=xml"], "/config/source/format"),
    (["--set", "config.delivery.max_batch_rows=-5"], "/config/delivery/max_batch_rows"),
    (["--set", "config.scoring.threads=abc"], "/config/scoring/threads"),
    (["--set", "replica=3"], "additional properties 'replica' not allowed"),
    (["--set", "kafka.securityProtocol=SASL_SLL"], "/kafka/securityProtocol"),
    (["--set", "config.model.reload=false"],
     "config.model.reload: the chart sets this key from its value model.reload"),
    (["--set", "config.source.topic=x"], "from its value topics.input"),
    (["--set", "mode=serve", "--set", "config.serve.port=1"], "from its value serve.port"),
    # set by the pod's environment or Secrets: config would be overridden, or leak a secret
    (["--set", "config.kafka.transactional_id=x"], "config.kafka.transactional_id: is set per "
                                                   "pod from kafka.groupId"),
    (["--set", "config.metrics.host=0.0.0.0"], "config.metrics.host: is the pod's IP"),
    (["--set", "config.kafka.sasl_username=bob"], "comes from kafka.credentialsSecret"),
    (["--set", "config.kafka.sasl_password=hunter2"], "is a secret, never in a ConfigMap"),
    (["--set", "config.kafka.allow_secrets_in_file=true"], "would let a secret into"),
    # kafka.client: the keys the worker owns, and secrets (helm names another path at random)
    (["--set", "config.kafka.client.enable\\.auto\\.commit=true"],
     "invalid propertyName 'enable.auto.commit'"),
    (["--set", "config.kafka.client.ssl\\.keystore\\.password=x"],
     "invalid propertyName 'ssl.keystore.password'"),
    # (helm's message names another path for a property name at random: the pattern is said)
    (["--set-json", 'avroSchemas={"x1": {}}'], f"'x1' does not match pattern '{AVRO_ID}'"),
    (["--set-json", 'avroSchemas={"1": 5}'], "/avroSchemas/1': got number"),
    (["--set-json", 'avroSchemas={"01": {}}'], "'01' does not match"),  # the worker reads 1.avsc
    (["--set-json", 'avroSchemas={"12345678901": {}}'], "'12345678901' does not match"),  # 11
    # past 2^32 - 1: a file no message's 4-byte id can name (ten digits were let through)
    (["--set-json", 'avroSchemas={"4294967296": {}}'], "'4294967296' does not match"),
    (["--set-json", 'avroSchemas={"9999999999": {}}'], "'9999999999' does not match"),
    # keys the chart owns only in some settings are still its own
    (["--set", "mode=serve", "--set", "config.serve.grpc_port=8081"], "value serve.grpcPort"),
    (["--set", "config.model.shadow_path=x"], "value model.shadowFile"),
    (["--set", "kafka.securityProtocol=PLAINTEXT", "--set", "config.kafka.sasl_mechanism=PLAIN"],
     "value kafka.saslMechanism"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_the_chart_refuses_what_the_worker_would(args, says):
    assert says in _refused(*args)


def test_helm_lint_checks_the_schema():
    ok = subprocess.run([_helm(), "lint", str(CHART), "--set", "config.source.format=json"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([_helm(), "lint", str(CHART), "--set", "config.soruce.format=json"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "'soruce' not allowed" in bad.stdout + bad.stderr


def test_lazy_off_renders_as_off_however_yaml_reads_it(tmp_path):
    """YAML reads an unquoted off as false: the value and config's mode accept it and the
    ConfigMap says "off" (a new user's `scoring: {lazy: off}` was refused as not one of
    'off', ...)."""
    docs = _render(tmp_path, {"scoring": {"lazy": False}})
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    assert 'mode: "off"' in cm["data"]["prod.yaml"] or "mode: 'off'" in cm["data"]["prod.yaml"]
    assert yaml.safe_load(cm["data"]["prod.yaml"])["scoring"]["lazy"]["mode"] == "off"
    out = subprocess.run([_helm(), "template", "fraud", str(CHART), "--set", "mode=serve",
                          "--set-json", 'config={"scoring": {"explain": {"method": "path"}}}',
                          "--set", "scoring.lazy=off"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr


def test_lazy_takes_its_policy_parameters(tmp_path):
    docs = _render(tmp_path, {"scoring": {"lazy": {"mode": "certified", "tau": 0.95}}})
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    from worker.config import LazyConfig

    lazy = yaml.safe_load(cm["data"]["prod.yaml"])["scoring"]["lazy"]
    assert lazy == {"mode": "certified", "tau": 0.95}
    assert LazyConfig(**lazy).mode == "certified"


def test_avro_schema_ids_at_the_bound_render(tmp_path):
    """The id bound's edges (0 and 2^32 - 1, the largest a message's 4-byte id says) render,
    each as <id>.avsc: one past it is refused (test_the_chart_refuses_what_the_worker_would),
    and the pattern says exactly 0 to 2^32 - 1 (every edge of its alternatives)."""
    docs = _render(tmp_path, {"avroSchemas": {"0": {"type": "record", "name": "A", "fields": []},
                                              "4294967295": "{}", "999999999": "{}"}})
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    assert {"0.avsc", "4294967295.avsc", "999999999.avsc"} <= set(cm["data"])
    pattern = re.compile(AVRO_ID)
    edges = {0, 2**32 - 1, 2**32, 10**9 - 1, 10**9, 10**10 - 1}
    for k in range(10):  # each digit's boundary in 4294967295: 42949672 95 -> 42949673 00
        step = 10 ** k
        edges |= {(2**32 - 1) // step * step - 1, (2**32 - 1) // step * step,
                  ((2**32 - 1) // step + 1) * step, ((2**32 - 1) // step + 1) * step - 1}
    rng = np.random.default_rng(0)
    for n in sorted(edges) + rng.integers(0, 10**10, 20_000).tolist():
        assert bool(pattern.match(str(n))) == (0 <= n <= 2**32 - 1), n
    for s in ("01", "-1", "", "4294967295 ", "1e9"):
        assert not pattern.match(s), s
