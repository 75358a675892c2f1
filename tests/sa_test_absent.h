/*
 * sa_test_absent.h — masked means absent: a NaN, +inf or -inf in a key that the masks hide (mask array,
 * lengths, segments, causal, window, positions; under a soft-cap too) changes no output of a row that does not
 * see it, on every plan this process may run (sa_plan_list: every SIMD level the CPU and SINKATTN_SIMD allow, the
 * tile plans, the reference), forward, backward and decode. Per case and plan, against the same plan's run on
 * the clean inputs, compared as floats (+0 == -0):
 *   hidden keys  every key that no query of its kv head sees is poisoned: every output equals the clean run's
 *                (out, lse, dq, dk, dv, dsinks, dbias), no NaN anywhere;
 *   seen keys    a fifth of the keys that some queries see is poisoned as well: the rows that see none of the
 *                poisoned keys keep their out, lse and dq (the others are NaN, as in jax.nn);
 *   values       the hidden keys' values are poisoned: lse and dv equal the clean run's, and the hidden keys' dk
 *                and the hidden pairs' dbias stay 0 (where jax.nn is finite; out reads the values through
 *                0 * NaN in jax.nn too).
 */
#ifndef SA_TEST_ABSENT_H
#define SA_TEST_ABSENT_H

#include "sa_plan.h"
#include "sa_test_case.h"

/* Each case hides some keys from every query of their kv head. bf16 ones also run the tile plans. */
/* one case a line */
// clang-format off
static const t_case ta_cases[] = {
    {.name = "mask array per key, bias", .dt = SA_BF16, .B = 2, .T = 40, .S = 150, .N = 4, .K = 2, .H = 64, .Hv = 32,
     .sm = SA_SOFTMAX_LEARNABLE, .dlse = 1, T_UNBOUNDED, .mask = T_BCAST(0, 1, 1, 0), .bias = T_BCAST(0, 0, 0, 0)},
    {.name = "full mask array, soft-cap", .dt = SA_F32, .B = 1, .T = 37, .S = 90, .N = 4, .K = 2, .H = 32, .Hv = 32,
     .sm = SA_SOFTMAX_LEARNABLE, .sinks = T_SINK_BIG, .lens = T_LENS_KV_ONLY, T_UNBOUNDED,
     .mask = T_BCAST(0, 0, 0, 0), .cap = 2.0f},
    {.name = "mask array per head and key", .dt = SA_BF16, .B = 2, .T = 30, .S = 200, .N = 4, .K = 2, .H = 32,
     .Hv = 32, .sm = SA_SOFTMAX_VANILLA, T_UNBOUNDED, .mask = T_BCAST(0, 0, 1, 0)},
    {.name = "lengths", .dt = SA_BF16, .B = 3, .T = 33, .S = 130, .N = 4, .K = 1, .H = 64, .Hv = 64,
     .sm = SA_SOFTMAX_OFF_BY_ONE, .lens = T_LENS_RANDOM, .dlse = 1, T_UNBOUNDED},
    {.name = "segments", .dt = SA_F16, .B = 2, .T = 45, .S = 70, .N = 4, .K = 2, .H = 32, .Hv = 32,
     .sm = SA_SOFTMAX_LEARNABLE, .segs = T_SEGS_PACKED, T_UNBOUNDED},
    {.name = "causal, keys past the queries", .dt = SA_BF16, .B = 1, .T = 50, .S = 200, .N = 8, .K = 2, .H = 32,
     .Hv = 32, .sm = SA_SOFTMAX_LEARNABLE, .dlse = 1, .causal = SA_CAUSAL_TOP_LEFT, T_UNBOUNDED, .diag = 30},
    {.name = "window, soft-cap, bias", .dt = SA_BF16, .B = 1, .T = 70, .S = 300, .N = 4, .K = 2, .H = 64, .Hv = 64,
     .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = 20, .wr = 0, .bias = T_BCAST(1, 0, 0, 0),
     .cap = 5.0f},
    {.name = "positions, mask array", .dt = SA_BF16, .B = 2, .T = 60, .S = 100, .N = 4, .K = 2, .H = 32, .Hv = 32,
     .sm = SA_SOFTMAX_LEARNABLE, .dlse = 1, .causal = SA_CAUSAL_TOP_LEFT, .wl = 30, .wr = 0, .pos = T_POS_RANDOM,
     .mask = T_BCAST(0, 1, 0, 0)},
    {.name = "positions, soft-cap", .dt = SA_F32, .B = 2, .T = 40, .S = 80, .N = 2, .K = 1, .H = 32, .Hv = 32,
     .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, T_UNBOUNDED, .pos = T_POS_RANDOM, .cap = 1.5f},
};
/* decode (cpu.decode.*): a few queries against a cache, bottom-right causal */
static const t_case ta_decode_cases[] = {
    {.name = "decode: lengths, window", .dt = SA_BF16, .B = 2, .T = 2, .S = 700, .N = 8, .K = 2, .H = 64, .Hv = 64,
     .sm = SA_SOFTMAX_LEARNABLE, .lens = T_LENS_RANDOM, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = 200, .wr = 0},
    {.name = "decode: mask array", .dt = SA_F32, .B = 1, .T = 3, .S = 300, .N = 4, .K = 1, .H = 32, .Hv = 32,
     .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_BOTTOM_RIGHT, T_UNBOUNDED, .mask = T_BCAST(0, 1, 1, 0)},
    {.name = "decode: soft-cap", .dt = SA_BF16, .B = 2, .T = 1, .S = 500, .N = 8, .K = 1, .H = 64, .Hv = 64,
     .sm = SA_SOFTMAX_LEARNABLE, .sinks = T_SINK_BIG, .lens = T_LENS_RANDOM, .causal = SA_CAUSAL_BOTTOM_RIGHT,
     .wl = 100, .wr = 0, .cap = 3.0f},
};
// clang-format on

