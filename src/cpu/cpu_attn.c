/*
 * cpu_attn.c — the CPU backend's entry points: the call's plan (cpu_plan.h: which SIMD level, rows per
 * item), the call context (tile counts, padded dims, base-2 scale), and the order of the passes. The
 * kernels are in cpu_kernel_body.h, the threads in cpu_pool.c.
 *
 * Memory beyond the caller's buffers: per thread one scratch of O(tile) floats, whatever T and S are
 * (at H = Hv = 128: 400 KiB forward, 560 KiB dq pass, 230 KiB dk/dv pass); for the backward also
 * D [B,N,T] and the dsinks partials [N,B,T/bq] fp32, from the caller's workspace when it is large
 * enough, else allocated per call. Bias, mask and dbias are read and summed in place, tile by tile.
 */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "cpu_plan.h"

/* ---- plan and context ------------------------------------------------------------------------ */

/* The kernel table a plan runs (the plan's level is one CPUID and SINKATTN_SIMD allow; a tile plan is legal
   only where its kernels are built and, for the real instructions, the CPU and OS have AMX). */
const sa_cpu_kernels *sa_cpu_kernels_of(const sa_cpu_plan *p) {
  if (p->tile == SA_CPU_TILE_EMULATED) return &sa_cpu_kernels_amxemu;
#ifdef SA_CPU_HAVE_AMX
  if (p->tile == SA_CPU_TILE_AMX) return &sa_cpu_kernels_amx;
#endif
  return p->simd == SA_CPU_AVX512 ? &sa_cpu_kernels_avx512
         : p->simd == SA_CPU_AVX2 ? &sa_cpu_kernels_avx2
                                  : &sa_cpu_kernels_scalar;
}

const char *sa_cpu_simd_name(void) {
  sa_cpu_simd s = sa_cpu_record_get()->simd;
  return s == SA_CPU_AVX512 ? "avx512" : s == SA_CPU_AVX2 ? "avx2" : "scalar";
}

static int64_t sa_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Whether some element of k inside the lengths (keys j < kv_len[b]) is a NaN or an inf: the exponent field
   all ones, tested on the bits (a loop the compiler vectorises). One read of K per backward call: at T = S =
   2048, K = 8, H = 64 about 1/4000 of the backward's multiply-adds. */
static int sa_cpu_keys_nonfinite(const sa_attn *a) {
  const int64_t row = a->kv_heads * a->head_dim;
  if (!a->k) return 0; /* an empty k may be NULL */
  for (int64_t b = 0; b < a->batch; b++) {
    const int64_t n = sa_kv_len_of(a, b) * row, off = b * a->kv_len * row;
    unsigned bad = 0;
    if (a->dtype == SA_F32) {
      const uint32_t *x = (const uint32_t *)a->k + off;
      for (int64_t i = 0; i < n; i++) bad |= (x[i] & 0x7f800000u) == 0x7f800000u;
    } else {
      const uint16_t *x = (const uint16_t *)a->k + off, e = a->dtype == SA_F16 ? 0x7c00u : 0x7f80u;
      for (int64_t i = 0; i < n; i++) bad |= (x[i] & e) == e;
    }
    if (bad) return 1;
  }
  return 0;
}

void sa_cpu_ctx_init(sa_cpu_ctx *c, const sa_attn *a, const sa_attn_grad *g, int tile) {
  memset(c, 0, sizeof *c);
  c->a = a;
  c->g = g;
  c->G = a->q_heads / a->kv_heads;
  int64_t bq_min;
  sa_cpu_plan_rows(a, tile, &c->bq, &bq_min); /* the plan's rows */
  c->nqb = (a->q_len + c->bq - 1) / c->bq;
  const int64_t bk2 = tile ? SA_CPU_TILE_BK2 : SA_CPU_BK2; /* the kernel body's BODY_BK2 */
  c->nkb = (a->kv_len + bk2 - 1) / bk2;
  c->nkt = (a->kv_len + SA_CPU_TILE_BK - 1) / SA_CPU_TILE_BK;
  c->hp = sa_round_up(a->head_dim, SA_CPU_PAD);
  c->hvp = sa_round_up(a->v_head_dim, SA_CPU_PAD);
  c->scale = sa_scale_of(a);
  c->scale2 = c->scale * SA_LOG2E;
  c->bias_st = sa_bcast_of(a->bias_dims);
  c->mask_st = sa_bcast_of(a->mask_dims);
  c->fill = a->bias != NULL;
  c->kill = a->mask != NULL;
  /* cap * log2(e) past FLT_MAX (caps above 2.3e38) is held at FLT_MAX: the scores it caps differently are
     beyond fp32 in base 2 anyway */
  const double cap2 = (double)a->logits_soft_cap * (double)SA_LOG2E;
  c->cap2 = cap2 > (double)FLT_MAX ? FLT_MAX : (float)cap2;
  c->dbias_pass = -1;
  if (g && g->dbias) {
    /* dbias is summed in the pass whose items already hold every pair of an element: the dk/dv pass holds
       all query rows of its keys, the dq pass all keys of its rows. So the dq pass when bias is shared
       along the keys only, else the dk/dv pass; its items then also span the batches, kv heads and (for a
       bias shared along both rows and keys) key blocks along which bias is shared. */
    const int64_t *d = a->bias_dims;
    int bi = d[2] == 1 && a->q_len > 1, bj = d[3] == 1 && a->kv_len > 1;
    c->dbias_pass = bj && !bi ? SA_CPU_BWD_DQ : SA_CPU_BWD_DKDV;
    c->span_b = d[0] == 1 && a->batch > 1;
    c->span_k = d[1] == 1 && a->q_heads > 1;
    c->span_blk = c->dbias_pass == SA_CPU_BWD_DKDV && bj;
  }
}

