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
    void sw_mon_count(const float* X, int64_t n, int64_t rstride, int64_t nfp, const float* et,
                      int64_t k0,
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


def count_bins(X, const float[:, ::1] edges, const int32_t[::1] n_edges,
               const float[::1] lo, const float[::1] hi, int64_t[:, ::1] counts):
    """Add each row of ``X`` (column descriptors, or a C-contiguous float32 row block read
    where it lies) to ``counts``: feature j's row holds its bins 0..m (m = ``n_edges[j]``:
    the bin of v is how many of ``edges[j, :m]`` are <= v), then its missing values (NaN,
    nulls), then values below ``lo[j]`` and above ``hi[j]`` (both counted in their bins
    too). Every shape is checked before anything is read or allocated."""
    cdef Columns cols = None
    cdef const float[:, ::1] block
    cdef const float* direct = NULL
    cdef int32_t nf, j
    cdef int64_t n, r0, nb, r, k, k0
    cdef int64_t width = edges.shape[1], stride = counts.shape[1]
    if isinstance(X, Columns):
        cols = X
        nf, n, direct = cols.n_features, cols.n_rows, cols.direct
    else:
        block = X  # a float32 C-contiguous 2-D array, else a TypeError or ValueError here
        if block.shape[1] > 2**29:
            raise ValueError("more features than a model has")
        n, nf = block.shape[0], <int32_t>block.shape[1]
        if n and nf:
            direct = &block[0, 0]
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
    # rows are read where they lie (a row block) or where staged, SW_MON_LANES values from
    # each chunk's start: a direct row whose last chunk would read past the array, and the
    # staged block's last rows, read a slack after them (NaN); the last direct rows are
    # copied to a padded buffer (at most nfp / nf + 1 of them)
    cdef int64_t safe = n if direct == NULL else \
        max(<int64_t>0, (n * nf - nfp) // nf + 1)
    cdef float* et = <float*>malloc(<size_t>kpad * <size_t>nfp * sizeof(float))
    cdef float* lo_p = <float*>malloc(2 * <size_t>nfp * sizeof(float))
    cdef int32_t* ge = <int32_t*>calloc(<size_t>(kpad + 3) * <size_t>nfp, sizeof(int32_t))
    cdef float* stagebuf = <float*>malloc((<size_t>BLOCK * <size_t>nf + <size_t>nfp) *
                                          sizeof(float)) if direct == NULL else NULL
    cdef float* rows = <float*>malloc(<size_t>BLOCK * <size_t>nfp * sizeof(float)) \
        if safe < n else NULL
    cdef const float* Xp
    cdef int64_t nd
    if et == NULL or lo_p == NULL or ge == NULL or (direct == NULL and
                                                    stagebuf == NULL) or \
            (safe < n and rows == NULL):
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
            if stagebuf != NULL:
                for r in range(nfp):
                    stagebuf[BLOCK * <int64_t>nf + r] = NAN
            if rows != NULL:
                for r in range(BLOCK * nfp):
                    rows[r] = NAN
            r0 = 0
            while r0 < n:
                nb = n - r0 if n - r0 < BLOCK else BLOCK
                if direct != NULL:
                    Xp = direct + r0 * nf
                    nd = min(nb, max(safe - r0, <int64_t>0))  # rows read where they lie
                else:
                    stage_block(cols.cols, nf, r0, nb, stagebuf)
                    Xp = stagebuf
                    nd = nb
                if nd < nb:  # the array's last rows: copied, padded
                    for r in range(nd, nb):
                        memcpy(rows + (r - nd) * nfp, Xp + r * nf, nf * sizeof(float))
                k0 = 0
                while k0 < kpad:
                    if nd:
                        sw_mon_count(Xp, nd, nf, nfp, et, k0, lo_p, lo_p + nfp, ge,
                                     ge + kpad * nfp, ge + (kpad + 1) * nfp,
                                     ge + (kpad + 2) * nfp)
                    if nd < nb:
                        sw_mon_count(rows, nb - nd, nfp, nfp, et, k0, lo_p, lo_p + nfp, ge,
                                     ge + kpad * nfp, ge + (kpad + 1) * nfp,
                                     ge + (kpad + 2) * nfp)
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


def count_scores(const double[::1] score, const double[::1] edges, int64_t[::1] counts):
    """Add each score's bin to ``counts`` (how many of ``edges``, ascending, are <= it; a
    NaN score in the last bin, as numpy's searchsorted puts it)."""
    cdef int64_t n = score.shape[0], m = edges.shape[0], i, k, b
    cdef double v
    if counts.shape[0] != m + 1:
        raise ValueError(f"{counts.shape[0]} score bins for {m} edges")
    with nogil:
        for i in range(n):
            v = score[i]
            if v != v:
                counts[m] += 1
                continue
            b = 0
            for k in range(m):
                b += v >= edges[k]
            counts[b] += 1


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
