/* Oblivious trees: padded models whose every level asks one question of all its nodes
   (CatBoost's trees; a tree shallower than the padded depth has pass-through levels, one
   question too). A row's leaf is then the bits of its D answers, root first, with no walk:
   level L reads one feature of the doubled order-key row (walk.h sw_split_row: index
   2f + missing-goes-right, NaN below or above every threshold's key) and compares it with
   one threshold key, so a block of rows can ask it at once, one SIMD compare per 16 rows.

   A block is SW_OBL_R rows staged column-major (sw_obl_cols: cols[k * SW_OBL_R + r] is the
   row r's doubled key k). Per tree, the leaf positions p (0 .. 2^D - 1, the padded leaf
   order) of the block's rows are built level by level, p |= bit where the compare holds,
   and its leaves are added to each row's accumulator: the trees in order, one add per tree
   per row, as every other kernel adds them, so the scores are the same bit for bit.

   Variants (sw_obl.simd): AVX-512 F (16 rows a compare; float64 leaves of trees of depth 6 or
   less picked from registers, sw_obl_sum512_h, otherwise gathered 8 or 16 at a time),
   AVX2 (8 rows), and portable C (gcc vectorizes the compare loop with the baseline SSE2).
   x86-64 variants are compiled with target attributes and taken only when the CPU has them
   (sw_obl_simd_best). With AVX-512 BW, blocks of more than 16 rows of a model with the
   bins built (Forest._obl_bins: depth 6 or less, one float64 score, at most 255 thresholds a
   column, enough trees a column to pay for binning) bin their columns once and read every
   tree as byte compares (sw_obl_sum_bins). Models with more than one value per leaf or
   several output columns take sw_obl_slots and add their leaves in the caller.

   Special nodes (categorical splits, LightGBM's zero band) are oblivious too when every node
   of a level has the same split: such a split becomes a derived column of the block, its
   answer (walk.h sw_special_step: 0 or 1, missing values as the node key says) computed once
   per row, and the level compares it with 0. Identical splits share one column. */
#ifndef SW_OBL_H
#define SW_OBL_H
#include <stdint.h>
#include <string.h>

#include "walk.h"

#if defined(__GNUC__) && defined(__x86_64__) && !defined(SW_NO_ASM)
#include <immintrin.h>
#define SW_OBL_X86 1
#endif

#define SW_OBL_R 64
enum { SW_OBL_ROW = 0, SW_OBL_AVX2 = 1, SW_OBL_AVX512 = 2 };

typedef struct {
    const uint32_t *key;  /* n_trees * depth: level L's column (the doubled row's index, or
                             2 * n_features + d for derived column d) */
    const uint32_t *thr;  /* n_trees * depth: level L's threshold order key (0: derived) */
    int64_t n_trees;
    int32_t depth;        /* the padded depth, 1..20 */
    int32_t simd;         /* SW_OBL_* in force */
    int32_t n_features;
    int32_t n_derived;    /* derived columns: the special splits' answers */
    const uint32_t *d_key;  /* n_derived: the split's node key (feature, missing side) */
    const uint32_t *d_off;  /* n_derived: its entry's offset in cats */
    const uint32_t *cats;   /* the special entries (ModelView.cats) */
    int32_t staged;         /* rows hold staged categories (ModelView.cat_staged) */
    const uint32_t *halves; /* NULL, or for depth <= 6 and float64 leaves summed to one score:
                               n_trees * 2W words (W = 64 at depth 6, 32 at 5, 16 below), a
                               tree's leaves' low words then their high words, zero past
                               2^D (sw_obl_sum512_h) */
    /* the bins (sw_obl_bins512, sw_obl_sum512_w; NULL quarters: not built, or switched off):
       AVX-512 BW, depth 6 or less, float64 leaves summed to one score */
    const uint16_t *quarters; /* n_trees * 256 words: word 64q + i of a tree is bits
                                 16q .. 16q + 15 of its leaf i (zero past 2^D) */
    const uint8_t *jb;      /* n_trees * depth: level L's threshold as the index j of its key
                               among its column's sorted borders (key > border j: bin > j) */
    int32_t n_used;         /* columns the levels read (each binned once a block) */
    const uint32_t *used;   /* n_used: the column */
    const uint32_t *nb;     /* n_used: its distinct thresholds, the borders (0..255: none
                               where every threshold is past the column's largest key; such
                               levels take j = 255) */
    const uint32_t *btab;   /* n_used * SW_OBL_BTAB: the borders, ascending, padded to 256 with
                               0xFFFFFFFF: 32 pivots (border 8g + 7; the borders themselves
                               where nb <= 31), then 8 planes of 32 (plane j entry g: border
                               8g + j; plane 7, the pivots again, is not read) */
} sw_obl;
#define SW_OBL_BTAB (32 + 8 * 32)

static int sw_obl_simd = -1;
static inline int sw_obl_simd_best(void) {
#ifdef SW_OBL_X86
    if (sw_obl_simd < 0) {
        __builtin_cpu_init();
        sw_obl_simd = __builtin_cpu_supports("avx512f") ? SW_OBL_AVX512
            : __builtin_cpu_supports("avx2") ? SW_OBL_AVX2 : SW_OBL_ROW;
    }
    return sw_obl_simd;
#else
    return SW_OBL_ROW;
#endif
}

