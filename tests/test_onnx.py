"""ONNX tree ensembles: the exporters' files (skl2onnx, onnxmltools) and hand-built nodes for
the modes they do not write, compiled and compared with ONNX Runtime on hostile rows: margins
bit for bit, probabilities within ONNX Runtime's own float32 rounding of its transforms."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import worker
from tests import models as M
from worker.model.ir import UnsupportedModelError

onnx = pytest.importorskip("onnx", reason="pip install onnx (the test extras)")
ort = pytest.importorskip("onnxruntime", reason="pip install onnxruntime (the test extras)")
from onnx import TensorProto, helper  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
F = M.N_FEATURES
# kernel block and task edges (one row, a block of 64 and its neighbours, several tasks)
SIZES = (1, 7, 63, 64, 65, 161, 322, 1000)


def _training(seed=0, n=1500):
    X, y2 = M.training_data(seed=seed, n=n)[:2]
    X = np.asarray(X, dtype=np.float32)  # float inputs, as exported for the worker's rows
    rng = np.random.default_rng(seed)
    y3 = rng.integers(0, 3, size=n)
    y3[np.nan_to_num(X[:, 0]) > 0.5] = 2
    return X, np.asarray(y2), y3


def _exports():
    """name -> ONNX model, as each exporter writes it (probabilities as tensors, no ZipMap)."""
    warnings.filterwarnings("ignore")
    import lightgbm as lgb
    import xgboost as xgb
    from onnxmltools import convert_lightgbm, convert_xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType
    from skl2onnx import to_onnx
    from sklearn.ensemble import (
        ExtraTreesRegressor,
        GradientBoostingClassifier,
        GradientBoostingRegressor,
        RandomForestClassifier,
        RandomForestRegressor,
    )

    X, y2, y3 = _training()
    Xf = np.nan_to_num(X)  # scikit-learn's forests here are fitted without NaN
    t = [("input", FloatTensorType([None, F]))]
    sk = {"zipmap": False}
    return {
        "sklearn-rf-binary": to_onnx(RandomForestClassifier(n_estimators=25, max_depth=8,
                                                            random_state=0).fit(Xf, y2),
                                     Xf[:1], options=sk),
        "sklearn-rf-multiclass": to_onnx(RandomForestClassifier(
            n_estimators=25, max_depth=8, random_state=0).fit(Xf, y3), Xf[:1], options=sk),
        "sklearn-rf-regression": to_onnx(RandomForestRegressor(
            n_estimators=20, max_depth=8, random_state=0).fit(Xf, Xf[:, 1]), Xf[:1]),
        "sklearn-et-regression": to_onnx(ExtraTreesRegressor(
            n_estimators=20, max_depth=8, random_state=0).fit(Xf, Xf[:, 1]), Xf[:1]),
        "sklearn-gb-regression": to_onnx(GradientBoostingRegressor(
            n_estimators=40, max_depth=3, random_state=0).fit(Xf, Xf[:, 1]), Xf[:1]),
        "sklearn-gb-binary": to_onnx(GradientBoostingClassifier(
            n_estimators=40, max_depth=3, random_state=0).fit(Xf, y2), Xf[:1], options=sk),
        "lightgbm-binary": convert_lightgbm(lgb.LGBMClassifier(
            n_estimators=60, num_leaves=31, verbose=-1).fit(X, y2), initial_types=t,
            zipmap=False),
        "lightgbm-multiclass": convert_lightgbm(lgb.LGBMClassifier(
            n_estimators=30, num_leaves=15, verbose=-1).fit(X, y3), initial_types=t,
            zipmap=False),
        "lightgbm-regression": convert_lightgbm(lgb.LGBMRegressor(
            n_estimators=60, num_leaves=31, verbose=-1).fit(X, Xf[:, 1]), initial_types=t),
        "xgboost-binary": convert_xgboost(xgb.XGBClassifier(
            n_estimators=60, max_depth=5).fit(X, y2), initial_types=t),
        "xgboost-multiclass": convert_xgboost(xgb.XGBClassifier(
            n_estimators=30, max_depth=4).fit(X, y3), initial_types=t),
        "xgboost-regression": convert_xgboost(xgb.XGBRegressor(
            n_estimators=60, max_depth=5).fit(X, Xf[:, 1]), initial_types=t),
    }


@pytest.fixture(scope="module")
def exports():
    return _exports()


def _thresholds(model) -> np.ndarray:
    from worker.model.onnx_loader import _attrs, tree_node

    a = _attrs(tree_node(model))
    t = np.asarray(a["nodes_values"], dtype=np.float32)
    return np.unique(np.concatenate([t, np.nextafter(t, np.float32(np.inf)),
                                     np.nextafter(t, np.float32(-np.inf))]))


def _ort_full(model, X: np.ndarray) -> np.ndarray:
    """The whole exported graph in ONNX Runtime (one thread): probabilities or values."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    outs = sess.run(None, {inp.name: X.astype(np.float64) if inp.type == "tensor(double)"
                           else X})
    got = outs[-1] if len(outs) > 1 else outs[0]
    return np.asarray(got, dtype=np.float64).reshape(X.shape[0], -1)


EXPORTS = ["sklearn-rf-binary", "sklearn-rf-multiclass", "sklearn-rf-regression",
           "sklearn-et-regression", "sklearn-gb-regression", "sklearn-gb-binary",
           "lightgbm-binary", "lightgbm-multiclass", "lightgbm-regression", "xgboost-binary",
           "xgboost-multiclass", "xgboost-regression"]


@pytest.mark.parametrize("name", EXPORTS)
def test_exported_models_match_onnx_runtime_on_hostile_rows(exports, name, tmp_path):
    from worker.model import onnx_loader

    assert sorted(exports) == sorted(EXPORTS)
    model = exports[name]
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(model.SerializeToString())
    compiled = worker.compile_model(path)  # from the file, as `compile` reads it
    thresholds = _thresholds(model)
    for seed, n in enumerate(SIZES):
        X = M.hostile_rows(n, thresholds, seed=seed)
        # the margins: ONNX Runtime's float32 sums, bit for bit
        ref_raw = onnx_loader.reference(model, X, raw=True)
        ours_raw = compiled.raw(X, n_threads=2)
        # (its outputs are float32: a double model's sums are compared as it rounds them)
        np.testing.assert_array_equal(ours_raw.astype(np.float32), ref_raw.astype(np.float32),
                                      err_msg=f"{name}: margins, {n} rows")
        # what the user's graph returns (ONNX Runtime rounds its logistic/softmax in float32)
        full = _ort_full(model, X)
        ours = compiled.predict_proba(X, n_threads=2) if compiled.task != "regression" \
            else compiled.predict(X, n_threads=2).reshape(-1, 1)
        np.testing.assert_allclose(ours, full, rtol=0, atol=3e-7,
                                   err_msg=f"{name}: outputs, {n} rows")
    # the artifact scores the same after a save and load
    compiled.save(tmp_path / "m.model")
    again = worker.load_model(tmp_path / "m.model")
    X = M.hostile_rows(300, thresholds, seed=99)
    np.testing.assert_array_equal(again.raw(X), compiled.raw(X))


