// Multiply-instruction loops behind docs/cpu-kernels.md's ceilings (GMAC/s per core).
// gcc -O2 mul-loops.c -o mul-loops && ./mul-loops   (one core; run on a quiet machine)
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec a; clock_gettime(CLOCK_MONOTONIC,&a); return a.tv_sec+a.tv_nsec/1e9;}
#define N 16
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"),noinline))
void run(long n, const int *mem){
  __m256i a[N]; __m512i b[N]; for(int i=0;i<N;i++){ a[i]=_mm256_set1_epi32(i); b[i]=_mm512_set1_epi32(i);}
  __m256i w=_mm256_loadu_si256((const __m256i*)mem), s=_mm256_set1_epi16(2);
  __m512i W=_mm512_loadu_si512((const void*)mem), S=_mm512_set1_epi16(2);
  double t=now();
  for(long k=0;k<n;k++){ const int*m=mem+(k&63);
    for(int i=0;i<N;i++){ __m256i y=_mm256_set1_epi32(m[i]); __m256i p=_mm256_maddubs_epi16(w,y); a[i]=_mm256_add_epi32(a[i],_mm256_madd_epi16(p,s));} }
  double t1=now()-t; t=now();
  for(long k=0;k<n;k++){ const int*m=mem+(k&63);
    for(int i=0;i<N;i++){ __m512i y=_mm512_set1_epi32(m[i]); __m512i p=_mm512_maddubs_epi16(W,y); b[i]=_mm512_add_epi32(b[i],_mm512_madd_epi16(p,S));} }
  double t2=now()-t; t=now();
  for(long k=0;k<n;k++){ const int*m=mem+(k&63);
    for(int i=0;i<N;i++){ __m256i y=_mm256_set1_epi32(m[i]); a[i]=_mm256_dpbusd_epi32(a[i],w,y);} }
  double t3=now()-t; t=now();
  for(long k=0;k<n;k++){ const int*m=mem+(k&63);
    for(int i=0;i<N;i++){ __m512i y=_mm512_set1_epi32(m[i]); b[i]=_mm512_dpbusd_epi32(b[i],W,y);} }
  double t4=now()-t;
  int x=0; for(int i=0;i<N;i++) x+=_mm256_extract_epi32(a[i],0)+_mm512_reduce_add_epi32(b[i]);
  double it=(double)N*n; printf("GMAC/s/core: ymm maddubs+madd %.0f | zmm maddubs+madd %.0f | ymm dpbusd %.0f | zmm dpbusd %.0f (%d)\n", it*32/t1/1e9, it*64/t2/1e9, it*32/t3/1e9, it*64/t4/1e9, x);
}
int main(){ static int mem[256]; for(int i=0;i<256;i++) mem[i]=i*77; run(200000000,mem); run(200000000,mem);}
