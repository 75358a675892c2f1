/*
 * feat.cuh — the device loads of the feature kernels (feat.h's inputs) in their dtype and broadcast: a bias pair, a
 * mask pair, a pair of key positions, for the pairs of one row that a thread's mma / wgmma accumulator holds side by
 * side (columns j, j + 1 with j even). The portable and the Hopper feature kernels share them. docs/hopper.md,
 * "feature kernels".
 */
#ifndef SA_CUDA_FEAT_CUH
#define SA_CUDA_FEAT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "feat.h"

/* Two bf16 / f16 of one 32-bit word (the lower element first) as floats. */
__device__ __forceinline__ float2 sa_feat_unpack2(uint32_t w, int dtype) {
  if (dtype == SA_BF16) return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  return __half22float2(*reinterpret_cast<const __half2 *>(&w));
}

/* Element idx of a bias of dtype `dtype` (read-only path: the bias is an input of the whole call). */
__device__ __forceinline__ float sa_feat_ld1(const void *p, int dtype, int64_t idx) {
  if (dtype == SA_F32) return __ldg(reinterpret_cast<const float *>(p) + idx);
  const unsigned short h = __ldg(reinterpret_cast<const unsigned short *>(p) + idx);
  return dtype == SA_BF16 ? __uint_as_float((uint32_t)h << 16) : __half2float(__ushort_as_half(h));
}

/* Elements idx, idx + 1 (idx even, the base 16-byte aligned: one 4- or 8-byte load). */
__device__ __forceinline__ float2 sa_feat_ld2(const void *p, int dtype, int64_t idx) {
  if (dtype == SA_F32) return __ldg(reinterpret_cast<const float2 *>(reinterpret_cast<const float *>(p) + idx));
  const uint32_t w = __ldg(reinterpret_cast<const unsigned int *>(reinterpret_cast<const uint16_t *>(p) + idx));
  return sa_feat_unpack2(w, dtype);
}

/* The bias of keys j, j + 1 (j even) of a row whose element 0 is at row_off (b bias_b + n bias_n + i bias_t);
   0 without a bias. */
__device__ __forceinline__ float2 sa_feat_bias2(const sa_cuda_feat &f, int64_t row_off, int j) {
  if (!f.bias) return make_float2(0.f, 0.f);
  if (f.bias_s) return sa_feat_ld2(f.bias, f.bias_dtype, row_off + j);
  const float x = sa_feat_ld1(f.bias, f.bias_dtype, row_off);
  return make_float2(x, x);
}

/* The bias of element idx (any layout: the dK/dV kernels' pairs are two rows of one key). */
__device__ __forceinline__ float sa_feat_bias1(const sa_cuda_feat &f, int64_t idx) {
  return f.bias ? sa_feat_ld1(f.bias, f.bias_dtype, idx) : 0.f;
}

/* Whether the mask lets keys j and j + 1 of a row (element 0 at row_off) in: bit 0 for j, bit 1 for j + 1; 3
   without a mask. Two byte loads: a row of the broadcast need not start on an even byte. */
__device__ __forceinline__ uint32_t sa_feat_mask2(const sa_cuda_feat &f, int64_t row_off, int j) {
  if (!f.mask) return 3u;
  const uint8_t *m = f.mask + row_off + (int64_t)j * f.mask_s;
  return (__ldg(m) != 0 ? 1u : 0u) | (__ldg(m + f.mask_s) != 0 ? 2u : 0u);
}

/* The same where row_off + j is even (the Hopper scope: S a multiple of 128, a 16-byte aligned mask): one load. */
__device__ __forceinline__ uint32_t sa_feat_mask2_aligned(const sa_cuda_feat &f, int64_t row_off, int j) {
  if (!f.mask) return 3u;
  if (!f.mask_s) return __ldg(f.mask + row_off) != 0 ? 3u : 0u;
  const unsigned short m = __ldg(reinterpret_cast<const unsigned short *>(f.mask + row_off + j));
  return ((m & 0xffu) != 0 ? 1u : 0u) | ((m >> 8) != 0 ? 2u : 0u);
}

/* Whether one element's mask lets its pair in (any layout). */
__device__ __forceinline__ bool sa_feat_mask1(const sa_cuda_feat &f, int64_t idx) {
  return !f.mask || __ldg(f.mask + idx) != 0;
}

/* Whether key positions kp pass a query's bounds [lo, hi] (sa_feat_pos_bounds): bit 0 for kp.x, bit 1 for kp.y. */
__device__ __forceinline__ uint32_t sa_feat_pos2(int2 kp, int32_t lo, int32_t hi) {
  return (kp.x >= lo && kp.x <= hi ? 1u : 0u) | (kp.y >= lo && kp.y <= hi ? 2u : 0u);
}

/* The portable kernels take their feature block as an optional trailing parameter (a pack of none or one
   sa_cuda_feat), so that the plain instantiation keeps exactly its parameter list and its code: f of the pack, or
   an unused empty block. */
__device__ __forceinline__ sa_cuda_feat sa_feat_arg() { return sa_cuda_feat{}; }
__device__ __forceinline__ const sa_cuda_feat &sa_feat_arg(const sa_cuda_feat &f) { return f; }

#endif /* SA_CUDA_FEAT_CUH */
