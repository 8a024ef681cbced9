/* TreeSHAP by pattern tables (explain.pyx pattern_rows) for a tree of at most 63 splits
   without categorical splits. Up to SW_PATTERN_ROWS rows at a time:
   1. each row's directions at the tree's splits as one 64-bit mask D (bit i: split i goes
      right), four splits a step (SSE: four loads, two compares, a movemask);
   2. every table row those directions pick is prefetched (the tables are read cold after a
      scoring call: A's are 6.3 MB, a row a line), then per group of leaves and row, the
      bits of D at the group's splits, gathered in ascending order (the table's index), pick
      one row of the group's table, added to the group's features. Groups outside, rows
      inside, and the group's feature columns held in registers (a case per feature count):
      a row's updates to one column (its path's features are in every group of the tree)
      no longer wait on each other, and a step loads no column number: A 11.6 -> 6.3 us a
      row (bench/NOTES.md).
   The gather is BMI2's pext where it is fast (Intel from Haswell on, AMD from family 19h;
   AMD's earlier pext is microcoded, hundreds of cycles), chosen once at load by cpuid, and a
   loop over the group's split positions elsewhere. The package stays built for baseline
   x86-64: only the pext copy is compiled for BMI2. Measured (bench/NOTES.md): the SSE
   directions 1.33x on A, 1.24x on D over one split a step; eight a step (AVX) no faster; an
   AVX2 gather for them slower on D (0.72x). */
#ifndef SW_PATTERN_H
#define SW_PATTERN_H

#include <stdint.h>
#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define SW_PATTERN_SSE 1
#endif

#define SW_PATTERN_ROWS 16 /* rows whose table rows are prefetched before they are read */

#if defined(__GNUC__) || defined(__clang__)
#define SW_PATTERN_PREFETCH(p) __builtin_prefetch((const void *)(p), 0, 3)
#else
#define SW_PATTERN_PREFETCH(p) ((void)(p))
#endif

/* Split i goes right iff x > threshold, or x is missing and missr has bit i: the rule of
   goes_right (explain.pyx). */
static inline uint64_t sw_pattern_directions(const float *x, const int32_t *fe, const float *th,
                                             uint64_t missr, int64_t ns)
{
    uint64_t D = 0;
    int64_t i = 0;
#ifdef SW_PATTERN_SSE
    for (; i + 4 <= ns; i += 4) {
        __m128 v = _mm_setr_ps(x[fe[i]], x[fe[i + 1]], x[fe[i + 2]], x[fe[i + 3]]);
        uint64_t gt = (unsigned)_mm_movemask_ps(_mm_cmpgt_ps(v, _mm_loadu_ps(th + i)));
        uint64_t na = (unsigned)_mm_movemask_ps(_mm_cmpunord_ps(v, v));
        D |= (gt | (na & (missr >> i))) << i;
    }
#endif
    for (; i < ns; i++) {
        float v = x[fe[i]];
        D |= ((uint64_t)(v > th[i]) | ((uint64_t)(v != v) & (missr >> i))) << i;
    }
    return D;
}

/* Bit j of the result: D's bit pos[j] (j < k). */
static inline uint64_t sw_pattern_bits(uint64_t D, const int32_t *pos, int32_t k)
{
    uint64_t r = 0;
    for (int32_t j = 0; j < k; j++)
        r |= ((D >> pos[j]) & 1) << j;
    return r;
}

/* fe, th: the tree's ns <= 63 splits (feature, threshold); missr: bit i set where split i
   sends a missing value right; its ng groups: mask (their splits' bits of D), pos (ng x k
   the same as positions, ascending, padded with ns: never set), off (first table entry, on a
   64-byte boundary), feat (ng x nf features, padded with the bias column); rs: doubles from
   one table row to the next (nf rounded up to 8: a row a line, one prefetch); nr rows from
   x (xs apart), their attributions phi on (ps apart). */
#define SW_PATTERN_ARGS                                                                      \
    const int32_t *fe, const float *th, uint64_t missr, int64_t ns, const uint64_t *mask,    \
        const int32_t *pos, int32_t k, const int64_t *off, const int32_t *feat, int32_t nf,  \
        int32_t rs, int64_t ng, const double *table, const float *x, int64_t xs,             \
        double *phi, int64_t ps, int64_t nr

/* A group's table rows added for the block's rows to its COUNT feature columns COLS, the
   rows' updates independent of each other. */
