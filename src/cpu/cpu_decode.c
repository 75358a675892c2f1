/*
 * cpu_decode.c — CPU split-KV decode: a few query tokens (Tq <= 64) against a long KV cache.
 *
 * Work items (b, chunk) run on threads (cpu_pool.c) and write vanilla partials (cpu_decode.h); the thread
 * that finishes the last chunk of a batch then merges each row's chunks in chunk order in fp32 and adds
 * the sink once:
 *     lse = logaddexp(lse_0, ..., lse_{C-1}, a_n),   out = sum_c exp(lse_c - lse) * out_c.
 * The chunk length depends on the shape only (the plan, cpu_plan.c), never on the thread count, and the
 * merge order is fixed, so the result is bitwise the same for every thread count. Partials live in the
 * caller's workspace when it is large enough, else in a malloc'd buffer.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu_decode.h"
#include "cpu_internal.h"

/* Floats of partials: out [items][R][Hv] then lse [items][R]; 0 when the count would not fit. */
static int64_t sa_cpu_decode_partial_floats(const sa_attn *a, const sa_cpu_plan *p) {
  double n = (double)a->batch * (double)a->kv_heads * (double)p->splits * (double)p->rows * (double)(a->v_head_dim + 1);
  if (n > 4.0e18 / 4.0) return 0;
  return a->batch * a->kv_heads * p->splits * p->rows * (a->v_head_dim + 1);
}

sa_status sa_cpu_decode_supported(const sa_attn *a) {
  if (a->q_segment_ids)
    return sa_error(SA_ERR_UNSUPPORTED,
                    "q_segment_ids/kv_segment_ids unsupported by the CPU decode "
                    "backend: use SA_BACKEND_REF (or sa_attn_fwd) for packed sequences");
  return SA_OK;
}

/* The forced plan's size when it can run, else the default's (the call itself then fails on the plan). */
size_t sa_cpu_decode_workspace_size(const sa_attn *a) {
  sa_cpu_plan p;
  if (sa_cpu_plan_of(a, SA_PLAN_DECODE, &p) != SA_OK &&
      sa_cpu_plan_make(a, SA_PLAN_DECODE, sa_cpu_record_get(), NULL, &p) != SA_OK)
    return 0;
  return p.fwd_kernels ? 0 : (size_t)sa_cpu_decode_partial_floats(a, &p) * sizeof(float);
}

typedef struct {
  const sa_attn *a;
  const sa_cpu_plan *p;
  void (*kernel)(const sa_decode_item *, float *);
  int64_t kernel_floats;
  float qscale;
  float *part_out, *part_lse;
  atomic_llong *done; /* [B] chunks finished per batch */
} sa_decode_job;

static int64_t sa_al16(int64_t n) { return (n + 15) & ~(int64_t)15; } /* floats, keeping 64-byte alignment */

static int64_t sa_al32(int64_t n) { return (n + 31) & ~(int64_t)31; }

/* The item's scratch: key ranges [R][2] (int64), m and l [K][Rp], acc [K][R][Hv rounded up to 32], then
   the kernel's. */
static int64_t sa_cpu_decode_scratch(const sa_attn *a, const sa_cpu_plan *p, int64_t kernel_floats) {
  const int64_t R = p->rows, Rp = sa_al16(R), K = a->kv_heads;
  return sa_al16(4 * R) + 2 * K * Rp + K * R * sa_al32(a->v_head_dim) + kernel_floats;
}

