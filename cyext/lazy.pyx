# cython: language_level=3
"""Lazy stopping policies inside the nogil block kernel.

One block of at most BLOCK_ROWS rows is staged once; work units are evaluated in chunks
(certified: `chunk` units, lazyrf: `block` trees, lazygbm: one round); after each chunk every
active row is checked and finished rows are compacted out (their staged row, accumulators and
vote counts move down), so later chunks walk only the rows still running. All active rows of a
block have evaluated the same number of units, so `u` is per block.

The rules, and their pure-Python statements that the tests compare this kernel against, are in
worker/model/lazy.py.
"""

from cython.parallel cimport parallel, prange
from libc.math cimport exp, log, fabs, sqrt, tanh, INFINITY
from libc.stdint cimport int8_t, int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy

import numpy as np

from swtypes cimport ModelView, PNode, CNode, Column, BLOCK_ROWS, INTERLEAVE, KEY_LEAF, sw_feat
from stage cimport stage_block
from walk cimport walk1, walk8, walk_rows8, sw_stage_cats
from blocks cimport acc_t, add_leaf, RowPlan, plannable, SPLIT_FLOATS
from worker._kernels cimport Columns, Forest, plan_rows, eval_planned, eval_rest, eval_trees


cpdef enum Policy:
    POLICY_CERTIFIED = 0
    POLICY_LAZYRF = 1
    POLICY_LAZYGBM = 2

cpdef enum StopReason:        # the output's stop_reason, in code order
    STOP_FULL = 0
    STOP_CERTIFICATE = 1
    STOP_POSTERIOR = 2
    STOP_FLIP = 3
    STOP_LATE = 4

cpdef enum Band:
    BAND_SINGLE = 0           # one raw output; cuts are in raw space
    BAND_VOTE = 1             # K raw outputs that are the class probabilities (vote forests)
    BAND_SOFTMAX = 2          # K margins; cuts apply to the leader's softmax probability bounds

cpdef enum GbmVariant:
    GBM_PROTOTYPE = 0
    GBM_CERTIFICATE_ONLY = 1
    GBM_CERTIFICATE_PLUS_FLIP = 2


ctypedef struct LazyCfg:      # everything a policy reads; arrays owned by worker.lazy tables
    int32_t policy            # Policy
    int32_t step              # units per chunk: certified chunk, lazyrf block, lazygbm 1
    const int64_t* unit_ptr   # work unit u = trees unit_ptr[u]:unit_ptr[u+1]
    int64_t n_units
    const double* smin        # (n_units+1) x G: sum of remaining trees' minimum leaf (acc units)
    const double* smax        # (n_units+1) x G: sum of remaining trees' maximum leaf
    const double* nrem        # (n_units+1) x G: number of remaining trees adding to output g
    const double* sabs        # (n_units+1) x G: sum of remaining trees' max |leaf|
    double eps                # rounding slack per remaining addition, relative (see bounds_at)
    int32_t band_mode         # BAND_*
    int32_t n_cuts
    const double* cut_a       # settled below cut i iff value_hi <= cut_a[i]
    const double* cut_b       # settled above cut i iff value_lo >= cut_b[i]
    double cls_margin         # multiclass leader: lo_L > hi_k + cls_margin * (1 + |hi_k|)
    int32_t n_vote            # lazyrf: classes voted on (2 for binary forests)
    int32_t t_min             # lazyrf / lazygbm: no posterior / flip stop before t_min units
    double tau                # lazyrf: stop when posterior score > tau
    const double* tail        # lazyrf binary: P(Bin(t+1, 1/2) <= n) at tail[tail_off[t/B-1] + n]
    const int64_t* tail_off
    int32_t mc_samples        # lazyrf multiclass, Dirichlet mass < 30: Monte Carlo draws
    uint64_t seed
    const double* R           # lazygbm: R_t = sum_{s>t} w_s, (n_units+1)
    const double* V           # lazygbm: V_t = sum_{s>t} w_s^2
    double flip_bound         # lazygbm: c * exp(-spr_threshold)
    int32_t variant           # GBM_*
    int64_t late_t            # lazygbm multiclass: late rule once t > late_t

