/* Branch-free tree walks over one staged float32 row: the split rule, written once, and the
   walks built from it. Declared for Cython in walk.pxd.

   Split rule: a row goes right iff x > thr (float32); a missing x (NaN) goes right iff the
   node key's low bit (missing-goes-right) is set. A node key is 2 * feature + right; bit 31
   marks a compact leaf. Three step variants give the same answers:
     NAN     tests for NaN at every step: SW_STEP(v, key, thr);
     FINITE  rows without NaN compare only: x > thr (about half the instructions per step);
     SPLIT   rows read a doubled row of order keys (sw_split_row: xx[2f + right] is key(x[f]),
             a NaN staged as 0 at 2f and as 0xFFFFFFFF at 2f + 1, below and above every
             threshold's key), so key(thr) < xx[key] is the whole rule, the padded SPLIT walks'
             (ModelView.qnodes). A pass-through node (threshold +inf, missing left) reads 2f;
             HistGradientBoosting's NaN-only split (threshold +inf, missing right) sends only
             the NaN key 0xFFFFFFFF right. */
#ifndef SW_WALK_H
#define SW_WALK_H
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "prefetch.h"

#define SW_KEY_LEAF 0x80000000u
#define SW_KEY_SPECIAL 0x40000000u  /* compact: threshold bits = offset of a special entry */

/* the split rule: 1 when the row goes right */
#define SW_STEP(v, key, thr) \
    ((uint32_t)((v) > (thr)) | ((uint32_t)((v) != (v)) & ((key) & 1u)))
#define SW_GT(v, key, thr) ((uint32_t)((v) > (thr)))

/* where a step reads its value: x[feature] (NAN, FINITE) or xx[key] (SPLIT); compact keys
   carry the leaf flag in bit 31, masked off first */
#define SW_IDX_F(key) ((key) >> 1)
#define SW_CIDX_F(key) (((key) & 0x7FFFFFFFu) >> 1)

enum { SW_RULE_NAN = 0, SW_RULE_FINITE = 1, SW_RULE_SPLIT = 2 };

typedef struct { uint32_t key; float thr; } sw_pnode;
typedef struct { uint32_t key; uint32_t thr; } sw_qnode;  /* thr: sw_order_key(threshold) */
typedef struct { uint32_t key; uint32_t thr; int32_t child; int32_t leaf; } sw_qcnode;
typedef struct { uint32_t key; float thr; int32_t child; int32_t leaf; } sw_cnode;

static inline uint32_t sw_feat(uint32_t key) { return (key & 0x3FFFFFFFu) >> 1; }

/* One step of the NAN rule for callers that walk one tree at a time. */
static inline uint32_t sw_go_right(float v, uint32_t key, float thr) {
    return SW_STEP(v, key, thr);
}

/* Padded walks, depth-specialised: W trees of one row at once, each chain in a register (a
   constant depth and full unrolling keep p[] out of memory and make each tree's base a
   constant displacement). */
typedef void (*sw_walk_fn)(const void *base, const float *x, int64_t *slot);
#define SW_DEF_WALK(W, D, IDX, RULE, NAME)                                                  \
static void NAME(const void *vbase, const float *x, int64_t *slot) {                        \
    const sw_pnode *base = (const sw_pnode *)vbase;                                         \
    const int64_t ni = ((int64_t)1 << D) - 1;                                               \
    int64_t p[W];                                                                           \
    _Pragma("GCC unroll 16") for (int j = 0; j < W; j++) p[j] = 0;                          \
    _Pragma("GCC unroll 16") for (int d = 0; d < D; d++) {                                  \
        _Pragma("GCC unroll 16") for (int j = 0; j < W; j++) {                              \
            const sw_pnode *nd = base + j * ni + p[j];                                      \
            const uint32_t key = nd->key;                                                   \
            const float v = x[IDX(key)];                                                    \
            p[j] = 2 * p[j] + 1 + (int64_t)RULE(v, key, nd->thr);                           \
        }                                                                                   \
    }                                                                                       \
    _Pragma("GCC unroll 16") for (int j = 0; j < W; j++) slot[j] = j * (ni + 1) + p[j] - ni; \
}
/* The SPLIT walk, the one rows take whenever they can be doubled (with NaN or without). It
   reads order keys, not floats: the doubled row and the thresholds (ModelView.qnodes) are
   mapped by sw_order_key, an order-preserving map of float32 onto uint32, so x > thr is an
   unsigned compare. With a 1-based heap index q (children 2q and 2q + 1) a step is
   q = 2q + (thr < xx[key]): on x86-64 the node's two words in one load, split, a compare
   with the row's value as memory operand and an add-with-carry: five instructions, two loads
   (bench/NOTES.md "Kernel v2"). Other targets compile the same rule in C. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(SW_NO_ASM)
/* the node's two words in one 8-byte load at its own address (gcc computed it once with a
   lea), split in integer registers (key the low word, thr the high), the row's word indexed
   by the key; the unsized-array operand tells gcc the row is read. Two loads a step, not
   three: on a core that issues three loads a cycle (Intel), A 1.06-1.12x, B 1.05-1.07x
   (bench/NOTES.md "Kernel v2") */
