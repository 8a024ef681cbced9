"""Attributions (``CompiledModel.contributions``) against the libraries' own: XGBoost
``pred_contribs`` / ``approx_contribs`` and shap's TreeExplainer (path-dependent TreeSHAP;
``approximate=True`` is Saabas) for scikit-learn, on hostile rows (NaN, +-inf, zeros, values
on split thresholds). Each row's attributions plus its bias are its raw score."""

from __future__ import annotations

import numpy as np
import pytest

import worker
from tests import models as M

XGB = ["xgb-binary-logistic", "xgb-binary-logitraw", "xgb-reg-squarederror",
       "xgb-reg-logistic", "xgb-multi-softprob", "xgb-parallel-tree", "xgb-deep"]


def _tolerance(margin: np.ndarray) -> float:
    """1e-5 of the margin's scale (XGBoost explains in float32, we in float64)."""
    return 1e-5 * max(1.0, float(np.abs(margin).max()))


@pytest.mark.parametrize("name", XGB)
@pytest.mark.parametrize("method", ["treeshap", "path"])
def test_xgboost_contributions_are_xgboosts(name, method):
    import xgboost as xgb

    booster = M.xgboost_models()[name]
    model = worker.compile_model(booster)
    X = M.hostile_rows(400, M.xgboost_thresholds(booster), seed=1)
    ours = model.contributions(X, method, n_threads=2)
    ref = booster.predict(xgb.DMatrix(M.finite_for_library(X), feature_names=booster.feature_names),
                          pred_contribs=True, approx_contribs=method == "path")
    margin = model.raw(X)
    assert ours.shape == ref.shape
    tol = _tolerance(margin)
    np.testing.assert_allclose(ours, ref, atol=tol, rtol=0)
    total = ours.sum(axis=-1)
    np.testing.assert_allclose(total, margin[:, 0] if model.n_outputs == 1 else margin,
                               atol=tol, rtol=0)


def test_threads_and_batches_give_the_same_attributions():
    model = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    X = M.hostile_rows(300, M.xgboost_thresholds(M.xgboost_models()["xgb-binary-logistic"]), 2)
    one = model.contributions(X, n_threads=1)
    np.testing.assert_array_equal(model.contributions(X, n_threads=2), one)
    np.testing.assert_array_equal(model.contributions(X[7:8]), one[7:8])
    assert model.contributions(X[:0]).shape == (0, model.n_features + 1)


def test_arrow_input_is_read_like_numpy():
    import pyarrow as pa

    booster = M.xgboost_models()["xgb-reg-squarederror"]
    model = worker.compile_model(booster)
    X = M.hostile_rows(50, M.xgboost_thresholds(booster), seed=3)
    table = pa.table({n: pa.array(X[:, j], from_pandas=True)
                      for j, n in enumerate(model.feature_names)})
    np.testing.assert_array_equal(model.contributions(table), model.contributions(X))


def test_artifact_round_trip_keeps_the_covers(tmp_path):
    model = worker.compile_model(M.xgboost_models()["xgb-multi-softprob"])
    model.save(tmp_path / "m.model")
    again = worker.load_model(tmp_path / "m.model")
    X = M.hostile_rows(40, M.xgboost_thresholds(M.xgboost_models()["xgb-multi-softprob"]), 4)
    np.testing.assert_array_equal(again.contributions(X), model.contributions(X))


def test_an_artifact_without_covers_says_so(tmp_path):
    from worker.model.compiled import CompiledModel

    model = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    arrays = {k: v for k, v in model.arrays.items() if not k.startswith("x_")}
    bare = CompiledModel(model.meta, arrays)
    with pytest.raises(ValueError, match="no node covers"):
        bare.contributions(np.zeros((1, model.n_features), np.float32))
    with pytest.raises(ValueError, match="unknown attribution method"):
        model.contributions(np.zeros((1, model.n_features), np.float32), method="lime")


@pytest.mark.parametrize("lie", ["child_loop", "child_outside", "feature", "cover"])
def test_lying_explain_arrays_are_refused(lie):
    from worker.model.artifact import ArtifactError
    from worker.model.compiled import CompiledModel

    model = worker.compile_model(M.xgboost_models()["xgb-binary-logistic"])
    arrays = {k: v.copy() for k, v in model.arrays.items()}
    inner = int(np.flatnonzero(arrays["x_feature"] >= 0)[3])
    if lie == "child_loop":
        arrays["x_child"][inner, 0] = 0  # back to the root: a walk that never ends
    elif lie == "child_outside":
        arrays["x_child"][inner, 1] = 10**6
    elif lie == "feature":
        arrays["x_feature"][inner] = model.n_features
    else:
        arrays["x_cover"][inner] = 0.0
    with pytest.raises(ArtifactError):
        CompiledModel(model.meta, arrays)


