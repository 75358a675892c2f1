/*
 * test_plan.c — the plan API and the CUDA plans on this CPU (a mocked device record; no GPU):
 *   1. below sm_80 every CUDA plan is refused with SA_ERR_UNSUPPORTED naming the device;
 *   2. sa_plan_force: unknown names and names of another kind are SA_ERR_INVALID; a forced plan that is not
 *      legal for a call is SA_ERR_UNSUPPORTED naming the plan and why; "" clears it;
 *   3. for every shape of tests/plan/cases.txt: the list is non-empty and starts with the default, every listed
 *      plan is pickable, known to sa_plan_force and describes itself with its own name first; the workspace of a
 *      backward plan is its launch's need (picking it with exactly that workspace keeps it; one byte less makes a
 *      one pass illegal);
 *   4. the REF / CPU plan names, and sa_plan_last after a REF call;
 *   5. decode: the mma plan is the default on the gpt-oss shapes, its schedule one wave of equal CTAs, 16-row
 *      groups, the combine a programmatic dependent launch on sm_90 only; its shape and dtype rules;
 *   6. the override-only timing variants: the one pass that always waits (the default's schedule and workspace,
 *      op_wait set) and the mma decode's split counts (half, x2, x4 of the default's, refused where equal to it).
 * The launches themselves are tests/plan/plan_record.cpp's (test_plan_launch, against tests/plan/golden.txt).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda/plan.h"
#include "sa_plan.h"
#include "sa_internal.h"

static int t_passed, t_failed;
static void t_count(int ok) { ok ? t_passed++ : t_failed++; }
#define t_report(...) (printf("FAIL "), printf(__VA_ARGS__), printf("\n"))

static const sa_cuda_device h200 = {9, 0, 132, 132, 232448, 233472, 1, 0, "NVIDIA H200 (mocked)"};

static sa_attn shape(int64_t B, int64_t T, int64_t S, int64_t N, int64_t K, int64_t H, sa_causal causal) {
  static const float sink = 0.0f;
  sa_attn a;
  sa_attn_init(&a);
  a.dtype = SA_BF16, a.batch = B, a.q_len = T, a.kv_len = S, a.q_heads = N, a.kv_heads = K, a.head_dim = H;
  a.v_head_dim = H, a.softmax = SA_SOFTMAX_LEARNABLE, a.sinks = &sink, a.causal = causal;
  return a;
}

static void check_old_device(void) {
  sa_cuda_device t4 = h200;
  t4.cc_major = 7, t4.cc_minor = 5;
  snprintf(t4.name, sizeof t4.name, "Tesla T4");
  const sa_attn a = shape(1, 128, 128, 2, 2, 64, SA_CAUSAL_NONE);
  sa_cuda_plan p;
  const sa_status s = sa_cuda_plan_pick(&a, SA_PLAN_FWD, &t4, NULL, (size_t)-1, &p);
  const int ok = s == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), "device 'Tesla T4' is sm_75") &&
                 strstr(sa_last_error(), "needs sm_80 or newer") &&
                 sa_cuda_plans(&a, SA_PLAN_BWD, &t4, (size_t)-1, NULL, 0) == 0;
  if (!ok) t_report("sm_75: status %d, message '%s'", (int)s, sa_last_error());
  t_count(ok);
}

static void check_force(void) {
  t_count(sa_plan_force(SA_PLAN_FWD, "hopper.fwd.nonesuch") == SA_ERR_INVALID && strstr(sa_last_error(), "nonesuch"));
  t_count(sa_plan_force(SA_PLAN_FWD, "hopper.bwd.onepass") == SA_ERR_INVALID);
  t_count(sa_plan_force(7, "ref.fwd") == SA_ERR_INVALID);
  /* the one pass takes no window: a forced one pass on a windowed call is refused, saying so */
  sa_attn a = shape(1, 1024, 1024, 8, 8, 128, SA_CAUSAL_TOP_LEFT);
  a.window_left = 127, a.window_right = 0;
  sa_cuda_plan p;
  sa_status s = sa_cuda_plan_pick(&a, SA_PLAN_BWD, &h200, "hopper.bwd.onepass", (size_t)-1, &p);
  const int ok =
      s == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), "hopper.bwd.onepass") && strstr(sa_last_error(), "window");
  if (!ok) t_report("forced one pass with a window: status %d '%s'", (int)s, sa_last_error());
  t_count(ok);
  /* f16: no Hopper plan */
  a.dtype = SA_F16;
  s = sa_cuda_plan_pick(&a, SA_PLAN_FWD, &h200, "hopper.fwd.persistent", (size_t)-1, &p);
  t_count(s == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), "bf16"));
  /* a green context of 32 SMs: S / 128 = 64 key blocks cannot be co-resident, the one pass is not legal */
  sa_cuda_device green = h200;
  green.ctx_sms = 32;
  a = shape(1, 8192, 8192, 8, 8, 128, SA_CAUSAL_TOP_LEFT);
  s = sa_cuda_plan_pick(&a, SA_PLAN_BWD, &green, NULL, (size_t)-1, &p);
  t_count(s == SA_OK && p.family == SA_CUDA_BWD_TWOPASS);
  s = sa_cuda_plan_pick(&a, SA_PLAN_BWD, &h200, NULL, (size_t)-1, &p);
  t_count(s == SA_OK && p.family == SA_CUDA_BWD_ONEPASS && p.cooperative == 1 && p.grid[0] == 132);
  /* REF honours a force of its own plan and refuses another */
  const char *names[4];
  t_count(sa_plan_list(&a, SA_PLAN_FWD, SA_BACKEND_REF, names, 4) == 1 && !strcmp(names[0], "ref.fwd"));
  t_count(sa_plan_force(SA_PLAN_FWD, "ref.fwd") == SA_OK && sa_plan_host(SA_PLAN_FWD, SA_BACKEND_REF, &a) == SA_OK &&
          !strncmp(sa_plan_last(SA_PLAN_FWD), "ref.fwd ", 8));
  t_count(sa_plan_force(SA_PLAN_FWD, "hopper.fwd.persistent") == SA_OK &&
          sa_plan_host(SA_PLAN_FWD, SA_BACKEND_REF, &a) == SA_ERR_UNSUPPORTED);
  t_count(sa_plan_force(SA_PLAN_FWD, "") == SA_OK && sa_plan_forced(SA_PLAN_FWD) == NULL);
  char buf[64];
  t_count(sa_plan_last_any(SA_PLAN_FWD, buf, sizeof buf) > 0 && !strncmp(buf, "ref.fwd ", 8));
}

