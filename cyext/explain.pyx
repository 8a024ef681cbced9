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

Leaf tables still cost a row d additions a leaf. Pattern tables sum them ahead (pattern_rows;
one output): the leaves below a node v depend on a row only through its directions at the k
splits of v's path and below v, so where k <= PAT_GROUP_K their summed attributions for each of
the 2^k patterns of directions are one table of 2^k rows (a whole tree of at most PAT_MAX_K
splits: one table). A row takes its directions at a tree's splits once (four compares a step),
then per group k bits (BMI2 pext where it is fast, pattern.h), one table row and an addition a
feature of the group: a full tree of depth 5 (as model A's are) takes 8 groups of 6 splits,
48 additions instead of 32 leaves x 5.

Deeper trees (d <= QUAD_MAX_D) take quadrature: w(s, d) is the Beta integral of
t^s (1-t)^(d-1-s) over [0, 1], so the sum above is the integral of prod_{i != j}
(z_i (1 - t) + o_i t), a polynomial of degree d - 1 that ceil(d/2) Gauss-Legendre points give
exactly: O(d^2 / 2) multiplications a leaf, no division. Algorithm 2 serves the rest.

Trees with one value per leaf take the same integrals node by node instead (the sharing of
Linear TreeSHAP, Yu et al. 2022, in quadrature form; MODE_LINEAR): going down, each node
carries P, the product of its path's factors z_j (1 - t) + o_j t at the tree's quadrature
points (a feature met again on the path has its factor replaced by the merged one); coming
back up, each child edge returns S, the sum of v P over the leaves below it, and the edge's
feature gets (o - z) times the integral of S / (its factor) over the leaves whose last split
on that feature is this edge (S minus the S of the deeper edges splitting on it). O(Q) a node
and tree, Q = ceil(d / 2) for the tree's largest d, against O(d^2 / 2) a leaf. Up to NR rows
walk a tree together (the recursion, nodes and covers shared; only the path followed differs
between them), a point's values for the rows one vector (linear.h, with an AVX-512F copy
where the CPU has it).

Which mode a tree takes by default (measured, bench/NOTES.md): leaf tables where they fit
(shallow trees: a row alone costs least there), else MODE_LINEAR (one value per leaf), else
quadrature leaf by leaf, else Algorithm 2.
"""

cimport cython
from cython.parallel cimport parallel, prange
from libc.math cimport isnan
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, malloc, free
from libc.string cimport memcpy, memset

import numpy as np

from walk cimport sw_special_right, sw_prefetch_l2

cdef extern from "pattern.h":
    int sw_pattern_fast_pext() nogil
    void sw_pattern_rows(int use_pext, const int32_t* fe, const float* th, uint64_t missr,
                         int64_t ns, const uint64_t* mask, const int32_t* pos, int32_t k,
                         const int64_t* off, const int32_t* feat, int32_t nf, int32_t rs,
                         int64_t ng, const double* table, const float* x, int64_t xs, double* phi,
                         int64_t ps, int64_t nr) noexcept nogil

cdef extern from "linear.h":
    enum:
        SW_LIN_MAX_ROWS
        SW_LIN_FRAME_ARRAYS
    ctypedef struct sw_lin:
        const int32_t* feature
        const int32_t* child
        const double* zfrac
        const double* value
        const uint32_t* right
        int32_t Q
        const double* tq
        const double* wq
        double* z
        uint32_t* o
        double** acc
        int32_t** acc_used
        int32_t* used
        double* arena
        int32_t frames
        uint32_t live
        double* phis[SW_LIN_MAX_ROWS]
        double* phi
    void* sw_lin_alloc(size_t size) noexcept nogil
    void sw_lin_free(void* p) noexcept nogil
    int32_t sw_lin_isa() noexcept nogil
    uint32_t sw_lin_dirs(const float* xt, float th, uint32_t miss_right, int32_t W) noexcept nogil
    void sw_lin_flush(double* phi, double* const* phis, int32_t nr, int32_t nf,
                      int32_t W) noexcept nogil
    int32_t sw_lin_width(int32_t nr) noexcept nogil
    void sw_lin_tree(sw_lin* s, int32_t W, int32_t isa) noexcept nogil

cdef enum:
    BLOCK = 16                      # rows that walk one tree before the next (8 and 32
                                    # measured slower on model A: 32 by 30%)
    TABLE_MAX_D = 6                 # distinct features on a leaf's path for the table
    TABLE_MAX_DOUBLES = 8 << 20     # the tables of one model (64 MB)
    PF_TABLE_BYTES = 1 << 20        # tables above this (a core's L2 here) are prefetched
    PAT_MAX_K = 8                   # splits of a tree for one pattern table (2^k rows), and
    PAT_GROUP_K = 6                 # of a group of a larger tree's leaves (measured on A, D:
                                    # bench/NOTES.md) ...
    PAT_MAX_DOUBLES = 4 << 20       # ... while a model's stay under this (32 MB)
    QUAD_MAX_D = 64                 # distinct features on a leaf's path for the quadrature
    QUAD_MAX_Q = 32                 # its quadrature points (QUAD_MAX_D / 2)
    QUAD_CELLS = 2048               # QUAD_MAX_D x QUAD_MAX_Q
    QUAD_MAX_ENTRIES = 16 << 20     # path entries of the leaves of one model
    MODE_RECURSIVE = 0              # Algorithm 2
    MODE_TABLE = 1
    MODE_QUADRATURE = 2
    MODE_LINEAR = 3
    MODE_AUTO = 4                   # tables, else linear, else quadrature, else Algorithm 2
    LINEAR_MAX_DEPTH = 64           # a tree's depth for MODE_LINEAR (its recursion's frames)
    NR = 16                         # rows that walk a MODE_LINEAR tree together (and a tree
                                    # of the path attribution: saabas_rows)

# Explainer(mode=): the evaluation each tree takes where it can (the rest as _tables says)
MODES = {"auto": MODE_AUTO, "linear": MODE_LINEAR, "linear-rows": MODE_LINEAR,
         "table": MODE_TABLE, "quadrature": MODE_QUADRATURE, "recursive": MODE_RECURSIVE}


cpdef enum Method:
    METHOD_TREESHAP = 0
    METHOD_PATH = 1


ctypedef struct PathElement:
    int32_t feature
    double zero_fraction
    double one_fraction
    double pweight


ctypedef struct SNode:           # a node as the path attribution reads it: one 16-byte record
    int32_t feature             # -1 at leaves
    float threshold
    int32_t child[2]            # (left, right), tree-local


ctypedef struct Trees:
    const int64_t* start       # first node of each tree
    const int32_t* feature     # -1 at leaves
    const float* threshold
    const int32_t* child       # (left, right), tree-local
    const uint8_t* default_left
    const uint32_t* special    # per node: offset of its entry in cats (0: x > threshold); NULL
    const uint32_t* cats       # special node entries (walk.h sw_special_right)
    const double* cover
    const double* value        # (node, width)
    const double* mean         # (node, width): cover-weighted mean of the leaves below
    const SNode* snode         # the nodes again, a record each (saabas_rows; NULL until the
    const double* sdelta       # first path attribution), and per (node, side, width)
                               # mean[child] - mean[node]
    const int32_t* group       # output of each tree (-1: every output, vector leaves)
    int32_t width
    int32_t n_outputs
    int32_t n_features
    # leaf by leaf (trees whose mode is not MODE_RECURSIVE)
    const int64_t* table_leaf   # (trees + 1): the first leaf of each tree in the leaf arrays
    const int64_t* leaf_node    # global node of each table leaf
    const int32_t* leaf_d       # distinct features on its path
    const int32_t* leaf_p       # splits on its path
    const int64_t* leaf_path    # first entry of its path in path_node / path_bit
    const int64_t* leaf_feat    # first of its d features in feat
    const int64_t* leaf_table   # first of its 2^d x d coefficients in table (-1: none)
    const int64_t* path_node    # global node of each split on the path
    const int32_t* path_bit     # (bit of the split's feature among the leaf's d) * 2 + right
    const int32_t* feat
    const double* table
    # trees of at most 64 nodes: per leaf and path feature, the nodes splitting on it (bits of
    # their tree-local index) and the directions the path takes there (set: right)
    const uint8_t* mode         # per tree: MODE_*
    const double* leaf_z        # per leaf and path feature (as feat): its cover fraction
    const double* gl_t          # Gauss-Legendre nodes on [0, 1], for Q = 1, 2, ... points:
    const double* gl_w          # Q (Q - 1) / 2 onwards, and their weights
    const uint8_t* small        # per tree: 1 when its patterns use these masks
    const uint64_t* feat_nodes
    const uint64_t* feat_right
    # MODE_LINEAR
    const double* zfrac         # per node: its cover over its parent's (roots: 1)
    const uint8_t* tree_q       # per tree: its quadrature points (ceil(d / 2), largest d)
    const uint8_t* tree_zero    # per tree: a node with zero cover (MODE_LINEAR row by row)
    # pattern tables (Explainer(patterns=); NULL pat_first: none): tree t's groups are
    # pat_first[t] .. pat_first[t + 1] - 1 (none: its leaf tables); per group the first of its
    # 2^k x nfp attributions in pat_table (k its own splits, nfp the tree's padded features),
    # its splits (numbers i of the tree's splits in ps_*, ascending, padded to pat_kp with ns,
    # from pat_inner_off in pat_inner) and its features (padded to pat_nfp, from pat_feat_off
    # in pat_feat)
    const int64_t* pat_first
    const int64_t* ps_first     # per tree: its splits (ascending node) in ps_*, from here
    const uint8_t* ps_plain     # per tree: pattern.h takes it (<= 63 splits, none categorical)
    const uint64_t* ps_missr    # (<= 63 splits) bit i: split i sends a missing value right
    const int32_t* ps_feat      # per split: feature, threshold, 1 where a missing value goes
    const float* ps_thr         # right, tree-local node
    const uint8_t* ps_miss
    const int32_t* ps_node
    const int32_t* pat_kp       # per tree: its groups' bits and features, padded to the most
    const int32_t* pat_nfp      # of any of them (a bit: split ns, never taken; a feature:
                                # the bias column, overwritten after)
    const int32_t* pat_rs       # per tree: doubles from one table row to the next (its padded
                                # features rounded up to 8: a row a 64-byte line)
    const uint64_t* pat_mask    # per group of a tree of at most 63 splits: its splits' bits
    const int64_t* pat_off
    const int64_t* pat_inner_off
    const int32_t* pat_inner
    const int64_t* pat_feat_off
    const int32_t* pat_feat
    const double* pat_table


# A thread's scratch for up to NR rows walking a tree together: MODE_LINEAR's walk (linear.h:
# per feature, the merged factor of the path walked so far, z 1 and o every row when not on
# the path, and the S accumulator of the deepest edge on the path splitting on it; the frames,
# SW_LIN_FRAME_ARRAYS arrays of Q x W values a depth, in its arena), the rows' directions at a
# tree's splits (right), the rows by feature (xt) and their sums (phi_acc); the path
# attribution's saabas_rows uses only xs, phis and nr.
ctypedef struct Block:
    const float* xs[NR]          # the rows
    double* phis[NR]             # and their attributions (of the tree's output)
    int32_t nr                   # how many (<= NR)
    sw_lin lin
    uint32_t* right              # per node of the tree: bit r, row r goes right
    int32_t isa                  # the copies of the walk to take (Explainer.lin_isa)
    float* xt                    # the block's rows by feature, NR lanes a feature (past nr:
                                 # row 0), for the directions of trees taken W > 1 rows at once
    double* phi_acc              # per output and feature, the W rows' sums of the trees taken
                                 # W > 1 at once (sw_lin_flush adds them to the rows')


cdef inline bint goes_right(const Trees* T, int64_t base, int64_t node,
                            const float* x) noexcept nogil:
    cdef float v = x[T.feature[base + node]]
    if T.special != NULL and T.special[base + node] != 0:
        return sw_special_right(v, 1 - T.default_left[base + node],
                                T.cats[T.special[base + node]], T.cats + T.special[base + node])
    if isnan(v):
        return not T.default_left[base + node]
    return v > T.threshold[base + node]


cdef inline int64_t next_node(const Trees* T, int64_t base, int64_t node,
                              const float* x) noexcept nogil:
    return T.child[2 * (base + node) + goes_right(T, base, node, x)]


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


cdef inline void table_span(const Trees* T, int64_t t, const char** lo,
                            const char** hi) noexcept nogil:
    """The bytes of tree t's leaf tables (pointers left alone where it has none, or takes
    pattern tables)."""
    cdef int64_t l0 = T.table_leaf[t], l1 = T.table_leaf[t + 1]
    if T.pat_first != NULL and T.pat_first[t] < T.pat_first[t + 1]:
        return  # pattern tables: a block's rows read few of their lines (not prefetched)
    if T.mode[t] != MODE_TABLE or l1 <= l0 or T.leaf_table[l0] < 0 or T.leaf_table[l1 - 1] < 0:
        return
    lo[0] = <const char*>(T.table + T.leaf_table[l0])
    hi[0] = <const char*>(T.table + T.leaf_table[l1 - 1]
                          + (<int64_t>1 << T.leaf_d[l1 - 1]) * T.leaf_d[l1 - 1])


cdef inline void prefetch_share(const char** lo, const char* hi, int64_t parts) noexcept nogil:
    """Prefetch the next 1 / parts of lo..hi (into L2), moving lo past it."""
    cdef const char* p = lo[0]
    cdef const char* end = p + (hi - p) // parts + 64
    while p < hi and p < end:
        sw_prefetch_l2(p)
        p += 64
    lo[0] = p


cdef void leaf_shap(const Trees* T, int64_t t, const float* x, double* phi,
                    int32_t out_stride, uint8_t* right) noexcept nogil:
    """One tree leaf by leaf (its mode: tables or quadrature); ``right`` scratch of the
    tree's node count."""
    cdef int64_t base = T.start[t], n = T.start[t + 1] - base, i
    cdef uint64_t R = 0
    if T.small[t]:
        for i in range(n):
            if T.feature[base + i] >= 0:
                R |= (<uint64_t>goes_right(T, base, i, x)) << i
    else:
        for i in range(n):
            if T.feature[base + i] >= 0:
                right[i] = goes_right(T, base, i, x)
    leaf_sum(T, t, T.table_leaf[t], T.table_leaf[t + 1], R, right, phi, out_stride)


