// Multiply-instruction loops behind docs/cpu-kernels.md's ceilings (GMAC/s per core), accumulators in registers.
// gcc -O2 mul-loops.c -o mul-loops && ./mul-loops   (one core; run on a quiet machine)
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec a; clock_gettime(CLOCK_MONOTONIC,&a); return a.tv_sec+a.tv_nsec/1e9;}
#define T __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avxvnni"),noinline))
#define R8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
T double ymm_mm(long n,const int*mem){ __m256i w=_mm256_loadu_si256((const __m256i*)mem), s=_mm256_set1_epi16(2);
#define D(i) __m256i a##i=_mm256_set1_epi32(i);
 R8(D)
 double t=now();
 for(long k=0;k<n;k++){ const int*m=mem+(k&63);
#define B(i) { __m256i y=_mm256_set1_epi32(m[i]); a##i=_mm256_add_epi32(a##i,_mm256_madd_epi16(_mm256_maddubs_epi16(w,y),s)); }
  R8(B) __asm__ volatile("":::"memory"); }
 t=now()-t; int x=0;
#define S(i) x+=_mm256_extract_epi32(a##i,0);
 R8(S) if(x==12345) puts("");
 return 8.0*n*32/t/1e9;}
#undef D
#undef B
#undef S
T double ymm_dp(long n,const int*mem){ __m256i w=_mm256_loadu_si256((const __m256i*)mem);
#define D(i) __m256i a##i=_mm256_set1_epi32(i);
 R8(D)
 double t=now();
 for(long k=0;k<n;k++){ const int*m=mem+(k&63);
#define B(i) { __m256i y=_mm256_set1_epi32(m[i]); a##i=_mm256_dpbusd_epi32(a##i,w,y); }
  R8(B) __asm__ volatile("":::"memory"); }
 t=now()-t; int x=0;
#define S(i) x+=_mm256_extract_epi32(a##i,0);
 R8(S) if(x==12345) puts("");
 return 8.0*n*32/t/1e9;}
#undef D
#undef B
#undef S
T double zmm_dp(long n,const int*mem){ __m512i w=_mm512_loadu_si512((const void*)mem);
#define D(i) __m512i a##i=_mm512_set1_epi32(i);
 R8(D)
 double t=now();
 for(long k=0;k<n;k++){ const int*m=mem+(k&63);
#define B(i) { __m512i y=_mm512_set1_epi32(m[i]); a##i=_mm512_dpbusd_epi32(a##i,w,y); }
  R8(B) __asm__ volatile("":::"memory"); }
 t=now()-t; int x=0;
#define S(i) x+=_mm512_reduce_add_epi32(a##i);
 R8(S) if(x==12345) puts("");
 return 8.0*n*64/t/1e9;}
#undef D
#undef B
#undef S
T double zmm_mm(long n,const int*mem){ __m512i w=_mm512_loadu_si512((const void*)mem), s=_mm512_set1_epi16(2);
#define D(i) __m512i a##i=_mm512_set1_epi32(i);
 R8(D)
 double t=now();
 for(long k=0;k<n;k++){ const int*m=mem+(k&63);
#define B(i) { __m512i y=_mm512_set1_epi32(m[i]); a##i=_mm512_add_epi32(a##i,_mm512_madd_epi16(_mm512_maddubs_epi16(w,y),s)); }
  R8(B) __asm__ volatile("":::"memory"); }
 t=now()-t; int x=0;
#define S(i) x+=_mm512_reduce_add_epi32(a##i);
 R8(S) if(x==12345) puts("");
 return 8.0*n*64/t/1e9;}
int main(){ static int mem[256]; for(int i=0;i<256;i++) mem[i]=i*77; long n=100000000;
 for(int r=0;r<2;r++) printf("GMAC/s/core: ymm maddubs+madd %.0f | zmm maddubs+madd %.0f | ymm dpbusd %.0f | zmm dpbusd %.0f\n", ymm_mm(n,mem), zmm_mm(n,mem), ymm_dp(n,mem), zmm_dp(n,mem));}
