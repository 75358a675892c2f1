/*
 * sa_test_case.h — one problem of the C test table (tests/test_attn.c): a case description (designated
 * initializers; zero is every option's default), its random inputs, the CPU backend against the fp64
 * reference on it (forward and backward, dbias included), and the checks of rows without a key.
 */
#ifndef SA_TEST_CASE_H
#define SA_TEST_CASE_H

#include "sa_plan.h"
#include "sa_test.h"

enum { T_SINK_U10, T_SINK_BIG }; /* U(-10,10) | +50 / -50 / U(-10,10) */
enum { T_LENS_NONE, T_LENS_RANDOM, T_LENS_EDGE, T_LENS_Q_ONLY, T_LENS_KV_ONLY };
enum { T_SEGS_NONE, T_SEGS_PACKED, T_SEGS_RANDOM };
/* positions: each token's index within its segment (packed documents; the index itself without segments),
   queries shifted to end with the keys (the bottom-right alignment, written as positions), or random */
enum { T_POS_NONE, T_POS_SEGMENT, T_POS_SHIFT, T_POS_RANDOM };
enum { T_BIAS_UNIFORM, T_BIAS_NEGINF }; /* U(-2, 2) | the same with 10% -inf and whole -inf rows */

#define T_UNBOUNDED .wl = -1, .wr = -1

typedef struct {
  const char *name; /* rows written by hand; generated rows are named by t_case_name alone */
  sa_dtype dt;
  int64_t B, T, S, N, K, H, Hv;
  sa_softmax sm;
  int sinks, lens, segs, dlse, no_dsinks;
  sa_causal causal;
  int64_t wl, wr, diag;
  float scale; /* 0 = default 1/sqrt(H) */
  int bias;    /* T_BCAST(...) or 0 */
  sa_dtype bias_dt;
  int bias_kind, no_dbias;
  int mask;  /* T_BCAST(...) or 0; ~25% of the pairs false and one row false everywhere */
  int pos;   /* T_POS_* */
  float cap; /* logits_soft_cap (0: none) */
} t_case;

static void t_bcast_name(int form, char *buf) {
  static const char *ax = "BNTS";
  for (int d = 0; d < 4; d++) buf[d] = (form - 1) >> (3 - d) & 1 ? '1' : ax[d];
  buf[4] = '\0';
}

static void t_case_name(const t_case *c, char *buf, size_t n) {
  static const char *sm[] = {"vanilla", "off_by_one", "learnable"}, *ca[] = {"none", "TL", "BR"};
  static const char *le[] = {"-", "random", "edge", "q-only", "kv-only"}, *se[] = {"-", "packed", "random"};
  static const char *po[] = {"-", "segment", "shift", "random"};
  char bias[64] = "-", mask[8] = "-";
  if (c->bias) {
    char f[8];
    t_bcast_name(c->bias, f);
    snprintf(bias, sizeof bias, "[%s] %s%s%s", f, t_dtype_name(c->bias_dt), c->bias_kind ? " -inf" : "",
             c->no_dbias ? " no-dbias" : "");
  }
  if (c->mask) t_bcast_name(c->mask, mask);
  snprintf(buf, n,
           "%s%s%s B%lld T%lld S%lld N%lld K%lld H%lld Hv%lld %s%s causal=%s win=(%lld,%lld) diag=%lld "
           "lens=%s segs=%s pos=%s bias=%s mask=%s dlse=%d scale=%g cap=%g",
           c->name ? c->name : "", c->name ? ": " : "", t_dtype_name(c->dt), (long long)c->B, (long long)c->T,
           (long long)c->S, (long long)c->N, (long long)c->K, (long long)c->H, (long long)c->Hv, sm[c->sm],
           c->sm == SA_SOFTMAX_LEARNABLE ? (c->sinks == T_SINK_BIG ? "(+-50)" : "(U10)") : "", ca[c->causal],
           (long long)c->wl, (long long)c->wr, (long long)c->diag, le[c->lens], se[c->segs], po[c->pos], bias, mask,
           c->dlse, (double)c->scale, (double)c->cap);
}

/* Inputs and outputs of one problem; the sa_attn points into these. */
typedef struct {
  sa_attn a;
  int64_t nq, nk, nv, no, nl, nb, nm;
  void *q, *k, *v, *dout, *out_r, *out_c, *dq_r, *dq_c, *dk_r, *dk_c, *dv_r, *dv_c, *bias;
  float *sinks, *dlse, *lse_r, *lse_c, *ds_r, *ds_c, *db_r, *db_c;
  uint8_t *mask;
  int32_t *qlens, *kvlens, *qseg, *kvseg, *qpos, *kvpos;
} t_prob;