ctypedef struct McCache:      # per-thread memo of Monte Carlo scores (a function of the counts)
    int32_t* keys             # MC_SLOTS x K vote counts; keys[slot * K] = -1: empty
    double* vals              # MC_SLOTS scores

cdef enum:
    MC_SLOTS = 1024           # direct-mapped; digits RF at t = 10 hits > 95% (16x faster)


# ---- small pure pieces ------------------------------------------------------------------

cdef inline uint64_t _mix64(uint64_t z) noexcept nogil:
    # splitmix64 finaliser
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef inline double _uniform(uint64_t* s) noexcept nogil:
    """Uniform in (0, 1): splitmix64 stream, 53 bits, never 0."""
    s[0] += <uint64_t>0x9E3779B97F4A7C15ULL
    return (<double>(_mix64(s[0]) >> 11) + 0.5) * (1.0 / 9007199254740992.0)


cdef double mc_dirichlet_score(const int32_t* counts, int32_t K, int32_t lead, int32_t S,
                               uint64_t seed) noexcept nogil:
    """Fraction of S Dirichlet(1 + counts) draws whose argmax is `lead`.

    argmax of a Dirichlet draw = argmax of independent Gamma(alpha_k, 1) draws; with integer
    alpha a Gamma draw is -log of a product of alpha uniforms, so the argmax is the argmin of
    those products (no logarithm: 6x faster; with A < 30 uniforms per draw the product stays
    far above the float64 underflow). The stream is seeded from (seed, counts) only, so equal
    vote counts give equal scores on every row and thread.
    """
    cdef uint64_t st = _mix64(seed ^ <uint64_t>0x243F6A8885A308D3ULL)
    cdef int32_t k, i, s, best, hits = 0
    cdef double p, bestp
    for k in range(K):
        st = _mix64(st + <uint64_t>counts[k] + <uint64_t>0x9E3779B97F4A7C15ULL)
    for s in range(S):
        best = 0
        bestp = 2.0
        for k in range(K):
            p = _uniform(&st)
            for i in range(counts[k]):
                p *= _uniform(&st)
            if p < bestp:
                bestp = p
                best = k
        hits += best == lead
    return <double>hits / <double>S


cdef inline double gauss_dominance(double a1, double a2, double A) noexcept nogil:
    cdef double mu = (a1 - a2) / A
    cdef double var = (a1 * (A - a1) + a2 * (A - a2) + 2.0 * a1 * a2) / (A * A * (A + 1.0))
    cdef double z = mu / (sqrt(var) + 1e-12)
    return 0.5 * (1.0 + tanh(0.7978845608 * (z + 0.044715 * z * z * z)))


cdef double mc_cached(const LazyCfg* c, McCache* mc, const int32_t* votes,
                      int32_t lead) noexcept nogil:
    """mc_dirichlet_score through the thread's memo: same counts, same score, computed once."""
    cdef int32_t K = c.n_vote, k
    cdef uint64_t h = 0
    cdef int32_t* key
    for k in range(K):
        h = _mix64(h + <uint64_t>votes[k] + 1)
    key = mc.keys + (h & (MC_SLOTS - 1)) * K
    for k in range(K):
        if key[k] != votes[k]:
            break
    else:
        return mc.vals[h & (MC_SLOTS - 1)]
    mc.vals[h & (MC_SLOTS - 1)] = mc_dirichlet_score(votes, K, lead, c.mc_samples, c.seed)
    for k in range(K):
        key[k] = votes[k]
    return mc.vals[h & (MC_SLOTS - 1)]


