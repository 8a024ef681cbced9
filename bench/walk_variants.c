/* Step and chain variants of the padded SPLIT walk over one model's nodes (bench/walk_variants.py
   dumps them: model B, XGBoost 500 x depth 8), each scoring the same 512 doubled rows tree
   group by tree group and adding each row's leaves in tree order (float32 sums: every variant
   must give the same sum, printed). Prints ns a row, the best of 15 rounds.

   gcc -O3 -Icyext bench/walk_variants.c -o walk_variants && ./walk_variants NODES XX

   Variants (R rows x W trees a call; "pass" = the trees a pass over all rows takes):
     one-row 12, slots   the one-row 12-tree walk (sw_walk12s), leaves added by the caller
     one-row W, summed   the same with W chains, the leaves added in the walk
     pairs 2 x W         the pair walk (sw_pair_*): two rows, W trees each, W-tree passes
     pairs 2 x 6, 12-tree passes   two calls of 6 trees a pair in each 12-tree group
     3-load step         the node's key and threshold loaded apart (one temporary register)
     rorx step           the node rotated on load (rorx), the key shifted out (shrx)
     32-bit address      rows as 64-bit words (value << 32) below 4 GB: a step of three
                         instructions, the node word compared whole with the row's word */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#include "walk.h"

#define D 8
#define NI 255
#define NR 512
static int64_t T, NF;
static sw_qnode *nodes;
static uint32_t *xx;
static uint64_t *xx64;
static float *leaves;

#define STEP3(Q, nd, XR) do { uint64_t t_;                                                   \
    __asm__("movl (%[n]), %k[t]\n\tmovl (%[x],%[t],4), %k[t]\n\tcmpl %k[t], 4(%[n])\n\t"    \
            "adc %[q], %[q]" : [q] "+r"(Q), [t] "=&r"(t_) : [n] "r"(nd), [x] "r"(XR),         \
            "m"(*(const uint32_t(*)[])(XR)), "m"(*(const uint64_t *)(nd)) : "cc"); } while (0)
#define STEPR(Q, nd, XR) do { uint64_t w_, k_;                                                \
    __asm__("rorxq $32, %[nm], %[w]\n\tshrxq %[c], %[w], %[k]\n\tcmp (%[x],%[k],4), %k[w]\n\t"\
            "adc %[q], %[q]" : [q] "+r"(Q), [k] "=&r"(k_), [w] "=&r"(w_)                      \
            : [nm] "m"(*(const uint64_t *)(nd)), [x] "r"(XR), [c] "r"(c32),                  \
            "m"(*(const uint32_t(*)[])(XR)) : "cc"); } while (0)
#define STEPA(Q, nd, XR) do { uint64_t w_;                                                    \
    __asm__("movq %[nm], %[w]\n\tcmpq (%k[x],%k[w],8), %[w]\n\tadc %[q], %[q]"               \
            : [q] "+r"(Q), [w] "=&r"(w_) : [nm] "m"(*(const uint64_t *)(nd)), [x] "r"(XR),    \
            "m"(*(const uint64_t(*)[])(XR)) : "cc"); } while (0)
#define QSTEP(Q, nd, XR) SW_QSTEP(Q, nd, XR)

/* R rows x W trees, leaves summed in the walk (row r's sum: acc[r]) */
#define DEF(R, W, STEP, XT, NAME) DEFA(R, W, STEP, XT, NAME, )
#define DEFA(R, W, STEP, XT, NAME, ATTR)                                                    \
ATTR                                                                                        \
static void NAME(const sw_qnode *vbase, const XT *const *xs, const float *lv, float *acc) {  \
    const sw_qnode *base = vbase - 1; const uint64_t c32 = 32; (void)c32;                   \
    uint64_t q[R][W]; const XT *x[R];                                                       \
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) x[r] = xs[r];                       \
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                                     \
        _Pragma("GCC unroll 16") for (int j = 0; j < W; j++) q[r][j] = 1;                   \
    _Pragma("GCC unroll 16") for (int d = 0; d < D; d++)                                    \
        _Pragma("GCC unroll 16") for (int j = 0; j < W; j++)                                \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                           \
                const sw_qnode *nd = base + j * NI + q[r][j]; STEP(q[r][j], nd, x[r]); }    \
    _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                   \
        float a = acc[r];                                                                   \
        _Pragma("GCC unroll 16") for (int j = 0; j < W; j++)                                \
            a += lv[j * (NI + 1) + (int64_t)q[r][j] - NI - 1];                              \
        acc[r] = a; } }
DEF(1, 12, QSTEP, uint32_t, one12s)
DEF(1, 10, QSTEP, uint32_t, one10s)
DEF(1, 11, QSTEP, uint32_t, one11s)
DEF(2, 6, QSTEP, uint32_t, pair6)
DEF(2, 8, QSTEP, uint32_t, pair8)
DEF(2, 5, QSTEP, uint32_t, pair5)
DEF(1, 12, STEP3, uint32_t, one12_3load)
DEF(1, 13, STEP3, uint32_t, one13_3load)
DEFA(2, 6, STEPR, uint32_t, pair6_rorx, __attribute__((target("bmi2"))))
DEF(1, 12, STEPA, uint64_t, one12_a32)
DEF(2, 6, STEPA, uint64_t, pair6_a32)
typedef void (*fn32)(const sw_qnode *, const uint32_t *const *, const float *, float *);
typedef void (*fn64)(const sw_qnode *, const uint64_t *const *, const float *, float *);

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
                          return t.tv_sec * 1e9 + t.tv_nsec; }

