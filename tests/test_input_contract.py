"""The input contract (issue 48): every feature accounted for by name, and a bad field never
scored as "missing". Each case of the issue's "Why" is here: a typo in a field path, a category
sent as a number, an absent object, an Avro producer's schema change, with the declared casts
checked against the library on the values they produce, and the per-feature counts."""

from __future__ import annotations

import io
import json
import struct

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import worker
from worker.config import load_settings
from worker.formats import InvalidMessage, input_format
from worker.io.records import Record
from worker.pipeline import Pipeline

pd = pytest.importorskip("pandas")
lgb = pytest.importorskip("lightgbm")
fastavro = pytest.importorskip("fastavro")

MCC = ["5411", "5812", "5999", "7995", "4829"]
COUNTRY = ["US", "GB", "DE", "NG", "IN"]
FEATURES = ["amount", "hour", "country", "mcc"]


def _frame(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "amount": (rng.lognormal(3.5, 1.4, n)).astype(np.float32),
        "hour": rng.integers(0, 24, n).astype(np.float32),
        "country": pd.Categorical(rng.choice(COUNTRY, n), categories=COUNTRY),
        "mcc": pd.Categorical(rng.choice(MCC, n, p=[.3, .3, .2, .1, .1]), categories=MCC)})


@pytest.fixture(scope="module")
def fraud():
    """A LightGBM classifier trained on a pandas frame with string categories (what a fraud
    team trains): gambling (mcc 7995) at night from some countries is fraud."""
    df = _frame(4000, 0)
    rng = np.random.default_rng(1)
    y = ((df.mcc == "7995") & ((df.hour < 6) | df.country.isin(["NG", "IN"])) |
         (df.amount > 900) & (rng.random(len(df)) < 0.6)).astype(int)
    clf = lgb.LGBMClassifier(n_estimators=60, num_leaves=15, verbose=-1, min_data_per_group=5,
                             cat_smooth=1.0, random_state=0).fit(df, y)
    model = worker.compile_model(clf)
    assert model.categories == {"country": COUNTRY, "mcc": MCC}
    return clf, model


def _events(df: pd.DataFrame, nested: bool = True) -> list[dict]:
    out = []
    for i, row in enumerate(df.itertuples(index=False)):
        ev = {"txn_id": i, "amount": float(row.amount), "hour": int(row.hour)}
        if nested:
            ev["merchant"] = {"country": row.country, "mcc": row.mcc}
        else:
            ev.update(country=row.country, mcc=row.mcc)
        out.append(ev)
    return out


NESTED = {"country": "merchant.country", "mcc": "merchant.mcc"}


def _pipeline(model, fields, fmt="json", **source):
    settings = load_settings(
        None, scoring={"id_column": "txn_id", "threads": 1, "thresholds": [0.5]},
        model={"path": "unused"},
        source={"type": "file", "path": "x.arrows", "format": fmt, "fields": fields,
                **source},
        sink={"type": "file", "path": "o.arrows", "format": "json"})
    return Pipeline(model, settings, "scores")


def _run(pipe, values):
    recs = [Record("in", 0, k, None, v, 0, []) for k, v in enumerate(values)]
    outputs, dead, stats = pipe.process([(r, pipe.decode(r)) for r in recs])
    rows = []
    for o in outputs:
        doc = json.loads(o.value)
        rows += [doc] if isinstance(doc, dict) else doc
    return rows, dead, stats


def _header(letter, name):
    return dict(letter.headers)[name].decode()


# ---- JSON: absent is not missing --------------------------------------------------------------

def test_a_typo_in_a_field_path_dead_letters_every_event_naming_feature_and_path(fraud):
    """`country: merchant.countr`: before, exit 0 and the feature read as missing on every
    row (2,000 events gave 12 review decisions instead of 32). Now every message is
    dead-lettered missing_field, naming the feature and the path, and counted by feature."""
    clf, model = fraud
    df = _frame(400, 2)
    values = [json.dumps(e).encode() for e in _events(df)]
    rows, dead, _ = _run(_pipeline(model, NESTED), values)
    assert len(rows) == 400 and not dead
    np.testing.assert_allclose([r["score"] for r in rows], clf.predict_proba(df)[:, 1],
                               rtol=1e-12)
    typo = {**NESTED, "country": "merchant.countr"}
    rows, dead, stats = _run(_pipeline(model, typo), values)
    assert rows == [] and len(dead) == 400
    assert {_header(d, "error_code") for d in dead} == {"missing_field"}
    why = _header(dead[0], "error")
    assert "'country'" in why and "merchant.countr" in why, why
    assert stats.features[("refused:missing_field", "country")] == 400


def test_an_absent_object_is_missing_field_and_a_null_one_is_missing(fraud):
    clf, model = fraud
    pipe = _pipeline(model, NESTED)
    base = {"txn_id": 1, "amount": 950.0, "hour": 3}
    with pytest.raises(InvalidMessage, match="'country' .merchant.country. is absent") as e:
        pipe.format.decode(json.dumps(base).encode())
    assert e.value.code == "missing_field" and e.value.feature == "country"
    # null says "missing": the model's missing-value rule, as the library applies it
    X = pipe.format.decode(json.dumps({**base, "merchant": None}).encode()).data.X
    ref = pd.DataFrame({"amount": [np.float32(950.0)], "hour": [np.float32(3)],
                        "country": pd.Categorical([None], categories=COUNTRY),
                        "mcc": pd.Categorical([None], categories=MCC)})
    np.testing.assert_allclose(model.predict_proba(X), clf.predict_proba(ref), rtol=1e-12)


