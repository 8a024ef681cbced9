# Fixed-width types and the packed node structs every kernel reads.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t

# Node key: 2 * feature + (1 if a missing value goes right), bit 31 = leaf (compact nodes).
# 2f + right is the index into a doubled row of order keys (key(x) at 2f and 2f+1, a NaN
# staged as 0 at 2f and 0xFFFFFFFF at 2f+1; walk.h sw_split_row): the SPLIT walks read
# xx[key] with no arithmetic on the key at all.
cdef extern from "walk.h":
    const uint32_t KEY_LEAF "SW_KEY_LEAF"
    uint32_t sw_feat(uint32_t key) noexcept nogil   # the feature index of a node key

cdef enum:
    BLOCK_ROWS = 64           # rows per staged block (XGBoost's kBlockOfRowsSize; 256 measured no faster)
    INTERLEAVE = 8            # trees walked at once per row: independent dependency chains

ctypedef struct PNode:        # padded level-major node, 8 bytes
    uint32_t key              # 2 * feature + missing-goes-right
    float thr                 # go right iff x > thr (float32); pass-through nodes: +inf

ctypedef struct CNode:        # compact node, 16 bytes (4 per cache line; siblings adjacent)
    uint32_t key              # 2 * feature + missing-goes-right; bit 31 = leaf
    float thr                 # go right iff x > thr; leaves: +inf (step stays put)
    int32_t child             # global index of the left child (right = child + 1); leaves: self
    int32_t leaf              # leaf slot in the leaf-value array (leaves only)

ctypedef struct ModelView:    # borrowed pointers into arrays owned by a kernels.Forest
    const PNode* pnodes       # padded: n_trees * (2^depth - 1) internal nodes
    const PNode* qnodes       # the same with thr's bits replaced by their order key (walk.h
                              # sw_order_key), for the SPLIT walks; NULL for compact models
                              # and models with special nodes
    const CNode* cnodes       # compact: all nodes of all trees
    const CNode* qcnodes      # the same with order-key thresholds (walk.h sw_cwalk_q); NULL
                              # for padded models and models with special nodes
    const PNode* sqcnodes     # qcnodes in 8 bytes a node (walk.h sw_scwalk_q) where they fit;
                              # else NULL
    const int64_t* root       # compact: global node index of each tree's root
    const int32_t* group      # output column each tree adds to (-1: every column)
    int32_t depth             # padded depth (0 for compact)
    int32_t n_leaf_out        # values per leaf (1, or n_outputs for soft-voting forests)
    int32_t n_outputs         # raw score columns
    int32_t n_features
    const uint32_t* cats      # special node entries (NULL: the model has none)
    const int32_t* cat_feat   # staged categorical features (walk.h sw_stage_cats) ...
    const uint32_t* cat_head  # ... and the header of their splits' entries
    int32_t n_cat_feat        # 0: nothing staged, the splits read the values
    int32_t cat_staged        # 1 when n_cat_feat > 0
    int64_t n_trees
    int64_t n_nodes           # compact: the nodes of all trees (the last tree's end); else 0
    int64_t n_leaves          # rows of leaf values
    const void* qs            # QuickScorer tables (qs.h sw_qs), or NULL: the walks score
    const void* obl           # oblivious-tree tables (oblivious.h sw_obl), or NULL
    const void* lanes         # the lanes kernel's tables (lanes.h sw_lanes), or NULL
    const void* masks         # the leaf-mask kernel's tables (masks.h sw_masks), or NULL
    int32_t trees_walk        # 1: deep-forest tasks walk 16 trees a row, not the rows walk
                              # (kernels.rows_walk; Forest.rows_walk, for tests and A/B runs)
    const int32_t* steps      # per tree: the untested steps of the rows walk without refills
                              # (walk.h sw_scwalk_fixed; kernels.walk_steps), or NULL: the
                              # refilling walk (sw_scwalk_rows; Forest.fixed_walk)
    int32_t part              # the partition walk (walk.h sw_scwalk_part) for tasks of at
                              # least PART_ROWS_PER_NODE x part_nodes rows: SW_PART_AVX512 or
                              # SW_PART_ROW, or 0: off (kernels.part_walk; Forest.part_walk)
    int64_t part_nodes        # the largest tree's node count (compact 8-byte nodes), else 0
    int32_t pairs             # 1: planned tasks walk doubled rows two at a time (walk.h
                              # sw_pair_*; kernels.eval_planned), 0: one at a time
                              # (Forest.pair_walk, for tests and A/B runs)
    int32_t agg               # AGG_SUM, or AGG_MIN / AGG_MAX (ONNX aggregate_function): the
                              # trees' smallest or largest leaf, then + base (blocks.add_leaf)

ctypedef struct Column:       # one feature column to stage from (numpy or Arrow memory)
    const char* data          # first element (Arrow: buffer start; rows start at `offset`)
    int64_t stride            # bytes between rows (bit-packed booleans: unused)
    int64_t offset            # element offset for bit-packed data and the validity bitmap
    const uint8_t* valid      # Arrow validity bitmap, NULL when every value is present
    int32_t kind              # one of the COL_* codes

cdef enum:
    COL_F32 = 0
    COL_F64 = 1
    COL_I8 = 2
    COL_I16 = 3
    COL_I32 = 4
    COL_I64 = 5
    COL_U8 = 6
    COL_U16 = 7
    COL_U32 = 8
    COL_U64 = 9
    COL_BITS = 10             # Arrow boolean: one bit per row
    COL_ABSENT = 11           # all missing