static int64_t sa_cpu_items(const sa_cpu_ctx *c, sa_cpu_pass pass) {
  sa_cpu_grid g = sa_cpu_grid_of(c, pass);
  return g.nb * g.nk * g.nl;
}

/* Upper bound of one pass's FLOPs (masks ignored): 2 T S (H + Hv) per query head. */
static double sa_cpu_flops(const sa_attn *a) {
  return 2.0 * (double)a->batch * (double)a->q_heads * (double)a->q_len * (double)a->kv_len *
         (double)(a->head_dim + a->v_head_dim);
}

/* Every valid problem is supported: any head dims (padded in the tiles), G, dtype, mask and lengths. */
sa_status sa_cpu_attn_supported(const sa_attn *a) {
  (void)a;
  return SA_OK;
}

sa_status sa_cpu_attn_fwd_plan(const sa_attn *a, const sa_cpu_plan *p, int *threads) {
  if (a->batch == 0 || a->q_len == 0) return SA_OK;
  sa_cpu_ctx c;
  sa_cpu_ctx_init(&c, a, NULL, p->tile != SA_CPU_TILE_NONE);
  const sa_cpu_kernels *k = sa_cpu_kernels_of(p);
  sa_status s = SA_OK;
  /* The tile forward packs K^T and V into its B operand layout once per call when each kv head has several
     query blocks, instead of once per item (every item of a kv head packs the same tiles): a buffer of K's and V's
     size. gpt-oss's T = 4096 (N/K 64/8, H 64) has 128 items per kv head. */
  const size_t kte = (size_t)sa_cpu_tile_kt_elems(a), vbe = (size_t)sa_cpu_tile_vb_elems(a);
  const size_t tiles = (size_t)(a->batch * a->kv_heads * c.nkt);
  if (p->tile != SA_CPU_TILE_NONE && c.nqb > 1 && a->kv_len > 0) {
    c.kpack = aligned_alloc(64, tiles * (kte + vbe) * sizeof(uint16_t));
    if (!c.kpack)
      return sa_error(SA_ERR_NO_MEMORY, "CPU backend: cannot allocate %zu bytes for the packed K and V",
                      tiles * (kte + vbe) * sizeof(uint16_t));
    c.vpack = c.kpack + tiles * kte;
    /* a packed element costs about what 16 flops of the products do (0.05 ns on one core), for the thread cap */
    s = sa_cpu_parallel(k, &c, SA_CPU_FWD_PACK, sa_cpu_items(&c, SA_CPU_FWD_PACK), k->scratch(&c, SA_CPU_FWD_PACK),
                        (double)tiles * (double)(kte + vbe) * 16.0, threads);
  }
  if (s == SA_OK)
    s = sa_cpu_parallel(k, &c, SA_CPU_FWD, sa_cpu_items(&c, SA_CPU_FWD), k->scratch(&c, SA_CPU_FWD), sa_cpu_flops(a),
                        threads);
  free(c.kpack);
  return s;
}

sa_status sa_cpu_attn_fwd(const sa_attn *a) {
  sa_cpu_plan p;
  sa_status s = sa_cpu_plan_of(a, SA_PLAN_FWD, &p);
  if (s != SA_OK) return s;
  int threads = 0;
  s = sa_cpu_attn_fwd_plan(a, &p, &threads);
  if (threads) sa_cpu_plan_ran(&p, a, threads);
  return s;
}

/* ---- backward -------------------------------------------------------------------------------- */

/* D [B,N,T] then the dsinks partials [N,B,nqb], each rounded to 64 bytes. The partials are sized for the
   shorter query blocks of masked problems whatever this call's masks, so that the size depends on shapes
   only (the FFI layer asks at trace time, when segment ids are not known). */
static size_t sa_cpu_bwd_bytes(const sa_attn *a, const sa_cpu_plan *p, size_t *part_off) {
  int64_t nqb_max = (a->q_len + p->bq_min - 1) / p->bq_min;
  size_t d = ((size_t)(a->batch * a->q_heads * a->q_len) * sizeof(float) + 63) & ~(size_t)63;
  size_t parts = ((size_t)(a->q_heads * a->batch * nqb_max) * sizeof(float) + 63) & ~(size_t)63;
  if (part_off) *part_off = d;
  return d + parts;
}

