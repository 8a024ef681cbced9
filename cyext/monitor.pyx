# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: language_level=3
"""Flight monitoring's counts (issue 51): each feature's reference bin, missing values and
values outside the reference range, read from the rows as the kernels stage them (a row
block read where it lies, anything else staged a block at a time by the kernels' own
stager), in one pass without Python per row."""

from libc.stdint cimport int32_t, int64_t
from libc.math cimport NAN
from libc.stdlib cimport calloc, malloc, free
from libc.string cimport memcpy, memset

from swtypes cimport Column
from stage cimport stage_block
from worker._kernels cimport Columns

cdef enum:
    BLOCK = 256       # rows staged at a time (where the rows are not a row block already)
MAX_EDGES = 255       # a feature's bin edges at most (bins: edges + 1)
EXTRA = 3             # after a feature's bins: missing, below the minimum, above the maximum


cdef extern from "monitor.h" nogil:
    enum:
        SW_MON_LANES
        SW_MON_EDGES
    void sw_mon_count(const float* X, int64_t n, int64_t nfp, const float* et, int64_t k0,
                      const float* lo, const float* hi, int32_t* ge, int32_t* miss,
                      int32_t* below, int32_t* above)


cdef inline void _flush(int64_t n, int32_t nf, int64_t nfp, const int32_t* n_edges,
                        int32_t* ge, int32_t* miss, int64_t kpad, int64_t* counts,
                        int64_t stride) noexcept nogil:
    """A block's counters into counts (bins from the >= counts: edges ascend, so bin k
    holds the values >= edge k-1 and not >= edge k), then zeroed."""
    cdef int32_t j
    cdef int64_t k, m, prev
    cdef int64_t* c
    for j in range(nf):
        c = counts + j * stride
        m = n_edges[j]
        prev = n - miss[j]
        for k in range(m):
            c[k] += prev - ge[k * nfp + j]
            prev = ge[k * nfp + j]
        c[m] += prev
        c[m + 1] += miss[j]
        c[m + 2] += miss[nfp + j]
        c[m + 3] += miss[2 * nfp + j]
    memset(ge, 0, (kpad + 3) * nfp * sizeof(int32_t))


def count_bins(Columns cols, const float[:, ::1] edges, const int32_t[::1] n_edges,
               const float[::1] lo, const float[::1] hi, int64_t[:, ::1] counts):
    """Add each row of ``cols`` to ``counts``: feature j's row holds its bins 0..m (m =
    ``n_edges[j]``: the bin of v is how many of ``edges[j, :m]`` are <= v), then its missing
    values (NaN, nulls), then values below ``lo[j]`` and above ``hi[j]`` (both counted in
    their bins too). Every shape is checked before anything is read or allocated."""
    cdef int32_t nf = cols.n_features, j
    cdef int64_t n = cols.n_rows, r0, nb, r, k, k0
    cdef int64_t width = edges.shape[1], stride = counts.shape[1]
    if edges.shape[0] != nf or n_edges.shape[0] != nf or lo.shape[0] != nf or \
            hi.shape[0] != nf or counts.shape[0] != nf:
        raise ValueError(f"one row of edges, n_edges, lo, hi and counts a feature ({nf})")
    if width > MAX_EDGES:
        raise ValueError(f"at most {MAX_EDGES} edges a feature")
    for j in range(nf):
        if n_edges[j] < 0 or n_edges[j] > width or n_edges[j] + 1 + EXTRA > stride:
            raise ValueError(f"feature {j}: {n_edges[j]} edges, {width} stored, "
                             f"{stride} counts")
    if n == 0 or nf == 0:
        return
    # features padded to whole vector chunks (NaN: never >= an edge, their counts unread),
    # edges to whole passes; nf < 2^29 (a model's bound) keeps every product in 64 bits
    cdef int64_t nfp = (nf + SW_MON_LANES - 1) // SW_MON_LANES * SW_MON_LANES
    cdef int64_t kpad = max((width + SW_MON_EDGES - 1) // SW_MON_EDGES, 1) * SW_MON_EDGES
    cdef bint padded = cols.direct == NULL or nfp != nf
    cdef float* et = <float*>malloc(<size_t>kpad * <size_t>nfp * sizeof(float))
    cdef float* lo_p = <float*>malloc(2 * <size_t>nfp * sizeof(float))
    cdef int32_t* ge = <int32_t*>calloc(<size_t>(kpad + 3) * <size_t>nfp, sizeof(int32_t))
    cdef float* stagebuf = <float*>malloc(<size_t>BLOCK * <size_t>nf * sizeof(float)) \
        if cols.direct == NULL else NULL
    cdef float* rows = <float*>malloc(<size_t>BLOCK * <size_t>nfp * sizeof(float)) \
        if padded else NULL
    cdef const float* X
    if et == NULL or lo_p == NULL or ge == NULL or (cols.direct == NULL and
                                                    stagebuf == NULL) or \
            (padded and rows == NULL):
        free(et)
        free(lo_p)
        free(ge)
        free(stagebuf)
        free(rows)
        raise MemoryError()
    for k in range(kpad):
        for j in range(nfp):
            et[k * nfp + j] = edges[j, k] if j < nf and k < n_edges[j] else NAN
    for j in range(nfp):
        lo_p[j] = lo[j] if j < nf else NAN
        lo_p[nfp + j] = hi[j] if j < nf else NAN
    try:
        with nogil:
            if padded:
                for r in range(BLOCK * nfp):
                    rows[r] = NAN
            r0 = 0
            while r0 < n:
                nb = n - r0 if n - r0 < BLOCK else BLOCK
                if cols.direct != NULL:
                    X = cols.direct + r0 * nf
                else:
                    stage_block(cols.cols, nf, r0, nb, stagebuf)
                    X = stagebuf
                if padded:
                    for r in range(nb):
                        memcpy(rows + r * nfp, X + r * nf, nf * sizeof(float))
                    X = rows
                k0 = 0
                while k0 < kpad:
                    sw_mon_count(X, nb, nfp, et, k0, lo_p, lo_p + nfp, ge, ge + kpad * nfp,
                                 ge + (kpad + 1) * nfp, ge + (kpad + 2) * nfp)
                    k0 += SW_MON_EDGES
                _flush(nb, nf, nfp, &n_edges[0], ge, ge + kpad * nfp, kpad, &counts[0, 0],
                       stride)
                r0 += nb
    finally:
        free(et)
        free(lo_p)
        free(ge)
        free(stagebuf)
        free(rows)


def stage(Columns cols):
    """Every row of ``cols`` as the kernels stage it: (rows, features) float32, C order,
    missing values NaN (the reference profile is built from these values)."""
    import numpy as np
    cdef int64_t n = cols.n_rows
    cdef int32_t nf = cols.n_features
    out = np.empty((n, nf), np.float32)
    cdef float[:, ::1] o = out
    if n == 0 or nf == 0:
        return out
    with nogil:
        stage_block(cols.cols, nf, 0, n, &o[0, 0])
    return out
