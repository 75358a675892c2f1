/*
 * sa_test_bf16.h — the error that plans multiplying P and dS in bf16 add to the C table's fp32 budgets
 * (sa_test_case.h): the AMX tile plans, the bf16 default on CPUs with AMX, round P to bf16 before o += P V and
 * dv += P^T dout, and dS before dq += dS K and dk += dS^T Q, as GPU flash-attention kernels do; everything
 * else (the products with q, k, v, dout themselves, exact in bf16; the softmax, lse, D, dsinks, dbias) stays
 * fp32. Rounding to nearest even moves each factor by at most u = 2^-8 of itself, so each result element moves
 * by at most u times the sum of its terms' magnitudes, computed here in fp64 from the reference's lse:
 *   out[i, d] += u sum_j w_ij |v_jd|,                w_ij = exp(l_ij - lse_i), l_ij = scale q_i.k_j + bias_ij
 *   dv[j, d]  += u sum_(n, i) w_ij |dout_id|
 *   dq[i, d]  += u |scale| sum_j |ds_ij| |k_jd|,     ds_ij = w_ij (dout_i.v_j - D_i)
 *   dk[j, d]  += u |scale| sum_(n, i) |ds_ij| |q_id|
 * (under a soft-cap, l_ij is cap tanh(l_ij / cap) and ds_ij carries its derivative 1 - tanh^2)
 * plus 2^-126 per term (bf16 denormals, which TDPBF16PS reads as zero). These are bounds, not fits: a dropped
 * key, a wrong scale or a missing sink term still exceeds them (test_cpu_tile breaks the tile code on purpose).
 * Included by sa_test_case.h, after its problem (t_prob) and validity (t_key_counts).
 */
#ifndef SA_TEST_BF16_H
#define SA_TEST_BF16_H

#include <string.h>

#include "sa_plan.h"

/* Whether the last call of kind which ran a plan whose products round P / dS to bf16 (a tile plan: its
   description carries tile=1 or tile=2). */
static inline int t_plan_rounds_p(int which) {
  const char *t = strstr(sa_plan_last(which), " tile=");
  return t && t[6] != '0';
}

/* Per-element extra bounds (NULL where not asked): o [no], q [nq], k [nk], v [nv]. */
typedef struct {
  double *o, *q, *k, *v;
} t_bf16_extra;

static void t_bf16_extra_free(t_bf16_extra *e) {
  free(e->o);
  free(e->q);
  free(e->k);
  free(e->v);
  memset(e, 0, sizeof *e);
}

/* The bounds of the forward (grads 0: o only) or of the backward (grads 1: q, k, v), against the reference's
   out and lse (and dlse: D_i = dout_i . out_i - dlse_i). */
static void t_bf16_extra_make(const t_prob *p, const t_case *c, int grads, t_bf16_extra *e) {
  const sa_attn *a = &p->a;
  const double u = 0x1p-8, den = 0x1p-126, sc = sa_scale_of(a);
  const int64_t G = c->N / c->K;
  memset(e, 0, sizeof *e);
  double **want[4] = {&e->o, &e->q, &e->k, &e->v};
  const int64_t n[4] = {p->no, p->nq, p->nk, p->nv};
  for (int x = 0; x < 4; x++)
    if ((x == 0) != grads) *want[x] = calloc((size_t)(n[x] ? n[x] : 1), sizeof(double));
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t h = 0; h < c->N; h++)
      for (int64_t i = 0; i < c->T; i++) {
        const double lse = p->lse_r[(b * c->N + h) * c->T + i];
        if (lse == -INFINITY) continue;
        const int64_t qo = ((b * c->T + i) * c->N + h) * c->H, oo = ((b * c->T + i) * c->N + h) * c->Hv;
        double D = 0.0;
        if (grads) {
          for (int64_t d = 0; d < c->Hv; d++)
            D += (double)sa_load(p->dout, c->dt, oo + d) * sa_load(p->out_r, c->dt, oo + d);
          if (c->dlse) D -= p->dlse[(b * c->N + h) * c->T + i];
        }
        for (int64_t j = 0; j < c->S; j++) {
          if (!t_key_counts(a, b, h, i, j)) continue;
          const int64_t ko = ((b * c->S + j) * c->K + h / G) * c->H, vo = ((b * c->S + j) * c->K + h / G) * c->Hv;
          double dot = 0.0;
          for (int64_t d = 0; d < c->H; d++) dot += (double)sa_load(p->q, c->dt, qo + d) * sa_load(p->k, c->dt, ko + d);
          const double l = sc * dot + sa_bias_at(a, b, h, i, j), cap = a->logits_soft_cap;
          const double t = cap > 0.0 ? tanh(l / cap) : 0.0, w = exp((cap > 0.0 ? cap * t : l) - lse);
          if (!grads) {
            for (int64_t d = 0; d < c->Hv; d++) e->o[oo + d] += (u * w + den) * fabs(sa_load(p->v, c->dt, vo + d));
            continue;
          }
          double dp = 0.0;
          for (int64_t d = 0; d < c->Hv; d++) {
            dp += (double)sa_load(p->dout, c->dt, oo + d) * sa_load(p->v, c->dt, vo + d);
            e->v[vo + d] += (u * w + den) * fabs(sa_load(p->dout, c->dt, oo + d));
          }
          const double ds = fabs(w * (dp - D) * (cap > 0.0 ? 1.0 - t * t : 1.0)), f = fabs(sc) * (u * ds + den);
          for (int64_t d = 0; d < c->H; d++) {
            e->q[qo + d] += f * fabs(sa_load(p->k, c->dt, ko + d));
            e->k[ko + d] += f * fabs(sa_load(p->q, c->dt, qo + d));
          }
        }
      }
}

#endif /* SA_TEST_BF16_H */