/* The outputs of one run. */
typedef struct {
  void *out, *dq, *dk, *dv;
  float *lse, *ds, *db;
} ta_out;

static void ta_alloc(ta_out *o, const t_prob *p) {
  size_t es = sa_dtype_size(p->a.dtype);
  o->out = t_alloc(p->no, es);
  o->dq = t_alloc(p->nq, es);
  o->dk = t_alloc(p->nk, es);
  o->dv = t_alloc(p->nv, es);
  o->lse = t_alloc(p->nl, 4);
  o->ds = t_alloc(p->a.q_heads, 4);
  o->db = t_alloc(p->nb, 4);
}

static void ta_free(ta_out *o) {
  void *all[] = {o->out, o->dq, o->dk, o->dv, o->lse, o->ds, o->db};
  for (int i = 0; i < 7; i++) free(all[i]);
}

/* Forward (decode when bwd is NULL and decode set) and backward from that forward's out and lse, under the
   plans fwd / bwd (NULL: the reference backend). */
static sa_status ta_call(t_prob *p, const t_case *c, const char *fwd, const char *bwd, int decode, ta_out *o) {
  const sa_backend be = fwd ? SA_BACKEND_CPU : SA_BACKEND_REF;
  sa_attn *a = &p->a;
  t_poison(o->out, a->dtype, p->no);
  t_poison(o->lse, SA_F32, p->nl);
  a->out = o->out;
  a->lse = o->lse;
  sa_plan_force(decode ? SA_PLAN_DECODE : SA_PLAN_FWD, fwd);
  sa_status s = decode ? sa_attn_decode_fwd(a, NULL, 0, be, NULL) : sa_attn_fwd(a, be, NULL);
  sa_plan_force(decode ? SA_PLAN_DECODE : SA_PLAN_FWD, NULL);
  if (s != SA_OK || decode) return s;
  sa_attn_grad g = {0};
  g.dout = p->dout;
  g.dlse = c->dlse ? p->dlse : NULL;
  g.dq = o->dq;
  g.dk = o->dk;
  g.dv = o->dv;
  g.dsinks = o->ds;
  g.dbias = c->bias ? o->db : NULL;
  sa_plan_force(SA_PLAN_BWD, bwd);
  s = sa_attn_bwd(a, &g, NULL, 0, be, NULL);
  sa_plan_force(SA_PLAN_BWD, NULL);
  return s;
}