def test_optional_fields_absent_are_missing_and_counted(fraud):
    clf, model = fraud
    fields = {**NESTED, "country": {"path": "merchant.country", "optional": True}}
    pipe = _pipeline(model, fields)
    df = _frame(50, 3)
    events = _events(df)
    for e in events[::2]:
        del e["merchant"]["country"]
    with pytest.raises(InvalidMessage):  # mcc is still required
        pipe.format.decode(json.dumps({"txn_id": 1, "amount": 1.0, "hour": 1,
                                       "merchant": {}}).encode())
    rows, dead, stats = _run(pipe, [json.dumps(events).encode()])
    assert not dead
    ref = df.copy()
    ref.loc[ref.index[::2], "country"] = None
    np.testing.assert_allclose([r["score"] for r in rows], clf.predict_proba(ref)[:, 1],
                               rtol=1e-12)
    assert stats.features[("absent", "country")] == 25
    assert stats.features[("missing", "country")] == 25
    assert stats.features[("missing", "amount")] == 0


# ---- JSON: types checked, casts declared ------------------------------------------------------

def test_a_category_sent_as_a_number_is_bad_type_unless_cast_string(fraud):
    """mcc 7995 as a number where the model was trained on the string "7995": before, read
    as category code 7995 (unseen), 0.024 instead of 0.718. Now bad_type naming the feature;
    with cast: string the integer is read as its digits and scores as the library scores
    "7995"."""
    clf, model = fraud
    event = {"txn_id": 1, "amount": 40.0, "hour": 2,
             "merchant": {"country": "NG", "mcc": 7995}}
    with pytest.raises(InvalidMessage, match="merchant.mcc is a number") as e:
        _pipeline(model, NESTED).format.decode(json.dumps(event).encode())
    assert e.value.code == "bad_type" and e.value.feature == "mcc"
    cast = _pipeline(model, {**NESTED, "mcc": {"path": "merchant.mcc", "cast": "string"}})
    ref = pd.DataFrame({"amount": [np.float32(40)], "hour": [np.float32(2)],
                        "country": pd.Categorical(["NG"], categories=COUNTRY),
                        "mcc": pd.Categorical(["7995"], categories=MCC)})
    want = clf.predict_proba(ref)[:, 1]
    assert want[0] > 0.5
    for mcc in (7995, "7995"):  # the cast takes the strings as they are
        ev = {**event, "merchant": {"country": "NG", "mcc": mcc}}
        X = cast.format.decode(json.dumps(ev).encode()).data.X
        np.testing.assert_allclose(model.predict_proba(X)[:, 1], want, rtol=1e-12)
    # an integer that is no category: unseen (missing), counted; a fraction or a boolean
    # has no category text
    m = cast.format.decode(json.dumps({**event, "merchant": {"country": "NG", "mcc": 1234}}
                                      ).encode())
    assert np.isnan(m.data.X[0, 3]) and m.counts["unseen"].tolist() == [0, 0, 0, 1]
    for bad, kind in ((7995.0, "cast_failed"), (7995.5, "cast_failed"), (True, "bad_type")):
        with pytest.raises(InvalidMessage) as e:
            cast.format.decode(json.dumps({**event, "merchant": {"country": "NG",
                                                                  "mcc": bad}}).encode())
        assert (e.value.code, e.value.feature) == (kind, "mcc"), bad


CAST_BAD = ["", " 1", "1 ", "+1", "--1", "1.5.2", "0x10", "NaN", "nan", "inf", "Infinity",
            "1e", "1,5", ".5", "5.", "1_000", "true", "null", '"1"', "[1]", "1" * 1025, "\u0661"]


@pytest.mark.parametrize("text", CAST_BAD)
def test_cast_number_refuses_what_is_not_one_json_number(text):
    from types import SimpleNamespace

    fmt = input_format("json", SimpleNamespace(feature_names=["a"], categories={}), None, None,
                       1 << 20, {"a": {"cast": "number"}})
    with pytest.raises(InvalidMessage) as e:
        fmt.decode(json.dumps({"a": text}).encode())
    assert (e.value.code, e.value.feature) == ("cast_failed", "a")


def test_without_a_cast_a_string_number_is_bad_type():
    from types import SimpleNamespace

    fmt = input_format("json", SimpleNamespace(feature_names=["a"], categories={}), None, None,
                       1 << 20)
    with pytest.raises(InvalidMessage, match="declare cast: number") as e:
        fmt.decode(b'{"a": "12.30"}')
    assert e.value.code == "bad_type"


_NUMBER_TEXTS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(lambda x: f"{x:.9g}"),
    st.integers(-(2**64), 2**64).map(str),
    st.sampled_from(["0", "-0", "0.0", "-0.0", "12.30", "1e-45", "3.4028235677973362e38",
                     "3.4028235677973366e38", "1e39", "16777217", "9007199254740993",
                     "18446744073709551615", "-9223372036854775808", "1E5", "2.5e-3"]))


@settings(max_examples=600, deadline=None)
@given(st.lists(_NUMBER_TEXTS, min_size=1, max_size=8))
def test_cast_number_is_the_float32_the_same_json_number_gives(texts):
    """`cast: number` defined exactly: "x" reads as the float32 that x reads as (to the bit,
    -0.0 too); where x is refused (bad_number: a float32 cannot hold it) so is "x"."""
    from types import SimpleNamespace

    model = SimpleNamespace(feature_names=["a"], categories={})
    plain = input_format("json", model, None, None, 1 << 20)
    cast = input_format("json", model, None, None, 1 << 20, {"a": {"cast": "number"}})
    for text in texts:
        try:
            want = plain.decode(b'{"a": ' + text.encode() + b"}").data.X
        except InvalidMessage as exc:
            assert exc.code == "bad_number", (text, exc)
            with pytest.raises(InvalidMessage) as e:
                cast.decode(json.dumps({"a": text}).encode())
            assert e.value.code in ("bad_number", "cast_failed"), text
            continue
        got = cast.decode(json.dumps({"a": text}).encode()).data.X
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist(), text


