/*
 * test_edges.c — the edge behaviour documented in include/sinkattn.h ("EDGES"), on REF and CPU, plus
 * concurrency and determinism of the CPU backend (larger than 600 lines: one short test per documented edge, kept
 * beside the header section it checks):
 *   T or S of 1; rows and whole batches without a valid key; lengths below 0 or beyond T / S;
 *   sinks of +-1e4, +-inf and NaN; NaN / inf in q, k, v (propagate into the rows that read them, never
 *   into others, never through padding); zero-size problems with NULL buffers; the CUDA backend's
 *   answer for a head dim it lacks; threads calling fwd and bwd at once (bitwise equal to serial runs);
 *   bitwise-identical results across repeated runs and CPU thread counts (with bias and mask too);
 *   rows that a mask or a -inf bias empties (out 0, lse the sink logit, no gradient), NaN in a bias;
 *   the soft-cap in closed form, a -inf bias under it (the logit -cap: the key counts), caps of 1e-30 and
 *   2e38 (3e38 refused).
 * SINKATTN_TEST_QUICK=1 (the sanitizer run) cuts the concurrency and determinism repetitions by 4x.
 */
#include <pthread.h>

#include "sa_test.h"

static int e_quick;

/* Counts every check; prints the first 3 failures of each call site (a broken edge fails in a loop). */
#define E_CHECK(cond, ...)                      \
  do {                                          \
    static int shown_;                          \
    int ok_ = (cond) != 0;                      \
    t_count(ok_);                               \
    if (ok_ || shown_++ >= 3) break;            \
    printf("FAIL %s:%d: ", __func__, __LINE__); \
    printf(__VA_ARGS__);                        \
    putchar('\n');                              \
  } while (0)

static float e_unif(t_rng *r, float lo, float hi) { return (float)t_unif(r, lo, hi); }

/* ---- one problem, f32, with its buffers --------------------------------------------------------- */

typedef struct {
  sa_attn a;
  sa_attn_grad g;
  float *q, *k, *v, *out, *lse, *sinks, *dout, *dq, *dk, *dv, *dsinks, *bias, *dbias;
  uint8_t *mask;
  int32_t *q_lens, *kv_lens;
  int64_t nq, nk, nv, no, rows, nb;
} e_case;

static float *e_buf(int64_t n) {
  float *p = malloc((size_t)(n + 1) * sizeof *p);
  if (!p) {
    fprintf(stderr, "test_edges: out of memory\n");
    exit(2);
  }
  return p;
}

static void e_make(e_case *c, int64_t B, int64_t T, int64_t S, int64_t N, int64_t K, int64_t H, int64_t Hv,
                   sa_softmax sm, uint64_t seed_) {
  t_rng seed = {seed_};
  memset(c, 0, sizeof *c);
  sa_attn *a = &c->a;
  sa_attn_init(a);
  a->dtype = SA_F32;
  a->batch = B;
  a->q_len = T;
  a->kv_len = S;
  a->q_heads = N;
  a->kv_heads = K;
  a->head_dim = H;
  a->v_head_dim = Hv;
  a->softmax = sm;
  c->nq = B * T * N * H;
  c->nk = B * S * K * H;
  c->nv = B * S * K * Hv;
  c->no = B * T * N * Hv;
  c->rows = B * N * T;
  c->q = e_buf(c->nq);
  c->k = e_buf(c->nk);
  c->v = e_buf(c->nv);
  c->dout = e_buf(c->no);
  c->out = e_buf(c->no);
  c->lse = e_buf(c->rows);
  c->sinks = e_buf(N);
  c->dq = e_buf(c->nq);
  c->dk = e_buf(c->nk);
  c->dv = e_buf(c->nv);
  c->dsinks = e_buf(N);
  c->q_lens = malloc((size_t)(B + 1) * 4);
  c->kv_lens = malloc((size_t)(B + 1) * 4);
  for (int64_t x = 0; x < c->nq; x++) c->q[x] = e_unif(&seed, -1.5f, 1.5f);
  for (int64_t x = 0; x < c->nk; x++) c->k[x] = e_unif(&seed, -1.5f, 1.5f);
  for (int64_t x = 0; x < c->nv; x++) c->v[x] = e_unif(&seed, -1.0f, 1.0f);
  for (int64_t x = 0; x < c->no; x++) c->dout[x] = e_unif(&seed, -1.0f, 1.0f);
  for (int64_t n = 0; n < N; n++) c->sinks[n] = e_unif(&seed, -10.0f, 10.0f); /* wide: a wrong sink shows */
  a->q = c->q;
  a->k = c->k;
  a->v = c->v;
  a->out = c->out;
  a->lse = c->lse;
  a->sinks = sm == SA_SOFTMAX_LEARNABLE ? c->sinks : NULL;
  c->g.dout = c->dout;
  c->g.dq = c->dq;
  c->g.dk = c->dk;
  c->g.dv = c->dv;
  c->g.dsinks = sm == SA_SOFTMAX_LEARNABLE ? c->dsinks : NULL;
}

/* A bias of form `form` (T_BCAST) from U(-2, 2) with its dbias, and a mask of form `mform` (or 0: none)
   with ~20% of its pairs false. */
