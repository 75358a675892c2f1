/*
 * cpu_kernel_body.h — the CPU attention kernels, written once against the vector layer that the including
 * file defines (VW floats per vf; V_ZERO/V_SET1/V_LOAD/V_STORE/V_FMA/V_ADD/V_SUB/V_MUL/V_MAX/V_RADD/
 * V_EXP2/V_TANH/V_LOAD_F16/V_LOAD_BF16/V_MASK_RANGE/V_KEEP/V_MUL_NZ; micro-kernel shape MK_R x MK_C;
 * SA_K_TABLE, SA_K_NAME).
 * Everything here is static: each including file is one SIMD level and exports only its kernel table.
 *
 * Scores are kept in base 2: q is multiplied by scale * log2(e) when it is converted, so every
 * exponential is an exp2 and the sink logit a enters as a * log2(e) (a bias element too: cpu_mask.h
 * builds the tile a score product starts from, and holds the masks and the dbias sums).
 *
 * Three passes, each a set of independent items (FlashAttention-2 style, no T x S matrix):
 *   FWD      item (b, kv head, query block): the G heads' M rows share each K/V tile; online softmax
 *            with the running max seeded by the sink, the sink added once in the final normalisation.
 *   BWD_DQ   item (b, kv head, query block): D_i = dout_i . out_i - dlse_i, dsinks partials, then
 *            dq = scale * dS K over the key tiles, P recomputed from lse.
 *   BWD_DKDV item (b, kv head, key block): dk, dv accumulated in fp32 over the G heads and all query
 *            tiles.
 * dbias is summed in BWD_DKDV, or in BWD_DQ for a bias shared along the keys only; that pass's items may
 * span several (b, kv head, block) (sa_cpu_grid in cpu_internal.h).
 * All products are C (+)= A B with A read as broadcast scalars at any (row, k) strides and B as vectors
 * along its rows. Only operands reused across a whole item are transposed (q^T, dout^T in FWD/BWD_DQ:
 * scores are kept as S^T, keys x query rows, so the softmax runs down columns without horizontal
 * reductions; k^T, v^T in BWD_DKDV); per-tile operands are converted row by row and, where a product needs
 * their transpose as A, read through the strides. A per-tile scalar transpose cost 6-12% of the forward.
 * The products go through PRODUCT: cpu_gemm.h's fp32 FMAs, or with SA_TILE defined (the AMX kernels,
 * cpu_kernel_amx.c and its emulated twin cpu_kernel_amxemu.c) cpu_tile.h's bf16 tile products; everything
 * else is the same code at both, except that the tile kernels' forward and dq items are their own (scores as
 * S in 32-row strips, cpu_tile_fwd.h, cpu_tile_bwd.h). The rows' conversions and prefetches are
 * cpu_kernel_rows.h's.
 */
#include <math.h>
#include <string.h>

#define SA_INLINE    static inline __attribute__((always_inline))
#define SA_MIN(x, y) ((x) < (y) ? (x) : (y))
#define SA_MAX(x, y) ((x) > (y) ? (x) : (y))

#ifdef SA_TILE
#include "cpu_tile.h"
#define BODY_BK  SA_CPU_TILE_BK  /* keys per tile of the forward and dq passes (cpu_internal.h) */
#define BODY_BK2 SA_CPU_TILE_BK2 /* keys per dk/dv item (sa_cpu_ctx_init's nkb) */
#define BODY_BQ2 SA_CPU_TILE_BQ2 /* query positions per dk/dv tile */
#else
#include "cpu_gemm.h"
#define BODY_BK  SA_CPU_BK
#define BODY_BK2 SA_CPU_BK2
#define BODY_BQ2 SA_CPU_BQ2
#endif

#include "cpu_kernel_rows.h"
#include "cpu_mask.h"

/* ---- per-pass scratch ------------------------------------------------------------------------ */

static int64_t pad_to(int64_t x) { return (x + SA_CPU_PAD - 1) / SA_CPU_PAD * SA_CPU_PAD; }

typedef struct {
  float *tmp, *tmp2, *q, *qt, *kt, *kr, *v, *vt, *d, *dt, *s, *dp, *acc, *acc2, *r1, *r2, *cm, *cl, *mlo, *mhi;
  float *row, *db;           /* rows of the additive tile (cpu_mask.h); dbias row sums of the dq pass */
  float *kl, *krow;          /* the kill tile and its rows (cpu_mask.h: mask array, positions) */
  float *cf;                 /* the dk/dv pass's soft-cap factors 1 - t^2 (its scores become p in place) */
  float *ta, *tb, *tc;       /* the tile layer's staging (cpu_tile.h): A panel, B blocks (bf16), C tiles */
  float *sq, *sd, *sk, *sv;  /* its per-item staging of q^T, dout^T (FWD, BWD_DQ) or k^T, v^T (BWD_DKDV) */
  const uint16_t **ra, **rb; /* and the input rows they are packed from (q, dout; k, v) */
} sa_bufs;