static void t_segments(int32_t *ids, int64_t n, int mode, t_rng *r) {
  int32_t id = 0;
  for (int64_t i = 0; i < n; i++) {
    if (mode == T_SEGS_RANDOM) {
      ids[i] = (int32_t)t_int(r, 0, 3);
      continue;
    }
    if (i > 0 && t_unif(r, 0, 1) < 0.15) id++; /* ~7-token segments: several per row of 37 */
    ids[i] = id;
  }
}

static void t_positions(int32_t *pos, const int32_t *seg, int64_t n, int64_t shift, int mode, t_rng *r) {
  for (int64_t i = 0; i < n; i++) {
    if (mode == T_POS_RANDOM) pos[i] = (int32_t)t_int(r, -3, n + 3);
    else if (mode == T_POS_SHIFT) pos[i] = (int32_t)(i + shift);
    else pos[i] = seg && i > 0 && seg[i] == seg[i - 1] ? pos[i - 1] + 1 : (seg ? 0 : (int32_t)i);
  }
}

static void t_bias_make(t_prob *p, const t_case *c, t_rng *r) {
  sa_attn *a = &p->a;
  const int64_t full[4] = {c->B, c->N, c->T, c->S};
  t_bcast_dims(c->bias, full, a->bias_dims);
  p->nb = sa_dims_count(a->bias_dims);
  p->bias = t_alloc(p->nb, sa_dtype_size(c->bias_dt));
  p->db_r = t_alloc(p->nb, 4);
  p->db_c = t_alloc(p->nb, 4);
  for (int64_t x = 0; x < p->nb; x++) {
    int neg = c->bias_kind == T_BIAS_NEGINF && t_unif(r, 0, 1) < 0.1;
    sa_store(p->bias, c->bias_dt, x, neg ? -INFINITY : (float)t_unif(r, -2, 2));
  }
  if (c->bias_kind == T_BIAS_NEGINF && a->bias_dims[2] > 1) /* row 1 of every (b, n): -inf on every key */
    for (int64_t x = 0; x < p->nb; x++)
      if ((x / a->bias_dims[3]) % a->bias_dims[2] == 1) sa_store(p->bias, c->bias_dt, x, -INFINITY);
  a->bias = p->bias;
  a->bias_dtype = c->bias_dt;
}

static void t_mask_make(t_prob *p, const t_case *c, t_rng *r) {
  sa_attn *a = &p->a;
  const int64_t full[4] = {c->B, c->N, c->T, c->S};
  t_bcast_dims(c->mask, full, a->mask_dims);
  p->nm = sa_dims_count(a->mask_dims);
  p->mask = t_alloc(p->nm, 1);
  /* 0 / 1 and other nonzero bytes (nonzero = attend); row 0 of every (b, n) false when rows vary */
  for (int64_t x = 0; x < p->nm; x++) p->mask[x] = t_unif(r, 0, 1) < 0.25 ? 0 : (uint8_t)t_int(r, 1, 255);
  if (a->mask_dims[2] > 1)
    for (int64_t x = 0; x < p->nm; x++)
      if ((x / a->mask_dims[3]) % a->mask_dims[2] == 0) p->mask[x] = 0;
  a->mask = p->mask;
}