def test_amounts_sent_as_strings_score_as_the_library_scores_their_values(fraud):
    clf, model = fraud
    df = _frame(300, 4)
    rng = np.random.default_rng(4)
    texts = [f"{v:.2f}" if k % 3 else repr(float(v)) for k, v in
             enumerate(rng.lognormal(3.5, 1.6, len(df)))]
    texts[:6] = ["900.00", "899.99", "900.01", "0", "-0", "1e3"]
    df["amount"] = np.array([float(t) for t in texts], np.float64).astype(np.float32)
    events = _events(df)
    for e, t in zip(events, texts, strict=True):
        e["amount"] = t
    pipe = _pipeline(model, {**NESTED, "amount": {"cast": "number"}})
    rows, dead, _ = _run(pipe, [json.dumps(events).encode()])
    assert not dead
    np.testing.assert_allclose([r["score"] for r in rows], clf.predict_proba(df)[:, 1],
                               rtol=1e-12)


def test_casts_the_feature_cannot_take_are_refused_at_start_up(fraud):
    _, model = fraud
    with pytest.raises(ValueError, match="cast: string reads a number as a category"):
        _pipeline(model, {"amount": {"cast": "string"}})
    with pytest.raises(ValueError, match="mcc.* is categorical"):
        _pipeline(model, {"mcc": {"cast": "number"}})
    with pytest.raises(ValueError, match="the id column takes no cast"):
        _pipeline(model, {"txn_id": {"cast": "number"}})


# ---- Avro: a writer schema that cannot reach a required path is refused ---------------------

def _schema(txn_type) -> dict:
    return {"type": "record", "name": "Payment", "fields": [
        {"name": "txn_id", "type": "long"}, {"name": "txn", "type": txn_type},
        {"name": "hour", "type": "int"}, {"name": "country", "type": "string"},
        {"name": "mcc", "type": "string"}]}


TXN_RECORD = {"type": "record", "name": "Txn", "fields": [{"name": "amount", "type": "double"}]}


def _avro_format(tmp_path, model, schemas: dict, fields):
    d = tmp_path / "schemas"
    d.mkdir(exist_ok=True)
    for sid, schema in schemas.items():
        (d / f"{sid}.avsc").write_text(json.dumps(schema))
    return input_format("avro", model, "txn_id", None, 1 << 20, fields, schemas_dir=str(d))


def _wire(sid: int, schema, record) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return b"\0" + struct.pack(">I", sid) + buf.getvalue()


@pytest.mark.parametrize("txn_type, value, said", [
    ({"type": "map", "values": "double"}, {"amount": 5000.0}, "txn is an Avro map"),
    ("string", "5000.0", "txn is an Avro string"),
    (["null", {"type": "map", "values": "double"}], {"amount": 5000.0}, "txn is an Avro map"),
    ({"type": "record", "name": "T2", "fields": [{"name": "amt", "type": "double"}]},
     {"amt": 5000.0}, "txn has no field 'amount'"),
], ids=["map", "string", "nullable-map", "renamed"])
def test_an_avro_schema_change_that_loses_a_path_is_schema_mismatch(tmp_path, fraud, txn_type,
                                                                   value, said):
    """`amount: txn.amount`: the same 5,000.0 transaction scored 0.982 when txn is a record
    and 0.243 when a new writer schema made txn a map, a string or a nullable map (read as
    missing). Now every message of that schema is schema_mismatch naming the path."""
    clf, model = fraud
    fields = {"amount": "txn.amount"}
    fmt = _avro_format(tmp_path, model, {1: _schema(TXN_RECORD), 2: _schema(txn_type)}, fields)
    rec = {"txn_id": 7, "txn": {"amount": 5000.0}, "hour": 3, "country": "NG", "mcc": "7995"}
    X = fmt.decode(_wire(1, _schema(TXN_RECORD), rec)).data[0]
    ref = pd.DataFrame({"amount": [np.float32(5000)], "hour": [np.float32(3)],
                        "country": pd.Categorical(["NG"], categories=COUNTRY),
                        "mcc": pd.Categorical(["7995"], categories=MCC)})
    np.testing.assert_allclose(model.predict_proba(X), clf.predict_proba(ref), rtol=1e-12)
    for _ in range(2):  # every message of the schema
        with pytest.raises(InvalidMessage) as e:
            fmt.decode(_wire(2, _schema(txn_type), {**rec, "txn": value}))
        assert e.value.code == "schema_mismatch"
        assert "feature 'amount' (txn.amount)" in e.value.detail and said in e.value.detail
    # optional: read as missing (absent, counted) instead
    opt = _avro_format(tmp_path, model, {2: _schema(txn_type)},
                       {"amount": {"path": "txn.amount", "optional": True}})
    m = opt.decode(_wire(2, _schema(txn_type), {**rec, "txn": value}))
    assert np.isnan(m.data[0][0, 0]) and m.counts["absent"].tolist() == [1, 0, 0, 0]


def test_an_avro_null_on_the_path_is_missing_not_absent(tmp_path, fraud):
    _, model = fraud
    schema = _schema(["null", TXN_RECORD])
    fmt = _avro_format(tmp_path, model, {3: schema}, {"amount": "txn.amount"})
    m = fmt.decode(_wire(3, schema, {"txn_id": 1, "txn": None, "hour": 1, "country": "US",
                                     "mcc": "5411"}))
    assert np.isnan(m.data[0][0, 0]) and m.counts is None
    m = fmt.decode(_wire(3, schema, {"txn_id": 1, "txn": {"amount": 2.5}, "hour": 1,
                                     "country": "US", "mcc": "5411"}))
    assert m.data[0][0, 0] == 2.5


