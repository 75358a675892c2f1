/*
 * cuda_attn.cu — the CUDA backend's entry points (declared in sa_internal.h): what it supports, the
 * parameter block, the backward workspace layout, and error translation. The kernels live in
 * cuda_fwd.cu and cuda_bwd.cu (portable) and hopper_fwd.cu, hopper_bwd.cu, hopper_bwd1.cu (sm_90a fast
 * paths); the tile table in cuda_common.cuh.
 *
 * Every call only enqueues work on the caller's stream: no allocation, no synchronisation, no host
 * read of device data (lengths and segment ids are read by the kernels), so it is CUDA-graph safe.
 */
#include <stdint.h>

#include "cuda_common.cuh"
#include "hopper_bwd.cuh"
#include "hopper_bwd1.cuh"
#include "hopper_fwd.cuh"
#include "sa_internal.h"

extern "C" int sa_cuda_available(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); /* clear the sticky "no device" error so later calls start clean */
    return 0;
  }
  return n > 0;
}

extern "C" int sa_cuda_is_device_pointer(const void *p) {
  if (!p) return 0;
  cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged;
}

int sa_cuda_padded_dim(int64_t h) { return h <= 32 ? 32 : h <= 64 ? 64 : h <= 128 ? 128 : 256; }

static int sa_cuda_dim_ok(int64_t h) { return h == 16 || h == 32 || h == 64 || h == 96 || h == 128 || h == 192 || h == 256; }

/* cp.async moves 16 bytes: every tensor must start on a 16-byte boundary (cudaMalloc and XLA give 256). */
static sa_status sa_cuda_aligned(const void *ptr, const char *name) {
  if ((uintptr_t)ptr % 16 != 0)
    return sa_error(SA_ERR_UNSUPPORTED, "%s is not 16-byte aligned: the CUDA backend needs 16-byte aligned tensors", name);
  return SA_OK;
}

extern "C" sa_status sa_cuda_attn_supported(const sa_attn *a) {
  if (!sa_cuda_dim_ok(a->head_dim))
    return sa_error(SA_ERR_UNSUPPORTED, "head_dim %lld unsupported by CUDA backend: use 16, 32, 64, 96, 128, 192 or 256",
                    (long long)a->head_dim);
  if (!sa_cuda_dim_ok(a->v_head_dim))
    return sa_error(SA_ERR_UNSUPPORTED, "v_head_dim %lld unsupported by CUDA backend: use 16, 32, 64, 96, 128, 192 or 256",
                    (long long)a->v_head_dim);
  if (a->dtype == SA_F32)
    return sa_error(SA_ERR_UNSUPPORTED, "dtype SA_F32 unsupported by CUDA backend: use SA_F16 or SA_BF16 "
                    "(the tensor cores run 16-bit inputs; the Python layer falls back for f32)");
  /* lengths and key indices are 32-bit in the kernels; grid y, z are (kv head, batch) */
  if (a->q_len >= (1 << 30) || a->kv_len >= (1 << 30))
    return sa_error(SA_ERR_UNSUPPORTED, "q_len %lld / kv_len %lld unsupported by CUDA backend: must be < 2^30",
                    (long long)a->q_len, (long long)a->kv_len);
  if (a->q_len * (a->q_heads / a->kv_heads) >= ((int64_t)1 << 31))
    return sa_error(SA_ERR_UNSUPPORTED, "q_len * q_heads / kv_heads unsupported by CUDA backend: must be < 2^31");
  if (a->batch > 65535 || a->q_heads > 65535)
    return sa_error(SA_ERR_UNSUPPORTED, "batch %lld / q_heads %lld unsupported by CUDA backend: must be <= 65535",
                    (long long)a->batch, (long long)a->q_heads);
  if (!sa_cuda_available())
    return sa_error(SA_ERR_DEVICE, "backend SA_BACKEND_CUDA unavailable: no CUDA device found");
  sa_status s;
  if ((s = sa_cuda_aligned(a->q, "q")) != SA_OK || (s = sa_cuda_aligned(a->k, "k")) != SA_OK ||
      (s = sa_cuda_aligned(a->v, "v")) != SA_OK || (s = sa_cuda_aligned(a->out, "out")) != SA_OK)
    return s;
  return SA_OK;
}