static void e_add_bias_mask(e_case *c, int form, int mform, uint64_t seed_) {
  t_rng seed = {seed_};
  sa_attn *a = &c->a;
  const int64_t full[4] = {a->batch, a->q_heads, a->q_len, a->kv_len};
  t_bcast_dims(form, full, a->bias_dims);
  c->nb = sa_dims_count(a->bias_dims);
  c->bias = e_buf(c->nb);
  c->dbias = e_buf(c->nb);
  for (int64_t x = 0; x < c->nb; x++) c->bias[x] = e_unif(&seed, -2.0f, 2.0f);
  a->bias = c->bias;
  c->g.dbias = c->dbias;
  if (!mform) return;
  t_bcast_dims(mform, full, a->mask_dims);
  c->mask = t_alloc(sa_dims_count(a->mask_dims), 1);
  for (int64_t x = 0; x < sa_dims_count(a->mask_dims); x++) c->mask[x] = e_unif(&seed, 0.0f, 1.0f) < 0.2f ? 0 : 1;
  a->mask = c->mask;
}

static void e_free(e_case *c) {
  float *f[] = {c->q, c->k, c->v, c->out, c->lse, c->sinks, c->dout, c->dq, c->dk, c->dv, c->dsinks, c->bias, c->dbias};
  for (size_t x = 0; x < sizeof f / sizeof f[0]; x++) free(f[x]);
  free(c->mask);
  free(c->q_lens);
  free(c->kv_lens);
}

static sa_status e_fwd(e_case *c, sa_backend be) {
  for (int64_t x = 0; x < c->no; x++) c->out[x] = NAN; /* an element left unwritten shows as NaN */
  for (int64_t x = 0; x < c->rows; x++) c->lse[x] = NAN;
  return sa_attn_fwd(&c->a, be, NULL);
}

static sa_status e_bwd(e_case *c, sa_backend be) {
  size_t ws = sa_attn_bwd_workspace_size(&c->a, be);
  void *w = ws ? malloc(ws) : NULL;
  sa_status s = sa_attn_bwd(&c->a, &c->g, w, ws, be, NULL);
  free(w);
  return s;
}

static int e_same(float x, float y) { return (isnan(x) && isnan(y)) || memcmp(&x, &y, 4) == 0; }
static int e_bits_equal(const float *x, const float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (!e_same(x[i], y[i])) return 0;
  return 1;
}
static int e_all_finite(const float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return 0;
  return 1;
}
static float *e_copy(const float *x, int64_t n) {
  float *y = e_buf(n);
  memcpy(y, x, (size_t)n * sizeof *y);
  return y;
}

#define E_O(c, b, i, n) ((((b) * (c)->a.q_len + (i)) * (c)->a.q_heads + (n)) * (c)->a.v_head_dim)
#define E_L(c, b, n, i) (((b) * (c)->a.q_heads + (n)) * (c)->a.q_len + (i))

static const sa_backend e_backends[] = {SA_BACKEND_REF, SA_BACKEND_CPU};
static const char *e_be_name(sa_backend be) { return be == SA_BACKEND_REF ? "REF" : "CPU"; }

/* ---- edges ------------------------------------------------------------------------------------- */

/* T = S = 1: one score s, out = v * e^s / (e^s + e^a), lse = log(e^s + e^a), in closed form. */
static void e_test_single(sa_backend be) {
  for (int sm = 0; sm < 3; sm++) {
    e_case c;
    e_make(&c, 2, 1, 1, 2, 1, 8, 4, (sa_softmax)sm, 11 + sm);
    E_CHECK(e_fwd(&c, be) == SA_OK, "%s softmax %d: %s", e_be_name(be), sm, sa_last_error());
    for (int64_t b = 0; b < 2; b++)
      for (int64_t n = 0; n < 2; n++) {
        double s = 0;
        for (int d = 0; d < 8; d++) s += (double)c.q[(b * 2 + n) * 8 + d] * c.k[b * 8 + d];
        s /= sqrt(8.0);
        double a = sm == 0 ? -INFINITY : sm == 1 ? 0.0 : c.sinks[n];
        double lse = log(exp(s) + exp(a)), p = exp(s - lse);
        E_CHECK(fabs(c.lse[E_L(&c, b, n, 0)] - lse) < 1e-5 * (1 + fabs(lse)), "%s sm %d lse %g want %g", e_be_name(be),
                sm, c.lse[E_L(&c, b, n, 0)], lse);
        for (int d = 0; d < 4; d++)
          E_CHECK(fabs(c.out[E_O(&c, b, 0, n) + d] - p * c.v[b * 4 + d]) < 1e-5, "%s sm %d out", e_be_name(be), sm);
      }
    E_CHECK(e_bwd(&c, be) == SA_OK, "%s bwd T=S=1: %s", e_be_name(be), sa_last_error());
    e_free(&c);
  }
}

/* The soft-cap: S = 3 keys in closed form, s_j = cap tanh((scale q.k_j + bias_j) / cap), with bias[1] = -inf, which
   the cap makes the logit -cap (the key still counts: out and lse include it, its gradients are 0). A cap of 2e38
   gives the uncapped call within rounding, and 3e38 is refused (cap log2(e) overflows a float: the kernels keep
   logits in base 2); a cap of 1e-30 makes every logit +-1e-30, the softmax uniform, and
   dq, dk, dbias 0 (1 - tanh^2 underflows to 0 at l / cap ~ 1e30), while dv and dsinks stay finite. */
