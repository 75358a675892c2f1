/*
 * test_hop_mask.cu — the position-mask arithmetic of the Hopper kernels (sa_hop_mask in
 * src/cuda/hopper/ptx.cuh), checked on the host against the library's reference mask (sa_key_range in
 * sa_internal.h, what the fp64 reference and the CPU kernels use). Host code only: it runs in CI, where no
 * GPU is, although the kernels that use these formulas only run on an H200 (test_cuda checks them there).
 *
 * For random (T, S, causal alignment, window, diag_offset), every (row i, key j):
 *   1. lo(i) <= j < hi(i)                        == sa_key_range's answer   (the per-row range)
 *   2. dlo <= j - i <= dhi                       == the same                (the per-element test)
 *   3. mask kind 1 (no left window): j - i <= dhi alone == the same       (the kernels skip the lower test)
 *   4. lo and hi never decrease with i                                     (what the tile ranges rely on)
 *   5. the forward / dQ tile range of a block of rows holds every key its rows see, and a tile the kernels
 *      call interior (smallest key - row >= dlo, largest <= dhi) has no invisible pair;
 *   6. the dK/dV row range [first i with hi(i) > k0, first i with lo(i) >= k0 + KB) holds every row that
 *      sees a key of [k0, k0 + KB), and sa_hop_query_rows' binary searches find it (= a linear scan);
 *   7-9. the same with per-batch lengths (lens_case).
 * Exit status 0 when every check passes.
 */
#include <stdio.h>
#include <stdlib.h>

#include "hopper/ptx.cuh"
#include "sa_internal.h"

static unsigned long long rng_state = 0x9E3779B97F4A7C15ull;
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

static void one_case(int T, int S, int causal, long long wl, long long wr, long long diag) {
  sa_cuda_params p;
  memset(&p, 0, sizeof p);
  p.T = T;
  p.S = S;
  p.causal = causal;
  p.wl = wl;
  p.wr = wr;
  p.diag_offset = diag;
  sa_attn a;
  memset(&a, 0, sizeof a);
  a.q_len = T;
  a.kv_len = S;
  a.causal = (sa_causal)causal;
  a.window_left = wl;
  a.window_right = wr;
  a.diag_offset = diag;
  const sa_hop_mask m = sa_hop_mask_of(p);
  const int kind = sa_hop_mask_kind_of(causal, wl, wr, 0, 0);
  const char *fmt = "T %d S %d causal %d window (%lld, %lld) diag %lld: i %d j %d";
  for (int i = 0; i < T; ++i) {
    const sa_range r = sa_key_range(&a, T, S, i);
    const int lo = sa_hop_lo(m, i), hi = sa_hop_hi(m, i);
    if (i + 1 < T)
      CHECK(sa_hop_lo(m, i + 1) >= lo && sa_hop_hi(m, i + 1) >= hi, fmt, T, S, causal, wl, wr, diag, i, -1);
    for (int j = 0; j < S; ++j) {
      const bool want = j >= r.lo && j < r.hi, x_ok = j - i >= m.dlo && j - i <= m.dhi;
      CHECK((j >= lo && j < hi) == want, fmt, T, S, causal, wl, wr, diag, i, j);
      CHECK(x_ok == want, fmt, T, S, causal, wl, wr, diag, i, j);
      if (kind == 0) CHECK(want, fmt, T, S, causal, wl, wr, diag, i, j);
      if (kind == 1) CHECK((j - i <= m.dhi) == want, fmt, T, S, causal, wl, wr, diag, i, j);
    }
  }
  /* 5: blocks of 128 rows (the forward's and dQ's CTA), tiles of 128 / 64 keys, warpgroups of 64 rows */
  for (int tile = 64; tile <= 128; tile += 64)
    for (int m0 = 0; m0 < T; m0 += 128) {
      const int m1 = m0 + 128 < T ? m0 + 128 : T;
      int n_tiles;
      const int t0 = sa_hop_key_tiles(m, m0, m1 - m0, tile, &n_tiles); /* the kernels' own function */
      for (int i = m0; i < m1; ++i) {
        const sa_range r = sa_key_range(&a, T, S, i);
        for (int64_t j = r.lo; j < r.hi; ++j) /* an empty range may sit past S (lo = hi = i' - wl): int64 */
          CHECK(j >= t0 * tile && j < (t0 + n_tiles) * tile, fmt, T, S, causal, wl, wr, diag, i, (int)j);
      }
      for (int w0 = m0; w0 < m1; w0 += 64)
        for (int k = t0 * tile; k < (t0 + n_tiles) * tile && k < S; k += tile) {
          const bool interior = !(k - w0 - 63 < m.dlo || k + tile - 1 - w0 > m.dhi);
          if (!interior) continue;
          for (int i = w0; i < w0 + 64 && i < m1; ++i) {
            const sa_range r = sa_key_range(&a, T, S, i);
            for (int j = k; j < k + tile && j < S; ++j)
              CHECK(j >= r.lo && j < r.hi, fmt, T, S, causal, wl, wr, diag, i, j);
          }
        }
    }
  /* 6: key blocks of 128 (the dK/dV CTA) */
  for (int k0 = 0; k0 < S; k0 += 128) {
    int i_beg = T, i_end = T; /* by linear scan: the definitions */
    for (int i = T - 1; i >= 0; --i) {
      if (sa_hop_hi(m, i) > k0) i_beg = i;
      if (sa_hop_lo(m, i) >= k0 + 128) i_end = i;
    }
    int k_end; /* the kernels' binary searches must find the same rows */
    const int k_beg = sa_hop_query_rows(m, T, k0, 128, &k_end);
    CHECK(k_beg == i_beg && k_end == i_end, fmt, T, S, causal, wl, wr, diag, k_beg, k_end);
    for (int i = 0; i < T; ++i) {
      const sa_range r = sa_key_range(&a, T, S, i);
      const bool sees = r.lo < r.hi && r.lo < k0 + 128 && r.hi > k0;
      if (sees) CHECK(i >= i_beg && i < i_end, fmt, T, S, causal, wl, wr, diag, i, k0);
    }
  }
}

