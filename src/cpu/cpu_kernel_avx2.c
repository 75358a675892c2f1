/*
 * cpu_kernel_avx2.c — the vector layer for AVX2 + FMA (8 floats), then the shared kernel body.
 * Micro-kernel 4 rows x 2 vectors: 8 ymm accumulators + 2 loads + 1 broadcast fit the 16 registers.
 */
#include <immintrin.h>

#include "cpu_internal.h"
#include "cpu_math_avx2.h"

#define VW 8
typedef __m256 vf;
#define V_ZERO()       _mm256_setzero_ps()
#define V_SET1(x)      _mm256_set1_ps(x)
#define V_LOAD(p)      _mm256_loadu_ps(p)
#define V_STORE(p, x)  _mm256_storeu_ps((p), (x))
#define V_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define V_ADD(a, b)    _mm256_add_ps((a), (b))
#define V_SUB(a, b)    _mm256_sub_ps((a), (b))
#define V_MUL(a, b)    _mm256_mul_ps((a), (b))
#define V_MAX(a, b)    _mm256_max_ps((a), (b))
#define V_LOAD_F16(p)  _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define V_LOAD_BF16(p) \
  _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
/* x where lo <= j < hi, else -inf (the key-range mask of one row of S^T). */
#define V_MASK_RANGE(x, j, lo, hi)                 \
  _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), (x), \
                   _mm256_and_ps(_mm256_cmp_ps((lo), (j), _CMP_LE_OQ), _mm256_cmp_ps((j), (hi), _CMP_LT_OQ)))
#define MK_R 4
#define MK_C 2

static inline float v_radd(vf x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#define V_RADD(x) v_radd(x)

#define V_EXP2(x) sa_exp2_avx2(x)
#define V_TANH(x) sa_tanh_avx2(x)
/* x where k != -inf, else -inf; p * x where p != 0, else 0 (cpu_vec_avx512.h) */
#define V_KEEP(x, k) \
  _mm256_blendv_ps((x), _mm256_set1_ps(-INFINITY), _mm256_cmp_ps((k), _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ))
#define V_MUL_NZ(p, x) _mm256_and_ps(_mm256_cmp_ps((p), _mm256_setzero_ps(), _CMP_NEQ_UQ), _mm256_mul_ps((p), (x)))

#define SA_K(name) sa_cpu_##name##_avx2
#define SA_K_TABLE sa_cpu_kernels_avx2
#define SA_K_NAME  "avx2"

#include "cpu_kernel_body.h"
