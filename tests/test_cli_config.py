"""Configuration, CLI exit codes, metrics and the file-to-file worker."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml

import worker
from tests import models as M
from worker.config import ConfigError, load_settings

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden"
# the two sections without defaults
MINIMAL = {"model": {"path": str(GOLDEN / "fraud-xgb.model")},
           "source": {"type": "file", "path": str(GOLDEN / "input.arrows")}}


def run_cli(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "worker.cli", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_example_configs_validate():
    prod = load_settings(REPO / "config" / "prod.yaml")
    assert prod.source.type == "kafka" and prod.delivery.mode == "exactly_once"
    assert prod.scoring.thresholds == [0.5, 0.9] and prod.metrics.host == "127.0.0.1"
    demo = load_settings(REPO / "config" / "demo.yaml")
    assert demo.source.type == "file" and demo.sink.type == "file"


def test_environment_overrides_yaml(monkeypatch):
    monkeypatch.setenv("SCORING_WORKER__KAFKA__BOOTSTRAP_SERVERS", "10.0.0.1:9093")
    monkeypatch.setenv("SCORING_WORKER__SCORING__THREADS", "1")
    monkeypatch.setenv("SCORING_WORKER__KAFKA__SASL_PASSWORD", "s3cret")
    s = load_settings(REPO / "config" / "prod.yaml")
    assert s.kafka.bootstrap_servers == "10.0.0.1:9093"
    assert s.kafka.group_id == "scoring-worker"  # the rest of the section stays from YAML
    assert s.scoring.threads == 1
    assert "s3cret" not in repr(s)  # a secret never prints
    assert s.consumer_config()["sasl.password"] == "s3cret"
    assert s.consumer_config()["isolation.level"] == "read_committed"
    assert "transactional.id" in s.producer_config(transactional=True)


@pytest.mark.parametrize("doc,field", [
    ({"scoring": {"threads": 0}}, "scoring.threads"),
    ({"scoring": {"thresholds": [0.9, 0.5]}}, "scoring.thresholds"),
    ({"delivery": {"mode": "maybe_once"}}, "delivery.mode"),
    ({"source": {"type": "kafka"}}, "source"),
    ({"metrics": {"port": 70000}}, "metrics.port"),
    ({"scoring": {"lazy": {"mode": "sometimes"}}}, "scoring.lazy.mode"),
    ({"unknown_section": {}}, "unknown_section"),
    # a hostile review: YAML's true was one thread, a quoted threshold a number
    ({"scoring": {"threads": True}}, "scoring.threads"),
    ({"scoring": {"thresholds": ["0.5"]}}, "scoring.thresholds"),
    ({"delivery": {"max_message_rows": False}}, "delivery.max_message_rows"),
])
def test_bad_config_exits_2_naming_the_field(tmp_path, doc, field):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_settings(path)
    proc = run_cli("--config", path)
    assert proc.returncode == 2
    assert field in proc.stderr and "Traceback" not in proc.stderr


def test_missing_config_and_model_exit_2(tmp_path):
    proc = run_cli("--config", tmp_path / "nope.yaml")
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"path": str(tmp_path / "none.model")},
                                   "source": {"type": "file", "path": str(GOLDEN /
                                                                          "input.arrows")}}))
    proc = run_cli("--config", cfg)
    assert proc.returncode == 2 and "model.path" in proc.stderr


def test_compile_cli_and_unsupported_model(tmp_path):
    import joblib
    from sklearn.ensemble import AdaBoostClassifier

    booster = M.xgboost_models()["xgb-binary-logistic"]
    booster.save_model(tmp_path / "m.json")
    proc = run_cli("compile", tmp_path / "m.json", "-o", tmp_path / "m.model")
    assert proc.returncode == 0, proc.stderr
    assert worker.load_model(tmp_path / "m.model").model_id in proc.stdout
    X, y, _, _ = M.training_data(nan=False)
    joblib.dump(AdaBoostClassifier(n_estimators=2).fit(X, y), tmp_path / "ada.joblib")
    proc = run_cli("compile", tmp_path / "ada.joblib", "-o", tmp_path / "ada.model")
    assert proc.returncode != 0 and "--trust-pickle" in proc.stderr  # nothing was unpickled
    proc = run_cli("compile", tmp_path / "ada.joblib", "-o", tmp_path / "ada.model",
                   "--trust-pickle")
    assert proc.returncode != 0 and "AdaBoostClassifier" in proc.stderr
    assert "runs code from the file" in proc.stderr
    assert not (tmp_path / "ada.model").exists()


def test_score_cli_matches_api(tmp_path):
    import pyarrow as pa

    from worker.io.tables import read_table, write_table

    model = worker.load_model(GOLDEN / "fraud-xgb.model")
    from worker import demo

    table = demo.generate(500, seed=3)
    write_table(tmp_path / "in.parquet", table)
    proc = run_cli("score", "--model", GOLDEN / "fraud-xgb.model", "--input",
                   tmp_path / "in.parquet", "--output", tmp_path / "out.arrow",
                   "--id-column", "txn_id", "--threshold", "0.5", "--threshold", "0.9")
    assert proc.returncode == 0, proc.stderr
    out = read_table(tmp_path / "out.arrow")
    ref = model.score_batch(table, thresholds=[0.5, 0.9])
    np.testing.assert_array_equal(out.column("score").to_numpy(), ref.score)
    assert out.column("id").to_pylist() == table.column("txn_id").to_pylist()
    assert out.schema.metadata[b"model_id"].decode() == model.model_id
    assert isinstance(out.column("stop_reason").type, pa.DictionaryType)


def test_file_worker_metrics_and_sigterm(tmp_path):
    """A slow file run serves /metrics and /healthz, and SIGTERM stops it with exit 0."""
    import signal

    from worker import demo
    from worker.io.records import write_records

    write_records(tmp_path / "in.arrows", demo.demo_messages(3000, 5, seed=4))
    from tests.kafka_util import free_port

    port = free_port()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({
        "source": {"type": "file", "path": str(tmp_path / "in.arrows")},
        "sink": {"type": "file", "path": str(tmp_path / "out.arrows")},
        "model": {"path": str(GOLDEN / "fraud-xgb.model")},
        "delivery": {"max_batch_messages": 1},
        "metrics": {"port": port},
        "logging": {"progress": False},
    }))
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "--config", str(cfg)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        body = health = None
        deadline = time.monotonic() + 60  # (start-up beside a loaded suite took over 10 s)
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            try:
                health = urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                              timeout=2).read().decode()
                # rows already scored (the counter is there, at 0, from the start; a
                # SIGTERM before the loop runs is a stop during start-up, exit 0 too)
                if any(line.startswith("scoring_records_in_total ")
                       and float(line.split()[1]) > 0 for line in body.splitlines()):
                    break
                time.sleep(0.05)
            except OSError:
                time.sleep(0.1)
        assert health is not None and health.status == 200
        assert "scoring_records_in_total" in body and "scoring_batch_seconds" in body
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    assert b"worker stopped" in err
    # it stopped mid-file, after a committed batch: every written message is whole
    from worker.io.records import read_records

    written = list(read_records(tmp_path / "out.arrows"))
    assert 0 < len(written) < 3000


def test_pipeline_dead_letters_what_it_cannot_decode_and_keeps_the_rest():
    """Duplicate columns, a wrong id column, a non-Arrow value: each message is dead-lettered
    with its reason, the good messages around them are scored."""
    import pyarrow as pa

    from tests.kafka_util import arrow_bytes, input_table
    from worker.config import load_settings
    from worker.io.records import Record
    from worker.pipeline import Pipeline

    model = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    pipe = Pipeline(model, load_settings(None, **MINIMAL), "scores")
    good = input_table(0, 4, seed=1)
    dup = pa.Table.from_arrays(list(good.columns) + [good.column("feat_2")],
                               names=good.column_names + ["feat_2"])
    values = [arrow_bytes(good), arrow_bytes(dup), b"\x00garbage",
              arrow_bytes(good.drop_columns(["txn_id"])), arrow_bytes(input_table(4, 3, seed=2))]
    recs = [Record("in", 0, i, b"k%d" % i, v) for i, v in enumerate(values)]
    outputs, dead, stats = pipe.process([(r, pipe.decode(r)) for r in recs])
    assert [o.key for o in outputs] == [b"k0", b"k4"]
    codes = {d.offset: dict(d.headers)["error_code"] for d in dead}
    assert codes == {1: b"duplicate_column", 2: b"not_arrow", 3: b"missing_column"}
    assert stats.rows == 7


@pytest.mark.parametrize("lazy,field", [
    ({"mode": "off", "tua": 0.9}, "scoring.lazy"),
    ({"mode": "certified", "tua": 0.9}, "scoring.lazy"),
])
def test_misspelled_lazy_parameters_exit_2(tmp_path, lazy, field):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({
        "source": {"type": "file", "path": str(GOLDEN / "input.arrows")},
        "sink": {"type": "file", "path": str(tmp_path / "o.arrows")},
        "model": {"path": str(GOLDEN / "fraud-xgb.model")},
        "scoring": {"lazy": lazy}}))
    proc = run_cli("--config", cfg)
    assert proc.returncode == 2 and field in proc.stderr, proc.stderr


@pytest.mark.parametrize("fmt,source,scoring,said", [
    ("json", {"fields": {"amount": "txn.x", "hour": "txn"}}, {},
     "source.fields: feature 'hour' reads 'txn', which holds feature 'amount''s 'txn.x' (a "
     "record is not a value)"),
    ("avro", {"fields": {"amount": "txn.x", "hour": "txn.x"}}, {},
     "source.fields: feature 'amount' and feature 'hour' both read 'txn.x': map one of them "
     "to another field in source.fields"),
    ("avro", {}, {"id_column": "amount"},
     "scoring.id_column: 'amount' is also a feature the model reads (both read its field): "
     "set scoring.id_column to the field that holds the id"),
])
def test_event_fields_that_clash_exit_2_naming_them(tmp_path, fmt, source, scoring, said):
    """Two of the model's features (or a feature and the id) read from one field of a JSON or
    Avro event, or one from a field holding another's: a configuration error at start-up, one
    line, no traceback. Avro took the last of two and left the first missing on every row."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({
        "source": {"type": "file", "path": str(GOLDEN / "input.arrows"), "format": fmt,
                   **({"schemas_dir": str(tmp_path)} if fmt == "avro" else {}), **source},
        "sink": {"type": "file", "path": str(tmp_path / "o.arrows")},
        "model": {"path": str(GOLDEN / "fraud-xgb.model")}, "scoring": scoring}))
    proc = run_cli("--config", cfg)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"config error: {said}", proc.stderr