static void e_test_soft_cap(sa_backend be) {
  for (int sm = 0; sm < 3; sm++) {
    e_case c;
    e_make(&c, 2, 1, 3, 2, 1, 8, 4, (sa_softmax)sm, 81 + sm);
    e_add_bias_mask(&c, T_BCAST(1, 1, 1, 0), 0, 91 + sm); /* bias [1, 1, 1, S] */
    c.bias[1] = -INFINITY;
    const float cap = 1.25f;
    c.a.logits_soft_cap = cap;
    E_CHECK(e_fwd(&c, be) == SA_OK && e_bwd(&c, be) == SA_OK, "%s sm %d: %s", e_be_name(be), sm, sa_last_error());
    for (int64_t b = 0; b < 2; b++)
      for (int64_t n = 0; n < 2; n++) {
        double sj[3], den = sm == 0 ? 0.0 : exp(sm == 1 ? 0.0 : (double)c.sinks[n]), o[4] = {0};
        for (int j = 0; j < 3; j++) {
          double dot = 0;
          for (int d = 0; d < 8; d++) dot += (double)c.q[(b * 2 + n) * 8 + d] * c.k[(b * 3 + j) * 8 + d];
          sj[j] = cap * tanh((dot / sqrt(8.0) + c.bias[j]) / cap);
          den += exp(sj[j]);
        }
        for (int j = 0; j < 3; j++)
          for (int d = 0; d < 4; d++) o[d] += exp(sj[j]) / den * c.v[(b * 3 + j) * 4 + d];
        E_CHECK(sj[1] == -cap, "bias -inf under the cap: logit %g, want -cap", sj[1]);
        E_CHECK(fabs(c.lse[E_L(&c, b, n, 0)] - log(den)) < 1e-5 * (1 + fabs(log(den))), "%s sm %d cap: lse %g want %g",
                e_be_name(be), sm, c.lse[E_L(&c, b, n, 0)], log(den));
        for (int d = 0; d < 4; d++)
          E_CHECK(fabs(c.out[E_O(&c, b, 0, n) + d] - o[d]) < 1e-5, "%s sm %d cap: out %g want %g", e_be_name(be), sm,
                  c.out[E_O(&c, b, 0, n) + d], o[d]);
      }
    E_CHECK(c.dbias[1] == 0.0f && isfinite(c.dbias[0]) && isfinite(c.dbias[2]),
            "%s sm %d cap: dbias %g %g %g (want finite, 0, finite)", e_be_name(be), sm, c.dbias[0], c.dbias[1],
            c.dbias[2]);
    E_CHECK(e_all_finite(c.dq, c.nq) && e_all_finite(c.dk, c.nk) && e_all_finite(c.dv, c.nv),
            "%s sm %d cap: non-finite gradients", e_be_name(be), sm);

    /* cap 2e38 against no cap (bias finite: with bias -inf the uncapped key drops out) */
    c.bias[1] = 0.5f;
    c.a.logits_soft_cap = 0.0f;
    E_CHECK(e_fwd(&c, be) == SA_OK && e_bwd(&c, be) == SA_OK, "%s sm %d: %s", e_be_name(be), sm, sa_last_error());
    float *out = e_copy(c.out, c.no), *lse = e_copy(c.lse, c.rows), *dq = e_copy(c.dq, c.nq);
    c.a.logits_soft_cap = 3e38f;
    E_CHECK(e_fwd(&c, be) == SA_ERR_INVALID && strstr(sa_last_error(), "logits_soft_cap"), "%s sm %d cap 3e38: %s",
            e_be_name(be), sm, sa_last_error());
    c.a.logits_soft_cap = 2e38f;
    E_CHECK(e_fwd(&c, be) == SA_OK && e_bwd(&c, be) == SA_OK, "%s sm %d: %s", e_be_name(be), sm, sa_last_error());
    for (int64_t x = 0; x < c.no; x++)
      E_CHECK(fabsf(c.out[x] - out[x]) <= 1e-6f, "%s sm %d cap 2e38: out %g, uncapped %g", e_be_name(be), sm, c.out[x],
              out[x]);
    for (int64_t x = 0; x < c.rows; x++)
      E_CHECK(fabsf(c.lse[x] - lse[x]) <= 1e-6f * (1 + fabsf(lse[x])), "%s sm %d cap 2e38: lse %g, uncapped %g",
              e_be_name(be), sm, c.lse[x], lse[x]);
    for (int64_t x = 0; x < c.nq; x++)
      E_CHECK(fabsf(c.dq[x] - dq[x]) <= 1e-5f, "%s sm %d cap 2e38: dq %g, uncapped %g", e_be_name(be), sm, c.dq[x],
              dq[x]);

    /* cap 1e-30: a uniform softmax over the 3 keys beside the sink */
    c.a.logits_soft_cap = 1e-30f;
    E_CHECK(e_fwd(&c, be) == SA_OK && e_bwd(&c, be) == SA_OK, "%s sm %d: %s", e_be_name(be), sm, sa_last_error());
    for (int64_t b = 0; b < 2; b++)
      for (int64_t n = 0; n < 2; n++) {
        const double den = 3.0 + (sm == 0 ? 0.0 : exp(sm == 1 ? 0.0 : (double)c.sinks[n]));
        for (int d = 0; d < 4; d++) {
          const double want = (c.v[(b * 3) * 4 + d] + c.v[(b * 3 + 1) * 4 + d] + c.v[(b * 3 + 2) * 4 + d]) / den;
          E_CHECK(fabs(c.out[E_O(&c, b, 0, n) + d] - want) < 1e-5, "%s sm %d cap 1e-30: out %g want %g", e_be_name(be),
                  sm, c.out[E_O(&c, b, 0, n) + d], want);
        }
      }
    int zero = 1;
    for (int64_t x = 0; x < c.nq; x++) zero &= c.dq[x] == 0.0f;
    for (int64_t x = 0; x < c.nk; x++) zero &= c.dk[x] == 0.0f;
    for (int64_t x = 0; x < c.nb; x++) zero &= c.dbias[x] == 0.0f;
    E_CHECK(zero && e_all_finite(c.dv, c.nv) && (sm != SA_SOFTMAX_LEARNABLE || e_all_finite(c.dsinks, 2)),
            "%s sm %d cap 1e-30: dq, dk, dbias must be 0, dv and dsinks finite", e_be_name(be), sm);
    free(out);
    free(lse);
    free(dq);
    e_free(&c);
  }
}

