/* The leaf-mask kernel: QuickScorer's masks (qs.h) for 16 rows in the lanes of AVX-512
   registers, tree after tree, every split of a tree asked of every row of the block.

   A block of 16 rows is staged by column as the lanes kernel stages it (lanes.h
   sw_lanes_stage: column 2f holds key(x[f]) with a NaN as 0, column 2f + 1 the same with a
   NaN as 0xFFFFFFFF), so a split's question for 16 rows is one aligned load of its column and
   one unsigned compare with its threshold's key: the rows going right. A tree of at most 64
   leaves keeps, for each row, the leaves the row can still reach, numbered left to right, as
   two 32-bit words (ranks 0-31 and 32-63) in two registers of 16 lanes; a split ANDs the
   words of the rows it sends right with its mask (its left subtree's leaves removed). A split
   whose left subtree lies within one word is one entry of that word's list, one that spans
   both is an entry in each. The AND commutes, so the lists are taken one after the other,
   without a branch on the tree's shape. The row's leaf is the lowest bit left: the low word's
   if it has one, else 32 + the high word's. Its value is permuted out of the tree's 64-entry
   leaf table and added to the row's sum, tree after tree in tree order: every sum is the
   walks' (and so the library's) to the bit.

   Why: the walks and the partition walk take a row's path step by step, each step a load
   whose address waits on the step before (the walks) or a gather (the partition walk), and
   leaf-wise LightGBM trees of 63 leaves took 4.8 steps a row and tree for 2.5 us a row
   (bench/NOTES.md "The leaf-mask kernel"). Here a split costs one compare and one AND for 16
   rows, whatever its depth, and the registers of up to SW_MASKS_NB blocks share each split's
   threshold and mask: about 64 entries a tree, no gather, no branch on the rows.

   Bounds: every read is within the caller's tables and the blocks (SW_MASKS_NB blocks of 2
   n_features columns of 16 keys, on the heap). An entry's column offset is key * 16 with
   key < 2 n_features, and the lists' offsets rise from 0 to n_ent, checked when the tables
   are built (kernels.Forest._masks). A leaf index is at most 63 whatever the masks hold (a
   permute reads the low 5 bits of a 32-entry pair, a blend picks the pair), inside the
   tree's 64 entries. n_features is at most SW_MASKS_MAXF. */
#ifndef SW_MASKS_H
#define SW_MASKS_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lanes.h"

#define SW_MASKS 16          /* rows a block */
#define SW_MASKS_NB 4        /* blocks a group: each split's registers loaded once for 64 rows */
#define SW_MASKS_LEAVES 64   /* a tree's leaf table */
#define SW_MASKS_MAXF 512    /* features (a group: 4 x 2 x 512 columns of 16 keys, 256 KB) */

typedef struct { uint32_t col, thr, mask, pad; } sw_mask_ent;  /* col: key * 16 */

typedef struct {
    const sw_mask_ent *ent;  /* tree t's low-word entries [off[2t], off[2t + 1]), its
                                high-word entries [off[2t + 1], off[2t + 2]) */
    const int64_t *off;      /* 2 n_trees + 1, rising from 0 to n_ent */
    const void *leaf;        /* n_trees x 64 floats: leaf rank i's value; with f64, n_trees x
                                128 words: the 64 doubles' low 32-bit words, then their high
                                words */
    int64_t n_trees;
    int64_t n_ent;
    int32_t n_features;      /* 1..SW_MASKS_MAXF */
    int32_t f64;             /* leaves and sums are double */
} sw_masks;

/* 1 when the CPU has AVX-512F and CD (vplzcntd finds the lowest leaf left); a CPU without
   them scores with the walks */
static int sw_masks_cpu_v = -1;
static inline int sw_masks_cpu(void) {
#if defined(__GNUC__) && defined(__x86_64__)
    if (sw_masks_cpu_v < 0) {
        __builtin_cpu_init();
        sw_masks_cpu_v = __builtin_cpu_supports("avx512f") &&
            __builtin_cpu_supports("avx512cd") ? 1 : 0;
    }
    return sw_masks_cpu_v;
#else
    return 0;
#endif
}

#ifdef SW_LANES_X86
#define SW_MASKS_ATTR __attribute__((target("avx512f,avx512cd")))

/* tree t's words for NB blocks: lo[b], hi[b] start full, each entry ANDs the rows it sends
   right */
