"""Ensemble (IR) -> packed arrays the kernels walk.

Two layouts, chosen per model:

* ``padded``: every tree completed to the model's depth D, internal nodes level-major
  (children of slot i at 2i+1, 2i+2) as 8-byte (key, threshold) words, 2^D leaves per tree.
  A leaf above depth D becomes pass-through nodes (threshold +inf, missing left) whose left
  path carries its value. No child pointers: the walk is ``pos = 2*pos + 1 + go_right``.
* ``compact``: real nodes only, breadth-first so the top levels share cache lines and siblings
  are adjacent (right = left + 1); 16-byte nodes with a child index. For deep trees, whose
  padded form would be exponentially larger.

In either layout a special node (a categorical or zero-as-missing split) has KEY_SPECIAL in its
key and the offset of its entry in ``cats`` as its threshold word (entries:
``ir.categorical_entry``); a compact one also carries the entry's header in its leaf word.
"""

from __future__ import annotations

import numpy as np

from .ir import SP_INT, SP_TRUNC, SP_ZERO, Ensemble, Tree, widen_entry

KEY_LEAF = np.uint32(0x80000000)  # node key: 2 * feature + missing-goes-right; bit 31 = leaf
KEY_SPECIAL = np.uint32(0x40000000)  # compact: the node's rule is its entry in ``cats``
# Padded trees above this depth would be mostly padding (and outgrow L2): use compact.
MAX_PADDED_DEPTH = 10


def _keys(tree: Tree, nodes: np.ndarray) -> np.ndarray:
    if tree.feature.max(initial=0) >= 2**29:
        raise ValueError("more than 2^29 features")
    right = (~tree.default_left[nodes]).astype(np.uint32)
    return tree.feature[nodes].astype(np.uint32) * np.uint32(2) + right


def pack_padded(ens: Ensemble, depth: int, acc: np.dtype) -> dict[str, np.ndarray]:
    n_int, n_leaf = (1 << depth) - 1, 1 << depth
    n_trees, width = ens.n_trees, ens.trees[0].value.shape[1]
    key = np.zeros((n_trees, n_int), dtype=np.uint32)
    thr = np.full((n_trees, n_int), np.inf, dtype=np.float32)
    leaves = np.zeros((n_trees, n_leaf, width), dtype=acc)
    cats, offsets = special_entries(ens)
    for t, tree in enumerate(ens.trees):
        node = np.zeros(1, dtype=np.int64)  # IR node ids on this level
        pos = np.zeros(1, dtype=np.int64)  # their padded slots
        for _level in range(depth):
            internal = tree.feature[node] >= 0
            ni, pi = node[internal], pos[internal]
            key[t, pi] = _keys(tree, ni)
            thr[t, pi] = tree.threshold[ni]
            for i, p in zip(ni.tolist(), pi.tolist(), strict=True):
                if i in offsets[t]:  # a special node: the threshold word is its entry
                    key[t, p] |= KEY_SPECIAL
                    thr[t, p] = np.uint32(offsets[t][i]).view(np.float32)
            # pass-through slots keep key 0 / +inf: everything, missing too, goes left
            node = np.concatenate([tree.left[ni], tree.right[ni], node[~internal]])
            pos = np.concatenate([2 * pi + 1, 2 * pi + 2, 2 * pos[~internal] + 1])
        leaves[t, pos - n_int] = tree.value[node]
    pnodes = np.empty((n_trees * n_int, 2), dtype=np.uint32)
    pnodes[:, 0] = key.reshape(-1)
    pnodes[:, 1] = thr.reshape(-1).view(np.uint32)
    out = {"pnodes": pnodes, "leaves": leaves.reshape(-1, width)}
    if cats is not None:
        out["cats"] = cats
    return out


