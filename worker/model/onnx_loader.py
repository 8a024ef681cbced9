"""ONNX tree ensembles (``ai.onnx.ml`` TreeEnsembleRegressor / TreeEnsembleClassifier, opsets
1-3, and TreeEnsemble, opset 5, read into the same form by ``_from_opset5``) -> Ensemble.
The file is read with the ``onnx`` package as data (protobuf): nothing in it is executed,
and ONNX Runtime only runs it afterwards, in ``compile.verify``, to compare.

A graph is accepted when it is one tree-ensemble node plus the nodes exporters add around it
that do not change a score: ZipMap (probabilities as a map), Cast, Identity, and a Mul by a
constant 1 (onnxmltools' LightGBM export). Anything else is refused with the node names.

Split rule (ONNX Runtime, float input): a node's condition is ``x <= t``, ``x < t``,
``x >= t`` or ``x > t`` with ``x`` the input's float32 value and ``t`` the threshold (float32,
or double in ``nodes_values_as_tensor``: then ``x`` is widened); true goes to
``nodes_truenodeids``. A missing value (NaN) goes to the true child when
``nodes_missing_value_tracks_true`` is 1, else where its comparison sends it (false, but true
for ``x != t``). Each becomes "right iff x > float32 threshold" (ir): ``x <= t`` and ``x > t``
compare with the largest float32 not above ``t``; ``x < t`` and ``x >= t`` with the largest
float32 below it. ``x == t`` and ``x != t`` (BRANCH_EQ, NEQ) become two such nodes, ``x > t``
then ``x > below(t)``, the unequal side's subtree emitted twice. A NaN threshold, and ``-inf``
with LT, GTE, EQ or NEQ, are refused by name.

Scores: SUM adds the leaves' weights (and ``base_values``) in float32 as ONNX Runtime does for
float thresholds; AVERAGE divides by the number of trees; MIN and MAX (one regression
target, each leaf one weight) keep the trees' smallest or largest leaf, then add the base
(the kernels' ModelView.agg). Post transforms NONE, LOGISTIC, SOFTMAX, SOFTMAX_ZERO (multiclass)
and PROBIT (one target). Two classes with
weights on one class id are ONNX Runtime's binary case: that class's score is the positive
class's (``[1 - s, s]`` for probabilities, a logistic of the margin otherwise).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from .ir import Ensemble, Tree, UnsupportedModelError, float32_at_or_below, float32_below

ML = "ai.onnx.ml"
TREE_OPS = ("TreeEnsembleRegressor", "TreeEnsembleClassifier", "TreeEnsemble")
# nodes that pass a tree ensemble's outputs on unchanged
PASS_THROUGH = ("ZipMap", "Cast", "Identity")
MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ",
         "LEAF", "BRANCH_MEMBER")
# TreeEnsemble (opset 5): nodes_modes codes, aggregate_function and post_transform numbers
MODES5 = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ",
          "BRANCH_MEMBER")
AGGREGATES5 = ("AVERAGE", "SUM", "MIN", "MAX")
POSTS5 = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")
MAX_NODES = 1 << 26  # far beyond any real ensemble; bounds the arrays built from a file
MAX_FEATURES = 1 << 17  # an input this wide costs gigabytes to probe; none is real
MAX_OUTPUTS = 1 << 12  # classes
MAX_LEAF_VALUES = 1 << 26  # nodes x outputs held as float64
MAX_DEPTH = 1000  # ONNX Runtime itself crashes (SIGSEGV) verifying chains ~14,000 deep
MAX_ID = (1 << 31) - 1  # ONNX Runtime keeps tree and node ids in 32 bits
MAX_TREE_NODES = 1 << 20  # one tree, BRANCH_EQ/NEQ unfolded
MAX_MEMBERS = 4096  # values of one BRANCH_MEMBER set


def is_onnx_source(source) -> bool:
    if isinstance(source, (str, Path)):
        return Path(source).suffix.lower() == ".onnx"
    return type(source).__name__ == "ModelProto" and type(source).__module__.startswith("onnx")


def read(source):
    """The ModelProto of a file (or the proto itself). Raises UnsupportedModelError."""
    if not isinstance(source, (str, Path)):
        return source
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"model source {path} does not exist")
    try:
        return onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, OSError) as exc:
        raise UnsupportedModelError(f"{path} is not a readable ONNX model: {exc}") from None


def _attrs(node) -> dict:
    """The node's attributes by name; a ``*_as_tensor`` (double) one under its plain name, and
    ``"_double"`` naming those that were."""
    from onnx import AttributeProto, TensorProto, helper, numpy_helper

    out = {"_double": set()}
    seen = set()
    for a in node.attribute:
        if a.name in seen:
            raise UnsupportedModelError(f"attribute {a.name} is given twice")
        seen.add(a.name)
        kind = AttributeProto.TENSOR if a.name.endswith("_as_tensor") else \
            _kinds().get(a.name)
        if kind is not None and a.type != kind:
            raise UnsupportedModelError(f"attribute {a.name} has the wrong type "
                                        f"({AttributeProto.AttributeType.Name(a.type)})")
        if a.name.endswith("_as_tensor"):
            t = a.t
            if t.data_location == TensorProto.EXTERNAL or len(t.external_data):
                raise UnsupportedModelError(f"attribute {a.name} keeps its data in an external "
                                            "file: only self-contained models are read")
            if t.data_type not in (TensorProto.FLOAT, TensorProto.DOUBLE):
                raise UnsupportedModelError(f"attribute {a.name} is not a float tensor")
            base = a.name[: -len("_as_tensor")]
            if base in out:
                raise UnsupportedModelError(f"both {base} and {a.name} are set")
            out[base] = numpy_helper.to_array(t).astype(np.float64).ravel()
            if t.data_type == TensorProto.DOUBLE:
                out["_double"].add(base)
            continue
        if a.name + "_as_tensor" in out:
            raise UnsupportedModelError(f"both {a.name} and {a.name}_as_tensor are set")
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


@functools.lru_cache(maxsize=1)
def _kinds() -> dict:
    """The attribute type each attribute this loader reads must have."""
    from onnx import AttributeProto as A

    ints = ["nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_truenodeids",
            "nodes_falsenodeids", "nodes_missing_value_tracks_true", "target_treeids",
            "target_nodeids", "target_ids", "class_treeids", "class_nodeids", "class_ids",
            "classlabels_int64s"]
    floats = ["nodes_values", "nodes_hitrates", "target_weights", "class_weights",
              "base_values"]
    kinds = {k: A.INTS for k in ints}
    kinds.update({k: A.FLOATS for k in floats})
    kinds.update({"nodes_modes": A.STRINGS, "classlabels_strings": A.STRINGS,
                  "n_targets": A.INT, "aggregate_function": A.STRING,
                  "post_transform": A.STRING})
    return kinds



def tree_node(model):
    """The one tree-ensemble node, reading the graph's input directly; every other node must
    pass its outputs through unchanged (see ``_check_wiring``)."""
    graph = model.graph
    trees = [n for n in graph.node if n.op_type in TREE_OPS and n.domain == ML]
    refused = []
    for n in graph.node:
        if n in trees or (n.op_type in PASS_THROUGH + ("Mul",) and n.domain in ("", ML)):
            continue
        refused.append(f"{n.name or '(unnamed)'} ({n.op_type})")
    if refused:
        raise UnsupportedModelError(
            "the graph has nodes besides one tree ensemble that this compiler does not "
            "reproduce: " + ", ".join(refused[:8]))
    if len(trees) != 1:
        raise UnsupportedModelError(f"the graph has {len(trees)} tree-ensemble nodes (one is "
                                    "supported: TreeEnsembleRegressor or "
                                    "TreeEnsembleClassifier, ai.onnx.ml opsets 1-3, or "
                                    "TreeEnsemble, opset 5)")
    _check_wiring(model, trees[0])
    return trees[0]


def _check_wiring(model, tree) -> None:
    """The tree reads the graph's one input as it is; the other nodes sit after the tree and
    change nothing a score is: Identity; Cast of the scores to float or double (of the label
    to anything); Mul of the scores by a one-element constant 1; ZipMap of the probabilities
    under the tree's own class labels, in its order. Whatever else a graph does is refused (a
    Cast of the input to int, a graph output that is not the tree's, a ZipMap that reorders)."""
    from onnx import TensorProto, numpy_helper

    graph = model.graph
    init = {t.name: t for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in init]
    if len(inputs) != 1 or list(tree.input) != inputs:
        raise UnsupportedModelError("the tree ensemble does not read the graph's one input "
                                    "directly (a node before it, or several inputs)")
    a = {x.name: x for x in tree.attribute}
    labels = _labels(a) if tree.op_type == "TreeEnsembleClassifier" else []
    # value name -> "label" or "scores": what it carries, from the tree onwards
    path = dict(zip(tree.output, ("label", "scores") if tree.op_type ==
                    "TreeEnsembleClassifier" else ("scores",), strict=False))
    for n in graph.node:
        if n is tree:
            continue
        name = n.name or n.op_type
        src = [i for i in n.input if i not in init]
        if len(src) != 1 or src[0] not in path:
            raise UnsupportedModelError(f"node {name} ({n.op_type}) does not take the tree "
                                        "ensemble's output alone")
        kind = path[src[0]]
        attrs = {x.name: x for x in n.attribute}
        if n.op_type == "Cast" and kind == "scores" and attrs.get("to") is not None and \
                attrs["to"].i not in (TensorProto.FLOAT, TensorProto.DOUBLE):
            raise UnsupportedModelError(f"node {name} casts the scores to another type")
        if n.op_type == "Mul":
            consts = [numpy_helper.to_array(init[i]) for i in n.input if i in init]
            if kind != "scores" or len(consts) != 1 or consts[0].size != 1 or \
                    not np.all(consts[0] == 1):
                raise UnsupportedModelError(f"node {name} (Mul) changes the scores")
        if n.op_type == "ZipMap":
            zl = attrs.get("classlabels_int64s") or attrs.get("classlabels_strings")
            z = list(zl.ints) if zl is not None and zl.ints else \
                [v.decode() for v in zl.strings] if zl is not None else None
            if kind != "scores" or z != [str(v) if isinstance(v, str) else v
                                         for v in labels]:
                raise UnsupportedModelError(f"node {name} (ZipMap) does not map the "
                                            "probabilities to the tree's class labels in order")
        for out in n.output:
            path[out] = kind
    outs = [o.name for o in graph.output]
    if not outs or any(o not in path for o in outs) or \
            not any(path[o] == "scores" for o in outs):
        raise UnsupportedModelError("the graph's outputs are not the tree ensemble's scores")
    return next(o for o in outs if path[o] == "scores")


