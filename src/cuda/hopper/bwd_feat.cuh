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

} /* namespace */

#endif /* SA_HOPPER_BWD_FEAT_CUH */
