/*
 * test_cuda_feat.cu — the arithmetic of the CUDA feature kernels (src/cuda/feat.h: bias, mask array, positions,
 * soft-cap), checked on the host against the library's own definitions (sa_internal.h: sa_positions_ok,
 * sa_bcast_of / sa_bcast_at; the soft-cap of src/ref in double precision). Host code only: it runs in CI, where no
 * GPU is, although the kernels that use these formulas only run on a GPU (test_cuda checks them there).
 *   1. the positions' key bounds of a query (int64 and int32) and the query bounds of a key = sa_positions_ok,
 *      including positions near the int32 limits, huge diag_offset and windows wider than 2^42;
 *   2. the class of a tile from the positions' min / max: EMPTY only if no pair passes, FULL iff every pair does;
 *   3. the mask's class from whole 32-bit words (sa_feat_word_all = no zero byte), and the AND / side-by-side
 *      join of two classes, against the pairs they describe;
 *   4. the soft-cap: sa_feat_tanh against tanh in double (a sweep, and +-inf, NaN, +-0, tiny), the base-2 logit
 *      of a pair with bias and cap, and 1 - tanh^2 recovered from the probability, against double;
 *   5. sa_cuda_feat_make: the bias / mask strides give sa_bcast_at's element for every broadcast form;
 *   6. the forward's class lists inside out: every (batch, head, slab, tile) byte distinct and inside that slab's
 *      own rows (so a work tile's consumers overwrite only lists their producer has read).
 * Exit status 0 when every check passes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <set>

#include "cuda/plan.h"
#include "feat.h"
#include "hopper/tiles.h"
#include "sa_internal.h"

static unsigned long long rng_state = 0x2545F4914F6CDD1Dull;
static unsigned rnd(void) { /* xorshift64*: fixed seed, the same cases every run */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (unsigned)((rng_state * 2685821657736338717ull) >> 32);
}
static long long pick(const long long *v, int n) { return v[rnd() % n]; }

