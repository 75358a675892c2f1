/*
 * cpu_bench.c — throughput of the CPU backend against this machine's own FMA peak (a benchmark, not a test).
 *
 *   cpu_bench [out.json] [--quick]      default out: bench/results/cpu-<date>.json (relative to the cwd)
 *
 * 1. Peak: every thread runs a register-resident FMA loop (12 independent accumulators, enough to cover
 *    4-cycle latency on 2 pipes) at the SIMD level the backend dispatched to, before and after the grid;
 *    the sum over threads is the fp32 FMA peak in GFLOP/s, by wall clock and per CPU second x threads.
 *    Percentages use the larger: on a shared machine the per-CPU figure is what the cores can do.
 * 2. Grid: f32, B = 1, N = K = 8 (one kv head per query head), learnable sinks, T = S in {512, 2048, 8192},
 *    H = Hv in {64, 128}, causal TOP_LEFT or none. Forward and forward+backward of SA_BACKEND_CPU on all
 *    threads; the fp64 reference only at T = 512 (it is ~30x slower); T = 8192 forward only, one timed call.
 *    FLOPs: fwd = 4 B N T S H (x 0.5 causal), fwd+bwd = 3.5 x fwd. Time: median wall clock of the timed
 *    calls after one warm-up call; also the median process CPU time, which load from other processes does
 *    not inflate (GFLOP per CPU second x threads, against the per-CPU peak).
 * 3. Memory: each configuration runs in a forked child that allocates and touches its buffers first; the
 *    growth of getrusage's maxrss over the calls is the backend's extra memory (scratch, threads, D).
 * --quick runs only T = 2048, H = 128 (for tuning).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, popen, fork under -std=c11 */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sinkattn.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- FMA peak -------------------------------------------------------------------------------- */

#define PEAK_ITERS 20000000L
#define PEAK_ACC 12

/* 12 named accumulators: at -O2 an array of them would live on the stack. */
#define PEAK_BODY(T, SET1, FMA)                                                                   \
  T x = SET1(0.999999f), y = SET1(1e-7f), a0 = SET1(0), a1 = SET1(1), a2 = SET1(2), a3 = SET1(3),   \
    a4 = SET1(4), a5 = SET1(5), a6 = SET1(6), a7 = SET1(7), a8 = SET1(8), a9 = SET1(9), a10 = SET1(10), \
    a11 = SET1(11);                                                                                \
  for (long it = 0; it < iters; it++) {                                                            \
    a0 = FMA(a0, x, y); a1 = FMA(a1, x, y); a2 = FMA(a2, x, y); a3 = FMA(a3, x, y);                 \
    a4 = FMA(a4, x, y); a5 = FMA(a5, x, y); a6 = FMA(a6, x, y); a7 = FMA(a7, x, y);                 \
    a8 = FMA(a8, x, y); a9 = FMA(a9, x, y); a10 = FMA(a10, x, y); a11 = FMA(a11, x, y);             \
  }                                                                                                \
  T s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;

