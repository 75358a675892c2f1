/*
 * lib_ab.c — two builds of libsinkattn.so (or one, twice) in one process, call by call: the A/B of a change to the
 * CPU backend on a shared machine, where only an interleaved comparison means anything. Each round runs A then B
 * (the order alternating round to round); the figure is the median over rounds of B's time / A's, with the
 * medians of each, by wall clock and by process CPU time (which other processes' load does not inflate).
 *
 *   lib_ab LIB_A LIB_B fwd|fwdbwd f32|bf16 none|mask|bias|cap|maskcap T [rounds] [plan]
 *
 * B = 1, N = K = 8, H = Hv = 128, T = S, learnable sinks, no causal mask. mask: a bool mask [1,1,T,S] with 10%
 * of the pairs false, in both; bias: a bias [1,N,T,S] with dbias, in both; cap: A uncapped, B with
 * logits_soft_cap 30 (the cost of the cap: give one library twice); maskcap: both with the mask, B capped.
 * plan: a forced plan pair, e.g. amx for cpu.fwd.amx / cpu.bwd.amx (the libraries' sa_plan_force). The
 * struct is the newer header's: a library built before logits_soft_cap reads the fields before it and runs
 * uncapped.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sinkattn.h"

typedef struct {
  sa_status (*fwd)(const sa_attn *, sa_backend, void *);
  sa_status (*bwd)(const sa_attn *, const sa_attn_grad *, void *, size_t, sa_backend, void *);
  size_t (*ws)(const sa_attn *, sa_backend);
  sa_status (*force)(int, const char *);
  const char *(*err)(void);
} ab_lib;

static void ab_open(const char *path, ab_lib *l) {
  /* RTLD_LOCAL: the two builds' symbols stay apart */
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "lib_ab: %s\n", dlerror());
    exit(2);
  }
  *(void **)&l->fwd = dlsym(h, "sa_attn_fwd");
  *(void **)&l->bwd = dlsym(h, "sa_attn_bwd");
  *(void **)&l->ws = dlsym(h, "sa_attn_bwd_workspace_size");
  *(void **)&l->force = dlsym(h, "sa_plan_force");
  *(void **)&l->err = dlsym(h, "sa_last_error");
  if (!l->fwd || !l->bwd || !l->ws || !l->err) {
    fprintf(stderr, "lib_ab: %s lacks the sinkattn API\n", path);
    exit(2);
  }
}