static long failures, checks;
#define CHECK(cond, ...)              \
  do {                                \
    ++checks;                         \
    if (!(cond) && failures++ < 20) { \
      printf("FAIL %s: ", #cond);     \
      printf(__VA_ARGS__);            \
      printf("\n");                   \
    }                                 \
  } while (0)

static sa_attn attn_pos(int causal, long long wl, long long wr, long long diag) {
  sa_attn a;
  memset(&a, 0, sizeof a);
  a.causal = (sa_causal)causal;
  a.window_left = wl;
  a.window_right = wr;
  a.diag_offset = diag;
  return a;
}

static sa_cuda_feat feat_pos(const sa_attn &a) {
  sa_cuda_feat f;
  memset(&f, 0, sizeof f);
  f.pos_causal = a.causal != SA_CAUSAL_NONE;
  f.pos_wl = a.window_left, f.pos_wr = a.window_right, f.pos_diag = a.diag_offset;
  return f;
}

static int32_t rnd_pos(int wide) {
  static const int32_t edge[6] = {INT32_MIN, INT32_MIN + 1, -1, 0, INT32_MAX - 1, INT32_MAX};
  if (wide && rnd() % 8 == 0) return edge[rnd() % 6];
  return (int32_t)(rnd() % 400) - 200;
}

/* 1 */
static void positions(void) {
  static const long long wins[] = {-1, 0, 1, 5, 127, 300, 1LL << 31, 1LL << 43};
  static const long long diags[] = {0, 0, 3, -7, 150, -150, 1LL << 32, -(1LL << 39)};
  for (int c = 0; c < 2000; ++c) {
    const sa_attn a = attn_pos(rnd() % 2, pick(wins, 8), pick(wins, 8), pick(diags, 8));
    const sa_cuda_feat f = feat_pos(a);
    for (int x = 0; x < 40; ++x) {
      const int32_t qp = rnd_pos(1), kp = rnd_pos(1);
      const int want = sa_positions_ok(&a, (int64_t)qp + a.diag_offset, kp);
      int32_t lo, hi;
      sa_feat_pos_bounds(&f, qp, &lo, &hi);
      const char *fmt = "causal %d window (%lld, %lld) diag %lld: qp %d kp %d";
      const int args_c = (int)a.causal;
      CHECK(sa_feat_pos_ok(&f, qp, kp) == want, fmt, args_c, a.window_left, a.window_right, a.diag_offset, qp, kp);
      CHECK((kp >= lo && kp <= hi) == want, fmt, args_c, a.window_left, a.window_right, a.diag_offset, qp, kp);
      sa_feat_pos_qbounds(&f, kp, &lo, &hi);
      CHECK((qp >= lo && qp <= hi) == want, fmt, args_c, a.window_left, a.window_right, a.diag_offset, qp, kp);
    }
  }
}

/* 2 */
static void position_classes(void) {
  static const long long wins[] = {-1, 0, 3, 20, 64};
  int32_t qp[64], kp[64];
  long seen[3] = {0, 0, 0};
  for (int c = 0; c < 20000; ++c) {
    const sa_attn a = attn_pos(rnd() % 2, pick(wins, 5), pick(wins, 5), (long long)(rnd() % 41) - 20);
    const sa_cuda_feat f = feat_pos(a);
    const int nq = 1 + rnd() % 64, nk = 1 + rnd() % 64, q0 = (int)(rnd() % 200) - 100, k0 = (int)(rnd() % 200) - 100;
    const int mode = rnd() % 3; /* increasing (packed positions), runs that restart (documents), scattered */
    int32_t qmin = INT32_MAX, qmax = INT32_MIN, kmin = INT32_MAX, kmax = INT32_MIN;
    for (int i = 0; i < nq; ++i) {
      qp[i] = mode == 0 ? q0 + i : mode == 1 ? q0 + i % 17 : q0 + (int)(rnd() % 64);
      qmin = qp[i] < qmin ? qp[i] : qmin, qmax = qp[i] > qmax ? qp[i] : qmax;
    }
    for (int j = 0; j < nk; ++j) {
      kp[j] = mode == 0 ? k0 + j : mode == 1 ? k0 + j % 13 : k0 + (int)(rnd() % 64);
      kmin = kp[j] < kmin ? kp[j] : kmin, kmax = kp[j] > kmax ? kp[j] : kmax;
    }
    int any = 0, all = 1;
    for (int i = 0; i < nq; ++i)
      for (int j = 0; j < nk; ++j) {
        const int ok = sa_positions_ok(&a, (int64_t)qp[i] + a.diag_offset, kp[j]);
        any |= ok;
        all &= ok;
      }
    const int cls = sa_feat_pos_class(&f, qmin, qmax, kmin, kmax);
    seen[cls]++;
    CHECK(cls != SA_FEAT_EMPTY || !any, "class EMPTY but a pair passes (case %d)", c);
    CHECK((cls == SA_FEAT_FULL) == (all != 0), "class %d but every pair passes = %d (case %d)", cls, all, c);
  }
  CHECK(seen[0] > 0 && seen[1] > 0 && seen[2] > 0, "every class occurs (%ld %ld %ld)", seen[0], seen[1], seen[2]);
}

/* 3 */
static void mask_classes(void) {
  static const uint32_t edge[] = {0u,          0x01010101u, 0x80808080u, 0xffffffffu, 0x00ffffffu, 0xff00ffffu,
                                  0xffff00ffu, 0xffffff00u, 0x01000000u, 0x00000001u, 0x7f7f7f7fu, 0x01800180u};
  for (int c = 0; c < 200000; ++c) {
    uint32_t w = c < 12 ? edge[c] : rnd();
    if (c >= 12 && rnd() % 2) w &= ~(0xffu << (8 * (rnd() % 4))); /* a zero byte */
    int all = 1;
    for (int k = 0; k < 4; ++k) all &= ((w >> (8 * k)) & 0xffu) != 0;
    CHECK((sa_feat_word_all(w) != 0) == all, "word %08x", w);
  }
  /* a tile of words: its class from any / all against its bytes */
  for (int c = 0; c < 5000; ++c) {
    uint32_t w[16];
    const int density = rnd() % 4; /* 0 none allowed, 3 all, else mixed */
    int any = 0, all = 1, any_w = 0, all_w = 1;
    for (int i = 0; i < 16; ++i) {
      w[i] = 0;
      for (int k = 0; k < 4; ++k) {
        const int on = density == 0 ? 0 : density == 3 ? 1 : (int)(rnd() % 3 != 0);
        w[i] |= (uint32_t)(on ? 1 + rnd() % 255 : 0) << (8 * k);
        any |= on, all &= on;
      }
      any_w |= w[i] != 0u;
      all_w &= sa_feat_word_all(w[i]);
    }
    const int cls = sa_feat_mask_class(any_w, all_w);
    CHECK(cls == (any ? (all ? SA_FEAT_FULL : SA_FEAT_PARTIAL) : SA_FEAT_EMPTY), "mask tile class %d", cls);
  }
  /* AND of two rules, and two blocks side by side, over every pair of classes */
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) {
      const int and_want = a == 0 || b == 0 ? 0 : a == 2 && b == 2 ? 2 : 1;
      const int join_want = a == b ? a : 1;
      CHECK(sa_feat_and(a, b) == and_want, "and(%d, %d) = %d", a, b, sa_feat_and(a, b));
      CHECK(sa_feat_join(a, b) == join_want, "join(%d, %d) = %d", a, b, sa_feat_join(a, b));
    }
}