/* Elements of x that differ from the clean y (as floats: NaN differs from everything), among [0, n) when
   rows is NULL, else among the rows r (of `len` elements) with rows[r] set. */
static int64_t ta_diff(const void *x, const void *y, sa_dtype t, int64_t n, int64_t len, const char *rows) {
  int64_t bad = 0;
  for (int64_t e = 0; e < n; e++)
    if ((!rows || rows[e / len]) && !(sa_load(x, t, e) == sa_load(y, t, e))) bad++;
  return bad;
}

/* Which keys (b, j, kv head) some query of their kv head sees: seen[(b * S + j) * K + kh]. */
static char *ta_seen(const sa_attn *a) {
  const int64_t B = a->batch, T = a->q_len, S = a->kv_len, N = a->q_heads, K = a->kv_heads, G = N / K;
  char *seen = calloc((size_t)(B * S * K + 1), 1);
  for (int64_t b = 0; b < B; b++)
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < S; j++)
          if (sa_attn_valid(a, b, n, i, j)) seen[(b * S + j) * K + n / G] = 1;
  return seen;
}

/* poison[(b * S + j) * K + kh]: 1 for the keys no query sees, and for a fifth of the others when `seen_too`. */
static char *ta_pick(const sa_attn *a, const char *seen, int seen_too, t_rng *r) {
  const int64_t n = a->batch * a->kv_len * a->kv_heads;
  char *poison = calloc((size_t)(n + 1), 1);
  for (int64_t x = 0; x < n; x++) poison[x] = !seen[x] || (seen_too && t_unif(r, 0, 1) < 0.2);
  return poison;
}

/* rows[(b * T + i) * N + n] (the layout of out and dq): 1 when the row sees none of the poisoned keys. */
static char *ta_clean_rows(const sa_attn *a, const char *poison) {
  const int64_t B = a->batch, T = a->q_len, S = a->kv_len, N = a->q_heads, K = a->kv_heads, G = N / K;
  char *rows = calloc((size_t)(B * T * N + 1), 1);
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < T; i++)
      for (int64_t n = 0; n < N; n++) {
        int clean = 1;
        for (int64_t j = 0; j < S && clean; j++)
          clean = !(poison[(b * S + j) * K + n / G] && sa_attn_valid(a, b, n, i, j));
        rows[(b * T + i) * N + n] = (char)clean;
      }
  return rows;
}

/* A copy of x (k or v: [B, S, K, D]) with value w in every element of the poisoned rows: NaN, +inf, -inf, or
   the three in turn (w = 0). */
static void *ta_poisoned(const void *x, sa_dtype t, const sa_attn *a, int64_t D, const char *poison, float w) {
  const int64_t n = a->batch * a->kv_len * a->kv_heads * D;
  const float mix[3] = {NAN, INFINITY, -INFINITY};
  void *y = t_alloc(n, sa_dtype_size(t));
  memcpy(y, x, (size_t)n * sa_dtype_size(t));
  for (int64_t e = 0; e < n; e++)
    if (poison[e / D]) sa_store(y, t, e, w == 0.0f ? mix[e % 3] : w);
  return y;
}

/* lse of the clean rows, in [B, N, T] from rows in [B, T, N]. */
static int64_t ta_diff_lse(const float *x, const float *y, const sa_attn *a, const char *rows) {
  int64_t bad = 0;
  for (int64_t b = 0; b < a->batch; b++)
    for (int64_t n = 0; n < a->q_heads; n++)
      for (int64_t i = 0; i < a->q_len; i++) {
        const int64_t l = (b * a->q_heads + n) * a->q_len + i;
        if ((!rows || rows[(b * a->q_len + i) * a->q_heads + n]) && !(x[l] == y[l])) bad++;
      }
  return bad;
}

