# cython: language_level=3
"""Full-evaluation block kernels: stage 64-row blocks, walk trees, add leaves in tree order.

Trees outer, rows inner, within a block: a group of eight trees stays in L1 while every row of
the block walks it. Accumulation is in the model's own precision (float32 for XGBoost, which
makes our margins bit-identical to its own; float64 for scikit-learn).
"""

cimport cython
from cython.parallel cimport parallel, prange
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy
from libc.math cimport exp, INFINITY

cimport numpy as cnp
import numpy as np

cnp.import_array()  # Forest.small's result arrays

from swtypes cimport (ModelView, PNode, CNode, Column, BLOCK_ROWS, INTERLEAVE, COL_F32,
                      COL_F64, COL_I8, COL_I16, COL_I32, COL_I64, COL_U8, COL_U16, COL_U32,
                      COL_U64, COL_BITS, COL_ABSENT)
from stage cimport stage_block
from blocks cimport (acc_t, add_leaf, add_leaves, one_sum, RowPlan, plannable, plan_wide,
                    COMPACT_ROWS, ROWS_WALK_ROWS, ROWS_WALK_MIN, PART_ROWS_PER_NODE, PART_ROWS_PER_NODE_ROW,
                    SPLIT_FLOATS, PLAN_ROWS, PLAN_FLOATS,
                    AGG_SUM, AGG_MIN, AGG_MAX)
from walk cimport (walk1, walk8, sw_prefetch, sw_prefetch_l2,
                  sw_walk_fn, sw_walk_fn_for, sw_row_finite, sw_split_row, sw_key_row,
                  sw_cwalk_q_for, sw_scwalk_q_for, WIDE, PLAN_WIDE,
                  SW_RULE_NAN, SW_RULE_FINITE, SW_RULE_SPLIT, sw_cwalk_fn, sw_cwalk_fn_for,
                  sw_swalk16, sw_swalkp_fn, sw_spwalk_fn_for, sw_stage_cats, sw_scwalk_rows,
                  sw_scwalk_rows_f, sw_scwalk_fixed, sw_scwalk_fixed_f, sw_key_cols,
                  sw_part_best, sw_scwalk_part, SW_PMAX, SW_PART_ROW, SW_PART_AVX512,
                  SW_PLEAF_SLOT, SW_PLEAF_F32, SW_PLEAF_F64, SW_PAIR_W, sw_pair_f_fn,
                  sw_pair_d_fn, sw_pair_f_for, sw_pair_d_for)

# eval_planned walks a group of PLAN_WIDE trees as two passes of the pair walk (walk.h also
# asserts it at compile time); a check that python -O keeps
if PLAN_WIDE != 2 * SW_PAIR_W:
    raise ImportError(f"PLAN_WIDE {PLAN_WIDE} is not two pair walks of {SW_PAIR_W} trees")

cdef extern from "<stdlib.h>" nogil:  # C11; libc.stdlib does not declare it
    void* aligned_alloc(size_t alignment, size_t size)

cdef extern from "qs.h":
    ctypedef struct sw_qsnode:
        pass
    ctypedef struct sw_qs:
        const sw_qsnode* num
        const int32_t* num_off
        const sw_qsnode* nan
        const int32_t* nan_off
        const sw_qsnode* cat
        const int32_t* cat_off
        const int32_t* cat_base
        const int32_t* cat_width
        const int32_t* leaf
        int64_t n_trees
        int32_t n_features
        int32_t simd
    void sw_qs_row(const sw_qs* q, const float* x, uint64_t* mk, int64_t* slot) noexcept nogil
    void sw_qs_rows8(const sw_qs* q, const float* x, int64_t ldx, int32_t n, uint64_t* mk,
                     int64_t* slot) noexcept nogil
    int sw_qs_simd_on() noexcept nogil
    enum: SW_QS_R, SW_QS_ROW, SW_QS_AVX2, SW_QS_AVX512

cdef extern from "oblivious.h":
    ctypedef struct sw_obl:
        const uint32_t* key
        const uint32_t* thr
        int64_t n_trees
        int32_t depth
        int32_t simd
        int32_t n_features
        int32_t n_derived
        const uint32_t* d_key
        const uint32_t* d_off
        const uint32_t* cats
        int32_t staged
        const uint32_t* halves
        const uint16_t* quarters
        const uint8_t* jb
        int32_t n_used
        const uint32_t* used
        const uint32_t* nb
        const uint32_t* btab
    void sw_obl_cols(const sw_obl* o, const float* X, int64_t ldx, int32_t n,
                     uint32_t* cols) noexcept nogil
    void sw_obl_slots(const sw_obl* o, const uint32_t* cols, int32_t n, int64_t t0, int64_t t1,
                      int32_t* slot) noexcept nogil
    void sw_obl_sum_d(const sw_obl* o, const uint32_t* cols, int32_t n, const double* leaves,
                      double* acc) noexcept nogil
    void sw_obl_sum_f(const sw_obl* o, const uint32_t* cols, int32_t n, const float* leaves,
                      float* acc) noexcept nogil
    int sw_obl_simd_best() noexcept nogil
    int sw_obl_bw() noexcept nogil
    int sw_obl_sum_bins(const sw_obl* o, const uint32_t* cols, int32_t n, uint8_t* bins,
                        double* acc) noexcept nogil
    enum: SW_OBL_R, SW_OBL_ROW, SW_OBL_AVX2, SW_OBL_AVX512, SW_OBL_BTAB

cdef extern from "lanes.h":
    ctypedef struct sw_lanes:
        const uint32_t* col
        const uint32_t* thr
        const void* leaf
        int64_t n_trees
        int32_t depth
        int32_t width
        int32_t n_features
        int32_t f64
    int sw_lanes_cpu() noexcept nogil
    int sw_lanes_rows(const sw_lanes* L, const float* x, int64_t ldx, int64_t n,
                      void* acc) noexcept nogil
    enum: SW_LANES, SW_LANES_MAXD, SW_LANES_MAXF

cdef extern from "masks.h":
    ctypedef struct sw_masks:
        const void* ent
        const int64_t* off
        const void* leaf
        int64_t n_trees
        int64_t n_ent
        int32_t n_features
        int32_t f64
    int sw_masks_cpu() noexcept nogil
    int sw_masks_rows(const sw_masks* M, const float* x, int64_t ldx, int64_t n,
                      void* acc) noexcept nogil
    enum: SW_MASKS, SW_MASKS_MAXF, SW_MASKS_LEAVES

cdef extern from "probit.h":
    float sw_ort_probit(float val) noexcept nogil


def ort_probit(const double[::1] raw):
    """ONNX Runtime's PROBIT transform of float32 scores (probit.h), as float64."""
    out = np.empty(raw.shape[0], dtype=np.float64)
    cdef double[::1] o = out
    cdef Py_ssize_t i
    with nogil:
        for i in range(raw.shape[0]):
            o[i] = sw_ort_probit(<float>raw[i])
    return out


cdef enum:
    OBL_HALVES_MAX_BYTES = 64 << 20  # sw_obl.halves: past it the leaves are gathered
                              # (and sw_obl.quarters: past it the bins are not built)
    OBL_BINS_TREES_LONG = 8   # the bins are built where the model has at least this many
    OBL_BINS_TREES_SHORT = 4  # trees for each column the levels read of more than 31
                              # thresholds (a two-level search), and this many for each of
                              # 31 or fewer (one level): binning the column costs a block what
                              # about 8 and 3 trees save (bench/oblivious_words.c)
    OBL_BINS_MAX_BORDERS = 255  # a bin is a byte (0 .. the column's thresholds)
    OBL_STACK_KEYS = 16384    # eval_oblivious's stack buffer: a block's columns for up to 128
                              # features (64 KB); wider models allocate theirs
    OBL_TREES = 16            # trees whose positions are taken at once (vector leaves)
    OBL_MIN_ROWS = 5          # fewer rows walk the trees: 16 lanes for a few rows cost
                              # more (500 x depth 6: one row took 7.5 us through the lanes,
                              # bench/catboost_speed.py before this cut, the walks 2.9; 5 rows
                              # 7.8 against the walks' 9.2, bench/oblivious_micro.py)
    LANES_MAX_TABLE_BYTES = 64 << 20  # the lanes kernel's tables (16 or 32 entries a tree):
                              # past this the walks score (a model of ~2 million trees)
    LANES_MIN_ROWS = 7        # the lanes kernel (lanes.h) takes 7 rows or more, and a last
                              # partial block of 7 or more: a block of 16 lanes costs what
                              # the walks take for 6 to 7 rows (model A: 6 rows 4.76 us a
                              # call walked, 4.90 in lanes; 7 rows 5.24 and 4.99;
                              # bench/lanes_micro.py)
    MASKS_MAX_TABLE_BYTES = 64 << 20  # the leaf-mask kernel's tables (an entry of 16 bytes a
                              # split and word, 64 leaves a tree): past this the walks score
    MASKS_MIN_COMPACT = 4     # the leaf-mask kernel (masks.h) takes calls of 4 rows or more
    MASKS_MIN_PADDED = 13     # (compact) or 13 (padded): a block of 16 lanes costs what the
                              # walks take for 3 to 4 rows of the LightGBM export (500 trees x
                              # 63 leaves: 4 rows 32.7 us a call walked, 24.4 in the kernel)
                              # and for 12 to 13 rows of XGBoost's padded 300 x depth 6 (12
                              # rows 11.6 and 12.7, 16 rows 14.8 and 13.0;
                              # bench/masks_micro.py)

cpdef enum Link:           # apply_link codes (CompiledModel maps its `link` to one of these)
    LINK_NONE = -1        # raw scores, (n, n_outputs)
    LINK_COPY = 0         # soft-voting forests with one column per class: raw is the probability
    LINK_SIGMOID = 1      # binary: p = 1 / (1 + exp(-raw)), out [1 - p, p]
    LINK_SIGMOID2 = 2     # binary GradientBoosting exponential loss: exp(-2 raw)
    LINK_VOTE1 = 3        # binary forest with one column: p = raw
    LINK_SOFTMAX = 4      # multiclass margins
    LINK_SOFTMAX_ZERO = 5  # ONNX Runtime's SOFTMAX_ZERO: a margin within 1e-7 of 0 is not
                           # exponentiated (it stays about 0) nor counted in the sum

# the partition walk takes a whole task (kernels.part_walk; walk.h refuses more than SW_PMAX
# rows, which would leave part_trees' slots unset): a task never outgrows it
if SW_PMAX < ROWS_WALK_ROWS:
    raise ImportError("walk.h SW_PMAX is below blocks.pxd ROWS_WALK_ROWS")
# eval_rows cuts the lanes and leaf-mask kernels' calls at one block size
if SW_MASKS != SW_LANES:
    raise ImportError("masks.h SW_MASKS differs from lanes.h SW_LANES")

_empty = np.empty
_float64 = np.float64
_NUMPY_KIND = {
    np.dtype(np.float32): COL_F32, np.dtype(np.float64): COL_F64,
    np.dtype(np.int8): COL_I8, np.dtype(np.int16): COL_I16, np.dtype(np.int32): COL_I32,
    np.dtype(np.int64): COL_I64, np.dtype(np.uint8): COL_U8, np.dtype(np.uint16): COL_U16,
    np.dtype(np.uint32): COL_U32, np.dtype(np.uint64): COL_U64, np.dtype(np.bool_): COL_U8,
}


