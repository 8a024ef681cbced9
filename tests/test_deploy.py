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
    # a stable id per pod, under the ACL prefix docs/operations.md grants (<group id>-): the
    # pod name through an earlier variable (Kubernetes expands $(POD_NAME))
    names = [e["name"] for e in c["env"]]
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert names.index("POD_NAME") < names.index("SCORING_WORKER__KAFKA__TRANSACTIONAL_ID")
    assert env["SCORING_WORKER__KAFKA__TRANSACTIONAL_ID"]["value"] == \
        "scoring-worker-$(POD_NAME)"
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
    pytest.skip("helm not found: go install helm.sh/helm/v3/cmd/helm@v3.22.0 "
                "(docs/operations.md)")


def _check_hardening(docs, values):
    """Non-root, read-only, no capabilities, RuntimeDefault seccomp; Kafka credentials and CA
    as files from Secrets (never an environment variable for the password); a NetworkPolicy
    letting out only the brokers and DNS and in only the metrics port; a PDB."""
    sts, c = _worker_container(docs)
    pod = sts["spec"]["template"]["spec"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    env = {e["name"] for e in c["env"]}
    assert "SCORING_WORKER__KAFKA__SASL_PASSWORD" not in env
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    protocol = values.get("kafka.securityProtocol", "SASL_SSL")
    if protocol.startswith("SASL"):
        assert mounts["kafka-credentials"]["readOnly"] is True
        assert volumes["kafka-credentials"]["secret"]["defaultMode"] == 0o440
    if protocol != "PLAINTEXT":
        assert volumes["kafka-ca"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    if values.get("kafka.tlsSecret"):
        assert volumes["kafka-tls"]["secret"]["secretName"] == values["kafka.tlsSecret"]
    np_ = next(d for d in docs if d["kind"] == "NetworkPolicy")
    assert np_["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert [r["ports"] for r in np_["spec"]["ingress"]] == [[{"port": 9464, "protocol": "TCP"}]]
    egress_ports = sorted(p["port"] for r in np_["spec"]["egress"] for p in r["ports"])
    assert egress_ports == [53, 53, 9093]
    pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("values", [
    {},
    {"model.shadowFile": "challenger.model", "keda.enabled": "false",
     "topics.inputPartitions": "3"},
    {"kafka.securityProtocol": "SSL", "kafka.tlsSecret": "worker-tls"},
    {"kafka.securityProtocol": "PLAINTEXT", "keda.enabled": "false"},
    {"kafka.saslMechanism": "PLAIN"},
], ids=["sasl_ssl", "shadow-no-keda", "mtls", "plaintext", "sasl-plain"])
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
    secured = values.get("kafka.securityProtocol") != "PLAINTEXT"
    assert kinds == sorted(["ConfigMap", "Service", "StatefulSet", "NetworkPolicy",
                            "PodDisruptionBudget"]
                           + (["ScaledObject"] if keda else [])
                           + (["TriggerAuthentication"] if keda and secured else []))
    _validate(docs)
    _check_guarantees(docs)
    _check_hardening(docs, values)
    if keda and secured:
        trig = next(d for d in docs if d["kind"] == "ScaledObject")["spec"]["triggers"][0]
        mech = values.get("kafka.saslMechanism", "SCRAM-SHA-512")
        if values.get("kafka.securityProtocol", "SASL_SSL").startswith("SASL"):
            assert trig["metadata"]["sasl"] == {"SCRAM-SHA-512": "scram_sha512",
                                                "PLAIN": "plaintext"}[mech]
        assert trig["metadata"]["tls"] == "enable"
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
    text = cm["data"]["prod.yaml"]
    # the Secrets' files, where the pod mounts them
    for mounted in ("/etc/kafka-credentials/password", "/etc/kafka-ca/ca.crt",
                    "/etc/kafka-tls/tls.crt", "/etc/kafka-tls/tls.key"):
        local = tmp_path / mounted.strip("/").replace("/", "_")
        local.write_text("x")
        text = text.replace(mounted, str(local))
    cfg.write_text(text)
    os.environ["SCORING_WORKER__KAFKA__SASL_USERNAME"] = "scoring-worker"  # from the Secret
    try:
        s = load_settings(str(cfg))
    finally:
        del os.environ["SCORING_WORKER__KAFKA__SASL_USERNAME"]
    if secured:
        assert s.kafka.security_protocol == values.get("kafka.securityProtocol", "SASL_SSL")
        assert s.kafka.ssl_ca_location.endswith("ca.crt")
    assert s.model.reload and s.delivery.mode == "exactly_once"
    assert s.model.path == "/var/lib/scoring-worker/models/fraud.model"
    if values.get("model.shadowFile"):
        assert s.model.shadow_path.endswith("/challenger.model")
        assert s.sink.shadow_topic == "scores-shadow"


@pytest.mark.parametrize("hpa,grpc", [(True, False), (False, False), (True, True)])
def test_the_chart_renders_serve_mode(tmp_path, hpa, grpc):
    """mode: serve renders a Deployment, a Service and (unless turned off) a
    HorizontalPodAutoscaler, ready on /v2/health/ready, hardened like the worker, no broker
    egress, and a serve config the command accepts; with serve.grpcPort the gRPC half on its
    port (container, Service, NetworkPolicy, config)."""
    from worker.config import load_settings

    args = [_helm(), "template", "fraud", str(CHART), "--set", "mode=serve"]
    if not hpa:
        args += ["--set", "serve.hpa.enabled=false"]
    if grpc:
        args += ["--set", "serve.grpcPort=8081"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted(d["kind"] for d in docs) == sorted(
        ["ConfigMap", "Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget"]
        + (["HorizontalPodAutoscaler"] if hpa else []))
    _validate(docs)
    dep = next(d for d in docs if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["args"][:1] == ["serve"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert ("replicas" in dep["spec"]) == (not hpa)
    grpc_port = [{"name": "grpc", "port": 8081, "targetPort": "grpc"}] if grpc else []
    assert c["ports"] == [{"name": "http", "containerPort": 8080}] + (
        [{"name": "grpc", "containerPort": 8081}] if grpc else [])
    svc = next(d for d in docs if d["kind"] == "Service")
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http"},
                                    *grpc_port]
    assert "clusterIP" not in svc["spec"]
    if hpa:
        h = next(d for d in docs if d["kind"] == "HorizontalPodAutoscaler")
        assert h["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                               "name": "fraud-scoring-worker"}
    np_ = next(d for d in docs if d["kind"] == "NetworkPolicy")
    assert [r["ports"] for r in np_["spec"]["ingress"]] == [
        [{"port": 8080, "protocol": "TCP"}] + ([{"port": 8081, "protocol": "TCP"}] if grpc
                                               else [])]
    assert sorted(p["port"] for r in np_["spec"]["egress"] for p in r["ports"]) == [53, 53]
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(cm["data"]["serve.yaml"])
    s = load_settings(str(cfg), defaults={"source": {"type": "file", "path": os.devnull}})
    assert (s.serve.host, s.serve.port, s.serve.name) == ("0.0.0.0", 8080, "fraud")
    assert s.serve.grpc_port == (8081 if grpc else None)
    assert (s.serve.max_explain_rows, s.serve.max_response_bytes) == (10_000, 64 << 20)
    assert s.model.path == "/var/lib/scoring-worker/models/fraud.model" and s.model.reload


@pytest.mark.parametrize("port", ["0", "8080"])
def test_the_chart_refuses_a_grpc_port_a_pod_cannot_have(port):
    """serve.grpcPort 0 (a port the system picks: nothing a Service can point at) or equal
    to serve.port: the render fails naming the value (a new user's walkthrough rendered
    both, the second crashing at start)."""
    out = subprocess.run([_helm(), "template", "fraud", str(CHART), "--set", "mode=serve",
                          "--set", f"serve.grpcPort={port}"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and f"serve.grpcPort ({port})" in out.stderr, out.stderr


def test_serve_mode_lets_prometheus_in_when_callers_are_named():
    """networkPolicy.serveFrom and metricsFrom both set: the callers reach serve's ports,
    Prometheus its port (/metrics shares it), nobody else."""
    out = subprocess.run([_helm(), "template", "fraud", str(CHART), "--set", "mode=serve",
                          "--set", "serve.grpcPort=8081",
                          "--set-json", 'networkPolicy.serveFrom=[{"podSelector": '
                                        '{"matchLabels": {"app": "auth"}}}]',
                          "--set-json", 'networkPolicy.metricsFrom=[{"namespaceSelector": '
                                        '{"matchLabels": {"name": "monitoring"}}}]'],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    np_ = next(d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "NetworkPolicy")
    assert [(sorted(p["port"] for p in r["ports"]), r["from"]) for r in
            np_["spec"]["ingress"]] == [
        ([8080, 8081], [{"podSelector": {"matchLabels": {"app": "auth"}}}]),
        ([8080], [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}])]


def test_the_chart_renders_the_shipped_alert_rules_behind_a_value():
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yaml").read_text())
    off = subprocess.run([_helm(), "template", "fraud", str(CHART)], capture_output=True,
                         text=True, check=True).stdout
    assert "PrometheusRule" not in off
    on = subprocess.run([_helm(), "template", "fraud", str(CHART), "--set",
                         "prometheusRule.enabled=true", "--set",
                         "prometheusRule.labels.release=kps"], capture_output=True, text=True,
                        check=True).stdout
    (doc,) = [d for d in yaml.safe_load_all(on) if d and d["kind"] == "PrometheusRule"]
    assert doc["spec"]["groups"] == rules["groups"]
    assert doc["metadata"]["labels"]["release"] == "kps"