# ---- hand-built nodes: the modes and options no exporter above writes ----

def _node_model(modes, tracks, values, aggregate="SUM", post="NONE", base=None,
                classifier=False, n_classes=2, weights_by_class=None, double=False):
    """Two trees over features 0 and 1: tree 0 splits ``modes[0]`` at ``values[0]`` then its
    true child splits ``modes[1]`` at ``values[1]``; tree 1 splits ``modes[2]`` on feature 1."""
    nodes = dict(treeids=[0, 0, 0, 0, 0, 1, 1, 1], nodeids=[0, 1, 2, 3, 4, 0, 1, 2],
                 featureids=[0, 1, 0, 0, 0, 1, 0, 0],
                 modes=[modes[0], modes[1], "LEAF", "LEAF", "LEAF", modes[2], "LEAF", "LEAF"],
                 values=[values[0], values[1], 0, 0, 0, values[2], 0, 0],
                 truenodeids=[1, 3, 0, 0, 0, 1, 0, 0], falsenodeids=[2, 4, 0, 0, 0, 2, 0, 0],
                 missing_value_tracks_true=[tracks[0], tracks[1], 0, 0, 0, tracks[2], 0, 0])
    leaves = [(0, 2, 0.25), (0, 3, -1.5), (0, 4, 3.0), (1, 1, 0.125), (1, 2, -0.75)]
    attrs = {f"nodes_{k}": v for k, v in nodes.items()}
    if not classifier:  # a classifier always sums
        attrs["aggregate_function"] = aggregate
    attrs["post_transform"] = post
    if base is not None:
        attrs["base_values"] = base
    prefix = "class" if classifier else "target"
    ids = []
    rows = []
    for t, nd, w in leaves:
        for c in (weights_by_class or [0]):
            rows.append((t, nd, c, w * (1 + c)))
            ids.append(c)
    attrs[f"{prefix}_treeids"] = [r[0] for r in rows]
    attrs[f"{prefix}_nodeids"] = [r[1] for r in rows]
    attrs[f"{prefix}_ids"] = [r[2] for r in rows]
    attrs[f"{prefix}_weights"] = [r[3] for r in rows]
    x = helper.make_tensor_value_info("X", TensorProto.DOUBLE if double else TensorProto.FLOAT,
                                      [None, 2])
    if double:  # thresholds and weights as double tensors (opset 3)
        for key in ("nodes_values", "target_weights", "base_values"):
            if key in attrs:
                attrs[f"{key}_as_tensor"] = helper.make_tensor(
                    key, TensorProto.DOUBLE, [len(attrs[key])], attrs.pop(key))
    if classifier:
        attrs["classlabels_int64s"] = list(range(n_classes))
        op = "TreeEnsembleClassifier"
        outs = [helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
                helper.make_tensor_value_info("p", TensorProto.FLOAT, [None, n_classes])]
    else:
        attrs["n_targets"] = 1
        op = "TreeEnsembleRegressor"
        outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])]
    node = helper.make_node(op, ["X"], [o.name for o in outs], domain="ai.onnx.ml",
                            name="forest", **attrs)
    graph = helper.make_graph([node], "g", [x], outs)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 3),
                                                helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _hostile_2(values) -> np.ndarray:
    t = np.asarray(values, dtype=np.float32)
    t = t[np.isfinite(t)]
    with np.errstate(over="ignore"):  # FLT_MAX steps to inf
        near = np.concatenate([t, np.nextafter(t, np.float32(np.inf)),
                               np.nextafter(t, np.float32(-np.inf))])
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype=np.float32)
    grid = np.concatenate([near, specials])
    a, b = np.meshgrid(grid, grid)
    return np.stack([a.ravel(), b.ravel()], axis=1).astype(np.float32)


MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]


@pytest.mark.parametrize("modes", [(a, b, c) for a, b, c in zip(MODES, MODES[1:] + MODES[:1],
                                                                  MODES[2:] + MODES[:2],
                                                                  strict=True)]
                         + [("BRANCH_EQ", "BRANCH_EQ", "BRANCH_NEQ")])
@pytest.mark.parametrize("tracks", [(0, 0, 0), (1, 0, 1), (1, 1, 1)])
def test_every_branch_mode_and_missing_track_matches_onnx_runtime(modes, tracks):
    from worker.model import onnx_loader

    values = [0.5, -1.25, 1e-3]
    m = _node_model(modes, tracks, values, base=[0.0625])
    compiled = worker.compile_model(m)
    X = _hostile_2(values)
    np.testing.assert_array_equal(compiled.raw(X, n_threads=1).astype(np.float32),
                                  onnx_loader.reference(m, X).astype(np.float32))


@pytest.mark.parametrize("options", [
    dict(aggregate="AVERAGE"),
    dict(aggregate="SUM", double=True, base=[0.1]),
    dict(aggregate="SUM", post="LOGISTIC", classifier=True, base=[-0.5]),
    dict(aggregate="SUM", post="SOFTMAX", classifier=True, n_classes=3,
         weights_by_class=[0, 1, 2], base=[0.1, -0.2, 0.3]),
    dict(aggregate="SUM", post="NONE", classifier=True, n_classes=3,
         weights_by_class=[0, 1, 2]),
    dict(aggregate="SUM", post="NONE", classifier=True, base=[0.25]),
], ids=["average", "double", "binary-logistic", "multiclass-softmax", "multiclass-probabilities",
        "binary-probabilities"])
def test_aggregations_transforms_and_base_values_match_onnx_runtime(options):
    from worker.model import onnx_loader

    values = [0.5, -1.25, 1e-3]
    m = _node_model(("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GT"), (0, 1, 0), values, **options)
    if options.get("classifier") and options.get("post", "NONE") == "NONE":
        # probabilities: positive leaf weights
        for a in m.graph.node[0].attribute:
            if a.name == "class_weights":
                a.floats[:] = [abs(w) for w in a.floats]
    # a double model with a threshold between float32s (1e-3): scored for float32 inputs
    compiled = worker.compile_model(m, float32_inputs=options.get("double", False))
    X = _hostile_2(values)
    ours = compiled.predict_proba(X, n_threads=1) if compiled.task != "regression" \
        else compiled.predict(X, n_threads=1).reshape(-1, 1)
    ref = onnx_loader.reference(m, X)
    tol = 3e-7 if options.get("post", "NONE") != "NONE" or options["aggregate"] == "AVERAGE" \
        or options.get("classifier") else 0
    if tol == 0:  # ONNX Runtime's outputs are float32: a double model's sums as it rounds them
        np.testing.assert_array_equal(ours.astype(np.float32), ref.astype(np.float32))
    else:
        np.testing.assert_allclose(ours, ref, rtol=0, atol=tol)


