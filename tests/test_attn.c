/*
 * test_attn.c — the C test driver: the CPU backend against the fp64 reference on a table of several
 * hundred problems (shapes, GQA, Hv != H, every mask, the three softmax types with wide sinks, f32 / f16
 * / bf16, forward and backward with and without dlse), the reference against finite differences, thread
 * count determinism, rows without keys, and the invalid-argument table.
 * Prints one line per failure, a summary per group, and last `N passed, N failed`; exit 1 on failure.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include <time.h>

#include "sa_test.h"
#include "sa_test_fd.h"
#include "sa_test_invalid.h"

/* ---- one problem ----------------------------------------------------------------------------- */

enum { T_SINK_U10, T_SINK_BIG };                                 /* U(-10,10) | +50 / -50 / U(-10,10) */
enum { T_LENS_NONE, T_LENS_RANDOM, T_LENS_EDGE, T_LENS_Q_ONLY, T_LENS_KV_ONLY };
enum { T_SEGS_NONE, T_SEGS_PACKED, T_SEGS_RANDOM };

typedef struct {
  sa_dtype dt;
  int64_t B, T, S, N, K, H, Hv;
  sa_softmax sm;
  int sinks, lens, segs, dlse, no_dsinks;
  sa_causal causal;
  int64_t wl, wr, diag;
  float scale; /* 0 = default 1/sqrt(H) */
} t_case;

static void t_case_name(const t_case *c, char *buf, size_t n) {
  static const char *sm[] = {"vanilla", "off_by_one", "learnable"}, *ca[] = {"none", "TL", "BR"};
  static const char *le[] = {"-", "random", "edge", "q-only", "kv-only"}, *se[] = {"-", "packed", "random"};
  snprintf(buf, n, "%s B%lld T%lld S%lld N%lld K%lld H%lld Hv%lld %s%s causal=%s win=(%lld,%lld) diag=%lld "
           "lens=%s segs=%s dlse=%d scale=%g", t_dtype_name(c->dt), (long long)c->B, (long long)c->T,
           (long long)c->S, (long long)c->N, (long long)c->K, (long long)c->H, (long long)c->Hv, sm[c->sm],
           c->sm == SA_SOFTMAX_LEARNABLE ? (c->sinks == T_SINK_BIG ? "(+-50)" : "(U10)") : "", ca[c->causal],
           (long long)c->wl, (long long)c->wr, (long long)c->diag, le[c->lens], se[c->segs], c->dlse,
           (double)c->scale);
}

/* Inputs and outputs of one problem; the sa_attn points into these. */
typedef struct {
  sa_attn a;
  int64_t nq, nk, nv, no, nl;
  void *q, *k, *v, *dout, *out_r, *out_c, *dq_r, *dq_c, *dk_r, *dk_c, *dv_r, *dv_c;
  float *sinks, *dlse, *lse_r, *lse_c, *ds_r, *ds_c;
  int32_t *qlens, *kvlens, *qseg, *kvseg;
} t_prob;

static void t_segments(int32_t *ids, int64_t n, int mode, t_rng *r) {
  int32_t id = 0;
  for (int64_t i = 0; i < n; i++) {
    if (mode == T_SEGS_RANDOM) { ids[i] = (int32_t)t_int(r, 0, 3); continue; }
    if (i > 0 && t_unif(r, 0, 1) < 0.15) id++; /* ~7-token segments: several per row of 37 */
    ids[i] = id;
  }
}

