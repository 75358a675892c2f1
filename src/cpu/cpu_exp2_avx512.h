/*
 * cpu_exp2_avx512.h — 2^x on 16 fp32 lanes for the AVX-512 attention layer (cpu_kernel_avx512.c) and the
 * AVX-512 decode kernel (cpu_decode_avx512.c).
 */
#ifndef SA_CPU_EXP2_AVX512_H
#define SA_CPU_EXP2_AVX512_H

#include <immintrin.h>

/* 2^x for x <= 0 (clamped to [-127, 127]): 2^round(x) built in the exponent bits times a degree-6 Taylor
   polynomial of 2^f on |f| <= 0.5 (truncation error 0.35^7/7! = 6e-8 relative). x <= -127 gives exactly
   0 (exponent field 0), so masked scores (-inf) cost no branch. max/min keep a NaN x (they return the
   second operand when one is NaN), so NaN propagates. */
static inline __m512 sa_exp2_avx512(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-127.0f), x);
  x = _mm512_min_ps(_mm512_set1_ps(127.0f), x);
  __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

#endif /* SA_CPU_EXP2_AVX512_H */
