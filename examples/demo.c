/*
 * demo.c — sinkattn from C, the example to copy: gpt-oss-style attention (learnable sinks, causal, GQA)
 * forward and backward on the fastest backend available (SA_BACKEND_AUTO), checked against the plain-C
 * reference (SA_BACKEND_REF), with the time and GFLOP/s of each pass.
 *
 *     make demo-c            (or: build/sinkattn_demo [T])
 *
 * Uses the public API only (sinkattn.h). Exit status 0 when the fast backend matches the reference.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "sinkattn.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Uniform in [lo, hi) from a 64-bit LCG: reproducible inputs without a dependency. */
static float uniform(uint64_t *s, float lo, float hi) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return lo + (hi - lo) * (float)((*s >> 40) * (1.0 / 16777216.0));
}

static float *alloc_floats(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof *p);
  if (!p) {
    fprintf(stderr, "demo: out of memory\n");
    exit(1);
  }
  return p;
}

/* Largest |x - r| (infinite for a NaN) and largest finite |r|; equal pairs (-inf lse) count as 0. */
static double max_err(const float *x, const float *r, size_t n, double *rmax) {
  double e = 0.0;
  *rmax = 0.0;
  for (size_t i = 0; i < n; i++) {
    if (isfinite(r[i]) && fabs(r[i]) > *rmax) *rmax = fabs(r[i]);
    if (x[i] == r[i]) continue;
    double d = fabs((double)x[i] - r[i]);
    if (isnan(d)) return INFINITY;
    if (d > e) e = d;
  }
  return e;
}

static const char *backend_name(sa_backend b) {
  return b == SA_BACKEND_CUDA ? "cuda" : b == SA_BACKEND_CPU ? "cpu" : "reference";
}

