/* The lanes kernel: 16 rows, one in each 32-bit lane of an AVX-512 register, walk each padded
   tree of depth 1..SW_LANES_MAXD together, without a gather or a step a row.

   A block of 16 rows is staged by column as the SPLIT rule's doubled keys (walk.h
   sw_split_row: column 2f holds key(x[f]) with a NaN as 0, column 2f + 1 the same with a NaN
   as 0xFFFFFFFF), so node h's question for all 16 rows is one aligned load of its column,
   cb + col[h], and one unsigned compare with its threshold's key. Level d of a tree has 2^d
   nodes: each is loaded, and a row's value is picked from them by a tree of blends whose
   masks are the row's answers at the levels above (the first blend level takes the last
   answer). The row's threshold is picked from the tree's table by its heap index h (a
   permute of one register to depth 4, of two at depth 5), and h = 2h + (thr < value). After the last level
   h - 2^D is the row's leaf, whose value is permuted out of the tree's leaf table and added to
   the row's sum, tree after tree in tree order: every sum is the walks' (and so the
   library's) to the bit.

   Why: the walks chain a node's load, the row's value and the compare for each row and step,
   and sit at the load ports' bound on shallow trees (bench/NOTES.md "Kernel v3"); here a level
   costs 2^d vector loads and 2^d - 1 blends for 16 rows, which on trees of depth 5 is about a
   third of the walks' loads. Deeper levels double their loads each; depth 6 measured no faster
   than the walks, so the kernel stops at 5.

   Bounds: every read is within the caller's tables (n_trees x SW_LANES_WIDTH(depth) entries
   each) and the block (2 n_features columns of 16 keys, on the heap): the tables' column
   offsets are key * 16 with key < 2 n_features, checked when they are built
   (kernels.Forest._lanes), and a heap index stays below 2^(D + 1) <= 64, read through permutes
   that take its low 4 (a table of 16) or 5 bits (32). n_features is at most SW_LANES_MAXF. */
#ifndef SW_LANES_H
#define SW_LANES_H
#include <stdint.h>
#include <string.h>

#include <stdlib.h>

#define SW_LANES 16          /* rows a block */
#define SW_LANES_MAXD 5      /* deepest tree */
#define SW_LANES_MAXF 512    /* features (the block: 2 x 512 columns of 16 keys, 64 KB) */
/* table entries a tree: heap indices 0..15 (0 unused) and 16 leaves to depth 4, 32 at 5 */
#define SW_LANES_WIDTH(D) ((D) <= 4 ? 16 : 32)

typedef struct {
    const uint32_t *col;   /* n_trees x width: node h's column offset in the block (key * 16) */
    const uint32_t *thr;   /* n_trees x width: node h's threshold key (0 where no node) */
    const void *leaf;      /* n_trees x width: leaf i's value (float, or double with f64) */
    int64_t n_trees;
    int32_t depth;         /* 1..SW_LANES_MAXD */
    int32_t width;         /* SW_LANES_WIDTH(depth) */
    int32_t n_features;    /* 1..SW_LANES_MAXF */
    int32_t f64;           /* leaves and sums are double */
} sw_lanes;

/* 1 when the CPU has AVX-512F (the only kernel; a CPU without it scores with the walks) */
static int sw_lanes_cpu_v = -1;
static inline int sw_lanes_cpu(void) {
#if defined(__GNUC__) && defined(__x86_64__)
    if (sw_lanes_cpu_v < 0) {
        __builtin_cpu_init();
        sw_lanes_cpu_v = __builtin_cpu_supports("avx512f") ? 1 : 0;
    }
    return sw_lanes_cpu_v;
#else
    return 0;
#endif
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define SW_LANES_X86 1

/* rows x[0..n) (ldx floats apart) into the block's doubled columns; lanes n..15 hold 0 */
static inline void sw_lanes_stage(const float *x, int64_t ldx, int32_t n, int32_t nf,
                                  uint32_t *cb) {
    if (n < SW_LANES)
        memset(cb, 0, (size_t)nf * 2 * SW_LANES * sizeof(uint32_t));
    for (int32_t r = 0; r < n; r++) {
        const float *b = x + (int64_t)r * ldx;
        for (int32_t f = 0; f < nf; f++) {
            uint32_t v;
            memcpy(&v, b + f, sizeof v);  /* the float's bits (rows need not be aligned) */
            const uint32_t m = 0u - (uint32_t)((v & 0x7FFFFFFFu) > 0x7F800000u);
            const uint32_t k = v ^ ((uint32_t)((int32_t)v >> 31) | 0x80000000u);
            cb[(2 * f) * SW_LANES + r] = k & ~m;
            cb[(2 * f + 1) * SW_LANES + r] = k | m;
        }
    }
}

/* one tree's levels for the block: h, each lane's heap index, from 1 to 2^D + leaf; the
   thresholds from one register (T0: heap indices below 16) or two (T0, T1: below 32) */
#define SW_LANES_THR(D, T0, T1, h) ((D) <= 4 ? _mm512_permutexvar_epi32(h, T0)                \
                                             : _mm512_permutex2var_epi32(T0, h, T1))
