/*
 * sa_test_fd.h — the reference backward against central finite differences of the reference forward,
 * all in fp64 (sa_ref_fwd64 / sa_ref_bwd64). The loss is L = sum(W_o * out) + sum(W_l * lse), so the
 * analytic gradient is sa_ref_bwd64 with dout = W_o and dlse = W_l (or no dlse when W_l = 0). With a bias,
 * dbias is checked the same way, and the mask array and positions change which pairs every gradient sums.
 *
 * Step h = 1e-5: the truncation error is O(h^2) ~ 1e-10 and the rounding error ~ eps*|L|/h ~ 1e-10
 * for |L| ~ 10, so 1e-7 (absolute + relative) separates a right gradient from a wrong one by 1e4.
 */
#ifndef SA_TEST_FD_H
#define SA_TEST_FD_H

#include "ref/ref_attn.h"
#include "sa_test.h"

typedef struct {
  const char *name;
  sa_softmax softmax;
  sa_causal causal;
  int64_t wl, wr, diag;
  int lens, segs, dlse;
  int64_t H, Hv;
  int bias;      /* T_BCAST form or 0; one element is -inf (its gradient is 0 either way) */
  int mask;      /* T_BCAST form or 0 */
  int positions; /* 1: random positions (causal and window then compare them) */
  float cap;     /* logits_soft_cap (0: none) */
  double sink;   /* sinks drawn from U(-sink, sink), one of them +-sink exactly (0: U(-2, 2)) */
} t_fd_case;

typedef struct {
  const sa_attn *a;
  double *q, *k, *v, *sinks, *bias, *wo, *wl, *out, *lse;
} t_fd_ctx;

static double t_fd_loss(t_fd_ctx *c) {
  const sa_attn *a = c->a;
  int64_t no = a->batch * a->q_len * a->q_heads * a->v_head_dim, nl = a->batch * a->q_heads * a->q_len;
  sa_ref_fwd64(a, c->q, c->k, c->v, c->sinks, c->bias, c->out, c->lse);
  double L = 0.0;
  for (int64_t i = 0; i < no; i++) L += c->wo[i] * c->out[i];
  for (int64_t i = 0; i < nl; i++) L += c->wl[i] != 0.0 ? c->wl[i] * c->lse[i] : 0.0;
  return L;
}

/* Central difference of L in every element of x[0..n) against the analytic g; returns bad count. */
static int64_t t_fd_tensor(t_fd_ctx *c, const char *tag, const char *what, double *x, const double *g, int64_t n) {
  const double h = 1e-5;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    double x0 = x[i];
    x[i] = x0 + h;
    double lp = t_fd_loss(c);
    x[i] = x0 - h;
    double lm = t_fd_loss(c);
    x[i] = x0;
    double num = (lp - lm) / (2.0 * h);
    if (!(fabs(num - g[i]) <= 1e-7 * (1.0 + fabs(g[i])))) {
      if (!bad)
        t_report("fd %s: d%s[%lld] analytic %.12g, finite difference %.12g", tag, what, (long long)i, g[i], num);
      bad++;
    }
  }
  return bad;
}

