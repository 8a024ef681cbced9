# cython: language_level=3
"""Per-row feature attributions of a tree ensemble, in the model's margin space.

``treeshap``: exact path-dependent TreeSHAP (Lundberg, Erion and Lee, "Consistent
individualized feature attribution for tree ensembles", Algorithm 2; the algorithm behind
XGBoost's ``pred_contribs`` and shap's ``TreeExplainer(feature_perturbation=
"tree_path_dependent")``), from each node's cover. ``path``: the Saabas path attribution
(XGBoost's ``approx_contribs``): along the row's path, each split's feature gets the change of
the cover-weighted mean value from the node to the child taken.

The trees are read as the loaders produced them (``pack.pack_explain``, checked by
``structure._check_explain``: children after their parent inside their tree), with the split
rule of every kernel: right iff x > threshold, a missing x goes where ``default_left`` says.
Sums are float64. The bias column holds the base margin plus each tree's expected value (its
root's mean), so a row's attributions plus its bias equal its margin.

Shallow trees take a table instead of Algorithm 2 (the idea of FastTreeSHAP v2, Yang 2021):
a leaf with d distinct features on its path contributes, for a row, a function of which of
those features the row follows the path on (a d-bit pattern A) only. With z_j the product of
the cover fractions of the path's splits on feature j, v the leaf value and w(s, d) =
s!(d-s-1)!/d!, feature j gets v (o_j - z_j) sum_{S in A minus j} w(|S|, d) prod_{i not in S,
i != j} z_i (o_j = 1 iff j is in A). Those coefficients are computed once per leaf and pattern
(2^d x d of them, d <= TABLE_MAX_D); a row then costs one comparison per split node and, per
leaf, its path's bit tests and d additions, instead of O(d^2) divisions per leaf.
"""

cimport cython
from cython.parallel cimport parallel, prange
from libc.math cimport isnan
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy, memset

import numpy as np

cdef enum:
    BLOCK = 32                      # rows that walk one tree before the next
    TABLE_MAX_D = 6                 # distinct features on a leaf's path for the table
    TABLE_MAX_DOUBLES = 8 << 20     # the tables of one model (64 MB)

cpdef enum Method:
    METHOD_TREESHAP = 0
    METHOD_PATH = 1


ctypedef struct PathElement:
    int32_t feature
    double zero_fraction
    double one_fraction
    double pweight


ctypedef struct Trees:
    const int64_t* start       # first node of each tree
    const int32_t* feature     # -1 at leaves
    const float* threshold
    const int32_t* child       # (left, right), tree-local
    const uint8_t* default_left
    const double* cover
    const double* value        # (node, width)
    const double* mean         # (node, width): cover-weighted mean of the leaves below
    const int32_t* group       # output of each tree (-1: every output, vector leaves)
    int32_t width
    int32_t n_outputs
    int32_t n_features
    # the tables (trees with table_leaf[t] <= table_leaf[t + 1]; -1: Algorithm 2)
    const int64_t* table_leaf   # (trees + 1): first table leaf of each tree, -1 without
    const int64_t* leaf_node    # global node of each table leaf
    const int32_t* leaf_d       # distinct features on its path
    const int32_t* leaf_p       # splits on its path
    const int64_t* leaf_path    # first entry of its path in path_node / path_bit
    const int64_t* leaf_feat    # first of its d features in feat
    const int64_t* leaf_table   # first of its 2^d x d coefficients in table
    const int64_t* path_node    # global node of each split on the path
    const int32_t* path_bit     # (bit of the split's feature among the leaf's d) * 2 + right
    const int32_t* feat
    const double* table
    # trees of at most 64 nodes: per leaf and path feature, the nodes splitting on it (bits of
    # their tree-local index) and the directions the path takes there (set: right)
    const uint8_t* small        # per tree: 1 when its patterns use these masks
    const uint64_t* feat_nodes
    const uint64_t* feat_right


cdef inline int64_t next_node(const Trees* T, int64_t base, int64_t node,
                              const float* x) noexcept nogil:
    cdef float v = x[T.feature[base + node]]
    cdef bint right
    if isnan(v):
        right = not T.default_left[base + node]
    else:
        right = v > T.threshold[base + node]
    return T.child[2 * (base + node) + right]