/* AVX-512 BW (the bins' byte compares and word permutes) */
static int sw_obl_bw_on = -1;
static inline int sw_obl_bw(void) {
#ifdef SW_OBL_X86
    if (sw_obl_bw_on < 0) {
        __builtin_cpu_init();
        sw_obl_bw_on = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    }
    return sw_obl_bw_on;
#else
    return 0;
#endif
}

/* the derived columns of the block's first n rows (after the features' 2 nf columns); rows
   n .. SW_OBL_R - 1 zero */
static inline void sw_obl_derived(const sw_obl *o, const float *X, int64_t ldx, int32_t n,
                                  uint32_t *cols) {
    const int32_t nf = o->n_features;
    for (int32_t d = 0; d < o->n_derived; d++) {
        uint32_t *c = cols + ((int64_t)2 * nf + d) * SW_OBL_R;
        const uint32_t key = o->d_key[d], off = o->d_off[d];
        const uint32_t *e = o->cats + off;
        const int64_t f = SW_SIDX(key);
        int32_t r = 0;
        for (; r < n; r++)
            c[r] = sw_special_step(X[(int64_t)r * ldx + f], key, e[0], e, o->staged);
        for (; r < SW_OBL_R; r++) c[r] = 0;
    }
}

/* n <= SW_OBL_R rows (row r at X + r * ldx, nf features) as doubled order-key columns, then
   the derived columns; the columns' rows n .. SW_OBL_R - 1 are zero (they take leaf 0 and
   are never read back). Portable C, a value at a time. */
static inline void sw_obl_cols_row(const sw_obl *o, const float *X, int64_t ldx, int32_t n,
                                   uint32_t *cols) {
    const int32_t nf = o->n_features;
    for (int32_t f = 0; f < nf; f++) {
        uint32_t *lo = cols + (int64_t)2 * f * SW_OBL_R, *hi = lo + SW_OBL_R;
        int32_t r = 0;
        for (; r < n; r++) {
            uint32_t b;
            memcpy(&b, X + (int64_t)r * ldx + f, sizeof b);
            const uint32_t m = 0u - (uint32_t)((b & 0x7FFFFFFFu) > 0x7F800000u);
            const uint32_t k = sw_order_key(b);
            lo[r] = k & ~m;
            hi[r] = k | m;
        }
        for (; r < SW_OBL_R; r++) lo[r] = hi[r] = 0;
    }
    sw_obl_derived(o, X, ldx, n, cols);
}

#ifdef SW_OBL_X86
/* a 16 x 16 tile of 32-bit words transposed in registers: r[i] word j becomes r[j] word i */
__attribute__((target("avx512f")))
static inline void sw_obl_tr16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) {
            t[8 * i + j] = _mm512_shuffle_i32x4(u[8 * i + j], u[8 * i + j + 4], 0x88);
            t[8 * i + j + 4] = _mm512_shuffle_i32x4(u[8 * i + j], u[8 * i + j + 4], 0xDD);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xDD);
    }
}

/* AVX-512: the columns of sw_obl_cols_row, 16 rows x 16 features a tile: each row read with
   a masked load (never past its nf features, and rows n and on not read at all), the tile
   transposed in registers, 16 rows' order keys at a time (sw_order_key: b ^ (sign | 2^31),
   one ternary-logic op), the NaN rows' keys 0 in the low column and all ones in the high */
__attribute__((target("avx512f")))
static void sw_obl_cols512(const sw_obl *o, const float *X, int64_t ldx, int32_t n,
                           uint32_t *cols) {
    const int32_t nf = o->n_features;
    const __m512i top = _mm512_set1_epi32((int)0x80000000u);
    const __m512i mag = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
    const __m512i ones = _mm512_set1_epi32(-1);
    for (int32_t r0 = 0; r0 < SW_OBL_R; r0 += 16) {
        const int32_t live_n = n - r0 >= 16 ? 16 : n - r0 > 0 ? n - r0 : 0;
        const __mmask16 live = (__mmask16)((1u << live_n) - 1);
        for (int32_t f0 = 0; f0 < nf; f0 += 16) {
            const int32_t nk = nf - f0 < 16 ? nf - f0 : 16;
            const __mmask16 fm = (__mmask16)((1u << nk) - 1);
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < live_n
                    ? _mm512_maskz_loadu_epi32(fm, X + (int64_t)(r0 + i) * ldx + f0)
                    : _mm512_setzero_si512();
            sw_obl_tr16(r);
            for (int k = 0; k < nk; k++) {
                const __m512i b = r[k];
                const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, mag), inf);
                const __m512i key = _mm512_ternarylogic_epi32(b, _mm512_srai_epi32(b, 31), top,
                                                              0x1E);
                uint32_t *lo = cols + (int64_t)2 * (f0 + k) * SW_OBL_R + r0;
                _mm512_storeu_si512(lo, _mm512_maskz_mov_epi32(live & ~nan, key));
                _mm512_storeu_si512(lo + SW_OBL_R, _mm512_mask_mov_epi32(
                    _mm512_maskz_mov_epi32(live, key), live & nan, ones));
            }
        }
    }
    sw_obl_derived(o, X, ldx, n, cols);
}
#endif