static void t_prob_make(t_prob *p, const t_case *c, t_rng *r, int idx) {
  memset(p, 0, sizeof *p);
  sa_attn *a = &p->a;
  sa_attn_init(a);
  a->dtype = c->dt;
  a->batch = c->B; a->q_len = c->T; a->kv_len = c->S; a->q_heads = c->N; a->kv_heads = c->K;
  a->head_dim = c->H; a->v_head_dim = c->Hv;
  a->softmax = c->sm; a->causal = c->causal;
  a->window_left = c->wl; a->window_right = c->wr; a->diag_offset = c->diag; a->scale = c->scale;
  size_t es = sa_dtype_size(c->dt);
  p->nq = c->B * c->T * c->N * c->H; p->nk = c->B * c->S * c->K * c->H;
  p->nv = c->B * c->S * c->K * c->Hv; p->no = c->B * c->T * c->N * c->Hv; p->nl = c->B * c->N * c->T;
  p->q = t_alloc(p->nq, es); p->k = t_alloc(p->nk, es); p->v = t_alloc(p->nv, es);
  p->dout = t_alloc(p->no, es); p->out_r = t_alloc(p->no, es); p->out_c = t_alloc(p->no, es);
  p->dq_r = t_alloc(p->nq, es); p->dq_c = t_alloc(p->nq, es); p->dk_r = t_alloc(p->nk, es);
  p->dk_c = t_alloc(p->nk, es); p->dv_r = t_alloc(p->nv, es); p->dv_c = t_alloc(p->nv, es);
  p->sinks = t_alloc(c->N, 4); p->dlse = t_alloc(p->nl, 4); p->lse_r = t_alloc(p->nl, 4);
  p->lse_c = t_alloc(p->nl, 4); p->ds_r = t_alloc(c->N, 4); p->ds_c = t_alloc(c->N, 4);
  /* q, k in U(-2.5, 2.5): scores have a standard deviation of ~2 (a^2/3 at the default scale), so the
     softmax is peaked enough for a wrong max or a wrong sink to show, and never degenerate. */
  t_fill(p->q, c->dt, p->nq, r, -2.5, 2.5);
  t_fill(p->k, c->dt, p->nk, r, -2.5, 2.5);
  t_fill(p->v, c->dt, p->nv, r, -1, 1);
  t_fill(p->dout, c->dt, p->no, r, -1, 1);
  t_fill(p->dlse, SA_F32, p->nl, r, -1, 1);
  for (int64_t n = 0; n < c->N; n++) {
    int kind = c->sinks == T_SINK_BIG ? (int)(n % 3) : 2;
    p->sinks[n] = kind == 0 ? 50.0f : kind == 1 ? -50.0f : (float)t_unif(r, -10, 10);
  }
  if (c->sm == SA_SOFTMAX_LEARNABLE) a->sinks = p->sinks;
  if (c->lens != T_LENS_NONE) {
    p->qlens = t_alloc(c->B, 4); p->kvlens = t_alloc(c->B, 4);
    for (int64_t b = 0; b < c->B; b++) {
      /* edge: whole batches without keys or queries, and lengths outside [0, T] / [0, S] (clamped) */
      static const int64_t eq[4][2] = {{-3, 1000000}, {1000000000, 0}, {0, -1}, {-1, -1}};
      int e = (int)((b + idx) % 4);
      int64_t ql = t_int(r, 0, c->T), kl = t_int(r, 0, c->S);
      if (c->lens == T_LENS_EDGE && e < 3) { ql = eq[e][0]; kl = eq[e][1]; }
      if (c->lens == T_LENS_EDGE && e == 3) { ql = c->T / 2 + 1; kl = c->S + 7; }
      p->qlens[b] = (int32_t)ql;
      p->kvlens[b] = (int32_t)kl;
    }
    if (c->lens != T_LENS_KV_ONLY) a->q_lens = p->qlens;
    if (c->lens != T_LENS_Q_ONLY) a->kv_lens = p->kvlens;
  }
  if (c->segs != T_SEGS_NONE) {
    p->qseg = t_alloc(c->B * c->T, 4); p->kvseg = t_alloc(c->B * c->S, 4);
    for (int64_t b = 0; b < c->B; b++) {
      t_segments(p->qseg + b * c->T, c->T, c->segs, r);
      t_segments(p->kvseg + b * c->S, c->S, c->segs, r);
    }
    a->q_segment_ids = p->qseg; a->kv_segment_ids = p->kvseg;
  }
  a->q = p->q; a->k = p->k; a->v = p->v;
}

