/*
 * sa_test_tile.h — the tile path's cases and checks, shared by test_cpu_tile.c (the emulated tile plans, on
 * any AVX-512 + AVX512-BF16 CPU) and amx_check.c (the AMX plans, on an AMX CPU). All cases are bf16, the tile path's
 * input type, against the fp64 reference with the bf16 tolerances of the GPU kernels, which also round P
 * and dS to bf16 before their products (tests/test_cuda.c): out and dbias max |err| / max |ref| <= 2e-2,
 * dq / dk / dv <= 3e-2, lse |err| / max(1, |lse|) <= 1e-4, dsinks RMS relative <= 2e-3; rows with no valid
 * key exactly out 0 and lse = the sink.
 */
#ifndef SA_TEST_TILE_H
#define SA_TEST_TILE_H

#include "sa_plan.h"
#include "sa_test_case.h"

#define TT_TOL_OUT    2e-2
#define TT_TOL_GRAD   3e-2
#define TT_TOL_LSE    1e-4
#define TT_TOL_DSINKS 2e-3

#define TT_BF    .dt = SA_BF16
#define TT_LEARN .sm = SA_SOFTMAX_LEARNABLE

/* Lengths that are no multiple of the tiles (16 rows, 32-element k steps, 64- and 256-key blocks), H = 80 / 96 / 112
   (k steps past the data), 128 and 256, Hv != H (down to one 16-column tile), G from 1 to 8, several query
   blocks, every mask kind, sinks U(-10, 10) and +-50. */
