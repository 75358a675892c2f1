/*
 * launch.h — the kernel families' launchers, each following a plan (plan.h) that attn.cu or decode/split.cu
 * picked: they enqueue on the caller's stream and never choose a schedule themselves.
 */
#ifndef SA_CUDA_LAUNCH_H
#define SA_CUDA_LAUNCH_H

#include "common.cuh"
#include "feat.h"
#include "plan.h"

/* portable/fwd.cu, portable/bwd.cu: the mma.sync kernels (sm_80+). The backward in three steps, enqueued in this
   order: the preprocess (D, lse2 when p.lse2 is set, the sink-gradient partials); dK/dV and dQ (or a Hopper
   family's); the fixed-order sink reduction. dtype: SA_BF16, SA_F16, or SA_F32 (the sa_f32in instantiations,
   common.cuh: inputs rounded to bf16 into shared memory, fp32 outputs). f: NULL, or the feature kernels' inputs
   (plans cuda.*.portable.features; 16-bit dtypes). */
cudaError_t sa_cuda_fwd_launch(const sa_cuda_params &p, const sa_cuda_feat *f, int dtype, int hd, cudaStream_t st);
cudaError_t sa_cuda_bwd_pre_launch(const sa_cuda_params &p, int dtype, cudaStream_t st);
cudaError_t sa_cuda_bwd_dkdv_dq_launch(const sa_cuda_params &p, const sa_cuda_feat *f, int dtype, int hd,
                                       cudaStream_t st);
cudaError_t sa_cuda_bwd_dsink_launch(const sa_cuda_params &p, cudaStream_t st);

/* hopper/fwd.cu: the sm_90a forward on the plan's grid and work order; a feature plan (plan.feat) also reads f
   (feat.h) and runs the class pre-pass first (feat_class.cu). */
cudaError_t sa_hop_fwd_launch(const sa_cuda_plan &plan, const sa_cuda_params &p, const sa_cuda_feat *f,
                              cudaStream_t st);
/* hopper/bwd_twopass.cu: dK/dV then dQ with the plan's warpgroups and grid order; reads p.D and p.lse2; a feature
   plan also f (its class table in the workspace, dbias zeroed by the caller). */
cudaError_t sa_hop_twopass_launch(const sa_cuda_plan &plan, const sa_cuda_params &p, const sa_cuda_feat *f,
                                  cudaStream_t st);
/* hopper/onepass128.cu, hopper/onepass64.cu: the one pass into the workspace regions at ws (16-byte aligned,
   after the common ones): memset of the ticket and semaphores, the kernel (cooperative when the plan says so),
   then sa_hop_dq_convert_kernel (H128) or sa_hop_dkdv_sum_kernel (H64 with a head split). A refused cooperative
   launch returns its error having enqueued nothing but the memset, so the caller can run the two passes instead. */
cudaError_t sa_hop_onepass_launch(const sa_cuda_plan &plan, const sa_cuda_params &p, void *ws, cudaStream_t st);

#endif /* SA_CUDA_LAUNCH_H */
