/* Binning the features once a block (issue 56, item 3: CatBoost's own way), against the
   oblivious kernel as it is (cyext/oblivious.h sw_obl_sum512_h4, included from cyext/), on
   one 64-row block of 30 features, ns a tree and row. Built and run by
   bench/oblivious_micro.py (gcc -O3 -Icyext), or by hand:

       gcc -O3 -Icyext bench/oblivious_bins.c -o oblivious_bins && ./oblivious_bins 500

   binarize     each feature's value replaced by its bin among the model's sorted borders of
                that feature (the count of borders below it, so `x > border j` is `bin > j`):
                an in-register binary search, 16 rows at a time: the first 5 steps among every
                8th border (one permute of 32 entries a step), the last 3 among the 8 borders
                of the value's group (the groups' j-th borders as 8 tables of 32); features of
                at most 32 borders take 5 steps. 27 features of 55 borders and 3 of 130, as
                bench/catboost_speed.py's numeric model has (45-66 and 125-138).
   bins-trees   the trees on the bins: a level is one byte compare of the block's 64 rows
                (not 4 of 16), the index built in byte lanes and widened for the permutes;
                the leaves picked as the kernel picks them (32-bit halves).
   bytes-trees  the same trees on the bins, the leaves kept as 8 byte planes a tree (byte q
                of each of its 64 leaves in one register): one byte permute (VBMI vpermb) a
                plane picks the 64 rows' bytes, and three rounds of unpacks (bytes, words,
                dwords) put each row's 8 bytes back together as its float64 leaf.
   ymm-compares the kernel with levels 1-5 asked by 256-bit vector compares (signed, on keys
                with the top bit flipped: they write a vector, not a mask, and this CPU runs
                four a cycle against one 512-bit compare into a mask) and ternary-logic ORs,
                the two halves of 16 rows joined for the permutes.
   Every sum is checked equal to the kernel's, bit for bit, before timing. */