def test_avro_categories_and_casts(tmp_path, fraud):
    """An Avro int for a feature with string categories is refused with its schema (bad_type)
    unless cast: string; a string amount is read with cast: number as JSON reads it; an
    enum symbol or string the model does not know is counted unseen."""
    clf, model = fraud
    ints = {"type": "record", "name": "P", "fields": [
        {"name": "txn_id", "type": "long"}, {"name": "amount", "type": "string"},
        {"name": "hour", "type": "int"}, {"name": "mcc", "type": "long"},
        {"name": "country", "type": {"type": "enum", "name": "C",
                                     "symbols": ["US", "NG", "XX"]}}]}
    rec = {"txn_id": 1, "amount": "40.10", "hour": 2, "mcc": 7995, "country": "NG"}
    plain = _avro_format(tmp_path, model, {4: ints}, {})
    with pytest.raises(InvalidMessage, match="amount is an Avro string") as e:
        plain.decode(_wire(4, ints, rec))
    assert e.value.code == "bad_type"
    casts = {"amount": {"cast": "number"}, "mcc": {"cast": "string"}}
    (tmp_path / "b").mkdir()
    fmt = _avro_format(tmp_path / "b", model, {4: ints}, casts)
    X = fmt.decode(_wire(4, ints, rec)).data[0]
    ref = pd.DataFrame({"amount": [np.float32(40.10)], "hour": [np.float32(2)],
                        "country": pd.Categorical(["NG"], categories=COUNTRY),
                        "mcc": pd.Categorical(["7995"], categories=MCC)})
    np.testing.assert_allclose(model.predict_proba(X), clf.predict_proba(ref), rtol=1e-12)
    m = fmt.decode(_wire(4, ints, {**rec, "mcc": 1, "country": "XX"}))
    assert m.counts["unseen"].tolist() == [0, 0, 1, 1]
    with pytest.raises(InvalidMessage) as e:
        fmt.decode(_wire(4, ints, {**rec, "amount": "12,5"}))
    assert (e.value.code, e.value.feature) == ("cast_failed", "amount")


def test_a_schema_that_failed_to_parse_is_read_again_like_a_missing_one(tmp_path, fraud,
                                                                        monkeypatch):
    """A half-written .avsc (a sidecar exporting the registry) was refused until restart,
    where a missing one is looked for again after 30 s: both are now."""
    from worker.formats import avro

    _, model = fraud
    schema = _schema(TXN_RECORD)
    fmt = _avro_format(tmp_path, model, {}, {"amount": "txn.amount"})
    (tmp_path / "schemas" / "5.avsc").write_text(json.dumps(schema)[:40])
    value = _wire(5, schema, {"txn_id": 1, "txn": {"amount": 2.0}, "hour": 1,
                              "country": "US", "mcc": "5411"})
    now = [1000.0]
    monkeypatch.setattr(avro.time, "monotonic", lambda: now[0])
    with pytest.raises(InvalidMessage) as e:
        fmt.decode(value)
    assert e.value.code == "bad_schema"
    (tmp_path / "schemas" / "5.avsc").write_text(json.dumps(schema))
    with pytest.raises(InvalidMessage):  # remembered for a while: not read each message
        fmt.decode(value)
    now[0] += avro.UNKNOWN_RETRY_S + 1
    assert fmt.decode(value).data[0][0, 0] == 2.0


# ---- counted --------------------------------------------------------------------------------

def test_per_feature_counts_reach_prometheus(fraud):
    """Missing values, unseen categories, absent optional fields and refusals by feature, as
    Prometheus counters (labels: the model's features)."""
    from prometheus_client import generate_latest

    from worker.metrics import Metrics

    _, model = fraud
    pipe = _pipeline(model, {**NESTED, "hour": {"optional": True}})
    events = [{"txn_id": 1, "amount": None, "merchant": {"country": "ZZ", "mcc": "5411"}},
              {"txn_id": 2, "amount": 5.0, "hour": 1, "merchant": {"country": "US",
                                                                   "mcc": 5411}}]
    _, dead, stats = _run(pipe, [json.dumps(events[0]).encode(), json.dumps(events[1]).encode()])
    assert len(dead) == 1
    m = Metrics()
    m.count_features(stats.features)
    text = generate_latest(m.registry).decode()
    for line in ('scoring_feature_missing_total{feature="amount"} 1.0',
                 'scoring_feature_missing_total{feature="hour"} 1.0',
                 'scoring_feature_missing_total{feature="country"} 1.0',
                 'scoring_feature_absent_total{feature="hour"} 1.0',
                 'scoring_feature_unseen_categories_total{feature="country"} 1.0',
                 'scoring_feature_refused_total{feature="mcc",reason="bad_type"} 1.0'):
        assert line in text, line


# ---- the Python API matches a DataFrame by name ---------------------------------------------

