/* Where the oblivious kernel's time goes (bench/NOTES.md, issue 36): the loop of
   cyext/oblivious.h over one 64-row block, 500 trees x depth 6 of random splits, in the ways
   it was tried. Built and run by bench/oblivious_micro.py (gcc -O3); prints ns a tree and row.

   compares only   the levels' compares and the leaf index, no leaf read (the index converted
                   to a double and added, so nothing is optimised away)
   gather zmm      leaves gathered 8 doubles at a time (the kernel above depth 6)
   gather ymm      leaves gathered 4 at a time
   permute         the tree's 64 leaves in 8 registers, 4 two-register permutes and 3 blends
                   for 8 rows, the blend masks from the index bits (the kernel, depth <= 6)
   permute 64      the same with the index built in 64-bit lanes and the blend masks taken
                   from the first two levels' compares
   permute 32 pext the index in 32-bit lanes (the permutes read even rows from the low half
                   of each 64-bit lane, odd rows after a 32-bit shift), the blend masks the
                   compares' even and odd bits (BMI2 pext): the kernel at depth 6 until
                   issue 56
   halves          the leaves as two tables of 32-bit words (low words, high words), 16 rows'
                   words picked by 32-bit permutes (levels 1-5 the index, level 0 a blend) and
                   put back together as float64 by unpacks: 4 permutes for 16 rows where the
                   above take 8 (the kernel at depth 6 or less since issue 56) */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define R 64