def _aggregated(model, agg: str):
    """``model`` (a one-target TreeEnsembleRegressor) with its aggregate_function set."""
    m = type(model)()
    m.CopyFrom(model)
    node = next(n for n in m.graph.node if n.op_type == "TreeEnsembleRegressor")
    for a in list(node.attribute):
        if a.name == "aggregate_function":
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute("aggregate_function", agg))
    return m


def _stumps_regression():
    import xgboost as xgb
    from onnxmltools import convert_xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType

    X = _training(seed=5)[0]
    return convert_xgboost(xgb.XGBRegressor(n_estimators=40, max_depth=1).fit(
        X, np.nan_to_num(X[:, 2])), initial_types=[("input", FloatTensorType([None, F]))])


@pytest.mark.parametrize("agg", ["MIN", "MAX"])
def test_min_and_max_aggregation_match_onnx_runtime_in_every_kernel(exports, agg, tmp_path):
    """aggregate_function MIN / MAX (no exporter writes them: the exporters' regressors with
    the attribute changed): the trees' smallest (largest) leaf plus the base, as ONNX Runtime
    keeps it, bit for bit in every layout and kernel, one row to several threads' tasks, from
    the file and after a save and load. Lazy policies, attributions and the oblivious kernel
    refuse it by name."""
    from worker.model import onnx_loader

    ran = set()
    for name in ("sklearn-rf-regression", "sklearn-gb-regression", "lightgbm-regression",
                 "xgboost-regression", "stumps"):
        model = _aggregated(exports[name] if name != "stumps" else _stumps_regression(), agg)
        path = tmp_path / f"{name}.onnx"
        path.write_bytes(model.SerializeToString())
        thresholds = _thresholds(model)
        for layout, kernel in (("auto", "auto"), ("padded", "walk"), ("compact", "walk"),
                               ("padded", "quickscorer"), ("compact", "quickscorer")):
            try:
                compiled = worker.compile_model(path, layout=layout, kernel=kernel)
            except ValueError as exc:  # QuickScorer: at most 64 leaves a tree
                assert kernel == "quickscorer" and "quickscorer" in str(exc), exc
                continue
            assert compiled.aggregate == agg.lower()
            ran.add((compiled.layout, compiled.kernel))
            for seed, n in enumerate(SIZES):
                X = M.hostile_rows(n, thresholds, seed=seed)
                ref = onnx_loader.reference(model, X).reshape(-1).astype(np.float32)
                np.testing.assert_array_equal(
                    compiled.predict(X, n_threads=2).astype(np.float32), ref,
                    err_msg=f"{name} {agg} {layout} {kernel}, {n} rows")
        ref_sum = onnx_loader.reference(exports[name] if name != "stumps"
                                        else _stumps_regression(), X).reshape(-1)
        assert not np.array_equal(ref_sum.astype(np.float32), ref), \
            f"{name}: {agg} gives the same scores as the sum (the test would not tell)"
        compiled.save(tmp_path / "m.model")
        again = worker.load_model(tmp_path / "m.model")
        assert again.aggregate == agg.lower()
        np.testing.assert_array_equal(again.raw(X), compiled.raw(X))
        with pytest.raises(ValueError, match=f"aggregate {agg.lower()}"):
            compiled.score_batch(X, lazy="certified")
        with pytest.raises(ValueError, match=f"aggregate {agg.lower()}"):
            compiled.contributions(X[:3])
        if name == "stumps":  # depth 1: otherwise an oblivious model
            assert compiled.kernel != "oblivious"
            with pytest.raises(ValueError, match=f"kernel oblivious: aggregate {agg.lower()}"):
                worker.compile_model(path, layout="padded", kernel="oblivious")
    # (QuickScorer takes padded models with categorical splits only)
    assert {("padded", "walk"), ("compact", "walk"), ("compact", "quickscorer")} <= ran


@pytest.mark.parametrize("agg", ["MIN", "MAX"])
@pytest.mark.parametrize("double", [False, True])
def test_min_and_max_with_base_values_and_double_attributes_match_onnx_runtime(agg, double):
    """A base value is added after the smallest (largest) leaf, in the sum's precision
    (float32 for a float input, double for a double one); equality splits unfold subtrees."""
    from worker.model import onnx_loader

    values = [0.5, -1.25, 1e-3]
    for base in (None, [0.1]):
        m = _node_model(("BRANCH_LEQ", "BRANCH_EQ", "BRANCH_GT"), (0, 1, 0), values,
                        aggregate=agg, base=base, double=double)
        compiled = worker.compile_model(m, float32_inputs=double)
        X = _hostile_2(values)
        ref = onnx_loader.reference(m, X).reshape(-1)
        np.testing.assert_array_equal(compiled.predict(X, n_threads=1).astype(np.float32),
                                      ref.astype(np.float32))
        assert len(np.unique(ref)) >= 3


@pytest.mark.parametrize("agg,weights,base", [
    ("MIN", (-0.0, 0.0), -0.0), ("MIN", (1.0, -0.0), -0.0), ("MAX", (-0.0, -1.0), -0.0),
    ("MAX", (np.inf, 1.0), 0.0), ("MIN", (-np.inf, 1.0), 0.5), ("MIN", (1.0, 2.0), np.inf),
], ids=["min-zeros", "min-neg-zero", "max-neg-zero", "max-inf", "min-minus-inf", "base-inf"])
def test_min_and_max_keep_a_leafs_sign_and_infinities_as_onnx_runtime(agg, weights, base):
    """A -0.0 leaf is kept as it is (the smallest of 0.0 and -0.0 is the first met, as ONNX
    Runtime's one thread keeps it), and infinite scores compile (compile's check reads equal
    infinities as equal): bit for bit against ONNX Runtime."""
    from worker.model import onnx_loader

    m = _node_model(("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GT"), (0, 0, 0), [0.5, -1.25, 1e-3],
                    aggregate=agg, base=[base])
    a = {x.name: x for x in m.graph.node[0].attribute}
    # tree 0's leaves 2, 3, 4 and tree 1's leaves 1, 2: the two values, alternated
    a["target_weights"].floats[:] = [weights[0], weights[1], weights[0], weights[1],
                                     weights[0]]
    compiled = worker.compile_model(m)
    X = _hostile_2([0.5, -1.25, 1e-3])
    ours = compiled.predict(X, n_threads=1).astype(np.float32)
    ref = onnx_loader.reference(m, X).reshape(-1).astype(np.float32)
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("change,message", [
    ("none", "leaf 2 has 0 weights"),
    ("two", "leaf 2 has 2 weights"),
    ("nan", "leaf 2 has a NaN weight"),
    ("classifier", "aggregate_function MIN on a classifier"),
])
def test_min_and_max_refuse_what_onnx_runtime_reads_by_path(change, message):
    m = _node_model(["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GT"], (0, 0, 0), [0.5, -1.25, 1e-3],
                    aggregate="MIN")
    node = m.graph.node[0]
    a = {x.name: x for x in node.attribute}
    if change == "none":  # tree 0's leaf 2 loses its weight
        for key in ("target_treeids", "target_nodeids", "target_ids"):
            del a[key].ints[0]
        del a["target_weights"].floats[0]
    elif change == "two":
        for key, v in (("target_treeids", 0), ("target_nodeids", 2), ("target_ids", 0)):
            a[key].ints.append(v)
        a["target_weights"].floats.append(0.5)
    elif change == "nan":
        a["target_weights"].floats[0] = float("nan")
    else:
        m = _node_model(["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GT"], (0, 0, 0),
                        [0.5, -1.25, 1e-3], classifier=True, post="LOGISTIC")
        m.graph.node[0].attribute.append(helper.make_attribute("aggregate_function", "MIN"))
    with pytest.raises(UnsupportedModelError, match=message):
        worker.compile_model(m)