/* the block's columns (sw_obl_cols_row), with AVX-512 where the kernel runs on it */
static inline void sw_obl_cols(const sw_obl *o, const float *X, int64_t ldx, int32_t n,
                               uint32_t *cols) {
#ifdef SW_OBL_X86
    if (o->simd == SW_OBL_AVX512) {
        sw_obl_cols512(o, X, ldx, n, cols);
        return;
    }
#endif
    sw_obl_cols_row(o, X, ldx, n, cols);
}

/* leaf positions of the block's first n rows in trees t0 .. t1 - 1:
   slot[(t - t0) * SW_OBL_R + r] */
static inline void sw_obl_slots(const sw_obl *o, const uint32_t *cols, int32_t n, int64_t t0,
                                int64_t t1, int32_t *slot) {
    const int32_t D = o->depth;
    for (int64_t t = t0; t < t1; t++) {
        const uint32_t *key = o->key + t * D, *thr = o->thr + t * D;
        int32_t *s = slot + (t - t0) * SW_OBL_R;
        for (int32_t r = 0; r < n; r++) s[r] = 0;
        for (int32_t l = 0; l < D; l++) {
            const uint32_t *c = cols + (int64_t)key[l] * SW_OBL_R;
            const uint32_t th = thr[l];
            for (int32_t r = 0; r < n; r++) s[r] = 2 * s[r] + (int32_t)(c[r] > th);
        }
    }
}

/* acc[r] += the leaf of every tree, in tree order, for the block's first n rows (one value
   per leaf, one output column). Portable C: the positions of 16 trees at a time, then their
   leaves row by row (each row's adds stay in tree order). */
#define SW_OBL_SUM_ROW(T, NAME)                                                             \
static void NAME(const sw_obl *o, const uint32_t *cols, int32_t n, const T *leaves, T *acc) {\
    int32_t slot[16 * SW_OBL_R];                                                            \
    const int64_t nl = (int64_t)1 << o->depth;                                              \
    for (int64_t t0 = 0; t0 < o->n_trees; t0 += 16) {                                       \
        const int64_t t1 = t0 + 16 < o->n_trees ? t0 + 16 : o->n_trees;                     \
        sw_obl_slots(o, cols, n, t0, t1, slot);                                             \
        for (int32_t r = 0; r < n; r++) {                                                   \
            T a = acc[r];                                                                   \
            for (int64_t t = t0; t < t1; t++) a += leaves[t * nl + slot[(t - t0) * SW_OBL_R + r]];\
            acc[r] = a;                                                                     \
        }                                                                                   \
    }                                                                                       \
}
SW_OBL_SUM_ROW(double, sw_obl_sum_row_d)
SW_OBL_SUM_ROW(float, sw_obl_sum_row_f)

#ifdef SW_OBL_X86
/* AVX-512: tree t's leaf positions for V vectors of 16 rows, p[v] (depth D) */
#define SW_OBL_AVX512_POS(V)                                                                \
        const uint32_t *key = o->key + t * D, *thr = o->thr + t * D;                        \
        __m512i p[V];                                                                       \
        _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) p[v] = _mm512_setzero_si512();   \
        for (int32_t l = 0; l < D; l++) {                                                   \
            const uint32_t *c = cols + (int64_t)key[l] * SW_OBL_R;                          \
            const __m512i th = _mm512_set1_epi32((int)thr[l]);                              \
            const __m512i bit = _mm512_set1_epi32(1 << (D - 1 - l));                        \
            _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) {                           \
                const __mmask16 m = _mm512_cmpgt_epu32_mask(_mm512_loadu_si512(c + 16 * v), th);\
                p[v] = _mm512_mask_or_epi32(p[v], m, p[v], bit);                            \
            }                                                                               \
        }

/* AVX-512: V vectors of 16 rows (V = 1 or 4), positions and sums in registers across trees */
#define SW_OBL_AVX512_D(V, NAME)                                                            \
__attribute__((target("avx512f")))                                                          \
static void NAME(const sw_obl *o, const uint32_t *cols, const double *leaves, double *acc) { \
    const int32_t D = o->depth;                                                             \
    const int64_t nl = (int64_t)1 << D;                                                     \
    __m512d a[2 * V];                                                                       \
    _Pragma("GCC unroll 8") for (int i = 0; i < 2 * V; i++) a[i] = _mm512_loadu_pd(acc + 8 * i);\
    for (int64_t t = 0; t < o->n_trees; t++) {                                              \
        SW_OBL_AVX512_POS(V)                                                                \
        const double *lv = leaves + t * nl;                                                 \
        _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) {                               \
            a[2 * v] = _mm512_add_pd(a[2 * v],                                              \
                _mm512_i32gather_pd(_mm512_castsi512_si256(p[v]), lv, 8));                  \
            a[2 * v + 1] = _mm512_add_pd(a[2 * v + 1],                                      \
                _mm512_i32gather_pd(_mm512_extracti64x4_epi64(p[v], 1), lv, 8));            \
        }                                                                                   \
    }                                                                                       \
    _Pragma("GCC unroll 8") for (int i = 0; i < 2 * V; i++) _mm512_storeu_pd(acc + 8 * i, a[i]);\
}
SW_OBL_AVX512_D(1, sw_obl_sum512_d1)
SW_OBL_AVX512_D(4, sw_obl_sum512_d4)

