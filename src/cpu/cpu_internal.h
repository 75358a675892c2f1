/*
 * cpu_internal.h — what the CPU backend's driver (cpu_attn.c, cpu_pool.c) shares with its kernels.
 *
 * The kernels are written once (cpu_kernel_body.h) against a small vector layer and compiled three times
 * (cpu_kernel_avx512.c, cpu_kernel_avx2.c, cpu_kernel_scalar.c), and twice more with the products on AMX
 * tiles (cpu_kernel_amx.c, cpu_kernel_amxemu.c); each compilation exports one sa_cpu_kernels table. A
 * kernel processes one independent work item with a private scratch buffer; every output element is
 * written by exactly one item in a fixed order, so the result does not depend on how items are spread over
 * threads (bitwise identical for any thread count).
 */
#ifndef SA_CPU_INTERNAL_H
#define SA_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "sa_internal.h"

/* Tile sizes, one table (measured on a 2-core AMD EPYC Zen 4, f32, T = S = 2048, H = 128, one thread,
   per CPU second so that the shared machine's load does not enter).
   SA_CPU_ROWS: query rows (G heads x positions) per forward / dq item, sharing each K/V tile. The K/V
     rows are converted once per item, so more rows mean fewer passes over K/V (each row of K/V sits on
     its own page): 64 -> 128 -> 256 rows gave 68% -> 72% -> 76% of the FMA peak without a mask.
   SA_CPU_ROWS_DIAG: the same with a causal / window / segment mask, where a taller block wastes more on
     its diagonal tiles: causal 64 and 128 rows 72%, 256 rows 60%; gpt-oss's 128-key window (T = 4096,
     N/K = 64/8, H = 64) fwd 59% at 64 rows, 55% at 128.
   SA_CPU_TILE_ROWS_CAUSAL: the rows of the tile kernels' forward and dq items under a plain causal mask
     (cpu_plan.c), whose 32-row strips each multiply only the keys they see: 64, 128 and 256 rows tie within 2%
     (bf16 forward, T = S = 2048 N8 H128 causal and T = S = 4096 N64/8 H64 causal, 2 threads, Xeon with AMX).
   SA_CPU_BK: keys per tile in the forward and dq passes (rows of S^T).
   SA_CPU_TILE_BK: keys per tile of the tile kernels' forward and dq items (cpu_tile_fwd.h, cpu_tile_bwd.h) and
     of their packed K and V: each strip's o / dq goes through the C tiles once per key tile, and its S (32 rows
     x the tile's keys, fp32) should stay in L1. CPU time against 256 keys (bf16, 2 threads, Xeon with AMX):
     128 keys forward 1.07x (N8 H128) and 1.11x (N64/8 H64 causal), forward+backward 1.05x; 512 keys 1.00-1.06x.
   SA_CPU_BK2, SA_CPU_BQ2: keys per dk/dv item and query positions per tile in that pass. 64 and 128 keys
     tie at T = 2048 (causal or not); with gpt-oss's 128-key window 64 wastes less on the window's edges
     (fwd+bwd 35% -> 40% of peak at T = 4096, N/K = 64/8, H = 64).
   SA_CPU_TILE_BK2, SA_CPU_TILE_BQ2: the same for the tile kernels, whose dv and dk products then run 4 k steps
     (the tile's query rows) per C block load and store instead of 2. The forward+backward's work besides the
     tile products (emulated as no-ops, as above), 64 x 64 = 1.00: 128 keys x 128 rows 0.90 (N8 H128), 0.94
     (causal), 0.91 (T = S = 4096 N64/8 H64 causal); 64 keys x 128 rows 0.96-0.97; 256 keys x 128 rows 0.89,
     0.94, 0.87; 128 keys x 64 rows 0.98-1.04. gpt-oss's window layer (127 keys, T = S = 4096 N64/8 H64) 1.03:
     a 128-key item's queries span 256 rows for 128 x 128 pairs in the window, a 64-key item's 192 for 64 x 128. */
#define SA_CPU_ROWS             256
#define SA_CPU_ROWS_DIAG        64
#define SA_CPU_TILE_ROWS_CAUSAL 128
#define SA_CPU_BK               64
#define SA_CPU_TILE_BK          256
#define SA_CPU_BK2              64
#define SA_CPU_BQ2              64
#define SA_CPU_TILE_BK2         128
#define SA_CPU_TILE_BQ2         128
/* Head dims are padded to a multiple of 16 floats (one AVX-512 vector, two AVX2 ones) in the fp32 tiles. */
#define SA_CPU_PAD 16

