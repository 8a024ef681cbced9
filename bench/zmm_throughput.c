/* Throughput of the AVX-512 instructions the oblivious kernel (cyext/oblivious.h) is made of, on
   this CPU: 8 independent instructions a loop iteration (each of the first eight registers its
   own chain where the instruction reads its destination), 10^8 iterations, in cycles at the
   clock measured first by a loop of dependent adds (one a cycle). bench/NOTES.md ("The
   oblivious kernel's bound") reads it.

       gcc -O2 -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512vbmi \
           bench/zmm_throughput.c -o zmm_throughput && taskset -c 0 ./zmm_throughput */
#include <stdio.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
                          return t.tv_sec + t.tv_nsec * 1e-9; }
static double ghz;
#define N 100000000L
#define BENCH(name, body) { double t0 = now();                                                \
    for (long i = 0; i < N; i++)                                                            \
        __asm__ volatile(body ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6",    \
                         "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "k1", "k2", "k3", "k4", "k5", "k6", "k7");  \
    double c = (now() - t0) * ghz * 1e9 / N;                                                 \
    printf("%-28s %5.2f cycles for 8  %.2f a cycle\n", name, c, 8 / c); }
/* (for the mixes: cycles a loop of 8 of each) */
#define R8(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7)
#define CMPY(i) "vpcmpgtd %%ymm8, %%ymm9, %%ymm" #i "\n"
#define CMPZK(i) "vpcmpgtd %%zmm8, %%zmm9, %%k1\n"
#define TLZ(i) "vpternlogd $0xF8, %%zmm8, %%zmm9, %%zmm" #i "\n"
#define TLY(i) "vpternlogd $0xF8, %%ymm8, %%ymm9, %%ymm" #i "\n"
#define INS(i) "vinserti64x4 $1, %%ymm8, %%zmm9, %%zmm" #i "\n"
#define CMPUY(i) "vpcmpud $6, %%ymm8, %%ymm9, %%k" "1" "\n"
#define ANDZ(i) "vpandd %%zmm8, %%zmm9, %%zmm" #i "\n"
#define ORY(i) "vpor %%ymm8, %%ymm9, %%ymm" #i "\n"
#define MOVM(i) "vpmovd2m %%zmm" #i ", %%k1\n"
#define PERM(i) "vpermt2d %%zmm8, %%zmm9, %%zmm" #i "\n"
#define ADDPD(i) "vaddpd %%zmm8, %%zmm1" #i ", %%zmm1" #i "\n"
#define CMPK(i) "vpcmpud $6, %%zmm8, %%zmm9, %%k" #i "\n"
#define CMPK8 CMPK(1) CMPK(2) CMPK(3) CMPK(4) CMPK(5) CMPK(6) CMPK(7) CMPK(1)
#define BLND(i) "vpblendmd %%zmm8, %%zmm9, %%zmm2" #i "%{%%k1%}\n"
#define UNPK(i) "vpunpckldq %%zmm8, %%zmm9, %%zmm1" #i "\n"
#define ADD8 ADDPD(0) ADDPD(1) ADDPD(2) ADDPD(3) ADDPD(4) ADDPD(5) ADDPD(6) ADDPD(7)