static void t_prob_make(t_prob *p, const t_case *c, t_rng *r, int idx) {
  memset(p, 0, sizeof *p);
  sa_attn *a = &p->a;
  sa_attn_init(a);
  a->dtype = c->dt;
  a->batch = c->B;
  a->q_len = c->T;
  a->kv_len = c->S;
  a->q_heads = c->N;
  a->kv_heads = c->K;
  a->head_dim = c->H;
  a->v_head_dim = c->Hv;
  a->softmax = c->sm;
  a->causal = c->causal;
  a->window_left = c->wl;
  a->window_right = c->wr;
  a->diag_offset = c->diag;
  a->scale = c->scale;
  a->logits_soft_cap = c->cap;
  size_t es = sa_dtype_size(c->dt);
  p->nq = c->B * c->T * c->N * c->H;
  p->nk = c->B * c->S * c->K * c->H;
  p->nv = c->B * c->S * c->K * c->Hv;
  p->no = c->B * c->T * c->N * c->Hv;
  p->nl = c->B * c->N * c->T;
  p->q = t_alloc(p->nq, es);
  p->k = t_alloc(p->nk, es);
  p->v = t_alloc(p->nv, es);
  p->dout = t_alloc(p->no, es);
  p->out_r = t_alloc(p->no, es);
  p->out_c = t_alloc(p->no, es);
  p->dq_r = t_alloc(p->nq, es);
  p->dq_c = t_alloc(p->nq, es);
  p->dk_r = t_alloc(p->nk, es);
  p->dk_c = t_alloc(p->nk, es);
  p->dv_r = t_alloc(p->nv, es);
  p->dv_c = t_alloc(p->nv, es);
  p->sinks = t_alloc(c->N, 4);
  p->dlse = t_alloc(p->nl, 4);
  p->lse_r = t_alloc(p->nl, 4);
  p->lse_c = t_alloc(p->nl, 4);
  p->ds_r = t_alloc(c->N, 4);
  p->ds_c = t_alloc(c->N, 4);
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
    p->qlens = t_alloc(c->B, 4);
    p->kvlens = t_alloc(c->B, 4);
    for (int64_t b = 0; b < c->B; b++) {
      /* edge: whole batches without keys or queries, and lengths outside [0, T] / [0, S] (clamped) */
      static const int64_t eq[4][2] = {{-3, 1000000}, {1000000000, 0}, {0, -1}, {-1, -1}};
      int e = (int)((b + idx) % 4);
      int64_t ql = t_int(r, 0, c->T), kl = t_int(r, 0, c->S);
      if (c->lens == T_LENS_EDGE && e < 3) {
        ql = eq[e][0];
        kl = eq[e][1];
      }
      if (c->lens == T_LENS_EDGE && e == 3) {
        ql = c->T / 2 + 1;
        kl = c->S + 7;
      }
      p->qlens[b] = (int32_t)ql;
      p->kvlens[b] = (int32_t)kl;
    }
    if (c->lens != T_LENS_KV_ONLY) a->q_lens = p->qlens;
    if (c->lens != T_LENS_Q_ONLY) a->kv_lens = p->kvlens;
  }
  if (c->segs != T_SEGS_NONE) {
    p->qseg = t_alloc(c->B * c->T, 4);
    p->kvseg = t_alloc(c->B * c->S, 4);
    for (int64_t b = 0; b < c->B; b++) {
      t_segments(p->qseg + b * c->T, c->T, c->segs, r);
      t_segments(p->kvseg + b * c->S, c->S, c->segs, r);
    }
    a->q_segment_ids = p->qseg;
    a->kv_segment_ids = p->kvseg;
  }
  if (c->pos != T_POS_NONE) {
    p->qpos = t_alloc(c->B * c->T, 4);
    p->kvpos = t_alloc(c->B * c->S, 4);
    for (int64_t b = 0; b < c->B; b++) {
      t_positions(p->qpos + b * c->T, p->qseg ? p->qseg + b * c->T : NULL, c->T, c->S - c->T, c->pos, r);
      t_positions(p->kvpos + b * c->S, p->kvseg ? p->kvseg + b * c->S : NULL, c->S, 0, c->pos, r);
    }
    a->q_positions = p->qpos;
    a->kv_positions = p->kvpos;
  }
  if (c->bias) t_bias_make(p, c, r);
  if (c->mask) t_mask_make(p, c, r);
  a->q = p->q;
  a->k = p->k;
  a->v = p->v;
}