/* B=2, T=5, S=7, N=4, K=2: small enough for ~2*(q+k+v+N+bias) = ~700-1300 forward calls per case. */
static int t_fd_one(const t_fd_case *fc, t_rng *r) {
  sa_attn a;
  sa_attn_init(&a);
  a.dtype = SA_F32;
  a.batch = 2;
  a.q_len = 5;
  a.kv_len = 7;
  a.q_heads = 4;
  a.kv_heads = 2;
  a.head_dim = fc->H;
  a.v_head_dim = fc->Hv;
  a.softmax = fc->softmax;
  a.causal = fc->causal;
  a.window_left = fc->wl;
  a.window_right = fc->wr;
  a.diag_offset = fc->diag;
  a.scale = 0.7f; /* != 1/sqrt(H): a missing or doubled scale shows */
  a.logits_soft_cap = fc->cap;
  int32_t qlens[2] = {4, 5}, kvlens[2] = {7, 3}, qseg[10], kvseg[14], qpos[10], kvpos[14];
  uint8_t mask[2 * 4 * 5 * 7];
  if (fc->lens) {
    a.q_lens = qlens;
    a.kv_lens = kvlens;
  }
  if (fc->segs) {
    /* batch 0: segments {0,0,1,1,2} vs {0,0,0,1,1,3,3}: the last query (segment 2) has no key. */
    const int32_t qs[10] = {0, 0, 1, 1, 2, 5, 5, 5, 6, 6}, ks[14] = {0, 0, 0, 1, 1, 3, 3, 5, 5, 6, 6, 6, 6, 6};
    memcpy(qseg, qs, sizeof qs);
    memcpy(kvseg, ks, sizeof ks);
    a.q_segment_ids = qseg;
    a.kv_segment_ids = kvseg;
  }
  if (fc->positions) {
    for (int x = 0; x < 10; x++) qpos[x] = (int32_t)t_int(r, 0, 8);
    for (int x = 0; x < 14; x++) kvpos[x] = (int32_t)t_int(r, 0, 8);
    a.q_positions = qpos;
    a.kv_positions = kvpos;
  }
  const int64_t full[4] = {2, 4, 5, 7};
  if (fc->mask) {
    t_bcast_dims(fc->mask, full, a.mask_dims);
    for (int64_t x = 0; x < sa_dims_count(a.mask_dims); x++) mask[x] = t_unif(r, 0, 1) < 0.3 ? 0 : 1;
    a.mask = mask;
  }
  if (fc->bias) t_bcast_dims(fc->bias, full, a.bias_dims);
  int64_t nq = 2 * 5 * 4 * fc->H, nk = 2 * 7 * 2 * fc->H, nv = 2 * 7 * 2 * fc->Hv, no = 2 * 5 * 4 * fc->Hv;
  int64_t nl = 2 * 4 * 5, nb = sa_dims_count(a.bias_dims);
  double *buf = t_alloc(3 * nq + 3 * nk + 3 * nv + 4 * no + 4 * nl + 3 * 4 + 2 * nb, sizeof(double));
  double *q = buf, *k = q + nq, *v = k + nk, *wo = v + nv, *out = wo + no, *lse = out + no, *wl = lse + nl;
  double *dq = wl + nl, *dk = dq + nq, *dv = dk + nk, *sinks = dv + nv, *dsinks = sinks + 4;
  double *out0 = dsinks + 4, *lse0 = out0 + no, *bias = lse0 + nl, *dbias = bias + nb;
  for (int64_t i = 0; i < nq; i++) q[i] = t_unif(r, -1.5, 1.5);
  for (int64_t i = 0; i < nk; i++) k[i] = t_unif(r, -1.5, 1.5);
  for (int64_t i = 0; i < nv; i++) v[i] = t_unif(r, -1, 1);
  for (int64_t i = 0; i < no; i++) wo[i] = t_unif(r, -1, 1);
  const double sr = fc->sink > 0.0 ? fc->sink : 2.0;
  for (int n = 0; n < 4; n++) sinks[n] = t_unif(r, -sr, sr);
  if (fc->sink > 0.0) sinks[1] = t_unif(r, 0, 1) < 0.5 ? -sr : sr;
  for (int64_t i = 0; i < nb; i++) bias[i] = i == nb / 2 && nb > 1 ? -INFINITY : t_unif(r, -1.5, 1.5);
  double *bp = fc->bias ? bias : NULL;
  t_fd_ctx c = {&a, q, k, v, sinks, bp, wo, wl, out0, lse0};
  sa_ref_fwd64(&a, q, k, v, sinks, bp, out0, lse0);
  /* W_l = 0 where lse = -inf (vanilla rows without keys): -inf * w is not a loss one can difference. */
  for (int64_t i = 0; i < nl; i++) wl[i] = fc->dlse && isfinite(lse0[i]) ? t_unif(r, -1, 1) : 0.0;
  memcpy(out, out0, (size_t)no * sizeof *out);
  memcpy(lse, lse0, (size_t)nl * sizeof *lse);
  sa_ref_bwd64(&a, q, k, v, sinks, bp, out, lse, wo, fc->dlse ? wl : NULL, dq, dk, dv, dsinks, fc->bias ? dbias : NULL);
  int64_t bad = 0;
  bad += t_fd_tensor(&c, fc->name, "q", q, dq, nq);
  bad += t_fd_tensor(&c, fc->name, "k", k, dk, nk);
  bad += t_fd_tensor(&c, fc->name, "v", v, dv, nv);
  if (fc->bias) bad += t_fd_tensor(&c, fc->name, "bias", bias, dbias, nb);
  if (fc->softmax == SA_SOFTMAX_LEARNABLE) {
    bad += t_fd_tensor(&c, fc->name, "sinks", sinks, dsinks, 4);
  } else {
    for (int n = 0; n < 4; n++)
      if (dsinks[n] != 0.0) {
        t_report("fd %s: dsinks[%d] = %g for a non-learnable softmax (must be 0)", fc->name, n, dsinks[n]);
        bad++;
      }
  }
  free(buf);
  return bad == 0;
}