#include "oblivious.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define NF 30
#define R 64
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static int cmpu(const void*a,const void*b){uint32_t x=*(const uint32_t*)a,y=*(const uint32_t*)b;return x<y?-1:x>y;}
static uint32_t border[2*NF][256]; static int nb[2*NF];
static uint32_t piv[2*NF][32], plane[2*NF][8][32];
/* bins[c*64 + r] = #{borders of c < x} */
__attribute__((target("avx512f,avx512bw")))
static void binarize(const uint32_t *cols, const int *used, int nused, uint8_t *bins){
    for(int u=0;u<nused;u++){ const int c=used[u];
        const __m512i P0=_mm512_loadu_si512(piv[c]),P1=_mm512_loadu_si512(piv[c]+16);
        if(nb[c] <= 32){
            for(int v=0;v<4;v++){
                const __m512i x=_mm512_loadu_si512(cols+c*R+16*v);
                __m512i pos=_mm512_setzero_si512();
                for(int s=16;s>=1;s>>=1){
                    const __m512i b=_mm512_permutex2var_epi32(P0,_mm512_add_epi32(pos,_mm512_set1_epi32(s-1)),P1);
                    pos=_mm512_mask_add_epi32(pos,_mm512_cmpgt_epu32_mask(x,b),pos,_mm512_set1_epi32(s));
                }
                _mm_storeu_si128((__m128i*)(bins+c*R+16*v),_mm512_cvtepi32_epi8(pos));
            }
            continue;
        }
        __m512i Q[8][2];
        for(int j=0;j<8;j++){Q[j][0]=_mm512_loadu_si512(plane[c][j]);Q[j][1]=_mm512_loadu_si512(plane[c][j]+16);}
        for(int v=0;v<4;v++){
            const __m512i x=_mm512_loadu_si512(cols+c*R+16*v);
            __m512i g=_mm512_setzero_si512();   /* group: pos/8 */
            for(int s=16;s>=1;s>>=1){
                const __m512i b=_mm512_permutex2var_epi32(P0,_mm512_add_epi32(g,_mm512_set1_epi32(s-1)),P1);
                g=_mm512_mask_add_epi32(g,_mm512_cmpgt_epu32_mask(x,b),g,_mm512_set1_epi32(s));
            }
            /* within the group: j in 0..7 */
            const __mmask16 k4=_mm512_cmpgt_epu32_mask(x,_mm512_permutex2var_epi32(Q[3][0],g,Q[3][1]));
            const __m512i b2=_mm512_mask_blend_epi32(k4,_mm512_permutex2var_epi32(Q[1][0],g,Q[1][1]),_mm512_permutex2var_epi32(Q[5][0],g,Q[5][1]));
            const __mmask16 k2=_mm512_cmpgt_epu32_mask(x,b2);
            const __m512i lo=_mm512_mask_blend_epi32(k2,_mm512_permutex2var_epi32(Q[0][0],g,Q[0][1]),_mm512_permutex2var_epi32(Q[2][0],g,Q[2][1]));
            const __m512i hi=_mm512_mask_blend_epi32(k2,_mm512_permutex2var_epi32(Q[4][0],g,Q[4][1]),_mm512_permutex2var_epi32(Q[6][0],g,Q[6][1]));
            const __mmask16 k1=_mm512_cmpgt_epu32_mask(x,_mm512_mask_blend_epi32(k4,lo,hi));
            __m512i pos=_mm512_slli_epi32(g,3);
            pos=_mm512_mask_add_epi32(pos,k4,pos,_mm512_set1_epi32(4));
            pos=_mm512_mask_add_epi32(pos,k2,pos,_mm512_set1_epi32(2));
            pos=_mm512_mask_add_epi32(pos,k1,pos,_mm512_set1_epi32(1));
            _mm_storeu_si128((__m128i*)(bins+c*R+16*v),_mm512_cvtepi32_epi8(pos));
        }
    }
}
/* trees on bins: key[t*6+l] column, jb[t*6+l] border index j: bin > j */
__attribute__((target("avx512f,avx512bw")))
static void hb(const uint32_t *key, const uint8_t *jb, int64_t T, const uint32_t *halves, const uint8_t *bins, double *acc){
    const __m512i g0 = _mm512_set_epi64(13, 12, 9, 8, 5, 4, 1, 0), g1 = _mm512_set_epi64(15, 14, 11, 10, 7, 6, 3, 2);
    __m512d a[8];
    for(int v=0;v<4;v++){const __m512d lo=_mm512_loadu_pd(acc+16*v),hi=_mm512_loadu_pd(acc+16*v+8);
        a[2*v]=_mm512_permutex2var_pd(lo,g0,hi);a[2*v+1]=_mm512_permutex2var_pd(lo,g1,hi);}
    for(int64_t t=0;t<T;t++){
        const uint32_t *k=key+t*6; const uint8_t *j=jb+t*6;
        const __mmask64 m0=_mm512_cmpgt_epu8_mask(_mm512_loadu_si512(bins+k[0]*R),_mm512_set1_epi8((char)j[0]));
        __m512i p=_mm512_setzero_si512();
        for(int l=1;l<6;l++){
            const __mmask64 m=_mm512_cmpgt_epu8_mask(_mm512_loadu_si512(bins+k[l]*R),_mm512_set1_epi8((char)j[l]));
            p=_mm512_mask_add_epi8(p,m,p,_mm512_set1_epi8((char)(1<<(5-l))));
        }
        const uint32_t *h=halves+t*128;
        const __m512i L0=_mm512_loadu_si512(h),L1=_mm512_loadu_si512(h+16),L2=_mm512_loadu_si512(h+32),L3=_mm512_loadu_si512(h+48);
        const __m512i H0=_mm512_loadu_si512(h+64),H1=_mm512_loadu_si512(h+80),H2=_mm512_loadu_si512(h+96),H3=_mm512_loadu_si512(h+112);
        for(int v=0;v<4;v++){
            const __m512i pv=_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(p,v));
            const __mmask16 mv=(__mmask16)(m0>>(16*v));
            const __m512i lo=_mm512_mask_blend_epi32(mv,_mm512_permutex2var_epi32(L0,pv,L1),_mm512_permutex2var_epi32(L2,pv,L3));
            const __m512i hi=_mm512_mask_blend_epi32(mv,_mm512_permutex2var_epi32(H0,pv,H1),_mm512_permutex2var_epi32(H2,pv,H3));
            a[2*v]=_mm512_add_pd(a[2*v],_mm512_castsi512_pd(_mm512_unpacklo_epi32(lo,hi)));
            a[2*v+1]=_mm512_add_pd(a[2*v+1],_mm512_castsi512_pd(_mm512_unpackhi_epi32(lo,hi)));
        }
    }
    const __m512i b0=_mm512_set_epi64(11,10,3,2,9,8,1,0),b1=_mm512_set_epi64(15,14,7,6,13,12,5,4);
    for(int v=0;v<4;v++){_mm512_storeu_pd(acc+16*v,_mm512_permutex2var_pd(a[2*v],b0,a[2*v+1]));
        _mm512_storeu_pd(acc+16*v+8,_mm512_permutex2var_pd(a[2*v],b1,a[2*v+1]));}
}
/* bytes-trees: the trees on bins, the leaves picked as byte planes and put back together by
   unpacks (rows in the registers in the unpacks' order, put back on store) */