#define SW_LANES_TREE(D, cb, colt, T0, T1, h) {                                             \
    __mmask16 bits_[D];                                                                     \
    h = _mm512_set1_epi32(1);                                                               \
    _Pragma("GCC unroll 8") for (int d = 0; d < (D); d++) {                                 \
        __m512i v_[1 << (D - 1)];                                                           \
        const int w = 1 << d;                                                               \
        _Pragma("GCC unroll 32") for (int i = 0; i < w; i++)                                \
            v_[i] = _mm512_load_si512((const void *)((cb) + (colt)[w + i]));                \
        _Pragma("GCC unroll 8") for (int e = d - 1, s = w; e >= 0; e--, s >>= 1)            \
            _Pragma("GCC unroll 16") for (int i = 0; i < s / 2; i++)                        \
                v_[i] = _mm512_mask_blend_epi32(bits_[e], v_[2 * i], v_[2 * i + 1]);       \
        bits_[d] = _mm512_cmpgt_epu32_mask(v_[0], SW_LANES_THR(D, T0, T1, h));              \
        h = _mm512_mask_sub_epi32(_mm512_add_epi32(h, h), bits_[d], _mm512_add_epi32(h, h), \
                                  _mm512_set1_epi32(-1));                                   \
    }                                                                                       \
}

#define SW_DEF_LANES_F32(D)                                                                 \
__attribute__((target("avx512f")))                                                          \
static void sw_lanes_f32_d##D(const sw_lanes *L, const uint32_t *cb, int32_t n, float *acc) { \
    const int W = SW_LANES_WIDTH(D);                                                        \
    const __mmask16 ok = (__mmask16)((1u << n) - 1u);                                       \
    __m512 a = _mm512_maskz_loadu_ps(ok, acc);                                              \
    const __m512i first = _mm512_set1_epi32(1 << D);                                        \
    const float *lf = (const float *)L->leaf;                                               \
    for (int64_t t = 0; t < L->n_trees; t++) {                                              \
        const uint32_t *colt = L->col + t * W, *tt = L->thr + t * W;                        \
        const __m512i T0 = _mm512_loadu_si512((const void *)tt);                            \
        const __m512i T1 = W == 32 ? _mm512_loadu_si512((const void *)(tt + 16)) : T0;      \
        __m512i h;                                                                          \
        SW_LANES_TREE(D, cb, colt, T0, T1, h)                                               \
        const __m512i i = _mm512_sub_epi32(h, first);                                       \
        const __m512 L0 = _mm512_loadu_ps(lf + t * W);                                      \
        a = _mm512_add_ps(a, W == 32 ? _mm512_permutex2var_ps(L0, i,                        \
                                                              _mm512_loadu_ps(lf + t * W + 16)) \
                                     : _mm512_permutexvar_ps(i, L0));                       \
    }                                                                                       \
    _mm512_mask_storeu_ps(acc, ok, a);                                                      \
}

/* double leaves: the 16 lanes' leaf indices widened to two registers of 8, each picked from
   the tree's 16 values (two registers: one permute) or 32 (four: a permute of the first 16,
   one of the last, a blend) */