/* AVX-512F, depth 6 or less, float64 leaves summed to one score: each row's leaf is picked
   from the tree's leaves held in registers as two tables of 32-bit words, the leaves' low
   words and their high words (o->halves), by 32-bit permutes of 16 rows at once, and the two
   words of each row put back together as its float64 leaf (unpack): 4 two-register permutes
   for 16 rows at depth 6, where picking float64 values 8 at a time takes 8 (the permutes are
   the loop's bound on this CPU: 1.4-1.5x, bench/oblivious_micro.py "halves"). The leaves'
   bits move unchanged, and each row's sum stays in tree order: the walks' scores to the bit.

   Depth 6: levels 1-5 are the permute's index (5 bits, 32 words a pair of registers), level
   0's compare picks the pair (a blend). Depth 5: every level is in the index, one pair of
   registers (W = 32 words a half); depth 1-4: one register (W = 16, a one-register permute).
   Words past the tree's 2^D leaves are zero and never picked. V vectors of 16 rows (1 or 4);
   the unpacks leave rows 16v + {0,1,4,5,8,9,12,13} in a[2v] and {2,3,6,7,10,11,14,15} in
   a[2v + 1], put in that order on load and back on store. */
#define SW_OBL_AVX512_H(V, NAME)                                                            \
__attribute__((target("avx512f")))                                                          \
static void NAME(const sw_obl *o, const uint32_t *cols, const uint32_t *halves,           \
                 double *acc) {                                                             \
    const int32_t D = o->depth, top = D == 6, one = D <= 4;                                 \
    const int64_t W = top ? 64 : D == 5 ? 32 : 16;                                          \
    const __m512i g0 = _mm512_set_epi64(13, 12, 9, 8, 5, 4, 1, 0);                          \
    const __m512i g1 = _mm512_set_epi64(15, 14, 11, 10, 7, 6, 3, 2);                        \
    __m512d a[2 * V];                                                                       \
    _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) {                                   \
        const __m512d lo = _mm512_loadu_pd(acc + 16 * v), hi = _mm512_loadu_pd(acc + 16 * v + 8);\
        a[2 * v] = _mm512_permutex2var_pd(lo, g0, hi);                                      \
        a[2 * v + 1] = _mm512_permutex2var_pd(lo, g1, hi);                                  \
    }                                                                                       \
    for (int64_t t = 0; t < o->n_trees; t++) {                                              \
        const uint32_t *key = o->key + t * D, *thr = o->thr + t * D;                        \
        __mmask16 m0[V];                                                                    \
        __m512i p[V];                                                                       \
        _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) {                               \
            m0[v] = 0;                                                                      \
            p[v] = _mm512_setzero_si512();                                                  \
        }                                                                                   \
        if (top) {                                                                          \
            const uint32_t *c = cols + (int64_t)key[0] * SW_OBL_R;                          \
            const __m512i th = _mm512_set1_epi32((int)thr[0]);                              \
            _Pragma("GCC unroll 4") for (int v = 0; v < V; v++)                             \
                m0[v] = _mm512_cmpgt_epu32_mask(_mm512_loadu_si512(c + 16 * v), th);        \
        }                                                                                   \
        for (int32_t l = top; l < D; l++) {                                                 \
            const uint32_t *c = cols + (int64_t)key[l] * SW_OBL_R;                          \
            const __m512i th = _mm512_set1_epi32((int)thr[l]);                              \
            const __m512i bit = _mm512_set1_epi32(1 << (D - 1 - l));                        \
            _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) {                           \
                const __mmask16 m = _mm512_cmpgt_epu32_mask(_mm512_loadu_si512(c + 16 * v), th);\
                p[v] = _mm512_mask_or_epi32(p[v], m, p[v], bit);                            \
            }                                                                               \
        }                                                                                   \
        const uint32_t *h = halves + t * 2 * W;                                             \
        const __m512i L0 = _mm512_loadu_si512(h), H0 = _mm512_loadu_si512(h + W);          \
        if (one) {                                                                          \
            _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) {                           \
                const __m512i lo = _mm512_permutexvar_epi32(p[v], L0);                      \
                const __m512i hi = _mm512_permutexvar_epi32(p[v], H0);                      \
                a[2 * v] = _mm512_add_pd(a[2 * v],                                          \
                                         _mm512_castsi512_pd(_mm512_unpacklo_epi32(lo, hi)));\
                a[2 * v + 1] = _mm512_add_pd(a[2 * v + 1],                                  \
                                             _mm512_castsi512_pd(_mm512_unpackhi_epi32(lo, hi)));\
            }                                                                               \
            continue;                                                                       \
        }                                                                                   \
        const __m512i L1 = _mm512_loadu_si512(h + 16), H1 = _mm512_loadu_si512(h + W + 16); \
        if (top) {                                                                          \
            const __m512i L2 = _mm512_loadu_si512(h + 32), L3 = _mm512_loadu_si512(h + 48);   \
            const __m512i H2 = _mm512_loadu_si512(h + 96), H3 = _mm512_loadu_si512(h + 112);  \
            _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) {                           \
                const __m512i lo = _mm512_mask_blend_epi32(m0[v],                           \
                    _mm512_permutex2var_epi32(L0, p[v], L1),                                \
                    _mm512_permutex2var_epi32(L2, p[v], L3));                               \
                const __m512i hi = _mm512_mask_blend_epi32(m0[v],                           \
                    _mm512_permutex2var_epi32(H0, p[v], H1),                                \
                    _mm512_permutex2var_epi32(H2, p[v], H3));                               \
                a[2 * v] = _mm512_add_pd(a[2 * v],                                          \
                                         _mm512_castsi512_pd(_mm512_unpacklo_epi32(lo, hi)));\
                a[2 * v + 1] = _mm512_add_pd(a[2 * v + 1],                                  \
                                             _mm512_castsi512_pd(_mm512_unpackhi_epi32(lo, hi)));\
            }                                                                               \
        } else {                                                                            \
            _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) {                           \
                const __m512i lo = _mm512_permutex2var_epi32(L0, p[v], L1);                 \
                const __m512i hi = _mm512_permutex2var_epi32(H0, p[v], H1);                 \
                a[2 * v] = _mm512_add_pd(a[2 * v],                                          \
                                         _mm512_castsi512_pd(_mm512_unpacklo_epi32(lo, hi)));\
                a[2 * v + 1] = _mm512_add_pd(a[2 * v + 1],                                  \
                                             _mm512_castsi512_pd(_mm512_unpackhi_epi32(lo, hi)));\
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    const __m512i b0 = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);                          \
    const __m512i b1 = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);                        \
    _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) {                                   \
        _mm512_storeu_pd(acc + 16 * v, _mm512_permutex2var_pd(a[2 * v], b0, a[2 * v + 1])); \
        _mm512_storeu_pd(acc + 16 * v + 8, _mm512_permutex2var_pd(a[2 * v], b1, a[2 * v + 1]));\
    }                                                                                       \
}
SW_OBL_AVX512_H(1, sw_obl_sum512_h1)
SW_OBL_AVX512_H(4, sw_obl_sum512_h4)