@functools.lru_cache(maxsize=1)
def _kinds5() -> dict:
    """TreeEnsemble's (opset 5) attributes and the type each must have."""
    from onnx import AttributeProto as A

    ints = ["nodes_featureids", "nodes_truenodeids", "nodes_trueleafs", "nodes_falsenodeids",
            "nodes_falseleafs", "nodes_missing_value_tracks_true", "leaf_targetids",
            "tree_roots"]
    kinds = {k: A.INTS for k in ints}
    kinds.update({k: A.TENSOR for k in ("nodes_modes", "nodes_splits", "leaf_weights",
                                        "membership_values", "nodes_hitrates")})
    kinds.update({"n_targets": A.INT, "aggregate_function": A.INT, "post_transform": A.INT})
    return kinds


def _from_opset5(node) -> tuple[dict, bool, list | None, dict]:
    """TreeEnsemble (ai.onnx.ml opset 5) as the opset 1-3 attributes ``_to_ir`` reads: its
    trees (roots in ``tree_roots``; a child is a node or, where ``nodes_*leafs`` says so, a
    leaf) numbered per tree, leaves as LEAF nodes with their weights, BRANCH_MEMBER nodes
    with their values (``membership_values``, one NaN-separated run per member node, in node
    order). ONNX Runtime ignores a post transform on one target but PROBIT; more targets with
    SOFTMAX are a multiclass model (classes 0, 1, ...). Returns (attributes, classifier,
    class labels or None, {legacy node row: member values})."""
    from onnx import TensorProto, helper, numpy_helper

    kinds = _kinds5()
    raw: dict = {}
    for at in node.attribute:
        if at.name in raw:
            raise UnsupportedModelError(f"attribute {at.name} is given twice")
        kind = kinds.get(at.name)
        if kind is None:
            raise UnsupportedModelError(f"TreeEnsemble attribute {at.name} is not one this "
                                        "compiler reads")
        if at.type != kind:
            raise UnsupportedModelError(f"attribute {at.name} has the wrong type")
        if kind == helper.AttributeProto.TENSOR:
            t = at.t
            if t.data_location == TensorProto.EXTERNAL or len(t.external_data):
                raise UnsupportedModelError(f"attribute {at.name} keeps its data in an external "
                                            "file: only self-contained models are read")
            raw[at.name] = (t.data_type, numpy_helper.to_array(t).ravel())
        else:
            raw[at.name] = helper.get_attribute_value(at)
    for key in ("nodes_modes", "nodes_splits", "leaf_weights", "tree_roots", "leaf_targetids",
                "nodes_featureids", "nodes_truenodeids", "nodes_falsenodeids"):
        if key not in raw:
            raise UnsupportedModelError(f"TreeEnsemble without {key}")
    mtype, mode_codes = raw["nodes_modes"]
    if mtype != TensorProto.UINT8:
        raise UnsupportedModelError("nodes_modes is not a uint8 tensor")
    n = mode_codes.shape[0]
    if n == 0 or n > MAX_NODES:
        raise UnsupportedModelError(f"{n} nodes: not a tree ensemble this compiler reads")
    stype, splits = raw["nodes_splits"]
    wtype, leaf_w = raw["leaf_weights"]
    if stype not in (TensorProto.FLOAT, TensorProto.DOUBLE) or wtype != stype:
        raise UnsupportedModelError("nodes_splits and leaf_weights must be float or double "
                                    "tensors of one type")
    if splits.shape[0] != n:
        raise UnsupportedModelError(f"nodes_splits has {splits.shape[0]} entries, expected {n}")
    splits = splits.astype(np.float64)
    leaf_w = leaf_w.astype(np.float64)
    n_leaves = leaf_w.shape[0]
    if n_leaves == 0 or n_leaves > MAX_NODES:
        raise UnsupportedModelError(f"{n_leaves} leaves")

    def ints(key: str, count: int, default=None) -> np.ndarray:
        v = raw.get(key)
        if v is None or len(v) == 0:
            if default is None:
                raise UnsupportedModelError(f"TreeEnsemble without {key}")
            return np.full(count, default, dtype=np.int64)
        arr = np.asarray(v, dtype=np.int64).ravel()
        if arr.shape[0] != count:
            raise UnsupportedModelError(f"attribute {key} has {arr.shape[0]} entries, "
                                        f"expected {count}")
        return arr

    features = ints("nodes_featureids", n)
    true_ix, false_ix = ints("nodes_truenodeids", n), ints("nodes_falsenodeids", n)
    true_leaf, false_leaf = ints("nodes_trueleafs", n, 0), ints("nodes_falseleafs", n, 0)
    tracks = ints("nodes_missing_value_tracks_true", n, 0)
    leaf_target = ints("leaf_targetids", n_leaves)
    roots = np.asarray(raw["tree_roots"], dtype=np.int64).ravel()
    for key, arr in (("nodes_trueleafs", true_leaf), ("nodes_falseleafs", false_leaf),
                     ("nodes_missing_value_tracks_true", tracks)):
        if np.any((arr != 0) & (arr != 1)):
            raise UnsupportedModelError(f"{key} holds a value other than 0 or 1")
    if np.any(mode_codes > len(MODES5) - 1):
        raise UnsupportedModelError(f"a node mode {int(mode_codes.max())} is not one of "
                                    f"{len(MODES5)} (BRANCH_LEQ .. BRANCH_MEMBER)")
    if roots.size == 0 or roots.min() < 0 or roots.max() >= n:
        raise UnsupportedModelError("tree_roots points outside the nodes")
    for flags, ix, side in ((true_leaf, true_ix, "true"), (false_leaf, false_ix, "false")):
        bound = np.where(flags == 1, n_leaves, n)
        if np.any(ix < 0) or np.any(ix >= bound):
            raise UnsupportedModelError(f"a node's {side} child points outside the nodes or "
                                        "leaves")
    n_targets = int(raw.get("n_targets", 1))
    if n_targets < 1 or n_targets > MAX_OUTPUTS:
        raise UnsupportedModelError(f"n_targets={n_targets}")
    if leaf_target.min() < 0 or leaf_target.max() >= n_targets:
        raise UnsupportedModelError(f"a leaf weight for target {int(leaf_target.max())} of "
                                    f"{n_targets}")
    agg_code = int(raw.get("aggregate_function", 1))
    post_code = int(raw.get("post_transform", 0))
    if not 0 <= agg_code < len(AGGREGATES5) or not 0 <= post_code < len(POSTS5):
        raise UnsupportedModelError(f"aggregate_function {agg_code} or post_transform "
                                    f"{post_code} is not one ONNX defines")
    agg, post = AGGREGATES5[agg_code], POSTS5[post_code]
    # member values: one NaN-separated run a BRANCH_MEMBER node, in node order
    member_nodes = np.flatnonzero(mode_codes == MODES5.index("BRANCH_MEMBER")).tolist()
    runs: list[list[float]] = []
    if member_nodes:
        if "membership_values" not in raw:
            raise UnsupportedModelError("BRANCH_MEMBER nodes without membership_values")
        mv_type, mv = raw["membership_values"]
        if mv_type != stype:
            raise UnsupportedModelError("membership_values is not of nodes_splits' type")
        cur: list[float] = []
        for v in mv.astype(np.float64).tolist():
            if np.isnan(v):
                runs.append(cur)
                cur = []
            else:
                cur.append(v)
        if cur:
            runs.append(cur)
        if len(runs) < len(member_nodes):
            raise UnsupportedModelError(f"membership_values holds {len(runs)} sets for "
                                        f"{len(member_nodes)} BRANCH_MEMBER nodes")
        for r in runs[:len(member_nodes)]:
            if not r or len(r) > MAX_MEMBERS:
                raise UnsupportedModelError(f"a BRANCH_MEMBER set of {len(r)} values (1 to "
                                            f"{MAX_MEMBERS} are read)")
            if len(r) < 31 and all(0 <= v <= 30 for v in r):
                continue  # ONNX Runtime: x == v, one value after another
            for v in r:  # a big set: integers an int32 holds (x is cast to one)
                if not (np.isfinite(v) and v == int(v) and -2**31 < v < 2**31):
                    raise UnsupportedModelError(
                        f"a BRANCH_MEMBER value {v} is not an integer in int32's range "
                        "(ONNX Runtime looks x up, cast to an int32, in a set of more than "
                        "30 values or of values outside [0, 30])")
    member_of = dict(zip(member_nodes, runs, strict=False))

    # each tree from its root: its nodes and leaves numbered in the order reached
    rows = {k: [] for k in ("tree", "node", "mode", "feature", "value", "tracks", "true",
                            "false")}
    weights = {k: [] for k in ("tree", "node", "id", "w")}
    members: dict[int, list[float]] = {}
    total = 0
    reached: set[int] = set()  # split nodes already in a tree
    for t, root in enumerate(roots.tolist()):
        ids: dict[tuple, int] = {}
        queue: list[tuple] = [("n", root)]
        ids[("n", root)] = 0
        for key in queue:
            kind, ix = key[0], key[1]
            nid = ids[key]
            total += 1
            if total > MAX_NODES:
                raise UnsupportedModelError(f"more than {MAX_NODES} nodes once the trees are "
                                            "numbered")
            row = len(rows["tree"])
            rows["tree"].append(t)
            rows["node"].append(nid)
            if kind == "l":
                rows["mode"].append("LEAF")
                for k in ("feature", "value", "tracks", "true", "false"):
                    rows[k].append(0)
                weights["tree"].append(t)
                weights["node"].append(nid)
                weights["id"].append(int(leaf_target[ix]))
                weights["w"].append(float(leaf_w[ix]))
                continue
            if ix in reached:  # a root repeated, or a node two trees share: each tree's
                # copy would be compiled again (ONNX Runtime walks it again)
                raise UnsupportedModelError(f"tree {t}: node {ix} is in another tree too (a "
                                            "root repeated, or a node two trees share)")
            reached.add(ix)
            children = []
            for flag, child in ((true_leaf[ix], true_ix[ix]), (false_leaf[ix], false_ix[ix])):
                # a leaf may be shared (both sides of a split): each reference its own copy
                key = ("l", int(child), len(ids)) if flag else ("n", int(child))
                if key in ids:
                    raise UnsupportedModelError(f"tree {t}: node {int(child)} is reached twice "
                                                "(a tree's nodes and leaves have one parent)")
                ids[key] = len(ids)
                queue.append(key)
                children.append(ids[key])
            mode = MODES5[int(mode_codes[ix])]
            rows["mode"].append(mode)
            rows["feature"].append(int(features[ix]))
            rows["value"].append(float(splits[ix]) if mode != "BRANCH_MEMBER" else 0.0)
            rows["tracks"].append(int(tracks[ix]))
            rows["true"].append(children[0])
            rows["false"].append(children[1])
            if mode == "BRANCH_MEMBER":
                members[row] = member_of[ix]
    a = {"_double": set() if stype == TensorProto.FLOAT else {"nodes_values"},
         "nodes_modes": rows["mode"], "nodes_treeids": rows["tree"],
         "nodes_nodeids": rows["node"], "nodes_featureids": rows["feature"],
         "nodes_values": np.asarray(rows["value"], dtype=np.float64),
         "nodes_missing_value_tracks_true": rows["tracks"],
         "nodes_truenodeids": rows["true"], "nodes_falsenodeids": rows["false"],
         "aggregate_function": agg}
    if n_targets == 1:
        if post not in ("NONE", "PROBIT"):  # ONNX Runtime transforms one target only with
            # PROBIT, the specification with each: which one the user means is not known
            raise UnsupportedModelError(f"post_transform {post} on one target is not "
                                        "supported (ONNX Runtime applies only PROBIT to one "
                                        "target, the ONNX specification each transform)")
        a.update({"post_transform": post, "n_targets": 1, "target_treeids": weights["tree"],
                  "target_nodeids": weights["node"], "target_ids": weights["id"],
                  "target_weights": np.asarray(weights["w"], dtype=np.float64)})
        return a, False, None, members
    # ONNX Runtime (1.19 to 1.32 at least) reads post_transform 1 as LOGISTIC and 2 as
    # SOFTMAX, the reverse of the ONNX specification's numbers; the scores its users get are
    # the reference: 2 is a softmax (and compile's check against ONNX Runtime would refuse a
    # runtime that changed its reading), 1 is refused
    if post_code == POSTS5.index("SOFTMAX"):
        raise UnsupportedModelError(
            f"{n_targets} targets with post_transform 1 (SOFTMAX in the ONNX specification, "
            "LOGISTIC in ONNX Runtime): refused, the runtimes disagree on it")
    if post_code not in (POSTS5.index("LOGISTIC"), POSTS5.index("SOFTMAX_ZERO")):
        raise UnsupportedModelError(f"{n_targets} targets with post_transform {post}: several "
                                    "targets are read as a multiclass model's softmax only "
                                    "(post_transform 2, ONNX Runtime's SOFTMAX, or 3, "
                                    "SOFTMAX_ZERO)")
    a.update({"post_transform": "SOFTMAX" if post_code == POSTS5.index("LOGISTIC")
              else "SOFTMAX_ZERO", "class_treeids": weights["tree"],
              "class_nodeids": weights["node"], "class_ids": weights["id"],
              "class_weights": np.asarray(weights["w"], dtype=np.float64)})
    return a, True, list(range(n_targets)), members