#define SW_MASKS_TREE(NB, M, cb, stride, t, lo, hi) {                                       \
    const sw_mask_ent *e_ = (M)->ent + (M)->off[2 * (t)];                                   \
    const sw_mask_ent *m_ = (M)->ent + (M)->off[2 * (t) + 1];                               \
    const sw_mask_ent *z_ = (M)->ent + (M)->off[2 * (t) + 2];                               \
    _Pragma("GCC unroll 4") for (int b = 0; b < (NB); b++)                                  \
        lo[b] = hi[b] = _mm512_set1_epi32(-1);                                              \
    for (; e_ < m_; e_++) {                                                                 \
        const __m512i th_ = _mm512_set1_epi32((int)e_->thr);                                \
        const __m512i mk_ = _mm512_set1_epi32((int)e_->mask);                               \
        const uint32_t *v_ = (cb) + e_->col;                                                \
        _Pragma("GCC unroll 4") for (int b = 0; b < (NB); b++)                              \
            lo[b] = _mm512_mask_and_epi32(lo[b], _mm512_cmplt_epu32_mask(                   \
                th_, _mm512_load_si512((const void *)(v_ + b * (stride)))), lo[b], mk_);     \
    }                                                                                       \
    for (; e_ < z_; e_++) {                                                                 \
        const __m512i th_ = _mm512_set1_epi32((int)e_->thr);                                \
        const __m512i mk_ = _mm512_set1_epi32((int)e_->mask);                               \
        const uint32_t *v_ = (cb) + e_->col;                                                \
        _Pragma("GCC unroll 4") for (int b = 0; b < (NB); b++)                              \
            hi[b] = _mm512_mask_and_epi32(hi[b], _mm512_cmplt_epu32_mask(                   \
                th_, _mm512_load_si512((const void *)(v_ + b * (stride)))), hi[b], mk_);     \
    }                                                                                       \
}

/* each lane's leaf rank, 0..63: the lowest bit of lo, else 32 + the lowest of hi (a lane
   whose words are both empty, which no tree's masks leave, gets 31: still in the table) */
SW_MASKS_ATTR static inline __m512i sw_masks_rank(__m512i lo, __m512i hi) {
    const __m512i z = _mm512_setzero_si512();
    const __m512i il = _mm512_sub_epi32(_mm512_set1_epi32(31), _mm512_lzcnt_epi32(
        _mm512_and_si512(lo, _mm512_sub_epi32(z, lo))));
    const __m512i ih = _mm512_sub_epi32(_mm512_set1_epi32(63), _mm512_lzcnt_epi32(
        _mm512_and_si512(hi, _mm512_sub_epi32(z, hi))));
    return _mm512_mask_blend_epi32(_mm512_test_epi32_mask(lo, lo), ih, il);
}

/* the lanes' accumulators of NB blocks, n rows in all (the last block may be partial) */
#define SW_MASKS_OK(n, b) ((__mmask16)((n) - 16 * (b) >= 16 ? 0xFFFFu                      \
                                        : (n) - 16 * (b) <= 0 ? 0u                          \
                                        : (1u << ((n) - 16 * (b))) - 1u))

#define SW_DEF_MASKS_F32(NB)                                                                \
SW_MASKS_ATTR static void sw_masks_f32_##NB(const sw_masks *M, const uint32_t *cb,          \
                                            int64_t stride, int32_t n, float *acc) {        \
    __m512 a[NB];                                                                           \
    _Pragma("GCC unroll 4") for (int b = 0; b < (NB); b++)                                  \
        a[b] = _mm512_maskz_loadu_ps(SW_MASKS_OK(n, b), acc + 16 * b);                      \
    const float *lf = (const float *)M->leaf;                                               \
    for (int64_t t = 0; t < M->n_trees; t++) {                                              \
        __m512i lo[NB], hi[NB];                                                             \
        SW_MASKS_TREE(NB, M, cb, stride, t, lo, hi)                                         \
        const float *lt = lf + t * SW_MASKS_LEAVES;                                         \
        const __m512 P0 = _mm512_loadu_ps(lt), P1 = _mm512_loadu_ps(lt + 16);               \
        const __m512 P2 = _mm512_loadu_ps(lt + 32), P3 = _mm512_loadu_ps(lt + 48);          \
        _Pragma("GCC unroll 4") for (int b = 0; b < (NB); b++) {                            \
            const __m512i i = sw_masks_rank(lo[b], hi[b]);                                  \
            a[b] = _mm512_add_ps(a[b], _mm512_mask_blend_ps(                                \
                _mm512_test_epi32_mask(i, _mm512_set1_epi32(32)),                           \
                _mm512_permutex2var_ps(P0, i, P1), _mm512_permutex2var_ps(P2, i, P3)));     \
        }                                                                                   \
    }                                                                                       \
    _Pragma("GCC unroll 4") for (int b = 0; b < (NB); b++)                                  \
        _mm512_mask_storeu_ps(acc + 16 * b, SW_MASKS_OK(n, b), a[b]);                       \
}

