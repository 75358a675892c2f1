/*
 * hopper_bwd.cuh — the sm_90a backward fast path (hopper_bwd.cu): dK/dV and dQ, run by sa_cuda_attn_bwd
 * between the portable preprocess and the portable sink reduction (cuda_bwd.cu) in place of the portable
 * dK/dV and dQ kernels.
 */
#ifndef SA_HOPPER_BWD_CUH
#define SA_HOPPER_BWD_CUH

#include "cuda_common.cuh"

/* Whether the call is inside the validated scope (see hopper_bwd.cu), workspace aside: the caller asks
   before the preprocess, so that it writes lse2 only when the Hopper kernels will read it. */
bool sa_hopper_bwd_in_scope(const sa_cuda_params &p, int bf16);

/* Launches the Hopper dK/dV and dQ kernels on st when the call is inside that scope, p.lse2 and p.D are set
   and 16-byte aligned, and sets *used = 1; otherwise launches nothing, sets *used = 0 and returns
   cudaSuccess (the caller then runs the portable dK/dV and dQ). Reads p.D and p.lse2, so the preprocess
   must be enqueued on st before it. bf16: the dtype is SA_BF16. */
cudaError_t sa_hopper_bwd_try(const sa_cuda_params &p, int bf16, cudaStream_t st, int *used);

#endif /* SA_HOPPER_BWD_CUH */