__attribute__((target("avx512f,fma"))) static float peak_avx512(long iters) {
  PEAK_BODY(__m512, _mm512_set1_ps, _mm512_fmadd_ps)
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float peak_avx2(long iters) {
  PEAK_BODY(__m256, _mm256_set1_ps, _mm256_fmadd_ps)
  float buf[8];
  _mm256_storeu_ps(buf, s);
  return buf[0] + buf[1] + buf[2] + buf[3] + buf[4] + buf[5] + buf[6] + buf[7];
}

/* The scalar kernels use a * b + c (fmaf is a libm call without -mfma): the peak loop does the same. */
static float peak_set1(float v) { return v; }
static float peak_muladd(float a, float b, float c) { return a * b + c; }
static float peak_scalar(long iters) {
  PEAK_BODY(float, peak_set1, peak_muladd)
  return s;
}

static int simd_width(void) {
  const char *s = sa_cpu_simd_name();
  return strcmp(s, "avx512") == 0 ? 16 : strcmp(s, "avx2") == 0 ? 8 : 1;
}

static double cpu_s(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
  long iters;
  double cpu_s;
  volatile float sink;
} peak_arg;

static void *peak_thread(void *arg) {
  peak_arg *p = (peak_arg *)arg;
  int w = simd_width();
  double c0 = cpu_s(CLOCK_THREAD_CPUTIME_ID);
  p->sink = w == 16 ? peak_avx512(p->iters) : w == 8 ? peak_avx2(p->iters) : peak_scalar(p->iters);
  p->cpu_s = cpu_s(CLOCK_THREAD_CPUTIME_ID) - c0;
  return NULL;
}

/* GFLOP/s of nt threads each running the FMA loop at once (best of reps ~70 ms runs): by wall clock, and
   per second of CPU time x nt (what the cores give when the machine is shared: the load-independent peak).
   main measures it before and after the grid and keeps the larger: one quiet moment is enough. */
static double measure_peak(int nt, int reps, double *per_cpu) {
  long iters = simd_width() == 1 ? PEAK_ITERS / 8 : PEAK_ITERS;
  double best = 0, flops = 2.0 * PEAK_ACC * simd_width() * (double)iters;
  pthread_t *tid = malloc((size_t)nt * sizeof *tid);
  peak_arg *arg = calloc((size_t)nt, sizeof *arg);
  *per_cpu = 0;
  for (int rep = 0; rep < reps; rep++) {
    double t0 = now_s(), c = 0;
    for (int t = 0; t < nt; t++) {
      arg[t].iters = iters;
      pthread_create(&tid[t], NULL, peak_thread, &arg[t]);
    }
    for (int t = 0; t < nt; t++) pthread_join(tid[t], NULL);
    double gf = flops * nt / (now_s() - t0) / 1e9;
    for (int t = 0; t < nt; t++) c += arg[t].cpu_s;
    if (gf > best) best = gf;
    if (flops * nt / c * nt / 1e9 > *per_cpu) *per_cpu = flops * nt / c * nt / 1e9;
  }
  free(tid);
  free(arg);
  return best;
}

/* ---- one configuration ------------------------------------------------------------------------ */

typedef struct {
  int T, H, causal;
  double fwd_ms, fwdbwd_ms, ref_fwd_ms, ref_fwdbwd_ms; /* < 0: not run */
  double fwd_gflops, fwdbwd_gflops, ref_fwd_gflops, ref_fwdbwd_gflops;
  double fwd_cpu_gflops, fwdbwd_cpu_gflops; /* flops per CPU second x threads: load-independent */
  double extra_mib; /* maxrss growth over the calls */
  int status;       /* sa_status of the first failing call, else 0 */
} bench_row;

static long maxrss_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

static float *rand_buf(size_t n, unsigned *seed) {
  float *p = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) {
    *seed = *seed * 1664525u + 1013904223u;
    p[i] = (float)((*seed >> 8) & 0xffff) / 32768.0f - 1.0f;
  }
  return p;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

/* Median milliseconds of the timed calls (warm-up first); reps adapt so a size takes ~1 s. *cpu_ms: the
   median process CPU time of a call (ms), which a busy machine does not inflate. */
static double time_calls(sa_attn *a, sa_attn_grad *g, void *ws, size_t wss, sa_backend be, int max_reps, int *st,
                         double *cpu_ms) {
  double t[16], c[16];
  int n = 0;
  double total = 0;
  for (int r = -1; r < max_reps && r < 16; r++) {
    double t0 = now_s(), c0 = cpu_s(CLOCK_PROCESS_CPUTIME_ID);
    sa_status s = sa_attn_fwd(a, be, NULL);
    if (s == SA_OK && g) s = sa_attn_bwd(a, g, ws, wss, be, NULL);
    double dt = now_s() - t0, dc = cpu_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    if (s != SA_OK) {
      *st = (int)s;
      return -1;
    }
    if (r >= 0) {
      c[n] = dc;
      t[n++] = dt;
      total += dt;
      if (total > 1.0 && n >= 2) break;
    } else if (dt > 2.0) {
      c[n] = dc;
      t[n++] = dt; /* a slow size: the warm-up call is the measurement */
      break;
    }
  }
  qsort(t, (size_t)n, sizeof t[0], cmp_double);
  qsort(c, (size_t)n, sizeof c[0], cmp_double);
  *cpu_ms = 1e3 * c[n / 2];
  return 1e3 * t[n / 2];
}

static void run_config(bench_row *row) {
  const int B = 1, N = 8, K = 8, T = row->T, S = row->T, H = row->H;
  unsigned seed = 12345u;
  size_t nq = (size_t)B * T * N * H, nk = (size_t)B * S * K * H, no = (size_t)B * T * N * H;
  float *q = rand_buf(nq, &seed), *k = rand_buf(nk, &seed), *v = rand_buf(nk, &seed), *dout = rand_buf(no, &seed);
  float *out = rand_buf(no, &seed), *lse = rand_buf((size_t)B * N * T, &seed);
  float *dq = rand_buf(nq, &seed), *dk = rand_buf(nk, &seed), *dv = rand_buf(nk, &seed);
  float sinks[8], dsinks[8];
  for (int n = 0; n < N; n++) sinks[n] = (float)(n - 4);
  sa_attn a;
  sa_attn_init(&a);
  a.dtype = SA_F32;
  a.batch = B; a.q_len = T; a.kv_len = S; a.q_heads = N; a.kv_heads = K; a.head_dim = H; a.v_head_dim = H;
  a.q = q; a.k = k; a.v = v; a.out = out; a.lse = lse;
  a.softmax = SA_SOFTMAX_LEARNABLE; a.sinks = sinks;
  a.causal = row->causal ? SA_CAUSAL_TOP_LEFT : SA_CAUSAL_NONE;
  sa_attn_grad g = {0};
  g.dout = dout; g.dq = dq; g.dk = dk; g.dv = dv; g.dsinks = dsinks;
  size_t wss = sa_attn_bwd_workspace_size(&a, SA_BACKEND_CPU);
  void *ws = wss ? malloc(wss) : NULL;
  if (ws) memset(ws, 0, wss);

  double fl = 4.0 * B * N * (double)T * S * H * (row->causal ? 0.5 : 1.0);
  long rss0 = maxrss_kib();
  int big = T >= 8192;
  double cf = -1, cb = -1, unused, nt = sa_cpu_get_num_threads();
  row->fwd_ms = time_calls(&a, NULL, NULL, 0, SA_BACKEND_CPU, big ? 1 : 16, &row->status, &cf);
  row->fwdbwd_ms = big ? -1 : time_calls(&a, &g, ws, wss, SA_BACKEND_CPU, 16, &row->status, &cb);
  row->extra_mib = (double)(maxrss_kib() - rss0) / 1024.0;
  row->ref_fwd_ms = row->ref_fwdbwd_ms = -1;
  if (T <= 512) {
    row->ref_fwd_ms = time_calls(&a, NULL, NULL, 0, SA_BACKEND_REF, 2, &row->status, &unused);
    row->ref_fwdbwd_ms = time_calls(&a, &g, NULL, 0, SA_BACKEND_REF, 2, &row->status, &unused);
  }
  row->fwd_gflops = row->fwd_ms > 0 ? fl / row->fwd_ms / 1e6 : -1;
  row->fwdbwd_gflops = row->fwdbwd_ms > 0 ? 3.5 * fl / row->fwdbwd_ms / 1e6 : -1;
  row->fwd_cpu_gflops = cf > 0 ? fl / (cf / nt) / 1e6 : -1;
  row->fwdbwd_cpu_gflops = cb > 0 ? 3.5 * fl / (cb / nt) / 1e6 : -1;
  row->ref_fwd_gflops = row->ref_fwd_ms > 0 ? fl / row->ref_fwd_ms / 1e6 : -1;
  row->ref_fwdbwd_gflops = row->ref_fwdbwd_ms > 0 ? 3.5 * fl / row->ref_fwdbwd_ms / 1e6 : -1;
  free(q); free(k); free(v); free(dout); free(out); free(lse); free(dq); free(dk); free(dv); free(ws);
}

/* Each configuration in its own child process, so that maxrss starts from that configuration's buffers. */
static void run_isolated(bench_row *row) {
  int fd[2];
  if (pipe(fd) != 0) {
    run_config(row);
    return;
  }
  pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    run_config(row);
    ssize_t w = write(fd[1], row, sizeof *row);
    _exit(w == (ssize_t)sizeof *row ? 0 : 1);
  }
  close(fd[1]);
  ssize_t r = pid > 0 ? read(fd[0], row, sizeof *row) : -1;
  close(fd[0]);
  if (pid > 0) waitpid(pid, NULL, 0);
  if (r != (ssize_t)sizeof *row) row->status = -1;
}

