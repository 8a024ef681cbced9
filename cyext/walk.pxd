# Branch-free tree walks over one staged float32 row. Each returns leaf slots; callers add values.
from libc.stdint cimport int32_t, int64_t, uint32_t

from swtypes cimport ModelView, PNode, CNode, KEY_LEAF, INTERLEAVE, sw_feat

cdef extern from "prefetch.h":
    void sw_prefetch(const void* p) noexcept nogil


cdef inline uint32_t go_right(float v, uint32_t key, float thr) noexcept nogil:
    # x > thr, or missing (v != v) with the default-right bit set: no branch either way
    return (v > thr) | ((v != v) & (key & 1))


cdef inline int64_t walk_padded1(const ModelView* m, const float* x, int64_t t) noexcept nogil:
    cdef int64_t ni = (<int64_t>1 << m.depth) - 1
    cdef const PNode* base = m.pnodes + t * ni
    cdef int64_t p = 0
    cdef int32_t d
    cdef const PNode* nd
    for d in range(m.depth):
        nd = base + p
        p = 2 * p + 1 + go_right(x[sw_feat(nd.key)], nd.key, nd.thr)
    return t * (ni + 1) + (p - ni)


cdef inline void walk_padded8(const ModelView* m, const float* x, int64_t t,
                              int64_t* slot) noexcept nogil:
    # Eight trees at once: eight independent dependency chains per row (measured 1.5-1.8x
    # over one chain at a time on depth-5 and depth-8 XGBoost models here).
    cdef int64_t ni = (<int64_t>1 << m.depth) - 1
    cdef const PNode* base = m.pnodes + t * ni
    cdef int64_t p[INTERLEAVE]
    cdef int32_t d, j
    cdef const PNode* nd
    for j in range(INTERLEAVE):
        p[j] = 0
    for d in range(m.depth):
        for j in range(INTERLEAVE):
            nd = base + j * ni + p[j]
            p[j] = 2 * p[j] + 1 + go_right(x[sw_feat(nd.key)], nd.key, nd.thr)
    for j in range(INTERLEAVE):
        slot[j] = (t + j) * (ni + 1) + (p[j] - ni)


cdef inline int64_t walk_compact1(const ModelView* m, const float* x, int64_t t) noexcept nogil:
    cdef const CNode* nd = m.cnodes + m.root[t]
    while not (nd.key & KEY_LEAF):
        nd = m.cnodes + nd.child + go_right(x[sw_feat(nd.key)], nd.key, nd.thr)
    return nd.leaf


cdef inline void walk_compact8(const ModelView* m, const float* x, int64_t t,
                               int64_t* slot) noexcept nogil:
    # Eight trees at once; a leaf steps onto itself (threshold +inf), so every chain takes the
    # same branch-free step until all eight have reached a leaf.
    cdef const CNode* nd[INTERLEAVE]
    cdef int32_t j
    cdef uint32_t all_leaf
    for j in range(INTERLEAVE):
        nd[j] = m.cnodes + m.root[t + j]
    while True:
        all_leaf = KEY_LEAF
        for j in range(INTERLEAVE):
            all_leaf &= nd[j].key
        if all_leaf:
            break
        for j in range(INTERLEAVE):
            nd[j] = m.cnodes + nd[j].child + go_right(x[sw_feat(nd[j].key)], nd[j].key,
                                                      nd[j].thr)
    for j in range(INTERLEAVE):
        slot[j] = nd[j].leaf