cdef void extend_path(PathElement* path, int32_t depth, double zero_fraction,
                      double one_fraction, int32_t feature) noexcept nogil:
    cdef int32_t i
    path[depth].feature = feature
    path[depth].zero_fraction = zero_fraction
    path[depth].one_fraction = one_fraction
    path[depth].pweight = 1.0 if depth == 0 else 0.0
    i = depth - 1
    while i >= 0:
        path[i + 1].pweight += one_fraction * path[i].pweight * (i + 1) / <double>(depth + 1)
        path[i].pweight = zero_fraction * path[i].pweight * (depth - i) / <double>(depth + 1)
        i -= 1


cdef void unwind_path(PathElement* path, int32_t depth, int32_t index) noexcept nogil:
    cdef double one = path[index].one_fraction, zero = path[index].zero_fraction
    cdef double next_one = path[depth].pweight, tmp
    cdef int32_t i = depth - 1
    while i >= 0:
        if one != 0:
            tmp = path[i].pweight
            path[i].pweight = next_one * (depth + 1) / ((i + 1) * one)
            next_one = tmp - path[i].pweight * zero * (depth - i) / <double>(depth + 1)
        else:
            path[i].pweight = path[i].pweight * (depth + 1) / (zero * (depth - i))
        i -= 1
    for i in range(index, depth):
        path[i].feature = path[i + 1].feature
        path[i].zero_fraction = path[i + 1].zero_fraction
        path[i].one_fraction = path[i + 1].one_fraction


cdef double unwound_path_sum(const PathElement* path, int32_t depth,
                             int32_t index) noexcept nogil:
    cdef double one = path[index].one_fraction, zero = path[index].zero_fraction
    cdef double next_one = path[depth].pweight, total = 0.0, tmp
    cdef int32_t i = depth - 1
    while i >= 0:
        if one != 0:
            tmp = next_one * (depth + 1) / ((i + 1) * one)
            total += tmp
            next_one = path[i].pweight - tmp * zero * ((depth - i) / <double>(depth + 1))
        else:
            total += (path[i].pweight / zero) / ((depth - i) / <double>(depth + 1))
        i -= 1
    return total


cdef void tree_shap(const Trees* T, int64_t base, int64_t node, const float* x, double* phi,
                    int32_t out_stride, PathElement* parent_path, int32_t depth,
                    double zero_fraction, double one_fraction,
                    int32_t feature) noexcept nogil:
    """Algorithm 2; ``phi`` is (outputs the leaf values go to) x (features + 1), stride
    ``out_stride`` between outputs."""
    cdef PathElement* path = parent_path + depth + 1
    cdef int32_t i, o, split, index
    cdef int64_t hot, cold, g = base + node
    cdef double w, inc_zero = 1.0, inc_one = 1.0, leaf
    memcpy(path, parent_path, (depth + 1) * sizeof(PathElement))
    extend_path(path, depth, zero_fraction, one_fraction, feature)
    split = T.feature[g]
    if split < 0:
        for i in range(1, depth + 1):
            w = unwound_path_sum(path, depth, i) * (path[i].one_fraction - path[i].zero_fraction)
            for o in range(T.width):
                leaf = T.value[g * T.width + o]
                phi[o * out_stride + path[i].feature] += w * leaf
        return
    hot = next_node(T, base, node, x)
    cold = T.child[2 * g] + T.child[2 * g + 1] - hot
    w = T.cover[g]
    index = 0
    while index <= depth:
        if path[index].feature == split:
            break
        index += 1
    if index != depth + 1:
        inc_zero = path[index].zero_fraction
        inc_one = path[index].one_fraction
        unwind_path(path, depth, index)
        depth -= 1
    tree_shap(T, base, hot, x, phi, out_stride, path, depth + 1,
              T.cover[base + hot] / w * inc_zero, inc_one, split)
    tree_shap(T, base, cold, x, phi, out_stride, path, depth + 1,
              T.cover[base + cold] / w * inc_zero, 0.0, split)