/* The products. The vector layer multiplies fp32 operands with q pre-scaled by scale * log2(e) (QSCALE);
   the tile layer takes q as the bf16 input gives it, exact in a tile, and scales the products of S by q
   instead (PSCALE, their alpha; dk gets it in its final factor). The B operands that a whole item reuses are
   transposed inputs (q^T, dout^T; k^T, v^T): T_COL puts the row of src at element off (already converted
   into tmp) as column r of the vector layer's fp32 tile, T_COL_CVT converts it first; the tile layer only
   records the row's address in rows, and STAGE_T packs the recorded rows into the tile layout once, straight
   from the bf16 input (tile_pack_b_t; through the fp32 tile and a scalar scatter per element, the q^T of a
   forward item is 5% of the tile forward's non-product samples, T = S = 2048, N8 H128).
   PRODUCT's st is that staging or NULL. LOAD_ROW brings one row of a per-tile input (K, V, q, dout) into its row buffer: fp32 for the
   vector layer, the bf16 as it is for the tile layer (cpu_tile_pack.h: same row starts, two per float),
   whose products with st take it as A and those without st as B (cpu_tile.h).
   The score products' scale is split (score_mul): where no bias tile is accumulated, the tile layer stores
   the raw products straight from the C tiles (alpha 1) and the exponent applies the scale, s * mul - m as
   one FMA (EXP_ARG, nmu = -m); otherwise the product applies it and mul is 1. The vector layer's mul is
   always 1 and its EXP_ARG is s + (-m), bitwise s - m. Storing through the tiles' fp32 staging with alpha
   costs a load, a multiply and a store per score: 4-5% of the tile forward's non-product time (T = S =
   2048, N8 H128, 2 threads, products emulated as no-ops on a Zen 4). */
#ifdef SA_TILE
#define QSCALE(c)                                           1.0f
#define PSCALE(c)                                           ((c)->scale2)
#define EXP_ARG(s, mulv, nmu)                               V_FMA(s, mulv, nmu)
#define T_COL(dst, ld, r, tmp, n, rows, src, off)           ((rows)[r] = (const uint16_t *)(src) + (off))
#define T_COL_CVT(B, dst, ld, r, src, t, off, n, mul, rows) T_COL(dst, ld, r, (B).tmp, n, rows, src, off)
#define STAGE_T(st, kd, N, Nt, rows)                        tile_pack_b_t((uint16_t *)(st), kd, N, Nt, rows)
#define LOAD_ROW(dst, src, t, off, n, npad, mul)            tile_load_row(dst, src, off, n)
#define PRODUCT(B, st, M, N, kd, A, ar, ak, Bm, ldb, C, ldc, acc, alpha)                       \
  ((st)                                                                                        \
       ? tile_gemm_staged(M, N, kd, A, ar, (const uint16_t *)(st), C, ldc, acc, alpha, (B).tc) \
       : tile_gemm_rows(M, N, kd, A, ak, Bm, ldb, C, ldc, acc, alpha, (uint16_t *)(B).ta, (uint16_t *)(B).tb, (B).tc))
#else
#define QSCALE(c)                                 ((c)->scale2)
#define PSCALE(c)                                 1.0f
#define EXP_ARG(s, mulv, nmu)                     V_ADD(s, nmu)
#define T_COL(dst, ld, r, tmp, n, rows, src, off) scatter_col(dst, ld, r, tmp, n)
#define T_COL_CVT(B, dst, ld, r, src, t, off, n, mul, rows) \
  (cvt((B).tmp, src, t, off, n, n, mul), scatter_col(dst, ld, r, (B).tmp, n))
#define STAGE_T(st, kd, N, Nt, rows)                                     ((void)0)
#define LOAD_ROW(dst, src, t, off, n, npad, mul)                         cvt(dst, src, t, off, n, npad, mul)
#define PRODUCT(B, st, M, N, kd, A, ar, ak, Bm, ldb, C, ldc, acc, alpha) gemm(M, N, kd, A, ar, ak, Bm, ldb, C, ldc, acc)
#endif

/* Lays the pass's tiles out in ws (64-byte aligned each) and returns the floats used; ws NULL: size only.
   Mp: the G * bq query rows of an item padded to a vector multiple (the vector axis of S^T). */
