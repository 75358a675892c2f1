/*
 * cpu_decode.c — CPU split-KV decode: a few query tokens (Tq <= 64) against a long KV cache.
 *
 * Work items (b, chunk) run on threads and write vanilla partials (cpu_decode.h); the combine then
 * merges each row's chunks in chunk order in fp32 and adds the sink once:
 *     lse = logaddexp(lse_0, ..., lse_{C-1}, a_n),   out = sum_c exp(lse_c - lse) * out_c.
 * The chunk length depends on the shape only (never on the thread count), so the result is bitwise the
 * same for every thread count. Partials live in the caller's workspace when it is large enough, else in
 * a malloc'd buffer.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <pthread.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

#define SA_DECODE_PARTIAL sa_cpu_decode_partial_generic
#include "cpu_decode_kernel.h"

/* Chunk = 16 * clamp(R, 32, 256) keys: at R = 8 rows (gpt-oss G = 8, one token) 512 keys, so the
   partials (R * (Hv + 1) floats per chunk) are ~1.6% of the cache bytes the chunk reads (bf16, H = Hv),
   and a 4k cache still gives 8 chunks per kv head to spread over threads. Larger R grows the chunk so
   the partials stay under ~6% of the traffic. */
static void sa_cpu_decode_plan_make(const sa_attn *a, sa_decode_plan *p) {
  p->a = a;
  p->group = a->q_heads / a->kv_heads;
  p->rows = p->group * a->q_len;
  int64_t r = p->rows < 32 ? 32 : p->rows > 256 ? 256 : p->rows;
  p->chunk = SA_DECODE_TILE * r;
  /* At least 8 work items (batch x chunks) while chunks stay >= 256 keys (shape only, like the rule above):
     many rows (T = 64 tokens x G = 4: a 4096-key chunk) made a B = 1, 4k cache one item, one thread's work,
     and decode took 6.7 ms against 3.4 for sa_attn_fwd on 2 cores (N/K 8/2, H 64, f32). Splitting whatever
     the batch instead made B = 8 slower (44 -> 60 ms at T = 32, N/K 64/8, S 2k): 256 rows of partials per
     256-key chunk are as many bytes as the chunk's cache. */
  const int64_t want = a->batch >= 8 ? 1 : (8 + a->batch - 1) / (a->batch > 0 ? a->batch : 1);
  int64_t part = ((a->kv_len + want - 1) / want + 31) / 32 * 32;
  if (part < 256) part = 256;
  if (part < p->chunk) p->chunk = part;
  p->splits = a->kv_len > 0 ? (a->kv_len + p->chunk - 1) / p->chunk : 1;
  p->qscale = sa_scale_of(a) * 1.4426950408889634f;
  p->bf16_dot = 0;
}

int64_t sa_cpu_decode_scratch_floats(const sa_decode_plan *p) {
  const int64_t H = p->a->head_dim, Hv = p->a->v_head_dim, R = p->rows;
  const int64_t K = p->a->kv_heads;
  /* per kv head Qs, acc, m, l; then Kt [Hpad][32] (the AVX-512 kernel's 32-key tiles; the portable one uses
     [H][16] of it) and Vf [16][Hvpad], row (+1 pad), and 2R int64 ranges = 4R floats */
  const int64_t Hp = (H + 15) & ~(int64_t)15, Hvp = (Hv + 15) & ~(int64_t)15;
  return K * (R * H + R * Hv + 2 * R) + Hp * SA_DECODE_TILE_WIDE + SA_DECODE_TILE * Hvp + (H > Hv ? H : Hv) + 1 + 4 * R;
}

/* Floats of partials: out [items][R][Hv] then lse [items][R]; 0 when the count would not fit. */
static int64_t sa_cpu_decode_partial_floats(const sa_decode_plan *p) {
  const sa_attn *a = p->a;
  double n = (double)a->batch * (double)a->kv_heads * (double)p->splits * (double)p->rows *
             (double)(a->v_head_dim + 1);
  if (n > 4.0e18 / 4.0) return 0;
  return a->batch * a->kv_heads * p->splits * p->rows * (a->v_head_dim + 1);
}