cdef extern from *:
    """
    /* Depth-specialised padded walks: W trees of one row at once, chains kept in registers.
       gcc 12 kept walk_padded8's p[8] on the stack with a rolled j loop (a store/load on every
       step's dependency chain); a constant depth and full unrolling put every chain in a
       register and make each tree's base a constant displacement. */
    #include <math.h>
    #include <stdint.h>
    typedef struct { uint32_t key; float thr; } sw_pnode;
    typedef void (*sw_walk_fn)(const void *base, const float *x, int64_t *slot);
    /* Three step rules, the same answers (go right iff x > thr; a NaN goes the node's way):
       STEP: NaN tested at every step. FINITE: rows without NaN, `v > thr` alone (about half
       the instructions per step: measured 1.4x rows/s on model A). SPLIT: rows with NaN, read
       from a doubled row xx[2f + right] (NaN staged as -inf at 2f, +inf at 2f+1; pass-through
       nodes read 2f; models with HistGradientBoosting's NaN-only splits, threshold +inf, keep
       STEP: ModelView.split_ok). A NaN row costs ~0.07 us more per call (staging), not per
       step. */
    /* key = 2f + right: FINITE reads x[key >> 1]; SPLIT reads xx[key] with no arithmetic on
       the key (it was and/shr/lea with the feature and the direction in separate bits). Compact
       keys carry the leaf flag in bit 31, masked off first (SW_C*). */
    #define SW_IDX_F(key) ((key) >> 1)
    #define SW_IDX_SPLIT(key) (key)
    #define SW_CIDX_F(key) (((key) & 0x7FFFFFFFu) >> 1)
    #define SW_CIDX_SPLIT(key) ((key) & 0x7FFFFFFFu)
    #define SW_STEP(v, key, thr) ((uint32_t)((v) > (thr)) | ((uint32_t)((v) != (v)) & ((key) & 1u)))
    #define SW_GT(v, key, thr) ((uint32_t)((v) > (thr)))
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
    #define SW_TAB(NAME) {0, NAME##_d1, NAME##_d2, NAME##_d3, NAME##_d4, NAME##_d5, NAME##_d6, \
                          NAME##_d7, NAME##_d8, NAME##_d9, NAME##_d10}
    #define SW_DEF_ALL(W, D) SW_DEF_WALK(W, D, SW_IDX_F, SW_STEP, sw_walk##W##n_d##D)          \
        SW_DEF_WALK(W, D, SW_IDX_F, SW_GT, sw_walk##W##f_d##D)                                  \
        SW_DEF_WALK(W, D, SW_IDX_SPLIT, SW_GT, sw_walk##W##s_d##D)
    #define SW_DEF_DEPTHS(W) SW_DEF_ALL(W, 1) SW_DEF_ALL(W, 2) SW_DEF_ALL(W, 3)                 \
        SW_DEF_ALL(W, 4) SW_DEF_ALL(W, 5) SW_DEF_ALL(W, 6) SW_DEF_ALL(W, 7)                     \
        SW_DEF_ALL(W, 8) SW_DEF_ALL(W, 9) SW_DEF_ALL(W, 10)
    SW_DEF_DEPTHS(8)
    SW_DEF_DEPTHS(16)
    #define SW_TAB(NAME) {0, NAME##_d1, NAME##_d2, NAME##_d3, NAME##_d4, NAME##_d5, NAME##_d6, \
                          NAME##_d7, NAME##_d8, NAME##_d9, NAME##_d10}
    static const sw_walk_fn sw_walk_tab[6][11] = {
        SW_TAB(sw_walk8n), SW_TAB(sw_walk8f), SW_TAB(sw_walk8s),
        SW_TAB(sw_walk16n), SW_TAB(sw_walk16f), SW_TAB(sw_walk16s)};
    /* wide: 0 for 8 trees, 1 for 16; rule: SW_RULE_*. NULL outside depths 1..10. */
    enum { SW_RULE_NAN = 0, SW_RULE_FINITE = 1, SW_RULE_SPLIT = 2 };
    static inline sw_walk_fn sw_walk_fn_for(int depth, int wide, int rule) {
        return depth >= 1 && depth <= 10 ? sw_walk_tab[3 * wide + rule][depth] : 0; }
    /* Compact walks, CW trees of one row, chains in registers (gcc kept walk_compact8's nd[8]
       on the stack); a leaf steps onto itself (threshold +inf) until all CW are done. CW = 16:
       measured 1.14x rows/s and 0.67x single-row latency over 8 on model C (a 9 MB forest,
       memory-latency bound: more misses in flight). Same rules as the padded walks (a leaf's
       key reads feature 0, never a NaN slot). */
    #define CW 16
    typedef struct { uint32_t key; float thr; int32_t child; int32_t leaf; } sw_cnode;
    typedef void (*sw_cwalk_fn)(const void *nodes, const int64_t *root, const float *x,
                                int64_t *slot);
    #define SW_DEF_CWALK(IDX, RULE, NAME)                                                       \
    static void NAME(const void *vnodes, const int64_t *root, const float *x, int64_t *slot) {  \
        const sw_cnode *c = (const sw_cnode *)vnodes;                                           \
        const sw_cnode *nd[CW];                                                                  \
        _Pragma("GCC unroll 16") for (int j = 0; j < CW; j++) nd[j] = c + root[j];               \
        for (;;) {                                                                              \
            uint32_t all = 0x80000000u;                                                         \
            _Pragma("GCC unroll 16") for (int j = 0; j < CW; j++) all &= nd[j]->key;             \
            if (all) break;                                                                     \
            _Pragma("GCC unroll 16") for (int j = 0; j < CW; j++) {                               \
                const uint32_t key = nd[j]->key;                                                \
                const float v = x[IDX(key)];                                                    \
                nd[j] = c + nd[j]->child + RULE(v, key, nd[j]->thr);                            \
            }                                                                                   \
        }                                                                                       \
        _Pragma("GCC unroll 16") for (int j = 0; j < CW; j++) slot[j] = nd[j]->leaf;             \
    }
    SW_DEF_CWALK(SW_CIDX_F, SW_STEP, sw_cwalk8n)
    SW_DEF_CWALK(SW_CIDX_F, SW_GT, sw_cwalk8f)
    SW_DEF_CWALK(SW_CIDX_SPLIT, SW_GT, sw_cwalk8s)
    static const sw_cwalk_fn sw_cwalk_tab[3] = {sw_cwalk8n, sw_cwalk8f, sw_cwalk8s};
    static inline sw_cwalk_fn sw_cwalk_fn_for(int rule) { return sw_cwalk_tab[rule]; }

    /* Integer tests on the float bits: gcc vectorises these; the float forms (v != v) stayed
       scalar with branches (measured ~90 ns per 64-feature row with NaN, now ~15). */
    typedef uint32_t __attribute__((may_alias)) sw_bits;
    static inline int sw_row_finite(const float *x, int n) {
        const sw_bits *b = (const sw_bits *)x;
        uint32_t bad = 0;
        for (int j = 0; j < n; j++) bad |= (b[j] & 0x7FFFFFFFu) > 0x7F800000u;
        return !bad; }
    static inline void sw_split_row(const float *x, int n, float *xx) {
        const sw_bits *b = (const sw_bits *)x;
        sw_bits *o = (sw_bits *)xx;
        for (int j = 0; j < n; j++) {
            const uint32_t v = b[j];
            const uint32_t m = 0u - (uint32_t)((v & 0x7FFFFFFFu) > 0x7F800000u);
            o[2 * j] = (v & ~m) | (0xFF800000u & m);       /* NaN -> -inf */
            o[2 * j + 1] = (v & ~m) | (0x7F800000u & m); } } /* NaN -> +inf */
    """
    ctypedef void (*sw_walk_fn)(const void* base, const float* x, int64_t* slot) noexcept nogil
    sw_walk_fn sw_walk_fn_for(int depth, int wide, int rule) noexcept nogil
    int sw_row_finite(const float* x, int n) noexcept nogil   # 1: no NaN among x[0..n)
    void sw_split_row(const float* x, int n, float* xx) noexcept nogil   # xx: 2n floats
    enum: SW_RULE_NAN, SW_RULE_FINITE, SW_RULE_SPLIT
    ctypedef void (*sw_cwalk_fn)(const void* nodes, const int64_t* root, const float* x,
                                 int64_t* slot) noexcept nogil
    sw_cwalk_fn sw_cwalk_fn_for(int rule) noexcept nogil


cdef enum:
    WIDE = 16                 # trees per row in the 16-chain walks