def _labels(attrs: dict) -> list:
    ints = attrs.get("classlabels_int64s")
    strings = attrs.get("classlabels_strings")
    if ints is not None and strings is not None and list(ints.ints) and list(strings.strings):
        raise UnsupportedModelError("both classlabels_int64s and classlabels_strings are set")
    if ints is not None and list(ints.ints):
        return list(ints.ints)
    return [v.decode() for v in strings.strings] if strings is not None else []


def _n_features(model, node, features: np.ndarray) -> int:
    inputs = {i.name: i for i in model.graph.input}
    declared = None
    if features.size and int(features.max()) >= MAX_FEATURES:
        raise UnsupportedModelError(f"a node reads feature {int(features.max())} (at most "
                                    f"{MAX_FEATURES} features)")
    if node.input and node.input[0] in inputs:
        dims = inputs[node.input[0]].type.tensor_type.shape.dim
        if len(dims) == 2 and dims[1].HasField("dim_value"):
            declared = int(dims[1].dim_value)
    used = int(features.max()) + 1 if features.size else 0
    if declared is not None and used > declared:
        raise UnsupportedModelError(f"a node reads feature {used - 1} of a {declared}-wide "
                                    "input")
    if declared is not None and declared > MAX_FEATURES:
        raise UnsupportedModelError(f"an input {declared} features wide (at most "
                                    f"{MAX_FEATURES})")
    return declared if declared is not None else max(used, 1)