int main(int argc, char **argv) {
  /* B=2 sequences of T=S=512 tokens, 8 query heads sharing 2 kv heads (G=4), head dim 64. */
  const int64_t B = 2, T = argc > 1 ? atoll(argv[1]) : 512, S = T, N = 8, K = 2, H = 64;
  if (T < 1 || T > 65536) {
    fprintf(stderr, "usage: %s [T in 1..65536]\n", argv[0]);
    return 2;
  }
  size_t nq = (size_t)(B * T * N * H), nk = (size_t)(B * S * K * H), nl = (size_t)(B * N * T);
  float *q = alloc_floats(nq), *k = alloc_floats(nk), *v = alloc_floats(nk), *dout = alloc_floats(nq);
  float sinks[8], dsinks[8], dsinks_ref[8];
  uint64_t seed = 42;
  for (size_t i = 0; i < nq; i++) q[i] = uniform(&seed, -2, 2);
  for (size_t i = 0; i < nk; i++) k[i] = uniform(&seed, -2, 2);
  for (size_t i = 0; i < nk; i++) v[i] = uniform(&seed, -1, 1);
  for (size_t i = 0; i < nq; i++) dout[i] = uniform(&seed, -1, 1);
  for (int n = 0; n < N; n++) sinks[n] = uniform(&seed, -4, 4);

  /* Describe the problem once; the same struct serves every backend and both passes. */
  sa_attn a;
  sa_attn_init(&a); /* zeros, and window (-1, -1) = unbounded */
  a.dtype = SA_F32;
  a.batch = B;
  a.q_len = T;
  a.kv_len = S;
  a.q_heads = N;
  a.kv_heads = K;
  a.head_dim = H;
  a.v_head_dim = H;
  a.q = q;
  a.k = k;
  a.v = v;
  a.softmax = SA_SOFTMAX_LEARNABLE;
  a.sinks = sinks;
  a.causal = SA_CAUSAL_TOP_LEFT; /* scale 0 = 1/sqrt(H) */

  /* Outputs: [0] from the fast backend, [1] from the reference. */
  float *out[2], *lse[2], *dq[2], *dk[2], *dv[2];
  for (int r = 0; r < 2; r++) {
    out[r] = alloc_floats(nq);
    lse[r] = alloc_floats(nl);
    dq[r] = alloc_floats(nq);
    dk[r] = alloc_floats(nk);
    dv[r] = alloc_floats(nk);
  }
  sa_backend be = sa_backend_resolve(&a, SA_BACKEND_AUTO);
  printf("sinkattn %s: B=%lld T=S=%lld N=%lld K=%lld H=%lld, f32, learnable sinks, causal; backend %s",
         SINKATTN_VERSION_STRING, (long long)B, (long long)T, (long long)N, (long long)K, (long long)H,
         backend_name(be));
  if (be == SA_BACKEND_CPU) printf(" (%s, %d threads)", sa_cpu_simd_name(), sa_cpu_get_num_threads());
  printf("\n");

  /* FLOPs counted over the causal pairs only: S*(S+1)/2 per head; 2 per multiply-add, for q.k and p.v.
     The backward does 5 such products per pair (s, dp, dq, dk, dv; p is recomputed): 2.5x the forward. */
  double pairs = (double)B * N * (double)T * (T + 1) / 2.0, fwd_flop = pairs * 2.0 * (H + H);
  double bwd_flop = 2.5 * fwd_flop;
  double t_fwd = 0, t_bwd = 0;
  for (int r = 0; r < 2; r++) {
    sa_backend use = r == 0 ? SA_BACKEND_AUTO : SA_BACKEND_REF;
    a.out = out[r];
    a.lse = lse[r];
    /* The fast backend runs 3 times and keeps the best time (the first call warms caches and threads). */
    for (int rep = 0; rep < (r == 0 ? 3 : 1); rep++) {
      double t0 = now_s();
      if (sa_attn_fwd(&a, use, NULL) != SA_OK) {
        fprintf(stderr, "demo: forward failed: %s\n", sa_last_error());
        return 1;
      }
      double t1 = now_s();
      sa_attn_grad g = {0};
      g.dout = dout;
      g.dq = dq[r];
      g.dk = dk[r];
      g.dv = dv[r];
      g.dsinks = r == 0 ? dsinks : dsinks_ref;
      size_t ws = sa_attn_bwd_workspace_size(&a, use);
      void *w = ws ? malloc(ws) : NULL;
      sa_status s = sa_attn_bwd(&a, &g, w, ws, use, NULL);
      free(w);
      if (s != SA_OK) {
        fprintf(stderr, "demo: backward failed: %s\n", sa_last_error());
        return 1;
      }
      double t2 = now_s();
      if (r == 0 && (rep == 0 || t1 - t0 < t_fwd)) t_fwd = t1 - t0;
      if (r == 0 && (rep == 0 || t2 - t1 < t_bwd)) t_bwd = t2 - t1;
      if (r == 1) printf("reference (fp64):  forward %8.2f ms, backward %8.2f ms\n", 1e3 * (t1 - t0), 1e3 * (t2 - t1));
    }
    if (r == 0)
      printf("%-9s          forward %8.2f ms (%6.1f GFLOP/s), backward %8.2f ms (%6.1f GFLOP/s)\n", backend_name(be),
             1e3 * t_fwd, fwd_flop / t_fwd * 1e-9, 1e3 * t_bwd, bwd_flop / t_bwd * 1e-9);
  }

  /* fp32 against fp64: relative to the largest value, 1e-4 is ~1000 fp32 ulps of headroom. */
  const char *names[] = {"out", "lse", "dq", "dk", "dv", "dsinks"};
  const float *got[] = {out[0], lse[0], dq[0], dk[0], dv[0], dsinks};
  const float *ref[] = {out[1], lse[1], dq[1], dk[1], dv[1], dsinks_ref};
  size_t cnt[] = {nq, nl, nq, nk, nk, (size_t)N};
  int ok = 1;
  printf("max |%s - reference|:", backend_name(be));
  for (int t = 0; t < 6; t++) {
    double rmax, e = max_err(got[t], ref[t], cnt[t], &rmax);
    int good = e <= 1e-4 * (rmax > 1.0 ? rmax : 1.0);
    printf(" %s %.2g%s", names[t], e, good ? "" : " (TOO LARGE)");
    ok &= good;
  }
  printf("\n%s\n", ok ? "OK" : "MISMATCH");
  for (int r = 0; r < 2; r++) {
    free(out[r]);
    free(lse[r]);
    free(dq[r]);
    free(dk[r]);
    free(dv[r]);
  }
  free(q);
  free(k);
  free(v);
  free(dout);
  return ok ? 0 : 1;
}
