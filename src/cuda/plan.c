/*
 * plan.c — the CUDA backend's plans (plan.h): which kernels a call runs, on which grid, with how much
 * workspace, and why. Pure C over the problem and a device record, so the CPU tests run it on a mocked H200
 * (tests/test_plan.c) and the launch code (attn.cu) only follows what it says. docs/hopper.md, "plans";
 * the schedules and their measurements in docs/hopper.md. The feature plans (bias, mask array, positions,
 * soft-cap) are plan_feat.c's; what both files share, plan_ctx.h. Larger than 600 lines: sa_collect's offer order is
 * every direction's default order, so it stays beside the plain plans and their portable variants (float32, features)
 * that it offers, which share their static tile rules.
 */
#include "plan.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "feat.h"
#include "hopper/mask.h"
#include "plan_ctx.h"
#include "hopper/tiles.h"
#include "sa_internal.h"
#include "sa_plan.h"

const char *const sa_cuda_plan_names[] = {"cuda.fwd.portable",
                                          "hopper.fwd.persistent",
                                          "hopper.fwd.onetile",
                                          "hopper.fwd.persistent.narrow",
                                          "cuda.bwd.portable",
                                          "hopper.bwd.twopass.wg2",
                                          "hopper.bwd.twopass.kv3",
                                          "hopper.bwd.twopass.dq3",
                                          "hopper.bwd.twopass.wg3",
                                          "hopper.bwd.onepass",
                                          "hopper.bwd.onepass.plain",
                                          "hopper.bwd.onepass.narrow",
                                          "cuda.decode.pipe",
                                          "cuda.decode.register",
                                          "cuda.decode.mma",
                                          "hopper.fwd.features",
                                          "hopper.bwd.twopass.features",
                                          "hopper.fwd.features.tma",
                                          "hopper.bwd.twopass.features.tma",
                                          "hopper.bwd.onepass.wait",
                                          "hopper.bwd.onepass.narrow.wait",
                                          "cuda.decode.mma.half",
                                          "cuda.decode.mma.x2",
                                          "cuda.decode.mma.x4",
                                          "cuda.fwd.portable.f32",
                                          "cuda.bwd.portable.f32",
                                          "cuda.fwd.portable.features",
                                          "cuda.bwd.portable.features",
                                          NULL};

/* Plans whose kernels have not yet passed bench/gpu_verify.sh on an H200: listed (sa_plan_list, so test_cuda runs
   them) and run when forced (sa_plan_force, SINKATTN_PLAN), never the default. The feature plans
   hopper.fwd.features and hopper.bwd.twopass.features passed PART=features (every case of test_cuda's features
   tables on every plan against the fp64 reference, memcheck and racecheck clean: the h200-features-* results in
   bench/results/) and are the default for the calls they take. The one-pass backward's WAIT instantiations (the
   .wait variants, bench/gpu_verify.sh PART=perf33) have not run either, nor the float32 and the feature
   instantiations of the portable kernels (cuda.*.portable.f32, PART=f32; cuda.*.portable.features, PART=features). */
static const char *const sa_unverified[] = {
    "hopper.fwd.features.tma",        "hopper.bwd.twopass.features.tma", "hopper.bwd.onepass.wait",
    "hopper.bwd.onepass.narrow.wait", "cuda.fwd.portable.features",      "cuda.bwd.portable.features",
    "cuda.fwd.portable.f32",          "cuda.bwd.portable.f32",           NULL};

/* float32 attention has only the cuda.*.portable.f32 plans, unverified: refused unless a plan is forced (its pick
   says what is wrong) or the plans are being listed. Decode takes float32 on its own kernels. */
sa_status sa_cuda_dtype_check(const sa_attn *a, int listing) {
  if (a->dtype != SA_F32 || listing || sa_plan_forced(SA_PLAN_FWD) || sa_plan_forced(SA_PLAN_BWD)) return SA_OK;
  return sa_error(SA_ERR_UNSUPPORTED,
                  "dtype SA_F32 unsupported by CUDA backend: use SA_F16 or SA_BF16 (the float32 plans "
                  "cuda.fwd.portable.f32 / cuda.bwd.portable.f32 have not run on a GPU and run only when forced; "
                  "the Python layer falls back for f32)");
}

static int sa_plan_unverified(const char *name) {
  for (int i = 0; sa_unverified[i]; ++i)
    if (!strcmp(sa_unverified[i], name)) return 1;
  return 0;
}

int sa_cuda_padded_dim(int64_t h) { return h <= 32 ? 32 : h <= 64 ? 64 : h <= 128 ? 128 : 256; }

size_t sa_r256(size_t x) { return (x + 255) & ~(size_t)255; }
int64_t sa_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int sa_aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }
static int sa_gcd_i(int a, int b) {
  while (b) {
    const int r = a % b;
    a = b;
    b = r;
  }
  return a;
}

/* ---- defaults that a timing run decides (bench/gpu_verify.sh PART=perf33, bench/plan_decide.py) ----------- */

/* The one-pass backward's producer takes its next ticket without waiting on wr_done when the ticket counter is
   already past the item's head (hopper/onepass128.cu's RULE), leaving phases of that barrier unobserved, which
   compute-sanitizer synccheck reports. 1: every one-pass plan runs the WAIT instantiations, which always wait;
   0: only the plans hopper.bwd.onepass.wait and .narrow.wait do. */