def staged_categories(ens: Ensemble) -> dict[int, int] | None:
    """feature -> the header every split on it shares once widened (the widest split's
    category count, the library's flags), when each categorical feature is split only by
    categorical splits with the same flags and no split is a zero band. Such a model's rows
    are staged with each categorical value replaced by the bit index its splits read
    (``walk.h`` ``sw_stage_cats``): the split is then one bit test. None: the splits read the
    raw values."""
    heads: dict[int, list[int]] = {}
    for t in ens.trees:
        for node, entry in t.special.items():
            h = int(entry[0])
            if h == SP_ZERO:
                return None
            f, flags, n = int(t.feature[node]), h & (SP_INT | SP_TRUNC), h & ~(SP_INT | SP_TRUNC)
            if heads.setdefault(f, [flags, n])[0] != flags:
                return None
            heads[f][1] = max(heads[f][1], n)
    if not heads:
        return None
    feats = np.fromiter(heads, dtype=np.int64)
    for t in ens.trees:
        on_cat = np.isin(t.feature, feats)
        on_cat[list(t.special)] = False
        if on_cat.any():  # a numerical split on a categorical feature
            return None
    return {f: flags | n for f, (flags, n) in heads.items()}


def special_entries(ens: Ensemble) -> tuple[np.ndarray | None, list[dict[int, int]]]:
    """The ``cats`` words (None: no special node) and, per tree, each special node's offset.
    With staged categories every entry is widened to its feature's widest split."""
    staged = staged_categories(ens) or {}
    cats, n_words, offsets = [np.zeros(2, dtype=np.uint32)], 2, []  # 0: the entry no node uses
    seen: dict[bytes, int] = {}  # identical entries are stored once (the kernels only read)
    for tree in ens.trees:
        at = {}
        for node, entry in sorted(tree.special.items()):
            head = staged.get(int(tree.feature[node]))
            if head is not None and head != int(entry[0]):
                entry = widen_entry(np.asarray(entry, dtype=np.uint32),
                                    head & ~(SP_INT | SP_TRUNC))
            words = np.asarray(entry, dtype=np.uint32)
            key = words.tobytes()
            if key not in seen:
                seen[key] = n_words
                cats.append(words)
                n_words += len(words)
            at[node] = seen[key]
        offsets.append(at)
    if n_words >= 2**32:
        raise ValueError("too many categorical splits (2^32 words)")
    return (np.concatenate(cats) if len(cats) > 1 else None), offsets


def pack_compact(ens: Ensemble, acc: np.dtype) -> dict[str, np.ndarray]:
    width = ens.trees[0].value.shape[1]
    cn, leaves, roots = [], [], []
    n_nodes = n_leaves = 0
    cats, offsets = special_entries(ens)
    for t, tree in enumerate(ens.trees):
        # breadth-first order with each sibling pair adjacent
        order, level = [np.zeros(1, dtype=np.int64)], np.zeros(1, dtype=np.int64)
        while True:
            inner = level[tree.feature[level] >= 0]
            if inner.size == 0:
                break
            level = np.stack([tree.left[inner], tree.right[inner]], axis=1).reshape(-1)
            order.append(level)
        order = np.concatenate(order)
        new_id = np.empty(tree.n_nodes, dtype=np.int64)
        new_id[order] = np.arange(order.size) + n_nodes
        is_leaf = tree.feature[order] < 0
        leaf_slot = np.cumsum(is_leaf) - 1 + n_leaves
        node = np.zeros((order.size, 4), dtype=np.uint32)
        key = _keys(tree, order)
        key[is_leaf] = KEY_LEAF
        node[:, 0] = key
        thr = np.where(is_leaf, np.float32(np.inf), tree.threshold[order]).astype(np.float32)
        node[:, 1] = thr.view(np.uint32)
        left = np.where(is_leaf, new_id[order], new_id[np.maximum(tree.left[order], 0)])
        node[:, 2] = left.astype(np.uint32)
        node[:, 3] = np.where(is_leaf, leaf_slot, 0).astype(np.uint32)
        for ir_node, offset in offsets[t].items():
            at = new_id[ir_node] - n_nodes
            node[at, 0] |= KEY_SPECIAL
            node[at, 1] = offset
            node[at, 3] = cats[offset]  # the entry's header, read with the node
        cn.append(node)
        leaves.append(tree.value[order[is_leaf]])
        roots.append(n_nodes)
        n_nodes += order.size
        n_leaves += int(is_leaf.sum())
    if n_nodes >= 2**31:
        raise ValueError("model too large for the compact layout (2^31 nodes)")
    out = {
        "cnodes": np.concatenate(cn),
        "root": np.asarray(roots, dtype=np.int64),
        "leaves": np.concatenate(leaves).astype(acc).reshape(-1, width),
    }
    if cats is not None:
        out["cats"] = cats
    return out