/* Rows without a valid key: out = 0 and lse = a_n bitwise, gradients 0 there. Covers a whole batch of
   q_len 0, a batch of kv_len 0, S = 0 (no keys at all) and lengths clamped from -5 and 1e9. */
static void e_test_empty(sa_backend be) {
  for (int sm = 0; sm < 3; sm++) {
    e_case c;
    e_make(&c, 3, 5, 6, 4, 2, 16, 8, (sa_softmax)sm, 21 + sm);
    c.q_lens[0] = 0;
    c.kv_lens[0] = 6; /* batch 0: no query rows valid */
    c.q_lens[1] = 5;
    c.kv_lens[1] = -5; /* batch 1: no keys (clamped to 0) */
    c.q_lens[2] = 1000000000;
    c.kv_lens[2] = 3; /* batch 2: q_len clamped to 5 */
    c.a.q_lens = c.q_lens;
    c.a.kv_lens = c.kv_lens;
    E_CHECK(e_fwd(&c, be) == SA_OK, "%s: %s", e_be_name(be), sa_last_error());
    for (int64_t b = 0; b < 2; b++)
      for (int64_t n = 0; n < 4; n++)
        for (int64_t i = 0; i < 5; i++) {
          float a = sa_sink_logit(&c.a, n);
          E_CHECK(e_same(c.lse[E_L(&c, b, n, i)], a), "%s sm %d b%lld n%lld i%lld lse %g, want sink %g", e_be_name(be),
                  sm, (long long)b, (long long)n, (long long)i, c.lse[E_L(&c, b, n, i)], a);
          for (int64_t d = 0; d < 8; d++)
            E_CHECK(c.out[E_O(&c, b, i, n) + d] == 0.0f, "%s sm %d empty row out %g", e_be_name(be), sm,
                    c.out[E_O(&c, b, i, n) + d]);
        }
    E_CHECK(e_all_finite(c.out, c.no), "%s sm %d: non-finite out", e_be_name(be), sm);
    E_CHECK(e_bwd(&c, be) == SA_OK, "%s bwd: %s", e_be_name(be), sa_last_error());
    E_CHECK(e_all_finite(c.dq, c.nq) && e_all_finite(c.dk, c.nk) && e_all_finite(c.dv, c.nv),
            "%s sm %d: non-finite gradient with empty rows", e_be_name(be), sm);
    for (int64_t x = 0; x < 5 * 4 * 16 * 2; x++) /* batches 0 and 1 of dq */
      E_CHECK(c.dq[x] == 0.0f, "%s sm %d: dq %g in a row without keys", e_be_name(be), sm, c.dq[x]);
    if (sm == SA_SOFTMAX_LEARNABLE) E_CHECK(e_all_finite(c.dsinks, 4), "%s dsinks not finite", e_be_name(be));

    /* The same lengths written in range give the same bits: clamping is exact. */
    float *out = e_copy(c.out, c.no), *lse = e_copy(c.lse, c.rows);
    c.kv_lens[1] = 0;
    c.q_lens[2] = 5;
    E_CHECK(e_fwd(&c, be) == SA_OK && e_bits_equal(out, c.out, c.no) && e_bits_equal(lse, c.lse, c.rows),
            "%s sm %d: clamped lengths differ from in-range ones", e_be_name(be), sm);
    free(out);
    free(lse);
    e_free(&c);
  }
  e_case c; /* S = 0: every row empty; learnable sinks */
  e_make(&c, 2, 3, 0, 2, 2, 8, 8, SA_SOFTMAX_LEARNABLE, 5);
  c.a.k = NULL;
  c.a.v = NULL;
  c.g.dk = NULL;
  c.g.dv = NULL;
  E_CHECK(e_fwd(&c, be) == SA_OK, "%s S=0: %s", e_be_name(be), sa_last_error());
  for (int64_t x = 0; x < c.rows; x++) E_CHECK(c.lse[x] == c.sinks[(x / 3) % 2], "%s S=0 lse", e_be_name(be));
  for (int64_t x = 0; x < c.no; x++) E_CHECK(c.out[x] == 0.0f, "%s S=0 out", e_be_name(be));
  E_CHECK(e_bwd(&c, be) == SA_OK, "%s S=0 bwd: %s", e_be_name(be), sa_last_error());
  e_free(&c);
  e_make(&c, 0, 0, 0, 2, 1, 8, 8, SA_SOFTMAX_OFF_BY_ONE, 5); /* B = T = S = 0 with NULL buffers */
  c.a.q = c.a.k = c.a.v = NULL;
  c.a.out = NULL;
  c.a.lse = NULL;
  E_CHECK(sa_attn_fwd(&c.a, be, NULL) == SA_OK, "%s empty problem: %s", e_be_name(be), sa_last_error());
  /* B = 0 stays empty however long T and S are: no memory is needed (REF once sized a row by S), and
     dsinks, the one result without a batch dimension, is 0 */
  c.a.q_len = c.a.kv_len = (int64_t)1 << 40;
  c.a.softmax = SA_SOFTMAX_LEARNABLE;
  c.a.sinks = c.sinks;
  c.g.dout = c.g.dq = c.g.dk = c.g.dv = NULL;
  c.g.dsinks = c.dsinks;
  c.dsinks[0] = c.dsinks[1] = NAN;
  sa_status sf = sa_attn_fwd(&c.a, be, NULL), sb = sa_attn_bwd(&c.a, &c.g, NULL, 0, be, NULL);
  E_CHECK(sf == SA_OK && sb == SA_OK && c.dsinks[0] == 0.0f && c.dsinks[1] == 0.0f,
          "%s B = 0, T = S = 2^40: fwd %s, bwd %s, dsinks %g %g (%s)", e_be_name(be), sa_status_name(sf),
          sa_status_name(sb), c.dsinks[0], c.dsinks[1], sa_last_error());
  c.a.q_len = 3;
  E_CHECK(sa_attn_decode_fwd(&c.a, NULL, 0, be, NULL) == SA_OK, "%s B = 0 decode, S = 2^40: %s", e_be_name(be),
          sa_last_error());
  e_free(&c);
}