cdef void pattern_rows(const Trees* T, int64_t t, const float* x, int64_t x_stride,
                       double* phi, int64_t phi_stride, int64_t nr, uint8_t* right,
                       bint use_pext) noexcept nogil:
    """A tree by its pattern tables (Explainer(patterns=), one output; module docstring):
    its leaves cut into groups (_cut), each the leaves below a node whose path and splits
    below come to k <= PAT_GROUP_K splits (a whole tree of at most PAT_MAX_K: one group), with
    their attributions for each of the 2^k patterns of directions at those splits summed at
    load (leaf_sum over their leaf tables). Rows x .. x + (nr - 1) x_stride, their
    attributions phi on (phi_stride apart). pattern.h takes trees of at most 63 splits
    without categorical splits (ps_plain); this loop the rest (a byte a direction, goes_right
    in models with categorical splits). Every group of a tree loops the same number of times
    (pat_kp, pat_nfp), so its loops' exits are predicted."""
    cdef int64_t g, at, fo, idx, i, r, s0 = T.ps_first[t], ns = T.ps_first[t + 1] - s0
    cdef int64_t g0 = T.pat_first[t], g1 = T.pat_first[t + 1]
    cdef int32_t j, kp = T.pat_kp[t], nf = T.pat_nfp[t], rs = T.pat_rs[t]
    cdef const int32_t* fe = T.ps_feat + s0
    cdef const float* th = T.ps_thr + s0
    cdef const uint8_t* miss = T.ps_miss + s0
    cdef const double* row
    cdef const float* xr
    cdef double* pr
    cdef float v
    if T.ps_plain[t]:  # pattern.h
        sw_pattern_rows(use_pext, fe, th, T.ps_missr[t], ns, T.pat_mask + g0,
                        T.pat_inner + T.pat_inner_off[g0], kp, T.pat_off + g0,
                        T.pat_feat + T.pat_feat_off[g0], nf, rs, g1 - g0, T.pat_table, x,
                        x_stride, phi, phi_stride, nr)
        return
    right[ns] = 0
    for r in range(nr):
        xr, pr = x + r * x_stride, phi + r * phi_stride
        if T.special == NULL:
            for i in range(ns):
                v = xr[fe[i]]
                right[i] = (<uint8_t>(v > th[i])) | ((<uint8_t>(v != v)) & miss[i])
        else:
            for i in range(ns):
                right[i] = goes_right(T, T.start[t], T.ps_node[s0 + i], xr)
        for g in range(g0, g1):
            at, fo, idx = T.pat_inner_off[g], T.pat_feat_off[g], 0
            for j in range(kp):
                idx |= (<int64_t>right[T.pat_inner[at + j]]) << j
            row = T.pat_table + T.pat_off[g] + idx * rs
            for j in range(nf):
                pr[T.pat_feat[fo + j]] += row[j]