def test_a_key_given_twice_in_the_yaml_exits_2(tmp_path):
    """A hostile review: a second ``scoring:`` section silently replaced the first (PyYAML
    keeps the last), and its decision bands with it."""
    path = tmp_path / "dup.yaml"
    path.write_text(f"model: {{path: {MINIMAL['model']['path']}}}\n"
                    f"source: {{type: file, path: {MINIMAL['source']['path']}}}\n"
                    "scoring: {thresholds: [0.9, 0.95]}\n"
                    "logging: {level: info}\n"
                    "scoring: {threads: 1}\n")
    with pytest.raises(ConfigError, match="the key 'scoring' is given twice.*line 5"):
        load_settings(path)
    proc = run_cli("--config", path)
    assert proc.returncode == 2 and "'scoring' is given twice" in proc.stderr
    nested = tmp_path / "nested.yaml"
    nested.write_text(yaml.safe_dump(MINIMAL) + "delivery:\n  mode: exactly_once\n"
                      "  mode: at_least_once\n")
    with pytest.raises(ConfigError, match="the key 'mode' is given twice"):
        load_settings(nested)
    merged = tmp_path / "merged.yaml"  # a merge key is not a repeat
    merged.write_text(f"model: {{path: {MINIMAL['model']['path']}}}\n"
                      "source: &s {type: file, path: a.arrows}\n"
                      "sink:\n  <<: *s\n  path: b.arrows\n")
    assert load_settings(merged).sink.path == "b.arrows"
    for text, said in (("scoring: {<<: {thresholds: [0.1], thresholds: [0.9]}}\n",
                        "the key 'thresholds' is given twice"),
                       ("a: &a {threads: 1}\nscoring: {<<: *a, <<: {threads: 2}}\n",
                        "'<<' is given twice")):
        inline = tmp_path / "inline.yaml"  # (a review: inline merges slipped past)
        inline.write_text(yaml.safe_dump(MINIMAL) + text)
        with pytest.raises(ConfigError, match=said):
            load_settings(inline)


