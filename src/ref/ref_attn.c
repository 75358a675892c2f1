/*
 * ref_attn.c — the reference: attention with sinks written to be read, not to be fast. Every other
 * backend is tested against it, so it follows the formulas of sinkattn.h line by line, one query row at
 * a time, in labelled passes, with fp64 accumulation. Inputs are converted to double once, the math runs
 * on double arrays (sa_ref_fwd64 / sa_ref_bwd64, also used by the finite-difference tests), and results
 * are rounded to the caller's dtype once at the end.
 *
 * Cost: O(B*N*T*S*(H+Hv)) time and O(S) extra memory per row plus the double copies of the tensors;
 * fine for tests and small problems, roughly 100x slower than the CPU backend.
 */
#include <stdlib.h>

#include "ref/ref_attn.h"

/* ---- indexing (dense, row-major; see the layout in sinkattn.h) -------------------------------- */

#define SA_Q(a, b, i, n) ((((b) * (a)->q_len + (i)) * (a)->q_heads + (n)) * (a)->head_dim)
#define SA_K(a, b, j, h) ((((b) * (a)->kv_len + (j)) * (a)->kv_heads + (h)) * (a)->head_dim)
#define SA_V(a, b, j, h) ((((b) * (a)->kv_len + (j)) * (a)->kv_heads + (h)) * (a)->v_head_dim)
#define SA_O(a, b, i, n) ((((b) * (a)->q_len + (i)) * (a)->q_heads + (n)) * (a)->v_head_dim)
#define SA_L(a, b, n, i) (((b) * (a)->q_heads + (n)) * (a)->q_len + (i))

/* The sink logit a_n in double: the learnable one comes from the caller's (double) sinks. */
static double sa_ref_sink(const sa_attn *a, const double *sinks, int64_t n) {
  return a->softmax == SA_SOFTMAX_LEARNABLE ? sinks[n] : (double)sa_sink_logit(a, n);
}

/* The scale every backend uses: the float of sa_scale_of, so that the reference and the fp32 backends
   multiply by the same number (1/sqrt(H) is not exact in float: 1/sqrt(80) differs by 3e-8 relative). */
static double sa_ref_scale(const sa_attn *a) { return (double)sa_scale_of(a); }

/* The soft-cap of one logit: cap * tanh(l / cap), or l itself when the cap is off (0). */
static double sa_ref_cap(const sa_attn *a, double l) {
  double cap = (double)a->logits_soft_cap;
  return cap > 0.0 ? cap * tanh(l / cap) : l;
}

/* d s / d l of the soft-cap at the capped logit s = cap * tanh(l / cap): 1 - tanh^2 = 1 - (s / cap)^2
   (1 when the cap is off). */
static double sa_ref_cap_grad(const sa_attn *a, double s) {
  double cap = (double)a->logits_soft_cap;
  return cap > 0.0 ? 1.0 - (s / cap) * (s / cap) : 1.0;
}

/* Scores of query row i (batch b, head n) against every key: s[j] = cap(scale * q_i . k_j + bias[b,n,i,j])
   where (i, j) is valid, -inf where it is not, whatever q, k and bias hold there (exp(-inf) = 0 drops
   those keys from every sum below). Without a soft-cap a bias of -inf drops its key the same way; under
   one it gives the logit -cap. */
static void sa_ref_scores(const sa_attn *a, const double *q, const double *k, const double *bias, int64_t b, int64_t n,
                          int64_t i, double *s) {
  int64_t S = a->kv_len, H = a->head_dim, kh = n / (a->q_heads / a->kv_heads);
  sa_range r = sa_key_range(a, sa_q_len_of(a, b), sa_kv_len_of(a, b), i);
  sa_bcast bs = sa_bcast_of(a->bias_dims);
  double scale = sa_ref_scale(a);
  for (int64_t j = 0; j < S; j++) {
    s[j] = -INFINITY;
    if (j < r.lo || j >= r.hi || !sa_pair_ok(a, b, n, i, j)) continue;
    const double *qi = q + SA_Q(a, b, i, n), *kj = k + SA_K(a, b, j, kh);
    double dot = 0.0;
    for (int64_t d = 0; d < H; d++) dot += qi[d] * kj[d];
    double l = scale * dot;
    if (bias) l += bias[sa_bcast_at(bs, b, n, i, j)];
    s[j] = sa_ref_cap(a, l);
  }
}

