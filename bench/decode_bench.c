/*
 * decode_bench.c — CPU decode (sa_attn_decode_fwd, one token, gpt-oss shape N/K = 64/8, H = 64, bf16,
 * learnable sinks) against this machine's copy bandwidth, measured in the same run with a threaded
 * memcpy over the same number of threads. Validates against the reference on a small shape first.
 *
 * bytes moved by decode = K and V cache bytes read + q read + out written; copy bandwidth counts the
 * bytes read plus the bytes written by memcpy (a decode only reads, so read-only traffic is compared
 * against read+write traffic: the same convention as the GPU script). The copy figure of glibc's memcpy
 * (non-temporal stores above a size) moved between 24 and 40 GB/s from run to run on the shared 2-core VM,
 * so the program also measures a read-only stream over the same threads ("read"), the roof a decode
 * (which only reads) can reach.
 * Usage: decode_bench [out.json]
 */
#define _POSIX_C_SOURCE 200112L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sa_internal.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

typedef struct { char *dst; const char *src; size_t n; } copy_job;
static void *copy_run(void *p) {
  copy_job *j = (copy_job *)p;
  memcpy(j->dst, j->src, j->n);
  return NULL;
}

/* Median GB/s (read + written) of a threaded 512 MiB memcpy. */
static double copy_bandwidth(int threads) {
  size_t n = (size_t)512 << 20;
  char *a = malloc(n), *b = malloc(n);
  if (!a || !b) return 0;
  memset(a, 1, n);
  memset(b, 2, n);
  double t[5];
  for (int r = 0; r < 6; r++) {
    pthread_t tid[64];
    copy_job jobs[64];
    double t0 = now();
    size_t part = n / (size_t)threads;
    for (int i = 0; i < threads; i++) {
      jobs[i].dst = b + part * (size_t)i; jobs[i].src = a + part * (size_t)i; jobs[i].n = part;
      if (i) pthread_create(&tid[i], NULL, copy_run, &jobs[i]);
    }
    copy_run(&jobs[0]);
    for (int i = 1; i < threads; i++) pthread_join(tid[i], NULL);
    if (r) t[r - 1] = now() - t0;
  }
  free(a);
  free(b);
  qsort(t, 5, sizeof t[0], cmp_d);
  return 2.0 * (double)n / t[2] / 1e9;
}

typedef struct { const uint64_t *src; size_t n; uint64_t sum; } read_job;
static volatile uint64_t read_sink;
static void *read_run(void *p) {
  read_job *j = (read_job *)p;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;  /* 4 chains: the loop is bound by memory, not by the adds */
  for (size_t i = 0; i + 4 <= j->n; i += 4) {
    s0 += j->src[i]; s1 += j->src[i + 1]; s2 += j->src[i + 2]; s3 += j->src[i + 3];
  }
  j->sum = s0 ^ s1 ^ s2 ^ s3;
  return NULL;
}

/* Median GB/s of a threaded read-only pass over 512 MiB. */
static double read_bandwidth(int threads) {
  size_t n = (size_t)512 << 20, words = n / 8;
  uint64_t *a = malloc(n);
  if (!a) return 0;
  memset(a, 1, n);
  double t[5];
  uint64_t sink = 0;
  for (int r = 0; r < 6; r++) {
    pthread_t tid[64];
    read_job jobs[64];
    double t0 = now();
    size_t part = words / (size_t)threads;
    for (int i = 0; i < threads; i++) {
      jobs[i].src = a + part * (size_t)i; jobs[i].n = part;
      if (i) pthread_create(&tid[i], NULL, read_run, &jobs[i]);
    }
    read_run(&jobs[0]);
    for (int i = 1; i < threads; i++) pthread_join(tid[i], NULL);
    for (int i = 0; i < threads; i++) sink ^= jobs[i].sum;
    if (r) t[r - 1] = now() - t0;
  }
  free(a);
  qsort(t, 5, sizeof t[0], cmp_d);
  read_sink = sink;  /* keeps the sums (and so the reads) alive */
  return (double)n / t[2] / 1e9;
}

static void fill(void *p, int64_t n, uint32_t seed) {
  uint16_t *h = (uint16_t *)p;
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    h[i] = sa_f32_to_bf16((float)(seed >> 8) / 16777216.0f * 2.0f - 1.0f);
  }
}

static void setup(sa_attn *a, int64_t B, int64_t S) {
  sa_attn_init(a);
  a->dtype = SA_BF16;
  a->batch = B; a->q_len = 1; a->kv_len = S; a->q_heads = 64; a->kv_heads = 8; a->head_dim = 64; a->v_head_dim = 64;
  a->softmax = SA_SOFTMAX_LEARNABLE;
  a->causal = SA_CAUSAL_BOTTOM_RIGHT;
}

