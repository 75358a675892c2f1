/*
 * cpu_kernel_avx512.c — the vector layer for AVX-512 (16 floats), then the shared kernel body.
 * Micro-kernel 4 rows x 4 vectors: 16 zmm accumulators, per step 4 loads + 4 broadcasts for 16 FMAs,
 * so the two FMA pipes, not the load ports, are the limit.
 */
#include <immintrin.h>

#include "cpu_internal.h"

#define VW 16
typedef __m512 vf;
#define V_ZERO() _mm512_setzero_ps()
#define V_SET1(x) _mm512_set1_ps(x)
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, x) _mm512_storeu_ps((p), (x))
#define V_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define V_ADD(a, b) _mm512_add_ps((a), (b))
#define V_SUB(a, b) _mm512_sub_ps((a), (b))
#define V_MUL(a, b) _mm512_mul_ps((a), (b))
#define V_MAX(a, b) _mm512_max_ps((a), (b))
#define V_RADD(x) _mm512_reduce_add_ps(x)
#define V_LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define V_LOAD_BF16(p) \
  _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
/* x where lo <= j < hi, else -inf (the key-range mask of one row of S^T). */
#define V_MASK_RANGE(x, j, lo, hi)                                                                     \
  _mm512_mask_blend_ps(_mm512_cmp_ps_mask((lo), (j), _CMP_LE_OQ) & _mm512_cmp_ps_mask((j), (hi), _CMP_LT_OQ), \
                       _mm512_set1_ps(-INFINITY), (x))
#define MK_R 4
#define MK_C 4

/* 2^x for x <= 0 (clamped to [-127, 127]): 2^round(x) built in the exponent bits times a degree-6 Taylor
   polynomial of 2^f on |f| <= 0.5 (truncation error 0.35^7/7! = 6e-8 relative). x <= -127 gives exactly
   0 (exponent field 0), so masked scores (-inf) cost no branch. max/min keep a NaN x (they return the
   second operand when one is NaN), so NaN propagates. */
static inline vf v_exp2(vf x) {
  x = _mm512_max_ps(_mm512_set1_ps(-127.0f), x);
  x = _mm512_min_ps(_mm512_set1_ps(127.0f), x);
  vf n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  vf f = _mm512_sub_ps(x, n);
  vf p = _mm512_set1_ps(1.5403530393381606e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}
#define V_EXP2(x) v_exp2(x)

#define SA_K(name) sa_cpu_##name##_avx512
#define SA_K_TABLE sa_cpu_kernels_avx512
#define SA_K_NAME "avx512"

#include "cpu_kernel_body.h"