static void t_fd_group(void) {
#define FD_ALL .wl = -1, .wr = -1
  static const t_fd_case cases[] = {
      {.name = "vanilla", FD_ALL, .H = 3, .Hv = 4},
      {.name = "vanilla+dlse causal", .causal = SA_CAUSAL_TOP_LEFT, FD_ALL, .dlse = 1, .H = 3, .Hv = 4},
      {.name = "off_by_one", .softmax = SA_SOFTMAX_OFF_BY_ONE, FD_ALL, .H = 4, .Hv = 3},
      {.name = "off_by_one+dlse lens",
       .softmax = SA_SOFTMAX_OFF_BY_ONE,
       .causal = SA_CAUSAL_BOTTOM_RIGHT,
       FD_ALL,
       .lens = 1,
       .dlse = 1,
       .H = 4,
       .Hv = 3},
      {.name = "learnable", .softmax = SA_SOFTMAX_LEARNABLE, FD_ALL, .H = 3, .Hv = 3},
      {.name = "learnable+dlse", .softmax = SA_SOFTMAX_LEARNABLE, FD_ALL, .dlse = 1, .H = 3, .Hv = 5},
      {.name = "learnable+dlse window",
       .softmax = SA_SOFTMAX_LEARNABLE,
       .causal = SA_CAUSAL_TOP_LEFT,
       .wl = 2,
       .wr = 0,
       .dlse = 1,
       .H = 3,
       .Hv = 2},
      {.name = "learnable+dlse all masks",
       .softmax = SA_SOFTMAX_LEARNABLE,
       .causal = SA_CAUSAL_BOTTOM_RIGHT,
       .wl = 3,
       .wr = 1,
       .diag = -1,
       .lens = 1,
       .segs = 1,
       .dlse = 1,
       .H = 2,
       .Hv = 3},
      {.name = "vanilla+dlse all masks",
       .causal = SA_CAUSAL_BOTTOM_RIGHT,
       .wl = 3,
       .wr = 1,
       .diag = -1,
       .lens = 1,
       .segs = 1,
       .dlse = 1,
       .H = 2,
       .Hv = 3},
      {.name = "learnable+dlse segs diag",
       .softmax = SA_SOFTMAX_LEARNABLE,
       .causal = SA_CAUSAL_TOP_LEFT,
       .wl = -1,
       .wr = 2,
       .diag = 2,
       .segs = 1,
       .dlse = 1,
       .H = 3,
       .Hv = 3},
      {.name = "learnable+dlse full bias",
       .softmax = SA_SOFTMAX_LEARNABLE,
       FD_ALL,
       .dlse = 1,
       .H = 3,
       .Hv = 3,
       .bias = T_BCAST(0, 0, 0, 0)},
      {.name = "vanilla bias [1,N,T,1] causal lens",
       .causal = SA_CAUSAL_TOP_LEFT,
       FD_ALL,
       .lens = 1,
       .H = 2,
       .Hv = 3,
       .bias = T_BCAST(1, 0, 0, 1)},
      {.name = "off_by_one+dlse bias [B,1,1,S] window",
       .softmax = SA_SOFTMAX_OFF_BY_ONE,
       .wl = 2,
       .wr = 1,
       .dlse = 1,
       .H = 3,
       .Hv = 2,
       .bias = T_BCAST(0, 1, 1, 0)},
      {.name = "learnable bias [1,1,1,1] mask [B,1,T,S]",
       .softmax = SA_SOFTMAX_LEARNABLE,
       FD_ALL,
       .H = 2,
       .Hv = 2,
       .bias = T_BCAST(1, 1, 1, 1),
       .mask = T_BCAST(0, 1, 0, 0)},
      {.name = "learnable+dlse mask [1,N,T,S] segs",
       .softmax = SA_SOFTMAX_LEARNABLE,
       .causal = SA_CAUSAL_TOP_LEFT,
       FD_ALL,
       .segs = 1,
       .dlse = 1,
       .H = 3,
       .Hv = 3,
       .mask = T_BCAST(1, 0, 0, 0)},
      {.name = "learnable+dlse positions causal window bias",
       .softmax = SA_SOFTMAX_LEARNABLE,
       .causal = SA_CAUSAL_TOP_LEFT,
       .wl = 3,
       .wr = 0,
       .diag = 1,
       .lens = 1,
       .dlse = 1,
       .H = 3,
       .Hv = 3,
       .bias = T_BCAST(0, 1, 0, 0),
       .positions = 1},
      {.name = "vanilla positions window mask",
       .wl = 1,
       .wr = 2,
       .dlse = 1,
       .H = 3,
       .Hv = 2,
       .mask = T_BCAST(1, 1, 0, 0),
       .positions = 1},
      /* soft-capped: caps 1.2-3 against logits up to ~5 (scale 0.7, |q|, |k| <= 1.5), so the tanh is far from
         linear and a missing 1 - tanh^2 in any gradient shows */
      {.name = "cap learnable+dlse causal",
       .softmax = SA_SOFTMAX_LEARNABLE,
       .causal = SA_CAUSAL_TOP_LEFT,
       FD_ALL,
       .dlse = 1,
       .H = 3,
       .Hv = 3,
       .cap = 1.5f,
       .sink = 10.0},
      {.name = "cap vanilla window lens",
       .causal = SA_CAUSAL_BOTTOM_RIGHT,
       .wl = 2,
       .wr = 1,
       .lens = 1,
       .dlse = 1,
       .H = 4,
       .Hv = 2,
       .cap = 2.0f},
      {.name = "cap learnable+dlse full bias sinks +-50",
       .softmax = SA_SOFTMAX_LEARNABLE,
       FD_ALL,
       .dlse = 1,
       .H = 3,
       .Hv = 3,
       .bias = T_BCAST(0, 0, 0, 0),
       .cap = 1.2f,
       .sink = 50.0},
      {.name = "cap off_by_one bias [1,N,T,1] segs",
       .softmax = SA_SOFTMAX_OFF_BY_ONE,
       FD_ALL,
       .segs = 1,
       .dlse = 1,
       .H = 3,
       .Hv = 2,
       .bias = T_BCAST(1, 0, 0, 1),
       .cap = 3.0f},
      {.name = "cap learnable positions window mask bias",
       .softmax = SA_SOFTMAX_LEARNABLE,
       .causal = SA_CAUSAL_TOP_LEFT,
       .wl = 3,
       .wr = 0,
       .lens = 1,
       .dlse = 1,
       .H = 3,
       .Hv = 3,
       .bias = T_BCAST(0, 1, 0, 0),
       .mask = T_BCAST(0, 1, 0, 0),
       .positions = 1,
       .cap = 1.5f,
       .sink = 10.0},
  };
#undef FD_ALL
  t_rng r = {12345};
  int pass = 0, n = (int)(sizeof cases / sizeof cases[0]);
  for (int i = 0; i < n; i++) {
    int ok = t_fd_one(&cases[i], &r);
    t_count(ok);
    pass += ok;
  }
  printf(
      "reference vs finite differences (fp64, dq dk dv dsinks dbias, dlse path, bias / mask / positions / "
      "soft-cap): "
      "%d/%d cases pass\n",
      pass, n);
}

#endif /* SA_TEST_FD_H */