#define T 500
#define D 6
#define NF 30

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((target("avx512f,bmi2")))
static void run(int variant, const uint32_t *key, const uint32_t *thr, const uint32_t *cols,
                const double *leaves, const uint32_t *halves, double *acc) {
    __m512d a[8];
    for (int i = 0; i < 8; i++) a[i] = _mm512_loadu_pd(acc + 8 * i);
    if (variant == 6) {
        /* a[2v] rows 16v + {0,1,4,5,8,9,12,13}, a[2v+1] the others (the unpacks' order);
           the sums are checked over the whole block, so they are not put back in order */
        for (int t = 0; t < T; t++) {
            const uint32_t *k = key + t * D, *th = thr + t * D;
            __mmask16 m0[4];
            __m512i p[4];
            const __m512i t0 = _mm512_set1_epi32((int)th[0]);
            for (int v = 0; v < 4; v++) {
                m0[v] = _mm512_cmpgt_epu32_mask(_mm512_loadu_si512(cols + k[0] * R + 16 * v), t0);
                p[v] = _mm512_setzero_si512();
            }
            for (int l = 1; l < 6; l++) {
                const __m512i tl = _mm512_set1_epi32((int)th[l]);
                const __m512i bit = _mm512_set1_epi32(1 << (5 - l));
                for (int v = 0; v < 4; v++) {
                    const __mmask16 m = _mm512_cmpgt_epu32_mask(
                        _mm512_loadu_si512(cols + k[l] * R + 16 * v), tl);
                    p[v] = _mm512_mask_or_epi32(p[v], m, p[v], bit);
                }
            }
            const uint32_t *h = halves + t * 128;
            const __m512i L0 = _mm512_loadu_si512(h), L1 = _mm512_loadu_si512(h + 16);
            const __m512i L2 = _mm512_loadu_si512(h + 32), L3 = _mm512_loadu_si512(h + 48);
            const __m512i H0 = _mm512_loadu_si512(h + 64), H1 = _mm512_loadu_si512(h + 80);
            const __m512i H2 = _mm512_loadu_si512(h + 96), H3 = _mm512_loadu_si512(h + 112);
            for (int v = 0; v < 4; v++) {
                const __m512i lo = _mm512_mask_blend_epi32(m0[v],
                    _mm512_permutex2var_epi32(L0, p[v], L1), _mm512_permutex2var_epi32(L2, p[v], L3));
                const __m512i hi = _mm512_mask_blend_epi32(m0[v],
                    _mm512_permutex2var_epi32(H0, p[v], H1), _mm512_permutex2var_epi32(H2, p[v], H3));
                a[2 * v] = _mm512_add_pd(a[2 * v], _mm512_castsi512_pd(_mm512_unpacklo_epi32(lo, hi)));
                a[2 * v + 1] = _mm512_add_pd(a[2 * v + 1],
                                             _mm512_castsi512_pd(_mm512_unpackhi_epi32(lo, hi)));
            }
        }
        for (int i = 0; i < 8; i++) _mm512_storeu_pd(acc + 8 * i, a[i]);
        return;
    }
    const __m512i b4 = _mm512_set1_epi64(16), b5 = _mm512_set1_epi64(32);
    for (int t = 0; t < T; t++) {
        const uint32_t *k = key + t * D, *th = thr + t * D;
        const double *lv = leaves + ((long)t << D);
        if (variant == 5) {
            /* levels 2-5 in 32-bit lanes: even rows read as the low halves of 64-bit lanes,
               odd rows after a 32-bit shift; the pair masks the first two levels' compare
               bits, even and odd taken apart (pext); a[2v] even rows, a[2v+1] odd rows */
            unsigned m5[4], m4[4];
            __m512i tv = _mm512_set1_epi32((int)th[0]);
            for (int v = 0; v < 4; v++)
                m5[v] = _mm512_cmpgt_epu32_mask(_mm512_loadu_si512(cols + k[0] * R + 16 * v), tv);
            tv = _mm512_set1_epi32((int)th[1]);
            for (int v = 0; v < 4; v++)
                m4[v] = _mm512_cmpgt_epu32_mask(_mm512_loadu_si512(cols + k[1] * R + 16 * v), tv);
            __m512i p[4];
            for (int v = 0; v < 4; v++) p[v] = _mm512_setzero_si512();
            for (int l = 2; l < 6; l++) {
                const __m512i tl = _mm512_set1_epi32((int)th[l]);
                const __m512i bit = _mm512_set1_epi32(1 << (5 - l));
                for (int v = 0; v < 4; v++) {
                    const __mmask16 m = _mm512_cmpgt_epu32_mask(
                        _mm512_loadu_si512(cols + k[l] * R + 16 * v), tl);
                    p[v] = _mm512_mask_or_epi32(p[v], m, p[v], bit);
                }
            }
            __m512d L[8];
            for (int i = 0; i < 8; i++) L[i] = _mm512_loadu_pd(lv + 8 * i);
            for (int v = 0; v < 4; v++)
                for (int h = 0; h < 2; h++) {
                    const __m512i x = h ? _mm512_srli_epi64(p[v], 32) : p[v];
                    const unsigned sel = h ? 0xAAAAu : 0x5555u;
                    const __m512d a0 = _mm512_permutex2var_pd(L[0], x, L[1]);
                    const __m512d a1 = _mm512_permutex2var_pd(L[2], x, L[3]);
                    const __m512d a2 = _mm512_permutex2var_pd(L[4], x, L[5]);
                    const __m512d a3 = _mm512_permutex2var_pd(L[6], x, L[7]);
                    const __mmask8 k4 = (__mmask8)_pext_u32(m4[v], sel);
                    const __mmask8 k5 = (__mmask8)_pext_u32(m5[v], sel);
                    a[2 * v + h] = _mm512_add_pd(a[2 * v + h], _mm512_mask_blend_pd(
                        k5, _mm512_mask_blend_pd(k4, a0, a1), _mm512_mask_blend_pd(k4, a2, a3)));
                }
            continue;
        }
        if (variant == 4) {
            __mmask16 m5[4], m4[4];
            __m512i tv = _mm512_set1_epi32((int)th[0]);
            for (int v = 0; v < 4; v++)
                m5[v] = _mm512_cmpgt_epu32_mask(_mm512_loadu_si512(cols + k[0] * R + 16 * v), tv);
            tv = _mm512_set1_epi32((int)th[1]);
            for (int v = 0; v < 4; v++)
                m4[v] = _mm512_cmpgt_epu32_mask(_mm512_loadu_si512(cols + k[1] * R + 16 * v), tv);
            __m512i q[8];
            for (int i = 0; i < 8; i++) q[i] = _mm512_setzero_si512();
            for (int l = 2; l < 6; l++) {
                const __m512i tl = _mm512_set1_epi32((int)th[l]);
                const __m512i bit = _mm512_set1_epi64(1 << (5 - l));
                for (int v = 0; v < 4; v++) {
                    const __mmask16 m = _mm512_cmpgt_epu32_mask(
                        _mm512_loadu_si512(cols + k[l] * R + 16 * v), tl);
                    q[2 * v] = _mm512_mask_or_epi64(q[2 * v], (__mmask8)m, q[2 * v], bit);
                    q[2 * v + 1] = _mm512_mask_or_epi64(q[2 * v + 1], (__mmask8)(m >> 8),
                                                        q[2 * v + 1], bit);
                }
            }
            __m512d L[8];
            for (int i = 0; i < 8; i++) L[i] = _mm512_loadu_pd(lv + 8 * i);
            for (int v = 0; v < 4; v++)
                for (int h = 0; h < 2; h++) {
                    const __m512i x = q[2 * v + h];
                    const __m512d a0 = _mm512_permutex2var_pd(L[0], x, L[1]);
                    const __m512d a1 = _mm512_permutex2var_pd(L[2], x, L[3]);
                    const __m512d a2 = _mm512_permutex2var_pd(L[4], x, L[5]);
                    const __m512d a3 = _mm512_permutex2var_pd(L[6], x, L[7]);
                    const __mmask8 k4 = (__mmask8)(m4[v] >> (8 * h));
                    const __mmask8 k5 = (__mmask8)(m5[v] >> (8 * h));
                    a[2 * v + h] = _mm512_add_pd(a[2 * v + h], _mm512_mask_blend_pd(
                        k5, _mm512_mask_blend_pd(k4, a0, a1), _mm512_mask_blend_pd(k4, a2, a3)));
                }
            continue;
        }
        __m512i p[4];
        for (int v = 0; v < 4; v++) p[v] = _mm512_setzero_si512();
        for (int l = 0; l < D; l++) {
            const __m512i tv = _mm512_set1_epi32((int)th[l]);
            const __m512i bit = _mm512_set1_epi32(1 << (D - 1 - l));
            for (int v = 0; v < 4; v++) {
                const __mmask16 m = _mm512_cmpgt_epu32_mask(
                    _mm512_loadu_si512(cols + k[l] * R + 16 * v), tv);
                p[v] = _mm512_mask_or_epi32(p[v], m, p[v], bit);
            }
        }
        for (int v = 0; v < 4; v++) {
            const __m256i lo = _mm512_castsi512_si256(p[v]), hi = _mm512_extracti64x4_epi64(p[v], 1);
            if (variant == 0) {
                a[2 * v] = _mm512_add_pd(a[2 * v], _mm512_cvtepi32_pd(lo));
                a[2 * v + 1] = _mm512_add_pd(a[2 * v + 1], _mm512_cvtepi32_pd(hi));
            } else if (variant == 1) {
                a[2 * v] = _mm512_add_pd(a[2 * v], _mm512_i32gather_pd(lo, lv, 8));
                a[2 * v + 1] = _mm512_add_pd(a[2 * v + 1], _mm512_i32gather_pd(hi, lv, 8));
            } else if (variant == 2) {
                const __m256d g0 = _mm256_i32gather_pd(lv, _mm256_castsi256_si128(lo), 8);
                const __m256d g1 = _mm256_i32gather_pd(lv, _mm256_extracti128_si256(lo, 1), 8);
                const __m256d g2 = _mm256_i32gather_pd(lv, _mm256_castsi256_si128(hi), 8);
                const __m256d g3 = _mm256_i32gather_pd(lv, _mm256_extracti128_si256(hi, 1), 8);
                a[2 * v] = _mm512_add_pd(a[2 * v], _mm512_insertf64x4(
                    _mm512_castpd256_pd512(g0), g1, 1));
                a[2 * v + 1] = _mm512_add_pd(a[2 * v + 1], _mm512_insertf64x4(
                    _mm512_castpd256_pd512(g2), g3, 1));
            } else {
                __m512d L[8];
                for (int i = 0; i < 8; i++) L[i] = _mm512_loadu_pd(lv + 8 * i);
                const __m512i q[2] = {_mm512_cvtepu32_epi64(lo), _mm512_cvtepu32_epi64(hi)};
                for (int h = 0; h < 2; h++) {
                    const __m512d a0 = _mm512_permutex2var_pd(L[0], q[h], L[1]);
                    const __m512d a1 = _mm512_permutex2var_pd(L[2], q[h], L[3]);
                    const __m512d a2 = _mm512_permutex2var_pd(L[4], q[h], L[5]);
                    const __m512d a3 = _mm512_permutex2var_pd(L[6], q[h], L[7]);
                    const __mmask8 k4 = _mm512_test_epi64_mask(q[h], b4);
                    const __mmask8 k5 = _mm512_test_epi64_mask(q[h], b5);
                    a[2 * v + h] = _mm512_add_pd(a[2 * v + h], _mm512_mask_blend_pd(
                        k5, _mm512_mask_blend_pd(k4, a0, a1), _mm512_mask_blend_pd(k4, a2, a3)));
                }
            }
        }
    }
    for (int i = 0; i < 8; i++) _mm512_storeu_pd(acc + 8 * i, a[i]);
}

