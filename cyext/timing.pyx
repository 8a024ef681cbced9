# cython: language_level=3
"""Benchmark helpers (not used by the worker): single-row latency timed inside native code."""

from libc.stdint cimport int64_t
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

import numpy as np

from worker._kernels cimport Forest, eval_rows


def bench_row_latency(Forest f, const float[:, ::1] rows, int64_t n_calls):
    """Bench only: nanoseconds of each of n_calls single-row evaluations (rows cycled), timed
    inside C with clock_gettime around the call (staged float32 row in, raw score out)."""
    cdef int64_t i, nr = rows.shape[0]
    cdef timespec t0, t1
    cdef int64_t[::1] ns
    cdef double raw[64]
    cdef float acc32[64]
    cdef double acc64[64]
    cdef double sink = 0.0
    f.need_ready()
    if rows.shape[1] != f.view.n_features or nr == 0 or f.view.n_outputs > 64:
        raise ValueError("rows must be (n >= 1, n_features) float32 and the model small")
    if f.view.n_cat_feat:
        raise ValueError("a model with staged categorical features needs staged rows")
    out = np.empty(n_calls, dtype=np.int64)
    ns = out
    with nogil:
        for i in range(n_calls):
            clock_gettime(CLOCK_MONOTONIC, &t0)
            if f.float32_acc:
                eval_rows(&f.view, &f.leaves32[0, 0], &f.base32[0], f.divisor,
                          &rows[i % nr, 0], 1, acc32, raw)
            else:
                eval_rows(&f.view, &f.leaves64[0, 0], &f.base64[0], f.divisor,
                          &rows[i % nr, 0], 1, acc64, raw)
            clock_gettime(CLOCK_MONOTONIC, &t1)
            sink += raw[0]
            ns[i] = (t1.tv_sec - t0.tv_sec) * 1000000000 + (t1.tv_nsec - t0.tv_nsec)
    if sink != sink and sink == 0.0:  # keep the result live
        print(sink)
    return out