static void t_prob_free(t_prob *p) {
  void *all[] = {p->q, p->k, p->v, p->dout, p->out_r, p->out_c, p->dq_r, p->dq_c, p->dk_r, p->dk_c,
                 p->dv_r, p->dv_c, p->sinks, p->dlse, p->lse_r, p->lse_c, p->ds_r, p->ds_c,
                 p->qlens, p->kvlens, p->qseg, p->kvseg};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* Does query row i of batch b have any valid key? (The mask predicate, asked pair by pair.) */
static int t_row_has_key(const sa_attn *a, int64_t b, int64_t i) {
  sa_range rg = sa_key_range(a, sa_q_len_of(a, b), sa_kv_len_of(a, b), i);
  for (int64_t j = rg.lo; j < rg.hi; j++)
    if (sa_segment_ok(a, b, i, j)) return 1;
  return 0;
}

static sa_status t_fwd(t_prob *p, sa_backend be, void *out, float *lse) {
  t_poison(out, p->a.dtype, p->no);
  t_poison(lse, SA_F32, p->nl);
  p->a.out = out;
  p->a.lse = lse;
  return sa_attn_fwd(&p->a, be, NULL);
}

/* The backward of both backends gets the reference's out and lse: it must use them as given. */
static sa_status t_bwd(t_prob *p, const t_case *c, sa_backend be, void *dq, void *dk, void *dv, float *ds) {
  sa_attn_grad g = {0};
  t_poison(dq, p->a.dtype, p->nq);
  t_poison(dk, p->a.dtype, p->nk);
  t_poison(dv, p->a.dtype, p->nv);
  t_poison(ds, SA_F32, p->a.q_heads);
  p->a.out = p->out_r;
  p->a.lse = p->lse_r;
  g.dout = p->dout; g.dlse = c->dlse ? p->dlse : NULL;
  g.dq = dq; g.dk = dk; g.dv = dv; g.dsinks = c->no_dsinks ? NULL : ds;
  size_t ws = sa_attn_bwd_workspace_size(&p->a, be);
  void *w = ws ? malloc(ws) : NULL;
  sa_status s = sa_attn_bwd(&p->a, &g, w, ws, be, NULL);
  free(w);
  return s;
}

/* fp32 accumulation budgets, relative to each head's scale (see t_compare, t_grad_floors). The CPU
   backend sums in fp32; the largest errors it shows over 6000 random cases of this table's kinds
   (relative to that scale) are about 6e-6 for out (exp() of scores or sinks of size ~50-100 carries
   ~|s| eps = 6e-6 relative into p), 1e-6 for lse, 2.5e-6 for dq/dk and 7.5e-6 for dv (a sum over up to
   129 queries x 8 heads). The budgets are 2.5-4x those: a wrong scale (1e-3), an off-by-one mask, a
   missing sink term (>= 1e-2) or a 1e-3 error in ds fails by 30x or more (checked by breaking the
   reference on purpose). f16/bf16 add the one-ulp rounding term 2u|ref| on top. */
#define T_ACC_OUT 1.5e-5
#define T_ACC_LSE 3e-6
#define T_ACC_GRAD 1e-5
#define T_ACC_DV 3e-5

enum { T_W_OUT, T_W_LSE, T_W_DQ, T_W_DK, T_W_DV, T_W_DSINKS, T_W_N };
typedef struct { int cases, passed; double worst[T_W_N]; } t_stats; /* worst: largest error / bound */

/* dsinks[n]: fp32 in both backends; the bound scales with sum_i exp(a - lse_i) (|dout.out| + |dlse|),
   the magnitude of the terms being summed (the sum itself may cancel to ~0). */
static int64_t t_check_dsinks(const t_prob *p, const t_case *c, const char *tag, double *worst) {
  const sa_attn *a = &p->a;
  int64_t bad = 0;
  for (int64_t n = 0; n < c->N; n++) {
    double absum = 0.0;
    for (int64_t b = 0; b < c->B; b++)
      for (int64_t i = 0; i < c->T; i++) {
        double lse = p->lse_r[(b * c->N + n) * c->T + i], t = c->dlse ? fabs(p->dlse[(b * c->N + n) * c->T + i]) : 0;
        if (lse == -INFINITY) continue;
        for (int64_t d = 0; d < c->Hv; d++) {
          int64_t o = ((b * c->T + i) * c->N + n) * c->Hv + d;
          t += fabs((double)sa_load(p->dout, c->dt, o) * sa_load(p->out_r, c->dt, o));
        }
        absum += exp((double)sa_sink_logit(a, n) - lse) * t;
      }
    double g = p->ds_c[n], r = p->ds_r[n];
    int want_zero = c->sm != SA_SOFTMAX_LEARNABLE;
    double bound = 2e-6 * absum + 1e-30; /* worst seen: 4e-7 */
    if (!want_zero && fabs(g - r) / bound > *worst) *worst = fabs(g - r) / bound;
    if (want_zero ? (g != 0.0 || r != 0.0) : !(fabs(g - r) <= bound)) {
      if (!bad) t_report("%s: dsinks[%lld] = %.9g, reference %.9g (bound %.3g)", tag, (long long)n, g, r,
                         want_zero ? 0.0 : bound);
      bad++;
    }
  }
  return bad;
}

/* Rows without a valid key: out = 0 and lse = the sink logit exactly, in both backends. */
static int64_t t_check_empty_rows(const t_prob *p, const t_case *c, const char *tag) {
  int64_t bad = 0;
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t i = 0; i < c->T; i++) {
      if (t_row_has_key(&p->a, b, i)) continue;
      for (int64_t n = 0; n < c->N; n++) {
        float want = sa_sink_logit(&p->a, n), lr = p->lse_r[(b * c->N + n) * c->T + i];
        float lc = p->lse_c[(b * c->N + n) * c->T + i];
        int ok = lr == want && lc == want;
        for (int64_t d = 0; d < c->Hv; d++) {
          int64_t o = ((b * c->T + i) * c->N + n) * c->Hv + d;
          ok &= sa_load(p->out_r, c->dt, o) == 0.0f && sa_load(p->out_c, c->dt, o) == 0.0f;
        }
        if (!ok) {
          if (!bad) t_report("%s: row b=%lld n=%lld i=%lld has no key: lse cpu %g ref %g (want %g), out must be 0",
                             tag, (long long)b, (long long)n, (long long)i, lc, lr, want);
          bad++;
        }
      }
    }
  return bad;
}

static double t_amax(const void *x, sa_dtype t, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)sa_load(x, t, i)));
  return m;
}