static const t_case tt_cases[] = {
    {"plain", TT_BF, 1, 37, 53, 4, 2, 64, 64, TT_LEARN, T_UNBOUNDED},
    {"sinks +-50, causal BR", TT_BF, 2, 65, 129, 6, 3, 32, 48, TT_LEARN, .sinks = T_SINK_BIG,
     .causal = SA_CAUSAL_BOTTOM_RIGHT, T_UNBOUNDED},
    {"window TL 7", TT_BF, 1, 100, 100, 8, 1, 128, 128, TT_LEARN, .causal = SA_CAUSAL_TOP_LEFT, .wl = 7, .wr = 0},
    {"segments + lengths, H 80", TT_BF, 3, 70, 90, 4, 4, 80, 80, TT_LEARN, .sinks = T_SINK_BIG, .lens = T_LENS_RANDOM,
     .segs = T_SEGS_PACKED, T_UNBOUNDED},
    {"rows without keys: edge lengths", TT_BF, 4, 33, 17, 4, 2, 64, 64, TT_LEARN, .lens = T_LENS_EDGE,
     .causal = SA_CAUSAL_BOTTOM_RIGHT, T_UNBOUNDED},
    {"rows without keys: window off the diagonal", TT_BF, 1, 40, 50, 2, 1, 64, 32, TT_LEARN, .wl = 2, .wr = 2,
     .diag = -40},
    {"vanilla causal TL", TT_BF, 2, 17, 5, 4, 2, 32, 32, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_TOP_LEFT,
     T_UNBOUNDED},
    {"off-by-one, random segments", TT_BF, 1, 31, 45, 4, 1, 64, 64, .sm = SA_SOFTMAX_OFF_BY_ONE, .segs = T_SEGS_RANDOM,
     T_UNBOUNDED},
    {"GQA G 8, H 96", TT_BF, 1, 31, 77, 16, 2, 96, 64, TT_LEARN, .sinks = T_SINK_BIG, T_UNBOUNDED},
    {"bias -inf + mask, dbias", TT_BF, 1, 40, 70, 4, 2, 64, 64, TT_LEARN, T_UNBOUNDED, .bias = T_BCAST(0, 0, 0, 0),
     .bias_kind = T_BIAS_NEGINF, .mask = T_BCAST(1, 0, 0, 0)},
    {"H 256, Hv 128", TT_BF, 1, 20, 40, 4, 2, 256, 128, TT_LEARN, T_UNBOUNDED},
    {"two query blocks, G 1", TT_BF, 1, 300, 270, 2, 2, 64, 64, TT_LEARN, .sinks = T_SINK_BIG, T_UNBOUNDED},
    {"positions in segments, dlse, scale 0.3", TT_BF, 2, 50, 50, 4, 2, 64, 64, TT_LEARN, .segs = T_SEGS_PACKED,
     .pos = T_POS_SEGMENT, .causal = SA_CAUSAL_TOP_LEFT, T_UNBOUNDED, .dlse = 1, .scale = 0.3f},
    {"H 112, Hv 16, G 3", TT_BF, 2, 45, 83, 6, 2, 112, 16, TT_LEARN, T_UNBOUNDED},
    {"H 128, G 2, bias, causal BR", TT_BF, 1, 97, 161, 4, 2, 128, 128, TT_LEARN, .causal = SA_CAUSAL_BOTTOM_RIGHT,
     T_UNBOUNDED, .bias = T_BCAST(0, 0, 0, 0)},
    /* several of the tile kernels' 256-key tiles (SA_CPU_TILE_BK), the last one partial */
    {"key tiles: causal BR, scale -0.2", TT_BF, 1, 130, 700, 4, 2, 64, 64, TT_LEARN, .sinks = T_SINK_BIG,
     .causal = SA_CAUSAL_BOTTOM_RIGHT, T_UNBOUNDED, .scale = -0.2f},
    {"key tiles: lengths, bias", TT_BF, 2, 40, 600, 4, 4, 32, 32, TT_LEARN, .lens = T_LENS_RANDOM, T_UNBOUNDED,
     .bias = T_BCAST(0, 0, 0, 0)},
    {"key tiles: window 300, G 4", TT_BF, 1, 70, 1100, 8, 2, 64, 64, TT_LEARN, .causal = SA_CAUSAL_BOTTOM_RIGHT,
     .wl = 300, .wr = 0},
    /* the soft-cap: with a bias the products apply the scale through alpha; without one too (score_mul 1) */
    {"soft-cap 2, bias, causal TL, sinks +-50", TT_BF, 2, 70, 90, 4, 2, 64, 64, TT_LEARN, .sinks = T_SINK_BIG,
     .causal = SA_CAUSAL_TOP_LEFT, T_UNBOUNDED, .bias = T_BCAST(0, 1, 0, 0), .cap = 2.0f},
    {"soft-cap 1.5, mask, positions, key tiles", TT_BF, 1, 60, 600, 8, 2, 64, 64, TT_LEARN, .pos = T_POS_RANDOM,
     .causal = SA_CAUSAL_TOP_LEFT, .wl = 100, .wr = 0, .mask = T_BCAST(0, 1, 0, 0), .dlse = 1, .cap = 1.5f},
    {"soft-cap 30, window, edge lengths, G 4", TT_BF, 2, 40, 300, 8, 2, 32, 32, TT_LEARN, .lens = T_LENS_EDGE,
     .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = 50, .wr = 0, .cap = 30.0f},
    {"soft-cap 0.7, vanilla, segments", TT_BF, 1, 130, 130, 4, 4, 128, 64, .sm = SA_SOFTMAX_VANILLA,
     .segs = T_SEGS_PACKED, T_UNBOUNDED, .cap = 0.7f},
};
#define TT_NCASES ((int)(sizeof tt_cases / sizeof tt_cases[0]))

/* max |x - ref| / max |ref| (test_cuda.c's measure); a NaN in x gives +inf. */
static double tt_relerr(const void *x, const void *ref, sa_dtype t, int64_t n) {
  double e = 0.0, m = 1e-30;
  for (int64_t i = 0; i < n; i++) {
    double g = sa_load(x, t, i), r = sa_load(ref, t, i);
    if (isnan(g) != isnan(r)) return INFINITY;
    if (isnan(r) || (isinf(r) && g == r)) continue;
    e = fmax(e, fabs(g - r));
    m = fmax(m, fabs(r));
  }
  return e / m;
}

/* lse: |err| / max(1, |ref|), the infinities equal. */
static double tt_lse_err(const float *x, const float *ref, int64_t n) {
  double e = 0.0;
  for (int64_t i = 0; i < n; i++) {
    if (isinf(ref[i]) || isnan(ref[i])) {
      if (!(x[i] == ref[i] || (isnan(x[i]) && isnan(ref[i])))) return INFINITY;
      continue;
    }
    e = fmax(e, fabs((double)x[i] - ref[i]) / fmax(1.0, fabs((double)ref[i])));
  }
  return e;
}