static double ab_clock(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *ab_fill(size_t n, int bf16, unsigned *seed) {
  void *p = malloc(n * (bf16 ? 2 : 4));
  if (!p) exit(2);
  for (size_t i = 0; i < n; i++) {
    *seed = *seed * 1664525u + 1013904223u;
    float x = (float)(*seed >> 8) * (2.0f / 16777216.0f) - 1.0f;
    if (bf16) {
      unsigned u;
      memcpy(&u, &x, 4);
      ((unsigned short *)p)[i] = (unsigned short)(u >> 16);
    } else ((float *)p)[i] = x;
  }
  return p;
}

static int ab_cmp(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

static double ab_median(double *x, int n) {
  qsort(x, (size_t)n, sizeof *x, ab_cmp);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* One call (forward, or forward and backward) of library l; *cpu gets its process CPU seconds. */
static double ab_run(const ab_lib *l, const sa_attn *a, sa_attn_grad *g, void *w, size_t ws, int bwd, double *cpu) {
  const double t0 = ab_clock(CLOCK_MONOTONIC), c0 = ab_clock(CLOCK_PROCESS_CPUTIME_ID);
  sa_status s = l->fwd(a, SA_BACKEND_CPU, NULL);
  if (s == SA_OK && bwd) s = l->bwd(a, g, w, ws, SA_BACKEND_CPU, NULL);
  if (s != SA_OK) {
    fprintf(stderr, "lib_ab: call failed: %s\n", l->err());
    exit(1);
  }
  *cpu = ab_clock(CLOCK_PROCESS_CPUTIME_ID) - c0;
  return ab_clock(CLOCK_MONOTONIC) - t0;
}

int main(int argc, char **argv) {
  if (argc < 7) {
    fprintf(stderr, "usage: lib_ab LIB_A LIB_B fwd|fwdbwd f32|bf16 none|mask|bias|cap|maskcap T [rounds] [plan]\n");
    return 2;
  }
  ab_lib lib[2];
  ab_open(argv[1], &lib[0]);
  ab_open(argv[2], &lib[1]);
  const int bwd = strcmp(argv[3], "fwdbwd") == 0, bf16 = strcmp(argv[4], "bf16") == 0;
  const char *extra = argv[5];
  const long T = atol(argv[6]);
  const int rounds = argc > 7 ? atoi(argv[7]) : 21;
  const char *plan = argc > 8 ? argv[8] : NULL;
  const int N = 8, H = 128, mask = strstr(extra, "mask") != NULL, bias = strcmp(extra, "bias") == 0;
  const int cap = strstr(extra, "cap") != NULL;
  if (T < 1 || rounds < 1) return 2;
  unsigned seed = 1;
  const size_t nq = (size_t)T * N * H, es = bf16 ? 2 : 4;
  void *q = ab_fill(nq, bf16, &seed), *k = ab_fill(nq, bf16, &seed), *v = ab_fill(nq, bf16, &seed);
  void *dout = ab_fill(nq, bf16, &seed), *out = calloc(nq, es), *dq = calloc(nq, es), *dk = calloc(nq, es),
       *dv = calloc(nq, es);
  float *lse = calloc((size_t)N * T, 4), sinks[8], dsinks[8];
  for (int n = 0; n < N; n++) sinks[n] = 0.5f * (float)(n - 4);
  void *bz = bias ? ab_fill((size_t)N * T * T, bf16, &seed) : NULL;
  float *db = bias ? calloc((size_t)N * T * T, 4) : NULL;
  unsigned char *m = mask ? malloc((size_t)T * T) : NULL;
  for (long x = 0; mask && x < T * T; x++) {
    seed = seed * 1664525u + 1013904223u;
    m[x] = (seed >> 8) % 10 != 0;
  }
  sa_attn a[2];
  for (int i = 0; i < 2; i++) {
    sa_attn *p = &a[i];
    sa_attn_init(p);
    p->dtype = bf16 ? SA_BF16 : SA_F32;
    p->batch = 1;
    p->q_len = p->kv_len = T;
    p->q_heads = p->kv_heads = N;
    p->head_dim = p->v_head_dim = H;
    p->q = q;
    p->k = k;
    p->v = v;
    p->out = out;
    p->lse = lse;
    p->softmax = SA_SOFTMAX_LEARNABLE;
    p->sinks = sinks;
    if (bias) {
      p->bias = bz;
      p->bias_dtype = p->dtype;
      p->bias_dims[0] = 1;
      p->bias_dims[1] = N;
      p->bias_dims[2] = p->bias_dims[3] = T;
    }
    if (mask) {
      p->mask = m;
      p->mask_dims[0] = p->mask_dims[1] = 1;
      p->mask_dims[2] = p->mask_dims[3] = T;
    }
    p->logits_soft_cap = cap && i == 1 ? 30.0f : 0.0f;
  }
  sa_attn_grad g = {0};
  g.dout = dout;
  g.dq = dq;
  g.dk = dk;
  g.dv = dv;
  g.dsinks = dsinks;
  g.dbias = db;
  size_t ws = lib[0].ws(&a[0], SA_BACKEND_CPU), ws1 = lib[1].ws(&a[1], SA_BACKEND_CPU);
  ws = ws > ws1 ? ws : ws1;
  void *w = ws ? malloc(ws) : NULL;
  if (plan)
    for (int i = 0; i < 2; i++) {
      char f[64], b[64];
      snprintf(f, sizeof f, "cpu.fwd.%s", plan);
      snprintf(b, sizeof b, "cpu.bwd.%s", plan);
      if (!lib[i].force || lib[i].force(0, f) != SA_OK || lib[i].force(1, b) != SA_OK) {
        fprintf(stderr, "lib_ab: cannot force plan %s\n", plan);
        return 1;
      }
    }
  double *t[2], *c[2], *rt = malloc((size_t)rounds * sizeof *rt), *rc = malloc((size_t)rounds * sizeof *rc), cpu;
  for (int i = 0; i < 2; i++) {
    t[i] = malloc((size_t)rounds * sizeof *t[i]);
    c[i] = malloc((size_t)rounds * sizeof *c[i]);
    ab_run(&lib[i], &a[i], &g, w, ws, bwd, &cpu); /* warm-up: pages, threads */
  }
  for (int r = 0; r < rounds; r++) {
    for (int x = 0; x < 2; x++) {
      const int i = (r + x) % 2;
      t[i][r] = ab_run(&lib[i], &a[i], &g, w, ws, bwd, &c[i][r]);
    }
    rt[r] = t[1][r] / t[0][r];
    rc[r] = c[1][r] / c[0][r];
  }
  const double mrt = ab_median(rt, rounds), mrc = ab_median(rc, rounds);
  printf("%s %s %s T=S=%ld N%d H%d%s%s, %d rounds: A %.2f ms, B %.2f ms wall (B/A %.3f); CPU B/A %.3f\n", argv[3],
         argv[4], extra, T, N, H, plan ? " plan " : "", plan ? plan : "", rounds, 1e3 * ab_median(t[0], rounds),
         1e3 * ab_median(t[1], rounds), mrt, mrc);
  return 0;
}