#define SA_LOG2E 1.44269504088896340736f
#define SA_LN2   0.693147180559945309417f

typedef struct sa_cpu_ctx {
  const sa_attn *a;
  const sa_attn_grad *g;
  int64_t G;                    /* query heads per kv head */
  int64_t bq;                   /* query positions per forward / dq item (G * bq rows; the plan's) */
  int64_t nqb;                  /* query blocks of bq positions */
  int64_t nkb;                  /* key blocks of the dk/dv pass (SA_CPU_BK2 keys, SA_CPU_TILE_BK2 at the tiles) */
  int64_t hp, hvp;              /* head_dim, v_head_dim rounded up to SA_CPU_PAD */
  float scale;                  /* softmax scale */
  float scale2;                 /* scale * log2(e): scores are kept in base 2 so exp is exp2 */
  float *dbuf;                  /* [B,N,T] D_i = dout_i . out_i - dlse_i (backward) */
  float *dsink_part;            /* [N, B, nqb] per-block dsinks partials (backward, LEARNABLE) */
  sa_bcast bias_st, mask_st;    /* element strides of bias (and dbias) and mask, 0 on their size-1 axes */
  int fill;                     /* every score tile starts from the additive bias tile (cpu_mask.h) */
  int kill;                     /* every score tile gets a kill tile from the mask array (cpu_mask.h) */
  float cap2;                   /* logits_soft_cap * log2(e), the cap in the base-2 scores; 0 = none */
  int k_bad;                    /* backward: some key inside the lengths holds a NaN or an inf (dq_item) */
  int dbias_pass;               /* the backward pass that sums dbias (an sa_cpu_pass), -1 without dbias */
  int span_b, span_k, span_blk; /* that pass's items span every batch / kv head / block (see sa_cpu_grid) */
  int64_t nkt;                  /* the tile kernels' key tiles of SA_CPU_TILE_BK keys (cpu_tile_fwd.h) */
  uint16_t *kpack, *vpack;      /* K^T, and V (forward) or V^T (dq pass), packed once per call [B][K][nkt] */
  uint16_t *kpair;              /* K's key pairs for the dq pass's dS K, likewise (NULL: each item packs) */
} sa_cpu_ctx;

/* SA_CPU_FWD_PACK, SA_CPU_DQ_PACK: the tile kernels' packing of their B operands once per call, one item per (b,
   kv head, key tile), before the forward's / the dq pass's items when a kv head has several query blocks
   (cpu_attn.c; cpu_tile_fwd.h, cpu_tile_bwd.h). */
typedef enum {
  SA_CPU_FWD = 0,
  SA_CPU_BWD_DQ = 1,
  SA_CPU_BWD_DKDV = 2,
  SA_CPU_FWD_PACK = 3,
  SA_CPU_DQ_PACK = 4
} sa_cpu_pass;

/* bf16 elements of one packed key tile of the tile kernels, VNNI blocks of 512 (cpu_tile_pack.h's layouts, dims
   rounded to 32): K-sized (K^T [16-key groups][32-dim k steps], K's key pairs [16-column groups][32-key k steps])
   and V-sized (V's key pairs, V^T). */
static inline int64_t sa_cpu_tile_kt_elems(const sa_attn *a) { return (a->head_dim + 31) / 32 * 32 * SA_CPU_TILE_BK; }
static inline int64_t sa_cpu_tile_vb_elems(const sa_attn *a) { return (a->v_head_dim + 31) / 32 * 32 * SA_CPU_TILE_BK; }

/* The context of a call (g NULL for a forward); tests read its dbias item grid too. */
void sa_cpu_ctx_init(sa_cpu_ctx *c, const sa_attn *a, const sa_attn_grad *g, int tile);

/* The items of a pass: one per (b, kv head, block) where blocks are query blocks (FWD, BWD_DQ) or key
   blocks (BWD_DKDV), except in the pass that sums dbias, whose items span every axis along which two
   items would add to the same dbias element: one item then sums each element in a fixed order, so dbias
   is bitwise the same for every thread count, with no scratch beyond dbias. An item is the gb x gk x gl
   sub-items (b, kv head, block) of one cell of the nb x nk x nl grid, run in that order. */
typedef struct {
  int64_t gb, gk, gl, nb, nk, nl;
} sa_cpu_grid;