@pytest.mark.parametrize("change,message", [
    (("value_eq", float("-inf")), "BRANCH_EQ with threshold -inf"),
    (("post", "SOFTMAX_ZERO"), "post_transform SOFTMAX_ZERO on a regressor"),
    (("value", float("nan")), "with threshold nan"),
])
def test_what_cannot_be_reproduced_is_refused_by_name(change, message):
    kind, v = change
    modes, values = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GT"], [0.5, -1.25, 1e-3]
    kw = {}
    if kind == "value_eq":
        modes[0], values[0] = "BRANCH_EQ", v
    elif kind == "value":
        values[0] = v
    else:
        kw[kind] = v
    with pytest.raises(UnsupportedModelError, match=message):
        worker.compile_model(_node_model(modes, (0, 0, 0), values, **kw))


def test_a_graph_with_other_nodes_is_refused_naming_them():
    m = _node_model(["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GT"], (0, 0, 0), [0.5, -1.25, 1e-3])
    g = m.graph
    g.node.append(helper.make_node("Add", ["y", "y"], ["y2"], name="double_it"))
    g.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, [None, 1]))
    with pytest.raises(UnsupportedModelError, match=r"double_it \(Add\)"):
        worker.compile_model(m)


def test_a_node_that_reads_past_the_input_is_refused():
    m = _node_model(["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GT"], (0, 0, 0), [0.5, -1.25, 1e-3])
    for a in m.graph.node[0].attribute:
        if a.name == "nodes_featureids":
            a.ints[0] = 5
    with pytest.raises(UnsupportedModelError, match="feature 5 of a 2-wide input"):
        worker.compile_model(m)


def test_a_tree_with_a_cycle_is_refused():
    m = _node_model(["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GT"], (0, 0, 0), [0.5, -1.25, 1e-3])
    for a in m.graph.node[0].attribute:
        if a.name == "nodes_falsenodeids":
            a.ints[1] = 0  # node 1's false side leads back to the root
    with pytest.raises(UnsupportedModelError, match="node 0 is on a cycle"):
        worker.compile_model(m)


def _one_tree(rows, leaves):
    """A regressor of one tree on two features: ``rows`` (id, mode, feature, value, true id,
    false id, tracks) and ``leaves`` (id, weight)."""
    ids, modes, feats, vals, true_ids, false_ids, trk = (list(c) for c in zip(*rows,
                                                                              strict=True))
    node = helper.make_node(
        "TreeEnsembleRegressor", ["X"], ["y"], domain="ai.onnx.ml", n_targets=1,
        nodes_treeids=[0] * len(ids), nodes_nodeids=ids, nodes_featureids=feats,
        nodes_modes=modes, nodes_values=vals, nodes_truenodeids=true_ids,
        nodes_falsenodeids=false_ids, nodes_missing_value_tracks_true=trk,
        target_treeids=[0] * len(leaves), target_nodeids=[n for n, _ in leaves],
        target_ids=[0] * len(leaves), target_weights=[w for _, w in leaves])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 3),
                                                helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("mode", ["BRANCH_LT", "BRANCH_EQ", "BRANCH_NEQ"])
def test_a_node_with_two_parents_is_emitted_once_per_path_as_onnx_runtime_reads_it(mode):
    from worker.model import onnx_loader

    # leaf 2 is the true side of the root and of node 1 (ONNX Runtime shares true sides only)
    m = _one_tree([(0, "BRANCH_LEQ", 0, 0.5, 2, 1, 1), (1, mode, 1, -1.25, 2, 3, 0),
                   (2, "LEAF", 0, 0.0, 0, 0, 0), (3, "LEAF", 0, 0.0, 0, 0, 0)],
                  [(2, 0.25), (3, -1.5)])
    compiled = worker.compile_model(m)
    X = _hostile_2([0.5, -1.25])
    got = compiled.raw(X, n_threads=1).astype(np.float32)
    np.testing.assert_array_equal(got, onnx_loader.reference(m, X).astype(np.float32))
    assert len(np.unique(got)) == 2


def _eq_chain_model(values, tracks, true_leaf=0.75, tail=None):
    """One tree: BRANCH_EQ on feature 0 at each of ``values`` in a chain (each false side the
    next test), every true side the same leaf (onnxmltools' LightGBM categorical export); the
    chain's end splits feature 1 at 0.5 (or is a leaf: ``tail``)."""
    k = len(values)
    rows = [(j, "BRANCH_EQ", 0, float(v), k, j + 1, int(t))
            for j, (v, t) in enumerate(zip(values, tracks, strict=True))]
    rows[-1] = rows[-1][:5] + (k + 1, rows[-1][6])
    rows.append((k, "LEAF", 0, 0.0, 0, 0, 0))
    leaves = [(k, true_leaf)]
    if tail is None:  # node k + 1: x1 <= 0.5 -> k + 2 (-1.0), else k + 3 (2.0)
        rows += [(k + 1, "BRANCH_LEQ", 1, 0.5, k + 2, k + 3, 0),
                 (k + 2, "LEAF", 0, 0.0, 0, 0, 0), (k + 3, "LEAF", 0, 0.0, 0, 0, 0)]
        leaves += [(k + 2, -1.0), (k + 3, 2.0)]
    else:
        rows.append((k + 1, "LEAF", 0, 0.0, 0, 0, 0))
        leaves.append((k + 1, tail))
    return _one_tree(rows, leaves)


