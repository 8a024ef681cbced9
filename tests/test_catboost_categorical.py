"""CatBoost models with one-hot categorical features, against CatBoost's own predictions.

Values arrive as strings (numpy/pandas objects, Arrow dictionaries), as integers (CatBoost
hashes an integer as its decimal string) or as whole floats (a JSON or tensor number); an
unseen category, an empty string and non-ASCII strings are compared too. The hash itself is
checked against the one CatBoost writes for every training string (its JSON export with the
pool), and every kernel that can score the model (the oblivious kernel in each mode, the walks,
QuickScorer) is compared. CTR splits are refused by name."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

import worker
from tests import models as M
from worker import _monitor, codec
from worker.formats import InvalidMessage
from worker.model.compile import chosen, to_ir
from worker.model.ir import UnsupportedModelError

catboost = pytest.importorskip("catboost", reason="pip install catboost (the test extras)")
pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")
pytest.importorskip("clickhouse_cityhash", reason="pip install clickhouse-cityhash")

MERCHANTS = ["m-001", "m-002", "grocer", "casino", "", "café", "商店", "m-003"]
MCC = [5411, 5812, 7995, 4829, 0, -1]
SIZES = (1, 5, 8, 9, 16, 17, 64, 65, 300)


def _frame(n: int, seed: int, unseen: bool = False) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    X = np.asarray(M.training_data(seed=seed, n=n)[0], dtype=np.float32)
    merchants = MERCHANTS + (["never-seen", "M-001", "m-001 "] if unseen else [])
    mcc = MCC + ([9999, 5411000] if unseen else [])
    return pd.DataFrame({"amount": X[:, 0], "merchant": rng.choice(merchants, n),
                         "hour": X[:, 1], "mcc": rng.choice(mcc, n), "velocity": X[:, 2]})


def _label(df: pd.DataFrame, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    risky = df.merchant.isin(["casino", "商店"]) | (df.mcc == 7995)
    return (risky ^ (np.nan_to_num(df.amount) > 1) ^ (rng.random(len(df)) < 0.1)).astype(int)


def _models():
    df = _frame(3000, seed=0)
    y = _label(df, 0)
    y3 = y + (np.nan_to_num(df.velocity) > 0.5)
    kw = dict(verbose=0, random_seed=0, thread_count=1, allow_writing_files=False,
              one_hot_max_size=255, cat_features=["merchant", "mcc"])
    C, R = catboost.CatBoostClassifier, catboost.CatBoostRegressor
    return df, {
        "logloss-d6": C(iterations=60, depth=6, **kw).fit(df, y),
        "multiclass-d4": C(iterations=30, depth=4, loss_function="MultiClass", **kw).fit(df, y3),
        "rmse-d8-nan-max": R(iterations=30, depth=8, nan_mode="Max", **kw).fit(
            df, np.nan_to_num(df.amount) + (df.merchant == "casino")),
    }


@pytest.fixture(scope="module")
def trained():
    return _models()


def test_the_hash_is_catboosts_own_for_every_training_string(trained, tmp_path):
    """CatBoost writes each training string's hash beside it when it exports a model with its
    pool: ours (model/cathash.py) must give the same number for each."""
    from worker.model.cathash import catboost_hash

    df, models = trained
    path = tmp_path / "m.json"
    models["logloss-d6"].save_model(str(path), format="json", pool=catboost.Pool(
        df, _label(df, 0), cat_features=["merchant", "mcc"]))
    pairs = json.loads(path.read_text())["features_info"]["cat_features_hash"]
    assert {p["value"] for p in pairs} == {*MERCHANTS, *map(str, MCC)}
    for p in pairs:
        assert catboost_hash(p["value"]) == p["hash"], p


def _arrow(df: pd.DataFrame, mcc_type=None) -> pa.Table:
    return pa.table({"amount": pa.array(df.amount, pa.float32()),
                     "merchant": pa.array(df.merchant.tolist()).dictionary_encode(),
                     "hour": pa.array(df.hour, pa.float32()),
                     "mcc": pa.array(df.mcc.tolist(), mcc_type or pa.int64()),
                     "velocity": pa.array(df.velocity, pa.float32())})


@pytest.mark.parametrize("name", ["logloss-d6", "multiclass-d4", "rmse-d8-nan-max"])
def test_every_input_form_and_kernel_matches_catboost(trained, name, tmp_path):
    _, models = trained
    model = models[name]
    compiled = worker.compile_model(model)
    path = tmp_path / "m.model"
    compiled.save(path)
    loaded = worker.load_model(path)
    assert loaded.category_hashes == compiled.category_hashes
    assert set(loaded.category_hashes) == {"merchant", "mcc"}
    ens = to_ir(model)
    others = [chosen(ens, lay, k) for lay, k in (("padded", "walk"), ("compact", "walk"),
                                                   ("padded", "oblivious"))]
    for seed, n in enumerate(SIZES):
        df = _frame(n, seed=100 + seed, unseen=True)
        raw = np.asarray(model.predict(df, prediction_type="RawFormulaVal"),
                         dtype=np.float64).reshape(n, -1)
        for m in [loaded, *others]:
            modes = [(None, False)]
            if m.kernel == "oblivious":
                best = m.forest.oblivious_simd()
                modes = [(k, False) for k in
                         ["row", "avx2", "avx512"][:["row", "avx2", "avx512"].index(best) + 1]]
                # the bins (AVX-512 BW; the one-hot splits' derived columns binned too),
                # built here though the model has too few trees a column to take them itself
                if best == "avx512" and m.forest.oblivious_bins(True):
                    modes.append(("avx512", True))
            for mode, bins in modes:
                if mode:
                    m.forest.oblivious_simd(mode)
                    m.forest.oblivious_bins(bins)
                where = f"{name}, {m.layout} {m.kernel} {mode or ''} bins {bins}, {n} rows"
                np.testing.assert_array_equal(m.raw(df.to_numpy(dtype=object), n_threads=2),
                                              raw, err_msg=f"{where}: numpy objects")
                np.testing.assert_array_equal(m.raw(_arrow(df)), raw, err_msg=f"{where}: Arrow")
        # integers as float64 (JSON numbers, tensors) and as Arrow int16 / float64
        as_float = df.to_numpy(dtype=object)
        as_float[:, 3] = df.mcc.to_numpy(dtype=np.float64)
        np.testing.assert_array_equal(loaded.raw(as_float), raw)
        np.testing.assert_array_equal(loaded.raw(_arrow(df, pa.float64())), raw)
        if loaded.task != "regression":
            np.testing.assert_allclose(loaded.predict_proba(df.to_numpy(dtype=object)),
                                       model.predict_proba(df), rtol=0, atol=1e-15)


def test_missing_and_unusable_values_take_the_unseen_side(trained):
    """CatBoost refuses a missing categorical value; the worker reads one (null, None, NaN,
    a fraction, a boolean-free type) as a category no split names: the false side of every
    one-hot split, as an unseen string goes."""
    _, models = trained
    compiled = worker.compile_model(models["logloss-d6"])
    df = _frame(50, seed=7)
    unseen = df.copy()
    unseen["merchant"] = "never-seen"
    unseen["mcc"] = 123456789
    want = compiled.raw(unseen.to_numpy(dtype=object))
    np.testing.assert_array_equal(
        want, np.asarray(models["logloss-d6"].predict(unseen, prediction_type="RawFormulaVal"),
                         dtype=np.float64).reshape(-1, 1))
    objs = df.to_numpy(dtype=object)
    objs[:, 1] = [None, np.nan] * 25
    objs[:, 3] = [2.5, None] * 25
    np.testing.assert_array_equal(compiled.raw(objs), want)
    table = _arrow(df).set_column(1, "merchant", pa.nulls(50, pa.dictionary(pa.int32(),
                                                                           pa.string())))
    table = table.set_column(3, "mcc", pa.nulls(50, pa.int64()))
    np.testing.assert_array_equal(compiled.raw(table), want)


def test_a_catboost_categorical_model_through_the_worker_decoder(trained):
    """Arrow messages as the worker reads them (codec.Decoder, ArrowFormat): dictionary
    strings and integers are hashed, never staged as codes by the C reader."""
    from worker.formats.arrow import ArrowFormat

    _, models = trained
    compiled = worker.compile_model(models["logloss-d6"])
    df = _frame(200, seed=9, unseen=True)
    table = _arrow(df).append_column("id", pa.array([f"tx-{i}" for i in range(200)]))
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    fmt = ArrowFormat(compiled, "id", None, 1 << 26)
    raw = np.asarray(models["logloss-d6"].predict(df, prediction_type="RawFormulaVal"),
                     dtype=np.float64).reshape(-1, 1)
    for _ in range(2):  # the second message's schema is cached: still not the C reader
        msg = fmt.decode(sink.getvalue())
        assert type(msg.data) is not codec.Raw
        got = compiled.forest.raw(compiled.columns(msg.data), 1)
        np.testing.assert_array_equal(got, raw)


def _json_events(df: pd.DataFrame, merchant_path=("merchant",)):
    """``df``'s rows as JSON events, each categorical value in one of the forms a producer
    writes (a string; an integer, an integer's string, a whole float, a boolean; null, absent,
    a fraction), and what CatBoost is given for each (the unseen value for the last three)."""
    events, ref = [], df.copy()
    for i, row in enumerate(df.itertuples()):
        e = {"id": f"t{i}", "amount": None if np.isnan(row.amount) else float(row.amount),
             "hour": None if np.isnan(row.hour) else float(row.hour),
             "velocity": None if np.isnan(row.velocity) else float(row.velocity)}
        merchant, mcc = row.merchant, int(row.mcc)
        form = i % 8
        if form == 0:
            e["mcc"] = mcc
        elif form == 1:
            e["mcc"] = str(mcc)
        elif form == 2:
            e["mcc"] = float(mcc)
        elif form == 3:
            e["mcc"] = True
            ref.loc[ref.index[i], "mcc"] = 1
        elif form == 4:
            e["mcc"], merchant = None, None
        elif form == 5:
            e["mcc"] = mcc + 0.5
        elif form == 6:
            e["mcc"], merchant = mcc, "absent"
        else:
            e["mcc"] = mcc
        if form in (4, 5):
            ref.loc[ref.index[i], "mcc"] = 123456789  # unseen: the false side
        if merchant in (None, "absent"):
            ref.loc[ref.index[i], "merchant"] = "never-seen"
        if merchant != "absent":
            where = e
            for key in merchant_path[:-1]:
                where = where.setdefault(key, {})
            where[merchant_path[-1]] = merchant
        events.append(e)
    return events, ref


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "source-fields"])
def test_json_events_score_as_catboost(trained, nested):
    """JSON events as the worker reads them (JsonFormat, one event a message or an array of
    them, several messages gathered): every form of a categorical value hashed as CatBoost
    hashes it, against CatBoost's RawFormulaVal; the rows go to the kernels as an Arrow batch
    of strings (also what a shadow model reads: rows_by_name)."""
    from worker.formats.json import JsonFormat

    _, models = trained
    model = models["logloss-d6"]
    compiled = worker.compile_model(model)
    df = _frame(240, seed=11, unseen=True)
    path = ("card", "merchant") if nested else ("merchant",)
    events, ref = _json_events(df, path)
    # an absent merchant is a missing value where source.fields says it may be left out
    fmt = JsonFormat(compiled, "id", None, 1 << 26,
                     {"merchant": {"path": "card.merchant", "optional": True}} if nested
                     else {"merchant": {"optional": True}})
    values = [json.dumps(e).encode() for e in events[:40]]
    values += [json.dumps(events[k:k + 50]).encode() for k in range(40, 240, 50)]
    msgs = [fmt.decode(v) for v in values]
    g = fmt.gather(msgs)
    want = np.asarray(model.predict(ref, prediction_type="RawFormulaVal"),
                      dtype=np.float64).reshape(-1, 1)
    np.testing.assert_array_equal(compiled.raw(g.X), want)
    np.testing.assert_array_equal(compiled.score_batch(g.X).score,
                                  model.predict_proba(ref)[:, 1])
    np.testing.assert_array_equal(compiled.raw(fmt.rows_by_name(g, compiled.feature_names)),
                                  want)
    assert g.ids.tolist() == [f"t{i}" for i in range(240)] if g.ids is not None else \
        [v for own in g.own_ids for v in own.to_pylist()] == [f"t{i}" for i in range(240)]


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "source-fields"])
def test_avro_records_score_as_catboost(trained, nested, tmp_path):
    """Avro records as the worker reads them (AvroFormat, Confluent's wire format): a string,
    an enum symbol, an integer, an integer's string, a whole double, a boolean hashed as
    CatBoost hashes them; null and a fraction unseen; against CatBoost's RawFormulaVal."""
    import struct

    fastavro = pytest.importorskip("fastavro")
    from worker.formats.avro import AvroFormat

    _, models = trained
    model = models["logloss-d6"]
    compiled = worker.compile_model(model)
    df = _frame(120, seed=17, unseen=True)
    path = ("card", "merchant") if nested else ("merchant",)
    events, ref = _json_events(df, path)
    num = ["null", "double"]
    merchant = {"name": "merchant", "type": ["null", "string"]}
    schema = {"type": "record", "name": "Txn", "fields": [
        {"name": "id", "type": "string"}, {"name": "amount", "type": num},
        {"name": "hour", "type": num}, {"name": "velocity", "type": num},
        {"name": "mcc", "type": ["null", "boolean", "long", "string", "double"]},
        *([{"name": "card", "type": {"type": "record", "name": "Card",
                                     "fields": [merchant]}}] if nested else [merchant])]}
    enum_schema = json.loads(json.dumps(schema))
    symbols = ["grocer", "casino", "m_001", "m_002"]  # enum symbols are names: seen, unseen
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "1.avsc").write_text(json.dumps(schema))
    fmt = AvroFormat(compiled, "id", None, 1 << 20,
                     {"merchant": "card.merchant"} if nested else None,
                     schemas_dir=str(tmp_path / "schemas"))
    parsed = fastavro.parse_schema(schema)
    values = []
    for e in events:
        if nested:
            e.setdefault("card", {}).setdefault("merchant", None)
        else:
            e.setdefault("merchant", None)
        e.setdefault("mcc", None)
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, e)
        values.append(b"\0" + struct.pack(">I", 1) + buf.getvalue())
    g = fmt.gather([fmt.decode(v) for v in values])
    want = np.asarray(model.predict(ref, prediction_type="RawFormulaVal"),
                      dtype=np.float64).reshape(-1, 1)
    np.testing.assert_array_equal(compiled.raw(g.X), want)
    np.testing.assert_array_equal(compiled.raw(fmt.rows_by_name(g, compiled.feature_names)),
                                  want)
    # an enum of merchant names: its symbol is the value CatBoost hashes
    field = enum_schema["fields"][-1]
    target = field["type"]["fields"][0] if nested else field
    target["type"] = ["null", {"type": "enum", "name": "Merchant", "symbols": symbols}]
    (tmp_path / "schemas" / "2.avsc").write_text(json.dumps(enum_schema))
    parsed2 = fastavro.parse_schema(enum_schema)
    enum_df = df.copy()
    enum_df["merchant"] = [symbols[i % len(symbols)] for i in range(len(df))]
    events2, ref2 = _json_events(enum_df, path)
    values2 = []
    for e in events2:
        holder = e.setdefault("card", {}) if nested else e
        holder.setdefault("merchant", None)
        e.setdefault("mcc", None)
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed2, e)
        values2.append(b"\0" + struct.pack(">I", 2) + buf.getvalue())
    g2 = fmt.gather([fmt.decode(v) for v in values2])
    np.testing.assert_array_equal(
        compiled.raw(g2.X), np.asarray(model.predict(ref2, prediction_type="RawFormulaVal"),
                                       dtype=np.float64).reshape(-1, 1))