/* Lengths (mask kind 3): batch lengths ql <= T, kl <= S with their own mask (sa_hop_mask_make of ql, kl), against
   sa_key_range with the same lengths, for every (row i < T, key j < S) of the buffers:
   7. the forward / dQ per-row test dlo <= j - i <= dhi(i) (sa_hop_row_bounds) and the dK/dV per-key test
      dlo(j) <= j - i <= dhi(j) (sa_hop_key_bounds) == the reference (rows past ql and keys past kl: never);
   8. the key tiles of a 128-row block's rows below ql hold every key they see; a tile the kernels call
      interior (bounds as in 5, ending by kl, rows below ql) has no invisible pair;
   9. sa_hop_query_rows over ql rows holds every row that sees a key of a 128-key block. */
static void lens_case(int T, int S, int ql, int kl, int causal, long long wl, long long wr, long long diag) {
  sa_attn a;
  memset(&a, 0, sizeof a);
  a.q_len = T;
  a.kv_len = S;
  a.causal = (sa_causal)causal;
  a.window_left = wl;
  a.window_right = wr;
  a.diag_offset = diag;
  const sa_hop_mask m = sa_hop_mask_make(ql, kl, causal, wl, wr, diag);
  const char *fmt = "lens T %d S %d ql %d kl %d causal %d window (%lld, %lld) diag %lld: i %d j %d";
  for (int i = 0; i < T; ++i) {
    const sa_range r = sa_key_range(&a, ql, kl, i);
    int rlo, rhi;
    sa_hop_row_bounds(m, ql, kl, i, &rlo, &rhi);
    for (int j = 0; j < S; ++j) {
      const bool want = j >= r.lo && j < r.hi && j < kl;
      int klo, khi;
      sa_hop_key_bounds(m, ql, kl, j, &klo, &khi);
      CHECK((j - i >= rlo && j - i <= rhi) == want, fmt, T, S, ql, kl, causal, wl, wr, diag, i, j);
      CHECK((j - i >= klo && j - i <= khi) == want, fmt, T, S, ql, kl, causal, wl, wr, diag, i, j);
    }
  }
  for (int tile = 64; tile <= 128; tile += 64)
    for (int m0 = 0; m0 < ql; m0 += 128) {
      const int rows = ql - m0 < 128 ? ql - m0 : 128;
      int n_tiles;
      const int t0 = sa_hop_key_tiles(m, m0, rows, tile, &n_tiles);
      for (int i = m0; i < m0 + rows; ++i) {
        const sa_range r = sa_key_range(&a, ql, kl, i);
        for (int64_t j = r.lo; j < r.hi && j < kl; ++j)
          CHECK(j >= t0 * tile && j < (t0 + n_tiles) * tile, fmt, T, S, ql, kl, causal, wl, wr, diag, i, (int)j);
      }
      for (int w0 = m0; w0 < m0 + 128; w0 += 64)
        for (int k = t0 * tile; k < (t0 + n_tiles) * tile; k += tile) {
          const bool interior = !(k - w0 - 63 < m.dlo || k + tile - 1 - w0 > m.dhi || k + tile > kl || w0 + 64 > ql);
          if (!interior) continue;
          for (int i = w0; i < w0 + 64; ++i) {
            const sa_range r = sa_key_range(&a, ql, kl, i);
            for (int j = k; j < k + tile; ++j)
              CHECK(j >= r.lo && j < r.hi, fmt, T, S, ql, kl, causal, wl, wr, diag, i, j);
          }
        }
    }
  for (int k0 = 0; k0 < S; k0 += 128) {
    int i_end;
    const int i_beg = sa_hop_query_rows(m, ql, k0, 128, &i_end);
    for (int i = 0; i < T; ++i) {
      const sa_range r = sa_key_range(&a, ql, kl, i);
      const int64_t hi = r.hi < kl ? r.hi : kl;
      const bool sees = r.lo < hi && r.lo < k0 + 128 && hi > k0;
      if (sees) CHECK(i >= i_beg && i < i_end && i < ql, fmt, T, S, ql, kl, causal, wl, wr, diag, i, k0);
    }
  }
}