/* Decode vs reference on a small shape, so the timed kernel is known to be right. */
static int validate(void) {
  sa_attn a;
  setup(&a, 2, 3000);
  static float sinks[64];
  for (int n = 0; n < 64; n++) sinks[n] = (float)(n % 21) - 10.0f;
  int32_t lens[2] = {2999, 1234};
  uint16_t *q = malloc(2 * 64 * 64 * 2), *k = malloc(2 * 3000 * 8 * 64 * 2), *v = malloc(2 * 3000 * 8 * 64 * 2);
  uint16_t o1[2 * 64 * 64], o2[2 * 64 * 64];
  fill(q, 2 * 64 * 64, 1); fill(k, 2 * 3000 * 8 * 64, 2); fill(v, 2 * 3000 * 8 * 64, 3);
  a.q = q; a.k = k; a.v = v; a.sinks = sinks; a.kv_lens = lens;
  a.out = o1;
  int ok = sa_attn_fwd(&a, SA_BACKEND_REF, NULL) == SA_OK;
  a.out = o2;
  ok &= sa_attn_decode_fwd(&a, NULL, 0, SA_BACKEND_CPU, NULL) == SA_OK;
  for (int i = 0; i < 2 * 64 * 64 && ok; i++) {
    float x = sa_bf16_to_f32(o1[i]), y = sa_bf16_to_f32(o2[i]);
    if (fabsf(x - y) > 1.6e-2f * (1.0f + fabsf(x))) ok = 0;
  }
  free(q); free(k); free(v);
  return ok;
}

int main(int argc, char **argv) {
  if (!validate()) {
    printf("decode_bench: CPU decode disagrees with the reference; not timing\n");
    return 1;
  }
  int threads = sa_cpu_get_num_threads();
  double copy = copy_bandwidth(threads), rd = read_bandwidth(threads);
  printf("CPU decode, bf16, N/K = 64/8, H = Hv = 64, Tq = 1, learnable sinks; %d threads, SIMD %s\n", threads,
         sa_cpu_simd_name());
  printf("copy bandwidth (memcpy read + write, %d threads): %.1f GB/s; read-only stream: %.1f GB/s\n", threads,
         copy, rd);
  printf("%4s %7s %10s %10s %9s %8s %8s\n", "B", "S", "MB moved", "time ms", "GB/s", "of copy", "of read");
  FILE *js = argc > 1 ? fopen(argv[1], "w") : NULL;
  if (js) fprintf(js, "{\"device\": \"cpu\", \"threads\": %d, \"simd\": \"%s\", \"copy_GBps\": %.2f, "
                  "\"read_GBps\": %.2f, \"rows\": [", threads, sa_cpu_simd_name(), copy, rd);
  const int64_t Bs[2] = {1, 8}, Ss[2] = {4096, 32768};
  static float sinks[64];
  for (int bi = 0; bi < 2; bi++)
    for (int si = 0; si < 2; si++) {
      sa_attn a;
      setup(&a, Bs[bi], Ss[si]);
      int64_t nkv = a.batch * a.kv_len * a.kv_heads * a.head_dim, nq = a.batch * a.q_heads * a.head_dim;
      void *q = malloc((size_t)nq * 2), *k = malloc((size_t)nkv * 2), *v = malloc((size_t)nkv * 2),
           *out = malloc((size_t)nq * 2);
      fill(q, nq, 1); fill(k, nkv, 2); fill(v, nkv, 3);
      a.q = q; a.k = k; a.v = v; a.out = out; a.sinks = sinks;
      size_t ws = sa_attn_decode_workspace_size(&a, SA_BACKEND_CPU);
      void *w = malloc(ws);
      double t[7];
      for (int r = 0; r < 8; r++) {
        double t0 = now();
        if (sa_attn_decode_fwd(&a, w, ws, SA_BACKEND_CPU, NULL) != SA_OK) printf("error: %s\n", sa_last_error());
        if (r) t[r - 1] = now() - t0;
      }
      qsort(t, 7, sizeof t[0], cmp_d);
      double bytes = 2.0 * (double)nkv * 2.0 + 2.0 * (double)nq * 2.0, gbs = bytes / t[3] / 1e9;
      printf("%4lld %7lld %10.1f %10.3f %9.1f %7.0f%% %7.0f%%\n", (long long)a.batch, (long long)a.kv_len,
             bytes / 1e6, t[3] * 1e3, gbs, 100.0 * gbs / copy, 100.0 * gbs / rd);
      if (js) fprintf(js, "%s{\"B\": %lld, \"S\": %lld, \"bytes\": %.0f, \"ms\": %.4f, \"GBps\": %.2f, \"of_copy\": %.3f}",
                      bi + si ? ", " : "", (long long)a.batch, (long long)a.kv_len, bytes, t[3] * 1e3, gbs, gbs / copy);
      free(q); free(k); free(v); free(out); free(w);
    }
  if (js) {
    fprintf(js, "]}\n");
    fclose(js);
  }
  return 0;
}
