/*
 * sa_test_decode.h — the decode cases of the C tests (test_decode.c, and amx_check.c's tile decode checks):
 * a case's shape and options (dcase), random problems made from it (sinks from U(-10, 10) and +-50 on heads
 * 0 and 1, cache lengths 0, 1, S and random, q lengths, bias, mask, positions, soft-cap), and the comparison with the
 * fp64 reference at the dtype's tolerance.
 */
#ifndef SA_TEST_DECODE_H
#define SA_TEST_DECODE_H

#include "sa_test.h"

static t_rng d_rng = {0x9e3779b97f4a7c15ull};

static inline void *rand_buf(sa_dtype t, int64_t n, float amp) {
  void *p = t_alloc(n, sa_dtype_size(t));
  t_fill(p, t, n, &d_rng, -amp, amp);
  return p;
}

typedef struct {
  const char *name; /* rows written by hand */
  sa_dtype dtype;
  int64_t B, Tq, S, N, K, H, Hv;
  sa_softmax softmax;
  int64_t wl, wr;
  int lens;   /* 0: no kv_lens; 1: {0, 1, S, random...}; 2: random */
  int q_lens; /* give q_lens {Tq, Tq - 1, ...} */
  sa_causal causal;
  int bias, mask; /* T_BCAST forms or 0 */
  int pos;        /* positions: queries at S - Tq + i, keys at j (causal then top-left) */
  float cap;      /* logits_soft_cap (0: none) */
} dcase;

#define D_ALL .wl = -1, .wr = -1
#define D_BR  SA_CAUSAL_BOTTOM_RIGHT

/* Fills a from c with fresh random data; the caller frees with free_attn. */
static inline void make_attn(const dcase *c, sa_attn *a, float *sinks, int32_t *kvl, int32_t *ql) {
  sa_attn_init(a);
  a->dtype = c->dtype;
  a->batch = c->B;
  a->q_len = c->Tq;
  a->kv_len = c->S;
  a->q_heads = c->N;
  a->kv_heads = c->K;
  a->head_dim = c->H;
  a->v_head_dim = c->Hv;
  a->q = rand_buf(c->dtype, c->B * c->Tq * c->N * c->H, 1.0f);
  a->k = rand_buf(c->dtype, c->B * c->S * c->K * c->H, 1.0f);
  a->v = rand_buf(c->dtype, c->B * c->S * c->K * c->Hv, 1.0f);
  a->softmax = c->softmax;
  a->scale = c->H >= 64 ? 0.0f : 0.3f; /* both the default and an explicit scale */
  for (int64_t n = 0; n < c->N; n++) sinks[n] = (float)t_unif(&d_rng, -10, 10);
  if (c->N > 2) {
    sinks[0] = 50.0f;
    sinks[1] = -50.0f;
  }
  if (c->softmax == SA_SOFTMAX_LEARNABLE) a->sinks = sinks;
  a->causal = c->causal;
  a->window_left = c->wl;
  a->window_right = c->wr;
  a->logits_soft_cap = c->cap;
  for (int64_t b = 0; b < c->B; b++) {
    int64_t x = t_int(&d_rng, 0, c->S);
    if (c->lens == 1) x = b == 0 ? 0 : b == 1 ? 1 : b == 2 ? c->S : x;
    kvl[b] = (int32_t)x;
    ql[b] = (int32_t)(c->Tq - (b % 2));
  }
  if (c->lens) a->kv_lens = kvl;
  if (c->q_lens) a->q_lens = ql;
  const int64_t full[4] = {c->B, c->N, c->Tq, c->S};
  if (c->bias) {
    t_bcast_dims(c->bias, full, a->bias_dims);
    a->bias = rand_buf(SA_BF16, sa_dims_count(a->bias_dims), 2.0f);
    a->bias_dtype = SA_BF16;
  }
  if (c->mask) {
    t_bcast_dims(c->mask, full, a->mask_dims);
    uint8_t *m = t_alloc(sa_dims_count(a->mask_dims), 1);
    for (int64_t x = 0; x < sa_dims_count(a->mask_dims); x++) m[x] = t_unif(&d_rng, 0, 1) < 0.2 ? 0 : 1;
    a->mask = m;
  }
  if (c->pos) {
    int32_t *qp = t_alloc(c->B * c->Tq, 4), *kp = t_alloc(c->B * c->S, 4);
    for (int64_t x = 0; x < c->B * c->Tq; x++) qp[x] = (int32_t)(c->S - c->Tq + x % c->Tq);
    for (int64_t x = 0; x < c->B * c->S; x++) kp[x] = (int32_t)(x % c->S);
    a->q_positions = qp;
    a->kv_positions = kp;
  }
}

static inline void free_attn(sa_attn *a) {
  free((void *)a->q);
  free((void *)a->k);
  free((void *)a->v);
  free((void *)a->bias);
  free((void *)a->mask);
  free((void *)a->q_positions);
  free((void *)a->kv_positions);
}