sa_status sa_ref_fwd64(const sa_attn *a, const double *q, const double *k, const double *v, const double *sinks,
                       const double *bias, double *out, double *lse) {
  int64_t B = a->batch, T = a->q_len, S = a->kv_len, N = a->q_heads, Hv = a->v_head_dim;
  int64_t G = N / a->kv_heads;
  double *s = malloc((size_t)(S + 1) * sizeof *s);
  if (!s) return sa_error(SA_ERR_NO_MEMORY, "reference: cannot allocate %lld scores", (long long)S);
  for (int64_t b = 0; b < B; b++)
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < T; i++) {
        double sink = sa_ref_sink(a, sinks, n);
        double *o = out + SA_O(a, b, i, n);

        /* pass 1: scores and row max. The max starts at the sink logit: a huge sink (|a| = 100) then
           cannot overflow exp(), and a row without keys keeps m = a_n. */
        sa_ref_scores(a, q, k, bias, b, n, i, s);
        double m = sink;
        /* A NaN score (NaN or inf in q or k) is kept as the max: the row then comes out NaN instead of
           looking empty (s > m is false for NaN, which would skip it). */
        for (int64_t j = 0; j < S && !isnan(m); j++) m = s[j] > m || isnan(s[j]) ? s[j] : m;

        /* A row with no valid key and no sink (vanilla): nothing to normalise. out = 0, lse = -inf. */
        if (m == -INFINITY) {
          for (int64_t d = 0; d < Hv; d++) o[d] = 0.0;
          lse[SA_L(a, b, n, i)] = -INFINITY;
          continue;
        }

        /* pass 2: exp-sum with the sink. The sink is one more column of the softmax denominator. */
        /* m >= sink, so exp(sink - m) is exp(0) = 1 when the sink is the max; spelled out because a
           +inf sink gives exp(inf - inf) = NaN: with it, a +inf sink yields l = 1, lse = +inf, out = 0. */
        double l = sink == m ? 1.0 : exp(sink - m);
        for (int64_t j = 0; j < S; j++) l += exp(s[j] - m);
        double lse_i = m + log(l);
        lse[SA_L(a, b, n, i)] = lse_i;

        /* pass 3: P.V. The sink column has no value row: its probability mass exp(a - lse) just
           leaves the output shorter (a row with only the sink gives out = 0). */
        for (int64_t d = 0; d < Hv; d++) o[d] = 0.0;
        for (int64_t j = 0; j < S; j++) {
          if (s[j] == -INFINITY) continue;
          double p = exp(s[j] - lse_i);
          const double *vj = v + SA_V(a, b, j, n / G);
          for (int64_t d = 0; d < Hv; d++) o[d] += p * vj[d];
        }
      }
  free(s);
  return SA_OK;
}

