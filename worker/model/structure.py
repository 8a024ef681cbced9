"""Structural check of a compiled model's meta and arrays, run at load before any kernel reads
them: the artifact's checksum proves the bytes are the ones written, not that a writer told
the truth. Every index the kernels follow is proved in range, every leaf is encoded as the
walks require, every shape and dtype is the one the format says. A violation raises
``ArtifactError`` naming the field.
"""

from __future__ import annotations

import math

import numpy as np

from .artifact import ArtifactError
from .cathash import MAX_HASHES
from .ir import entry_size

TASKS = {"binary", "multiclass", "regression"}
LINKS = {"identity", "sigmoid", "sigmoid2", "softmax", "vote", "exp", "probit", "softmax_zero"}
LAYOUTS = {"padded", "compact"}
MAX_PADDED_DEPTH = 20  # the packer's limit: 2^20 leaves per tree, shifts done in 64 bits
KEY_LEAF = 0x80000000
KEY_SPECIAL = 0x40000000  # compact: the threshold word is the offset of an entry in `cats`
INF_BITS = 0x7F800000  # float32 +inf: a compact leaf's threshold (a leaf steps onto itself)
MAX_FEATURES = 1 << 29  # node keys hold 2 * feature + 1 in 30 bits


def _fail(field: str, what: str):
    raise ArtifactError(f"invalid compiled model: {field}: {what}")


def _int(meta: dict, key: str, lo: int, hi: int) -> int:
    v = meta.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        _fail(f"meta.{key}", f"{v!r} is not an integer in [{lo}, {hi}]")
    return v


def _array(arrays: dict, name: str, dtype, ndim: int, shape: tuple | None = None) -> np.ndarray:
    a = arrays.get(name)
    if a is None:
        _fail(f"arrays.{name}", "missing")
    if a.dtype != np.dtype(dtype):
        _fail(f"arrays.{name}", f"dtype {a.dtype}, expected {np.dtype(dtype)}")
    if a.ndim != ndim:
        _fail(f"arrays.{name}", f"{a.ndim}-D, expected {ndim}-D")
    if shape is not None:
        for axis, want in enumerate(shape):
            if want is not None and a.shape[axis] != want:
                _fail(f"arrays.{name}", f"shape {a.shape}, expected {shape} (None: any)")
    return a


def _layout_choice(c, layout: str) -> None:
    """The compile's record of its layout and kernel choice (worker/model/layout.py): the
    kernel it names is the one loading takes, so it must be one the kernels know."""
    if not isinstance(c, dict):
        _fail("meta.layout_choice", "not a mapping")
    if c.get("layout") != layout:
        _fail("meta.layout_choice.layout", f"{c.get('layout')!r}, the model's layout is "
              f"{layout!r}")
    if c.get("kernel") not in ("walk", "quickscorer", "oblivious", "lanes", "masks"):
        _fail("meta.layout_choice.kernel", f"{c.get('kernel')!r}, expected walk, quickscorer, "
              "oblivious, lanes or masks")
    for key in ("us_per_row", "not_candidates"):
        v = c.get(key, {})
        if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
            _fail(f"meta.layout_choice.{key}", "not a mapping of candidate names")
    if not all(isinstance(t, (int, float)) and not isinstance(t, bool)
               for t in c.get("us_per_row", {}).values()):
        _fail("meta.layout_choice.us_per_row", "a timing that is not a number")