static void t_prob_free(t_prob *p) {
  void *all[] = {p->q,    p->k,    p->v,     p->dout,   p->out_r, p->out_c, p->dq_r,  p->dq_c, p->dk_r, p->dk_c,
                 p->dv_r, p->dv_c, p->bias,  p->sinks,  p->dlse,  p->lse_r, p->lse_c, p->ds_r, p->ds_c, p->db_r,
                 p->db_c, p->mask, p->qlens, p->kvlens, p->qseg,  p->kvseg, p->qpos,  p->kvpos};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* Does the key j count for row (b, n, i): valid, and not dropped by a -inf bias (which a soft-cap makes the
   finite logit -cap)? */
static int t_key_counts(const sa_attn *a, int64_t b, int64_t n, int64_t i, int64_t j) {
  if (!sa_attn_valid(a, b, n, i, j)) return 0;
  return a->logits_soft_cap > 0.0f || sa_bias_at(a, b, n, i, j) != -INFINITY;
}

static int t_row_has_key(const sa_attn *a, int64_t b, int64_t n, int64_t i) {
  for (int64_t j = 0; j < a->kv_len; j++)
    if (t_key_counts(a, b, n, i, j)) return 1;
  return 0;
}

/* Plans forced on the CPU backend's forward and backward calls of t_fwd / t_bwd (NULL: whatever the caller
   forced, else the defaults); the reference's calls never see them. */
static const char *t_cpu_plan[2];

static sa_status t_fwd(t_prob *p, sa_backend be, void *out, float *lse) {
  t_poison(out, p->a.dtype, p->no);
  t_poison(lse, SA_F32, p->nl);
  p->a.out = out;
  p->a.lse = lse;
  const int force = be == SA_BACKEND_CPU && t_cpu_plan[0];
  if (force) sa_plan_force(SA_PLAN_FWD, t_cpu_plan[0]);
  sa_status s = sa_attn_fwd(&p->a, be, NULL);
  if (force) sa_plan_force(SA_PLAN_FWD, NULL);
  return s;
}

/* The backward of both backends gets the reference's out and lse: it must use them as given. */
static sa_status t_bwd(t_prob *p, const t_case *c, sa_backend be, void *dq, void *dk, void *dv, float *ds, float *db) {
  sa_attn_grad g = {0};
  t_poison(dq, p->a.dtype, p->nq);
  t_poison(dk, p->a.dtype, p->nk);
  t_poison(dv, p->a.dtype, p->nv);
  t_poison(ds, SA_F32, p->a.q_heads);
  if (db) t_poison(db, SA_F32, p->nb);
  p->a.out = p->out_r;
  p->a.lse = p->lse_r;
  g.dout = p->dout;
  g.dlse = c->dlse ? p->dlse : NULL;
  g.dq = dq;
  g.dk = dk;
  g.dv = dv;
  g.dsinks = c->no_dsinks ? NULL : ds;
  g.dbias = c->bias && !c->no_dbias ? db : NULL;
  const int force = be == SA_BACKEND_CPU && t_cpu_plan[1];
  if (force) sa_plan_force(SA_PLAN_BWD, t_cpu_plan[1]);
  size_t ws = sa_attn_bwd_workspace_size(&p->a, be);
  void *w = ws ? malloc(ws) : NULL;
  sa_status s = sa_attn_bwd(&p->a, &g, w, ws, be, NULL);
  if (force) sa_plan_force(SA_PLAN_BWD, NULL);
  free(w);
  return s;
}

/* fp32 accumulation budgets, relative to each head's scale (see t_compare, t_grad_floors). The CPU
   backend sums in fp32; the largest errors it shows over 6000 random cases of this table's kinds
   (relative to that scale) are about 6e-6 for out (exp() of scores or sinks of size ~50-100 carries
   ~|s| eps = 6e-6 relative into p), 1e-6 for lse, 2.5e-6 for dq/dk and 7.5e-6 for dv (a sum over up to
   129 queries x 8 heads). The budgets are 2.5-4x those: a wrong scale (1e-3), an off-by-one mask, a
   missing sink term (>= 1e-2) or a 1e-3 error in ds fails by 30x or more (checked by breaking the
   reference on purpose). f16/bf16 add the one-ulp rounding term 2u|ref| on top. dbias (fp32 in both) is
   held to the dv budget against its own floor (t_dbias_floor). */
#define T_ACC_OUT  1.5e-5
#define T_ACC_LSE  3e-6
#define T_ACC_GRAD 1e-5
#define T_ACC_DV   3e-5

enum { T_W_OUT, T_W_LSE, T_W_DQ, T_W_DK, T_W_DV, T_W_DSINKS, T_W_DBIAS, T_W_N };
typedef struct {
  int cases, passed;
  double worst[T_W_N];
} t_stats; /* worst: largest error / bound */

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
      if (!bad)
        t_report("%s: dsinks[%lld] = %.9g, reference %.9g (bound %.3g)", tag, (long long)n, g, r,
                 want_zero ? 0.0 : bound);
      bad++;
    }
  }
  return bad;
}

/* Rows without a key that counts (none valid, or every valid one at bias -inf): out = 0 and lse = the
   sink logit exactly, in both backends. */
