# Small per-row helpers shared by the full-evaluation kernels (kernels.pyx) and the lazy
# policies (lazy.pyx): the accumulator type, leaf sums in tree order, the per-row walk plan.
# Inline, so each kernel module compiles them into its own loops. The block functions built
# from them (plan_rows, eval_trees, ...) live in kernels.pyx and are shared through
# worker/_kernels.pxd.
from libc.stdint cimport int32_t, int64_t, uint8_t

from swtypes cimport ModelView, PNode, BLOCK_ROWS, INTERLEAVE
from walk cimport sw_walk_fn

cdef enum:
    COMPACT_ROWS = 1024       # rows per task for compact models (see kernels.task_rows) ...
    ROWS_WALK_ROWS = 2048     # ... and for those whose rows walk each tree together
    ROWS_WALK_MIN = 256       # fewer rows in a task walk 16 trees a row instead
    PART_ROWS_PER_NODE = 4    # the partition walk takes tasks of 4 rows a node of the
                              # largest tree or more (kernels.part_walk) ...
    PART_ROWS_PER_NODE_ROW = 8  # ... or 8 a row at a time (no AVX-512)
    SPLIT_FLOATS = 16384      # eval_trees' stack buffer for doubled rows (64 KB: 64 rows
                              # of up to 128 features)
    PLAN_ROWS = 512           # rows per task for padded models whose rows are doubled ...
    PLAN_FLOATS = 65536       # ... while their doubled rows fit 256 KB (see kernels.task_rows)

ctypedef fused acc_t:         # accumulator: float32 (XGBoost's own sum) or float64
    float
    double


cdef enum:
    AGG_SUM = 0               # ModelView.agg: the leaves added in tree order (every model but ...
    AGG_MIN = 1               # ... ONNX regressors with aggregate_function MIN or MAX: acc
    AGG_MAX = 2               # starts at +inf / -inf, keeps the smallest / largest leaf, and
                              # gets base after the last tree (kernels.eval_rows)


cdef inline acc_t agg_step(int32_t agg, acc_t a, acc_t v) noexcept nogil:
    # ONNX Runtime's TreeAggregatorMin/Max: the leaf replaces the score when below (above) it
    if agg == AGG_MIN:
        return v if v < a else a
    if agg == AGG_MAX:
        return v if v > a else a
    return a + v


cdef inline void add_leaf(const ModelView* m, const acc_t* leaves, int64_t t, int64_t slot,
                          acc_t* acc) noexcept nogil:
    cdef int32_t k, g = m.group[t]
    cdef int32_t w = m.n_leaf_out
    if m.agg != AGG_SUM:
        if g >= 0:
            acc[g] = agg_step(m.agg, acc[g], leaves[slot * w])
        else:
            for k in range(w):
                acc[k] = agg_step(m.agg, acc[k], leaves[slot * w + k])
    elif g >= 0:
        acc[g] += leaves[slot * w]
    else:
        for k in range(w):
            acc[k] += leaves[slot * w + k]


cdef inline bint one_sum(const ModelView* m) noexcept nogil:
    # every tree adds one value to acc[0]: add_leaves' one-register sum
    return m.n_outputs == 1 and m.n_leaf_out == 1 and m.agg == AGG_SUM


cdef inline void add_leaves(const ModelView* m, const acc_t* leaves, int64_t t, int32_t k,
                            int64_t lbase, const int64_t* slot, acc_t* acc,
                            bint one) noexcept nogil:
    """Trees t..t+k's leaves (slots relative to lbase) into one row's acc, in tree order;
    ``one``: one_sum(m)."""
    cdef int32_t j
    cdef acc_t a
    if one:
        # one register, same order: no store-to-load forwarding on the sum's chain (measured
        # +8% rows/s on model A)
        a = acc[0]
        for j in range(k):
            a += leaves[lbase + slot[j]]
        acc[0] = a
    else:
        for j in range(k):
            add_leaf(m, leaves, t + j, lbase + slot[j], acc)


ctypedef struct RowPlan:       # a staged row's walk, chosen once per row (see plan_rows)
    const float* x            # the row, or its doubled copy (order keys) for the SPLIT rule
    const PNode* nodes        # the nodes its walks read: pnodes, or qnodes for the SPLIT rule
    sw_walk_fn w8             # 8-tree walk for the row's missing-value rule
    sw_walk_fn wide           # PLAN_WIDE-tree walk (walk.pxd)


cdef inline bint plan_wide(const ModelView* m) noexcept nogil:
    # padded models whose rows are doubled for the SPLIT walks: tasks of up to PLAN_ROWS rows
    return m.qnodes != NULL and m.cats == NULL and m.depth >= 1 and m.depth <= 10


cdef inline bint plannable(const ModelView* m, int32_t n) noexcept nogil:
    # special nodes (categorical splits) take the generic walks (walk.pxd), which test them
    return m.pnodes != NULL and m.cats == NULL and m.depth >= 1 and m.depth <= 10 \
        and n <= BLOCK_ROWS
