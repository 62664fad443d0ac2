// Peak float32 multiply-adds per second, 8 lanes (ymm) and 16 (zmm), on 1 and 2 threads.
//   gcc -O3 -march=native -fopenmp fma_peak.c -o fma_peak && ./fma_peak
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
#include <omp.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static float run_ymm(long n){__m256 a[12]; __m256 b=_mm256_set1_ps(1.0000001f), c=_mm256_set1_ps(1e-7f);
  for(int i=0;i<12;i++)a[i]=_mm256_set1_ps(i);
  for(long k=0;k<n;k++){ for(int i=0;i<12;i++) a[i]=_mm256_fmadd_ps(a[i],b,c); __asm__ volatile(""::"x"(a[0]));}
  float s=0; for(int i=0;i<12;i++) s+=a[i][0]; return s;}
static float run_zmm(long n){__m512 a[12]; __m512 b=_mm512_set1_ps(1.0000001f), c=_mm512_set1_ps(1e-7f);
  for(int i=0;i<12;i++)a[i]=_mm512_set1_ps(i);
  for(long k=0;k<n;k++){ for(int i=0;i<12;i++) a[i]=_mm512_fmadd_ps(a[i],b,c); __asm__ volatile(""::"v"(a[0]));}
  float s=0; for(int i=0;i<12;i++) s+=a[i][0]; return s;}
int main(){
  long n=100000000; float s=0;
  for (int threads=1; threads<=2; threads++) {
    double t=now();
    #pragma omp parallel num_threads(threads) reduction(+:s)
    s += run_ymm(n);
    t=now()-t; printf("ymm %d threads: %.1f GFLOP/s total\n", threads, threads*n*12*16/t/1e9);
    t=now();
    #pragma omp parallel num_threads(threads) reduction(+:s)
    s += run_zmm(n);
    t=now()-t; printf("zmm %d threads: %.1f GFLOP/s total\n", threads, threads*n*12*32/t/1e9);
  }
  printf("%g\n", s);
}
