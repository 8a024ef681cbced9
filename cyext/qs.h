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
#endif