def test_hostile_json_and_avro_cost_a_hashed_model_what_they_cost_others(trained, tmp_path):
    """The categorical values' texts come from the C readers (json_rows.h, avro_rows.h), not
    from a second parse: fields nothing reads (2 MB of empty JSON arrays; an Avro array of
    2^20 items that take no bytes; 1 MB of Avro decimal bytes) make no Python object per
    value (peak Python memory under 8 MB). An Avro uuid-typed string is hashed as the
    string; a path through an Avro map is absent, for every feature alike; a whole number
    beyond int64 has no category from JSON, Avro or numpy."""
    import struct
    import tracemalloc

    fastavro = pytest.importorskip("fastavro")
    from worker.formats.avro import AvroFormat
    from worker.formats.json import JsonFormat

    _, models = trained
    model = models["logloss-d6"]
    compiled = worker.compile_model(model)
    fmt = JsonFormat(compiled, None, None, 1 << 26)
    row = {"amount": 0.5, "hour": 1.0, "velocity": 0.0, "merchant": "casino", "mcc": 7995}
    big = json.dumps({**row, "junk": [[]] * 600_000}).encode()
    tracemalloc.start()
    g = fmt.gather([fmt.decode(big)])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 << 20, peak
    ref = pd.DataFrame([row])[["amount", "merchant", "hour", "mcc", "velocity"]]
    want = np.asarray(model.predict(ref, prediction_type="RawFormulaVal")).reshape(-1, 1)
    np.testing.assert_array_equal(compiled.raw(g.X), want)

    schema = {"type": "record", "name": "T", "fields": [
        {"name": "amount", "type": "double"}, {"name": "hour", "type": "double"},
        {"name": "velocity", "type": "double"},
        {"name": "merchant", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "mcc", "type": ["null", "long", "double"]},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 4,
                                 "scale": 0}},
        {"name": "empty", "type": {"type": "array", "items": {"type": "record", "name": "E",
                                   "fields": [{"name": f"n{k}", "type": "null"}
                                              for k in range(50)]}}},
        {"name": "attrs", "type": {"type": "map", "values": "string"}}]}
    (tmp_path / "1.avsc").write_text(json.dumps(schema))
    avro = AvroFormat(compiled, None, None, 1 << 26, schemas_dir=str(tmp_path))
    mapped = AvroFormat(compiled, None, None, 1 << 26,
                        {"amount": {"path": "attrs.amount", "optional": True},
                         "merchant": {"path": "attrs.merchant", "optional": True}},
                        schemas_dir=str(tmp_path))
    required = AvroFormat(compiled, None, None, 1 << 26, {"amount": "attrs.amount"},
                          schemas_dir=str(tmp_path))

    plain = json.loads(json.dumps(schema))  # the same bytes, written without logical types
    for f in plain["fields"]:
        if isinstance(f["type"], dict) and "logicalType" in f["type"]:
            f["type"] = f["type"]["type"]
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(plain), {
        **row, "dec": b"\x01" * 1_000_000, "empty": [{}] * 1000,
        "attrs": {"merchant": "casino", "amount": "0.5"}})
    value = bytearray(b"\0" + struct.pack(">I", 1) + buf.getvalue())
    # the array's block count 1000 (varint 0xd0 0x0f) -> 2^20 (0x80 0x80 0x80 0x01): its
    # items take no bytes, so the count is all there is of them
    at = value.index(b"\xd0\x0f\x00", 5 + 24 + 7 + 3 + 3 + 1_000_000)
    value[at:at + 2] = b"\x80\x80\x80\x01"
    value = bytes(value)
    tracemalloc.start()
    g = avro.gather([avro.decode(value)])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 << 20, peak
    np.testing.assert_array_equal(compiled.raw(g.X), want)
    # through the map: a required feature's schema is refused; optional ones are absent
    # (C reader and texts alike)
    with pytest.raises(InvalidMessage, match="attrs is an Avro map") as e:
        required.decode(value)
    assert e.value.code == "schema_mismatch"
    g = mapped.gather([mapped.decode(value)])
    absent = ref.assign(amount=np.nan, merchant="never-seen")
    np.testing.assert_array_equal(compiled.raw(g.X), np.asarray(
        model.predict(absent, prediction_type="RawFormulaVal")).reshape(-1, 1))
    # a whole number beyond int64: no category from any input
    beyond = ref.assign(mcc=123456789)
    want_beyond = np.asarray(model.predict(beyond, prediction_type="RawFormulaVal")
                             ).reshape(-1, 1)
    g = fmt.gather([fmt.decode(json.dumps({**row, "mcc": 1e39}).encode())])
    np.testing.assert_array_equal(compiled.raw(g.X), want_beyond)
    objs = ref.to_numpy(dtype=object)
    objs[0, 3] = 1e39
    np.testing.assert_array_equal(compiled.raw(objs), want_beyond)