/* the trees past the last whole pass, one at a time, in order */
static void rest(int64_t t, float *acc) {
    for (; t < T; t++) for (int r = 0; r < NR; r++) {
        const uint32_t *x = xx + r * 2 * NF; const sw_qnode *b = nodes + t * NI - 1;
        int64_t q = 1;
        for (int d = 0; d < D; d++) q = 2 * q + (b[q].thr < x[b[q].key]);
        acc[r] += leaves[t * (NI + 1) + q - NI - 1];
    }
}

/* R rows x W trees a call; `pass` trees a pass over every row (W or a multiple of it) */
static double run(void *f, int wide, int R, int W, int pass, double *sum) {
    float acc[NR] = {0};
    double t0 = now();
    int64_t t = 0;
    for (; t + pass <= T; t += pass)
        for (int r = 0; r + R <= NR; r += R)
            for (int h = 0; h < pass; h += W) {
                if (wide) {
                    const uint64_t *xs[2] = {xx64 + r * 2 * NF, xx64 + (r + 1) * 2 * NF};
                    ((fn64)f)(nodes + (t + h) * NI, xs, leaves + (t + h) * (NI + 1), acc + r);
                } else {
                    const uint32_t *xs[2] = {xx + r * 2 * NF, xx + (r + 1) * 2 * NF};
                    ((fn32)f)(nodes + (t + h) * NI, xs, leaves + (t + h) * (NI + 1), acc + r);
                }
            }
    rest(t, acc);
    double dt = now() - t0, s = 0;
    for (int r = 0; r < NR; r++) s += acc[r];
    *sum = s;
    return dt / NR;
}

static double run_slots(double *sum) {  /* the product's one-row walk, slots then the adds */
    float acc[NR] = {0};
    int64_t slot[16];
    double t0 = now();
    int64_t t = 0;
    sw_walk_fn w = sw_walk_fn_for(D, 1, SW_RULE_SPLIT);
    for (; t + 12 <= T; t += 12) for (int r = 0; r < NR; r++) {
        w(nodes + t * NI, (const float *)(xx + r * 2 * NF), slot);
        float a = acc[r];
        for (int j = 0; j < 12; j++) a += leaves[t * (NI + 1) + slot[j]];
        acc[r] = a;
    }
    rest(t, acc);
    double dt = now() - t0, s = 0;
    for (int r = 0; r < NR; r++) s += acc[r];
    *sum = s;
    return dt / NR;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: walk_variants NODES XX\n"); return 2; }
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    fseek(f, 0, SEEK_END); T = ftell(f) / (8 * NI); rewind(f);
    nodes = malloc(T * NI * 8);
    if (fread(nodes, 8, T * NI, f) != (size_t)(T * NI)) return 2;
    fclose(f);
    f = fopen(argv[2], "rb");
    if (!f) return 2;
    fseek(f, 0, SEEK_END); NF = ftell(f) / (4 * 2 * NR); rewind(f);
    xx = malloc(NR * 2 * NF * 4);
    if (fread(xx, 4, NR * 2 * NF, f) != (size_t)(NR * 2 * NF)) return 2;
    fclose(f);
    xx64 = mmap(0, NR * 2 * NF * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT,
                -1, 0);
    if (xx64 == MAP_FAILED) return 2;
    for (int64_t i = 0; i < NR * 2 * NF; i++) xx64[i] = (uint64_t)xx[i] << 32;
    leaves = malloc(T * (NI + 1) * sizeof(float));
    for (int64_t i = 0; i < T * (NI + 1); i++) leaves[i] = (float)(i % 977) * 1e-3f;
    struct { const char *name; void *f; int wide, R, W, pass; } v[] = {
        {"one-row 12, slots (sw_walk12s)", 0, 0, 1, 12, 12},
        {"one-row 12, summed", (void *)one12s, 0, 1, 12, 12},
        {"one-row 11, summed", (void *)one11s, 0, 1, 11, 11},
        {"one-row 10, summed", (void *)one10s, 0, 1, 10, 10},
        {"pairs 2 x 6, 6-tree passes", (void *)pair6, 0, 2, 6, 6},
        {"pairs 2 x 6, 12-tree passes", (void *)pair6, 0, 2, 6, 12},
        {"pairs 2 x 5, 5-tree passes", (void *)pair5, 0, 2, 5, 5},
        {"pairs 2 x 8, 8-tree passes", (void *)pair8, 0, 2, 8, 8},
        {"3-load step, one-row 12", (void *)one12_3load, 0, 1, 12, 12},
        {"3-load step, one-row 13", (void *)one13_3load, 0, 1, 13, 13},
        {"rorx step, pairs 2 x 6", (void *)pair6_rorx, 0, 2, 6, 6},
        {"32-bit address, one-row 12", (void *)one12_a32, 1, 1, 12, 12},
        {"32-bit address, pairs 2 x 6", (void *)pair6_a32, 1, 2, 6, 6}};
    const int nv = sizeof v / sizeof v[0];
    double best[32], sum0 = 0;
    for (int i = 0; i < nv; i++) best[i] = 1e99;
    for (int rep = 0; rep < 15; rep++)
        for (int i = 0; i < nv; i++) {
            double s, ns = v[i].f ? run(v[i].f, v[i].wide, v[i].R, v[i].W, v[i].pass, &s)
                                  : run_slots(&s);
            if (ns < best[i]) best[i] = ns;
            if (rep == 0 && i == 0) sum0 = s;
            if (s != sum0) { printf("%s: sum %.9g, not %.9g\n", v[i].name, s, sum0); return 1; }
        }
    printf("model: %lld trees x depth %d, %lld features, %d rows; every sum %.9g\n",
           (long long)T, D, (long long)NF, NR, sum0);
    for (int i = 0; i < nv; i++)
        printf("%-34s %6.0f ns a row  %.3fx\n", v[i].name, best[i], best[0] / best[i]);
    return 0;
}
