"""The alert rules (deploy/prometheus/alerts.yaml) and the Grafana dashboard
(deploy/grafana/scoring-worker.json) against real Prometheus (issue 51): promtool's unit tests
of every rule, then a real Prometheus server scraping a real worker on the local broker. A
stream whose one feature turns null makes the drift and missing-rate alerts fire, read from
Prometheus's /api/v1/alerts; while the stream was clean none was active; and every panel's
query runs against that Prometheus without an error or an empty result."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import yaml

from tests import kafka_util as K
from tests import models as M

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "alerts.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "scoring-worker.json"
MODEL_ALERTS = {"ScoringFeatureDrift", "ScoringMissingRateJump", "ScoringScoreDrift"}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"prometheus not found ({name}): apt-get install prometheus (.ci/run "
                    "installs it)")
    return path


def test_the_rules_are_valid_and_pass_their_unit_tests():
    promtool = _tool("promtool")
    out = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "SUCCESS: 9 rules found" in out.stdout, out.stdout + out.stderr
    out = subprocess.run([promtool, "test", "rules", "alerts_test.yaml"], cwd=RULES.parent,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def test_every_panel_has_a_query_and_the_chart_ships_the_same_rules():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["panels"] and all(p["targets"] and all(t["expr"] for t in p["targets"])
                                  for p in dash["panels"])
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for what in ("latency", "lag", "band", "psi", "missing", "swaps"):
        assert what in titles, what
    chart = ROOT / "deploy" / "helm" / "scoring-worker" / "files" / "alerts.yaml"
    assert chart.read_text() == RULES.read_text()


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _query(prom: str, expr: str) -> dict:
    return _get(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))


def _active(prom: str) -> list[dict]:
    return [a for a in _get(f"{prom}/api/v1/alerts")["data"]["alerts"]]


class _Stream(threading.Thread):
    """Messages of 20 rows at 50 messages/s; ``null`` set: feat_2 arrives null."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.null = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self):
        from confluent_kafka import Producer

        try:
            p = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 2})
            i = 0
            while not self.done.is_set():
                t = K.input_table(i * 20, 20, seed=10_000 + i)
                if self.null.is_set():
                    j = t.schema.get_field_index("feat_2")
                    t = t.set_column(j, "feat_2", pa.nulls(len(t), pa.float32()))
                p.produce(self.topic, value=K.arrow_bytes(t), partition=i % 2)
                p.poll(0)
                i += 1
                time.sleep(0.02)
            p.flush(30)
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            self.error = exc


@pytest.mark.kafka
def test_a_feature_turned_null_fires_its_alerts_in_a_real_prometheus(
        tmp_path, kafka_bootstrap, topic_factory):
    import worker

    prometheus = _tool("prometheus")
    # the tests' model with a reference profile of rows like the stream's
    ref = K.input_table(0, 20_000, seed=1)
    model = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"]).with_reference(
        ref.drop_columns(["txn_id"]))
    model_path = tmp_path / "profiled.model"
    model.save(model_path)
    topics = {k: topic_factory(partitions=2, prefix=k) for k in ("in", "scores", "dlq")}
    wport, pport = K.free_port(), K.free_port()
    cfg = K.write_config(tmp_path / "w.yaml", kafka_bootstrap, model_path, topics["in"],
                         topics["scores"], topics["dlq"], group=f"g-{topics['in']}",
                         mode="at_least_once", metrics_port=wport)
    doc = yaml.safe_load(cfg.read_text())
    doc["monitoring"] = {"window_s": 2, "min_rows": 200}
    cfg.write_text(yaml.safe_dump(doc))
    # the shipped rules, their `for:` shortened to what a test can wait
    rules = re.sub(r"for: \d+m", "for: 2s", RULES.read_text())
    (tmp_path / "alerts.yaml").write_text(rules)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "alerts.yaml")],
        "scrape_configs": [{"job_name": "scoring-worker",
                            "static_configs": [{"targets": [f"127.0.0.1:{wport}"]}]}]}))
    prom = f"http://127.0.0.1:{pport}"
    stream = _Stream(kafka_bootstrap, topics["in"])
    stream.start()
    worker_proc = K.start_worker(cfg, tmp_path / "worker.log")
    with open(tmp_path / "prometheus.log", "wb") as plog:
        prom_proc = subprocess.Popen(
            [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{pport}"], stdout=plog, stderr=subprocess.STDOUT)
    try:
        # clean: windows are judged (the PSI gauges appear) and no model alert is active
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                got = _query(prom, "scoring_monitor_feature_psi")["data"]["result"]
            except OSError:
                got = []
            if len(got) == M.N_FEATURES:
                break
            time.sleep(1)
        assert len(got) == M.N_FEATURES, (tmp_path / "worker.log").read_text()[-3000:]
        time.sleep(6)  # several windows and rule evaluations on the clean stream
        psi = {r["metric"]["feature"]: float(r["value"][1]) for r in
               _query(prom, "scoring_monitor_feature_psi")["data"]["result"]}
        assert max(psi.values()) < 0.1, psi
        assert not [a for a in _active(prom) if a["labels"]["alertname"] in MODEL_ALERTS]
        # the dashboard: every panel's query runs, none errs or comes back empty
        for panel in json.loads(DASHBOARD.read_text())["panels"]:
            for t in panel["targets"]:
                res = _query(prom, t["expr"])
                assert res["status"] == "success" and res["data"]["result"], \
                    (panel["title"], t["expr"], res)
        # feat_2 turns null: both alerts fire for feat_2, and only for it
        stream.null.set()
        t0 = time.monotonic()
        firing: dict[str, float] = {}
        while time.monotonic() - t0 < 60 and len(firing) < 2:
            for a in _active(prom):
                name = a["labels"]["alertname"]
                if a["state"] == "firing" and name in MODEL_ALERTS - {"ScoringScoreDrift"}:
                    assert a["labels"]["feature"] == "feat_2", a
                    firing.setdefault(name, time.monotonic() - t0)
            time.sleep(0.5)
        assert set(firing) == {"ScoringFeatureDrift", "ScoringMissingRateJump"}, (
            firing, _active(prom), (tmp_path / "worker.log").read_text()[-3000:])
        print("alerts fired after the feature turned null: "
              + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(firing.items())))
    finally:
        stream.done.set()
        prom_proc.terminate()
        prom_proc.wait(30)
        rc = K.stop_worker(worker_proc)
        stream.join(30)
    assert stream.error is None, stream.error
    assert rc == 0, (tmp_path / "worker.log").read_text()[-3000:]
    log = (tmp_path / "worker.log").read_text()
    assert "feature drift" in log and "missing rate jump" in log
    assert np.isfinite(psi["feat_2"])