/* Merges the C chunks of every row of (b, kv head kh) into out and lse. */
static void sa_cpu_decode_combine(const sa_decode_job *j, int64_t b, int64_t kh) {
  const sa_attn *a = j->a;
  const int64_t R = j->p->rows, G = a->q_heads / a->kv_heads, Hv = a->v_head_dim, C = j->p->splits;
  const int64_t N = a->q_heads, T = a->q_len, bk = b * a->kv_heads + kh;
  float *po = j->part_out + bk * C * R * Hv;
  const float *pl = j->part_lse + bk * C * R;
  for (int64_t r = 0; r < R; r++) {
    int64_t t = r / G, n = kh * G + r % G;
    int64_t obase = ((b * T + t) * N + n) * Hv;
    float sink = sa_sink_logit(a, n), mx = sink;
    for (int64_t c = 0; c < C; c++) mx = pl[c * R + r] > mx ? pl[c * R + r] : mx;
    if (mx == -INFINITY) { /* vanilla row with no valid key */
      for (int64_t d = 0; d < Hv; d++) sa_store(a->out, a->dtype, obase + d, 0.0f);
      if (a->lse) a->lse[(b * N + n) * T + t] = -INFINITY;
      continue;
    }
    float sum = expf(sink - mx);
    for (int64_t c = 0; c < C; c++) sum += expf(pl[c * R + r] - mx);
    float lse = mx + logf(sum), inv = 1.0f / sum;
    /* the row's partials are read by this merge only, so chunk 0's slot accumulates in place */
    float *acc = po + r * Hv;
    float w0 = expf(pl[r] - mx) * inv;
    for (int64_t d = 0; d < Hv; d++) acc[d] *= w0;
    for (int64_t c = 1; c < C; c++) {
      const float w = expf(pl[c * R + r] - mx) * inv, *o = po + (c * R + r) * Hv;
      for (int64_t d = 0; d < Hv; d++) acc[d] += w * o[d];
    }
    for (int64_t d = 0; d < Hv; d++) sa_store(a->out, a->dtype, obase + d, acc[d]);
    if (a->lse) a->lse[(b * N + n) * T + t] = lse;
  }
}

static void sa_cpu_decode_item_run(void *arg, int64_t item, float *scratch) {
  const sa_decode_job *j = (const sa_decode_job *)arg;
  const sa_attn *a = j->a;
  const sa_cpu_plan *p = j->p;
  const int64_t R = p->rows, Rp = sa_al16(R), K = a->kv_heads, Hv = a->v_head_dim, G = a->q_heads / K;
  const int64_t b = item / p->splits, c = item % p->splits;
  const int64_t ql = sa_q_len_of(a, b), kl = sa_kv_len_of(a, b);
  const int64_t c0 = c * p->keys, c1 = c0 + p->keys < kl ? c0 + p->keys : kl;
  int64_t *rng = (int64_t *)(void *)scratch;
  sa_decode_item it = {a, p, G, j->qscale, b, c, c1, c0, rng, NULL, NULL, NULL, Rp, sa_al32(Hv)};
  it.m = scratch + sa_al16(4 * R);
  it.l = it.m + K * Rp;
  it.acc = it.l + K * Rp;
  float *ks = it.acc + K * R * it.astride;

  /* pass 1: which keys of this chunk each row may see (lengths, causal, window via sa_key_range); the
     mask depends on the token t = r / G only, so every kv head shares it */
  for (int64_t r = 0; r < R; r++) {
    sa_range kr = sa_key_range(a, ql, kl, r / G);
    int64_t lo = kr.lo > c0 ? kr.lo : c0, hi = kr.hi < c1 ? kr.hi : c1;
    if (lo >= hi) lo = hi = 0;
    rng[2 * r] = lo;
    rng[2 * r + 1] = hi;
    if (lo < hi) {
      if (lo < it.jlo) it.jlo = lo;
      if (hi > it.jhi) it.jhi = hi;
    }
  }
  for (int64_t x = 0; x < K * Rp; x++) {
    it.m[x] = -INFINITY;
    it.l[x] = 0.0f;
  }
  memset(it.acc, 0, (size_t)(K * R * it.astride) * sizeof(float));
  /* pass 2: the kernel's online softmax over the chunk */
  if (it.jlo < it.jhi) j->kernel(&it, ks);

  /* pass 3: the vanilla partials of slots (b, kh, c) (the sink is added once, in the merge) */
  for (int64_t kh = 0; kh < K; kh++) {
    const int64_t slot = (b * K + kh) * p->splits + c;
    for (int64_t r = 0; r < R; r++) {
      const float l = it.l[kh * Rp + r], *acc = it.acc + (kh * R + r) * it.astride;
      float *o = j->part_out + (slot * R + r) * Hv;
      if (l > 0.0f) {
        float inv = 1.0f / l;
        for (int64_t d = 0; d < Hv; d++) o[d] = acc[d] * inv;
        j->part_lse[slot * R + r] = (it.m[kh * Rp + r] + log2f(l)) * SA_LN2;
      } else {
        memset(o, 0, (size_t)Hv * sizeof(float));
        j->part_lse[slot * R + r] = -INFINITY;
      }
    }
  }
  /* The thread that completes a batch's last chunk merges it: the increment publishes this item's
     partials (sequentially consistent atomics) to that thread. */
  if (atomic_fetch_add(&j->done[b], 1) + 1 == p->splits)
    for (int64_t kh = 0; kh < K; kh++) sa_cpu_decode_combine(j, b, kh);
}

