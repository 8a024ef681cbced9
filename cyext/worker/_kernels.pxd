# What worker._kernels shares with the other kernel modules (lazy, timing): its extension
# types and the block functions, cimported as `from worker._kernels cimport ...`. (Cython finds
# a module's .pxd by its full name, hence this folder.) The block functions are ordinary
# functions of _kernels, called directly there (compiled as they always were) and through
# Cython's function table from the other modules, once per block (bench/NOTES.md).
from libc.stdint cimport int32_t, int64_t

from swtypes cimport ModelView, Column
from blocks cimport acc_t, RowPlan


cdef class Columns:
    """Column descriptors over numpy or Arrow memory; keeps every owner alive while it lives."""
    cdef Column* cols              # one descriptor per feature (malloc'd, owned)
    cdef readonly int32_t n_features
    cdef readonly int64_t n_rows
    cdef const float* direct       # row-major float32 rows usable without staging, or NULL
    cdef list _owners              # the numpy arrays / Arrow arrays the pointers point into

    cdef int _alloc(self, int32_t nf) except -1


cdef class Forest:
    """Packed model arrays and the view the kernels read. The arrays are owned here, and must
    not change after __init__: the kernels' tables (QuickScorer's, the oblivious kernel's
    halves and bins, the lanes and leaf-mask kernels') are made from them once."""
    cdef ModelView view            # borrowed pointers into `arrays`
    cdef readonly dict arrays
    cdef object qnodes             # pnodes / cnodes with order-key thresholds (ModelView)
    cdef object sqnodes            # qnodes of a compact model in 8 bytes a node, or None
    cdef object steps              # walk_steps of sqnodes (ModelView.steps), or None
    cdef int64_t part_largest      # the largest tree's nodes (ModelView.part_nodes), or 0
    cdef void* qs_tables           # qs.h sw_qs over arrays in qs_arrays (malloc'd), or NULL
    cdef dict qs_arrays            # worker/model/quickscorer.py tables ({} without); not
                                   # visible from Python: qs_tables points into them
    cdef void* obl_tables          # oblivious.h sw_obl over obl_arrays (malloc'd), or NULL
    cdef dict obl_arrays           # each tree's per-level column and threshold, the derived
                                   # columns' splits, the halves and the bins' tables ({}
                                   # without); not visible from Python
    cdef void* lanes_tables        # lanes.h sw_lanes over lanes_arrays (malloc'd), or NULL
    cdef dict lanes_arrays         # each tree's column offsets, threshold keys and leaves in
                                   # 32 entries ({} without); not visible from Python
    cdef void* masks_tables        # masks.h sw_masks over masks_arrays (malloc'd), or NULL
    cdef dict masks_arrays         # the splits' entries, each tree's list offsets and 64
                                   # leaves ({} without); not visible from Python
    cdef readonly str kernel       # "walk", "quickscorer", "oblivious", "lanes" or "masks"
    cdef readonly str kernel_reason  # why the other kernel was not taken
    cdef readonly dict kernel_timings  # auto: us per probe row of each candidate
    cdef readonly bint float32_acc  # leaves and base are float32 (XGBoost) or float64
    cdef readonly double divisor
    cdef readonly str aggregate    # "sum", or "min" / "max" (ModelView.agg)
    cdef const float[:, ::1] leaves32
    cdef const double[:, ::1] leaves64
    cdef const float[::1] base32
    cdef const double[::1] base64
    cdef float* scratch_x          # small(): staged float32 rows (BLOCK_ROWS x n_features)
    cdef double* scratch_acc       # small(): accumulators (either precision fits)
    cdef double* scratch_raw       # small(): raw scores
    cdef readonly bint ready       # __init__ finished: a Forest whose __init__ raised scores
                                   # nothing (its view may be half made)

    cdef int need_ready(self) except -1  # ValueError unless ready (every scoring entry)


# trees t0..t1 over a block of staged rows (bodies and docstrings in kernels.pyx)
cdef int32_t plan_rows(const ModelView* m, const float* X, int64_t ldx, int32_t n, float* xx,
                       int32_t xx_cap, RowPlan* plan) noexcept nogil
cdef int64_t eval_planned(const ModelView* m, const acc_t* leaves, const RowPlan* plan,
                          int32_t n, int64_t t0, int64_t t1, acc_t* acc) noexcept nogil
cdef void eval_trees(const ModelView* m, const acc_t* leaves, const float* X, int64_t ldx,
                     int32_t n, int64_t t0, int64_t t1, acc_t* acc) noexcept nogil
cdef void eval_rest(const ModelView* m, const acc_t* leaves, const float* X, int64_t ldx,
                    int32_t n, int64_t t0, int64_t t1, acc_t* acc, float* xx=*,
                    int32_t xx_cap=*) noexcept nogil
cdef void eval_rows(const ModelView* m, const acc_t* leaves, const acc_t* base,
                    double divisor, const float* X, int32_t n, acc_t* acc,
                    double* raw, RowPlan* plan=*, float* xx=*, int32_t xx_cap=*) noexcept nogil
