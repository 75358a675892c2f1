/*
 * test_mask.c — the validity predicate and the dbias work split, checked against statements written
 * independently of the library's helpers:
 *   1. sa_attn_valid (the one definition every backend uses) against the predicate written out from
 *      include/sinkattn.h's prose, on random problems with lengths, causal, windows up to INT64_MAX,
 *      diag_offset, segments, positions up to the int32 limits and masks of every broadcast form;
 *   2. the CPU backend's dbias items: for each of the 16 bias forms over several shapes, every sub-item
 *      (b, kv head, block) of the pass that sums dbias belongs to exactly one item, and no dbias element
 *      is reachable from two items (so no two threads ever add to one element, and the order is fixed);
 *   3. positions that restate an index mask give the index mask's results: bitwise on REF, and on CPU
 *      within its fp32 rounding (the CPU backend skips and masks the tiles by other means).
 * Last line: "N passed, N failed".
 */
#include "cpu/cpu_internal.h"
#include "sa_test.h"
#include "sa_test_valid.h"

/* ---- 1. the predicate, written out ------------------------------------------------------------- */

static int32_t m_position(t_rng *r) {
  static const int32_t edge[] = {INT32_MIN, INT32_MIN + 1, -1, 0, 1, INT32_MAX - 1, INT32_MAX};
  return t_int(r, 0, 9) == 0 ? edge[t_int(r, 0, 6)] : (int32_t)t_int(r, -5, 45);
}

static void m_predicate_group(void) {
  t_rng r = {777};
  int pass = 0, total = 0;
  for (int it = 0; it < 400; it++) {
    sa_attn a;
    sa_attn_init(&a);
    a.batch = t_int(&r, 1, 3);
    a.q_len = t_int(&r, 0, 40);
    a.kv_len = t_int(&r, 0, 40);
    a.kv_heads = t_int(&r, 1, 2);
    a.q_heads = a.kv_heads * t_int(&r, 1, 3);
    static const int64_t wins[] = {-1, 0, 1, 3, 17, INT64_MAX};
    a.window_left = wins[t_int(&r, 0, 5)];
    a.window_right = wins[t_int(&r, 0, 5)];
    a.diag_offset = t_int(&r, 0, 3) ? 0 : t_int(&r, -50, 50);
    int pos = (int)t_int(&r, 0, 1);
    a.causal = (sa_causal)t_int(&r, 0, pos ? 1 : 2);
    int32_t ql[3], kl[3], qs[120], ks[120], qp[120], kp[120];
    uint8_t mask[3 * 6 * 40 * 40];
    for (int b = 0; b < 3; b++) {
      ql[b] = (int32_t)t_int(&r, -2, 45);
      kl[b] = (int32_t)t_int(&r, -2, 45);
    }
    for (int x = 0; x < 120; x++) {
      qs[x] = (int32_t)t_int(&r, 0, 2);
      ks[x] = (int32_t)t_int(&r, 0, 2);
      qp[x] = m_position(&r);
      kp[x] = m_position(&r);
    }
    if (t_int(&r, 0, 1)) {
      a.q_lens = ql;
      a.kv_lens = kl;
    }
    if (t_int(&r, 0, 2) == 0) {
      a.q_segment_ids = qs;
      a.kv_segment_ids = ks;
    }
    if (pos) {
      a.q_positions = qp;
      a.kv_positions = kp;
    }
    if (t_int(&r, 0, 1)) {
      const int64_t full[4] = {a.batch, a.q_heads, a.q_len, a.kv_len};
      t_bcast_dims((int)t_int(&r, 1, 16), full, a.mask_dims);
      for (int64_t x = 0; x < sa_dims_count(a.mask_dims); x++) mask[x] = t_int(&r, 0, 3) ? (uint8_t)t_int(&r, 1, 9) : 0;
      a.mask = mask;
    }
    int64_t bad = 0;
    for (int64_t b = 0; b < a.batch; b++)
      for (int64_t n = 0; n < a.q_heads; n++)
        for (int64_t i = 0; i < a.q_len; i++)
          for (int64_t j = 0; j < a.kv_len; j++)
            if (sa_attn_valid(&a, b, n, i, j) != t_valid_written(&a, b, n, i, j)) {
              if (!bad)
                t_report(
                    "predicate problem %d: (b %lld, n %lld, i %lld, j %lld): sa_attn_valid %d, "
                    "written out %d",
                    it, (long long)b, (long long)n, (long long)i, (long long)j, sa_attn_valid(&a, b, n, i, j),
                    t_valid_written(&a, b, n, i, j));
              bad++;
            }
    t_count(bad == 0);
    pass += bad == 0;
    total++;
  }
  printf(
      "sa_attn_valid vs the predicate written out (lengths, causal, windows, segments, positions, mask): "
      "%d/%d problems\n",
      pass, total);
}

/* ---- 2. dbias items ------------------------------------------------------------------------------ */

static int64_t m_min(int64_t x, int64_t y) { return x < y ? x : y; }