int main(void) {
  const long long windows[] = {-1, -1, -1, 0, 1, 7, 50, 127, 128, 300, 1000, 1LL << 40};
  const long long diags[] = {0,   0,    0,   1,    -1,   37,    -37,         128,         -128,
                             200, -200, 500, -500, 5000, -5000, (1LL << 39), -(1LL << 39)};
  const int sizes[] = {1, 2, 37, 64, 100, 128, 129, 256, 300, 384};
  int cases = 0;
  const int n_random = getenv("SA_MASK_CASES") ? atoi(getenv("SA_MASK_CASES")) : 600;
  for (int n = 0; n < n_random; ++n, ++cases)
    one_case(sizes[rnd() % 10], sizes[rnd() % 10], (int)(rnd() % 3), pick(windows, 12), pick(windows, 12),
             pick(diags, 17));
  /* the shapes the kernels meet most: gpt-oss's window, bottom-right decode-like blocks, ring blocks */
  one_case(512, 512, 1, 127, 0, 0);
  one_case(256, 512, 2, -1, -1, 0);
  one_case(512, 256, 2, 100, 0, 0);
  one_case(384, 384, 1, -1, -1, -300);
  one_case(100, 300, 0, 1000, 1000, -500);
  cases += 5;
  const int bufs[] = {128, 256, 384};
  for (int n = 0; n < n_random / 4; ++n, ++cases) {
    const int T = bufs[rnd() % 3], S = bufs[rnd() % 3];
    const int ql = rnd() % 5 == 0 ? (int)(rnd() % 2) * T : (int)(rnd() % (T + 1));
    const int kl = rnd() % 5 == 0 ? (int)(rnd() % 2) * S : (int)(rnd() % (S + 1));
    lens_case(T, S, ql, kl, (int)(rnd() % 3), pick(windows, 12), pick(windows, 12), pick(diags, 17));
  }
  printf("test_hop_mask: %ld checks over %d cases, %ld failed\n", checks, cases, failures);
  return failures ? 1 : 0;
}
