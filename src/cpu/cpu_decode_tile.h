/*
 * cpu_decode_tile.h — the decode work item with Q.K^T and P.V on AMX tiles (plans cpu.decode.amx and
 * cpu.decode.amx.emulated; docs/cpu.md, "Decode"), compiled twice: cpu_decode_amx.c over the instructions,
 * cpu_decode_amxemu.c over their emulation (cpu_tile_isa.h, SA_TILE_EMULATED). The includer names the item
 * and its scratch size (SA_DEC_TILE_FN, SA_DEC_TILE_SCRATCH) and its configuration probe (SA_DEC_TILE_CONFIG). bf16 caches, head_dim a multiple of 32
 * (cpu_plan.c refuses the rest, naming why).
 *
 * The item is the AVX-512 one's (cpu_decode_avx512.c) with its products moved to tiles: S^T [keys][rows]
 * with the query rows in the 16 lanes (for R <= 8, 16 / lanes kv heads share a vector: sa_dec_pack_of),
 * blocks of keys, the online softmax down the lanes in fp32 AVX-512 (sa_dec_softmax). Per block, S^T of every
 * kv head first (the block's K rows, one contiguous region of every head, in one sweep that the L2 streamer
 * follows), then each group's softmax and P, then P V head by head: against the groups taken in turn with the
 * next group's K rows asked into L1, 0.91x the time at B8 S 32k (gpt-oss, bf16, 2 threads; B1 1.00x). On Sapphire Rapids that item is bound by its vector work (Zen 5: without Q.K^T it runs
 * 25% faster, without P.V 11%); here per head and 32 keys the two products are 8 TDPBF16PS and what is
 * left to the vectors is the softmax, the P and V layouts and the o tiles' loads and stores.
 *  - S^T of a head = K Q^T. A = 16 keys x 32 dims straight from the cache rows: TILELOADD takes the stride
 *    (K H 2 bytes between keys), so K is never packed (hence head_dim a multiple of 32). B = the head's Q^T,
 *    staged once per item in VNNI blocks (the cache's own bf16 pairs of q). The C tile is tw = min(lanes,
 *    16) columns wide, the head's rows only, and is stored into the head's lane slot of S^T: heads sharing a
 *    vector never add into each other's lanes (an inf in one head's keys stays in its lanes).
 *  - o of a head += P V. A = the head's lanes of P, rounded to bf16 and read transposed from S^T
 *    (tile_pack_a_t), tw rows. B = the block's V rows paired into VNNI form (keys 2e, 2e + 1 interleaved per
 *    dim): one vpunpcklwd and one vpunpckhwd per 32 dims and key pair, which leaves the 16 columns of a tile
 *    in a permuted dim order, put back once per item (sa_dtl_unpermute). C = o itself, tw rows x 16 dims,
 *    loaded from and stored to the item's fp32 o through the tile. The online-softmax rescale of o
 *    (AVX-512) runs only for a head with some factor != 1: with a stable running maximum most blocks skip it.
 * cpu_tile.h's products configure every tile as 16 rows x 64 bytes; at gpt-oss's R = 8 half of each S^T,
 * P and o tile would then be another head's rows or padding, merged afterwards. This item configures its
 * tiles per shape (tw wide S^T, tw high P and o), once per item, and releases them at its end.
 */
#ifndef SA_CPU_DECODE_TILE_H
#define SA_CPU_DECODE_TILE_H

#include "cpu_decode_avx512.h"
#include "cpu_tile_isa.h"
#include "cpu_tile_pack.h"

/* Keys per block: one k step of P.V (32 keys a TDPBF16PS), two 16-key tiles of S^T. A block of every head is
   64 KiB of cache at gpt-oss's K 8, H 64 (32 KiB of K, 32 of V), the item's staging ~20 KiB. */
#define SA_DTL_BK 32
#define SA_DTL_KS (SA_DTL_BK / SA_TILE_K) /* k steps of P.V per block */

