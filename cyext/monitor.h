/* Flight monitoring's block counters (cyext/monitor.pyx): for each row of a staged block,
   each feature's value against each of its reference bin edges, the missing values and the
   values outside the reference range. The rows are laid out SW_MON_LANES features to a
   chunk (a row's stride padded to a whole chunk, NaN in the padding), and for a chunk every
   counter of the block is kept in registers while the rows stream by: one vector load a row
   and a chunk, then a compare and an add an edge. Compiled for AVX-512, AVX2 and the
   baseline, the CPU's best taken at load (GCC's target_clones). */
#ifndef SW_MONITOR_H
#define SW_MONITOR_H
#include <stdint.h>
#include <string.h>

#define SW_MON_LANES 16
#define SW_MON_EDGES 9  /* edges a pass (10 bins, the default); more: further passes */

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SW_MON_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SW_MON_CLONES
#endif

typedef float sw_mon_vf __attribute__((vector_size(4 * SW_MON_LANES), aligned(4)));
typedef int32_t sw_mon_vi __attribute__((vector_size(4 * SW_MON_LANES), aligned(4)));

/* Rows X[0..n) (row r at X + r * rstride; SW_MON_LANES values are read from each chunk's
   start, so a row's last chunk may read past its features into the next row or a slack:
   those lanes' edges are NaN, their counters unread; nfp: the features padded to whole
   chunks, a multiple of SW_MON_LANES; n small enough for int32):
   ge[k * nfp + j] += values >= edge k of feature j (et: the edges transposed, stride nfp,
   NaN past a feature's own: never >=), for edges k0..k0+SW_MON_EDGES (NaN past width);
   with k0 == 0 also miss, below and above (stride nfp). GCC's vector types: a compare
   is -1 where true, so counters subtract it. */
SW_MON_CLONES
static void sw_mon_count(const float* restrict X, int64_t n, int64_t rstride, int64_t nfp,
                         const float* restrict et, int64_t k0,
                         const float* restrict lo, const float* restrict hi,
                         int32_t* restrict ge, int32_t* restrict miss,
                         int32_t* restrict below, int32_t* restrict above)
{
    for (int64_t j0 = 0; j0 < nfp; j0 += SW_MON_LANES) {
        sw_mon_vi acc[SW_MON_EDGES], m = {0}, b = {0}, a = {0};
        sw_mon_vf e[SW_MON_EDGES], l, h;
        for (int k = 0; k < SW_MON_EDGES; k++) {
            acc[k] = (sw_mon_vi){0};
            memcpy(&e[k], et + (k0 + k) * nfp + j0, sizeof e[k]);
        }
        memcpy(&l, lo + j0, sizeof l);
        memcpy(&h, hi + j0, sizeof h);
        if (k0 == 0) {
            for (int64_t r = 0; r < n; r++) {
                sw_mon_vf v;
                memcpy(&v, X + r * rstride + j0, sizeof v);
                m -= v != v;
                b -= v < l;
                a -= v > h;
                for (int k = 0; k < SW_MON_EDGES; k++)
                    acc[k] -= v >= e[k];
            }
        } else {
            for (int64_t r = 0; r < n; r++) {
                sw_mon_vf v;
                memcpy(&v, X + r * rstride + j0, sizeof v);
                for (int k = 0; k < SW_MON_EDGES; k++)
                    acc[k] -= v >= e[k];
            }
        }
        for (int k = 0; k < SW_MON_EDGES; k++)
            for (int i = 0; i < SW_MON_LANES; i++)
                ge[(k0 + k) * nfp + j0 + i] += acc[k][i];
        if (k0 == 0) {
            for (int i = 0; i < SW_MON_LANES; i++) {
                miss[j0 + i] += m[i];
                below[j0 + i] += b[i];
                above[j0 + i] += a[i];
            }
        }
    }
}
#define SW_MON_SLANES 8  /* scores a vector */
typedef double sw_mon_vd __attribute__((vector_size(8 * SW_MON_SLANES), aligned(8)));
typedef int64_t sw_mon_vl __attribute__((vector_size(8 * SW_MON_SLANES), aligned(8)));

/* Scores sc[0..n) against the m ascending edges (none NaN): ge[k] += the scores >= edge k,
   *nan += the NaN scores; SW_MON_SLANES scores a vector, SW_MON_EDGES edges a pass (the
   pass's edges past m are NaN: never >=), the last n % SW_MON_SLANES one at a time. A score
   a bin as a scalar loop (counts[b] += 1: a chain through memory when scores share a bin)
   made a 1,000-row block's count 16.2 us against 10.9 without scores; this, 12.4
   (bench/monitor_micro.py under bench/ab.py, bench/NOTES.md). */
SW_MON_CLONES
static void sw_mon_score_ge(const double* restrict sc, int64_t n,
                            const double* restrict edges, int64_t m,
                            int64_t* restrict ge, int64_t* restrict nan)
{
    const int64_t nv = n - n % SW_MON_SLANES;
    int64_t k0 = 0;
    do {
        sw_mon_vl acc[SW_MON_EDGES], na = {0};
        sw_mon_vd e[SW_MON_EDGES];
        double es[SW_MON_EDGES];
        for (int k = 0; k < SW_MON_EDGES; k++) {
            acc[k] = (sw_mon_vl){0};
            es[k] = k0 + k < m ? edges[k0 + k] : __builtin_nan("");
            for (int i = 0; i < SW_MON_SLANES; i++)
                e[k][i] = es[k];
        }
        for (int64_t i = 0; i < nv; i += SW_MON_SLANES) {
            sw_mon_vd v;
            memcpy(&v, sc + i, sizeof v);
            na -= v != v;
            for (int k = 0; k < SW_MON_EDGES; k++)
                acc[k] -= v >= e[k];
        }
        int64_t tn = 0, tge[SW_MON_EDGES] = {0};
        for (int64_t i = nv; i < n; i++) {
            double v = sc[i];
            tn += v != v;
            for (int k = 0; k < SW_MON_EDGES; k++)
                tge[k] += v >= es[k];
        }
        for (int k = 0; k < SW_MON_EDGES && k0 + k < m; k++) {
            int64_t t = tge[k];
            for (int i = 0; i < SW_MON_SLANES; i++)
                t += acc[k][i];
            ge[k0 + k] += t;
        }
        if (k0 == 0) {
            for (int i = 0; i < SW_MON_SLANES; i++)
                tn += na[i];
            *nan += tn;
        }
        k0 += SW_MON_EDGES;
    } while (k0 < m);
}

/* X[0..n) rows of nf floats (row r at X + r * nf): miss[j] += the NaN values of column j. */
SW_MON_CLONES
static void sw_mon_missing(const float* restrict X, int64_t n, int64_t nf,
                           int64_t* restrict miss)
{
    for (int64_t r = 0; r < n; r++) {
        const float* row = X + r * nf;
        for (int64_t j = 0; j < nf; j++)
            miss[j] += row[j] != row[j];
    }
}
#endif
