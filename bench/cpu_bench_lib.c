/*
 * cpu_bench_lib.c — the C half of the CPU benchmark (bench/cpu_bench.py loads it with ctypes as
 * libsinkattn_cpubench.so): this machine's limits measured by microbenchmarks, and sinkattn's CPU calls
 * timed on buffers the driver owns (so PyTorch can be timed on the same values in the same process).
 *
 *   sab_fma_peak   fp32 FMA GFLOP/s on every thread: 12 register-resident chains per thread (enough for
 *                  4-cycle latency on 2 pipes) at the SIMD level the backend dispatches to
 *   sab_amx_peak   bf16 tile-product GFLOP/s (TDPBF16PS into 4 accumulator tiles), compute-only and with
 *                  a tile load per product; -1 without AMX-BF16 or the OS's tile state
 *   sab_read_bw    GB/s of a threaded read of a large buffer (each thread its slice, 512-bit loads)
 *   sab_time       median seconds of sinkattn forward / forward+backward / decode calls on a problem
 *   sab_check      the largest error of a call's output (under this thread's forced plans) against the fp64
 *                  reference, relative to max |ref|
 * A benchmark, not a test: nothing here is part of the library.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu_plan.h"
#include "sa_internal.h"

static double sab_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double sab_cpu_now(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int sab_cmp(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

/* Runs fn(arg_i) on nt threads at once (the caller is thread 0); wall seconds. */
static double sab_threads(int nt, void *(*fn)(void *), void *args, size_t arg_size) {
  pthread_t tid[256];
  if (nt > 256) nt = 256;
  double t0 = sab_now();
  for (int t = 1; t < nt; t++) pthread_create(&tid[t], NULL, fn, (char *)args + (size_t)t * arg_size);
  fn(args);
  for (int t = 1; t < nt; t++) pthread_join(tid[t], NULL);
  return sab_now() - t0;
}

/* ---- fp32 FMA peak ------------------------------------------------------------------------------ */

#define SAB_FMA_ITERS 20000000L

/* 12 named accumulators: an array of them could live on the stack. */
#define SAB_FMA_BODY(T, SET1, FMA)                                                                              \
  T x = SET1(0.999999f), y = SET1(1e-7f), a0 = SET1(0), a1 = SET1(1), a2 = SET1(2), a3 = SET1(3), a4 = SET1(4), \
    a5 = SET1(5), a6 = SET1(6), a7 = SET1(7), a8 = SET1(8), a9 = SET1(9), a10 = SET1(10), a11 = SET1(11);       \
  for (long it = 0; it < iters; it++) {                                                                         \
    a0 = FMA(a0, x, y);                                                                                         \
    a1 = FMA(a1, x, y);                                                                                         \
    a2 = FMA(a2, x, y);                                                                                         \
    a3 = FMA(a3, x, y);                                                                                         \
    a4 = FMA(a4, x, y);                                                                                         \
    a5 = FMA(a5, x, y);                                                                                         \
    a6 = FMA(a6, x, y);                                                                                         \
    a7 = FMA(a7, x, y);                                                                                         \
    a8 = FMA(a8, x, y);                                                                                         \
    a9 = FMA(a9, x, y);                                                                                         \
    a10 = FMA(a10, x, y);                                                                                       \
    a11 = FMA(a11, x, y);                                                                                       \
  }                                                                                                             \
  T s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;