#define SA_HOP_OP_WAIT_DEFAULT 0
/* The mma decode's split count where its one-wave rule gives chunks of at most SA_DEC_MMA_SHORT_CHUNK keys, in
   percent of that rule's (100: the rule itself); cuda.decode.mma.half, .x2 and .x4 run 50, 200 and 400 on every
   shape. */
#define SA_DEC_MMA_SHORT_SPLITS_PCT 100
#define SA_DEC_MMA_SHORT_CHUNK      1024

/* ---- what every plan of a call shares ---------------------------------------------------------------- */

void sa_plan_init(sa_cuda_plan *p, const sa_pctx *c, const char *name, sa_cuda_family f) {
  memset(p, 0, sizeof *p);
  p->name = name;
  p->family = f;
  p->hd = c->hd;
  p->mask = c->mask;
  p->split = 1;
  p->sms = c->sms;
}

static int sa_misaligned(const sa_pctx *c) {
  const sa_attn *a = c->a;
  return !sa_aligned16(a->q) || !sa_aligned16(a->k) || !sa_aligned16(a->v) || !sa_aligned16(a->out);
}

/* The rules every Hopper kernel shares (why not, into c->hop_why). T, S multiples of 128: every tile divides
   them; below 2^29: key - row stays inside SA_HOP_XLIM; scale > 0: the row max is taken before scaling. */
static void sa_hop_scope(sa_pctx *c) {
  const sa_attn *a = c->a;
  const sa_cuda_device *d = c->dev;
  const float sl2 = sa_scale_of(a) * 1.4426950408889634f;
  const char *w = NULL;
  if (d->hopper_off) w = "SINKATTN_CUDA_HOPPER=0";
  else if (!d->sm90a) w = "the library holds no sm_90a code";
  else if (d->cc_major != 9 || d->cc_minor != 0) w = "the device is not CC 9.0";
  else if (!c->bf16) w = "dtype is not bf16";
  else if (c->H != c->Hv || (c->H != 64 && c->H != 128)) w = "head_dim != v_head_dim or not 64 / 128";
  else if (c->T <= 0 || c->S <= 0 || c->T % 128 || c->S % 128) w = "q_len or kv_len not a positive multiple of 128";
  else if (c->T >= (1 << 29) || c->S >= (1 << 29)) w = "q_len or kv_len >= 2^29";
  else if (!(sl2 > 0.f) || !isfinite(sl2)) w = "scale <= 0";
  else if (sa_misaligned(c)) w = "a tensor is not 16-byte aligned";
  else if (c->segs && !sa_aligned16(a->kv_segment_ids)) w = "kv_segment_ids is not 16-byte aligned";
  snprintf(c->hop_why, sizeof c->hop_why, "%s", w ? w : "");
}

/* The first input of the call that only the feature kernels take, by its field's name; NULL without one. */
const char *sa_feature_of(const sa_attn *a) {
  return sa_dims_set(a->bias_dims)    ? "bias"
         : sa_dims_set(a->mask_dims)  ? "mask"
         : a->q_positions             ? "q_positions / kv_positions"
         : a->logits_soft_cap != 0.0f ? "logits_soft_cap"
                                      : NULL;
}

void sa_pctx_make(sa_pctx *c, const sa_attn *a, int which, const sa_cuda_device *dev) {
  memset(c, 0, sizeof *c);
  c->a = a;
  c->dev = dev;
  c->which = which;
  c->bf16 = a->dtype == SA_BF16;
  c->B = a->batch, c->T = a->q_len, c->S = a->kv_len, c->N = a->q_heads, c->K = a->kv_heads;
  c->G = a->q_heads / a->kv_heads, c->H = a->head_dim, c->Hv = a->v_head_dim;
  c->hd = sa_cuda_padded_dim(c->H > c->Hv ? c->H : c->Hv);
  c->lens = a->q_lens || a->kv_lens;
  c->segs = a->q_segment_ids || a->kv_segment_ids;
  /* with positions, causal and window compare the positions (the feature kernels), not the indices */
  const int pos = a->q_positions != NULL;
  c->mask = sa_hop_mask_kind_of(pos ? 0 : (int)a->causal, pos ? -1 : a->window_left, pos ? -1 : a->window_right,
                                c->lens, c->segs);
  c->sms = dev->ctx_sms > 0 ? dev->ctx_sms : dev->sms;
  c->feat = sa_feature_of(a);
  sa_hop_scope(c);
}

/* ---- forward -------------------------------------------------------------------------------------------- */

static void sa_fwd_portable(const sa_pctx *c, sa_cuda_plan *p) {
  sa_plan_init(p, c, "cuda.fwd.portable", SA_CUDA_FWD_PORTABLE);
  /* the portable tile table (common.cuh, sa_tile): NW warps x 16 MI rows, BN keys */
  const int hd = c->hd, mi = hd == 64 || hd == 256 ? 1 : 2, nw = hd == 64 ? 8 : 4;
  p->bm = nw * 16 * mi;
  p->bn = hd <= 128 ? 64 : 32;
  p->grid[0] = (int)sa_cdiv(c->T * c->G, p->bm), p->grid[1] = (int)c->K, p->grid[2] = (int)c->B;
  p->reason = "mma.sync kernels (sm_80+): every shape, mask and 16-bit dtype";
}

/* The Hopper forward's schedule (persistent: 1 the SMs' grid, 2 the narrow test grid; 0 one work tile a CTA), of
   the plain kernels or (feat) the feature kernels, whose tile is SA_HOP_FWD_FEAT_BM rows at both head dims. */
