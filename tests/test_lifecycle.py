"""Model hot swap: the watcher verifies a new artifact off the loop and refuses what cannot
replace the running model; on the real broker, ten swaps under a steady stream (and one
corrupt file) deliver every id exactly once, each message scored by the model it names."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import worker
from tests import kafka_util as K
from tests import models as M
from worker.config import load_settings
from worker.lifecycle import ModelWatcher
from worker.metrics import Metrics


@pytest.fixture(scope="module")
def models():
    xgb = M.xgboost_models()
    return {"a": worker.compile_model(xgb["xgb-binary-logistic"]),
            "b": worker.compile_model(xgb["xgb-parallel-tree"]),
            "wide": worker.compile_model(xgb["xgb-reg-squarederror"])}


def _settings(path, **model):
    return load_settings(None, model={"path": str(path), "reload": True,
                                      "reload_interval_ms": 50, **model},
                         source={"type": "kafka", "topic": "in"},
                         sink={"type": "kafka", "topic": "out"})


def _wait(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_the_watcher_swaps_in_a_verified_artifact_and_refuses_the_rest(tmp_path, models):
    path = tmp_path / "fraud.model"
    models["a"].save(path)
    running = worker.load_model(path)
    metrics = Metrics()
    w = ModelWatcher(str(path), running, _settings(path), metrics).start()
    try:
        # a truncated artifact (as a copy in progress leaves it): refused, not loaded
        data = models["b"].to_bytes()
        path.write_bytes(data[: len(data) // 2])
        _wait(lambda: metrics.model_refusals.labels("live", "unreadable")._value.get() == 1)
        assert w._ready is None
        # not an artifact at all
        path.write_bytes(b"\x00not a model" * 100)
        _wait(lambda: metrics.model_refusals.labels("live", "unreadable")._value.get() == 2)
        # a good one, written atomically by save(): verified and handed over once
        models["b"].save(path)
        _wait(lambda: w._ready is not None)
        got = w.take()
        assert got.model_id == models["b"].model_id and w.take() is None
        assert w.running_id == models["b"].model_id
        # the same artifact rewritten: nothing to swap
        models["b"].save(path)
        time.sleep(0.4)
        assert w._ready is None
    finally:
        w.stop()


def test_a_new_kernel_choice_for_the_same_model_is_swapped_in(tmp_path, models):
    """The kernel choice is outside the model id: the same model compiled again with another
    kernel keeps its id, and the watcher still hands it over (same scores, other speed)."""
    src = M.xgboost_models()["xgb-binary-logistic"]
    walk = worker.compile_model(src, layout="compact", kernel="walk")
    qs = worker.compile_model(src, layout="compact", kernel="quickscorer")
    assert walk.model_id == qs.model_id
    path = tmp_path / "fraud.model"
    walk.save(path)
    w = ModelWatcher(str(path), worker.load_model(path), _settings(path), Metrics()).start()
    try:
        qs.save(path)
        _wait(lambda: w._ready is not None)
        got = w.take()
        assert got.kernel == "quickscorer" and got.model_id == walk.model_id
    finally:
        w.stop()


def test_a_model_reading_other_features_is_refused_unless_allowed(tmp_path, models):
    path = tmp_path / "fraud.model"
    models["a"].save(path)
    running = worker.load_model(path)
    renamed = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    renamed.feature_names = [f"other_{i}" for i in range(renamed.n_features)]
    renamed.meta["feature_names"] = renamed.feature_names
    for allow, expect_ready in ((False, False), (True, True)):
        models["a"].save(path)
        metrics = Metrics()
        w = ModelWatcher(str(path), running, _settings(path, allow_feature_change=allow),
                         metrics).start()
        try:
            time.sleep(0.2)
            renamed.save(path)
            if expect_ready:
                _wait(lambda w=w: w._ready is not None)
                assert w.take().feature_names[0] == "other_0"
            else:
                _wait(lambda m=metrics: m.model_refusals.labels(
                    "live", "feature_change")._value.get() == 1)
                assert w._ready is None
        finally:
            w.stop()



@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_a_model_with_a_feature_read_from_the_ids_field_is_refused_not_swapped_in(
        tmp_path, fmt):
    """A new artifact (features may change) whose feature is named like the id column: its
    events' fields clash, so it is refused with the reason, where building its pipeline in
    the loop raised and stopped the worker."""
    from worker.lifecycle import ModelRefused, verify

    running = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    candidate = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    candidate.feature_names = ["txn_id"] + [f"f{i}" for i in range(1, candidate.n_features)]
    candidate.meta["feature_names"] = candidate.feature_names
    settings = load_settings(None, model={"path": str(tmp_path / "m.model"),
                                          "allow_feature_change": True},
                             source={"type": "kafka", "topic": "in", "format": fmt,
                                     **({"schemas_dir": str(tmp_path)} if fmt == "avro"
                                        else {})},
                             sink={"type": "kafka", "topic": "out"})
    verify(running, running, settings)  # the running model reads apart from the id
    with pytest.raises(ModelRefused) as e:
        verify(candidate, running, settings)
    assert e.value.reason == "fields"
    assert "scoring.id_column: 'txn_id' is also a feature the model reads" in str(e.value)
    # a shadow scores the live model's columns, and serve reads no events: not theirs to check
    verify(candidate, running, settings, events=False)


def test_a_swap_to_a_model_reading_fewer_features_keeps_its_mapped_fields(tmp_path):
    """source.fields maps a feature the new model no longer reads: the swap is a swap (the
    mapping is left out for it), and its pipeline reads the rest; start-up still refuses a
    name no feature has (a typo). An attacker review: the swap was refused, and before the
    check it raised in the loop."""
    from worker.lifecycle import verify
    from worker.pipeline import Pipeline, reader_for

    running = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    fewer = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    last = running.feature_names[-1]
    fewer.feature_names = running.feature_names[:-1] + ["other"]
    fewer.meta["feature_names"] = fewer.feature_names
    settings = load_settings(None, model={"path": str(tmp_path / "m.model"),
                                          "allow_feature_change": True},
                             source={"type": "kafka", "topic": "in", "format": "json",
                                     "fields": {last: "ctx.last"}},
                             sink={"type": "kafka", "topic": "out"})
    verify(fewer, running, settings)
    pipe = Pipeline(fewer, settings, "out")
    event = {"txn_id": 1, "ctx": {"last": 2}, **dict.fromkeys(fewer.feature_names[:-1]),
             "other": 3}
    X = pipe.format.decode(json.dumps(event).encode()).data.X
    assert X[0, -1] == 3 and np.isnan(X[0, 0])
    with pytest.raises(ValueError, match="names no feature"):
        reader_for(fewer, settings)  # start-up's check: strict

@pytest.mark.kafka
def test_ten_swaps_under_a_stream_every_id_once_scored_by_the_model_it_names(
        tmp_path, kafka_bootstrap, topic_factory, models):
    topics = {"in": topic_factory(partitions=2, prefix="in"),
              "out": topic_factory(partitions=2, prefix="scores"),
              "dlq": topic_factory(partitions=1, prefix="dlq"),
              "shadow": topic_factory(partitions=2, prefix="shadow")}
    path = tmp_path / "fraud.model"
    models["a"].save(path)
    models["wide"].save(tmp_path / "challenger.model")  # a regression model as the shadow
    cfg = K.write_config(tmp_path / "w.yaml", kafka_bootstrap, path, topics["in"],
                         topics["out"], topics["dlq"], group=f"g-{topics['in']}")
    import yaml

    c = yaml.safe_load(cfg.read_text())
    c["model"].update(reload=True, reload_interval_ms=100,
                      shadow_path=str(tmp_path / "challenger.model"))
    c["sink"]["shadow_topic"] = topics["shadow"]
    cfg.write_text(yaml.safe_dump(c))
    log = tmp_path / "w.log"
    proc = K.start_worker(cfg, log)
    producer = K.SteadyProducer(kafka_bootstrap, topics["in"], rows=5, rate=100)
    producer.start()
    try:
        # the saves start once the loop runs: on a loaded machine a fixed 3 s lost that race
        # (start-up and the group's join took longer, two saves came before the watcher's
        # first look and were one change to it: 8 swaps)
        deadline = time.monotonic() + 120
        while "partitions assigned" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(1.0)
        for k in range(10):
            (models["b"] if k % 2 == 0 else models["a"]).save(path)
            time.sleep(1.0)
            if k == 4:  # a corrupt file in between: refused, the running model stays
                Path(path).write_bytes(b"garbage" * 1000)
                time.sleep(1.0)
        time.sleep(1.0)
        producer.done.set()
        producer.join(60)
        n = producer.sent
        out = K.wait_for_ids(kafka_bootstrap, topics["out"], n * 5, timeout=120)
    finally:
        producer.done.set()
        rc = K.stop_worker(proc)
    text = log.read_text()
    assert rc == 0, text[-3000:]
    ids = K.output_ids(out)
    assert np.array_equal(np.sort(ids), np.arange(n * 5)), "lost or duplicated"
    assert text.count("model swapped") == 10, text[-3000:]
    assert text.count("model refused") == 1
    # every message was scored, whole, by the model its header names
    by_id = {m.model_id: m for m in models.values()}
    used = set()
    for m in out:
        mid = dict(m.headers())["model_id"].decode()
        t = pa.ipc.open_stream(m.value()).read_all()
        assert t.schema.metadata[b"model_id"].decode() == mid
        first = t.column("id")[0].as_py()
        msg = first // 5
        rows = K.input_table(msg * 5, 5, msg)
        want = by_id[mid].score_batch(rows.drop_columns(["txn_id"]),
                                      thresholds=[0.5, 0.9]).score
        np.testing.assert_array_equal(t.column("score").to_numpy(), want)
        used.add(mid)
    assert used == {models["a"].model_id, models["b"].model_id}
    # the shadow topic: every id once, in the same transactions, with the challenger's scores
    shadow = K.read_topic(kafka_bootstrap, topics["shadow"], expect_messages=n, timeout=60)
    sids = K.output_ids(shadow)
    assert np.array_equal(np.sort(sids), np.arange(n * 5))
    for m in shadow[:50]:
        assert dict(m.headers())["model_id"].decode() == models["wide"].model_id
        t = pa.ipc.open_stream(m.value()).read_all()
        msg = t.column("id")[0].as_py() // 5
        want = models["wide"].score_batch(K.input_table(msg * 5, 5, msg).drop_columns(
            ["txn_id"])).score
        np.testing.assert_array_equal(t.column("score").to_numpy(), want)
    # the loop's pause: the swap at the boundary, and the gap between committed outputs
    # around each swap (outputs carry their produce time) against the gaps elsewhere
    from datetime import datetime

    swaps = [(datetime.fromisoformat(line.split()[0].rstrip("Z")).timestamp(),
              float(line.split("swap_ms=")[1].split()[0]))
             for line in text.splitlines() if "model swapped" in line]
    stamps = np.sort(np.array([m.timestamp()[1] / 1000 for m in out]))
    gaps = np.diff(stamps)
    near = np.zeros(len(gaps), dtype=bool)
    for t, _ms in swaps:
        near |= (stamps[1:] >= t - 0.05) & (stamps[:-1] <= t + 0.5)
    print(f"swap at the boundary: max {max(ms for _t, ms in swaps):.3f} ms; longest gap "
          f"between committed outputs around a swap {gaps[near].max() * 1000:.1f} ms, "
          f"elsewhere {gaps[~near].max() * 1000:.1f} ms (p99 "
          f"{np.percentile(gaps[~near], 99) * 1000:.1f} ms)")
    assert max(ms for _t, ms in swaps) < 50  # the swap itself: no load, no warm-up on the loop


def _recording(path, n_messages=40, rows=25):
    from worker.io.records import Record, write_records

    write_records(path, [Record("in", i % 2, i // 2, None,
                                K.arrow_bytes(K.input_table(i * rows, rows, i)), 1)
                         for i in range(n_messages)])
    return pa.concat_tables([K.input_table(i * rows, rows, i) for i in range(n_messages)])


def _scores(path):
    from worker.io.records import read_outputs

    tables = [t for _r, t in read_outputs(path)]
    t = pa.concat_tables([x.replace_schema_metadata(None) for x in tables])
    order = np.argsort(t.column("id").to_numpy())
    return t.column("id").to_numpy()[order], t.column("score").to_numpy()[order], tables


def _shadow_run(tmp_path, models, shadow, break_shadow=False):
    from worker.io.files import FileSink, FileSource
    from worker.loop import Worker

    rec = tmp_path / "in.arrows"
    rows = _recording(rec)
    settings = load_settings(None, model={"path": "unused"},
                             source={"type": "file", "path": str(rec)},
                             sink={"type": "file", "path": str(tmp_path / "o.arrows")},
                             scoring={"id_column": "txn_id", "thresholds": [0.5, 0.9],
                                      "threads": 1},
                             logging={"progress": False})
    sink = FileSink(tmp_path / "o.arrows", tmp_path / "o-dlq.arrows",
                    shadow_path=tmp_path / "o-shadow.arrows")
    w = Worker(settings, models["a"], FileSource(rec), sink)
    if shadow:
        w.pipeline.set_shadow(models["b"], "shadow")
        if break_shadow:
            def boom(*a, **k):
                raise RuntimeError("the challenger broke")
            w.pipeline.shadow.model = type("Broken", (), {"score_batch": boom})()
    assert w.run() == 0
    sink.close()
    return w, rows.drop_columns(["txn_id"])


def test_shadow_scores_every_row_beside_the_live_model(tmp_path, models):
    w, X = _shadow_run(tmp_path, models, shadow=True)
    live = models["a"].score_batch(X, thresholds=[0.5, 0.9])
    chal = models["b"].score_batch(X, thresholds=[0.5, 0.9])
    ids, score, _ = _scores(tmp_path / "o.arrows")
    sids, sscore, stables = _scores(tmp_path / "o-shadow.arrows")
    assert np.array_equal(ids, np.arange(len(X))) and np.array_equal(sids, ids)
    np.testing.assert_array_equal(score, live.score)  # live untouched
    np.testing.assert_array_equal(sscore, chal.score)  # the challenger's own scores
    assert {t.schema.metadata[b"model_id"].decode() for t in stables} == \
        {models["b"].model_id}
    # agreement: one count per (live band, shadow band) pair, as offline
    m = w.metrics
    for a in range(3):
        for b in range(3):
            want = int(((live.decision == a) & (chal.decision == b)).sum())
            got = m.shadow_agreement.labels(str(a), str(b))._value.get()
            assert got == want, (a, b)
    assert m.shadow_errors._value.get() == 0


def test_a_failing_shadow_never_touches_the_live_output(tmp_path, models):
    w, X = _shadow_run(tmp_path, models, shadow=True, break_shadow=True)
    ids, score, _ = _scores(tmp_path / "o.arrows")
    np.testing.assert_array_equal(score, models["a"].score_batch(X).score)
    assert np.array_equal(ids, np.arange(len(X)))
    assert not (tmp_path / "o-shadow.arrows").exists()
    assert w.metrics.shadow_errors._value.get() > 0


def test_replay_shadow_prints_the_agreement_table(tmp_path, models):
    import subprocess
    import sys

    rec = tmp_path / "in.arrows"
    X = _recording(rec).drop_columns(["txn_id"])
    models["a"].save(tmp_path / "a.model")
    models["b"].save(tmp_path / "b.model")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("scoring: {id_column: txn_id, thresholds: [0.5, 0.9], threads: 1}\n"
                   "logging: {progress: false}\n")
    r = subprocess.run([sys.executable, "-m", "worker.cli", "replay", str(rec), "--config",
                        str(cfg), "--model", str(tmp_path / "a.model"), "--shadow",
                        str(tmp_path / "b.model"), "--output", str(tmp_path / "o.arrows")],
                       capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr[-2000:]
    live = models["a"].score_batch(X, thresholds=[0.5, 0.9]).decision
    chal = models["b"].score_batch(X, thresholds=[0.5, 0.9]).decision
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("band ")]
    got = np.array([[int(v.replace(",", "")) for v in row[2:]] for row in rows])
    want = np.array([[((live == a) & (chal == b)).sum() for b in range(3)] for a in range(3)])
    np.testing.assert_array_equal(got, want)
    assert f"agreement {np.trace(want) / len(X):.4%}" in r.stdout


def test_readyz_is_503_until_the_loop_is_ready():
    import socket
    import urllib.error
    import urllib.request

    m = Metrics()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = m.serve("127.0.0.1", port)
    try:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert e.value.code == 503
        m.ready = True
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            assert r.status == 200
    finally:
        server.shutdown()


@pytest.mark.kafka
def test_a_sigkill_during_a_swap_loses_nothing(tmp_path, kafka_bootstrap, topic_factory, models):
    import yaml

    topics = {"in": topic_factory(partitions=2, prefix="in"),
              "out": topic_factory(partitions=2, prefix="scores"),
              "dlq": topic_factory(partitions=1, prefix="dlq")}
    path = tmp_path / "fraud.model"
    models["a"].save(path)
    cfg = K.write_config(tmp_path / "w.yaml", kafka_bootstrap, path, topics["in"],
                         topics["out"], topics["dlq"], group=f"g-{topics['in']}")
    c = yaml.safe_load(cfg.read_text())
    c["model"].update(reload=True, reload_interval_ms=50)
    # a stable id (as the StatefulSet's pod name): the restart fences the killed transaction
    c["kafka"]["transactional_id"] = f"swap-{topics['in']}"
    cfg.write_text(yaml.safe_dump(c))
    producer = K.SteadyProducer(kafka_bootstrap, topics["in"], rows=5, rate=200)
    producer.start()
    proc = K.start_worker(cfg, tmp_path / "w1.log")
    try:
        time.sleep(3)
        models["b"].save(path)
        time.sleep(0.12)  # the watcher has seen the change, loading or just swapped
        proc.kill()
        proc.wait(30)
        proc = K.start_worker(cfg, tmp_path / "w2.log")
        time.sleep(3)
        producer.done.set()
        producer.join(60)
        out = K.wait_for_ids(kafka_bootstrap, topics["out"], producer.sent * 5, timeout=120)
    finally:
        producer.done.set()
        assert K.stop_worker(proc) == 0
    ids = K.output_ids(out)
    assert np.array_equal(np.sort(ids), np.arange(producer.sent * 5)), "lost or duplicated"
    # after the restart every message is scored by the artifact now at the path
    last = {dict(m.headers())["model_id"].decode() for m in out[-20:]}
    assert last == {models["b"].model_id}


def test_a_swap_to_probabilities_under_thresholds_outside_them_is_refused(tmp_path, models):
    """Thresholds [50, 90] band a regression model's values; a classifier swapped in would
    allow every row (a probability never reaches 50): refused, the running model stays."""
    from worker.lifecycle import ModelRefused, verify

    settings = load_settings(None, model={"path": str(tmp_path / "m.model")},
                             source={"type": "kafka", "topic": "in"},
                             sink={"type": "kafka", "topic": "out"},
                             scoring={"thresholds": [50, 90]})
    reg, clf = models["wide"], models["a"]
    verify(reg, reg, settings, events=False)  # regression values: any threshold
    with pytest.raises(ModelRefused, match="thresholds: 50 is outside 0 to 1") as e:
        verify(clf, reg, settings, events=False)
    assert e.value.reason == "thresholds"
    # explain.min_score above every probability: no row would be explained (a review found
    # the swap took it, where start-up refused it)
    explained = load_settings(None, model={"path": str(tmp_path / "m.model")},
                              source={"type": "kafka", "topic": "in"},
                              sink={"type": "kafka", "topic": "out"},
                              scoring={"explain": {"min_score": 50}})
    verify(reg, reg, explained, events=False)
    with pytest.raises(ModelRefused, match="min_score: 50 is above 1"):
        verify(clf, reg, explained, events=False)