sa_status sa_cpu_decode_supported(const sa_attn *a) {
  if (a->q_segment_ids)
    return sa_error(SA_ERR_UNSUPPORTED, "q_segment_ids/kv_segment_ids unsupported by the CPU decode "
                    "backend: use SA_BACKEND_REF (or sa_attn_fwd) for packed sequences");
  return SA_OK;
}

size_t sa_cpu_decode_workspace_size(const sa_attn *a) {
  sa_decode_plan p;
  sa_cpu_decode_plan_make(a, &p);
  return (size_t)sa_cpu_decode_partial_floats(&p) * sizeof(float);
}

/* ---- threads ------------------------------------------------------------------------------------ */

typedef struct sa_decode_job {
  const sa_decode_plan *p;
  sa_decode_partial_fn partial;
  float *part_out, *part_lse, *scratch;
  int64_t scratch_floats, items;
  int combine;          /* 0: partial items (b, kh, c); 1: combine items (b, kh) */
  atomic_llong next;
} sa_decode_job;

typedef struct sa_decode_worker {
  sa_decode_job *job;
  int index;
} sa_decode_worker;

static void sa_cpu_decode_combine(const sa_decode_plan *p, int64_t bk, float *part_out,
                                  const float *part_lse) {
  const sa_attn *a = p->a;
  const int64_t R = p->rows, G = p->group, Hv = a->v_head_dim, C = p->splits, N = a->q_heads, T = a->q_len;
  const int64_t b = bk / a->kv_heads, kh = bk % a->kv_heads;
  float *po = part_out + bk * C * R * Hv;
  const float *pl = part_lse + bk * C * R;
  for (int64_t r = 0; r < R; r++) {
    int64_t t = r / G, n = kh * G + r % G;
    int64_t obase = ((b * T + t) * N + n) * Hv;
    float sink = sa_sink_logit(a, n), mx = sink;
    for (int64_t c = 0; c < C; c++) mx = pl[c * R + r] > mx ? pl[c * R + r] : mx;
    if (mx == -INFINITY) {  /* vanilla row with no valid key */
      for (int64_t d = 0; d < Hv; d++) sa_store(a->out, a->dtype, obase + d, 0.0f);
      if (a->lse) a->lse[(b * N + n) * T + t] = -INFINITY;
      continue;
    }
    float sum = expf(sink - mx);
    for (int64_t c = 0; c < C; c++) sum += expf(pl[c * R + r] - mx);
    float lse = mx + logf(sum), inv = 1.0f / sum;
    /* the row's partials are read by this item only, so chunk 0's slot accumulates in place */
    float *acc = po + r * Hv;
    float w0 = expf(pl[r] - mx) * inv;
    for (int64_t d = 0; d < Hv; d++) acc[d] *= w0;
    for (int64_t c = 1; c < C; c++) {
      const float w = expf(pl[c * R + r] - mx) * inv, *o = po + (c * R + r) * Hv;
      for (int64_t d = 0; d < Hv; d++) acc[d] = SA_DEC_FMA(w, o[d], acc[d]);
    }
    for (int64_t d = 0; d < Hv; d++) sa_store(a->out, a->dtype, obase + d, acc[d]);
    if (a->lse) a->lse[(b * N + n) * T + t] = lse;
  }
}

static void *sa_cpu_decode_run(void *arg) {
  sa_decode_worker *w = (sa_decode_worker *)arg;
  sa_decode_job *j = w->job;
  const sa_decode_plan *p = j->p;
  float *scratch = j->scratch + (int64_t)w->index * j->scratch_floats;
  for (;;) {
    int64_t i = (int64_t)atomic_fetch_add(&j->next, 1);
    if (i >= j->items) break;
    if (j->combine) {
      sa_cpu_decode_combine(p, i, j->part_out, j->part_lse);
    } else {
      j->partial(p, i / p->splits, i % p->splits, scratch, j->part_out, j->part_lse);
    }
  }
  return NULL;
}

/* Runs job->items items on up to nthreads threads (the caller's thread is one of them). If a thread
   cannot be created the others take its items: the result does not depend on how many ran. */
