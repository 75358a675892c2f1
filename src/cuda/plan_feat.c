/*
 * plan_feat.c — the CUDA backend's feature plans (hopper.fwd.features, hopper.bwd.twopass.features and their TMA
 * twins): which calls with a bias, a mask array, positions or a soft-cap they take, on the plain Hopper schedules
 * (plan.c), and the refusal, naming the input, of every other such call (sa_cuda_feature_check,
 * sa_cuda_feature_device). docs/hopper.md, "Feature kernels".
 */
#include <stdio.h>
#include <string.h>

#include "feat.h"
#include "hopper/tiles.h"
#include "plan.h"
#include "plan_ctx.h"
#include "sa_internal.h"
#include "sa_plan.h"

/* What the Hopper feature kernels take beyond the plain scope (hopper/fwd_feat.cuh, bwd_feat.cuh, feat_class.cu):
   position-mask kinds 0-3 (no segment ids), kv_len <= 65536 (the class list of a work tile in its Q slot), a mask
   of one row per query and key ([B or 1, N or 1, T, S]: the pre-pass classifies 64-row blocks), and 16-byte aligned
   bias, mask and positions (pair loads). */
static const char *sa_feat_hop_scope(const sa_pctx *c) {
  const sa_attn *a = c->a;
  if (c->hop_why[0]) return c->hop_why;
  if (c->segs) return "the Hopper feature kernels take no segment ids";
  if (c->S > SA_HOP_FEAT_MAX_KV_LEN) return "the Hopper feature kernels take kv_len <= 65536";
  if (a->mask && (a->mask_dims[2] != c->T || a->mask_dims[3] != c->S))
    return "the Hopper feature kernels take a mask of [B or 1, N or 1, q_len, kv_len]";
  if ((a->bias && !sa_aligned16(a->bias)) || (a->mask && !sa_aligned16(a->mask)) ||
      (a->q_positions && (!sa_aligned16(a->q_positions) || !sa_aligned16(a->kv_positions))))
    return "bias, mask or positions not 16-byte aligned";
  return NULL;
}

/* The class table's extents (feat.h): the batch's when the mask or the positions vary with it, the heads' when the
   mask does; 0 without a mask or positions. */
static void sa_feat_classes(const sa_pctx *c, sa_cuda_plan *p) {
  const sa_attn *a = c->a;
  if (!a->mask && !a->q_positions) return;
  p->cls_cb = (a->mask && a->mask_dims[0] > 1) || a->q_positions ? c->B : 1;
  p->cls_cn = a->mask && a->mask_dims[1] > 1 ? c->N : 1;
}

/* hopper.fwd.features: the plain forward's schedule for the call's kind, one work tile a CTA (heaviest first) when
   the classes make the work of a work tile depend on the data, and the batch fastest when a bias or mask is shared
   by the batch. */
const char *sa_fwd_hopper_feat(const sa_pctx *c, sa_cuda_plan *p) {
  const sa_attn *a = c->a;
  const int lists = a->mask || a->q_positions;
  const char *why = sa_feat_hop_scope(c);
  const char *sched = why ? NULL : sa_fwd_hopper_sched(c, p, lists ? 0 : sa_fwd_persist_default(c), 1);
  if (why) sa_plan_init(p, c, "hopper.fwd.features", SA_CUDA_FWD_HOPPER);
  p->name = "hopper.fwd.features";
  p->feat = 1;
  if (why || sched) return why ? why : sched;
  sa_feat_classes(c, p);
  p->b_fast = c->B > 1 && ((a->bias && a->bias_dims[0] == 1) || (a->mask && a->mask_dims[0] == 1));
  p->reason = lists ? "sm_90a forward with bias / mask / positions / soft-cap; tiles classed by a pre-pass, empty ones "
                      "skipped, full ones untested"
                    : "sm_90a forward with bias / soft-cap";
  return NULL;
}

/* The TMA feature plans' map of a bias: its dims {S, T, heads, batches}, so a bias of [B or 1, N or 1, T, S]. */
static const char *sa_feat_tma_bias_why(const sa_pctx *c) {
  const sa_attn *a = c->a;
  return a->bias && (a->bias_dims[2] != c->T || a->bias_dims[3] != c->S)
             ? "the TMA feature kernels take a bias of [B or 1, N or 1, q_len, kv_len]"
             : NULL;
}