#define SW_PATTERN_ADD(COLS, COUNT, INDEX)                                                   \
    for (int64_t r = 0; r < n; r++) {                                                        \
        double *p = phi + (r0 + r) * ps;                                                     \
        const double *row = table + off[g] + (int64_t)INDEX(Ds[r], g) * rs;                  \
        for (int32_t j = 0; j < (COUNT); j++)                                                \
            p[COLS[j]] += row[j];                                                            \
    }

/* the same for a group of N features, its columns read once (kept in registers) */
#define SW_PATTERN_ADD_N(N, INDEX)                                                           \
    case N: {                                                                                \
        int32_t fl[N];                                                                       \
        for (int32_t j = 0; j < N; j++)                                                      \
            fl[j] = f[j];                                                                    \
        SW_PATTERN_ADD(fl, N, INDEX)                                                         \
    } break;

#define SW_PATTERN_BODY(INDEX)                                                               \
    uint64_t Ds[SW_PATTERN_ROWS];                                                            \
    (void)mask;                                                                              \
    (void)pos;                                                                               \
    (void)k;                                                                                 \
    for (int64_t r0 = 0; r0 < nr; r0 += SW_PATTERN_ROWS) {                                   \
        int64_t n = nr - r0 < SW_PATTERN_ROWS ? nr - r0 : SW_PATTERN_ROWS;                   \
        for (int64_t r = 0; r < n; r++)                                                      \
            Ds[r] = sw_pattern_directions(x + (r0 + r) * xs, fe, th, missr, ns);             \
        for (int64_t r = 0; r < n; r++)                                                      \
            for (int64_t g = 0; g < ng; g++)                                                 \
                SW_PATTERN_PREFETCH(table + off[g] + (int64_t)INDEX(Ds[r], g) * rs);         \
        for (int64_t g = 0; g < ng; g++) {                                                   \
            const int32_t *f = feat + g * nf;                                                \
            switch (nf) {                                                                    \
            SW_PATTERN_ADD_N(1, INDEX) SW_PATTERN_ADD_N(2, INDEX) SW_PATTERN_ADD_N(3, INDEX) \
            SW_PATTERN_ADD_N(4, INDEX) SW_PATTERN_ADD_N(5, INDEX) SW_PATTERN_ADD_N(6, INDEX) \
            SW_PATTERN_ADD_N(7, INDEX) SW_PATTERN_ADD_N(8, INDEX)                            \
            default:                                                                         \
                SW_PATTERN_ADD(f, nf, INDEX)                                                 \
            }                                                                                \
        }                                                                                    \
    }

#define SW_PATTERN_LOOP_INDEX(D, g) sw_pattern_bits(D, pos + (g) * k, k)

static void sw_pattern_rows_loop(SW_PATTERN_ARGS) { SW_PATTERN_BODY(SW_PATTERN_LOOP_INDEX) }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>

#define SW_PATTERN_PEXT_INDEX(D, g) _pext_u64(D, mask[g])

__attribute__((target("bmi2"))) static void sw_pattern_rows_pext(SW_PATTERN_ARGS)
{
    SW_PATTERN_BODY(SW_PATTERN_PEXT_INDEX)
}

/* 1 where this CPU has BMI2 with a fast pext (Intel; AMD from family 19h). */
static int sw_pattern_fast_pext(void)
{
    unsigned a, b, c, d, family;
    char vendor[13];
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("bmi2") || !__get_cpuid(0, &a, &b, &c, &d))
        return 0;
    __builtin_memcpy(vendor, &b, 4);
    __builtin_memcpy(vendor + 4, &d, 4);
    __builtin_memcpy(vendor + 8, &c, 4);
    vendor[12] = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    family = (a >> 8) & 0xf;
    if (family == 0xf)
        family += (a >> 20) & 0xff;
    if (__builtin_strcmp(vendor, "GenuineIntel") == 0)
        return 1;
    return __builtin_strcmp(vendor, "AuthenticAMD") == 0 && family >= 0x19;
}
#else
#define sw_pattern_rows_pext sw_pattern_rows_loop
static int sw_pattern_fast_pext(void) { return 0; }
#endif

/* use_pext: sw_pattern_fast_pext() at load (tests also run the loop on the same models). */
static inline void sw_pattern_rows(int use_pext, SW_PATTERN_ARGS)
{
    if (use_pext)
        sw_pattern_rows_pext(fe, th, missr, ns, mask, pos, k, off, feat, nf, rs, ng, table, x,
                             xs, phi, ps, nr);
    else
        sw_pattern_rows_loop(fe, th, missr, ns, mask, pos, k, off, feat, nf, rs, ng, table, x,
                             xs, phi, ps, nr);
}

#endif