@pytest.mark.parametrize("values,tracks", [
    ([1.0, 3.0, 7.0, 9.0], (0, 0, 0, 0)),
    ([1.0, 3.0, 7.0, 9.0], (0, 0, 1, 0)),  # one merged run: only its first test's track
    ([1.0, 3.0, 7.0, 9.0], (1, 0, 0, 0)),
    ([0.0, 20.0, 21.0, 10.0, 31.0], (0, 1, 0, 1, 1)),  # 0 stands alone; the run from 20
    ([5.0, 100.0, 7.0, 40.0], (0, 0, 1, 0)),  # 100 breaks the run: 7 starts another
    ([18.0, 32.0, 33.0], (0, 1, 1)),  # 32 merges, 33 does not
    ([9.0, 0.0, 2.0, 1.0, 3.0], (1, 0, 0, 0, 0)),  # unsorted, adjacent, zero
    ([0.1, 0.5, 2.0], (0, 0, 0)),  # 0.1 is a float32 value here (the float attribute)
    ([3.0, 3.0, -2.5, np.inf], (0, 0, 0, 1)),  # a repeated value, a negative one, +inf
    ([5.0, 6.0, 100.0, 7.0], (0, 0, 0, 1)),  # 7 after 100 starts a run: its own track
])
def test_a_chain_of_equality_tests_sharing_one_subtree_matches_onnx_runtime(values, tracks):
    from worker.model import onnx_loader

    m = _eq_chain_model(values, tracks)
    compiled = worker.compile_model(m)
    X = _hostile_2(values + [0.5, 0.25, 12.0, 1.5, -0.0, 32.0, 64.0, 2.0 ** 31, 2.0 ** 32])
    got = compiled.raw(X, n_threads=1).astype(np.float32)
    want = onnx_loader.reference(m, X).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(want)) >= 3  # the rows reach every side


def test_a_long_equality_chain_unfolds_in_linear_size():
    from worker.model import onnx_loader

    values = [float(v) for v in range(0, 400, 3)]  # 134 categories, one subtree each side
    m = _eq_chain_model(values, [0] * len(values))
    ens = onnx_loader.to_ir(m)
    assert ens.trees[0].feature.size < 16 * len(values)  # two EQ nodes a value would be 2^134
    compiled = worker.compile_model(m)
    X = _hostile_2(values[:40] + [0.5, 1.0, 401.0])
    np.testing.assert_array_equal(compiled.raw(X, n_threads=1).astype(np.float32),
                                  onnx_loader.reference(m, X).astype(np.float32))


@pytest.mark.parametrize("values,tracks", [
    ([40.0, 41.0], (0, 1)),  # merged on a double input (64-bit set), apart on a float one
    ([33.0, 34.0, 70.0], (0, 1, 1)),
    ([64.0, 2.0], (0, 1)),
    ([65.0, 66.0], (0, 1)),  # past 64: apart on both
    ([63.0, 64.0, 65.0], (0, 0, 1)),  # 64 merges, 65 does not
])
def test_a_double_inputs_equality_chain_routes_nan_as_onnx_runtimes_64_bit_set(values, tracks):
    """ONNX Runtime merges a BRANCH_EQ run into a bit set as wide as its threshold type: whole
    numbers in [1, 64] on a double input (a hostile review found 40, 41 routed as [1, 32])."""
    from worker.model import onnx_loader

    m = _eq_chain_model(values, tracks)
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    compiled = worker.compile_model(m)
    X = _hostile_2(values + [0.5, 7.0])
    np.testing.assert_array_equal(compiled.raw(X, n_threads=1).astype(np.float32),
                                  onnx_loader.reference(m, X).astype(np.float32))


def test_a_large_output_elsewhere_does_not_loosen_verify():
    """verify holds each output to its own magnitude: a second tree worth 1e7 on some rows
    hid a 1.75 difference on rows scoring about 1 (tolerance scaled by the largest output)."""
    from worker.model import compile as C
    from worker.model import onnx_loader

    m = _one_tree([(0, "BRANCH_LEQ", 1, 100.0, 1, 2, 0), (1, "LEAF", 0, 0.0, 0, 0, 0),
                   (2, "LEAF", 0, 0.0, 0, 0, 0)], [(1, 0.75), (2, 1e7)])
    model = worker.compile_model(m)
    arrays = dict(model.arrays)
    leaves = arrays["leaves"].copy()
    leaves[leaves == 0.75] = 0.75 + 1.75  # a compile bug on the small rows
    arrays["leaves"] = leaves
    arrays["leaf_max"] = np.maximum(arrays["leaf_max"], leaves.max())
    wrong = worker.CompiledModel(model.meta, arrays, kernel=model.kernel)
    X = np.array([[0.0, 0.0], [0.0, 1000.0]], np.float32)
    assert onnx_loader.reference(m, X).ravel().tolist() == [0.75, 1e7]
    with pytest.raises(UnsupportedModelError, match="by 1.75 on probe rows \\(an output of "
                       "0.75\\)"):
        C.verify(wrong, m, probe=X)


def test_shared_nodes_that_unfold_past_the_budget_are_refused_before_emitting(tmp_path):
    """A 'diamond stack' (each level's two sides meet again below) doubles the paths per
    level: 2.3 kB unfolded to 2^21 nodes (8 s, 490 MB) before its refusal named equality
    splits it does not have. Counted on the graph first: refused at once, naming the cause."""
    levels = 40
    rows = []
    for i in range(levels):  # node 2i: x0 <= i -> 2i + 2, else 2i + 1; node 2i + 1 -> 2i + 2
        rows.append((2 * i, "BRANCH_LEQ", 0, float(i), 2 * i + 2, 2 * i + 1, 0))
        rows.append((2 * i + 1, "BRANCH_LEQ", 1, float(i), 2 * i + 2, 2 * i + 2, 0))
    rows.append((2 * levels, "LEAF", 0, 0.0, 0, 0, 0))
    m = _one_tree(rows, [(2 * levels, 1.0)])
    # only the count on the graph says this (the emission's own budget names the splits)
    with pytest.raises(UnsupportedModelError, match="shared nodes \\(several parents\\) "
                       "unfold to more than"):
        worker.compile_model(m)