/* Tile numbers (literals: the intrinsics put them into the instruction's text): S^T of the block's two key
   tiles, their K rows, Q^T, then P, V pairs and o. */
#define TD_S0 0
#define TD_S1 1
#define TD_K0 2
#define TD_K1 3
#define TD_Q  4
#define TD_P  5
#define TD_V  6
#define TD_O  7

typedef struct {
  sa_dec_pack pk;
  int64_t tw;   /* a head's lanes per tile: S^T tile columns, P and o tile rows (1, 2, 4, 8 or 16) */
  int64_t nct;  /* tiles of lanes per head: lanes / tw (R > 8: Rp / 16) */
  int64_t ks;   /* k steps of Q.K^T: H / 32 */
  int64_t hv32; /* o's width: Hv rounded up to 32 (two 16-column tiles per 32 dims of V) */
} sa_dtl;

static sa_dtl sa_dtl_of(const sa_attn *a, const sa_cpu_plan *p) {
  sa_dtl s;
  s.pk = sa_dec_pack_of(p->rows, a->kv_heads);
  s.tw = s.pk.lanes < 16 ? s.pk.lanes : 16;
  s.nct = s.pk.lanes / s.tw;
  s.ks = a->head_dim / SA_TILE_K;
  s.hv32 = (a->v_head_dim + 31) & ~(int64_t)31;
  return s;
}

/* Floats of the item's scratch, each piece a multiple of 16 floats (64-byte aligned): Q^T blocks
   [K][nct][ks] (bf16), S^T per group [groups][BK][Rp], the block's rescale factors per group and the lanes' key
   ranges [groups + 2][Rp], m and l per group [2][groups][Rp], the P panels per group [groups][Rp][BK] (bf16),
   the V pairs [hv32 / 16][KS] blocks (bf16), o [K][lanes][hv32], and one key tile's rows [16][H] (bf16) for a
   block that ends inside it. */
int64_t SA_DEC_TILE_SCRATCH(const sa_attn *a, const sa_cpu_plan *p) {
  const sa_dtl s = sa_dtl_of(a, p);
  const int64_t Rp = s.pk.Rp, K = a->kv_heads, ng = s.pk.groups;
  return K * s.nct * s.ks * SA_TILE_BLK / 2 + ng * SA_DTL_BK * Rp + (ng + 2) * Rp + 2 * ng * Rp +
         ng * Rp * SA_DTL_BK / 2 + (s.hv32 / SA_TILE_N) * SA_DTL_KS * SA_TILE_BLK / 2 + K * s.pk.lanes * s.hv32 +
         SA_TILE_M * a->head_dim / 2;
}

/* The item's tile shapes (palette 1). TDPBF16PS needs C m x n, A m x k pairs, B k pair-rows x n: S^T 16 keys
   x tw, K 16 keys x 32 dims, Q^T 16 pair-rows x tw; o tw x 16 dims, P tw x 32 keys, V 16 pair-rows x 16. */
static void sa_dtl_config(const sa_dtl *s) {
  sa_tile_cfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  const uint16_t w = (uint16_t)(4 * s->tw);
  const uint16_t colsb[8] = {w, w, 64, 64, w, 64, 64, 64};
  const uint8_t rows[8] = {16, 16, 16, 16, 16, (uint8_t)s->tw, 16, (uint8_t)s->tw};
  for (int t = 0; t < 8; t++) {
    cfg.colsb[t] = colsb[t];
    cfg.rows[t] = rows[t];
  }
  TILE_LOADCONFIG(&cfg);
}

/* sa_dtl_config as an item runs it, then the configuration the thread holds (STTILECFG) into got (64 bytes),
   then TILERELEASE; returns the item's tw, from which tests/test_tile_config.c states the intended block. */
int64_t SA_DEC_TILE_CONFIG(const sa_attn *a, const sa_cpu_plan *p, void *got) {
  const sa_dtl s = sa_dtl_of(a, p);
  sa_dtl_config(&s);
  TILE_STORECONFIG((sa_tile_cfg *)got);
  TILE_RELEASE();
  return s.tw;
}