const char *sa_fwd_hopper_sched(const sa_pctx *c, sa_cuda_plan *p, int persistent, int feat) {
  static const char *const names[3] = {"hopper.fwd.onetile", "hopper.fwd.persistent", "hopper.fwd.persistent.narrow"};
  sa_plan_init(p, c, names[persistent], SA_CUDA_FWD_HOPPER);
  if (c->hop_why[0]) return c->hop_why;
  const int HD = (int)c->H, MASK = c->mask, BM = feat ? SA_HOP_FWD_FEAT_BM : SA_HOP_FWD_BM(HD), BN = SA_HOP_FWD_BN;
  if ((feat ? SA_HOP_FWD_FEAT_SMEM(HD) : SA_HOP_FWD_SMEM(HD, MASK)) > c->dev->smem_optin)
    return "its shared memory exceeds the device's opt-in limit";
  const int T = (int)c->T, S = (int)c->S;
  p->bm = BM, p->bn = BN, p->qslots = SA_HOP_FWD_QSLOTS, p->wg = BM / SA_HOP_WG_ROWS;
  p->n_mb = (T + BM - 1) / BM;
  const long long total = (long long)(c->B * c->N) * p->n_mb;
  if (total >= (1LL << 30)) return "B N ceil(T / rows) work tiles >= 2^30";
  p->BH = (int)(c->B * c->N);
  p->total = (int)total;
  const int keyt = (S + BN - 1) / BN;
  const int pairs = MASK == 1 && keyt <= SA_HOP_FWD_PAIRS_MAX_KEY_TILES(HD);
  p->grid[0] = p->total, p->grid[1] = p->grid[2] = 1;
  p->reason = "one work tile a CTA: masked work tiles of more than 8 key tiles share unevenly when persistent";
  if (persistent) {
    const int narrow = persistent == 2;
    int g = narrow ? SA_HOP_FWD_NARROW_GRID : c->sms > 0 ? c->sms : p->total;
    /* a grid coprime to the m-blocks (or the pairs) a head deals partial 192-row m-blocks evenly */
    if (MASK == 0 && !narrow && T % BM != 0)
      while (g > 1 && g < p->total && sa_gcd_i(g, p->n_mb) != 1) --g;
    p->grid[0] = g < p->total ? g : p->total;
    p->persistent = 1;
    if (pairs) {
      p->nph = (p->n_mb + 1) / 2;
      const int np = p->BH * p->nph;
      if (!narrow && T % BM != 0)
        while (g > 1 && g < np && sa_gcd_i(g, p->nph) != 1) --g;
      p->grid[0] = g < np ? g : np;
      p->total = 2 * p->grid[0] * ((np + p->grid[0] - 1) / p->grid[0]);
    } else if (MASK != 0) {
      const double head_kv = 4.0 * S * HD / (double)c->G, hg = SA_HOP_FWD_L2_SECTION_BYTES / head_kv;
      p->hg = hg < 1 ? 1 : hg > p->BH ? p->BH : (int)hg;
    }
    p->reason = narrow  ? "test schedule: 3 persistent CTAs, many work tiles each"
                : pairs ? "persistent, causal work tiles in heavy / light pairs of one head"
                : MASK  ? "persistent, heads in L2 sections, heaviest m-blocks first"
                        : "persistent: every work tile costs the same, the prologue hides under the previous tile";
  }
  return NULL;
}

static const char *sa_fwd_hopper(const sa_pctx *c, sa_cuda_plan *p, int persistent) {
  return sa_fwd_hopper_sched(c, p, persistent, 0);
}

/* Persistent by default without a mask, for causal pairs, and while a work tile sees <= 8 key tiles. */
int sa_fwd_persist_default(const sa_pctx *c) {
  const int HD = (int)c->H, BN = SA_HOP_FWD_BN, keyt = (int)((c->S + BN - 1) / BN);
  const sa_hop_mask mk =
      sa_hop_mask_make(c->T, c->S, (int)c->a->causal, c->a->window_left, c->a->window_right, c->a->diag_offset);
  const int pairs = c->mask == 1 && keyt <= SA_HOP_FWD_PAIRS_MAX_KEY_TILES(HD);
  const int short_window =
      c->mask == 2 && (SA_HOP_FWD_BM(HD) + (long long)mk.dhi - mk.dlo) / BN + 2 <= SA_HOP_FWD_PERSIST_MAX_KEY_TILES;
  return c->mask == 0 || pairs || keyt <= SA_HOP_FWD_PERSIST_MAX_KEY_TILES || short_window;
}

/* ---- backward ------------------------------------------------------------------------------------------- */

size_t sa_cuda_bwd_common_ws(const sa_attn *a) {
  const size_t rows = (size_t)a->batch * (size_t)a->q_heads * (size_t)a->q_len;
  const size_t parts = (size_t)a->batch * (size_t)a->q_heads * (size_t)sa_cdiv(a->q_len, 64);
  return 2 * sa_r256(rows * sizeof(float)) + sa_r256(parts * sizeof(float));
}

static void sa_bwd_portable(const sa_pctx *c, sa_cuda_plan *p) {
  sa_plan_init(p, c, "cuda.bwd.portable", SA_CUDA_BWD_PORTABLE);
  const int ds = c->hd <= 128 ? 1 : 2;
  p->bm = 64, p->bn = c->hd <= 64 ? 64 : 32;
  p->grid[0] = (int)(sa_cdiv(c->S, 64) * ds), p->grid[1] = (int)c->K, p->grid[2] = (int)c->B;
  p->grid_dq[0] = (int)sa_cdiv(c->T * c->G, 64), p->grid_dq[1] = (int)c->K, p->grid_dq[2] = (int)c->B;
  p->ws = sa_cuda_bwd_common_ws(c->a);
  p->reason = "mma.sync dK/dV and dQ kernels (sm_80+): every shape and mask, no atomics";
}