def test_ctr_splits_are_refused_by_name():
    df = _frame(1500, seed=3)
    model = catboost.CatBoostClassifier(iterations=10, depth=3, verbose=0, thread_count=1,
                                        allow_writing_files=False, one_hot_max_size=2,
                                        cat_features=["merchant", "mcc"]).fit(df, _label(df, 3))
    with pytest.raises(UnsupportedModelError, match="CTR .* one_hot_max_size"):
        worker.compile_model(model)


def test_a_hostile_hash_record_is_refused_by_name(trained, tmp_path):
    from worker.model import artifact

    _, models = trained
    compiled = worker.compile_model(models["logloss-d6"])
    for bad in ({"merchant": [1 << 32]}, {"merchant": [-1]}, {"merchant": list(range(1025))},
                {"merchant": [5, 5]}, {"nope": [1]}, {"merchant": ["a"]}, ["merchant"]):
        path = tmp_path / "m.model"
        path.write_bytes(artifact.dumps({**compiled.meta, "category_hashes": bad},
                                        compiled.arrays))
        with pytest.raises(worker.ArtifactError, match="meta.category_hashes"):
            worker.load_model(path)


def test_boolean_categories_are_catboosts_ones_and_zeros(tmp_path):
    """CatBoost reads a boolean category as the integer 1 or 0: so does the worker, from a
    pandas bool column, numpy booleans, Python bools and Arrow booleans."""
    df = _frame(2000, seed=11)
    df["flag"] = df.velocity > 0.3
    y = ((df.flag & (np.nan_to_num(df.amount) > 0)) | (df.mcc == 7995)).astype(int)
    model = catboost.CatBoostClassifier(iterations=20, depth=4, verbose=0, thread_count=1,
                                        random_seed=0, allow_writing_files=False,
                                        one_hot_max_size=255,
                                        cat_features=["merchant", "mcc", "flag"]).fit(df, y)
    compiled = worker.compile_model(model)
    assert "flag" in compiled.category_hashes
    test = _frame(200, seed=12)
    test["flag"] = test.velocity > 0.3
    want = np.asarray(model.predict(test, prediction_type="RawFormulaVal"),
                      dtype=np.float64).reshape(-1, 1)
    objs = test.to_numpy(dtype=object)
    np.testing.assert_array_equal(compiled.raw(objs), want)
    objs[:, 5] = [bool(v) for v in objs[:, 5]]
    np.testing.assert_array_equal(compiled.raw(objs), want)
    table = _arrow(test).append_column("flag", pa.array(test.flag.tolist(), pa.bool_()))
    np.testing.assert_array_equal(compiled.raw(table), want)