/* Sinks: +-1e4, +-inf and NaN in a learnable problem, compared with a reference run. */
static void e_test_sinks(sa_backend be) {
  e_case c;
  e_make(&c, 2, 7, 9, 4, 2, 16, 16, SA_SOFTMAX_LEARNABLE, 31);
  c.a.causal = SA_CAUSAL_BOTTOM_RIGHT;
  e_case v; /* vanilla twin: same data */
  e_make(&v, 2, 7, 9, 4, 2, 16, 16, SA_SOFTMAX_VANILLA, 31);
  v.a.causal = SA_CAUSAL_BOTTOM_RIGHT;
  E_CHECK(e_fwd(&v, be) == SA_OK, "%s vanilla: %s", e_be_name(be), sa_last_error());
  const float sinks[4] = {1e4f, -1e4f, INFINITY, -INFINITY};
  memcpy(c.sinks, sinks, sizeof sinks);
  E_CHECK(e_fwd(&c, be) == SA_OK, "%s: %s", e_be_name(be), sa_last_error());
  for (int64_t b = 0; b < 2; b++)
    for (int64_t i = 0; i < 7; i++)
      for (int64_t d = 0; d < 16; d++) {
        /* +1e4 and +inf take all the mass: out 0 exactly (exp(s - 1e4) underflows to 0 in fp32). */
        E_CHECK(c.out[E_O(&c, b, i, 0) + d] == 0.0f, "%s sink 1e4: out %g", e_be_name(be), c.out[E_O(&c, b, i, 0) + d]);
        E_CHECK(c.out[E_O(&c, b, i, 2) + d] == 0.0f, "%s sink +inf: out %g", e_be_name(be),
                c.out[E_O(&c, b, i, 2) + d]);
        /* -1e4 adds exp(-1e4 - m) = 0 to the denominator: vanilla within rounding; -inf is vanilla. */
        float o1 = c.out[E_O(&c, b, i, 1) + d], v1 = v.out[E_O(&v, b, i, 1) + d];
        E_CHECK(fabsf(o1 - v1) <= 1e-6f * (1 + fabsf(v1)), "%s sink -1e4: %g vs vanilla %g", e_be_name(be), o1, v1);
        E_CHECK(e_same(c.out[E_O(&c, b, i, 3) + d], v.out[E_O(&v, b, i, 3) + d]), "%s sink -inf != vanilla",
                e_be_name(be));
      }
  for (int64_t b = 0; b < 2; b++)
    for (int64_t i = 0; i < 7; i++) {
      E_CHECK(c.lse[E_L(&c, b, 0, i)] == 1e4f, "%s sink 1e4: lse %g", e_be_name(be), c.lse[E_L(&c, b, 0, i)]);
      E_CHECK(c.lse[E_L(&c, b, 2, i)] == INFINITY, "%s sink +inf: lse %g", e_be_name(be), c.lse[E_L(&c, b, 2, i)]);
      E_CHECK(e_same(c.lse[E_L(&c, b, 3, i)], v.lse[E_L(&v, b, 3, i)]), "%s sink -inf: lse %g vs vanilla %g",
              e_be_name(be), c.lse[E_L(&c, b, 3, i)], v.lse[E_L(&v, b, 3, i)]);
    }
  /* Backward: +inf sink rows carry no mass, so they add nothing to dq, dk, dv: all stay finite. */
  E_CHECK(e_bwd(&c, be) == SA_OK, "%s bwd: %s", e_be_name(be), sa_last_error());
  E_CHECK(e_all_finite(c.dq, c.nq) && e_all_finite(c.dk, c.nk) && e_all_finite(c.dv, c.nv),
          "%s: non-finite dq/dk/dv with infinite sinks", e_be_name(be));
  E_CHECK(isfinite(c.dsinks[0]) && isfinite(c.dsinks[1]) && c.dsinks[3] == 0.0f,
          "%s dsinks %g %g %g (want finite, finite, 0)", e_be_name(be), c.dsinks[0], c.dsinks[1], c.dsinks[3]);

  /* NaN in head 1's sink: head 1 gives NaN (lse in every row, out in every row with a key), the other
     heads are bitwise what a finite sink gives them. */
  float *out = e_copy(c.out, c.no), *lse = e_copy(c.lse, c.rows);
  c.sinks[1] = NAN;
  E_CHECK(e_fwd(&c, be) == SA_OK, "%s NaN sink: %s", e_be_name(be), sa_last_error());
  for (int64_t b = 0; b < 2; b++)
    for (int64_t i = 0; i < 7; i++)
      for (int64_t n = 0; n < 4; n++) {
        float l = c.lse[E_L(&c, b, n, i)];
        if (n == 1) {
          E_CHECK(isnan(l) && isnan(c.out[E_O(&c, b, i, n)]), "%s NaN sink: lse %g out %g", e_be_name(be), l,
                  c.out[E_O(&c, b, i, n)]);
        } else {
          E_CHECK(
              e_same(l, lse[E_L(&c, b, n, i)]) && e_bits_equal(c.out + E_O(&c, b, i, n), out + E_O(&c, b, i, n), 16),
              "%s NaN sink in head 1 changed head %lld", e_be_name(be), (long long)n);
        }
      }
  E_CHECK(e_bwd(&c, be) == SA_OK, "%s bwd with a NaN sink: %s", e_be_name(be), sa_last_error());
  free(out);
  free(lse);
  e_free(&c);
  e_free(&v);
}