cdef double rf_posterior(const LazyCfg* c, McCache* mc, const int32_t* votes,
                         int64_t t) noexcept nogil:
    """LazyRF posterior dominance score after t trees with hard vote counts `votes`."""
    cdef int32_t K = c.n_vote, k, lead = 0, run = -1
    cdef double A
    for k in range(1, K):
        if votes[k] > votes[lead]:
            lead = k
    if K == 2:
        return c.tail[c.tail_off[t // c.step - 1] + votes[lead]]
    A = <double>(t + K)
    if A < 30.0:
        if mc != NULL and mc.keys != NULL:
            return mc_cached(c, mc, votes, lead)
        return mc_dirichlet_score(votes, K, lead, c.mc_samples, c.seed)
    for k in range(K):
        if k != lead and (run < 0 or votes[k] > votes[run]):
            run = k
    return gauss_dominance(1.0 + votes[lead], 1.0 + votes[run], A)


cdef inline bint band_settled(const LazyCfg* c, double vlo, double vhi) noexcept nogil:
    cdef int32_t i
    for i in range(c.n_cuts):
        if not (vhi <= c.cut_a[i] or vlo >= c.cut_b[i]):
            return False
    return True


cdef inline void bounds_at(const LazyCfg* c, int64_t u, int32_t G, const acc_t* acc,
                           double divisor, double* lo, double* hi) noexcept nogil:
    """Guaranteed raw-score bounds after u units: [acc + smin - e, acc + smax + e] / divisor.

    e covers every rounding still to come: the remaining nrem additions in the model's own
    precision (each off by at most half an ulp of a partial sum, and every partial sum is at
    most |acc| + sabs in magnitude), the float64 rounding of the suffix sums and of this very
    expression. eps = 2^-23 + 2^-51 for float32 accumulation, 2^-51 for float64 (at least
    twice each unit roundoff), times (nrem + 4); plus 1e-44 per addition for subnormals.
    Division by a positive divisor is monotone under correct rounding.
    """
    cdef int32_t g
    cdef double a, e
    cdef int64_t o = u * G
    for g in range(G):
        a = <double>acc[g]
        e = (c.nrem[o + g] + 4.0) * (c.eps * (fabs(a) + c.sabs[o + g]) + 1e-44)
        lo[g] = a + c.smin[o + g] - e
        hi[g] = a + c.smax[o + g] + e
        if divisor != 1.0:  # boosters: no division on the check's path (x / 1.0 == x exactly)
            lo[g] /= divisor
            hi[g] /= divisor


cdef inline bint certified_stop(const LazyCfg* c, int32_t G, const double* lo,
                         const double* hi) noexcept nogil:
    """The decision band (and label) of the full model is settled by these bounds."""
    cdef int32_t k, L = 0
    cdef double s_lo = 0.0, s_hi = 0.0
    if G == 1:
        return band_settled(c, lo[0], hi[0])
    for k in range(1, G):
        if lo[k] > lo[L]:
            L = k
    for k in range(G):
        if k != L and not (lo[L] > hi[k] + c.cls_margin * (1.0 + fabs(hi[k]))):
            return False
    if c.band_mode == BAND_VOTE:
        return band_settled(c, lo[L], hi[L])
    for k in range(G):
        if k != L:
            s_lo += exp(hi[k] - lo[L])
            s_hi += exp(lo[k] - hi[L])
    return band_settled(c, 1.0 / (1.0 + s_lo), 1.0 / (1.0 + s_hi))


cdef int32_t gbm_stop(const LazyCfg* c, int64_t t, int32_t G, const acc_t* acc) noexcept nogil:
    """LazyGBM rules in order after t rounds; STOP_* or -1 to continue."""
    cdef double m, top1, top2, v, R = c.R[t], V = c.V[t]
    cdef int32_t k
    if G == 1:
        m = <double>acc[0]
        if fabs(m) > R:
            return STOP_CERTIFICATE
    else:
        top1 = <double>acc[0]
        top2 = -INFINITY
        for k in range(1, G):
            v = <double>acc[k]
            if v > top1:
                top2 = top1
                top1 = v
            elif v > top2:
                top2 = v
        m = top1 - top2
        if m > 2.0 * R:
            return STOP_CERTIFICATE
        if m / (2.0 * R + 1e-9) > 1.5:  # the ratio rule: never fires after the one above
            return STOP_CERTIFICATE
    if c.variant != GBM_CERTIFICATE_ONLY and t >= c.t_min:
        if V == 0.0:
            return STOP_FLIP
        if exp(-m * m / (2.0 * (V + 1e-12))) < c.flip_bound:
            return STOP_FLIP
    if c.variant == GBM_PROTOTYPE and G > 1 and t > c.late_t and m > 0.0:
        return STOP_LATE
    return -1


# ---- the block kernel -------------------------------------------------------------------

cdef inline void rf_add(const ModelView* m, const acc_t* leaves, int64_t slot, acc_t* acc,
                        int32_t* votes) noexcept nogil:
    """Soft vote into acc, hard vote (argmax, lowest class on ties) into votes."""
    cdef int32_t k, w = m.n_leaf_out, best = 0
    cdef const acc_t* v = leaves + slot * w
    if w == 1:  # binary forest leaf: P(class 1); the tree votes 1 iff P(1) > P(0)
        acc[0] += v[0]
        votes[1 if v[0] > 0.5 else 0] += 1
        return
    for k in range(w):
        acc[k] += v[k]
        if v[k] > v[best]:
            best = k
    votes[best] += 1


cdef void rf_eval(const ModelView* m, const acc_t* leaves, const float* X, int64_t ldx,
                  int32_t n, int64_t t0, int64_t t1, acc_t* acc, int32_t* votes,
                  int32_t K) noexcept nogil:
    """eval_trees plus per-tree hard votes (forests: every tree adds to every output)."""
    cdef int64_t slot[INTERLEAVE]
    cdef int64_t t = t0
    cdef int32_t r, j, G = m.n_outputs
    while t + INTERLEAVE <= t1:
        for r in range(n):
            walk8(m, X + r * ldx, t, slot)
            for j in range(INTERLEAVE):
                rf_add(m, leaves, slot[j], acc + r * G, votes + r * K)
        t += INTERLEAVE
    while t < t1:
        for r in range(n):
            rf_add(m, leaves, walk1(m, X + r * ldx, t), acc + r * G, votes + r * K)
        t += 1


cdef void eval_few_trees(const ModelView* m, const acc_t* leaves, const float* X, int64_t ldx,
                         int32_t n, int64_t t0, int64_t t1, acc_t* acc) noexcept nogil:
    """eval_trees for chunks shorter than INTERLEAVE trees: interleave rows instead."""
    cdef int64_t slot[INTERLEAVE]
    cdef int64_t t
    cdef int32_t r, j, G = m.n_outputs
    if t1 - t0 >= INTERLEAVE:
        eval_trees(m, leaves, X, ldx, n, t0, t1, acc)
        return
    for t in range(t0, t1):
        r = 0
        while r + INTERLEAVE <= n:
            walk_rows8(m, X + r * ldx, ldx, t, slot)
            for j in range(INTERLEAVE):
                add_leaf(m, leaves, t, slot[j], acc + (r + j) * G)
            r += INTERLEAVE
        while r < n:
            add_leaf(m, leaves, t, walk1(m, X + r * ldx, t), acc + r * G)
            r += 1


cdef int32_t sweep(const LazyCfg* c, int64_t u, int32_t na, int32_t nf, int32_t G, int32_t K,
                   double divisor, float* X, acc_t* acc, int32_t* act, int32_t* votes,
                   double* lo, double* hi, double* o_raw, double* o_lo, double* o_hi,
                   int32_t* o_units, int8_t* o_reason, McCache* mc,
                   RowPlan* plan) noexcept nogil:
    """Check every active row after u units; write finished rows out, compact the rest."""
    cdef int32_t i, w = 0, g, r, reason
    cdef double ntr
    for i in range(na):
        reason = -1
        if c.policy == POLICY_CERTIFIED:
            bounds_at(c, u, G, acc + i * G, divisor, lo, hi)
            if certified_stop(c, G, lo, hi):
                reason = STOP_CERTIFICATE
        elif c.policy == POLICY_LAZYRF:
            if u >= c.t_min and rf_posterior(c, mc, votes + i * K, u) > c.tau:
                reason = STOP_POSTERIOR
        else:
            reason = gbm_stop(c, u, G, acc + i * G)
        if reason >= 0:
            r = act[i]
            if c.policy != POLICY_CERTIFIED:
                bounds_at(c, u, G, acc + i * G, divisor, lo, hi)
            ntr = <double>c.unit_ptr[u]
            for g in range(G):
                o_lo[r * G + g] = lo[g]
                o_hi[r * G + g] = hi[g]
                if c.policy == POLICY_CERTIFIED:
                    o_raw[r * G + g] = 0.5 * lo[g] + 0.5 * hi[g]
                elif c.policy == POLICY_LAZYRF:  # soft vote of the trees evaluated so far
                    o_raw[r * G + g] = <double>acc[i * G + g] / ntr
                else:
                    o_raw[r * G + g] = <double>acc[i * G + g] / divisor
            o_units[r] = <int32_t>u
            o_reason[r] = <int8_t>reason
            continue
        if w != i:
            memcpy(X + w * nf, X + i * nf, nf * sizeof(float))
            for g in range(G):
                acc[w * G + g] = acc[i * G + g]
            for g in range(K):
                votes[w * K + g] = votes[i * K + g]
            act[w] = act[i]
            if plan != NULL:  # the row's walk moves with it; a doubled row stays where it is
                plan[w] = plan[i]
                if plan[w].x == X + i * nf:
                    plan[w].x = X + w * nf
        w += 1
    return w


cdef int lazy_block(const ModelView* m, const acc_t* leaves, const acc_t* base, double divisor,
                    const LazyCfg* c, const Column* cols, const float* direct, int64_t r0,
                    int32_t n, double* o_raw, double* o_lo, double* o_hi, int32_t* o_units,
                    int8_t* o_reason, acc_t* acc, float* X, int32_t* act, int32_t* votes,
                    double* lo, int32_t* mc_keys, double* mc_vals, float* xx) noexcept nogil:
    """Rows r0..r0+n (one block); outputs indexed by row r - r0 (callers offset the pointers).
    xx: room for the block's doubled NaN rows (2 * n_features * BLOCK_ROWS floats) or NULL."""
    cdef int32_t nf = m.n_features, G = m.n_outputs, K = c.n_vote, na = n, i, g
    cdef McCache mcs
    cdef McCache* mc = &mcs
    mcs.keys = mc_keys
    mcs.vals = mc_vals
    cdef int64_t u = 0, u1, t
    cdef double v
    cdef RowPlan plan_rows_[BLOCK_ROWS]
    cdef RowPlan* plan = NULL
    if direct != NULL:
        memcpy(X, direct + r0 * nf, n * nf * sizeof(float))
    else:
        stage_block(cols, nf, r0, n, X)
    if m.n_cat_feat:
        sw_stage_cats(X, nf, n, m.cat_feat, m.cat_head, m.n_cat_feat)
    for i in range(n):
        act[i] = i
        for g in range(G):
            acc[i * G + g] = base[g]
        for g in range(K):
            votes[i * K + g] = 0
    if c.policy != POLICY_LAZYRF and xx != NULL and plannable(m, n):
        # each row's missing-value walk chosen once per block, not once per chunk (re-planning
        # every 8 trees cost as much as walking them: certified on XGBoost 300x6 ran at 1.16x)
        plan = plan_rows_
        plan_rows(m, X, nf, n, xx, 2 * nf * BLOCK_ROWS, plan)
    if c.policy == POLICY_CERTIFIED:  # the base alone may already settle a row
        na = sweep(c, 0, na, nf, G, K, divisor, X, acc, act, votes, lo, lo + G, o_raw, o_lo,
                   o_hi, o_units, o_reason, mc, plan)
    while na > 0 and u < c.n_units:
        u1 = min(u + c.step, c.n_units)
        if c.policy == POLICY_LAZYRF:
            rf_eval(m, leaves, X, nf, na, c.unit_ptr[u], c.unit_ptr[u1], acc, votes, K)
        elif plan != NULL and c.unit_ptr[u1] - c.unit_ptr[u] >= INTERLEAVE:
            t = eval_planned(m, leaves, plan, na, c.unit_ptr[u], c.unit_ptr[u1], acc)
            eval_rest(m, leaves, X, nf, na, t, c.unit_ptr[u1], acc)
        else:
            eval_few_trees(m, leaves, X, nf, na, c.unit_ptr[u], c.unit_ptr[u1], acc)
        u = u1
        if u >= c.n_units:
            break
        na = sweep(c, u, na, nf, G, K, divisor, X, acc, act, votes, lo, lo + G, o_raw, o_lo,
                   o_hi, o_units, o_reason, mc, plan)
    for i in range(na):  # every unit ran: exactly the full kernel's arithmetic
        for g in range(G):
            v = <double>acc[i * G + g] / divisor if divisor != 1.0 else <double>acc[i * G + g]
            o_raw[act[i] * G + g] = v
            o_lo[act[i] * G + g] = v
            o_hi[act[i] * G + g] = v
        o_units[act[i]] = <int32_t>c.n_units
        o_reason[act[i]] = STOP_FULL
    return 0


cdef int lazy_all(const ModelView* m, const acc_t* leaves, const acc_t* base, double divisor,
                  const LazyCfg* c, const Column* cols, const float* direct, int64_t n_rows,
                  double* o_raw, double* o_lo, double* o_hi, int32_t* o_units,
                  int8_t* o_reason, int n_threads) noexcept nogil:
    """Every row, OpenMP across 64-row blocks; each thread owns its block buffers."""
    cdef int64_t n_blocks = (n_rows + BLOCK_ROWS - 1) // BLOCK_ROWS, b, r0
    cdef int32_t G = m.n_outputs, K = max(c.n_vote, 1), nb
    cdef acc_t* acc
    cdef float* X
    cdef int32_t* act
    cdef int32_t* votes
    cdef double* lo
    cdef int32_t* mk
    cdef double* mv
    cdef float* xx
    cdef int32_t i
    cdef int failed = 0
    with parallel(num_threads=max(1, min(n_threads, n_blocks))):
        acc = <acc_t*>malloc(BLOCK_ROWS * G * sizeof(acc_t))
        X = <float*>malloc(BLOCK_ROWS * max(m.n_features, 1) * sizeof(float))
        act = <int32_t*>malloc(BLOCK_ROWS * sizeof(int32_t))
        votes = <int32_t*>malloc(BLOCK_ROWS * K * sizeof(int32_t))
        lo = <double*>malloc(2 * G * sizeof(double))
        xx = NULL  # doubled NaN rows for the planned walks (without it: slower, same answers)
        if c.policy != POLICY_LAZYRF:
            xx = <float*>malloc(2 * BLOCK_ROWS * max(m.n_features, 1) * sizeof(float))
        mk = NULL
        mv = NULL
        if c.policy == POLICY_LAZYRF and c.n_vote > 2:
            mk = <int32_t*>malloc(MC_SLOTS * K * sizeof(int32_t))
            mv = <double*>malloc(MC_SLOTS * sizeof(double))
            if mk == NULL or mv == NULL:
                free(mk)
                free(mv)
                mk = NULL  # no memo: still correct, only slower
                mv = NULL
            else:
                for i in range(MC_SLOTS):
                    mk[i * K] = -1
        for b in prange(n_blocks, schedule="dynamic"):
            if acc == NULL or X == NULL or act == NULL or votes == NULL or lo == NULL:
                failed = 1
            else:
                r0 = b * BLOCK_ROWS
                nb = <int32_t>min(<int64_t>BLOCK_ROWS, n_rows - r0)
                lazy_block(m, leaves, base, divisor, c, cols, direct, r0, nb, o_raw + r0 * G,
                           o_lo + r0 * G, o_hi + r0 * G, o_units + r0, o_reason + r0, acc, X,
                           act, votes, lo, mk, mv, xx)
        free(acc)
        free(X)
        free(act)
        free(votes)
        free(lo)
        free(mk)
        free(mv)
        free(xx)
    return -failed


cdef inline const double* _dptr(const double[::1] a) noexcept:
    return &a[0] if a.shape[0] > 0 else NULL


cdef class KernelConfig:
    """Everything a policy reads, typed: built by worker.model.lazy.kernel_config from the
    model's tables and the policy's parameters (keyword arguments set the attributes)."""
    cdef public int policy               # Policy
    cdef public int step                 # units per chunk: certified chunk, lazyrf block, 1
    cdef public object unit_ptr          # int64 (n_units + 1,): unit u = trees [u], [u + 1]
    cdef public object smin, smax        # float64 (n_units + 1, G): remaining min/max leaf sums
    cdef public object nrem, sabs        # remaining trees per output, remaining max |leaf|
    cdef public double eps               # rounding slack per remaining addition (bounds_at)
    cdef public int band_mode            # Band
    cdef public object cut_a, cut_b      # float64 (n_cuts,): settled below / above cut i
    cdef public double cls_margin        # multiclass leader margin (relative)
    cdef public int n_vote               # lazyrf: classes voted on
    cdef public int t_min                # no posterior / flip stop before t_min units
    cdef public double tau               # lazyrf: stop when the posterior score > tau
    cdef public object tail, tail_off    # lazyrf binary tails (float64) and offsets (int64)
    cdef public int mc_samples           # lazyrf multiclass Monte Carlo draws
    cdef public uint64_t seed
    cdef public object R, V              # lazygbm: float64 (n_units + 1,) residual capacities
    cdef public double flip_bound        # lazygbm: c * exp(-spr_threshold)
    cdef public int variant              # GbmVariant
    cdef public int64_t late_t           # lazygbm multiclass: late rule once t > late_t

    def __init__(self, **values):
        empty = np.zeros(0)
        self.cut_a = self.cut_b = self.tail = empty
        self.tail_off = np.zeros(0, dtype=np.int64)
        self.tau = 1.0
        self.mc_samples = 1
        for key, value in values.items():
            setattr(self, key, value)  # an unknown key is an AttributeError


def lazy_score(Forest f, Columns cols, KernelConfig cfg, int n_threads=1):
    """Run a lazy policy over every row (cfg: see KernelConfig).

    Returns (raw, raw_lo, raw_hi, work_units, reason): raw (n, n_outputs) float64 is the full
    raw score for rows that ran every unit, the bound midpoint for certified stops, the partial
    soft vote (lazyrf) or partial margin (lazygbm); raw_lo/raw_hi are guaranteed bounds of the
    full raw score; reason holds STOP_* codes.
    """
    cdef LazyCfg c
    cdef int64_t n = cols.n_rows
    cdef int32_t G = f.view.n_outputs
    f.need_ready()
    cdef const int64_t[::1] unit_ptr = cfg.unit_ptr
    cdef const double[:, ::1] smin = cfg.smin
    cdef const double[:, ::1] smax = cfg.smax
    cdef const double[:, ::1] nrem = cfg.nrem
    cdef const double[:, ::1] sabs = cfg.sabs
    cdef const double[::1] cut_a = cfg.cut_a
    cdef const double[::1] cut_b = cfg.cut_b
    cdef const double[::1] tail = cfg.tail
    cdef const int64_t[::1] tail_off = cfg.tail_off
    cdef const double[::1] R = cfg.R
    cdef const double[::1] V = cfg.V
    cdef double[:, ::1] raw, lo, hi
    cdef int32_t[::1] units
    cdef int8_t[::1] reason
    cdef int rc = 0
    if cols.n_features != f.view.n_features:
        raise ValueError(f"X has {cols.n_features} features, the model expects "
                         f"{f.view.n_features}")
    c.n_units = unit_ptr.shape[0] - 1
    if unit_ptr[c.n_units] != f.view.n_trees:
        raise ValueError("unit_ptr does not cover the model's trees")
    for name, arr in (("smin", smin), ("smax", smax), ("nrem", nrem), ("sabs", sabs)):
        if arr.shape[0] != c.n_units + 1 or arr.shape[1] != G:
            raise ValueError(f"{name} must be (n_units + 1, n_outputs)")
    if cut_a.shape[0] != cut_b.shape[0]:
        raise ValueError("cut_a and cut_b differ in length")
    c.policy = cfg.policy
    c.step = cfg.step
    if c.step < 1:
        raise ValueError("chunk/block must be at least 1 unit")
    c.unit_ptr = &unit_ptr[0]
    c.smin = &smin[0, 0]
    c.smax = &smax[0, 0]
    c.nrem = &nrem[0, 0]
    c.sabs = &sabs[0, 0]
    c.eps = cfg.eps
    c.band_mode = cfg.band_mode
    c.n_cuts = cut_a.shape[0]
    c.cut_a = _dptr(cut_a)
    c.cut_b = _dptr(cut_b)
    c.cls_margin = cfg.cls_margin
    c.n_vote = cfg.n_vote
    c.t_min = cfg.t_min
    c.tau = cfg.tau
    c.tail = _dptr(tail)
    c.tail_off = &tail_off[0] if tail_off.shape[0] > 0 else NULL
    c.mc_samples = cfg.mc_samples
    c.seed = cfg.seed
    c.R = _dptr(R)
    c.V = _dptr(V)
    c.flip_bound = cfg.flip_bound
    c.variant = cfg.variant
    c.late_t = cfg.late_t
    if c.policy == POLICY_LAZYRF:
        if c.n_vote < 2 or (c.n_vote > 2) != (G > 1) or (c.n_vote > 2 and c.n_vote != G):
            raise ValueError("lazyrf needs a soft-voting forest classifier")
        if c.n_vote == 2 and tail_off.shape[0] < c.n_units // c.step:
            raise ValueError("lazyrf binary tail table too short")
    elif c.policy == POLICY_LAZYGBM:
        if R.shape[0] != c.n_units + 1 or V.shape[0] != c.n_units + 1:
            raise ValueError("lazygbm needs R and V of length n_units + 1")
        c.n_vote = 0
    elif c.policy == POLICY_CERTIFIED:
        c.n_vote = 0
    else:
        raise ValueError(f"unknown policy code {c.policy}")
    raw_a = np.empty((n, G), dtype=np.float64)
    lo_a = np.empty((n, G), dtype=np.float64)
    hi_a = np.empty((n, G), dtype=np.float64)
    units_a = np.empty(n, dtype=np.int32)
    reason_a = np.empty(n, dtype=np.int8)
    if n == 0:
        return raw_a, lo_a, hi_a, units_a, reason_a
    raw, lo, hi, units, reason = raw_a, lo_a, hi_a, units_a, reason_a
    with nogil:
        if f.float32_acc:
            rc = lazy_all(&f.view, &f.leaves32[0, 0], &f.base32[0], f.divisor, &c, cols.cols,
                          cols.direct, n, &raw[0, 0], &lo[0, 0], &hi[0, 0], &units[0],
                          &reason[0], n_threads)
        else:
            rc = lazy_all(&f.view, &f.leaves64[0, 0], &f.base64[0], f.divisor, &c, cols.cols,
                          cols.direct, n, &raw[0, 0], &lo[0, 0], &hi[0, 0], &units[0],
                          &reason[0], n_threads)
    if rc != 0:
        raise MemoryError("could not allocate per-thread block buffers")
    return raw_a, lo_a, hi_a, units_a, reason_a


def lazy_mc_score(counts, int lead, int samples, uint64_t seed):
    """The kernel's deterministic Monte Carlo Dirichlet dominance score (for references/tests)."""
    cdef const int32_t[::1] cv = np.ascontiguousarray(counts, dtype=np.int32)
    if not 0 <= lead < cv.shape[0] or samples < 1:
        raise ValueError("lead must index counts and samples must be positive")
    return mc_dirichlet_score(&cv[0], <int32_t>cv.shape[0], lead, samples, seed)