/* Q^T of every kv head as VNNI B blocks qb [kh][ct][s] (32 dims x 16 columns each): pair-row e of column x
   is the dword 16 s + e of query row ct tw + x of head kh, i.e. its bf16 elements 32 s + 2 e and + 1 as q
   holds them (exact: the scale is applied to the fp32 scores); columns past tw and rows past R are 0. */
static void sa_dtl_stage_q(const sa_decode_item *it, const sa_dtl *s, uint16_t *qb) {
  const sa_attn *a = it->a;
  const int64_t H = a->head_dim, G = it->group, R = it->plan->rows, N = a->q_heads, T = a->q_len, b = it->b;
  const int64_t blk32 = SA_TILE_BLK / 2; /* dwords of a block */
  memset(qb, 0, (size_t)(a->kv_heads * s->nct * s->ks * SA_TILE_BLK) * sizeof(uint16_t));
  for (int64_t kh = 0; kh < a->kv_heads; kh++)
    for (int64_t r = 0; r < R; r++) {
      const uint16_t *q = (const uint16_t *)a->q + ((b * T + r / G) * N + kh * G + r % G) * H;
      uint32_t *col = (uint32_t *)(void *)qb + (kh * s->nct + r / s->tw) * s->ks * blk32 + r % s->tw;
      for (int64_t d2 = 0; d2 < H / 2; d2++) memcpy(col + (d2 / 16) * blk32 + (d2 % 16) * SA_TILE_N, q + 2 * d2, 4);
    }
}

/* The block's scores into base 2: st *= qscale in the lanes of existing heads, 0 in the lanes of a last group
   short of hpv heads (no tile writes them; 0 keeps them finite). */
static void sa_dtl_scale(float *st, int64_t nb, int64_t Rp, __mmask16 live, float qscale) {
  const __m512 qs = _mm512_set1_ps(qscale);
  for (int64_t jj = 0; jj < nb; jj++)
    for (int64_t v = 0; v < Rp; v += 16)
      _mm512_store_ps(st + jj * Rp + v, _mm512_maskz_mul_ps(live, _mm512_load_ps(st + jj * Rp + v), qs));
}

/* V rows of the block's keys (row jj at v0 + jj * vstride elements; zero from nb on, and past Hv) as the VNNI
   B blocks vb [c2][s] of 32 keys x 16 columns. Pair-row e of a block holds keys 2e, 2e + 1; for 32 dims
   [32 c, 32 c + 32) vpunpcklwd gives tile 2c the dims 32 c + 8 q + i and vpunpckhwd tile 2c + 1 the dims
   32 c + 8 q + 4 + i (column 4 q + i, q, i in 0..3): o's columns in that order until sa_dtl_unpermute. A
   share of the next block's lines is asked into L2 per key pair. */
static void sa_dtl_pack_v(const uint16_t *v0, int64_t vstride, int64_t nb, int64_t Hv, int64_t hv32, uint16_t *vb,
                          sa_dec_pf *pf) {
  for (int64_t e = 0; e < SA_DTL_BK / 2; e++) {
    sa_dec_pf_step(pf, pf->per);
    const uint16_t *r0 = v0 + 2 * e * vstride, *r1 = r0 + vstride;
    uint16_t *dst = vb + (e / 16) * SA_TILE_BLK + (e % 16) * 2 * SA_TILE_N;
    for (int64_t c = 0; c < hv32 / 32; c++) {
      const int64_t n = Hv - 32 * c;
      const __mmask32 m = n >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << n) - 1u);
      const __m512i x0 = 2 * e < nb ? _mm512_maskz_loadu_epi16(m, r0 + 32 * c) : _mm512_setzero_si512();
      const __m512i x1 = 2 * e + 1 < nb ? _mm512_maskz_loadu_epi16(m, r1 + 32 * c) : _mm512_setzero_si512();
      _mm512_store_si512(dst + (2 * c) * SA_DTL_KS * SA_TILE_BLK, _mm512_unpacklo_epi16(x0, x1));
      _mm512_store_si512(dst + (2 * c + 1) * SA_DTL_KS * SA_TILE_BLK, _mm512_unpackhi_epi16(x0, x1));
    }
  }
}