__attribute__((target("avx512f,fma"))) static float sab_fma512(long iters) {
  SAB_FMA_BODY(__m512, _mm512_set1_ps, _mm512_fmadd_ps)
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float sab_fma256(long iters) {
  SAB_FMA_BODY(__m256, _mm256_set1_ps, _mm256_fmadd_ps)
  float buf[8];
  _mm256_storeu_ps(buf, s);
  return buf[0] + buf[1] + buf[2] + buf[3] + buf[4] + buf[5] + buf[6] + buf[7];
}

/* The scalar kernels use a * b + c (fmaf is a libm call without -mfma): so does this loop. */
static float sab_set1(float v) { return v; }
static float sab_muladd(float a, float b, float c) { return a * b + c; }
static float sab_fma1(long iters) {
  SAB_FMA_BODY(float, sab_set1, sab_muladd)
  return s;
}

typedef struct {
  long iters;
  int width;
  volatile float sink;
  double cpu_s;
} sab_fma_arg;

static void *sab_fma_thread(void *p) {
  sab_fma_arg *a = (sab_fma_arg *)p;
  const double c0 = sab_cpu_now(CLOCK_THREAD_CPUTIME_ID);
  a->sink = a->width == 16 ? sab_fma512(a->iters) : a->width == 8 ? sab_fma256(a->iters) : sab_fma1(a->iters);
  a->cpu_s = sab_cpu_now(CLOCK_THREAD_CPUTIME_ID) - c0;
  return NULL;
}

/* Best GFLOP/s of reps runs by wall clock; *per_cpu (may be NULL): the best per CPU second x threads. */
SA_API double sab_fma_peak(int threads, int reps, double *per_cpu) {
  const sa_cpu_simd s = sa_cpu_record_get()->simd;
  const int width = s == SA_CPU_AVX512 ? 16 : s == SA_CPU_AVX2 ? 8 : 1;
  sab_fma_arg args[256];
  long iters = width == 1 ? SAB_FMA_ITERS / 8 : SAB_FMA_ITERS;
  if (threads > 256) threads = 256;
  for (int t = 0; t < threads; t++) args[t] = (sab_fma_arg){iters, width, 0.0f, 0.0};
  const double flops = 2.0 * 12 * width * (double)iters * threads;
  double best = 0, best_cpu = 0;
  for (int r = 0; r < reps; r++) {
    double gf = flops / sab_threads(threads, sab_fma_thread, args, sizeof args[0]) / 1e9, c = 0;
    for (int t = 0; t < threads; t++) c += args[t].cpu_s;
    if (gf > best) best = gf;
    if (flops / (c / threads) / 1e9 > best_cpu) best_cpu = flops / (c / threads) / 1e9;
  }
  if (per_cpu) *per_cpu = best_cpu;
  return best;
}

/* ---- AMX bf16 tile peak ------------------------------------------------------------------------ */

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SAB_HAVE_AMX 1
/* Palette 1: 8 tiles of 16 rows x 64 bytes (16 x 32 bf16 operands, 16 x 16 fp32 accumulators). */
typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((aligned(64))) sab_tilecfg;

typedef struct {
  long iters;
  int loads; /* 1: a tile load before every product (A from L1) */
  double sink;
} sab_amx_arg;

__attribute__((target("amx-tile,amx-bf16"))) static void *sab_amx_thread(void *p) {
  sab_amx_arg *a = (sab_amx_arg *)p;
  static const sab_tilecfg cfg0 = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
  sab_tilecfg cfg = cfg0;
  uint16_t ab[2][16 * 32] __attribute__((aligned(64)));
  float c[16 * 16] __attribute__((aligned(64)));
  for (int i = 0; i < 16 * 32; i++) ab[0][i] = ab[1][i] = 0x3c00; /* bf16 0.0078125: no overflow */
  __asm__ volatile("ldtilecfg %0" : : "m"(cfg)); /* the whole block as the operand: cpu_tile_isa.h says why */
  _tile_loadd(4, ab[0], 64);
  _tile_loadd(5, ab[1], 64);
  _tile_loadd(6, ab[0], 64);
  _tile_loadd(7, ab[1], 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (long it = 0; it < a->iters; it++) {
    if (a->loads) _tile_loadd(4, ab[it & 1], 64);
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 6, 5);
    _tile_dpbf16ps(3, 6, 7);
  }
  _tile_stored(0, c, 64);
  _tile_release();
  a->sink = c[0];
  return NULL;
}
#endif

/* GFLOP/s of 4 TDPBF16PS (16 x 16 x 32 each) per step on every thread; with_loads adds a tile load per step. */
SA_API double sab_amx_peak(int threads, int reps, int with_loads) {
  const sa_cpu_record *rec = sa_cpu_record_get();
  if (!rec->f.amx_bf16 || !rec->f.amx_os) return -1.0;
#ifdef SAB_HAVE_AMX
  sab_amx_arg args[256];
  const long iters = 2000000L;
  if (threads > 256) threads = 256;
  for (int t = 0; t < threads; t++) args[t] = (sab_amx_arg){iters, with_loads, 0.0};
  double best = 0;
  for (int r = 0; r < reps; r++) {
    double gf = 4.0 * 16 * 16 * 32 * 2 * (double)iters * threads /
                sab_threads(threads, sab_amx_thread, args, sizeof args[0]) / 1e9;
    if (gf > best) best = gf;
  }
  return best;
#else
  (void)threads;
  (void)reps;
  (void)with_loads;
  return -1.0;
#endif
}

/* ---- read bandwidth ---------------------------------------------------------------------------- */

typedef struct {
  const char *p;
  size_t n;
  int wide;
  volatile uint64_t sink;
  double cpu_s; /* this thread's CPU seconds */
} sab_read_arg;

__attribute__((target("avx512f"))) static uint64_t sab_read512(const char *p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 256 <= n; i += 256) {
    a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
    a1 = _mm512_xor_si512(a1, _mm512_load_si512(p + i + 64));
    a2 = _mm512_xor_si512(a2, _mm512_load_si512(p + i + 128));
    a3 = _mm512_xor_si512(a3, _mm512_load_si512(p + i + 192));
  }
  return (uint64_t)_mm512_reduce_or_epi64(_mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3)));
}