/* gpt-oss decode (N64 K8 H64, one token): the mma plan's splits give at most one wave of 2 CTAs an SM when the
   blocks are fewer than that, and one split when they are not. */
static void check_decode_mma(void) {
  static const struct {
    int64_t B, S, splits, chunk;
  } rows[] = {{1, 4096, 16, 256},  {1, 32768, 32, 1024}, {1, 131072, 33, 4032},  {8, 4096, 4, 1024},
              {8, 32768, 4, 8192}, {64, 4096, 1, 4096},  {64, 131072, 1, 131072}};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    const sa_attn a = shape(rows[i].B, 1, rows[i].S, 64, 8, 64, SA_CAUSAL_BOTTOM_RIGHT);
    sa_cuda_plan p;
    const int ok = sa_cuda_plan_pick(&a, SA_PLAN_DECODE, &h200, NULL, (size_t)-1, &p) == SA_OK &&
                   p.family == SA_CUDA_DECODE_MMA && p.dec_pdl == 1 && p.rows == 8 && p.rowgroups == 1 &&
                   p.splits == rows[i].splits && p.chunk == rows[i].chunk &&
                   (int64_t)p.grid[0] * p.grid[1] * p.grid[2] <= (rows[i].B > 8 ? 1 << 30 : 264);
    if (!ok)
      t_report("decode mma B%lld S%lld: splits %lld chunk %lld (want %lld, %lld)", (long long)rows[i].B,
               (long long)rows[i].S, (long long)p.splits, (long long)p.chunk, (long long)rows[i].splits,
               (long long)rows[i].chunk);
    t_count(ok);
  }
  /* sm_80 (an A100's record): the same schedule, the combine a plain launch */
  sa_cuda_device a100 = h200;
  a100.cc_major = 8, a100.sms = a100.ctx_sms = 108, a100.sm90a = 0, a100.smem_per_sm = 167936;
  const sa_attn g = shape(8, 1, 4096, 64, 8, 64, SA_CAUSAL_BOTTOM_RIGHT);
  sa_cuda_plan q;
  t_count(sa_cuda_plan_pick(&g, SA_PLAN_DECODE, &a100, NULL, (size_t)-1, &q) == SA_OK &&
          q.family == SA_CUDA_DECODE_MMA && q.dec_pdl == 0 && q.splits == 1);
  /* rows in groups of 16: 5 tokens of G 8 are 40 rows, 3 groups */
  sa_attn a = shape(2, 5, 1000, 16, 2, 128, SA_CAUSAL_BOTTOM_RIGHT);
  sa_cuda_plan p;
  t_count(sa_cuda_plan_pick(&a, SA_PLAN_DECODE, &h200, "cuda.decode.mma", (size_t)-1, &p) == SA_OK && p.rows == 40 &&
          p.rowgroups == 3 && p.grid[1] == 6);
  a.dtype = SA_F32;
  t_count(sa_cuda_plan_pick(&a, SA_PLAN_DECODE, &h200, "cuda.decode.mma", (size_t)-1, &p) == SA_ERR_UNSUPPORTED &&
          strstr(sa_last_error(), "cuda.decode.mma") && strstr(sa_last_error(), "bf16 / f16"));
  a.dtype = SA_F16, a.v_head_dim = 64;
  t_count(sa_cuda_plan_pick(&a, SA_PLAN_DECODE, &h200, "cuda.decode.mma", (size_t)-1, &p) == SA_ERR_UNSUPPORTED &&
          strstr(sa_last_error(), "H == Hv"));
}