/* double leaves, held as 32-bit halves (the tree's 64 low words, then its 64 high words, as
   the oblivious kernel's sw_obl_sum512_h holds them): a lane's low word and high word are each
   picked by two two-register permutes and a blend, and an unpack puts each row's two words
   back together as its double: 4 permutes for 16 rows where picking doubles 8 at a time takes
   8. The bits move unchanged. The unpacks leave rows 16b + {0,1,4,5,8,9,12,13} in a[2b] and
   {2,3,6,7,10,11,14,15} in a[2b + 1], put in that order on load and back on store. */
#define SW_DEF_MASKS_F64(NB)                                                                \
SW_MASKS_ATTR static void sw_masks_f64_##NB(const sw_masks *M, const uint32_t *cb,          \
                                            int64_t stride, int32_t n, double *acc) {       \
    const __m512i g0 = _mm512_set_epi64(13, 12, 9, 8, 5, 4, 1, 0);                          \
    const __m512i g1 = _mm512_set_epi64(15, 14, 11, 10, 7, 6, 3, 2);                        \
    const __m512i b0 = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);                          \
    const __m512i b1 = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);                        \
    __m512d a[2 * NB];                                                                      \
    _Pragma("GCC unroll 4") for (int b = 0; b < (NB); b++) {                                \
        const __mmask16 k = SW_MASKS_OK(n, b);                                              \
        const __m512d lo = _mm512_maskz_loadu_pd((__mmask8)k, acc + 16 * b);               \
        const __m512d hi = _mm512_maskz_loadu_pd((__mmask8)(k >> 8), acc + 16 * b + 8);     \
        a[2 * b] = _mm512_permutex2var_pd(lo, g0, hi);                                      \
        a[2 * b + 1] = _mm512_permutex2var_pd(lo, g1, hi);                                  \
    }                                                                                       \
    const uint32_t *lf = (const uint32_t *)M->leaf;                                         \
    for (int64_t t = 0; t < M->n_trees; t++) {                                              \
        __m512i lo[NB], hi[NB];                                                             \
        SW_MASKS_TREE(NB, M, cb, stride, t, lo, hi)                                         \
        const uint32_t *lt = lf + t * 2 * SW_MASKS_LEAVES;                                  \
        const __m512i L0 = _mm512_loadu_si512((const void *)lt);                            \
        const __m512i L1 = _mm512_loadu_si512((const void *)(lt + 16));                     \
        const __m512i L2 = _mm512_loadu_si512((const void *)(lt + 32));                     \
        const __m512i L3 = _mm512_loadu_si512((const void *)(lt + 48));                     \
        const __m512i H0 = _mm512_loadu_si512((const void *)(lt + 64));                     \
        const __m512i H1 = _mm512_loadu_si512((const void *)(lt + 80));                     \
        const __m512i H2 = _mm512_loadu_si512((const void *)(lt + 96));                     \
        const __m512i H3 = _mm512_loadu_si512((const void *)(lt + 112));                    \
        _Pragma("GCC unroll 4") for (int b = 0; b < (NB); b++) {                            \
            const __m512i i = sw_masks_rank(lo[b], hi[b]);                                  \
            const __mmask16 k32 = _mm512_test_epi32_mask(i, _mm512_set1_epi32(32));         \
            const __m512i wl = _mm512_mask_blend_epi32(                                     \
                k32, _mm512_permutex2var_epi32(L0, i, L1), _mm512_permutex2var_epi32(L2, i, L3));\
            const __m512i wh = _mm512_mask_blend_epi32(                                     \
                k32, _mm512_permutex2var_epi32(H0, i, H1), _mm512_permutex2var_epi32(H2, i, H3));\
            a[2 * b] = _mm512_add_pd(a[2 * b],                                              \
                                     _mm512_castsi512_pd(_mm512_unpacklo_epi32(wl, wh)));   \
            a[2 * b + 1] = _mm512_add_pd(a[2 * b + 1],                                      \
                                         _mm512_castsi512_pd(_mm512_unpackhi_epi32(wl, wh))); \
        }                                                                                   \
    }                                                                                       \
    _Pragma("GCC unroll 4") for (int b = 0; b < (NB); b++) {                                \
        const __mmask16 k = SW_MASKS_OK(n, b);                                              \
        _mm512_mask_storeu_pd(acc + 16 * b, (__mmask8)k,                                    \
                              _mm512_permutex2var_pd(a[2 * b], b0, a[2 * b + 1]));          \
        _mm512_mask_storeu_pd(acc + 16 * b + 8, (__mmask8)(k >> 8),                         \
                              _mm512_permutex2var_pd(a[2 * b], b1, a[2 * b + 1]));          \
    }                                                                                       \
}
SW_DEF_MASKS_F32(1) SW_DEF_MASKS_F32(2) SW_DEF_MASKS_F32(3) SW_DEF_MASKS_F32(4)
SW_DEF_MASKS_F64(1) SW_DEF_MASKS_F64(2) SW_DEF_MASKS_F64(3) SW_DEF_MASKS_F64(4)