def check(meta: dict, arrays: dict[str, np.ndarray]) -> None:
    """Raise ArtifactError unless the kernels can walk this model safely."""
    if not isinstance(meta, dict):
        _fail("meta", "not a mapping")
    for key, kind in (("task", str), ("link", str), ("layout", str), ("accumulate", str),
                      ("feature_names", list), ("classes", list)):
        if not isinstance(meta.get(key), kind):
            _fail(f"meta.{key}", f"{meta.get(key)!r} is not a {kind.__name__}")
    for key in ("objective", "source", "kind", "notes"):
        if key not in meta:
            _fail(f"meta.{key}", "missing")
    if meta["task"] not in TASKS:
        _fail("meta.task", f"{meta['task']!r}, expected one of {sorted(TASKS)}")
    if meta["link"] not in LINKS:
        _fail("meta.link", f"{meta['link']!r}, expected one of {sorted(LINKS)}")
    layout = meta["layout"]
    if layout not in LAYOUTS:
        _fail("meta.layout", f"{layout!r}, expected padded or compact")
    if "layout_choice" in meta:
        _layout_choice(meta["layout_choice"], layout)
    nf = _int(meta, "n_features", 1, MAX_FEATURES - 1)
    G = _int(meta, "n_outputs", 1, 1 << 16)
    depth = _int(meta, "depth", 0, MAX_PADDED_DEPTH if layout == "padded" else 0)
    _int(meta, "max_depth", 0, 1 << 20)
    names = meta["feature_names"]
    if len(names) != nf or not all(isinstance(n, str) for n in names):
        _fail("meta.feature_names", f"{len(names)} names for {nf} features (or not strings)")
    if len(set(names)) != nf:
        _fail("meta.feature_names", "a feature is named twice")
    cats = meta.get("categories", {})
    if not isinstance(cats, dict) or not all(
            k in names and isinstance(v, list) and all(isinstance(c, str) for c in v)
            for k, v in cats.items()):
        _fail("meta.categories", "not a mapping of feature names to lists of strings")
    hashed = meta.get("category_hashes", {})
    if not isinstance(hashed, dict) or not all(
            k in names and k not in cats and isinstance(v, list) and len(v) <= MAX_HASHES
            and all(type(h) is int and 0 <= h < 1 << 32 for h in v) and len(set(v)) == len(v)
            for k, v in hashed.items()):
        _fail("meta.category_hashes", "not a mapping of feature names (without categories) to "
              f"lists of at most {MAX_HASHES} distinct 32-bit hashes")
    # the combinations the loaders write (the link code and the output shape follow them)
    task, link, n_classes = meta["task"], meta["link"], len(meta["classes"])
    want = {"binary": (G == 1 and n_classes == 2, {"sigmoid", "sigmoid2", "identity", "vote"}),
            "multiclass": (G == n_classes >= 2, {"softmax", "vote", "softmax_zero"}),
            "regression": (G == 1 and n_classes == 0,
                           {"identity", "sigmoid", "exp", "probit"})}[task]
    if not want[0]:
        _fail("meta.classes", f"{n_classes} classes and {G} outputs do not fit a {task} model")
    if link not in want[1]:
        _fail("meta.link", f"{link!r} is not a link of a {task} model")
    divisor = meta.get("divisor")
    if isinstance(divisor, bool) or not isinstance(divisor, (int, float)) \
            or not math.isfinite(divisor) or divisor <= 0:
        _fail("meta.divisor", f"{divisor!r} is not a finite number > 0")
    acc = {"float32": np.float32, "float64": np.float64}.get(meta["accumulate"])
    if acc is None:
        _fail("meta.accumulate", f"{meta['accumulate']!r}, expected float32 or float64")
    aggregate = meta.get("aggregate", "sum")
    if aggregate not in ("sum", "min", "max"):
        _fail("meta.aggregate", f"{aggregate!r}, expected sum, min or max")
    if aggregate != "sum" and (task != "regression" or divisor != 1):
        _fail("meta.aggregate", f"{aggregate} on a {task} model with divisor {divisor} (the "
              "ONNX loader writes it for one-target regressors only)")

    group = _array(arrays, "tree_group", np.int32, 1)
    n_trees = group.shape[0]
    if n_trees == 0:
        _fail("arrays.tree_group", "a model needs at least one tree")
    if group.min() < -1 or group.max() >= G:
        _fail("arrays.tree_group", f"an output index outside [-1, {G})")
    tdepth = _array(arrays, "tree_depth", np.int32, 1, (n_trees,))
    if tdepth.min() < 0 or (layout == "padded" and tdepth.max() > depth):
        _fail("arrays.tree_depth", "a tree depth outside the layout's depth")
    unit_ptr = _array(arrays, "unit_ptr", np.int64, 1)
    if unit_ptr.shape[0] < 2 or unit_ptr[0] != 0 or unit_ptr[-1] != n_trees \
            or np.any(unit_ptr[1:] <= unit_ptr[:-1]):  # compared, not subtracted: no overflow
        _fail("arrays.unit_ptr", f"not strictly increasing from 0 to the tree count {n_trees}")
    leaves = _array(arrays, "leaves", acc, 2)
    width = leaves.shape[1]
    if width not in (1, G):
        _fail("arrays.leaves", f"{width} values per leaf, expected 1 or {G}")
    if np.any(group < 0) and width != G:
        _fail("arrays.leaves", "trees adding to every output need one value per output")
    if width > 1 and np.any(group >= 0):  # (the attributions write every output of a leaf)
        _fail("arrays.tree_group", "a tree of vector leaves adds to one output, not all (-1)")
    _array(arrays, "base", acc, 1, (G,))
    for name in ("leaf_min", "leaf_max"):
        _array(arrays, name, np.float64, 2, (n_trees, width))
    if layout == "padded":
        _check_padded(arrays, n_trees, depth, nf, leaves.shape[0])
        lo, hi = _padded_leaf_range(arrays, n_trees, depth, width)
    else:
        _check_compact(arrays, n_trees, nf, leaves.shape[0])
        lo, hi = _compact_leaf_range(arrays, n_trees, width)
    if "cats" in arrays:
        keys = arrays["cnodes" if layout == "compact" else "pnodes"][:, 0]
        if not np.any((keys & (KEY_LEAF | KEY_SPECIAL)) == KEY_SPECIAL):
            _fail("arrays.cats", "present, but no node uses it")
    if "cat_feat" in arrays or "cat_head" in arrays:
        _check_staged(arrays, layout, nf)
    x_names = [n for n in arrays if n.startswith("x_")]
    if x_names:
        _check_explain(arrays, n_trees, nf, width)
    # certified stopping bounds the remaining trees by these: they must hold every leaf a walk
    # can reach, as the kernels add it (in the accumulator's precision)
    smin, smax = arrays["leaf_min"].astype(acc), arrays["leaf_max"].astype(acc)
    if np.isnan(smin).any() or np.isnan(smax).any() or np.any(smin > lo) or np.any(smax < hi):
        _fail("arrays.leaf_min/leaf_max", "narrower than the leaves the trees reach")