/* sum_j p_ij over the valid keys of one row, from the scores (not 1 - exp(a - lse): next to a +50
   sink the float lse rounds to exactly 50 and that difference to 0). */
static double t_key_mass(const t_prob *p, const t_case *c, int64_t b, int64_t n, int64_t i) {
  const sa_attn *a = &p->a;
  double lse = p->lse_r[(b * c->N + n) * c->T + i], mass = 0.0, sc = sa_scale_of(a);
  if (lse == -INFINITY) return 0.0;
  sa_range rg = sa_key_range(a, sa_q_len_of(a, b), sa_kv_len_of(a, b), i);
  for (int64_t j = rg.lo; j < rg.hi; j++) {
    if (!sa_segment_ok(a, b, i, j)) continue;
    double dot = 0.0;
    for (int64_t d = 0; d < c->H; d++)
      dot += (double)sa_load(p->q, c->dt, ((b * c->T + i) * c->N + n) * c->H + d) *
             sa_load(p->k, c->dt, ((b * c->S + j) * c->K + n / (c->N / c->K)) * c->H + d);
    mass += exp(sc * dot - lse);
  }
  return mass;
}

/* Floors of the gradient comparisons (see t_compare), per head: the size of one term of the sums.
   ds = p (dp - D), where dp is a dot product of Hv terms whose fp32 error scales with
   sqrt(Hv) max|dout| max|v| even where dp - D cancels; dq, dk multiply that by |scale| max|k| (max|q|);
   all times the largest probability mass that head's rows put on keys (~e^-50 next to a +50 sink:
   that head is then held to its own tiny scale). dv = sum p dout has no dp: max|dout| mass. */
static void t_grad_floors(const t_prob *p, const t_case *c, double *fq, double *fk, double *fv) {
  double dv = sqrt((double)c->Hv) * t_amax(p->dout, c->dt, p->no) * t_amax(p->v, c->dt, p->nv);
  double sc = fabs((double)sa_scale_of(&p->a)), qm = t_amax(p->q, c->dt, p->nq), km = t_amax(p->k, c->dt, p->nk);
  for (int64_t h = 0; h < c->K; h++) fk[h] = fv[h] = 0.0;
  for (int64_t n = 0; n < c->N; n++) {
    double mass = 0.0;
    for (int64_t b = 0; b < c->B; b++)
      for (int64_t i = 0; i < c->T; i++) mass = fmax(mass, t_key_mass(p, c, b, n, i));
    int64_t h = n / (c->N / c->K);
    fq[n] = sc * km * dv * mass;
    fk[h] = fmax(fk[h], sc * qm * dv * mass);
    fv[h] = fmax(fv[h], t_amax(p->dout, c->dt, p->no) * mass);
  }
}

static int t_run_case(const t_case *c, int idx, t_stats *st) {
  char name[320], tag[360];
  t_case_name(c, name, sizeof name);
  snprintf(tag, sizeof tag, "case %d [%s]", idx, name);
  t_rng r = {0x5eed0000ull + (uint64_t)idx};
  t_prob p;
  t_prob_make(&p, c, &r, idx);
  int64_t bad = 0;
  sa_status s;
  if ((s = t_fwd(&p, SA_BACKEND_REF, p.out_r, p.lse_r)) != SA_OK) {
    t_report("%s: reference fwd %s: %s", tag, sa_status_name(s), sa_last_error());
    bad++;
  } else if ((s = t_fwd(&p, SA_BACKEND_CPU, p.out_c, p.lse_c)) != SA_OK) {
    t_report("%s: cpu fwd %s: %s", tag, sa_status_name(s), sa_last_error());
    bad++;
  } else {
    bad += t_compare("out", tag, p.out_c, p.out_r, c->dt, p.no, (t_layout){c->Hv, c->N, NULL}, T_ACC_OUT,
                     &st->worst[T_W_OUT]);
    /* lse = m + log(l) with l >= 1: its error is absolute, ~eps * max(|m|, 1), hence the floor of 1 */
    double ones[T_MAX_HEADS];
    for (int h = 0; h < T_MAX_HEADS; h++) ones[h] = 1.0;
    bad += t_compare("lse", tag, p.lse_c, p.lse_r, SA_F32, p.nl, (t_layout){c->T ? c->T : 1, c->N, ones},
                     T_ACC_LSE, &st->worst[T_W_LSE]);
    bad += t_check_empty_rows(&p, c, tag);
    int64_t nan = t_count_nan(p.out_c, c->dt, p.no) + t_count_nan(p.lse_c, SA_F32, p.nl);
    if (nan) t_report("%s: %lld NaN in the cpu forward", tag, (long long)nan);
    bad += nan;
  }
  if (bad == 0) {
    if ((s = t_bwd(&p, c, SA_BACKEND_REF, p.dq_r, p.dk_r, p.dv_r, p.ds_r)) != SA_OK) {
      t_report("%s: reference bwd %s: %s", tag, sa_status_name(s), sa_last_error());
      bad++;
    } else if ((s = t_bwd(&p, c, SA_BACKEND_CPU, p.dq_c, p.dk_c, p.dv_c, p.ds_c)) != SA_OK) {
      t_report("%s: cpu bwd %s: %s", tag, sa_status_name(s), sa_last_error());
      bad++;
    } else {
      double fq[T_MAX_HEADS], fk[T_MAX_HEADS], fv[T_MAX_HEADS];
      t_grad_floors(&p, c, fq, fk, fv);
      bad += t_compare("dq", tag, p.dq_c, p.dq_r, c->dt, p.nq, (t_layout){c->H, c->N, fq}, T_ACC_GRAD,
                       &st->worst[T_W_DQ]);
      bad += t_compare("dk", tag, p.dk_c, p.dk_r, c->dt, p.nk, (t_layout){c->H, c->K, fk}, T_ACC_GRAD,
                       &st->worst[T_W_DK]);
      bad += t_compare("dv", tag, p.dv_c, p.dv_r, c->dt, p.nv, (t_layout){c->Hv, c->K, fv}, T_ACC_DV,
                       &st->worst[T_W_DV]);
      if (!c->no_dsinks) bad += t_check_dsinks(&p, c, tag, &st->worst[T_W_DSINKS]);
      int64_t nan = t_count_nan(p.dq_c, c->dt, p.nq) + t_count_nan(p.dk_c, c->dt, p.nk) +
                    t_count_nan(p.dv_c, c->dt, p.nv) + t_count_nan(p.dq_r, c->dt, p.nq);
      if (nan) t_report("%s: %lld NaN in the backward", tag, (long long)nan);
      bad += nan;
    }
  }
  t_prob_free(&p);
  st->cases++;
  st->passed += bad == 0;
  t_count(bad == 0);
  return bad == 0;
}