SKLEARN = ["rf-binary", "rf-multi", "et-multi", "rf-reg", "et-reg", "gb-binary", "gb-reg",
           "hgb-binary", "hgb-reg"]


@pytest.mark.parametrize("name", SKLEARN)
@pytest.mark.parametrize("method", ["treeshap", "path"])
def test_sklearn_contributions_are_shaps(name, method):
    import shap
    est = M.sklearn_models()[name]
    model = worker.compile_model(est)
    X = M.hostile_rows(200, M.sklearn_thresholds(est), seed=5,
                       nan=name.startswith(("rf", "et")), inf=False)
    explainer = shap.TreeExplainer(est, feature_perturbation="tree_path_dependent")
    ref = np.asarray(explainer.shap_values(X.astype(np.float64), check_additivity=False,
                                           approximate=method == "path"))
    expected = np.atleast_1d(explainer.expected_value)
    ours = model.contributions(X, method, n_threads=1)
    if ours.ndim == 2:  # one output: shap gives (rows, features) or (rows, features, classes)
        ours = ours[:, None, :]
    if ref.ndim == 2:
        ref = ref[:, :, None]
    if ref.shape[-1] != ours.shape[1]:  # a binary forest: shap explains both classes
        ref, expected = ref[:, :, -ours.shape[1]:], expected[-ours.shape[1]:]
    ref = np.transpose(ref, (0, 2, 1))  # (rows, outputs, features)
    margin = model.raw(X)
    tol = _tolerance(margin)
    np.testing.assert_allclose(ours[:, :, :-1], ref, atol=tol, rtol=0)
    np.testing.assert_allclose(ours[0, :, -1], expected, atol=tol, rtol=0)
    np.testing.assert_allclose(ours.sum(axis=-1), margin, atol=tol, rtol=0)


@pytest.mark.parametrize("method", ["treeshap", "path"])
def test_multiclass_gradient_boosting_adds_up_to_its_decision_function(method):
    # shap does not explain multiclass GradientBoostingClassifier: the library's own margins
    est = M.sklearn_models()["gb-multi"]
    model = worker.compile_model(est)
    X = M.hostile_rows(200, M.sklearn_thresholds(est), seed=6, nan=False, inf=False)
    ours = model.contributions(X, method)
    ref = est.decision_function(X.astype(np.float64))
    assert ours.shape == (200, 3, model.n_features + 1)
    np.testing.assert_allclose(ours.sum(axis=-1), ref, atol=_tolerance(ref), rtol=0)


def test_score_batch_explains_the_flagged_rows_only():
    booster = M.xgboost_models()["xgb-binary-logistic"]
    model = worker.compile_model(booster)
    X = M.hostile_rows(500, M.xgboost_thresholds(booster), seed=8)
    r = model.score_batch(X, thresholds=[0.3, 0.7], explain="treeshap", top_k=3, n_threads=1)
    flagged = r.score >= 0.3
    assert 0 < flagged.sum() < 500
    assert np.all(r.reason_feature[~flagged] == -1) and np.all(np.isnan(r.reason_bias[~flagged]))
    phi = model.contributions(X[flagged], n_threads=1)
    top = np.argsort(-np.abs(phi[:, :-1]), axis=1, kind="stable")[:, :3]
    np.testing.assert_array_equal(r.reason_feature[flagged], top)
    np.testing.assert_array_equal(r.reason_value[flagged],
                                  np.take_along_axis(phi[:, :-1], top, 1).astype(np.float32))
    np.testing.assert_array_equal(r.reason_bias[flagged], phi[:, -1])
    # explain_min_score wins over the thresholds; a lazily stopped row is explained in full
    r2 = model.score_batch(X, thresholds=[0.3], lazy="certified", explain="path",
                           explain_min_score=0.9, n_threads=1)
    chosen = r2.score >= 0.9
    np.testing.assert_array_equal(r2.reason_feature[:, 0] >= 0, chosen)
    full = model.contributions(X[chosen], "path", n_threads=1)
    np.testing.assert_allclose(r2.reason_bias[chosen], full[:, -1])