/* o rows [n][hv32] (columns in sa_dtl_pack_v's order) into dst rows astride floats apart, in dim order. */
static void sa_dtl_unpermute(const float *o, int64_t n, int64_t hv32, float *dst, int64_t astride) {
  const __m512i lo = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
  const __m512i hi = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
  for (int64_t r = 0; r < n; r++)
    for (int64_t c = 0; c < hv32; c += 32) {
      const __m512 e = _mm512_load_ps(o + r * hv32 + c), f = _mm512_load_ps(o + r * hv32 + c + 16);
      _mm512_storeu_ps(dst + r * astride + c, _mm512_permutex2var_ps(e, lo, f));
      _mm512_storeu_ps(dst + r * astride + c + 16, _mm512_permutex2var_ps(e, hi, f));
    }
}

/* S^T of one kv head for the block's nb keys into its lane slot st + slot (rows Rp floats apart). Key row jj at
   k0 + jj * kst bytes; a key tile that the block ends inside is copied into kb with zero rows after it (the
   cache may end right after its last key). Per 32-dim k step, Q^T is loaded once for both key tiles. */
static void sa_dtl_scores(const sa_dtl *s, const char *k0, int64_t kst, int64_t nb, int64_t H, const uint16_t *qb,
                          float *st, int64_t Rp, uint16_t *kb) {
  const char *a0 = k0, *a1 = k0 + 16 * kst;
  int64_t s0 = kst, s1 = kst;
  const int two = nb > 16;
  if (nb < (two ? 32 : 16)) { /* the block's last key tile is partial */
    const int64_t first = two ? 16 : 0, nv = nb - first;
    for (int64_t jj = 0; jj < 16; jj++) {
      if (jj < nv) memcpy(kb + jj * H, k0 + (first + jj) * kst, (size_t)H * sizeof(uint16_t));
      else memset(kb + jj * H, 0, (size_t)H * sizeof(uint16_t));
    }
    if (two) a1 = (const char *)kb, s1 = H * (int64_t)sizeof(uint16_t);
    else a0 = (const char *)kb, s0 = H * (int64_t)sizeof(uint16_t);
  }
  for (int64_t ct = 0; ct < s->nct; ct++) {
    const uint16_t *q = qb + ct * s->ks * SA_TILE_BLK;
    float *dst = st + ct * s->tw;
    TILE_ZERO(TD_S0);
    if (two) TILE_ZERO(TD_S1);
    for (int64_t k = 0; k < s->ks; k++) {
      TILE_LOADD(TD_Q, q + k * SA_TILE_BLK, 2 * SA_TILE_N * (int64_t)sizeof(uint16_t));
      TILE_LOADD(TD_K0, a0 + k * SA_TILE_K * (int64_t)sizeof(uint16_t), s0);
      TILE_DPBF16PS(TD_S0, TD_K0, TD_Q);
      if (two) {
        TILE_LOADD(TD_K1, a1 + k * SA_TILE_K * (int64_t)sizeof(uint16_t), s1);
        TILE_DPBF16PS(TD_S1, TD_K1, TD_Q);
      }
    }
    TILE_STORED(TD_S0, dst, Rp * (int64_t)sizeof(float));
    if (two) TILE_STORED(TD_S1, dst + 16 * Rp, Rp * (int64_t)sizeof(float));
  }
}

/* o [lanes][hv32] of one kv head += P V: P's rows from the panel pa [.][BK] at the head's first lane, V pairs
   vb; each o tile (tw rows x 16 dims) through the tiles from memory and back. */