/* ---- the case table -------------------------------------------------------------------------- */

typedef struct { sa_causal causal; int64_t wl, wr, diag; int lens, segs; } t_mask;

/* Every mask kind alone, then in combination (diag_offset both ways; windows that empty whole rows). */
static const t_mask t_masks[] = {
    {SA_CAUSAL_NONE, -1, -1, 0, T_LENS_NONE, T_SEGS_NONE},
    {SA_CAUSAL_TOP_LEFT, -1, -1, 0, T_LENS_NONE, T_SEGS_NONE},
    {SA_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, T_LENS_NONE, T_SEGS_NONE},
    {SA_CAUSAL_NONE, 3, 2, 0, T_LENS_NONE, T_SEGS_NONE},
    {SA_CAUSAL_TOP_LEFT, 7, 0, 0, T_LENS_NONE, T_SEGS_NONE},
    {SA_CAUSAL_BOTTOM_RIGHT, 5, 0, 0, T_LENS_NONE, T_SEGS_NONE},
    {SA_CAUSAL_NONE, 0, 0, 0, T_LENS_NONE, T_SEGS_NONE},
    {SA_CAUSAL_NONE, -1, 4, 0, T_LENS_NONE, T_SEGS_NONE},
    {SA_CAUSAL_NONE, 4, -1, 0, T_LENS_NONE, T_SEGS_NONE},
    {SA_CAUSAL_NONE, -1, -1, 0, T_LENS_RANDOM, T_SEGS_NONE},
    {SA_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, T_LENS_EDGE, T_SEGS_NONE},
    {SA_CAUSAL_TOP_LEFT, -1, -1, 0, T_LENS_KV_ONLY, T_SEGS_NONE},
    {SA_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, T_LENS_Q_ONLY, T_SEGS_NONE},
    {SA_CAUSAL_NONE, -1, -1, 0, T_LENS_NONE, T_SEGS_PACKED},
    {SA_CAUSAL_TOP_LEFT, -1, -1, 0, T_LENS_RANDOM, T_SEGS_RANDOM},
    {SA_CAUSAL_TOP_LEFT, -1, -1, 7, T_LENS_NONE, T_SEGS_NONE},
    {SA_CAUSAL_BOTTOM_RIGHT, 3, 3, -5, T_LENS_NONE, T_SEGS_NONE},
    {SA_CAUSAL_NONE, 2, 2, -40, T_LENS_NONE, T_SEGS_NONE},
    {SA_CAUSAL_BOTTOM_RIGHT, 2, 1, 3, T_LENS_EDGE, T_SEGS_PACKED},
    {SA_CAUSAL_TOP_LEFT, 127, 0, -2, T_LENS_RANDOM, T_SEGS_PACKED},
};
#define T_NMASK ((int)(sizeof t_masks / sizeof t_masks[0]))