typedef void (*sw_masks_f32_fn)(const sw_masks *, const uint32_t *, int64_t, int32_t, float *);
typedef void (*sw_masks_f64_fn)(const sw_masks *, const uint32_t *, int64_t, int32_t,
                                double *);
static const sw_masks_f32_fn sw_masks_f32_tab[SW_MASKS_NB + 1] = {
    0, sw_masks_f32_1, sw_masks_f32_2, sw_masks_f32_3, sw_masks_f32_4};
static const sw_masks_f64_fn sw_masks_f64_tab[SW_MASKS_NB + 1] = {
    0, sw_masks_f64_1, sw_masks_f64_2, sw_masks_f64_3, sw_masks_f64_4};
#endif

/* Every tree of M for the n rows x[0..n) (ldx floats apart), each row's sum acc[r] (float, or
   double with M->f64) added to in tree order. A group's blocks are allocated here (4 x 2 x
   n_features x 16 keys, at most 256 KB: on the heap, not the stack). 0, or -1 with nothing
   done: no AVX-512F and CD, no memory, or a table outside the bounds above. */
static inline int sw_masks_rows(const sw_masks *M, const float *x, int64_t ldx, int64_t n,
                                void *acc) {
#ifdef SW_LANES_X86
    if (!sw_masks_cpu() || M->n_features < 1 || M->n_features > SW_MASKS_MAXF || n < 0 ||
        ldx < M->n_features || M->n_trees < 0 || M->off[0] != 0 ||
        M->off[2 * M->n_trees] != M->n_ent)
        return -1;
    const int64_t stride = (int64_t)M->n_features * 2 * SW_MASKS;  /* a block's keys */
    uint32_t *cb = (uint32_t *)aligned_alloc(
        64, (size_t)(SW_MASKS_NB * stride) * sizeof(uint32_t));  /* a multiple of 64 */
    if (cb == NULL)
        return -1;
    const int64_t group = (int64_t)SW_MASKS_NB * SW_MASKS;
    for (int64_t r0 = 0; r0 < n; r0 += group) {
        const int32_t k = (int32_t)(n - r0 < group ? n - r0 : group);
        const int nb = (k + SW_MASKS - 1) / SW_MASKS;
        for (int b = 0; b < nb; b++) {
            const int32_t kb = k - SW_MASKS * b < SW_MASKS ? k - SW_MASKS * b : SW_MASKS;
            sw_lanes_stage(x + (r0 + (int64_t)SW_MASKS * b) * ldx, ldx, kb, M->n_features,
                           cb + b * stride);
        }
        if (M->f64)
            sw_masks_f64_tab[nb](M, cb, stride, k, (double *)acc + r0);
        else
            sw_masks_f32_tab[nb](M, cb, stride, k, (float *)acc + r0);
    }
    free(cb);
    return 0;
#else
    (void)M; (void)x; (void)ldx; (void)n; (void)acc;
    return -1;
#endif
}
#endif
