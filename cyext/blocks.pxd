# Block helpers shared by the full-evaluation kernels (kernels.pyx) and the lazy policies
# (lazy.pyx): leaf sums in tree order, the per-row walk plan, trees t0..t1 over a block of rows.
# Inline here so that each kernel module compiles them into its own loops.
from libc.stdint cimport int32_t, int64_t, uint8_t

from swtypes cimport ModelView, BLOCK_ROWS, INTERLEAVE
from walk cimport (walk_padded1, walk_padded8, walk_compact1, walk_compact8, sw_prefetch,
                  sw_walk_fn, sw_walk_fn_for, sw_row_finite, sw_split_row, WIDE,
                  SW_RULE_NAN, SW_RULE_FINITE, SW_RULE_SPLIT, sw_cwalk_fn, sw_cwalk_fn_for)

cdef enum:
    COMPACT_ROWS = 1024       # rows per task for compact models (see kernels.task_rows)
    SPLIT_FLOATS = 8192       # eval_trees' stack buffer for doubled NaN rows (32 KB)

ctypedef fused acc_t:         # accumulator: float32 (XGBoost's own sum) or float64
    float
    double


cdef inline void add_leaf(const ModelView* m, const acc_t* leaves, int64_t t, int64_t slot,
                          acc_t* acc) noexcept nogil:
    cdef int32_t k, g = m.group[t]
    cdef int32_t w = m.n_leaf_out
    if g >= 0:
        acc[g] += leaves[slot * w]
    else:
        for k in range(w):
            acc[k] += leaves[slot * w + k]


cdef inline void add_leaves(const ModelView* m, const acc_t* leaves, int64_t t, int32_t k,
                            int64_t lbase, const int64_t* slot, acc_t* acc,
                            bint one) noexcept nogil:
    """Trees t..t+k's leaves (slots relative to lbase) into one row's acc, in tree order."""
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
    const float* x            # the row, or its doubled copy for the SPLIT rule
    sw_walk_fn w8             # 8-tree walk for the row's missing-value rule
    sw_walk_fn w16            # 16-tree walk


cdef inline bint plannable(const ModelView* m, int32_t n) noexcept nogil:
    return m.pnodes != NULL and m.depth >= 1 and m.depth <= 10 and n <= BLOCK_ROWS


cdef inline int32_t plan_rows(const ModelView* m, const float* X, int64_t ldx, int32_t n, float* xx,
                       int32_t xx_cap, RowPlan* plan) noexcept nogil:
    """The missing-value variant of each row, chosen once per row (rows with NaN doubled into
    xx while it has room; the others keep the NaN-testing walk). Returns the floats of xx used."""
    cdef int32_t r, rule, used = 0, nf = m.n_features
    for r in range(n):
        plan[r].x = X + r * ldx
        if sw_row_finite(plan[r].x, nf):
            rule = SW_RULE_FINITE
        elif m.split_ok and used + 2 * nf <= xx_cap:
            sw_split_row(plan[r].x, nf, xx + used)
            plan[r].x = xx + used
            used += 2 * nf
            rule = SW_RULE_SPLIT
        else:
            rule = SW_RULE_NAN
        plan[r].w8 = sw_walk_fn_for(m.depth, 0, rule)
        plan[r].w16 = sw_walk_fn_for(m.depth, 1, rule)
    return used


cdef inline int64_t eval_planned(const ModelView* m, const acc_t* leaves, const RowPlan* plan,
                          int32_t n, int64_t t0, int64_t t1, acc_t* acc) noexcept nogil:
    """Trees t0.. in groups of 16 then 8 for planned rows; returns the first tree not walked
    (fewer than 8 remain: callers finish them with the generic walks)."""
    cdef int64_t slot[WIDE]
    cdef int64_t t = t0, lbase, ni = (<int64_t>1 << m.depth) - 1
    cdef int32_t r, G = m.n_outputs
    cdef bint one = G == 1 and m.n_leaf_out == 1   # every tree adds one value to acc[0]
    # 16 trees per row at once: for a row alone its only independent chains are trees
    # (measured A native p50 1.28 -> 0.95 us); for blocks, with the chains in registers,
    # +10-20% rows/s over 8 on A and B (one call per row measured as fast as walking a
    # list of rows in one call)
    while t + WIDE <= t1:
        lbase = t * (ni + 1)
        for r in range(n):
            plan[r].w16(m.pnodes + t * ni, plan[r].x, slot)
            add_leaves(m, leaves, t, WIDE, lbase, slot, acc + r * G, one)
        t += WIDE
    while t + INTERLEAVE <= t1:
        lbase = t * (ni + 1)
        for r in range(n):
            plan[r].w8(m.pnodes + t * ni, plan[r].x, slot)
            add_leaves(m, leaves, t, INTERLEAVE, lbase, slot, acc + r * G, one)
        t += INTERLEAVE
    return t