static void t_apply_mask(t_case *c, const t_mask *m) {
  c->causal = m->causal; c->wl = m->wl; c->wr = m->wr; c->diag = m->diag; c->lens = m->lens; c->segs = m->segs;
}

static int64_t t_cost(const t_case *c) { return c->B * c->N * c->T * c->S * (c->H + c->Hv); }

static const int64_t t_head_dims[] = {32, 64, 80, 96, 128, 256};
static const int64_t t_lens_set[] = {1, 2, 3, 5, 16, 17, 31, 37, 64, 65, 129};
static const int64_t t_heads[][2] = {{1, 1}, {2, 1}, {4, 4}, {4, 2}, {8, 1}, {8, 4}, {16, 2}, {6, 3}, {8, 8}};

/* Fills cases[] and returns the count: ~54 shape cases, 3 x 3 x masks, ~250 random ones, edges. */
static int t_build_cases(t_case *cs, int max) {
  int n = 0;
  t_rng r = {2024};
  /* 1. every head dim x dtype x softmax, on odd and 1-long sequences, G = 1, 2, 8 */
  static const int64_t ts[][2] = {{37, 37}, {1, 129}, {129, 1}, {64, 45}, {17, 129}, {129, 37}};
  static const int64_t nk[][2] = {{8, 8}, {8, 4}, {8, 1}};
  for (int h = 0; h < 6; h++)
    for (int d = 0; d < 3; d++)
      for (int s = 0; s < 3; s++) {
        t_case c = {0};
        int i = n;
        c.dt = (sa_dtype)d; c.sm = (sa_softmax)s; c.H = t_head_dims[h];
        c.Hv = i % 3 == 0 ? c.H : i % 3 == 1 ? 64 : 32 + 16 * (i % 5);
        c.B = 1 + i % 2; c.T = ts[i % 6][0]; c.S = ts[i % 6][1];
        c.N = nk[i % 3][0] / (c.H >= 128 ? 2 : 1); c.K = nk[i % 3][1] / (c.H >= 128 && i % 3 != 2 ? 2 : 1);
        c.sinks = i % 4 == 3 ? T_SINK_BIG : T_SINK_U10;
        c.dlse = i % 2;
        t_apply_mask(&c, &t_masks[i % T_NMASK]);
        cs[n++] = c;
      }
  /* 2. every mask x softmax x dtype on one small GQA shape with T != S (both ways) */
  for (int m = 0; m < T_NMASK; m++)
    for (int s = 0; s < 3; s++)
      for (int d = 0; d < 3; d++) {
        t_case c = {0};
        c.dt = (sa_dtype)d; c.sm = (sa_softmax)s;
        c.B = 2; c.T = (m + s) % 2 ? 37 : 45; c.S = (m + s) % 2 ? 45 : 37; c.N = 4; c.K = 2;
        c.H = 64; c.Hv = d == 1 ? 32 : 64;
        c.sinks = (m + d) % 3 == 0 ? T_SINK_BIG : T_SINK_U10;
        c.dlse = (m + s + d) % 2;
        c.no_dsinks = (m + s + d) % 7 == 6;
        t_apply_mask(&c, &t_masks[m]);
        cs[n++] = c;
      }
  /* 3. random combinations, capped at ~6M multiply-adds per pass so the table runs in seconds */
  for (int k = 0; k < 250 && n < max; k++) {
    t_case c = {0};
    do {
      c.dt = (sa_dtype)t_int(&r, 0, 2); c.sm = (sa_softmax)t_int(&r, 0, 2);
      c.B = t_int(&r, 1, 3); c.T = t_lens_set[t_int(&r, 0, 10)]; c.S = t_lens_set[t_int(&r, 0, 10)];
      int hk = (int)t_int(&r, 0, 8);
      c.N = t_heads[hk][0]; c.K = t_heads[hk][1];
      c.H = t_head_dims[t_int(&r, 0, 5)];
      c.Hv = t_int(&r, 0, 2) ? c.H : t_head_dims[t_int(&r, 0, 5)];
    } while (t_cost(&c) > 6000000);
    c.sinks = (int)t_int(&r, 0, 1); c.dlse = (int)t_int(&r, 0, 1); c.no_dsinks = t_int(&r, 0, 9) == 0;
    /* an explicit scale within 2x of the default, either sign: scores of the same size as elsewhere
       (a scale 8x the default at H = 256 gives |s| ~ 100, where fp32 itself loses 1e-5 in p) */
    c.scale = t_int(&r, 0, 3) == 0 ? (float)(t_unif(&r, -2, 2) / sqrt((double)c.H)) : 0.0f;
    if (t_int(&r, 0, 1)) {
      t_apply_mask(&c, &t_masks[t_int(&r, 0, T_NMASK - 1)]);
    } else { /* independent random draws of each mask part */
      c.causal = (sa_causal)t_int(&r, 0, 2);
      c.wl = t_int(&r, -1, 9); c.wr = t_int(&r, -1, 9); c.diag = t_int(&r, 0, 3) ? 0 : t_int(&r, -20, 20);
      c.lens = (int)t_int(&r, 0, 4); c.segs = (int)t_int(&r, 0, 2);
    }
    cs[n++] = c;
  }
  /* 4. edges: S = 0, T = 0, B = 0, single elements, every batch empty, decode against a long cache */
  static const t_case edges[] = {
      {SA_F32, 2, 5, 0, 4, 2, 32, 32, SA_SOFTMAX_LEARNABLE, T_SINK_U10, 0, 0, 1, 0, SA_CAUSAL_NONE, -1, -1, 0, 0},
      {SA_BF16, 2, 5, 0, 4, 2, 32, 32, SA_SOFTMAX_VANILLA, T_SINK_U10, 0, 0, 1, 0, SA_CAUSAL_NONE, -1, -1, 0, 0},
      {SA_F16, 2, 0, 7, 4, 2, 32, 32, SA_SOFTMAX_LEARNABLE, T_SINK_U10, 0, 0, 0, 0, SA_CAUSAL_NONE, -1, -1, 0, 0},
      {SA_F32, 0, 5, 7, 4, 2, 32, 32, SA_SOFTMAX_OFF_BY_ONE, T_SINK_U10, 0, 0, 0, 0, SA_CAUSAL_NONE, -1, -1, 0, 0},
      {SA_F32, 1, 1, 1, 1, 1, 32, 32, SA_SOFTMAX_LEARNABLE, T_SINK_U10, 0, 0, 1, 0, SA_CAUSAL_NONE, -1, -1, 0, 0},
      {SA_BF16, 1, 1, 1, 1, 1, 64, 32, SA_SOFTMAX_VANILLA, T_SINK_U10, 0, 0, 0, 0, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0},
      {SA_F16, 3, 1, 129, 8, 1, 64, 64, SA_SOFTMAX_LEARNABLE, T_SINK_BIG, T_LENS_RANDOM, 0, 1, 0,
       SA_CAUSAL_BOTTOM_RIGHT, 127, 0, 0, 0},
      {SA_BF16, 2, 1, 129, 8, 2, 128, 128, SA_SOFTMAX_OFF_BY_ONE, T_SINK_U10, 0, 0, 0, 0, SA_CAUSAL_BOTTOM_RIGHT,
       -1, -1, 0, 0},
      {SA_F32, 4, 9, 11, 2, 1, 32, 32, SA_SOFTMAX_LEARNABLE, T_SINK_BIG, T_LENS_EDGE, 0, 1, 0, SA_CAUSAL_NONE, -1,
       -1, 0, 0},
      {SA_BF16, 4, 9, 11, 2, 1, 32, 32, SA_SOFTMAX_VANILLA, T_SINK_U10, T_LENS_EDGE, T_SEGS_RANDOM, 1, 0,
       SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0},
      {SA_F32, 2, 16, 16, 4, 4, 32, 32, SA_SOFTMAX_LEARNABLE, T_SINK_U10, 0, 0, 1, 0, SA_CAUSAL_TOP_LEFT, -1, -1,
       -100, 0},
      {SA_F16, 2, 16, 16, 4, 4, 32, 32, SA_SOFTMAX_VANILLA, T_SINK_U10, 0, 0, 1, 0, SA_CAUSAL_BOTTOM_RIGHT, 0, 0,
       100, 0},
      {SA_BF16, 1, 129, 129, 4, 1, 256, 256, SA_SOFTMAX_LEARNABLE, T_SINK_BIG, 0, 0, 1, 0, SA_CAUSAL_TOP_LEFT, 127,
       0, 0, 0},
      {SA_BF16, 1, 200, 300, 2, 1, 64, 64, SA_SOFTMAX_LEARNABLE, T_SINK_U10, T_LENS_RANDOM, 0, 1, 0,
       SA_CAUSAL_BOTTOM_RIGHT, 100, 0, 0, 0},
      {SA_F16, 2, 3, 1000, 4, 1, 128, 128, SA_SOFTMAX_OFF_BY_ONE, T_SINK_U10, T_LENS_RANDOM, 0, 1, 0,
       SA_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 0},
      {SA_F32, 1, 129, 129, 4, 2, 80, 96, SA_SOFTMAX_LEARNABLE, T_SINK_U10, T_LENS_RANDOM, T_SEGS_PACKED, 1, 0,
       SA_CAUSAL_NONE, -1, -1, 0, 1.0f},
  };
  for (size_t e = 0; e < sizeof edges / sizeof edges[0] && n < max; e++) cs[n++] = edges[e];
  return n;
}