/* The bins (issue 56: CatBoost's own way, binarizing each feature once, then every tree as
   byte arithmetic). A level asks key > t, t one of its column's sorted distinct thresholds
   (the borders b_0 < ... < b_(nb-1)), t = b_j; a row's bin in that column is the count of
   borders below its key, and since the borders it exceeds are a prefix, key > b_j exactly when
   bin > j. With nb <= 255 a bin is a byte, so a level is one byte compare of the block's 64
   rows (four 32-bit compares without the bins).

   sw_obl_bins512: the block's bins of every column the levels read, 16 rows at a time, by a
   binary search in registers among the borders padded with 0xFFFFFFFF (never below a key):
   5 steps among 32 entries (the borders themselves where nb <= 31; else every 8th border,
   which finds the row's group g of 8, g <= 31 since the 256th entry is padding), then 3 within
   the group (border 8g + 7 is known not below the key). bins[c * SW_OBL_R + r]. */
/* how many of the 32 ascending words of (P0, P1) each of x's 16 keys exceeds, when the last
   word is exceeded by none: 5 steps of a binary search */
__attribute__((target("avx512f")))
static inline __m512i sw_obl_search32(__m512i P0, __m512i P1, __m512i x) {
    __m512i pos = _mm512_setzero_si512();
    for (int s = 16; s >= 1; s >>= 1) {
        const __m512i b = _mm512_permutex2var_epi32(
            P0, _mm512_add_epi32(pos, _mm512_set1_epi32(s - 1)), P1);
        pos = _mm512_mask_add_epi32(pos, _mm512_cmpgt_epu32_mask(x, b), pos,
                                    _mm512_set1_epi32(s));
    }
    return pos;
}