#define SW_DEF_LANES_F64(D)                                                                 \
__attribute__((target("avx512f")))                                                          \
static void sw_lanes_f64_d##D(const sw_lanes *L, const uint32_t *cb, int32_t n, double *acc) { \
    const int W = SW_LANES_WIDTH(D);                                                        \
    const __mmask8 ok0 = (__mmask8)((n >= 8 ? 0xFFu : (1u << n) - 1u));                     \
    const __mmask8 ok1 = (__mmask8)((n <= 8 ? 0u : (1u << (n - 8)) - 1u));                  \
    __m512d a0 = _mm512_maskz_loadu_pd(ok0, acc), a1 = _mm512_maskz_loadu_pd(ok1, acc + 8); \
    const __m512i first = _mm512_set1_epi32(1 << D);                                        \
    const __m512i sixteen = _mm512_set1_epi64(16);                                          \
    const double *lf = (const double *)L->leaf;                                             \
    for (int64_t t = 0; t < L->n_trees; t++) {                                              \
        const uint32_t *colt = L->col + t * W, *tt = L->thr + t * W;                        \
        const __m512i T0 = _mm512_loadu_si512((const void *)tt);                            \
        const __m512i T1 = W == 32 ? _mm512_loadu_si512((const void *)(tt + 16)) : T0;      \
        __m512i h;                                                                          \
        SW_LANES_TREE(D, cb, colt, T0, T1, h)                                               \
        const __m512i i32 = _mm512_sub_epi32(h, first);                                     \
        const __m512i i0 = _mm512_cvtepu32_epi64(_mm512_castsi512_si256(i32));              \
        const __m512i i1 = _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(i32, 1));        \
        const double *lt = lf + t * W;                                                      \
        const __m512d P0 = _mm512_loadu_pd(lt), P1 = _mm512_loadu_pd(lt + 8);              \
        __m512d l0 = _mm512_permutex2var_pd(P0, i0, P1);                                    \
        __m512d l1 = _mm512_permutex2var_pd(P0, i1, P1);                                    \
        if (W == 32) {                                                                      \
            const __m512d P2 = _mm512_loadu_pd(lt + 16), P3 = _mm512_loadu_pd(lt + 24);     \
            l0 = _mm512_mask_blend_pd(_mm512_test_epi64_mask(i0, sixteen), l0,              \
                                      _mm512_permutex2var_pd(P2, i0, P3));                  \
            l1 = _mm512_mask_blend_pd(_mm512_test_epi64_mask(i1, sixteen), l1,              \
                                      _mm512_permutex2var_pd(P2, i1, P3));                  \
        }                                                                                   \
        a0 = _mm512_add_pd(a0, l0);                                                         \
        a1 = _mm512_add_pd(a1, l1);                                                         \
    }                                                                                       \
    _mm512_mask_storeu_pd(acc, ok0, a0);                                                    \
    _mm512_mask_storeu_pd(acc + 8, ok1, a1);                                                \
}
SW_DEF_LANES_F32(1) SW_DEF_LANES_F32(2) SW_DEF_LANES_F32(3) SW_DEF_LANES_F32(4)
SW_DEF_LANES_F32(5)
SW_DEF_LANES_F64(1) SW_DEF_LANES_F64(2) SW_DEF_LANES_F64(3) SW_DEF_LANES_F64(4)
SW_DEF_LANES_F64(5)

typedef void (*sw_lanes_f32_fn)(const sw_lanes *, const uint32_t *, int32_t, float *);
typedef void (*sw_lanes_f64_fn)(const sw_lanes *, const uint32_t *, int32_t, double *);
static const sw_lanes_f32_fn sw_lanes_f32_tab[SW_LANES_MAXD + 1] = {
    0, sw_lanes_f32_d1, sw_lanes_f32_d2, sw_lanes_f32_d3, sw_lanes_f32_d4, sw_lanes_f32_d5};
static const sw_lanes_f64_fn sw_lanes_f64_tab[SW_LANES_MAXD + 1] = {
    0, sw_lanes_f64_d1, sw_lanes_f64_d2, sw_lanes_f64_d3, sw_lanes_f64_d4, sw_lanes_f64_d5};
#endif

/* Every tree of L for the n rows x[0..n) (ldx floats apart), each row's sum acc[r] (float, or
   double with L->f64) added to in tree order. The block's columns are allocated here (2 x
   n_features x 16 keys, at most 64 KB: on the heap, not the stack). 0, or -1 with nothing
   done: no AVX-512F, no memory, or a table outside the bounds above. */
static inline int sw_lanes_rows(const sw_lanes *L, const float *x, int64_t ldx, int64_t n,
                                void *acc) {
#ifdef SW_LANES_X86
    if (!sw_lanes_cpu() || L->depth < 1 || L->depth > SW_LANES_MAXD ||
        L->width != SW_LANES_WIDTH(L->depth) || L->n_features < 1 ||
        L->n_features > SW_LANES_MAXF || n < 0 || ldx < L->n_features)
        return -1;
    const size_t bytes = (size_t)L->n_features * 2 * SW_LANES * sizeof(uint32_t);  /* 128 nf */
    uint32_t *cb = (uint32_t *)aligned_alloc(64, bytes);  /* a multiple of 64: nf x 128 */
    if (cb == NULL)
        return -1;
    for (int64_t r0 = 0; r0 < n; r0 += SW_LANES) {
        const int32_t k = (int32_t)(n - r0 < SW_LANES ? n - r0 : SW_LANES);
        sw_lanes_stage(x + r0 * ldx, ldx, k, L->n_features, cb);
        if (L->f64)
            sw_lanes_f64_tab[L->depth](L, cb, k, (double *)acc + r0);
        else
            sw_lanes_f32_tab[L->depth](L, cb, k, (float *)acc + r0);
    }
    free(cb);
    return 0;
#else
    (void)L; (void)x; (void)ldx; (void)n; (void)acc;
    return -1;
#endif
}
#endif