def pack_explain(ens: Ensemble) -> dict[str, np.ndarray]:
    """The trees as they are (node order, children, covers) for the attributions
    (``_explain``): ``x_tree`` the first node of each tree (and the total), per node the
    feature (-1: leaf), threshold, children (tree-local, -1 at leaves), missing-goes-left,
    cover and value (leaves); with special nodes also ``x_special``, the offset of a node's
    entry in ``cats`` (0: an ordinary split). Empty when a tree has no covers, or a split
    node a cover that is not a positive number (attributions then say so)."""
    for t in ens.trees:
        inner = t.feature >= 0
        if t.cover is None or t.cover.shape != t.feature.shape or \
                not np.all(np.isfinite(t.cover)) or np.any(t.cover < 0) or \
                np.any(t.cover[inner] <= 0):
            return {}
    sizes = np.asarray([t.n_nodes for t in ens.trees], dtype=np.int64)
    x_tree = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=x_tree[1:])
    cats, offsets = special_entries(ens)
    out = {
        "x_tree": x_tree,
        "x_feature": np.concatenate([t.feature for t in ens.trees]).astype(np.int32),
        "x_threshold": np.concatenate([t.threshold for t in ens.trees]).astype(np.float32),
        "x_child": np.concatenate([np.stack([t.left, t.right], axis=1)
                                   for t in ens.trees]).astype(np.int32),
        "x_default_left": np.concatenate([t.default_left for t in ens.trees]).astype(np.uint8),
        "x_cover": np.concatenate([t.cover for t in ens.trees]).astype(np.float64),
        "x_value": np.concatenate([np.where((t.feature < 0)[:, None], t.value, 0.0)
                                   for t in ens.trees]).astype(np.float64),
    }
    if cats is not None:
        special = []
        for t, at in zip(ens.trees, offsets, strict=True):
            words = np.zeros(t.n_nodes, dtype=np.uint32)
            words[list(at)] = list(at.values())
            special.append(words)
        out["x_special"] = np.concatenate(special)
    return out


def pack(ens: Ensemble, layout: str = "auto") -> tuple[dict, dict[str, np.ndarray]]:
    """Return (layout info, arrays) for the kernels."""
    acc = np.dtype(np.float32 if ens.accumulate == "float32" else np.float64)
    depths = np.asarray([t.depth() for t in ens.trees], dtype=np.int32)
    depth = int(depths.max(initial=0))
    if layout == "auto":
        layout = "padded" if depth <= MAX_PADDED_DEPTH else "compact"
    if layout == "padded":
        if depth > 20:
            raise ValueError(f"depth {depth} is too deep for the padded layout")
        arrays = pack_padded(ens, depth, acc)
    elif layout == "compact":
        arrays = pack_compact(ens, acc)
    else:
        raise ValueError(f"unknown layout {layout!r} (auto, padded or compact)")
    arrays["tree_depth"] = depths
    arrays["tree_group"] = ens.tree_group.astype(np.int32)
    arrays["unit_ptr"] = ens.unit_ptr.astype(np.int64)
    arrays["base"] = ens.base.astype(acc)
    mins, maxs = zip(*(t.leaf_range() for t in ens.trees), strict=True)
    arrays["leaf_min"] = np.asarray(mins, dtype=np.float64)  # per tree, per leaf output
    arrays["leaf_max"] = np.asarray(maxs, dtype=np.float64)
    arrays.update(pack_explain(ens))
    staged = staged_categories(ens)
    if staged:
        arrays["cat_feat"] = np.asarray(list(staged), dtype=np.int32)
        arrays["cat_head"] = np.asarray(list(staged.values()), dtype=np.uint32)
    info = {"layout": layout, "depth": depth if layout == "padded" else 0,
            "max_depth": depth, "accumulate": str(acc)}
    return info, arrays