/* The feature plans (bias, mask array, positions, soft-cap) are the default for the calls they take, in both
   directions; every other call with those inputs is refused by name before any kernel (sa_cuda_feature_check, no
   device; sa_cuda_feature_device on the device), so that a caller asking once (Python's routing) runs the
   reference instead. */
static void check_features(void) {
  static const int32_t marker[4] __attribute__((aligned(16))) = {0};
  sa_plan_force(SA_PLAN_FWD, NULL), sa_plan_force(SA_PLAN_BWD, NULL);
  sa_cuda_plan p;
  sa_attn a = shape(2, 256, 256, 4, 2, 64, SA_CAUSAL_NONE);
  t_count(sa_cuda_feature_check(&a, 0) == SA_OK); /* no feature input */
  a.bias = marker, a.bias_dtype = SA_BF16;
  const int64_t bias1nts[4] = {1, 4, 256, 256};
  memcpy(a.bias_dims, bias1nts, sizeof bias1nts);
  t_count(sa_cuda_feature_check(&a, 0) == SA_OK && sa_cuda_feature_device(&a, &h200) == SA_OK);
  t_count(sa_cuda_plan_pick(&a, SA_PLAN_FWD, &h200, NULL, (size_t)-1, &p) == SA_OK &&
          !strcmp(p.name, "hopper.fwd.features"));
  t_count(sa_cuda_plan_pick(&a, SA_PLAN_BWD, &h200, NULL, (size_t)-1, &p) == SA_OK &&
          !strcmp(p.name, "hopper.bwd.twopass.features"));
  /* each call below differs from `a` in one way the feature plans do not take: the reason names the input and why */
  enum { F32, H32, H96, T200, SEGS, MASK_KEYS, MASK_QUERIES, BIAS_ROWS, S128K, CAP_HV, POS_UNALIGNED, N_REFUSED };
  static const char *const want[N_REFUSED] = {
      "bias unsupported by the CUDA backend for this call (plan hopper.fwd.features: dtype is not bf16",
      "head_dim != v_head_dim or not 64 / 128",
      "head_dim != v_head_dim or not 64 / 128",
      "not a positive multiple of 128",
      "mask unsupported by the CUDA backend for this call (plan hopper.fwd.features: the Hopper feature kernels take "
      "no segment ids",
      "take a mask of [B or 1, N or 1, q_len, kv_len]",
      "take a mask of [B or 1, N or 1, q_len, kv_len]",
      "plan hopper.bwd.twopass.features: the Hopper feature kernels take no bias shared by the query rows",
      "take kv_len <= 65536",
      "logits_soft_cap unsupported by the CUDA backend for this call",
      "q_positions / kv_positions unsupported by the CUDA backend for this call (plan hopper.fwd.features: bias, mask "
      "or positions not 16-byte aligned"};
  for (int k = 0; k < N_REFUSED; ++k) {
    sa_attn x = a;
    if (k == F32) x.dtype = SA_F32;
    if (k == H32) x.head_dim = x.v_head_dim = 32;
    if (k == H96) x.head_dim = x.v_head_dim = 96;
    if (k == T200) x.q_len = 200, x.bias_dims[2] = 200;
    if (k >= SEGS && k <= MASK_QUERIES) {
      x.bias = NULL, memset(x.bias_dims, 0, sizeof x.bias_dims);
      x.mask = (const uint8_t *)marker;
      const int64_t m[3][4] = {{2, 1, 256, 256}, {2, 1, 1, 256}, {1, 1, 256, 1}};
      memcpy(x.mask_dims, m[k - SEGS], sizeof m[0]);
      if (k == SEGS) x.q_segment_ids = x.kv_segment_ids = marker;
    }
    if (k == BIAS_ROWS) x.bias_dims[2] = 1;
    if (k == S128K) x.q_len = 128, x.kv_len = 131072, x.bias_dims[2] = 128, x.bias_dims[3] = 131072;
    if (k == CAP_HV)
      x.bias = NULL, memset(x.bias_dims, 0, sizeof x.bias_dims), x.logits_soft_cap = 30.f, x.head_dim = 128;
    if (k == POS_UNALIGNED) {
      x.bias = NULL, memset(x.bias_dims, 0, sizeof x.bias_dims), x.causal = SA_CAUSAL_TOP_LEFT;
      x.q_positions = marker + 1, x.kv_positions = marker;
    }
    const sa_status s = sa_cuda_feature_check(&x, 0);
    int ok = s == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), want[k]) && strstr(sa_last_error(), "SA_BACKEND_CPU");
    if (!ok) t_report("feature refusal %d: status %d '%s'", k, (int)s, sa_last_error());
    /* the backward's pick says the same; listing (test_cuda) leaves the plans to say it */
    ok = ok && sa_cuda_plan_pick(&x, SA_PLAN_BWD, &h200, NULL, (size_t)-1, &p) == SA_ERR_UNSUPPORTED &&
         strstr(sa_last_error(), want[k]) && sa_cuda_feature_check(&x, 1) == SA_OK;
    t_count(ok);
  }
  /* a forced plan: the check lets the call through, the pick of the forced plan says why it is not legal */
  sa_attn rows = a;
  rows.bias_dims[2] = 1;
  t_count(sa_plan_force(SA_PLAN_FWD, "hopper.fwd.features") == SA_OK && sa_cuda_feature_check(&rows, 0) == SA_OK);
  t_count(sa_cuda_plan_pick(&rows, SA_PLAN_FWD, &h200, "hopper.fwd.features", (size_t)-1, &p) == SA_OK);
  t_count(sa_cuda_plan_pick(&rows, SA_PLAN_BWD, &h200, "hopper.bwd.twopass.features", (size_t)-1, &p) ==
              SA_ERR_UNSUPPORTED &&
          strstr(sa_last_error(), "plan hopper.bwd.twopass.features is not legal") &&
          strstr(sa_last_error(), "shared by the query rows"));
  sa_plan_force(SA_PLAN_FWD, NULL);
  /* the TMA feature plans: listed after the verified ones, never the default (not yet run on a GPU), legal when forced
     within their own scope */
  {
    sa_cuda_plan list[16];
    int nf = sa_cuda_plans(&a, SA_PLAN_FWD, &h200, (size_t)-1, list, 16);
    t_count(nf == 3 && !strcmp(list[0].name, "hopper.fwd.features") &&
            !strcmp(list[1].name, "hopper.fwd.features.tma") && !strcmp(list[2].name, "cuda.fwd.portable.features"));
    int nb = sa_cuda_plans(&a, SA_PLAN_BWD, &h200, (size_t)-1, list, 16);
    t_count(nb == 2 && !strcmp(list[1].name, "hopper.bwd.twopass.features.tma") && list[1].ws == list[0].ws);
    t_count(sa_cuda_plan_pick(&a, SA_PLAN_FWD, &h200, "hopper.fwd.features.tma", (size_t)-1, &p) == SA_OK &&
            p.feat == 2 && p.qslots == 1);
    t_count(sa_cuda_plan_pick(&a, SA_PLAN_BWD, &h200, "hopper.bwd.twopass.features.tma", (size_t)-1, &p) == SA_OK &&
            p.feat == 2);
    sa_attn f32 = a; /* an f32 bias tile fits the forward's feature stage at H64, not at H128 */
    f32.bias_dtype = SA_F32;
    t_count(sa_cuda_plan_pick(&f32, SA_PLAN_FWD, &h200, "hopper.fwd.features.tma", (size_t)-1, &p) == SA_OK);
    f32.head_dim = f32.v_head_dim = 128;
    t_count(sa_cuda_plan_pick(&f32, SA_PLAN_FWD, &h200, "hopper.fwd.features.tma", (size_t)-1, &p) ==
                SA_ERR_UNSUPPORTED &&
            strstr(sa_last_error(), "f32 bias tile"));
    t_count(sa_cuda_plan_pick(&f32, SA_PLAN_BWD, &h200, "hopper.bwd.twopass.features.tma", (size_t)-1, &p) == SA_OK);
    t_count(sa_cuda_plan_pick(&rows, SA_PLAN_FWD, &h200, "hopper.fwd.features.tma", (size_t)-1, &p) ==
                SA_ERR_UNSUPPORTED &&
            strstr(sa_last_error(), "[B or 1, N or 1, q_len, kv_len]"));
    /* the class slice of a dK/dV CTA: G x T / 64 bytes, at most SA_HOP_BWD_TMA_CLS */
    sa_attn mq = shape(1, 8192, 8192, 64, 1, 64, SA_CAUSAL_NONE);
    const int64_t m11[4] = {1, 1, 8192, 8192};
    mq.mask = (const uint8_t *)marker, memcpy(mq.mask_dims, m11, sizeof m11);
    t_count(sa_cuda_plan_pick(&mq, SA_PLAN_BWD, &h200, "hopper.bwd.twopass.features.tma", (size_t)-1, &p) ==
                SA_ERR_UNSUPPORTED &&
            strstr(sa_last_error(), "class slice"));
    mq.q_len = mq.kv_len = mq.mask_dims[2] = mq.mask_dims[3] = 4096;
    t_count(sa_cuda_plan_pick(&mq, SA_PLAN_BWD, &h200, "hopper.bwd.twopass.features.tma", (size_t)-1, &p) == SA_OK);
    nb = sa_cuda_plans(&mq, SA_PLAN_BWD, &h200, (size_t)-1, list, 16);
    t_count(nb == 3 && sa_cuda_plan_pick(&mq, SA_PLAN_BWD, &h200, NULL, (size_t)-1, &p) == SA_OK &&
            !strcmp(p.name, "hopper.bwd.twopass.features") && !strcmp(list[2].name, "cuda.bwd.portable.features"));
    /* the portable feature plans (sm_80+): listed last, never the default (not yet run on a GPU), forceable on any
       device; no dbias, so the backward refuses a bias; 16-bit dtypes, no segment ids */
    sa_cuda_device a100p = h200;
    a100p.cc_major = 8, a100p.sm90a = 0;
    t_count(sa_cuda_plans(&mq, SA_PLAN_BWD, &a100p, (size_t)-1, list, 16) == 1 &&
            !strcmp(list[0].name, "cuda.bwd.portable.features") &&
            sa_cuda_plan_pick(&mq, SA_PLAN_BWD, &a100p, NULL, (size_t)-1, &p) == SA_ERR_UNSUPPORTED &&
            sa_cuda_plan_pick(&mq, SA_PLAN_BWD, &a100p, "cuda.bwd.portable.features", (size_t)-1, &p) == SA_OK &&
            p.feat == 1 && p.family == SA_CUDA_BWD_PORTABLE);
    t_count(sa_cuda_plan_pick(&a, SA_PLAN_FWD, &a100p, "cuda.fwd.portable.features", (size_t)-1, &p) == SA_OK &&
            p.feat == 1 && p.family == SA_CUDA_FWD_PORTABLE);
    t_count(sa_cuda_plan_pick(&a, SA_PLAN_BWD, &a100p, "cuda.bwd.portable.features", (size_t)-1, &p) ==
                SA_ERR_UNSUPPORTED &&
            strstr(sa_last_error(), "takes no bias"));
    sa_attn ms = mq;
    ms.q_segment_ids = ms.kv_segment_ids = marker;
    t_count(sa_cuda_plan_pick(&ms, SA_PLAN_FWD, &a100p, "cuda.fwd.portable.features", (size_t)-1, &p) ==
                SA_ERR_UNSUPPORTED &&
            strstr(sa_last_error(), "no segment ids"));
    ms = mq;
    ms.dtype = SA_F32;
    t_count(sa_cuda_plan_pick(&ms, SA_PLAN_FWD, &a100p, "cuda.fwd.portable.features", (size_t)-1, &p) ==
                SA_ERR_UNSUPPORTED &&
            strstr(sa_last_error(), "bf16 / f16"));
    nf = sa_plan_force(SA_PLAN_FWD, "hopper.fwd.features.tma") == SA_OK; /* a name sa_plan_force knows */
    t_count(nf);
    sa_plan_force(SA_PLAN_FWD, NULL);
  }
  /* the device's part: no sm_90a code (an A100), the Hopper kernels switched off */
  sa_cuda_device a100 = h200, off = h200;
  a100.cc_major = 8, a100.sm90a = 0, off.hopper_off = 1;
  t_count(sa_cuda_feature_device(&a, &a100) == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), "no sm_90a code") &&
          strstr(sa_last_error(), "bias"));
  t_count(sa_cuda_feature_device(&a, &off) == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), "SINKATTN_CUDA_HOPPER=0"));
  t_count(sa_cuda_plan_pick(&a, SA_PLAN_FWD, &a100, NULL, (size_t)-1, &p) == SA_ERR_UNSUPPORTED &&
          strstr(sa_last_error(), "no sm_90a code"));
}