/* hopper.fwd.features.tma: hopper.fwd.features with each key tile's bias (or, without a bias, the mask of its partial
   tiles) landed by TMA into a feature stage beside K (hopper/fwd_feat.cuh, FEAT 2), one Q slot. The map needs a bias
   of [B or 1, N or 1, T, S]; an f32 bias tile (64 KiB) fits the stage at H64 only. */
const char *sa_fwd_hopper_feat_tma(const sa_pctx *c, sa_cuda_plan *p) {
  const sa_attn *a = c->a;
  const char *why = sa_fwd_hopper_feat(c, p);
  p->name = "hopper.fwd.features.tma";
  if (why || (why = sa_feat_tma_bias_why(c))) return why;
  if (a->bias && a->bias_dtype == SA_F32 && SA_HOP_FWD_TMA_FS(c->H) < SA_HOP_FWD_FEAT_BM * SA_HOP_FWD_BN * 4)
    return "an f32 bias tile does not fit the feature stage at head_dim 128";
  if (SA_HOP_FWD_TMA_SMEM(c->H) > c->dev->smem_optin) return "its shared memory exceeds the device's opt-in limit";
  p->feat = 2;
  p->qslots = SA_HOP_FWD_TMA_QSLOTS;
  p->reason =
      "sm_90a forward with bias / mask / positions / soft-cap; the bias (or a partial tile's mask) by TMA "
      "beside K";
  return NULL;
}

/* hopper.bwd.twopass.features: the two passes with 2 consumer warpgroups each, the class table in the workspace
   after the common regions, dbias from the dQ kernel (one launch per contributor of a bias shared by the batch or
   the heads). A bias shared by the query rows ([., ., 1, S]) would need a sum across dQ's CTAs: not taken. */
const char *sa_bwd_twopass_feat(const sa_pctx *c, sa_cuda_plan *p) {
  const sa_attn *a = c->a;
  const char *why = sa_feat_hop_scope(c);
  if (!why && a->bias && a->bias_dims[2] == 1 && c->T > 1)
    why = "the Hopper feature kernels take no bias shared by the query rows (its dbias sums across CTAs)";
  const char *sched = why ? NULL : sa_bwd_twopass(c, p, 2, 2);
  if (why) sa_plan_init(p, c, "hopper.bwd.twopass.features", SA_CUDA_BWD_TWOPASS);
  p->name = "hopper.bwd.twopass.features";
  p->feat = 1;
  if (why || sched) return why ? why : sched;
  sa_feat_classes(c, p);
  if (p->cls_cb) {
    p->off_cls = p->ws;
    p->ws += sa_r256((size_t)(p->cls_cb * p->cls_cn * sa_cdiv(c->T, 64) * sa_cdiv(c->S, 64)));
  }
  p->reason = "sm_90a dK/dV then dQ with bias / mask / positions / soft-cap, dbias in a fixed order";
  return NULL;
}

/* hopper.bwd.twopass.features.tma: hopper.bwd.twopass.features with each CTA's slice of the class table in shared
   memory (an empty tile costs a shared load, no global one) and each streamed tile's bias landed by TMA beside it
   (hopper/bwd_feat.cuh, FEAT 2). The map needs a bias of [B or 1, N or 1, T, S]; the dK/dV slice, G heads x T / 64
   query blocks, at most SA_HOP_BWD_TMA_CLS bytes. */
const char *sa_bwd_twopass_feat_tma(const sa_pctx *c, sa_cuda_plan *p) {
  const char *why = sa_bwd_twopass_feat(c, p);
  p->name = "hopper.bwd.twopass.features.tma";
  if (why || (why = sa_feat_tma_bias_why(c))) return why;
  if (p->cls_cb && c->G * (c->T / 64) > SA_HOP_BWD_TMA_CLS)
    return "the class slice of a key block (G x q_len / 64 bytes) exceeds its shared memory";
  if (SA_HOP_BWD_DKDV_TMA_SMEM(c->H) > c->dev->smem_optin || SA_HOP_BWD_DQ_TMA_SMEM(c->H) > c->dev->smem_optin)
    return "its shared memory exceeds the device's opt-in limit";
  p->feat = 2;
  p->reason =
      "sm_90a dK/dV then dQ with bias / mask / positions / soft-cap, classes in shared memory, the bias by "
      "TMA, dbias in a fixed order";
  return NULL;
}