/* 4 */
static void soft_cap(void) {
  double worst = 0, worst_y = 0;
  for (int i = -400000; i <= 400000; ++i) {
    const float y = (float)i * 5e-5f;
    const double e = fabs((double)sa_feat_tanh(y) - tanh((double)y));
    if (e > worst) worst = e, worst_y = y;
  }
  for (int i = 0; i < 100000; ++i) { /* wide and tiny arguments */
    const float y = ldexpf((float)(rnd() % 1000) / 500.f - 1.f, (int)(rnd() % 60) - 40);
    const double e = fabs((double)sa_feat_tanh(y) - tanh((double)y));
    if (e > worst) worst = e, worst_y = y;
  }
  printf("soft-cap tanh: max abs error %.3g (at y = %g)\n", worst, worst_y);
  CHECK(worst < 2e-7, "tanh max abs error %g at %g", worst, worst_y);
  CHECK(sa_feat_tanh(INFINITY) == 1.f && sa_feat_tanh(-INFINITY) == -1.f, "tanh(+-inf)");
  CHECK(isnan(sa_feat_tanh(NAN)), "tanh(NaN) is NaN");
  CHECK(sa_feat_tanh(0.f) == 0.f && sa_feat_tanh(1e-30f) == 1e-30f, "tanh near 0");

  /* the base-2 logit of a pair, with and without a cap; and the cap's derivative from p */
  double wl = 0, wg = 0;
  for (int c = 0; c < 200000; ++c) {
    sa_cuda_feat f;
    memset(&f, 0, sizeof f);
    f.scale = 0.125f;
    const int capped = c % 2;
    if (capped) {
      f.cap = (float)(1 + rnd() % 60);
      f.cap_inv = 1.f / f.cap;
      f.cap_l2 = f.cap * 1.4426950408889634f;
      f.cap_l2_inv = 1.f / f.cap_l2;
    }
    const float qk = (float)((int)(rnd() % 20001) - 10000) * 0.01f, bias = (float)((int)(rnd() % 2001) - 1000) * 0.01f;
    const double l = (double)qk * 0.125 + (double)bias;
    const double want = (capped ? (double)f.cap * tanh(l / (double)f.cap) : l) * 1.4426950408889634;
    const double got = sa_feat_logit2(&f, qk, bias);
    wl = fmax(wl, fabs(got - want) / fmax(1.0, fabs(want)));
    if (capped) { /* p from the capped logit and an lse2 above it, then 1 - tanh^2 back from p */
      const double lse2 = want + (double)(rnd() % 3000) * 0.01;
      const float p = exp2f((float)(want - lse2));
      const double t = want / (double)f.cap_l2, gwant = 1.0 - t * t;
      if (p > 1e-30f) wg = fmax(wg, fabs((double)sa_feat_cap_grad(&f, p, (float)lse2) - gwant));
    }
  }
  printf("soft-cap logit: max rel error %.3g; 1 - tanh^2 from p: max abs error %.3g\n", wl, wg);
  CHECK(wl < 5e-6, "logit2 max rel error %g", wl);
  CHECK(wg < 2e-4, "cap_grad max abs error %g", wg);
  sa_cuda_feat f0;
  memset(&f0, 0, sizeof f0);
  CHECK(sa_feat_cap_grad(&f0, 0.5f, 3.f) == 1.f, "no cap: factor 1");
}

