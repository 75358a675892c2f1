/*
 * hopper/bwd_feat.cuh — the two-pass backward's feature steps (plan hopper.bwd.twopass.features:
 * sa_hop_twopass_dkdv_kernel / sa_hop_twopass_dq_kernel with FEAT 1): the parameters, the class of a 64 x 64 block
 * from the pre-pass's table (feat_class.cu), and per pair the logit of a bias and a soft-cap, the select of the mask
 * array and the positions, the soft-cap's factor of dS and the dbias write. Included by hopper/bwd_twopass.cu only.
 * docs/hopper.md, "feature kernels".
 */
#ifndef SA_HOPPER_BWD_FEAT_CUH
#define SA_HOPPER_BWD_FEAT_CUH

#include "feat.cuh"
#include "hopper/ptx.cuh"

namespace {

/* The class of 64-row block rb, 64-key block kb of batch b, head n; full without a table. Every lane of a warp
   reads the same byte. */
__device__ __forceinline__ int feat_cls(const sa_cuda_feat &f, int64_t b, int64_t n, int rb, int kb) {
  if (!f.cls) return SA_FEAT_FULL;
  return __ldg(f.cls + b * f.cls_b + n * f.cls_n + (int64_t)rb * f.cls_t + kb);
}

/* Whether every block of a streamed tile is empty for the CTA's n_wg warpgroups (the producer skips loading it,
   the consumers skip it alike): the tile's blocks are (rb0 + w, kb) in dQ (rows advance) and (rb, kb0 + w) in dK/dV
   (keys advance). */
__device__ __forceinline__ bool feat_tile_empty(const sa_cuda_feat &f, int64_t b, int64_t n, int rb, int kb, int n_wg,
                                                bool rows_advance) {
  if (!f.cls) return false;
  for (int w = 0; w < n_wg; ++w)
    if (feat_cls(f, b, n, rows_advance ? rb + w : rb, rows_advance ? kb : kb + w) != SA_FEAT_EMPTY) return false;
  return true;
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* ---- FEAT 2 (hopper.bwd.twopass.features.tma): the class slice in shared memory, the bias by TMA ---- */

/* The dK/dV CTA's slice of the class table into shared memory at dst (every thread of the CTA, before its first
   barrier): byte g (T / 64) + rb holds the classes of query block rb of head n0 + g against key blocks kb0 (bits 0-1)
   and kb0 + 1 (bits 2-3, with a second warpgroup), so that a tile is empty iff its byte is 0. */
__device__ __forceinline__ void feat_cls_slice_kv(const sa_cuda_feat &f, uint32_t dst, int64_t b, int n0, int G,
                                                  int nrb, int kb0, int n_wg) {
  for (int i = threadIdx.x; i < G * nrb; i += blockDim.x) {
    const int g = i / nrb, rb = i - g * nrb;
    const uint8_t *c = f.cls + b * f.cls_b + (int64_t)(n0 + g) * f.cls_n + (int64_t)rb * f.cls_t + kb0;
    const uint32_t v = sa_feat_cls_pack(__ldg(c), n_wg > 1 ? __ldg(c + 1) : 0u, n_wg);
    asm volatile("st.shared.u8 [%0], %1;" ::"r"(dst + i), "r"(v) : "memory");
  }
}

/* The dQ CTA's row of the class table into shared memory at dst: byte kb holds row blocks rb0 (bits 0-1) and rb0 + 1
   (bits 2-3, with a second warpgroup) against key block kb. */
__device__ __forceinline__ void feat_cls_slice_q(const sa_cuda_feat &f, uint32_t dst, int64_t b, int64_t n, int rb0,
                                                 int nkb, int n_wg) {
  const uint8_t *c = f.cls + b * f.cls_b + n * f.cls_n + (int64_t)rb0 * f.cls_t;
  for (int kb = threadIdx.x; kb < nkb; kb += blockDim.x) {
    const uint32_t v = sa_feat_cls_pack(__ldg(c + kb), n_wg > 1 ? __ldg(c + f.cls_t + kb) : 0u, n_wg);
    asm volatile("st.shared.u8 [%0], %1;" ::"r"(dst + kb), "r"(v) : "memory");
  }
}

/* A byte of the slice (both warpgroups' classes); without classes every block is full. */
__device__ __forceinline__ uint32_t feat_cls_byte(const sa_cuda_feat &f, uint32_t a) {
  if (!f.cls) return SA_FEAT_FULL | SA_FEAT_FULL << 2;
  uint32_t v;
  asm volatile("ld.shared.u8 %0, [%1];" : "=r"(v) : "r"(a) : "memory");
  return v;
}

/* The bias boxes of a streamed tile (es-byte elements, 128 bytes of each of `rows` rows a box, 128-byte swizzled:
   sa_feat_swz) from key k0, row i0 of head n, batch b, `bytes` bytes of keys in all: the map's dims are
   {S, T, heads, batches} of the bias, broadcast dims of 1. */
__device__ __forceinline__ void feat_tma_bias(const sa_cuda_feat &f, const CUtensorMap *map, uint32_t dst, uint32_t bar,
                                              int es, int bytes, int rows, int k0, int i0, int b, int n) {
  const int per = 128 / es;
  for (int c = 0; c < bytes / 128; ++c)
    tma_load(dst + c * rows * 128, map, bar, k0 + c * per, i0, f.bias_n ? n : 0, f.bias_b ? b : 0);
}

/* One bias element of es bytes in shared memory as a float. */
__device__ __forceinline__ float feat_bias_at(const uint8_t *a, int es, int dtype) {
  if (es == 4) return *reinterpret_cast<const float *>(a);
  const unsigned short h = *reinterpret_cast<const unsigned short *>(a);
  return dtype == SA_BF16 ? __uint_as_float((uint32_t)h << 16) : __half2float(__ushort_as_half(h));
}

#endif /* sm_90a */

} /* namespace */

#endif /* SA_HOPPER_BWD_FEAT_CUH */