static double tt_dsinks_err(const float *x, const float *ref, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(x[i])) return INFINITY;
    num += ((double)x[i] - ref[i]) * ((double)x[i] - ref[i]);
    den += (double)ref[i] * ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The errors of one run: out, lse, dq, dk, dv, dsinks, dbias (0 where absent). */
typedef struct {
  double e[7];
} tt_errs;
static const char *const tt_err_names[7] = {"out", "lse", "dq", "dk", "dv", "dsinks", "dbias"};
static const double tt_err_tols[7] = {TT_TOL_OUT,  TT_TOL_LSE,    TT_TOL_GRAD, TT_TOL_GRAD,
                                      TT_TOL_GRAD, TT_TOL_DSINKS, TT_TOL_OUT};

/* sa_plan_last of kind which names plan (its first word). */
static int tt_ran(int which, const char *plan) {
  const char *d = sa_plan_last(which);
  size_t n = strlen(plan);
  return strncmp(d, plan, n) == 0 && d[n] == ' ';
}

/* Case c's inputs (seeded by idx) with the reference's out, lse and gradients. 0 on a reference error. */
static int tt_prepare(t_prob *p, const t_case *c, int idx) {
  t_rng r = {0x711e0000ull + (uint64_t)idx};
  t_prob_make(p, c, &r, idx);
  return t_fwd(p, SA_BACKEND_REF, p->out_r, p->lse_r) == SA_OK &&
         t_bwd(p, c, SA_BACKEND_REF, p->dq_r, p->dk_r, p->dv_r, p->ds_r, p->db_r) == SA_OK;
}

/* The forward and backward under plans fwd and bwd into p's *_c buffers (the backward from the
   reference's out and lse, as t_bwd gives it); SA_OK and both plans named by sa_plan_last, else 0. */
static int tt_run(t_prob *p, const t_case *c, const char *fwd, const char *bwd, const char *tag) {
  sa_plan_force(SA_PLAN_FWD, fwd);
  sa_plan_force(SA_PLAN_BWD, bwd);
  sa_status s = t_fwd(p, SA_BACKEND_CPU, p->out_c, p->lse_c);
  int ok = s == SA_OK && tt_ran(SA_PLAN_FWD, fwd);
  if (ok) {
    s = t_bwd(p, c, SA_BACKEND_CPU, p->dq_c, p->dk_c, p->dv_c, p->ds_c, p->db_c);
    ok = s == SA_OK && tt_ran(SA_PLAN_BWD, bwd);
  }
  if (!ok) t_report("%s: %s / %s: %s (%s)", tag, fwd, bwd, sa_status_name(s), sa_last_error());
  sa_plan_force(SA_PLAN_FWD, NULL);
  sa_plan_force(SA_PLAN_BWD, NULL);
  return ok;
}

static tt_errs tt_errors(const t_prob *p, const t_case *c) {
  tt_errs x = {{0}};
  x.e[0] = tt_relerr(p->out_c, p->out_r, c->dt, p->no);
  x.e[1] = tt_lse_err(p->lse_c, p->lse_r, p->nl);
  x.e[2] = tt_relerr(p->dq_c, p->dq_r, c->dt, p->nq);
  x.e[3] = tt_relerr(p->dk_c, p->dk_r, c->dt, p->nk);
  x.e[4] = tt_relerr(p->dv_c, p->dv_r, c->dt, p->nv);
  if (!c->no_dsinks) x.e[5] = tt_dsinks_err(p->ds_c, p->ds_r, c->N);
  if (c->bias && !c->no_dbias) x.e[6] = tt_relerr(p->db_c, p->db_r, SA_F32, p->nb);
  return x;
}

/* Each error within its tolerance (reported, counted), the rows without keys exact; worst[k] is raised to
   the largest error / tolerance seen. */
static int tt_check(const t_prob *p, const t_case *c, const char *tag, double *worst) {
  tt_errs x = tt_errors(p, c);
  int ok = 1;
  for (int k = 0; k < 7; k++) {
    worst[k] = fmax(worst[k], x.e[k] / tt_err_tols[k]);
    if (!(x.e[k] <= tt_err_tols[k])) {
      t_report("%s: %s error %.3g > %.3g", tag, tt_err_names[k], x.e[k], tt_err_tols[k]);
      ok = 0;
    }
  }
  if (t_check_empty_rows(p, c, tag)) ok = 0;
  t_count(ok);
  return ok;
}

#endif /* SA_TEST_TILE_H */
