/*
 * attn.cu — the CUDA backend's entry points (sa_internal.h): what it supports, the parameter block, the
 * backward workspace layout, and the dispatch of a call to the plan plan.c picks for it. The kernel families
 * are in portable/, hopper/ and decode/; docs/hopper.md, "plans", lists them.
 *
 * Every call only enqueues work on the caller's stream: no allocation, no synchronisation, no host read of
 * device data (lengths and segment ids are read by the kernels), so it is CUDA-graph safe.
 */
#include <stdint.h>
#include <stdio.h>

#include "launch.h"
#include "sa_internal.h"
#include "sa_plan.h"

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

static int sa_cuda_dim_ok(int64_t h) {
  return h == 16 || h == 32 || h == 64 || h == 96 || h == 128 || h == 192 || h == 256;
}

/* cp.async moves 16 bytes: every tensor must start on a 16-byte boundary (cudaMalloc and XLA give 256). */
static sa_status sa_cuda_aligned(const void *ptr, const char *name) {
  if ((uintptr_t)ptr % 16 != 0)
    return sa_error(SA_ERR_UNSUPPORTED, "%s is not 16-byte aligned: the CUDA backend needs 16-byte aligned tensors",
                    name);
  return SA_OK;
}

extern "C" sa_status sa_cuda_attn_supported(const sa_attn *a) {
  if (!sa_cuda_dim_ok(a->head_dim))
    return sa_error(SA_ERR_UNSUPPORTED,
                    "head_dim %lld unsupported by CUDA backend: use 16, 32, 64, 96, 128, 192 or 256",
                    (long long)a->head_dim);
  if (!sa_cuda_dim_ok(a->v_head_dim))
    return sa_error(SA_ERR_UNSUPPORTED,
                    "v_head_dim %lld unsupported by CUDA backend: use 16, 32, 64, 96, 128, 192 or 256",
                    (long long)a->v_head_dim);
  /* lengths and key indices are 32-bit in the kernels; grid y, z are (kv head, batch) */
  if (a->q_len >= (1 << 30) || a->kv_len >= (1 << 30))
    return sa_error(SA_ERR_UNSUPPORTED, "q_len %lld / kv_len %lld unsupported by CUDA backend: must be < 2^30",
                    (long long)a->q_len, (long long)a->kv_len);
  if (a->q_len * (a->q_heads / a->kv_heads) >= ((int64_t)1 << 31))
    return sa_error(SA_ERR_UNSUPPORTED, "q_len * q_heads / kv_heads unsupported by CUDA backend: must be < 2^31");
  if (a->batch > 65535 || a->q_heads > 65535)
    return sa_error(SA_ERR_UNSUPPORTED, "batch %lld / q_heads %lld unsupported by CUDA backend: must be <= 65535",
                    (long long)a->batch, (long long)a->q_heads);
  const sa_cuda_device *dev = sa_cuda_available() ? sa_cuda_device_current() : nullptr;
  if (!dev) return sa_error(SA_ERR_DEVICE, "backend SA_BACKEND_CUDA unavailable: no CUDA device found");
  if (dev->cc_major < 8)
    return sa_error(SA_ERR_UNSUPPORTED, "device '%s' is sm_%d%d: the CUDA backend needs sm_80 or newer", dev->name,
                    dev->cc_major, dev->cc_minor);
  sa_status s;
  if ((s = sa_cuda_aligned(a->q, "q")) != SA_OK || (s = sa_cuda_aligned(a->k, "k")) != SA_OK ||
      (s = sa_cuda_aligned(a->v, "v")) != SA_OK || (s = sa_cuda_aligned(a->out, "out")) != SA_OK)
    return s;
  return sa_cuda_feature_device(a, dev); /* bias, mask, positions, soft-cap: the feature plans on this device */
}

static sa_cuda_params sa_cuda_params_of(const sa_attn *a) {
  sa_cuda_params p;
  memset(&p, 0, sizeof p);
  p.q = a->q;
  p.k = a->k;
  p.v = a->v;
  p.out = a->out;
  p.lse = a->lse;
  p.sinks = a->softmax == SA_SOFTMAX_LEARNABLE ? a->sinks : NULL;
  p.q_lens = a->q_lens;
  p.kv_lens = a->kv_lens;
  p.q_seg = a->q_segment_ids;
  p.kv_seg = a->kv_segment_ids;
  p.B = a->batch;
  p.T = a->q_len;
  p.S = a->kv_len;
  p.N = a->q_heads;
  p.K = a->kv_heads;
  p.G = a->q_heads / a->kv_heads;
  p.H = a->head_dim;
  p.Hv = a->v_head_dim;
  p.scale = sa_scale_of(a);
  p.scale_log2 = p.scale * SA_LOG2E;
  p.softmax = (int)a->softmax;
  p.causal = (int)a->causal;
  p.wl = a->window_left;
  p.wr = a->window_right;
  p.diag_offset = a->diag_offset;
  if (a->q_positions) { /* causal and window compare the positions (sa_cuda_feat), not the indices */
    p.causal = 0;
    p.wl = p.wr = -1;
    p.diag_offset = 0;
  }
  return p;
}

