/*
 * cpu_vec_avx512.h — the AVX-512 vector layer of the kernel body (16 floats), shared by the AVX-512 kernels
 * (cpu_kernel_avx512.c) and the tile kernels (cpu_kernel_amx.c, cpu_kernel_amxemu.c), whose softmax, masks
 * and bookkeeping are the same AVX-512 code. Micro-kernel 4 rows x 4 vectors: 16 zmm accumulators, per step
 * 4 loads + 4 broadcasts for 16 FMAs, so the two FMA pipes, not the load ports, are the limit.
 */
#ifndef SA_CPU_VEC_AVX512_H
#define SA_CPU_VEC_AVX512_H

#include <immintrin.h>

#include "cpu_exp2_avx512.h"
#include "cpu_internal.h"
#include "cpu_tanh_avx512.h"

#define VW 16
typedef __m512 vf;
#define V_ZERO()       _mm512_setzero_ps()
#define V_SET1(x)      _mm512_set1_ps(x)
#define V_LOAD(p)      _mm512_loadu_ps(p)
#define V_STORE(p, x)  _mm512_storeu_ps((p), (x))
#define V_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define V_ADD(a, b)    _mm512_add_ps((a), (b))
#define V_SUB(a, b)    _mm512_sub_ps((a), (b))
#define V_MUL(a, b)    _mm512_mul_ps((a), (b))
#define V_MAX(a, b)    _mm512_max_ps((a), (b))
#define V_RADD(x)      _mm512_reduce_add_ps(x)
#define V_LOAD_F16(p)  _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define V_LOAD_BF16(p) \
  _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
/* x where lo <= j < hi, else -inf (the key-range mask of one row of S^T). */
#define V_MASK_RANGE(x, j, lo, hi)                                                                            \
  _mm512_mask_blend_ps(_mm512_cmp_ps_mask((lo), (j), _CMP_LE_OQ) & _mm512_cmp_ps_mask((j), (hi), _CMP_LT_OQ), \
                       _mm512_set1_ps(-INFINITY), (x))
/* 16 floats to bf16 at p, rounded as sa_f32_to_bf16 (nearest even, NaN quieted): the output rows' stores,
   element by element 5% of the tile forward's non-product samples (T = S = 2048, N8 H128). */
static inline void sa_store_bf16_avx512(void *p, __m512 x) {
  const __m512i u = _mm512_castps_si512(x), one = _mm512_set1_epi32(1);
  __m512i r =
      _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
  _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
}
#define V_STORE_BF16(p, x) sa_store_bf16_avx512((p), (x))
#define MK_R               4
#define MK_C               4

#define V_EXP2(x) sa_exp2_avx512(x)
#define V_TANH(x) sa_tanh_avx512(x)
/* x where k != -inf, else -inf (a kill tile's select, cpu_mask.h); NaN k keeps x. */
#define V_KEEP(x, k) \
  _mm512_mask_blend_ps(_mm512_cmp_ps_mask((k), _mm512_set1_ps(-INFINITY), _CMP_NEQ_UQ), _mm512_set1_ps(-INFINITY), (x))
/* p * x where p != 0, else 0 (a masked pair's ds is 0 whatever dp holds); NaN p gives NaN. */
#define V_MUL_NZ(p, x) _mm512_maskz_mul_ps(_mm512_cmp_ps_mask((p), _mm512_setzero_ps(), _CMP_NEQ_UQ), (p), (x))

#endif /* SA_CPU_VEC_AVX512_H */