/* NaN / inf in q, k, v propagate, never crash. Padding (beyond the lengths) reaches nothing, bitwise;
   inside the lengths a poisoned key reaches at least the rows that see it (causal TOP_LEFT: rows i >= j)
   and nothing outside its batch. Rows that mask it may turn NaN too (0 * NaN in a tile): not tested. */
static void e_test_poison(sa_backend be) {
  e_case c;
  e_make(&c, 2, 8, 8, 2, 1, 8, 8, SA_SOFTMAX_LEARNABLE, 41);
  c.a.causal = SA_CAUSAL_TOP_LEFT;
  c.q_lens[0] = 8;
  c.kv_lens[0] = 8;
  c.q_lens[1] = 5;
  c.kv_lens[1] = 6;
  c.a.q_lens = c.q_lens;
  c.a.kv_lens = c.kv_lens;
  E_CHECK(e_fwd(&c, be) == SA_OK, "%s: %s", e_be_name(be), sa_last_error());
  E_CHECK(e_bwd(&c, be) == SA_OK, "%s: %s", e_be_name(be), sa_last_error());
  float *out = e_copy(c.out, c.no), *dq = e_copy(c.dq, c.nq), *dk = e_copy(c.dk, c.nk), *dv = e_copy(c.dv, c.nv);
  float *ds = e_copy(c.dsinks, 2);
  /* padding of batch 1: query rows 5..7, keys 6..7, all NaN */
  for (int64_t x = (8 + 5) * 2 * 8; x < 16 * 2 * 8; x++) c.q[x] = NAN;
  for (int64_t x = (8 + 6) * 8; x < 16 * 8; x++) c.k[x] = c.v[x] = NAN;
  E_CHECK(e_fwd(&c, be) == SA_OK && e_bits_equal(out, c.out, c.no), "%s: NaN padding leaked into out", e_be_name(be));
  E_CHECK(e_bwd(&c, be) == SA_OK, "%s: %s", e_be_name(be), sa_last_error());
  E_CHECK(e_bits_equal(dq, c.dq, c.nq), "%s: NaN padding leaked into dq", e_be_name(be));
  E_CHECK(e_bits_equal(dk, c.dk, c.nk), "%s: NaN padding leaked into dk", e_be_name(be));
  E_CHECK(e_bits_equal(dv, c.dv, c.nv), "%s: NaN padding leaked into dv", e_be_name(be));
  E_CHECK(e_bits_equal(ds, c.dsinks, 2), "%s: NaN padding leaked into dsinks", e_be_name(be));
  /* batch 0: v at key 3 NaN; k at key 6 = +inf */
  for (int64_t d = 0; d < 8; d++) c.v[3 * 8 + d] = NAN;
  c.k[6 * 8] = INFINITY;
  E_CHECK(e_fwd(&c, be) == SA_OK, "%s poisoned: %s", e_be_name(be), sa_last_error());
  for (int64_t i = 0; i < 8; i++)
    for (int64_t n = 0; n < 2; n++) {
      const float *o = c.out + E_O(&c, 0, i, n);
      if (i >= 3)
        E_CHECK(!e_all_finite(o, 8), "%s: row %lld sees a NaN value but is finite", e_be_name(be), (long long)i);
    }
  E_CHECK(e_bits_equal(c.out + E_O(&c, 1, 0, 0), out + E_O(&c, 1, 0, 0), 8 * 2 * 8),
          "%s: poison in batch 0 reached batch 1", e_be_name(be));
  E_CHECK(e_bwd(&c, be) == SA_OK, "%s bwd poisoned: %s", e_be_name(be), sa_last_error());
  free(out);
  free(dq);
  free(dk);
  free(dv);
  free(ds);
  e_free(&c);
}

/* A row that the mask array empties (every key false) and one that the bias empties (-inf on every key) are
   rows without a key: out 0 and lse a_n bitwise, no gradient (dq 0, and 0 in dbias). NaN in one bias
   element makes its row NaN and no other row of the forward changes, bitwise. */
