/*
 * sa_test_invalid.h — every argument of sa_attn / sa_attn_grad / the backend enum made wrong in turn:
 * each call must return its status AND leave a message naming the field (a status alone does not tell
 * a user which of 20 fields to fix). Also: status names, and sa_last_error cleared by a good call.
 */
#ifndef SA_TEST_INVALID_H
#define SA_TEST_INVALID_H

#include "sa_test.h"

enum { T_CALL_CHECK, T_CALL_FWD, T_CALL_BWD };

/* A valid problem (B=2 T=3 S=4 N=4 K=2 H=8 Hv=8, f32, learnable, lengths and segments) that each
   entry of the table breaks in one place. Static storage: the table only reads it. */
static float ti_q[2 * 3 * 4 * 8], ti_k[2 * 4 * 2 * 8], ti_v[2 * 4 * 2 * 8], ti_out[2 * 3 * 4 * 8];
static float ti_lse[2 * 4 * 3], ti_dq[2 * 3 * 4 * 8], ti_dk[2 * 4 * 2 * 8], ti_dv[2 * 4 * 2 * 8];
static float ti_sinks[4], ti_dsinks[4], ti_bias[2 * 4 * 3 * 4], ti_dbias[2 * 4 * 3 * 4];
static uint8_t ti_mask[2 * 4 * 3 * 4];
static int32_t ti_qlens[2] = {3, 2}, ti_kvlens[2] = {4, 1}, ti_qseg[6], ti_kvseg[8], ti_qpos[6], ti_kvpos[8];

static void t_inv_base(sa_attn *a, sa_attn_grad *g) {
  sa_attn_init(a);
  a->dtype = SA_F32;
  a->batch = 2;
  a->q_len = 3;
  a->kv_len = 4;
  a->q_heads = 4;
  a->kv_heads = 2;
  a->head_dim = 8;
  a->v_head_dim = 8;
  a->q = ti_q;
  a->k = ti_k;
  a->v = ti_v;
  a->out = ti_out;
  a->lse = ti_lse;
  a->softmax = SA_SOFTMAX_LEARNABLE;
  a->sinks = ti_sinks;
  a->q_lens = ti_qlens;
  a->kv_lens = ti_kvlens;
  a->q_segment_ids = ti_qseg;
  a->kv_segment_ids = ti_kvseg;
  a->causal = SA_CAUSAL_BOTTOM_RIGHT;
  memset(g, 0, sizeof *g);
  g->dout = ti_out;
  g->dq = ti_dq;
  g->dk = ti_dk;
  g->dv = ti_dv;
  g->dsinks = ti_dsinks;
}

static int t_inv_run(int call, const sa_attn *a, const sa_attn_grad *g, sa_backend be) {
  switch (call) {
    case T_CALL_CHECK: return sa_attn_check(a, be);
    case T_CALL_FWD: return sa_attn_fwd(a, be, NULL);
    default: return sa_attn_bwd(a, g, NULL, 0, be, NULL);
  }
}

static int ti_pass, ti_total;

static void t_inv_expect(const char *what, int call, const sa_attn *a, const sa_attn_grad *g, sa_backend be,
                         sa_status want, const char *needle) {
  static const char *calls[] = {"sa_attn_check", "sa_attn_fwd", "sa_attn_bwd"};
  sa_status s = (sa_status)t_inv_run(call, a, g, be);
  const char *msg = sa_last_error();
  int ok = s == want && msg && strstr(msg, needle) != NULL;
  if (!ok)
    t_report("invalid [%s] %s(backend %d): got %s \"%s\", want %s with \"%s\" in the message", what, calls[call],
             (int)be, sa_status_name(s), msg ? msg : "(null)", sa_status_name(want), needle);
  ti_total++;
  ti_pass += ok;
  t_count(ok);
}

/* One table row: start from the valid base, apply CODE (which may also set the pointers ap / gp that
   are passed), expect WANT and NEEDLE, for each host backend. */
/* The base problem with a full bias, a mask and positions (causal top-left: bottom-right excludes
   positions), and dbias. */
static void t_inv_extras(sa_attn *a, sa_attn_grad *g) {
  const int64_t full[4] = {2, 4, 3, 4};
  a->bias = ti_bias;
  a->bias_dtype = SA_F32;
  a->mask = ti_mask;
  memcpy(a->bias_dims, full, sizeof full);
  memcpy(a->mask_dims, full, sizeof full);
  a->q_positions = ti_qpos;
  a->kv_positions = ti_kvpos;
  a->causal = SA_CAUSAL_TOP_LEFT;
  g->dbias = ti_dbias;
}