def test_onnxmltools_lightgbm_categorical_export_matches_lightgbm_and_onnx_runtime(tmp_path):
    """onnxmltools writes a LightGBM categorical split as a chain of BRANCH_EQ nodes whose
    true sides share one subtree (refused as "node 3 has two parents" before)."""
    import lightgbm as lgb
    import onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType

    rng = np.random.default_rng(3)
    n = 4000
    X = rng.normal(size=(n, 3)).astype(np.float32)
    X[:, 2] = rng.integers(0, 12, n)
    y = ((X[:, 0] > 0) ^ np.isin(X[:, 2], [1, 3, 7, 9])).astype(int)
    clf = lgb.LGBMClassifier(n_estimators=20, num_leaves=8, verbose=-1, min_child_samples=5)
    clf.fit(X, y, categorical_feature=[2])
    onx = onnxmltools.convert_lightgbm(clf, initial_types=[("X", FloatTensorType([None, 3]))],
                                       zipmap=False)
    path = tmp_path / "lgb-categorical.onnx"
    path.write_bytes(onx.SerializeToString())
    compiled = worker.compile_model(path)
    cats = np.arange(-1, 14, dtype=np.float32)
    near = np.concatenate([cats, np.nextafter(cats, np.float32(np.inf)),
                           np.nextafter(cats, np.float32(-np.inf)), [np.nan, 0.5, 1e9]])
    Xh = np.repeat(X[:200], len(near), axis=0)
    Xh[:, 2] = np.tile(near, 200).astype(np.float32)
    Xh[::7, 0] = np.nan
    from worker.model import onnx_loader

    # margins bit for bit, probabilities within ONNX Runtime's float32 logistic (README)
    np.testing.assert_array_equal(
        compiled.raw(Xh, n_threads=1).ravel().astype(np.float32),
        onnx_loader.reference(onx, Xh, raw=True).ravel().astype(np.float32))
    got = compiled.predict_proba(Xh, n_threads=1)
    np.testing.assert_allclose(got, _ort_full(onx, Xh), rtol=0, atol=3e-7)
    whole = np.isin(Xh[:, 2], np.arange(0, 12)) & ~np.isnan(Xh[:, 0])
    np.testing.assert_allclose(got[whole, 1], clf.predict_proba(Xh[whole])[:, 1], atol=1e-6)


def _double(m, values=(0.1, -1.25)):
    """``m`` (from _one_tree) on a double input, its thresholds double tensors (as written)."""
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    node = m.graph.node[0]
    old = next(a for a in node.attribute if a.name == "nodes_values")
    vals = [values[0] if v == np.float32(values[0]) else values[1] if
            v == np.float32(values[1]) else float(v) for v in old.floats]
    node.attribute.remove(old)
    node.attribute.append(helper.make_attribute("nodes_values_as_tensor", helper.make_tensor(
        "nodes_values", TensorProto.DOUBLE, [len(vals)], vals)))


def test_a_double_input_with_thresholds_between_float32s_is_refused_naming_the_way_out(tmp_path):
    """Issue 49: a threshold of 0.1 on a double input: ONNX Runtime sends 0.1 and
    0.09999999999 left, 0.1000000001 right; staged as float32 all three went right. Refused
    by name; accepted with float32_inputs (exact for inputs that are float32 values)."""
    from worker.model import onnx_loader

    m = _one_tree([(0, "BRANCH_LEQ", 0, 0.1, 1, 2, 0), (1, "LEAF", 0, 0.0, 0, 0, 0),
                   (2, "LEAF", 0, 0.0, 0, 0, 0)], [(1, -1.0), (2, 1.0)])
    _double(m)
    rows = np.array([[0.1, 0.0], [0.1000000001, 0.0], [0.09999999999, 0.0]])
    assert _ort_full(m, rows).ravel().tolist() == [-1.0, 1.0, -1.0]
    with pytest.raises(UnsupportedModelError, match=r"1 of 1 thresholds between two float32 "
                       r"values \(e.g. 0.1\).*FloatTensorType.*--float32-inputs"):
        worker.compile_model(m)
    path = tmp_path / "double.onnx"
    path.write_bytes(m.SerializeToString())
    refused = _cli("compile", path, "-o", tmp_path / "double.model")
    assert refused.returncode == 1 and "--float32-inputs" in refused.stderr
    took = _cli("compile", path, "-o", tmp_path / "double.model", "--float32-inputs")
    assert took.returncode == 0, took.stderr
    assert "note: double input staged as float32: 1 of 1 thresholds" in took.stdout
    compiled = worker.load_model(tmp_path / "double.model")
    assert any("between two float32 values" in n for n in compiled.meta["notes"])
    X = _hostile_2([0.1])
    np.testing.assert_array_equal(compiled.predict(X, n_threads=1).astype(np.float32),
                                  onnx_loader.reference_full(m, X).ravel().astype(np.float32))


def test_a_double_input_whose_thresholds_are_float32_values_compiles_as_is():
    from worker.model import onnx_loader

    m = _one_tree([(0, "BRANCH_LEQ", 0, float(np.float32(0.1)), 1, 2, 0),
                   (1, "BRANCH_LT", 1, -1.25, 3, 4, 1), (2, "LEAF", 0, 0.0, 0, 0, 0),
                   (3, "LEAF", 0, 0.0, 0, 0, 0), (4, "LEAF", 0, 0.0, 0, 0, 0)],
                  [(2, 1.0), (3, -1.0), (4, 0.5)])
    _double(m, (float(np.float32(0.1)), -1.25))
    compiled = worker.compile_model(m)
    assert any("every threshold a float32 value" in n for n in compiled.meta["notes"])
    X = _hostile_2([np.float32(0.1), -1.25])
    np.testing.assert_array_equal(compiled.predict(X, n_threads=1).astype(np.float32),
                                  onnx_loader.reference_full(m, X).ravel().astype(np.float32))


# ---- the command line: ONNX compiled; files it does not read named for what they are ----