def test_a_categorical_feature_no_split_reads_compiles_and_is_read_as_categories():
    """A weak categorical feature may end with no one-hot split (its export lists no values):
    it stays categorical (strings are accepted, every value unseen)."""
    df = _frame(1500, seed=13)
    df["noise"] = np.random.default_rng(13).choice(["p", "q"], len(df))
    y = (np.nan_to_num(df.amount) > 0).astype(int)
    model = catboost.CatBoostClassifier(iterations=5, depth=2, verbose=0, thread_count=1,
                                        random_seed=0, allow_writing_files=False,
                                        one_hot_max_size=255,
                                        cat_features=["merchant", "mcc", "noise"]).fit(df, y)
    compiled = worker.compile_model(model)
    assert set(compiled.category_hashes) == {"merchant", "mcc", "noise"}
    test = _frame(100, seed=14)
    test["noise"] = np.random.default_rng(14).choice(["p", "q", "r"], len(test))
    want = np.asarray(model.predict(test, prediction_type="RawFormulaVal"),
                      dtype=np.float64).reshape(-1, 1)
    np.testing.assert_array_equal(compiled.raw(test.to_numpy(dtype=object)), want)
    table = _arrow(test).append_column("noise", pa.array(test.noise.tolist()).dictionary_encode())
    np.testing.assert_array_equal(compiled.raw(table), want)