static void e_test_killed_rows(sa_backend be) {
  for (int sm = 0; sm < 3; sm++) {
    e_case c;
    e_make(&c, 2, 7, 9, 4, 2, 16, 8, (sa_softmax)sm, 61 + sm);
    c.a.causal = SA_CAUSAL_TOP_LEFT;
    e_add_bias_mask(&c, T_BCAST(0, 0, 0, 0), T_BCAST(0, 0, 0, 0), 71 + sm);
    const int64_t mrow = ((0 * 4 + 1) * 7 + 5) * 9, brow = ((1 * 4 + 0) * 7 + 3) * 9; /* (b0 n1 i5), (b1 n0 i3) */
    for (int64_t j = 0; j < 9; j++) {
      c.mask[mrow + j] = 0;
      c.bias[brow + j] = -INFINITY;
    }
    E_CHECK(e_fwd(&c, be) == SA_OK && e_bwd(&c, be) == SA_OK, "%s sm %d: %s", e_be_name(be), sm, sa_last_error());
    const int64_t rows[2][3] = {{0, 1, 5}, {1, 0, 3}};
    for (int r = 0; r < 2; r++) {
      int64_t b = rows[r][0], n = rows[r][1], i = rows[r][2];
      float a = sa_sink_logit(&c.a, n);
      E_CHECK(e_same(c.lse[E_L(&c, b, n, i)], a), "%s sm %d emptied row %d: lse %g, want %g", e_be_name(be), sm, r,
              c.lse[E_L(&c, b, n, i)], a);
      for (int64_t d = 0; d < 8; d++)
        E_CHECK(c.out[E_O(&c, b, i, n) + d] == 0.0f, "%s sm %d emptied row %d: out %g", e_be_name(be), sm, r,
                c.out[E_O(&c, b, i, n) + d]);
      for (int64_t d = 0; d < 16; d++)
        E_CHECK(c.dq[((b * 7 + i) * 4 + n) * 16 + d] == 0.0f, "%s sm %d emptied row %d: dq %g", e_be_name(be), sm, r,
                c.dq[((b * 7 + i) * 4 + n) * 16 + d]);
      for (int64_t j = 0; j < 9; j++)
        E_CHECK(c.dbias[((b * 4 + n) * 7 + i) * 9 + j] == 0.0f, "%s sm %d emptied row %d: dbias %g", e_be_name(be), sm,
                r, c.dbias[((b * 4 + n) * 7 + i) * 9 + j]);
    }
    E_CHECK(e_all_finite(c.out, c.no) && e_all_finite(c.dq, c.nq) && e_all_finite(c.dk, c.nk) &&
                e_all_finite(c.dv, c.nv) && e_all_finite(c.dbias, c.nb),
            "%s sm %d: non-finite results", e_be_name(be), sm);
    /* NaN in bias element (b0, n2, i4, j1), a key row 4 of a causal mask sees */
    float *out = e_copy(c.out, c.no), *lse = e_copy(c.lse, c.rows);
    c.bias[((0 * 4 + 2) * 7 + 4) * 9 + 1] = NAN;
    c.mask[((0 * 4 + 2) * 7 + 4) * 9 + 1] = 1;
    E_CHECK(e_fwd(&c, be) == SA_OK, "%s sm %d NaN bias: %s", e_be_name(be), sm, sa_last_error());
    E_CHECK(isnan(c.lse[E_L(&c, 0, 2, 4)]) && isnan(c.out[E_O(&c, 0, 4, 2)]), "%s sm %d: NaN bias, row not NaN",
            e_be_name(be), sm);
    for (int64_t b = 0; b < 2; b++)
      for (int64_t i = 0; i < 7; i++)
        for (int64_t n = 0; n < 4; n++) {
          if (b == 0 && i == 4 && n == 2) continue;
          E_CHECK(e_same(c.lse[E_L(&c, b, n, i)], lse[E_L(&c, b, n, i)]) &&
                      e_bits_equal(c.out + E_O(&c, b, i, n), out + E_O(&c, b, i, n), 8),
                  "%s sm %d: NaN bias of row (0, 2, 4) changed row (%lld, %lld, %lld)", e_be_name(be), sm, (long long)b,
                  (long long)n, (long long)i);
        }
    free(out);
    free(lse);
    e_free(&c);
  }
}

/* A head dim the CUDA backend lacks is SA_ERR_UNSUPPORTED naming head_dim (when CUDA is built and a device
   is present), reported before the pointers' memory kind is looked at (these are host pointers); without
   the CUDA backend, or without a device, every SA_BACKEND_CUDA entry point is SA_ERR_DEVICE naming CUDA.
   AUTO never picks CUDA for host memory. */
static void e_test_cuda_unsupported(void) {
  e_case c;
  e_make(&c, 1, 4, 4, 2, 1, 72, 72, SA_SOFTMAX_OFF_BY_ONE, 51);
  sa_status s = sa_attn_check(&c.a, SA_BACKEND_CUDA);
  if (sa_has_cuda() && sa_cuda_available()) {
    E_CHECK(s == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), "head_dim"), "CUDA head_dim 72: %s (%s)",
            sa_status_name(s), sa_last_error());
  } else {
    sa_status sb = sa_attn_bwd(&c.a, &c.g, NULL, 0, SA_BACKEND_CUDA, NULL);
    sa_status sd = sa_attn_decode_fwd(&c.a, NULL, 0, SA_BACKEND_CUDA, NULL);
    E_CHECK(s == SA_ERR_DEVICE && sb == SA_ERR_DEVICE && sd == SA_ERR_DEVICE && strstr(sa_last_error(), "CUDA"),
            "no CUDA device: check %s, bwd %s, decode %s (%s)", sa_status_name(s), sa_status_name(sb),
            sa_status_name(sd), sa_last_error());
  }
  E_CHECK(sa_backend_resolve(&c.a, SA_BACKEND_AUTO) != SA_BACKEND_CUDA, "AUTO picked CUDA for host memory");
  e_free(&c);
}

/* ---- concurrency and determinism (CPU) ------------------------------------------------------------ */

enum { E_THREADS = 8 };
typedef struct {
  e_case c;
  float *out, *lse, *dq, *dk, *dv, *ds, *db;
  int reps, bad, errs;
} e_job;

static void e_job_make(e_job *j, int t) {
  /* Different shapes per thread, GQA, windows and masks, so the threads run different code paths; every
     other job has a bias (shared by heads and batches, per key, per row) and some a mask array. */
  e_make(&j->c, 1 + t % 2, 33 + 7 * t, 29 + 5 * t, 4, 2 - t % 2, t % 3 ? 64 : 32, 64, (sa_softmax)(t % 3), 1000 + t);
  j->c.a.causal = (sa_causal)(t % 3);
  if (t % 4 == 3) {
    j->c.a.window_left = 9;
    j->c.a.window_right = 2;
  }
  static const int forms[4] = {T_BCAST(1, 1, 0, 0), T_BCAST(0, 1, 1, 0), T_BCAST(0, 0, 0, 1), T_BCAST(0, 0, 0, 0)};
  if (t % 2) e_add_bias_mask(&j->c, forms[(t / 2) % 4], t % 3 == 1 ? T_BCAST(1, 0, 0, 0) : 0, 2000 + t);
}