static int m_grid_case(int form, int64_t B, int64_t T, int64_t S, int64_t N, int64_t K) {
  sa_attn a;
  sa_attn_init(&a);
  a.dtype = SA_F32;
  a.batch = B;
  a.q_len = T;
  a.kv_len = S;
  a.q_heads = N;
  a.kv_heads = K;
  a.head_dim = a.v_head_dim = 32;
  const int64_t full[4] = {B, N, T, S};
  t_bcast_dims(form, full, a.bias_dims);
  float one = 0.0f;
  a.bias = &one; /* never read: only the shapes matter here */
  sa_attn_grad g = {0};
  g.dbias = &one;
  sa_cpu_ctx c;
  sa_cpu_ctx_init(&c, &a, &g, 0);
  const sa_cpu_pass pass = (sa_cpu_pass)c.dbias_pass;
  const sa_cpu_grid gr = sa_cpu_grid_of(&c, pass);
  const int64_t nblk = pass == SA_CPU_BWD_DKDV ? c.nkb : c.nqb, blk = pass == SA_CPU_BWD_DKDV ? SA_CPU_BK2 : c.bq;
  const int64_t items = gr.nb * gr.nk * gr.nl, subs = gr.gb * gr.gk * gr.gl, G = N / K;
  int64_t *owner = t_alloc(sa_dims_count(a.bias_dims), sizeof *owner);
  int *seen = calloc((size_t)(B * K * nblk + 1), sizeof *seen);
  for (int64_t e = 0; e < sa_dims_count(a.bias_dims); e++) owner[e] = -1;
  const sa_bcast st = sa_bcast_of(a.bias_dims);
  int ok = items * subs == B * K * nblk && (pass == SA_CPU_BWD_DQ || pass == SA_CPU_BWD_DKDV);
  for (int64_t it = 0; ok && it < items; it++)
    for (int64_t k = 0; ok && k < subs; k++) {
      int64_t sub = sa_cpu_sub_item(&gr, K, it, k), bl = sub % nblk, kh = (sub / nblk) % K, b = sub / (nblk * K);
      ok &= sub >= 0 && sub < B * K * nblk && !seen[sub]++;
      /* the pairs a sub-item holds: its block of keys (dk/dv) or of query rows (dq), all of the other */
      int64_t i0 = pass == SA_CPU_BWD_DQ ? bl * blk : 0, i1 = pass == SA_CPU_BWD_DQ ? m_min(T, i0 + blk) : T;
      int64_t j0 = pass == SA_CPU_BWD_DKDV ? bl * blk : 0, j1 = pass == SA_CPU_BWD_DKDV ? m_min(S, j0 + blk) : S;
      for (int64_t n = kh * G; ok && n < (kh + 1) * G; n++)
        for (int64_t i = i0; ok && i < i1; i++)
          for (int64_t j = j0; ok && j < j1; j++) {
            int64_t e = sa_bcast_at(st, b, n, i, j);
            ok &= owner[e] == -1 || owner[e] == it;
            owner[e] = it;
          }
    }
  if (!ok) {
    char f[5];
    static const char *ax = "BNTS";
    for (int d = 0; d < 4; d++) f[d] = (form - 1) >> (3 - d) & 1 ? '1' : ax[d];
    f[4] = '\0';
    t_report(
        "dbias items: bias [%s] over B%lld T%lld S%lld N%lld K%lld (pass %d, %lld items of %lld): a sub-item "
        "is missing or repeated, or two items reach one dbias element",
        f, (long long)B, (long long)T, (long long)S, (long long)N, (long long)K, (int)pass, (long long)items,
        (long long)subs);
  }
  free(owner);
  free(seen);
  t_count(ok);
  return ok;
}

static void m_grid_group(void) {
  static const int64_t shapes[][5] = {{3, 70, 150, 8, 2}, {2, 200, 65, 4, 4}, {1, 1, 300, 8, 1},
                                      {2, 129, 1, 2, 2},  {4, 33, 33, 1, 1},  {1, 1, 1, 4, 2}};
  int pass = 0, total = 0;
  for (int f = 1; f <= 16; f++)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++, total++)
      pass += m_grid_case(f, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4]);
  printf("dbias items of the CPU backend (16 bias forms x 6 shapes): %d/%d own their elements alone\n", pass, total);
}

/* ---- 3. positions restating index masks ---------------------------------------------------------- */

typedef struct {
  const char *name;
  sa_causal causal; /* of the index form; the positions form is top-left */
  int64_t wl, wr, diag, T, S;
  int shift; /* q positions i + S - T (the bottom-right diagonal), else i */
} m_pos_case;