int64_t sa_cpu_decode_tile_config(const sa_attn *a, const sa_cpu_plan *p, void *got) {
  if (p->tile == SA_CPU_TILE_EMULATED) return sa_cpu_decode_amxemu_config(a, p, got);
#ifdef SA_CPU_HAVE_AMX
  if (p->tile == SA_CPU_TILE_AMX) return sa_cpu_decode_amx_config(a, p, got);
#endif
  return -1;
}

sa_status sa_cpu_decode_fwd(const sa_attn *a, void *workspace, size_t workspace_size) {
  sa_cpu_plan p;
  sa_status s = sa_cpu_plan_of(a, SA_PLAN_DECODE, &p);
  if (s != SA_OK) return s;
  if (p.fwd_kernels) { /* bias, mask, positions, soft-cap (or forced): the attention forward */
    int threads = 0;
    s = sa_cpu_attn_fwd_plan(a, &p, &threads);
    if (threads) sa_cpu_plan_ran(&p, a, threads);
    return s;
  }
  const int64_t items = a->batch * p.splits;
  if (items == 0 || a->q_len == 0) return SA_OK;
  const int64_t pf = sa_cpu_decode_partial_floats(a, &p);
  if (pf == 0) return sa_error(SA_ERR_NO_MEMORY, "CPU decode: partials for this shape overflow");

  sa_decode_job job = {
      a,    &p,  sa_cpu_decode_portable, sa_cpu_decode_portable_scratch(a, &p), sa_scale_of(a) * SA_LOG2E, NULL,
      NULL, NULL};
  if (p.tile == SA_CPU_TILE_EMULATED) {
    job.kernel = sa_cpu_decode_amxemu;
    job.kernel_floats = sa_cpu_decode_amxemu_scratch(a, &p);
#ifdef SA_CPU_HAVE_AMX
  } else if (p.tile == SA_CPU_TILE_AMX) {
    job.kernel = sa_cpu_decode_amx;
    job.kernel_floats = sa_cpu_decode_amx_scratch(a, &p);
#endif
  } else if (p.simd == SA_CPU_AVX512) {
    job.kernel = sa_cpu_decode_avx512;
    job.kernel_floats = sa_cpu_decode_avx512_scratch(a, &p);
  }
  float *owned = NULL;
  if (workspace && workspace_size >= (size_t)pf * sizeof(float) && ((uintptr_t)workspace % sizeof(float)) == 0)
    job.part_out = (float *)workspace;
  else job.part_out = owned = (float *)malloc((size_t)pf * sizeof(float));
  job.done = calloc((size_t)a->batch, sizeof *job.done);
  if (!job.part_out || !job.done) {
    free(owned);
    free(job.done);
    return sa_error(SA_ERR_NO_MEMORY, "CPU decode: cannot allocate %lld bytes of partials",
                    (long long)(pf * (int64_t)sizeof(float)));
  }
  job.part_lse = job.part_out + items * a->kv_heads * p.rows * a->v_head_dim;
  for (int64_t b = 0; b < a->batch; b++) atomic_init(&job.done[b], 0);
  int threads = 1;
  s = sa_cpu_run_items(sa_cpu_decode_item_run, &job, items, (size_t)sa_cpu_decode_scratch(a, &p, job.kernel_floats),
                       items, NULL, NULL, &threads);
  sa_cpu_plan_ran(&p, a, threads);
  free(owned);
  free(job.done);
  return s;
}