static int ta_total, ta_pass;

static void ta_expect(int64_t bad, const char *tag, const char *what) {
  if (bad) t_report("masked means absent %s: %lld elements of %s differ from the clean run", tag, (long long)bad, what);
  ta_total++;
  ta_pass += bad == 0;
  t_count(bad == 0);
}

/* Case c under the plans fwd / bwd (NULL: the reference; bwd NULL with decode: decode only). */
static void ta_case_plan(t_prob *p, const t_case *c, const char *fwd, const char *bwd, int decode, const char *cname) {
  sa_attn *a = &p->a;
  const void *k0 = a->k, *v0 = a->v;
  const int64_t H = a->head_dim, Hv = a->v_head_dim, S = a->kv_len, K = a->kv_heads, G = a->q_heads / K;
  char tag[300];
  ta_out clean, got;
  ta_alloc(&clean, p);
  ta_alloc(&got, p);
  sa_status s = ta_call(p, c, fwd, bwd, decode, &clean);
  if (s != SA_OK) {
    t_report("masked means absent [%s] %s: clean run %s: %s", cname, fwd ? fwd : "ref", sa_status_name(s),
             sa_last_error());
    t_count(0);
    ta_free(&clean);
    ta_free(&got);
    return;
  }
  char *seen = ta_seen(a);
  t_rng r = {0xab5e0000ull + (uint64_t)S};
  static const float kinds[4] = {NAN, INFINITY, -INFINITY, 0.0f};
  static const char *kind_names[4] = {"NaN", "+inf", "-inf", "NaN/+inf/-inf"};
  for (int mode = 0; mode < 3; mode++) /* hidden keys, seen keys too, hidden values */
    for (int kind = 0; kind < 4; kind++) {
      if (mode == 1 && kind != 3) continue;
      char *poison = ta_pick(a, seen, mode == 1, &r);
      int64_t npoison = 0;
      for (int64_t x = 0; x < a->batch * S * K; x++) npoison += poison[x];
      if (npoison == 0) t_report("masked means absent [%s]: the case hides no key (a test that cannot fail)", cname);
      t_count(npoison > 0);
      char *rows = mode == 1 ? ta_clean_rows(a, poison) : NULL;
      void *kp = mode == 2 ? NULL : ta_poisoned(k0, a->dtype, a, H, poison, kinds[kind]);
      void *vp = mode == 2 ? ta_poisoned(v0, a->dtype, a, Hv, poison, kinds[kind]) : NULL;
      a->k = kp ? kp : k0;
      a->v = vp ? vp : v0;
      snprintf(tag, sizeof tag, "[%s] %s / %s, %s in the %s", cname, fwd ? fwd : "ref", bwd ? bwd : "-",
               kind_names[kind],
               mode == 0   ? "hidden keys"
               : mode == 1 ? "hidden and some seen keys"
                           : "hidden values");
      s = ta_call(p, c, fwd, bwd, decode, &got);
      a->k = k0;
      a->v = v0;
      if (s != SA_OK) {
        t_report("masked means absent %s: %s: %s", tag, sa_status_name(s), sa_last_error());
        t_count(0);
      } else if (mode == 0) {
        int64_t bad = ta_diff(got.out, clean.out, a->dtype, p->no, 1, NULL) + ta_diff_lse(got.lse, clean.lse, a, NULL);
        if (!decode)
          bad += ta_diff(got.dq, clean.dq, a->dtype, p->nq, 1, NULL) +
                 ta_diff(got.dk, clean.dk, a->dtype, p->nk, 1, NULL) +
                 ta_diff(got.dv, clean.dv, a->dtype, p->nv, 1, NULL) +
                 ta_diff(got.ds, clean.ds, SA_F32, a->q_heads, 1, NULL) +
                 (c->bias ? ta_diff(got.db, clean.db, SA_F32, p->nb, 1, NULL) : 0);
        ta_expect(bad, tag, decode ? "out, lse" : "out, lse, dq, dk, dv, dsinks, dbias");
      } else if (mode == 1) {
        int64_t bad = ta_diff(got.out, clean.out, a->dtype, p->no, Hv, rows) + ta_diff_lse(got.lse, clean.lse, a, rows);
        if (!decode) bad += ta_diff(got.dq, clean.dq, a->dtype, p->nq, H, rows);
        ta_expect(bad, tag, decode ? "the clean rows' out, lse" : "the clean rows' out, lse, dq");
      } else {
        int64_t bad = ta_diff_lse(got.lse, clean.lse, a, NULL);
        if (!decode) {
          bad += ta_diff(got.dv, clean.dv, a->dtype, p->nv, 1, NULL);
          for (int64_t x = 0; x < a->batch * S * K; x++) /* the hidden keys' dk */
            if (poison[x])
              bad += ta_diff((const char *)got.dk + x * H * sa_dtype_size(a->dtype),
                             (const char *)clean.dk + x * H * sa_dtype_size(a->dtype), a->dtype, H, 1, NULL);
          if (c->bias && sa_dims_count(a->bias_dims) == a->batch * a->q_heads * a->q_len * S)
            for (int64_t e = 0; e < p->nb; e++) { /* a full bias: the dbias of pairs with a hidden key */
              const int64_t j = e % S, bn = e / (a->q_len * S), b = bn / a->q_heads, n = bn % a->q_heads;
              if (poison[(b * S + j) * K + n / G] && !(got.db[e] == clean.db[e])) bad++;
            }
        }
        ta_expect(bad, tag, decode ? "lse" : "lse, dv, the hidden keys' dk and pairs' dbias");
      }
      free(poison);
      free(rows);
      free(kp);
      free(vp);
    }
  free(seen);
  ta_free(&clean);
  ta_free(&got);
}

