# Tree walks over one staged float32 row; each returns leaf slots, callers add values. The split
# rule and the wide walks are C, in walk.h; the one-tree and eight-tree walks below use its
# sw_go_right.
from libc.stdint cimport int32_t, int64_t, uint32_t

from swtypes cimport ModelView, PNode, CNode, KEY_LEAF, INTERLEAVE, sw_feat

cdef extern from "walk.h":
    void sw_prefetch(const void* p) noexcept nogil
    void sw_prefetch_l2(const void* p) noexcept nogil
    uint32_t sw_go_right(float v, uint32_t key, float thr) noexcept nogil   # 1: go right
    ctypedef void (*sw_walk_fn)(const void* base, const float* x, int64_t* slot) noexcept nogil
    sw_walk_fn sw_walk_fn_for(int depth, int wide, int rule) noexcept nogil  # NULL: no such walk
    ctypedef void (*sw_cwalk_fn)(const void* nodes, const int64_t* root, const float* x,
                                 int64_t* slot) noexcept nogil
    sw_cwalk_fn sw_cwalk_fn_for(int rule) noexcept nogil
    int sw_row_finite(const float* x, int n) noexcept nogil   # 1: no NaN among x[0..n)
    void sw_split_row(const float* x, int n, float* xx) noexcept nogil   # xx: 2n floats
    void sw_key_row(const float* x, int n, float* k) noexcept nogil      # k: n order keys
    sw_cwalk_fn sw_cwalk_q_for(int rule) noexcept nogil  # order-key compact walk, SPLIT/FINITE
    sw_cwalk_fn sw_scwalk_q_for(int rule) noexcept nogil  # the same over 8-byte nodes (sqcnodes)
    # n rows through one tree of 8-byte nodes, 8 chains refilled from the rows: doubled rows
    # (SPLIT) / rows of keys (FINITE); slots[i]: row i's leaf slot
    void sw_scwalk_rows(const void* nodes, int64_t root, const uint32_t* const* rx, int32_t n,
                        int64_t* slots, const char* pf, const char* pf_end) noexcept nogil
    void sw_scwalk_rows_f(const void* nodes, int64_t root, const uint32_t* const* rx, int32_t n,
                          int64_t* slots, const char* pf, const char* pf_end) noexcept nogil
    # the same without refills: 8 rows at once, `steps` steps untested, then steps until all
    # 8 stand on a leaf
    void sw_scwalk_fixed(const void* nodes, int64_t root, const uint32_t* const* rx, int32_t n,
                         int64_t* slots, int32_t steps, const char* pf,
                         const char* pf_end) noexcept nogil
    void sw_scwalk_fixed_f(const void* nodes, int64_t root, const uint32_t* const* rx,
                           int32_t n, int64_t* slots, int32_t steps, const char* pf,
                           const char* pf_end) noexcept nogil
    # the partition walk: n rows staged by column (sw_key_cols), a tree node by node
    enum: SW_PMAX, SW_PART_ROW, SW_PART_AVX512, SW_PLEAF_SLOT, SW_PLEAF_F32, SW_PLEAF_F64
    void sw_key_cols(const float* x, int64_t ldx, int32_t n, int32_t nf,
                     uint32_t* cols) noexcept nogil
    int sw_part_best() noexcept nogil
    int sw_scwalk_part(const void* nodes, int64_t root, const uint32_t* cols, int32_t n,
                       int leaf, int64_t* slots, const void* leaves, void* acc, int simd,
                       const char* pf, const char* pf_end) noexcept nogil
    # models with special (categorical, zero-as-missing) nodes: W chains, chain j the tree at
    # root[j * dt] on the row x + j * dx
    void sw_swalk1(const void* nodes, const int64_t* root, int64_t dt, const float* x,
                   int64_t dx, const uint32_t* cats, int staged, int64_t* slot) noexcept nogil
    void sw_swalk8(const void* nodes, const int64_t* root, int64_t dt, const float* x,
                   int64_t dx, const uint32_t* cats, int staged, int64_t* slot) noexcept nogil
    void sw_swalk16(const void* nodes, const int64_t* root, int64_t dt, const float* x,
                    int64_t dx, const uint32_t* cats, int staged, int64_t* slot) noexcept nogil
    uint32_t sw_special_right(float v, uint32_t key, uint32_t h, const uint32_t* e) noexcept nogil
    uint32_t sw_step_padded(float v, uint32_t key, float thr, const uint32_t* cats,
                            int staged) noexcept nogil
    ctypedef void (*sw_swalkp_fn)(const void* base, const float* x, int64_t* slot,
                                  const uint32_t* cats, int staged) noexcept nogil
    void sw_stage_cats(float* x, int64_t ldx, int32_t n_rows, const int32_t* feat,
                       const uint32_t* head, int32_t k) noexcept nogil
    sw_swalkp_fn sw_spwalk_fn_for(int depth) noexcept nogil
    enum: SW_RULE_NAN, SW_RULE_FINITE, SW_RULE_SPLIT
    # two doubled rows through SW_PAIR_W trees, each row's leaves added to its sum in tree order
    enum: SW_PAIR_W
    ctypedef void (*sw_pair_f_fn)(const void* base, const uint32_t* x0, const uint32_t* x1,
                                  const float* lv, float* acc0, float* acc1) noexcept nogil
    ctypedef void (*sw_pair_d_fn)(const void* base, const uint32_t* x0, const uint32_t* x1,
                                  const double* lv, double* acc0, double* acc1) noexcept nogil
    sw_pair_f_fn sw_pair_f_for(int depth) noexcept nogil   # NULL outside depths 1..10
    sw_pair_d_fn sw_pair_d_for(int depth) noexcept nogil