@pytest.mark.parametrize("scoring, field", [
    ({"thresholds": [50, 90]}, "scoring.thresholds"),
    ({"thresholds": [-1]}, "scoring.thresholds"),
    ({"thresholds": [0.5, 1.5]}, "scoring.thresholds"),
    ({"thresholds": [0.5], "explain": {"min_score": 5}}, "scoring.explain.min_score"),
])
def test_thresholds_outside_a_probability_exit_2(tmp_path, scoring, field):
    """A hostile review: thresholds [50, 90] (percentages) for a classifier started, and
    every row was allowed (a probability never reaches 50)."""
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({**MINIMAL, "scoring": scoring}))
    proc = run_cli("--config", path)
    assert proc.returncode == 2, proc.stderr
    assert field in proc.stderr and ("outside 0 to 1" in proc.stderr or
                                     "above 1" in proc.stderr)
    assert "Traceback" not in proc.stderr
    proc = run_cli("check", "--config", path)
    assert proc.returncode == 2 and field in proc.stderr
    proc = run_cli("serve", "--config", path, "--port", "0")
    assert proc.returncode == 2 and f"config error: {field}: " in proc.stderr, proc.stderr


def test_score_batch_refuses_thresholds_outside_a_probability():
    X = np.zeros((3, M.N_FEATURES), np.float32)
    clf = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    assert clf.scores_probabilities
    with pytest.raises(ValueError, match="thresholds: 50 is outside 0 to 1"):
        clf.score_batch(X, thresholds=(50, 90))
    assert clf.score_batch(X, thresholds=(0.0, 1.0)).decision.tolist() == [1, 1, 1]
    # margins and regression values take any threshold
    import xgboost as xgb

    Xt, y, _, yr = M.training_data(nan=False)
    raw = worker.compile_model(xgb.train({"objective": "binary:logitraw", "max_depth": 2},
                                         xgb.DMatrix(Xt, label=y), 3))
    reg = worker.compile_model(xgb.train({"objective": "reg:squarederror", "max_depth": 2},
                                         xgb.DMatrix(Xt, label=yr), 3))
    for m in (raw, reg):
        assert not m.scores_probabilities
        assert len(m.score_batch(X, thresholds=(-5, 50))) == 3
    # a regression through a sigmoid scores probabilities too (a review: reg:logistic and
    # LightGBM's cross_entropy took [50, 90]); no thresholds at all: every row band 0
    import lightgbm as lgb

    y01 = (yr > np.median(yr)).astype(float)
    for m in (worker.compile_model(xgb.train({"objective": "reg:logistic", "max_depth": 2},
                                             xgb.DMatrix(Xt, label=y01), 3)),
              worker.compile_model(lgb.train({"objective": "cross_entropy", "verbose": -1},
                                             lgb.Dataset(Xt, label=y01), 3))):
        assert m.task == "regression" and m.scores_probabilities
        with pytest.raises(ValueError, match="outside 0 to 1"):
            m.score_batch(X, thresholds=(50, 90))
    assert clf.score_batch(X, thresholds=()).decision.tolist() == [0, 0, 0]