/* ---- determinism: thread counts must not change a single bit ---------------------------------- */

static int t_determinism_case(const t_case *c, int idx) {
  char name[320];
  t_case_name(c, name, sizeof name);
  t_rng r = {0xd7e7000ull + (uint64_t)idx};
  t_prob p;
  t_prob_make(&p, c, &r, idx);
  size_t es = sa_dtype_size(c->dt);
  int ok = t_fwd(&p, SA_BACKEND_REF, p.out_r, p.lse_r) == SA_OK;
  void *o1 = t_alloc(p.no, es), *q1 = t_alloc(p.nq, es), *k1 = t_alloc(p.nk, es), *v1 = t_alloc(p.nv, es);
  float *l1 = t_alloc(p.nl, 4), *s1 = t_alloc(c->N, 4);
  for (int th = 1; th <= 3 && ok; th++) {
    sa_cpu_set_num_threads(th);
    ok &= t_fwd(&p, SA_BACKEND_CPU, p.out_c, p.lse_c) == SA_OK;
    ok &= t_bwd(&p, c, SA_BACKEND_CPU, p.dq_c, p.dk_c, p.dv_c, p.ds_c) == SA_OK;
    if (!ok) {
      t_report("determinism case %d [%s]: cpu call failed with %d threads: %s", idx, name, th, sa_last_error());
      break;
    }
    if (th == 1) {
      memcpy(o1, p.out_c, (size_t)p.no * es); memcpy(l1, p.lse_c, (size_t)p.nl * 4);
      memcpy(q1, p.dq_c, (size_t)p.nq * es); memcpy(k1, p.dk_c, (size_t)p.nk * es);
      memcpy(v1, p.dv_c, (size_t)p.nv * es); memcpy(s1, p.ds_c, (size_t)c->N * 4);
      continue;
    }
    const char *diff = memcmp(o1, p.out_c, (size_t)p.no * es) ? "out"
                       : memcmp(l1, p.lse_c, (size_t)p.nl * 4) ? "lse"
                       : memcmp(q1, p.dq_c, (size_t)p.nq * es) ? "dq"
                       : memcmp(k1, p.dk_c, (size_t)p.nk * es) ? "dk"
                       : memcmp(v1, p.dv_c, (size_t)p.nv * es) ? "dv"
                       : memcmp(s1, p.ds_c, (size_t)c->N * 4) ? "dsinks" : NULL;
    if (diff) {
      t_report("determinism case %d [%s]: %s with %d threads differs bitwise from 1 thread", idx, name, diff, th);
      ok = 0;
    }
  }
  sa_cpu_set_num_threads(0);
  free(o1); free(q1); free(k1); free(v1); free(l1); free(s1);
  t_prob_free(&p);
  t_count(ok);
  return ok;
}

