/* The bins (issue 56, item 3, kept: cyext/oblivious.h sw_obl_bins512 and sw_obl_sum512_w)
   against the halves kernel (sw_obl_sum512_h4) and the forms tried on the way, on one 64-row
   block of 30 features (27 of 55 thresholds and 3 of 130, each level on a feature's NaN-low
   column as CatBoost's default asks), ns a tree and row, one thread. Built and run by hand:

       gcc -O3 -Icyext bench/oblivious_words.c -o oblivious_words && \
           taskset -c 0 ./oblivious_words 500

   halves       the kernel the bins replace for blocks of more than 16 rows: 24 32-bit
                compares, 20 masked ORs, 16 permutes, 8 blends, 8 unpacks, 8 adds a tree
   index only   its first half: the compares and ORs (no leaves picked)
   pick only    its second half, in the bins' form: 8 word permutes, 16 unpacks, 8 adds (an
                index from the tree number, no compares)
   bins         sw_obl_bins512 (each column binned once a block) + sw_obl_sum512_w (6 byte
                compares, 6 masked byte adds, a shift, then the pick); the two counted apart
                and together, their tables built as Forest._obl_bins builds them
   words        the 32-bit compares kept, the two 16-row masks of 32 rows joined (kunpckwd)
                and the word permutes after them
   split masks  each distinct (column, threshold) of the model compared once a block into a
                64-bit mask, the trees reading their levels' masks from memory
   Every form's sums are checked equal to the kernel's, bit for bit, before timing. Argument:
   trees (500; 100-300 find the bins' break-even, OBL_BINS_TREES in cyext/kernels.pyx). */
#include "oblivious.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define NF 30
#define R 64
#define D 6
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static int cmpu(const void*a,const void*b){uint32_t x=*(const uint32_t*)a,y=*(const uint32_t*)b;return x<y?-1:x>y;}
static int cmp64(const void*a,const void*b){uint64_t x=*(const uint64_t*)a,y=*(const uint64_t*)b;return x<y?-1:x>y;}
static uint32_t border[NF][256]; static int nbord[NF];

#define PICK(pe)                                                                            \
    const uint16_t *q = quarters + t * 256;                                                 \
    const __m512i Q0 = _mm512_loadu_si512(q), Q1 = _mm512_loadu_si512(q + 32);              \
    const __m512i Q2 = _mm512_loadu_si512(q + 64), Q3 = _mm512_loadu_si512(q + 96);         \
    const __m512i Q4 = _mm512_loadu_si512(q + 128), Q5 = _mm512_loadu_si512(q + 160);       \
    const __m512i Q6 = _mm512_loadu_si512(q + 192), Q7 = _mm512_loadu_si512(q + 224);       \
    for (int h = 0; h < 2; h++) {                                                           \
        const __m512i P0 = _mm512_permutex2var_epi16(Q0, pe[h], Q1);                        \
        const __m512i P1 = _mm512_permutex2var_epi16(Q2, pe[h], Q3);                        \
        const __m512i P2 = _mm512_permutex2var_epi16(Q4, pe[h], Q5);                        \
        const __m512i P3 = _mm512_permutex2var_epi16(Q6, pe[h], Q7);                        \
        const __m512i dl = _mm512_unpacklo_epi16(P0, P1), dh = _mm512_unpackhi_epi16(P0, P1);\
        const __m512i el = _mm512_unpacklo_epi16(P2, P3), eh = _mm512_unpackhi_epi16(P2, P3);\
        a[4*h] = _mm512_add_pd(a[4*h], _mm512_castsi512_pd(_mm512_unpacklo_epi32(dl, el))); \
        a[4*h+1] = _mm512_add_pd(a[4*h+1], _mm512_castsi512_pd(_mm512_unpackhi_epi32(dl, el)));\
        a[4*h+2] = _mm512_add_pd(a[4*h+2], _mm512_castsi512_pd(_mm512_unpacklo_epi32(dh, eh)));\
        a[4*h+3] = _mm512_add_pd(a[4*h+3], _mm512_castsi512_pd(_mm512_unpackhi_epi32(dh, eh)));\
    }