sa_status sa_ref_bwd64(const sa_attn *a, const double *q, const double *k, const double *v, const double *sinks,
                       const double *bias, const double *out, const double *lse, const double *dout, const double *dlse,
                       double *dq, double *dk, double *dv, double *dsinks, double *dbias) {
  int64_t B = a->batch, T = a->q_len, S = a->kv_len, N = a->q_heads, K = a->kv_heads;
  int64_t H = a->head_dim, Hv = a->v_head_dim, G = N / K;
  double scale = sa_ref_scale(a);
  double *s = malloc((size_t)(S + 1) * sizeof *s);
  if (!s) return sa_error(SA_ERR_NO_MEMORY, "reference: cannot allocate %lld scores", (long long)S);
  memset(dq, 0, (size_t)(B * T * N * H) * sizeof *dq);
  memset(dk, 0, (size_t)(B * S * K * H) * sizeof *dk);
  memset(dv, 0, (size_t)(B * S * K * Hv) * sizeof *dv);
  if (dsinks) memset(dsinks, 0, (size_t)N * sizeof *dsinks);
  if (dbias) memset(dbias, 0, (size_t)sa_dims_count(a->bias_dims) * sizeof *dbias);
  sa_bcast bs = sa_bcast_of(a->bias_dims);

  /* Loop order b, n, i (then j): dsinks[n] is summed over (b, i), and each dbias element over the pairs
     that read it, in this one fixed order. */
  for (int64_t b = 0; b < B; b++)
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < T; i++) {
        double lse_i = lse[SA_L(a, b, n, i)];
        /* lse = -inf: a vanilla row without keys. It has no probability mass, so no gradient. */
        if (lse_i == -INFINITY) continue;
        const double *qi = q + SA_Q(a, b, i, n), *oi = out + SA_O(a, b, i, n);
        const double *doi = dout + SA_O(a, b, i, n);
        double *dqi = dq + SA_Q(a, b, i, n);

        /* pass 1: D_i = dout_i . out_i - dlse_i, the softmax's "row mean" of dp (out and lse as given:
           the backward differentiates the forward the caller actually ran). */
        double D = dlse ? -dlse[SA_L(a, b, n, i)] : 0.0;
        for (int64_t d = 0; d < Hv; d++) D += doi[d] * oi[d];

        /* pass 2: probabilities from the saved lse, then ds = p (dp - D) into dq, dk, dv, and into the
           bias element the score read. ds is the gradient of the capped score s; the logit l's (which
           dq, dk and dbias differentiate) is ds * ds/dl, the soft-cap's 1 - tanh^2. */
        sa_ref_scores(a, q, k, bias, b, n, i, s);
        for (int64_t j = 0; j < S; j++) {
          if (s[j] == -INFINITY) continue;
          double p = exp(s[j] - lse_i);
          const double *kj = k + SA_K(a, b, j, n / G), *vj = v + SA_V(a, b, j, n / G);
          double *dkj = dk + SA_K(a, b, j, n / G), *dvj = dv + SA_V(a, b, j, n / G);
          double dp = 0.0;
          for (int64_t d = 0; d < Hv; d++) dp += doi[d] * vj[d];
          double ds = p * (dp - D) * sa_ref_cap_grad(a, s[j]);
          for (int64_t d = 0; d < H; d++) dqi[d] += scale * ds * kj[d];
          for (int64_t d = 0; d < H; d++) dkj[d] += scale * ds * qi[d];
          for (int64_t d = 0; d < Hv; d++) dvj[d] += p * doi[d];
          if (dbias) dbias[sa_bcast_at(bs, b, n, i, j)] += ds;
        }

        /* pass 3: the sink gradient. The sink is a column with probability exp(a - lse) and value 0,
           so ds_sink = p_sink (0 - D_i). Only a learnable sink is a parameter. */
        if (dsinks && a->softmax == SA_SOFTMAX_LEARNABLE) {
          double sink = sa_ref_sink(a, sinks, n); /* a +inf sink has lse = +inf and all the mass: 1 */
          dsinks[n] -= (sink == lse_i ? 1.0 : exp(sink - lse_i)) * D;
        }
      }
  free(s);
  return SA_OK;
}

/* ---- the dtype entry points: convert, run in fp64, round once ----------------------------------- */

/* A double copy of n elements of p (dtype t); NULL p gives zeros. One extra element so n = 0 is not a
   malloc(0) whose NULL would read as failure. */
static double *sa_ref_load(const void *p, sa_dtype t, int64_t n) {
  double *x = malloc((size_t)(n + 1) * sizeof *x);
  if (!x) return NULL;
  for (int64_t i = 0; i < n; i++) x[i] = p ? (double)sa_load(p, t, i) : 0.0;
  return x;
}

static void sa_ref_store(void *p, sa_dtype t, const double *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) sa_store(p, t, i, (float)x[i]);
}

enum {
  SA_REF_Q,
  SA_REF_K,
  SA_REF_V,
  SA_REF_SINKS,
  SA_REF_BIAS,
  SA_REF_OUT,
  SA_REF_LSE,
  SA_REF_DOUT,
  SA_REF_DLSE,
  SA_REF_DQ,
  SA_REF_DK,
  SA_REF_DV,
  SA_REF_DSINKS,
  SA_REF_DBIAS,
  SA_REF_NBUF
};

static void sa_ref_free(double **x) {
  for (int i = 0; i < SA_REF_NBUF; i++) free(x[i]);
}