cdef void leaf_sum(const Trees* T, int64_t t, int64_t l0, int64_t l1, uint64_t R,
                   const uint8_t* right, double* phi, int32_t out_stride) noexcept nogil:
    """leaf_shap's sum over the leaves l0 .. l1 - 1 of tree t, the row's directions at its
    splits given (R: small trees, by tree-local node bit; right: the others)."""
    cdef int64_t base = T.start[t], l, q, g, f0, mask
    cdef int32_t d, k, o, b
    cdef const double* tbl
    cdef double v
    for l in range(l0, l1):
        d = T.leaf_d[l]
        if T.small[t]:  # feature k followed: every split on it goes the path's way
            mask = 0
            f0 = T.leaf_feat[l]
            for k in range(d):
                if ((R ^ T.feat_right[f0 + k]) & T.feat_nodes[f0 + k]) == 0:
                    mask |= (<int64_t>1) << k
        else:
            mask = -1  # every bit: d may be 64
            for q in range(T.leaf_path[l], T.leaf_path[l] + T.leaf_p[l]):
                b = T.path_bit[q]
                if right[T.path_node[q] - base] != (b & 1):
                    mask &= ~((<int64_t>1) << (b >> 1))
        if d < 64:
            mask &= ((<int64_t>1) << d) - 1
        if T.mode[t] == MODE_QUADRATURE:
            quadrature_leaf(T, l, d, mask, phi, out_stride)
            continue
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


cdef void quadrature_leaf(const Trees* T, int64_t l, int32_t d, int64_t mask, double* phi,
                          int32_t out_stride) noexcept nogil:
    """One leaf: feature k gets v (o_k - z_k) times the integral over [0, 1] of
    prod_{j != k} (z_j (1 - t) + o_j t), a polynomial of degree d - 1, so Gauss-Legendre with
    ceil(d / 2) points is exact (the weights w(s, d) are Beta integrals of t^s (1-t)^(d-1-s)).
    Quadrature points innermost: short loops the compiler vectorises."""
    cdef double h[QUAD_CELLS]    # h[k * Q + q]
    cdef double pre[QUAD_CELLS]  # prod_{j < k} h_j at point q
    cdef double run[QUAD_MAX_Q]
    cdef double acc[QUAD_MAX_D]
    cdef int32_t Q, k, q, o
    cdef int64_t g0 = T.leaf_feat[l], g = T.leaf_node[l], base
    cdef const double* tq
    cdef const double* wq
    cdef double zk, ok, a, v
    if d == 0:
        return
    Q = (d + 1) // 2
    base = <int64_t>Q * (Q - 1) // 2
    tq = T.gl_t + base
    wq = T.gl_w + base
    for q in range(Q):
        run[q] = 1.0
    for k in range(d):
        zk = T.leaf_z[g0 + k]
        ok = 1.0 if (mask >> k) & 1 else 0.0
        for q in range(Q):
            h[k * Q + q] = zk + (ok - zk) * tq[q]
            pre[k * Q + q] = run[q]
            run[q] *= h[k * Q + q]
    for q in range(Q):
        run[q] = wq[q]  # from here: the weight times prod_{j > k} h_j
    k = d - 1
    while k >= 0:
        a = 0.0
        for q in range(Q):
            a += pre[k * Q + q] * run[q]
            run[q] *= h[k * Q + q]
        acc[k] = a
        k -= 1
    for o in range(T.width):
        v = T.value[g * T.width + o]
        for k in range(d):
            ok = 1.0 if (mask >> k) & 1 else 0.0
            phi[o * out_stride + T.feat[g0 + k]] += v * (ok - T.leaf_z[g0 + k]) * acc[k]


cdef inline void block_rows(Block* blo, const float* x, int64_t x_stride, double* phi,
                            int64_t phi_stride, int64_t nr) noexcept nogil:
    """The block's nr rows from x (x_stride apart), their attributions phi on (phi_stride
    apart)."""
    cdef int64_t r
    blo.nr = <int32_t>nr
    for r in range(nr):
        blo.xs[r] = x + r * x_stride
        blo.phis[r] = phi + r * phi_stride


cdef void block_tree(const Trees* T, int64_t t, Block* s) noexcept nogil:
    """One MODE_LINEAR tree for the ``s.nr`` rows of ``s`` (linear.h): the rows' directions
    at its splits as a mask a split, then the walk of the smallest copy that holds them, its
    lanes past ``s.nr`` repeating row 0. More than one row: the directions from ``s.xt``
    (four compares a step; categorical splits by goes_right), the attributions summed in
    ``s.phi_acc`` (the caller adds them to the rows' after the block's last tree)."""
    cdef int32_t Q = T.tree_q[t], W = sw_lin_width(s.nr), r, o = max(T.group[t], 0)
    cdef int64_t base = T.start[t], nodes = T.start[t + 1] - T.start[t], node, g
    cdef int64_t gq = <int64_t>Q * (Q - 1) // 2
    cdef uint32_t m, pad = ((<uint32_t>1 << W) - 1) & ~((<uint32_t>1 << s.nr) - 1)
    cdef sw_lin* L = &s.lin
    if Q == 0:
        return
    for node in range(nodes):
        g = base + node
        if T.feature[g] < 0:
            continue
        if W > 1 and (T.special == NULL or T.special[g] == 0):
            s.right[node] = sw_lin_dirs(s.xt + <int64_t>T.feature[g] * NR, T.threshold[g],
                                        1 - T.default_left[g], W)
            continue
        m = 0
        for r in range(s.nr):
            m |= (<uint32_t>goes_right(T, base, node, s.xs[r])) << r
        s.right[node] = m | (pad if m & 1 else 0)
    L.feature = T.feature + base
    L.child = T.child + 2 * base
    L.zfrac = T.zfrac + base
    L.value = T.value + base
    L.right = s.right
    L.Q, L.tq, L.wq = Q, T.gl_t + gq, T.gl_w + gq
    L.live = (<uint32_t>1 << s.nr) - 1
    L.phis[0] = s.phis[0]
    L.phi = s.phi_acc + <int64_t>o * T.n_features * W
    sw_lin_tree(L, W, s.isa)


cdef void saabas(const Trees* T, int64_t base, const float* x, double* phi,
                 int32_t out_stride) noexcept nogil:
    """The path attribution of one tree for one row: each split on the row's path gives its
    feature the change of the node means. Models with special nodes; the others take
    saabas_rows."""
    cdef int64_t node = 0, nxt
    cdef int32_t o, f
    while T.feature[base + node] >= 0:
        f = T.feature[base + node]
        nxt = next_node(T, base, node, x)
        for o in range(T.width):
            phi[o * out_stride + f] += (T.mean[(base + nxt) * T.width + o]
                                        - T.mean[(base + node) * T.width + o])
        node = nxt


cdef void saabas_rows(const Trees* T, int64_t base, const float* const* xs,
                      double* const* phis, int32_t nr, int32_t out_stride) noexcept nogil:
    """saabas for nr <= NR rows of a block at once (models without special nodes): the rows
    step in turn, so their walks' misses overlap where one row's are each the next one's
    address (a row's additions keep their order: the same doubles)."""
    cdef int64_t node[NR]
    cdef int32_t r, f, side, o, active = nr
    cdef const SNode* nd
    cdef const double* dl
    cdef float v
    for r in range(nr):
        node[r] = 0
    while active > 0:
        active = 0
        for r in range(nr):
            if node[r] < 0:
                continue
            nd = T.snode + base + node[r]
            f = nd.feature
            if f < 0:
                node[r] = -1
                continue
            active += 1
            v = xs[r][f]
            if isnan(v):
                side = not T.default_left[base + node[r]]
            else:
                side = v > nd.threshold
            dl = T.sdelta + ((base + node[r]) * 2 + side) * T.width
            for o in range(T.width):
                phis[r][o * out_stride + f] += dl[o]
            node[r] = nd.child[side]


