/* QuickScorer for compact models whose trees have at most 64 leaves (tables:
   worker/model/quickscorer.py). One row: every tree's 64-bit mask of reachable leaves starts
   full; each split the row goes right at ANDs its tree's mask with the node's mask (its left
   subtree's leaves removed); the leaf is the lowest bit left. The splits the row goes right at
   are found per feature: numerical ones sorted by threshold key (a scan while key(thr) <
   key(x)), the feature's "missing goes right" list for NaN, and for a staged categorical
   feature the list of its index. */
#ifndef SW_QS_H
#define SW_QS_H
#include <stdint.h>
#include <string.h>

typedef struct { uint32_t thr; uint32_t tree; uint64_t mask; } sw_qsnode;

typedef struct {
    const sw_qsnode *num; const int32_t *num_off;   /* per feature, sorted by thr */
    const sw_qsnode *nan; const int32_t *nan_off;   /* per feature: NaN goes right */
    const sw_qsnode *cat; const int32_t *cat_off;   /* per (feature, staged index) */
    const int32_t *cat_base;                        /* per feature: -1, or its first list */
    const int32_t *cat_width;                       /* per feature: its lists (n + 3) */
    const int32_t *leaf;                            /* n_trees x 64: leaf rank -> slot */
    int64_t n_trees;
    int32_t n_features;
    int32_t simd;                                   /* SW_QS_*: 8 rows at once, or one */
} sw_qs;

static inline void sw_qs_apply(const sw_qsnode *e, int32_t k, int32_t end, uint64_t *mk) {
    for (; k < end; k++) mk[e[k].tree] &= e[k].mask;
}

/* slot[t] (t < n_trees) = the leaf slot of row x in tree t; mk: n_trees words of scratch */
static inline void sw_qs_row(const sw_qs *q, const float *x, uint64_t *mk, int64_t *slot) {
    const int64_t T = q->n_trees;
    memset(mk, 0xFF, (size_t)T * sizeof *mk);
    for (int32_t f = 0; f < q->n_features; f++) {
        uint32_t b;
        memcpy(&b, &x[f], sizeof b);
        const int32_t cb = q->cat_base[f];
        if (cb >= 0) {   /* a staged index; kept inside the feature's lists whatever it is */
            const uint32_t i = b < (uint32_t)q->cat_width[f] ? b : (uint32_t)q->cat_width[f] - 1u;
            sw_qs_apply(q->cat, q->cat_off[cb + i], q->cat_off[cb + i + 1], mk);
        } else if ((b & 0x7FFFFFFFu) > 0x7F800000u) {
            sw_qs_apply(q->nan, q->nan_off[f], q->nan_off[f + 1], mk);
        } else {
            const uint32_t key = b ^ ((uint32_t)((int32_t)b >> 31) | 0x80000000u);
            const sw_qsnode *e = q->num;
            int32_t k = q->num_off[f];
            const int32_t end = q->num_off[f + 1];
            for (; k < end && e[k].thr < key; k++) mk[e[k].tree] &= e[k].mask;
        }
    }
    for (int64_t t = 0; t < T; t++)
        slot[t] = q->leaf[t * 64 + __builtin_ctzll(mk[t] | (1ull << 63))];  /* never 0 */
}

/* V-QuickScorer (SIMD across rows): up to 8 rows at once, each tree's 8 masks in one 64-byte
   line (mk[t * 8 + r]). A numerical list is scanned once for the 8 rows, while its threshold
   is below the largest of their keys; each entry ANDs the masks of the rows above it (a
   compare gives the lane mask). NaN and categorical lists stay per row. x86-64 only, what the
   CPU has asked at run time (sw_qs_simd_on): AVX-512 F+VL (one 512-bit masked AND per entry)
   or AVX2 (two 256-bit halves); elsewhere, and with sw_qs.simd SW_QS_ROW, sw_qs_row. */
#define SW_QS_R 8
enum { SW_QS_ROW = 0, SW_QS_AVX2 = 1, SW_QS_AVX512 = 2 };
static int sw_qs_simd = -1;   /* the best the CPU has: -1 not asked yet, else SW_QS_* */
static inline int sw_qs_simd_on(void) {
#if defined(__GNUC__) && defined(__x86_64__) && !defined(SW_NO_ASM)
    if (sw_qs_simd < 0) {
        __builtin_cpu_init();
        sw_qs_simd = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")
            ? SW_QS_AVX512 : __builtin_cpu_supports("avx2") ? SW_QS_AVX2 : SW_QS_ROW;
    }
    return sw_qs_simd;
#else
    return SW_QS_ROW;
#endif
}

/* Feature f of rows x + r * ldx (r < n): a categorical feature's and a NaN's lists applied
   per row; key[r] the order key of each other row's value (0 for the rest: never right);
   returns the largest key. */
static inline uint32_t sw_qs_prep(const sw_qs *q, const float *x, int64_t ldx, int32_t n,
                                  int32_t f, uint64_t *mk, uint32_t *key) {
    const int32_t cb = q->cat_base[f];
    uint32_t kmax = 0;
    for (int32_t r = 0; r < SW_QS_R; r++) key[r] = 0;
    for (int32_t r = 0; r < n; r++) {
        uint32_t b;
        memcpy(&b, &x[r * ldx + f], sizeof b);
        const sw_qsnode *e;
        int32_t k, end;
        if (cb >= 0) {
            const uint32_t w = (uint32_t)q->cat_width[f];
            const uint32_t i = b < w ? b : w - 1u;
            e = q->cat, k = q->cat_off[cb + i], end = q->cat_off[cb + i + 1];
        } else if ((b & 0x7FFFFFFFu) > 0x7F800000u) {
            e = q->nan, k = q->nan_off[f], end = q->nan_off[f + 1];
        } else {
            key[r] = b ^ ((uint32_t)((int32_t)b >> 31) | 0x80000000u);
            kmax = key[r] > kmax ? key[r] : kmax;
            continue;
        }
        for (; k < end; k++) mk[(int64_t)e[k].tree * SW_QS_R + r] &= e[k].mask;
    }
    return kmax;
}