static void t_determinism_group(const t_case *cs, int n) {
  int pass = 0, total = 0;
  /* every 25th table case (small and edge shapes) plus two with work enough for 3 threads to split */
  for (int i = 0; i < n; i += 25, total++) pass += t_determinism_case(&cs[i], i);
  t_case big = {SA_F32, 2, 129, 129, 8, 2, 64, 64, SA_SOFTMAX_LEARNABLE, T_SINK_U10, T_LENS_RANDOM, 0, 1, 0,
                SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0};
  pass += t_determinism_case(&big, 9000); total++;
  big.dt = SA_BF16; big.B = 3; big.T = 65; big.N = 16; big.causal = SA_CAUSAL_NONE; big.segs = T_SEGS_PACKED;
  pass += t_determinism_case(&big, 9001); total++;
  printf("determinism (cpu with 1, 2, 3 threads, bitwise out lse dq dk dv dsinks): %d/%d cases pass\n", pass, total);
}

/* ---- main ------------------------------------------------------------------------------------ */

static double t_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(void) {
  double t0 = t_now();
  t_fd_group();
  double t1 = t_now();

  static t_case cs[600];
  int n = t_build_cases(cs, 600);
  t_stats st[3] = {{0}};
  for (int i = 0; i < n; i++) t_run_case(&cs[i], i, &st[cs[i].dt]);
  for (int d = 0; d < 3; d++)
    printf("cpu vs reference, %s: %d/%d cases pass (largest error / bound: out %.2f lse %.2f dq %.2f dk %.2f "
           "dv %.2f dsinks %.2f)\n", t_dtype_name((sa_dtype)d), st[d].passed, st[d].cases, st[d].worst[0],
           st[d].worst[1], st[d].worst[2], st[d].worst[3], st[d].worst[4], st[d].worst[5]);
  double t2 = t_now();

  t_determinism_group(cs, n);
  double t3 = t_now();
  t_invalid_group();
  printf("time: finite differences %.1f s, table %.1f s, determinism %.1f s, total %.1f s (cpu simd %s, %d threads)\n",
         t1 - t0, t2 - t1, t3 - t2, t_now() - t0, sa_cpu_simd_name(), sa_cpu_get_num_threads());
  printf("%d passed, %d failed\n", t_passed, t_failed);
  return t_failed ? 1 : 0;
}