#define T_INV(call, want, needle, code)                                                 \
  for (int bi = 0; bi < 3; bi++) {                                                      \
    static const sa_backend bes[3] = {SA_BACKEND_REF, SA_BACKEND_CPU, SA_BACKEND_AUTO}; \
    sa_attn a;                                                                          \
    sa_attn_grad g;                                                                     \
    sa_backend be = bes[bi];                                                            \
    const sa_attn *ap = &a;                                                             \
    const sa_attn_grad *gp = &g;                                                        \
    t_inv_base(&a, &g);                                                                 \
    code;                                                                               \
    t_inv_expect(#code, call, ap, gp, be, want, needle);                                \
  }

static void t_invalid_group(void) {
  const sa_status INV = SA_ERR_INVALID;
  for (int i = 0; i < 6; i++) ti_qseg[i] = i % 2;
  for (int i = 0; i < 8; i++) ti_kvseg[i] = i % 3 == 0;

  /* sizes and enums */
  T_INV(T_CALL_FWD, INV, "dtype", a.dtype = (sa_dtype)3);
  T_INV(T_CALL_FWD, INV, "dtype", a.dtype = (sa_dtype)-1);
  T_INV(T_CALL_FWD, INV, "batch", a.batch = -1);
  T_INV(T_CALL_FWD, INV, "q_len", a.q_len = -2);
  T_INV(T_CALL_FWD, INV, "kv_len", a.kv_len = -1);
  T_INV(T_CALL_FWD, INV, "q_heads", a.q_heads = 0);
  T_INV(T_CALL_FWD, INV, "kv_heads", a.kv_heads = 0);
  T_INV(T_CALL_FWD, INV, "kv_heads", a.kv_heads = -4);
  T_INV(T_CALL_FWD, INV, "q_heads", a.q_heads = 6; a.kv_heads = 4);
  T_INV(T_CALL_FWD, INV, "head_dim", a.head_dim = 0);
  T_INV(T_CALL_FWD, INV, "v_head_dim", a.v_head_dim = -8);
  T_INV(T_CALL_FWD, INV, "softmax", a.softmax = (sa_softmax)3);
  T_INV(T_CALL_FWD, INV, "causal", a.causal = (sa_causal)7);
  T_INV(T_CALL_FWD, INV, "window_left", a.window_left = -2);
  T_INV(T_CALL_FWD, INV, "window_right", a.window_right = -5);
  T_INV(T_CALL_FWD, INV, "diag_offset", a.diag_offset = (int64_t)1 << 40);
  T_INV(T_CALL_FWD, INV, "diag_offset", a.diag_offset = -((int64_t)1 << 41));
  T_INV(T_CALL_FWD, INV, "scale", a.scale = NAN);
  T_INV(T_CALL_FWD, INV, "scale", a.scale = INFINITY);
  T_INV(T_CALL_FWD, INV,
        "logits_soft_cap -1 invalid: must be > 0 with cap * log2(e) a finite float (cap <= 2.35e38), or 0 for none",
        a.logits_soft_cap = -1.0f);
  T_INV(T_CALL_FWD, INV, "logits_soft_cap nan invalid: must be > 0 with cap * log2(e) a finite float",
        a.logits_soft_cap = NAN);
  T_INV(T_CALL_BWD, INV, "logits_soft_cap inf invalid: must be > 0 with cap * log2(e) a finite float",
        a.logits_soft_cap = INFINITY);
  T_INV(T_CALL_CHECK, INV, "logits_soft_cap -inf invalid", a.logits_soft_cap = -INFINITY);
  T_INV(T_CALL_FWD, INV, "logits_soft_cap -1e-30 invalid", a.logits_soft_cap = -1e-30f);
  T_INV(T_CALL_BWD, INV, "logits_soft_cap 3e+38 invalid", a.logits_soft_cap = 3e38f); /* cap log2(e) overflows */
  T_INV(T_CALL_FWD, INV, "q: size", a.head_dim = (int64_t)1 << 60);
  T_INV(T_CALL_FWD, INV, "k: size", a.kv_len = (int64_t)1 << 61);
  T_INV(T_CALL_FWD, INV, "v: size", a.v_head_dim = (int64_t)1 << 60);
  T_INV(T_CALL_CHECK, INV, "batch", a.batch = INT64_MIN);
  /* pointers and options */
  T_INV(T_CALL_FWD, INV, "sinks", a.sinks = NULL);
  T_INV(T_CALL_FWD, INV, "q is NULL", a.q = NULL);
  T_INV(T_CALL_FWD, INV, "k is NULL", a.k = NULL);
  T_INV(T_CALL_FWD, INV, "v is NULL", a.v = NULL);
  T_INV(T_CALL_FWD, INV, "out is NULL", a.out = NULL);
  T_INV(T_CALL_FWD, INV, "kv_segment_ids", a.kv_segment_ids = NULL);
  T_INV(T_CALL_FWD, INV, "q_segment_ids", a.q_segment_ids = NULL);
  T_INV(T_CALL_CHECK, INV, "sinks", a.sinks = NULL);
  T_INV(T_CALL_CHECK, INV, "backend", be = (sa_backend)4);
  T_INV(T_CALL_FWD, INV, "backend", be = (sa_backend)-1);
  T_INV(T_CALL_BWD, INV, "backend", be = (sa_backend)9);
  T_INV(T_CALL_FWD, INV, "attn", ap = NULL);
  T_INV(T_CALL_CHECK, INV, "attn", ap = NULL);
  T_INV(T_CALL_BWD, INV, "attn", ap = NULL);
  /* the backward: the attn fields again (it validates the same struct), then the grad */
  T_INV(T_CALL_BWD, INV, "head_dim", a.head_dim = -1);
  T_INV(T_CALL_BWD, INV, "sinks", a.sinks = NULL);
  T_INV(T_CALL_BWD, INV, "lse", a.lse = NULL);
  T_INV(T_CALL_BWD, INV, "out is NULL", a.out = NULL);
  T_INV(T_CALL_BWD, INV, "dout", g.dout = NULL);
  T_INV(T_CALL_BWD, INV, "dq", g.dq = NULL);
  T_INV(T_CALL_BWD, INV, "dk", g.dk = NULL);
  T_INV(T_CALL_BWD, INV, "dv", g.dv = NULL);
  T_INV(T_CALL_BWD, INV, "grad", gp = NULL);
  T_INV(T_CALL_BWD, INV, "q_segment_ids", a.q_segment_ids = NULL);
  /* bias, mask, positions, dbias */
  T_INV(T_CALL_FWD, INV, "bias_dims[2] 7 invalid: must be 1 or q_len 3", t_inv_extras(&a, &g); a.bias_dims[2] = 7);
  T_INV(T_CALL_FWD, INV, "bias_dims[0] 0 invalid: must be 1 or batch 2", t_inv_extras(&a, &g); a.bias_dims[0] = 0);
  T_INV(T_CALL_CHECK, INV, "bias_dims[3] -1 invalid", t_inv_extras(&a, &g); a.bias_dims[3] = -1);
  T_INV(T_CALL_BWD, INV, "bias_dims[1] 2 invalid: must be 1 or q_heads 4", t_inv_extras(&a, &g); a.bias_dims[1] = 2);
  T_INV(T_CALL_FWD, INV, "bias_dtype 9 invalid: use SA_F32 (0), SA_F16 (1) or SA_BF16 (2)", t_inv_extras(&a, &g);
        a.bias_dtype = (sa_dtype)9);
  T_INV(T_CALL_FWD, INV, "bias_dtype -1 invalid", a.bias_dtype = (sa_dtype)-1);
  T_INV(T_CALL_FWD, INV, "bias is set but bias_dims[0] is 0", t_inv_extras(&a, &g); memset(a.bias_dims, 0, 32));
  T_INV(T_CALL_FWD, INV, "bias is NULL but bias_dims is [2, 4, 3, 4]", t_inv_extras(&a, &g); a.bias = NULL);
  T_INV(T_CALL_FWD, INV, "mask_dims[3] 5 invalid: must be 1 or kv_len 4", t_inv_extras(&a, &g); a.mask_dims[3] = 5);
  T_INV(T_CALL_BWD, INV, "mask_dims[0] 3 invalid", t_inv_extras(&a, &g); a.mask_dims[0] = 3);
  T_INV(T_CALL_FWD, INV, "mask is set but mask_dims[0] is 0", t_inv_extras(&a, &g); memset(a.mask_dims, 0, 32));
  T_INV(T_CALL_FWD, INV, "mask is NULL but mask_dims is [2, 4, 3, 4]", t_inv_extras(&a, &g); a.mask = NULL);
  T_INV(T_CALL_FWD, INV, "bias: size", t_inv_extras(&a, &g); a.q_len = a.kv_len = (int64_t)1 << 31;
        a.bias_dims[2] = a.bias_dims[3] = (int64_t)1 << 31; a.mask = NULL; memset(a.mask_dims, 0, 32));
  T_INV(T_CALL_FWD, INV, "q_positions is NULL but kv_positions is set", t_inv_extras(&a, &g); a.q_positions = NULL);
  T_INV(T_CALL_BWD, INV, "kv_positions is NULL but q_positions is set", t_inv_extras(&a, &g); a.kv_positions = NULL);
  T_INV(T_CALL_FWD, INV, "causal SA_CAUSAL_BOTTOM_RIGHT (2) invalid with q_positions", t_inv_extras(&a, &g);
        a.causal = SA_CAUSAL_BOTTOM_RIGHT);
  T_INV(T_CALL_BWD, INV, "dbias is set but bias is NULL", g.dbias = ti_dbias);
  T_INV(T_CALL_BWD, INV, "dbias is set but bias is NULL", t_inv_extras(&a, &g); a.bias = NULL;
        memset(a.bias_dims, 0, 32));
  T_INV(T_CALL_FWD, SA_OK, "", t_inv_extras(&a, &g));
  T_INV(T_CALL_BWD, SA_OK, "", t_inv_extras(&a, &g));
  T_INV(T_CALL_BWD, SA_OK, "", t_inv_extras(&a, &g); g.dbias = NULL);
  T_INV(T_CALL_BWD, SA_OK, "", t_inv_extras(&a, &g); a.bias_dims[0] = a.bias_dims[2] = 1; a.mask_dims[1] = 1;
        a.bias_dtype = SA_BF16);
  /* an empty bias may be NULL (as every empty buffer), and still has a dbias (of zeros) */
  T_INV(T_CALL_BWD, SA_OK, "", t_inv_extras(&a, &g); a.q_len = 0; a.q = a.out = NULL; a.lse = NULL; g.dq = NULL;
        g.dout = NULL; a.bias_dims[2] = 0; a.bias = NULL; a.mask = NULL; memset(a.mask_dims, 0, 32));
  /* what the CUDA kernels do not take (sizes outside the feature plans' scope) is named whether or not this build has
     them */
  {
    static const char *needles[4] = {"bias unsupported by the CUDA backend", "mask unsupported by the CUDA backend",
                                     "q_positions / kv_positions unsupported by the CUDA backend",
                                     "logits_soft_cap unsupported by the CUDA backend"};
    for (int w = 0; w < 4; w++) {
      sa_attn a;
      sa_attn_grad g;
      t_inv_base(&a, &g);
      t_inv_extras(&a, &g);
      a.logits_soft_cap = 30.0f;
      if (w > 2) { a.q_positions = a.kv_positions = NULL; }
      if (w > 0) {
        a.bias = NULL;
        memset(a.bias_dims, 0, 32);
      }
      if (w > 1) {
        a.mask = NULL;
        memset(a.mask_dims, 0, 32);
      }
      sa_status st = sa_check_cuda_inputs(&a);
      int ok = st == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), needles[w]) != NULL;
      if (!ok)
        t_report("sa_check_cuda_inputs: got %s \"%s\", want \"%s\"", sa_status_name(st), sa_last_error(), needles[w]);
      t_count(ok);
      ti_total++;
      ti_pass += ok;
    }
  }
  /* no CUDA in this build: the CUDA backend says so instead of crashing on host pointers */
  if (!sa_has_cuda()) {
    T_INV(T_CALL_FWD, SA_ERR_DEVICE, "CUDA", be = SA_BACKEND_CUDA);
    T_INV(T_CALL_BWD, SA_ERR_DEVICE, "CUDA", be = SA_BACKEND_CUDA);
  }

  /* Not errors: empty problems need no pointers; dlse, dsinks, lse (forward) may be NULL; lengths are
     data and clamp; a sink array given to a non-learnable softmax is ignored. */
  T_INV(T_CALL_FWD, SA_OK, "", a.batch = 0; a.q = a.k = a.v = a.out = NULL);
  T_INV(T_CALL_FWD, SA_OK, "", a.q_len = 0; a.q = a.out = NULL);
  T_INV(T_CALL_BWD, SA_OK, "", a.q_len = 0; a.q = a.out = NULL; a.lse = NULL; g.dq = NULL; g.dout = NULL);
  T_INV(T_CALL_FWD, SA_OK, "", a.lse = NULL);
  T_INV(T_CALL_BWD, SA_OK, "", g.dsinks = NULL);
  T_INV(T_CALL_FWD, SA_OK, "", a.softmax = SA_SOFTMAX_OFF_BY_ONE);
  T_INV(T_CALL_FWD, SA_OK, "", a.softmax = SA_SOFTMAX_VANILLA; a.sinks = NULL);
  T_INV(T_CALL_FWD, SA_OK, "", a.diag_offset = ((int64_t)1 << 40) - 1; a.window_left = INT64_MAX);

  /* a good call clears the previous message */
  for (int bi = 0; bi < 3; bi++) {
    static const sa_backend bes[3] = {SA_BACKEND_REF, SA_BACKEND_CPU, SA_BACKEND_AUTO};
    sa_attn a;
    sa_attn_grad g;
    t_inv_base(&a, &g);
    a.dtype = (sa_dtype)9;
    sa_attn_fwd(&a, bes[bi], NULL);
    t_inv_base(&a, &g);
    sa_status s1 = sa_attn_fwd(&a, bes[bi], NULL);
    int ok1 = s1 == SA_OK && sa_last_error()[0] == '\0';
    a.dtype = (sa_dtype)9;
    sa_attn_fwd(&a, bes[bi], NULL);
    t_inv_base(&a, &g);
    sa_status s2 = sa_attn_bwd(&a, &g, NULL, 0, bes[bi], NULL);
    int ok2 = s2 == SA_OK && sa_last_error()[0] == '\0';
    if (!ok1 || !ok2)
      t_report("sa_last_error after a good call (backend %d): fwd %s \"%s\", bwd %s", (int)bes[bi], sa_status_name(s1),
               ok1 ? "" : sa_last_error(), sa_status_name(s2));
    t_count(ok1 && ok2);
    ti_total++;
    ti_pass += ok1 && ok2;
  }

  /* the workspace query: 0 for an invalid problem (sa_attn_bwd then says why) and for REF */
  {
    sa_attn a;
    sa_attn_grad g;
    t_inv_base(&a, &g);
    size_t w_ref = sa_attn_bwd_workspace_size(&a, SA_BACKEND_REF),
           w_null = sa_attn_bwd_workspace_size(NULL, SA_BACKEND_CPU);
    size_t w_be = sa_attn_bwd_workspace_size(&a, (sa_backend)5);
    a.kv_heads = 3;
    size_t w_bad = sa_attn_bwd_workspace_size(&a, SA_BACKEND_CPU);
    /* sizes whose element count overflows int64 are invalid for the size queries too (they once got
       a wrapped product back) */
    t_inv_base(&a, &g);
    a.q_len = (int64_t)1 << 62;
    size_t w_big = sa_attn_bwd_workspace_size(&a, SA_BACKEND_CPU) + sa_attn_bwd_workspace_size(&a, SA_BACKEND_AUTO);
    a.q_len = 3;
    a.kv_len = INT64_MAX;
    w_big += sa_attn_decode_workspace_size(&a, SA_BACKEND_CPU) + sa_attn_bwd_workspace_size(&a, SA_BACKEND_CPU);
    int ok = w_ref == 0 && w_null == 0 && w_be == 0 && w_bad == 0 && w_big == 0;
    if (!ok)
      t_report(
          "sa_attn_bwd_workspace_size: REF %zu, NULL attn %zu, bad backend %zu, bad kv_heads %zu, "
          "overflowing sizes %zu (all must be 0)",
          w_ref, w_null, w_be, w_bad, w_big);
    t_count(ok);
    ti_total++;
    ti_pass += ok;
  }

  /* status names */
  static const char *names[] = {"SA_OK", "SA_ERR_INVALID", "SA_ERR_UNSUPPORTED", "SA_ERR_NO_MEMORY", "SA_ERR_DEVICE"};
  int names_ok = 1;
  for (int s = 0; s < 5; s++) names_ok &= strcmp(sa_status_name((sa_status)s), names[s]) == 0;
  names_ok &= sa_status_name((sa_status)77) != NULL && strcmp(sa_status_name((sa_status)77), "SA_OK") != 0;
  if (!names_ok) t_report("sa_status_name: wrong name for a status");
  t_count(names_ok);
  ti_total++;
  ti_pass += names_ok;

  printf("invalid arguments (status + message naming the field, REF/CPU/AUTO): %d/%d pass\n", ti_pass, ti_total);
}

#endif /* SA_TEST_INVALID_H */