static void sa_dtl_pv(const sa_dtl *s, const uint16_t *pa, const uint16_t *vb, float *o) {
  const int64_t ostride = s->hv32 * (int64_t)sizeof(float), pstride = SA_DTL_BK * (int64_t)sizeof(uint16_t);
  for (int64_t rt = 0; rt < s->nct; rt++)
    for (int64_t c2 = 0; c2 < s->hv32 / SA_TILE_N; c2++) {
      float *ot = o + rt * s->tw * s->hv32 + c2 * SA_TILE_N;
      TILE_LOADD(TD_O, ot, ostride);
      for (int64_t k = 0; k < SA_DTL_KS; k++) {
        TILE_LOADD(TD_P, pa + rt * s->tw * SA_DTL_BK + k * SA_TILE_K, pstride);
        TILE_LOADD(TD_V, vb + (c2 * SA_DTL_KS + k) * SA_TILE_BLK, 2 * SA_TILE_N * (int64_t)sizeof(uint16_t));
        TILE_DPBF16PS(TD_O, TD_P, TD_V);
      }
      TILE_STORED(TD_O, ot, ostride);
    }
}

/* o rows [n][hv32] *= their factors, unless every factor is 1 (then o stays bitwise what it is). */
static void sa_dtl_rescale(float *o, int64_t n, int64_t hv32, const float *corr) {
  int any = 0;
  for (int64_t r = 0; r < n; r++) any |= corr[r] != 1.0f;
  if (!any) return;
  for (int64_t r = 0; r < n; r++) {
    const __m512 c = _mm512_set1_ps(corr[r]);
    for (int64_t d = 0; d < hv32; d += 16)
      _mm512_store_ps(o + r * hv32 + d, _mm512_mul_ps(c, _mm512_load_ps(o + r * hv32 + d)));
  }
}