cdef void table_shap(const Trees* T, int64_t t, const float* x, double* phi,
                     int32_t out_stride, uint8_t* right) noexcept nogil:
    """One shallow tree by its leaf tables; ``right`` scratch of the tree's node count."""
    cdef int64_t base = T.start[t], n = T.start[t + 1] - base, i, l, q, g, f0
    cdef int32_t d, mask, k, o, b
    cdef uint64_t R = 0
    cdef const double* tbl
    cdef double v
    if T.small[t]:
        for i in range(n):
            if T.feature[base + i] >= 0 and \
                    next_node(T, base, i, x) == T.child[2 * (base + i) + 1]:
                R |= (<uint64_t>1) << i
    else:
        for i in range(n):
            if T.feature[base + i] >= 0:
                right[i] = next_node(T, base, i, x) == T.child[2 * (base + i) + 1]
    for l in range(T.table_leaf[t], T.table_leaf[t + 1]):
        d = T.leaf_d[l]
        if T.small[t]:  # feature k followed: every split on it goes the path's way
            mask = 0
            f0 = T.leaf_feat[l]
            for k in range(d):
                if ((R ^ T.feat_right[f0 + k]) & T.feat_nodes[f0 + k]) == 0:
                    mask |= 1 << k
        else:
            mask = (1 << d) - 1
            for q in range(T.leaf_path[l], T.leaf_path[l] + T.leaf_p[l]):
                b = T.path_bit[q]
                if right[T.path_node[q] - base] != (b & 1):
                    mask &= ~(1 << (b >> 1))
        tbl = T.table + T.leaf_table[l] + <int64_t>mask * d
        if T.width == 1:  # the table holds the coefficients times the leaf value
            for k in range(d):
                phi[T.feat[T.leaf_feat[l] + k]] += tbl[k]
            continue
        g = T.leaf_node[l]
        for o in range(T.width):
            v = T.value[g * T.width + o]
            for k in range(d):
                phi[o * out_stride + T.feat[T.leaf_feat[l] + k]] += tbl[k] * v


cdef void saabas(const Trees* T, int64_t base, const float* x, double* phi,
                 int32_t out_stride) noexcept nogil:
    cdef int64_t node = 0, nxt
    cdef int32_t o, f
    while T.feature[base + node] >= 0:
        f = T.feature[base + node]
        nxt = next_node(T, base, node, x)
        for o in range(T.width):
            phi[o * out_stride + f] += (T.mean[(base + nxt) * T.width + o]
                                        - T.mean[(base + node) * T.width + o])
        node = nxt