@pytest.mark.parametrize("craft, message", [
    ("values", "more than 1024 one-hot values"),
    ("split_values", "more than 1024 one-hot values"),
    ("deep", "unfold to"),
])
def test_a_crafted_json_export_is_refused_before_it_costs_much(trained, craft, message,
                                                              tmp_path):
    """A few megabytes of JSON could ask for a million one-hot values, or trees that unfold
    to billions of nodes: refused before any tree is built."""
    import resource
    import time

    _, models = trained
    path = tmp_path / "m.json"
    models["logloss-d6"].save_model(str(path), format="json")
    d = json.loads(path.read_text())
    cat = d["features_info"]["categorical_features"][0]
    tree = d["oblivious_trees"][0]
    if craft == "values":
        cat["values"] = list(range(-(1 << 31), -(1 << 31) + 1_000_000))
    elif craft == "split_values":
        one_hot = {"split_type": "OneHotFeature", "cat_feature_index": cat["feature_index"]}
        d["oblivious_trees"] = [{"splits": [{**one_hot, "value": k}],
                                 "leaf_values": [0.0, 1.0]} for k in range(200_000)]
    else:
        d["oblivious_trees"] = [{**tree, "splits": tree["splits"] * 3,
                                 "leaf_values": [0.0]}] * 200  # 200 x 2^19 nodes
    path.write_text(json.dumps(d))
    t0 = time.monotonic()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(UnsupportedModelError, match=message):
        worker.compile_model(path)
    assert time.monotonic() - t0 < 60
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 1_500_000  # KB