/* The variants that bench/gpu_verify.sh PART=perf33 times against the defaults. */
static void check_variants(void) {
  /* the one pass that waits: the default one pass's schedule, grid and workspace, the WAIT kernels */
  sa_attn a = shape(16, 1024, 1024, 32, 32, 64, SA_CAUSAL_TOP_LEFT);
  sa_cuda_plan d, w, nw;
  char desc[384];
  int ok = sa_cuda_plan_pick(&a, SA_PLAN_BWD, &h200, NULL, (size_t)-1, &d) == SA_OK &&
           !strcmp(d.name, "hopper.bwd.onepass") &&
           sa_cuda_plan_pick(&a, SA_PLAN_BWD, &h200, "hopper.bwd.onepass.wait", (size_t)-1, &w) == SA_OK &&
           w.family == SA_CUDA_BWD_ONEPASS && w.op_wait == 1 && w.cooperative == 1 && w.grid[0] == d.grid[0] &&
           w.ws == d.ws && w.items == d.items && w.split == d.split &&
           sa_cuda_plan_pick(&a, SA_PLAN_BWD, &h200, "hopper.bwd.onepass.narrow.wait", (size_t)-1, &nw) == SA_OK &&
           nw.op_wait == 1 && nw.grid[0] == nw.nkb;
  sa_cuda_plan_describe(&w, desc, sizeof desc);
  ok = ok && strstr(desc, " wait=1") != NULL;
  if (!ok)
    t_report("hopper.bwd.onepass.wait: op_wait %d / %d, grid %d / %d, '%s'", d.op_wait, w.op_wait, d.grid[0], w.grid[0],
             desc);
  t_count(ok);
  a.window_left = 127, a.window_right = 0; /* the one pass's scope: the waiting one too */
  t_count(sa_cuda_plan_pick(&a, SA_PLAN_BWD, &h200, "hopper.bwd.onepass.wait", (size_t)-1, &w) == SA_ERR_UNSUPPORTED &&
          strstr(sa_last_error(), "hopper.bwd.onepass.wait") && strstr(sa_last_error(), "window"));
  /* decode: 50 / 200 / 400% of the default's splits at gpt-oss B8 S4k (4 splits of 1024 keys) */
  static const struct {
    const char *name;
    int64_t B, splits, chunk;
  } dec[] = {{"cuda.decode.mma.half", 8, 2, 2048},
             {"cuda.decode.mma.x2", 8, 8, 512},
             {"cuda.decode.mma.x4", 8, 16, 256},
             {"cuda.decode.mma.x2", 64, 2, 2048},
             {"cuda.decode.mma.x4", 64, 4, 1024}};
  for (size_t i = 0; i < sizeof dec / sizeof dec[0]; i++) {
    const sa_attn g = shape(dec[i].B, 1, 4096, 64, 8, 64, SA_CAUSAL_BOTTOM_RIGHT);
    sa_cuda_plan p;
    ok = sa_cuda_plan_pick(&g, SA_PLAN_DECODE, &h200, dec[i].name, (size_t)-1, &p) == SA_OK &&
         p.family == SA_CUDA_DECODE_MMA && p.splits == dec[i].splits && p.chunk == dec[i].chunk &&
         p.grid[0] == p.splits && p.dec_pdl == 1;
    if (!ok)
      t_report("%s B%lld: splits %lld chunk %lld", dec[i].name, (long long)dec[i].B, (long long)p.splits,
               (long long)p.chunk);
    t_count(ok);
  }
  /* B64 S4k has one split by default: half of it is the same count, not a plan of its own */
  const sa_attn g = shape(64, 1, 4096, 64, 8, 64, SA_CAUSAL_BOTTOM_RIGHT);
  sa_cuda_plan p;
  t_count(sa_cuda_plan_pick(&g, SA_PLAN_DECODE, &h200, "cuda.decode.mma.half", (size_t)-1, &p) == SA_ERR_UNSUPPORTED &&
          strstr(sa_last_error(), "split count of cuda.decode.mma"));
  sa_cuda_plan list[16];
  const int n = sa_cuda_plans(&g, SA_PLAN_DECODE, &h200, (size_t)-1, list, 16);
  t_count(n == 5 && !strcmp(list[0].name, "cuda.decode.mma"));
}