@pytest.mark.parametrize("k", [1, 2, 3, 7, 8])
def test_top_reasons_orders_as_a_stable_argsort_of_the_absolute_values(k):
    # ties (small integers, +-v), zeros and NaN, written to the flagged rows only
    from worker import _explain

    rng = np.random.default_rng(k)
    phi = rng.integers(-3, 4, size=(300, 9)).astype(np.float64)
    phi[rng.random(phi.shape) < 0.1] = np.nan
    phi[::7, :-1] = 0.0
    rows = np.sort(rng.choice(1000, size=300, replace=False)).astype(np.int64)
    feat = np.full((1000, k), -1, dtype=np.int32)
    val = np.zeros((1000, k), dtype=np.float32)
    _explain.top_reasons(phi, rows, feat, val)
    key = np.where(np.isnan(phi[:, :-1]), -1.0, np.abs(phi[:, :-1]))
    top = np.argsort(-key, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(feat[rows], top)
    np.testing.assert_array_equal(val[rows], np.take_along_axis(phi[:, :-1], top, 1)
                                  .astype(np.float32))
    others = np.setdiff1d(np.arange(1000), rows)
    assert np.all(feat[others] == -1) and np.all(val[others] == 0)
    with pytest.raises(IndexError):
        _explain.top_reasons(phi[:1], np.array([1000], dtype=np.int64), feat, val)
    with pytest.raises(ValueError):
        _explain.top_reasons(phi, rows, feat, np.zeros((1000, k + 1), np.float32))
    none = np.zeros((1000, 0), np.int32)
    _explain.top_reasons(phi, rows, none, np.zeros((1000, 0), np.float32))  # top 0: nothing


def test_multiclass_rows_are_explained_for_their_label():
    booster = M.xgboost_models()["xgb-multi-softprob"]
    model = worker.compile_model(booster)
    X = M.hostile_rows(100, M.xgboost_thresholds(booster), seed=9)
    r = model.score_batch(X, thresholds=[0.0], explain="treeshap", top_k=2, n_threads=1)
    phi = model.contributions(X, n_threads=1)[np.arange(100), r.label]
    np.testing.assert_array_equal(r.reason_bias, phi[:, -1])
    np.testing.assert_array_equal(
        r.reason_value, np.take_along_axis(phi[:, :-1], r.reason_feature, 1).astype(np.float32))


def test_the_worker_publishes_reason_columns(tmp_path):
    import pyarrow as pa

    from worker import demo
    from worker.config import load_settings
    from worker.io.records import Record
    from worker.pipeline import Pipeline

    art = tmp_path / "demo.model"
    worker.compile_model(demo.train_xgboost(demo.generate(3000, seed=1), rounds=20)).save(art)
    model = worker.load_model(art)
    settings = load_settings(None, model={"path": str(art)},
                             source={"type": "file", "path": "x.arrows"},
                             scoring={"threads": 1, "thresholds": [0.5],
                                      "explain": {"method": "treeshap", "top_k": 2,
                                                  "min_score": 0.0}})
    pipe = Pipeline(model, settings, "scores")
    table = demo.generate(40, seed=2).select([demo.ID_COLUMN, *demo.FEATURES])
    recs = []
    for i in range(4):
        sink = pa.BufferOutputStream()
        part = table.slice(10 * i, 10)
        with pa.ipc.new_stream(sink, part.schema) as w:
            w.write_table(part)
        recs.append(Record("in", 0, i, b"k", sink.getvalue().to_pybytes(), 1, []))
    for rec in recs[:1]:
        pipe.process([(rec, pipe.decode(rec))])  # the schema cached: the rest read in C
    out, dead, stats = pipe.process([(r, pipe.decode(r)) for r in recs])
    assert not dead and len(out) == 4 and stats.explained == 40
    assert len(stats.top_reasons) == 5
    assert stats.top_reasons[0][0] == max(t[0] for t in stats.top_reasons)
    got = pa.concat_tables([pa.ipc.open_stream(o.value).read_all() for o in out])
    got.validate(full=True)
    X = np.column_stack([table.column(f).to_numpy(zero_copy_only=False).astype(np.float32)
                         for f in model.feature_names])  # the demo's features have no nulls
    phi = model.contributions(X, n_threads=1)
    top = np.argsort(-np.abs(phi[:, :-1]), axis=1, kind="stable")[:, :2]
    names = [[model.feature_names[j] for j in row] for row in top]
    assert got.column("reason_feature").to_pylist() == names
    np.testing.assert_array_equal(np.asarray(got.column("reason_value").to_pylist()),
                                  np.take_along_axis(phi[:, :-1], top, 1).astype(np.float32))
    np.testing.assert_allclose(got.column("reason_bias").to_numpy(), phi[:, -1])


def test_score_command_writes_reason_codes(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    import pyarrow as pa

    from worker.io.tables import write_table

    booster = M.xgboost_models()["xgb-binary-logistic"]
    model = worker.compile_model(booster)
    model.save(tmp_path / "m.model")
    X = M.hostile_rows(60, M.xgboost_thresholds(booster), seed=11)
    write_table(tmp_path / "in.arrow", pa.table({n: X[:, j] for j, n in
                                                  enumerate(model.feature_names)}))
    proc = subprocess.run([sys.executable, "-m", "worker.cli", "score", "--model",
                           str(tmp_path / "m.model"), "--input", str(tmp_path / "in.arrow"),
                           "--output", str(tmp_path / "out.arrow"), "--explain", "path",
                           "--top-k", "2", "--explain-min-score", "0"],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = pa.ipc.open_file(tmp_path / "out.arrow").read_all()
    phi = model.contributions(X, "path", n_threads=1)
    top = np.argsort(-np.abs(phi[:, :-1]), axis=1, kind="stable")[:, :2]
    assert out.column("reason_feature").to_pylist() == \
        [[model.feature_names[j] for j in row] for row in top]


def test_shallow_forest_with_vector_leaves_is_shaps():
    # depth 4: every tree takes the leaf tables, each leaf holding one value per class
    import shap
    from sklearn.ensemble import RandomForestClassifier

    X, _, y3, _ = M.training_data(seed=4, n=600)
    est = RandomForestClassifier(n_estimators=10, max_depth=4, random_state=0).fit(X, y3)
    model = worker.compile_model(est)
    rows = M.hostile_rows(150, M.sklearn_thresholds(est), seed=12, inf=False)
    ours = model.contributions(rows, n_threads=2)
    assert model._explainer.tabled == 10
    ref = np.asarray(shap.TreeExplainer(est, feature_perturbation="tree_path_dependent")
                     .shap_values(rows.astype(np.float64), check_additivity=False))
    np.testing.assert_allclose(ours[:, :, :-1], np.transpose(ref, (0, 2, 1)), atol=1e-9, rtol=0)
    np.testing.assert_allclose(ours.sum(axis=-1), model.raw(rows), atol=1e-9, rtol=0)


def test_the_run_counts_explained_rows(tmp_path):
    import pyarrow as pa

    from worker import demo
    from worker.config import load_settings
    from worker.io.files import FileSink, FileSource
    from worker.io.records import Record, read_records, write_records
    from worker.loop import Worker

    art = tmp_path / "demo.model"
    worker.compile_model(demo.train_xgboost(demo.generate(3000, seed=1), rounds=20)).save(art)
    table = demo.generate(300, seed=5).select([demo.ID_COLUMN, *demo.FEATURES])
    write_records(tmp_path / "in.arrows", [
        Record("in", 0, i, None, demo.arrow_stream(table.slice(30 * i, 30)), 1, [])
        for i in range(10)])
    settings = load_settings(None, model={"path": str(art)},
                             source={"type": "file", "path": str(tmp_path / "in.arrows")},
                             scoring={"threads": 1, "thresholds": [0.5],
                                      "explain": {"method": "path", "min_score": 0.5}})
    model = worker.load_model(art)
    w = Worker(settings, model, FileSource(tmp_path / "in.arrows"),
               FileSink(tmp_path / "o.arrows", tmp_path / "d.arrows"))
    assert w.run() == 0
    w.sink.close()
    X = np.column_stack([table.column(f).to_numpy(zero_copy_only=False) for f in
                         model.feature_names]).astype(np.float32)
    flagged = int((model.predict_proba(X)[:, 1] >= 0.5).sum())
    assert flagged > 0
    got = w.metrics.registry.get_sample_value("scoring_explained_rows_total")
    assert got == flagged == w.totals.explained
    first = next(read_records(tmp_path / "o.arrows"))
    assert pa.types.is_list(pa.ipc.open_stream(first.value).schema.field("reason_feature").type)


MODES = ["recursive", "table", "quadrature", "linear", "linear-rows"]


def _mode_counts(ex) -> dict:
    return {"table": ex.tabled, "quadrature": ex.quadrature, "linear": ex.linear}


@pytest.mark.parametrize("name", XGB)
@pytest.mark.parametrize("mode", MODES)
def test_each_treeshap_mode_is_xgboosts(name, mode):
    # every evaluation a tree can take, forced where the tree allows it, held to the library
    # (Algorithm 2 serves trees with more than 64 distinct features on a path; node by node
    # by quadrature the trees with one value per leaf, NR rows at a time or, on a tree with a
    # zero cover, a row at a time)
    import xgboost as xgb

    from worker import _explain

    booster = M.xgboost_models()[name]
    model = worker.compile_model(booster)
    ex = _explain.Explainer(model.arrays, model.n_features, model.n_outputs,
                            float(model.divisor), mode=mode)
    counts = _mode_counts(ex)
    if mode == "recursive":
        assert sum(counts.values()) == 0
    else:
        assert counts[mode.split("-")[0]] > 0, counts
    X = M.hostile_rows(203, M.xgboost_thresholds(booster), seed=13)  # blocks and a remainder
    full = ex.contributions(X, int(_explain.Method.METHOD_TREESHAP), 2)
    np.testing.assert_array_equal(ex.contributions(X[5:6], 0, 1)[0], full[5])  # a row alone
    ours = full[:, 0, :] if model.n_outputs == 1 else full
    ref = booster.predict(xgb.DMatrix(M.finite_for_library(X),
                                      feature_names=booster.feature_names), pred_contribs=True)
    np.testing.assert_allclose(ours, ref, atol=_tolerance(model.raw(X)), rtol=0)


def _has_avx512f() -> bool:
    from pathlib import Path

    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(line.startswith("flags") and " avx512f" in line for line in text.splitlines())


@pytest.mark.parametrize("name", ["xgb-deep", "xgb-multi-softprob", "xgb-parallel-tree"])
@pytest.mark.parametrize("isa", [0, 1])
def test_linear_walk_copies_are_xgboosts_and_one_bit_pattern_for_every_block_size(name, isa):
    # linear.h's walk has a copy per row count (1, 4, 8, 16 lanes; a block of nr rows takes
    # the smallest that holds it, its lanes past nr repeating row 0) and per instruction set
    # (baseline, AVX-512F): every row's attributions must be the same bits whichever copy and
    # block it went through, and XGBoost's. The rows' directions come from the block's rows
    # by feature (NaN: the default direction); several outputs flush each its own sums.
    import xgboost as xgb

    from worker import _explain

    if isa == 1 and not _has_avx512f():
        pytest.skip("this CPU has no AVX-512F: the AVX-512F copies cannot run here")
    booster = M.xgboost_models()[name]
    model = worker.compile_model(booster)
    args = (model.arrays, model.n_features, model.n_outputs, float(model.divisor))
    base = _explain.Explainer(*args, mode="linear", lin_isa=0)
    ex = _explain.Explainer(*args, mode="linear", lin_isa=isa)
    assert ex.lin_isa == isa and base.lin_isa == 0
    assert ex.linear == model.n_trees  # every tree node by node: no other sums in between
    X = M.hostile_rows(61, M.xgboost_thresholds(booster), seed=21)
    full = base.contributions(X, int(_explain.Method.METHOD_TREESHAP), 1)
    ref = booster.predict(xgb.DMatrix(M.finite_for_library(X),
                                      feature_names=booster.feature_names), pred_contribs=True)
    ours = full[:, 0, :] if model.n_outputs == 1 else full
    np.testing.assert_allclose(ours, ref, atol=_tolerance(model.raw(X)), rtol=0)
    r = 0
    for size in (1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 31):  # blocks of every copy, remainders
        got = ex.contributions(X[r:r + size], int(_explain.Method.METHOD_TREESHAP), 2)
        np.testing.assert_array_equal(got, full[r:r + size])
        r = (r + size) % 30


def test_linear_walk_takes_categorical_splits_like_xgboost():
    # a categorical split's direction comes from goes_right, not the block's compares
    import xgboost as xgb

    from tests.test_categorical import CAT, N_FEATURES, _xgb_categorical, hostile
    from worker import _explain

    est = _xgb_categorical(False)
    model = worker.compile_model(est)
    X = hostile(200, np.asarray([0.0]), seed=22)
    X = np.ascontiguousarray(np.where(np.isinf(X), np.float32(7.0), X), np.float32)
    dm = xgb.DMatrix(X, enable_categorical=True, feature_names=model.feature_names,
                     feature_types=["c" if j in CAT else "q" for j in range(N_FEATURES)])
    ref = est.get_booster().predict(dm, pred_contribs=True)
    for isa in (0, 1):
        ex = _explain.Explainer(model.arrays, model.n_features, model.n_outputs,
                                float(model.divisor), mode="linear", lin_isa=isa)
        assert ex.linear == model.n_trees
        ours = ex.contributions(X, int(_explain.Method.METHOD_TREESHAP), 1)[:, 0]
        assert np.abs(ours - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("name", SKLEARN)
@pytest.mark.parametrize("mode", ["linear", "linear-rows", "quadrature"])
def test_each_treeshap_mode_is_shaps(name, mode):
    import shap

    from worker import _explain

    est = M.sklearn_models()[name]
    model = worker.compile_model(est)
    ex = _explain.Explainer(model.arrays, model.n_features, model.n_outputs,
                            float(model.divisor), mode=mode)
    X = M.hostile_rows(75, M.sklearn_thresholds(est), seed=14,
                       nan=name.startswith(("rf", "et")), inf=False)
    ours = ex.contributions(X, int(_explain.Method.METHOD_TREESHAP), 1)
    ref = np.asarray(shap.TreeExplainer(est, feature_perturbation="tree_path_dependent")
                     .shap_values(X.astype(np.float64), check_additivity=False))
    if ref.ndim == 2:
        ref = ref[:, :, None]
    if ref.shape[-1] != ours.shape[1]:  # a binary forest: shap explains both classes
        ref = ref[:, :, -ours.shape[1]:]
    np.testing.assert_allclose(ours[:, :, :-1], np.transpose(ref, (0, 2, 1)),
                               atol=_tolerance(model.raw(X)), rtol=0)


@pytest.mark.parametrize("name", ["xgb-binary-logitraw", "xgb-multi-softprob",
                                  "xgb-parallel-tree", "xgb-reg-logistic",
                                  "xgb-binary-logistic", "xgb-reg-squarederror"])
@pytest.mark.parametrize("patterns, pext", [(True, None), (True, False), (5, None),
                                            (False, None)])
def test_pattern_tables_and_leaf_tables_are_xgboosts(name, patterns, pext):
    # trees of at most 8 splits take a table of their attributions for every pattern of
    # directions at their splits by default, larger trees one a group of leaves whose splits
    # and path come to at most 6 (pattern_rows; patterns=5: groups of at most 5 in every
    # tree); pext=False takes the portable bit gather instead of BMI2's. The leaf tables they
    # would take otherwise are held to XGBoost here too
    import xgboost as xgb

    from worker import _explain

    booster = M.xgboost_models()[name]
    model = worker.compile_model(booster)
    ex = _explain.Explainer(model.arrays, model.n_features, model.n_outputs,
                            float(model.divisor), mode="table", patterns=patterns, pext=pext)
    assert (ex.patterned > 0) == (patterns is not False) and ex.tabled > 0
    if patterns == 5 or patterns and "logitraw" not in name:  # depth 4 or 5 (logitraw: 3):
        assert ex.pattern_groups > ex.patterned  # trees cut into groups of leaves
    X = M.hostile_rows(150, M.xgboost_thresholds(booster), seed=21)
    Xf = np.ascontiguousarray(X, np.float32)
    ours = ex.contributions(Xf, 0, 2)
    ref = booster.predict(xgb.DMatrix(M.finite_for_library(X), feature_names=booster.feature_names),
                          pred_contribs=True)
    np.testing.assert_allclose(ours.reshape(ref.shape), ref, atol=_tolerance(model.raw(X)),
                               rtol=0)
    if patterns and ex.pext:  # the two gathers of a row's bits: the same sums, bit for bit
        loop = _explain.Explainer(model.arrays, model.n_features, model.n_outputs,
                                  float(model.divisor), mode="table", patterns=patterns,
                                  pext=False)
        assert not loop.pext and np.array_equal(loop.contributions(Xf, 0, 1), ours)


def test_cut_groups_leaves_and_leaves_a_shared_child_to_the_leaf_tables():
    # _cut on one tree of depth 2 (nodes 1 and 4 split on features 1 and 2): groups of at
    # most 2 splits are the subtrees of 1 and 4, each with the root above it. The fuzzer's
    # artifact with a child shared by two nodes (which passes structure.check) made _cut
    # raise where a tree's leaves are not consecutive; it now keeps such a tree on its leaf
    # tables
    from worker import _explain

    feature = np.array([0, 1, -1, -1, 2, -1, -1], np.int32)
    child = np.array([[1, 4], [2, 3], [0, 0], [0, 0], [5, 6], [0, 0], [0, 0]], np.int32)
    leaves = np.array([2, 3, 5, 6], np.int64)  # depth first, left first: _tables' leaf order
    groups = _explain._cut(0, 7, feature, child, 2, 2, leaves, 10)
    assert [(a, b, list(n), list(f)) for a, b, n, f in groups] == \
        [(10, 12, [0, 1], [0, 1]), (12, 14, [0, 4], [0, 2])]
    whole = _explain._cut(0, 7, feature, child, 2, 3, leaves, 10)
    assert [(a, b, list(n)) for a, b, n, _ in whole] == [(10, 14, [0, 1, 4])]
    assert _explain._cut(0, 7, feature, child, 1, 1, leaves, 10) is None  # leaves 2 deep
    shared = child.copy()
    shared[4] = [3, 6]  # node 3 below nodes 1 and 4
    assert _explain._cut(0, 7, feature, shared, 2, 2, leaves, 10) is None


@pytest.mark.parametrize("patterns", [4, 5])
def test_trees_on_pattern_tables_release_their_leaf_tables_and_the_others_keep_theirs(
        patterns):
    # 10 trees of depth 3, 10 of depth 6, 10 of depth 3: groups of at most 4 or 5 splits take
    # the 20 shallow ones; the deep ones in the middle keep their leaf tables, moved up in
    # the smaller array that is left
    import xgboost as xgb

    from worker import _explain

    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, M.N_FEATURES)).astype(np.float32)
    y = (X[:, 0] + X[:, 1] * X[:, 2] + 0.3 * rng.normal(size=2000) > 0).astype(int)
    data, booster = xgb.DMatrix(X, y), None
    for depth in (3, 6, 3):
        booster = xgb.train({"max_depth": depth, "objective": "binary:logistic", "eta": 0.3},
                            data, 10, xgb_model=booster)
    model = worker.compile_model(booster)
    args = (model.arrays, model.n_features, model.n_outputs, float(model.divisor))
    mixed = _explain.Explainer(*args, mode="table", patterns=patterns)
    leaf = _explain.Explainer(*args, mode="table", patterns=False)
    assert mixed.patterned == 20 and mixed.tabled == leaf.tabled == 30
    assert 8 < mixed.leaf_table_bytes < leaf.leaf_table_bytes
    rows = M.hostile_rows(200, M.xgboost_thresholds(booster), seed=23)
    ref = booster.predict(xgb.DMatrix(M.finite_for_library(rows)), pred_contribs=True)
    Xf = np.ascontiguousarray(rows, np.float32)
    for threads in (1, 2):
        np.testing.assert_allclose(mixed.contributions(Xf, 0, threads)[:, 0], ref,
                                   atol=_tolerance(model.raw(rows)), rtol=0)
    np.testing.assert_allclose(mixed.contributions(Xf, 0, 1), leaf.contributions(Xf, 0, 1),
                               atol=1e-12, rtol=0)


def test_pattern_tables_of_trees_of_64_splits_and_more_are_xgboosts():
    # 64 splits or more do not fit pattern.h's 64-bit directions: pattern_rows' loop takes
    # them (5 features, so each leaf's path has at most 5 distinct ones: leaf tables)
    import xgboost as xgb

    from worker import _explain

    rng = np.random.default_rng(31)
    X = rng.normal(size=(3000, 5)).astype(np.float32)
    y = (np.sin(3 * X[:, 0]) + X[:, 1] * X[:, 2] - X[:, 3] ** 2 + 0.3 * X[:, 4] > 0)
    booster = xgb.train({"objective": "binary:logistic", "max_depth": 7, "min_child_weight": 0,
                         "eta": 0.3, "nthread": 1}, xgb.DMatrix(X, label=y), 4)
    splits = [d.count("[f") for d in booster.get_dump()]
    assert max(splits) >= 64
    model = worker.compile_model(booster)
    ex = _explain.Explainer(model.arrays, model.n_features, model.n_outputs,
                            float(model.divisor), mode="table", patterns=7)
    assert ex.patterned == model.n_trees and ex.pattern_groups > ex.patterned
    Xh = np.ascontiguousarray(M.hostile_rows(200, M.xgboost_thresholds(booster), seed=32)[:, :5])
    ours = ex.contributions(np.ascontiguousarray(Xh, np.float32), 0, 1)
    ref = booster.predict(xgb.DMatrix(M.finite_for_library(Xh)), pred_contribs=True)
    np.testing.assert_allclose(ours.reshape(ref.shape), ref, atol=_tolerance(model.raw(Xh)),
                               rtol=0)


@pytest.mark.parametrize("name", ["gb-binary", "gb-exponential", "gb-reg"])  # shap: no multi GB
@pytest.mark.parametrize("patterns", [True, False, 4])
def test_pattern_tables_and_leaf_tables_are_shaps(name, patterns):
    import shap

    from worker import _explain

    est = M.sklearn_models()[name]
    model = worker.compile_model(est)
    ex = _explain.Explainer(model.arrays, model.n_features, model.n_outputs,
                            float(model.divisor), patterns=patterns)
    if patterns is True:  # depth 3: a table a tree; depth 4 (gb-reg): groups of leaves
        assert ex.patterned == ex.tabled == model.n_trees
        assert (ex.pattern_groups > ex.patterned) == (name == "gb-reg")
    elif patterns:  # groups of at most 4: 2 a depth-3 tree, 8 a depth-4 one (pairs of leaves)
        assert ex.pattern_groups > ex.patterned == model.n_trees
    else:
        assert ex.patterned == 0
    X = M.hostile_rows(75, M.sklearn_thresholds(est), seed=22, nan=False, inf=False)
    ours = ex.contributions(np.ascontiguousarray(X, np.float32), 0, 1)
    ref = np.asarray(shap.TreeExplainer(est, feature_perturbation="tree_path_dependent")
                     .shap_values(X.astype(np.float64), check_additivity=False))
    if ref.ndim == 2:
        ref = ref[:, :, None]
    np.testing.assert_allclose(ours[:, :, :-1], np.transpose(ref, (0, 2, 1)),
                               atol=_tolerance(model.raw(X)), rtol=0)


@pytest.mark.parametrize("name", ["xgb-binary-logistic", "xgb-multi-softprob", "xgb-deep"])
def test_prefetching_the_next_trees_tables_keeps_xgboosts_answers(name):
    # models whose leaf tables outgrow L2 (PF_TABLE_BYTES) have each row of a block prefetch a
    # share of the next tree's tables: forced on and off here, and xgb-deep's take it anyway
    import xgboost as xgb

    from worker import _explain

    booster = M.xgboost_models()[name]
    model = worker.compile_model(booster)
    X = M.hostile_rows(203, M.xgboost_thresholds(booster), seed=5)  # a short last block
    ref = booster.predict(xgb.DMatrix(M.finite_for_library(X), feature_names=booster.feature_names),
                          pred_contribs=True)
    for prefetch in (True, False):
        ex = _explain.Explainer(model.arrays, model.n_features, model.n_outputs,
                                float(model.divisor), prefetch=prefetch)
        assert ex.prefetch_tables == prefetch and ex.tabled > 0
        ours = ex.contributions(np.ascontiguousarray(X, np.float32), 0, 2)  # treeshap, 2 threads
        np.testing.assert_allclose(ours.reshape(ref.shape), ref,
                                   atol=_tolerance(model.raw(X)), rtol=0)
    default = _explain.Explainer(model.arrays, model.n_features, model.n_outputs,
                                 float(model.divisor))
    assert default.prefetch_tables == (name == "xgb-deep")


def test_the_default_takes_tables_for_shallow_trees_and_linear_for_deeper_ones():
    model = worker.compile_model(M.xgboost_models()["xgb-deep"])
    X = M.hostile_rows(20, M.xgboost_thresholds(M.xgboost_models()["xgb-deep"]), seed=15)
    model.contributions(X[:1])
    ex = model._explainer
    assert ex.tabled > 0 and ex.linear > 0 and ex.tabled + ex.linear == model.n_trees
    with pytest.raises(ValueError, match="unknown TreeSHAP mode"):
        from worker import _explain
        _explain.Explainer(model.arrays, model.n_features, model.n_outputs, 1.0, mode="fast")
