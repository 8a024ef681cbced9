"""QuickScorer tables for compact models whose trees have at most 64 leaves and padded models
with categorical splits (cyext/qs.h).

QuickScorer (Lucchese et al., SIGIR 2015) does not walk trees. Each tree keeps a 64-bit mask of
the leaves a row can still reach, numbered left to right; a split the row passes to the right
removes the leaves of its left subtree (an AND with the node's mask), and the row's leaf is the
lowest bit left. Every split the row goes right at is found feature by feature: numerical
splits sorted by threshold, a scan from the lowest while the threshold is below the row's value;
for a missing value the list of the feature's splits that send it right; for a staged
categorical feature (pack.staged_categories: the row holds the bit index its splits read) the
list of splits that send that index right. No branch depends on the tree's shape, and the work
is sequential reads: the walk's weak spot on leaf-wise LightGBM trees (deep, unbalanced, a
quarter of the splits categorical), measured in bench/NOTES.md "QuickScorer".

Exact by construction: the same rule per split (x > thr on order keys, the thresholds' -0.0 as
+0.0; a missing value where the node key's low bit says; a categorical index by the entry's
bit), the same leaf per tree, and the leaves added by the kernels in tree order.
"""

from __future__ import annotations

import numpy as np

from .. import _kernels
from .ir import SP_INT, SP_TRUNC, SP_ZERO
from .pack import KEY_LEAF, KEY_SPECIAL

SP_N = ~(SP_INT | SP_TRUNC)  # a staged header's category count (ir.py entries)
MAX_LEAVES = 64
MAX_CAT_CELLS = 4_000_000  # categorical (index, tree) cells built at load (32 MB at most)
ALL = (1 << 64) - 1
# one split: the order key of its threshold (numerical lists), its tree, the mask that removes
# its left subtree's leaves
NODE = np.dtype([("thr", "<u4"), ("tree", "<u4"), ("mask", "<u8")])


class NotEligible(Exception):
    """The model has no QuickScorer tables (the reason says why); the walks score it."""


def build(cnodes: np.ndarray, root: np.ndarray, n_features: int, cats: np.ndarray | None,
          cat_feat: np.ndarray | None, cat_head: np.ndarray | None) -> dict[str, np.ndarray]:
    """The tables of walk.h sw_qs for a compact model, or NotEligible."""
    key = cnodes[:, 0].astype(np.int64)
    special = ((key & (KEY_LEAF | KEY_SPECIAL)) == KEY_SPECIAL)
    staged = _staged(special, cats, cat_feat, cat_head, n_features, cnodes[special, 3])
    inner, tree, mask, leaf_of = compact_splits(cnodes, root)
    thr_key = _kernels.order_key_nodes(cnodes)[:, 1]
    return _tables(key[inner], cnodes[inner, 1], thr_key[inner], special[inner], tree, mask,
                   leaf_of, staged, cats, n_features)