/* The forced plan's size when it can run, else the default's (the call itself then fails on the plan). */
size_t sa_cpu_attn_bwd_workspace_size(const sa_attn *a) {
  sa_cpu_plan p;
  if (sa_cpu_plan_of(a, SA_PLAN_BWD, &p) != SA_OK &&
      sa_cpu_plan_make(a, SA_PLAN_BWD, sa_cpu_record_get(), NULL, &p) != SA_OK)
    return 0;
  return sa_cpu_bwd_bytes(a, &p, NULL);
}

sa_status sa_cpu_attn_bwd(const sa_attn *a, const sa_attn_grad *g, void *workspace, size_t workspace_size) {
  const int64_t B = a->batch, N = a->q_heads;
  sa_cpu_plan p;
  sa_status s = sa_cpu_plan_of(a, SA_PLAN_BWD, &p);
  if (s != SA_OK) return s;
  sa_cpu_ctx c;
  sa_cpu_ctx_init(&c, a, g, p.tile != SA_CPU_TILE_NONE);
  c.k_bad = sa_cpu_keys_nonfinite(a);
  size_t part_off, need = sa_cpu_bwd_bytes(a, &p, &part_off);
  int own = workspace == NULL || workspace_size < need || ((uintptr_t)workspace & 3) != 0; /* floats */
  char *buf = own ? aligned_alloc(64, need) : (char *)workspace;
  if (!buf) return sa_error(SA_ERR_NO_MEMORY, "CPU backend: cannot allocate %zu bytes for the backward", need);
  c.dbuf = (float *)buf;
  c.dsink_part = (float *)(buf + part_off);

  const sa_cpu_kernels *k = sa_cpu_kernels_of(&p);
  int threads = 1;
  /* dbias is summed in place (pairs that no tile visits add nothing) */
  if (g->dbias) memset(g->dbias, 0, (size_t)sa_dims_count(a->bias_dims) * sizeof *g->dbias);
  /* the tile dq pass's K^T, V^T and K pairs packed once per call, as the forward's (sa_cpu_attn_fwd_plan) */
  const size_t kte = (size_t)sa_cpu_tile_kt_elems(a), vbe = (size_t)sa_cpu_tile_vb_elems(a);
  const size_t tiles = (size_t)(a->batch * a->kv_heads * c.nkt);
  if (p.tile != SA_CPU_TILE_NONE && c.nqb > 1 && a->kv_len > 0 && B > 0 && a->q_len > 0) {
    c.kpack = aligned_alloc(64, tiles * (2 * kte + vbe) * sizeof(uint16_t));
    if (!c.kpack)
      s = sa_error(SA_ERR_NO_MEMORY, "CPU backend: cannot allocate %zu bytes for the packed K and V",
                   tiles * (2 * kte + vbe) * sizeof(uint16_t));
    else {
      c.vpack = c.kpack + tiles * kte;
      c.kpair = c.vpack + tiles * vbe;
      s = sa_cpu_parallel(k, &c, SA_CPU_DQ_PACK, sa_cpu_items(&c, SA_CPU_DQ_PACK), k->scratch(&c, SA_CPU_DQ_PACK),
                          (double)tiles * (double)(2 * kte + vbe) * 16.0, &threads);
    }
  }
  if (s == SA_OK && B > 0 && a->q_len > 0)
    s = sa_cpu_parallel(k, &c, SA_CPU_BWD_DQ, sa_cpu_items(&c, SA_CPU_BWD_DQ), k->scratch(&c, SA_CPU_BWD_DQ),
                        1.5 * sa_cpu_flops(a), &threads);
  free(c.kpack);
  c.kpack = c.vpack = c.kpair = NULL;
  /* dk/dv read every D of pass 1, so the passes run one after the other. */
  if (s == SA_OK && B > 0 && a->kv_len > 0)
    s = sa_cpu_parallel(k, &c, SA_CPU_BWD_DKDV, sa_cpu_items(&c, SA_CPU_BWD_DKDV), k->scratch(&c, SA_CPU_BWD_DKDV),
                        2.0 * sa_cpu_flops(a), &threads);
  sa_cpu_plan_ran(&p, a, threads);

  /* dsinks[n] = -sum over (b, query block) of the per-block partials, in that fixed order (double, so
     the sum of up to B*T/bq partials adds no error beyond the partials' own). */
  if (s == SA_OK && g->dsinks) {
    for (int64_t n = 0; n < N; n++) {
      double acc = 0.0;
      if (a->softmax == SA_SOFTMAX_LEARNABLE && a->q_len > 0)
        for (int64_t e = 0; e < B * c.nqb; e++) acc += c.dsink_part[n * B * c.nqb + e];
      g->dsinks[n] = (float)(0.0 - acc); /* +0 when nothing was added */
    }
  }
  if (own) free(buf);
  return s;
}