static void e_job_snapshot(e_job *j) {
  j->out = e_copy(j->c.out, j->c.no);
  j->lse = e_copy(j->c.lse, j->c.rows);
  j->dq = e_copy(j->c.dq, j->c.nq);
  j->dk = e_copy(j->c.dk, j->c.nk);
  j->dv = e_copy(j->c.dv, j->c.nv);
  j->ds = e_copy(j->c.dsinks, j->c.a.q_heads);
  j->db = j->c.dbias ? e_copy(j->c.dbias, j->c.nb) : NULL;
}

static int e_job_matches(e_job *j) {
  return e_bits_equal(j->out, j->c.out, j->c.no) && e_bits_equal(j->lse, j->c.lse, j->c.rows) &&
         e_bits_equal(j->dq, j->c.dq, j->c.nq) && e_bits_equal(j->dk, j->c.dk, j->c.nk) &&
         e_bits_equal(j->dv, j->c.dv, j->c.nv) &&
         (!j->c.g.dsinks || e_bits_equal(j->ds, j->c.dsinks, j->c.a.q_heads)) &&
         (!j->c.dbias || e_bits_equal(j->db, j->c.dbias, j->c.nb));
}

static void e_job_free(e_job *j) {
  free(j->out);
  free(j->lse);
  free(j->dq);
  free(j->dk);
  free(j->dv);
  free(j->ds);
  free(j->db);
  e_free(&j->c);
}

static void *e_job_run(void *arg) {
  e_job *j = arg;
  for (int r = 0; r < j->reps; r++) {
    if (e_fwd(&j->c, SA_BACKEND_CPU) != SA_OK || e_bwd(&j->c, SA_BACKEND_CPU) != SA_OK) j->errs++;
    else if (!e_job_matches(j)) j->bad++;
    /* An invalid call on this thread sets this thread's message only. */
    if (sa_attn_fwd(NULL, SA_BACKEND_CPU, NULL) != SA_ERR_INVALID || !strstr(sa_last_error(), "NULL")) j->errs++;
  }
  return NULL;
}

static void e_test_threads(void) {
  e_job jobs[E_THREADS];
  for (int t = 0; t < E_THREADS; t++) { /* serial first: the expected bits */
    e_job_make(&jobs[t], t);
    E_CHECK(e_fwd(&jobs[t].c, SA_BACKEND_CPU) == SA_OK && e_bwd(&jobs[t].c, SA_BACKEND_CPU) == SA_OK,
            "serial job %d: %s", t, sa_last_error());
    e_job_snapshot(&jobs[t]);
    jobs[t].reps = e_quick ? 2 : 8;
    jobs[t].bad = jobs[t].errs = 0;
  }
  pthread_t th[E_THREADS];
  for (int t = 0; t < E_THREADS; t++) E_CHECK(pthread_create(&th[t], NULL, e_job_run, &jobs[t]) == 0, "create");
  for (int t = 0; t < E_THREADS; t++) pthread_join(th[t], NULL);
  for (int t = 0; t < E_THREADS; t++) {
    E_CHECK(jobs[t].errs == 0 && jobs[t].bad == 0, "thread %d: %d errors, %d of %d runs not bitwise equal to serial", t,
            jobs[t].errs, jobs[t].bad, jobs[t].reps);
    e_job_free(&jobs[t]);
  }
}

/* The same call with 1..7 CPU threads, and repeated: identical bits (dsinks included). */
static void e_test_thread_counts(void) {
  int counts[] = {1, 2, 3, 4, 7}, ncounts = e_quick ? 3 : 5;
  for (int t = 0; t < 4; t++) {
    e_job j;
    e_job_make(&j, t + 1);
    sa_cpu_set_num_threads(1);
    E_CHECK(e_fwd(&j.c, SA_BACKEND_CPU) == SA_OK && e_bwd(&j.c, SA_BACKEND_CPU) == SA_OK, "%s", sa_last_error());
    e_job_snapshot(&j);
    for (int x = 0; x < ncounts; x++)
      for (int rep = 0; rep < 2; rep++) {
        sa_cpu_set_num_threads(counts[x]);
        E_CHECK(e_fwd(&j.c, SA_BACKEND_CPU) == SA_OK && e_bwd(&j.c, SA_BACKEND_CPU) == SA_OK && e_job_matches(&j),
                "job %d: %d threads (rep %d) differs from 1 thread", t, counts[x], rep);
      }
    e_job_free(&j);
  }
  sa_cpu_set_num_threads(0);
}

int main(void) {
  const char *quick = getenv("SINKATTN_TEST_QUICK");
  e_quick = quick && quick[0] && quick[0] != '0';
  for (size_t b = 0; b < sizeof e_backends / sizeof e_backends[0]; b++) {
    e_test_single(e_backends[b]);
    e_test_empty(e_backends[b]);
    e_test_sinks(e_backends[b]);
    e_test_poison(e_backends[b]);
    e_test_killed_rows(e_backends[b]);
    e_test_soft_cap(e_backends[b]);
  }
  e_test_cuda_unsupported();
  e_test_threads();
  e_test_thread_counts();
  printf("test_edges: %d checks passed, %d failed (CPU SIMD %s)\n", t_passed, t_failed, sa_cpu_simd_name());
  return t_failed ? 1 : 0;
}
