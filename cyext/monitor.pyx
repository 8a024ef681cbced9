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

import numpy as np

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


cdef class Plan:
    """A reference profile laid out for the counter once: each feature's edges transposed
    and padded to whole vector chunks and passes (NaN: never >= a value), its range, the
    score's edges. Read-only after it is built: threads may count with one plan at once."""

    cdef float* et                 # edges transposed: kpad rows of nfp features
    cdef float* lohi               # lo then hi, nfp each (NaN past the features)
    cdef int32_t* n_edges          # each feature's edges
    cdef double* sedges            # the score's edges
    cdef readonly int32_t nf
    cdef readonly int64_t nfp, kpad, width, stride, n_score_edges

    def __cinit__(self, const float[:, ::1] edges, const int32_t[::1] n_edges,
                  const float[::1] lo, const float[::1] hi, const double[::1] score_edges,
                  int64_t stride):
        cdef int64_t j, k
        self.et = self.lohi = NULL
        self.n_edges = NULL
        self.sedges = NULL
        if edges.shape[0] > 2**29:
            raise ValueError("more features than a model has")
        self.nf = <int32_t>edges.shape[0]
        self.width = edges.shape[1]
        self.stride = stride
        if n_edges.shape[0] != self.nf or lo.shape[0] != self.nf or hi.shape[0] != self.nf:
            raise ValueError(f"one row of edges, n_edges, lo and hi a feature ({self.nf})")
        if self.width > MAX_EDGES:
            raise ValueError(f"at most {MAX_EDGES} edges a feature")
        for j in range(self.nf):
            if n_edges[j] < 0 or n_edges[j] > self.width or n_edges[j] + 1 + EXTRA > stride:
                raise ValueError(f"feature {j}: {n_edges[j]} edges, {self.width} stored, "
                                 f"{stride} counts")
        if score_edges.shape[0] > MAX_EDGES:
            raise ValueError(f"at most {MAX_EDGES} score edges")
        # nf < 2^29 (a model's bound) keeps every product below in 64 bits
        self.nfp = (self.nf + SW_MON_LANES - 1) // SW_MON_LANES * SW_MON_LANES
        self.kpad = max((self.width + SW_MON_EDGES - 1) // SW_MON_EDGES, 1) * SW_MON_EDGES
        self.n_score_edges = score_edges.shape[0]
        self.et = <float*>malloc(<size_t>self.kpad * <size_t>self.nfp * sizeof(float))
        self.lohi = <float*>malloc(2 * <size_t>self.nfp * sizeof(float))
        self.n_edges = <int32_t*>malloc(max(self.nf, 1) * sizeof(int32_t))
        self.sedges = <double*>malloc(max(self.n_score_edges, 1) * sizeof(double))
        if self.et == NULL or self.lohi == NULL or self.n_edges == NULL or \
                self.sedges == NULL:
            raise MemoryError()
        for k in range(self.kpad):
            for j in range(self.nfp):
                self.et[k * self.nfp + j] = edges[j, k] \
                    if j < self.nf and k < n_edges[j] else NAN
        for j in range(self.nfp):
            self.lohi[j] = lo[j] if j < self.nf else NAN
            self.lohi[self.nfp + j] = hi[j] if j < self.nf else NAN
        for j in range(self.nf):
            self.n_edges[j] = n_edges[j]
        for j in range(self.n_score_edges):
            self.sedges[j] = score_edges[j]

    def __dealloc__(self):
        free(self.et)
        free(self.lohi)
        free(self.n_edges)
        free(self.sedges)

    def count(self, X, int64_t[:, ::1] counts, score=None, score_counts=None):
        """Add each row of ``X`` (column descriptors, or a C-contiguous float32 row block
        read where it lies) to ``counts`` (features x stride): feature j's row holds its
        bins 0..m (the bin of v: how many of its m edges are <= v), then its missing values
        (NaN, nulls), then values below its minimum and above its maximum (counted in their
        bins too); and each ``score`` (float64) to ``score_counts``. Every shape is checked
        before anything is read or allocated."""
        cdef Columns cols = None
        cdef const float[:, ::1] block
        cdef const double[::1] sc
        cdef int64_t[::1] scc
        cdef const float* direct = NULL
        cdef int32_t nf = self.nf
        cdef int64_t n, r0, nb, r, k0, nd, i, k, b, m
        cdef int64_t nfp = self.nfp, kpad = self.kpad
        cdef double v
        if isinstance(X, Columns):
            cols = X
            if cols.n_features != nf:
                raise ValueError(f"{cols.n_features} features, the plan {nf}")
            n, direct = cols.n_rows, cols.direct
        else:
            block = X  # a float32 C-contiguous 2-D array, else a TypeError or ValueError
            if block.shape[1] != nf:
                raise ValueError(f"{block.shape[1]} features, the plan {nf}")
            n = block.shape[0]
            if n and nf:
                direct = &block[0, 0]
        if counts.shape[0] != nf or counts.shape[1] != self.stride:
            raise ValueError(f"counts of shape ({counts.shape[0]}, {counts.shape[1]}), the "
                             f"plan's ({nf}, {self.stride})")
        if score is not None:
            sc = score
            scc = score_counts
            if scc.shape[0] != self.n_score_edges + 1:
                raise ValueError(f"{scc.shape[0]} score bins for {self.n_score_edges} edges")
            m = self.n_score_edges
            with nogil:
                for i in range(sc.shape[0]):
                    v = sc[i]
                    if v != v:  # NaN last, as numpy's searchsorted puts it
                        scc[m] += 1
                        continue
                    b = 0
                    for k in range(m):
                        b += v >= self.sedges[k]
                    scc[b] += 1
        if n == 0 or nf == 0:
            return
        # rows are read where they lie (a row block) or where staged, SW_MON_LANES values
        # from each chunk's start: a staged block's last rows read into a slack after it
        # (zeroed: the lanes past the features are never read back); the array's last rows,
        # whose last chunk would read past its end, are copied to a padded buffer (at most
        # nfp / nf + 1 of them)
        # (cdivision: // truncates toward zero, so a negative numerator is kept out of it;
        # review: n * nf just under nfp gave safe 1, and a one-row block's last chunk read
        # up to 60 bytes past the array)
        cdef int64_t safe = n if direct == NULL else \
            0 if n * nf < nfp else (n * nf - nfp) // nf + 1
        cdef int64_t ncopy = min(n - safe, <int64_t>BLOCK)
        cdef int32_t* ge = <int32_t*>calloc(<size_t>(kpad + 3) * <size_t>nfp,
                                            sizeof(int32_t))
        cdef float* stagebuf = <float*>calloc(<size_t>BLOCK * <size_t>nf + <size_t>nfp,
                                              sizeof(float)) if direct == NULL else NULL
        cdef float* rows = <float*>malloc(<size_t>ncopy * <size_t>nfp * sizeof(float)) \
            if safe < n else NULL
        cdef const float* Xp
        if ge == NULL or (direct == NULL and stagebuf == NULL) or (safe < n and rows == NULL):
            free(ge)
            free(stagebuf)
            free(rows)
            raise MemoryError()
        try:
            with nogil:
                if rows != NULL:
                    for r in range(ncopy * nfp):
                        rows[r] = NAN
                r0 = 0
                while r0 < n:
                    nb = n - r0 if n - r0 < BLOCK else BLOCK
                    if direct != NULL:
                        Xp = direct + r0 * nf
                        nd = min(nb, max(safe - r0, <int64_t>0))  # read where they lie
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
                            sw_mon_count(Xp, nd, nf, nfp, self.et, k0, self.lohi,
                                         self.lohi + nfp, ge, ge + kpad * nfp,
                                         ge + (kpad + 1) * nfp, ge + (kpad + 2) * nfp)
                        if nd < nb:
                            sw_mon_count(rows, nb - nd, nfp, nfp, self.et, k0, self.lohi,
                                         self.lohi + nfp, ge, ge + kpad * nfp,
                                         ge + (kpad + 1) * nfp, ge + (kpad + 2) * nfp)
                        k0 += SW_MON_EDGES
                    _flush(nb, nf, nfp, self.n_edges, ge, ge + kpad * nfp, kpad,
                           &counts[0, 0], self.stride)
                    r0 += nb
        finally:
            free(ge)
            free(stagebuf)
            free(rows)


def count_bins(X, const float[:, ::1] edges, const int32_t[::1] n_edges,
               const float[::1] lo, const float[::1] hi, int64_t[:, ::1] counts):
    """``Plan(edges, n_edges, lo, hi, no score edges, counts' width).count(X, counts)``."""
    Plan(edges, n_edges, lo, hi, np.zeros(0), counts.shape[1]).count(X, counts)


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