EXPLAIN_ARRAYS = ("x_tree", "x_feature", "x_threshold", "x_child", "x_default_left",
                  "x_cover", "x_value", "x_special")


def _check_explain(arrays, n_trees: int, nf: int, width: int) -> None:
    """The trees the attributions walk (``pack.pack_explain``): every child inside its tree
    and after its parent (every walk ends), features below ``nf``, covers positive."""
    extra = sorted(n for n in arrays if n.startswith("x_") and n not in EXPLAIN_ARRAYS)
    if extra:
        _fail(f"arrays.{extra[0]}", "unknown")
    tree = _array(arrays, "x_tree", np.int64, 1, (n_trees + 1,))
    if tree[0] != 0 or np.any(tree[1:] <= tree[:-1]):
        _fail("arrays.x_tree", "not strictly increasing from 0")
    n = int(tree[-1])
    feature = _array(arrays, "x_feature", np.int32, 1, (n,))
    _array(arrays, "x_threshold", np.float32, 1, (n,))
    child = _array(arrays, "x_child", np.int32, 2, (n, 2)).astype(np.int64)
    dleft = _array(arrays, "x_default_left", np.uint8, 1, (n,))
    cover = _array(arrays, "x_cover", np.float64, 1, (n,))
    value = _array(arrays, "x_value", np.float64, 2, (n, width))
    if feature.min() < -1 or feature.max() >= nf:
        _fail("arrays.x_feature", f"a feature outside [-1, {nf})")
    if dleft.max() > 1:
        _fail("arrays.x_default_left", "not 0 or 1")
    leaf = feature < 0
    if np.any(child[leaf] != -1):
        _fail("arrays.x_child", "a leaf with a child")
    start = np.repeat(tree[:-1], np.diff(tree))
    size = np.repeat(np.diff(tree), np.diff(tree))
    local = np.arange(n, dtype=np.int64) - start
    inner = ~leaf
    for side in (0, 1):
        c = child[inner, side]
        if np.any(c <= local[inner]) or np.any(c >= size[inner]):
            _fail("arrays.x_child", "a child before its node or outside its tree")
    if not np.all(np.isfinite(cover)) or np.any(cover < 0) or np.any(cover[inner] <= 0):
        _fail("arrays.x_cover", "a cover that is not finite and >= 0 (> 0 at a split)")
    if not np.all(np.isfinite(value)):
        _fail("arrays.x_value", "a value that is not finite")
    if "x_special" in arrays:
        special = _array(arrays, "x_special", np.uint32, 1, (n,))
        if np.any(special[leaf] != 0):
            _fail("arrays.x_special", "a leaf with a categorical entry")
        _check_entries(arrays, special[special != 0], "arrays.x_special")