cdef class Explainer:
    """The attributions of one compiled model (``CompiledModel.contributions``)."""

    cdef Trees T
    cdef int64_t n_trees, max_nodes
    cdef readonly int64_t tabled  # trees explained by their leaf tables
    cdef int32_t max_depth
    cdef double divisor
    cdef object _keep
    cdef readonly object bias  # (n_outputs,) float64: base margin + the trees' expected values

    def __init__(self, dict arrays, int32_t n_features, int32_t n_outputs, double divisor):
        """``arrays``: a checked artifact's (``structure.check``) with its ``x_*`` arrays."""
        start = np.ascontiguousarray(arrays["x_tree"], dtype=np.int64)
        feature = np.ascontiguousarray(arrays["x_feature"], dtype=np.int32)
        threshold = np.ascontiguousarray(arrays["x_threshold"], dtype=np.float32)
        child = np.ascontiguousarray(arrays["x_child"], dtype=np.int32)
        default_left = np.ascontiguousarray(arrays["x_default_left"], dtype=np.uint8)
        cover = np.ascontiguousarray(arrays["x_cover"], dtype=np.float64)
        value = np.ascontiguousarray(arrays["x_value"], dtype=np.float64)
        group = np.ascontiguousarray(arrays["tree_group"], dtype=np.int32)
        self.n_trees = group.shape[0]
        width = value.shape[1]
        mean = value.copy()
        depth = np.zeros(feature.shape[0], dtype=np.int32)
        self.max_depth = _means(start, feature, child, cover, mean, depth, width)
        tables = _tables(start, feature, child, cover, value)
        self._keep = (start, feature, threshold, child, default_left, cover, value, mean, group,
                      tables)
        (table_leaf, leaf_node, leaf_d, leaf_p, leaf_path, leaf_feat, leaf_table, path_node,
         path_bit, feat, table, small, feat_nodes, feat_right) = tables
        self.T.table_leaf = <const int64_t*><Py_ssize_t>table_leaf.ctypes.data
        self.T.leaf_node = <const int64_t*><Py_ssize_t>leaf_node.ctypes.data
        self.T.leaf_d = <const int32_t*><Py_ssize_t>leaf_d.ctypes.data
        self.T.leaf_p = <const int32_t*><Py_ssize_t>leaf_p.ctypes.data
        self.T.leaf_path = <const int64_t*><Py_ssize_t>leaf_path.ctypes.data
        self.T.leaf_feat = <const int64_t*><Py_ssize_t>leaf_feat.ctypes.data
        self.T.leaf_table = <const int64_t*><Py_ssize_t>leaf_table.ctypes.data
        self.T.path_node = <const int64_t*><Py_ssize_t>path_node.ctypes.data
        self.T.path_bit = <const int32_t*><Py_ssize_t>path_bit.ctypes.data
        self.T.feat = <const int32_t*><Py_ssize_t>feat.ctypes.data
        self.T.table = <const double*><Py_ssize_t>table.ctypes.data
        self.T.small = <const uint8_t*><Py_ssize_t>small.ctypes.data
        self.T.feat_nodes = <const uint64_t*><Py_ssize_t>feat_nodes.ctypes.data
        self.T.feat_right = <const uint64_t*><Py_ssize_t>feat_right.ctypes.data
        self.max_nodes = int(np.max(np.diff(start)))
        self.tabled = int(np.sum(table_leaf[1:] > table_leaf[:len(table_leaf) - 1]))
        self.T.start = <const int64_t*><Py_ssize_t>start.ctypes.data
        self.T.feature = <const int32_t*><Py_ssize_t>feature.ctypes.data
        self.T.threshold = <const float*><Py_ssize_t>threshold.ctypes.data
        self.T.child = <const int32_t*><Py_ssize_t>child.ctypes.data
        self.T.default_left = <const uint8_t*><Py_ssize_t>default_left.ctypes.data
        self.T.cover = <const double*><Py_ssize_t>cover.ctypes.data
        self.T.value = <const double*><Py_ssize_t>value.ctypes.data
        self.T.mean = <const double*><Py_ssize_t>mean.ctypes.data
        self.T.group = <const int32_t*><Py_ssize_t>group.ctypes.data
        self.T.width = width
        self.T.n_outputs = n_outputs
        self.T.n_features = n_features
        self.divisor = divisor
        bias = np.asarray(arrays["base"], dtype=np.float64).copy()
        roots = mean[start[:len(start) - 1]]  # (trees, width): each root's mean
        for t in range(self.n_trees):
            if width == n_outputs and group[t] < 0:
                bias += roots[t]
            else:
                bias[group[t]] += roots[t, 0]
        self.bias = bias / divisor

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def contributions(self, const float[:, ::1] X, int method, int n_threads=1):
        """(rows, outputs, features + 1) float64: each feature's attribution, then the bias."""
        cdef int64_t n = X.shape[0], r, t, blk, r0, r1
        cdef int64_t n_blocks = (X.shape[0] + BLOCK - 1) // BLOCK
        cdef int32_t nf = self.T.n_features, G = self.T.n_outputs, stride = nf + 1, o
        cdef int64_t scratch = (self.max_depth + 2) * (self.max_depth + 3) // 2 + 1
        cdef PathElement* path
        cdef uint8_t* right
        cdef int failed[1]
        cdef double* phi
        cdef double[:, :, ::1] out
        if X.shape[1] != nf:
            raise ValueError(f"X has {X.shape[1]} features, the model {nf}")
        if method != METHOD_TREESHAP and method != METHOD_PATH:
            raise ValueError(f"unknown method {method}")
        result = np.zeros((n, G, nf + 1), dtype=np.float64)
        out = result
        if n == 0:
            return result
        failed[0] = 0
        with nogil, parallel(num_threads=max(n_threads, 1)):
            path = <PathElement*>malloc(scratch * sizeof(PathElement))
            right = <uint8_t*>malloc(self.max_nodes + 1)
            if path == NULL or right == NULL:
                failed[0] = 1
            else:
                # trees outer, rows inner within a block: one tree's nodes and leaf tables
                # stay in cache while the block's rows walk it (the tables of a model are
                # megabytes; row by row, every leaf's lookup missed L2)
                for blk in prange(n_blocks, schedule="dynamic"):
                    r0 = blk * BLOCK
                    r1 = min(r0 + BLOCK, n)
                    for t in range(self.n_trees):
                        o = self.T.group[t]
                        if o < 0:
                            o = 0  # vector leaves: every output, from output 0 on
                        for r in range(r0, r1):
                            phi = &out[r, o, 0]
                            if method == METHOD_TREESHAP and \
                                    self.T.table_leaf[t] < self.T.table_leaf[t + 1]:
                                table_shap(&self.T, t, &X[r, 0], phi, stride, right)
                            elif method == METHOD_TREESHAP:
                                tree_shap(&self.T, self.T.start[t], 0, &X[r, 0], phi,
                                          stride, path, 0, 1.0, 1.0, -1)
                            else:
                                saabas(&self.T, self.T.start[t], &X[r, 0], phi, stride)
            free(path)
            free(right)
        if failed[0]:
            raise MemoryError("no memory for the attribution scratch")
        result[:, :, :nf] /= self.divisor
        result[:, :, nf] = self.bias
        return result