sa_status sa_ref_attn_fwd(const sa_attn *a) {
  int64_t B = a->batch, T = a->q_len, S = a->kv_len, N = a->q_heads, K = a->kv_heads;
  int64_t nq = B * T * N * a->head_dim, nk = B * S * K * a->head_dim, nv = B * S * K * a->v_head_dim;
  int64_t no = B * T * N * a->v_head_dim;
  double *x[SA_REF_NBUF] = {0};
  x[SA_REF_Q] = sa_ref_load(a->q, a->dtype, nq);
  x[SA_REF_K] = sa_ref_load(a->k, a->dtype, nk);
  x[SA_REF_V] = sa_ref_load(a->v, a->dtype, nv);
  x[SA_REF_SINKS] = sa_ref_load(a->softmax == SA_SOFTMAX_LEARNABLE ? a->sinks : NULL, SA_F32, N);
  x[SA_REF_BIAS] = sa_ref_load(a->bias, a->bias_dtype, sa_dims_count(a->bias_dims));
  x[SA_REF_OUT] = sa_ref_load(NULL, SA_F32, no);
  x[SA_REF_LSE] = sa_ref_load(NULL, SA_F32, B * N * T);
  for (int i = 0; i <= SA_REF_LSE; i++)
    if (!x[i]) {
      sa_ref_free(x);
      return sa_error(SA_ERR_NO_MEMORY, "reference: cannot allocate the fp64 copies of q, k, v, bias, out");
    }
  const double *bias = sa_dims_set(a->bias_dims) ? x[SA_REF_BIAS] : NULL;
  sa_status s =
      sa_ref_fwd64(a, x[SA_REF_Q], x[SA_REF_K], x[SA_REF_V], x[SA_REF_SINKS], bias, x[SA_REF_OUT], x[SA_REF_LSE]);
  if (s == SA_OK) {
    sa_ref_store(a->out, a->dtype, x[SA_REF_OUT], no);
    if (a->lse) sa_ref_store(a->lse, SA_F32, x[SA_REF_LSE], B * N * T);
  }
  sa_ref_free(x);
  return s;
}

sa_status sa_ref_attn_bwd(const sa_attn *a, const sa_attn_grad *g) {
  int64_t B = a->batch, T = a->q_len, S = a->kv_len, N = a->q_heads, K = a->kv_heads;
  int64_t nq = B * T * N * a->head_dim, nk = B * S * K * a->head_dim, nv = B * S * K * a->v_head_dim;
  int64_t no = B * T * N * a->v_head_dim, nb = sa_dims_count(a->bias_dims);
  double *x[SA_REF_NBUF] = {0};
  x[SA_REF_Q] = sa_ref_load(a->q, a->dtype, nq);
  x[SA_REF_K] = sa_ref_load(a->k, a->dtype, nk);
  x[SA_REF_V] = sa_ref_load(a->v, a->dtype, nv);
  x[SA_REF_SINKS] = sa_ref_load(a->softmax == SA_SOFTMAX_LEARNABLE ? a->sinks : NULL, SA_F32, N);
  x[SA_REF_BIAS] = sa_ref_load(a->bias, a->bias_dtype, nb);
  x[SA_REF_OUT] = sa_ref_load(a->out, a->dtype, no);
  x[SA_REF_LSE] = sa_ref_load(a->lse, SA_F32, B * N * T);
  x[SA_REF_DOUT] = sa_ref_load(g->dout, a->dtype, no);
  x[SA_REF_DLSE] = sa_ref_load(g->dlse, SA_F32, B * N * T);
  x[SA_REF_DQ] = sa_ref_load(NULL, SA_F32, nq);
  x[SA_REF_DK] = sa_ref_load(NULL, SA_F32, nk);
  x[SA_REF_DV] = sa_ref_load(NULL, SA_F32, nv);
  x[SA_REF_DSINKS] = sa_ref_load(NULL, SA_F32, N);
  x[SA_REF_DBIAS] = sa_ref_load(NULL, SA_F32, g->dbias ? nb : 0);
  for (int i = 0; i < SA_REF_NBUF; i++)
    if (!x[i]) {
      sa_ref_free(x);
      return sa_error(SA_ERR_NO_MEMORY, "reference: cannot allocate the fp64 copies of the tensors");
    }
  sa_status s = sa_ref_bwd64(a, x[SA_REF_Q], x[SA_REF_K], x[SA_REF_V], x[SA_REF_SINKS],
                             sa_dims_set(a->bias_dims) ? x[SA_REF_BIAS] : NULL, x[SA_REF_OUT], x[SA_REF_LSE],
                             x[SA_REF_DOUT], g->dlse ? x[SA_REF_DLSE] : NULL, x[SA_REF_DQ], x[SA_REF_DK], x[SA_REF_DV],
                             x[SA_REF_DSINKS], g->dbias ? x[SA_REF_DBIAS] : NULL);
  if (s == SA_OK) {
    sa_ref_store(g->dq, a->dtype, x[SA_REF_DQ], nq);
    sa_ref_store(g->dk, a->dtype, x[SA_REF_DK], nk);
    sa_ref_store(g->dv, a->dtype, x[SA_REF_DV], nv);
    if (g->dsinks) sa_ref_store(g->dsinks, SA_F32, x[SA_REF_DSINKS], N);
    if (g->dbias) sa_ref_store(g->dbias, SA_F32, x[SA_REF_DBIAS], nb);
  }
  sa_ref_free(x);
  return s;
}
