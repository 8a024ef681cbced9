/* Exact path-dependent TreeSHAP node by node (MODE_LINEAR, explain.pyx; the sharing of
   Linear TreeSHAP, Yu et al. 2022, in quadrature form) for W rows walking one tree together.

   Going down, a node carries P, the product of its path's factors z (1 - t) + o t at the
   tree's Q quadrature points (Q x W values, rows inner); coming back up, a child returns D,
   the sum over its leaves of v times the factors below it, and the edge's feature gets
   (o - z) times the integral of P_parent D_child over its own factor (explain.pyx's module
   docstring has the whole argument).

   The row count W is a constant of each copy (1, 4, 8 or 16: linear_w.h, included once a
   copy), and a point's W values are one vector of GCC's vector extension, which the compiler
   splits into the CPU's registers; the rows' directions come in as one mask a split (bit r:
   row r goes right), taken by the caller before the walk (sw_lin_dirs). A factor
   z (1 - t) + o t takes one of two values at a point (o is 0 or 1), so it is picked by the
   mask rather than computed a lane at a time. A block of nr rows takes the smallest copy
   with W >= nr: its lanes past nr repeat row 0 (the caller makes their directions row 0's)
   and `live` keeps them out of the decision to skip an edge. Copies of W > 1 sum each
   feature's attributions for the block's W lanes across its trees (phi), added to the rows'
   once after the block's last tree (sw_lin_flush). Each real row's arithmetic is the same
   whatever the copy: the same operations in the same order as the Cython loops this
   replaced, so on a model whose trees all take this walk the same bits (tests/test_explain.py
   holds every copy and block size to one another bit for bit, and to XGBoost). */
#ifndef SW_LINEAR_H
#define SW_LINEAR_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#define SW_LIN_SSE 1
#endif

#define SW_LIN_MAX_ROWS 16
#define SW_LIN_FRAME_ARRAYS 7 /* a depth's P, D, F, R, 1 / (factor replaced), own, w P */

typedef struct {
    /* the tree (tree-local node numbers) */
    const int32_t *feature;   /* -1 at leaves */
    const int32_t *child;     /* (left, right) */
    const double *zfrac;      /* a node's cover over its parent's */
    const double *value;      /* one value a node (leaves) */
    const uint32_t *right;    /* per split: bit r, row r goes right */
    int32_t Q;                /* quadrature points, their nodes on [0, 1] and weights */
    const double *tq;
    const double *wq;
    /* the walk's state, per feature: merged factor's z, the rows following all the path's
       splits on it (o), the S accumulator of the deepest edge splitting on it (NULL: not on
       the path) and whether that one was written */
    double *z;
    uint32_t *o;
    double **acc;
    int32_t **acc_used;
    int32_t *used;            /* per depth */
    double *arena;            /* frames * SW_LIN_FRAME_ARRAYS * W * Q, then the root's P, D */
    int32_t frames;
    uint32_t live;            /* the real rows (bits below nr) */
    double *phis[SW_LIN_MAX_ROWS]; /* each row's attributions of the tree's output (W 1) */
    double *phi;              /* W > 1: per feature, the W rows' sums of the block's trees of
                                 this output (sw_lin_flush adds them to the rows') */
} sw_lin;

/* The walk's frames, from a cache line's start (a point's 16 rows, two lines, then start a
   line), NULL when out of memory; sw_lin_free frees them. */
static inline void *sw_lin_alloc(size_t size)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, size ? size : 64) != 0)
        return NULL;
    return p;
}

static inline void sw_lin_free(void *p)
{
    free(p);
}

/* Lane r of entry b: all ones where b has bit r. */
static const int64_t sw_lin_nibble[16][4] = {
    {0, 0, 0, 0}, {-1, 0, 0, 0}, {0, -1, 0, 0}, {-1, -1, 0, 0},
    {0, 0, -1, 0}, {-1, 0, -1, 0}, {0, -1, -1, 0}, {-1, -1, -1, 0},
    {0, 0, 0, -1}, {-1, 0, 0, -1}, {0, -1, 0, -1}, {-1, -1, 0, -1},
    {0, 0, -1, -1}, {-1, 0, -1, -1}, {0, -1, -1, -1}, {-1, -1, -1, -1}};

