# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: language_level=3
"""Flight monitoring's counts (issue 51): each feature's reference bin, missing values and
values outside the reference range, read from the rows as the kernels stage them (a row
block read where it lies, anything else staged a block at a time by the kernels' own
stager), in one pass without Python per row."""

from libc.stdint cimport int32_t, int64_t
from libc.math cimport NAN
from libc.stdlib cimport calloc, malloc, free
from libc.string cimport memcmp, memcpy, memset
from cpython.pythread cimport (PyThread_type_lock, PyThread_allocate_lock, PyThread_free_lock,
                               PyThread_acquire_lock, PyThread_release_lock,
                               PyThread_get_thread_ident, NOWAIT_LOCK, WAIT_LOCK)
from cpython.buffer cimport (PyObject_GetBuffer, PyBuffer_Release, PyBUF_C_CONTIGUOUS,
                             PyBUF_FORMAT, PyBUF_WRITABLE)

from swtypes cimport Column
from stage cimport stage_block
from worker._kernels cimport Columns

import numpy as np
cimport numpy as cnp

cnp.import_array()

cdef enum:
    BLOCK = 256       # rows staged at a time (where the rows are not a row block already)
    STACK_GE = 4096   # the block's counters on the stack up to this many (16 KiB)
    STACK_ROWS = 1024  # padded copies of an array's last rows on the stack up to this many
    SMALL = 4         # rows of a row block a Counter keeps to count later (PENDING), at most
    PENDING = 64      # rows a Counter keeps before it counts them
    FEW_FEATURES = 2048  # features, at most, of a Counter that keeps rows
    MAX_EDGES = 255   # a feature's (and the score's) bin edges at most (bins: edges + 1)
EXTRA = 3             # after a feature's bins: missing, below the minimum, above the maximum


cdef extern from "monitor.h" nogil:
    enum:
        SW_MON_LANES
        SW_MON_EDGES
    void sw_mon_count(const float* X, int64_t n, int64_t rstride, int64_t nfp, const float* et,
                      int64_t k0,
                      const float* lo, const float* hi, int32_t* ge, int32_t* miss,
                      int32_t* below, int32_t* above)
    void sw_mon_score_ge(const double* sc, int64_t n, const double* edges, int64_t m,
                         int64_t* ge, int64_t* nan)
    void sw_mon_missing(const float* X, int64_t n, int64_t nf, int64_t* miss)


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


cdef inline void _score_bins(const double* sc, int64_t n, const double* edges, int64_t m,
                             int64_t* counts) noexcept nogil:
    """Each score's bin (how many of the m <= MAX_EDGES ascending edges are <= it; NaN last,
    as numpy's searchsorted puts it) counted: past a few scores, from the counts of scores
    >= each edge (sw_mon_score_ge), as _flush makes a feature's bins."""
    cdef int64_t i, k, b, nan = 0, prev
    cdef int64_t ge[MAX_EDGES]
    cdef double v
    if n >= 16:
        memset(ge, 0, m * sizeof(int64_t))
        sw_mon_score_ge(sc, n, edges, m, ge, &nan)
        prev = n - nan
        for k in range(m):
            counts[k] += prev - ge[k]
            prev = ge[k]
        counts[m] += prev + nan
        return
    for i in range(n):
        v = sc[i]
        if v != v:
            counts[m] += 1
            continue
        b = 0
        for k in range(m):
            b += v >= edges[k]
        counts[b] += 1