cdef class Columns:
    """Column descriptors over numpy or Arrow memory; keeps every owner alive while it lives."""

    def __cinit__(self):
        self.cols = NULL
        self.direct = NULL

    def __dealloc__(self):
        free(self.cols)

    cdef int _alloc(self, int32_t nf) except -1:
        self.cols = <Column*>malloc(max(nf, 1) * sizeof(Column))
        if self.cols == NULL:
            raise MemoryError()
        self.n_features = nf
        self._owners = []
        return 0

    @staticmethod
    def from_numpy(X):
        """A 2-D numpy array of any numeric or bool dtype, any memory order."""
        cdef Columns c = Columns()
        cdef int32_t j
        cdef Py_ssize_t addr, s0, s1
        X = np.asarray(X)
        if X.ndim != 2:
            raise ValueError(f"X must be 2-D (rows, features); got shape {X.shape}")
        if X.dtype.byteorder == ">" or X.dtype not in _NUMPY_KIND:
            X = X.astype(np.float64)
        c._alloc(X.shape[1])
        c._owners.append(X)
        c.n_rows = X.shape[0]
        addr = X.__array_interface__["data"][0]
        s0, s1 = X.strides
        for j in range(c.n_features):
            c.cols[j].data = <const char*>(addr + j * s1)
            c.cols[j].stride = s0
            c.cols[j].offset = 0
            c.cols[j].valid = NULL
            c.cols[j].kind = _NUMPY_KIND[X.dtype]
        if X.dtype == np.float32 and X.flags.c_contiguous:
            c.direct = <const float*>addr
        return c

    @staticmethod
    def from_arrow(list arrays, int64_t n_rows):
        """One pyarrow Array per feature (single chunk, numeric or boolean), or None (missing)."""
        cdef Columns c = Columns()
        cdef int32_t j
        c._alloc(len(arrays))
        c.n_rows = n_rows
        for j, arr in enumerate(arrays):
            c.cols[j].valid = NULL
            c.cols[j].offset = 0
            c.cols[j].stride = 0
            c.cols[j].data = NULL
            if arr is None:
                c.cols[j].kind = COL_ABSENT
                continue
            if len(arr) != n_rows:
                raise ValueError(f"column {j} has {len(arr)} rows, expected {n_rows}")
            c._owners.append(arr)
            bufs = arr.buffers()
            kind, width = _arrow_kind(arr.type)
            c.cols[j].kind = kind
            c.cols[j].stride = width
            c.cols[j].offset = arr.offset
            if kind == COL_ABSENT:
                continue
            # the gather reads rows offset .. offset + n_rows of each buffer: prove they exist
            # (the caller validated the array; this guards every other way in)
            end = arr.offset + n_rows
            if arr.offset < 0 or bufs[1] is None or bufs[1].size < (
                    (end + 7) // 8 if kind == COL_BITS else end * width):
                raise ValueError(f"column {j}: data buffer too small for {n_rows} rows")
            c.cols[j].data = <const char*><Py_ssize_t>bufs[1].address
            if bufs[0] is not None and arr.null_count != 0:
                if bufs[0].size < (end + 7) // 8:
                    raise ValueError(f"column {j}: validity bitmap too small for {n_rows} rows")
                c.cols[j].valid = <const uint8_t*><Py_ssize_t>bufs[0].address
        return c


def _arrow_kind(t):
    import pyarrow as pa
    if pa.types.is_boolean(t):
        return COL_BITS, 0
    if pa.types.is_null(t):
        return COL_ABSENT, 0
    table = {pa.float32(): COL_F32, pa.float64(): COL_F64, pa.int8(): COL_I8,
             pa.int16(): COL_I16, pa.int32(): COL_I32, pa.int64(): COL_I64, pa.uint8(): COL_U8,
             pa.uint16(): COL_U16, pa.uint32(): COL_U32, pa.uint64(): COL_U64}
    if t in table:
        return table[t], t.bit_width // 8
    raise TypeError(f"Arrow type {t} is not a numeric or boolean feature type")


def order_key_nodes(object pnodes):
    """pnodes with each threshold's bits replaced by their order key (walk.h sw_order_key:
    a < b as float32 iff key(a) < key(b), -0.0 taken as +0.0), for the SPLIT walks."""
    q = np.array(pnodes, dtype=np.uint32, order="C", copy=True)
    b = q[:, 1]
    b[b == np.uint32(0x80000000)] = 0
    q[:, 1] = b ^ ((b.view(np.int32) >> 31).view(np.uint32) | np.uint32(0x80000000))
    return q


def small_key_nodes(object qcnodes):
    """Order-key compact nodes (``order_key_nodes`` of cnodes: key, threshold key, left child,
    leaf slot) in 8 bytes a node for walk.h's sw_scwalk_q, or None where a value does not fit:
    key = leaf bit | (left child - node) << 16 | 2f + right, threshold = its key, a leaf's
    0xFF800000 | its slot. From arrays the structure check passed: children after their node,
    leaves pointing at themselves."""
    q = np.asarray(qcnodes, dtype=np.uint32)
    n = q.shape[0]
    if n == 0 or n >= 2**31:
        return None
    key = q[:, 0].astype(np.int64)
    leaf = (key & 0x80000000) != 0
    delta = q[:, 2].astype(np.int64) - np.arange(n, dtype=np.int64)
    slot = q[:, 3].astype(np.int64)
    read = key & 0x7FFFFFFF
    if (key[~leaf] & 0x40000000).any() or (delta[~leaf] < 1).any() or \
            (delta[~leaf] > 0x7FFF).any() or (delta[leaf] != 0).any() or \
            (read[~leaf] > 0xFFFF).any() or (slot[leaf] > 0x7FFFFF).any() or \
            (q[~leaf, 1] > 0xFF800000).any():
        return None
    out = np.empty((n, 2), dtype=np.uint32)
    out[:, 0] = np.where(leaf, 0x80000000, (delta << 16) | read).astype(np.uint32)
    out[:, 1] = np.where(leaf, 0xFF800000 | slot, q[:, 1]).astype(np.uint32)
    return out


def walk_steps(object sqnodes, object root):
    """Each tree's expected path length under even routing (every split sends half of what
    reaches it each way), rounded down: the steps the rows walk without refills takes before
    it tests for leaves (walk.h sw_scwalk_fixed). A balanced tree's is its depth, so its walk
    never tests; a lopsided one's is nearer its short paths than its deepest. Read only for
    speed: any value walks to the same leaves. From 8-byte nodes (small_key_nodes) whose
    children follow their node within the tree (the structure check)."""
    q_arr = np.ascontiguousarray(sqnodes, dtype=np.uint32)
    if q_arr.ndim != 2 or q_arr.shape[1] != 2:
        raise ValueError("walk_steps: nodes must be n x 2 (key, threshold)")
    cdef const uint32_t[:, ::1] q = q_arr
    cdef const int64_t[::1] r = np.ascontiguousarray(root, dtype=np.int64)
    cdef int64_t n = q.shape[0], T = r.shape[0], t, i, end, c, b, big = 0
    out = np.zeros(T, dtype=np.int32)
    cdef int32_t[::1] o = out
    for t in range(T):  # scratch for the largest tree, not for the whole model
        end = r[t + 1] if t + 1 < T else n
        if 0 <= r[t] < end <= n:
            big = max(big, end - r[t])
    p_arr = np.zeros(big, dtype=np.float64)  # each node's share of the rows, and its depth
    d_arr = np.zeros(big, dtype=np.int32)
    cdef double[::1] p = p_arr
    cdef int32_t[::1] d = d_arr
    cdef double e
    with nogil:
        for t in range(T):
            end = r[t + 1] if t + 1 < T else n
            if r[t] < 0 or r[t] >= end or end > n:
                continue
            b = r[t]
            p[0] = 1.0
            d[0] = 0
            e = 0.0
            for i in range(b, end):
                if q[i, 0] & 0x80000000u:  # a leaf (walk.h SW_KEY_LEAF)
                    e += p[i - b] * d[i - b]
                    continue
                c = i + ((q[i, 0] >> 16) & 0x7FFF)
                if c <= i or c + 1 >= end:
                    continue
                p[c - b] = p[i - b] / 2
                p[c + 1 - b] = p[i - b] / 2
                d[c - b] = d[i - b] + 1
                d[c + 1 - b] = d[i - b] + 1
            o[t] = <int32_t>min(e, 64.0)
    return out


def split_row_keys(const float[::1] x):
    """The doubled row of order keys the SPLIT walks read (walk.h sw_split_row), for tests:
    keys[2f + right] is the key x[f] compares with, NaN staged as 0 (right 0) or 0xFFFFFFFF."""
    out = np.empty(2 * x.shape[0], dtype=np.uint32)
    cdef uint32_t[::1] o = out
    if x.shape[0]:
        sw_split_row(&x[0], <int>x.shape[0], <float*>&o[0])
    return out


cdef int32_t plan_rows(const ModelView* m, const float* X, int64_t ldx, int32_t n, float* xx,
                       int32_t xx_cap, RowPlan* plan) noexcept nogil:
    """The walk of each row, chosen once per row: rows doubled into xx while it has room take
    the SPLIT walk, with NaN or without (its step is the cheapest: walk.h SW_QSTEP); past that,
    rows without NaN compare only and rows with NaN test for it at each step. Returns the
    floats of xx used."""
    cdef int32_t r, rule, used = 0, nf = m.n_features
    for r in range(n):
        plan[r].x = X + r * ldx
        plan[r].nodes = m.pnodes
        if m.qnodes != NULL and used + 2 * nf <= xx_cap:
            sw_split_row(plan[r].x, nf, xx + used)
            plan[r].x = xx + used
            plan[r].nodes = m.qnodes
            used += 2 * nf
            rule = SW_RULE_SPLIT
        elif sw_row_finite(plan[r].x, nf):
            rule = SW_RULE_FINITE
        else:
            rule = SW_RULE_NAN
        plan[r].w8 = sw_walk_fn_for(m.depth, 0, rule)
        plan[r].wide = sw_walk_fn_for(m.depth, 1, rule)
    return used


cdef int64_t eval_planned(const ModelView* m, const acc_t* leaves, const RowPlan* plan,
                          int32_t n, int64_t t0, int64_t t1, acc_t* acc) noexcept nogil:
    """Trees t0.. in groups of 12 then 8 for planned rows; returns the first tree not walked
    (fewer than 8 remain: callers finish them with the generic walks)."""
    cdef int64_t slot[WIDE]
    cdef int64_t t = t0, lbase, ni = (<int64_t>1 << m.depth) - 1
    cdef int32_t r, h, G = m.n_outputs, paired = 0
    cdef bint one = one_sum(m)   # every tree adds one value to acc[0]
    cdef sw_pair_f_fn pair_f = sw_pair_f_for(m.depth)
    cdef sw_pair_d_fn pair_d = sw_pair_d_for(m.depth)
    # the pair walk (walk.h sw_pair_*): the doubled rows, two at a time, for one summed value
    # a leaf (G is 1); the doubled rows are the plan's first (plan_rows doubles while xx has
    # room), and a row left without a partner takes the one-row walk below
    if m.pairs and one and m.qnodes != NULL and pair_f != NULL and pair_d != NULL:
        while paired + 2 <= n and plan[paired].nodes == m.qnodes and \
                plan[paired + 1].nodes == m.qnodes:
            paired += 2
    # 12 trees per row at once: for a row alone its only independent chains are trees
    # (measured: A native p50 0.95 us with 16, 1.28 us with 8); with the four-instruction
    # order-key step 12 chains spill less than 16: +4% rows/s on A, +11% on B, p50 no worse
    # (bench/NOTES.md "Kernel v2"); one call per row measured as fast as a list of rows
    while t + PLAN_WIDE <= t1:
        lbase = t * (ni + 1)
        h = 0
        while h < PLAN_WIDE and paired:
            # SW_PAIR_W trees over every pair, then the next SW_PAIR_W: each row's adds stay
            # in tree order, and a pass's nodes and leaves (12 and 6 KB at depth 8) stay in
            # L1 beside the rows, where 12 trees' (36 KB) did not
            r = 0
            while r < paired:
                if acc_t is float:
                    pair_f(plan[r].nodes + (t + h) * ni, <const uint32_t*>plan[r].x,
                           <const uint32_t*>plan[r + 1].x, leaves + lbase + h * (ni + 1),
                           acc + r, acc + r + 1)
                else:
                    pair_d(plan[r].nodes + (t + h) * ni, <const uint32_t*>plan[r].x,
                           <const uint32_t*>plan[r + 1].x, leaves + lbase + h * (ni + 1),
                           acc + r, acc + r + 1)
                r += 2
            h += SW_PAIR_W
        for r in range(paired, n):
            plan[r].wide(plan[r].nodes + t * ni, plan[r].x, slot)
            add_leaves(m, leaves, t, PLAN_WIDE, lbase, slot, acc + r * G, one)
        t += PLAN_WIDE
    while t + INTERLEAVE <= t1:
        lbase = t * (ni + 1)
        for r in range(n):
            plan[r].w8(plan[r].nodes + t * ni, plan[r].x, slot)
            add_leaves(m, leaves, t, INTERLEAVE, lbase, slot, acc + r * G, one)
        t += INTERLEAVE
    return t


cdef void eval_trees(const ModelView* m, const acc_t* leaves, const float* X, int64_t ldx,
                     int32_t n, int64_t t0, int64_t t1, acc_t* acc) noexcept nogil:
    """acc[r * n_outputs + g] += trees t0..t1 for rows X[r * ldx], r < n, in tree order."""
    cdef RowPlan plan[BLOCK_ROWS]
    cdef float xx[SPLIT_FLOATS]   # doubled rows (on the stack: no allocation per call)
    if plannable(m, n) and t0 + INTERLEAVE <= t1:
        plan_rows(m, X, ldx, n, xx, SPLIT_FLOATS, plan)
        t0 = eval_planned(m, leaves, plan, n, t0, t1, acc)
    eval_rest(m, leaves, X, ldx, n, t0, t1, acc)


cdef inline int64_t tree_end(const ModelView* m, int64_t t) noexcept nogil:
    """One past compact tree t's last node."""
    return m.root[t + 1] if t + 1 < m.n_trees else m.n_nodes


cdef inline int64_t first_leaf(const ModelView* m, int64_t t) noexcept nogil:
    # compact tree t's first leaf slot: the slots run in tree order (pack.pack_compact) and a
    # tree of k nodes, every split with two children, has (k + 1) / 2 leaves. Read only for
    # prefetching, so a model that breaks this is slower, never wrong; clamped all the same.
    return min((m.root[t] + t) // 2 if t < m.n_trees else m.n_leaves, m.n_leaves)


cdef inline void rows_tree(const ModelView* m, const void* qc, const acc_t* leaves, int64_t t,
                           const float* const* rx, const int32_t* order, int32_t k0, int32_t k1,
                           acc_t* acc, bint split, const char* pf,
                           const char* pf_end) noexcept nogil:
    """Tree t of the 8-byte nodes qc for the rows at positions k0..k1 (rx[k] staged for row
    order[k]); the walk prefetches pf..pf_end (rows_trees)."""
    cdef int64_t slots[ROWS_WALK_ROWS]
    cdef int32_t k
    if k1 <= k0:
        return
    if m.steps != NULL:
        (sw_scwalk_fixed if split else sw_scwalk_fixed_f)(
            qc, m.root[t], <const uint32_t* const*>(rx + k0), k1 - k0, slots, m.steps[t], pf,
            pf_end)
    else:
        (sw_scwalk_rows if split else sw_scwalk_rows_f)(
            qc, m.root[t], <const uint32_t* const*>(rx + k0), k1 - k0, slots, pf, pf_end)
    if one_sum(m):  # one column, one value a leaf, summed: a leaf is one add
        for k in range(k0, k1):
            acc[order[k]] += leaves[slots[k - k0]]
        return
    for k in range(k0, k1):
        add_leaf(m, leaves, t, slots[k - k0], acc + order[k] * m.n_outputs)


cdef void rows_trees(const ModelView* m, const void* qc, const acc_t* leaves, int64_t t0,
                     int64_t t1, const float* const* rx, const int32_t* order, int32_t nfin,
                     int32_t n, acc_t* acc) noexcept nogil:
    """Trees t0..t1 tree by tree for a task's n staged rows, the nfin without NaN first. Each
    tree's leaf values are prefetched once before its walks, and each of its two walks (rows
    without NaN, then with) prefetches the task's next tree, or after the last its first,
    which the next task walks first: the second walk's prefetches of lines the first brought
    in cost little, and bring back those the rows passing through L2 evicted since (C, 1
    thread: 1.41x for the next tree, 1.13x more for the leaves; bench/NOTES.md)."""
    cdef int64_t t, u
    cdef const char* lp
    cdef const char* lp_end
    cdef const char* pf
    cdef const char* pf_end
    for t in range(t0, t1):
        lp = <const char*>(leaves + first_leaf(m, t) * m.n_leaf_out)
        lp_end = <const char*>(leaves + first_leaf(m, t + 1) * m.n_leaf_out)
        lp -= <size_t>lp & 63
        while lp < lp_end:
            sw_prefetch(lp)
            lp += 64
        u = t + 1 if t + 1 < t1 else t0
        pf = <const char*>(<const PNode*>qc + m.root[u])
        pf -= <size_t>pf & 63
        pf_end = <const char*>(<const PNode*>qc + tree_end(m, u))
        rows_tree(m, qc, leaves, t, rx, order, 0, nfin, acc, False, pf, pf_end)
        rows_tree(m, qc, leaves, t, rx, order, nfin, n, acc, True, pf, pf_end)



cdef void part_trees(const ModelView* m, const void* qc, const acc_t* leaves, int64_t t0,
                     int64_t t1, const uint32_t* cols, int32_t n, acc_t* acc) noexcept nogil:
    """Trees t0..t1 for a task's n rows staged by column (walk.h sw_key_cols), each tree by
    the partition walk (sw_scwalk_part). One value a leaf, summed: the walk adds it to the
    row's score at the leaf; otherwise it gives each row's slot, added here. A row's leaves
    are added in tree order. Each walk prefetches the task's next tree (rows_trees)."""
    cdef int64_t slots[ROWS_WALK_ROWS]
    cdef int64_t t, u
    cdef int32_t k
    cdef bint one = one_sum(m)
    cdef int leaf = (SW_PLEAF_F32 if acc_t is float else SW_PLEAF_F64) if one else SW_PLEAF_SLOT
    cdef const char* pf
    cdef const char* pf_end
    for t in range(t0, t1):
        u = t + 1 if t + 1 < t1 else t0
        pf = <const char*>(<const PNode*>qc + m.root[u])
        pf -= <size_t>pf & 63
        pf_end = <const char*>(<const PNode*>qc + tree_end(m, u))
        sw_scwalk_part(qc, m.root[t], cols, n, leaf, slots, leaves, acc, m.part, pf, pf_end)
        if not one:
            for k in range(n):
                add_leaf(m, leaves, t, slots[k], acc + k * m.n_outputs)

cdef void eval_rest(const ModelView* m, const acc_t* leaves, const float* X, int64_t ldx,
                    int32_t n, int64_t t0, int64_t t1, acc_t* acc, float* xx=NULL,
                    int32_t xx_cap=0) noexcept nogil:
    """eval_trees without the padded planned walks: compact models and remainders. With xx
    (score_all's compact tasks), the rows are staged into it as order keys, doubled where they
    hold NaN, for the order-key compact walks."""
    cdef int64_t slot[WIDE]
    cdef int64_t t = t0, ni
    cdef int32_t r, j, G = m.n_outputs, nf = m.n_features
    cdef bint padded = m.pnodes != NULL
    cdef bint one = one_sum(m)
    cdef uint8_t rules[ROWS_WALK_ROWS]
    cdef const float* rx[ROWS_WALK_ROWS]
    cdef int32_t order[ROWS_WALK_ROWS]
    cdef int32_t used = 0, k, nfin
    cdef sw_cwalk_fn cwalk_f = sw_cwalk_fn_for(SW_RULE_FINITE)
    cdef sw_cwalk_fn cwalk_n = sw_cwalk_fn_for(SW_RULE_NAN)
    cdef sw_cwalk_fn cwalk_q = sw_cwalk_q_for(SW_RULE_SPLIT)
    cdef sw_cwalk_fn cwalk_qf = sw_cwalk_q_for(SW_RULE_FINITE)
    cdef const void* qc = m.qcnodes
    cdef const void* sqc = m.sqcnodes  # read once: Forest.small_nodes may switch it
    if sqc != NULL:  # the same walks over 8-byte nodes
        cwalk_q, cwalk_qf, qc = sw_scwalk_q_for(SW_RULE_SPLIT), sw_scwalk_q_for(SW_RULE_FINITE), \
            sqc
    cdef bint keyed = m.qcnodes != NULL and xx != NULL and not padded and \
        n * 2 * nf <= xx_cap
    # a task of rows the rows walks take (or, its trees small, the partition walk)
    cdef bint by_tree = keyed and n >= ROWS_WALK_MIN and sqc != NULL and rows_walk(m)
    ni = (<int64_t>1 << m.depth) - 1
    if not padded and n <= ROWS_WALK_ROWS:
        # compact: a rule per row. With xx for every row doubled (score_all's tasks), the
        # rows are staged as order keys, doubled where they hold NaN, and walk qcnodes: one
        # node array for the whole task (walk.h sw_cwalk_q); otherwise cnodes, the rows with
        # NaN testing for it at each step
        if m.cats != NULL:  # special nodes: one walk for every row
            while t + WIDE <= t1:
                for r in range(n):
                    sw_swalk16(m.cnodes, m.root + t, 1, X + r * ldx, 0, m.cats, m.cat_staged,
                               slot)
                    add_leaves(m, leaves, t, WIDE, 0, slot, acc + r * G, one)
                t += WIDE
        elif by_tree and part_walk(m, n):
            # Small trees: the task's rows, staged by column, go through each tree node by
            # node (walk.h sw_scwalk_part; the LightGBM export 2.2x the lockstep walk below,
            # bench/NOTES.md "The partition walk")
            sw_key_cols(X, ldx, n, nf, <uint32_t*>xx)
            part_trees(m, sqc, leaves, t0, t1, <const uint32_t*>xx, n, acc)
            t = t1
        elif by_tree:
            # Deep forests of 8-byte nodes: tree by tree, the task's rows walk it 8 at a time
            # (walk.h sw_scwalk_fixed: the tree's expected depth in untested steps, then
            # steps until all 8 stand on a leaf; or sw_scwalk_rows, a finished chain taking
            # the next row, with Forest.fixed_walk(False)), so one tree's
            # nodes stay in L1/L2 while the rows pass, where 16 trees of one row spread a walk
            # over 16 trees' nodes (model C, callgrind with a 48 KB L1 and 1 MB L2, per row:
            # L1 misses 1,083 -> 641, L2 misses 118 -> 49; bench/NOTES.md). Rows without NaN
            # first, as keys; then the others, doubled; order[k] is the row at position k. A
            # row's leaves are still added in tree order.
            nfin = 0
            for r in range(n):
                rules[r] = sw_row_finite(X + r * ldx, nf)
                if rules[r]:
                    order[nfin] = r
                    nfin += 1
            k = nfin
            for r in range(n):
                if not rules[r]:
                    order[k] = r
                    k += 1
            for k in range(n):
                r = order[k]
                rx[k] = xx + used
                if k < nfin:
                    sw_key_row(X + r * ldx, nf, xx + used)
                    used += nf
                else:
                    sw_split_row(X + r * ldx, nf, xx + used)
                    used += 2 * nf
            rows_trees(m, sqc, leaves, t0, t1, rx, order, nfin, n, acc)
            t = t1
        elif t + WIDE <= t1:
            for r in range(n):
                rx[r] = X + r * ldx
                rules[r] = SW_RULE_FINITE if sw_row_finite(rx[r], nf) else SW_RULE_NAN
                if keyed:
                    if rules[r] == SW_RULE_FINITE:
                        sw_key_row(rx[r], nf, xx + used)
                        rx[r] = xx + used
                        used += nf
                    else:
                        sw_split_row(rx[r], nf, xx + used)
                        rx[r] = xx + used
                        used += 2 * nf
                        rules[r] = SW_RULE_SPLIT
            while t + WIDE <= t1:
                for r in range(n):
                    if keyed:
                        (cwalk_q if rules[r] == SW_RULE_SPLIT else cwalk_qf)(
                            qc, m.root + t, rx[r], slot)
                    elif rules[r] == SW_RULE_FINITE:
                        cwalk_f(m.cnodes, m.root + t, rx[r], slot)
                    else:
                        cwalk_n(m.cnodes, m.root + t, rx[r], slot)
                    add_leaves(m, leaves, t, WIDE, 0, slot, acc + r * G, one)
                t += WIDE
    cdef sw_swalkp_fn spwalk = sw_spwalk_fn_for(m.depth) if padded else NULL
    if padded and m.cats != NULL and spwalk != NULL:  # special nodes, depth-specialised
        while t + WIDE <= t1:
            for r in range(n):
                spwalk(m.pnodes + t * ni, X + r * ldx, slot, m.cats, m.cat_staged)
                add_leaves(m, leaves, t, WIDE, t * (ni + 1), slot, acc + r * G, one)
            t += WIDE
    while t + INTERLEAVE <= t1:
        if t + 2 * INTERLEAVE <= t1:  # the next group's top levels, while this one is walked
            if padded:
                sw_prefetch(m.pnodes + (t + INTERLEAVE) * ni)
            else:
                sw_prefetch(m.cnodes + m.root[t + INTERLEAVE])
        for r in range(n):
            walk8(m, X + r * ldx, t, slot)
            for j in range(INTERLEAVE):
                add_leaf(m, leaves, t + j, slot[j], acc + r * G)
        t += INTERLEAVE
    while t < t1:
        for r in range(n):
            add_leaf(m, leaves, t, walk1(m, X + r * ldx, t), acc + r * G)
        t += 1


cdef void _obl_set_bins(sw_obl* o, dict arrays):
    """The bins' tables in arrays (Forest._obl_bins) pointed to by o, quarters last (the switch
    the kernel reads); none in arrays: o without them."""
    cdef const uint16_t[:, ::1] qv
    cdef const uint8_t[:, ::1] jv
    cdef const uint32_t[::1] uv
    cdef const uint32_t[::1] nv
    cdef const uint32_t[:, ::1] bv
    if "obl_quarters" not in arrays:
        o.quarters = NULL
        o.jb = NULL
        o.n_used = 0
        o.used = o.nb = o.btab = NULL
        return
    qv = arrays["obl_quarters"]
    jv = arrays["obl_jb"]
    uv = arrays["obl_used"]
    nv = arrays["obl_nb"]
    bv = arrays["obl_btab"]
    o.jb = &jv[0, 0]
    o.n_used = <int32_t>uv.shape[0]
    o.used = &uv[0]
    o.nb = &nv[0]
    o.btab = &bv[0, 0]
    o.quarters = &qv[0, 0]


cdef void eval_oblivious(const ModelView* m, const acc_t* leaves, const float* X, int32_t n,
                         acc_t* acc) noexcept nogil:
    """Every tree of an oblivious model (oblivious.h) for n row-major rows, added to acc in
    tree order, SW_OBL_R rows a block."""
    cdef const sw_obl* o = <const sw_obl*>m.obl
    cdef int32_t nf = m.n_features, G = m.n_outputs, r0, k, r
    cdef int64_t t0, t1, t, nl = (<int64_t>1) << m.depth
    cdef uint32_t stack_cols[OBL_STACK_KEYS]
    cdef uint32_t* cols = stack_cols
    cdef uint8_t* bins = NULL  # the bins: a byte for each key of cols (heap: see below)
    cdef acc_t blk[SW_OBL_R]
    cdef int32_t slot[OBL_TREES * SW_OBL_R]
    cdef bint one = one_sum(m)
    cdef int64_t n_cols = 2 * <int64_t>nf + o.n_derived
    if n_cols * SW_OBL_R > OBL_STACK_KEYS:
        cols = <uint32_t*>malloc(n_cols * SW_OBL_R * sizeof(uint32_t))
        if cols == NULL:  # no memory for the columns: the walks need none
            eval_trees(m, leaves, X, nf, n, 0, m.n_trees, acc)
            return
    if o.quarters != NULL and one and acc_t is double and n > 16:
        # (16 rows or fewer: no block takes the bins, sw_obl_sum_bins) on the heap: 16 KB
        # more of this frame on every thread's stack overflowed threads of 84-96 KiB that
        # scored before (the hostile review); without memory for them the halves score
        # (sw_obl_sum_bins refuses NULL)
        bins = <uint8_t*>malloc(n_cols * SW_OBL_R)
    for r in range(SW_OBL_R):
        blk[r] = 0
    cdef const char* nxt
    cdef int64_t ahead, off
    r0 = 0
    while r0 < n:
        k = min(<int32_t>SW_OBL_R, n - r0)
        sw_obl_cols(o, X + <int64_t>r0 * nf, nf, k, cols)
        # the next block's rows asked for now, read while this block's trees are scored: the
        # staging otherwise waits on memory for them (rows come from a large array once)
        nxt = <const char*>(X + <int64_t>(r0 + k) * nf)
        ahead = (min(<int64_t>n, <int64_t>r0 + k + SW_OBL_R) - r0 - k) * nf * <int64_t>sizeof(float)
        off = 0
        while off < ahead:  # within the rows: nxt + off never passes their end
            sw_prefetch_l2(nxt + off)
            off += 64
        if one:
            for r in range(k):
                blk[r] = acc[r0 + r]
            if acc_t is double:
                if not sw_obl_sum_bins(o, cols, k, bins, blk):
                    sw_obl_sum_d(o, cols, k, leaves, blk)
            else:
                sw_obl_sum_f(o, cols, k, leaves, blk)
            for r in range(k):
                acc[r0 + r] = blk[r]
        else:
            t0 = 0
            while t0 < m.n_trees:
                t1 = min(t0 + OBL_TREES, m.n_trees)
                sw_obl_slots(o, cols, k, t0, t1, slot)
                for r in range(k):
                    for t in range(t0, t1):
                        add_leaf(m, leaves, t, t * nl + slot[(t - t0) * SW_OBL_R + r],
                                 acc + <int64_t>(r0 + r) * G)
                t0 = t1
        r0 += k
    if cols != stack_cols:
        free(cols)
    free(bins)


cdef void walk_rows(const ModelView* m, const acc_t* leaves, const float* X, int32_t n,
                    acc_t* acc, RowPlan* plan, float* xx, int32_t xx_cap) noexcept nogil:
    """Every tree for n rows by the walks (eval_rows without a kernel's tables, and the rows
    a kernel leaves): a task's rows planned in its own buffers where it has them (not
    eval_trees' 64 KB stack buffer, which calls and tasks of 64 rows or fewer take)."""
    cdef int64_t t0
    if plan != NULL and plan_wide(m) and INTERLEAVE <= m.n_trees:
        plan_rows(m, X, m.n_features, n, xx, xx_cap, plan)
        t0 = eval_planned(m, leaves, plan, n, 0, m.n_trees, acc)
        eval_rest(m, leaves, X, m.n_features, n, t0, m.n_trees, acc)
    elif xx != NULL and m.qcnodes != NULL:
        eval_rest(m, leaves, X, m.n_features, n, 0, m.n_trees, acc, xx, xx_cap)
    else:
        eval_trees(m, leaves, X, m.n_features, n, 0, m.n_trees, acc)


cdef void eval_rows(const ModelView* m, const acc_t* leaves, const acc_t* base,
                    double divisor, const float* X, int32_t n, acc_t* acc,
                    double* raw, RowPlan* plan=NULL, float* xx=NULL,
                    int32_t xx_cap=0) noexcept nogil:
    """Every tree for n row-major float32 rows X: raw[r * G + g] = (base + trees) / divisor.
    With a plan and xx for n rows (score_all's tasks of padded models), the rows are planned
    and doubled once for the whole task; otherwise in blocks of BLOCK_ROWS (eval_trees)."""
    cdef int32_t r, g, G = m.n_outputs
    cdef uint64_t* mk = NULL
    cdef int64_t* qslot = NULL
    cdef acc_t start = INFINITY if m.agg == AGG_MIN else -INFINITY
    for r in range(n):
        for g in range(G):
            acc[r * G + g] = base[g] if m.agg == AGG_SUM else start
    cdef int32_t r0, k
    cdef bint simd = False
    # read once: Forest.lanes and Forest.masks may switch them while another thread scores
    cdef const sw_lanes* lanes = <const sw_lanes*>m.lanes
    cdef const sw_masks* masks = <const sw_masks*>m.masks
    if m.qs != NULL:  # QuickScorer (qs.h): every tree of a row at once, leaves in tree order
        simd = n > 1 and (<const sw_qs*>m.qs).simd
        k = SW_QS_R if simd else 1
        # each tree's 8 masks one 64-byte line (qs.h): on a line of its own, not split
        # across two, whatever malloc's 16-byte alignment gave (bench/qs_heap.py)
        mk = <uint64_t*>aligned_alloc(64, (k * m.n_trees * sizeof(uint64_t) + 63) // 64 * 64)
        qslot = <int64_t*>malloc(k * m.n_trees * sizeof(int64_t))
    cdef int32_t least = MASKS_MIN_PADDED if m.pnodes != NULL else MASKS_MIN_COMPACT
    if m.obl != NULL and n >= OBL_MIN_ROWS:  # oblivious trees (oblivious.h): the leaves
        eval_oblivious(m, leaves, X, n, acc)       # from the bits of each level
    elif (lanes != NULL and n >= LANES_MIN_ROWS) or (masks != NULL and n >= least):
        # 16 rows a block in the lanes of AVX-512 registers: shallow padded trees (lanes.h),
        # or trees of at most 64 leaves, every split asked of the block at once (masks.h); a
        # last block of fewer rows than the kernel takes walks
        if lanes != NULL:
            least = LANES_MIN_ROWS
        k = n if n % SW_LANES == 0 or n % SW_LANES >= least else n - n % SW_LANES
        if (sw_lanes_rows(lanes, X, m.n_features, k, acc) if lanes != NULL else
                sw_masks_rows(masks, X, m.n_features, k, acc)) != 0:
            k = 0  # refused (no memory for the block): the walks score
        if k < n:
            walk_rows(m, leaves, X + <int64_t>k * m.n_features, n - k, acc + <int64_t>k * G,
                      plan, xx, xx_cap)
    elif mk != NULL and qslot != NULL:
        if simd:
            r0 = 0
            while r0 < n:
                k = min(<int32_t>SW_QS_R, n - r0)
                sw_qs_rows8(<const sw_qs*>m.qs, X + r0 * m.n_features, m.n_features, k, mk,
                            qslot)
                for r in range(k):
                    add_leaves(m, leaves, 0, <int32_t>m.n_trees, 0, qslot + r * m.n_trees,
                               acc + (r0 + r) * G, one_sum(m))
                r0 += k
        else:
            for r in range(n):
                sw_qs_row(<const sw_qs*>m.qs, X + r * m.n_features, mk, qslot)
                add_leaves(m, leaves, 0, <int32_t>m.n_trees, 0, qslot, acc + r * G,
                           one_sum(m))
    else:
        walk_rows(m, leaves, X, n, acc, plan, xx, xx_cap)
    free(mk)
    free(qslot)
    if m.agg != AGG_SUM:  # ONNX Runtime: the smallest (largest) leaf, then + base
        for r in range(n):
            for g in range(G):
                acc[r * G + g] = acc[r * G + g] + base[g]
    for r in range(n * G):
        raw[r] = <double>acc[r] / divisor if divisor != 1.0 else <double>acc[r]


cdef int score_range(const ModelView* m, const acc_t* leaves, const acc_t* base,
                     double divisor, const Column* cols, const float* direct, int64_t r_begin,
                     int64_t r_end, double* out, acc_t* acc, float* buf, RowPlan* plan,
                     float* xx, int32_t xx_cap) noexcept nogil:
    """Rows r_begin..r_end (at most task_rows) into out[(r - r_begin) * G + g]."""
    cdef int32_t n = <int32_t>(r_end - r_begin)
    cdef const float* X
    if direct != NULL and m.n_cat_feat == 0:
        X = direct + r_begin * m.n_features
    else:
        if direct != NULL:  # staged categorical features are rewritten: a copy
            memcpy(buf, direct + r_begin * m.n_features, n * m.n_features * sizeof(float))
        else:
            stage_block(cols, m.n_features, r_begin, n, buf)
        sw_stage_cats(buf, m.n_features, n, m.cat_feat, m.cat_head, m.n_cat_feat)
        X = buf
    eval_rows(m, leaves, base, divisor, X, n, acc, out, plan, xx, xx_cap)
    return 0


cdef inline bint rows_walk(const ModelView* m) noexcept nogil:
    # compact models of 8-byte nodes without special nodes, whose keyed rows fit a task's
    # buffer (task_buffers): eval_rest walks each tree with 8 of a task's rows at once
    return m.sqcnodes != NULL and m.cats == NULL and not m.trees_walk and \
        2 * max(m.n_features, 1) * ROWS_WALK_ROWS <= 4 * PLAN_FLOATS


cdef inline bint part_walk(const ModelView* m, int64_t n) noexcept nogil:
    # a task of n rows takes the partition walk (eval_rest): on (Forest.part_walk), and the
    # largest tree has at most one node for each PART_ROWS_PER_NODE rows (AVX-512), or each
    # PART_ROWS_PER_NODE_ROW (a row at a time). bench/part_walk.py on 2,048-row tasks of
    # LightGBM models: with AVX-512 1.22x the rows walk at 4 rows a node, 0.95-1.06x at 2; a
    # row at a time 1.15x at 8 rows a node, 0.94x at 4 (bench/NOTES.md "The partition walk")
    cdef int64_t per = PART_ROWS_PER_NODE if m.part == SW_PART_AVX512 else \
        PART_ROWS_PER_NODE_ROW
    return m.part != 0 and 0 < m.part_nodes and m.part_nodes * per <= n and n <= SW_PMAX


cdef inline int64_t task_rows(const ModelView* m) noexcept nogil:
    # Compact (deep) models outgrow L2: 1024 rows walk each group of trees while it is cached
    # (measured 2.3x rows/s on model C, a 9 MB random forest, over 64-row blocks), or, with
    # the rows walk (rows_walk), 2,048 rows walk each tree while it is cached. Padded
    # models with doubled rows walk each group of 12 trees over up to 512 rows, the group's
    # nodes in L1 and the doubled rows (at most 256 KB) streaming from L2 (bench/NOTES.md
    # "Kernel v2": B +19%, A +1%); the others keep 64-row blocks.
    if plan_wide(m):
        return max(<int64_t>BLOCK_ROWS,
                   min(<int64_t>PLAN_ROWS, PLAN_FLOATS // (2 * max(m.n_features, 1))))
    if m.pnodes != NULL:
        return BLOCK_ROWS
    return ROWS_WALK_ROWS if rows_walk(m) else COMPACT_ROWS


cdef int task_buffers(const ModelView* m, int64_t rows, acc_t** acc, float** buf,
                      RowPlan** plan, float** xx) noexcept nogil:
    """One task's buffers (a thread's own); the plan and doubled rows only for tasks larger
    than a block (eval_rows). 0, or -1 with everything freed."""
    cdef int64_t xx_floats = rows * 2 * max(m.n_features, 1)
    cdef bint planned = rows > BLOCK_ROWS and plan_wide(m)
    # compact: order-key rows (eval_rest) while they fit PLAN_FLOATS * 4 (1 MB); wider models
    # keep the float walks rather than a buffer of megabytes per thread
    cdef bint keyed = not planned and m.qcnodes != NULL and xx_floats <= 4 * PLAN_FLOATS
    acc[0] = <acc_t*>malloc(rows * m.n_outputs * sizeof(acc_t))
    buf[0] = <float*>malloc(rows * max(m.n_features, 1) * sizeof(float))
    plan[0] = NULL
    xx[0] = NULL
    if planned:
        plan[0] = <RowPlan*>malloc(rows * sizeof(RowPlan))
    if planned or keyed:
        xx[0] = <float*>malloc(xx_floats * sizeof(float))
    if acc[0] == NULL or buf[0] == NULL or planned and plan[0] == NULL or (
            planned or keyed) and xx[0] == NULL:
        free(acc[0])
        free(buf[0])
        free(plan[0])
        free(xx[0])
        acc[0] = buf[0] = NULL
        plan[0] = NULL
        xx[0] = NULL
        return -1
    return 0


cdef int score_all(const ModelView* m, const acc_t* leaves, const acc_t* base, double divisor,
                   const Column* cols, const float* direct, int64_t n_rows, double* out,
                   int n_threads) noexcept nogil:
    """Every row, OpenMP across blocks of task_rows rows; each thread owns its buffers."""
    cdef int64_t rows = task_rows(m), n_blocks
    if n_threads > 1 and rows > BLOCK_ROWS:
        # as many tasks for every thread (a small batch: one task a thread; 10,000 rows of
        # 2,048-row tasks: six of 1,667, not five for two threads)
        n_blocks = (n_rows + rows - 1) // rows
        n_blocks = (n_blocks + n_threads - 1) // n_threads * n_threads
        rows = max(<int64_t>BLOCK_ROWS, (n_rows + n_blocks - 1) // n_blocks)
    n_blocks = (n_rows + rows - 1) // rows
    cdef int64_t b, r0, r1
    cdef int32_t G = m.n_outputs
    cdef acc_t* acc
    cdef float* buf
    cdef RowPlan* plan
    cdef float* xx
    cdef int32_t xx_cap = <int32_t>(rows * 2 * max(m.n_features, 1))
    cdef int failed = 0
    if n_blocks <= 1 or n_threads <= 1:
        if task_buffers(m, rows, &acc, &buf, &plan, &xx) != 0:
            return -1
        for b in range(n_blocks):
            r0 = b * rows
            r1 = min(r0 + rows, n_rows)
            score_range(m, leaves, base, divisor, cols, direct, r0, r1, out + r0 * G, acc, buf,
                        plan, xx, xx_cap)
        free(acc)
        free(buf)
        free(plan)
        free(xx)
        return 0
    with parallel(num_threads=n_threads):
        acc = NULL  # assigned here, so each thread's own (private)
        buf = NULL
        plan = NULL
        xx = NULL
        if task_buffers(m, rows, &acc, &buf, &plan, &xx) != 0:
            acc = NULL
        # dynamic: a thread whose vCPU a neighbour holds up leaves its remaining tasks to the
        # other, where a static split makes the call wait for it (bench/NOTES.md "Thread
        # scaling: the dynamic schedule"); one task a fetch, as fast as static when quiet
        for b in prange(n_blocks, schedule="dynamic"):
            if acc == NULL:
                failed += 1  # a reduction: every thread's failure counts, not the last one's
            else:
                r0 = b * rows
                r1 = min(r0 + rows, n_rows)
                score_range(m, leaves, base, divisor, cols, direct, r0, r1, out + r0 * G, acc,
                            buf, plan, xx, xx_cap)
        free(acc)
        free(buf)
        free(plan)
        free(xx)
    return -1 if failed else 0


AGGREGATES = {"sum": AGG_SUM, "min": AGG_MIN, "max": AGG_MAX}  # Forest(aggregate=)


# the lanes and oblivious kernels read the padded layout's trees: a compact model's refusal
COMPACT_REFUSED = ("the compact layout: this kernel reads the padded layout's trees (compile "
                   "with layout='padded', or 'auto' to time every candidate)")

cdef class Forest:
    """Packed model arrays and the view the kernels read. The arrays are owned here, and must
    not change after __init__: the kernels' tables (QuickScorer's, the oblivious kernel's
    halves, the lanes and leaf-mask kernels') are made from them once."""

    def __cinit__(self):
        self.ready = False
        self.qs_tables = NULL
        self.obl_tables = NULL
        self.lanes_tables = NULL
        self.masks_tables = NULL
        self.scratch_x = NULL
        self.scratch_acc = NULL
        self.scratch_raw = NULL

    def __dealloc__(self):
        free(self.qs_tables)
        free(self.obl_tables)
        free(self.lanes_tables)
        free(self.masks_tables)
        free(self.scratch_x)
        free(self.scratch_acc)
        free(self.scratch_raw)

    def __init__(self, dict arrays, str layout, int depth, int n_features, int n_outputs,
                 double divisor, str kernel="auto", str aggregate="sum"):
        cdef const uint32_t[:, ::1] nodes
        cdef const int64_t[::1] root
        cdef const int32_t[::1] group
        # names first: a refusal here leaves an initialised Forest as it was
        if aggregate not in AGGREGATES:
            raise ValueError(f"unknown aggregate {aggregate!r} (sum, min, max)")
        if kernel not in ("auto", "walk", "quickscorer", "oblivious", "lanes", "masks"):
            raise ValueError(f"unknown kernel {kernel!r} (auto, walk, quickscorer, oblivious, "
                             "lanes, masks)")
        if layout not in ("padded", "compact"):
            raise ValueError(f"unknown layout {layout!r}")
        # from here a failure leaves the Forest half made: it scores nothing until an
        # __init__ finishes
        self.ready = False
        # the kernels' tables and scratch buffers of an earlier __init__ (tables point into
        # arrays replaced below): gone before anything can reach them again (Forest.lanes,
        # oblivious_simd). Not while another thread scores with this Forest: a Forest is
        # initialised once, where it is made
        free(self.scratch_x)
        free(self.scratch_acc)
        free(self.scratch_raw)
        self.scratch_x = NULL
        self.scratch_acc = self.scratch_raw = NULL
        self.view.qs = NULL
        self.view.obl = NULL
        self.view.lanes = NULL
        self.view.masks = NULL
        free(self.qs_tables)
        free(self.obl_tables)
        free(self.lanes_tables)
        free(self.masks_tables)
        self.qs_tables = self.obl_tables = self.lanes_tables = self.masks_tables = NULL
        self.arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
        a = self.arrays
        self.divisor = divisor
        self.view.pnodes = NULL
        self.view.cnodes = NULL
        self.view.root = NULL
        self.view.cats = NULL
        self.view.cat_feat = NULL
        self.view.cat_head = NULL
        self.view.n_cat_feat = 0
        self.view.cat_staged = 0
        self.view.trees_walk = 0
        self.view.pairs = 1
        self.view.steps = NULL
        self.steps = None
        self.view.part = 0
        self.view.part_nodes = 0
        self.part_largest = 0
        self.view.agg = AGGREGATES[aggregate]
        self.aggregate = aggregate
        self.view.n_nodes = 0
        self.view.n_leaves = a["leaves"].shape[0]
        group = a["tree_group"]
        self.view.n_trees = group.shape[0]
        if self.view.n_trees == 0:
            raise ValueError("a model needs at least one tree")
        self.view.group = &group[0]
        self.view.n_features = n_features
        self.view.n_outputs = n_outputs
        if layout == "padded":
            nodes = a["pnodes"]
            if not 0 <= depth <= 20:
                raise ValueError(f"padded depth {depth} outside 0..20")
            if nodes.shape[0] != self.view.n_trees * ((<int64_t>1 << depth) - 1):
                raise ValueError("padded node array does not match the tree count and depth")
            self.view.pnodes = <const PNode*>&nodes[0, 0] if nodes.shape[0] else <const PNode*>1
            self.view.depth = depth
        elif layout == "compact":
            nodes = a["cnodes"]
            root = a["root"]
            self.view.cnodes = <const CNode*>&nodes[0, 0]
            self.view.root = &root[0]
            self.view.n_nodes = nodes.shape[0]
            self.view.depth = 0
        else:
            raise ValueError(f"unknown layout {layout!r}")
        if "cats" in a:
            cats = a["cats"]
            if cats.dtype != np.uint32 or cats.ndim != 1 or cats.shape[0] < 2:
                raise ValueError("cats must be 1-D uint32 with the unused entry first")
            self.view.cats = <const uint32_t*><Py_ssize_t>cats.ctypes.data
            if "cat_feat" in a:
                feat, head = a["cat_feat"], a["cat_head"]
                if feat.dtype != np.int32 or head.dtype != np.uint32 or feat.ndim != 1 \
                        or head.shape != feat.shape or feat.size == 0 \
                        or feat.min() < 0 or feat.max() >= n_features:
                    raise ValueError("cat_feat / cat_head malformed")
                self.view.cat_feat = <const int32_t*><Py_ssize_t>feat.ctypes.data
                self.view.cat_head = <const uint32_t*><Py_ssize_t>head.ctypes.data
                self.view.n_cat_feat = feat.shape[0]
                self.view.cat_staged = 1
        self.view.qnodes = NULL
        self.view.qcnodes = NULL
        self.view.sqcnodes = NULL
        self.sqnodes = None
        if layout == "padded" and self.view.cats == NULL \
                and self.view.pnodes != <const PNode*>1:  # special nodes: spwalk reads pnodes
            self.qnodes = order_key_nodes(a["pnodes"])
            nodes = self.qnodes
            self.view.qnodes = <const PNode*>&nodes[0, 0]
        elif layout == "compact" and self.view.cats == NULL:
            self.qnodes = order_key_nodes(a["cnodes"])
            nodes = self.qnodes
            self.view.qcnodes = <const CNode*>&nodes[0, 0]
            self.sqnodes = small_key_nodes(self.qnodes)
            self.small_nodes(True)
        self.float32_acc = a["leaves"].dtype == np.float32
        if self.float32_acc:
            self.leaves32 = a["leaves"]
            self.base32 = a["base"]
            self.view.n_leaf_out = self.leaves32.shape[1]
        else:
            self.leaves64 = a["leaves"]
            self.base64 = a["base"]
            self.view.n_leaf_out = self.leaves64.shape[1]
        if a["base"].shape[0] != n_outputs:
            raise ValueError("base has the wrong number of outputs")
        self._check()
        self.view.qs = NULL
        self.view.obl = NULL
        self.view.lanes = NULL
        self.view.masks = NULL
        self.kernel_timings = {}
        self.qs_arrays = {}
        self.obl_arrays = {}
        self.lanes_arrays = {}
        self.masks_arrays = {}
        self.kernel = "walk"
        self.kernel_reason = ""
        self.scratch_x = <float*>malloc(BLOCK_ROWS * max(n_features, 1) * sizeof(float))
        self.scratch_acc = <double*>malloc(BLOCK_ROWS * n_outputs * sizeof(double))
        self.scratch_raw = <double*>malloc(BLOCK_ROWS * n_outputs * sizeof(double))
        if self.scratch_x == NULL or self.scratch_acc == NULL or self.scratch_raw == NULL:
            raise MemoryError()
        # the view is whole and the walks can score it: a kernel's tables refused below leave
        # the walks in force
        self.ready = True
        if kernel == "oblivious":
            self._oblivious()
        elif kernel == "lanes":
            self._lanes()
        elif kernel == "masks":
            self._masks()
        elif kernel != "walk":
            self._quickscorer(kernel == "quickscorer")

    def _oblivious(self):
        """The oblivious kernel's tables (oblivious.h), for a padded model whose every tree
        asks one question per level: the same feature, missing-value side and threshold, or
        the same special split (its entry's words), at every node of the level; otherwise
        ValueError saying why."""
        self.need_ready()
        from worker.model.ir import entry_size

        cdef sw_obl* o
        cdef const uint32_t[:, ::1] kv
        cdef const uint32_t[:, ::1] tv
        cdef const uint32_t[::1] dk
        cdef const uint32_t[::1] do
        cdef const uint32_t[:, ::1] hv
        cdef int32_t D = self.view.depth
        cdef int64_t T = self.view.n_trees
        cdef int64_t nf = self.view.n_features
        reason = ""
        if self.view.cnodes != NULL:
            raise ValueError(f"kernel oblivious: {COMPACT_REFUSED}")
        if self.view.pnodes == NULL or D < 1 or nf < 1:
            raise ValueError("kernel oblivious: not a padded model of depth 1 or more")
        if self.view.agg != AGG_SUM:  # its blocks add the leaves (oblivious.h sw_obl_sum)
            self.kernel_reason = f"aggregate {self.aggregate}: the oblivious kernel sums"
            raise ValueError(f"kernel oblivious: {self.kernel_reason}")
        q = order_key_nodes(self.arrays["pnodes"]).reshape(T, (1 << D) - 1, 2)
        d_key, d_off = [], []
        special = (q[:, :, 0] & 0x40000000) != 0
        if special.any():
            # a special node: column 2 nf + d, threshold 0; identical splits share d
            cats = self.arrays["cats"]
            raw_off = self.arrays["pnodes"][:, 1].reshape(T, (1 << D) - 1)
            derived = {}
            pairs, inverse = np.unique(np.stack([q[:, :, 0][special], raw_off[special]], 1),
                                       axis=0, return_inverse=True)
            col = np.empty(len(pairs), dtype=np.uint32)
            for i, (k, off) in enumerate(pairs):
                words = cats[int(off):int(off) + entry_size(cats, int(off))].tobytes()
                d = derived.setdefault((int(k), words), len(derived))
                if d == len(d_key):
                    d_key.append(int(k))
                    d_off.append(int(off))
                col[i] = 2 * nf + d
            q[:, :, 0][special] = col[inverse.reshape(-1)]
            q[:, :, 1][special] = 0
        keys = np.empty((T, D), dtype=np.uint32)
        thr = np.empty((T, D), dtype=np.uint32)
        for level in range(D):
            seg = q[:, (1 << level) - 1:(1 << (level + 1)) - 1, :]
            differ = np.flatnonzero((seg != seg[:, :1, :]).any(axis=(1, 2)))
            if differ.size:
                reason = (f"tree {int(differ[0])} asks more than one question at level "
                          f"{level} (not an oblivious tree)")
                break
            keys[:, level] = seg[:, 0, 0]
            thr[:, level] = seg[:, 0, 1]
        if reason:
            self.kernel_reason = reason
            raise ValueError(f"kernel oblivious: {reason}")
        # every index the kernel reads: a column of the block (2 a feature, at most 65,536
        # derived), 2^D leaves a tree
        if int(keys.max()) >= 2 * nf + len(d_key) or len(d_key) > 1 << 16 \
                or self.arrays["leaves"].shape[0] != T << D:
            raise ValueError("kernel oblivious: a level reads beyond the block's columns, or "
                             "more than 65,536 distinct special splits")
        # everything built first, then swapped in at once: a failure here (no memory for the
        # halves, say) leaves the tables in force as they were
        arrays = {"obl_key": keys, "obl_thr": thr,
                  "obl_dkey": np.asarray(d_key + [0], dtype=np.uint32),
                  "obl_doff": np.asarray(d_off + [0], dtype=np.uint32)}
        halves = self._obl_halves()
        if halves is not None:
            arrays["obl_halves"] = halves
        bins = self._obl_bins(keys, thr, 2 * nf + len(d_key), True)
        if bins is not None:
            arrays.update(bins)
        kv = keys
        tv = thr
        dk = arrays["obl_dkey"]
        do = arrays["obl_doff"]
        o = <sw_obl*>malloc(sizeof(sw_obl))
        if o == NULL:
            raise MemoryError()
        o.key = &kv[0, 0]
        o.thr = &tv[0, 0]
        o.n_trees = T
        o.depth = D
        o.simd = sw_obl_simd_best()
        o.n_features = <int32_t>nf
        o.n_derived = len(d_key)
        o.d_key = &dk[0]
        o.d_off = &do[0]
        o.cats = self.view.cats
        o.staged = self.view.cat_staged
        o.halves = NULL
        if halves is not None:
            hv = halves
            o.halves = &hv[0, 0]
        o.quarters = NULL
        _obl_set_bins(o, arrays)
        old = self.obl_tables
        self.obl_arrays = arrays
        self.obl_tables = o
        self.view.obl = o
        free(old)  # an earlier _oblivious()'s tables (not while another thread scores)
        self.kernel = "oblivious"

    def _obl_halves(self):
        """sw_obl.halves (oblivious.h sw_obl_sum512_h) for a model of depth 6 or less whose
        trees add one float64 leaf to one score, on a CPU with AVX-512F (the only kernel that
        reads them), at most OBL_HALVES_MAX_BYTES: each tree's leaves as 32-bit words, the
        low words in W slots then the high words in W (W = 64 at depth 6, 32 at depth 5, 16
        below; zero past the tree's 2^D leaves, never picked); None otherwise (the leaves
        are gathered). Built, not installed: the caller swaps it in."""
        cdef int32_t D = self.view.depth
        cdef int64_t T = self.view.n_trees
        if D > 6 or self.float32_acc or sw_obl_simd_best() != SW_OBL_AVX512 or not (
                self.view.n_outputs == 1 and self.view.n_leaf_out == 1
                and self.view.agg == AGG_SUM):
            return None
        W = 64 if D == 6 else 32 if D == 5 else 16
        if T * 2 * W * 4 > OBL_HALVES_MAX_BYTES:
            return None
        bits = np.asarray(self.arrays["leaves"], dtype=np.float64).reshape(T, 1 << D).view(
            np.uint64)
        halves = np.zeros((T, 2 * W), dtype=np.uint32)
        halves[:, :1 << D] = bits & np.uint64(0xFFFFFFFF)
        halves[:, W:W + (1 << D)] = bits >> np.uint64(32)
        return halves

    def _obl_bins(self, keys, thr, int64_t n_cols, bint pay):
        """The bins' tables (oblivious.h sw_obl_bins512, sw_obl_sum512_w) for a model of depth
        6 or less whose trees add one float64 leaf to one score, on a CPU with AVX-512 BW, at
        most OBL_HALVES_MAX_BYTES of them (the leaves as words), every column its levels
        read asked at most OBL_BINS_MAX_BORDERS distinct thresholds (a threshold past the
        column's largest key is none), and (pay: when the kernel is built) trees enough to
        pay for binning those columns (OBL_BINS_TREES_LONG and _SHORT); None otherwise. keys and thr: the levels' columns and threshold keys (n_trees x depth,
        uint32); n_cols: the block's columns. Built, not installed: the caller swaps them
        in."""
        cdef int32_t D = self.view.depth
        cdef int64_t T = self.view.n_trees
        if D > 6 or self.float32_acc or sw_obl_simd_best() != SW_OBL_AVX512 \
                or not sw_obl_bw() or not (self.view.n_outputs == 1
                                           and self.view.n_leaf_out == 1
                                           and self.view.agg == AGG_SUM):
            return None
        if T * 256 * 2 > OBL_HALVES_MAX_BYTES:
            return None
        used = np.unique(keys)
        if used.size == 0 or int(used[-1]) >= n_cols \
                or (pay and T < OBL_BINS_TREES_SHORT * used.size):
            return None
        jb = np.empty(keys.shape, dtype=np.uint8)
        nb = np.empty(used.size, dtype=np.uint32)
        btab = np.full((used.size, SW_OBL_BTAB), 0xFFFFFFFF, dtype=np.uint32)
        pad = np.empty(256, dtype=np.uint32)
        nf2 = 2 * <int64_t>self.view.n_features
        for u, c in enumerate(used):
            at = keys == c
            # a threshold no key of the column exceeds (the largest key: +inf's where missing
            # values are 0, the even columns, all ones in the odd) is no border: its levels
            # take j = 255, which no bin exceeds (CatBoost's bias, a tree asking column 0 >
            # +inf, would otherwise cost a border)
            top = 0xFF800000 if c < nf2 and c % 2 == 0 else 0xFFFFFFFF
            live = thr[at] < top
            borders = np.unique(thr[at][live])  # ascending, distinct
            if borders.size > OBL_BINS_MAX_BORDERS:
                return None
            jb[at] = np.where(live, np.searchsorted(borders, thr[at]), 255).astype(np.uint8)
            nb[u] = borders.size
            pad[:] = 0xFFFFFFFF
            pad[:borders.size] = borders
            btab[u, :32] = pad[:32] if borders.size <= 31 else pad[7::8]
            for j in range(8):
                btab[u, 32 + 32 * j:64 + 32 * j] = pad[j::8]
        if pay and T < (OBL_BINS_TREES_SHORT * int((nb <= 31).sum())
                        + OBL_BINS_TREES_LONG * int((nb > 31).sum())):
            return None
        bits = np.asarray(self.arrays["leaves"], dtype=np.float64).reshape(T, 1 << D).view(
            np.uint64)
        quarters = np.zeros((T, 256), dtype=np.uint16)
        for q in range(4):
            quarters[:, 64 * q:64 * q + (1 << D)] = (bits >> np.uint64(16 * q)) & np.uint64(0xFFFF)
        return {"obl_quarters": quarters, "obl_jb": jb, "obl_used": used.astype(np.uint32),
                "obl_nb": nb, "obl_btab": btab}

    def oblivious_bins(self, object on=None):
        """The oblivious kernel's blocks of more than 16 rows by the bins (True: each column
        binned once a block, every tree read as byte compares; AVX-512 BW) or by the halves
        (False), for tests and A/B runs; what is in force (False without the tables, or while
        oblivious_simd is not "avx512"). Read once a block, as oblivious_halves."""
        cdef sw_obl* o = <sw_obl*>self.obl_tables
        cdef const uint16_t[:, ::1] qv
        if o == NULL:
            return False
        a = self.obl_arrays
        if on and "obl_quarters" not in a:
            # a model the kernel's build left without them for want of trees a column: built
            # now (for tests and A/B runs; like _oblivious, not while another thread scores)
            bins = self._obl_bins(a["obl_key"], a["obl_thr"],
                                  2 * <int64_t>o.n_features + o.n_derived, False)
            if bins is None:
                return False
            a.update(bins)
            _obl_set_bins(o, a)
        if "obl_quarters" not in a:
            return False
        if on is not None:
            qv = a["obl_quarters"]
            o.quarters = &qv[0, 0] if on else NULL
        return o.quarters != NULL and o.simd == SW_OBL_AVX512

    def oblivious_halves(self, object on=None):
        """The oblivious kernel's float64 leaves picked from registers as 32-bit halves
        (True; AVX-512, depth 6 or less) or gathered (False), for tests and A/B runs; what is
        in force (False without the tables, or while oblivious_simd is not "avx512"). The
        kernel reads the switch once a block, so switching it while another thread scores
        changes which way that thread's next blocks pick their leaves, never mid-block."""
        cdef sw_obl* o = <sw_obl*>self.obl_tables
        cdef const uint32_t[:, ::1] hv
        if o == NULL or "obl_halves" not in self.obl_arrays:
            return False
        if on is not None:
            hv = self.obl_arrays["obl_halves"]
            o.halves = &hv[0, 0] if on else NULL
        return o.halves != NULL and o.simd == SW_OBL_AVX512

    def _lanes(self):
        """The lanes kernel's tables (lanes.h), for a padded model of depth 1..5 without
        special nodes whose every tree adds one value to one score; otherwise ValueError
        saying why."""
        self.need_ready()
        cdef sw_lanes* L
        cdef const uint32_t[:, ::1] cv
        cdef const uint32_t[:, ::1] tv
        cdef int32_t D = self.view.depth
        cdef int64_t T = self.view.n_trees
        cdef int64_t nf = self.view.n_features
        if self.view.cnodes != NULL:
            reason = COMPACT_REFUSED
        elif self.view.qnodes == NULL or D < 1:
            reason = "not a padded model of depth 1 or more without special nodes"
        elif D > SW_LANES_MAXD:
            reason = f"depth {D}: the kernel takes trees of depth {SW_LANES_MAXD} at most " \
                "(deeper levels cost more loads than the walks' steps)"
        elif not one_sum(&self.view):
            reason = "trees adding to several scores, or not summed"
        elif not 1 <= nf <= SW_LANES_MAXF:
            reason = f"{nf} features: the kernel takes 1 to {SW_LANES_MAXF}"
        elif not sw_lanes_cpu():
            reason = "this CPU has no AVX-512F"
        else:
            reason = ""
        W = 16 if D <= 4 else 32  # lanes.h SW_LANES_WIDTH
        leaf_bytes = self.arrays["leaves"].dtype.itemsize
        if not reason and T * W * (8 + leaf_bytes) > LANES_MAX_TABLE_BYTES:
            reason = f"tables of {T * W * (8 + leaf_bytes):,} bytes, past the kernel's " \
                f"{LANES_MAX_TABLE_BYTES:,}"
        if reason:
            self.kernel_reason = reason
            raise ValueError(f"kernel lanes: {reason}")
        n_int = (1 << D) - 1
        q = np.asarray(self.qnodes, dtype=np.uint32).reshape(T, n_int, 2)
        keys = q[:, :, 0].astype(np.int64)
        leaves = self.arrays["leaves"]
        # every column a node reads lies in the block: 2 n_features columns of 16 keys
        if T and (keys.min() < 0 or keys.max() >= 2 * nf):
            raise ValueError("kernel lanes: a node reads beyond the block's columns")
        if leaves.shape[0] != T << D or leaves.shape[1] != 1:
            raise ValueError("kernel lanes: the leaf array does not match the trees")
        # built again (a second call): the old tables go before the arrays they point into
        self.view.lanes = NULL
        free(self.lanes_tables)
        self.lanes_tables = NULL
        col = np.zeros((T, W), dtype=np.uint32)
        thr = np.zeros((T, W), dtype=np.uint32)
        col[:, 1:1 + n_int] = keys * SW_LANES
        thr[:, 1:1 + n_int] = q[:, :, 1]
        leaf = np.zeros((T, W), dtype=leaves.dtype)
        leaf[:, :1 << D] = leaves[:, 0].reshape(T, 1 << D)
        self.lanes_arrays = {"col": col, "thr": thr, "leaf": leaf}
        cv = col
        tv = thr
        L = <sw_lanes*>malloc(sizeof(sw_lanes))
        if L == NULL:
            raise MemoryError()
        self.lanes_tables = L
        L.col = &cv[0, 0]
        L.thr = &tv[0, 0]
        L.leaf = <const void*><Py_ssize_t>leaf.ctypes.data
        L.n_trees = T
        L.depth = D
        L.width = W
        L.n_features = <int32_t>nf
        L.f64 = 0 if self.float32_acc else 1
        self.view.lanes = L  # (built where the Forest is made, before any thread scores)
        self.kernel = "lanes"

    def _masks(self):
        """The leaf-mask kernel's tables (masks.h), for a model without special nodes whose
        every tree has at most 64 leaves (padded: depth 1..6) and adds one value to one score;
        otherwise ValueError saying why."""
        self.need_ready()
        from worker.model import quickscorer

        cdef sw_masks* M
        cdef const uint32_t[:, ::1] ev
        cdef const int64_t[::1] ov
        cdef const uint32_t[:, ::1] lv
        cdef int64_t T = self.view.n_trees
        cdef int64_t nf = self.view.n_features
        padded = self.view.pnodes != NULL
        reason = ""
        if padded and not 1 <= self.view.depth <= 6:
            reason = f"padded depth {self.view.depth} (at most 64 leaves: depth 1..6)"
        elif (self.view.qnodes == NULL) if padded else (self.view.qcnodes == NULL):
            reason = "special (categorical) splits: QuickScorer's tables take those"
        elif not one_sum(&self.view):
            reason = "trees adding to several scores (a multiclass model) or combined by min " \
                "or max: the kernel sums one score"
        elif not 1 <= nf <= SW_MASKS_MAXF:
            reason = f"{nf} features: the kernel takes 1 to {SW_MASKS_MAXF}"
        elif not sw_masks_cpu():
            reason = "this CPU has no AVX-512F and AVX-512CD"
        else:
            try:
                if padded:
                    keep, tree, mask, leaf_of = quickscorer.padded_splits(
                        self.arrays["pnodes"], self.view.depth)
                else:
                    keep, tree, mask, leaf_of = quickscorer.compact_splits(
                        self.arrays["cnodes"], self.arrays["root"])
            except quickscorer.NotEligible as exc:
                reason = str(exc)
        leaf_bytes = self.arrays["leaves"].dtype.itemsize
        if not reason:
            n_bytes = 2 * 16 * len(tree) + T * (SW_MASKS_LEAVES * leaf_bytes + 16)
            if n_bytes > MASKS_MAX_TABLE_BYTES:
                reason = f"tables of up to {n_bytes:,} bytes, past the kernel's " \
                    f"{MASKS_MAX_TABLE_BYTES:,}"
        if reason:
            self.kernel_reason = reason
            raise ValueError(f"kernel masks: {reason}")
        q = np.asarray(self.qnodes, dtype=np.uint32)
        key = q[keep, 0].astype(np.int64)
        # every column an entry reads lies in the block: 2 n_features columns of 16 keys
        if len(key) and (key.min() < 0 or key.max() >= 2 * nf):
            raise ValueError("kernel masks: a split reads beyond the block's columns")
        if leaf_of.min() < 0 or leaf_of.max() >= self.arrays["leaves"].shape[0]:
            raise ValueError("kernel masks: a leaf slot beyond the leaf array")
        t = quickscorer.mask_tables(key.astype(np.uint32), q[keep, 1], tree, mask, leaf_of,
                                    self.arrays["leaves"])
        off = t["off"]
        # the kernel reads 64 floats a tree, or 128 words (the doubles' halves), one row after
        # the other (the typed view refuses an array that is not)
        if t["leaf"].shape != (T, SW_MASKS_LEAVES * (1 if self.float32_acc else 2)) \
                or t["leaf"].itemsize != 4:
            raise ValueError("kernel masks: the leaf table does not match the trees")
        lv = t["leaf"].view(np.uint32)
        if off[0] != 0 or off[-1] != t["n_ent"] or (np.diff(off) < 0).any():
            raise ValueError("kernel masks: the lists' offsets do not rise from 0 to the "
                             "entries")
        # built first, then swapped in: a failure above leaves the tables in force as they were
        ev = t["ent"]
        ov = off
        M = <sw_masks*>malloc(sizeof(sw_masks))
        if M == NULL:
            raise MemoryError()
        M.ent = <const void*>&ev[0, 0]
        M.off = &ov[0]
        M.leaf = <const void*>&lv[0, 0]
        M.n_trees = T
        M.n_ent = t["n_ent"]
        M.n_features = <int32_t>nf
        M.f64 = 0 if self.float32_acc else 1
        old = self.masks_tables
        self.masks_arrays = t
        self.masks_tables = M
        self.view.masks = M
        free(old)  # an earlier _masks()'s tables (not while another thread scores)
        self.kernel = "masks"

    def masks(self, object on=None):
        """The leaf-mask kernel on (True) or off (False: the walks score), for tests and A/B
        runs; what is in force. False without its tables."""
        if on is not None and self.masks_tables != NULL:
            self.view.masks = self.masks_tables if on else NULL
        return self.view.masks != NULL

    cdef int need_ready(self) except -1:
        """ValueError unless __init__ finished (a half-made view scores nothing)."""
        if not self.ready:
            raise ValueError("this Forest's __init__ failed: it scores nothing")
        return 0

    def lanes(self, object on=None):
        """The lanes kernel on (True) or off (False: the walks score), for tests and A/B runs;
        what is in force. False without its tables."""
        if on is not None and self.lanes_tables != NULL:
            self.view.lanes = self.lanes_tables if on else NULL
        return self.view.lanes != NULL

    def oblivious_simd(self, object mode=None):
        """How the oblivious kernel scores: "avx512" (16 rows a compare), "avx2" (8) or
        "row" (portable C), the best the CPU has by default; ``mode`` sets it (tests score
        every way), refusing what the CPU lacks. What is in force; None without the kernel."""
        cdef sw_obl* o = <sw_obl*>self.obl_tables
        names = {SW_OBL_ROW: "row", SW_OBL_AVX2: "avx2", SW_OBL_AVX512: "avx512"}
        if o == NULL:
            return None
        if mode is not None:
            best = sw_obl_simd_best()
            want = {v: k for k, v in names.items()}.get(mode, -1)
            if want < 0 or want > best:
                raise ValueError(f"oblivious mode {mode!r}: this CPU has {names[best]}")
            o.simd = want
        return names[o.simd]

    def _quickscorer(self, bint forced):
        """QuickScorer tables (worker/model/quickscorer.py) for a compact model whose trees
        have at most 64 leaves; otherwise the walks (forced: ValueError saying why)."""
        self.need_ready()
        from worker.model import quickscorer

        cdef sw_qs* q
        a = self.arrays
        if self.view.cnodes == NULL and self.view.cats == NULL:
            # measured: the padded walks score A 2.35x and D 1.4x faster than QuickScorer
            reason = "padded layout without categorical splits (the walks are faster there)"
        elif self.view.cnodes == NULL:
            try:
                t = quickscorer.build_padded(a["pnodes"], self.view.depth,
                                             self.view.n_features, a.get("cats"),
                                             a.get("cat_feat"), a.get("cat_head"))
                reason = ""
            except quickscorer.NotEligible as exc:
                reason = str(exc)
        else:
            try:
                t = quickscorer.build(a["cnodes"], a["root"], self.view.n_features,
                                      a.get("cats"), a.get("cat_feat"), a.get("cat_head"))
                reason = ""
            except quickscorer.NotEligible as exc:
                reason = str(exc)
        if reason:
            self.kernel_reason = reason
            if forced:
                raise ValueError(f"kernel quickscorer: {reason}")
            return
        self.qs_arrays = t
        q = <sw_qs*>malloc(sizeof(sw_qs))
        if q == NULL:
            raise MemoryError()
        self.qs_tables = q
        q.num = <const sw_qsnode*><Py_ssize_t>t["qs_num"].ctypes.data
        q.num_off = <const int32_t*><Py_ssize_t>t["qs_num_off"].ctypes.data
        q.nan = <const sw_qsnode*><Py_ssize_t>t["qs_nan"].ctypes.data
        q.nan_off = <const int32_t*><Py_ssize_t>t["qs_nan_off"].ctypes.data
        q.cat = <const sw_qsnode*><Py_ssize_t>t["qs_cat"].ctypes.data
        q.cat_off = <const int32_t*><Py_ssize_t>t["qs_cat_off"].ctypes.data
        q.cat_base = <const int32_t*><Py_ssize_t>t["qs_cat_base"].ctypes.data
        q.cat_width = <const int32_t*><Py_ssize_t>t["qs_cat_width"].ctypes.data
        q.leaf = <const int32_t*><Py_ssize_t>t["qs_leaf"].ctypes.data
        q.n_trees = self.view.n_trees
        q.n_features = self.view.n_features
        q.simd = sw_qs_simd_on()
        self.view.qs = q
        self.kernel = "quickscorer"
        if not forced:
            self._choose(t)

    def _choose(self, dict t):
        """Auto: keep QuickScorer only if it scores probe rows at least 10% faster than the
        walks on this machine (both are exact: the choice changes speed only). Probe rows
        take values on and next to the model's own thresholds, 5% missing, random staged
        categories. Timings (us per row, median of 5, alternated) go to kernel_timings."""
        self.need_ready()
        import time

        cdef int32_t nf = self.view.n_features, n = BLOCK_ROWS
        cdef int32_t G = self.view.n_outputs
        cdef float[:, ::1] X
        cdef double[::1] acc, raw
        cdef const void* qs = self.view.qs
        rng = np.random.default_rng(0)
        probe = rng.normal(size=(n, max(nf, 1))).astype(np.float32)
        off, num = t["qs_num_off"], t["qs_num"]
        for f in range(nf):
            if t["qs_cat_base"][f] >= 0:
                probe[:, f] = rng.integers(0, t["qs_cat_width"][f], n).astype(np.uint32).view(
                    np.float32)
            elif off[f + 1] > off[f]:
                k = num["thr"][rng.integers(off[f], off[f + 1], n)].astype(np.int64)
                k += rng.integers(-1, 2, n)  # on the threshold or one ulp either side
                k = np.clip(k, 0, 0xFFFFFFFF).astype(np.uint32)
                bits = np.where(k >> 31 == 1, k & np.uint32(0x7FFFFFFF), ~k).astype(np.uint32)
                probe[:, f] = bits.view(np.float32)
                probe[rng.random(n) < 0.05, f] = np.nan
        X = probe
        acc = np.empty(n * G)
        raw = np.empty(n * G)
        times = {"walk": [], "quickscorer": []}
        for rep in range(5):
            for name in ("walk", "quickscorer"):
                self.view.qs = qs if name == "quickscorer" else NULL
                t0 = time.perf_counter()
                with nogil:
                    if self.float32_acc:
                        eval_rows(&self.view, &self.leaves32[0, 0], &self.base32[0],
                                  self.divisor, &X[0, 0], n, <float*>&acc[0], &raw[0])
                    else:
                        eval_rows(&self.view, &self.leaves64[0, 0], &self.base64[0],
                                  self.divisor, &X[0, 0], n, &acc[0], &raw[0])
                times[name].append((time.perf_counter() - t0) / n * 1e6)
        self.kernel_timings = {k: round(float(np.median(v)), 3) for k, v in times.items()}
        if self.kernel_timings["quickscorer"] <= 0.9 * self.kernel_timings["walk"]:
            self.view.qs = qs
        else:
            self.view.qs = NULL
            free(self.qs_tables)
            self.qs_tables = NULL
            self.qs_arrays = {}
            self.kernel = "walk"
            self.kernel_reason = "QuickScorer was not 10% faster on probe rows"

    def quickscorer_simd(self, object mode=None):
        """How QuickScorer scores: "avx512" or "avx2" (8 rows at once, the best the CPU has
        by default) or "row" (a row at a time); ``mode`` sets it (True: the best, False:
        "row"; tests score every way), refusing what the CPU lacks. What is in force; None
        without QuickScorer."""
        cdef sw_qs* q = <sw_qs*>self.qs_tables
        names = {SW_QS_ROW: "row", SW_QS_AVX2: "avx2", SW_QS_AVX512: "avx512"}
        if q == NULL:
            return None
        if mode is not None:
            best = sw_qs_simd_on()
            want = best if mode is True else SW_QS_ROW if mode is False else {
                v: k for k, v in names.items()}.get(mode, -1)
            if want < 0 or want > best:
                raise ValueError(f"QuickScorer mode {mode!r}: this CPU has {names[best]}")
            q.simd = want
        return names[q.simd]

    def small_nodes(self, bint on):
        """Whether the compact walks over order keys read 8-byte nodes (``small_key_nodes``:
        the default where they fit) or the 16-byte ones (tests score both). The node size in
        force: 8, 16, or None for a padded model or one with special nodes."""
        cdef const uint32_t[:, ::1] nodes
        if self.view.qcnodes == NULL:
            return None
        self.view.sqcnodes = NULL
        if on and self.sqnodes is not None:
            nodes = self.sqnodes
            self.view.sqcnodes = <const PNode*>&nodes[0, 0]
            if self.steps is None:
                self.steps = walk_steps(self.sqnodes, self.arrays["root"])
            self.fixed_walk(True)
            self.part_largest = int(np.diff(np.append(self.arrays["root"],
                                                      self.view.n_nodes)).max())
            self.view.part_nodes = self.part_largest
            self.view.part = sw_part_best()
        else:
            self.view.part = 0
            self.view.part_nodes = 0
        return 8 if self.view.sqcnodes != NULL else 16

    def part_walk(self, object mode=None, object force=None):
        """Whether a large task's rows go through each small tree node by node (walk.h
        sw_scwalk_part; the default where its largest tree has at most one node for each 4
        of a task's rows): "avx512" (16 rows a compare, the default where the CPU has it) or
        "row" (a row at a time), or off (False: the rows walks). ``mode`` sets it (True: the
        best; tests score every way), refusing what the CPU lacks; ``force`` True takes it
        whatever the trees' size (for bench/part_walk.py), False restores the limit. What is
        in force; None where it does not apply (no rows walk, or trees of more than 512
        nodes)."""
        names = {SW_PART_ROW: "row", SW_PART_AVX512: "avx512"}
        if force is not None and self.view.part_nodes > 0:
            self.view.part_nodes = 1 if force else self.part_largest
        if not rows_walk(&self.view) or self.view.part_nodes < 1 or \
                self.view.part_nodes * PART_ROWS_PER_NODE > ROWS_WALK_ROWS:
            return None
        if mode is not None:
            best = sw_part_best()
            want = best if mode is True else 0 if mode is False else {
                v: k for k, v in names.items()}.get(mode, -1)
            if want < 0 or want > best:
                raise ValueError(f"partition walk {mode!r}: this CPU has {names[best]}")
            self.view.part = want
        return names.get(self.view.part, False)

    def fixed_walk(self, object on=None, object steps=None):
        """Whether the rows walk takes 8 rows through a tree without refills (walk.h
        sw_scwalk_fixed: the default where the rows walk applies) or refills a chain at each
        leaf (sw_scwalk_rows; tests score both, ``on`` sets it; ``steps``, 0 to 64, replaces
        every tree's untested steps, which change the speed only). What is in force; None
        where the rows walk does not apply."""
        cdef const int32_t[::1] steps_v
        if steps is not None and self.steps is not None:
            if not 0 <= steps <= 64:
                raise ValueError("steps must be 0 to 64")
            self.steps = np.full(self.view.n_trees, steps, dtype=np.int32)
            on = True if on is None else on
        if on is not None:
            self.view.steps = NULL
            if on and self.steps is not None:
                steps_v = self.steps
                self.view.steps = &steps_v[0]
        if not rows_walk(&self.view):
            return None
        return self.view.steps != NULL

    def rows_walk(self, object on=None):
        """Whether a deep forest's tasks walk each tree with 8 rows at once (the default
        where it applies: 8-byte compact nodes, no special nodes) or 16 trees a row (tests
        score both; ``on`` sets it). What is in force; None where it does not apply."""
        if on is not None:
            self.view.trees_walk = 0 if on else 1
        saved, self.view.trees_walk = self.view.trees_walk, 0
        applies = rows_walk(&self.view)
        self.view.trees_walk = saved
        return (not saved) if applies else None

    def pair_walk(self, object on=None):
        """Whether a padded model's walks take their doubled rows two at a time (walk.h
        sw_pair_*: the default where it applies, one summed value a leaf) or one at a time
        (tests score both; ``on`` sets it). What is set; None where it does not apply. Where
        another kernel is in force (the lanes, the leaf masks, QuickScorer, the oblivious
        kernel), the walks score only what it hands them: a block's last rows, the lazy
        modes' chunks."""
        if on is not None:
            self.view.pairs = 1 if on else 0
        if self.view.qnodes == NULL or self.view.pnodes == NULL or not one_sum(&self.view) \
                or sw_pair_f_for(self.view.depth) == NULL:
            return None
        return bool(self.view.pairs)

    @property
    def compact_node_bytes(self):
        """Bytes a node the compact walks read (8 or 16); None for a padded model or one with
        special nodes."""
        if self.view.qcnodes == NULL:
            return None
        return 8 if self.view.sqcnodes != NULL else 16

    def _check(self):
        """Every index the kernels follow stays inside its array (run once at load)."""
        a = self.arrays
        nf = self.view.n_features
        group = a["tree_group"]
        if group.max() >= self.view.n_outputs or group.min() < -1:
            raise ValueError("tree_group out of range")
        if (group < 0).any() and self.view.n_leaf_out != self.view.n_outputs:
            raise ValueError("vector leaves must have one value per output")
        n_leaves = a["leaves"].shape[0]
        if self.view.pnodes != NULL:
            keys = (a["pnodes"][:, 0] & 0xBFFFFFFF) >> 1
            if keys.size and keys.max() >= max(nf, 1):
                raise ValueError("a node reads a feature beyond n_features")
            if n_leaves != self.view.n_trees << self.view.depth:
                raise ValueError("padded leaf array has the wrong size")
            special = (a["pnodes"][:, 0] & 0x40000000) != 0
            if special.any():
                self._check_entries(a["pnodes"][special, 1], None, a["pnodes"][special, 0])
        else:
            cn = a["cnodes"]
            n = cn.shape[0]
            leaf = (cn[:, 0] & 0x80000000) != 0
            if (((cn[:, 0] & 0x3FFFFFFF) >> 1) >= max(nf, 1)).any():
                raise ValueError("a node reads a feature beyond n_features")
            if ((cn[:, 0] & 0xC0000000) == 0xC0000000).any():
                raise ValueError("a leaf marked as a special node")
            if (cn[~leaf, 2].astype(np.int64) + 1 >= n).any() or (cn[leaf, 3] >= n_leaves).any():
                raise ValueError("a node points outside the model")
            if (a["root"] >= n).any() or (a["root"] < 0).any():
                raise ValueError("a tree root points outside the model")
            if (cn[leaf, 2] != np.flatnonzero(leaf)).any():
                raise ValueError("a leaf does not point at itself")
            # no cycles: children always come after their parent in breadth-first order
            if (cn[~leaf, 2].astype(np.int64) <= np.flatnonzero(~leaf)).any():
                raise ValueError("a node points backwards")
            special = (cn[:, 0] & 0xC0000000) == 0x40000000
            if special.any():
                self._check_entries(cn[special, 1], cn[special, 3], cn[special, 0])

    def _check_entries(self, offsets, heads, keys):
        """Special nodes' entries lie whole inside cats (compact nodes: ``heads`` copied); with
        staged categories every entry has its feature's header (the index a row is staged to
        stays inside the entry's bits)."""
        if self.view.cats == NULL:
            raise ValueError("a special node in a model without cats")
        cats = self.arrays["cats"]
        off = offsets.astype(np.int64)
        if (off >= cats.shape[0]).any():
            raise ValueError("a special node's entry lies outside cats")
        head = cats[off].astype(np.int64)
        if heads is not None and (heads != cats[off]).any():
            raise ValueError("a special node's header differs from its entry's")
        n_bits = head & 0x1FFFFF
        end = np.where(head == 0x40000000, off + 3, off + 1 + (n_bits + 34) // 32)  # n + 3 bits
        if ((head & 0x40000000 != 0) & (head != 0x40000000)).any() \
                or ((head & 0x1FE00000) != 0).any() or (end > cats.shape[0]).any():
            raise ValueError("a special node's entry is malformed or outside cats")
        if self.view.n_cat_feat:
            want = np.full(self.view.n_features, -1, dtype=np.int64)
            want[self.arrays["cat_feat"]] = self.arrays["cat_head"]
            if (want[(keys.astype(np.int64) & 0x3FFFFFFF) >> 1] != head).any():
                raise ValueError("a special node's entry is not its staged feature's")

    @property
    def n_trees(self):
        return self.view.n_trees

    def raw(self, Columns cols, int n_threads=1, object out=None):
        """Raw scores (rows, n_outputs) float64: (base + trees in order) / divisor."""
        cdef int64_t n = cols.n_rows
        cdef int rc
        cdef double[:, ::1] res
        self.need_ready()
        if cols.n_features != self.view.n_features:
            raise ValueError(f"X has {cols.n_features} features, the model expects "
                             f"{self.view.n_features}")
        if out is None:
            out = np.empty((n, self.view.n_outputs), dtype=np.float64)
        res = out
        if n == 0:
            return out
        with nogil:
            if self.float32_acc:
                rc = score_all(&self.view, &self.leaves32[0, 0], &self.base32[0], self.divisor,
                               cols.cols, cols.direct, n, &res[0, 0], n_threads)
            else:
                rc = score_all(&self.view, &self.leaves64[0, 0], &self.base64[0], self.divisor,
                               cols.cols, cols.direct, n, &res[0, 0], n_threads)
        if rc != 0:
            raise MemoryError("could not allocate per-thread block buffers")
        return out

    def small(self, object X, int link):
        """Fast path for a few rows (single-row scoring): X a C-contiguous 2-D float32/float64
        numpy array (not a subclass) of at most BLOCK_ROWS rows. Returns raw scores (link
        LINK_NONE) or probabilities, or None when X does not fit this path (the caller then
        takes the general one). Holds the GIL (it uses this Forest's scratch buffers): at
        most one block of work."""
        cdef int32_t n, nf = self.view.n_features, G = self.view.n_outputs, r, j
        cdef const double* xd
        cdef const float* X32
        cdef int typ
        cdef cnp.npy_intp dims[2]
        cdef cnp.ndarray a, out
        self.need_ready()
        if type(X) is not cnp.ndarray:  # numpy rows only (a subclass: the general path)
            return None
        # numpy's own fields, read directly (the buffer protocol took ~0.1 us of a one-row
        # call: bench/one_row.py); the array is held by the caller throughout
        a = <cnp.ndarray>X
        typ = cnp.PyArray_TYPE(a)
        if (cnp.PyArray_NDIM(a) != 2 or cnp.PyArray_DIM(a, 1) != nf
                or cnp.PyArray_DIM(a, 0) > BLOCK_ROWS
                or (typ != cnp.NPY_FLOAT32 and typ != cnp.NPY_FLOAT64)
                or not cnp.PyArray_IS_C_CONTIGUOUS(a) or not cnp.PyArray_ISALIGNED(a)
                or not cnp.PyArray_ISNOTSWAPPED(a)):
            return None
        n = <int32_t>cnp.PyArray_DIM(a, 0)
        if typ == cnp.NPY_FLOAT32 and self.view.n_cat_feat == 0:
            X32 = <const float*>cnp.PyArray_DATA(a)
        else:
            if typ == cnp.NPY_FLOAT32:
                memcpy(self.scratch_x, cnp.PyArray_DATA(a), n * nf * sizeof(float))
            else:
                xd = <const double*>cnp.PyArray_DATA(a)
                for r in range(n * nf):
                    self.scratch_x[r] = <float>xd[r]
            sw_stage_cats(self.scratch_x, nf, n, self.view.cat_feat, self.view.cat_head,
                          self.view.n_cat_feat)
            X32 = self.scratch_x
        if self.float32_acc:
            eval_rows(&self.view, &self.leaves32[0, 0], &self.base32[0], self.divisor, X32,
                      n, <float*>self.scratch_acc, self.scratch_raw)
        else:
            eval_rows(&self.view, &self.leaves64[0, 0], &self.base64[0], self.divisor, X32,
                      n, self.scratch_acc, self.scratch_raw)
        # numpy's C API: a Python call to np.empty cost about a fifth of a one-row call
        # (bench/one_row.py)
        dims[0] = n
        dims[1] = 2 if link == LINK_SIGMOID or link == LINK_SIGMOID2 or link == LINK_VOTE1 \
            else G
        out = cnp.PyArray_EMPTY(2, dims, cnp.NPY_FLOAT64, 0)
        if n == 0:
            return out
        apply_link(self.scratch_raw, n, G, link, <double*>cnp.PyArray_DATA(out))
        return out


cdef inline double row_max(const double* x, int32_t G) noexcept nogil:
    """The largest of a row's G raw scores (the softmaxes' shift)."""
    cdef double mx = x[0]
    cdef int32_t g
    for g in range(1, G):
        if x[g] > mx:
            mx = x[g]
    return mx


cdef void apply_link(const double* raw, int64_t n, int32_t G, int link,
                     double* out) noexcept nogil:
    """Probabilities from raw scores, with libm exp: one implementation for every batch size,
    so a row's probability never depends on how many rows came with it."""
    cdef int64_t r
    cdef int32_t g
    cdef double p, mx, s, e
    if link == LINK_SIGMOID or link == LINK_SIGMOID2 or link == LINK_VOTE1:
        for r in range(n):
            if link == LINK_SIGMOID:
                p = 1.0 / (1.0 + exp(-raw[r * G]))
            elif link == LINK_SIGMOID2:
                p = 1.0 / (1.0 + exp(-2.0 * raw[r * G]))
            else:
                p = raw[r * G]
            out[2 * r] = 1.0 - p
            out[2 * r + 1] = p
    elif link == LINK_SOFTMAX:
        for r in range(n):
            mx = row_max(raw + r * G, G)
            s = 0.0
            for g in range(G):
                out[r * G + g] = exp(raw[r * G + g] - mx)
                s += out[r * G + g]
            for g in range(G):
                out[r * G + g] /= s
    elif link == LINK_SOFTMAX_ZERO:
        for r in range(n):
            mx = row_max(raw + r * G, G)
            e = exp(-mx)
            s = 0.0
            for g in range(G):
                p = raw[r * G + g]
                if p > SOFTMAX_ZERO_BAND or p < -SOFTMAX_ZERO_BAND:
                    out[r * G + g] = exp(p - mx)
                    s += out[r * G + g]
                else:
                    out[r * G + g] = p * e
            for g in range(G):
                out[r * G + g] /= s
    else:
        for r in range(n * G):
            out[r] = raw[r]


# ONNX Runtime's band around 0 for SOFTMAX_ZERO: the float 1e-7f (raw scores of its models are
# float32 values, so comparing them in double answers as its float compare does)
cdef double SOFTMAX_ZERO_BAND = <double><float>1e-7


cdef enum:
    LINK_TASK_ROWS = 8192  # rows a thread links at a time (link_proba)


def link_proba(const double[:, ::1] raw, int link, int n_threads=1):
    """(n, n_classes) probabilities from (n, n_outputs) raw scores (see LINK_*); batches of
    more than LINK_TASK_ROWS rows across n_threads threads (a row's value is the same)."""
    cdef int64_t n = raw.shape[0], t, n_tasks, r0
    cdef int32_t G = <int32_t>raw.shape[1]
    cdef int32_t C = 2 if link in (LINK_SIGMOID, LINK_SIGMOID2, LINK_VOTE1) else G
    cdef double[:, ::1] res
    out = _empty((n, C), dtype=_float64)
    res = out
    if n == 0:
        return out
    n_tasks = (n + LINK_TASK_ROWS - 1) // LINK_TASK_ROWS
    with nogil:
        if n_threads <= 1 or n_tasks <= 1:
            apply_link(&raw[0, 0], n, G, link, &res[0, 0])
        else:
            for t in prange(n_tasks, schedule="dynamic", num_threads=n_threads):
                r0 = t * LINK_TASK_ROWS
                apply_link(&raw[0, 0] + r0 * G, min(<int64_t>LINK_TASK_ROWS, n - r0), G, link,
                           &res[0, 0] + r0 * C)
    return out