static int64_t t_check_empty_rows(const t_prob *p, const t_case *c, const char *tag) {
  int64_t bad = 0;
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t n = 0; n < c->N; n++)
      for (int64_t i = 0; i < c->T; i++) {
        if (t_row_has_key(&p->a, b, n, i)) continue;
        float want = sa_sink_logit(&p->a, n), lr = p->lse_r[(b * c->N + n) * c->T + i];
        float lc = p->lse_c[(b * c->N + n) * c->T + i];
        int ok = lr == want && lc == want;
        for (int64_t d = 0; d < c->Hv; d++) {
          int64_t o = ((b * c->T + i) * c->N + n) * c->Hv + d;
          ok &= sa_load(p->out_r, c->dt, o) == 0.0f && sa_load(p->out_c, c->dt, o) == 0.0f;
        }
        if (!ok) {
          if (!bad)
            t_report("%s: row b=%lld n=%lld i=%lld has no key: lse cpu %g ref %g (want %g), out must be 0", tag,
                     (long long)b, (long long)n, (long long)i, lc, lr, want);
          bad++;
        }
      }
  return bad;
}

static double t_amax(const void *x, sa_dtype t, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)sa_load(x, t, i)));
  return m;
}

/* sum_j p_ij over the keys of one row, from the scores (not 1 - exp(a - lse): next to a +50 sink the
   float lse rounds to exactly 50 and that difference to 0). */
static double t_key_mass(const t_prob *p, const t_case *c, int64_t b, int64_t n, int64_t i) {
  const sa_attn *a = &p->a;
  double lse = p->lse_r[(b * c->N + n) * c->T + i], mass = 0.0, sc = sa_scale_of(a);
  if (lse == -INFINITY) return 0.0;
  for (int64_t j = 0; j < c->S; j++) {
    if (!t_key_counts(a, b, n, i, j)) continue;
    double dot = 0.0;
    for (int64_t d = 0; d < c->H; d++)
      dot += (double)sa_load(p->q, c->dt, ((b * c->T + i) * c->N + n) * c->H + d) *
             sa_load(p->k, c->dt, ((b * c->S + j) * c->K + n / (c->N / c->K)) * c->H + d);
    const double l = sc * dot + sa_bias_at(a, b, n, i, j), cap = a->logits_soft_cap;
    mass += exp((cap > 0.0 ? cap * tanh(l / cap) : l) - lse);
  }
  return mass;
}

/* Floors of the gradient comparisons (see t_compare), per head: the size of one term of the sums.
   ds = p (dp - D), where dp is a dot product of Hv terms whose fp32 error scales with
   sqrt(Hv) max|dout| max|v| even where dp - D cancels; dq, dk multiply that by |scale| max|k| (max|q|);
   all times the largest probability mass that head's rows put on keys (~e^-50 next to a +50 sink:
   that head is then held to its own tiny scale). dv = sum p dout has no dp: max|dout| mass. dbias sums
   ds itself over the pairs that share an element: fb is the largest head's ds term (dbias's heads mix
   when bias is shared along them). */
static void t_grad_floors(const t_prob *p, const t_case *c, double *fq, double *fk, double *fv, double *fb) {
  double dv = sqrt((double)c->Hv) * t_amax(p->dout, c->dt, p->no) * t_amax(p->v, c->dt, p->nv);
  double sc = fabs((double)sa_scale_of(&p->a)), qm = t_amax(p->q, c->dt, p->nq), km = t_amax(p->k, c->dt, p->nk);
  for (int64_t h = 0; h < c->K; h++) fk[h] = fv[h] = 0.0;
  *fb = 0.0;
  for (int64_t n = 0; n < c->N; n++) {
    double mass = 0.0;
    for (int64_t b = 0; b < c->B; b++)
      for (int64_t i = 0; i < c->T; i++) mass = fmax(mass, t_key_mass(p, c, b, n, i));
    int64_t h = n / (c->N / c->K);
    fq[n] = sc * km * dv * mass;
    fk[h] = fmax(fk[h], sc * qm * dv * mass);
    fv[h] = fmax(fv[h], t_amax(p->dout, c->dt, p->no) * mass);
    *fb = fmax(*fb, dv * mass);
  }
}

/* dbias: fp32 in both; the floor is one ds term times sqrt of the terms each element sums (the size-1
   axes' lengths), as the fp32 rounding of a long sum grows. */