/* ---- report ---------------------------------------------------------------------------------- */

static void read_first_line(const char *cmd_or_file, int is_cmd, const char *prefix, char *dst, size_t n) {
  snprintf(dst, n, "unknown");
  FILE *f = is_cmd ? popen(cmd_or_file, "r") : fopen(cmd_or_file, "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (prefix && strncmp(line, prefix, strlen(prefix)) != 0) continue;
    char *s = prefix ? strchr(line, ':') : line;
    if (!s) continue;
    s += prefix ? 1 : 0;
    while (*s == ' ' || *s == '\t') s++;
    s[strcspn(s, "\n")] = 0;
    snprintf(dst, n, "%s", s);
    break;
  }
  if (is_cmd) pclose(f);
  else fclose(f);
}

static void json_num(FILE *f, const char *key, double x, const char *sep) {
  if (x < 0) fprintf(f, "\"%s\": null%s", key, sep);
  else fprintf(f, "\"%s\": %.4g%s", key, x, sep);
}

int main(int argc, char **argv) {
  const char *path = NULL;
  int quick = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) quick = 1;
    else path = argv[i];
  }
  char defpath[128], date[32], commit[64], cpu[256], load0[128], load1[128];
  time_t tnow = time(NULL);
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", localtime(&tnow));
  strftime(defpath, sizeof defpath, "bench/results/cpu-%Y%m%d-%H%M.json", localtime(&tnow));
  if (!path) path = defpath;
  read_first_line("git rev-parse --short HEAD 2>/dev/null", 1, NULL, commit, sizeof commit);
  read_first_line("/proc/cpuinfo", 0, "model name", cpu, sizeof cpu);
  read_first_line("/proc/loadavg", 0, NULL, load0, sizeof load0);
  int nt = sa_cpu_get_num_threads();
  const char *simd = sa_cpu_simd_name();

  double peak_cpu, peak = measure_peak(nt, 10, &peak_cpu);
  printf("cpu_bench: %s, %d threads, SIMD %s, commit %s, load %s\n", cpu, nt, simd, commit, load0);
  printf("FMA peak (fp32, %d threads, %s): %.1f GFLOP/s by wall clock, %.1f per CPU second x threads\n", nt,
         simd, peak, peak_cpu);

  int Ts[3] = {512, 2048, 8192}, Hs[2] = {64, 128};
  bench_row rows[12];
  int nr = 0;
  for (int ti = 0; ti < 3; ti++)
    for (int hi = 0; hi < 2; hi++)
      for (int c = 0; c < 2; c++) {
        if (quick && (Ts[ti] != 2048 || Hs[hi] != 128)) continue;
        bench_row *r = &rows[nr++];
        memset(r, 0, sizeof *r);
        r->T = Ts[ti]; r->H = Hs[hi]; r->causal = c;
        run_isolated(r);
        printf("T=%d H=%d causal=%d: fwd %.1f ms, fwd+bwd %.1f ms%s\n", r->T, r->H, c, r->fwd_ms, r->fwdbwd_ms,
               r->status ? " FAILED" : "");
        fflush(stdout);
      }
  read_first_line("/proc/loadavg", 0, NULL, load1, sizeof load1);
  double peak_cpu2, peak2 = measure_peak(nt, 10, &peak_cpu2);
  printf("FMA peak again after the grid: %.1f GFLOP/s by wall clock, %.1f per CPU second x threads\n", peak2,
         peak_cpu2);
  if (peak2 > peak) peak = peak2;
  if (peak_cpu2 > peak_cpu) peak_cpu = peak_cpu2;
  /* On a shared machine the wall-clock loop sees less than the cores can do; the cores' rate (per CPU
     second) is the honest denominator then, and makes the wall-clock percentages conservative. */
  double peak_wall = peak;
  if (peak_cpu > peak) peak = peak_cpu;

  printf("\nf32, B=1, N=K=8, learnable sinks; GFLOP/s by wall clock (%% of the FMA peak %.1f, the larger of the\n"
         "wall-clock %.1f and per-CPU-second %.1f loops); last column: %% of the per-CPU-second peak by CPU\n"
         "time, which load from other processes does not inflate\n", peak, peak_wall, peak_cpu);
  printf("%6s %4s %6s | %16s %16s | %9s %9s | %8s | %s\n", "T=S", "H", "causal", "fwd", "fwd+bwd", "ref fwd",
         "ref f+b", "extraMiB", "by CPU time fwd, f+b");
  for (int i = 0; i < nr; i++) {
    const bench_row *r = &rows[i];
    if (r->status) {
      printf("%6d %4d %6s | failed (status %d)\n", r->T, r->H, r->causal ? "yes" : "no", r->status);
      continue;
    }
    printf("%6d %4d %6s | %7.1f (%5.1f%%) ", r->T, r->H, r->causal ? "yes" : "no", r->fwd_gflops,
           100 * r->fwd_gflops / peak);
    if (r->fwdbwd_gflops > 0) printf("%7.1f (%5.1f%%) | ", r->fwdbwd_gflops, 100 * r->fwdbwd_gflops / peak);
    else printf("%16s | ", "-");
    if (r->ref_fwd_gflops > 0) printf("%9.2f %9.2f | ", r->ref_fwd_gflops, r->ref_fwdbwd_gflops);
    else printf("%9s %9s | ", "-", "-");
    printf("%8.1f | %3.0f%%", r->extra_mib, 100 * r->fwd_cpu_gflops / peak_cpu);
    if (r->fwdbwd_cpu_gflops > 0) printf(", %3.0f%%", 100 * r->fwdbwd_cpu_gflops / peak_cpu);
    printf("\n");
  }

  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "cpu_bench: cannot write %s\n", path);
    return 1;
  }
  fprintf(f, "{\n  \"benchmark\": \"cpu_bench\",\n  \"date\": \"%s\",\n  \"git_commit\": \"%s\",\n", date, commit);