static sa_cuda_params sa_cuda_params_of(const sa_attn *a) {
  sa_cuda_params p;
  memset(&p, 0, sizeof p);
  p.q = a->q; p.k = a->k; p.v = a->v; p.out = a->out; p.lse = a->lse;
  p.sinks = a->softmax == SA_SOFTMAX_LEARNABLE ? a->sinks : NULL;
  p.q_lens = a->q_lens; p.kv_lens = a->kv_lens;
  p.q_seg = a->q_segment_ids; p.kv_seg = a->kv_segment_ids;
  p.B = a->batch; p.T = a->q_len; p.S = a->kv_len; p.N = a->q_heads; p.K = a->kv_heads;
  p.G = a->q_heads / a->kv_heads; p.H = a->head_dim; p.Hv = a->v_head_dim;
  p.scale = sa_scale_of(a);
  p.scale_log2 = p.scale * SA_LOG2E;
  p.softmax = (int)a->softmax; p.causal = (int)a->causal;
  p.wl = a->window_left; p.wr = a->window_right; p.diag_offset = a->diag_offset;
  return p;
}

static sa_status sa_cuda_status(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return SA_OK;
  return sa_error(SA_ERR_DEVICE, "CUDA %s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static int sa_cuda_hd(const sa_attn *a) {
  return sa_cuda_padded_dim(a->head_dim > a->v_head_dim ? a->head_dim : a->v_head_dim);
}

static thread_local int sa_cuda_last_fwd = 0; /* per thread: concurrent callers never share it */

extern "C" int sa_cuda_last_fwd_kernel(void) { return sa_cuda_last_fwd; }

/* The sm_90a kernel when the call is inside its scope (hopper_fwd.cu), else the portable one. */
extern "C" sa_status sa_cuda_attn_fwd(const sa_attn *a, void *stream) {
  if (a->batch == 0 || a->q_len == 0) return SA_OK; /* nothing to write */
  sa_cuda_params p = sa_cuda_params_of(a);
  int hopper = 0;
  cudaError_t e = sa_hopper_fwd_try(p, a->dtype == SA_BF16, (cudaStream_t)stream, &hopper);
  if (!hopper) e = sa_cuda_fwd_launch(p, a->dtype == SA_BF16, sa_cuda_hd(a), (cudaStream_t)stream);
  sa_cuda_last_fwd = hopper ? 2 : 1;
  return sa_cuda_status(e, "forward launch");
}

/* Workspace: D [B, N, T] fp32, then the sink-gradient partials [B, N, ceil(T / 64)] fp32, then lse2
   [B, N, T] fp32 (read by the Hopper backward only, reserved always: 4 bytes per row, against the 2 * Hv
   bytes each of dout and out that the preprocess reads), each 256-byte aligned. Then, only when the shape is
   in the one-pass scope (sa_hopper_bwd1_in_scope, asked on the machine that runs the call: it reads the SM
   count), the one pass's regions (sa_hopper_bwd1_workspace): dq_acc [B, N, T, H] fp32 and the ticket + one
   semaphore per (b, head, 64 queries), 256-byte aligned: B4 T4096 N16 H128 adds 128 MiB + 16 KiB to the
   2 MiB + 16 KiB of the others (dq_acc is twice dq's bf16 bytes); at H64 with the head split (hopper_bwd3.cu)
   also fp32 partial dK, dV per split: gpt-oss (B1 S4096 K8, hs 2) adds 32 MiB.
   The same for both values of `deterministic`: the one pass orders its adds, the other kernels use no atomics. */

static size_t sa_cuda_bwd_common_ws(const sa_attn *a) {
  size_t rows = (size_t)a->batch * (size_t)a->q_heads * (size_t)a->q_len;
  size_t nqb = (size_t)((a->q_len + SA_PRE_ROWS - 1) / SA_PRE_ROWS);
  size_t parts = (size_t)a->batch * (size_t)a->q_heads * nqb;
  return 2 * sa_cuda_round256(rows * sizeof(float)) + sa_cuda_round256(parts * sizeof(float));
}

extern "C" size_t sa_cuda_attn_bwd_workspace_size(const sa_attn *a, int deterministic) {
  (void)deterministic;
  const sa_cuda_params p = sa_cuda_params_of(a); /* data pointers may be NULL: every alignment check takes it */
  const size_t one_pass = sa_hopper_bwd1_in_scope(p, a->dtype == SA_BF16) ? sa_hopper_bwd1_workspace(p) : 0;
  return sa_cuda_bwd_common_ws(a) + one_pass;
}

static thread_local int sa_cuda_last_bwd = 0; /* as sa_cuda_last_fwd */

extern "C" int sa_cuda_last_bwd_kernel(void) { return sa_cuda_last_bwd; }

/* Preprocess, then the sm_90a one pass when the call is inside its scope and the workspace holds its regions
   (hopper_bwd1.cu), else the sm_90a dK/dV and dQ when inside theirs (hopper_bwd.cu), else the portable ones,
   then the sink reduction: dsinks comes from the preprocess's partials either way. */
extern "C" sa_status sa_cuda_attn_bwd(const sa_attn *a, const sa_attn_grad *g, void *workspace,
                                      size_t workspace_size, void *stream) {
  sa_status s;
  if ((s = sa_cuda_aligned(g->dout, "dout")) != SA_OK || (s = sa_cuda_aligned(g->dq, "dq")) != SA_OK ||
      (s = sa_cuda_aligned(g->dk, "dk")) != SA_OK || (s = sa_cuda_aligned(g->dv, "dv")) != SA_OK)
    return s;
  sa_cuda_params p = sa_cuda_params_of(a);
  size_t rows = (size_t)a->batch * (size_t)a->q_heads * (size_t)a->q_len;
  p.dout = g->dout; p.dlse = g->dlse; p.dq = g->dq; p.dk = g->dk; p.dv = g->dv; p.dsinks = g->dsinks;
  p.D = (float *)workspace;
  p.dsink_part = (float *)((char *)workspace + sa_cuda_round256(rows * sizeof(float)));
  p.nqb = (a->q_len + SA_PRE_ROWS - 1) / SA_PRE_ROWS;
  size_t parts = (size_t)a->batch * (size_t)a->q_heads * (size_t)p.nqb;
  /* workspace_size: checked against sa_cuda_attn_bwd_workspace_size by sa_attn_bwd; the one pass checks it
     again for its own regions */
  if (rows == 0 && a->batch * a->kv_len == 0 && !g->dsinks) return SA_OK; /* nothing to write */
  const int bf16 = a->dtype == SA_BF16;
  const cudaStream_t st = (cudaStream_t)stream;
  if (sa_hopper_bwd_in_scope(p, bf16)) /* the preprocess writes lse2 only for the Hopper kernels */
    p.lse2 = (float *)((char *)p.dsink_part + sa_cuda_round256(parts * sizeof(float)));
  int hopper = 0;
  cudaError_t e = sa_cuda_bwd_pre_launch(p, bf16, st);
  const size_t common = sa_cuda_bwd_common_ws(a); /* the one pass's regions follow; never past workspace_size */
  if (e == cudaSuccess && p.lse2 && workspace_size >= common)
    e = sa_hopper_bwd1_try(p, bf16, (char *)workspace + common, workspace_size - common, st, &hopper);
  if (e == cudaSuccess && p.lse2 && !hopper) e = sa_hopper_bwd_try(p, bf16, st, &hopper);
  if (e == cudaSuccess && !hopper) e = sa_cuda_bwd_dkdv_dq_launch(p, bf16, sa_cuda_hd(a), st);
  if (e == cudaSuccess) e = sa_cuda_bwd_dsink_launch(p, st);
  sa_cuda_last_bwd = hopper ? 2 : 1;
  return sa_cuda_status(e, "backward launch");
}