static inline sa_cpu_grid sa_cpu_grid_of(const sa_cpu_ctx *c, sa_cpu_pass pass) {
  const int64_t nblk = pass == SA_CPU_BWD_DKDV                             ? c->nkb
                       : pass == SA_CPU_FWD_PACK || pass == SA_CPU_DQ_PACK ? c->nkt
                                                                           : c->nqb;
  const int64_t span = (int)pass == c->dbias_pass;
  sa_cpu_grid g;
  g.gb = span && c->span_b && c->a->batch > 0 ? c->a->batch : 1;
  g.gk = span && c->span_k ? c->a->kv_heads : 1;
  g.gl = span && c->span_blk && nblk > 0 ? nblk : 1;
  g.nb = c->a->batch / g.gb;
  g.nk = c->a->kv_heads / g.gk;
  g.nl = nblk / g.gl;
  return g;
}

/* The k-th of the gb * gk * gl sub-items of item `item` (b outermost, the block innermost), as the index
   (b * kv_heads + kv head) * blocks + block. */
static inline int64_t sa_cpu_sub_item(const sa_cpu_grid *g, int64_t kv_heads, int64_t item, int64_t k) {
  const int64_t il = item % g->nl, ik = (item / g->nl) % g->nk, ib = item / (g->nl * g->nk);
  const int64_t sl = k % g->gl, sk = (k / g->gl) % g->gk, sb = k / (g->gl * g->gk);
  return ((ib * g->gb + sb) * kv_heads + ik * g->gk + sk) * (g->nl * g->gl) + il * g->gl + sl;
}

typedef struct sa_cpu_kernels {
  const char *name;
  /* Floats of scratch one worker needs for a pass (the items allocate nothing). */
  size_t (*scratch)(const sa_cpu_ctx *c, sa_cpu_pass pass);
  /* Item indices of sa_cpu_grid_of's grid, (b, kv head, block) row-major. */
  void (*run)(const sa_cpu_ctx *c, sa_cpu_pass pass, int64_t item, float *scratch);
  /* Per worker thread, before its first item and after its last (NULL: none): the tile kernels load the
     tile configuration and release the tile state there. */
  void (*begin)(void);
  void (*end)(void);
  /* The 64-byte tile configuration this thread holds (STTILECFG; NULL for the vector kernels): the tests read
     it back after begin (tests/test_tile_config.c). */
  void (*config_read)(void *cfg64);
} sa_cpu_kernels;

extern const sa_cpu_kernels sa_cpu_kernels_avx512;
extern const sa_cpu_kernels sa_cpu_kernels_avx2;
extern const sa_cpu_kernels sa_cpu_kernels_scalar;
/* The AVX-512 body with its products on AMX tiles: real instructions (built when the compiler takes
   -mamx-tile -mamx-bf16: SA_CPU_HAVE_AMX), and the same code over emulated instructions (tests). */
#ifdef SA_CPU_HAVE_AMX
extern const sa_cpu_kernels sa_cpu_kernels_amx;
#endif
extern const sa_cpu_kernels sa_cpu_kernels_amxemu;

struct sa_cpu_plan;
/* The kernel table a plan runs (its SIMD level, or its tile products: real or emulated). */
const sa_cpu_kernels *sa_cpu_kernels_of(const struct sa_cpu_plan *p);

/* Runs fn(arg, i, scratch) for the items i in [0, n) on up to max_threads threads (the caller's among
   them; fewer when sa_cpu_get_num_threads or n is smaller), each worker with its own scratch of
   scratch_floats floats (64-byte aligned), items handed out by one atomic counter; each worker calls
   begin before its first item and end after its last where they are not NULL. *threads (may be NULL) is
   raised to the count that ran. SA_ERR_NO_MEMORY when no worker's scratch can be allocated. */
typedef void (*sa_cpu_item_fn)(void *arg, int64_t item, float *scratch);
sa_status sa_cpu_run_items(sa_cpu_item_fn fn, void *arg, int64_t n, size_t scratch_floats, int64_t max_threads,
                           void (*begin)(void), void (*end)(void), int *threads);

/* The attention forward under plan p (a forward plan, or the decode plan that runs its kernels); *threads
   is raised to the threads it ran on. */
struct sa_cpu_plan;
sa_status sa_cpu_attn_fwd_plan(const sa_attn *a, const struct sa_cpu_plan *p, int *threads);

/* One pass of the attention kernels over items [0, n); flops (an estimate of the pass's work) caps the
   threads for small calls. */
sa_status sa_cpu_parallel(const sa_cpu_kernels *k, const sa_cpu_ctx *c, sa_cpu_pass pass, int64_t n,
                          size_t scratch_floats, double flops, int *threads);

#endif /* SA_CPU_INTERNAL_H */