static inline void sw_qs_leaves8(const sw_qs *q, int32_t n, const uint64_t *mk, int64_t *slot) {
    const int64_t T = q->n_trees;
    for (int32_t r = 0; r < n; r++)
        for (int64_t t = 0; t < T; t++)
            slot[r * T + t] = q->leaf[t * 64 + __builtin_ctzll(mk[t * SW_QS_R + r] | (1ull << 63))];
}

#if defined(__GNUC__) && defined(__x86_64__) && !defined(SW_NO_ASM)
#include <immintrin.h>
/* rows x + r * ldx (r < n <= 8): slot[r * n_trees + t]; mk: 8 * n_trees words of scratch */
__attribute__((target("avx512f,avx512vl")))
static void sw_qs_rows8_avx512(const sw_qs *q, const float *x, int64_t ldx, int32_t n,
                               uint64_t *mk, int64_t *slot) {
    const __m512i all = _mm512_set1_epi64(-1);
    for (int64_t t = 0; t < q->n_trees; t++) _mm512_storeu_si512((void *)(mk + t * SW_QS_R), all);
    for (int32_t f = 0; f < q->n_features; f++) {
        uint32_t key[SW_QS_R];
        const uint32_t kmax = sw_qs_prep(q, x, ldx, n, f, mk, key);
        if (q->cat_base[f] >= 0) continue;
        const __m256i kv = _mm256_loadu_si256((const __m256i *)key);
        const sw_qsnode *e = q->num;
        const int32_t end = q->num_off[f + 1];
        for (int32_t k = q->num_off[f]; k < end && e[k].thr < kmax; k++) {
            const __mmask8 m = _mm256_cmplt_epu32_mask(_mm256_set1_epi32((int)e[k].thr), kv);
            uint64_t *p = mk + (int64_t)e[k].tree * SW_QS_R;
            const __m512i v = _mm512_loadu_si512((const void *)p);
            _mm512_storeu_si512((void *)p, _mm512_mask_and_epi64(
                v, m, v, _mm512_set1_epi64((long long)e[k].mask)));
        }
    }
    sw_qs_leaves8(q, n, mk, slot);
}

/* the same with AVX2: keys compared as signed after flipping their top bit, the 8 lane
   masks widened to two halves of four 64-bit lanes, each half's masks cleared by andnot */
__attribute__((target("avx2")))
static void sw_qs_rows8_avx2(const sw_qs *q, const float *x, int64_t ldx, int32_t n,
                             uint64_t *mk, int64_t *slot) {
    const __m256i all = _mm256_set1_epi64x(-1), flip = _mm256_set1_epi32((int)0x80000000u);
    for (int64_t t = 0; t < q->n_trees; t++) {
        _mm256_storeu_si256((__m256i *)(mk + t * SW_QS_R), all);
        _mm256_storeu_si256((__m256i *)(mk + t * SW_QS_R + 4), all);
    }
    for (int32_t f = 0; f < q->n_features; f++) {
        uint32_t key[SW_QS_R];
        const uint32_t kmax = sw_qs_prep(q, x, ldx, n, f, mk, key);
        if (q->cat_base[f] >= 0) continue;
        const __m256i kv = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)key), flip);
        const sw_qsnode *e = q->num;
        const int32_t end = q->num_off[f + 1];
        for (int32_t k = q->num_off[f]; k < end && e[k].thr < kmax; k++) {
            const __m256i gt = _mm256_cmpgt_epi32(
                kv, _mm256_xor_si256(_mm256_set1_epi32((int)e[k].thr), flip));
            const __m256i clear = _mm256_set1_epi64x((long long)~e[k].mask);
            __m256i *p = (__m256i *)(mk + (int64_t)e[k].tree * SW_QS_R);
            const __m256i lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(gt));
            const __m256i hi = _mm256_cvtepi32_epi64(_mm256_extracti128_si256(gt, 1));
            _mm256_storeu_si256(p, _mm256_andnot_si256(_mm256_and_si256(lo, clear),
                                                       _mm256_loadu_si256(p)));
            _mm256_storeu_si256(p + 1, _mm256_andnot_si256(_mm256_and_si256(hi, clear),
                                                           _mm256_loadu_si256(p + 1)));
        }
    }
    sw_qs_leaves8(q, n, mk, slot);
}
#endif

/* up to 8 rows with the SIMD kernel q->simd names (one row at a time for SW_QS_ROW) */
static void sw_qs_rows8(const sw_qs *q, const float *x, int64_t ldx, int32_t n, uint64_t *mk,
                        int64_t *slot) {
#if defined(__GNUC__) && defined(__x86_64__) && !defined(SW_NO_ASM)
    if (q->simd == SW_QS_AVX512) { sw_qs_rows8_avx512(q, x, ldx, n, mk, slot); return; }
    if (q->simd == SW_QS_AVX2) { sw_qs_rows8_avx2(q, x, ldx, n, mk, slot); return; }
#endif
    for (int32_t r = 0; r < n; r++) sw_qs_row(q, x + r * ldx, mk, slot + r * q->n_trees);
}
#endif