static int64_t t_check_dbias(const t_prob *p, const t_case *c, const char *tag, double fb, double *worst) {
  const int64_t full[4] = {c->B, c->N, c->T, c->S};
  double terms = 1.0;
  for (int x = 0; x < 4; x++) terms *= p->a.bias_dims[x] == 1 ? (double)full[x] : 1.0;
  double floor_ = fb * sqrt(terms);
  return t_compare("dbias", tag, p->db_c, p->db_r, SA_F32, p->nb, (t_layout){p->nb ? p->nb : 1, 1, &floor_}, T_ACC_DV,
                   worst);
}

#include "sa_test_bf16.h"

/* inline: test_cpu_tile.c and amx_check.c include this file for its inputs and checks, not the driver */
static inline int t_run_case(const t_case *c, int idx, t_stats *st) {
  char name[400], tag[440];
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
    t_bf16_extra ex = {0};
    if (t_plan_rounds_p(SA_PLAN_FWD)) t_bf16_extra_make(&p, c, 0, &ex);
    bad += t_compare_x("out", tag, p.out_c, p.out_r, c->dt, p.no, (t_layout){c->Hv, c->N, NULL}, T_ACC_OUT, ex.o,
                       &st->worst[T_W_OUT]);
    t_bf16_extra_free(&ex);
    /* lse = m + log(l) with l >= 1: its error is absolute, ~eps * max(|m|, 1), hence the floor of 1 */
    double ones[T_MAX_HEADS];
    for (int h = 0; h < T_MAX_HEADS; h++) ones[h] = 1.0;
    bad += t_compare("lse", tag, p.lse_c, p.lse_r, SA_F32, p.nl, (t_layout){c->T ? c->T : 1, c->N, ones}, T_ACC_LSE,
                     &st->worst[T_W_LSE]);
    bad += t_check_empty_rows(&p, c, tag);
    int64_t nan = t_count_nan(p.out_c, c->dt, p.no) + t_count_nan(p.lse_c, SA_F32, p.nl);
    if (nan) t_report("%s: %lld NaN in the cpu forward", tag, (long long)nan);
    bad += nan;
  }
  if (bad == 0) {
    if ((s = t_bwd(&p, c, SA_BACKEND_REF, p.dq_r, p.dk_r, p.dv_r, p.ds_r, p.db_r)) != SA_OK) {
      t_report("%s: reference bwd %s: %s", tag, sa_status_name(s), sa_last_error());
      bad++;
    } else if ((s = t_bwd(&p, c, SA_BACKEND_CPU, p.dq_c, p.dk_c, p.dv_c, p.ds_c, p.db_c)) != SA_OK) {
      t_report("%s: cpu bwd %s: %s", tag, sa_status_name(s), sa_last_error());
      bad++;
    } else {
      double fq[T_MAX_HEADS], fk[T_MAX_HEADS], fv[T_MAX_HEADS], fb;
      t_grad_floors(&p, c, fq, fk, fv, &fb);
      t_bf16_extra ex = {0};
      if (t_plan_rounds_p(SA_PLAN_BWD)) t_bf16_extra_make(&p, c, 1, &ex);
      bad += t_compare_x("dq", tag, p.dq_c, p.dq_r, c->dt, p.nq, (t_layout){c->H, c->N, fq}, T_ACC_GRAD, ex.q,
                         &st->worst[T_W_DQ]);
      bad += t_compare_x("dk", tag, p.dk_c, p.dk_r, c->dt, p.nk, (t_layout){c->H, c->K, fk}, T_ACC_GRAD, ex.k,
                         &st->worst[T_W_DK]);
      bad += t_compare_x("dv", tag, p.dv_c, p.dv_r, c->dt, p.nv, (t_layout){c->Hv, c->K, fv}, T_ACC_DV, ex.v,
                         &st->worst[T_W_DV]);
      t_bf16_extra_free(&ex);
      if (!c->no_dsinks) bad += t_check_dsinks(&p, c, tag, &st->worst[T_W_DSINKS]);
      if (c->bias && !c->no_dbias) bad += t_check_dbias(&p, c, tag, fb, &st->worst[T_W_DBIAS]);
      int64_t nan = t_count_nan(p.dq_c, c->dt, p.nq) + t_count_nan(p.dk_c, c->dt, p.nk) +
                    t_count_nan(p.dv_c, c->dt, p.nv) + t_count_nan(p.dq_r, c->dt, p.nq) +
                    (c->bias && !c->no_dbias ? t_count_nan(p.db_c, SA_F32, p.nb) : 0);
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

#endif /* SA_TEST_CASE_H */