static uint64_t sab_read64(const char *p, size_t n) {
  const uint64_t *w = (const uint64_t *)(const void *)p;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t i = 0; i + 4 <= n / 8; i += 4) {
    s0 ^= w[i];
    s1 ^= w[i + 1];
    s2 ^= w[i + 2];
    s3 ^= w[i + 3];
  }
  return s0 ^ s1 ^ s2 ^ s3;
}

static void *sab_read_thread(void *p) {
  sab_read_arg *a = (sab_read_arg *)p;
  const double c0 = sab_cpu_now(CLOCK_THREAD_CPUTIME_ID);
  a->sink = a->wide ? sab_read512(a->p, a->n) : sab_read64(a->p, a->n);
  a->cpu_s = sab_cpu_now(CLOCK_THREAD_CPUTIME_ID) - c0;
  return NULL;
}

/* Median GB/s of reps threaded reads of bytes (each thread a contiguous slice), by wall clock; *per_cpu
   (may be NULL) gets the median bytes per CPU second x threads: what the cores read while they run, which
   other processes' load does not dilute. */
SA_API double sab_read_bw(int threads, double bytes, int reps, double *per_cpu) {
  size_t n = ((size_t)bytes + 4095) & ~(size_t)4095;
  char *buf = aligned_alloc(4096, n);
  if (!buf || threads < 1) return -1.0;
  memset(buf, 1, n);
  if (threads > 256) threads = 256;
  sab_read_arg args[256];
  size_t part = n / (size_t)threads & ~(size_t)255;
  int wide = sa_cpu_record_get()->simd == SA_CPU_AVX512;
  for (int t = 0; t < threads; t++) args[t] = (sab_read_arg){buf + (size_t)t * part, part, wide, 0, 0.0};
  double gbs[64], gcpu[64];
  if (reps > 64) reps = 64;
  if (reps < 1) reps = 1;
  sab_threads(threads, sab_read_thread, args, sizeof args[0]); /* warm-up */
  for (int r = 0; r < reps; r++) {
    gbs[r] = (double)part * threads / sab_threads(threads, sab_read_thread, args, sizeof args[0]) / 1e9;
    double c = 0;
    for (int t = 0; t < threads; t++) c += args[t].cpu_s;
    gcpu[r] = (double)part * threads / (c / threads) / 1e9;
  }
  free(buf);
  qsort(gbs, (size_t)reps, sizeof gbs[0], sab_cmp);
  qsort(gcpu, (size_t)reps, sizeof gcpu[0], sab_cmp);
  if (per_cpu) *per_cpu = gcpu[reps / 2];
  return gbs[reps / 2];
}

/* ---- sinkattn calls ---------------------------------------------------------------------------- */

/* The driver's problem (bench/cpu_bench.py mirrors it): [B,T,N,H] q / out / dout, [B,S,K,H] k / v,
   learnable sinks [N]; causal 0 none, 1 top-left, 2 bottom-right; window_left -1 for none. */
typedef struct {
  int64_t dtype, B, T, S, N, K, H, causal, window_left;
  void *q, *k, *v, *out, *dout, *dq, *dk, *dv;
  float *lse, *sinks, *dsinks;
} sab_problem;

static void sab_attn_of(const sab_problem *p, sa_attn *a, sa_attn_grad *g) {
  sa_attn_init(a);
  a->dtype = (sa_dtype)p->dtype;
  a->batch = p->B;
  a->q_len = p->T;
  a->kv_len = p->S;
  a->q_heads = p->N;
  a->kv_heads = p->K;
  a->head_dim = p->H;
  a->v_head_dim = p->H;
  a->q = p->q;
  a->k = p->k;
  a->v = p->v;
  a->out = p->out;
  a->lse = p->lse;
  a->softmax = SA_SOFTMAX_LEARNABLE;
  a->sinks = p->sinks;
  a->causal = (sa_causal)p->causal;
  if (p->window_left >= 0) {
    a->window_left = p->window_left;
    a->window_right = 0;
  }
  memset(g, 0, sizeof *g);
  g->dout = p->dout;
  g->dq = p->dq;
  g->dk = p->dk;
  g->dv = p->dv;
  g->dsinks = p->dsinks;
}

/* kind 0 forward, 1 forward + backward, 2 decode */
static sa_status sab_call(const sa_attn *a, const sa_attn_grad *g, int kind, void *ws, size_t wss, sa_backend be) {
  if (kind == 2) return sa_attn_decode_fwd(a, ws, wss, be, NULL);
  sa_status s = sa_attn_fwd(a, be, NULL);
  if (s == SA_OK && kind == 1) s = sa_attn_bwd(a, g, ws, wss, be, NULL);
  return s;
}