def _int_array(attrs: dict, key: str, n: int | None = None) -> np.ndarray:
    v = np.asarray(attrs.get(key, []), dtype=np.int64).ravel()
    if n is not None and v.shape[0] != n:
        raise UnsupportedModelError(f"attribute {key} has {v.shape[0]} entries, expected {n}")
    return v


def to_ir(source, float32_inputs: bool = False) -> Ensemble:
    """``float32_inputs``: accept a model with a double input whose thresholds are not all
    float32 values, scored as ONNX Runtime scores inputs that are float32 values (the worker
    stages every value as float32); refused without it (``_double_input``)."""
    model = read(source)
    node = tree_node(model)
    try:
        return _to_ir(model, node, float32_inputs)
    except UnsupportedModelError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as exc:
        raise UnsupportedModelError(f"malformed tree-ensemble attributes: {exc}") from None
    except MemoryError:
        raise UnsupportedModelError("the tree ensemble is too large to compile in this "
                                    "process's memory") from None


def _to_ir(model, node, float32_inputs: bool = False) -> Ensemble:
    if node.op_type == "TreeEnsemble":
        a, classifier, labels5, members = _from_opset5(node)
    else:
        a, classifier, labels5, members = _attrs(node), \
            node.op_type == "TreeEnsembleClassifier", None, {}
    modes = [m.decode() if isinstance(m, bytes) else str(m) for m in a.get("nodes_modes", [])]
    n = len(modes)
    if n == 0 or n > MAX_NODES:
        raise UnsupportedModelError(f"{n} nodes: not a tree ensemble this compiler reads")
    tree_ids = _int_array(a, "nodes_treeids", n)
    node_ids = _int_array(a, "nodes_nodeids", n)
    features = _int_array(a, "nodes_featureids", n)
    true_ids = _int_array(a, "nodes_truenodeids", n)
    false_ids = _int_array(a, "nodes_falsenodeids", n)
    values = np.asarray(a.get("nodes_values", np.zeros(n)), dtype=np.float64).ravel()
    if values.shape[0] != n:
        raise UnsupportedModelError(f"nodes_values has {values.shape[0]} entries, expected {n}")
    tracks = a.get("nodes_missing_value_tracks_true")
    tracks = np.zeros(n, dtype=np.int64) if tracks is None or len(tracks) == 0 else \
        _int_array(a, "nodes_missing_value_tracks_true", n)
    if np.any((tracks != 0) & (tracks != 1)):  # ONNX Runtime tracks only where it is 1
        raise UnsupportedModelError("nodes_missing_value_tracks_true holds a value other than "
                                    "0 or 1")
    tracks = tracks.astype(bool)
    if np.any(features < 0):
        raise UnsupportedModelError("a node reads a negative feature index")
    for key, ids in (("nodes_treeids", tree_ids), ("nodes_nodeids", node_ids)):
        if ids.size and (ids.min() < 0 or ids.max() > MAX_ID):
            raise UnsupportedModelError(f"{key} outside [0, 2^31)")
    n_features = _n_features(model, node, features)

    prefix = "class" if classifier else "target"
    w_tree = _int_array(a, f"{prefix}_treeids")
    w_node = _int_array(a, f"{prefix}_nodeids", w_tree.shape[0])
    w_id = _int_array(a, f"{prefix}_ids", w_tree.shape[0])
    w_val = np.asarray(a.get(f"{prefix}_weights", []), dtype=np.float64).ravel()
    if w_val.shape[0] != w_tree.shape[0]:
        raise UnsupportedModelError(f"{prefix}_weights and {prefix}_treeids differ in length")
    if classifier:
        labels = labels5 if labels5 is not None else \
            _labels({x.name: x for x in node.attribute})
        n_out = len(labels)
        if n_out < 2 or n_out > MAX_OUTPUTS:
            raise UnsupportedModelError(f"a classifier with {n_out} class labels")
    else:
        labels = []
        n_out = int(a.get("n_targets", 1))
        if n_out != 1:
            raise UnsupportedModelError(f"n_targets={n_out}: one regression target is supported")
    if w_id.size and (w_id.min() < 0 or w_id.max() >= n_out):
        raise UnsupportedModelError(f"a leaf weight for output {int(w_id.max())} of {n_out}")

    agg = str(a.get("aggregate_function", "SUM"))
    if isinstance(agg, bytes):
        agg = agg.decode()
    if agg not in ("SUM", "AVERAGE", "MIN", "MAX"):
        raise UnsupportedModelError(f"aggregate_function {agg} is not one ONNX defines (SUM, "
                                    "AVERAGE, MIN, MAX)")
    if agg in ("MIN", "MAX") and classifier:
        # ONNX Runtime's classifiers always add (TreeAggregatorClassifier); a TreeEnsemble of
        # several targets is read here as one
        raise UnsupportedModelError(f"aggregate_function {agg} on a classifier (or several "
                                    "targets) is not supported: one regression target is")
    post = str(a.get("post_transform", "NONE"))
    if post not in ("NONE", "LOGISTIC", "SOFTMAX", "PROBIT", "SOFTMAX_ZERO"):
        raise UnsupportedModelError(f"post_transform {post} is not supported (NONE, LOGISTIC, "
                                    "SOFTMAX; PROBIT on a regressor; SOFTMAX_ZERO on a "
                                    "multiclass classifier)")
    base = np.asarray(a.get("base_values", []), dtype=np.float64).ravel()

    # leaf weights: (tree, node) -> [(output, weight)]
    weights: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for t, nd, i, v in zip(w_tree.tolist(), w_node.tolist(), w_id.tolist(), w_val.tolist(),
                           strict=True):
        weights.setdefault((t, nd), []).append((i, v))
    if agg in ("MIN", "MAX"):
        _check_min_max(agg, modes, tree_ids, node_ids, weights)

    # the output columns: a binary classifier with weights on one class is ONNX Runtime's
    # binary case (one score); otherwise one column per class (or the regression target)
    used = sorted({i for ws in weights.values() for i, _v in ws})
    binary_one = classifier and n_out == 2 and len(used) <= 1
    positive = all(v >= 0 for v in w_val.tolist())
    if classifier and n_out == 2 and not binary_one:
        raise UnsupportedModelError("a two-class model with weights on both classes is not "
                                    "supported (weights on the positive class only, as the "
                                    "exporters write them, are)")
    if classifier and n_out == 2 and base.size not in (0, 1):
        raise UnsupportedModelError(f"{base.size} base_values for a binary classifier")
    if binary_one and used == [1] and post != "NONE":
        raise UnsupportedModelError(f"a binary classifier with weights on class 1 only and "
                                    f"post_transform {post} (ONNX Runtime's output is not a "
                                    "probability then)")
    G = 1 if binary_one or not classifier else n_out
    if n * G > MAX_LEAF_VALUES:
        raise UnsupportedModelError(f"{n} nodes x {G} outputs: too large")
    col = (lambda i: 0) if G == 1 else (lambda i: i)

    # ONNX Runtime reads each tree from its first-listed node (the root) and counts a tree
    # per run of equal ids: a tree's nodes must be listed together
    order = list(dict.fromkeys(tree_ids.tolist()))
    runs = 1 + int(np.count_nonzero(tree_ids[1:] != tree_ids[:-1]))
    if runs != len(order):
        raise UnsupportedModelError("a tree's nodes are not listed together (tree ids "
                                    "interleaved)")
    by_tree: dict[int, list[int]] = {}
    for k, t in enumerate(tree_ids.tolist()):
        by_tree.setdefault(t, []).append(k)
    trees, groups = [], []
    # what unfolding EQ, NEQ and MEMBER splits may add (each emits a subtree more than once):
    # four times the file's nodes (at least 2^20) in all trees together, and leaf values
    # (nodes x outputs) twice the file's (at least 2^23): a file of a few hundred bytes could
    # otherwise unfold to gigabytes
    from onnx import TensorProto

    # ONNX Runtime's sums are double for a double input (its thresholds then compare doubles:
    # exact for inputs that are float32 values, which the worker stages), float32 otherwise
    double_input = _input_type(model, node) == TensorProto.DOUBLE
    budget = {"nodes": max(4 * n, 1 << 20),
              "values": min(MAX_LEAF_VALUES, max(2 * n * G, 1 << 23)),
              # ONNX Runtime merges BRANCH_EQ runs into a bit set as wide as its threshold
              # type: 32 values for float, 64 for double (_chain_nan_true)
              "merge": 64 if double_input else 32}
    for t in order:
        tree, group = _tree(t, by_tree[t], node_ids, modes, features, values, tracks, true_ids,
                            false_ids, weights, G, col, members, budget,
                            agg in ("MIN", "MAX"))
        trees.append(tree)
        groups.append(group)

    n_trees = len(trees)
    divisor = float(n_trees) if agg == "AVERAGE" else 1.0
    b = np.zeros(G)
    if base.size:
        if binary_one:
            b[0] = base[0]
        elif base.size == G:
            b[:] = base
        else:
            raise UnsupportedModelError(f"{base.size} base_values for {G} outputs")
    if agg in ("MIN", "MAX"):
        # ONNX Runtime: the smallest (largest) leaf of the trees, then + base_values[0];
        # the kernels start from +inf (-inf) and add the base after the last tree
        b = b.copy()
    elif agg == "SUM" and np.any(b != 0):
        # ONNX Runtime adds the base values after the trees' float32 sum: a last tree of one
        # leaf per output adds them in the same place (the ir's base comes first)
        if G > 1 and -1 in groups:  # trees carry every class: so does the base's
            trees.append(Tree.constant(b))
            groups.append(-1)
        else:
            for g in range(G):
                if b[g] != 0:
                    trees.append(Tree.constant(b[g:g + 1]))
                    groups.append(g if G > 1 else 0)
        b = np.zeros(G)
    n_units = len(trees)
    b = b * divisor  # AVERAGE: ir (base + sum) / n, ONNX sum / n + base (within an ulp)
    if classifier:
        task = "binary" if n_out == 2 else "multiclass"
        if post == "LOGISTIC" and task == "binary":
            link = "sigmoid"
        elif post == "SOFTMAX" and task == "multiclass":
            link = "softmax"
        elif post == "SOFTMAX_ZERO" and task == "multiclass":
            link = "softmax_zero"  # kernels.apply_link, as ONNX Runtime computes it
        elif post == "NONE" and positive:
            link = "vote"  # the scores are probabilities already (forests)
        else:
            raise UnsupportedModelError(f"post_transform {post} on a {task} classifier with "
                                        f"{'positive' if positive else 'signed'} weights is "
                                        "not supported")
    else:
        # ONNX Runtime applies PROBIT to one target (probit.h) and no other transform
        task, link = "regression", "probit" if post == "PROBIT" else "identity"
        if post not in ("NONE", "PROBIT"):
            raise UnsupportedModelError(f"post_transform {post} on a regressor")
    opset = next((o.version for o in model.opset_import if o.domain == ML), 1)
    if a["_double"] and not double_input:
        raise UnsupportedModelError("double attributes (*_as_tensor) with a float input")
    producer = f"{model.producer_name} {model.producer_version}".strip()
    notes = [f"exported by {producer}"] if producer else []
    if double_input:
        notes.append(_double_input(modes, values, float32_inputs))
    return Ensemble(
        trees=trees,
        tree_group=np.asarray(groups, dtype=np.int32),
        unit_ptr=np.arange(n_units + 1, dtype=np.int64),
        n_outputs=G,
        base=b,
        divisor=divisor,
        link=link,
        task=task,
        n_features=n_features,
        feature_names=[f"f{i}" for i in range(n_features)],
        classes=labels,
        accumulate="float64" if double_input else "float32",
        aggregate=agg.lower() if agg in ("MIN", "MAX") else "sum",
        objective=f"{agg.lower()}/{post.lower()}",
        source=f"onnx {node.op_type} (ai.onnx.ml opset {opset})",
        kind=node.op_type,
        notes=notes,
    )


