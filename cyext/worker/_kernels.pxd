# The extension types of worker._kernels, for the other kernel modules (lazy, timing) to
# cimport: `from worker._kernels cimport Columns, Forest`. (Cython finds a module's .pxd by
# its full name, hence this folder.)
from libc.stdint cimport int32_t, int64_t

from swtypes cimport ModelView, Column


cdef class Columns:
    """Column descriptors over numpy or Arrow memory; keeps every owner alive while it lives."""
    cdef Column* cols              # one descriptor per feature (malloc'd, owned)
    cdef readonly int32_t n_features
    cdef readonly int64_t n_rows
    cdef const float* direct       # row-major float32 rows usable without staging, or NULL
    cdef list _owners              # the numpy arrays / Arrow arrays the pointers point into

    cdef int _alloc(self, int32_t nf) except -1


cdef class Forest:
    """Packed model arrays and the view the kernels read. The arrays are owned here."""
    cdef ModelView view            # borrowed pointers into `arrays`
    cdef readonly dict arrays
    cdef readonly bint float32_acc  # leaves and base are float32 (XGBoost) or float64
    cdef readonly double divisor
    cdef const float[:, ::1] leaves32
    cdef const double[:, ::1] leaves64
    cdef const float[::1] base32
    cdef const double[::1] base64
    cdef float* scratch_x          # small(): staged float32 rows (BLOCK_ROWS x n_features)
    cdef double* scratch_acc       # small(): accumulators (either precision fits)
    cdef double* scratch_raw       # small(): raw scores