def test_a_shadow_with_other_categories_reads_its_own_codes(trained):
    """Live and shadow CatBoost models whose splits name different categories (the shadow
    trained without some merchants): from JSON events the shadow scores the strings with its
    own hashes, not the live model's codes. A JSON stream whose rows keep only the live
    model's codes (string categories of another library) counts the shadow's batch as an
    error instead of scoring it wrongly."""
    from worker.config import load_settings
    from worker.io.records import Record
    from worker.pipeline import Pipeline

    df, models = trained
    live_model = models["logloss-d6"]
    sub = df[~df.merchant.isin(["grocer", "m-002"])]
    other = catboost.CatBoostClassifier(
        iterations=40, depth=5, verbose=0, random_seed=1, thread_count=1,
        allow_writing_files=False, one_hot_max_size=255,
        cat_features=["merchant", "mcc"]).fit(sub, _label(sub, 0))
    live, shadow = worker.compile_model(live_model), worker.compile_model(other)
    assert live.category_hashes["merchant"] != shadow.category_hashes["merchant"]
    settings = load_settings(
        None, scoring={"id_column": "id", "threads": 1}, model={"path": "unused"},
        source={"type": "file", "path": "x.arrows", "format": "json",
                "fields": {"merchant": {"optional": True}}},  # _json_events leaves some out
        sink={"type": "file", "path": "o.arrows", "format": "json"})
    events, ref = _json_events(_frame(64, seed=13, unseen=True))
    values = [json.dumps(e).encode() for e in events[:8]] + [json.dumps(events[8:]).encode()]
    recs = [Record("in", 0, k, None, v, 0, []) for k, v in enumerate(values)]
    pipe = Pipeline(live, settings, "scores")
    pipe.set_shadow(shadow, "shadow")
    outputs, dead, stats = pipe.process([(r, pipe.decode(r)) for r in recs])
    assert not dead and stats.shadow_errors == 0

    def scores(records):
        rows = []
        for r in records:
            doc = json.loads(r.value)
            rows += [doc] if isinstance(doc, dict) else doc
        return [row["score"] for row in rows]

    np.testing.assert_allclose(scores(o for o in outputs if o.topic == "scores"),
                               live_model.predict_proba(ref)[:, 1], rtol=1e-15, atol=0)
    np.testing.assert_allclose(scores(o for o in outputs if o.topic == "shadow"),
                               other.predict_proba(ref)[:, 1], rtol=1e-15, atol=0)