def _check_entries(arrays, offsets: np.ndarray, field: str) -> None:
    """Each special node's entry (``ir.categorical_entry``) lies whole inside ``cats``."""
    if offsets.size == 0:
        return
    if "cats" not in arrays:
        _fail(field, "categorical splits without arrays.cats")
    cats = _array(arrays, "cats", np.uint32, 1)
    if cats.shape[0] < 2 or cats[0] != 0 or cats[1] != 0:
        _fail("arrays.cats", "does not start with the unused entry [0, 0]")
    for off in np.unique(offsets).tolist():
        size = entry_size(cats, off) if off < cats.shape[0] else 0
        if size == 0 or off + size > cats.shape[0]:
            _fail(field, f"an entry at {off} that is malformed or outside arrays.cats")


def _check_staged(arrays, layout: str, nf: int) -> None:
    """Staged categorical features (``pack.staged_categories``): the kernels read a staged
    value as a bit index up to the feature's n + 2, so every split on the feature must be a
    categorical entry of exactly that header (n + 3 bits), and no other node may read it."""
    feat = _array(arrays, "cat_feat", np.int32, 1)
    head = _array(arrays, "cat_head", np.uint32, 1, (feat.shape[0],))
    if feat.size == 0 or feat.min() < 0 or feat.max() >= nf or np.unique(feat).size != feat.size:
        _fail("arrays.cat_feat", "not distinct features in range")
    if "cats" not in arrays or any(entry_size(head, i) == 0 or int(head[i]) == 0x40000000
                                   for i in range(head.size)):
        _fail("arrays.cat_head", "not categorical headers (or no arrays.cats)")
    nodes = arrays["cnodes" if layout == "compact" else "pnodes"]
    key, thr = nodes[:, 0].astype(np.int64), nodes[:, 1].astype(np.int64)
    f = (key & 0x3FFFFFFF) >> 1
    split = (key & KEY_LEAF) == 0
    if layout == "padded":  # pass-through nodes (key 0, +inf) send every value left
        split &= ~((key == 0) & (thr == INF_BITS))
    special = split & ((key & KEY_SPECIAL) != 0)
    want = np.full(nf, -1, dtype=np.int64)
    want[feat] = head
    on_cat = split & (want[f] >= 0)
    if np.any(on_cat & ~special) or np.any(special & ~on_cat):
        _fail("arrays.cat_feat", "a staged feature read by a numerical split, or a categorical "
                                 "split on a feature that is not staged")
    if np.any(arrays["cats"][thr[special]].astype(np.int64) != want[f[special]]):
        _fail("arrays.cat_head", "a split's entry is not its feature's header")


def _check_padded(arrays, n_trees: int, depth: int, nf: int, n_leaves: int) -> None:
    n_int = (1 << depth) - 1
    nodes = _array(arrays, "pnodes", np.uint32, 2, (n_trees * n_int, 2))
    if n_leaves != n_trees << depth:
        _fail("arrays.leaves", f"{n_leaves} leaves, the padded layout has {n_trees << depth}")
    key = nodes[:, 0]
    if key.size and (key & np.uint32(0xBFFFFFFF)).max() >= 2 * nf:  # the leaf bit too
        _fail("arrays.pnodes", f"a node key reads a feature beyond n_features ({nf})")
    special = (key & KEY_SPECIAL) != 0
    # a NaN threshold: the float walks send every row left of it, the SPLIT walks' order
    # keys (walk.h sw_order_key) put a NaN with its sign bit below -inf; no library writes one
    if np.any((nodes[~special, 1] & np.uint32(0x7FFFFFFF)) > np.uint32(INF_BITS)):
        _fail("arrays.pnodes", "a NaN threshold")
    _check_entries(arrays, nodes[special, 1], "arrays.pnodes")