/* Every case of the golden record's shapes: the list, the picks, the workspace. */
static void check_cases(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) {
    t_report("cannot open %s", path);
    t_count(0);
    return;
  }
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    const char *bar = strstr(line, " | ");
    if (line[0] == '#' || !bar) continue;
    char dt[8], sm[16], ca[16];
    long long B, T, S, N, K, H, Hv, wl, wr, diag;
    int lens, segs;
    if (sscanf(bar + 3, "%7s %lld %lld %lld %lld %lld %lld %lld %15s %15s %lld %lld %lld %d %d", dt, &B, &T, &S, &N, &K,
               &H, &Hv, sm, ca, &wl, &wr, &diag, &lens, &segs) != 15)
      continue;
    static const int32_t marker[4] __attribute__((aligned(16))) = {0};
    sa_attn a = shape(B, T, S, N, K, H,
                      !strcmp(ca, "top_left")       ? SA_CAUSAL_TOP_LEFT
                      : !strcmp(ca, "bottom_right") ? SA_CAUSAL_BOTTOM_RIGHT
                                                    : SA_CAUSAL_NONE);
    a.dtype = !strcmp(dt, "f16") ? SA_F16 : !strcmp(dt, "f32") ? SA_F32 : SA_BF16;
    a.v_head_dim = Hv, a.window_left = wl, a.window_right = wr, a.diag_offset = diag;
    a.softmax = !strcmp(sm, "vanilla")      ? SA_SOFTMAX_VANILLA
                : !strcmp(sm, "off_by_one") ? SA_SOFTMAX_OFF_BY_ONE
                                            : SA_SOFTMAX_LEARNABLE;
    if (lens) a.q_lens = a.kv_lens = marker;
    if (segs) a.q_segment_ids = a.kv_segment_ids = marker;
    for (int which = 0; which < SA_PLAN_KINDS; which++) {
      if (which == SA_PLAN_DECODE && T > 64) continue;
      sa_cuda_plan list[16], p;
      const int np = sa_cuda_plans(&a, which, &h200, (size_t)-1, list, 16);
      /* the default is the first listed plan; float32 attention has none (its only plans, cuda.*.portable.f32,
         are override-only), and every listed plan is forceable */
      const int dflt = sa_cuda_plan_pick(&a, which, &h200, NULL, (size_t)-1, &p) == SA_OK;
      int ok = np > 0 && (dflt ? !strcmp(p.name, list[0].name) : a.dtype == SA_F32 && which != SA_PLAN_DECODE);
      for (int i = 0; ok && i < np && i < 16; i++) {
        char desc[384];
        ok =
            sa_cuda_plan_pick(&a, which, &h200, list[i].name, (size_t)-1, &p) == SA_OK && !strcmp(p.name, list[i].name);
        sa_cuda_plan_describe(&p, desc, sizeof desc);
        ok = ok && sa_plan_force(which, list[i].name) == SA_OK; /* sa_plan_force knows every listed name */
        ok = ok && !strncmp(desc, p.name, strlen(p.name)) && desc[strlen(p.name)] == ' ';
        if (ok && which == SA_PLAN_BWD) { /* the need is the workspace: with exactly it the plan stays legal */
          sa_cuda_plan q;
          ok = sa_cuda_plan_pick(&a, which, &h200, p.name, p.ws, &q) == SA_OK && q.ws == p.ws &&
               p.ws >= sa_cuda_bwd_common_ws(&a);
          if (ok && p.family == SA_CUDA_BWD_ONEPASS)
            ok = sa_cuda_plan_pick(&a, which, &h200, p.name, p.ws - 1, &q) == SA_ERR_UNSUPPORTED;
        }
        if (!ok) t_report("%.60s: kind %d plan %s", line, which, list[i].name);
      }
      if (np <= 0) t_report("%.60s: kind %d has no plan", line, which);
      t_count(ok);
    }
    n++;
  }
  fclose(f);
  t_count(n >= 100);
}

int main(int argc, char **argv) {
  check_old_device();
  check_force();
  check_decode_mma();
  check_features();
  check_variants();
  check_cases(argc > 1 ? argv[1] : "tests/plan/cases.txt");
  sa_plan_force(SA_PLAN_FWD, NULL), sa_plan_force(SA_PLAN_BWD, NULL), sa_plan_force(SA_PLAN_DECODE, NULL);
  printf("test_plan: %d passed, %d failed\n", t_passed, t_failed);
  return t_failed ? 1 : 0;
}
