"""ONNX TreeEnsemble (ai.onnx.ml opset 5): the exporters' models rewritten in opset 5's form
(here, from their opset 1-3 attributes), and hand-built set-membership splits, compiled from
the file and checked against ONNX Runtime on hostile rows (NaN, +-inf, values on thresholds
and on set members and their float32 neighbours, kernel block edges); what it cannot
reproduce (MIN and MAX on several targets, several regression targets) and crafted
attributes refused by name."""

from __future__ import annotations

import numpy as np
import pytest

import worker
from tests import models as M
from tests.test_onnx import EXPORTS, SIZES, _exports

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

ML = "ai.onnx.ml"
MODE_CODE = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4,
             "BRANCH_NEQ": 5, "BRANCH_MEMBER": 6}
# opset 5 puts one target on a leaf: models whose leaves carry every class (forests'
# multiclass votes) have no opset-5 form
V5_EXPORTS = [n for n in EXPORTS if n != "sklearn-rf-multiclass"]


def _model(node, n_features: int, double: bool = False):
    elem = TensorProto.DOUBLE if double else TensorProto.FLOAT
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("X", elem,
                                                                      [None, n_features])],
                          [helper.make_tensor_value_info("Y", elem, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(ML, 5),
                                            helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m


def _tensor(name, values, double=False):
    t = TensorProto.DOUBLE if double else TensorProto.FLOAT
    return helper.make_tensor(name, t, (len(values),), np.asarray(
        values, np.float64 if double else np.float32))


def to_opset5(model):
    """An opset 1-3 tree ensemble as a TreeEnsemble node: its split nodes in order, its leaves
    (one per class weight; a leaf with no weight adds 0 to target 0), trees from their
    first-listed node; base values as last trees of one leaf (a split whose sides are that
    leaf). Written from the operators' specifications, not from the compiler's reader."""
    node = next(n for n in model.graph.node if n.op_type.startswith("TreeEnsemble"))
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    classifier = node.op_type == "TreeEnsembleClassifier"
    p = "class" if classifier else "target"
    modes = [m.decode() for m in a["nodes_modes"]]
    tree, nid = list(a["nodes_treeids"]), list(a["nodes_nodeids"])
    values = list(a.get("nodes_values", [])) or \
        list(np.asarray(helper.get_attribute_value(next(
            x for x in node.attribute if x.name == "nodes_values_as_tensor")).float_data))
    tracks = list(a.get("nodes_missing_value_tracks_true", [])) or [0] * len(modes)
    weights = {}
    for t, n_, i, w in zip(a[f"{p}_treeids"], a[f"{p}_nodeids"], a[f"{p}_ids"],
                           a[f"{p}_weights"], strict=True):
        weights.setdefault((t, n_), []).append((i, w))
    n_targets = len(a.get("classlabels_int64s", []) or a.get("classlabels_strings", [])) \
        if classifier else int(a.get("n_targets", 1))
    targets = sorted({i for ws in weights.values() for i, _ in ws})
    if classifier and n_targets == 2 and len(targets) <= 1:
        n_targets, remap = 1, {targets[0] if targets else 1: 0}  # the binary case: one score
    else:
        remap = {i: i for i in range(n_targets)}
    split_ix = {}
    leaves, leaf_t, leaf_w = {}, [], []
    for k, m in enumerate(modes):
        key = (tree[k], nid[k])
        if m == "LEAF":
            refs = []
            for i, w in weights.get(key, []) or [(next(iter(remap)), 0.0)]:
                refs.append(len(leaf_t))
                leaf_t.append(remap[i])
                leaf_w.append(w)
            leaves[key] = refs
        else:
            split_ix[key] = len(split_ix)
    splits = [k for k, m in enumerate(modes) if m != "LEAF"]
    if any(len(v) != 1 for v in leaves.values()):
        raise ValueError("a leaf with several weights has no opset-5 form")
    out = {k: [] for k in ("modes", "feat", "split", "tnode", "tleaf", "fnode", "fleaf",
                           "tracks")}
    by_key = {(tree[k], nid[k]): k for k in range(len(modes))}
    for k in splits:
        out["modes"].append(MODE_CODE[modes[k]])
        out["feat"].append(a["nodes_featureids"][k])
        out["split"].append(values[k])
        out["tracks"].append(tracks[k])
        for side, ids in (("t", a["nodes_truenodeids"]), ("f", a["nodes_falsenodeids"])):
            child = (tree[k], ids[k])
            if modes[by_key[child]] == "LEAF":
                out[f"{side}node"].append(leaves[child][0])
                out[f"{side}leaf"].append(1)
            else:
                out[f"{side}node"].append(split_ix[child])
                out[f"{side}leaf"].append(0)
    roots = []
    for t in dict.fromkeys(tree):
        first = (t, nid[tree.index(t)])
        if modes[by_key[first]] == "LEAF":
            raise ValueError("a tree of one leaf")
        roots.append(split_ix[first])
    base = list(a.get("base_values", []))
    if n_targets == 1 and len(base) > 1:
        base = base[-1:]  # the binary case's positive class
    for i, b in enumerate(base):
        if b:
            leaf_t.append(i)
            leaf_w.append(b)
            roots.append(len(out["modes"]))
            for key, v in (("modes", 0), ("feat", 0), ("split", 0.0), ("tracks", 0),
                           ("tnode", len(leaf_t) - 1), ("tleaf", 1),
                           ("fnode", len(leaf_t) - 1), ("fleaf", 1)):
                out[key].append(v)
    post = a.get("post_transform", b"NONE").decode()
    if n_targets == 1 and post != "PROBIT":
        post = "NONE"  # ONNX Runtime transforms one target with PROBIT only
    agg = a.get("aggregate_function", b"SUM").decode()
    v5 = helper.make_node(
        "TreeEnsemble", ["X"], ["Y"], domain=ML, n_targets=n_targets,
        aggregate_function=["AVERAGE", "SUM", "MIN", "MAX"].index(agg),
        # ONNX Runtime's numbers (its softmax is 2; the specification says 1)
        post_transform=["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"].index(post),
        tree_roots=roots,
        nodes_modes=helper.make_tensor("nodes_modes", TensorProto.UINT8,
                                       (len(out["modes"]),),
                                       np.asarray(out["modes"], np.uint8)),
        nodes_featureids=out["feat"], nodes_splits=_tensor("nodes_splits", out["split"]),
        nodes_truenodeids=out["tnode"], nodes_trueleafs=out["tleaf"],
        nodes_falsenodeids=out["fnode"], nodes_falseleafs=out["fleaf"],
        nodes_missing_value_tracks_true=out["tracks"], leaf_targetids=leaf_t,
        leaf_weights=_tensor("leaf_weights", leaf_w))
    n_features = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    return _model(v5, n_features)


def _ort(model, X):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return np.asarray(s.run(None, {"X": X})[0], dtype=np.float64).reshape(len(X), -1)


def _ours(compiled, X):
    return compiled.predict_proba(X, n_threads=2) if compiled.task != "regression" else \
        compiled.predict(X, n_threads=2).reshape(-1, 1)


@pytest.fixture(scope="module")
def exports5():
    return {k: to_opset5(v) for k, v in _exports().items() if k in V5_EXPORTS}


def _split_values(model) -> np.ndarray:
    """The thresholds of a TreeEnsemble and their float32 neighbours (hostile rows' values)."""
    from onnx import numpy_helper

    t = numpy_helper.to_array(next(x.t for x in model.graph.node[0].attribute
                                   if x.name == "nodes_splits")).astype(np.float32)
    return np.unique(np.concatenate([t, np.nextafter(t, np.float32(np.inf)),
                                     np.nextafter(t, np.float32(-np.inf))]))


@pytest.mark.parametrize("name", V5_EXPORTS)
def test_exported_models_in_opset_5_match_onnx_runtime(exports5, name, tmp_path):
    model = exports5[name]
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    compiled = worker.compile_model(path)  # from the file, as `compile` reads it
    assert "opset 5" in compiled.source
    thresholds = _split_values(model)
    for seed, n in enumerate(SIZES):
        X = M.hostile_rows(n, thresholds, seed=seed)
        ref = _ort(model, X)
        ours = _ours(compiled, X)
        if compiled.task == "multiclass":  # ONNX Runtime's softmax, rounded in float32
            np.testing.assert_allclose(ours, ref, rtol=0, atol=3e-7, err_msg=name)
        else:  # sums in float32 in tree order: bit for bit
            np.testing.assert_array_equal(ours.astype(np.float32), ref.astype(np.float32),
                                          err_msg=f"{name}, {n} rows")


def _member_model(sets, tracks=(0, 0), agg=1, n_targets=1, post=0, double=False,
                  extra_leq=0.25):
    """Two trees over 3 features: tree 0 asks x1 in sets[0] (true: 10, else asks x0 <=
    extra_leq: 20 / 30); tree 1 asks x2 in sets[1] (true: 1, false: -1)."""
    mv = []
    for s in sets:
        mv += list(s) + [np.nan]
    node = helper.make_node(
        "TreeEnsemble", ["X"], ["Y"], domain=ML, n_targets=n_targets, aggregate_function=agg,
        post_transform=post, tree_roots=[0, 2],
        nodes_modes=helper.make_tensor("nodes_modes", TensorProto.UINT8, (3,),
                                       np.array([6, 0, 6], np.uint8)),
        nodes_featureids=[1, 0, 2], nodes_splits=_tensor("nodes_splits", [np.nan, extra_leq,
                                                                          np.nan], double),
        nodes_truenodeids=[0, 1, 3], nodes_trueleafs=[1, 1, 1],
        nodes_falsenodeids=[1, 2, 4], nodes_falseleafs=[0, 1, 1],
        nodes_missing_value_tracks_true=[tracks[0], 0, tracks[1]],
        leaf_targetids=[0, 0, 0, n_targets - 1, n_targets - 1],
        leaf_weights=_tensor("leaf_weights", [10.0, 20.0, 30.0, 1.0, -1.0], double),
        membership_values=_tensor("membership_values", mv, double))
    return _model(node, 3, double)


def _member_rows(sets, n=600, seed=0):
    """Rows whose x1 and x2 sit on the members, their float32 neighbours, NaN, +-inf, 0."""
    rng = np.random.default_rng(seed)
    vals = np.array([v for s in sets for v in s] + [0.0], np.float32)
    # ONNX Runtime truncates x to an int32: the members, their neighbours, and x +- 1 and
    # +- 0.5 around them (where truncation moves), beyond int32, NaN, +-inf
    around = np.concatenate([vals, vals + 1, vals - 1, vals + 0.5, vals - 0.5]).astype(
        np.float32)
    near = np.concatenate([around, np.nextafter(around, np.float32(np.inf)),
                           np.nextafter(around, np.float32(-np.inf)),
                           [np.nan, np.inf, -np.inf, 0.25, np.nextafter(np.float32(0.25), 1),
                            2**31, -2**31, 3e9, -3e9, 2**31 - 128, -0.0]])
    X = rng.normal(size=(n, 3)).astype(np.float32)
    for j in (0, 1, 2):
        pick = rng.random(n) < 0.8
        X[pick, j] = rng.choice(near.astype(np.float32), size=int(pick.sum()))
    return X


@pytest.mark.parametrize("sets", [
    # small sets in [0, 30]: ONNX Runtime tests x == v (any float value)
    ([1.0, 3.0], [0.5, 30.0, 2.25]),
    # big sets (negative, beyond 30, more than 30 values): x cast to int32 and looked up
    ([1.0, 3.0, -2.0, 40.0, 100000.0], [-7.0]),
    ([0.0, 7.0, 7.0, -1.0, 2147483520.0, -2147483520.0, 16777216.0], [1.0, 2.0, -3.0]),
    (list(np.arange(0, 40, dtype=np.float32)), [0.0, 31.0]),
    ([5.0], [4.0, 5.0, 6.0, -4.0]),
], ids=["small", "big", "edges", "many", "adjacent"])
@pytest.mark.parametrize("tracks", [(0, 0), (1, 1), (0, 1)])
def test_set_membership_matches_onnx_runtime(sets, tracks, tmp_path):
    model = _member_model(sets, tracks)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    compiled = worker.compile_model(path)
    for n in (1, 63, 64, 65, 600):
        X = _member_rows(sets, n=n, seed=n)
        np.testing.assert_array_equal(_ours(compiled, X).astype(np.float32),
                                      _ort(model, X).astype(np.float32))


def test_double_thresholds_and_members_on_a_double_input(tmp_path):
    sets = ([1.0, 2.0, -7.0], [0.0, 9.0])
    model = _member_model(sets, (1, 0), double=True, extra_leq=0.1)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    compiled = worker.compile_model(path, float32_inputs=True)  # 0.1: rows are float32s
    X = _member_rows(sets, n=800, seed=3)
    np.testing.assert_array_equal(_ours(compiled, X), _ort(model, X.astype(np.float64)))


@pytest.mark.parametrize("agg,post,n_targets", [(0, 0, 1), (1, 0, 1), (2, 0, 1), (3, 0, 1),
                                               (1, 2, 3), (0, 2, 3)],
                         ids=["average", "sum", "min", "max", "softmax-3", "average-softmax-3"])
def test_aggregations_and_transforms_match_onnx_runtime(agg, post, n_targets, tmp_path):
    """AVERAGE, SUM, MIN and MAX; three targets with ONNX Runtime's softmax (post_transform 2)
    are a multiclass model."""
    sets = ([1.0, 3.0], [-2.0, 0.0])
    model = _member_model(sets, (1, 0), agg=agg, n_targets=n_targets, post=post)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    compiled = worker.compile_model(path)
    X = _member_rows(sets, n=500, seed=agg + post)
    ours, ref = _ours(compiled, X), _ort(model, X)
    if n_targets == 1:
        np.testing.assert_array_equal(ours.astype(np.float32), ref.astype(np.float32))
    else:
        assert compiled.task == "multiclass"
        np.testing.assert_allclose(ours, ref, rtol=0, atol=3e-7)


@pytest.mark.parametrize("change,message", [
    ({"aggregate_function": 2, "n_targets": 3, "post_transform": 2},
     "aggregate_function MIN on a classifier"),
    ({"aggregate_function": 3, "n_targets": 3, "post_transform": 2},
     "aggregate_function MAX on a classifier"),
    ({"post_transform": 3}, "SOFTMAX_ZERO on one target"),
    ({"post_transform": 2}, "LOGISTIC on one target"),
    ({"n_targets": 2, "post_transform": 1}, "the runtimes disagree"),
    ({"n_targets": 2, "post_transform": 4}, "post_transform PROBIT"),
    ({"n_targets": 2, "post_transform": 0}, "targets with post_transform NONE"),
    ({"aggregate_function": 9}, "not one ONNX defines"),
    ({"tree_roots": [0, 7]}, "tree_roots points outside"),
    ({"nodes_truenodeids": [0, 5, 3]}, "outside the nodes or leaves"),
    ({"nodes_falsenodeids": [0, 2, 4], "nodes_falseleafs": [0, 1, 1]},
     "reached twice"),
    ({"leaf_targetids": [0, 0, 0, 0, 3]}, "target 3 of 1"),
    ({"nodes_trueleafs": [1, 2, 1]}, "other than 0 or 1"),
    ({"membership_values": _tensor("membership_values", [1.0, np.nan])},
     "1 sets for 2 BRANCH_MEMBER nodes"),
    ({"membership_values": _tensor("membership_values", [-1.5, np.nan, 2.0])},
     "not an integer"),
    ({"membership_values": _tensor("membership_values", [np.nan, 2.0])},
     "a BRANCH_MEMBER set of 0 values"),
    ({"membership_values": _tensor("membership_values", [1.0, np.nan, 3e9])},
     "not an integer in int32"),
    ({"nodes_modes": helper.make_tensor("nodes_modes", TensorProto.UINT8, (3,),
                                        np.array([6, 0, 9], np.uint8))}, "node mode 9"),
    ({"nodes_modes": helper.make_tensor("nodes_modes", TensorProto.UINT8, (3,),
                                        np.array([6, 0, 7], np.uint8))}, "node mode 7 is not"),
    ({"nodes_hitrates": [1.0]}, "wrong type"),
    ({"leaf_weights": _tensor("leaf_weights", [1.0, 2.0, 3.0, 4.0, 5.0], double=True)},
     "of one type"),
    ({"nodes_splits": _tensor("nodes_splits", [0.0, 1.0])}, "nodes_splits has 2 entries"),
])
def test_what_opset_5_cannot_reproduce_is_refused_by_name(change, message, tmp_path):
    from worker.model.ir import UnsupportedModelError

    model = _member_model(([1.0], [2.0]))
    node = model.graph.node[0]
    attrs = {a.name: a for a in node.attribute}
    for k, v in change.items():
        if k in attrs:
            node.attribute.remove(attrs[k])
        node.attribute.append(helper.make_attribute(k, v))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    with pytest.raises(UnsupportedModelError, match=message):
        worker.compile_model(path)


EDGES = [0, 1, 2, 3, 4, 5, -1, 2**31 - 1, 2**31, 2**32, 2**63 - 1, -2**63]


def test_crafted_opset_5_attributes_are_refused_or_exact(tmp_path):
    """Hypothesis mutates the attributes of a small TreeEnsemble (integers at their edges,
    lists shortened or lengthened, modes, member sets): compile refuses it by name, or ONNX
    Runtime runs it and the compiled model equals it; never another exception."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from worker.model.ir import UnsupportedModelError

    int_lists = ["nodes_featureids", "nodes_truenodeids", "nodes_trueleafs",
                 "nodes_falsenodeids", "nodes_falseleafs", "nodes_missing_value_tracks_true",
                 "leaf_targetids", "tree_roots"]
    X = _member_rows(([1.0, 3.0], [2.0, 40.0]), n=200, seed=5)

    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.sampled_from(int_lists + ["n_targets", "aggregate_function",
                                                           "post_transform", "modes",
                                                           "members"]),
                              st.integers(0, 4), st.sampled_from(EDGES)),
                    min_size=1, max_size=3))
    def run(changes):
        model = _member_model(([1.0, 3.0], [2.0, 40.0]), (1, 0))
        node = model.graph.node[0]
        attrs = {a.name: a for a in node.attribute}
        for name, pos, v in changes:
            if name in int_lists:
                vals = list(attrs[name].ints)
                if pos < len(vals):
                    vals[pos] = v
                else:
                    vals.append(v)
                new = helper.make_attribute(name, vals)
            elif name == "modes":
                codes = [6, 0, 6]
                codes[pos % 3] = v % 256
                new = helper.make_attribute("nodes_modes", helper.make_tensor(
                    "nodes_modes", TensorProto.UINT8, (3,), np.array(codes, np.uint8)))
                name = "nodes_modes"
            elif name == "members":
                mv = [1.0, 3.0, np.nan, 2.0, 40.0, np.nan]
                mv[pos] = float(v)
                new = helper.make_attribute("membership_values",
                                            _tensor("membership_values", mv))
                name = "membership_values"
            else:
                new = helper.make_attribute(name, v)
            node.attribute.remove(attrs[name])
            node.attribute.append(new)
            attrs[name] = new
        path = tmp_path / "m.onnx"
        onnx.save(model, path)
        try:
            compiled = worker.compile_model(path)
        except UnsupportedModelError:
            return
        ref = _ort(model, X)
        ours = _ours(compiled, X)[:, :ref.shape[1]]
        if compiled.task == "multiclass":  # softmax: within ONNX Runtime's float32 (README)
            np.testing.assert_allclose(ours, ref, rtol=0, atol=3e-7)
        else:
            np.testing.assert_array_equal(ours.astype(np.float32), ref.astype(np.float32))

    run()


# ---- what an attacker's review found (each failed before its fix) ---------------------------

def _chain(depth: int, roots: list[int], n_targets: int = 1, post: int = 0, mode: int = 6):
    """A chain of ``depth`` splits on x0, each's false side the next, true a leaf."""
    n = depth
    node = helper.make_node(
        "TreeEnsemble", ["X"], ["Y"], domain=ML, n_targets=n_targets, aggregate_function=1,
        post_transform=post, tree_roots=roots,
        nodes_modes=helper.make_tensor("nodes_modes", TensorProto.UINT8, (n,),
                                       np.full(n, mode, np.uint8)),
        nodes_featureids=[0] * n, nodes_splits=_tensor("nodes_splits", [5.0] * n),
        nodes_truenodeids=list(range(n)), nodes_trueleafs=[1] * n,
        nodes_falsenodeids=list(range(1, n)) + [n], nodes_falseleafs=[0] * (n - 1) + [1],
        leaf_targetids=[i % n_targets for i in range(n + 1)],
        leaf_weights=_tensor("leaf_weights", np.arange(n + 1, dtype=np.float64)),
        membership_values=_tensor("membership_values", [5.0, np.nan] * n))
    return _model(node, 1)


def test_a_negative_big_set_member_in_a_double_model_is_exact(tmp_path):
    """-16777217 is no float32: the piece's top is the float32 at or below it (rounding to
    nearest counted -16777216 as a member)."""
    node = helper.make_node(
        "TreeEnsemble", ["X"], ["Y"], domain=ML, n_targets=1, tree_roots=[0],
        nodes_modes=helper.make_tensor("nodes_modes", TensorProto.UINT8, (1,),
                                       np.array([6], np.uint8)),
        nodes_featureids=[0], nodes_splits=_tensor("nodes_splits", [0.0], True),
        nodes_truenodeids=[0], nodes_trueleafs=[1], nodes_falsenodeids=[1],
        nodes_falseleafs=[1], leaf_targetids=[0, 0],
        leaf_weights=_tensor("leaf_weights", [1.0, 0.0], True),
        membership_values=_tensor("membership_values", [-16777217.0, -3.0], True))
    model = _model(node, 1, double=True)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    compiled = worker.compile_model(path)
    x = np.array([-16777218, -16777217, -16777216, -16777215, -3.5, -3, -2.5, -2], np.float32)
    X = np.concatenate([x, np.nextafter(x, np.float32(1)), np.nextafter(x, np.float32(-1))])
    X = X.reshape(-1, 1)
    np.testing.assert_array_equal(_ours(compiled, X), _ort(model, X.astype(np.float64)))


@pytest.mark.parametrize("roots", [[0, 0], [0, 1]])
def test_trees_sharing_nodes_are_refused(roots, tmp_path):
    from worker.model.ir import UnsupportedModelError

    path = tmp_path / "m.onnx"
    onnx.save(_chain(3, roots), path)
    with pytest.raises(UnsupportedModelError, match="in another tree too"):
        worker.compile_model(path)


@pytest.mark.parametrize("depth,n_targets,post", [(40, 1, 0), (16, 4096, 2)])
def test_a_small_file_that_would_unfold_to_gigabytes_is_refused_quickly(depth, n_targets,
                                                                          post, tmp_path):
    """Each MEMBER split emits its false side twice: a chain of 40 is 2^41 nodes; 16 of them
    with 4,096 outputs a leaf, gigabytes of leaf values. Refused by the unfolding budget."""
    import resource
    import time

    from worker.model.ir import UnsupportedModelError

    path = tmp_path / "m.onnx"
    onnx.save(_chain(depth, [0], n_targets, post), path)
    assert path.stat().st_size < 4096
    t0 = time.monotonic()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(UnsupportedModelError, match="unfolded"):
        worker.compile_model(path)
    assert time.monotonic() - t0 < 60
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 1_000_000  # KB


def test_a_tree_whose_root_is_not_its_first_node_matches_onnx_runtime(tmp_path):
    # tree_roots may name any node: here node 1, whose false side is node 0
    node = helper.make_node(
        "TreeEnsemble", ["X"], ["Y"], domain=ML, n_targets=1, tree_roots=[1],
        aggregate_function=1, post_transform=0,
        nodes_modes=helper.make_tensor("nodes_modes", TensorProto.UINT8, (2,),
                                       np.array([0, 0], np.uint8)),
        nodes_featureids=[0, 0], nodes_splits=_tensor("nodes_splits", [7.0, 2.0]),
        nodes_truenodeids=[0, 2], nodes_trueleafs=[1, 1],
        nodes_falsenodeids=[1, 0], nodes_falseleafs=[1, 0],
        leaf_targetids=[0, 0, 0], leaf_weights=_tensor("leaf_weights", [10.0, 20.0, 30.0]))
    model = _model(node, 1)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    X = np.array([[-1.0], [2.0], [3.0], [7.0], [8.0], [np.nan]], np.float32)
    want = _ort(model, X)
    assert len(np.unique(want)) == 3  # every leaf reached
    np.testing.assert_array_equal(_ours(worker.compile_model(path), X), want)