__attribute__((target("avx512f,avx512bw")))
static void sw_obl_bins512(const sw_obl *o, const uint32_t *cols, uint8_t *bins) {
    for (int32_t u = 0; u < o->n_used; u++) {
        const int64_t c = o->used[u];
        const uint32_t *tab = o->btab + (int64_t)u * SW_OBL_BTAB;
        const __m512i P0 = _mm512_loadu_si512(tab), P1 = _mm512_loadu_si512(tab + 16);
        const uint32_t *col = cols + c * SW_OBL_R;
        uint8_t *out = bins + c * SW_OBL_R;
        if (o->nb[u] <= 31) {
            for (int v = 0; v < 4; v++) {
                const __m512i pos = sw_obl_search32(P0, P1, _mm512_loadu_si512(col + 16 * v));
                _mm_storeu_si128((__m128i *)(out + 16 * v), _mm512_cvtepi32_epi8(pos));
            }
            continue;
        }
        __m512i Q[7][2];
        for (int j = 0; j < 7; j++) {
            Q[j][0] = _mm512_loadu_si512(tab + 32 + 32 * j);
            Q[j][1] = _mm512_loadu_si512(tab + 32 + 32 * j + 16);
        }
        for (int v = 0; v < 4; v++) {
            const __m512i x = _mm512_loadu_si512(col + 16 * v);
            const __m512i g = sw_obl_search32(P0, P1, x);
            /* within the group: borders 8g + 0 .. 6, the middle first */
            const __mmask16 k4 = _mm512_cmpgt_epu32_mask(x, _mm512_permutex2var_epi32(Q[3][0], g, Q[3][1]));
            const __mmask16 k2 = _mm512_cmpgt_epu32_mask(x, _mm512_mask_blend_epi32(k4,
                _mm512_permutex2var_epi32(Q[1][0], g, Q[1][1]),
                _mm512_permutex2var_epi32(Q[5][0], g, Q[5][1])));
            const __m512i lo = _mm512_mask_blend_epi32(k2,
                _mm512_permutex2var_epi32(Q[0][0], g, Q[0][1]),
                _mm512_permutex2var_epi32(Q[2][0], g, Q[2][1]));
            const __m512i hi = _mm512_mask_blend_epi32(k2,
                _mm512_permutex2var_epi32(Q[4][0], g, Q[4][1]),
                _mm512_permutex2var_epi32(Q[6][0], g, Q[6][1]));
            const __mmask16 k1 = _mm512_cmpgt_epu32_mask(x, _mm512_mask_blend_epi32(k4, lo, hi));
            __m512i pos = _mm512_slli_epi32(g, 3);
            pos = _mm512_mask_add_epi32(pos, k4, pos, _mm512_set1_epi32(4));
            pos = _mm512_mask_add_epi32(pos, k2, pos, _mm512_set1_epi32(2));
            pos = _mm512_mask_add_epi32(pos, k1, pos, _mm512_set1_epi32(1));
            _mm_storeu_si128((__m128i *)(out + 16 * v), _mm512_cvtepi32_epi8(pos));
        }
    }
}

/* The trees on the bins, the block's 64 rows at once: each level one byte compare (bin > j)
   and a masked byte add of its bit, so byte r of p is row r's leaf position (< 64). The leaves
   are held as 4 planes of 64 16-bit words (o->quarters: plane q is bits 16q .. 16q + 15 of
   every leaf), two registers a plane, and picked by word permutes (vpermt2w, which reads the
   low 6 bits of each word index): the word lanes of p itself give the even rows' positions
   (word i is bytes 2i and 2i + 1; the low one, row 2i, holds the low 6 bits) and p shifted
   right by 8 the odd rows'. Unpacks of words then dwords put each row's 4 words back together
   as its float64 leaf: 8 permutes and 16 unpacks for 64 rows, where the halves take 16, 8
   blends and 8 unpacks after 24 compares (bench/oblivious_bins.c). The bits move unchanged and
   each row's sum stays in tree order: the other kernels' scores to the bit.

   Accumulator a[4e + j] (e = 0 even rows, 1 odd) holds, in 128-bit lane L, the rows of word
   lanes 8L + 2j and 8L + 2j + 1: row 2 (8L + 2j + k) + e in its qword 2L + k. */
__attribute__((target("avx512f,avx512bw")))
static void sw_obl_sum512_w(const sw_obl *o, const uint8_t *bins, const uint16_t *quarters,
                            double *acc) {
    const int32_t D = o->depth;
    __m512d a[8];
    double tmp[8];
    for (int e = 0; e < 2; e++)
        for (int j = 0; j < 4; j++) {
            for (int L = 0; L < 4; L++)
                for (int k = 0; k < 2; k++) tmp[2 * L + k] = acc[2 * (8 * L + 2 * j + k) + e];
            a[4 * e + j] = _mm512_loadu_pd(tmp);
        }
    for (int64_t t = 0; t < o->n_trees; t++) {
        const uint32_t *key = o->key + t * D;
        const uint8_t *jb = o->jb + t * D;
        __m512i p = _mm512_maskz_mov_epi8(
            _mm512_cmpgt_epu8_mask(_mm512_loadu_si512(bins + (int64_t)key[0] * SW_OBL_R),
                                   _mm512_set1_epi8((char)jb[0])),
            _mm512_set1_epi8((char)(1 << (D - 1))));
        for (int32_t l = 1; l < D; l++) {
            const __mmask64 m = _mm512_cmpgt_epu8_mask(
                _mm512_loadu_si512(bins + (int64_t)key[l] * SW_OBL_R), _mm512_set1_epi8((char)jb[l]));
            p = _mm512_mask_add_epi8(p, m, p, _mm512_set1_epi8((char)(1 << (D - 1 - l))));
        }
        const __m512i pe[2] = {p, _mm512_srli_epi16(p, 8)};
        const uint16_t *q = quarters + t * 256;
        const __m512i Q0 = _mm512_loadu_si512(q), Q1 = _mm512_loadu_si512(q + 32);
        const __m512i Q2 = _mm512_loadu_si512(q + 64), Q3 = _mm512_loadu_si512(q + 96);
        const __m512i Q4 = _mm512_loadu_si512(q + 128), Q5 = _mm512_loadu_si512(q + 160);
        const __m512i Q6 = _mm512_loadu_si512(q + 192), Q7 = _mm512_loadu_si512(q + 224);
        for (int e = 0; e < 2; e++) {
            const __m512i P0 = _mm512_permutex2var_epi16(Q0, pe[e], Q1);
            const __m512i P1 = _mm512_permutex2var_epi16(Q2, pe[e], Q3);
            const __m512i P2 = _mm512_permutex2var_epi16(Q4, pe[e], Q5);
            const __m512i P3 = _mm512_permutex2var_epi16(Q6, pe[e], Q7);
            const __m512i dl = _mm512_unpacklo_epi16(P0, P1), dh = _mm512_unpackhi_epi16(P0, P1);
            const __m512i el = _mm512_unpacklo_epi16(P2, P3), eh = _mm512_unpackhi_epi16(P2, P3);
            a[4 * e] = _mm512_add_pd(a[4 * e], _mm512_castsi512_pd(_mm512_unpacklo_epi32(dl, el)));
            a[4 * e + 1] = _mm512_add_pd(a[4 * e + 1],
                                         _mm512_castsi512_pd(_mm512_unpackhi_epi32(dl, el)));
            a[4 * e + 2] = _mm512_add_pd(a[4 * e + 2],
                                         _mm512_castsi512_pd(_mm512_unpacklo_epi32(dh, eh)));
            a[4 * e + 3] = _mm512_add_pd(a[4 * e + 3],
                                         _mm512_castsi512_pd(_mm512_unpackhi_epi32(dh, eh)));
        }
    }
    for (int e = 0; e < 2; e++)
        for (int j = 0; j < 4; j++) {
            _mm512_storeu_pd(tmp, a[4 * e + j]);
            for (int L = 0; L < 4; L++)
                for (int k = 0; k < 2; k++) acc[2 * (8 * L + 2 * j + k) + e] = tmp[2 * L + k];
        }
}

