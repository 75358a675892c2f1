/*
 * hopper_bwd1.cuh — the sm_90a one-pass backward (hopper_bwd1.cu, dev/hopper_bwd_05): dK, dV and dQ in one
 * kernel, deterministic; run by sa_cuda_attn_bwd between the preprocess and the sink reduction in place of the
 * two passes of hopper_bwd.cu where it was measured faster (H128 here; H64 in hopper_bwd3.cu; see each for the
 * scope).
 */
#ifndef SA_HOPPER_BWD1_CUH
#define SA_HOPPER_BWD1_CUH

#include "cuda_common.cuh"
#include "hopper_bwd.cuh"

/* Whether the one pass takes the call, workspace aside (includes sa_hopper_bwd_in_scope; queries the device: SM
   count and compute capability). sa_cuda_attn_bwd_workspace_size asks it with the same shape to size the
   workspace, so a call in scope finds its regions there. */
bool sa_hopper_bwd1_in_scope(const sa_cuda_params &p, int bf16);

/* Bytes the one pass needs after the common workspace regions: dq_acc [B, N, T, H] fp32, then the ticket and the
   semaphores (1 + B N T / 64 ints), each rounded up to 256 bytes. */
size_t sa_hopper_bwd1_workspace(const sa_cuda_params &p);

/* Launches memset (ticket, semaphores; not dq_acc), one-pass kernel and (H128) dq convert on st when the call is in
   scope, p.lse2 and p.D are set and 16-byte aligned, ws (the one pass's regions) is 16-byte aligned (TMA) and
   ws_bytes >= sa_hopper_bwd1_workspace(p), and sets *used = 1. Otherwise launches nothing, sets *used = 0 and
   returns cudaSuccess (the caller then runs the two passes). Reads p.D and p.lse2: the preprocess must be enqueued
   on st before it. */
cudaError_t sa_hopper_bwd1_try(const sa_cuda_params &p, int bf16, void *ws, size_t ws_bytes, cudaStream_t st,
                               int *used);

/* The same three for the H64 one pass (hopper_bwd3.cu: three consumer warpgroups, 192 keys a CTA); the functions
   above hand an H64 call to them. */
bool sa_hopper_bwd3_in_scope(const sa_cuda_params &p, int bf16);
size_t sa_hopper_bwd3_workspace(const sa_cuda_params &p);
cudaError_t sa_hopper_bwd3_try(const sa_cuda_params &p, int bf16, void *ws, size_t ws_bytes, cudaStream_t st,
                               int *used);

#endif /* SA_HOPPER_BWD1_CUH */