void SA_DEC_TILE_FN(const sa_decode_item *it, float *scratch) {
  const sa_attn *a = it->a;
  const int64_t H = a->head_dim, Hv = a->v_head_dim, K = a->kv_heads, S = a->kv_len, b = it->b;
  const sa_dtl sh = sa_dtl_of(a, it->plan);
  const int64_t Rp = sh.pk.Rp, ng = sh.pk.groups, hpv = sh.pk.hpv, lanes = sh.pk.lanes, hv32 = sh.hv32;
  uint16_t *qb = (uint16_t *)(void *)scratch;
  float *st = scratch + K * sh.nct * sh.ks * SA_TILE_BLK / 2, *corr = st + ng * SA_DTL_BK * Rp;
  int32_t *rlo = (int32_t *)(void *)(corr + ng * Rp), *rhi = rlo + Rp;
  float *gm = corr + (ng + 2) * Rp, *gl = gm + ng * Rp;
  uint16_t *pa = (uint16_t *)(void *)(gl + ng * Rp), *vb = pa + ng * Rp * SA_DTL_BK;
  float *ob = (float *)(void *)(vb + (hv32 / SA_TILE_N) * SA_DTL_KS * SA_TILE_BLK);
  uint16_t *kb = (uint16_t *)(void *)(ob + K * lanes * hv32);
  int64_t lo_max, hi_min;
  sa_dec_lanes_init(it, &sh.pk, rlo, rhi, gm, gl, &lo_max, &hi_min);
  memset(st, 0, (size_t)(ng * SA_DTL_BK * Rp) * sizeof(float));
  memset(ob, 0, (size_t)(K * lanes * hv32) * sizeof(float));
  sa_dtl_config(&sh);
  sa_dtl_stage_q(it, &sh, qb);
  const uint16_t *kc = (const uint16_t *)a->k, *vc = (const uint16_t *)a->v;
  const int64_t kst = K * H * (int64_t)sizeof(uint16_t), es = (int64_t)sizeof(uint16_t);

  for (int64_t j0 = it->jlo; j0 < it->jhi; j0 += SA_DTL_BK) {
    const int64_t nb = it->jhi - j0 < SA_DTL_BK ? it->jhi - j0 : SA_DTL_BK;
    const int mask = j0 < lo_max || j0 + nb > hi_min; /* some row's range cuts this block */
    const int64_t jp = j0 + SA_DTL_BK, np = it->jhi - jp < SA_DTL_BK ? it->jhi - jp : SA_DTL_BK;
    /* the next block's K and V regions (contiguous: every head of its keys), asked into L2 group by group */
    const char *kn = np > 0 ? (const char *)(kc + (b * S + jp) * K * H) : NULL;
    const char *vn = np > 0 ? (const char *)(vc + (b * S + jp) * K * Hv) : NULL;
    const int64_t kl_lines = np > 0 ? (np * K * H * es + 63) / 64 : 0;
    const int64_t vl_lines = np > 0 ? (np * K * Hv * es + 63) / 64 : 0;
    /* S^T of every head first, so that the block's K rows (every head of its keys, one contiguous region) are
       read in one sweep, which the L2 streamer follows; then per group the softmax and P */
    for (int64_t kh = 0; kh < K; kh++) {
      const int64_t g = kh / hpv, h = kh % hpv;
      const char *k0 = (const char *)(kc + ((b * S + j0) * K + kh) * H);
      sa_dtl_scores(&sh, k0, kst, nb, H, qb + kh * sh.nct * sh.ks * SA_TILE_BLK, st + g * SA_DTL_BK * Rp + h * lanes,
                    Rp, kb);
    }
    for (int64_t g = 0; g < ng; g++) {
      const int64_t nh = K - g * hpv < hpv ? K - g * hpv : hpv;
      float *sg = st + g * SA_DTL_BK * Rp;
      const __mmask16 live = hpv > 1 && nh * lanes < 16 ? (__mmask16)((1u << (nh * lanes)) - 1u) : (__mmask16)0xffff;
      sa_dtl_scale(sg, nb, Rp, live, it->qscale);
      sa_dec_softmax(Rp, nb, j0 - it->jlo, mask, rlo, rhi, sg, gm + g * Rp, gl + g * Rp, corr + g * Rp);
      for (int64_t m0 = 0; m0 < Rp; m0 += 2 * SA_TILE_M)
        tile_pack_a_t(pa + (g * Rp + m0) * SA_DTL_BK, SA_DTL_BK, m0, Rp, nb, sg, Rp);
    }
    /* then P V head by head (V, likewise one region), the next block's lines asked into L2 a few per key pair */
    for (int64_t g = 0; g < ng; g++) {
      const int64_t kh0 = g * hpv, nh = K - kh0 < hpv ? K - kh0 : hpv;
      sa_dec_pf pf = {kn ? kn + 64 * (g * kl_lines / ng) : NULL, vn ? vn + 64 * (g * vl_lines / ng) : NULL,
                      (g + 1) * kl_lines / ng - g * kl_lines / ng, (g + 1) * vl_lines / ng - g * vl_lines / ng, 0};
      pf.per = (pf.n + pf.n2 + nh * (SA_DTL_BK / 2) - 1) / (nh * (SA_DTL_BK / 2));
      for (int64_t h = 0; h < nh; h++) {
        float *o = ob + (kh0 + h) * lanes * hv32;
        sa_dtl_rescale(o, lanes, hv32, corr + g * Rp + h * lanes);
        sa_dtl_pack_v(vc + ((b * S + j0) * K + kh0 + h) * Hv, K * Hv, nb, Hv, hv32, vb, &pf);
        sa_dtl_pv(&sh, pa + (g * Rp + h * lanes) * SA_DTL_BK, vb, o);
      }
      sa_dec_pf_step(&pf, pf.n + pf.n2); /* what the key pairs left */
    }
  }
  TILE_RELEASE();
  sa_dec_lanes_out(it, &sh.pk, gm, gl);
  for (int64_t kh = 0; kh < K; kh++)
    sa_dtl_unpermute(ob + kh * lanes * hv32, it->plan->rows, hv32, it->acc + kh * it->plan->rows * it->astride,
                     it->astride);
}

#endif /* SA_CPU_DECODE_TILE_H */