static inline int close_enough(const sa_attn *a, const void *out, const float *lse, const void *out_ref,
                               const float *lse_ref, double *worst) {
  double tol = a->dtype == SA_F32 ? 2e-5 : a->dtype == SA_F16 ? 2e-3 : 1.6e-2;
  int64_t no = a->batch * a->q_len * a->q_heads * a->v_head_dim, nl = a->batch * a->q_heads * a->q_len;
  int ok = 1;
  *worst = 0;
  for (int64_t i = 0; i < no; i++) {
    double x = sa_load(out, a->dtype, i), y = sa_load(out_ref, a->dtype, i);
    double e = fabs(x - y) / (tol * (1.0 + fabs(y)));
    if (!(e <= 1.0)) ok = 0;
    if (e > *worst || isnan(e)) *worst = e;
  }
  for (int64_t i = 0; i < nl; i++) {
    if (isinf(lse_ref[i]) || isinf(lse[i])) {
      if (lse[i] != lse_ref[i]) ok = 0;
      continue;
    }
    double e = fabs((double)lse[i] - lse_ref[i]) / (1e-4 * (1.0 + fabs(lse_ref[i])));
    if (!(e <= 1.0)) ok = 0;
  }
  return ok;
}

/* Decode cases for the tile item (bf16, head_dim a multiple of 32), which amx_check runs on the AMX
   instructions against the reference and against their emulation (test_decode on every plan): gpt-oss's N/K
   64/8 (two kv heads per 16 lanes), R 1 over 6 kv heads (a last group of heads short of the vector), R 1 over
   16 and R 2 over 8 kv heads (1 and 2 lanes a head), R 16 and 40 (one and three 16-lane tiles a head), H 96 /
   Hv 40 (three k steps, a V tail), H 128 over several chunks, windows, cache lengths 0, 1 and S, q lengths,
   every softmax type. */
// clang-format off
static const dcase td_cases[] = {
    {.name = "gpt-oss", .dtype = SA_BF16, .B = 2, .Tq = 1, .S = 3000, .N = 64, .K = 8, .H = 64, .Hv = 64,
     .softmax = SA_SOFTMAX_LEARNABLE, D_ALL, .lens = 1, .causal = D_BR},
    {.name = "gpt-oss window 127", .dtype = SA_BF16, .B = 1, .Tq = 1, .S = 2000, .N = 64, .K = 8, .H = 64, .Hv = 64,
     .softmax = SA_SOFTMAX_LEARNABLE, .wl = 127, .wr = 0, .causal = D_BR},
    {.name = "R 1, 6 kv heads", .dtype = SA_BF16, .B = 2, .Tq = 1, .S = 900, .N = 6, .K = 6, .H = 64, .Hv = 64,
     .softmax = SA_SOFTMAX_OFF_BY_ONE, D_ALL, .lens = 2, .causal = D_BR},
    {.name = "R 1, 16 kv heads", .dtype = SA_BF16, .B = 2, .Tq = 1, .S = 700, .N = 16, .K = 16, .H = 64, .Hv = 64,
     .softmax = SA_SOFTMAX_LEARNABLE, D_ALL, .lens = 1, .causal = D_BR},
    {.name = "R 2, 8 kv heads", .dtype = SA_BF16, .B = 1, .Tq = 2, .S = 600, .N = 8, .K = 8, .H = 32, .Hv = 48,
     .softmax = SA_SOFTMAX_OFF_BY_ONE, .wl = 30, .wr = 0, .lens = 2, .q_lens = 1, .causal = D_BR},
    {.name = "R 16", .dtype = SA_BF16, .B = 3, .Tq = 2, .S = 1700, .N = 16, .K = 2, .H = 64, .Hv = 64,
     .softmax = SA_SOFTMAX_LEARNABLE, .wl = 40, .wr = 0, .lens = 2, .q_lens = 1, .causal = D_BR},
    {.name = "R 40, H 32, Hv 16", .dtype = SA_BF16, .B = 1, .Tq = 5, .S = 800, .N = 16, .K = 2, .H = 32, .Hv = 16,
     .softmax = SA_SOFTMAX_VANILLA, D_ALL, .lens = 2, .q_lens = 1, .causal = D_BR},
    {.name = "H 96, Hv 40, R 3", .dtype = SA_BF16, .B = 2, .Tq = 1, .S = 1300, .N = 6, .K = 2, .H = 96, .Hv = 40,
     .softmax = SA_SOFTMAX_LEARNABLE, .wl = 200, .wr = 0, .lens = 1, .causal = D_BR},
    {.name = "H 128, several chunks", .dtype = SA_BF16, .B = 2, .Tq = 1, .S = 5000, .N = 8, .K = 1, .H = 128,
     .Hv = 128, .softmax = SA_SOFTMAX_LEARNABLE, D_ALL, .lens = 1, .causal = D_BR},
    {.name = "top-left causal, R 64", .dtype = SA_BF16, .B = 2, .Tq = 16, .S = 1500, .N = 8, .K = 2, .H = 64,
     .Hv = 64, .softmax = SA_SOFTMAX_LEARNABLE, .wl = 200, .wr = 0, .lens = 2, .q_lens = 1,
     .causal = SA_CAUSAL_TOP_LEFT},
    {.name = "no causal mask, R 2", .dtype = SA_BF16, .B = 4, .Tq = 1, .S = 1000, .N = 4, .K = 2, .H = 64, .Hv = 32,
     .softmax = SA_SOFTMAX_VANILLA, D_ALL, .lens = 1},
};
// clang-format on
#define TD_NCASES ((int)(sizeof td_cases / sizeof td_cases[0]))

#endif /* SA_TEST_DECODE_H */