/* cuda.fwd.portable.f32 / cuda.bwd.portable.f32: the portable plan of the call's direction on float32 inputs, rounded
   to bf16 into shared memory (common.cuh, sa_f32in): the same tiles and grid. */
static void sa_portable_f32(const sa_pctx *c, sa_cuda_plan *p) {
  if (c->which == SA_PLAN_FWD) sa_fwd_portable(c, p);
  else sa_bwd_portable(c, p);
  p->name = c->which == SA_PLAN_FWD ? "cuda.fwd.portable.f32" : "cuda.bwd.portable.f32";
  p->reason = "mma.sync kernels (sm_80+) on float32 inputs rounded to bf16, fp32 outputs: every shape and mask";
}

/* cuda.fwd.portable.features / cuda.bwd.portable.features: the portable plan of the call's direction with the
   feature kernels (portable/fwd.cu, bwd.cu with FEAT: every pair tested, no class pre-pass): a bias of any broadcast
   and dtype (forward), a mask array of any broadcast, positions, a soft-cap; bf16 / f16, no segment ids. The
   backward takes no bias: it writes no dbias. */
static const char *sa_portable_feat(const sa_pctx *c, sa_cuda_plan *p) {
  const sa_attn *a = c->a;
  if (c->which == SA_PLAN_FWD) sa_fwd_portable(c, p);
  else sa_bwd_portable(c, p);
  p->name = c->which == SA_PLAN_FWD ? "cuda.fwd.portable.features" : "cuda.bwd.portable.features";
  p->feat = 1;
  p->reason = "mma.sync kernels (sm_80+) with bias / mask / positions / soft-cap tested per pair";
  if (a->dtype == SA_F32) return "the portable feature kernels take bf16 / f16";
  if (c->segs) return "the portable feature kernels take no segment ids";
  if (c->which == SA_PLAN_BWD && sa_dims_set(a->bias_dims)) return "the portable feature backward takes no bias";
  return NULL;
}

static const char *sa_bwd_hop_scope(const sa_pctx *c) {
  const sa_attn *a = c->a;
  if (c->hop_why[0]) return c->hop_why;
  if (c->segs && !sa_aligned16(a->q_segment_ids)) return "q_segment_ids is not 16-byte aligned";
  return NULL;
}

/* The two-pass dK/dV and dQ kernels with nck / ncq consumer warpgroups (0: the default for this grid). */
const char *sa_bwd_twopass(const sa_pctx *c, sa_cuda_plan *p, int nck, int ncq) {
  static const char *const names[2][2] = {{"hopper.bwd.twopass.wg2", "hopper.bwd.twopass.dq3"},
                                          {"hopper.bwd.twopass.kv3", "hopper.bwd.twopass.wg3"}};
  const char *why = sa_bwd_hop_scope(c);
  const int may3 = !why && SA_HOP_BWD_NC_MAX(c->H, c->mask) == 3;
  const int64_t many = (int64_t)SA_HOP_BWD_NC3_CTAS_PER_SM * c->sms;
  if (!nck) nck = may3 && sa_cdiv(c->S, 192) * c->K * c->B >= many ? 3 : 2;
  if (!ncq) ncq = may3 && sa_cdiv(c->T, 192) * c->N * c->B >= many ? 3 : 2;
  sa_plan_init(p, c, names[nck == 3][ncq == 3], SA_CUDA_BWD_TWOPASS);
  if (why) return why;
  if ((nck == 3 || ncq == 3) && !may3) return "3 consumer warpgroups need H 64 without lengths or segment ids";
  if (SA_HOP_BWD_DKDV_SMEM(c->H, nck) > c->dev->smem_optin || SA_HOP_BWD_DQ_SMEM(c->H, ncq) > c->dev->smem_optin)
    return "its shared memory exceeds the device's opt-in limit";
  const int kbk = 64 * nck;
  p->wg = nck, p->wg_dq = ncq, p->bm = kbk, p->bn = SA_HOP_BWD_QB;
  /* key block work falls with kb under an upper bound alone, or lengths / segment ids with one and no left
     window: then the heaviest key blocks start first while the grid is short */
  const sa_attn *a = c->a;
  const int falls = c->mask == 1 || (c->mask >= 3 && (a->causal != 0 || a->window_right >= 0) && a->window_left < 0);
  const int64_t nkb = sa_cdiv(c->S, kbk), ctas = nkb * c->K * c->B;
  p->kb_slowest = falls && ctas < (int64_t)SA_HOP_BWD_KB_SLOWEST_CTAS_PER_SM * c->sms;
  if (p->kb_slowest) p->grid[0] = (int)c->K, p->grid[1] = (int)c->B, p->grid[2] = (int)nkb;
  else p->grid[0] = (int)nkb, p->grid[1] = (int)c->K, p->grid[2] = (int)c->B;
  p->grid_dq[0] = (int)sa_cdiv(c->T, 64 * ncq), p->grid_dq[1] = (int)c->N, p->grid_dq[2] = (int)c->B;
  p->ws = sa_cuda_bwd_common_ws(a);
  p->reason = c->segs ? "sm_90a dK/dV then dQ, segment ids tested per element over the lengths' tile range"
                      : "sm_90a dK/dV then dQ: wgmma, TMA rings, no atomics";
  return NULL;
}