__attribute__((target("avx512f,avx512bw,avx512vbmi")))
static void hb8(const uint32_t *key, const uint8_t *jb, int64_t T, const uint8_t *planes, const uint8_t *bins, double *acc){
    __m512d a[8];
    double tmp[64];
    /* zmm j = (s1, s2, s3) bits (4, 2, 1): lane L, qword k holds row 16L + 8 s1 + 4 s2 + 2 s3 + k */
    for(int j=0;j<8;j++){ int s1=(j>>2)&1,s2=(j>>1)&1,s3=j&1; for(int L=0;L<4;L++) for(int k=0;k<2;k++) tmp[8*j+2*L+k]=acc[16*L+8*s1+4*s2+2*s3+k]; a[j]=_mm512_loadu_pd(tmp+8*j);}
    for(int64_t t=0;t<T;t++){
        const uint32_t *k=key+t*6; const uint8_t *j=jb+t*6;
        __m512i p=_mm512_maskz_mov_epi8(_mm512_cmpgt_epu8_mask(_mm512_loadu_si512(bins+k[0]*R),_mm512_set1_epi8((char)j[0])),_mm512_set1_epi8(32));
        for(int l=1;l<6;l++){
            const __mmask64 m=_mm512_cmpgt_epu8_mask(_mm512_loadu_si512(bins+k[l]*R),_mm512_set1_epi8((char)j[l]));
            p=_mm512_mask_add_epi8(p,m,p,_mm512_set1_epi8((char)(1<<(5-l))));
        }
        const uint8_t *h=planes+t*512;
        __m512i P[8];
        for(int q=0;q<8;q++) P[q]=_mm512_permutexvar_epi8(p,_mm512_loadu_si512(h+64*q));
        const __m512i w01l=_mm512_unpacklo_epi8(P[0],P[1]),w01h=_mm512_unpackhi_epi8(P[0],P[1]);
        const __m512i w23l=_mm512_unpacklo_epi8(P[2],P[3]),w23h=_mm512_unpackhi_epi8(P[2],P[3]);
        const __m512i w45l=_mm512_unpacklo_epi8(P[4],P[5]),w45h=_mm512_unpackhi_epi8(P[4],P[5]);
        const __m512i w67l=_mm512_unpacklo_epi8(P[6],P[7]),w67h=_mm512_unpackhi_epi8(P[6],P[7]);
        const __m512i d0ll=_mm512_unpacklo_epi16(w01l,w23l),d0lh=_mm512_unpackhi_epi16(w01l,w23l);
        const __m512i d0hl=_mm512_unpacklo_epi16(w01h,w23h),d0hh=_mm512_unpackhi_epi16(w01h,w23h);
        const __m512i d1ll=_mm512_unpacklo_epi16(w45l,w67l),d1lh=_mm512_unpackhi_epi16(w45l,w67l);
        const __m512i d1hl=_mm512_unpacklo_epi16(w45h,w67h),d1hh=_mm512_unpackhi_epi16(w45h,w67h);
        a[0]=_mm512_add_pd(a[0],_mm512_castsi512_pd(_mm512_unpacklo_epi32(d0ll,d1ll)));
        a[1]=_mm512_add_pd(a[1],_mm512_castsi512_pd(_mm512_unpackhi_epi32(d0ll,d1ll)));
        a[2]=_mm512_add_pd(a[2],_mm512_castsi512_pd(_mm512_unpacklo_epi32(d0lh,d1lh)));
        a[3]=_mm512_add_pd(a[3],_mm512_castsi512_pd(_mm512_unpackhi_epi32(d0lh,d1lh)));
        a[4]=_mm512_add_pd(a[4],_mm512_castsi512_pd(_mm512_unpacklo_epi32(d0hl,d1hl)));
        a[5]=_mm512_add_pd(a[5],_mm512_castsi512_pd(_mm512_unpackhi_epi32(d0hl,d1hl)));
        a[6]=_mm512_add_pd(a[6],_mm512_castsi512_pd(_mm512_unpacklo_epi32(d0hh,d1hh)));
        a[7]=_mm512_add_pd(a[7],_mm512_castsi512_pd(_mm512_unpackhi_epi32(d0hh,d1hh)));
    }
    for(int j=0;j<8;j++){ _mm512_storeu_pd(tmp+8*j,a[j]); int s1=(j>>2)&1,s2=(j>>1)&1,s3=j&1; for(int L=0;L<4;L++) for(int k=0;k<2;k++) acc[16*L+8*s1+4*s2+2*s3+k]=tmp[8*j+2*L+k];}
}
/* ymm-compares: sw_obl_sum512_h4 with levels 1-5 from 256-bit vector compares (signed, on
   keys with the top bit flipped) and ternary-logic ORs, the two halves joined for the
   permutes */