#define SW_QSTEP(Q, nd, xx) do {                                                            \
    uint64_t w_; uint32_t k_;                                                               \
    __asm__("movq %[nm], %[w]\n\tmovl %k[w], %k[k]\n\tshrq $32, %[w]\n\t"                   \
            "cmp (%[x],%q[k],4), %k[w]\n\tadc %[q], %[q]"                                   \
            : [q] "+r"(Q), [k] "=&r"(k_), [w] "=&r"(w_)                                     \
            : [nm] "m"(*(const uint64_t *)(nd)), [x] "r"(xx),                               \
              "m"(*(const uint32_t(*)[])(xx))                                               \
            : "cc");                                                                        \
} while (0)
#else
#define SW_QSTEP(Q, nd, xx) ((Q) = (Q) + (Q) + (uint64_t)((nd)->thr < (xx)[(nd)->key]))
#endif
#define SW_DEF_QWALK(W, D, NAME)                                                            \
static void NAME(const void *vbase, const float *vxx, int64_t *slot) {                      \
    const sw_qnode *base = (const sw_qnode *)vbase - 1;                                     \
    const uint32_t *xx = (const uint32_t *)vxx;                                             \
    const int64_t ni = ((int64_t)1 << D) - 1;                                               \
    uint64_t q[W];                                                                          \
    _Pragma("GCC unroll 16") for (int j = 0; j < W; j++) q[j] = 1;                          \
    _Pragma("GCC unroll 16") for (int d = 0; d < D; d++) {                                  \
        _Pragma("GCC unroll 16") for (int j = 0; j < W; j++) {                              \
            const sw_qnode *nd = base + j * ni + q[j];                                      \
            SW_QSTEP(q[j], nd, xx);                                                         \
        }                                                                                   \
    }                                                                                       \
    _Pragma("GCC unroll 16") for (int j = 0; j < W; j++) slot[j] = j * (ni + 1) + (int64_t)q[j] - ni - 1; \
}
#define SW_DEF_ALL(W, D) SW_DEF_WALK(W, D, SW_IDX_F, SW_STEP, sw_walk##W##n_d##D)          \
    SW_DEF_WALK(W, D, SW_IDX_F, SW_GT, sw_walk##W##f_d##D)                                  \
    SW_DEF_QWALK(W, D, sw_walk##W##s_d##D)
#define SW_DEF_DEPTHS(W) SW_DEF_ALL(W, 1) SW_DEF_ALL(W, 2) SW_DEF_ALL(W, 3)                 \
    SW_DEF_ALL(W, 4) SW_DEF_ALL(W, 5) SW_DEF_ALL(W, 6) SW_DEF_ALL(W, 7)                     \
    SW_DEF_ALL(W, 8) SW_DEF_ALL(W, 9) SW_DEF_ALL(W, 10)
SW_DEF_DEPTHS(8)
SW_DEF_DEPTHS(12)
#define SW_TAB(NAME) {0, NAME##_d1, NAME##_d2, NAME##_d3, NAME##_d4, NAME##_d5, NAME##_d6, \
                      NAME##_d7, NAME##_d8, NAME##_d9, NAME##_d10}
static const sw_walk_fn sw_walk_tab[6][11] = {
    SW_TAB(sw_walk8n), SW_TAB(sw_walk8f), SW_TAB(sw_walk8s),
    SW_TAB(sw_walk12n), SW_TAB(sw_walk12f), SW_TAB(sw_walk12s)};

/* wide: 0 for 8 trees, 1 for 12 (walk.pxd PLAN_WIDE); rule: SW_RULE_*. NULL outside depths
   1..10. */
static inline sw_walk_fn sw_walk_fn_for(int depth, int wide, int rule) {
    return depth >= 1 && depth <= 10 ? sw_walk_tab[3 * wide + rule][depth] : 0;
}

/* The pair walk: two doubled rows (SPLIT rule) through SW_PAIR_W trees at once, 2 x 6 chains,
   each row's leaves added to its own sum in tree order (one value a leaf, summed: blocks.pxd
   one_sum), as add_leaves adds them: the same leaves in the same order, so the scores are the
   one-row walk's to the bit. A step is SW_QSTEP. Why two rows: the one-row walk's 12 chains
   all end together and then wait on their row's 12 dependent leaf adds; here two rows' adds
   run side by side, and the caller (kernels.eval_planned) takes 6 trees a pass over every
   pair, whose nodes and leaves stay in L1 (a 12-tree group's 36 KB at depth 8 did not).
   bench/pair_walk.py: model B 1.08-1.18x the one-row walk; bench/walk_variants.c: the other
   forms tried (bench/NOTES.md "The pair walk"). lv: the first tree's leaves (2^D values a
   tree, trees one after the other). */
#define SW_PAIR_W 6
/* kernels.eval_planned: a group of walk.pxd PLAN_WIDE (12) trees is two pair passes */
_Static_assert(2 * SW_PAIR_W == 12, "PLAN_WIDE is two pair passes");
#define SW_DEF_QPAIR(D, T, NAME)                                                            \
static void NAME(const void *vbase, const uint32_t *x0, const uint32_t *x1, const T *lv,    \
                 T *acc0, T *acc1) {                                                        \
    const sw_qnode *base = (const sw_qnode *)vbase - 1;                                     \
    const int64_t ni = ((int64_t)1 << D) - 1;                                               \
    uint64_t q0[SW_PAIR_W], q1[SW_PAIR_W];                                                  \
    _Pragma("GCC unroll 16") for (int j = 0; j < SW_PAIR_W; j++) q0[j] = q1[j] = 1;         \
    _Pragma("GCC unroll 16") for (int d = 0; d < D; d++) {                                  \
        _Pragma("GCC unroll 16") for (int j = 0; j < SW_PAIR_W; j++) {                      \
            const sw_qnode *n0 = base + j * ni + q0[j], *n1 = base + j * ni + q1[j];        \
            SW_QSTEP(q0[j], n0, x0);                                                        \
            SW_QSTEP(q1[j], n1, x1);                                                        \
        }                                                                                   \
    }                                                                                       \
    T a0 = *acc0, a1 = *acc1;                                                               \
    _Pragma("GCC unroll 16") for (int j = 0; j < SW_PAIR_W; j++) {                          \
        a0 += lv[j * (ni + 1) + (int64_t)q0[j] - ni - 1];                                   \
        a1 += lv[j * (ni + 1) + (int64_t)q1[j] - ni - 1];                                   \
    }                                                                                       \
    *acc0 = a0;                                                                             \
    *acc1 = a1;                                                                             \
}
#define SW_DEF_QPAIRS(D) SW_DEF_QPAIR(D, float, sw_pair_f_d##D)                            \
    SW_DEF_QPAIR(D, double, sw_pair_d_d##D)
SW_DEF_QPAIRS(1) SW_DEF_QPAIRS(2) SW_DEF_QPAIRS(3) SW_DEF_QPAIRS(4) SW_DEF_QPAIRS(5)
SW_DEF_QPAIRS(6) SW_DEF_QPAIRS(7) SW_DEF_QPAIRS(8) SW_DEF_QPAIRS(9) SW_DEF_QPAIRS(10)
typedef void (*sw_pair_f_fn)(const void *, const uint32_t *, const uint32_t *, const float *,
                             float *, float *);
typedef void (*sw_pair_d_fn)(const void *, const uint32_t *, const uint32_t *, const double *,
                             double *, double *);
static const sw_pair_f_fn sw_pair_f_tab[11] = {0, sw_pair_f_d1, sw_pair_f_d2, sw_pair_f_d3,
    sw_pair_f_d4, sw_pair_f_d5, sw_pair_f_d6, sw_pair_f_d7, sw_pair_f_d8, sw_pair_f_d9,
    sw_pair_f_d10};
static const sw_pair_d_fn sw_pair_d_tab[11] = {0, sw_pair_d_d1, sw_pair_d_d2, sw_pair_d_d3,
    sw_pair_d_d4, sw_pair_d_d5, sw_pair_d_d6, sw_pair_d_d7, sw_pair_d_d8, sw_pair_d_d9,
    sw_pair_d_d10};
/* NULL outside depths 1..10 */
static inline sw_pair_f_fn sw_pair_f_for(int depth) {
    return depth >= 1 && depth <= 10 ? sw_pair_f_tab[depth] : 0;
}
static inline sw_pair_d_fn sw_pair_d_for(int depth) {
    return depth >= 1 && depth <= 10 ? sw_pair_d_tab[depth] : 0;
}

/* Compact walks: SW_CW trees of one row, chains in registers; a leaf steps onto itself
   (threshold +inf, key reads feature 0 and never a NaN slot) until all are done. 16 chains:
   deep forests are memory-latency bound, and more misses in flight pay (bench/NOTES.md). */
#define SW_CW 16
typedef void (*sw_cwalk_fn)(const void *nodes, const int64_t *root, const float *x,
                            int64_t *slot);
/* NEXT(c, n, x, key): the node a chain standing on n steps to; SLOT(n): a leaf's slot */
#define SW_DEF_CWALK_G(NODE, ROW, NEXT, SLOT, NAME)                                         \
static void NAME(const void *vnodes, const int64_t *root, const float *vx, int64_t *slot) { \
    const NODE *c = (const NODE *)vnodes;                                                   \
    const ROW *x = (const ROW *)vx;                                                         \
    const NODE *nd[SW_CW];                                                                  \
    _Pragma("GCC unroll 16") for (int j = 0; j < SW_CW; j++) nd[j] = c + root[j];           \
    for (;;) {                                                                              \
        uint32_t all = SW_KEY_LEAF;                                                         \
        _Pragma("GCC unroll 16") for (int j = 0; j < SW_CW; j++) all &= nd[j]->key;         \
        if (all) break;                                                                     \
        _Pragma("GCC unroll 16") for (int j = 0; j < SW_CW; j++)                            \
            nd[j] = NEXT(c, nd[j], x, nd[j]->key);                                          \
    }                                                                                       \
    _Pragma("GCC unroll 16") for (int j = 0; j < SW_CW; j++) slot[j] = SLOT(nd[j]);         \
}
#define SW_CSLOT(n) ((n)->leaf)
/* a 16-byte node's step: its left child, plus one when the rule sends the row right */
#define SW_CCHILD(c, n, x, key, IDX, RULE) \
    ((c) + (n)->child + RULE((x)[IDX(key)], key, (n)->thr))
#define SW_CNEXT_N(c, n, x, key) SW_CCHILD(c, n, x, key, SW_CIDX_F, SW_STEP)
#define SW_CNEXT_F(c, n, x, key) SW_CCHILD(c, n, x, key, SW_CIDX_F, SW_GT)
SW_DEF_CWALK_G(sw_cnode, float, SW_CNEXT_N, SW_CSLOT, sw_cwalk_n)
SW_DEF_CWALK_G(sw_cnode, float, SW_CNEXT_F, SW_CSLOT, sw_cwalk_f)
/* Compact walks over order keys (ModelView.qcnodes): SPLIT reads a doubled row of keys
   (sw_split_row), FINITE a row of keys (sw_key_row). A leaf (threshold +inf, key 0 plus the
   leaf bit) reads slot 0, never above key(+inf), and stays put. A task takes one of the two
   node arrays for all its rows: a deep forest is bound by memory, and two copies of it in
   cache cost more than the step saves (measured on model C). */
#define SW_QGT(v, key, thr) ((uint32_t)((thr) < (v)))
#define SW_CIDX_Q(key) ((key) & 0x7FFFFFFFu)
#define SW_CNEXT_Q(c, n, x, key) SW_CCHILD(c, n, x, key, SW_CIDX_Q, SW_QGT)
#define SW_CNEXT_QF(c, n, x, key) SW_CCHILD(c, n, x, key, SW_CIDX_F, SW_QGT)
SW_DEF_CWALK_G(sw_qcnode, uint32_t, SW_CNEXT_Q, SW_CSLOT, sw_cwalk_q)
SW_DEF_CWALK_G(sw_qcnode, uint32_t, SW_CNEXT_QF, SW_CSLOT, sw_cwalk_qf)
static inline sw_cwalk_fn sw_cwalk_q_for(int rule) {
    return rule == SW_RULE_SPLIT ? sw_cwalk_q : sw_cwalk_qf;
}
/* The same walks over 8-byte nodes (sw_qnode; ModelView.sqcnodes, built at load from qcnodes
   where every value fits, kernels.small_key_nodes): key = leaf bit 31 | (left child - node)
   << 16 | 2f + right (< 2^16); thr = the threshold's order key, a leaf's 0xFF800000 | its slot
   (>= every key a row holds at its slot 0, so a leaf stays put). Half the bytes of a deep
   forest, read by the same compare. */
#define SW_SC_DELTA(key) (((key) >> 16) & 0x7FFFu)
#define SW_SCIDX_Q(key) ((key) & 0xFFFFu)
#define SW_SCIDX_F(key) (((key) & 0xFFFFu) >> 1)
#define SW_SC_SLOT(thr) ((thr) & 0x7FFFFFu)
/* an 8-byte node's step: the child's distance from the node in its key */
#define SW_SCCHILD(n, x, key, IDX) \
    ((n) + SW_SC_DELTA(key) + SW_QGT((x)[IDX(key)], key, (n)->thr))
#define SW_SCNEXT_Q(c, n, x, key) SW_SCCHILD(n, x, key, SW_SCIDX_Q)
#define SW_SCNEXT_F(c, n, x, key) SW_SCCHILD(n, x, key, SW_SCIDX_F)
#define SW_SCSLOT(n) SW_SC_SLOT((n)->thr)
SW_DEF_CWALK_G(sw_qnode, uint32_t, SW_SCNEXT_Q, SW_SCSLOT, sw_scwalk_q)
SW_DEF_CWALK_G(sw_qnode, uint32_t, SW_SCNEXT_F, SW_SCSLOT, sw_scwalk_qf)
static inline sw_cwalk_fn sw_scwalk_q_for(int rule) {
    return rule == SW_RULE_SPLIT ? sw_scwalk_q : sw_scwalk_qf;
}
/* The rows walk: n rows (rx[0..n), rows of order keys) through one tree of 8-byte nodes, 8
   chains, one row a chain; a chain that reaches a leaf stores its row's slot in slots[] and
   starts the next row at the root, so no chain waits for the deepest path of a group. The
   tree's nodes stay in L1/L2 while a task's rows pass through it (kernels.pyx eval_rest).
   Each chain's node index, row pointer and row number are locals, so gcc keeps the nodes and
   most row pointers in registers: 16 chains in arrays (the loop, branching at each leaf, was
   not unrolled) kept them in memory, a load and a store a step more; and a 64-bit node index
   (not a pointer) makes the step's child a compare and an add-with-carry of the child's
   distance (12 instructions a step; callgrind on C: 40.4k -> 28.4k -> 24.2k instructions a
   row, the same cache misses; bench/NOTES.md "C: rows walk each tree together"). Fewer than
   8 rows walk one after another. Each row a chain takes after its first 8 also prefetches
   the next line of pf..pf_end (the caller's next tree), so much of that tree is in L2 when
   its walk starts: on C's 2,048-row tasks the 576 lines of a tree within the first 600 rows
   of its walk (1 thread: 1.41x; bench/NOTES.md). A walk of fewer rows than the tree has
   lines covers less, and one of fewer than 8 rows none. Prefetching late (over the walk's
   last rows instead of its first) measured the same (bench/NOTES.md). ROWS reads doubled
   rows (SPLIT), ROWS_F rows of keys (FINITE). SW_RSTEP reads the enclosing walk's n, top,
   rx, slots, next, done, pf and pf_end. */
#define SW_RW 8
#define SW_RINIT(j) uint64_t q##j = 0; const uint32_t *x##j = rx[j]; int32_t row##j = j;
#define SW_RSTEP(j, IDX)                                                                     \
    {                                                                                       \
        const uint32_t key = top[q##j].key;                                                 \
        if (__builtin_expect(key & SW_KEY_LEAF, 0)) {                                       \
            if (row##j < n) {                                                               \
                slots[row##j] = SW_SC_SLOT(top[q##j].thr);                                  \
                done++;                                                                     \
                if (next < n) {                                                             \
                    if (pf < pf_end) {                                                      \
                        sw_prefetch_l2(pf);                                                 \
                        pf += 64;                                                           \
                    }                                                                       \
                    row##j = next;                                                          \
                    x##j = rx[next++];                                                      \
                    q##j = 0;                                                               \
                } else {                                                                    \
                    row##j = n;  /* stands on its leaf until the others are done */         \
                }                                                                           \
            }                                                                               \
        } else {                                                                            \
            q##j += (uint64_t)SW_SC_DELTA(key) + (uint64_t)(top[q##j].thr < x##j[IDX(key)]);\
        }                                                                                   \
    }
#define SW_DEF_RWALK(IDX, NAME)                                                                \
static void NAME(const void *vnodes, int64_t root, const uint32_t *const *rx, int32_t n,    \
                 int64_t *slots, const char *pf, const char *pf_end) {                      \
    const sw_qnode *top = (const sw_qnode *)vnodes + root;                                  \
    if (n < SW_RW) {                                                                        \
        for (int32_t r = 0; r < n; r++) {                                                   \
            const sw_qnode *nd = top;                                                       \
            uint32_t key;                                                                   \
            while (!((key = nd->key) & SW_KEY_LEAF)) nd = SW_SCCHILD(nd, rx[r], key, IDX);  \
            slots[r] = SW_SCSLOT(nd);                                                       \
        }                                                                                   \
        return;                                                                             \
    }                                                                                       \
    SW_RINIT(0) SW_RINIT(1) SW_RINIT(2) SW_RINIT(3)                                         \
    SW_RINIT(4) SW_RINIT(5) SW_RINIT(6) SW_RINIT(7)                                         \
    int32_t next = SW_RW, done = 0;                                                         \
    while (done < n) {                                                                      \
        SW_RSTEP(0, IDX) SW_RSTEP(1, IDX) SW_RSTEP(2, IDX) SW_RSTEP(3, IDX)                 \
        SW_RSTEP(4, IDX) SW_RSTEP(5, IDX) SW_RSTEP(6, IDX) SW_RSTEP(7, IDX)                 \
    }                                                                                       \
}
SW_DEF_RWALK(SW_SCIDX_Q, sw_scwalk_rows)
SW_DEF_RWALK(SW_SCIDX_F, sw_scwalk_rows_f)
/* The rows walk without refills: 8 rows at once through one tree of 8-byte nodes, every
   chain taking `steps` steps with no test (a leaf stands on itself: delta 0, a threshold at or
   above any key), then one more step of all 8 until all 8 stand on a leaf (one test of the 8
   keys a step; after SW_FCAP of those, the chains left are set aside, below). No branch a
   chain and none mispredicted at each row's leaf, as the refilling walk above has; a group of
   8 costs its deepest path. `steps` is the tree's expected path under even routing
   (kernels.walk_steps), so trees of even depth take every step untested. The step is six
   instructions (x86-64: the node's key halves loaded apart, the row's key compared with the
   threshold as memory operand, an add-with-carry of the child's distance); elsewhere the same
   rule in C. The last n % 8 rows join the set-aside chains. Each group of 8 also prefetches up
   to 8 lines of pf..pf_end (the caller's next tree), as the refilling walk does a line a
   row. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(SW_NO_ASM)
#define SW_FASM(Q, X, SHIFT) {                                                              \
    uint64_t d_, k_, v_;                                                                    \
    __asm__("movzwl (%[t],%[q],8), %k[k]\n\t" SHIFT                                         \
            "movzwl 2(%[t],%[q],8), %k[d]\n\t"                                              \
            "andl $0x7fff, %k[d]\n\t"                                                       \
            "movl (%[x],%[k],4), %k[v]\n\t"                                                 \
            "cmpl %k[v], 4(%[t],%[q],8)\n\t"                                                \
            "adc %[d], %[q]"                                                                \
            : [q] "+r"(Q), [k] "=&r"(k_), [d] "=&r"(d_), [v] "=&r"(v_)                      \
            : [t] "r"(top), [x] "r"(X), "m"(*(const uint32_t(*)[])(X)),                     \
              "m"(*(const sw_qnode(*)[])(top))                                              \
            : "cc");                                                                        \
}
#define SW_FSTEP_SW_SCIDX_Q(j) SW_FASM(q##j, x##j, "")
#define SW_FSTEP_SW_SCIDX_F(j) SW_FASM(q##j, x##j, "shrl $1, %k[k]\n\t")
#else
#define SW_FSTEP_C(j, IDX) {                                                                \
    const sw_qnode *nd_ = top + q##j;                                                       \
    const uint32_t key_ = nd_->key;                                                         \
    q##j += (uint64_t)SW_SC_DELTA(key_) + (uint64_t)(nd_->thr < x##j[IDX(key_)]);           \
}
#define SW_FSTEP_SW_SCIDX_Q(j) SW_FSTEP_C(j, SW_SCIDX_Q)
#define SW_FSTEP_SW_SCIDX_F(j) SW_FSTEP_C(j, SW_SCIDX_F)
#endif
#define SW_FSTEP(j, IDX) SW_FSTEP_##IDX(j)
#define SW_FSTEP8(IDX) SW_FSTEP(0, IDX) SW_FSTEP(1, IDX) SW_FSTEP(2, IDX) SW_FSTEP(3, IDX)   \
                       SW_FSTEP(4, IDX) SW_FSTEP(5, IDX) SW_FSTEP(6, IDX) SW_FSTEP(7, IDX)
#define SW_FINIT(j) uint64_t q##j = 0; const uint32_t *x##j = rx[g + j];
/* A chain still walking after SW_FCAP tested steps is set aside (its row and node) and the
   set-aside chains finish together, 8 at a time, each that reaches a leaf taking the next (as
   the refilling walk does): a group costs at most 8 x (steps + SW_FCAP) steps beyond its rows'
   own paths, and the long paths are walked side by side, not alone. Without it, rows ordered
   so that one of each 8 takes a long path made every group walk it 8 times (an attacker
   review's crafted 2,000-deep tree; bench/rows_walk.py times it). */
#define SW_FCAP 16
#define SW_FREST 256
#define SW_FSET(j) {                                                                        \
    if (top[q##j].key & SW_KEY_LEAF) {                                                      \
        slots[g + j] = SW_SC_SLOT(top[q##j].thr);                                           \
    } else {                                                                                \
        rest_row[n_rest] = g + j;                                                           \
        rest_node[n_rest++] = q##j;                                                         \
    }                                                                                       \
}
#define SW_DEF_FREST(IDX, NAME)                                                             \
static void NAME(const sw_qnode *top, const uint32_t *const *rx, const int32_t *row,       \
                 const uint64_t *node, int32_t n, int64_t *slots) {                         \
    uint64_t q[SW_RW];                                                                      \
    const uint32_t *x[SW_RW];                                                               \
    int32_t who[SW_RW], next = 0, live = 0;                                                 \
    for (int32_t j = 0; j < SW_RW; j++) {                                                   \
        who[j] = -1;                                                                        \
        if (next < n) { q[j] = node[next]; who[j] = row[next]; x[j] = rx[row[next++]]; live++; } \
    }                                                                                       \
    while (live > 0) {                                                                      \
        for (int32_t j = 0; j < SW_RW; j++) {                                               \
            if (who[j] < 0) continue;                                                       \
            const sw_qnode *nd = top + q[j];                                                \
            const uint32_t key = nd->key;                                                   \
            if (key & SW_KEY_LEAF) {                                                        \
                slots[who[j]] = SW_SC_SLOT(nd->thr);                                        \
                if (next < n) { q[j] = node[next]; who[j] = row[next]; x[j] = rx[row[next++]]; } \
                else { who[j] = -1; live--; }                                               \
            } else {                                                                        \
                q[j] += (uint64_t)SW_SC_DELTA(key) + (uint64_t)(nd->thr < x[j][IDX(key)]);  \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
}
SW_DEF_FREST(SW_SCIDX_Q, sw_scwalk_rest)
SW_DEF_FREST(SW_SCIDX_F, sw_scwalk_rest_f)
#define SW_DEF_FWALK(IDX, REST, NAME)                                                       \
static void NAME(const void *vnodes, int64_t root, const uint32_t *const *rx, int32_t n,    \
                 int64_t *slots, int32_t steps, const char *pf, const char *pf_end) {       \
    const sw_qnode *top = (const sw_qnode *)vnodes + root;                                  \
    int32_t rest_row[SW_FREST], n_rest = 0, g = 0;                                          \
    uint64_t rest_node[SW_FREST];                                                           \
    for (; g + SW_RW <= n; g += SW_RW) {                                                    \
        for (int32_t i = 0; i < SW_RW && pf < pf_end; i++, pf += 64) sw_prefetch_l2(pf);    \
        SW_FINIT(0) SW_FINIT(1) SW_FINIT(2) SW_FINIT(3)                                     \
        SW_FINIT(4) SW_FINIT(5) SW_FINIT(6) SW_FINIT(7)                                     \
        for (int32_t s = 0; s < steps; s++) { SW_FSTEP8(IDX) }                              \
        for (int32_t s = 0; s < SW_FCAP && !(top[q0].key & top[q1].key & top[q2].key &      \
                 top[q3].key & top[q4].key & top[q5].key & top[q6].key & top[q7].key &       \
                 SW_KEY_LEAF); s++) { SW_FSTEP8(IDX) }                                      \
        if (n_rest > SW_FREST - SW_RW) {                                                    \
            REST(top, rx, rest_row, rest_node, n_rest, slots);                              \
            n_rest = 0;                                                                     \
        }                                                                                   \
        SW_FSET(0) SW_FSET(1) SW_FSET(2) SW_FSET(3)                                         \
        SW_FSET(4) SW_FSET(5) SW_FSET(6) SW_FSET(7)                                         \
    }                                                                                       \
    for (; g < n; g++) {  /* flushed before each append: the loop above may leave it full */\
        if (n_rest == SW_FREST) {                                                           \
            REST(top, rx, rest_row, rest_node, n_rest, slots);                              \
            n_rest = 0;                                                                     \
        }                                                                                   \
        rest_row[n_rest] = g;                                                               \
        rest_node[n_rest++] = 0;                                                            \
    }                                                                                       \
    REST(top, rx, rest_row, rest_node, n_rest, slots);                                      \
}
SW_DEF_FWALK(SW_SCIDX_Q, sw_scwalk_rest, sw_scwalk_fixed)
SW_DEF_FWALK(SW_SCIDX_F, sw_scwalk_rest_f, sw_scwalk_fixed_f)
static const sw_cwalk_fn sw_cwalk_tab[2] = {sw_cwalk_n, sw_cwalk_f};
static inline sw_cwalk_fn sw_cwalk_fn_for(int rule) { return sw_cwalk_tab[rule]; }

/* Special nodes (models with categorical or zero-as-missing splits; compact layout only): the
   key carries SW_KEY_SPECIAL and the threshold's bits are the offset of the node's entry in
   the model's `cats` words (entry layout: worker/model/ir.py). Offset 0 holds an entry no node
   uses. */
#define SW_SP_INT 0x80000000u
#define SW_SP_ZERO 0x40000000u
#define SW_SP_TRUNC 0x20000000u
#define SW_SP_N 0x001FFFFFu

static inline float sw_float(uint32_t b) { float f; memcpy(&f, &b, sizeof f); return f; }
static inline uint32_t sw_bits_of(float f) { uint32_t b; memcpy(&b, &f, sizeof b); return b; }

/* The bit of a categorical entry (header h, bits b) that value v reads: 0 for a negative
   value, c + 1 for category c, n + 1 for a value at or above n or (SW_SP_INT) a fraction.
   Negative: v < 0, or with SW_SP_TRUNC v <= -1 (int(v) truncates (-1, 0) to category 0). NaN
   reads n + 1; callers send it where the node key says. */
static inline uint32_t sw_cat_bit(float v, uint32_t h) {
    const uint32_t n = h & SW_SP_N;
    const float top = (float)n;
    const float lo = (h & SW_SP_TRUNC) ? -0.99999994f : 0.0f;   /* v < lo: negative */
    const uint32_t neg = (uint32_t)(v < lo);
    const float w = neg ? 0.0f : (v < top ? v : top);            /* in [0, n]; NaN: n */
    const int32_t c = (int32_t)w;
    const uint32_t frac = (h >> 31) & (uint32_t)((float)c != w);
    return neg ? 0u : (frac ? n + 1u : (uint32_t)c + 1u);
}

/* 1 when v goes right at the special node with entry e, whose header h (= e[0]) the caller
   read from the node itself (key: the node key, bit 0 = a missing value goes right) */
static inline uint32_t sw_special_right(float v, uint32_t key, uint32_t h, const uint32_t *e) {
    const uint32_t nan = (uint32_t)(v != v);
    if (__builtin_expect(h == SW_SP_ZERO, 0)) {   /* LightGBM missing_type=Zero */
        const float z = sw_float(e[2]);
        const uint32_t band = nan | ((uint32_t)(v >= -z) & (uint32_t)(v <= z));
        return band ? (key & 1u) : (uint32_t)(v > sw_float(e[1]));
    }
    const uint32_t i = sw_cat_bit(v, h);
    const uint32_t bit = (e[1 + (i >> 5)] >> (i & 31u)) & 1u;
    return nan ? (key & 1u) : bit;
}

#define SW_SIDX(key) (((key) & 0x3FFFFFFFu) >> 1)   /* a key's feature, special bit or not */

/* Staged categorical features (models whose categorical features only categorical splits
   read, ModelView.cat_staged): the row's value is replaced, once per row, by the bit index
   its splits read (sw_cat_bit; a missing value n + 2), stored as the float's bits; a split is
   then one bit test. Every entry on the feature has its n (worker/model/pack.py widens them). */
static inline void sw_stage_cats(float *x, int64_t ldx, int32_t n_rows, const int32_t *feat,
                                 const uint32_t *head, int32_t k) {
    for (int32_t r = 0; r < n_rows; r++) {
        float *row = x + r * ldx;
        for (int32_t i = 0; i < k; i++) {
            const float v = row[feat[i]];
            const uint32_t idx = (v != v) ? (head[i] & SW_SP_N) + 2u : sw_cat_bit(v, head[i]);
            memcpy(&row[feat[i]], &idx, sizeof idx);
        }
    }
}

/* a special node's answer: staged, the bit at the row's index; else the rule on the value */
static inline uint32_t sw_special_step(float v, uint32_t key, uint32_t h, const uint32_t *e,
                                       int staged) {
    if (staged) {
        const uint32_t i = sw_bits_of(v);
        return (e[1 + (i >> 5)] >> (i & 31u)) & 1u;
    }
    return sw_special_right(v, key, h, e);
}

/* a padded node of a model with special nodes (its threshold word the entry's offset) */
static inline uint32_t sw_step_padded(float v, uint32_t key, float thr, const uint32_t *cats,
                                      int staged) {
    if (key & SW_KEY_SPECIAL) {
        const uint32_t off = sw_bits_of(thr);
        return sw_special_step(v, key, cats[off], cats + off, staged);
    }
    return SW_STEP(v, key, thr);
}

/* Padded walks for models with special nodes, depth-specialised like the others: W trees of
   one row; at each level every chain steps by the numerical rule, then the chains on a special
   node (found by a bit mask) are redone by its entry. */
typedef void (*sw_swalkp_fn)(const void *base, const float *x, int64_t *slot,
                             const uint32_t *cats, int staged);
#define SW_DEF_SPWALK(W, D, NAME)                                                           \
static void NAME(const void *vbase, const float *x, int64_t *slot, const uint32_t *cats,     \
                 int staged) {                                                              \
    const sw_pnode *base = (const sw_pnode *)vbase;                                         \
    const int64_t ni = ((int64_t)1 << D) - 1;                                               \
    int64_t p[W];                                                                           \
    _Pragma("GCC unroll 16") for (int j = 0; j < W; j++) p[j] = 0;                          \
    _Pragma("GCC unroll 16") for (int d = 0; d < D; d++) {                                  \
        uint32_t sp = 0;                                                                    \
        int64_t q[W];                                                                       \
        _Pragma("GCC unroll 16") for (int j = 0; j < W; j++) {                              \
            const sw_pnode *nd = base + j * ni + p[j];                                      \
            const uint32_t key = nd->key;                                                   \
            q[j] = 2 * p[j] + 1 + (int64_t)SW_STEP(x[SW_SIDX(key)], key, nd->thr);          \
            sp |= ((key >> 30) & 1u) << j;                                                  \
        }                                                                                   \
        while (sp) {                                                                        \
            const int j = __builtin_ctz(sp);                                                \
            sp &= sp - 1;                                                                   \
            const sw_pnode *nd = base + j * ni + p[j];                                      \
            q[j] = 2 * p[j] + 1 + (int64_t)sw_step_padded(x[SW_SIDX(nd->key)], nd->key,    \
                                                          nd->thr, cats, staged);           \
        }                                                                                   \
        _Pragma("GCC unroll 16") for (int j = 0; j < W; j++) p[j] = q[j];                   \
    }                                                                                       \
    _Pragma("GCC unroll 16") for (int j = 0; j < W; j++) slot[j] = j * (ni + 1) + p[j] - ni; \
}
#define SW_DEF_SPDEPTHS(W) SW_DEF_SPWALK(W, 1, sw_spwalk##W##_d1)                          \
    SW_DEF_SPWALK(W, 2, sw_spwalk##W##_d2) SW_DEF_SPWALK(W, 3, sw_spwalk##W##_d3)           \
    SW_DEF_SPWALK(W, 4, sw_spwalk##W##_d4) SW_DEF_SPWALK(W, 5, sw_spwalk##W##_d5)           \
    SW_DEF_SPWALK(W, 6, sw_spwalk##W##_d6) SW_DEF_SPWALK(W, 7, sw_spwalk##W##_d7)           \
    SW_DEF_SPWALK(W, 8, sw_spwalk##W##_d8) SW_DEF_SPWALK(W, 9, sw_spwalk##W##_d9)           \
    SW_DEF_SPWALK(W, 10, sw_spwalk##W##_d10)
SW_DEF_SPDEPTHS(16)
static const sw_swalkp_fn sw_spwalk_tab[11] = {0, sw_spwalk16_d1, sw_spwalk16_d2,
    sw_spwalk16_d3, sw_spwalk16_d4, sw_spwalk16_d5, sw_spwalk16_d6, sw_spwalk16_d7,
    sw_spwalk16_d8, sw_spwalk16_d9, sw_spwalk16_d10};
/* 16 trees of one row at a padded depth 1..10 (NULL otherwise) */
static inline sw_swalkp_fn sw_spwalk_fn_for(int depth) {
    return depth >= 1 && depth <= 10 ? sw_spwalk_tab[depth] : 0;
}


/* W chains over compact nodes with special nodes: chain j walks the tree rooted at
   root[j * dt] on the row x + j * dx. Each round steps every chain by the numerical rule
   (branch-free), then redoes the chains standing on a special node, found by a bit mask: one
   loop whose trip count varies, where a test per chain on the node's kind would mispredict
   at every third step or so. */
#define SW_DEF_SWALK(W, NAME)                                                               \
static inline void NAME(const void *vnodes, const int64_t *root, int64_t dt, const float *x, \
                        int64_t dx, const uint32_t *cats, int staged, int64_t *slot) {      \
    const sw_cnode *c = (const sw_cnode *)vnodes;                                           \
    const sw_cnode *nd[W];                                                                  \
    _Pragma("GCC unroll 16") for (int j = 0; j < W; j++) nd[j] = c + root[j * dt];          \
    for (;;) {                                                                              \
        uint32_t all = SW_KEY_LEAF, sp = 0;                                                 \
        _Pragma("GCC unroll 16") for (int j = 0; j < W; j++) all &= nd[j]->key;             \
        if (all) break;                                                                     \
        const sw_cnode *next[W];                                                            \
        _Pragma("GCC unroll 16") for (int j = 0; j < W; j++) {                              \
            const uint32_t key = nd[j]->key;                                                \
            next[j] = c + nd[j]->child + SW_STEP(x[j * dx + SW_SIDX(key)], key, nd[j]->thr);\
            sp |= ((key >> 30) & 1u) << j;                                                  \
        }                                                                                   \
        while (sp) {                                                                        \
            const int j = __builtin_ctz(sp);                                                \
            sp &= sp - 1;                                                                   \
            const uint32_t key = nd[j]->key;                                                \
            next[j] = c + nd[j]->child                                                      \
                + sw_special_step(x[j * dx + SW_SIDX(key)], key, (uint32_t)nd[j]->leaf,     \
                                  cats + sw_bits_of(nd[j]->thr), staged);                   \
        }                                                                                   \
        _Pragma("GCC unroll 16") for (int j = 0; j < W; j++) nd[j] = next[j];               \
    }                                                                                       \
    _Pragma("GCC unroll 16") for (int j = 0; j < W; j++) slot[j] = nd[j]->leaf;             \
}
SW_DEF_SWALK(1, sw_swalk1)
SW_DEF_SWALK(8, sw_swalk8)
SW_DEF_SWALK(16, sw_swalk16)

/* Integer tests on the float bits, which gcc vectorises (the float form v != v stays scalar
   with a branch per feature). */
typedef uint32_t __attribute__((may_alias)) sw_bits;

/* 1 when x[0..n) holds no NaN */
static inline int sw_row_finite(const float *x, int n) {
    const sw_bits *b = (const sw_bits *)x;
    uint32_t bad = 0;
    for (int j = 0; j < n; j++) bad |= (b[j] & 0x7FFFFFFFu) > 0x7F800000u;
    return !bad;
}

/* The order key of a float32 (its bits b): an unsigned integer with a < b as floats iff
   key(a) < key(b), for every non-NaN a, b except the pair -0.0, +0.0 (equal as floats). The
   thresholds' keys are made with -0.0 taken as +0.0 (kernels.order_key_nodes), so no
   threshold holds key(-0.0), which lies between the negatives' keys and key(+0.0): a row's
   -0.0 then compares with every threshold as +0.0 does. The SPLIT walk compares keys: an
   integer compare, with the node's key and threshold both in integer registers. */
static inline uint32_t sw_order_key(uint32_t b) {
    return b ^ ((uint32_t)((int32_t)b >> 31) | 0x80000000u);
}

/* a row without NaN as order keys (the compact FINITE walk over ModelView.qcnodes) */
static inline void sw_key_row(const float *x, int n, float *vk) {
    const sw_bits *b = (const sw_bits *)x;
    sw_bits *o = (sw_bits *)vk;
    for (int j = 0; j < n; j++) o[j] = sw_order_key(b[j]);
}

/* the doubled row of the SPLIT rule, as order keys: xx[2j] = xx[2j + 1] = key(x[j]), a NaN
   staged as 0 (missing left: no threshold's key is below it) and 0xFFFFFFFF (missing right:
   none is above it; key(+inf) is 0xFF800000). Four features at a time with SSE2 where there
   is SSE2 (gcc leaves the interleaved stores scalar: the scalar loop was 14% of model A's
   kernel time). */
static inline void sw_split_row(const float *x, int n, float *vxx) {
    const sw_bits *b = (const sw_bits *)x;
    sw_bits *o = (sw_bits *)vxx;
    int j = 0;
#ifdef __SSE2__
    const __m128i abs_mask = _mm_set1_epi32(0x7FFFFFFF), inf = _mm_set1_epi32(0x7F800000);
    const __m128i sign = _mm_set1_epi32((int)0x80000000u);
    for (; j + 4 <= n; j += 4) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(b + j));
        const __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(v, abs_mask), inf);
        const __m128i k = _mm_xor_si128(v, _mm_or_si128(_mm_srai_epi32(v, 31), sign));
        const __m128i lo = _mm_andnot_si128(nan, k);                    /* NaN: 0 */
        const __m128i hi = _mm_or_si128(k, nan);                        /* NaN: all ones */
        _mm_storeu_si128((__m128i *)(o + 2 * j), _mm_unpacklo_epi32(lo, hi));
        _mm_storeu_si128((__m128i *)(o + 2 * j + 4), _mm_unpackhi_epi32(lo, hi));
    }
#endif
    for (; j < n; j++) {
        const uint32_t v = b[j];
        const uint32_t m = 0u - (uint32_t)((v & 0x7FFFFFFFu) > 0x7F800000u);
        o[2 * j] = sw_order_key(v) & ~m;
        o[2 * j + 1] = sw_order_key(v) | m;
    }
}

/* The partition walk: a task's rows through one tree node by node, not row by row
   (kernels.part_trees; small trees, kernels.part_walk). The rows are staged by column
   (sw_key_cols: cols[f * n + r] = key(x[r][f]), a NaN 0xFFFFFFFF). The root takes every row;
   each split node divides its list of rows between its children (the left child's from the
   front of the list's span, the right child's from the back, in the other of two buffers),
   depth first, and each leaf takes its list. No step waits on the one before: a node compares
   each of its rows' values in its column with its threshold (AVX-512: 16 rows a gather and
   one compare, the two children's rows compressed out; the root reads its column in order),
   where the rows walks above chain a node's load, the row's value and the compare a row and
   step, and the lockstep walk also pays the deepest path of each 8 rows (bench/NOTES.md "The
   partition walk"). The rule is the SPLIT rule of the doubled row without doubling: a node
   reading 2f + 1 (missing right) compares key(x) with its threshold's key, a NaN's
   0xFFFFFFFF above every threshold; one reading 2f (missing left) adds 1 to both, so a NaN
   wraps to 0, below every threshold, and no other key wraps (a threshold's key is at most
   key(+inf) = 0xFF800000: NaN thresholds are refused, artifact.py).
   Bounds: n <= SW_PMAX (else -1, nothing done). A list is a span [s, e) of 0..n, and the two
   children's spans split their parent's, so the lists held at any time are disjoint and
   nonempty, at most n of them on the stack; a child follows its node (the structure check),
   so the walk ends. Each row reaches exactly one leaf. */
#define SW_PMAX 2048
enum { SW_PART_ROW = 1, SW_PART_AVX512 = 2 };
enum { SW_PLEAF_SLOT = 0, SW_PLEAF_F32 = 1, SW_PLEAF_F64 = 2 };
typedef struct { uint64_t q; uint16_t s, e; uint32_t par; } sw_pspan;

static inline void sw_key_cols(const float *x, int64_t ldx, int32_t n, int32_t nf,
                               uint32_t *cols) {
    for (int32_t r = 0; r < n; r++) {
        const uint32_t *b = (const uint32_t *)(x + r * ldx);
        for (int32_t f = 0; f < nf; f++) {
            const uint32_t v = b[f];
            const uint32_t m = 0u - (uint32_t)((v & 0x7FFFFFFFu) > 0x7F800000u);
            cols[(int64_t)f * n + r] = sw_order_key(v) | m;
        }
    }
}

/* a node's rows src[s..e) (ROOT: 0..n in order, src unused) into dst: left from lo up,
   right from hi down; the scalar step writes a row at both ends and moves one */
#define SW_PART_ROWS(ROOT) {                                                                \
    for (int32_t i = s; i < e; i++) {                                                       \
        const uint32_t r = ROOT ? (uint32_t)i : src[i];                                     \
        const uint32_t go = (uint32_t)(t2 < col[r] + add);                                  \
        dst[lo] = r;                                                                        \
        dst[hi - 1] = r;                                                                    \
        lo += 1 - (int32_t)go;                                                              \
        hi -= (int32_t)go;                                                                  \
    }                                                                                       \
}
#if defined(__GNUC__) && defined(__x86_64__)
#define SW_PART_X86 1
#include <immintrin.h>
/* 16 rows: their values, the compare, and each side's rows compressed to its end (masked
   stores of exactly that side's count) */
#define SW_PART_16(R, V, OK) {                                                              \
    const __mmask16 k_ = _mm512_mask_cmplt_epu32_mask(OK, vt, _mm512_add_epi32(V, va));     \
    const __mmask16 l_ = (__mmask16)(~k_ & (OK));                                           \
    const uint32_t cr_ = (uint32_t)__builtin_popcount((unsigned)k_);                        \
    const uint32_t cl_ = (uint32_t)__builtin_popcount((unsigned)l_);                        \
    _mm512_mask_storeu_epi32(dst + lo, (__mmask16)_bzhi_u32(0xFFFFu, cl_),                  \
                             _mm512_maskz_compress_epi32(l_, R));                           \
    hi -= (int32_t)cr_;                                                                     \
    _mm512_mask_storeu_epi32(dst + hi, (__mmask16)_bzhi_u32(0xFFFFu, cr_),                  \
                             _mm512_maskz_compress_epi32(k_, R));                           \
    lo += (int32_t)cl_;                                                                     \
}
#define SW_PART_AVX(ROOT) {                                                                 \
    const __m512i va = _mm512_set1_epi32((int)add), vt = _mm512_set1_epi32((int)t2);        \
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,   \
                                           14, 15);                                         \
    int32_t i = s;                                                                          \
    for (; i + 16 <= e; i += 16) {                                                          \
        if (ROOT) {                                                                         \
            const __m512i r = _mm512_add_epi32(iota, _mm512_set1_epi32(i));                 \
            SW_PART_16(r, _mm512_loadu_si512(col + i), (__mmask16)0xFFFFu)                  \
        } else {                                                                            \
            const __m512i r = _mm512_loadu_si512(src + i);                                  \
            SW_PART_16(r, _mm512_i32gather_epi32(r, col, 4), (__mmask16)0xFFFFu)            \
        }                                                                                   \
    }                                                                                       \
    if (i < e) {                                                                            \
        const __mmask16 ok = (__mmask16)_bzhi_u32(0xFFFFu, (uint32_t)(e - i));              \
        if (ROOT) {                                                                         \
            const __m512i r = _mm512_add_epi32(iota, _mm512_set1_epi32(i));                 \
            SW_PART_16(r, _mm512_maskz_loadu_epi32(ok, col + i), ok)                        \
        } else {                                                                            \
            const __m512i r = _mm512_maskz_loadu_epi32(ok, src + i);                        \
            SW_PART_16(r, _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), ok, r, col, 4), \
                       ok)                                                                  \
        }                                                                                   \
    }                                                                                       \
}
#define SW_PART_ATTR __attribute__((target("avx512f,bmi2,popcnt")))
#endif
/* what a leaf does with each of its rows r: its slot, or (one value a leaf, summed) its value
   added to the row's score */
#define SW_PLEAF_SLOT_DO(r) slots[r] = slot
#define SW_PLEAF_F32_DO(r) ((float *)acc)[r] += ((const float *)leaves)[slot]
#define SW_PLEAF_F64_DO(r) ((double *)acc)[r] += ((const double *)leaves)[slot]
#define SW_DEF_PART(ATTR, PART, LEAF, NAME)                                                 \
ATTR static void NAME(const sw_qnode *top, const uint32_t *cols, int32_t n, int64_t *slots, \
                      const void *leaves, void *acc) {                                      \
    uint32_t buf[2][SW_PMAX + 16];  /* + 16: the buffers not a multiple of 4 KB apart */    \
    sw_pspan st[SW_PMAX];                                                                   \
    const uint32_t *src = buf[0];                                                           \
    int32_t sp = 0, s = 0, e = n, root = 1;                                                 \
    uint64_t q = 0;                                                                         \
    uint32_t par = 0;                                                                       \
    for (;;) {                                                                              \
        const uint32_t key = top[q].key, thr = top[q].thr;                                  \
        if (key & SW_KEY_LEAF) {                                                            \
            const int64_t slot = SW_SC_SLOT(thr);                                           \
            if (root) {                                                                     \
                for (int32_t r = 0; r < n; r++) LEAF(r);                                    \
                return;                                                                     \
            }                                                                               \
            for (int32_t i = s; i < e; i++) LEAF(src[i]);                                   \
            if (sp == 0) return;                                                            \
            sp--;                                                                           \
            q = st[sp].q; s = st[sp].s; e = st[sp].e; par = st[sp].par;                     \
            src = buf[par];                                                                 \
            continue;                                                                       \
        }                                                                                   \
        uint32_t *dst = buf[par ^ 1u];                                                      \
        const uint32_t *col = cols + (int64_t)((key & 0xFFFFu) >> 1) * n;                   \
        const uint32_t add = ~key & 1u, t2 = thr + add;                                     \
        int32_t lo = s, hi = e;                                                             \
        if (root) PART(1) else PART(0)                                                      \
        root = 0;                                                                           \
        const uint64_t c = q + SW_SC_DELTA(key);                                            \
        par ^= 1u;                                                                          \
        src = dst;                                                                          \
        if (lo == s) {                  /* every row right */                               \
            q = c + 1;                                                                      \
        } else {                                                                            \
            if (lo < e) {               /* the right child's rows wait */                   \
                st[sp].q = c + 1;                                                           \
                st[sp].s = (uint16_t)lo;                                                    \
                st[sp].e = (uint16_t)e;                                                     \
                st[sp++].par = par;                                                         \
            }                                                                               \
            q = c;                                                                          \
            e = lo;                                                                         \
        }                                                                                   \
    }                                                                                       \
}
SW_DEF_PART(, SW_PART_ROWS, SW_PLEAF_SLOT_DO, sw_part_row_slot)
SW_DEF_PART(, SW_PART_ROWS, SW_PLEAF_F32_DO, sw_part_row_f32)
SW_DEF_PART(, SW_PART_ROWS, SW_PLEAF_F64_DO, sw_part_row_f64)
#ifdef SW_PART_X86
SW_DEF_PART(SW_PART_ATTR, SW_PART_AVX, SW_PLEAF_SLOT_DO, sw_part_avx_slot)
SW_DEF_PART(SW_PART_ATTR, SW_PART_AVX, SW_PLEAF_F32_DO, sw_part_avx_f32)
SW_DEF_PART(SW_PART_ATTR, SW_PART_AVX, SW_PLEAF_F64_DO, sw_part_avx_f64)
#endif

/* the best partition the CPU has (SW_PART_AVX512 with AVX-512F, BMI2 and POPCNT) */
static int sw_part_best_v = 0;
static inline int sw_part_best(void) {
#ifdef SW_PART_X86
    if (sw_part_best_v == 0) {
        __builtin_cpu_init();
        sw_part_best_v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("bmi2") &&
            __builtin_cpu_supports("popcnt") ? SW_PART_AVX512 : SW_PART_ROW;
    }
    return sw_part_best_v;
#else
    return SW_PART_ROW;
#endif
}

/* The tree at nodes + root for the n rows of cols: slots[r] (leaf SW_PLEAF_SLOT) or the
   leaf's value added to acc[r] (SW_PLEAF_F32 / _F64: float / double acc and leaves). simd:
   SW_PART_ROW or SW_PART_AVX512 (a CPU without it takes the rows). Prefetches pf..pf_end (the
   caller's next tree) into L2 first. 0, or -1 for n outside 1..SW_PMAX. */
static inline int sw_scwalk_part(const void *nodes, int64_t root, const uint32_t *cols,
                                 int32_t n, int leaf, int64_t *slots, const void *leaves,
                                 void *acc, int simd, const char *pf, const char *pf_end) {
    const sw_qnode *top = (const sw_qnode *)nodes + root;
    if (n < 1 || n > SW_PMAX)
        return -1;
    for (; pf < pf_end; pf += 64) sw_prefetch_l2(pf);
#ifdef SW_PART_X86
    if (simd == SW_PART_AVX512 && sw_part_best() == SW_PART_AVX512) {
        (leaf == SW_PLEAF_F32 ? sw_part_avx_f32 : leaf == SW_PLEAF_F64 ? sw_part_avx_f64
                                                                       : sw_part_avx_slot)(
            top, cols, n, slots, leaves, acc);
        return 0;
    }
#endif
    (void)simd;
    (leaf == SW_PLEAF_F32 ? sw_part_row_f32 : leaf == SW_PLEAF_F64 ? sw_part_row_f64
                                                                   : sw_part_row_slot)(
        top, cols, n, slots, leaves, acc);
    return 0;
}
#endif