def test_a_shadow_whose_categories_the_rows_lost_counts_an_error_not_a_wrong_score():
    import lightgbm as lgb

    from worker.config import load_settings
    from worker.io.records import Record
    from worker.pipeline import Pipeline

    rng = np.random.default_rng(0)
    cats = ["a", "b", "c", "d"]

    def fit(keep):
        n = 800
        x = rng.normal(size=n)
        c = rng.choice(keep, n)
        y = ((c == keep[0]) ^ (x > 0)).astype(int)
        frame = pd.DataFrame({"x": x, "c": pd.Categorical(c, categories=keep)})
        return lgb.LGBMClassifier(n_estimators=5, num_leaves=4, min_child_samples=5,
                                  verbose=-1).fit(frame, y)

    live, shadow = worker.compile_model(fit(cats)), worker.compile_model(fit(cats[::-1]))
    assert live.categories["c"] != shadow.categories["c"]
    settings = load_settings(
        None, scoring={"id_column": "id", "threads": 1}, model={"path": "unused"},
        source={"type": "file", "path": "x.arrows", "format": "json"},
        sink={"type": "file", "path": "o.arrows", "format": "json"})
    recs = [Record("in", 0, k, None, json.dumps({"id": k, "x": 0.5, "c": "b"}).encode(), 0, [])
            for k in range(3)]
    pipe = Pipeline(live, settings, "scores")
    pipe.set_shadow(shadow, "shadow")
    outputs, dead, stats = pipe.process([(r, pipe.decode(r)) for r in recs])
    assert not dead and stats.shadow_errors == 1
    assert [o.topic for o in outputs] == ["scores"] * 3


