"""Kubernetes files: the plain manifest and the Helm chart's rendering are valid Kubernetes
(kubernetes-validate, offline schemas), keep the guarantees (a stable transactional id per pod,
readiness on /readyz, the grace period above the stop bound, KEDA capped at the partition
count), and the worker config the chart renders loads."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "scoring-worker"


def _validate(docs):
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    for doc in docs:
        if doc.get("apiVersion", "").startswith("keda.sh/"):
            continue  # a CRD: checked field by field below
        kv.validate(doc, kv.latest_version(), strict=True)


def _worker_container(docs):
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    return sts, sts["spec"]["template"]["spec"]["containers"][0]


def _check_guarantees(docs):
    sts, c = _worker_container(docs)
    env = {e["name"]: e for e in c["env"]}
    assert env["SCORING_WORKER__KAFKA__TRANSACTIONAL_ID"]["valueFrom"]["fieldRef"][
        "fieldPath"] == "metadata.name"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # the worker exits within stop_timeout (10 s) + 10 s of SIGTERM
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 20


def test_the_plain_manifest_is_valid_and_keeps_the_guarantees():
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy/k8s/scoring-worker.yaml")
                                          .read_text()) if d]
    _validate(docs)
    _check_guarantees(docs)


def _helm():
    for cand in (shutil.which("helm"), str(Path.home() / "go" / "bin" / "helm")):
        if cand and os.access(cand, os.X_OK):
            return cand
    pytest.skip("helm not found: go install helm.sh/helm/v3/cmd/helm@v3.22.0 (README)")


@pytest.mark.parametrize("values", [{}, {"model.shadowFile": "challenger.model",
                                         "keda.enabled": "false", "topics.inputPartitions": "3"}])
def test_the_chart_renders_valid_files_that_keep_the_guarantees(tmp_path, values):
    from worker.config import load_settings

    args = [_helm(), "template", "fraud", str(CHART)]
    for k, v in values.items():
        args += ["--set", f"{k}={v}"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    keda = values.get("keda.enabled") != "false"
    assert kinds == sorted(["ConfigMap", "Service", "StatefulSet"]
                           + (["ScaledObject"] if keda else []))
    _validate(docs)
    _check_guarantees(docs)
    if keda:
        so = next(d for d in docs if d["kind"] == "ScaledObject")
        assert so["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                                "name": "fraud-scoring-worker"}
        assert so["spec"]["maxReplicaCount"] == 12  # the input partitions (values.yaml)
        trig = so["spec"]["triggers"][0]
        assert trig["type"] == "kafka" and trig["metadata"]["allowIdleConsumers"] == "false"
        assert trig["metadata"]["consumerGroup"] == "scoring-worker"
    # the worker config the chart renders is one the worker accepts
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    cfg = tmp_path / "prod.yaml"
    cfg.write_text(cm["data"]["prod.yaml"])
    s = load_settings(str(cfg))
    assert s.model.reload and s.delivery.mode == "exactly_once"
    assert s.model.path == "/var/lib/scoring-worker/models/fraud.model"
    if values.get("model.shadowFile"):
        assert s.model.shadow_path.endswith("/challenger.model")
        assert s.sink.shadow_topic == "scores-shadow"
