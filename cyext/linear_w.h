/* One copy of the MODE_LINEAR walk (linear.h) for SW_W rows, compiled for the instruction set
   SW_ISA names (SW_ISA_ATTR: its function attributes): included by linear.h and
   linear_copies.h once a copy, all three defined. No include guard, on purpose. */
#define SW_LIN_CAT2(a, b, c) a##b##c
#define SW_LIN_CAT(a, b, c) SW_LIN_CAT2(a, b, c)
#define SW_LIN_NODE SW_LIN_CAT(sw_lin_node_, SW_W, SW_ISA)
#define SW_LIN_TREE SW_LIN_CAT(sw_lin_tree_, SW_W, SW_ISA)
#define SW_LIN_V SW_LIN_CAT(sw_lin_v, SW_W, SW_ISA)
#define SW_LIN_M SW_LIN_CAT(sw_lin_m, SW_W, SW_ISA)
/* a where the lanes of mask m are set, else b (scalars a and b): a lane's bits, no arithmetic */
#define SW_LIN_PICK(m, a, b) \
    ((SW_LIN_V)(((m) & (SW_LIN_M)((a) - (SW_LIN_V){0})) | (~(m) & (SW_LIN_M)((b) - (SW_LIN_V){0}))))

/* A point's values for the SW_W rows, one vector (GCC's vector extension: the compiler splits
   it into the CPU's registers; element-wise IEEE operations, the same bits as a loop over the
   rows); aligned as a double, so the frames need no more than malloc's alignment. */
typedef double SW_LIN_V __attribute__((vector_size(SW_W * sizeof(double)), aligned(8)));
typedef int64_t SW_LIN_M __attribute__((vector_size(SW_W * sizeof(double)), aligned(8)));

/* All ones in the lanes whose bit of `bits` is set, four lanes a step. */
SW_ISA_ATTR static inline SW_LIN_M SW_LIN_CAT(sw_lin_mask_, SW_W, SW_ISA)(uint32_t bits)
{
    SW_LIN_M m;
#if SW_W == 1
    m[0] = -(int64_t)(bits & 1);
#else
    int32_t r;
    for (r = 0; r < SW_W; r += 4)
        memcpy((int64_t *)&m + r, sw_lin_nibble[(bits >> r) & 15], 4 * sizeof(int64_t));
#endif
    return m;
}
#define SW_LIN_MASK SW_LIN_CAT(sw_lin_mask_, SW_W, SW_ISA)

/* Below `node` at `depth`, given P (Q x SW_W, rows inner): D = the sum over the leaves below
   of v times their factors below `node`; each split's feature gets its edges' shares. An
   edge's share needs S / F, F its merged factor: P_parent D_child when F is the edge's own
   factor, times 1 / (the factor it replaces) when the feature was met before on the path,
   minus own / F, the S of deeper edges on the same feature (their leaves are theirs). An
   edge no real row follows whose merged factor is zero has S = 0: skipped. */