/* Median seconds of `calls` calls on `threads` threads (after one untimed call); -1 and *status on failure.
   *cpu_s gets the median process CPU seconds of a call divided by threads (the call's time had its threads
   run undisturbed), *plan the description of the plan that ran (up to 256 bytes). */
SA_API double sab_time(const sab_problem *p, int kind, int calls, int threads, int *status, char *plan, double *cpu_s) {
  sa_attn a;
  sa_attn_grad g;
  sab_attn_of(p, &a, &g);
  sa_cpu_set_num_threads(threads);
  size_t wss = kind == 2   ? sa_attn_decode_workspace_size(&a, SA_BACKEND_CPU)
               : kind == 1 ? sa_attn_bwd_workspace_size(&a, SA_BACKEND_CPU)
                           : 0;
  void *ws = wss ? malloc(wss) : NULL;
  double t[256], ct[256];
  if (calls > 256) calls = 256;
  if (calls < 1) calls = 1;
  sa_status s = SA_OK;
  for (int c = -1; c < calls && s == SA_OK; c++) {
    double t0 = sab_now(), c0 = sab_cpu_now(CLOCK_PROCESS_CPUTIME_ID);
    s = sab_call(&a, &g, kind, ws, wss, SA_BACKEND_CPU);
    if (c >= 0) {
      t[c] = sab_now() - t0;
      ct[c] = (sab_cpu_now(CLOCK_PROCESS_CPUTIME_ID) - c0) / threads;
    }
  }
  free(ws);
  *status = (int)s;
  if (plan) snprintf(plan, 256, "%s", sa_plan_last(kind == 2 ? SA_PLAN_DECODE : kind));
  if (s != SA_OK) return -1.0;
  qsort(t, (size_t)calls, sizeof t[0], sab_cmp);
  qsort(ct, (size_t)calls, sizeof ct[0], sab_cmp);
  if (cpu_s) *cpu_s = ct[calls / 2];
  return t[calls / 2];
}

/* The call's out against the fp64 reference on the same inputs: max |out - ref| / max |ref|; -1 when a call
   fails. The reference output goes to ref_out (the driver's buffer of out's size). */
SA_API double sab_check(const sab_problem *p, int kind, void *ref_out) {
  sa_attn a;
  sa_attn_grad g;
  sab_attn_of(p, &a, &g);
  size_t wss = kind == 2 ? sa_attn_decode_workspace_size(&a, SA_BACKEND_CPU) : 0;
  void *ws = wss ? malloc(wss) : NULL;
  sa_status s =
      kind == 2 ? sa_attn_decode_fwd(&a, ws, wss, SA_BACKEND_CPU, NULL) : sa_attn_fwd(&a, SA_BACKEND_CPU, NULL);
  free(ws);
  a.out = ref_out;
  /* the reference runs under no forced plan (a CPU plan forced for this thread refuses a REF call) */
  const char *forced[3];
  for (int w = 0; w < 3; w++) {
    forced[w] = sa_plan_forced(w);
    sa_plan_force(w, NULL);
  }
  sa_status rs = sa_attn_fwd(&a, SA_BACKEND_REF, NULL);
  for (int w = 0; w < 3; w++) sa_plan_force(w, forced[w]);
  if (s != SA_OK || rs != SA_OK) return -1.0;
  const int64_t n = p->B * p->T * p->N * p->H;
  double e = 0, m = 1e-30;
  for (int64_t i = 0; i < n; i++) {
    double x = sa_load(p->out, a.dtype, i), r = sa_load(ref_out, a.dtype, i);
    if (isnan(x)) return INFINITY;
    e = fmax(e, fabs(x - r));
    m = fmax(m, fabs(r));
  }
  return e / m;
}

/* One line about the build and the CPU: the dispatch level, AVX512-BF16 / AMX, the compiler. */
SA_API const char *sab_info(void) {
  static char buf[512];
  const sa_cpu_record *r = sa_cpu_record_get();
#ifdef __clang__
  const char *cc = "clang " __clang_version__;
#else
  const char *cc = "gcc " __VERSION__;
#endif
  snprintf(buf, sizeof buf,
           "{\"simd\": \"%s\", \"avx512_bf16\": %d, \"amx_bf16\": %d, \"amx_fp16\": %d, "
           "\"amx_os\": %d, \"compiler\": \"%s\", \"sinkattn\": \"%s\"}",
           sa_cpu_simd_name(), r->f.avx512_bf16, r->f.amx_bf16, r->f.amx_fp16, r->f.amx_os, cc,
           SINKATTN_VERSION_STRING);
  return buf;
}