/* The one-pass kernels' item count and head split; variant: 0 cooperative, 1 plain launch, 2 narrow grid. */
static const char *sa_bwd_onepass(const sa_pctx *c, sa_cuda_plan *p, int variant, size_t ws_avail) {
  static const char *const names[3] = {"hopper.bwd.onepass", "hopper.bwd.onepass.plain", "hopper.bwd.onepass.narrow"};
  sa_plan_init(p, c, names[variant], SA_CUDA_BWD_ONEPASS);
  p->op_wait = SA_HOP_OP_WAIT_DEFAULT;
  const sa_attn *a = c->a;
  const char *why = sa_bwd_hop_scope(c);
  if (why) return why;
  if (c->lens || c->segs || a->window_left >= 0 || a->window_right >= 0)
    return "the one pass takes no lengths, window or segment ids";
  if (!(a->causal == SA_CAUSAL_NONE || (a->causal == SA_CAUSAL_TOP_LEFT && a->diag_offset == 0)))
    return "the one pass takes causal top-left on the main diagonal only";
  if (c->B * c->N * c->T >= SA_HOP_OP_MAX_ROWS) return "B N T >= 2^27";
  if (SA_HOP_OP_SMEM(c->H) > c->dev->smem_optin) return "its shared memory exceeds the device's opt-in limit";
  const int HD = (int)c->H, KB = SA_HOP_OP_KB(HD);
  const int64_t nkb = sa_cdiv(c->S, KB);
  int hs = 1;
  if (HD == 64) /* the head split while the grid is short (tiles.h) */
    while (c->G % (2 * hs) == 0 && nkb * c->K * c->B * hs < (int64_t)SA_HOP_OP_SPLIT_CTAS_PER_SM * c->sms) hs *= 2;
  const int64_t n_all = c->G / hs * (c->T / SA_HOP_BWD_QB), items = nkb * hs * c->K * c->B;
  if (a->causal == SA_CAUSAL_NONE && n_all < nkb) return "fewer query tiles than key blocks (NAT's start tiles)";
  /* NAT orders a head's dQ adds over its nkb key blocks: they must be held by co-resident CTAs (one an SM) */
  if (nkb > c->sms) return "more key blocks a head than SMs in this context (the dQ order needs them co-resident)";
  if (items >= (1LL << 31)) return "items >= 2^31";
  p->wg = SA_HOP_OP_NC(HD), p->bm = KB, p->bn = SA_HOP_BWD_QB;
  p->nkb = (int)nkb, p->split = hs, p->n_all = (int)n_all, p->items = (int)items;
  p->d = (int)(n_all / nkb > 1 ? n_all / nkb : 1);
  p->persistent = 1;
  p->cooperative = variant != 1;
  const int64_t g = variant == 2 ? nkb : (c->sms > nkb ? c->sms : nkb);
  p->grid[0] = (int)(g < items ? g : items), p->grid[1] = p->grid[2] = 1;
  p->sync_bytes = (size_t)(1 + c->B * c->N * (c->T / SA_HOP_BWD_QB)) * 4;
  const size_t acc = (size_t)(c->B * c->N * c->T * c->H) * 4;
  const size_t part = hs > 1 ? 2 * (size_t)hs * (size_t)(c->B * c->S * c->K * c->H) * 4 : 0;
  p->off_sync = sa_r256(acc);
  p->off_part = p->off_sync + sa_r256(p->sync_bytes);
  p->ws = sa_cuda_bwd_common_ws(a) + p->off_part + (HD == 64 ? sa_r256(part) : 0);
  if (p->ws > ws_avail) return "the workspace given is smaller than the one pass needs";
  p->reason = variant == 0   ? "dK, dV, dQ in one persistent pass (5 products a tile, the two passes 7); cooperative "
                               "launch: every CTA co-resident, else the two passes run"
              : variant == 1 ? "the one pass on a plain launch: progress needs a head's key blocks co-resident "
                               "(not guaranteed on a shared GPU: docs/hopper.md)"
                             : "test schedule: the one pass on nkb CTAs, many items each";
  return NULL;
}

/* ---- decode --------------------------------------------------------------------------------------------- */

static int sa_dec_pipe_shape(const sa_pctx *c) {
  return (c->a->dtype == SA_BF16 || c->a->dtype == SA_F16) && c->H == c->Hv && (c->H == 64 || c->H == 128);
}

/* What the decode schedules share, given the splits wanted and the fewest keys a chunk may hold: at most 1024
   splits (the combine keeps their weights in shared memory), chunks a multiple of 64 keys, the splits those chunks
   make, the partials' workspace and the split kernel's grid (p->rows and p->rowgroups set by the caller). */
static void sa_dec_split(const sa_pctx *c, sa_cuda_plan *p, int64_t splits, int64_t min_chunk) {
  int64_t max_splits = (c->S + min_chunk - 1) / min_chunk;
  if (max_splits > 1024) max_splits = 1024;
  if (max_splits < 1) max_splits = 1;
  if (splits > max_splits) splits = max_splits;
  if (splits < 1) splits = 1;
  int64_t chunk = (c->S + splits - 1) / splits;
  chunk = (chunk + 63) / 64 * 64;
  if (chunk < 64) chunk = 64;
  p->chunk = chunk;
  p->splits = c->S > 0 ? (c->S + chunk - 1) / chunk : 1;
  p->ws = (size_t)(c->B * c->K * p->splits * p->rows) * (size_t)(c->Hv + 1) * sizeof(float);
  p->grid[0] = (int)p->splits, p->grid[1] = (int)(c->K * p->rowgroups), p->grid[2] = (int)c->B;
}

