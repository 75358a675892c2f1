/*
 * bias_bench.c — the CPU backend with and without a bias or a mask, one configuration per process, for
 * paired whole-process timing (run it twice, with and without, in turn) and for its own per-call medians
 * (a benchmark, not a test).
 *
 *   bias_bench fwd|fwdbwd f32|bf16 none|full|shared|mask T [calls]
 *
 * B = 1, N = K = 8, H = Hv = 128, T = S, learnable sinks, no causal mask. full: bias [1,N,T,S]; shared:
 * bias [1,1,T,S] (both in the data's dtype, with dbias in fwdbwd); mask: a bool mask [1,1,T,S] with 10% of
 * the pairs false. Every run allocates and fills the same buffers, a bias and a mask included whether the
 * call takes them or not, so that two runs differ only in the calls. Prints the medians of the calls' wall
 * time and process CPU time (which the load of other processes does not inflate) after one warm-up call,
 * and the growth of the peak RSS over the calls (the backend's own memory: scratch, threads, D; the
 * caller's buffers are touched before).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "sinkattn.h"

static double clock_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long maxrss_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

/* n elements of U(-amp, amp) in f32 or bf16 (truncated: the values only need to be ordinary). */
static void *fill(size_t n, int bf16, float amp, unsigned *seed) {
  void *p = malloc(n * (bf16 ? 2 : 4));
  if (!p) {
    fprintf(stderr, "bias_bench: out of memory\n");
    exit(2);
  }
  for (size_t i = 0; i < n; i++) {
    *seed = *seed * 1664525u + 1013904223u;
    float x = amp * ((float)(*seed >> 8) * (2.0f / 16777216.0f) - 1.0f);
    if (bf16) {
      unsigned u;
      memcpy(&u, &x, 4);
      ((unsigned short *)p)[i] = (unsigned short)(u >> 16);
    } else ((float *)p)[i] = x;
  }
  return p;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: bias_bench fwd|fwdbwd f32|bf16 none|full|shared|mask T [calls]\n");
    return 2;
  }
  const int bwd = strcmp(argv[1], "fwdbwd") == 0, bf16 = strcmp(argv[2], "bf16") == 0;
  const char *form = argv[3];
  const int64_t T = atoll(argv[4]), B = 1, N = 8, H = 128;
  const int calls = argc > 5 ? atoi(argv[5]) : 3;
  unsigned seed = 12345;
  sa_attn a;
  sa_attn_init(&a);
  a.dtype = bf16 ? SA_BF16 : SA_F32;
  a.batch = B;
  a.q_len = a.kv_len = T;
  a.q_heads = a.kv_heads = N;
  a.head_dim = a.v_head_dim = H;
  a.softmax = SA_SOFTMAX_LEARNABLE;
  size_t nq = (size_t)(B * T * N * H), es = bf16 ? 2 : 4;
  a.q = fill(nq, bf16, 2.0f, &seed);
  a.k = fill(nq, bf16, 2.0f, &seed);
  a.v = fill(nq, bf16, 1.0f, &seed);
  void *dout = fill(nq, bf16, 1.0f, &seed);
  float sinks[8];
  for (int n = 0; n < 8; n++) sinks[n] = (float)n - 4.0f;
  a.sinks = sinks;
  a.out = malloc(nq * es);
  a.lse = malloc((size_t)(B * N * T) * 4);
  void *dq = malloc(nq * es), *dk = malloc(nq * es), *dv = malloc(nq * es);
  float dsinks[8];
  /* the full bias is allocated for every form; shared reads its first [T,S] */
  size_t nb = (size_t)(N * T * T);
  void *bias = fill(nb, bf16, 2.0f, &seed);
  float *dbias = malloc(nb * 4);
  uint8_t *mask = malloc((size_t)(T * T));
  for (size_t i = 0; i < (size_t)(T * T); i++) {
    seed = seed * 1664525u + 1013904223u;
    mask[i] = (seed >> 24) >= 26;
  }
  sa_attn_grad g = {0};
  g.dout = dout;
  g.dq = dq;
  g.dk = dk;
  g.dv = dv;
  g.dsinks = dsinks;
  if (!strcmp(form, "full") || !strcmp(form, "shared")) {
    a.bias = bias;
    a.bias_dtype = a.dtype;
    a.bias_dims[0] = 1;
    a.bias_dims[1] = strcmp(form, "full") ? 1 : N;
    a.bias_dims[2] = a.bias_dims[3] = T;
    g.dbias = dbias;
  } else if (!strcmp(form, "mask")) {
    a.mask = mask;
    a.mask_dims[0] = a.mask_dims[1] = 1;
    a.mask_dims[2] = a.mask_dims[3] = T;
  } else if (strcmp(form, "none")) {
    fprintf(stderr, "bias_bench: form %s: use none, full, shared or mask\n", form);
    return 2;
  }
  size_t wss = bwd ? sa_attn_bwd_workspace_size(&a, SA_BACKEND_CPU) : 0;
  void *ws = wss ? malloc(wss) : NULL;
  /* every caller's buffer touched, so that the RSS growth below is the backend's own */
  memset(a.out, 0, nq * es);
  memset(a.lse, 0, (size_t)(B * N * T) * 4);
  memset(dq, 0, nq * es);
  memset(dk, 0, nq * es);
  memset(dv, 0, nq * es);
  memset(dbias, 0, nb * 4);
  if (ws) memset(ws, 0, wss);
  long rss0 = maxrss_kib();
  double t[64], cpu[64];
  int n = calls < 63 ? calls : 63;
  for (int c = 0; c <= n; c++) {
    double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    sa_status s = sa_attn_fwd(&a, SA_BACKEND_CPU, NULL);
    if (s == SA_OK && bwd) s = sa_attn_bwd(&a, &g, ws, wss, SA_BACKEND_CPU, NULL);
    if (s != SA_OK) {
      fprintf(stderr, "bias_bench: %s: %s\n", sa_status_name(s), sa_last_error());
      return 1;
    }
    if (c) {
      t[c - 1] = clock_s(CLOCK_MONOTONIC) - t0;
      cpu[c - 1] = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    }
  }
  qsort(t, (size_t)n, sizeof t[0], cmp_double);
  qsort(cpu, (size_t)n, sizeof cpu[0], cmp_double);
  printf(
      "%s %s %s T=%lld: median %.1f ms wall, %.1f ms CPU over %d calls, peak RSS growth over the calls %ld KiB, "
      "%d threads, %s\n",
      argv[1], argv[2], form, (long long)T, 1e3 * t[n / 2], 1e3 * cpu[n / 2], n, maxrss_kib() - rss0,
      sa_cpu_get_num_threads(), sa_cpu_simd_name());
  return 0;
}