def compact_splits(cnodes: np.ndarray, root: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every split of a compact model whose trees have at most 64 leaves and no node shared
    by two parents (else NotEligible: an artifact may share nodes, the walks read them once
    per path, and a rank a node has is one path's): its node, its tree, the mask that removes
    its left subtree's leaves (ranked left to right); and each tree's leaf slots by rank
    (n_trees x 64, 0 past its leaves)."""
    key = cnodes[:, 0].astype(np.int64)
    child = cnodes[:, 2].view(np.int32).astype(np.int64)
    leaf_slot = cnodes[:, 3].view(np.int32)
    is_leaf = (key & KEY_LEAF) != 0
    n_trees = root.shape[0]
    leaf_of = np.zeros((n_trees, MAX_LEAVES), dtype=np.int32)
    inner, inner_tree, inner_mask = [], [], []
    for t in range(n_trees):
        order, stack, seen = [], [int(root[t])], set()
        while stack:  # pre-order, left first: leaves in left-to-right order
            n = stack.pop()
            order.append(n)
            if len(order) > 2 * MAX_LEAVES - 1:
                raise NotEligible(f"a tree with more than {MAX_LEAVES} leaves (tree {t}; "
                                  "LightGBM's num_leaves or scikit-learn's max_leaf_nodes of "
                                  f"{MAX_LEAVES} or less keeps trees within it)")
            if n in seen:
                raise NotEligible(f"a node reached by two paths (tree {t}, node {n})")
            seen.add(n)
            if not is_leaf[n]:
                c = int(child[n])
                stack.append(c + 1)
                stack.append(c)
        count, first = {}, {}
        rank = 0
        for n in order:
            if is_leaf[n]:
                first[n] = rank
                leaf_of[t, rank] = leaf_slot[n]
                rank += 1
        for n in reversed(order):
            if is_leaf[n]:
                count[n] = 1
            else:
                c = int(child[n])
                count[n] = count[c] + count[c + 1]
                first[n] = first[c]
                inner.append(n)
                inner_tree.append(t)
                inner_mask.append(ALL & ~(((1 << count[c]) - 1) << first[c]))
    return (np.asarray(inner, dtype=np.int64), np.asarray(inner_tree, dtype=np.uint32),
            np.asarray(inner_mask, dtype=np.uint64), leaf_of)


def build_padded(pnodes: np.ndarray, depth: int, n_features: int, cats: np.ndarray | None,
                 cat_feat: np.ndarray | None, cat_head: np.ndarray | None
                 ) -> dict[str, np.ndarray]:
    """The tables for a padded model (full trees of ``depth`` levels, heap order)."""
    key = pnodes[:, 0].astype(np.int64)
    special = (key & KEY_SPECIAL) != 0
    keep, tree, mask, leaf_of = padded_splits(pnodes, depth)
    staged = _staged(special, cats, cat_feat, cat_head, n_features,
                     cats[pnodes[special, 1].astype(np.int64)] if special.any() else None)
    thr_key = _kernels.order_key_nodes(pnodes)[:, 1]
    return _tables(key[keep], pnodes[keep, 1], thr_key[keep], special[keep], tree, mask,
                   leaf_of, staged, cats, n_features)


def padded_splits(pnodes: np.ndarray, depth: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """compact_splits for a padded model of depth 1..6 (else NotEligible): leaf ranks are the
    last level's positions, a node's left subtree the ranks below its left child. Nodes that
    send nothing right (threshold +inf, missing left: the pass-through nodes of shallower
    leaves) are left out; the nodes are given as a mask over pnodes."""
    if not 1 <= depth <= 6:
        raise NotEligible(f"padded depth {depth} (at most 64 leaves: depth 1..6)")
    ni = (1 << depth) - 1
    n_trees = pnodes.shape[0] // ni
    key = pnodes[:, 0].astype(np.int64)
    special = (key & KEY_SPECIAL) != 0
    p = np.arange(n_trees * ni, dtype=np.int64) % ni          # heap index within the tree
    level = np.floor(np.log2(p + 1)).astype(np.int64)
    span = np.left_shift(1, depth - level - 1)                  # leaves under either child
    left = 2 * p + 1                                            # left child's heap index
    first = (left - ((1 << (level + 1)) - 1)) * span            # its first leaf rank
    one = np.uint64(1)
    mask = ~(((one << span.astype(np.uint64)) - one) << first.astype(np.uint64))  # span <= 32
    keep = special | (pnodes[:, 1] != 0x7F800000) | ((key & 1) == 1)
    tree = (np.arange(n_trees * ni, dtype=np.int64) // ni).astype(np.uint32)
    leaf_of = np.zeros((n_trees, MAX_LEAVES), dtype=np.int32)
    leaf_of[:, :1 << depth] = (np.arange(n_trees, dtype=np.int64)[:, None] << depth) \
        + np.arange(1 << depth)
    return keep, tree[keep], mask[keep], leaf_of


def _staged(special, cats, cat_feat, cat_head, n_features, heads) -> np.ndarray:
    """feature -> the header of its staged categorical splits (-1: none), or NotEligible."""
    staged = np.full(max(n_features, 1), -1, dtype=np.int64)
    if special.any():
        if (heads == SP_ZERO).any():
            raise NotEligible("zero-as-missing splits (LightGBM zero_as_missing)")
        if cats is None or cat_feat is None:
            raise NotEligible("categorical splits that read unstaged values (a categorical "
                              "feature that numerical splits read too)")
        staged[cat_feat] = cat_head
    return staged


def _tables(key, thr_bits, thr_key, sp, tree, mask, leaf_of, staged, cats,
            n_features: int) -> dict[str, np.ndarray]:
    """The lists of walk.h sw_qs from every split's key, threshold word, tree and mask."""
    n_trees = leaf_of.shape[0]
    feat = (key & 0x3FFFFFFF) >> 1
    out = {"qs_leaf": leaf_of}
    # numerical splits: per feature, by threshold key; and the feature's "NaN goes right" list
    nm = ~sp
    order = np.lexsort((thr_key[nm], feat[nm]))
    out["qs_num"], out["qs_num_off"] = _table(feat[nm][order], thr_key[nm][order],
                                              tree[nm][order], mask[nm][order], n_features)
    right = nm & ((key & 1) == 1)
    order = np.argsort(feat[right], kind="stable")
    out["qs_nan"], out["qs_nan_off"] = _table(feat[right][order], 0, tree[right][order],
                                              mask[right][order], n_features)
    # staged categorical features: per (feature, index), one entry per tree, the AND of the
    # masks of that tree's splits that send the index right
    base = np.full(max(n_features, 1), -1, dtype=np.int32)
    width = np.zeros(max(n_features, 1), dtype=np.int32)
    cells = int(((staged[staged >= 0] & SP_N) + 3).sum()) * n_trees
    if cells > MAX_CAT_CELLS:  # the tables would outgrow the model: the walks score it
        raise NotEligible(f"categorical features with too many categories for its tables "
                          f"({cells:,} index x tree cells, at most {MAX_CAT_CELLS:,})")
    lists, trees, masks = [], [], []
    slots = 0
    for f in np.flatnonzero(staged >= 0):
        nb = (int(staged[f]) & SP_N) + 3
        base[f], width[f] = slots, nb
        on_f = np.flatnonzero(sp & (feat == f))
        acc = np.full((nb, n_trees), ALL, dtype=np.uint64)
        words = (nb + 31) // 32
        for k in on_f:
            off = int(thr_bits[k])
            bits = np.unpackbits(cats[off + 1: off + 1 + words].astype("<u4").view(np.uint8),
                                 bitorder="little")[:nb].astype(bool)
            acc[bits, tree[k]] &= mask[k]
        i, t = np.nonzero(acc != np.uint64(ALL))
        lists.append(slots + i)
        trees.append(t.astype(np.uint32))
        masks.append(acc[i, t])
        slots += nb
    cat_list = np.concatenate(lists) if lists else np.zeros(0, dtype=np.int64)
    out["qs_cat"], out["qs_cat_off"] = _table(
        cat_list, 0, np.concatenate(trees) if trees else np.zeros(0, dtype=np.uint32),
        np.concatenate(masks) if masks else np.zeros(0, dtype=np.uint64), slots)
    out["qs_cat_base"], out["qs_cat_width"] = base, width
    return out


def _table(which: np.ndarray, thr, tree: np.ndarray, mask: np.ndarray,
           n_lists: int) -> tuple[np.ndarray, np.ndarray]:
    """Entries sorted by list (``which``) as one NODE array and offsets (n_lists + 1)."""
    arr = np.zeros(max(len(tree), 1), dtype=NODE)  # never empty: a pointer to hand out
    arr["thr"][:len(tree)] = thr
    arr["tree"][:len(tree)] = tree
    arr["mask"][:len(tree)] = mask
    off = np.zeros(n_lists + 1, dtype=np.int32)
    np.cumsum(np.bincount(np.asarray(which, dtype=np.int64), minlength=n_lists)[:n_lists],
              out=off[1:])
    return arr, off


def mask_tables(key: np.ndarray, thr_key: np.ndarray, tree: np.ndarray, mask: np.ndarray,
                leaf_of: np.ndarray, leaves: np.ndarray) -> dict[str, np.ndarray]:
    """The leaf-mask kernel's tables (cyext/masks.h) from every split of a model without
    special splits (its doubled column key, threshold key, tree and 64-bit mask, as
    compact_splits and padded_splits give them) and each tree's leaf slots by rank: an entry
    (column offset key * 16, threshold key, 32-bit mask, 0) for each word of its mask that
    removes a leaf, tree by tree, the low words' entries before the high words'; the offsets
    of each tree's two lists (2 n_trees + 1); each tree's 64 leaf values by rank (one value a
    leaf: leaves[:, 0]), float32 as they are, float64 as their 32-bit halves (the 64 low
    words, then the 64 high words: masks.h picks each half with 32-bit permutes)."""
    n_trees = leaf_of.shape[0]
    words = [(mask & np.uint64(0xFFFFFFFF)).astype(np.uint32),
             (mask >> np.uint64(32)).astype(np.uint32)]
    used = [w != np.uint32(0xFFFFFFFF) for w in words]  # words that remove no leaf: no entry
    e_tree = np.concatenate([tree[u].astype(np.int64) for u in used])
    e_word = np.concatenate([np.full(int(u.sum()), h, dtype=np.int64)
                             for h, u in enumerate(used)])
    order = np.lexsort((e_word, e_tree))  # by tree, then word; stable within
    ent = np.zeros((max(len(order), 1), 4), dtype=np.uint32)  # never empty: a pointer
    ent[:len(order), 0] = np.concatenate([key[u] for u in used])[order] * 16
    ent[:len(order), 1] = np.concatenate([thr_key[u] for u in used])[order]
    ent[:len(order), 2] = np.concatenate([w[u] for w, u in zip(words, used, strict=True)])[order]
    off = np.zeros(2 * n_trees + 1, dtype=np.int64)
    np.cumsum(np.bincount(2 * e_tree + e_word, minlength=2 * n_trees), out=off[1:])
    leaf = np.ascontiguousarray(leaves[leaf_of.reshape(-1), 0].reshape(n_trees, MAX_LEAVES))
    if leaf.dtype == np.float64:
        bits = leaf.view(np.uint64)
        leaf = np.concatenate([(bits & np.uint64(0xFFFFFFFF)).astype(np.uint32),
                               (bits >> np.uint64(32)).astype(np.uint32)], axis=1)
    return {"ent": ent, "off": off, "leaf": np.ascontiguousarray(leaf), "n_ent": len(order)}