def test_a_dataframe_is_matched_by_name_and_its_categories_read_as_the_library_reads_them(
        fraud):
    """A frame with its columns in another order: before, matched by position (47 of 1,000
    decisions flipped); the training frame itself (pandas category columns) failed with
    "could not convert string to float". Now both score as LightGBM scores the frame; a
    frame without a feature is refused naming it; numpy stays positional."""
    clf, model = fraud
    df = _frame(1000, 6)
    want = clf.predict_proba(df)
    reordered = df[["mcc", "hour", "country", "amount"]].assign(extra=1.0)
    for X in (df, reordered):
        np.testing.assert_allclose(model.predict_proba(X), want, rtol=1e-12)
        np.testing.assert_allclose(model.score_batch(X, thresholds=[0.5]).score, want[:, 1],
                                   rtol=1e-12)
        np.testing.assert_allclose(model.contributions(X),
                                   clf.booster_.predict(df, pred_contrib=True), atol=1e-9)
    r = model.score_batch(reordered, lazy="certified", thresholds=[0.5], audit_fraction=1.0)
    assert r.audit_disagreements == 0
    assert (r.decision == (want[:, 1] >= 0.5)).all()
    # a dict of columns, the categories as plain strings
    cols = {c: (df[c].astype(str).to_numpy() if c in ("country", "mcc") else df[c].to_numpy())
            for c in reversed(df.columns)}
    np.testing.assert_allclose(model.predict_proba(cols), want, rtol=1e-12)
    with pytest.raises(KeyError, match="missing feature column.*hour"):
        model.predict_proba(df.drop(columns=["hour"]))
    with pytest.raises(ValueError, match="more than once"):
        model.predict_proba(pd.concat([df, df[["hour"]]], axis=1))


def test_a_reordered_frame_scores_as_xgboost_scores_the_frame():
    xgb = pytest.importorskip("xgboost")
    df = _frame(1500, 7)
    y = ((df.mcc == "7995") | (df.amount > 300)).astype(int)
    est = xgb.XGBClassifier(n_estimators=30, max_depth=4, enable_categorical=True,
                            tree_method="hist", max_cat_to_onehot=1).fit(df, y)
    model = worker.compile_model(est)
    want = est.predict_proba(df)
    np.testing.assert_allclose(model.predict_proba(df[df.columns[::-1]]), want, atol=1e-6)
    np.testing.assert_allclose(model.predict_proba(df), want, atol=1e-6)


# ---- serve fails closed ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def fraud_server(fraud, tmp_path_factory):
    from tests.test_serve import Server

    d = tmp_path_factory.mktemp("contract-serve")
    fraud[1].save(d / "fraud.model")
    s = Server(d / "fraud.model", d, {})
    yield s
    assert s.stop() == 0, s.output()


def test_serve_takes_categories_by_name_and_refuses_what_leaves_features_out(fraud,
                                                                           fraud_server):
    """Before: a request with only `amount` was 200 (score 0.0056, "allow"); categories could
    not be sent by name, only as codes a retrained model may renumber. Now, through Triton's
    own client: BYTES category names (JSON and binary) score as LightGBM scores the frame,
    the metadata lists the categories, codes and the matrix form are 400, and so is a
    request that leaves a feature out, naming it."""
    from tritonclient import http as httpclient
    from tritonclient.utils import InferenceServerException

    from tests.test_serve import get, post

    clf, model = fraud
    df = _frame(300, 9)
    df.loc[df.index[::7], "mcc"] = None
    want = clf.predict_proba(df)[:, 1]
    status, meta = get(fraud_server, "/v2/models/fraud")
    meta = json.loads(meta)
    assert meta["parameters"]["categories"] == {"country": COUNTRY, "mcc": MCC}
    assert {i["name"]: i["datatype"] for i in meta["inputs"]} == {
        "amount": "FP32", "hour": "FP32", "country": "BYTES", "mcc": "BYTES"}
    client = httpclient.InferenceServerClient(url=fraud_server.url)
    try:
        for binary in (False, True):
            inputs = []
            for name in ("mcc", "amount", "country", "hour"):
                if name in ("mcc", "country"):
                    t = httpclient.InferInput(name, [len(df)], "BYTES")
                    t.set_data_from_numpy(np.array(
                        [b"" if v is None or v != v else v.encode() for v in df[name]],
                        dtype=object), binary_data=binary)
                else:
                    t = httpclient.InferInput(name, [len(df)], "FP32")
                    t.set_data_from_numpy(df[name].to_numpy(np.float32), binary_data=binary)
                inputs.append(t)
            res = client.infer("fraud", inputs)
            # "" is no category: missing, as the library reads the None
            np.testing.assert_allclose(res.as_numpy("score"), want, rtol=1e-12)
        codes = httpclient.InferInput("mcc", [len(df)], "FP32")
        codes.set_data_from_numpy(df.mcc.cat.codes.to_numpy(np.float32))
        with pytest.raises(InferenceServerException, match="category names"):
            client.infer("fraud", [inputs[1], inputs[2], inputs[3], codes])
        with pytest.raises(InferenceServerException, match="1 of the model's 4 features "
                                                           "has no input: hour"):
            client.infer("fraud", inputs[:3])
    finally:
        client.close()
    matrix = {"inputs": [{"name": "input-0", "shape": [1, 4], "datatype": "FP32",
                          "data": [40.0, 2, 3, 3]}]}
    status, _, body = post(fraud_server, "/v2/models/fraud/infer", json.dumps(matrix).encode())
    assert status == 400 and b"by category names" in body, body
    only_amount = {"inputs": [{"name": "amount", "shape": [1], "datatype": "FP32",
                               "data": [5000.0]}]}
    status, _, body = post(fraud_server, "/v2/models/fraud/infer",
                           json.dumps(only_amount).encode())
    assert status == 400 and b"hour, country, mcc" in body, body