def _double_input(modes, values, float32_inputs: bool) -> str:
    """A double input: ONNX Runtime compares the double value with the double threshold, and
    the worker stages every value as float32. Where every threshold is a float32 value the
    two agree on every float32 input and on a double one unless it lies within half a float32
    step above a threshold; a threshold between two float32 values (a double export of
    scikit-learn's float64 midpoints in ``nodes_values_as_tensor``) sends the inputs equal to
    it, and the doubles just above it, the other way: refused by name unless
    ``float32_inputs``."""
    thr = np.asarray([v for m, v in zip(modes, values, strict=True)
                      if m not in ("LEAF", "BRANCH_MEMBER")], dtype=np.float64)
    with np.errstate(over="ignore"):
        off = thr[np.isfinite(thr) & (thr.astype(np.float32).astype(np.float64) != thr)]
    if off.size and not float32_inputs:
        raise UnsupportedModelError(
            f"a double input with {off.size} of {thr.size} thresholds between two float32 "
            f"values (e.g. {float(off[0])!r}): ONNX Runtime compares the double input with them, "
            "the worker stages every input as float32, so an input equal to such a threshold "
            "goes the other way. Export with a float input (skl2onnx's FloatTensorType, its "
            "default: the trees scikit-learn itself predicts with), or compile with "
            "--float32-inputs (Python: float32_inputs=True) to accept ONNX Runtime's scores "
            "for inputs that are float32 values")
    return (f"double input staged as float32: {off.size} of {thr.size} thresholds between "
            "two float32 values (accepted with float32_inputs), exact for inputs that are "
            "float32 values" if off.size else
            "double input staged as float32: every threshold a float32 value, exact for "
            "float32 inputs and for doubles not within half a float32 step above a threshold")