static size_t carve(const sa_cpu_ctx *c, sa_cpu_pass pass, float *ws, sa_bufs *B) {
  size_t off = 0;
#define TAKE(ptr, n)                         \
  do {                                       \
    (ptr) = ws ? ws + off : NULL;            \
    off += ((size_t)(n) + 15) & ~(size_t)15; \
  } while (0)
  const int64_t M = c->G * c->bq, Mp = pad_to(M), H = c->a->head_dim, Hv = c->a->v_head_dim;
  const int64_t hp = c->hp, hvp = c->hvp, BK = BODY_BK, BK2 = BODY_BK2, Q2 = BODY_BQ2;
  const int kil = c->kill || c->a->q_positions;
  memset(B, 0, sizeof *B);
  TAKE(B->tmp, SA_MAX(hp, hvp));
  TAKE(B->row, VW * SA_MAX(BK, BK2));
  if (kil) TAKE(B->krow, VW * SA_MAX(BK, BK2));
  if (pass == SA_CPU_FWD) {
    TAKE(B->qt, H * Mp);
    TAKE(B->kr, BK * hp);
    TAKE(B->v, BK * hvp);
    TAKE(B->s, BK * Mp);
    if (kil) TAKE(B->kl, BK * Mp);
    TAKE(B->acc, M * hvp);
    TAKE(B->r1, Mp);
    TAKE(B->r2, Mp);
    TAKE(B->cm, Mp);
    TAKE(B->cl, Mp);
    TAKE(B->mlo, Mp);
    TAKE(B->mhi, Mp);
  } else if (pass == SA_CPU_BWD_DQ) {
    TAKE(B->tmp2, hvp);
    TAKE(B->qt, H * Mp);
    TAKE(B->dt, Hv * Mp);
    TAKE(B->kr, BK * hp);
    TAKE(B->v, BK * hvp);
    TAKE(B->s, BK * Mp);
    if (kil) TAKE(B->kl, BK * Mp);
    TAKE(B->dp, BK * Mp);
    TAKE(B->acc, M * hp);
    TAKE(B->r1, Mp);
    TAKE(B->r2, Mp);
    TAKE(B->mlo, Mp);
    TAKE(B->mhi, Mp);
    TAKE(B->db, Mp);
  } else {
    TAKE(B->kt, H * BK2);
    TAKE(B->vt, Hv * BK2);
    TAKE(B->q, Q2 * hp);
    TAKE(B->d, Q2 * hvp);
    TAKE(B->s, Q2 * BK2);
    if (kil) TAKE(B->kl, Q2 * BK2);
    if (c->cap2 > 0.0f) TAKE(B->cf, Q2 * BK2);
    TAKE(B->dp, Q2 * BK2);
    TAKE(B->acc, BK2 * hp);
    TAKE(B->acc2, BK2 * hvp);
    TAKE(B->r1, Q2);
    TAKE(B->r2, Q2);
  }
#ifdef SA_TILE
  { /* depths: H, Hv, the keys of a tile, the rows of a dk/dv tile; widths: Mp, hp, hvp, the dk/dv keys */
    const int64_t kmax = SA_MAX(SA_MAX(hp, hvp), SA_MAX(BK, SA_MAX(BK2, Q2)));
    const int64_t nmax = SA_MAX(SA_MAX(Mp, hp), SA_MAX(hvp, BK2));
    TAKE(B->ta, (tile_a_elems(kmax) + 1) / 2);
    TAKE(B->tb, (tile_b_elems(kmax, nmax) + 1) / 2);
    TAKE(B->tc, SA_TILE_C_FLOATS);
    const int64_t pf = (int64_t)(sizeof(void *) / sizeof(float));
    float *ra, *rb;
    TAKE(ra, BK2 * pf);
    TAKE(rb, BK2 * pf);
    B->ra = (const uint16_t **)(void *)ra;
    B->rb = (const uint16_t **)(void *)rb;
    TAKE(B->sk, (tile_b_elems(H, BK2) + 1) / 2); /* the dk/dv items' (the forward and dq items are cpu_tile_*.h's) */
    TAKE(B->sv, (tile_b_elems(Hv, BK2) + 1) / 2);
  }
#endif
#undef TAKE
  return off;
}

#ifdef SA_TILE
static size_t tile_own_scratch(const sa_cpu_ctx *c, sa_cpu_pass pass);
#endif

static size_t scratch(const sa_cpu_ctx *c, sa_cpu_pass pass) {
  sa_bufs B;
#ifdef SA_TILE
  /* the tile kernels' own forward and dq items and their packing passes (cpu_tile_fwd.h, cpu_tile_bwd.h) */
  if (pass != SA_CPU_BWD_DKDV) return tile_own_scratch(c, pass);
#endif
  return carve(c, pass, NULL, &B);
}