def test_serve_allow_missing_is_the_documented_fail_open(fraud, tmp_path):
    from worker.serve.service import Service

    _, model = fraud
    model.save(tmp_path / "fraud.model")
    body = json.dumps({"inputs": [{"name": "amount", "shape": [1], "datatype": "FP32",
                                   "data": [5000.0]}]}).encode()
    for allow, status in ((False, 400), (True, 200)):
        settings = load_settings(None, model={"path": str(tmp_path / "fraud.model")},
                                 source={"type": "file", "path": "unused"},
                                 serve={"allow_missing": allow})
        svc = Service(settings, str(tmp_path / "fraud.model"), "fraud")
        svc.load()
        try:
            got = svc.handle(b"POST", b"/v2/models/fraud/infer",
                             {b"content-type": b"application/json"}, body)
        finally:
            svc.close()
        assert got[0] == status, got
        if allow:  # missing values counted by feature
            from prometheus_client import generate_latest

            text = generate_latest(svc.metrics.registry).decode()
            assert 'serve_feature_missing_total{feature="hour"} 1.0' in text, text
            X = np.array([[5000.0, np.nan, np.nan, np.nan]], np.float32)
            score = json.loads(got[2])["outputs"][0]["data"][0]
            assert score == pytest.approx(float(model.predict_proba(X)[0, 1]), rel=1e-12)


# ---- what the attacker review of the contract found (each failed before its fix) ----------

