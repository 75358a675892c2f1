/*
 * hopper_fwd.cuh — the sm_90a forward fast path (hopper_fwd.cu), called by sa_cuda_attn_fwd before the
 * portable kernel.
 */
#ifndef SA_HOPPER_FWD_CUH
#define SA_HOPPER_FWD_CUH

#include "cuda_common.cuh"

/* Launches the Hopper forward on st when the call is inside its validated scope (see hopper_fwd.cu) and
   sets *used = 1; otherwise launches nothing, sets *used = 0 and returns cudaSuccess (the caller then runs
   the portable kernel). bf16: the dtype is SA_BF16. */
cudaError_t sa_hopper_fwd_try(const sa_cuda_params &p, int bf16, cudaStream_t st, int *used);

#endif /* SA_HOPPER_FWD_CUH */