SW_ISA_ATTR static void SW_LIN_NODE(sw_lin *s, int32_t node, int32_t depth, const SW_LIN_V *restrict P,
                        SW_LIN_V *restrict D)
{
    enum { W = SW_W };
    const int32_t Q = s->Q, f = s->feature[node];
    const double *restrict tq = s->tq;
    const double *restrict wq = s->wq;
    SW_LIN_V *restrict Pc, *restrict Dc, *restrict F, *restrict inv, *restrict own, *restrict wP;
    SW_LIN_V *R;
#if SW_W > 1
    SW_LIN_V *restrict phi = (SW_LIN_V *)s->phi;
#endif
    SW_LIN_V a, omz;
    SW_LIN_M m;
    double zp, zm, inv0, inv1, f0, f1;
    uint32_t op, right, follow;
    SW_LIN_V *up;
    int32_t *up_used;
    int32_t q, side, c;

    if (f < 0) {
        const double v = s->value[node];
        for (q = 0; q < Q; q++)
            D[q] = v - (SW_LIN_V){0};
        return;
    }
    Pc = (SW_LIN_V *)(s->arena + (int64_t)depth * SW_LIN_FRAME_ARRAYS * W * Q);
    Dc = Pc + Q;
    F = Dc + Q;
    inv = F + 2 * Q;  /* after R's place (R: F where no factor is replaced) */
    own = inv + Q;
    wP = own + Q;
    for (q = 0; q < Q; q++)
        wP[q] = wq[q] * P[q];
    for (q = 0; q < Q; q++)
        D[q] = (SW_LIN_V){0};
    right = s->right[node];
    zp = s->z[f];
    op = s->o[f];
    up = (SW_LIN_V *)s->acc[f];
    up_used = s->acc_used[f];
    if (up != 0) {
        /* 1 / the factor this split's merges replace: one of two values a point */
        m = SW_LIN_MASK(op);
        for (q = 0; q < Q; q++) {
            inv0 = 1.0 / (zp + (0.0 - zp) * tq[q]);
            inv1 = 1.0 / (zp + (1.0 - zp) * tq[q]);
            inv[q] = SW_LIN_PICK(m, inv1, inv0);
        }
    }
    for (side = 0; side < 2; side++) {
        c = s->child[2 * node + side];
        zm = zp * s->zfrac[c];
        follow = op & (side ? right : ~right);
        if (zm == 0.0 && (follow & s->live) == 0)
            continue;
        /* the factor z (1 - t) + o t at a point takes one of two values, o 0 or 1 */
        m = SW_LIN_MASK(follow);
        for (q = 0; q < Q; q++) {
            f0 = zm + (0.0 - zm) * tq[q];
            f1 = zm + (1.0 - zm) * tq[q];
            F[q] = SW_LIN_PICK(m, f1, f0);
        }
        if (up == 0) {
            R = F;
            for (q = 0; q < Q; q++)
                Pc[q] = P[q] * F[q];
        } else {
            R = F + Q;
            for (q = 0; q < Q; q++) {
                R[q] = F[q] * inv[q];
                Pc[q] = P[q] * R[q];
            }
        }
        s->z[f] = zm;
        s->o[f] = follow;
        s->acc[f] = (double *)own;
        s->acc_used[f] = &s->used[depth];
        s->used[depth] = 0;
        SW_LIN_NODE(s, c, depth + 1, Pc, Dc);
        a = (SW_LIN_V){0};
        if (up == 0) {
            for (q = 0; q < Q; q++)
                a += wP[q] * Dc[q];
        } else {
            for (q = 0; q < Q; q++)
                a += wP[q] * Dc[q] * inv[q];
        }
        if (s->used[depth]) {
            for (q = 0; q < Q; q++)
                a -= wq[q] * own[q] / F[q];
        }
        omz = SW_LIN_PICK(m, 1.0 - zm, 0.0 - zm); /* o - z */
#if SW_W == 1
        s->phis[0][f] += omz[0] * a[0];
#else
        phi[f] += omz * a; /* the block's sums, added to the rows' at its end */
#endif
        if (up != 0) {
            if (!up_used[0]) {
                up_used[0] = 1;
                for (q = 0; q < Q; q++)
                    up[q] = (SW_LIN_V){0};
            }
            for (q = 0; q < Q; q++)
                up[q] += Pc[q] * Dc[q];
        }
        for (q = 0; q < Q; q++)
            D[q] += R[q] * Dc[q];
    }
    s->z[f] = zp;
    s->o[f] = op;
    s->acc[f] = (double *)up;
    s->acc_used[f] = up_used;
}

SW_ISA_ATTR static void SW_LIN_TREE(sw_lin *s)
{
    enum { W = SW_W };
    SW_LIN_V *P = (SW_LIN_V *)(s->arena + (int64_t)s->frames * SW_LIN_FRAME_ARRAYS * W * s->Q);
    SW_LIN_V *D = P + s->Q;
    int32_t q;
    for (q = 0; q < s->Q; q++)
        P[q] = 1.0 - (SW_LIN_V){0};
    SW_LIN_NODE(s, 0, 0, P, D);
}

#undef SW_LIN_NODE
#undef SW_LIN_TREE
#undef SW_LIN_V
#undef SW_LIN_M
#undef SW_LIN_PICK
#undef SW_LIN_MASK
#undef SW_LIN_CAT
#undef SW_LIN_CAT2