/* Splits: 2 waves of the pipeline kernel's resident CTAs (3-4 an SM from its shared memory), chunks of >= 128
   keys (its 3-deep pipeline fills); the register kernel ~8 blocks an SM, chunks of >= 256 keys. The same for both
   kernels: shape only. */
static void sa_dec_schedule(const sa_pctx *c, sa_cuda_plan *p) {
  int occ = 0;
  if (sa_dec_pipe_shape(c)) {
    const int smem = SA_DEC_PIPE_SMEM((int)c->H);
    const int per_sm = c->dev->smem_per_sm > 0 ? c->dev->smem_per_sm : 233472;
    occ = per_sm / (smem + 1024);
    occ = occ < 1 ? 1 : occ > 4 ? 4 : occ;
  }
  const int sms = c->sms > 0 ? c->sms : 132;
  p->rows = c->G * c->T;
  p->rowgroups = (p->rows + 7) / 8;
  const int64_t blocks = c->B * c->K * p->rowgroups;
  const int64_t target = (occ ? 2 * (int64_t)occ : 8) * (int64_t)sms, min_chunk = occ ? 128 : 256;
  sa_dec_split(c, p, blocks > 0 ? (target + blocks - 1) / blocks : 1, min_chunk);
}

/* The mma kernel's schedule (decode/mma.cu): rows in groups of 16 (its M), and one wave of equal CTAs where the
   (batch, kv head, row group) blocks are fewer than the resident slots (2 an SM from its shared memory): splits =
   slots / blocks rounded down. A second wave costs more than the imbalance it removes: two waves of half-size
   CTAs take 3-6 us more per call at B1 S32k and B8 S4k on the H200 (docs/performance.md, "Decode"), each wave
   paying the CTA ramp (lengths, q, the first tile's latency) and a tail. Chunks hold >= 256 keys: every warp gets
   >= 2 tiles, so its pipeline fills. More blocks than slots: one split, the blocks in waves. pct: the split count
   in percent of that rule's (0: SA_DEC_MMA_SHORT_SPLITS_PCT where the rule's chunks are short, else the rule). */
static void sa_dec_mma_schedule(const sa_pctx *c, sa_cuda_plan *p, int pct) {
  const int per_sm = c->dev->smem_per_sm > 0 ? c->dev->smem_per_sm : 233472;
  int occ = per_sm / (SA_DEC_MMA_SMEM(c->hd <= 64 ? 64 : 128) + 1024);
  occ = occ < 1 ? 1 : occ > 2 ? 2 : occ;
  const int64_t slots = (int64_t)occ * (c->sms > 0 ? c->sms : 132);
  p->rows = c->G * c->T;
  p->rowgroups = (p->rows + 15) / 16;
  const int64_t blocks = c->B * c->K * p->rowgroups;
  sa_dec_split(c, p, blocks > 0 && blocks < slots ? slots / blocks : 1, 256);
  if (!pct && p->chunk <= SA_DEC_MMA_SHORT_CHUNK) pct = SA_DEC_MMA_SHORT_SPLITS_PCT;
  if (pct && pct != 100) sa_dec_split(c, p, p->splits * pct / 100, 256);
  /* sm_90: the combine is a programmatic dependent launch (-1.0..1.2 us a call on the H200's short rows) */
  p->dec_pdl = c->dev->cc_major >= 9;
}

/* kind, best first: 0 the mma kernel, 1 the pipeline kernel, 2 the register kernel */
static const char *sa_dec_plan(const sa_pctx *c, sa_cuda_plan *p, int kind) {
  static const char *const names[3] = {"cuda.decode.mma", "cuda.decode.pipe", "cuda.decode.register"};
  static const sa_cuda_family fams[3] = {SA_CUDA_DECODE_MMA, SA_CUDA_DECODE_PIPE, SA_CUDA_DECODE_REGISTER};
  sa_plan_init(p, c, names[kind], fams[kind]);
  if (kind == 0) sa_dec_mma_schedule(c, p, 0);
  else sa_dec_schedule(c, p);
  p->reason = kind == 0   ? "split-KV, scores and P V on mma.sync, a cp.async pipeline per warp"
              : kind == 1 ? "split-KV, K / V through a 4-stage cp.async pipeline in shared memory"
                          : "split-KV, K / V in registers (any head dim <= 256 and dtype)";
  if (kind < 2 && !sa_dec_pipe_shape(c))
    return "the pipeline and mma kernels take bf16 / f16 with H == Hv in {64, 128}";
  if (kind < 2 && (!sa_aligned16(c->a->q) || !sa_aligned16(c->a->k) || !sa_aligned16(c->a->v)))
    return "q, k or v is not 16-byte aligned";
  return NULL;
}

/* ---- the list ------------------------------------------------------------------------------------------- */

typedef struct {
  sa_cuda_plan *out;
  int max, n;
  const char *forced; /* when set: only that plan is wanted */
  const char *why;    /* why the forced plan is not legal */
  int seen;           /* the forced plan was considered */
  int listing;        /* every legal plan, the unverified ones too (sa_cuda_plans) */
} sa_plist;

static void sa_offer(sa_plist *l, const sa_cuda_plan *p, const char *why) {
  if (l->forced) {
    if (strcmp(l->forced, p->name) != 0) return;
    l->seen = 1;
    if (why) {
      l->why = why;
      return;
    }
  } else if (why || (!l->listing && sa_plan_unverified(p->name))) {
    return;
  }
  for (int i = 0; i < l->n && i < l->max; ++i)
    if (!strcmp(l->out[i].name, p->name)) return; /* offered twice (a default and its variant) */
  if (l->out && l->n < l->max) l->out[l->n] = *p;
  l->n++;
}