def _check_min_max(agg: str, modes, tree_ids, node_ids, weights: dict) -> None:
    """MIN and MAX take each tree's one leaf weight: a leaf with none, or with several (which
    ONNX Runtime reads differently by path), and a NaN weight (whose place in the order
    decides ONNX Runtime's result) are refused by name."""
    for k, mode in enumerate(modes):
        if mode != "LEAF":
            continue
        key = (int(tree_ids[k]), int(node_ids[k]))
        ws = weights.get(key, [])
        if len(ws) != 1:
            raise UnsupportedModelError(f"aggregate_function {agg}: tree {key[0]} leaf "
                                        f"{key[1]} has {len(ws)} weights (one is supported)")
        if np.isnan(ws[0][1]):
            raise UnsupportedModelError(f"aggregate_function {agg}: tree {key[0]} leaf "
                                        f"{key[1]} has a NaN weight")


def _tree(t, rows, node_ids, modes, features, values, tracks, true_ids, false_ids, weights,
          G: int, col, members: dict, budget: dict, one_weight: bool = False):
    """One ONNX tree (its attribute rows) as an ir.Tree, nodes renumbered from the root. With
    ``one_weight`` (MIN, MAX: each leaf one weight, _check_min_max) a leaf is its weight as
    it is, a -0.0 kept (ONNX Runtime keeps it); otherwise the weights are added from 0.0."""
    where = f"tree {t}"
    pos = {}
    for k in rows:
        nid = int(node_ids[k])
        if nid in pos:
            raise UnsupportedModelError(f"{where}: node id {nid} appears twice")
        pos[nid] = k
    root = int(node_ids[rows[0]])  # ONNX Runtime's root: the tree's first-listed node
    # depth first from the root: every node reached, none on a cycle. A node may have several
    # parents (onnxmltools' BRANCH_EQ chains for a categorical split share the subtree every
    # listed category goes to): it is emitted once per path that reaches it
    state = {root: 1}  # 1: on the current path, 2: done
    path = [(root, _children(pos[root], modes, true_ids, false_ids))]
    longest: dict[int, int] = {}  # the deepest path down from each node (children first)
    unfolded: dict[int, int] = {}
    cap = min(MAX_TREE_NODES, budget["nodes"]) + 1
    while path:
        nid, kids = path[-1]
        if not kids:
            state[nid] = 2
            path.pop()
            k = pos[nid]
            kids_k = _children(k, modes, true_ids, false_ids)
            longest[nid] = 0 if not kids_k else 1 + max(longest[c] for c in kids_k)
            if longest[nid] > MAX_DEPTH:
                raise UnsupportedModelError(f"{where}: deeper than {MAX_DEPTH}")
            # the nodes this one unfolds to, each shared node once per path (at least: an
            # equality split adds more); counted before anything is emitted, capped
            unfolded[nid] = min(cap, 1 + sum(unfolded[c] for c in kids_k))
            if unfolded[nid] >= cap:
                raise UnsupportedModelError(
                    f"{where}: its shared nodes (several parents) unfold to more than "
                    f"{cap - 1} nodes, emitted once per path")
            continue
        child = kids.pop()
        if child not in pos:
            raise UnsupportedModelError(f"{where}: node {nid} points outside the tree")
        if state.get(child) == 1:
            raise UnsupportedModelError(f"{where}: node {child} is on a cycle (it leads back "
                                        "to itself)")
        if child not in state:
            if len(path) >= MAX_DEPTH:
                raise UnsupportedModelError(f"{where}: deeper than {MAX_DEPTH}")
            state[child] = 1
            path.append((child, _children(pos[child], modes, true_ids, false_ids)))
    if len(state) != len(rows):
        raise UnsupportedModelError(f"{where}: {len(rows) - len(state)} nodes not reached from "
                                    "its first-listed node (ONNX Runtime's root)")
    # the ir's nodes, emitted from the root; BRANCH_EQ and NEQ become two nodes each (x > t,
    # then x > the float32 below t), and their "not equal" side is emitted twice
    feature: list[int] = []
    threshold: list[np.float32] = []
    left: list[int] = []
    right: list[int] = []
    default_left: list[bool] = []
    value: list[np.ndarray] = []

    def new() -> int:
        feature.append(-1)
        threshold.append(np.float32(0))
        left.append(-1)
        right.append(-1)
        default_left.append(False)
        value.append(np.zeros(G))
        budget["nodes"] -= 1
        budget["values"] -= G
        if len(feature) > MAX_TREE_NODES or budget["nodes"] < 0 or budget["values"] < 0:
            raise UnsupportedModelError(f"{where}: more than {MAX_TREE_NODES} nodes in a tree, "
                                        "or four times the file's nodes in all (twice its "
                                        "leaf values), once the BRANCH_EQ, NEQ and MEMBER "
                                        "splits and the shared nodes are unfolded")
        return len(feature) - 1

    def split(i: int, f: int, thr, to_left: int, to_right: int, nan_left: bool) -> None:
        feature[i], threshold[i] = f, np.float32(thr)
        left[i], right[i], default_left[i] = to_left, to_right, nan_left

    groups = set()
    stack = [(root, new())]
    while stack:
        nid, i = stack.pop()
        k = pos[nid]
        mode = modes[k]
        if mode == "BRANCH_EQ":
            chain = _eq_chain(k, pos, modes, features, true_ids, false_ids)
            if len(chain) > 1:  # x in {v1, ..., vk} -> one true subtree, else the chain's end
                vs = [float(values[c]) for c in chain]
                bad = next((v for v in vs if np.isnan(v) or v == -np.inf), None)
                if bad is not None:
                    raise UnsupportedModelError(f"{where} node {nid}: BRANCH_EQ with "
                                                f"threshold {bad}")
                # x == v: only a float32 value can equal it; the float32 in (below(v), v]
                spans = [(float(_below(v)), v) for v in sorted(set(vs))
                         if float(np.float32(v)) == v]
                _emit_spans(i, int(features[k]), spans,
                            _chain_nan_true(chain, vs, tracks, budget["merge"]),
                            int(true_ids[k]), int(false_ids[chain[-1]]), new, split, stack,
                            f"{where} node {nid}: a chain of {len(chain)} BRANCH_EQ nodes")
                continue
        if mode == "LEAF":
            for out, w in weights.get((t, nid), []):
                if one_weight:
                    value[i][col(out)] = w
                else:
                    value[i][col(out)] += w
                groups.add(out)
            continue
        if mode not in MODES:
            raise UnsupportedModelError(f"{where} node {nid}: unknown node mode {mode!r}")
        if mode == "BRANCH_MEMBER":
            _member(i, int(features[k]), members[k], bool(tracks[k]), int(true_ids[k]),
                    int(false_ids[k]), new, split, stack)
            continue
        v = values[k]
        if np.isnan(v) or (mode not in ("BRANCH_LEQ", "BRANCH_GT") and v == -np.inf):
            raise UnsupportedModelError(f"{where} node {nid}: {mode} with threshold {v}")
        f = int(features[k])
        on_true, on_false = int(true_ids[k]), int(false_ids[k])
        a, b = new(), new()
        if mode in ("BRANCH_LEQ", "BRANCH_LT"):  # true: x <= t or x < t, left
            thr = float32_at_or_below(np.array([v]))[0] if mode == "BRANCH_LEQ" else _below(v)
            split(i, f, thr, a, b, nan_left=bool(tracks[k]))
            stack += [(on_true, a), (on_false, b)]
        elif mode in ("BRANCH_GTE", "BRANCH_GT"):  # true: x >= t or x > t, right
            thr = float32_at_or_below(np.array([v]))[0] if mode == "BRANCH_GT" else _below(v)
            split(i, f, thr, a, b, nan_left=not tracks[k])
            stack += [(on_false, a), (on_true, b)]
        else:
            # x > t: not equal (right); else x > below(t): equal (right), else not equal
            c, d = new(), new()
            equal, unequal = (on_true, on_false) if mode == "BRANCH_EQ" else \
                (on_false, on_true)
            # NaN: x == t is false, x != t true; a tracked NaN goes to the true side
            nan_equal = mode == "BRANCH_EQ" and bool(tracks[k])
            split(i, f, float32_at_or_below(np.array([v]))[0], a, b, nan_left=nan_equal)
            split(a, f, _below(v), c, d, nan_left=False)
            stack += [(unequal, b), (equal, d), (unequal, c)]
    m = len(feature)
    value_arr = np.asarray(value, dtype=np.float64).reshape(m, G)
    if G == 1 or len(groups) <= 1:
        group = int(next(iter(groups))) if G > 1 and groups else 0
        if G > 1:
            value_arr = value_arr[:, group:group + 1]
    else:
        group = -1
    return Tree(feature=np.asarray(feature, dtype=np.int32),
                threshold=np.asarray(threshold, dtype=np.float32),
                left=np.asarray(left, dtype=np.int32), right=np.asarray(right, dtype=np.int32),
                default_left=np.asarray(default_left, dtype=bool), value=value_arr), group