int main(void) {
    unsigned long x = 0;
    double t0 = now();
    for (long i = 0; i < 2 * N; i++)
        __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    ghz = 8.0 * N / (now() - t0) / 1e9;
    printf("clock %.2f GHz (dependent adds)\n", ghz);
 BENCH("vpcmpud zmm->k", "vpcmpud $6, %%zmm8, %%zmm0, %%k1\n vpcmpud $6, %%zmm8, %%zmm1, %%k2\n vpcmpud $6, %%zmm8, %%zmm2, %%k3\n vpcmpud $6, %%zmm8, %%zmm3, %%k4\n vpcmpud $6, %%zmm9, %%zmm0, %%k5\n vpcmpud $6, %%zmm9, %%zmm1, %%k6\n vpcmpud $6, %%zmm9, %%zmm2, %%k7\n vpcmpud $6, %%zmm9, %%zmm3, %%k1")
 BENCH("vpcmpub zmm->k", "vpcmpub $6, %%zmm8, %%zmm0, %%k1\n vpcmpub $6, %%zmm8, %%zmm1, %%k2\n vpcmpub $6, %%zmm8, %%zmm2, %%k3\n vpcmpub $6, %%zmm8, %%zmm3, %%k4\n vpcmpub $6, %%zmm9, %%zmm0, %%k5\n vpcmpub $6, %%zmm9, %%zmm1, %%k6\n vpcmpub $6, %%zmm9, %%zmm2, %%k7\n vpcmpub $6, %%zmm9, %%zmm3, %%k1")
 BENCH("vpermt2d zmm", "vpermt2d %%zmm8, %%zmm9, %%zmm0\n vpermt2d %%zmm8, %%zmm9, %%zmm1\n vpermt2d %%zmm8, %%zmm9, %%zmm2\n vpermt2d %%zmm8, %%zmm9, %%zmm3\n vpermt2d %%zmm8, %%zmm9, %%zmm4\n vpermt2d %%zmm8, %%zmm9, %%zmm5\n vpermt2d %%zmm8, %%zmm9, %%zmm6\n vpermt2d %%zmm8, %%zmm9, %%zmm7")
 BENCH("vpermd zmm", "vpermd %%zmm8, %%zmm9, %%zmm0\n vpermd %%zmm8, %%zmm9, %%zmm1\n vpermd %%zmm8, %%zmm9, %%zmm2\n vpermd %%zmm8, %%zmm9, %%zmm3\n vpermd %%zmm8, %%zmm9, %%zmm4\n vpermd %%zmm8, %%zmm9, %%zmm5\n vpermd %%zmm8, %%zmm9, %%zmm6\n vpermd %%zmm8, %%zmm9, %%zmm7")
 BENCH("vpermb zmm", "vpermb %%zmm8, %%zmm9, %%zmm0\n vpermb %%zmm8, %%zmm9, %%zmm1\n vpermb %%zmm8, %%zmm9, %%zmm2\n vpermb %%zmm8, %%zmm9, %%zmm3\n vpermb %%zmm8, %%zmm9, %%zmm4\n vpermb %%zmm8, %%zmm9, %%zmm5\n vpermb %%zmm8, %%zmm9, %%zmm6\n vpermb %%zmm8, %%zmm9, %%zmm7")
 BENCH("vpermt2b zmm", "vpermt2b %%zmm8, %%zmm9, %%zmm0\n vpermt2b %%zmm8, %%zmm9, %%zmm1\n vpermt2b %%zmm8, %%zmm9, %%zmm2\n vpermt2b %%zmm8, %%zmm9, %%zmm3\n vpermt2b %%zmm8, %%zmm9, %%zmm4\n vpermt2b %%zmm8, %%zmm9, %%zmm5\n vpermt2b %%zmm8, %%zmm9, %%zmm6\n vpermt2b %%zmm8, %%zmm9, %%zmm7")
 BENCH("vpermt2w zmm", "vpermt2w %%zmm8, %%zmm9, %%zmm0\n vpermt2w %%zmm8, %%zmm9, %%zmm1\n vpermt2w %%zmm8, %%zmm9, %%zmm2\n vpermt2w %%zmm8, %%zmm9, %%zmm3\n vpermt2w %%zmm8, %%zmm9, %%zmm4\n vpermt2w %%zmm8, %%zmm9, %%zmm5\n vpermt2w %%zmm8, %%zmm9, %%zmm6\n vpermt2w %%zmm8, %%zmm9, %%zmm7")
 BENCH("vpermt2pd zmm", "vpermt2pd %%zmm8, %%zmm9, %%zmm0\n vpermt2pd %%zmm8, %%zmm9, %%zmm1\n vpermt2pd %%zmm8, %%zmm9, %%zmm2\n vpermt2pd %%zmm8, %%zmm9, %%zmm3\n vpermt2pd %%zmm8, %%zmm9, %%zmm4\n vpermt2pd %%zmm8, %%zmm9, %%zmm5\n vpermt2pd %%zmm8, %%zmm9, %%zmm6\n vpermt2pd %%zmm8, %%zmm9, %%zmm7")
 BENCH("vpord{k} zmm", "vpord %%zmm8, %%zmm0, %%zmm0%{%%k1%}\n vpord %%zmm8, %%zmm1, %%zmm1%{%%k1%}\n vpord %%zmm8, %%zmm2, %%zmm2%{%%k1%}\n vpord %%zmm8, %%zmm3, %%zmm3%{%%k1%}\n vpord %%zmm8, %%zmm4, %%zmm4%{%%k1%}\n vpord %%zmm8, %%zmm5, %%zmm5%{%%k1%}\n vpord %%zmm8, %%zmm6, %%zmm6%{%%k1%}\n vpord %%zmm8, %%zmm7, %%zmm7%{%%k1%}")
 BENCH("vpblendmd zmm", "vpblendmd %%zmm8, %%zmm9, %%zmm0%{%%k1%}\n vpblendmd %%zmm8, %%zmm9, %%zmm1%{%%k1%}\n vpblendmd %%zmm8, %%zmm9, %%zmm2%{%%k1%}\n vpblendmd %%zmm8, %%zmm9, %%zmm3%{%%k1%}\n vpblendmd %%zmm8, %%zmm9, %%zmm4%{%%k1%}\n vpblendmd %%zmm8, %%zmm9, %%zmm5%{%%k1%}\n vpblendmd %%zmm8, %%zmm9, %%zmm6%{%%k1%}\n vpblendmd %%zmm8, %%zmm9, %%zmm7%{%%k1%}")
 BENCH("vpunpckldq zmm", "vpunpckldq %%zmm8, %%zmm9, %%zmm0\n vpunpckldq %%zmm8, %%zmm9, %%zmm1\n vpunpckldq %%zmm8, %%zmm9, %%zmm2\n vpunpckldq %%zmm8, %%zmm9, %%zmm3\n vpunpckldq %%zmm8, %%zmm9, %%zmm4\n vpunpckldq %%zmm8, %%zmm9, %%zmm5\n vpunpckldq %%zmm8, %%zmm9, %%zmm6\n vpunpckldq %%zmm8, %%zmm9, %%zmm7")
 BENCH("vaddpd zmm (indep)", "vaddpd %%zmm8, %%zmm0, %%zmm0\n vaddpd %%zmm8, %%zmm1, %%zmm1\n vaddpd %%zmm8, %%zmm2, %%zmm2\n vaddpd %%zmm8, %%zmm3, %%zmm3\n vaddpd %%zmm8, %%zmm4, %%zmm4\n vaddpd %%zmm8, %%zmm5, %%zmm5\n vaddpd %%zmm8, %%zmm6, %%zmm6\n vaddpd %%zmm8, %%zmm7, %%zmm7")
 BENCH("vpaddb{k} zmm", "vpaddb %%zmm8, %%zmm0, %%zmm0%{%%k1%}\n vpaddb %%zmm8, %%zmm1, %%zmm1%{%%k1%}\n vpaddb %%zmm8, %%zmm2, %%zmm2%{%%k1%}\n vpaddb %%zmm8, %%zmm3, %%zmm3%{%%k1%}\n vpaddb %%zmm8, %%zmm4, %%zmm4%{%%k1%}\n vpaddb %%zmm8, %%zmm5, %%zmm5%{%%k1%}\n vpaddb %%zmm8, %%zmm6, %%zmm6%{%%k1%}\n vpaddb %%zmm8, %%zmm7, %%zmm7%{%%k1%}")
 BENCH("kmovw k<-m16", "kmovw (%%rsp), %%k1\n kmovw 2(%%rsp), %%k2\n kmovw 4(%%rsp), %%k3\n kmovw 6(%%rsp), %%k4\n kmovw 8(%%rsp), %%k5\n kmovw 10(%%rsp), %%k6\n kmovw 12(%%rsp), %%k7\n kmovw 14(%%rsp), %%k1")
 BENCH("vpmovzxbd zmm", "vpmovzxbd %%xmm8, %%zmm0\n vpmovzxbd %%xmm8, %%zmm1\n vpmovzxbd %%xmm8, %%zmm2\n vpmovzxbd %%xmm8, %%zmm3\n vpmovzxbd %%xmm8, %%zmm4\n vpmovzxbd %%xmm8, %%zmm5\n vpmovzxbd %%xmm8, %%zmm6\n vpmovzxbd %%xmm8, %%zmm7")
 BENCH("vpunpcklbw zmm", "vpunpcklbw %%zmm8, %%zmm9, %%zmm0\n vpunpcklbw %%zmm8, %%zmm9, %%zmm1\n vpunpcklbw %%zmm8, %%zmm9, %%zmm2\n vpunpcklbw %%zmm8, %%zmm9, %%zmm3\n vpunpcklbw %%zmm8, %%zmm9, %%zmm4\n vpunpcklbw %%zmm8, %%zmm9, %%zmm5\n vpunpcklbw %%zmm8, %%zmm9, %%zmm6\n vpunpcklbw %%zmm8, %%zmm9, %%zmm7")
 BENCH("vpcmpgtd ymm->ymm", R8(CMPY))
 BENCH("vpcmpgtd zmm->k", R8(CMPZK))
 BENCH("vpcmpud ymm->k", R8(CMPUY))
 BENCH("vpternlogd zmm (dep)", R8(TLZ))
 BENCH("vpternlogd ymm (dep)", R8(TLY))
 BENCH("vpandd zmm", R8(ANDZ))
 BENCH("vpor ymm", R8(ORY))
 BENCH("vinserti64x4 zmm", R8(INS))
 BENCH("vpmovd2m", R8(MOVM))
    /* the kernel's three one-a-cycle kinds together: 8 of each, 24 cycles if they share the
       same pipes, 8 if each has its own */
    BENCH("8 cmp + 8 permute + 8 addpd", CMPK8 R8(PERM) ADD8)
    BENCH("8 cmp + 8 permute", CMPK8 R8(PERM))
    BENCH("8 permute + 8 addpd", R8(PERM) ADD8)
    BENCH("8 cmp + 8 addpd", CMPK8 ADD8)
    /* and every kind the kernel runs: is the whole machine two 512-bit instructions a cycle? */
    BENCH("8 each of 5 kinds (no OR)", CMPK8 R8(PERM) ADD8 R8(BLND) R8(UNPK))
    BENCH("8 blend + 8 unpack", R8(BLND) R8(UNPK))
    return 0;
}