/* 5 */
static void strides(void) {
  const int64_t B = 3, N = 4, T = 5, S = 6;
  for (int m = 0; m < 16; ++m) {
    sa_attn a;
    sa_attn_init(&a);
    a.batch = B, a.q_heads = N, a.q_len = T, a.kv_len = S;
    static const float bias_buf[4] = {0};
    static const uint8_t mask_buf[4] = {0};
    a.bias = bias_buf;
    a.bias_dtype = SA_F32;
    a.mask = mask_buf;
    const int64_t full[4] = {B, N, T, S};
    for (int d = 0; d < 4; ++d) {
      a.bias_dims[d] = (m >> d) & 1 ? full[d] : 1;
      a.mask_dims[d] = (m >> (3 - d)) & 1 ? full[d] : 1;
    }
    const sa_cuda_feat f = sa_cuda_feat_make(&a);
    const sa_bcast bs = sa_bcast_of(a.bias_dims), ms = sa_bcast_of(a.mask_dims);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < T; ++i)
          for (int64_t j = 0; j < S; ++j) {
            CHECK(b * f.bias_b + n * f.bias_n + i * f.bias_t + j * f.bias_s == sa_bcast_at(bs, b, n, i, j),
                  "bias form %d", m);
            CHECK(b * f.mask_b + n * f.mask_n + i * f.mask_t + j * f.mask_s == sa_bcast_at(ms, b, n, i, j),
                  "mask form %d", m);
          }
  }
}

/* 6 */
static void class_lists(void) {
  static const int64_t hvs[2] = {64, 128};
  for (int c = 0; c < 2; ++c) {
    const int64_t B = 2, N = 3, T = 512, Hv = hvs[c], nt = SA_HOP_FEAT_MAX_KV_LEN / SA_HOP_FWD_BN;
    std::set<int64_t> seen;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t rb = 0; rb < T / 64; ++rb)
          for (int64_t k = 0; k < nt; ++k) {
            const int64_t off = sa_feat_list_offset(b, n, rb, k, T, N, Hv), rowb = 2 * Hv;
            const int64_t row = off / rowb, hb = row % N, i = (row / N) % T, bb = row / (N * T);
            CHECK(seen.insert(off).second, "list byte (%lld %lld %lld %lld) written twice", (long long)b, (long long)n,
                  (long long)rb, (long long)k);
            CHECK(bb == b && hb == n && i >= 64 * rb && i < 64 * rb + 64, "list byte outside its slab's rows");
            if (k % 16 == 0) CHECK(off % 16 == 0, "a 16-byte chunk of a list is aligned");
          }
  }
}

int main() {
  positions();
  position_classes();
  mask_classes();
  soft_cap();
  strides();
  class_lists();
  printf("test_cuda_feat: %ld checks, %ld failures\n", checks, failures);
  return failures ? 1 : 0;
}