int main(void) {
    if (!__builtin_cpu_supports("avx512f")) {
        printf("no AVX-512 on this CPU\n");
        return 0;
    }
    static const char *names[] = {"compares only", "gather zmm", "gather ymm", "permute",
                                  "permute 64", "permute 32 pext", "halves"};
    uint32_t *key = malloc(T * D * 4), *thr = malloc(T * D * 4);
    double *leaves = malloc(sizeof(double) * ((long)T << D));
    uint32_t *cols = malloc(2 * NF * R * 4);
    srand(1);
    for (int i = 0; i < T * D; i++) {
        key[i] = (uint32_t)(rand() % (2 * NF));
        thr[i] = (uint32_t)rand() * 2u;
    }
    for (long i = 0; i < ((long)T << D); i++) leaves[i] = rand() / 1e9;
    uint32_t *halves = malloc(sizeof(uint32_t) * T * 128);
    for (long t = 0; t < T; t++)
        for (int i = 0; i < 64; i++) {
            uint64_t b;
            memcpy(&b, leaves + t * 64 + i, 8);
            halves[t * 128 + i] = (uint32_t)b;
            halves[t * 128 + 64 + i] = (uint32_t)(b >> 32);
        }
    for (int i = 0; i < 2 * NF * R; i++) cols[i] = (uint32_t)rand() * 2u;
    const int reps = 4000;
    for (int round = 0; round < 3; round++)
        for (int variant = 0; variant < 7; variant++) {
            double acc[64] = {0};
            const double t0 = now();
            for (int r = 0; r < reps; r++) run(variant, key, thr, cols, leaves, halves, acc);
            double sum = 0;  /* over the block's rows: the same whatever their order */
            for (int i = 0; i < R; i++) sum += acc[i];
            printf("round %d  %-15s %.3f ns a tree and row  (checksum %.6g)\n", round,
                   names[variant], (now() - t0) / (reps * (double)R * T) * 1e9, sum);
        }
    return 0;
}