cdef inline void eval_trees(const ModelView* m, const acc_t* leaves, const float* X, int64_t ldx,
                     int32_t n, int64_t t0, int64_t t1, acc_t* acc) noexcept nogil:
    """acc[r * n_outputs + g] += trees t0..t1 for rows X[r * ldx], r < n, in tree order."""
    cdef RowPlan plan[BLOCK_ROWS]
    cdef float xx[SPLIT_FLOATS]   # doubled rows with NaN (on the stack: no allocation per call)
    if plannable(m, n) and t0 + INTERLEAVE <= t1:
        plan_rows(m, X, ldx, n, xx, SPLIT_FLOATS, plan)
        t0 = eval_planned(m, leaves, plan, n, t0, t1, acc)
    eval_rest(m, leaves, X, ldx, n, t0, t1, acc)


cdef inline void eval_rest(const ModelView* m, const acc_t* leaves, const float* X, int64_t ldx,
                    int32_t n, int64_t t0, int64_t t1, acc_t* acc) noexcept nogil:
    """eval_trees without the padded planned walks: compact models and remainders."""
    cdef int64_t slot[WIDE]
    cdef int64_t t = t0, ni, s
    cdef int32_t r, j, G = m.n_outputs, nf = m.n_features
    cdef bint padded = m.pnodes != NULL
    cdef bint one = G == 1 and m.n_leaf_out == 1
    cdef uint8_t rules[COMPACT_ROWS]
    cdef sw_cwalk_fn cwalk_f = sw_cwalk_fn_for(SW_RULE_FINITE)
    cdef sw_cwalk_fn cwalk_n = sw_cwalk_fn_for(SW_RULE_NAN)
    ni = (<int64_t>1 << m.depth) - 1
    if not padded and n <= COMPACT_ROWS:
        # compact: rule per row as above; doubled NaN rows in a per-call buffer when the stack
        # one is too small (rows without room keep the NaN-testing rule)
        if t + WIDE <= t1:
            for r in range(n):
                rules[r] = SW_RULE_FINITE if sw_row_finite(X + r * ldx, nf) else SW_RULE_NAN
            while t + WIDE <= t1:
                for r in range(n):
                    if rules[r] == SW_RULE_FINITE:
                        cwalk_f(m.cnodes, m.root + t, X + r * ldx, slot)
                    else:
                        cwalk_n(m.cnodes, m.root + t, X + r * ldx, slot)
                    add_leaves(m, leaves, t, WIDE, 0, slot, acc + r * G, one)
                t += WIDE
    while t + INTERLEAVE <= t1:
        if t + 2 * INTERLEAVE <= t1:  # the next group's top levels, while this one is walked
            if padded:
                sw_prefetch(m.pnodes + (t + INTERLEAVE) * ni)
            else:
                sw_prefetch(m.cnodes + m.root[t + INTERLEAVE])
        for r in range(n):
            if padded:
                walk_padded8(m, X + r * ldx, t, slot)
            else:
                walk_compact8(m, X + r * ldx, t, slot)
            for j in range(INTERLEAVE):
                add_leaf(m, leaves, t + j, slot[j], acc + r * G)
        t += INTERLEAVE
    while t < t1:
        for r in range(n):
            if padded:
                s = walk_padded1(m, X + r * ldx, t)
            else:
                s = walk_compact1(m, X + r * ldx, t)
            add_leaf(m, leaves, t, s, acc + r * G)
        t += 1


cdef inline void eval_rows(const ModelView* m, const acc_t* leaves, const acc_t* base,
                    double divisor, const float* X, int32_t n, acc_t* acc,
                    double* raw) noexcept nogil:
    """Every tree for n <= BLOCK_ROWS row-major float32 rows, raw[r * G + g] as in score_range."""
    cdef int32_t r, g, G = m.n_outputs
    for r in range(n):
        for g in range(G):
            acc[r * G + g] = base[g]
    eval_trees(m, leaves, X, m.n_features, n, 0, m.n_trees, acc)
    for r in range(n * G):
        raw[r] = <double>acc[r] / divisor if divisor != 1.0 else <double>acc[r]