def _member(i: int, f: int, values, tracks: bool, on_true: int, on_false: int, new, split,
            stack) -> None:
    """``x in values`` (BRANCH_MEMBER) at ir node ``i``, as ONNX Runtime decides it. A set of
    fewer than 31 values, all in [0, 30], becomes a chain of ``x == v`` tests (float
    equality); any other set is a "big set" of integers that x, cast to an int32 (truncated
    toward zero), is looked up in: member v holds [v, v + 1) for v > 0, (v - 1, v] for v < 0
    and (-1, 1) for 0; x beyond int32's range and +-inf are in none. NaN: a member when
    ``tracks``. Either way the members are float32 intervals; their ends cut the line, and a
    balanced search over the cuts ends in each piece, which continues to the true or false
    subtree (each emitted once a piece)."""
    small = len(values) < 31 and all(0 <= v <= 30 for v in values)
    spans = []  # (lo, hi): the float32 x with lo < x <= hi are members
    for v in sorted(set(values)):
        if small:  # x == v: only a float32 value can equal it
            if float(np.float32(v)) == v:
                spans.append((float(_below(v)), v))
            continue
        lo, hi = (v - 1, v + 1) if v == 0 else (v, v + 1) if v > 0 else (v - 1, v)
        # v > 0: x >= lo and x < hi; v < 0: x > lo and x <= hi; 0: x > lo and x < hi
        low = float(_below(lo)) if v > 0 else float(float32_at_or_below(np.array([lo]))[0])
        high = float(float32_at_or_below(np.array([float(hi)]))[0]) if v < 0 else \
            float(_below(hi))
        spans.append((low, high))
    _emit_spans(i, f, spans, tracks, on_true, on_false, new, split, stack,
                "a BRANCH_MEMBER node")