/* Every legal plan of the CPU backend (the forward's, with the backward of the same suffix), and the
   reference. */
static void ta_case(const t_case *c, int idx, int decode) {
  t_rng r = {0xab5e5000ull + (uint64_t)idx};
  t_prob p;
  t_prob_make(&p, c, &r, idx);
  const char *names[16], *bnames[16];
  const int which = decode ? SA_PLAN_DECODE : SA_PLAN_FWD;
  int n = sa_plan_list(&p.a, which, SA_BACKEND_CPU, names, 16);
  int nb = decode ? 0 : sa_plan_list(&p.a, SA_PLAN_BWD, SA_BACKEND_CPU, bnames, 16);
  ta_case_plan(&p, c, NULL, NULL, decode, c->name);
  for (int i = 0; i < n && i < 16; i++) {
    const char *bwd = NULL;
    if (!decode) {
      char want[64];
      snprintf(want, sizeof want, "cpu.bwd.%s", names[i] + strlen("cpu.fwd."));
      for (int k = 0; k < nb && k < 16; k++)
        if (strcmp(bnames[k], want) == 0) bwd = bnames[k];
      if (!bwd) {
        t_report("masked means absent [%s]: no backward plan %s beside %s", c->name, want, names[i]);
        t_count(0);
        continue;
      }
    }
    ta_case_plan(&p, c, names[i], bwd, decode, c->name);
  }
  t_prob_free(&p);
}

static void t_absent_group(void) {
  for (size_t i = 0; i < sizeof ta_cases / sizeof ta_cases[0]; i++) ta_case(&ta_cases[i], (int)i, 0);
  for (size_t i = 0; i < sizeof ta_decode_cases / sizeof ta_decode_cases[0]; i++)
    ta_case(&ta_decode_cases[i], 100 + (int)i, 1);
  printf("masked means absent (NaN / +-inf in hidden keys and values, every plan and the reference): %d/%d pass\n",
         ta_pass, ta_total);
}

#endif /* SA_TEST_ABSENT_H */
