# Gather rows from column sources into a row-major float32 block (missing -> NaN).
from libc.math cimport NAN
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from swtypes cimport (Column, COL_F32, COL_F64, COL_I8, COL_I16, COL_I32, COL_I64, COL_U8,
                      COL_U16, COL_U32, COL_U64, COL_BITS, COL_ABSENT)


cdef inline void stage_block(const Column* cols, int32_t nf, int64_t r0, int64_t n,
                             float* out) noexcept nogil:
    """Rows r0..r0+n of every column into out[r * <int64_t>nf + j]; one typed loop per column. Every
    index in 64 bits: a block of 2^31 / nf rows or more indexes past 2^31."""
    cdef int32_t j
    cdef int64_t r, b
    cdef const Column* c
    cdef const char* p
    for j in range(nf):
        c = &cols[j]
        p = c.data + (r0 + c.offset) * c.stride
        if c.kind == COL_F32:
            for r in range(n):
                out[r * <int64_t>nf + j] = (<const float*>(p + r * c.stride))[0]
        elif c.kind == COL_F64:
            for r in range(n):
                out[r * <int64_t>nf + j] = <float>(<const double*>(p + r * c.stride))[0]
        elif c.kind == COL_I8:
            for r in range(n):
                out[r * <int64_t>nf + j] = <float>(<const int8_t*>(p + r * c.stride))[0]
        elif c.kind == COL_I16:
            for r in range(n):
                out[r * <int64_t>nf + j] = <float>(<const int16_t*>(p + r * c.stride))[0]
        elif c.kind == COL_I32:
            for r in range(n):
                out[r * <int64_t>nf + j] = <float>(<const int32_t*>(p + r * c.stride))[0]
        elif c.kind == COL_I64:
            for r in range(n):
                out[r * <int64_t>nf + j] = <float>(<const int64_t*>(p + r * c.stride))[0]
        elif c.kind == COL_U8:
            for r in range(n):
                out[r * <int64_t>nf + j] = <float>(<const uint8_t*>(p + r * c.stride))[0]
        elif c.kind == COL_U16:
            for r in range(n):
                out[r * <int64_t>nf + j] = <float>(<const uint16_t*>(p + r * c.stride))[0]
        elif c.kind == COL_U32:
            for r in range(n):
                out[r * <int64_t>nf + j] = <float>(<const uint32_t*>(p + r * c.stride))[0]
        elif c.kind == COL_U64:
            for r in range(n):
                out[r * <int64_t>nf + j] = <float>(<const uint64_t*>(p + r * c.stride))[0]
        elif c.kind == COL_BITS:
            for r in range(n):
                b = r0 + c.offset + r
                out[r * <int64_t>nf + j] = <float>((c.data[b >> 3] >> (b & 7)) & 1)
        else:
            for r in range(n):
                out[r * <int64_t>nf + j] = NAN
        if c.valid != NULL:
            for r in range(n):
                b = r0 + c.offset + r
                if not ((c.valid[b >> 3] >> (b & 7)) & 1):
                    out[r * <int64_t>nf + j] = NAN