def test_what_the_texts_cost_is_bounded_and_counted(tmp_path):
    """Review findings: the hashed texts count in a message's decoded size (a JSON message
    of a million empty events and three hashed features is too_large within a 32 MiB limit
    it fits without them); a hashed Avro enum's symbols are at most MAX_SYMBOL bytes (each
    message copies one); a record naming a field twice is refused (fastavro takes it); an
    AvroReader with hashed features needs the enum symbols."""
    from types import SimpleNamespace

    from worker import _eventread
    from worker.formats import InvalidMessage
    from worker.formats.avro import MAX_SYMBOL, AvroFormat
    from worker.formats.json import JsonFormat

    names = ["x", "a", "b", "c"]
    stub = SimpleNamespace(feature_names=names, categories={},
                           category_hashes={"a": [], "b": [], "c": []}, columns=lambda t: t)
    plain = SimpleNamespace(feature_names=names, categories={}, category_hashes={})
    value = b"[" + b",".join([b"{}"] * 1_000_000) + b"]"
    optional = {f: {"optional": True} for f in names}  # events of no fields
    # (64 MB: the 3 MB message within a sixteenth, its 24 MB of rows within the limit)
    assert JsonFormat(plain, None, None, 64 << 20, optional).decode(value).rows == 1_000_000
    with pytest.raises(InvalidMessage) as e:
        JsonFormat(stub, None, None, 64 << 20, optional).decode(value)
    assert e.value.code == "too_large"
    msg = JsonFormat(stub, None, None, 1 << 30, optional).decode(b'{"a": "casino"}')
    assert msg.nbytes >= 16 + len("casino") + 64 + 56 + 24

    def fmt(schema):
        d = tmp_path / f"s{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        (d / "1.avsc").write_text(json.dumps(schema))
        return AvroFormat(stub, None, None, 1 << 20, schemas_dir=str(d))

    def refused(f, why):
        with pytest.raises(InvalidMessage) as e:
            f.decode(b"\0\0\0\0\1" + b"\0")
        assert e.value.code == "bad_schema" and why in str(e.value), e.value

    long = {"type": "record", "name": "T", "fields": [
        {"name": "a", "type": {"type": "enum", "name": "E",
                               "symbols": ["s", "y" * (MAX_SYMBOL + 1)]}}]}
    refused(fmt(long), f"an enum symbol over {MAX_SYMBOL} bytes")
    twice = {"type": "record", "name": "T", "fields": [{"name": "a", "type": "string"},
                                                       {"name": "a", "type": "string"}]}
    refused(fmt(twice), "names a field twice")
    with pytest.raises(ValueError, match="enum symbols"):
        _eventread.AvroReader([[13, -1, 0, 1], [9, 1, 0, 2]], [1], [0.0, 1.0], [], 4,
                              1 << 20, None, [1])


def test_score_batch_with_a_monitor_hashes_once_and_counts_the_codes(trained, monkeypatch):
    """Hostile-review finding: with monitor= a CatBoost model's categories were hashed twice
    (once to score, once to count). Once now, and the counts are those of the codes the
    model scored; the scores are CatBoost's."""
    df, models = trained
    est = models["logloss-d6"]
    m = worker.compile_model(est).with_reference(_frame(400, seed=3))
    calls = []
    real = type(m._category_sets["merchant"]).codes_of_objects

    def counted(self, values):
        calls.append(len(values))
        return real(self, values)

    monkeypatch.setattr(type(m._category_sets["merchant"]), "codes_of_objects", counted)
    X = _frame(300, seed=4, unseen=True)
    c = m.monitor_counts()
    for i in range(0, 300, 100):
        r = m.score_batch(X.iloc[i:i + 100], monitor=c)
        np.testing.assert_allclose(r.score, est.predict_proba(X.iloc[i:i + 100])[:, 1],
                                   rtol=1e-6, atol=1e-7)
    assert len(calls) == 3 * 2  # a call a categorical column a batch: never again to count
    rows = m.hashed_rows(X)
    want = m.reference.new_counts()
    _monitor.count_bins(rows, m.reference.edges, m.reference.n_edges, m.reference.lo,
                        m.reference.hi, want)
    np.testing.assert_array_equal(c.counts, want)
    # the marked rows read as codes everywhere after: lazy stopping and its audit
    kw = dict(lazy="certified", audit_fraction=1.0)
    r1 = m.score_batch(X, monitor=m.monitor_counts(), **kw)
    r0 = m.score_batch(X, **kw)
    assert r1.audit_rows == 300 and r1.audit_disagreements == r0.audit_disagreements == 0
    np.testing.assert_array_equal(r1.score, r0.score)