/* Bit r (r < W): the block's row r goes right at a split on a feature whose W values are xt,
   with threshold th: x > th, or x missing and miss_right (goes_right's rule, explain.pyx). */
static inline uint32_t sw_lin_dirs(const float *xt, float th, uint32_t miss_right, int32_t W)
{
    uint32_t m = 0;
    int32_t r = 0;
#ifdef SW_LIN_SSE
    const __m128 t = _mm_set1_ps(th);
    for (; r + 4 <= W; r += 4) {
        __m128 v = _mm_loadu_ps(xt + r);
        uint32_t gt = (uint32_t)_mm_movemask_ps(_mm_cmpgt_ps(v, t));
        uint32_t na = (uint32_t)_mm_movemask_ps(_mm_cmpunord_ps(v, v));
        m |= (gt | (na & (0u - miss_right))) << r;
    }
#endif
    for (; r < W; r++) {
        float v = xt[r];
        m |= ((uint32_t)(v > th) | ((uint32_t)(v != v) & miss_right)) << r;
    }
    return m;
}

/* Adds the block's sums (phi: nf features of W lanes) to its nr rows' (phis[r], nf values),
   and zeroes them. */
static inline void sw_lin_flush(double *phi, double *const *phis, int32_t nr, int32_t nf,
                                int32_t W)
{
    int32_t f, r;
    for (f = 0; f < nf; f++) {
        for (r = 0; r < nr; r++)
            phis[r][f] += phi[(int64_t)f * W + r];
        memset(phi + (int64_t)f * W, 0, W * sizeof(double));
    }
}

/* The copies: every row count for baseline x86-64 (SSE2: a 16-row vector is eight
   registers), and for 4, 8 and 16 rows an AVX-512F copy (two registers), taken where the CPU
   and the OS have it (sw_lin_isa). B at 1 thread, in alternated processes on an Intel Xeon
   guest: 1,560 us a row before this file, 930-970 baseline, 517-550 AVX-512F; an AVX2 copy
   measured 1,140-1,300, slower than the baseline one there, so there is none
   (bench/NOTES.md). No copy may contract a multiply and an add into one fused operation
   (AVX-512F has them), so every copy gives the same bits. */
#define SW_NOFMA __attribute__((optimize("fp-contract=off")))
#define SW_ISA
#define SW_ISA_ATTR SW_NOFMA
#define SW_W 1
#include "linear_w.h"
#undef SW_W
#include "linear_copies.h"
#undef SW_ISA
#undef SW_ISA_ATTR

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define SW_LIN_X86 1
#define SW_ISA _avx512
#define SW_ISA_ATTR SW_NOFMA __attribute__((target("avx512f")))
#include "linear_copies.h"
#undef SW_ISA
#undef SW_ISA_ATTR
#endif

/* The copies to take on this CPU: 1 AVX-512F (where the OS saves its registers, which
   __builtin_cpu_supports checks), else 0 baseline. */
static inline int32_t sw_lin_isa(void)
{
#ifdef SW_LIN_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return 1;
#endif
    return 0;
}

/* The smallest copy that holds nr rows. */
static inline int32_t sw_lin_width(int32_t nr)
{
    return nr <= 1 ? 1 : nr <= 4 ? 4 : nr <= 8 ? 8 : 16;
}

/* One tree for W = sw_lin_width(nr) lanes (s->right, s->phis and s->live set for them), by
   the copies of instruction set isa (sw_lin_isa, or lower). */
static void sw_lin_tree(sw_lin *s, int32_t W, int32_t isa)
{
#ifdef SW_LIN_X86
    if (isa == 1 && W > 1) {
        switch (W) {
        case 4: sw_lin_tree_4_avx512(s); return;
        case 8: sw_lin_tree_8_avx512(s); return;
        default: sw_lin_tree_16_avx512(s); return;
        }
    }
#endif
    switch (W) {
    case 1: sw_lin_tree_1(s); break;
    case 4: sw_lin_tree_4(s); break;
    case 8: sw_lin_tree_8(s); break;
    default: sw_lin_tree_16(s); break;
    }
}

#endif