cdef enum:
    WIDE = 16                 # trees per row in the 16-chain walks
    PLAN_WIDE = 12            # trees per row in the planned padded walks (sw_walk_fn_for wide)


cdef inline int64_t walk_padded1(const ModelView* m, const float* x, int64_t t) noexcept nogil:
    cdef int64_t ni = (<int64_t>1 << m.depth) - 1
    cdef const PNode* base = m.pnodes + t * ni
    cdef int64_t p = 0
    cdef int32_t d
    cdef const PNode* nd
    if m.cats != NULL:
        for d in range(m.depth):
            nd = base + p
            p = 2 * p + 1 + sw_step_padded(x[sw_feat(nd.key)], nd.key, nd.thr, m.cats,
                                           m.cat_staged)
        return t * (ni + 1) + (p - ni)
    for d in range(m.depth):
        nd = base + p
        p = 2 * p + 1 + sw_go_right(x[sw_feat(nd.key)], nd.key, nd.thr)
    return t * (ni + 1) + (p - ni)


cdef inline void walk_padded_x8(const ModelView* m, const float* x, int64_t t, int64_t dt,
                                int64_t dx, int64_t* slot) noexcept nogil:
    # eight independent dependency chains: chain j walks tree t + j * dt on row x + j * dx
    # (eight trees of one row: dt 1, dx 0; one tree of eight rows: dt 0, dx = the row stride)
    cdef int64_t ni = (<int64_t>1 << m.depth) - 1
    cdef int64_t p[INTERLEAVE]
    cdef int32_t d, j
    cdef const PNode* nd
    for j in range(INTERLEAVE):
        p[j] = 0
    if m.cats != NULL:
        for d in range(m.depth):
            for j in range(INTERLEAVE):
                nd = m.pnodes + (t + j * dt) * ni + p[j]
                p[j] = 2 * p[j] + 1 + sw_step_padded(x[j * dx + sw_feat(nd.key)], nd.key,
                                                     nd.thr, m.cats, m.cat_staged)
        for j in range(INTERLEAVE):
            slot[j] = (t + j * dt) * (ni + 1) + (p[j] - ni)
        return
    for d in range(m.depth):
        for j in range(INTERLEAVE):
            nd = m.pnodes + (t + j * dt) * ni + p[j]
            p[j] = 2 * p[j] + 1 + sw_go_right(x[j * dx + sw_feat(nd.key)], nd.key, nd.thr)
    for j in range(INTERLEAVE):
        slot[j] = (t + j * dt) * (ni + 1) + (p[j] - ni)


cdef inline int64_t walk_compact1(const ModelView* m, const float* x, int64_t t) noexcept nogil:
    cdef int64_t slot
    cdef const CNode* nd = m.cnodes + m.root[t]
    if m.cats != NULL:
        sw_swalk1(m.cnodes, m.root + t, 0, x, 0, m.cats, m.cat_staged, &slot)
        return slot
    while not (nd.key & KEY_LEAF):
        nd = m.cnodes + nd.child + sw_go_right(x[sw_feat(nd.key)], nd.key, nd.thr)
    return nd.leaf


cdef inline void walk_compact_x8(const ModelView* m, const float* x, int64_t t, int64_t dt,
                                 int64_t dx, int64_t* slot) noexcept nogil:
    # as walk_padded_x8; a leaf steps onto itself (threshold +inf), so every chain takes the
    # same branch-free step until all eight have reached a leaf
    cdef const CNode* nd[INTERLEAVE]
    cdef int32_t j
    cdef uint32_t all_leaf
    if m.cats != NULL:
        sw_swalk8(m.cnodes, m.root + t, dt, x, dx, m.cats, m.cat_staged, slot)
        return
    for j in range(INTERLEAVE):
        nd[j] = m.cnodes + m.root[t + j * dt]
    while True:
        all_leaf = KEY_LEAF
        for j in range(INTERLEAVE):
            all_leaf &= nd[j].key
        if all_leaf:
            break
        for j in range(INTERLEAVE):
            nd[j] = m.cnodes + nd[j].child + sw_go_right(x[j * dx + sw_feat(nd[j].key)],
                                                         nd[j].key, nd[j].thr)
    for j in range(INTERLEAVE):
        slot[j] = nd[j].leaf


cdef inline void walk8(const ModelView* m, const float* x, int64_t t,
                       int64_t* slot) noexcept nogil:
    """Trees t..t+7 of one row, whichever the layout."""
    if m.pnodes != NULL:
        walk_padded_x8(m, x, t, 1, 0, slot)
    else:
        walk_compact_x8(m, x, t, 1, 0, slot)


cdef inline int64_t walk1(const ModelView* m, const float* x, int64_t t) noexcept nogil:
    """Tree t of one row, whichever the layout."""
    return walk_padded1(m, x, t) if m.pnodes != NULL else walk_compact1(m, x, t)


cdef inline void walk_rows8(const ModelView* m, const float* X, int64_t ldx, int64_t t,
                            int64_t* slot) noexcept nogil:
    """Tree t of eight rows X, X + ldx, ...: eight chains when a chunk is one short round
    (lazygbm checks after every round; one chain per row measured ~1.7x slower)."""
    if m.pnodes != NULL:
        walk_padded_x8(m, X, t, 0, ldx, slot)
    else:
        walk_compact_x8(m, X, t, 0, ldx, slot)