cdef void fill_leaf_table(int32_t d, const double* z, double* out) noexcept:
    """The 2^d x d coefficients of one leaf (module docstring): out[A * d + k]."""
    cdef int32_t A, k, j, m, size, B
    cdef double w[TABLE_MAX_D + 1]
    cdef double e[TABLE_MAX_D + 1]
    cdef double outside, total, fact_d = 1.0
    cdef double fact[TABLE_MAX_D + 1]
    fact[0] = 1.0
    for j in range(1, d + 1):
        fact[j] = fact[j - 1] * j
    for j in range(d):  # w(s, d) = s! (d - s - 1)! / d!
        w[j] = fact[j] * fact[d - j - 1] / fact[d]
    for A in range(1 << d):
        for k in range(d):
            B = A & ~(1 << k)
            outside = 1.0
            e[0] = 1.0
            size = 0
            for j in range(d):
                if j == k:
                    continue
                if B & (1 << j):  # elementary symmetric sums of the z in B
                    size += 1
                    e[size] = 0.0
                    m = size
                    while m >= 1:
                        e[m] += z[j] * e[m - 1]
                        m -= 1
                else:
                    outside *= z[j]
            total = 0.0
            for m in range(size + 1):
                total += w[size - m] * e[m]
            total *= outside
            out[A * d + k] = (1.0 - z[k]) * total if A & (1 << k) else -z[k] * total