/* rows 32h + word lane i: a[4h + j] lane L qword k is word lane 8L + 2j + k */
#define LOAD_ACC for(int h=0;h<2;h++) for(int j=0;j<4;j++){ double tmp[8]; for(int L=0;L<4;L++) for(int k=0;k<2;k++) tmp[2*L+k]=acc[32*h+8*L+2*j+k]; a[4*h+j]=_mm512_loadu_pd(tmp);}
#define STORE_ACC for(int h=0;h<2;h++) for(int j=0;j<4;j++){ double tmp[8]; _mm512_storeu_pd(tmp,a[4*h+j]); for(int L=0;L<4;L++) for(int k=0;k<2;k++) acc[32*h+8*L+2*j+k]=tmp[2*L+k];}

__attribute__((target("avx512f,avx512bw")))
static void words(const sw_obl *o, const uint32_t *cols, const uint16_t *quarters, double *acc){
    __m512d a[8]; LOAD_ACC
    for (int64_t t = 0; t < o->n_trees; t++) {
        const uint32_t *key = o->key + t * D, *thr = o->thr + t * D;
        __m512i p[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        for (int32_t l = 0; l < D; l++) {
            const uint32_t *c = cols + (int64_t)key[l] * R;
            const __m512i th = _mm512_set1_epi32((int)thr[l]);
            const __m512i bit = _mm512_set1_epi16((short)(1 << (D - 1 - l)));
            for (int h = 0; h < 2; h++) {
                const __mmask16 m0 = _mm512_cmpgt_epu32_mask(_mm512_loadu_si512(c + 32 * h), th);
                const __mmask16 m1 = _mm512_cmpgt_epu32_mask(_mm512_loadu_si512(c + 32 * h + 16), th);
                p[h] = _mm512_mask_add_epi16(p[h], _mm512_kunpackw(m1, m0), p[h], bit);
            }
        }
        PICK(p)
    }
    STORE_ACC
}
__attribute__((target("avx512f,avx512bw")))
static void split_masks(const uint32_t *cols, const uint32_t *scol, const uint32_t *sthr, int64_t S, uint64_t *mk){
    for (int64_t s = 0; s < S; s++) {
        const uint32_t *c = cols + (int64_t)scol[s] * R;
        const __m512i th = _mm512_set1_epi32((int)sthr[s]);
        uint64_t m = 0;
        for (int v = 0; v < 4; v++) m |= (uint64_t)_mm512_cmpgt_epu32_mask(_mm512_loadu_si512(c + 16 * v), th) << (16 * v);
        mk[s] = m;
    }
}
__attribute__((target("avx512f,avx512bw")))
static void split_trees(int64_t T, const uint32_t *lvl, const uint64_t *mk, const uint16_t *quarters, double *acc){
    __m512d a[8]; LOAD_ACC
    for (int64_t t = 0; t < T; t++) {
        const uint32_t *lv = lvl + t * D;
        __m512i p[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        for (int32_t l = 0; l < D; l++) {
            const uint32_t *mm = (const uint32_t *)(mk + lv[l]);
            const __m512i bit = _mm512_set1_epi16((short)(1 << (D - 1 - l)));
            for (int h = 0; h < 2; h++)
                p[h] = _mm512_mask_add_epi16(p[h], _load_mask32((__mmask32 *)(mm + h)), p[h], bit);
        }
        PICK(p)
    }
    STORE_ACC
}
__attribute__((target("avx512f,avx512bw")))
static void pick_only(int64_t T, const uint32_t *lvl, const uint16_t *quarters, double *acc){
    __m512d a[8]; LOAD_ACC
    for (int64_t t = 0; t < T; t++) {
        __m512i p[2] = {_mm512_set1_epi16((short)(lvl[t*D]&63)), _mm512_set1_epi16((short)(lvl[t*D+1]&63))};
        PICK(p)
    }
    STORE_ACC
}
__attribute__((target("avx512f,avx512bw")))
static void index_only(const sw_obl *o, const uint32_t *cols, double *acc){
    __m512i s[4]; for(int v=0;v<4;v++) s[v]=_mm512_setzero_si512();
    for (int64_t t = 0; t < o->n_trees; t++) {
        const uint32_t *key = o->key + t * D, *thr = o->thr + t * D;
        __mmask16 m0[4]; __m512i p[4];
        { const uint32_t *c = cols + (int64_t)key[0] * R; const __m512i th = _mm512_set1_epi32((int)thr[0]);
          for (int v = 0; v < 4; v++) { m0[v] = _mm512_cmpgt_epu32_mask(_mm512_loadu_si512(c + 16 * v), th); p[v]=_mm512_setzero_si512(); } }
        for (int32_t l = 1; l < D; l++) {
            const uint32_t *c = cols + (int64_t)key[l] * R;
            const __m512i th = _mm512_set1_epi32((int)thr[l]);
            const __m512i bit = _mm512_set1_epi32(1 << (D - 1 - l));
            for (int v = 0; v < 4; v++) p[v] = _mm512_mask_or_epi32(p[v], _mm512_cmpgt_epu32_mask(_mm512_loadu_si512(c + 16 * v), th), p[v], bit);
        }
        for (int v = 0; v < 4; v++) s[v] = _mm512_mask_xor_epi32(s[v], m0[v], s[v], p[v]);
    }
    for(int v=0;v<4;v++) { int64_t x[8]; _mm512_storeu_si512(x, s[v]); acc[v] += (double)(x[0]^x[3]); }
}
int main(int argc,char**argv){
    const int T=argc>1?atoi(argv[1]):500; srand(1);
    if (T < 50) { printf("at least 50 trees\n"); return 2; }
    __builtin_cpu_init();
    if (!sw_obl_bw()) { printf("no AVX-512 BW on this CPU: nothing to compare\n"); return 0; }
    for(int f=0;f<NF;f++){int n=f<3?130:55; nbord[f]=n;
        for(int i=0;i<n;i++) border[f][i]=(uint32_t)rand()*2u+1;
        qsort(border[f],n,4,cmpu);}
    uint32_t *key=malloc((size_t)T*D*4),*thr=malloc((size_t)T*D*4),*halves=aligned_alloc(64,(size_t)T*128*4),*cols=aligned_alloc(64,2*NF*R*4);
    for(int i=0;i<T*D;i++){int f=rand()%NF; key[i]=2*f; thr[i]=border[f][rand()%nbord[f]];}
    for(int i=0;i<T*128;i++) halves[i]=rand();
    for(int i=0;i<2*NF*R;i++){ int f=(i/R)/2; cols[i]=(uint32_t)rand()*2u; if(i%5==0) cols[i]=border[f][rand()%nbord[f]]; if(i%7==0) cols[i]=0xFFFFFFFFu; if(i%11==0) cols[i]=0;}
    sw_obl o={0}; o.key=key;o.thr=thr;o.n_trees=T;o.depth=D;o.n_features=NF;o.halves=halves;o.simd=SW_OBL_AVX512;
    uint16_t *qu=aligned_alloc(64,(size_t)T*512);
    for(int t=0;t<T;t++) for(int i=0;i<64;i++){ uint64_t v=(uint64_t)halves[t*128+i] | (uint64_t)halves[t*128+64+i]<<32; for(int q=0;q<4;q++) qu[(size_t)t*256+64*q+i]=(uint16_t)(v>>(16*q)); }
    /* the bins' tables, as Forest._obl_bins builds them: the used columns, their distinct
       thresholds (the borders), each level's index among them */
    uint32_t used[2*NF], nb[2*NF], *btab=malloc(2*NF*SW_OBL_BTAB*4); uint8_t *jb=malloc((size_t)T*D); int nu=0;
    for(int c=0;c<2*NF;c++){
        uint32_t b[256]; int k=0;
        for(int i=0;i<T*D;i++) if(key[i]==(uint32_t)c){ int seen=0; for(int j=0;j<k;j++) seen|=b[j]==thr[i]; if(!seen) b[k++]=thr[i]; }
        if(!k) continue;
        qsort(b,k,4,cmpu);
        uint32_t pad[256]; for(int i=0;i<256;i++) pad[i]=i<k?b[i]:0xFFFFFFFFu;
        uint32_t *tab=btab+(size_t)nu*SW_OBL_BTAB;
        for(int g=0;g<32;g++) tab[g]=k<=31?pad[g]:pad[8*g+7];
        for(int j=0;j<8;j++) for(int g=0;g<32;g++) tab[32+32*j+g]=pad[8*g+j];
        for(int i=0;i<T*D;i++) if(key[i]==(uint32_t)c) for(int j=0;j<k;j++) if(b[j]==thr[i]) jb[i]=(uint8_t)j;
        used[nu]=c; nb[nu]=k; nu++;
    }
    o.quarters=qu; o.jb=jb; o.n_used=nu; o.used=used; o.nb=nb; o.btab=btab;
    uint8_t *bins=aligned_alloc(64,2*NF*R);
    /* the distinct splits, for split masks */
    uint64_t *pk=malloc((size_t)T*D*8),*u=malloc((size_t)T*D*8); for(int i=0;i<T*D;i++) pk[i]=(uint64_t)key[i]<<32|thr[i];
    memcpy(u,pk,(size_t)T*D*8); qsort(u,(size_t)T*D,8,cmp64); int S=0; for(int i=0;i<T*D;i++) if(!S||u[S-1]!=u[i]) u[S++]=u[i];
    uint32_t *scol=malloc(S*4),*sthr=malloc(S*4),*lvl=malloc((size_t)T*D*4); uint64_t *mk=aligned_alloc(64,((size_t)S*8+63)/64*64);
    for(int s=0;s<S;s++){scol[s]=u[s]>>32;sthr[s]=(uint32_t)u[s];}
    for(int i=0;i<T*D;i++){int lo=0,hi=S-1; while(lo<hi){int m=(lo+hi)/2; if(u[m]<pk[i]) lo=m+1; else hi=m;} lvl[i]=lo;}
    uint32_t lo=255,hi=0; for(int i=0;i<nu;i++){ lo=nb[i]<lo?nb[i]:lo; hi=nb[i]>hi?nb[i]:hi; }
    printf("%d trees, %d columns binned (%u-%u thresholds), %d distinct splits of %d levels\n",T,nu,lo,hi,S,T*D);
    double a[64]={0},b[64]={0},c[64]={0},d[64]={0},z[64]={0};
    sw_obl_sum512_h4(&o,cols,halves,a);
    sw_obl_bins512(&o,cols,bins); sw_obl_sum512_w(&o,bins,qu,b);
    words(&o,cols,qu,c); split_masks(cols,scol,sthr,S,mk); split_trees(T,lvl,mk,qu,d);
    if (memcmp(a,b,sizeof a) || memcmp(a,c,sizeof a) || memcmp(a,d,sizeof a)) { printf("a form's sums differ from the kernel's\n"); return 1; }
    printf("every form's sums equal the kernel's, bit for bit\n");
    const int reps=40000/(T/50);
    for(int round=0;round<5;round++){
        double t0=now(); for(int r=0;r<reps;r++) sw_obl_sum512_h4(&o,cols,halves,a); const double h=now()-t0;
        t0=now(); for(int r=0;r<reps;r++) index_only(&o,cols,z); const double io=now()-t0;
        t0=now(); for(int r=0;r<reps;r++) pick_only(T,lvl,qu,z); const double po=now()-t0;
        t0=now(); for(int r=0;r<reps;r++) sw_obl_bins512(&o,cols,bins); const double bb=now()-t0;
        t0=now(); for(int r=0;r<reps;r++) sw_obl_sum512_w(&o,bins,qu,b); const double bt=now()-t0;
        t0=now(); for(int r=0;r<reps;r++) words(&o,cols,qu,c); const double w=now()-t0;
        t0=now(); for(int r=0;r<reps;r++) split_masks(cols,scol,sthr,S,mk); const double sm=now()-t0;
        t0=now(); for(int r=0;r<reps;r++) split_trees(T,lvl,mk,qu,d); const double st=now()-t0;
        const double s=1e9/(reps*64.0*T);
        printf("halves %.3f (index only %.3f, pick only %.3f)  bins %.3f + %.3f = %.3f: %.2fx  "
               "words %.3f: %.2fx  split masks %.3f + %.3f = %.3f: %.2fx\n",
               h*s, io*s, po*s, bb*s, bt*s, (bb+bt)*s, h/(bb+bt), w*s, h/w, sm*s, st*s, (sm+st)*s, h/(sm+st));
    }
    return 0;
}