sa_cuda_feat sa_cuda_feat_make(const sa_attn *a) {
  sa_cuda_feat f;
  memset(&f, 0, sizeof f);
  if (sa_dims_set(a->bias_dims)) {
    const sa_bcast bs = sa_bcast_of(a->bias_dims);
    f.bias = a->bias;
    f.bias_dtype = (int)a->bias_dtype;
    f.bias_b = bs.b, f.bias_n = bs.n, f.bias_t = bs.t, f.bias_s = (int)bs.s;
  }
  if (sa_dims_set(a->mask_dims)) {
    const sa_bcast ms = sa_bcast_of(a->mask_dims);
    f.mask = a->mask;
    f.mask_b = ms.b, f.mask_n = ms.n, f.mask_t = ms.t, f.mask_s = (int)ms.s;
  }
  f.q_pos = a->q_positions;
  f.kv_pos = a->kv_positions;
  f.pos_causal = a->causal != SA_CAUSAL_NONE;
  f.pos_wl = a->window_left, f.pos_wr = a->window_right, f.pos_diag = a->diag_offset;
  f.scale = sa_scale_of(a);
  if (a->logits_soft_cap > 0.0f) {
    f.cap = a->logits_soft_cap;
    f.cap_inv = 1.0f / f.cap;
    f.cap_l2 = f.cap * 1.4426950408889634f;
    f.cap_l2_inv = 1.0f / f.cap_l2;
  }
  return f;
}

/* Why the verified feature plans cannot take a call with feature inputs on `dev` (both directions: a caller asking
   once, as Python does, runs the backward with the forward's plan family); NULL when they can. The reason goes into
   buf, prefixed by the plan that refuses. */
const char *sa_feature_why(const sa_attn *a, const sa_cuda_device *dev, char *buf, size_t n) {
  for (int which = SA_PLAN_FWD; which <= SA_PLAN_BWD; ++which) {
    sa_pctx c;
    sa_pctx_make(&c, a, which, dev);
    sa_cuda_plan p;
    const char *why = which == SA_PLAN_FWD ? sa_fwd_hopper_feat(&c, &p) : sa_bwd_twopass_feat(&c, &p);
    if (why) {
      snprintf(buf, n, "plan %s: %s", p.name, why);
      return buf;
    }
  }
  return NULL;
}

/* Any sm_90a device with the H100 / H200 shared memory: what the device-free check assumes (the device's own rules
   are sa_cuda_feature_device's). */
static const sa_cuda_device sa_feat_any_sm90a = {9, 0, 132, 132, 232448, 233472, 1, 0, "an sm_90a device"};

sa_status sa_feature_refuse(const char *what, const char *why) {
  return sa_error(SA_ERR_UNSUPPORTED,
                  "%s unsupported by the CUDA backend for this call (%s); SA_BACKEND_CPU and SA_BACKEND_REF take it, "
                  "on host memory",
                  what, why);
}

sa_status sa_cuda_feature_check(const sa_attn *a, int listing) {
  const char *what = sa_feature_of(a);
  if (!what || listing) return SA_OK;
  if (sa_plan_forced(SA_PLAN_FWD) || sa_plan_forced(SA_PLAN_BWD)) return SA_OK; /* the pick names what is wrong */
  char buf[224];
  const char *why = sa_feature_why(a, &sa_feat_any_sm90a, buf, sizeof buf);
  return why ? sa_feature_refuse(what, why) : SA_OK;
}

sa_status sa_cuda_feature_device(const sa_attn *a, const sa_cuda_device *dev) {
  const char *what = sa_feature_of(a);
  if (!what || sa_plan_forced(SA_PLAN_FWD) || sa_plan_forced(SA_PLAN_BWD)) return SA_OK;
  char buf[224];
  const char *why = sa_feature_why(a, dev, buf, sizeof buf);
  return why ? sa_feature_refuse(what, why) : SA_OK;
}