__attribute__((target("avx512f,avx512vl")))
static void h4y(const sw_obl *o, const uint32_t *cols, const uint32_t *fcols, const uint32_t *fthr, const uint32_t *halves, double *acc){
    const int32_t D = 6; const int64_t W = 64;
    const __m512i g0 = _mm512_set_epi64(13, 12, 9, 8, 5, 4, 1, 0);
    const __m512i g1 = _mm512_set_epi64(15, 14, 11, 10, 7, 6, 3, 2);
    __m512d a[8];
    for (int v = 0; v < 4; v++) { const __m512d lo = _mm512_loadu_pd(acc + 16 * v), hi = _mm512_loadu_pd(acc + 16 * v + 8);
        a[2 * v] = _mm512_permutex2var_pd(lo, g0, hi); a[2 * v + 1] = _mm512_permutex2var_pd(lo, g1, hi); }
    for (int64_t t = 0; t < o->n_trees; t++) {
        const uint32_t *key = o->key + t * D, *thr = o->thr + t * D, *ft = fthr + t * D;
        __mmask16 m0[4]; __m256i p[8];
        { const uint32_t *c = cols + (int64_t)key[0] * SW_OBL_R; const __m512i th = _mm512_set1_epi32((int)thr[0]);
          for (int v = 0; v < 4; v++) m0[v] = _mm512_cmpgt_epu32_mask(_mm512_loadu_si512(c + 16 * v), th); }
        { const uint32_t *c = fcols + (int64_t)key[1] * SW_OBL_R; const __m256i th = _mm256_set1_epi32((int)ft[1]);
          const __m256i bit = _mm256_set1_epi32(16);
          for (int h = 0; h < 8; h++) p[h] = _mm256_and_si256(_mm256_cmpgt_epi32(_mm256_loadu_si256((const __m256i *)(c + 8 * h)), th), bit); }
        for (int32_t l = 2; l < D; l++) {
            const uint32_t *c = fcols + (int64_t)key[l] * SW_OBL_R;
            const __m256i th = _mm256_set1_epi32((int)ft[l]);
            const __m256i bit = _mm256_set1_epi32(1 << (D - 1 - l));
            for (int h = 0; h < 8; h++)
                p[h] = _mm256_ternarylogic_epi32(p[h], _mm256_cmpgt_epi32(_mm256_loadu_si256((const __m256i *)(c + 8 * h)), th), bit, 0xF8);
        }
        const uint32_t *hh = halves + t * 2 * W;
        const __m512i L0 = _mm512_loadu_si512(hh), H0 = _mm512_loadu_si512(hh + W);
        const __m512i L1 = _mm512_loadu_si512(hh + 16), H1 = _mm512_loadu_si512(hh + W + 16);
        const __m512i L2 = _mm512_loadu_si512(hh + 32), L3 = _mm512_loadu_si512(hh + 48);
        const __m512i H2 = _mm512_loadu_si512(hh + 96), H3 = _mm512_loadu_si512(hh + 112);
        for (int v = 0; v < 4; v++) {
            const __m512i pv = _mm512_inserti64x4(_mm512_castsi256_si512(p[2 * v]), p[2 * v + 1], 1);
            const __m512i lo = _mm512_mask_blend_epi32(m0[v], _mm512_permutex2var_epi32(L0, pv, L1), _mm512_permutex2var_epi32(L2, pv, L3));
            const __m512i hi = _mm512_mask_blend_epi32(m0[v], _mm512_permutex2var_epi32(H0, pv, H1), _mm512_permutex2var_epi32(H2, pv, H3));
            a[2 * v] = _mm512_add_pd(a[2 * v], _mm512_castsi512_pd(_mm512_unpacklo_epi32(lo, hi)));
            a[2 * v + 1] = _mm512_add_pd(a[2 * v + 1], _mm512_castsi512_pd(_mm512_unpackhi_epi32(lo, hi)));
        }
    }
    const __m512i b0 = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), b1 = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
    for (int v = 0; v < 4; v++) { _mm512_storeu_pd(acc + 16 * v, _mm512_permutex2var_pd(a[2 * v], b0, a[2 * v + 1]));
        _mm512_storeu_pd(acc + 16 * v + 8, _mm512_permutex2var_pd(a[2 * v], b1, a[2 * v + 1])); }
}
int main(int argc,char**argv){
    int T=argc>1?atoi(argv[1]):500, D=6; srand(1);
    int used[2*NF],nused=0;
    for(int f=0;f<NF;f++){int c=2*f; int n=f<3?130:55; nb[c]=n; used[nused++]=c;
        for(int i=0;i<n;i++) border[c][i]=(uint32_t)rand()*2u+1;
        qsort(border[c],n,4,cmpu);
        for(int i=n;i<256;i++) border[c][i]=0xFFFFFFFFu;
        if(n<=32) for(int i=0;i<32;i++) piv[c][i]=border[c][i];
        else { for(int g=0;g<32;g++){ piv[c][g]=border[c][8*g+7]; for(int j=0;j<8;j++) plane[c][j][g]=border[c][8*g+j]; } }
    }
    uint32_t *key=malloc(T*D*4),*thr=malloc(T*D*4),*halves=aligned_alloc(64,T*128*4),*cols=aligned_alloc(64,2*NF*64*4);
    uint8_t *jb=malloc(T*D), *bins=aligned_alloc(64,2*NF*64);
    for(int i=0;i<T*D;i++){int c=2*(rand()%NF); int j=rand()%nb[c]; key[i]=c; thr[i]=border[c][j]; jb[i]=(uint8_t)j;}
    for(int i=0;i<T*128;i++)halves[i]=rand();
    for(int i=0;i<2*NF*64;i++){ cols[i]=(uint32_t)rand()*2u; if(i%5==0) cols[i]=border[(i/64)&~1][rand()%nb[(i/64)&~1]]; if(i%7==0) cols[i]=0xFFFFFFFFu; if(i%11==0) cols[i]=0;}
    sw_obl o={0}; o.key=key;o.thr=thr;o.n_trees=T;o.depth=D;o.n_features=NF;o.halves=halves;
    uint8_t *planes=aligned_alloc(64,(size_t)T*512);
    for(int t=0;t<T;t++) for(int i=0;i<64;i++){ uint64_t v=(uint64_t)halves[t*128+i] | (uint64_t)halves[t*128+64+i]<<32; for(int q=0;q<8;q++) planes[(size_t)t*512+64*q+i]=(uint8_t)(v>>(8*q)); }
    double a[64]={0},b[64]={0},c8[64]={0}; memset(bins,0,2*NF*64);
    sw_obl_sum512_h4(&o,cols,halves,a); binarize(cols,used,nused,bins); hb(key,jb,T,halves,bins,b);
    if (memcmp(a, b, sizeof a)) { printf("the binned sums differ from the kernel's\n"); return 1; }
    printf("the binned sums equal the kernel's, bit for bit\n");
    __builtin_cpu_init();
    const int vbmi = __builtin_cpu_supports("avx512vbmi");  /* vpermb: bytes-trees only */
    if (vbmi) hb8(key,jb,T,planes,bins,c8); else memcpy(c8, a, sizeof a);
    if (memcmp(a, c8, sizeof a)) { printf("the byte-plane sums differ from the kernel's\n"); for(int i=0;i<4;i++) printf("%g %g\n",a[i],c8[i]); return 1; }
    printf(vbmi ? "the byte-plane sums equal the kernel's, bit for bit\n"
                : "no AVX-512 VBMI on this CPU: bytes-trees not run\n");
    uint32_t *fcols=aligned_alloc(64,2*NF*64*4), *fthr=malloc(T*D*4); double cy[64]={0};
    for(int i=0;i<2*NF*64;i++) fcols[i]=cols[i]^0x80000000u;
    for(int i=0;i<T*D;i++) fthr[i]=thr[i]^0x80000000u;
    h4y(&o,cols,fcols,fthr,halves,cy);
    if (memcmp(a, cy, sizeof a)) { printf("the ymm sums differ from the kernel's\n"); return 1; }
    printf("the ymm-compare sums equal the kernel's, bit for bit\n");
    int reps=40000/ (T/50);
    for(int round=0;round<5;round++){
        double t0=now(); for(int r=0;r<reps;r++) sw_obl_sum512_h4(&o,cols,halves,a); double d1=now()-t0;
        t0=now(); for(int r=0;r<reps;r++) binarize(cols,used,nused,bins); double d2=now()-t0;
        t0=now(); for(int r=0;r<reps;r++) hb(key,jb,T,halves,bins,b); double d3=now()-t0;
        t0=now(); for(int r=0;r<reps && vbmi;r++) hb8(key,jb,T,planes,bins,c8); double d4=now()-t0;
        t0=now(); for(int r=0;r<reps;r++) h4y(&o,cols,fcols,fthr,halves,cy); double d5=now()-t0;
        double s=1e9/(reps*64.0*T);
        printf("halves %.3f  binarize %.3f  bins-trees %.3f  total %.3f  gain %.2fx  "
               "bytes-trees %.3f  total %.3f  gain %.2fx  ymm-compares %.3f  gain %.2fx\n",
               d1*s,d2*s,d3*s,(d2+d3)*s,d1/(d2+d3),d4*s,(d2+d4)*s,d1/(d2+d4),d5*s,d1/d5);
    }
}
