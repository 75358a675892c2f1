/*
 * cpu_math_avx2.h — 2^x and tanh on 8 fp32 lanes for the AVX2 vector layer (cpu_kernel_avx2.c): the
 * exponentials of the softmax and the logits soft-cap.
 */
#ifndef SA_CPU_MATH_AVX2_H
#define SA_CPU_MATH_AVX2_H

#include <immintrin.h>
#include <stdint.h>

#include "cpu_tanh.h"

/* 2^x, same construction and error as the AVX-512 layer's (cpu_exp2_avx512.h). */
static inline __m256 sa_exp2_avx2(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-127.0f), x);
  x = _mm256_min_ps(_mm256_set1_ps(127.0f), x);
  __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(1.5403530393381606e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428443e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076284772e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108664821580e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650695910071e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718055994531e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* tanh (cpu_tanh.h); 2 / (e + 1) by a division: vrcpps has 12 bits only. */
static inline __m256 sa_tanh_avx2(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f), sgn = _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN));
  const __m256 ax = _mm256_andnot_ps(sgn, x), x2 = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(SA_TANH_P4);
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(SA_TANH_P3));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(SA_TANH_P2));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(SA_TANH_P1));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(SA_TANH_P0));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(x, x2), p, x); /* NaN x stays NaN here */
  const __m256 e =
      sa_exp2_avx2(_mm256_mul_ps(_mm256_min_ps(ax, _mm256_set1_ps(SA_TANH_CLAMP)), _mm256_set1_ps(SA_TANH_2LOG2E)));
  const __m256 big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
  /* x's sign onto either: big is positive, small has it already except at -0 */
  const __m256 t = _mm256_blendv_ps(small, big, _mm256_cmp_ps(ax, _mm256_set1_ps(SA_TANH_SPLIT), _CMP_GE_OQ));
  return _mm256_or_ps(t, _mm256_and_ps(sgn, x));
}

#endif /* SA_CPU_MATH_AVX2_H */