#define SW_OBL_AVX512_F(V, NAME)                                                            \
__attribute__((target("avx512f")))                                                          \
static void NAME(const sw_obl *o, const uint32_t *cols, const float *leaves, float *acc) {   \
    const int32_t D = o->depth;                                                             \
    const int64_t nl = (int64_t)1 << D;                                                     \
    __m512 a[V];                                                                            \
    _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) a[v] = _mm512_loadu_ps(acc + 16 * v);\
    for (int64_t t = 0; t < o->n_trees; t++) {                                              \
        SW_OBL_AVX512_POS(V)                                                                \
        const float *lv = leaves + t * nl;                                                  \
        _Pragma("GCC unroll 4") for (int v = 0; v < V; v++)                                 \
            a[v] = _mm512_add_ps(a[v], _mm512_i32gather_ps(p[v], lv, 4));                   \
    }                                                                                       \
    _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) _mm512_storeu_ps(acc + 16 * v, a[v]);\
}
SW_OBL_AVX512_F(1, sw_obl_sum512_f1)
SW_OBL_AVX512_F(4, sw_obl_sum512_f4)

/* AVX2: V vectors of 8 rows (V = 1 or 4); unsigned compare as signed after flipping the top
   bit of both sides */
#define SW_OBL_AVX2_POS(V)                                                                  \
        const uint32_t *key = o->key + t * D, *thr = o->thr + t * D;                        \
        __m256i p[V];                                                                       \
        _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) p[v] = _mm256_setzero_si256();   \
        for (int32_t l = 0; l < D; l++) {                                                   \
            const uint32_t *c = cols + (int64_t)key[l] * SW_OBL_R;                          \
            const __m256i th = _mm256_set1_epi32((int)(thr[l] ^ 0x80000000u));             \
            const __m256i bit = _mm256_set1_epi32(1 << (D - 1 - l));                        \
            _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) {                           \
                const __m256i x = _mm256_xor_si256(                                         \
                    _mm256_loadu_si256((const __m256i *)(c + 8 * v)), sign);                \
                p[v] = _mm256_or_si256(p[v], _mm256_and_si256(_mm256_cmpgt_epi32(x, th), bit));\
            }                                                                               \
        }

#define SW_OBL_AVX2_D(V, NAME)                                                              \
__attribute__((target("avx2")))                                                             \
static void NAME(const sw_obl *o, const uint32_t *cols, const double *leaves, double *acc) { \
    const int32_t D = o->depth;                                                             \
    const int64_t nl = (int64_t)1 << D;                                                     \
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u);                               \
    __m256d a[2 * V];                                                                       \
    _Pragma("GCC unroll 8") for (int i = 0; i < 2 * V; i++) a[i] = _mm256_loadu_pd(acc + 4 * i);\
    for (int64_t t = 0; t < o->n_trees; t++) {                                              \
        SW_OBL_AVX2_POS(V)                                                                  \
        const double *lv = leaves + t * nl;                                                 \
        _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) {                               \
            a[2 * v] = _mm256_add_pd(a[2 * v],                                              \
                _mm256_i32gather_pd(lv, _mm256_castsi256_si128(p[v]), 8));                  \
            a[2 * v + 1] = _mm256_add_pd(a[2 * v + 1],                                      \
                _mm256_i32gather_pd(lv, _mm256_extracti128_si256(p[v], 1), 8));             \
        }                                                                                   \
    }                                                                                       \
    _Pragma("GCC unroll 8") for (int i = 0; i < 2 * V; i++) _mm256_storeu_pd(acc + 4 * i, a[i]);\
}
SW_OBL_AVX2_D(1, sw_obl_sum256_d1)
SW_OBL_AVX2_D(4, sw_obl_sum256_d4)