def test_arrow_unseen_categories_are_counted_apart_from_nulls(fraud):
    """A categorical Arrow column with more nulls than unseen strings: the count went
    negative and the metrics raised after the commit, every batch (a crash loop)."""
    import pyarrow as pa

    from worker.model.compiled import category_sets, unseen_categories

    cats = category_sets({"c": ["US", "GB", "NG"]})["c"]
    col = pa.DictionaryArray.from_arrays(pa.array([0, None, None, 1, 2, 3], pa.int32()),
                                         pa.array(["US", "XX", None, "YY"]))
    assert unseen_categories(col, cats) == 2  # XX, YY; the null index and null value: missing
    _, model = fraud
    table = pa.table({"txn_id": pa.array([1, 2, 3]),
                      "amount": pa.array([1.0, 2.0, 3.0], pa.float32()),
                      "hour": pa.array([1.0, 2.0, 3.0], pa.float32()),
                      "country": pa.array(["US", None, None]).dictionary_encode(),
                      "mcc": pa.array(["XX", None, "5411"]).dictionary_encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    pipe = _pipeline(model, {}, fmt="arrow")
    msg = pipe.format.decode(sink.getvalue().to_pybytes())
    assert msg.counts["unseen"].tolist() == [0, 0, 0, 1]
    _, dead, stats = pipe.process([(Record("in", 0, 0, None, b"", 0, []), msg)])
    assert not dead and stats.features[("missing", "country")] == 2
    from worker.metrics import Metrics

    Metrics().count_features(stats.features)  # (raised before)


def test_an_avro_record_on_the_path_holding_only_a_null_feature_is_read(tmp_path):
    from types import SimpleNamespace

    inner = {"type": "record", "name": "A", "fields": [{"name": "x", "type": "null"}]}
    for schema in ({"type": "record", "name": "R", "fields": [
            {"name": "a", "type": inner}, {"name": "b", "type": "int"}]},
            {"type": "record", "name": "R", "fields": [{"name": "a", "type": inner}]}):
        model = SimpleNamespace(feature_names=["x", "b"][:len(schema["fields"])],
                                categories={})
        where = tmp_path / str(len(schema["fields"]))
        where.mkdir()
        fmt = _avro_format(where, model, {1: schema},
                           {"x": "a.x", "txn_id": {"optional": True}})
        rec = {"a": {"x": None}, "b": 3}
        m = fmt.decode(_wire(1, schema, rec))
        assert np.isnan(m.data[0][0, 0]) and m.counts is None


def test_reader_arguments_that_would_reach_native_code_unchecked_are_refused():
    from worker import _eventread

    for depth in (0, 2**62):
        with pytest.raises(ValueError, match="max_depth"):
            _eventread.JsonReader([["x"]], None, {}, ["x"], 0, 1 << 20, depth)
    # an array whose items take no bytes yet are read (b = 2): no schema compiles to it
    nodes = [[13, -1, 0, 1], [10, -1, 2, 2], [13, -1, 1, 0]]
    with pytest.raises(ValueError, match="item kind"):
        _eventread.AvroReader(nodes, [1], [], [], 1, 1 << 20)


def test_cast_number_reads_a_long_decimal_as_json_reads_it():
    from types import SimpleNamespace

    model = SimpleNamespace(feature_names=["a"], categories={})
    cast = input_format("json", model, None, None, 1 << 20, {"a": {"cast": "number"}})
    text = "1." + "0" * 900 + "1"
    got = cast.decode(json.dumps({"a": text}).encode()).data.X
    want = input_format("json", model, None, None, 1 << 20).decode(
        b'{"a": ' + text.encode() + b"}").data.X
    assert got.tolist() == want.tolist() == [[1.0]]


# ---- a dry run before production -----------------------------------------------------------

def test_check_reads_a_sample_through_the_real_decoder_and_names_what_would_fail(fraud,
                                                                              tmp_path):
    """`scoring-worker check --config C --sample S`: per feature its source and how often
    the sample gives it; the messages that would be dead-lettered and why; exit 1 when a
    required feature is never present (the typo), 0 once the config is right."""
    import subprocess
    import sys

    import yaml

    from tests.test_serve import ROOT

    _, model = fraud
    model.save(tmp_path / "fraud.model")
    events = _events(_frame(100, 11))
    for e in events[::10]:
        e["merchant"]["mcc"] = int(e["merchant"]["mcc"])
    for e in events[::4]:
        e["hour"] = None
    (tmp_path / "s.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n{x\n")

    def check(fields, *extra):
        cfg = {"model": {"path": str(tmp_path / "fraud.model")},
               "source": {"type": "file", "path": "x.arrows", "format": "json",
                          "fields": fields}, "scoring": {"id_column": "txn_id"}}
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
        return subprocess.run([sys.executable, "-m", "worker.cli", "check", "--config",
                               str(tmp_path / "c.yaml"), *extra], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)

    typo = check({**NESTED, "country": "merchant.countr"}, "--sample", str(tmp_path / "s.jsonl"))
    assert typo.returncode == 1, typo.stdout + typo.stderr
    out = typo.stdout
    line = {ln.split()[0]: ln for ln in out.splitlines() if ln.split()}
    assert "merchant.countr" in line["country"] and "100.0%" in line["country"]  # absent
    assert "missing_field 90" in line["country"]
    assert "bad_type 10" in line["mcc"]
    assert "77.8%" in line["hour"] and "22.2%" in line["hour"]  # present, null (of 90 read)
    assert "101 messages; the worker would dead-letter 101" in out and "bad_json: 1" in out
    assert "required features never present: country (country: absent from every" in out
    fixed = check({**NESTED, "mcc": {"path": "merchant.mcc", "cast": "string"}},
                  "--sample", str(tmp_path / "s.jsonl"))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "the worker would dead-letter 1:" in fixed.stdout  # the line that is not JSON
    # a typo in the id's path: every event refused (before: scored with null ids, silently)
    id_typo = check({**NESTED, "mcc": {"path": "merchant.mcc", "cast": "string"},
                     "txn_id": "txn.idd"}, "--sample", str(tmp_path / "s.jsonl"))
    line = {ln.split()[0]: ln for ln in id_typo.stdout.splitlines() if ln.split()}
    assert "missing_field 100" in line["txn_id"], id_typo.stdout
    table = check(NESTED)
    assert table.returncode == 0 and "merchant.mcc" in table.stdout
    assert "category (5 names)" in table.stdout
    bad = check({"nonesuch": "a.b"})
    assert bad.returncode == 2 and "names no feature" in bad.stderr


def test_the_id_is_required_like_a_feature(fraud, tmp_path):
    """A typo in the id's path (`txn_id: txn.idd`): before, every output came out with a null
    id, exit 0, nothing logged. Now missing_field naming the id (JSON), schema_mismatch
    (Avro); a null id is still a null id, and optional: true reads an absent one as null."""
    _, model = fraud
    ev = {"txn": {"id": "t-1"}, "amount": 5.0, "hour": 1,
          "merchant": {"country": "US", "mcc": "5411"}}
    typo = _pipeline(model, {**NESTED, "txn_id": "txn.idd"})
    with pytest.raises(InvalidMessage, match="the id 'txn_id' .txn.idd. is absent") as e:
        typo.format.decode(json.dumps(ev).encode())
    assert e.value.code == "missing_field"
    right = _pipeline(model, {**NESTED, "txn_id": "txn.id"})
    assert right.format.decode(json.dumps(ev).encode()).data.ids.to_pylist() == ["t-1"]
    null = right.format.decode(json.dumps({**ev, "txn": {"id": None}}).encode())
    assert null.data.ids.to_pylist() == [None]
    opt = _pipeline(model, {**NESTED, "txn_id": {"path": "txn.idd", "optional": True}})
    assert opt.format.decode(json.dumps(ev).encode()).data.ids.to_pylist() == [None]
    schema = {"type": "record", "name": "P", "fields": [
        {"name": "txn_key", "type": "long"}, {"name": "amount", "type": "double"},
        {"name": "hour", "type": "int"}, {"name": "country", "type": "string"},
        {"name": "mcc", "type": "string"}]}
    fmt = _avro_format(tmp_path, model, {1: schema}, {})
    with pytest.raises(InvalidMessage, match="the id 'txn_id' .txn_id.: the record has no "
                                             "field 'txn_id'") as e:
        fmt.decode(_wire(1, schema, {"txn_key": 1, "amount": 1.0, "hour": 1,
                                     "country": "US", "mcc": "5411"}))
    assert e.value.code == "schema_mismatch"


def test_frames_the_review_found(fraud, tmp_path):
    """A number for a category by name was read as a code (wrong scores, up to 0.99 off
    LightGBM's refusal); pandas categories of numbers were refused; a frame naming none of
    the features said only which were missing; a Series failed with an AttributeError; a
    Parquet file's plain strings were refused by `score`."""
    import pyarrow as pa

    clf, model = fraud
    df = _frame(200, 12)
    with pytest.raises(TypeError, match="knows it by its category names"):
        model.predict_proba(df.assign(mcc=df.mcc.astype(int)))
    with pytest.raises(TypeError, match="knows it by its category names"):
        model.predict_proba({c: (df[c].astype(int).to_numpy() if c == "mcc" else
                                 df[c].astype(str).to_numpy() if c == "country" else
                                 df[c].to_numpy()) for c in df.columns})
    with pytest.raises(KeyError, match="name none of the model's features"):
        model.predict_proba(pd.DataFrame(np.zeros((2, 4))))
    with pytest.raises(TypeError, match="not rows"):
        model.predict_proba(df["amount"])
    # categories of numbers: a LightGBM model trained on them scores its own frame
    codes = df.assign(mcc=pd.Categorical(df.mcc.astype(int), categories=[int(m) for m in MCC]))
    y = (df.mcc == "7995").astype(int)
    lg = lgb.LGBMClassifier(n_estimators=10, verbose=-1, min_data_per_group=5).fit(codes, y)
    m = worker.compile_model(lg)
    assert m.categories["mcc"] == MCC
    np.testing.assert_allclose(m.predict_proba(codes), lg.predict_proba(codes), rtol=1e-12)
    # plain strings in an Arrow table (Parquet's): dictionary-encoded on the way in
    table = pa.table({"amount": df.amount.to_numpy(), "hour": df.hour.to_numpy(),
                      "country": df.country.astype(str).to_numpy(),
                      "mcc": pa.array(df.mcc.astype(str).tolist(), pa.large_string())})
    np.testing.assert_allclose(model.predict_proba(table), clf.predict_proba(df), rtol=1e-12)


def test_the_worker_reads_json_lines_from_a_file(fraud, tmp_path):
    """A new user's first run without Kafka: events as JSON lines (one message a line) as
    the file source, the scores and dead letters as recorded topics."""
    import subprocess
    import sys

    import yaml

    from tests.test_serve import ROOT
    from worker.io.records import read_records

    clf, model = fraud
    model.save(tmp_path / "fraud.model")
    df = _frame(30, 13)
    lines = [json.dumps(e) for e in _events(df)]
    lines.insert(5, json.dumps({"txn_id": 99, "amount": 1.0}))  # no hour, no merchant
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n\n")
    cfg = {"model": {"path": str(tmp_path / "fraud.model")},
           "source": {"type": "file", "path": str(tmp_path / "events.jsonl"),
                      "format": "json", "fields": NESTED},
           "sink": {"type": "file", "path": str(tmp_path / "out.arrows"), "format": "json"},
           "scoring": {"id_column": "txn_id"}, "logging": {"progress": False}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    run = subprocess.run([sys.executable, "-m", "worker.cli", "--config",
                          str(tmp_path / "c.yaml")], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    rows = [json.loads(o.value) for o in read_records(tmp_path / "out.arrows")]
    dead = list(read_records(tmp_path / "out-dlq.arrows"))
    assert [dict(d.headers)["error_code"] for d in dead] == [b"missing_field"]
    assert [r["txn_id"] for r in rows] == list(range(30))
    np.testing.assert_allclose([r["score"] for r in rows], clf.predict_proba(df)[:, 1],
                               rtol=1e-12)
    # the contract at start-up: one line a feature
    assert "merchant.mcc" in run.stdout + run.stderr
    cfg["source"]["format"] = "arrow"
    del cfg["source"]["fields"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    bad = subprocess.run([sys.executable, "-m", "worker.cli", "--config",
                          str(tmp_path / "c.yaml")], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "set source.format to json" in bad.stderr


def test_score_reads_a_parquet_files_categories_by_name_and_refuses_codes(fraud, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from click.testing import CliRunner

    from worker.cli import main

    clf, model = fraud
    model.save(tmp_path / "fraud.model")
    df = _frame(100, 14)
    names = pa.table({"amount": df.amount.to_numpy(), "hour": df.hour.to_numpy(),
                      "country": df.country.astype(str).tolist(),
                      "mcc": df.mcc.astype(str).tolist()})
    pq.write_table(names, tmp_path / "names.parquet")
    pq.write_table(names.set_column(3, "mcc", pa.array(df.mcc.cat.codes.to_numpy())),
                   tmp_path / "codes.parquet")
    run = CliRunner().invoke(main, ["score", "--model", str(tmp_path / "fraud.model"),
                                    "--input", str(tmp_path / "names.parquet"), "--output",
                                    str(tmp_path / "o.arrow")])
    assert run.exit_code == 0, run.output
    got = pa.ipc.open_file(str(tmp_path / "o.arrow")).read_all() \
        if (tmp_path / "o.arrow").read_bytes()[:6] == b"ARROW1" else \
        pa.ipc.open_stream(str(tmp_path / "o.arrow")).read_all()
    np.testing.assert_allclose(got.column("score").to_numpy(), clf.predict_proba(df)[:, 1],
                               rtol=1e-12)
    run = CliRunner().invoke(main, ["score", "--model", str(tmp_path / "fraud.model"),
                                    "--input", str(tmp_path / "codes.parquet"), "--output",
                                    str(tmp_path / "o2.arrow")])
    assert run.exit_code != 0 and "knows it by its category names" in run.output


def test_the_native_bounds_at_their_edges():
    """cast: number reads up to CAST_MAX (1,024) characters and refuses one more; a JSON
    reader's max_depth is 1 to 1,024 (simdjson's buffers take a slot a level)."""
    from types import SimpleNamespace

    from worker import _eventread

    model = SimpleNamespace(feature_names=["a"], categories={})
    cast = input_format("json", model, None, None, 1 << 20, {"a": {"cast": "number"}})
    at = "1." + "0" * 1021 + "1"
    assert len(at) == 1024
    assert cast.decode(json.dumps({"a": at}).encode()).data.X.tolist() == [[1.0]]
    with pytest.raises(InvalidMessage) as e:
        cast.decode(json.dumps({"a": at + "0"}).encode())
    assert e.value.code == "cast_failed"
    for depth, ok in ((1, True), (1024, True), (1025, False)):
        if ok:
            _eventread.JsonReader([["a"]], None, {}, ["a"], 0, 1 << 20, depth)
        else:
            with pytest.raises(ValueError, match="max_depth"):
                _eventread.JsonReader([["a"]], None, {}, ["a"], 0, 1 << 20, depth)


def test_a_cast_read_from_a_config_file_is_checked_as_one_written_here():
    # the cast's text comes from YAML or JSON (a new string, not this module's literal):
    # cast: string on a feature without categories is refused whichever way it came
    from types import SimpleNamespace

    from worker.formats.base import field_specs

    model = SimpleNamespace(feature_names=["amount"], categories={})
    spec = json.loads('{"amount": {"cast": "string"}}')
    with pytest.raises(ValueError, match="source.fields.amount.cast: string reads a number"):
        field_specs(model, None, spec)
    spec = yaml.safe_load("amount: {cast: number}")
    assert field_specs(model, None, spec)["amount"].cast == "number"