static sa_status sa_cuda_status(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return SA_OK;
  return sa_error(SA_ERR_DEVICE, "CUDA %s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* The plan of this call (forced or default) on the current context's device. */
static sa_status sa_cuda_plan_of(const sa_attn *a, int which, size_t ws_avail, sa_cuda_plan *plan) {
  sa_status s = sa_plan_env_check();
  if (s != SA_OK) return s;
  const sa_cuda_device *dev = sa_cuda_device_current();
  if (!dev) return sa_error(SA_ERR_DEVICE, "backend SA_BACKEND_CUDA unavailable: the device record cannot be read");
  return sa_cuda_plan_pick(a, which, dev, sa_plan_forced(which), ws_avail, plan);
}

static void sa_cuda_plan_note(int which, const sa_cuda_plan &plan) {
  char desc[384];
  sa_cuda_plan_describe(&plan, desc, sizeof desc);
  sa_plan_record(which, desc);
}

extern "C" sa_status sa_cuda_attn_fwd(const sa_attn *a, void *stream) {
  sa_cuda_plan plan;
  sa_status s = sa_cuda_plan_of(a, SA_PLAN_FWD, (size_t)-1, &plan);
  if (s != SA_OK) return s;
  sa_cuda_plan_note(SA_PLAN_FWD, plan);
  if (a->batch == 0 || a->q_len == 0) return SA_OK; /* nothing to write */
  const sa_cuda_params p = sa_cuda_params_of(a);
  const sa_cuda_feat f = sa_cuda_feat_make(a);
  const cudaStream_t st = (cudaStream_t)stream;
  const cudaError_t e = plan.family == SA_CUDA_FWD_HOPPER
                            ? sa_hop_fwd_launch(plan, p, &f, st)
                            : sa_cuda_fwd_launch(p, plan.feat ? &f : nullptr, (int)a->dtype, plan.hd, st);
  return sa_cuda_status(e, "forward launch");
}

/* Workspace: D [B, N, T] fp32, then the sink-gradient partials [B, N, ceil(T / 64)] fp32, then lse2 [B, N, T]
   fp32 (read by the Hopper kernels; reserved always: 4 bytes a row against the 2 Hv bytes each of dout and out
   that the preprocess reads), each 256-byte aligned (sa_cuda_bwd_common_ws); then the one pass's regions when
   its plan runs: dq_acc [B, N, T, H] fp32, the ticket and the semaphores, and at H64 with a head split the fp32
   partial dK, dV (B4 T4096 N16 H128 adds 128 MiB to the common 2 MiB; gpt-oss adds 32 MiB at hs 8). Every plan
   is bitwise reproducible: the one pass orders its adds, the other kernels use no atomics. */
extern "C" size_t sa_cuda_attn_bwd_workspace_size(const sa_attn *a) {
  sa_cuda_plan plan;
  const sa_cuda_device *dev = sa_cuda_available() ? sa_cuda_device_current() : nullptr;
  if (!dev) return sa_cuda_bwd_common_ws(a);
  if (sa_plan_env_check() != SA_OK ||
      sa_cuda_plan_pick(a, SA_PLAN_BWD, dev, sa_plan_forced(SA_PLAN_BWD), (size_t)-1, &plan) != SA_OK)
    return 0; /* the call reports why */
  return plan.ws;
}

/* The one pass, or the two passes when the driver refuses its cooperative launch (another stream's kernels or
   a smaller context hold SMs its CTAs need co-resident: docs/hopper.md, "progress"). The two passes need only
   the common regions, which the one pass's workspace holds. */
static cudaError_t sa_cuda_onepass_or_twopass(const sa_attn *a, sa_cuda_plan *plan, const sa_cuda_params &p, char *ws,
                                              cudaStream_t st) {
  cudaError_t e = sa_hop_onepass_launch(*plan, p, ws + sa_cuda_bwd_common_ws(a), st);
  if (!plan->cooperative || (e != cudaErrorCooperativeLaunchTooLarge && e != cudaErrorNotSupported)) return e;
  cudaGetLastError();
  sa_cuda_plan two[16];
  const int n = sa_cuda_plans(a, SA_PLAN_BWD, sa_cuda_device_current(), (size_t)-1, two, 16);
  for (int i = 0; i < n && i < 16; ++i)
    if (two[i].family == SA_CUDA_BWD_TWOPASS) {
      const char *refused = plan->name;
      *plan = two[i];
      snprintf(plan->note, sizeof plan->note, "the cooperative launch of %s was refused (%s): two passes", refused,
               cudaGetErrorName(e));
      return sa_hop_twopass_launch(*plan, p, nullptr, st);
    }
  return e;
}

/* Preprocess, then the plan's dK/dV and dQ (Hopper one pass, Hopper two passes or portable), then the sink
   reduction: dsinks comes from the preprocess's partials whichever family ran. */
extern "C" sa_status sa_cuda_attn_bwd(const sa_attn *a, const sa_attn_grad *g, void *workspace, size_t workspace_size,
                                      void *stream) {
  sa_status s;
  if ((s = sa_cuda_aligned(g->dout, "dout")) != SA_OK || (s = sa_cuda_aligned(g->dq, "dq")) != SA_OK ||
      (s = sa_cuda_aligned(g->dk, "dk")) != SA_OK || (s = sa_cuda_aligned(g->dv, "dv")) != SA_OK)
    return s;
  const size_t common = sa_cuda_bwd_common_ws(a);
  if (workspace_size < common || (common && !workspace)) {
    sa_cuda_plan any; /* no plan takes the call whatever the workspace: that is the reason to give */
    if ((s = sa_cuda_plan_of(a, SA_PLAN_BWD, (size_t)-1, &any)) != SA_OK) return s;
    return sa_error(SA_ERR_INVALID,
                    "workspace_size %zu too small: this call needs %zu bytes "
                    "(sa_attn_bwd_workspace_size)",
                    workspace_size, any.ws);
  }
  if ((uintptr_t)workspace % 16 != 0)
    return sa_error(SA_ERR_INVALID, "workspace is not 16-byte aligned: the CUDA backward needs 16-byte alignment");
  sa_cuda_plan plan;
  if ((s = sa_cuda_plan_of(a, SA_PLAN_BWD, workspace ? workspace_size : 0, &plan)) != SA_OK) return s;
  sa_cuda_params p = sa_cuda_params_of(a);
  const size_t rows = (size_t)a->batch * (size_t)a->q_heads * (size_t)a->q_len;
  p.dout = g->dout;
  p.dlse = g->dlse;
  p.dq = g->dq;
  p.dk = g->dk;
  p.dv = g->dv;
  p.dsinks = g->dsinks;
  p.D = (float *)workspace;
  p.dsink_part = (float *)((char *)workspace + sa_cuda_round256(rows * sizeof(float)));
  p.nqb = (a->q_len + SA_PRE_ROWS - 1) / SA_PRE_ROWS;
  const size_t parts = (size_t)a->batch * (size_t)a->q_heads * (size_t)p.nqb;
  const cudaStream_t st = (cudaStream_t)stream;
  const size_t dbias_bytes = g->dbias ? (size_t)sa_dims_count(a->bias_dims) * sizeof(float) : 0;
  /* dbias: zeroed here, then every pair's dS added in a fixed order (the feature plans' dQ; zeros where no pair
     reads an element, and with no rows at all) */
  if (dbias_bytes && cudaMemsetAsync(g->dbias, 0, dbias_bytes, st) != cudaSuccess)
    return sa_cuda_status(cudaGetLastError(), "dbias memset");
  if (rows == 0 && a->batch * a->kv_len == 0 && !g->dsinks) { /* nothing to write */
    sa_cuda_plan_note(SA_PLAN_BWD, plan);
    return SA_OK;
  }
  const int dt = (int)a->dtype;
  if (plan.family != SA_CUDA_BWD_PORTABLE) /* the preprocess writes lse2 only for the Hopper kernels */
    p.lse2 = (float *)((char *)p.dsink_part + sa_cuda_round256(parts * sizeof(float)));
  cudaError_t e = sa_cuda_bwd_pre_launch(p, dt, st);
  if (e == cudaSuccess) {
    if (plan.family == SA_CUDA_BWD_ONEPASS) e = sa_cuda_onepass_or_twopass(a, &plan, p, (char *)workspace, st);
    else if (plan.family == SA_CUDA_BWD_TWOPASS) {
      sa_cuda_feat f = sa_cuda_feat_make(a);
      if (plan.feat && plan.cls_cb) { /* the class table of 64 x 64 blocks, after the common regions */
        const int64_t nrb = (a->q_len + 63) / 64, nkb = (a->kv_len + 63) / 64;
        f.cls = (uint8_t *)workspace + plan.off_cls;
        f.cls_t = nkb;
        f.cls_n = plan.cls_cn > 1 ? nrb * nkb : 0;
        f.cls_b = plan.cls_cb > 1 ? plan.cls_cn * nrb * nkb : 0;
      }
      if (g->dbias) {
        const sa_bcast bs = sa_bcast_of(a->bias_dims);
        f.dbias_out = g->dbias;
        f.dbias_b = bs.b, f.dbias_n = bs.n, f.dbias_t = bs.t, f.dbias_s = (int)bs.s;
      }
      e = sa_hop_twopass_launch(plan, p, &f, st);
    } else {
      const sa_cuda_feat f = sa_cuda_feat_make(a);
      e = sa_cuda_bwd_dkdv_dq_launch(p, plan.feat ? &f : nullptr, dt, plan.hd, st);
    }
  }
  if (e == cudaSuccess) e = sa_cuda_bwd_dsink_launch(p, st);
  sa_cuda_plan_note(SA_PLAN_BWD, plan);
  return sa_cuda_status(e, "backward launch");
}