cdef class Explainer:
    """The attributions of one compiled model (``CompiledModel.contributions``)."""

    cdef Trees T
    cdef int64_t n_trees, max_nodes
    cdef readonly int64_t tabled  # trees explained by their leaf tables
    cdef readonly int64_t quadrature  # trees explained leaf by leaf by quadrature
    cdef readonly int64_t linear  # trees explained node by node by quadrature
    cdef readonly int64_t patterned  # trees explained by their pattern tables
    cdef readonly int64_t pattern_groups  # and their groups of leaves
    cdef readonly bint pext  # pattern tables gather their bits by BMI2 pext (pattern.h)
    cdef readonly int32_t lin_isa  # MODE_LINEAR's copies: 1 AVX-512F, 0 baseline
    cdef int32_t lin_frames, lin_q  # MODE_LINEAR's scratch: frames (deepest leaf + 1), points
    cdef int32_t max_depth
    cdef readonly bint prefetch_tables  # prefetch the next tree's leaf tables
    cdef readonly int64_t leaf_table_bytes  # the leaf tables kept (none for patterned trees)
    cdef double divisor
    cdef object _keep
    cdef readonly object bias  # (n_outputs,) float64: base margin + the trees' expected values

    def __init__(self, dict arrays, int32_t n_features, int32_t n_outputs, double divisor,
                 str mode="auto", object prefetch=None, object patterns=None,
                 object pext=None, object lin_isa=None):
        """``arrays``: a checked artifact's (``structure.check``) with its ``x_*`` arrays.
        ``mode``: the TreeSHAP evaluation each tree takes where it can (``MODES``; "auto" the
        fastest measured, others for tests, which hold each to the libraries; "linear-rows":
        MODE_LINEAR a row at a time, as trees with a zero cover take it). ``prefetch``:
        whether a block's rows prefetch the next tree's leaf tables; None where the model's
        tables outgrow PF_TABLE_BYTES (True and False for tests). ``patterns``: pattern
        tables (pattern_rows) for the trees of leaf tables that allow them; None and True
        take them (a whole tree of at most PAT_MAX_K splits, groups of at most PAT_GROUP_K),
        an int K groups of at most K splits (tests and measurement), False (tests) keeps the
        leaf tables. ``pext``: the pattern tables gather a row's bits by BMI2 pext where the
        CPU does it fast (None), or by a loop (False; tests). ``lin_isa``: the copies of
        MODE_LINEAR's walk (linear.h) to take: None the widest this CPU runs, an int at most
        that (tests: 0 baseline, 1 AVX-512F)."""
        if mode not in MODES:
            raise ValueError(f"unknown TreeSHAP mode {mode!r} ({', '.join(MODES)})")
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
        if width > 1 and (width != n_outputs or (group >= 0).any()):
            raise ValueError("vector leaves must add to every output (tree_group -1)")
        mean = value.copy()
        depth = np.zeros(feature.shape[0], dtype=np.int32)
        self.max_depth = _means(start, feature, child, cover, mean, depth, width)
        tables = _tables(start, feature, child, cover, value, MODES[mode])
        zfrac = np.ones(feature.shape[0], dtype=np.float64)
        for t in range(self.n_trees):  # each child's cover over its parent's
            lo, hi = int(start[t]), int(start[t + 1])
            inner = lo + np.flatnonzero(feature[lo:hi] >= 0)
            for side in range(2):
                kids = lo + child[inner, side]
                zfrac[kids] = cover[kids] / cover[inner]
        self._keep = (start, feature, threshold, child, default_left, cover, value, mean, group,
                      tables, zfrac)
        self.T.snode = NULL  # built by the first path attribution (_path_records)
        self.T.sdelta = NULL
        self.T.zfrac = <const double*><Py_ssize_t>zfrac.ctypes.data
        self.T.tree_q = <const uint8_t*><Py_ssize_t>tables["tree_q"].ctypes.data
        tree_zero = np.zeros(max(self.n_trees, 1), dtype=np.uint8)
        if self.n_trees:  # a tree's smallest cover fraction is 0
            tree_zero[:self.n_trees] = (np.minimum.reduceat(zfrac, start[:-1]) == 0) | \
                (mode == "linear-rows")
        self._keep = self._keep + (tree_zero,)
        self.T.tree_zero = <const uint8_t*><Py_ssize_t>tree_zero.ctypes.data
        tb = tables
        self.T.table_leaf = <const int64_t*><Py_ssize_t>tb["table_leaf"].ctypes.data
        self.T.mode = <const uint8_t*><Py_ssize_t>tb["mode"].ctypes.data
        self.T.small = <const uint8_t*><Py_ssize_t>tb["small"].ctypes.data
        self.T.leaf_node = <const int64_t*><Py_ssize_t>tb["leaf_node"].ctypes.data
        self.T.leaf_d = <const int32_t*><Py_ssize_t>tb["leaf_d"].ctypes.data
        self.T.leaf_p = <const int32_t*><Py_ssize_t>tb["leaf_p"].ctypes.data
        self.T.leaf_path = <const int64_t*><Py_ssize_t>tb["leaf_path"].ctypes.data
        self.T.leaf_feat = <const int64_t*><Py_ssize_t>tb["leaf_feat"].ctypes.data
        self.T.leaf_table = <const int64_t*><Py_ssize_t>tb["leaf_table"].ctypes.data
        self.T.path_node = <const int64_t*><Py_ssize_t>tb["path_node"].ctypes.data
        self.T.path_bit = <const int32_t*><Py_ssize_t>tb["path_bit"].ctypes.data
        self.T.feat = <const int32_t*><Py_ssize_t>tb["feat"].ctypes.data
        self.T.leaf_z = <const double*><Py_ssize_t>tb["leaf_z"].ctypes.data
        self.T.table = <const double*><Py_ssize_t>tb["table"].ctypes.data
        self.T.feat_nodes = <const uint64_t*><Py_ssize_t>tb["feat_nodes"].ctypes.data
        self.T.feat_right = <const uint64_t*><Py_ssize_t>tb["feat_right"].ctypes.data
        self.T.gl_t = <const double*><Py_ssize_t>tb["gl_t"].ctypes.data
        self.T.gl_w = <const double*><Py_ssize_t>tb["gl_w"].ctypes.data
        self.max_nodes = int(np.max(np.diff(start)))
        self.tabled = int(np.sum(tb["mode"][:self.n_trees] == MODE_TABLE))
        self.quadrature = int(np.sum(tb["mode"][:self.n_trees] == MODE_QUADRATURE))
        self.linear = int(np.sum(tb["mode"][:self.n_trees] == MODE_LINEAR))
        lin = tb["mode"][:self.n_trees] == MODE_LINEAR
        self.lin_q = int(tb["tree_q"][:self.n_trees][lin].max()) if self.linear else 0
        self.lin_frames = min(self.max_depth, LINEAR_MAX_DEPTH) + 1
        self.T.start = <const int64_t*><Py_ssize_t>start.ctypes.data
        self.T.feature = <const int32_t*><Py_ssize_t>feature.ctypes.data
        self.T.threshold = <const float*><Py_ssize_t>threshold.ctypes.data
        self.T.child = <const int32_t*><Py_ssize_t>child.ctypes.data
        self.T.default_left = <const uint8_t*><Py_ssize_t>default_left.ctypes.data
        self.T.special = NULL
        self.T.cats = NULL
        if "x_special" in arrays:
            special = np.ascontiguousarray(arrays["x_special"], dtype=np.uint32)
            cats = np.ascontiguousarray(arrays["cats"], dtype=np.uint32)
            self._keep = self._keep + (special, cats)
            self.T.special = <const uint32_t*><Py_ssize_t>special.ctypes.data
            self.T.cats = <const uint32_t*><Py_ssize_t>cats.ctypes.data
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
        self.T.pat_first = NULL
        self.patterned = self.pattern_groups = 0
        if patterns is not False and patterns is not None and patterns is not True:
            if not 0 <= int(patterns) <= 12:
                raise ValueError("patterns: splits a group, 0 to 12")
        self.pext = sw_pattern_fast_pext() != 0 and pext is not False
        self.lin_isa = sw_lin_isa() if lin_isa is None else min(int(lin_isa), sw_lin_isa())
        if patterns is None or patterns is True:
            K, K_whole = PAT_GROUP_K, PAT_MAX_K
        else:
            K = K_whole = int(patterns)
        if patterns is not False and width == 1 and K > 0:
            pat_first = self._patterns(tb, K, K_whole, arrays["x_special"]
                                       if "x_special" in arrays else None)
            if self.patterned:
                self._release_leaf_tables(tb, pat_first)
        self.leaf_table_bytes = tb["table"].nbytes
        self.prefetch_tables = self.leaf_table_bytes > PF_TABLE_BYTES if prefetch is None \
            else bool(prefetch)

    def _release_leaf_tables(self, dict tb, pat_first):
        """The leaf tables of trees that take pattern tables are read no more (the kernel
        and table_span go to the patterns first): keep only the other trees', moved up
        (A: 5.7 MB freed)."""
        lt, tl, d = tb["leaf_table"], tb["table_leaf"], tb["leaf_d"].astype(np.int64)
        drop = np.zeros(lt.shape[0], dtype=bool)
        for t in np.flatnonzero(np.diff(pat_first) > 0):
            drop[tl[t]:tl[t + 1]] = True
        lt[drop] = -1
        keep = np.flatnonzero(lt >= 0)
        size = (np.int64(1) << d[keep]) * d[keep]
        new_off = np.concatenate(([0], np.cumsum(size))).astype(np.int64)
        src = np.repeat(lt[keep] - new_off[:-1], size) + np.arange(new_off[-1], dtype=np.int64)
        table = np.ascontiguousarray(tb["table"][src]) if keep.size else \
            np.zeros(1, dtype=np.float64)
        lt[keep] = new_off[:-1]
        tb["table"] = table
        self.T.table = <const double*><Py_ssize_t>table.ctypes.data

    def _patterns(self, dict tb, int32_t K, int32_t K_whole, special):
        """Pattern tables (pattern_rows) for the trees explained by leaf tables whose leaves
        all lie at most K splits deep or that have at most K_whole splits, while the model's
        stay under PAT_MAX_DOUBLES (``special``: x_special or None). A tree's
        groups are taken from the root down: node v heads one where its depth plus the splits
        below it come to at most K (its leaves' directions then depend on those splits only),
        else its children are tried. Each row of a group's table is leaf_sum over the group's
        leaves for one pattern of directions at its splits."""
        start, feature, threshold, child, default_left = self._keep[:5]
        nft = self.T.n_features  # the padding feature: the bias column
        mode, table_leaf, leaf_node = tb["mode"], tb["table_leaf"], tb["leaf_node"]
        n_trees = self.n_trees
        pat_first = np.zeros(n_trees + 1, dtype=np.int64)
        ps_first = np.zeros(n_trees + 1, dtype=np.int64)
        kp = np.zeros(max(n_trees, 1), dtype=np.int32)
        nfp = np.zeros(max(n_trees, 1), dtype=np.int32)
        rsv = np.zeros(max(n_trees, 1), dtype=np.int32)
        groups, splits = [], []  # per group: (tree, first leaf, leaf end, k, bits, features,
                                 # mask)
        n_dbl = n_splits = 0
        for t in range(n_trees):
            pat_first[t + 1], ps_first[t + 1] = len(groups), n_splits
            if mode[t] != MODE_TABLE or n_dbl + 2 > PAT_MAX_DOUBLES:
                continue
            lo = int(start[t])
            tree = _cut(lo, int(start[t + 1]), feature, child, K, K_whole,
                        leaf_node[table_leaf[t]:table_leaf[t + 1]], int(table_leaf[t]))
            if tree is None:
                continue
            k = max(nodes.size for _, _, nodes, _ in tree)
            nf = max(f.size for _, _, _, f in tree)
            rs = -(-nf // 8) * 8  # a table row a line (64 bytes)
            size = sum((1 << nodes.size) * rs for _, _, nodes, _ in tree)
            if n_dbl + size > PAT_MAX_DOUBLES:
                continue
            inner = np.flatnonzero(feature[lo:int(start[t + 1])] >= 0).astype(np.int32)
            for first, end, nodes, f in tree:  # bits: split ordinals, padded with ns
                bits = np.full(k, inner.size, dtype=np.int32)
                bits[:nodes.size] = np.searchsorted(inner, nodes)
                feats = np.full(nf, nft, dtype=np.int32)
                feats[:f.size] = f
                mask = 0
                if inner.size <= 63:
                    for b in bits[:nodes.size]:
                        mask |= 1 << int(b)
                groups.append((t, first, end, nodes.size, bits, feats, mask))
            splits.append(inner)
            n_dbl += size
            n_splits += inner.size
            kp[t], nfp[t], rsv[t] = k, nf, rs
            pat_first[t + 1], ps_first[t + 1] = len(groups), n_splits
        if n_dbl == 0:
            return
        ps_node = np.concatenate(splits).astype(np.int32)
        node_base = np.repeat(start[:-1], np.diff(ps_first))
        ps_feat = feature[node_base + ps_node].astype(np.int32)
        ps_thr = threshold[node_base + ps_node].astype(np.float32)
        ps_miss = (1 - default_left[node_base + ps_node]).astype(np.uint8)
        ps_plain = np.zeros(max(n_trees, 1), dtype=np.uint8)
        ps_plain[:n_trees] = (np.diff(ps_first) <= 63) & (np.diff(pat_first) > 0)
        if special is not None:  # a tree with a categorical split: pattern_rows' loop
            cats = np.concatenate(([0], np.cumsum(special[node_base + ps_node] != 0)))
            ps_plain[:n_trees] &= cats[ps_first[1:]] == cats[ps_first[:-1]]
        ps_missr = np.zeros(max(n_trees, 1), dtype=np.uint64)
        for t in np.flatnonzero(ps_plain):
            right = np.flatnonzero(ps_miss[ps_first[t]:ps_first[t + 1]]).tolist()
            ps_missr[t] = sum(1 << i for i in right)
        pat_tree = np.array([g[0] for g in groups], dtype=np.int64)
        pat_leaves = np.array([(g[1], g[2]) for g in groups], dtype=np.int64)
        pat_k = np.array([g[3] for g in groups], dtype=np.int32)
        sizes = (np.int64(1) << pat_k.astype(np.int64)) * rsv[pat_tree]
        pat_off = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        inner_off = np.concatenate(([0], np.cumsum(kp[pat_tree])[:-1])).astype(np.int64)
        feat_off = np.concatenate(([0], np.cumsum(nfp[pat_tree])[:-1])).astype(np.int64)
        pat_inner = np.concatenate([g[4] for g in groups]).astype(np.int32)
        pat_feat = np.concatenate([g[5] for g in groups]).astype(np.int32)
        pat_mask = np.array([g[6] for g in groups], dtype=np.uint64)
        buf = np.zeros(n_dbl + 8, dtype=np.float64)  # from a 64-byte boundary: a row a line
        at = (-buf.ctypes.data % 64) // 8
        table = buf[at:at + n_dbl]
        self._fill_patterns(pat_tree, pat_leaves, pat_off, pat_k, inner_off, pat_inner,
                            feat_off, pat_feat, ps_first, ps_node, nfp, rsv, table)
        self._keep = self._keep + (pat_first, ps_first, ps_plain, ps_missr, ps_feat, ps_thr,
                                   ps_miss, ps_node, kp,
                                   nfp, rsv, pat_off, pat_k, inner_off, pat_inner, feat_off,
                                   pat_feat, pat_mask, table)
        self.T.ps_first = <const int64_t*><Py_ssize_t>ps_first.ctypes.data
        self.T.ps_plain = <const uint8_t*><Py_ssize_t>ps_plain.ctypes.data
        self.T.ps_missr = <const uint64_t*><Py_ssize_t>ps_missr.ctypes.data
        self.T.ps_feat = <const int32_t*><Py_ssize_t>ps_feat.ctypes.data
        self.T.ps_thr = <const float*><Py_ssize_t>ps_thr.ctypes.data
        self.T.ps_miss = <const uint8_t*><Py_ssize_t>ps_miss.ctypes.data
        self.T.ps_node = <const int32_t*><Py_ssize_t>ps_node.ctypes.data
        self.T.pat_kp = <const int32_t*><Py_ssize_t>kp.ctypes.data
        self.T.pat_nfp = <const int32_t*><Py_ssize_t>nfp.ctypes.data
        self.T.pat_rs = <const int32_t*><Py_ssize_t>rsv.ctypes.data
        self.T.pat_mask = <const uint64_t*><Py_ssize_t>pat_mask.ctypes.data
        self.T.pat_off = <const int64_t*><Py_ssize_t>pat_off.ctypes.data
        self.T.pat_inner_off = <const int64_t*><Py_ssize_t>inner_off.ctypes.data
        self.T.pat_inner = <const int32_t*><Py_ssize_t>pat_inner.ctypes.data
        self.T.pat_feat_off = <const int64_t*><Py_ssize_t>feat_off.ctypes.data
        self.T.pat_feat = <const int32_t*><Py_ssize_t>pat_feat.ctypes.data
        self.T.pat_table = <const double*><Py_ssize_t>table.ctypes.data
        self.T.pat_first = <const int64_t*><Py_ssize_t>pat_first.ctypes.data  # last: on
        self.patterned = int(np.sum(np.diff(pat_first) > 0))
        self.pattern_groups = len(groups)
        return pat_first

    def _fill_patterns(self, const int64_t[::1] pat_tree, const int64_t[:, ::1] pat_leaves,
                       const int64_t[::1] pat_off, const int32_t[::1] pat_k,
                       const int64_t[::1] inner_off, const int32_t[::1] pat_inner,
                       const int64_t[::1] feat_off, const int32_t[::1] pat_feat,
                       const int64_t[::1] ps_first, const int32_t[::1] ps_node,
                       const int32_t[::1] nfp, const int32_t[::1] rs, double[::1] table):
        cdef int64_t g, t, p, R, node
        cdef int32_t j, nf = self.T.n_features
        cdef double[::1] phi = np.zeros(nf + 1, dtype=np.float64)
        cdef uint8_t[::1] right = np.zeros(self.max_nodes + 1, dtype=np.uint8)
        for g in range(pat_tree.shape[0]):
            t = pat_tree[g]
            for p in range(<int64_t>1 << pat_k[g]):
                R = 0
                for j in range(pat_k[g]):  # the real bits come first
                    node = ps_node[ps_first[t] + pat_inner[inner_off[g] + j]]
                    right[node] = p >> j & 1
                    if right[node] and node < 64:  # R: trees of at most 64 nodes (small)
                        R |= (<int64_t>1) << node
                leaf_sum(&self.T, t, pat_leaves[g, 0], pat_leaves[g, 1], <uint64_t>R,
                         &right[0], &phi[0], nf + 1)
                for j in range(nfp[t]):  # padding reads phi[nf]: 0, never added to here
                    table[pat_off[g] + p * rs[t] + j] = phi[pat_feat[feat_off[g] + j]]
                    phi[pat_feat[feat_off[g] + j]] = 0.0

    def _path_records(self):
        """saabas_rows' node records and changes of the means, built at the first path
        attribution (C: 21 MB that TreeSHAP alone does not need)."""
        start, feature, threshold, child, mean = (self._keep[0], self._keep[1], self._keep[2],
                                                  self._keep[3], self._keep[7])
        width = mean.shape[1]
        snode = np.empty((feature.shape[0], 4), dtype=np.int32)  # SNode records
        snode[:, 0] = feature
        snode[:, 1] = threshold.view(np.int32)
        snode[:, 2:] = child
        sdelta = np.zeros((feature.shape[0], 2, width), dtype=np.float64)
        node_base = np.repeat(start[:-1], np.diff(start))
        inner = np.flatnonzero(feature >= 0)
        for side in range(2):
            sdelta[inner, side] = mean[node_base[inner] + child[inner, side]] - mean[inner]
        self._keep = self._keep + (snode, sdelta)
        self.T.sdelta = <const double*><Py_ssize_t>sdelta.ctypes.data
        self.T.snode = <const SNode*><Py_ssize_t>snode.ctypes.data

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
        cdef Block* blo  # (a pointer: assigned in the parallel block, so thread-private)
        cdef bint linear = method == METHOD_TREESHAP and self.linear > 0
        cdef int64_t step
        cdef int32_t j, k, w
        cdef int failed[1]
        cdef double* phi
        cdef double[:, :, ::1] out
        cdef const char* pf_lo
        cdef const char* pf_hi
        if X.shape[1] != nf:
            raise ValueError(f"X has {X.shape[1]} features, the model {nf}")
        if method != METHOD_TREESHAP and method != METHOD_PATH:
            raise ValueError(f"unknown method {method}")
        if method == METHOD_PATH and self.T.special == NULL and self.T.snode == NULL:
            self._path_records()
        result = np.zeros((n, G, nf + 1), dtype=np.float64)
        out = result
        if n == 0:
            return result
        failed[0] = 0
        with nogil, parallel(num_threads=max(n_threads, 1)):
            path = <PathElement*>malloc(scratch * sizeof(PathElement))
            right = <uint8_t*>malloc(self.max_nodes + 1)
            blo = <Block*>calloc(1, sizeof(Block))
            if blo != NULL and linear:  # sized at load: frames to the deepest leaf, points
                blo.lin.frames = self.lin_frames
                blo.isa = self.lin_isa
                blo.lin.z = <double*>malloc((nf + 1) * sizeof(double))
                blo.lin.o = <uint32_t*>malloc((nf + 1) * sizeof(uint32_t))
                blo.lin.acc = <double**>malloc((nf + 1) * sizeof(double*))
                blo.lin.acc_used = <int32_t**>malloc((nf + 1) * sizeof(int32_t*))
                blo.lin.used = <int32_t*>malloc(blo.lin.frames * sizeof(int32_t))
                blo.lin.arena = <double*>sw_lin_alloc(<int64_t>(blo.lin.frames + 1)
                                                      * SW_LIN_FRAME_ARRAYS * NR * self.lin_q
                                                      * sizeof(double))
                blo.right = <uint32_t*>malloc((self.max_nodes + 1) * sizeof(uint32_t))
                blo.xt = <float*>malloc(<int64_t>nf * NR * sizeof(float) + 1)
                blo.phi_acc = <double*>calloc(<int64_t>G * nf * NR + 1, sizeof(double))
            if path == NULL or right == NULL or blo == NULL or linear and (
                    blo.lin.z == NULL or blo.lin.o == NULL or blo.lin.acc == NULL or
                    blo.lin.acc_used == NULL or blo.lin.used == NULL or
                    blo.lin.arena == NULL or blo.right == NULL or
                    blo.xt == NULL or blo.phi_acc == NULL):
                failed[0] = 1
            else:
                if linear:
                    for j in range(nf + 1):
                        blo.lin.z[j], blo.lin.o[j], blo.lin.acc[j], blo.lin.acc_used[j] = \
                            1.0, 0xFFFFFFFF, NULL, NULL
                # trees outer, rows inner within a block: one tree's nodes and leaf tables
                # stay in cache while the block's rows walk it (the tables of a model are
                # megabytes; row by row, every leaf's lookup missed L2). Where a model's
                # tables outgrow L2, each row of the block also prefetches a share of the next
                # tree's, so they come from L2 rather than L3 or memory (A, paired in one
                # process: 1.15x-1.63x under this host's noise; D's 150 KB: 0.91x, so not
                # there; bench/NOTES.md)
                for blk in prange(n_blocks, schedule="dynamic"):
                    r0 = blk * BLOCK
                    r1 = min(r0 + BLOCK, n)
                    if linear:  # the block's rows by feature (block_tree; BLOCK == NR, so a
                        # tree taken NR rows at a time takes the block at once), lanes past r1: r0
                        w = sw_lin_width(<int32_t>(r1 - r0))
                        for k in range(nf):
                            for r in range(w):
                                blo.xt[k * NR + r] = X[r0 + r if r0 + r < r1 else r0, k]
                    for t in range(self.n_trees):
                        o = self.T.group[t]
                        if o < 0:
                            o = 0  # vector leaves: every output, from output 0 on
                        if method == METHOD_TREESHAP and self.T.mode[t] == MODE_LINEAR:
                            # NR rows at a time; a row at a time on a tree with a zero cover
                            step = 1 if self.T.tree_zero[t] else NR
                            r = r0
                            while r < r1:
                                block_rows(blo, &X[r, 0], nf, &out[r, o, 0],
                                           <int64_t>G * stride, min(step, r1 - r))
                                block_tree(&self.T, t, blo)
                                r += step
                            continue
                        if method == METHOD_PATH and self.T.special == NULL:
                            r = r0
                            while r < r1:
                                block_rows(blo, &X[r, 0], nf, &out[r, o, 0],
                                           <int64_t>G * stride, min(NR, r1 - r))
                                saabas_rows(&self.T, self.T.start[t], blo.xs, blo.phis, blo.nr,
                                            stride)
                                r += NR
                            continue
                        if method == METHOD_TREESHAP and self.T.pat_first != NULL and \
                                self.T.pat_first[t] < self.T.pat_first[t + 1]:
                            pattern_rows(&self.T, t, &X[r0, 0], nf, &out[r0, o, 0],
                                         <int64_t>G * stride, r1 - r0, right, self.pext)
                            continue
                        pf_lo = pf_hi = NULL
                        if self.prefetch_tables and method == METHOD_TREESHAP and \
                                t + 1 < self.n_trees:
                            table_span(&self.T, t + 1, &pf_lo, &pf_hi)
                        for r in range(r0, r1):
                            phi = &out[r, o, 0]
                            if pf_lo != NULL:  # the next tree's tables, a share a row
                                prefetch_share(&pf_lo, pf_hi, r1 - r)
                            if method == METHOD_TREESHAP and \
                                    self.T.mode[t] != MODE_RECURSIVE:
                                leaf_shap(&self.T, t, &X[r, 0], phi, stride, right)
                            elif method == METHOD_TREESHAP:
                                tree_shap(&self.T, self.T.start[t], 0, &X[r, 0], phi,
                                          stride, path, 0, 1.0, 1.0, -1)
                            else:
                                saabas(&self.T, self.T.start[t], &X[r, 0], phi, stride)
                    if linear and r1 - r0 > 1:  # the sums of the trees taken W > 1 at once
                        for o in range(G):
                            block_rows(blo, &X[r0, 0], nf, &out[r0, o, 0], <int64_t>G * stride,
                                       r1 - r0)
                            sw_lin_flush(blo.phi_acc + <int64_t>o * nf * w, blo.phis,
                                         blo.nr, nf, w)
            free(path)
            free(right)
            if blo != NULL:
                free(blo.lin.z)
                free(blo.lin.o)
                free(blo.lin.acc)
                free(blo.lin.acc_used)
                free(blo.lin.used)
                sw_lin_free(blo.lin.arena)
                free(blo.right)
                free(blo.xt)
                free(blo.phi_acc)
            free(blo)
        if failed[0]:
            raise MemoryError("no memory for the attribution scratch")
        result[:, :, :nf] /= self.divisor
        result[:, :, nf] = self.bias
        return result


def _cut(int64_t lo, int64_t hi, const int32_t[::1] feature, const int32_t[:, ::1] child,
         int32_t K, int32_t K_whole, const int64_t[::1] leaf_node, int64_t leaf0):
    """The groups of one tree (root ``lo``) for its pattern tables (Explainer._patterns): the
    whole tree where it has at most K_whole splits, else groups of at most K; None where a
    leaf lies more than K splits deep or a node has two parents (an artifact that passed
    structure.check with a shared child: its leaf tables walk it as before). Per group, in
    leaf order, its first leaf
    and leaf end (in the leaf arrays, from ``leaf0``: a subtree's leaves are consecutive
    there, _tables walking depth first), its splits (tree-local, ascending) and its
    features."""
    cdef int64_t n = hi - lo, i, v, c, l, deepest = 0
    cdef int64_t[::1] depth = np.zeros(n, dtype=np.int64)
    cdef int64_t[::1] parent = np.full(n, -1, dtype=np.int64)
    cdef int64_t[::1] below = np.zeros(n, dtype=np.int64)  # splits in the subtree
    cdef int64_t[::1] leaf_of = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        if feature[lo + i] >= 0:
            for c in range(2):
                if parent[child[lo + i, c]] >= 0 or child[lo + i, c] == 0:
                    return None  # a node of two parents: not a tree (leaf tables walk it)
                depth[child[lo + i, c]] = depth[i] + 1
                parent[child[lo + i, c]] = i
        elif depth[i] > deepest:
            deepest = depth[i]
    for i in range(n - 1, -1, -1):
        if feature[lo + i] >= 0:
            below[i] = 1 + below[child[lo + i, 0]] + below[child[lo + i, 1]]
    if deepest > K and below[0] > K_whole:
        return None
    for l in range(leaf_node.shape[0]):
        leaf_of[leaf_node[l] - lo] = leaf0 + l
    groups = []
    stack = [0]
    while stack:
        v = stack.pop()
        if depth[v] + below[v] > K and not (v == 0 and below[v] <= K_whole):
            stack.append(child[lo + v, 1])
            stack.append(child[lo + v, 0])
            continue
        nodes, leaves, todo = [], [], [v]
        i = parent[v]
        while i >= 0:
            nodes.append(i)
            i = parent[i]
        while todo:
            i = todo.pop()
            if feature[lo + i] >= 0:
                nodes.append(i)
                todo.append(child[lo + i, 0])
                todo.append(child[lo + i, 1])
            else:
                leaves.append(leaf_of[i])
        first, end = min(leaves), max(leaves) + 1
        if end - first != len(leaves) or first < 0:  # not so in a tree: leaf tables then
            return None
        nodes = np.array(sorted(nodes), dtype=np.int32)
        feats = np.unique(np.asarray(feature)[lo + nodes.astype(np.int64)]).astype(np.int32)
        groups.append((first, end, nodes, feats))
    return groups


cdef void fill_leaf_table(int32_t d, const double* z, double* out) noexcept:
    """The 2^d x d coefficients of one leaf (module docstring): out[A * d + k]."""
    cdef int32_t A, k, j, m, size, B
    cdef double w[TABLE_MAX_D + 1]
    cdef double e[TABLE_MAX_D + 1]
    cdef double outside, total
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


cdef int64_t _walk_leaves(int64_t lo, const int32_t[::1] feature,
                          const int32_t[:, ::1] child, int64_t[::1] st_node,
                          int64_t[::1] st_depth, int64_t[::1] path_n, int64_t[::1] stamp,
                          int64_t leaf0, int64_t* out) noexcept:
    """The sizes of one tree (root ``lo``), depth first: out[0] the largest number of
    distinct features on a leaf's path, out[1] the leaves, out[2] the path entries, out[3]
    the table doubles (sum of 2^d d, saturating), out[4] the deepest leaf's depth. Returns
    the next leaf id (``stamp`` marks the features seen per leaf id)."""
    cdef int64_t top = 0, node, depth, i, f, leaf = leaf0, d
    st_node[0], st_depth[0] = lo, 0
    top = 1
    out[0] = out[1] = out[2] = out[3] = out[4] = 0
    while top > 0:
        top -= 1
        node, depth = st_node[top], st_depth[top]
        if feature[node] < 0:
            d = 0
            for i in range(depth):
                f = feature[path_n[i]]
                if stamp[f] != leaf:
                    stamp[f] = leaf
                    d += 1
            leaf += 1
            out[0] = max(out[0], d)
            out[1] += 1
            out[2] += depth
            out[4] = max(out[4], depth)
            if d <= TABLE_MAX_D:
                out[3] += (<int64_t>1 << d) * d
            else:
                out[3] = TABLE_MAX_DOUBLES + 1
            continue
        path_n[depth] = node  # children below: their path is this one plus this node
        st_node[top], st_depth[top] = lo + child[node, 1], depth + 1
        st_node[top + 1], st_depth[top + 1] = lo + child[node, 0], depth + 1
        top += 2
    return leaf


def _tables(const int64_t[::1] start, const int32_t[::1] feature,
            const int32_t[:, ::1] child, const double[::1] cover, const double[:, ::1] value,
            int32_t prefer):
    """Each tree's leaves with their paths, and its mode: ``prefer`` where the tree allows it
    (MODE_LINEAR: one value per leaf, depth <= LINEAR_MAX_DEPTH, at most QUAD_MAX_D distinct
    path features; MODE_AUTO: tables where they fit, else MODE_LINEAR), else leaf tables
    (every leaf at most TABLE_MAX_D distinct path features, while the model's tables stay
    under TABLE_MAX_DOUBLES), else quadrature (at most
    QUAD_MAX_D, while the path entries stay under QUAD_MAX_ENTRIES), else Algorithm 2.
    ``prefer`` MODE_RECURSIVE: every tree by Algorithm 2. Typed loops: a forest of deep trees
    has millions of path entries."""
    cdef int64_t t, lo, n, node, depth, top, i, k, f, e, lf, ff, tb_at, leaf_id = 0
    cdef int64_t n_tab = 0, n_entries = 0, d, node_next
    cdef bint tabled
    cdef int64_t stats[5]
    cdef int64_t n_trees = start.shape[0] - 1
    cdef int64_t max_nodes = int(np.max(np.diff(start))) if n_trees else 1
    cdef int64_t nfs = int(np.max(feature)) + 2 if feature.shape[0] else 2
    cdef int64_t[::1] st_node = np.zeros(max_nodes + 2, dtype=np.int64)
    cdef int64_t[::1] st_depth = np.zeros(max_nodes + 2, dtype=np.int64)
    cdef int64_t[::1] path_n = np.zeros(max_nodes + 1, dtype=np.int64)
    cdef int32_t[::1] path_r = np.zeros(max_nodes + 1, dtype=np.int32)
    cdef int64_t[::1] stamp = np.full(nfs, -1, dtype=np.int64)
    cdef int32_t[::1] slot = np.zeros(nfs, dtype=np.int32)
    cdef double z[QUAD_MAX_D]
    cdef int64_t[::1] o_node, o_path, o_feat, o_table, o_pnode
    cdef int32_t[::1] o_d, o_p, o_pbit, o_f
    cdef double[::1] o_z, o_tab
    cdef uint64_t[::1] o_fn, o_fr
    cdef uint8_t[::1] mode_v, small_v
    table_leaf = np.zeros(start.shape[0], dtype=np.int64)
    mode = np.zeros(max(n_trees, 1), dtype=np.uint8)
    tree_q = np.zeros(max(n_trees, 1), dtype=np.uint8)
    small = np.zeros(max(n_trees, 1), dtype=np.uint8)
    mode_v, small_v = mode, small
    parts = []  # per tree with leaves: its arrays
    n_leaves_total = n_feat_total = 0
    for t in range(n_trees):
        lo, n = start[t], start[t + 1] - start[t]
        leaf_id = _walk_leaves(lo, feature, child, st_node, st_depth, path_n, stamp, leaf_id,
                               stats)
        tree_q[t] = (stats[0] + 1) // 2 if stats[0] <= QUAD_MAX_D else 0
        if prefer == MODE_RECURSIVE:
            table_leaf[t + 1] = n_leaves_total
            continue
        tabled = stats[0] <= TABLE_MAX_D and n_tab + stats[3] <= TABLE_MAX_DOUBLES
        if (prefer == MODE_LINEAR or (prefer == MODE_AUTO and not tabled)) and \
                value.shape[1] == 1 and stats[4] <= LINEAR_MAX_DEPTH and stats[0] <= QUAD_MAX_D:
            mode_v[t] = MODE_LINEAR
            table_leaf[t + 1] = n_leaves_total  # no leaf arrays: node by node
            continue
        if prefer == MODE_QUADRATURE and stats[0] <= QUAD_MAX_D and \
                n_entries + stats[2] <= QUAD_MAX_ENTRIES:
            mode_v[t] = MODE_QUADRATURE
        elif tabled:
            mode_v[t] = MODE_TABLE
        elif stats[0] <= QUAD_MAX_D and n_entries + stats[2] <= QUAD_MAX_ENTRIES:
            mode_v[t] = MODE_QUADRATURE
        else:
            table_leaf[t + 1] = n_leaves_total  # no leaves: Algorithm 2
            continue
        small_v[t] = n <= 64
        n_entries += stats[2]
        L = stats[1]
        o_node, o_d, o_p = np.zeros(L, np.int64), np.zeros(L, np.int32), np.zeros(L, np.int32)
        o_path, o_feat = np.zeros(L, np.int64), np.zeros(L, np.int64)
        o_table = np.full(L, -1, np.int64)
        o_pnode, o_pbit = np.zeros(stats[2] + 1, np.int64), np.zeros(stats[2] + 1, np.int32)
        o_f, o_z = np.zeros(stats[2] + 1, np.int32), np.zeros(stats[2] + 1, np.float64)
        o_fn, o_fr = np.zeros(stats[2] + 1, np.uint64), np.zeros(stats[2] + 1, np.uint64)
        o_tab = np.zeros(stats[3] + 1 if mode_v[t] == MODE_TABLE else 1, np.float64)
        # pass 2: the same walk, filling
        lf = e = ff = tb_at = 0
        st_node[0], st_depth[0] = lo, 0
        top = 1
        while top > 0:
            top -= 1
            node, depth = st_node[top], st_depth[top]
            if feature[node] >= 0:
                path_n[depth] = node
                st_node[top], st_depth[top] = lo + child[node, 1], depth + 1
                st_node[top + 1], st_depth[top + 1] = lo + child[node, 0], depth + 1
                top += 2
                continue
            d = 0
            for i in range(depth):  # the path's features, first seen first; cover fractions
                f = feature[path_n[i]]
                if stamp[f] != leaf_id:
                    stamp[f] = leaf_id
                    slot[f] = <int32_t>d
                    z[d] = 1.0
                    o_f[ff + d] = <int32_t>f
                    d += 1
                k = slot[f]
                # the child on the path: the next path node, or this leaf
                node_next = path_n[i + 1] if i + 1 < depth else node
                path_r[i] = 1 if node_next == lo + child[path_n[i], 1] else 0
                z[k] *= cover[node_next] / cover[path_n[i]]
                o_pnode[e + i] = path_n[i]
                o_pbit[e + i] = <int32_t>(k * 2 + path_r[i])
                if n <= 64:
                    o_fn[ff + k] |= (<uint64_t>1) << (path_n[i] - lo)
                    o_fr[ff + k] |= (<uint64_t>path_r[i]) << (path_n[i] - lo)
            leaf_id += 1
            for k in range(d):
                o_z[ff + k] = z[k]
            o_node[lf], o_d[lf], o_p[lf] = node, <int32_t>d, <int32_t>depth
            o_path[lf], o_feat[lf] = n_entries - stats[2] + e, n_feat_total + ff
            if mode_v[t] == MODE_TABLE:
                o_table[lf] = n_tab + tb_at
                if d:
                    fill_leaf_table(<int32_t>d, z, &o_tab[tb_at])
                    if value.shape[1] == 1:  # one value per leaf: folded in
                        for i in range((1 << d) * d):
                            o_tab[tb_at + i] *= value[node, 0]
                tb_at += (1 << d) * d
            lf += 1
            e += depth
            ff += d
        parts.append((np.asarray(o_node), np.asarray(o_d), np.asarray(o_p),
                      np.asarray(o_path), np.asarray(o_feat), np.asarray(o_table),
                      np.asarray(o_pnode)[:e], np.asarray(o_pbit)[:e], np.asarray(o_f)[:ff],
                      np.asarray(o_z)[:ff], np.asarray(o_fn)[:ff], np.asarray(o_fr)[:ff],
                      np.asarray(o_tab)[:tb_at]))
        n_tab += tb_at
        n_leaves_total += lf
        n_feat_total += ff
        table_leaf[t + 1] = n_leaves_total
    gl_t, gl_w = [], []
    for k in range(1, QUAD_MAX_Q + 1):  # Gauss-Legendre on [0, 1], k points
        xs, ws = np.polynomial.legendre.leggauss(k)
        gl_t.extend((xs + 1.0) / 2.0)
        gl_w.extend(ws / 2.0)
    names = ("leaf_node", "leaf_d", "leaf_p", "leaf_path", "leaf_feat", "leaf_table",
             "path_node", "path_bit", "feat", "leaf_z", "feat_nodes", "feat_right", "table")
    dtypes = (np.int64, np.int32, np.int32, np.int64, np.int64, np.int64, np.int64, np.int32,
              np.int32, np.float64, np.uint64, np.uint64, np.float64)
    out = {"table_leaf": table_leaf, "mode": mode, "small": small, "tree_q": tree_q,
           "gl_t": np.asarray(gl_t, dtype=np.float64),
           "gl_w": np.asarray(gl_w, dtype=np.float64)}
    for j, (name, dt) in enumerate(zip(names, dtypes)):
        arrays = [p[j] for p in parts if p[j].shape[0]]
        out[name] = np.concatenate(arrays).astype(dt) if arrays else np.zeros(1, dtype=dt)
    return out


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


@cython.boundscheck(False)
@cython.wraparound(False)
def top_reasons(const double[:, :] phi, const int64_t[::1] rows, int32_t[:, ::1] feat,
                float[:, ::1] val):
    """Row i of phi (its features' attributions, the bias last) into feat[rows[i]] and
    val[rows[i]]: the k = feat.shape[1] features of largest absolute attribution, largest
    first, a tie to the lower feature index (np.argsort(-|phi|, kind="stable")); a NaN
    attribution ranks below every number. O(features x k) a row, for the few flagged rows."""
    cdef Py_ssize_t n = phi.shape[0], nf = phi.shape[1] - 1, k = feat.shape[1]
    cdef Py_ssize_t i, j, c, p, r
    cdef double a
    if rows.shape[0] != n or val.shape[1] != k or k > nf:
        raise ValueError("top_reasons: shapes do not match")
    for i in range(n):
        if not 0 <= rows[i] < feat.shape[0] or feat.shape[0] != val.shape[0]:
            raise IndexError("top_reasons: row outside the output")
    if k == 0:
        return
    cdef double* key = <double*>malloc(max(k, 1) * sizeof(double))
    cdef int32_t* idx = <int32_t*>malloc(max(k, 1) * sizeof(int32_t))
    if key == NULL or idx == NULL:
        free(key)
        free(idx)
        raise MemoryError()
    with nogil:
        for i in range(n):
            c = 0
            for j in range(nf):
                a = phi[i, j]
                a = -1.0 if isnan(a) else (a if a >= 0 else -a)
                if c == k and not a > key[k - 1]:
                    continue
                p = c if c < k else k - 1  # the slot it enters from: the end, or the worst
                while p > 0 and a > key[p - 1]:  # strictly: an equal one stays ahead
                    key[p], idx[p] = key[p - 1], idx[p - 1]
                    p -= 1
                key[p], idx[p] = a, <int32_t>j
                if c < k:
                    c += 1
            r = rows[i]
            for p in range(k):
                feat[r, p] = idx[p]
                val[r, p] = <float>phi[i, idx[p]]
    free(key)
    free(idx)