/* The factor the exponent applies to a score product (EXP_ARG): the tile layer's scale when the product
   accumulates no bias tile, the scores are not soft-capped (the cap reads scaled scores) and the scale is
   positive (the maxima of raw and scaled scores then agree), else 1. The product's alpha is PSCALE /
   score_mul. */
static float score_mul(const sa_cpu_ctx *c, int add) {
  return add || c->cap2 > 0.0f || !(PSCALE(c) > 0.0f) ? 1.0f : PSCALE(c);
}

static void scale_row(float *o, int64_t n, float f) {
  vf fv = V_SET1(f);
  for (int64_t j = 0; j < n; j += VW) V_STORE(o + j, V_MUL(V_LOAD(o + j), fv));
}

/* Key ranges of positions [i0, i0 + np) and the union [*jlo, *jhi) of the non-empty ones. */
static void ranges(const sa_attn *a, int64_t ql, int64_t kl, int64_t i0, int64_t np, sa_range *rg, int64_t *jlo,
                   int64_t *jhi) {
  *jlo = kl;
  *jhi = 0;
  for (int64_t p = 0; p < np; p++) {
    rg[p] = sa_key_range(a, ql, kl, i0 + p);
    if (rg[p].lo < rg[p].hi) {
      *jlo = SA_MIN(*jlo, rg[p].lo);
      *jhi = SA_MAX(*jhi, rg[p].hi);
    }
  }
}

/* The next tile's q / dout rows asked into L1 in the dk/dv pass while this one computes: the vector kernels read
   64 rows a tile. The tile kernels' 128- and 256-row tiles would ask for up to 2048 lines at once,
   more than L1 holds, and ran their forward+backward in 0.93-0.95x the time without them (B1 T = S = 2048 N8
   H128 bf16, 2 threads, Xeon with AMX; into L2 instead: 1.00x). */
#ifdef SA_TILE
#define PREFETCH_NEXT(base, t, r0, n, stride, off, len) ((void)(base), (void)(r0), (void)(n), (void)(off))
#else
#define PREFETCH_NEXT(base, t, r0, n, stride, off, len) prefetch_rows(base, t, r0, n, stride, off, len)
#endif

/* The K and V rows of a tile as the products read them: row jj at k + jj * kld and v + jj * vld (floats; the
   tile layer's rows hold bf16, two per float). */
typedef struct {
  const float *k, *v;
  int64_t kld, vld;
} kv_rows;

/* K and V rows [j0, j0 + nk) of kv head kh converted into the row buffers, and a prefetch of the next tile's. */
static kv_rows load_kv_rows(const sa_cpu_ctx *c, const sa_bufs *B, int64_t b, int64_t kh, int64_t j0, int64_t nk,
                            int64_t jhi) {
  const sa_attn *a = c->a;
  const int64_t S = a->kv_len, Kh = a->kv_heads, H = a->head_dim, Hv = a->v_head_dim;
  if (j0 + BODY_BK < jhi) {
    int64_t nn = SA_MIN(BODY_BK, jhi - j0 - BODY_BK);
    prefetch_rows(a->k, a->dtype, b * S + j0 + BODY_BK, nn, Kh * H, kh * H, H);
    prefetch_rows(a->v, a->dtype, b * S + j0 + BODY_BK, nn, Kh * Hv, kh * Hv, Hv);
  }
  for (int64_t jj = 0; jj < nk; jj++) {
    int64_t row = (b * S + j0 + jj) * Kh + kh;
    LOAD_ROW(B->kr + jj * c->hp, a->k, a->dtype, row * H, H, c->hp, 1.0f);
    LOAD_ROW(B->v + jj * c->hvp, a->v, a->dtype, row * Hv, Hv, c->hvp, 1.0f);
  }
  const kv_rows kv = {B->kr, B->v, c->hp, c->hvp};
  return kv;
}

/* ---- forward --------------------------------------------------------------------------------- */

#ifndef SA_TILE /* the tile kernels' forward item is cpu_tile_fwd.h's */
#include "cpu_kernel_fwd.h"
#else
#include "cpu_tile_fwd.h"
#define fwd_item fwd_item_tile
#endif

/* ---- backward: D, dsinks partials and dq ----------------------------------------------------- */

/* lse in base 2 for recomputing p = 2^(s - lse2). An empty vanilla row has lse = -inf and only masked
   scores: reference 0 gives p = 2^-inf = 0 there instead of NaN. */