def _emit_spans(i: int, f: int, spans, nan_true: bool, on_true: int, on_false: int, new,
                split, stack, what: str) -> None:
    """At ir node ``i``: the float32 x in one of ``spans`` (lo, hi] go to ``on_true``, the
    others to ``on_false``, NaN to ``on_true`` when ``nan_true``. The spans' ends cut the
    line, and a balanced search over the cuts ends in each piece, which continues to the true
    or false subtree (emitted once a piece)."""
    cuts = sorted({c for span in spans for c in span})
    lo_ = np.array([s_[0] for s_ in spans])
    hi_ = np.array([s_[1] for s_ in spans])
    # piece j: (cuts[j - 1], cuts[j]] (j = 0 from -inf; the last one above the last cut: none)
    pieces = [bool(np.any((lo_ < c) & (c <= hi_))) for c in cuts] + [False]
    if nan_true and not any(pieces):
        raise UnsupportedModelError(f"{what} no float32 value is a member of, with missing "
                                    "values tracked true")
    nan_to = next(j for j, m in enumerate(pieces) if m == nan_true)

    def build(node: int, lo: int, hi: int) -> None:
        if lo == hi:
            stack.append((on_true if pieces[lo] else on_false, node))
            return
        mid = (lo + hi) // 2  # right: x > cuts[mid], pieces mid + 1 .. hi
        left, right = new(), new()
        split(node, f, np.float32(cuts[mid]), left, right, nan_left=nan_to <= mid)
        build(left, lo, mid)
        build(right, mid + 1, hi)

    build(i, 0, len(cuts))


def _children(k: int, modes, true_ids, false_ids) -> list[int]:
    """The node ids attribute row ``k`` leads to (none for a leaf)."""
    return [] if modes[k] == "LEAF" else [int(false_ids[k]), int(true_ids[k])]


def _chain_nan_true(chain: list[int], vs: list[float], tracks, width: int = 32) -> bool:
    """Where ONNX Runtime (1.32, measured on 1,500 random chains) sends NaN down a BRANCH_EQ
    chain: it merges each run of consecutive tests whose values are whole numbers in [1,
    ``width``] (32 for a float input, 64 for a double one: its bit set is as wide as the
    threshold type) into one set test that keeps the run's first
    ``missing_value_tracks_true``, so a NaN goes to the true side when a test standing alone,
    or the first of a run, tracks it."""
    def merges(v: float) -> bool:
        return float(v).is_integer() and 1 <= v <= width

    return any(bool(tracks[c]) for j, c in enumerate(chain)
               if not (j and merges(vs[j]) and merges(vs[j - 1])))


def _eq_chain(k: int, pos: dict, modes, features, true_ids, false_ids) -> list[int]:
    """The rows of the BRANCH_EQ chain from row ``k``: each next one the false child of the
    last, on the same feature, with the same true child (one category set, as onnxmltools
    exports a LightGBM categorical split). Bounded by the tree's rows (no cycle: _tree)."""
    chain = [k]
    while len(chain) <= len(pos):
        nxt = pos.get(int(false_ids[chain[-1]]))
        if nxt is None or modes[nxt] != "BRANCH_EQ" or features[nxt] != features[k] or \
                int(true_ids[nxt]) != int(true_ids[k]):
            break
        chain.append(nxt)
    return chain


def _below(v: float) -> np.float32:
    """The largest float32 below ``v`` (a float32 or a double threshold)."""
    v32 = np.float32(v)
    if float(v32) < v:  # a double between two float32s: the one below is at or below it
        return v32
    return float32_below(np.array([v], dtype=np.float64))[0]


def reference(source, X: np.ndarray, raw: bool = False) -> np.ndarray:
    """ONNX Runtime's scores for float32 rows, from the tree-ensemble node alone (the nodes
    around it pass its outputs through): probabilities (n, n_classes) or values (n, 1).
    ``raw``: the scores before the post transform (the margins; a binary classifier's
    positive-class column only)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    model = read(source)
    node = tree_node(model)
    n_features = X.shape[1]
    elem = _input_type(model, node)
    x = helper.make_tensor_value_info("X", elem, [None, n_features])
    if node.op_type == "TreeEnsembleClassifier":
        strings = any(a.name == "classlabels_strings" for a in node.attribute)
        outs = [helper.make_tensor_value_info(
                    "label", TensorProto.STRING if strings else TensorProto.INT64, None),
                helper.make_tensor_value_info("scores", TensorProto.FLOAT, None)]
    else:
        outs = [helper.make_tensor_value_info("scores", TensorProto.FLOAT, None)]
    bare = helper.make_node(node.op_type, ["X"], [o.name for o in outs], domain=ML)
    bare.attribute.extend(a for a in node.attribute if not (raw and a.name == "post_transform"))
    graph = helper.make_graph([bare], "tree", [x], outs)
    opset = next((o.version for o in model.opset_import if o.domain == ML), 1)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid(ML, opset),
                                                helper.make_opsetid("", 17)])
    m.ir_version = min(model.ir_version or 8, 10) or 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    X = np.ascontiguousarray(X, dtype=np.float32)  # the worker's rows, widened if need be
    got = _run(m, "scores", X.astype(np.float64) if elem == TensorProto.DOUBLE else X)
    got = np.asarray(got, dtype=np.float64).reshape(X.shape[0], -1)
    if raw and node.op_type == "TreeEnsembleClassifier" and got.shape[1] == 2:
        got = got[:, 1:]  # the binary case: [-s, s] or [1 - s, s]
    return got


def _input_type(model, node) -> int:
    """The element type of the tree node's input (FLOAT unless the graph declares DOUBLE)."""
    from onnx import TensorProto

    for i in model.graph.input:
        if node.input and i.name == node.input[0]:
            t = i.type.tensor_type.elem_type
            return t if t in (TensorProto.FLOAT, TensorProto.DOUBLE) else TensorProto.FLOAT
    return TensorProto.FLOAT


def _run(model, output: str, X: np.ndarray):
    """One output of ``model`` for ``X`` in ONNX Runtime (one thread); a model it refuses
    (or a run that fails) is UnsupportedModelError, not a traceback."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        return sess.run([output], {name: X})[0]
    except Exception as exc:  # noqa: BLE001 (onnxruntime's own error types)
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsupportedModelError(f"ONNX Runtime refuses the model: {text}") from None


def reference_full(source, X: np.ndarray) -> np.ndarray:
    """What the user's whole graph returns in ONNX Runtime: probabilities (n, n_classes)
    (a ZipMap's maps read in the tree's label order) or values (n, 1)."""
    from onnx import TensorProto

    model = read(source)
    node = tree_node(model)
    output = _check_wiring(model, node)
    elem = _input_type(model, node)
    X = np.ascontiguousarray(X, dtype=np.float32)
    got = _run(model, output, X.astype(np.float64) if elem == TensorProto.DOUBLE else X)
    if isinstance(got, list):  # ZipMap: one {label: probability} per row
        labels = _labels({x.name: x for x in node.attribute})
        got = [[row[label] for label in labels] for row in got]
    return np.asarray(got, dtype=np.float64).reshape(X.shape[0], -1)