def _tables(const int64_t[::1] start, const int32_t[::1] feature,
            const int32_t[:, ::1] child, const double[::1] cover, const double[:, ::1] value):
    """The leaf tables of every tree whose leaves have at most TABLE_MAX_D distinct features
    on their path, while the model's tables stay under TABLE_MAX_DOUBLES."""
    cdef int64_t t, lo, node, split, q, n_tab = 0
    cdef int32_t d, k, f
    cdef double z[TABLE_MAX_D]
    cdef double[::1] tv
    table_leaf = np.zeros(start.shape[0], dtype=np.int64)
    leaf_node, leaf_d, leaf_p, leaf_path, leaf_feat, leaf_table = [], [], [], [], [], []
    path_node, path_bit, feats, tables = [], [], [], []
    small = np.zeros(max(start.shape[0] - 1, 1), dtype=np.uint8)
    feat_nodes, feat_right = [], []
    for t in range(start.shape[0] - 1):
        lo = start[t]
        leaves = []  # (leaf node, [(node, right, feature)])
        stack = [(lo, [])]
        fits = True
        while stack and fits:
            node, path = stack.pop()
            if feature[node] < 0:
                if len({p[2] for p in path}) > TABLE_MAX_D:
                    fits = False
                leaves.append((node, path))
                continue
            stack.append((lo + child[node, 1], path + [(node, 1, feature[node])]))
            stack.append((lo + child[node, 0], path + [(node, 0, feature[node])]))
        size = sum((1 << len({p[2] for p in path})) * len({p[2] for p in path})
                   for _, path in leaves) if fits else 0
        if not fits or n_tab + size > TABLE_MAX_DOUBLES:
            table_leaf[t + 1] = len(leaf_node)  # no table leaves: Algorithm 2
            continue
        for node, path in leaves:
            order = list(dict.fromkeys(p[2] for p in path))  # features, first seen first
            d = len(order)
            index = {f: i for i, f in enumerate(order)}
            for k in range(d):
                z[k] = 1.0
            for entry in path:
                split, k = entry[0], index[entry[2]]
                z[k] *= cover[lo + child[split, <int32_t>entry[1]]] / cover[split]
            tv = np.empty(max((1 << d) * d, 1), dtype=np.float64)
            if d:
                fill_leaf_table(d, z, &tv[0])
                if value.shape[1] == 1:  # one value per leaf: folded into its coefficients
                    for k in range((1 << d) * d):
                        tv[k] *= value[node, 0]
            leaf_node.append(node)
            leaf_d.append(d)
            leaf_p.append(len(path))
            leaf_path.append(len(path_node))
            leaf_feat.append(len(feats))
            leaf_table.append(n_tab)
            for (pn, rt, f) in path:
                path_node.append(pn)
                path_bit.append(index[f] * 2 + rt)
            feats.extend(order)
            nodes_of, right_of = [0] * d, [0] * d
            if start[t + 1] - lo <= 64:
                for (pn, rt, f) in path:
                    nodes_of[index[f]] |= 1 << (pn - lo)
                    right_of[index[f]] |= rt << (pn - lo)
            feat_nodes.extend(nodes_of)
            feat_right.extend(right_of)
            tables.append(np.asarray(tv)[:(1 << d) * d])
            n_tab += (1 << d) * d
        table_leaf[t + 1] = len(leaf_node)
        small[t] = start[t + 1] - lo <= 64
    return (table_leaf, np.asarray(leaf_node, dtype=np.int64),
            np.asarray(leaf_d, dtype=np.int32), np.asarray(leaf_p, dtype=np.int32),
            np.asarray(leaf_path, dtype=np.int64), np.asarray(leaf_feat, dtype=np.int64),
            np.asarray(leaf_table, dtype=np.int64),
            np.asarray(path_node or [0], dtype=np.int64),
            np.asarray(path_bit or [0], dtype=np.int32), np.asarray(feats or [0], dtype=np.int32),
            np.concatenate(tables) if tables else np.zeros(1, dtype=np.float64), small,
            np.asarray(feat_nodes or [0], dtype=np.uint64),
            np.asarray(feat_right or [0], dtype=np.uint64))


def _means(const int64_t[::1] start, const int32_t[::1] feature, const int32_t[:, ::1] child,
           const double[::1] cover, double[:, ::1] mean, int32_t[::1] depth, int32_t width):
    """Each split node's mean: its children's means weighted by their covers over its own
    cover (XGBoost's FillNodeMeanValues). Children come after their parent, so one pass
    from the last node back. Returns the deepest leaf's depth."""
    cdef int64_t t, i, a, b, g, lo, hi
    cdef int32_t o, deepest = 0
    for t in range(start.shape[0] - 1):
        lo, hi = start[t], start[t + 1]
        i = hi - 1
        while i >= lo:
            if feature[i] >= 0:
                a, b = lo + child[i, 0], lo + child[i, 1]
                for o in range(width):
                    mean[i, o] = (mean[a, o] * cover[a] + mean[b, o] * cover[b]) / cover[i]
            i -= 1
        for i in range(lo, hi):  # parents first: a child's depth is its parent's + 1
            if feature[i] >= 0:
                for g in range(2):
                    depth[lo + child[i, g]] = depth[i] + 1
                    if depth[i] + 1 > deepest:
                        deepest = depth[i] + 1
    return deepest