def _cli(*args):
    return subprocess.run([sys.executable, "-m", "worker.cli", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_compile_reads_onnx_and_names_files_it_does_not_read(exports, tmp_path):
    path = tmp_path / "lgb.onnx"
    path.write_bytes(exports["lightgbm-binary"].SerializeToString())
    proc = _cli("compile", path, "-o", tmp_path / "lgb.model")
    assert proc.returncode == 0, proc.stderr
    cbm = tmp_path / "model.bin"
    cbm.write_bytes(b"CBM1" + bytes(64))
    proc = _cli("compile", cbm, "-o", tmp_path / "x.model")
    assert proc.returncode != 0 and "a CatBoost model: name it .cbm" in proc.stderr
    assert "joblib/pickle file:" not in proc.stderr and ".onnx" in proc.stderr
    other = tmp_path / "model.dat"
    other.write_bytes(b"\x00\x01 not a model")
    proc = _cli("compile", other, "-o", tmp_path / "x.model")
    assert proc.returncode != 0 and "not a model file this compiler knows" in proc.stderr
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"\xff\xff\xff not protobuf")
    proc = _cli("compile", broken, "-o", tmp_path / "x.model")
    assert proc.returncode != 0 and "not a readable ONNX model" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---- crafted files (an attack review's findings, each refused by name before the fix
# compiled it, scored it differently from ONNX Runtime, or crashed the command) ----

def _stump_model(**change):
    return _node_model(["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GT"], (0, 0, 0), [0.5, -1.25, 1e-3],
                       **change)


def _attr(m, name):
    return next(a for a in m.graph.node[0].attribute if a.name == name)


def test_a_node_before_the_tree_or_an_output_it_does_not_make_is_refused():
    m = _stump_model()
    g = m.graph
    tree = g.node[0]
    tree.input[0] = "Xf"  # X -> Cast(int64) -> Cast(float) -> tree: rounds the input
    g.node.insert(0, helper.make_node("Cast", ["X"], ["Xi"], to=TensorProto.INT64))
    g.node.insert(1, helper.make_node("Cast", ["Xi"], ["Xf"], to=TensorProto.FLOAT))
    with pytest.raises(UnsupportedModelError, match="does not read the graph's one input"):
        worker.compile_model(m)
    m = _stump_model()
    m.graph.node.append(helper.make_node("Cast", ["y"], ["yi"], to=TensorProto.INT64))
    m.graph.output[0].name = "yi"
    with pytest.raises(UnsupportedModelError, match="casts the scores"):
        worker.compile_model(m)


def test_onnx_runtimes_root_is_the_first_listed_node():
    m = _stump_model()
    order = [1, 0, 2, 3, 4, 5, 6, 7]  # tree 0's second node listed first
    for a in m.graph.node[0].attribute:
        if a.name.startswith("nodes_"):
            field = a.ints if a.ints else a.floats if a.floats else a.strings
            values = list(field)
            del field[:]
            field.extend(values[i] for i in order)
    with pytest.raises(UnsupportedModelError, match="not reached from its first-listed node"):
        worker.compile_model(m)


@pytest.mark.parametrize("change,message", [
    ("tracks", "other than 0 or 1"),
    ("tree_id", r"outside \[0, 2\^31\)"),
    ("width", "features wide"),
    ("external", "external file"),
])
def test_crafted_attributes_are_refused_by_name(change, message):
    m = _stump_model()
    if change == "tracks":
        _attr(m, "nodes_missing_value_tracks_true").ints[0] = 2
    elif change == "tree_id":
        ids = _attr(m, "nodes_treeids").ints
        for i in range(5, 8):
            ids[i] = 1 << 32
    elif change == "width":
        m.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 1 << 40
    else:
        from onnx.external_data_helper import set_external_data

        m = _stump_model(double=True)
        t = _attr(m, "nodes_values_as_tensor").t
        t.raw_data = np.asarray(t.double_data, dtype=np.float64).tobytes()
        del t.double_data[:]
        set_external_data(t, location="thresholds.bin", offset=0, length=len(t.raw_data))
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
    with pytest.raises(UnsupportedModelError, match=message):
        worker.compile_model(m)


def test_a_chain_deeper_than_onnx_runtime_survives_is_refused_not_a_crash(tmp_path):
    depth = 1200  # ONNX Runtime crashed (SIGSEGV) verifying a 14,000-deep chain
    n = 2 * depth + 1
    attrs = dict(nodes_treeids=[0] * n, nodes_nodeids=list(range(n)),
                 nodes_featureids=[0] * n, nodes_values=[float(i) for i in range(n)],
                 nodes_modes=["BRANCH_LEQ" if i < depth else "LEAF" for i in range(n)],
                 nodes_truenodeids=[depth + i if i < depth else 0 for i in range(n)],
                 nodes_falsenodeids=[i + 1 if i < depth - 1 else (n - 1 if i < depth else 0)
                                     for i in range(n)],
                 target_treeids=[0] * (depth + 1), target_nodeids=list(range(depth, n)),
                 target_ids=[0] * (depth + 1), target_weights=[1.0] * (depth + 1),
                 n_targets=1)
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 1])
    node = helper.make_node("TreeEnsembleRegressor", ["X"], ["y"], domain="ai.onnx.ml", **attrs)
    m = helper.make_model(helper.make_graph([node], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("ai.onnx.ml", 3)])
    m.ir_version = 8
    path = tmp_path / "chain.onnx"
    path.write_bytes(m.SerializeToString())
    proc = _cli("compile", path, "-o", tmp_path / "x.model")
    assert proc.returncode == 1 and "deeper than 1000" in proc.stderr, proc.stderr


@pytest.mark.parametrize("tracks", [(0, 0, 0), (1, 1, 1)])
def test_equality_splits_at_zero_and_infinity_match_onnx_runtime(tracks):
    """x == 0 holds for -0.0; x == +inf only for +inf (the unfolded pair of splits)."""
    from worker.model import onnx_loader

    values = [0.0, float("inf"), -2.5]
    m = _node_model(("BRANCH_EQ", "BRANCH_NEQ", "BRANCH_EQ"), tracks, values)
    compiled = worker.compile_model(m)
    X = _hostile_2([0.0, np.finfo(np.float32).max, -2.5, 1e-45])
    np.testing.assert_array_equal(compiled.raw(X, n_threads=1).astype(np.float32),
                                  onnx_loader.reference(m, X).astype(np.float32))


def _probit_export():
    """A scikit-learn GradientBoostingRegressor fitted to values in (0, 1), exported, its
    post_transform set to PROBIT."""
    from skl2onnx import to_onnx
    from sklearn.ensemble import GradientBoostingRegressor

    X = _training(seed=3)[0]
    X = np.nan_to_num(X).astype(np.float32)
    y = 1 / (1 + np.exp(-(X[:, 0] - X[:, 1])))
    m = to_onnx(GradientBoostingRegressor(n_estimators=30, max_depth=3, random_state=0)
                .fit(X, y), X[:1])
    node = next(n for n in m.graph.node if n.op_type == "TreeEnsembleRegressor")
    for a in list(node.attribute):
        if a.name == "post_transform":
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute("post_transform", "PROBIT"))
    return m


def test_probit_on_one_target_is_onnx_runtimes_to_the_bit(tmp_path):
    """ONNX Runtime's PROBIT (its float32 approximation of the inverse error function, with
    libm's logf) reproduced to the bit, in opset 3 and rewritten in opset 5, on hostile rows
    (sums outside [0, 1] give NaN in both); lazy policies refuse it by name."""
    from tests.test_onnx5 import to_opset5
    from worker.model import onnx_loader

    m3 = _probit_export()
    for m in (m3, to_opset5(m3)):
        path = tmp_path / "m.onnx"
        path.write_bytes(m.SerializeToString())
        compiled = worker.compile_model(path)
        assert compiled.link == "probit"
        for seed, n in enumerate((1, 7, 64, 65, 3000)):
            X = M.hostile_rows(n, _thresholds(m3), seed=seed)
            ours = compiled.predict(X, n_threads=2).astype(np.float32)
            ref = onnx_loader.reference(m, X).reshape(-1).astype(np.float32)
            np.testing.assert_array_equal(ours, ref)
            assert np.isfinite(ref).sum() > n // 2  # mostly inside (0, 1): not all NaN
        with pytest.raises(ValueError, match="PROBIT"):
            compiled.score_batch(X, lazy="certified")


