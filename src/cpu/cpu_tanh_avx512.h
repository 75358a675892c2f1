/*
 * cpu_tanh_avx512.h — tanh on 16 fp32 lanes for the AVX-512 vector layer (cpu_vec_avx512.h): the logits
 * soft-cap of the AVX-512 and tile kernels. Construction and error: cpu_tanh.h.
 */
#ifndef SA_CPU_TANH_AVX512_H
#define SA_CPU_TANH_AVX512_H

#include <immintrin.h>

#include "cpu_exp2_avx512.h"
#include "cpu_tanh.h"

/* 2 / (e + 1) by vrcp14ps (relative error 2^-14) and one Newton step (2^-28): a division costs about 3x as
   much on 16 lanes and gains nothing at fp32. */
static inline __m512 sa_tanh_avx512(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f), ax = _mm512_abs_ps(x), x2 = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(SA_TANH_P4);
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(SA_TANH_P3));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(SA_TANH_P2));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(SA_TANH_P1));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(SA_TANH_P0));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(x, x2), p, x); /* NaN x stays NaN here */
  const __m512 e =
      sa_exp2_avx512(_mm512_mul_ps(_mm512_min_ps(ax, _mm512_set1_ps(SA_TANH_CLAMP)), _mm512_set1_ps(SA_TANH_2LOG2E)));
  const __m512 d = _mm512_add_ps(e, one);
  __m512 r = _mm512_rcp14_ps(d);
  r = _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, one), r);
  const __m512 big = _mm512_fnmadd_ps(_mm512_set1_ps(2.0f), r, one);
  /* x's sign onto either: big is positive, small has it already except at -0 */
  const __m512i t = _mm512_castps_si512(
      _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(SA_TANH_SPLIT), _CMP_GE_OQ), small, big));
  return _mm512_castsi512_ps(
      _mm512_or_si512(t, _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN))));
}

#endif /* SA_CPU_TANH_AVX512_H */