static float lse_base2(float lse) { return lse == -INFINITY ? 0.0f : lse * SA_LOG2E; }

#include "cpu_kernel_keys.h" /* after sa_bufs, kv_rows and LOAD_ROW, which it uses */

#ifndef SA_TILE /* the tile kernels' dq item is cpu_tile_bwd.h's */
static void dq_item(const sa_cpu_ctx *c, int64_t item, float *ws) {
  const sa_attn *a = c->a;
  const sa_attn_grad *gr = c->g;
  const sa_dtype dt = a->dtype;
  const int64_t T = a->q_len, N = a->q_heads, Kh = a->kv_heads, H = a->head_dim, Hv = a->v_head_dim;
  const int64_t G = c->G, hp = c->hp, hvp = c->hvp, BK = BODY_BK;
  const int64_t qb = item % c->nqb, kh = (item / c->nqb) % Kh, b = item / (c->nqb * Kh);
  const int64_t i0 = qb * c->bq, np = SA_MIN(c->bq, T - i0), M = G * np, Mp = pad_to(M);
  const int64_t ql = sa_q_len_of(a, b), kl = sa_kv_len_of(a, b);
  sa_bufs B;
  carve(c, SA_CPU_BWD_DQ, ws, &B);
  sa_range rg[SA_CPU_ROWS];
  int64_t jlo, jhi;
  ranges(a, ql, kl, i0, np, rg, &jlo, &jhi);
  /* r1: -lse2 per column, the exponent's nmu (EXP_ARG) */
  if (Mp > M) { /* padding columns: zero q and dout, p = 2^(0 - inf) = 0 */
    memset(B.qt, 0, (size_t)(H * Mp) * sizeof(float));
    memset(B.dt, 0, (size_t)(Hv * Mp) * sizeof(float));
    for (int64_t r = M; r < Mp; r++) {
      B.r1[r] = -INFINITY;
      B.r2[r] = 0.0f;
    }
  }
  for (int64_t g = 0; g < G; g++) {
    int64_t n = kh * G + g;
    float sink = sa_sink_logit(a, n), part = 0.0f;
    for (int64_t p = 0; p < np; p++) {
      int64_t r = g * np + p, i = i0 + p, orow = ((b * T + i) * N + n) * Hv, lrow = (b * N + n) * T + i;
      if (r + ROW_AHEAD < M) { /* the rows of the step ROW_AHEAD on */
        const int64_t ra = r + ROW_AHEAD, ta = b * T + i0 + ra % np, na = kh * G + ra / np;
        prefetch_rows(a->q, dt, ta, 1, N * H, na * H, H);
        prefetch_rows(gr->dout, dt, ta, 1, N * Hv, na * Hv, Hv);
        prefetch_rows(a->out, dt, ta, 1, N * Hv, na * Hv, Hv);
      }
      T_COL_CVT(B, B.qt, Mp, r, a->q, dt, ((b * T + i) * N + n) * H, H, QSCALE(c), B.ra);
      cvt(B.tmp, gr->dout, dt, orow, Hv, hvp, 1.0f);
      cvt(B.tmp2, a->out, dt, orow, Hv, hvp, 1.0f);
      T_COL(B.dt, Mp, r, B.tmp, Hv, B.rb, gr->dout, orow);
      vf acc = V_ZERO();
      for (int64_t e = 0; e < hvp; e += VW) acc = V_FMA(V_LOAD(B.tmp + e), V_LOAD(B.tmp2 + e), acc);
      float D = V_RADD(acc) - (gr->dlse ? gr->dlse[lrow] : 0.0f), lse = a->lse[lrow];
      c->dbuf[lrow] = D;
      B.r1[r] = -lse_base2(lse);
      B.r2[r] = D;
      /* As the reference: a row with lse = -inf has no mass; sink == lse (+inf sink) gives mass 1. */
      if (a->softmax == SA_SOFTMAX_LEARNABLE && lse != -INFINITY) part += (sink == lse ? 1.0f : expf(sink - lse)) * D;
    }
    if (a->softmax == SA_SOFTMAX_LEARNABLE) c->dsink_part[(n * a->batch + b) * c->nqb + qb] = part;
  }
  memset(B.acc, 0, (size_t)(M * hp) * sizeof(float));
  const int dbias = c->dbias_pass == SA_CPU_BWD_DQ;
  if (dbias) memset(B.db, 0, (size_t)Mp * sizeof(float));
  STAGE_T(B.sq, H, M, Mp, B.ra);
  STAGE_T(B.sd, Hv, M, Mp, B.rb);

  for (int64_t j0 = jlo; j0 < jhi; j0 += BK) {
    const int64_t nk = SA_MIN(BK, jhi - j0);
    const int cls = tile_class(a, b, rg, i0, np, j0, nk), pos = a->q_positions && cls == 1, add = c->fill;
    float *kill = c->kill || pos ? B.kl : NULL;
    if (cls == 0 ||
        ((add || kill) && !fill_cols(c, b, kh, add ? B.s : NULL, B.row, kill, B.krow, nk, Mp, M, np, i0, j0, pos)))
      continue;
    const float mul = score_mul(c, add);
    const vf mulv = V_SET1(mul);
    (void)mulv;
    kv_rows kv = load_kv_rows(c, &B, b, kh, j0, nk, jhi);
    PRODUCT(B, B.sq, nk, Mp, H, kv.k, kv.kld, 1, B.qt, Mp, B.s, Mp, add, PSCALE(c) / mul); /* S^T = (bias^T +) k q^T */
    finish_scores(c, B.s, kill, nk * Mp);
    if (cls == 1) mask_cols(a, b, B.s, nk, Mp, M, np, rg, i0, j0, B.mlo, B.mhi);
    PRODUCT(B, B.sd, nk, Mp, Hv, kv.v, kv.vld, 1, B.dt, Mp, B.dp, Mp, 0, 1.0f); /* dP^T = v dout^T */
    /* p = 2^(mul s - lse2); ds = p (dp - D) per column, times 1 - t^2 under a soft-cap; 0 where p is (a
       masked pair: whatever a NaN or inf value made of its dp) */
    if (c->cap2 > 0.0f) {
      const vf icap = V_SET1(1.0f / c->cap2);
      for (int64_t jj = 0; jj < nk; jj++) {
        float *s = B.s + jj * Mp, *dp = B.dp + jj * Mp;
        for (int64_t e = 0; e < Mp; e += VW) {
          const vf sv = V_LOAD(s + e), p = V_EXP2(EXP_ARG(sv, mulv, V_LOAD(B.r1 + e)));
          V_STORE(dp + e, V_MUL_NZ(p, V_MUL(V_SUB(V_LOAD(dp + e), V_LOAD(B.r2 + e)), cap_grad(sv, icap))));
        }
      }
    } else {
      for (int64_t jj = 0; jj < nk; jj++) {
        float *s = B.s + jj * Mp, *dp = B.dp + jj * Mp;
        for (int64_t e = 0; e < Mp; e += VW) {
          vf p = V_EXP2(EXP_ARG(V_LOAD(s + e), mulv, V_LOAD(B.r1 + e)));
          V_STORE(dp + e, V_MUL_NZ(p, V_SUB(V_LOAD(dp + e), V_LOAD(B.r2 + e))));
        }
      }
    }
    if (dbias) dbias_cols(B.dp, nk, Mp, B.db);
    const int64_t nbad = c->k_bad ? bad_keys_out(c, &B, &kv, b, kh, j0, nk) : 0;
    PRODUCT(B, NULL, M, hp, nk, B.dp, 1, Mp, kv.k, kv.kld, B.acc, hp, 1, 1.0f); /* dq += dS k */
    if (nbad) bad_keys_in(c, &B, b, kh, j0, nk, M, Mp);
  }
  for (int64_t r = 0; r < M; r++) {
    int64_t g = r / np, p = r % np, n = kh * G + g;
    put(gr->dq, dt, ((b * T + i0 + p) * N + n) * H, B.acc + r * hp, H, c->scale);
    if (dbias) gr->dbias[sa_bcast_at(c->bias_st, b, n, i0 + p, 0)] += B.db[r];
  }
}
#else
#include "cpu_tile_bwd.h"
#define dq_item dq_item_tile
static size_t tile_own_scratch(const sa_cpu_ctx *c, sa_cpu_pass pass) {
  tf_bufs F;
  tb_bufs Q;
  /* cpu_mask.h's column forms serve the body's S^T items, which these kernels replace (their S is query rows x
     keys): named here so that the compiler does not warn about them */
  (void)mask_cols;
  (void)fill_cols;
  (void)dbias_cols;
  (void)load_kv_rows; /* and the body's K / V row loading with its keys with a NaN or an inf (cpu_kernel_keys.h) */
  (void)bad_keys_out;
  (void)bad_keys_in;
  return pass == SA_CPU_FWD_PACK  ? tf_pack_scratch(c)
         : pass == SA_CPU_DQ_PACK ? tb_pack_scratch(c)
         : pass == SA_CPU_FWD     ? tf_carve(c, NULL, &F)
                                  : tb_carve(c, NULL, &Q);
}
#endif