#ifdef __clang__
  const char *cc = __VERSION__;
#else
  const char *cc = "gcc " __VERSION__;
#endif
  fprintf(f, "  \"cpu\": \"%s\",\n  \"threads\": %d,\n  \"simd\": \"%s\",\n  \"compiler\": \"%s\",\n", cpu, nt, simd, cc);
  fprintf(f, "  \"loadavg_start\": \"%s\",\n  \"loadavg_end\": \"%s\",\n", load0, load1);
  fprintf(f, "  \"fma_peak_gflops\": %.2f,\n  \"fma_peak_gflops_wall\": %.2f,\n  \"fma_peak_gflops_cpu_time\": %.2f,\n",
          peak, peak_wall, peak_cpu);
  fprintf(f, "  \"problem\": \"f32, B=1, N=K=8, Hv=H, learnable sinks; fwd flops 4BNTSH (x0.5 causal), fwd+bwd 3.5x\",\n");
  fprintf(f, "  \"rows\": [\n");
  for (int i = 0; i < nr; i++) {
    bench_row *r = &rows[i];
    fprintf(f, "    {\"T\": %d, \"S\": %d, \"H\": %d, \"causal\": %s, \"status\": %d, ", r->T, r->T, r->H,
            r->causal ? "true" : "false", r->status);
    json_num(f, "fwd_ms", r->fwd_ms, ", ");
    json_num(f, "fwd_gflops", r->fwd_gflops, ", ");
    json_num(f, "fwd_peak_frac", r->fwd_gflops > 0 ? r->fwd_gflops / peak : -1, ", ");
    json_num(f, "fwdbwd_ms", r->fwdbwd_ms, ", ");
    json_num(f, "fwdbwd_gflops", r->fwdbwd_gflops, ", ");
    json_num(f, "fwdbwd_peak_frac", r->fwdbwd_gflops > 0 ? r->fwdbwd_gflops / peak : -1, ", ");
    json_num(f, "fwd_gflops_cpu_time", r->fwd_cpu_gflops, ", ");
    json_num(f, "fwdbwd_gflops_cpu_time", r->fwdbwd_cpu_gflops, ", ");
    json_num(f, "ref_fwd_gflops", r->ref_fwd_gflops, ", ");
    json_num(f, "ref_fwdbwd_gflops", r->ref_fwdbwd_gflops, ", ");
    json_num(f, "extra_mib", r->extra_mib, "}");
    fprintf(f, "%s\n", i + 1 < nr ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  fclose(f);
  printf("wrote %s (load at end %s)\n", path, load1);
  return 0;
}
