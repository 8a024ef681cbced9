/* Staging a block for the oblivious kernel (cyext/oblivious.h, included from cyext/): 64 rows
   of 30 float32 features as doubled order-key columns, a value at a time (sw_obl_cols_row,
   the portable form) against 16 x 16 tiles transposed in registers (sw_obl_cols512); ns a
   row, four rounds, the rows cycling over four blocks. Both outputs are checked equal first.
   Built and run by bench/oblivious_micro.py (gcc -O3 -Icyext), or by hand:

       gcc -O3 -Icyext bench/oblivious_cols.c -o oblivious_cols && ./oblivious_cols */
#include "oblivious.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    if (!__builtin_cpu_supports("avx512f")) {
        printf("no AVX-512 on this CPU\n");
        return 0;
    }
    const int nf = 30, n = 64, blocks = 4, reps = 200000;
    float *X = malloc(sizeof(float) * nf * n * blocks);
    srand(1);
    for (int i = 0; i < nf * n * blocks; i++)
        X[i] = i % 13 == 0 ? NAN : i % 17 == 0 ? -0.0f : (float)rand() / RAND_MAX - 0.5f;
    sw_obl o = {0};
    o.n_features = nf;
    uint32_t *a = aligned_alloc(64, sizeof(uint32_t) * 2 * nf * 64);
    uint32_t *b = aligned_alloc(64, sizeof(uint32_t) * 2 * nf * 64);
    sw_obl_cols_row(&o, X, nf, n, a);
    sw_obl_cols512(&o, X, nf, n, b);
    if (memcmp(a, b, sizeof(uint32_t) * 2 * nf * 64)) {
        printf("the two stagings differ\n");
        return 1;
    }
    for (int round = 0; round < 4; round++) {
        double t0 = now();
        for (int i = 0; i < reps; i++) sw_obl_cols_row(&o, X + (size_t)(i % blocks) * nf * n, nf, n, a);
        const double d1 = now() - t0;
        t0 = now();
        for (int i = 0; i < reps; i++) sw_obl_cols512(&o, X + (size_t)(i % blocks) * nf * n, nf, n, b);
        const double d2 = now() - t0;
        printf("round %d  a value at a time %.2f ns a row  tiles %.2f ns a row\n", round,
               d1 / reps / n * 1e9, d2 / reps / n * 1e9);
    }
    return 0;
}