/* ---- backward: dk, dv ------------------------------------------------------------------------ */

/* First row in [lo, hi) whose key range ends after j0 (want_hi) or starts at or after j0 (!want_hi):
   both ends of sa_key_range are non-decreasing in the row for rows < q_len. */
static int64_t first_row(const sa_attn *a, int64_t ql, int64_t kl, int64_t lo, int64_t hi, int64_t j0, int want_hi) {
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    sa_range r = sa_key_range(a, ql, kl, mid);
    if (want_hi ? r.hi > j0 : r.lo >= j0) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

static void dkdv_item(const sa_cpu_ctx *c, int64_t item, float *ws) {
  const sa_attn *a = c->a;
  const sa_attn_grad *gr = c->g;
  const sa_dtype dt = a->dtype;
  const int64_t T = a->q_len, S = a->kv_len, N = a->q_heads, Kh = a->kv_heads, H = a->head_dim, Hv = a->v_head_dim;
  const int64_t G = c->G, hp = c->hp, hvp = c->hvp, BK = BODY_BK2, Q2 = BODY_BQ2;
  const int64_t kb = item % c->nkb, kh = (item / c->nkb) % Kh, b = item / (c->nkb * Kh);
  const int64_t ql = sa_q_len_of(a, b), kl = sa_kv_len_of(a, b);
  /* Keys in [kl, S) are padding: never loaded (whatever they hold), their dk and dv are 0. */
  const int64_t j0 = kb * BK, nall = SA_MIN(BK, S - j0), nk = SA_MAX(0, SA_MIN(nall, kl - j0));
  sa_bufs B;
  carve(c, SA_CPU_BWD_DKDV, ws, &B);
  if (nk < BK) { /* columns past nk only feed dk/dv rows that are never computed */
    memset(B.kt, 0, (size_t)(H * BK) * sizeof(float));
    memset(B.vt, 0, (size_t)(Hv * BK) * sizeof(float));
  }
  for (int64_t jj = 0; jj < nk; jj++) {
    int64_t row = (b * S + j0 + jj) * Kh + kh;
    T_COL_CVT(B, B.kt, BK, jj, a->k, dt, row * H, H, 1.0f, B.ra);
    T_COL_CVT(B, B.vt, BK, jj, a->v, dt, row * Hv, Hv, 1.0f, B.rb);
  }
  memset(B.acc, 0, (size_t)(nall * hp) * sizeof(float));
  memset(B.acc2, 0, (size_t)(nall * hvp) * sizeof(float));
  STAGE_T(B.sk, H, nk, BK, B.ra);
  STAGE_T(B.sv, Hv, nk, BK, B.rb);
  const int64_t ib = first_row(a, ql, kl, 0, ql, j0, 1);
  const int64_t ie = nk > 0 ? first_row(a, ql, kl, ib, ql, j0 + nk, 0) : ib;
  sa_range rg[BODY_BQ2];

  const int dbias = c->dbias_pass == SA_CPU_BWD_DKDV;

  for (int64_t i0 = ib; i0 < ie; i0 += Q2) {
    const int64_t np = SA_MIN(Q2, ie - i0);
    for (int64_t p = 0; p < np; p++) rg[p] = sa_key_range(a, ql, kl, i0 + p);
    const int cls = tile_class(a, b, rg, i0, np, j0, nk), pos = a->q_positions && cls == 1, add = c->fill;
    float *kill = c->kill || pos ? B.kl : NULL;
    if (cls == 0) continue;
    for (int64_t g = 0; g < G; g++) {
      const int64_t n = kh * G + g;
      if ((add || kill) && !fill_rows(c, b, n, add ? B.s : NULL, kill, np, BK, nk, i0, j0, pos)) continue;
      for (int64_t p = 0; p < np; p++) {
        int64_t i = i0 + p, lrow = (b * N + n) * T + i;
        LOAD_ROW(B.q + p * hp, a->q, dt, ((b * T + i) * N + n) * H, H, hp, QSCALE(c));
        LOAD_ROW(B.d + p * hvp, gr->dout, dt, ((b * T + i) * N + n) * Hv, Hv, hvp, 1.0f);
        B.r1[p] = lse_base2(a->lse[lrow]);
        B.r2[p] = c->dbuf[lrow];
      }
      { /* the rows of the next (head, tile) step */
        int64_t ng = g + 1 < G ? n + 1 : kh * G, ni = g + 1 < G ? i0 : i0 + Q2, nn = SA_MIN(Q2, ie - ni);
        if (nn > 0) {
          PREFETCH_NEXT(a->q, dt, b * T + ni, nn, N * H, ng * H, H);
          PREFETCH_NEXT(gr->dout, dt, b * T + ni, nn, N * Hv, ng * Hv, Hv);
        }
      }
      const float mul = score_mul(c, add);
      const vf mulv = V_SET1(mul);
      (void)mulv;
      PRODUCT(B, B.sk, np, BK, H, B.q, hp, 1, B.kt, BK, B.s, BK, add, PSCALE(c) / mul); /* S = (bias +) q k^T */
      finish_scores(c, B.s, kill, np * BK);
      if (cls == 1) mask_rows(a, b, B.s, np, BK, nk, rg, i0, j0);
      if (B.cf) { /* the soft-cap's 1 - t^2 while the capped scores are still there */
        const vf icap = V_SET1(1.0f / c->cap2);
        for (int64_t e = 0; e < np * BK; e += VW) V_STORE(B.cf + e, cap_grad(V_LOAD(B.s + e), icap));
      }
      for (int64_t p = 0; p < np; p++) { /* p = 2^(mul s - lse2) */
        float *s = B.s + p * BK;
        vf nl2 = V_SET1(-B.r1[p]);
        for (int64_t e = 0; e < BK; e += VW) V_STORE(s + e, V_EXP2(EXP_ARG(V_LOAD(s + e), mulv, nl2)));
      }
      PRODUCT(B, NULL, nk, hvp, np, B.s, 1, BK, B.d, hvp, B.acc2, hvp, 1, 1.0f); /* dv += P^T dout */
      PRODUCT(B, B.sv, np, BK, Hv, B.d, hvp, 1, B.vt, BK, B.dp, BK, 0, 1.0f);    /* dP = dout v^T */
      for (int64_t p = 0; p < np; p++) { /* ds = p (dp - D) (1 - t^2 under a soft-cap), 0 where p is */
        float *s = B.s + p * BK, *dp = B.dp + p * BK;
        vf Dv = V_SET1(B.r2[p]);
        if (B.cf)
          for (int64_t e = 0; e < BK; e += VW)
            V_STORE(dp + e, V_MUL_NZ(V_LOAD(s + e), V_MUL(V_SUB(V_LOAD(dp + e), Dv), V_LOAD(B.cf + p * BK + e))));
        else
          for (int64_t e = 0; e < BK; e += VW) V_STORE(dp + e, V_MUL_NZ(V_LOAD(s + e), V_SUB(V_LOAD(dp + e), Dv)));
      }
      if (dbias) dbias_rows(c, b, n, B.dp, np, BK, nk, i0, j0);
      PRODUCT(B, NULL, nk, hp, np, B.dp, 1, BK, B.q, hp, B.acc, hp, 1, 1.0f); /* dk += dS^T (QSCALE q) */
    }
  }
  /* dk = scale * dS^T q = ln(2) * scale2 * dS^T q: the vector layer's q carries scale2 (QSCALE), the tile
     layer's product adds it here (PSCALE), so that dk accumulates through the tiles without an alpha. */
  for (int64_t jj = 0; jj < nall; jj++) {
    int64_t row = (b * S + j0 + jj) * Kh + kh;
    put(gr->dk, dt, row * H, B.acc + jj * hp, H, SA_LN2 * PSCALE(c));
    put(gr->dv, dt, row * Hv, B.acc2 + jj * hvp, Hv, 1.0f);
  }
}

/* Item `item` of sa_cpu_grid_of's grid: its sub-items in order. */
static void run(const sa_cpu_ctx *c, sa_cpu_pass pass, int64_t item, float *ws) {
  const sa_cpu_grid g = sa_cpu_grid_of(c, pass);
  for (int64_t k = 0; k < g.gb * g.gk * g.gl; k++) {
    const int64_t sub = sa_cpu_sub_item(&g, c->a->kv_heads, item, k);
    switch (pass) {
      case SA_CPU_FWD: fwd_item(c, sub, ws); break;
      case SA_CPU_BWD_DQ: dq_item(c, sub, ws); break;
#ifdef SA_TILE
      case SA_CPU_FWD_PACK: tf_pack_item(c, sub, ws); break;
      case SA_CPU_DQ_PACK: tb_pack_item(c, sub, ws); break;
#endif
      default: dkdv_item(c, sub, ws); break;
    }
  }
}

#ifdef SA_TILE
const sa_cpu_kernels SA_K_TABLE = {SA_K_NAME, scratch, run, tile_begin, tile_end, tile_config_read};
#else
const sa_cpu_kernels SA_K_TABLE = {SA_K_NAME, scratch, run, NULL, NULL, NULL};
#endif