#define SW_OBL_AVX2_F(V, NAME)                                                              \
__attribute__((target("avx2")))                                                             \
static void NAME(const sw_obl *o, const uint32_t *cols, const float *leaves, float *acc) {   \
    const int32_t D = o->depth;                                                             \
    const int64_t nl = (int64_t)1 << D;                                                     \
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u);                               \
    __m256 a[V];                                                                            \
    _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) a[v] = _mm256_loadu_ps(acc + 8 * v); \
    for (int64_t t = 0; t < o->n_trees; t++) {                                              \
        SW_OBL_AVX2_POS(V)                                                                  \
        const float *lv = leaves + t * nl;                                                  \
        _Pragma("GCC unroll 4") for (int v = 0; v < V; v++)                                 \
            a[v] = _mm256_add_ps(a[v], _mm256_i32gather_ps(lv, p[v], 4));                   \
    }                                                                                       \
    _Pragma("GCC unroll 4") for (int v = 0; v < V; v++) _mm256_storeu_ps(acc + 8 * v, a[v]); \
}
SW_OBL_AVX2_F(1, sw_obl_sum256_f1)
SW_OBL_AVX2_F(4, sw_obl_sum256_f4)
#endif

/* The block's first n rows (cols from sw_obl_cols): acc[r] += every tree's leaf. acc has
   room for SW_OBL_R values; rows n .. SW_OBL_R - 1 of it are scratch. */
static inline void sw_obl_sum_d(const sw_obl *o, const uint32_t *cols, int32_t n,
                                const double *leaves, double *acc) {
#ifdef SW_OBL_X86
    if (o->simd == SW_OBL_AVX512) {
        /* read once: Forest.oblivious_halves may switch it while another thread scores */
        const uint32_t *halves = __atomic_load_n(&o->halves, __ATOMIC_RELAXED);
        if (halves != NULL && o->depth <= 6) {
            if (n > 16) sw_obl_sum512_h4(o, cols, halves, acc);
            else sw_obl_sum512_h1(o, cols, halves, acc);
        }
        else if (n > 16) sw_obl_sum512_d4(o, cols, leaves, acc);
        else sw_obl_sum512_d1(o, cols, leaves, acc);
        return;
    }
    if (o->simd == SW_OBL_AVX2) {
        if (n > 32) { sw_obl_sum256_d4(o, cols, leaves, acc);
                      sw_obl_sum256_d4(o, cols + 32, leaves, acc + 32); }
        else if (n > 8) sw_obl_sum256_d4(o, cols, leaves, acc);
        else sw_obl_sum256_d1(o, cols, leaves, acc);
        return;
    }
#endif
    sw_obl_sum_row_d(o, cols, n, leaves, acc);
}

/* The block's first n rows by the bins (sw_obl_bins512 into bins, n_columns * SW_OBL_R bytes,
   then sw_obl_sum512_w): acc[r] += every tree's leaf, as sw_obl_sum_d. 1 if it scored; 0 where
   the bins do not apply (not AVX-512, not built or switched off, 16 rows or fewer: the halves
   take those without binning every column), and acc is untouched. */
static inline int sw_obl_sum_bins(const sw_obl *o, const uint32_t *cols, int32_t n,
                                  uint8_t *bins, double *acc) {
#ifdef SW_OBL_X86
    /* read once: Forest.oblivious_bins may switch it while another thread scores */
    const uint16_t *quarters = __atomic_load_n(&o->quarters, __ATOMIC_RELAXED);
    if (o->simd != SW_OBL_AVX512 || quarters == NULL || bins == NULL || n <= 16
            || o->depth > 6)
        return 0;
    sw_obl_bins512(o, cols, bins);
    sw_obl_sum512_w(o, bins, quarters, acc);
    return 1;
#else
    (void)o; (void)cols; (void)n; (void)bins; (void)acc;
    return 0;
#endif
}

static inline void sw_obl_sum_f(const sw_obl *o, const uint32_t *cols, int32_t n,
                                const float *leaves, float *acc) {
#ifdef SW_OBL_X86
    if (o->simd == SW_OBL_AVX512) {
        if (n > 16) sw_obl_sum512_f4(o, cols, leaves, acc);
        else sw_obl_sum512_f1(o, cols, leaves, acc);
        return;
    }
    if (o->simd == SW_OBL_AVX2) {
        if (n > 32) { sw_obl_sum256_f4(o, cols, leaves, acc);
                      sw_obl_sum256_f4(o, cols + 32, leaves, acc + 32); }
        else if (n > 8) sw_obl_sum256_f4(o, cols, leaves, acc);
        else sw_obl_sum256_f1(o, cols, leaves, acc);
        return;
    }
#endif
    sw_obl_sum_row_f(o, cols, n, leaves, acc);
}
#endif
