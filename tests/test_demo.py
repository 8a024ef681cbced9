"""The demo data: generator, recorded topic, demo models and the run summary."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from worker import codec, demo, load_model
from worker.io.records import Record, read_records, write_records
from worker.report import band_labels, summarize


def _positive_rate(table: pa.Table) -> float:
    return pc.mean(pc.cast(table.column(demo.LABEL), pa.float64())).as_py()


# ---- generator ------------------------------------------------------------------------------

def test_generate_is_deterministic_per_seed():
    a, b, c = demo.generate(5000, 7), demo.generate(5000, 7), demo.generate(5000, 8)
    assert a.equals(b)
    assert not a.equals(c)
    assert a.column("txn_id").to_pylist() == list(range(1, 5001))


def test_generate_schema_nulls_and_positive_rate():
    t = demo.generate(100_000, 11)
    assert t.schema.equals(demo.SCHEMA)
    kinds = {str(f.type) for f in t.schema if f.name in demo.FEATURES}
    assert {"double", "float", "int8", "int16", "int32", "uint8", "bool"} <= kinds
    assert 0.005 <= _positive_rate(t) <= 0.02
    assert 0.015 <= t.column("device_age_days").null_count / t.num_rows <= 0.05
    ip_null = t.column("ip_risk_score").is_null()
    assert pc.all(pc.or_(pc.invert(ip_null), t.column("card_present"))).as_py()
    for name in demo.FEATURES:
        if name not in ("device_age_days", "ip_risk_score"):
            assert t.column(name).null_count == 0, name
    assert pc.min(t.column("amount")).as_py() > 0
    assert pc.min_max(t.column("hour")).as_py() == {"min": 0, "max": 23}
    assert pc.all(pc.greater_equal(t.column("velocity_24h"), t.column("velocity_1h"))).as_py()
    X = demo.feature_matrix(t)
    assert X.dtype == np.float32 and X.shape == (t.num_rows, len(demo.FEATURES))
    assert np.isnan(X[:, demo.FEATURES.index("device_age_days")]).sum() == \
        t.column("device_age_days").null_count


# ---- recorded topic -------------------------------------------------------------------------

def test_demo_topic_decodes(tmp_path):
    path = tmp_path / "topic.arrows"
    n, rows = 60, 20
    assert demo.write_demo_topic(path, n, rows, seed=5) == n
    recs = list(read_records(path))
    assert len(recs) == n
    bad = demo.malformed_positions(n)
    assert sorted(bad.values()) == ["empty_batch", "missing_column", "not_arrow"]
    assert sorted(i % demo.N_PARTITIONS for i in bad) == [0, 1, 2]
    assert [r.partition for r in recs] == [i % demo.N_PARTITIONS for i in range(n)]
    for p in range(demo.N_PARTITIONS):
        assert [r.offset for r in recs if r.partition == p] == list(range(n // demo.N_PARTITIONS))
    ts = [r.timestamp_ms for r in recs]
    assert all(b > a for a, b in zip(ts, ts[1:], strict=False))
    ids = []
    for i, r in enumerate(recs):
        assert r.topic == "transactions" and r.key.startswith(b"card-")
        if i in bad:
            with pytest.raises(codec.InvalidMessage) as err:
                codec.decode(r.value, demo.FEATURES, demo.ID_COLUMN)
            assert err.value.code == bad[i]
            continue
        assert dict(r.headers)["content-type"] == codec.CONTENT_TYPE.encode()
        table = codec.decode(r.value, demo.FEATURES, demo.ID_COLUMN)
        assert table.schema.names == demo.MESSAGE_SCHEMA.names  # features + id, no label
        assert table.num_rows == rows
        ids += table.column(demo.ID_COLUMN).to_pylist()
    assert ids == sorted(ids) and len(set(ids)) == len(ids) == (n - len(bad)) * rows


# ---- demo models ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo-models")
    table = demo.generate(20_000, 101)
    return demo.train_models(table, out, xgb_rounds=40, rf_trees=15, holdout=0.0), out


def test_models_are_saved_and_exact(trained):
    result, out = trained
    for key in ("xgb_source", "xgb_model", "rf_model"):
        assert result[key].exists() and result[key].is_relative_to(out)
    held_out = demo.generate(20_000, 202)
    X = demo.feature_matrix(held_out)
    assert np.isnan(X).any()
    xgb_model, rf_model = load_model(result["xgb_model"]), load_model(result["rf_model"])
    assert xgb_model.feature_names == rf_model.feature_names == demo.FEATURES
    assert (xgb_model.work_total, rf_model.work_total) == (40, 15)

    import xgboost as xgb

    ref = result["booster"].predict(xgb.DMatrix(X, feature_names=demo.FEATURES))
    np.testing.assert_allclose(xgb_model.predict_proba(held_out)[:, 1], ref, rtol=0, atol=1e-5)
    np.testing.assert_allclose(xgb_model.predict_proba(X)[:, 1], ref, rtol=0, atol=1e-5)
    named = pa.table({f: X[:, j] for j, f in enumerate(demo.FEATURES)})
    ref_rf = result["sklearn_rf"].predict_proba(named)
    np.testing.assert_allclose(rf_model.predict_proba(held_out), ref_rf, rtol=0, atol=1e-5)


def test_xgboost_demo_model_separates_fraud(trained):
    from sklearn.metrics import roc_auc_score

    result, _ = trained
    held_out = demo.generate(20_000, 303)
    y = held_out.column(demo.LABEL).to_numpy(zero_copy_only=False)
    assert y.sum() > 100
    assert roc_auc_score(y, result["xgb"].predict_proba(held_out)[:, 1]) > 0.9


def test_prepare_is_idempotent(tmp_path):
    kw = {"train_rows": 10_000, "n_messages": 12, "rows_per_message": 5}
    first = demo.prepare(tmp_path, **kw)
    assert first is not None and first["messages"] == 12
    assert all(p.exists() for p in demo.outputs(tmp_path))
    assert len(list(read_records(tmp_path / demo.DEMO_TOPIC))) == 12
    assert demo.prepare(tmp_path, **kw) is None


# ---- summary --------------------------------------------------------------------------------

def _output_value(ids, scores, decisions, work, reasons, work_total=150) -> bytes:
    codes = pa.array([codec.STOP_REASONS.tolist().index(r) for r in reasons], type=pa.int8())
    batch = pa.RecordBatch.from_pydict({
        "id": pa.array(ids, pa.int64()), "score": pa.array(scores, pa.float64()),
        "label": pa.array([int(s >= 0.5) for s in scores], pa.int32()),
        "decision": pa.array(decisions, pa.int8()), "work_units": pa.array(work, pa.int32()),
        "stop_reason": pa.DictionaryArray.from_arrays(codes, pa.array(codec.STOP_REASONS.tolist())),
        "score_lo": pa.array(scores, pa.float64()), "score_hi": pa.array(scores, pa.float64()),
    })
    return codec.encode(batch, {b"work_total": str(work_total).encode()})


def test_summarize_counts_and_png(tmp_path):
    out = tmp_path / "out.arrows"
    values = [
        _output_value([1, 2, 3], [0.01, 0.6, 0.95], [0, 1, 2], [150, 150, 150],
                      ["full", "full", "full"]),
        _output_value([4, 5], [0.001, 0.002], [0, 0], [10, 20], ["certificate", "certificate"]),
        _output_value([6], [0.7], [1], [30], ["flip"]),
    ]
    recs = [Record("scores", i % 2, i // 2, b"k", v) for i, v in enumerate(values)]
    recs.append(Record("scores", 0, 9, b"k", b"not arrow"))
    write_records(out, recs)
    png = tmp_path / "plots" / "summary.png"
    s = summarize(out, None, 2.0, png, [0.5, 0.9], dead_letters=3)
    assert (s.records, s.messages, s.undecodable, s.dead_letters) == (6, 4, 1, 3)
    assert s.work_total == 150  # from the output metadata
    assert s.records_per_s == pytest.approx(3.0)
    assert s.mean_work_units == pytest.approx((450 + 30 + 30) / 6)
    assert s.work_fraction == pytest.approx(510 / 6 / 150)
    assert s.stop_reasons == {"full": 3, "certificate": 2, "flip": 1}
    assert s.decisions == dict(zip(band_labels([0.5, 0.9]), [3, 2, 1], strict=True))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert summarize(out, 200, None, None, [0.5]).work_total == 200
    from rich.console import Console

    console = Console(record=True, width=100)
    console.print(s)  # renders as s.table()
    text = console.export_text()
    assert "dead-lettered" in text and "decision 2: >= 0.9" in text