cdef class Plan:
    """A reference profile laid out for the counter once: each feature's edges transposed
    and padded to whole vector chunks and passes (NaN: never >= a value), its range, the
    score's edges. Read-only after it is built: threads may count with one plan at once, each
    into counts of its own."""

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
        if stride < 1 + EXTRA:
            raise ValueError(f"{stride} counts a feature: at least {1 + EXTRA}")
        for j in range(self.nf):  # (a bin is the count of edges <= a value: ascending)
            for k in range(n_edges[j]):
                if edges[j, k] != edges[j, k] or k and edges[j, k] < edges[j, k - 1]:
                    raise ValueError(f"feature {j}: its edges must ascend, without NaN")
        if score_edges.shape[0] > MAX_EDGES:
            raise ValueError(f"at most {MAX_EDGES} score edges")
        for k in range(score_edges.shape[0]):
            if score_edges[k] != score_edges[k] or k and score_edges[k] < score_edges[k - 1]:
                raise ValueError("the score's edges must ascend, without NaN")
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

    def count(self, X, counts, score=None, score_counts=None):
        """Add each row of ``X`` (column descriptors, a C-contiguous float32 row block read
        where it lies, or any 2-D numeric array, staged) to ``counts`` (int64, features x
        stride, C order): feature j's row holds its bins 0..m (the bin of v: how many of its
        m edges are <= v), then its missing values (NaN, nulls), then values below its
        minimum and above its maximum (counted in their bins too); and each ``score`` (one
        a row; float64, else converted) to ``score_counts`` (int64). Every shape is checked
        before anything is read or counted."""
        cdef Py_buffer cb, scb
        cdef bint have_c = False, have_sc = False
        try:
            _int64_c(counts, &cb, "counts")
            have_c = True
            if cb.ndim != 2 or cb.shape[0] != self.nf or cb.shape[1] != self.stride:
                raise ValueError(f"counts of shape {tuple(cb.shape[i] for i in range(cb.ndim))}, the plan's "
                                 f"({self.nf}, {self.stride})")
            if score is not None:
                _int64_c(score_counts, &scb, "score_counts")
                have_sc = True
                if scb.ndim != 1 or scb.shape[0] != self.n_score_edges + 1:
                    raise ValueError(f"score_counts of shape {tuple(scb.shape[i] for i in range(scb.ndim))} for "
                                     f"{self.n_score_edges} score edges")
            self._add(X, score, <int64_t*>cb.buf,
                      <int64_t*>scb.buf if have_sc else NULL)
        finally:
            if have_c:
                PyBuffer_Release(&cb)
            if have_sc:
                PyBuffer_Release(&scb)

    cdef int _add(self, object X, object score, int64_t* counts, int64_t* scc) except -1:
        """``count`` into counters whose shapes are checked (``scc``: NULL, or the score's
        bins, n_score_edges + 1). Arrays are read through the buffer protocol (a typed
        memoryview costs ~0.1-0.2 us each: at one row, more than the count)."""
        cdef Py_buffer xb, sb
        cdef bint have_x = False, have_s = False
        cdef Columns cols = None
        cdef const float* direct = NULL
        cdef int64_t n = 0, ns = 0
        try:
            if isinstance(X, Columns):
                cols = X
            elif _row_block(X, &xb, self.nf):
                have_x = True
                n = xb.shape[0]
                direct = <const float*>xb.buf
            else:  # anything else numpy reads: staged as the kernels stage it
                cols = Columns.from_numpy(X)
            if cols is not None:
                if cols.n_features != self.nf:
                    raise ValueError(f"{cols.n_features} features, the plan {self.nf}")
                n, direct = cols.n_rows, cols.direct
            if scc != NULL:
                have_s = _buffer(score, &sb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
                if have_s and not _is(&sb, b"d", 8, 1):
                    PyBuffer_Release(&sb)
                    have_s = False
                if not have_s:  # another numeric dtype or layout: converted
                    score = _score_array(score)
                    PyObject_GetBuffer(score, &sb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
                    have_s = True
                ns = sb.shape[0]
                if ns != n:
                    raise ValueError(f"{ns} scores for {n} rows")
                if ns > 64:  # releasing the GIL costs more than a few scores' bins
                    with nogil:
                        _score_bins(<const double*>sb.buf, ns, self.sedges,
                                    self.n_score_edges, scc)
                else:
                    _score_bins(<const double*>sb.buf, ns, self.sedges, self.n_score_edges,
                                scc)
            if n and self.nf:
                self._rows(direct, cols, n, counts)
        finally:
            if have_x:
                PyBuffer_Release(&xb)
            if have_s:
                PyBuffer_Release(&sb)
        return 0

    cdef int _rows(self, const float* direct, Columns cols, int64_t n, int64_t* counts) \
            except -1:
        """Rows 0..n of ``direct`` (a row block, nf floats a row) or of ``cols`` (staged a
        block at a time) into ``counts``; scratch on the stack where it fits."""
        cdef int32_t nf = self.nf
        cdef int64_t r0, nb, r, k0, nd
        cdef int64_t nfp = self.nfp, kpad = self.kpad
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
        cdef int64_t nge = (kpad + 3) * nfp  # < 2^29 * 264: no overflow
        cdef int32_t ge_stack[STACK_GE]
        cdef float rows_stack[STACK_ROWS]
        cdef int32_t* ge = ge_stack
        cdef float* rows = rows_stack
        cdef float* stagebuf = NULL
        cdef const float* Xp
        cdef bint heap_ge = nge > STACK_GE, heap_rows = ncopy * nfp > STACK_ROWS
        if heap_ge:
            ge = <int32_t*>calloc(<size_t>nge, sizeof(int32_t))
        else:
            memset(ge, 0, <size_t>nge * sizeof(int32_t))
        if heap_rows:
            rows = <float*>malloc(<size_t>ncopy * <size_t>nfp * sizeof(float))
        if direct == NULL:
            stagebuf = <float*>calloc(<size_t>BLOCK * <size_t>nf + <size_t>nfp, sizeof(float))
        if ge == NULL or rows == NULL or (direct == NULL and stagebuf == NULL):
            if heap_ge:
                free(ge)
            if heap_rows:
                free(rows)
            free(stagebuf)
            raise MemoryError()
        with nogil:
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
                       counts, self.stride)
                r0 += nb
        if heap_ge:
            free(ge)
        if heap_rows:
            free(rows)
        free(stagebuf)
        return 0


cdef inline bint _is(Py_buffer* b, const char* fmt, Py_ssize_t itemsize, int ndim):
    """A buffer of ``ndim`` dimensions whose items are the format character fmt[0] (any
    byte-order prefix but a swapped one) of ``itemsize`` bytes."""
    cdef const char* f = b.format
    if f == NULL or b.ndim != ndim or b.itemsize != itemsize:
        return False
    if f[0] == b"@" or f[0] == b"=" or f[0] == b"<":
        f += 1
    return f[0] == fmt[0] and f[1] == 0


def _score_array(score):
    """``score`` as a C-contiguous float64 array: one number a row, 1-D, of a numeric or
    boolean dtype (anything else refused: a missing or mistyped score is not a NaN)."""
    a = np.asarray(score)
    if a.ndim != 1 or a.dtype.kind not in "fiub":
        raise ValueError(f"score: one number a row (1-D, numeric); got "
                         f"{a.dtype} of shape {a.shape}")
    return np.ascontiguousarray(a, np.float64)


cdef inline const float* _few_rows(object X, int32_t nf) noexcept:
    """``X``'s data where it is a numpy array of at most SMALL rows of nf float32 values, C
    order, aligned, in the machine's byte order (else NULL)."""
    cdef cnp.ndarray a
    if type(X) is not cnp.ndarray:
        return NULL
    a = <cnp.ndarray>X
    if cnp.PyArray_NDIM(a) != 2 or cnp.PyArray_TYPE(a) != cnp.NPY_FLOAT32 or \
            not cnp.PyArray_IS_C_CONTIGUOUS(a) or not cnp.PyArray_ISALIGNED(a) or \
            not cnp.PyArray_ISNOTSWAPPED(a) or cnp.PyArray_DIM(a, 1) != nf or \
            cnp.PyArray_DIM(a, 0) > SMALL:
        return NULL
    return <const float*>cnp.PyArray_DATA(a)


cdef inline bint _scores_of(object s, cnp.npy_intp n, double* out) noexcept:
    """``s``'s n values (n <= SMALL) copied to ``out`` where it is a 1-D numpy array of
    float64, any stride (a binary model's scores are a column of its probabilities), aligned,
    in the machine's byte order (else False)."""
    cdef cnp.ndarray a
    cdef cnp.npy_intp i, st
    cdef const char* p
    if type(s) is not cnp.ndarray:
        return False
    a = <cnp.ndarray>s
    if cnp.PyArray_NDIM(a) != 1 or cnp.PyArray_TYPE(a) != cnp.NPY_FLOAT64 or \
            not cnp.PyArray_ISALIGNED(a) or not cnp.PyArray_ISNOTSWAPPED(a) or \
            cnp.PyArray_DIM(a, 0) != n or n > SMALL:
        return False
    p = <const char*>cnp.PyArray_DATA(a)
    st = cnp.PyArray_STRIDE(a, 0)
    for i in range(n):
        out[i] = (<const double*>(p + i * st))[0]
    return True


cdef bint _buffer(object o, Py_buffer* b, int flags) except -1:
    """``o``'s buffer taken with ``flags`` (True), or not (False: none, or not so laid
    out)."""
    try:
        PyObject_GetBuffer(o, b, flags)
    except (BufferError, TypeError, ValueError):
        return False
    return True


cdef bint _row_block(object X, Py_buffer* b, int32_t nf) except -1:
    """``X`` a C-contiguous 2-D float32 array of nf columns, its buffer taken (True), or
    not (False, nothing taken: the caller stages X)."""
    if not _buffer(X, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT):
        return False
    if not _is(b, b"f", 4, 2) or b.shape[1] != nf:
        PyBuffer_Release(b)
        return False
    return True


cdef int _int64_c(object a, Py_buffer* b, str name) except -1:
    """``a``'s writable C-contiguous buffer of int64 (else a ValueError naming it)."""
    if not _buffer(a, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE):
        raise ValueError(f"{name}: a writable C-contiguous int64 array")
    if not (_is(b, b"l", 8, b.ndim) or _is(b, b"q", 8, b.ndim)):
        PyBuffer_Release(b)
        raise ValueError(f"{name}: a writable C-contiguous int64 array")
    return 0


cdef class Counter:
    """A plan's counters, counted into by ``add`` (one call: the Python API's monitor,
    ``score_batch(X, monitor=...)``): ``counts`` (features x the plan's stride) and
    ``score_counts``, read as copies; ``reset`` zeroes them. A few rows at a time
    (at most SMALL, a float32 row block) are kept, up to PENDING, and counted together by
    the block counter (its setup costs more than one row's count); reading the counts counts
    them first, so what is read is always every row added. Its arrays are never reallocated
    (their addresses are kept). Threads may share one: each call holds its lock (another
    thread's call waits, the GIL released while it does); a call re-entered from its own
    thread (an array's ``__array__`` counting into it) is refused, never a deadlock."""

    cdef readonly Plan plan
    cdef readonly object owner     # what it counts for (add's ``owner``: refused if another)
    cdef object _counts, _scores
    cdef int64_t* c
    cdef int64_t* s
    cdef float* pend               # PENDING rows of nf floats, then nfp of slack (zeroed)
    cdef readonly int64_t npend    # rows kept, not yet counted
    cdef PyThread_type_lock lock
    cdef unsigned long holder      # the thread holding the lock (0: none)

    def __cinit__(self, Plan plan not None, object owner=None, *args, **kwargs):
        # (further arguments: a Python subclass's, worker.monitoring.Counts)
        self.plan = plan
        self.owner = owner
        self.lock = NULL
        self.holder = 0
        self._counts = np.zeros((plan.nf, plan.stride), np.int64)
        self._scores = np.zeros(plan.n_score_edges + 1, np.int64)
        self.c = <int64_t*><Py_ssize_t>self._counts.ctypes.data
        self.s = <int64_t*><Py_ssize_t>self._scores.ctypes.data
        self.pend = NULL
        self.npend = 0
        self.lock = PyThread_allocate_lock()
        if self.lock == NULL:
            raise MemoryError()
        if 0 < plan.nf and plan.nfp <= FEW_FEATURES:
            self.pend = <float*>calloc(PENDING * <size_t>plan.nf + <size_t>plan.nfp,
                                       sizeof(float))
            if self.pend == NULL:
                raise MemoryError()

    def __dealloc__(self):
        free(self.pend)
        if self.lock != NULL:
            PyThread_free_lock(self.lock)

    cdef int _take(self) except -1:
        """This counter's lock, waited for (the GIL released meanwhile); refused where this
        thread holds it already."""
        cdef unsigned long me = PyThread_get_thread_ident()
        if self.holder == me:
            raise RuntimeError("this monitor's counts were used again while it counted (from "
                               "an array's conversion?)")
        if not PyThread_acquire_lock(self.lock, NOWAIT_LOCK):
            with nogil:
                PyThread_acquire_lock(self.lock, WAIT_LOCK)
        self.holder = me
        return 0

    cdef void _give(self) noexcept:
        self.holder = 0
        PyThread_release_lock(self.lock)

    cdef int _count_pending(self) except -1:
        """The rows kept, counted (the caller holds the lock)."""
        if self.npend:
            self.plan._rows(self.pend, None, self.npend, self.c)
            self.npend = 0
        return 0

    def add(self, X, score, owner=None):
        """Rows ``X`` and their ``score`` (one a row) counted (``Plan.count``); refused
        (ValueError) if ``owner`` is given and is not the counter's."""
        cdef const float* few
        cdef double sc[SMALL]
        cdef int64_t n
        if owner is not None and owner is not self.owner:
            self._check_owner(owner)  # (a subclass's: the same model loaded again may count)
        if score is None:
            raise ValueError("score: one number a row (1-D, numeric); got None")
        # the lock is taken for what releases the GIL (counting the kept rows, a block);
        # keeping a few rows holds the GIL throughout and no other thread is counting
        # (holder 0: nothing releases the GIL while it is set), so it needs none
        cdef bint locked = False
        if self.holder != 0:  # another thread counts (or this one, re-entered): its turn
            self._take()
            locked = True
        try:
            few = _few_rows(X, self.plan.nf) if self.pend != NULL else NULL
            if few != NULL:
                n = cnp.PyArray_DIM(<cnp.ndarray>X, 0)
                if _scores_of(score, n, sc):
                    if self.npend + n > PENDING:  # (releases the GIL: the rows read after)
                        if not locked:
                            self._take()
                            locked = True
                        self._count_pending()
                        few = _few_rows(X, self.plan.nf)
                    # numpy's own arrays, read through its C API (the buffer protocol costs
                    # ~0.07 us an array: at one row, as much as the count) holding the GIL,
                    # so neither can change under it; the rows kept, the scores counted
                    memcpy(self.pend + self.npend * self.plan.nf, few,
                           <size_t>n * <size_t>self.plan.nf * sizeof(float))
                    self.npend += n
                    _score_bins(sc, n, self.plan.sedges, self.plan.n_score_edges, self.s)
                    return
            if not locked:
                self._take()
                locked = True
            self._count_pending()
            self.plan._add(X, score, self.c, self.s)
        finally:
            if locked:
                self._give()

    def _check_owner(self, owner):
        raise ValueError("monitor: counts not made by this model's monitor_counts()")

    def merge(self, Counter other not None, bint reset=False):
        """``other``'s counts (another thread's, of the same profile) added to these;
        ``reset``: other's zeroed in the same step (a roll-up that loses no row). The two
        locks are taken in one order whichever merges into which."""
        cdef Counter first, second
        if other is self:
            raise ValueError("merge: a counter into itself")
        if not _same_plan(self.plan, other.plan):
            raise ValueError("merge: counts of another reference profile")
        first, second = (self, other) if <size_t><void*>self < <size_t><void*>other else \
            (other, self)
        first._take()
        try:
            second._take()
            try:
                other._count_pending()
                self._counts += other._counts
                self._scores += other._scores
                if reset:
                    other._counts[...] = 0
                    other._scores[...] = 0
            finally:
                second._give()
        finally:
            first._give()

    @property
    def counts(self):
        """A copy of the feature counts: every row added so far."""
        self._take()
        try:
            self._count_pending()
            return self._counts.copy()
        finally:
            self._give()

    @property
    def score_counts(self):
        """A copy of the scores' bin counts."""
        self._take()
        try:
            return self._scores.copy()
        finally:
            self._give()

    def reset(self):
        self._take()
        try:
            self.npend = 0
            self._counts[...] = 0
            self._scores[...] = 0
        finally:
            self._give()


cdef bint _same_plan(Plan a, Plan b):
    """Plans of the same profile: one object, or the same layout to the byte."""
    if a is b:
        return True
    if a.nf != b.nf or a.nfp != b.nfp or a.kpad != b.kpad or a.width != b.width or \
            a.stride != b.stride or a.n_score_edges != b.n_score_edges:
        return False
    return memcmp(a.et, b.et, <size_t>a.kpad * <size_t>a.nfp * sizeof(float)) == 0 and \
        memcmp(a.lohi, b.lohi, 2 * <size_t>a.nfp * sizeof(float)) == 0 and \
        (a.nf == 0 or memcmp(a.n_edges, b.n_edges, <size_t>a.nf * sizeof(int32_t)) == 0) and \
        (a.n_score_edges == 0 or
         memcmp(a.sedges, b.sedges, <size_t>a.n_score_edges * sizeof(double)) == 0)


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


def missing_counts(X):
    """Each column's NaN values in ``X``, a C-contiguous 2-D float32 array (a staged row
    block), as int64; None for anything else (the caller counts it another way). numpy's
    count_nonzero(isnan(X), axis=0) takes about five times as long (bench/monitor_micro.py:
    25-26 us against 4.7 for 1,000 rows of 30 features)."""
    cdef Py_buffer b
    if not _buffer(X, &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT):
        return None
    cdef int64_t n, nf
    cdef int64_t[::1] o
    try:
        if not _is(&b, b"f", 4, 2):
            return None
        n, nf = b.shape[0], b.shape[1]
        out = np.zeros(nf, np.int64)
        o = out
        if n * nf > 4096:  # (both from a buffer that exists: the product fits)
            with nogil:
                sw_mon_missing(<const float*>b.buf, n, nf, &o[0])
        elif nf:
            sw_mon_missing(<const float*>b.buf, n, nf, &o[0])
        return out
    finally:
        PyBuffer_Release(&b)