def _check_compact(arrays, n_trees: int, nf: int, n_leaves: int) -> None:
    nodes = _array(arrays, "cnodes", np.uint32, 2, (None, 4))
    n = nodes.shape[0]
    if n >= 1 << 31:
        _fail("arrays.cnodes", "more than 2^31 nodes")
    root = _array(arrays, "root", np.int64, 1, (n_trees,))
    if root.size and (root.min() < 0 or root.max() >= n):
        _fail("arrays.root", "a tree root outside the node array")
    key, thr, child, slot = (nodes[:, k].astype(np.int64) for k in range(4))
    leaf = (key & KEY_LEAF) != 0
    here = np.arange(n, dtype=np.int64)
    if np.any(key[leaf] != KEY_LEAF):
        _fail("arrays.cnodes", "a leaf key carries bits besides the leaf flag")
    if np.any(thr[leaf] != INF_BITS):
        _fail("arrays.cnodes", "a leaf threshold is not +inf (the walks would step off it)")
    if np.any(child[leaf] != here[leaf]):
        _fail("arrays.cnodes", "a leaf does not point at itself")
    if np.any(slot[leaf] >= n_leaves):
        _fail("arrays.cnodes", "a leaf slot outside the leaf array")
    inner = ~leaf
    if np.any((key[inner] & ~KEY_SPECIAL) >= 2 * nf):
        _fail("arrays.cnodes", f"a node key reads a feature beyond n_features ({nf})")
    special = inner & ((key & KEY_SPECIAL) != 0)
    # a NaN threshold, as in the padded layout: the float walks (small batches) send every
    # row left of it, the order-key walks (large batches) right of a negative NaN
    if np.any((thr[inner & ~special] & 0x7FFFFFFF) > INF_BITS):
        _fail("arrays.cnodes", "a NaN threshold")
    _check_entries(arrays, thr[special], "arrays.cnodes")
    if special.any() and np.any(arrays["cats"][thr[special]] != slot[special]):
        _fail("arrays.cnodes", "a special node's header differs from its entry's")
    # children come after their parent (no cycles) and both lie inside the array
    if np.any(child[inner] <= here[inner]) or np.any(child[inner] + 1 >= n):
        _fail("arrays.cnodes", "a child index before its node or outside the array")


def _padded_leaf_range(arrays, n_trees: int, depth: int, width: int):
    """Per tree and output, the extremes over the leaves a walk can reach: a pass-through node
    (threshold +inf, missing left) sends every row left, so its right subtree is never
    reached (the packer leaves zeros there)."""
    n_int = (1 << depth) - 1
    nodes = arrays["pnodes"]
    key = nodes[:, 0].reshape(n_trees, n_int)
    thr = nodes[:, 1].reshape(n_trees, n_int)
    dead_right = (thr == INF_BITS) & ((key & 1) == 0)
    reach = np.ones((n_trees, 1), dtype=bool)
    for level in range(depth):
        first = (1 << level) - 1
        right = reach & ~dead_right[:, first:first + (1 << level)]
        reach = np.stack([reach, right], axis=2).reshape(n_trees, 1 << (level + 1))
    leaves = arrays["leaves"].reshape(n_trees, 1 << depth, width)
    lo = np.where(reach[:, :, None], leaves, np.inf).min(axis=1)
    hi = np.where(reach[:, :, None], leaves, -np.inf).max(axis=1)
    return lo, hi


def _compact_leaf_range(arrays, n_trees: int, width: int):
    """Per tree and output, the extremes over the leaves reachable from each root (level by
    level; children come after their parents, so it ends)."""
    nodes, leaves = arrays["cnodes"], arrays["leaves"]
    lo = np.full((n_trees, width), np.inf)
    hi = np.full((n_trees, width), -np.inf)
    tree = np.arange(n_trees, dtype=np.int64)
    node = arrays["root"].astype(np.int64)
    while node.size:
        leaf = (nodes[node, 0] & KEY_LEAF) != 0
        vals = leaves[nodes[node[leaf], 3].astype(np.int64)].astype(np.float64)
        np.minimum.at(lo, tree[leaf], vals)
        np.maximum.at(hi, tree[leaf], vals)
        inner = ~leaf
        child = nodes[node[inner], 2].astype(np.int64)
        tree = np.concatenate([tree[inner], tree[inner]])
        node = np.concatenate([child, child + 1])
        pair = np.unique(tree * nodes.shape[0] + node)  # a node shared by two parents: once
        tree, node = pair // nodes.shape[0], pair % nodes.shape[0]
    return lo, hi
