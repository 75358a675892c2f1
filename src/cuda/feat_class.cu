/*
 * feat_class.cu — the class pre-pass of the Hopper feature kernels: every tile of the mask array and the positions
 * is empty, partial or full, so that the kernels skip the empty tiles, test no pair of the full ones and read the
 * mask only in the partial ones. docs/hopper.md, "feature kernels".
 *
 * Where the classes go: the backward's table of 64 x 64 blocks lies in its workspace (feat.h, sa_cuda_feat::cls).
 * The forward has no workspace: the class list of the 128-key tiles of a 64-row slab is written into that slab's
 * own rows of `out` (sa_feat_list_offset) before the forward runs; the forward's producer copies a work tile's
 * lists into shared memory before it loads the tile's Q, and only then may the consumers store those rows.
 */
#include "feat_class.h"

#include "feat.cuh"

namespace {

constexpr int SA_FC_WARPS = 4; /* warps a CTA: one block of W keys each */

/* Block (rb, kb) of W keys (64 or 128) and 64 rows of batch b, head n of the mask and the positions: its class.
   Warp-collective. The mask rows are 16-byte aligned (S a multiple of 128, a 16-byte aligned base). */
template <int W>
__device__ __forceinline__ int sa_feat_block_class(const sa_cuda_feat &f, int64_t b, int64_t n, int64_t T, int64_t S,
                                                   int64_t rb, int64_t kb, int lane) {
  const int64_t i0 = rb * 64, j0 = kb * W;
  int cm = SA_FEAT_FULL, cp = SA_FEAT_FULL;
  if (f.mask) {
    constexpr int CPR = W / 16;         /* 16-byte chunks a row */
    constexpr int ITER = 64 * CPR / 32; /* loads a lane */
    const uint8_t *base = f.mask + b * f.mask_b + n * f.mask_n + j0;
    bool any = false, all = true;
#pragma unroll 4
    for (int x = 0; x < ITER; ++x) {
      const int c = x * 32 + lane, r = c / CPR, k = c % CPR;
      const uint4 v = __ldg(reinterpret_cast<const uint4 *>(base + (i0 + r) * f.mask_t + 16 * k));
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        any |= w[e] != 0u;
        all &= sa_feat_word_all(w[e]) != 0;
      }
    }
    cm = sa_feat_mask_class(__any_sync(0xffffffffu, any), __all_sync(0xffffffffu, all));
  }
  if (f.q_pos) {
    const int32_t *qp = f.q_pos + b * T + i0, *kp = f.kv_pos + b * S + j0;
    int qmin = min(qp[lane], qp[lane + 32]), qmax = max(qp[lane], qp[lane + 32]);
    int kmin = kp[lane], kmax = kp[lane];
#pragma unroll
    for (int x = 32; x < W; x += 32) kmin = min(kmin, kp[x + lane]), kmax = max(kmax, kp[x + lane]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      qmin = min(qmin, __shfl_xor_sync(0xffffffffu, qmin, o));
      qmax = max(qmax, __shfl_xor_sync(0xffffffffu, qmax, o));
      kmin = min(kmin, __shfl_xor_sync(0xffffffffu, kmin, o));
      kmax = max(kmax, __shfl_xor_sync(0xffffffffu, kmax, o));
    }
    cp = sa_feat_pos_class(&f, qmin, qmax, kmin, kmax);
  }
  return sa_feat_and(cm, cp);
}

/* grid (ceil(blocks / warps), T / 64, cb cn): warp w of CTA x takes key block x warps + w of row block y, for the
   mask / positions index z = cb_i cn + cn_i. W 64: the backward's table entry; W 128: the forward's list byte, in the
   rows of every (b, n) that shares it (B / cb batches, N / cn heads: one store a lane). */
template <int W>
__global__ void __launch_bounds__(SA_FC_WARPS * 32) sa_feat_class_kernel(const sa_cuda_feat f, sa_feat_class_args a) {
  const int lane = threadIdx.x % 32;
  const int64_t kb = (int64_t)blockIdx.x * SA_FC_WARPS + threadIdx.x / 32, rb = blockIdx.y;
  const int64_t nk = (a.S + W - 1) / W;
  if (kb >= nk) return; /* warp-uniform */
  const int64_t cbi = blockIdx.z / a.cn, cni = blockIdx.z - cbi * a.cn;
  const int c = sa_feat_block_class<W>(f, cbi, cni, a.T, a.S, rb, kb, lane);
  if (W == 64) {
    if (lane == 0) f.cls[cbi * f.cls_b + cni * f.cls_n + rb * f.cls_t + kb] = (uint8_t)c;
    return;
  }
  /* the forward's lists: every (b, n) whose mask / positions are these */
  const int64_t nb = a.B / a.cb, nn = a.N / a.cn, copies = nb * nn;
  for (int64_t x = lane; x < copies; x += 32) {
    const int64_t bb = cbi + (x / nn) * a.cb, n = cni + (x % nn) * a.cn;
    a.out[sa_feat_list_offset(bb, n, rb, kb, a.T, a.N, a.Hv)] = (uint8_t)c;
  }
}

} /* namespace */

cudaError_t sa_feat_class_launch(const sa_cuda_feat &f, const sa_feat_class_args &a, int fwd_lists, cudaStream_t st) {
  const int W = fwd_lists ? 128 : 64;
  const int64_t nk = (a.S + W - 1) / W;
  const dim3 grid((unsigned)((nk + SA_FC_WARPS - 1) / SA_FC_WARPS), (unsigned)(a.T / 64), (unsigned)(a.cb * a.cn));
  if (fwd_lists) sa_feat_class_kernel<128><<<grid, SA_FC_WARPS * 32, 0, st>>>(f, a);
  else sa_feat_class_kernel<64><<<grid, SA_FC_WARPS * 32, 0, st>>>(f, a);
  return cudaGetLastError();
}