/* ---- override-only variants, timed against the defaults (bench/gpu_verify.sh PART=perf33) ----------------- */

/* hopper.bwd.onepass.wait / .narrow.wait: the one pass's schedules with the WAIT instantiations (op_wait). */
static const char *sa_bwd_onepass_wait(const sa_pctx *c, sa_cuda_plan *p, int narrow, size_t ws_avail) {
  const char *why = sa_bwd_onepass(c, p, narrow ? 2 : 0, ws_avail);
  p->name = narrow ? "hopper.bwd.onepass.narrow.wait" : "hopper.bwd.onepass.wait";
  p->op_wait = 1;
  if (!why)
    p->reason = narrow ? "test schedule: the one pass on nkb CTAs, the producer waiting for every item's writer"
                       : "the one pass whose producer waits for every item's writer before its next ticket";
  return why;
}

/* cuda.decode.mma.half / .x2 / .x4: the mma decode with 50 / 200 / 400 percent of its one-wave rule's splits (two
   and four waves of smaller CTAs, or half a wave of larger ones); not legal where that is the default's count. */
static const char *sa_dec_mma_variant(const sa_pctx *c, sa_cuda_plan *p, int v) {
  static const char *const names[3] = {"cuda.decode.mma.half", "cuda.decode.mma.x2", "cuda.decode.mma.x4"};
  static const int pct[3] = {50, 200, 400};
  const char *why = sa_dec_plan(c, p, 0);
  const int64_t dflt = p->splits;
  p->name = names[v];
  if (why) return why;
  sa_dec_mma_schedule(c, p, pct[v]);
  if (p->splits == dflt) return "it gives this shape the split count of cuda.decode.mma";
  p->reason = "split-KV on mma.sync, a split count other than the default's (a timing variant)";
  return NULL;
}

static void sa_collect_variants(const sa_pctx *c, size_t ws_avail, sa_plist *l, const char *nf) {
  sa_cuda_plan p;
  const char *why;
  for (int i = 0; i < 2 && c->which == SA_PLAN_BWD; ++i) {
    why = sa_bwd_onepass_wait(c, &p, i, ws_avail);
    sa_offer(l, &p, why ? why : nf);
  }
  for (int i = 0; i < 3 && c->which == SA_PLAN_DECODE; ++i) {
    why = sa_dec_mma_variant(c, &p, i);
    sa_offer(l, &p, why ? why : nf);
  }
}

static void sa_collect(const sa_attn *a, int which, const sa_cuda_device *dev, size_t ws_avail, sa_plist *l) {
  sa_pctx c;
  sa_pctx_make(&c, a, which, dev);
  sa_cuda_plan p;
  const char *why;
  /* a call with an input only the feature kernels take: the plain plans are not legal (nf says why) */
  const char *nf =
      c.feat ? "its kernels take no bias, mask array, positions or soft-cap (the *.features plans do)" : NULL;
  const char *nofeat = "the call has no bias, mask array, positions or soft-cap (a plain plan takes it)";
  /* float32 runs the portable kernels' sa_f32in instantiations (common.cuh) alone */
  const int is32 = a->dtype == SA_F32;
  const char *f32 = is32 ? "its kernels take bf16 / f16 (float32: the cuda.*.portable.f32 plans)" : NULL;
  const char *not32 = is32 ? NULL : "the call is not float32 (cuda.*.portable takes it)";
  if (which == SA_PLAN_FWD) {
    sa_cuda_plan port;
    sa_fwd_portable(&c, &port);
    const int dflt = c.hop_why[0] ? 0 : sa_fwd_persist_default(&c);
    if (c.hop_why[0]) snprintf(port.note, sizeof port.note, "not Hopper: %.96s", c.hop_why);
    why = sa_fwd_hopper(&c, &p, dflt);
    sa_offer(l, &p, why ? why : nf);
    why = sa_fwd_hopper(&c, &p, !dflt);
    sa_offer(l, &p, why ? why : nf);
    sa_offer(l, &port, nf ? nf : f32);
    why = sa_fwd_hopper(&c, &p, 2);
    sa_offer(l, &p, why ? why : nf);
    why = sa_fwd_hopper_feat(&c, &p);
    sa_offer(l, &p, c.feat ? why : nofeat);
    why = sa_fwd_hopper_feat_tma(&c, &p);
    sa_offer(l, &p, c.feat ? why : nofeat);
    sa_portable_f32(&c, &port);
    sa_offer(l, &port, nf ? nf : not32);
    why = sa_portable_feat(&c, &port);
    sa_offer(l, &port, c.feat ? why : nofeat);
  } else if (which == SA_PLAN_BWD) {
    sa_cuda_plan port;
    sa_bwd_portable(&c, &port);
    const char *hw = sa_bwd_hop_scope(&c);
    if (hw) snprintf(port.note, sizeof port.note, "not Hopper: %.96s", hw);
    why = sa_bwd_onepass(&c, &p, 0, ws_avail);
    sa_offer(l, &p, why ? why : nf);
    why = sa_bwd_twopass(&c, &p, 0, 0);
    sa_offer(l, &p, why ? why : nf);
    static const int ncs[4][2] = {{2, 2}, {3, 2}, {2, 3}, {3, 3}};
    for (int i = 0; i < 4; ++i) {
      why = sa_bwd_twopass(&c, &p, ncs[i][0], ncs[i][1]);
      sa_offer(l, &p, why ? why : nf);
    }
    const char *small = port.ws <= ws_avail ? NULL : "the workspace given is smaller than the backward needs";
    if (port.ws <= ws_avail) sa_offer(l, &port, nf ? nf : f32);
    else sa_offer(l, &port, small);
    why = sa_bwd_onepass(&c, &p, 1, ws_avail);
    sa_offer(l, &p, why ? why : nf);
    why = sa_bwd_onepass(&c, &p, 2, ws_avail);
    sa_offer(l, &p, why ? why : nf);
    why = sa_bwd_twopass_feat(&c, &p);
    if (!why && p.ws > ws_avail) why = "the workspace given is smaller than the backward needs";
    sa_offer(l, &p, c.feat ? why : nofeat);
    why = sa_bwd_twopass_feat_tma(&c, &p);
    if (!why && p.ws > ws_avail) why = "the workspace given is smaller than the backward needs";
    sa_offer(l, &p, c.feat ? why : nofeat);
    sa_portable_f32(&c, &port);
    sa_offer(l, &port, nf ? nf : not32 ? not32 : small);
    why = sa_portable_feat(&c, &port);
    sa_offer(l, &port, c.feat ? (why ? why : small) : nofeat);
  } else if (which == SA_PLAN_DECODE) {
    for (int kind = 0; kind < 3; kind++) {
      why = sa_dec_plan(&c, &p, kind);
      sa_offer(l, &p, why ? why : nf);
    }
  }
  sa_collect_variants(&c, ws_avail, l, nf);
}