static int m_pos_one(const m_pos_case *pc, sa_backend be, t_rng *r) {
  const int64_t B = 2, N = 4, K = 2, H = 32, T = pc->T, S = pc->S;
  sa_attn a;
  sa_attn_init(&a);
  a.dtype = SA_F32;
  a.batch = B;
  a.q_len = T;
  a.kv_len = S;
  a.q_heads = N;
  a.kv_heads = K;
  a.head_dim = a.v_head_dim = H;
  a.softmax = SA_SOFTMAX_LEARNABLE;
  a.window_left = pc->wl;
  a.window_right = pc->wr;
  a.diag_offset = pc->diag;
  float *q = t_alloc(B * T * N * H, 4), *k = t_alloc(B * S * K * H, 4), *v = t_alloc(B * S * K * H, 4);
  float *o1 = t_alloc(B * T * N * H, 4), *o2 = t_alloc(B * T * N * H, 4), *l1 = t_alloc(B * N * T, 4);
  float *l2 = t_alloc(B * N * T, 4), sinks[4];
  int32_t *qp = t_alloc(B * T, 4), *kp = t_alloc(B * S, 4);
  t_fill(q, SA_F32, B * T * N * H, r, -2, 2);
  t_fill(k, SA_F32, B * S * K * H, r, -2, 2);
  t_fill(v, SA_F32, B * S * K * H, r, -1, 1);
  for (int n = 0; n < 4; n++) sinks[n] = (float)t_unif(r, -10, 10);
  for (int64_t x = 0; x < B * T; x++) qp[x] = (int32_t)(x % T + (pc->shift ? S - T : 0));
  for (int64_t x = 0; x < B * S; x++) kp[x] = (int32_t)(x % S);
  a.q = q;
  a.k = k;
  a.v = v;
  a.sinks = sinks;
  a.causal = pc->causal;
  a.out = o1;
  a.lse = l1;
  sa_status s1 = sa_attn_fwd(&a, be, NULL);
  a.causal = pc->causal == SA_CAUSAL_NONE ? SA_CAUSAL_NONE : SA_CAUSAL_TOP_LEFT;
  a.q_positions = qp;
  a.kv_positions = kp;
  a.out = o2;
  a.lse = l2;
  sa_status s2 = sa_attn_fwd(&a, be, NULL);
  int ok = s1 == SA_OK && s2 == SA_OK;
  double worst = 0.0;
  for (int64_t x = 0; ok && x < B * T * N * H; x++) {
    double e = fabs((double)o1[x] - o2[x]);
    worst = fmax(worst, e);
    ok &= be == SA_BACKEND_REF ? memcmp(&o1[x], &o2[x], 4) == 0 : e <= 1e-6;
  }
  for (int64_t x = 0; ok && x < B * N * T; x++)
    ok &=
        be == SA_BACKEND_REF ? memcmp(&l1[x], &l2[x], 4) == 0 : fabs((double)l1[x] - l2[x]) <= 1e-6 * (1 + fabs(l1[x]));
  if (!ok)
    t_report("positions restating [%s] on %s: %s / %s, results differ (largest out difference %.3g)", pc->name,
             be == SA_BACKEND_REF ? "REF" : "CPU", sa_status_name(s1), sa_status_name(s2), worst);
  void *all[] = {q, k, v, o1, o2, l1, l2, qp, kp};
  for (size_t x = 0; x < sizeof all / sizeof all[0]; x++) free(all[x]);
  t_count(ok);
  return ok;
}

/* Window edges on the CPU tiles' borders: with 32 query rows per block (G = 2) and 64 keys per tile, a
   left window of 65 lets row 128 see exactly key 63 of tile 0, a right window of 33 row 31 key 64. */
static const m_pos_case m_pos_cases[] = {
    {.name = "bottom-right causal",
     .causal = SA_CAUSAL_BOTTOM_RIGHT,
     .wl = -1,
     .wr = -1,
     .T = 90,
     .S = 200,
     .shift = 1},
    {.name = "bottom-right window (20, 0)",
     .causal = SA_CAUSAL_BOTTOM_RIGHT,
     .wl = 20,
     .wr = 0,
     .T = 150,
     .S = 260,
     .shift = 1},
    {.name = "causal, left window 65", .causal = SA_CAUSAL_TOP_LEFT, .wl = 65, .wr = 0, .T = 260, .S = 260},
    {.name = "right window 33", .wl = -1, .wr = 33, .T = 200, .S = 260},
    {.name = "window (64, 64), diag -7", .wl = 64, .wr = 64, .diag = -7, .T = 200, .S = 200},
    {.name = "causal, diag 63", .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .diag = 63, .T = 130, .S = 260},
};

static void m_pos_group(void) {
  t_rng r = {4242};
  int pass = 0, total = 0;
  for (size_t x = 0; x < sizeof m_pos_cases / sizeof m_pos_cases[0]; x++)
    for (int be = SA_BACKEND_REF; be <= SA_BACKEND_CPU; be++, total++)
      pass += m_pos_one(&m_pos_cases[x], (sa_backend)be, &r);
  printf("positions restating index masks (REF bitwise, CPU within 1e-6): %d/%d\n", pass, total);
}

int main(void) {
  m_predicate_group();
  m_grid_group();
  m_pos_group();
  printf("%d passed, %d failed\n", t_passed, t_failed);
  return t_failed ? 1 : 0;
}