def test_probit_on_a_classifier_is_refused_by_name():
    m = _node_model(["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GT"], (0, 0, 0), [0.5, -1.25, 1e-3],
                    post="PROBIT", classifier=True, base=[0.25])
    with pytest.raises(UnsupportedModelError, match="post_transform PROBIT on a binary"):
        worker.compile_model(m)


def test_softmax_zero_matches_onnx_runtime(tmp_path):
    """SOFTMAX_ZERO: a class whose score is 0 (no leaf weight, base 0) is not exponentiated,
    in opset 3 and 5, on hostile rows; a binary classifier with it and lazy policies refuse
    it by name."""
    from tests.test_onnx5 import _member_model, _member_rows
    from worker.model import onnx_loader

    values = [0.5, -1.25, 1e-3]
    m3 = _node_model(("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GT"), (0, 1, 0), values,
                     post="SOFTMAX_ZERO", classifier=True, n_classes=3,
                     weights_by_class=[1, 2], base=[0.0, 0.1, -0.2])
    # opset 5: three targets, target 1 without a leaf weight (ONNX Runtime's number 3)
    sets = ([1.0, 3.0], [2.0])
    m5 = _member_model(sets, n_targets=3, post=3)
    for m, X, zero in ((m3, _hostile_2(values), 0), (m5, _member_rows(sets), 1)):
        path = tmp_path / "m.onnx"
        path.write_bytes(m.SerializeToString())
        compiled = worker.compile_model(path)
        assert compiled.link == "softmax_zero"
        ours = compiled.predict_proba(X, n_threads=1)
        ref = onnx_loader.reference(m, X)
        assert (ours[:, zero] < 1e-6).all()  # the zero score: about 0, not exp(0 - max)
        np.testing.assert_allclose(ours, ref, rtol=0, atol=3e-7)
        with pytest.raises(ValueError, match="SOFTMAX_ZERO"):
            compiled.score_batch(X, lazy="certified")
    binary = _node_model(("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GT"), (0, 1, 0), values,
                         post="SOFTMAX_ZERO", classifier=True, base=[0.25])
    with pytest.raises(UnsupportedModelError, match="SOFTMAX_ZERO on a binary"):
        worker.compile_model(binary)


# ---- found by mutation testing (issue 55, mutation/RESULTS.md: worker/model/onnx_loader.py) -

@pytest.mark.parametrize("labels", ["int", "str"])
def test_a_zipmap_export_is_scored_as_onnx_runtime_maps_it(labels):
    # skl2onnx's default export ends in a ZipMap (a dictionary of label -> probability a
    # row): the loader reads through it when it maps the tree's classes in order
    from skl2onnx import to_onnx
    from sklearn.ensemble import RandomForestClassifier

    X, _, y3 = _training()
    Xf = np.nan_to_num(X)
    y = np.array(["fraud", "good", "review"])[y3] if labels == "str" else y3
    est = RandomForestClassifier(n_estimators=10, max_depth=6, random_state=0).fit(Xf, y)
    m = to_onnx(est, Xf[:1])  # zipmap on: the default
    assert [n.op_type for n in m.graph.node][-1] == "ZipMap"
    compiled = worker.compile_model(m)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    rows = Xf[:300]
    maps = sess.run(None, {sess.get_inputs()[0].name: rows})[1]
    want = np.array([[d[c] for c in est.classes_] for d in maps], np.float32)
    got = compiled.raw(rows, n_threads=1).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_weights_fewer_than_their_tree_ids_are_refused():
    from worker.model import onnx_loader

    m = _one_tree([(0, "BRANCH_LEQ", 1, 0.5, 1, 2, 0), (1, "LEAF", 0, 0.0, 0, 0, 0),
                   (2, "LEAF", 0, 0.0, 0, 0, 0)], [(1, 0.25), (2, 0.75)])
    node = onnx_loader.tree_node(m)
    for a in node.attribute:
        if a.name == "target_weights":
            del a.floats[-1]
    with pytest.raises(UnsupportedModelError, match="target_weights and target_treeids "
                       "differ in length"):
        worker.compile_model(m)


def test_node_values_more_than_the_nodes_are_refused():
    m = _stump_model()
    _attr(m, "nodes_values").floats.append(0.5)
    with pytest.raises(UnsupportedModelError, match="nodes_values has 9 entries, expected 8"):
        worker.compile_model(m)


def test_a_two_class_model_with_weights_on_both_classes_is_refused():
    m = _stump_model(classifier=True, n_classes=2, weights_by_class=[0, 1])
    with pytest.raises(UnsupportedModelError, match="two-class model with weights on both"):
        worker.compile_model(m)
    # (weights on one class, as the exporters write them: the exports above)


def test_unreached_nodes_are_counted():
    m = _stump_model()
    _attr(m, "nodes_truenodeids").ints[0] = 3  # tree 0's root straight to two leaves
    _attr(m, "nodes_falsenodeids").ints[0] = 4
    with pytest.raises(UnsupportedModelError, match=r"tree 0: 2 nodes not reached"):
        worker.compile_model(m)


def test_the_source_names_the_ml_domains_opset_whatever_the_order_of_the_imports():
    m = _stump_model()
    del m.opset_import[:]
    m.opset_import.extend([helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    assert worker.compile_model(m).source == "onnx TreeEnsembleRegressor (ai.onnx.ml opset 3)"


def test_tree_ids_need_not_start_at_zero():
    # ONNX Runtime groups nodes by their tree id, whatever the numbers: trees 1 and 2 score
    # as trees 0 and 1 do
    from worker.model import onnx_loader

    m = _stump_model()
    ids = _attr(m, "nodes_treeids").ints
    ids[:] = [t + 1 for t in ids]
    ids = _attr(m, "target_treeids").ints
    ids[:] = [t + 1 for t in ids]
    X = _hostile_2([0.5, -1.25, 1e-3, 0.0, 2.0])
    np.testing.assert_array_equal(worker.compile_model(m).raw(X, n_threads=1).astype(np.float32),
                                  onnx_loader.reference(m, X).astype(np.float32))


def test_a_binary_classifier_weighted_on_class_1_only_with_a_transform_is_refused():
    # ONNX Runtime then gives a transform of the class-1 weights alone: not a probability
    m = _stump_model(classifier=True, n_classes=2, weights_by_class=[1], post="LOGISTIC")
    with pytest.raises(UnsupportedModelError, match="weights on class 1 only and "
                       "post_transform LOGISTIC"):
        worker.compile_model(m)