def test_more_thresholds_than_a_decision_holds_are_refused(tmp_path):
    """A hostile review: 200 thresholds were taken, and a decision (an 8-bit band index)
    wrapped to -56 for a score of 0.9955. At most 127: exit 2 naming the field (worker,
    check, serve); score_batch raises; 127 give the top band 127."""
    many = [round(i / 200, 4) for i in range(1, 129)]
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({**MINIMAL, "scoring": {"thresholds": many}}))
    for args in ((), ("check",), ("serve", "--port", "0")):
        proc = run_cli(*args, "--config", path)
        assert proc.returncode == 2 and "scoring.thresholds" in proc.stderr and \
            "at most 127" in proc.stderr, proc.stderr
    clf = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    X = np.zeros((2, M.N_FEATURES), np.float32)
    with pytest.raises(ValueError, match="128 thresholds, more than 127"):
        clf.score_batch(X, thresholds=many)
    top = [i / 1e6 for i in range(1, 128)]  # every threshold below any score here
    assert clf.score_batch(X, thresholds=top).decision.tolist() == [127, 127]
    assert load_settings(None, defaults={**MINIMAL, "scoring": {"thresholds": top}}) \
        .scoring.thresholds == top


def test_an_arrow_id_column_naming_a_feature_or_nothing_exits_2(tmp_path):
    """JSON refused an id column that is also a feature; Arrow took it (every output's id a
    feature's value), and an empty id_column was read as none (a hostile review)."""
    feature = worker.load_model(MINIMAL["model"]["path"]).feature_names[0]
    for scoring, said in (({"id_column": feature}, "is also a feature"),
                          ({"id_column": ""}, "scoring.id_column")):
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump({**MINIMAL, "scoring": scoring}))
        proc = run_cli("--config", path)
        assert proc.returncode == 2, proc.stderr
        assert said in proc.stderr and "Traceback" not in proc.stderr