static const char *sa_device_why(const sa_cuda_device *dev, char *buf, size_t n) {
  if (dev->cc_major >= 8) return NULL;
  snprintf(buf, n, "device '%s' is sm_%d%d: the CUDA backend needs sm_80 or newer", dev->name, dev->cc_major,
           dev->cc_minor);
  return buf;
}

int sa_cuda_plans(const sa_attn *a, int which, const sa_cuda_device *dev, size_t ws_avail, sa_cuda_plan *plans,
                  int max) {
  char buf[256];
  if (!a || !dev || sa_device_why(dev, buf, sizeof buf)) return 0;
  sa_plist l = {.out = plans, .max = plans ? max : 0, .listing = 1};
  sa_collect(a, which, dev, ws_avail, &l);
  return l.n;
}

sa_status sa_cuda_plan_pick(const sa_attn *a, int which, const sa_cuda_device *dev, const char *forced, size_t ws_avail,
                            sa_cuda_plan *out) {
  char buf[256];
  const char *dw = sa_device_why(dev, buf, sizeof buf);
  if (dw) return sa_error(SA_ERR_UNSUPPORTED, "%s", dw);
  sa_plist l = {.out = out, .max = 1, .forced = forced && *forced ? forced : NULL};
  sa_collect(a, which, dev, ws_avail, &l);
  if (l.n > 0) return SA_OK;
  if (l.forced)
    return sa_error(SA_ERR_UNSUPPORTED, "plan %s is not legal for this call: %s", l.forced,
                    l.seen ? l.why : "it is not a plan of this kind on the CUDA backend");
  const char *feat = sa_feature_of(a);
  if (feat && which != SA_PLAN_DECODE) { /* only the feature plans take it: say why they do not */
    char why[224];
    if (!sa_feature_why(a, dev, why, sizeof why)) snprintf(why, sizeof why, "the workspace given is too small");
    return sa_feature_refuse(feat, why);
  }
  return sa_error(SA_ERR_UNSUPPORTED, "no CUDA plan for this call");
}

size_t sa_cuda_plan_describe(const sa_cuda_plan *p, char *buf, size_t n) {
  int k = snprintf(buf, n, "%s hd=%d tile=%dx%d", p->name, p->hd, p->bm, p->bn);
  if (p->family == SA_CUDA_FWD_HOPPER) k += snprintf(buf + k, n > (size_t)k ? n - k : 0, " qslots=%d", p->qslots);
  if (p->wg) k += snprintf(buf + k, n > (size_t)k ? n - k : 0, " wg=%d", p->wg);
  if (p->wg_dq) k += snprintf(buf + k, n > (size_t)k ? n - k : 0, " wg_dq=%d", p->wg_dq);
  if (p->family == SA_CUDA_DECODE_MMA) k += snprintf(buf + k, n > (size_t)k ? n - k : 0, " pdl=%d", p->dec_pdl);
  if (p->splits)
    k += snprintf(buf + k, n > (size_t)k ? n - k : 0, " splits=%lld chunk=%lld", (long long)p->splits,
                  (long long)p->chunk);
  if (p->op_wait) k += snprintf(buf + k, n > (size_t)k ? n - k : 0, " wait=1");
  k += snprintf(buf + k, n > (size_t)k ? n - k : 0, " grid=%d,%d,%d persistent=%d cooperative=%d split=%d ws=%zu",
                p->grid[0], p->grid[1], p->grid[2], p->persistent, p->cooperative, p->split, p->ws);
  if (p->feat)
    k += snprintf(buf + k, n > (size_t)k ? n - k : 0, " feat=%d b_fast=%d classes=%lldx%lld", p->feat, p->b_fast,
                  (long long)p->cls_cb, (long long)p->cls_cn);
  k += snprintf(buf + k, n > (size_t)k ? n - k : 0, " reason=%s%s%s", p->reason ? p->reason : "",
                p->note[0] ? "; " : "", p->note);
  return (size_t)k;
}