static void sa_cpu_decode_parallel(sa_decode_job *job, int nthreads) {
  pthread_t tid[64];
  sa_decode_worker w[64];
  int started = 0;
  atomic_store(&job->next, 0);
  for (int i = 1; i < nthreads; i++) {
    w[i].job = job;
    w[i].index = i;
    if (pthread_create(&tid[i], NULL, sa_cpu_decode_run, &w[i]) != 0) break;
    started = i;
  }
  w[0].job = job;
  w[0].index = 0;
  sa_cpu_decode_run(&w[0]);
  for (int i = 1; i <= started; i++) pthread_join(tid[i], NULL);
}

/* AVX-512 when CPUID has it, unless SINKATTN_SIMD (the CPU backend's switch, read at each call so a
   test can compare both kernels in one process) asks for "avx2" or "scalar": both get the portable one. */
static int sa_cpu_decode_use_avx512(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  const char *env = getenv("SINKATTN_SIMD");
  if (env && (strcmp(env, "scalar") == 0 || strcmp(env, "avx2") == 0)) return 0;
  __builtin_cpu_init();
  /* No "f16c" test: clang 14 (the fuzz build) rejects that feature string, and every AVX-512 CPU has F16C. */
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("fma");
#else
  return 0;
#endif
}

/* AVX512-BF16 (vdpbf16ps) from CPUID leaf 7 sub-leaf 1, EAX bit 5 (Zen 4, Cooper Lake, Sapphire Rapids);
   read directly because clang 14 (the fuzz build) has no "avx512bf16" for __builtin_cpu_supports. */
static int sa_cpu_decode_has_bf16_dot(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) return 0;
  return (eax >> 5) & 1u;
#else
  return 0;
#endif
}

sa_status sa_cpu_decode_fwd(const sa_attn *a, void *workspace, size_t workspace_size) {
  sa_decode_plan p;
  sa_cpu_decode_plan_make(a, &p);
  const int avx512 = sa_cpu_decode_use_avx512();
  p.bf16_dot = avx512 && a->dtype == SA_BF16 && sa_cpu_decode_has_bf16_dot();
  const int64_t items = a->batch * p.splits, slots = items * a->kv_heads;
  if (items == 0 || a->q_len == 0) return SA_OK;
  const int64_t pf = sa_cpu_decode_partial_floats(&p);
  if (pf == 0) return sa_error(SA_ERR_NO_MEMORY, "CPU decode: partials for this shape overflow");

  float *parts = NULL, *owned = NULL;
  if (workspace && workspace_size >= (size_t)pf * sizeof(float) && ((uintptr_t)workspace % sizeof(float)) == 0)
    parts = (float *)workspace;
  else
    parts = owned = (float *)malloc((size_t)pf * sizeof(float));

  int nthreads = sa_cpu_get_num_threads();
  if (nthreads < 1) nthreads = 1;
  if (nthreads > 64) nthreads = 64;
  if (nthreads > items) nthreads = (int)items;
  sa_decode_job job;
  job.p = &p;
  job.partial = avx512 ? sa_cpu_decode_partial_avx512 : sa_cpu_decode_partial_generic;
  job.scratch_floats = (sa_cpu_decode_scratch_floats(&p) + 15) & ~(int64_t)15; /* 64-byte strides */
  job.scratch = (float *)malloc((size_t)(job.scratch_floats * nthreads) * sizeof(float));
  if (!parts || !job.scratch) {
    free(owned);
    free(job.scratch);
    return sa_error(SA_ERR_NO_MEMORY, "CPU decode: cannot allocate %lld bytes of partials and scratch",
                    (long long)((pf + job.scratch_floats * nthreads) * (int64_t)sizeof(float)));
  }
  job.part_out = parts;
  job.part_lse = parts + slots * p.rows * a->v_head_dim;

  job.items = items;
  job.combine = 0;
  sa_cpu_decode_parallel(&job, nthreads);

  job.items = a->batch * a->kv_heads;
  job.combine = 1;
  sa_cpu_decode_parallel(&job, nthreads < job.items ? nthreads : (int)job.items);

  free(owned);
  free(job.scratch);
  return SA_OK;
}
