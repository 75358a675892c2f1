/*
 * cpu_decode_avx512.c — the decode work item for AVX-512 (cpu.decode.avx512 and cpu.decode.avx512bf16).
 * CMake compiles it with -mavx512f/bw/vl/dq -mfma -mf16c (the file name says so); the vdpbf16ps functions
 * carry their own target attribute and run only under the avx512bf16 plan, which needs AVX512-BF16.
 *
 * Scores are kept transposed, S^T [keys][rows], with the query rows in the vector lanes: the R rows of a
 * kv head padded to a multiple of 16, or, for R <= 8, the rows of 16 / lanes kv heads sharing a vector
 * (sa_dec_pack_of):
 *  - Q.K^T needs no transposed K: a key's score vector is sum_d k[j][d] * Q^T[d][rows], k[j][d] broadcast
 *    straight from the cache rows (bf16 pairs into vdpbf16ps, f32, or an fp32 copy of f16 / bf16 rows);
 *  - the online softmax runs down the lanes: maxima, exp2, sums and rescale factors are vectors over the
 *    rows, without horizontal reductions;
 *  - P.V keeps 8 rows x 32 output dims in registers and broadcasts P^T[j][r] from the score block.
 * Per block of SA_DEC_BK keys the three steps run for one group of kv heads, then the next, so the cache
 * is read front to back; meanwhile the next block is asked into L2, a few lines per P.V step, and the
 * rows of a later group of this block into L1.
 */
#include "cpu_decode_avx512.h"

/* Keys per block and the prefetch distances, measured on one Zen 5 core with a DRAM-resident cache (bf16,
   B 1, S 32k, N/K 64/8, H 64, two kv heads per score vector; time ratios, medians of 11 interleaved
   rounds): the next block's K and V lines (every head) asked into L2 a few per key step of the P.V loops,
   and this block's rows of the group of heads two groups ahead into L1. 16-key blocks 1.00, one group
   ahead 1.04, 32-key blocks 1.27, 24 keys 1.44 (13.2 GB/s at the best). The L2 lines issued in one burst
   per head instead of spread stalled the loads behind full miss buffers (one head per vector, 64-key
   blocks, one run: 6.7 vs 9.3 GB/s; at 32 keys the spread lines gave 13.3). */
#define SA_DEC_BK       16
#define SA_DEC_L1_AHEAD 2

#define SA_BF16_TARGET __attribute__((target("avx512bf16")))

/* Floats of the kernel's scratch: Q^T [groups][H][Rp] (fp32; bf16 pairs use half), S^T [BK][Rp], the block's
   rescale factors [Rp], the lanes' key ranges as int32 [2][Rp], m and l per group [2][groups][Rp], and an fp32
   copy of a group's K block [hpv][BK][H] for caches without a direct broadcast (f16, bf16 without
   AVX512-BF16). */
int64_t sa_cpu_decode_avx512_scratch(const sa_attn *a, const sa_cpu_plan *p) {
  const sa_dec_pack pk = sa_dec_pack_of(p->rows, a->kv_heads);
  return pk.groups * a->head_dim * pk.Rp + SA_DEC_BK * pk.Rp + 3 * pk.Rp + 2 * pk.groups * pk.Rp +
         pk.hpv * SA_DEC_BK * sa_al16(a->head_dim);
}

/* Key k of a group at 4-key bases: bases[k / 4] + (k % 4) * stride (stride3 = 3 * stride), so 16 keys
   cost 4 base registers instead of 16. */
SA_INL const char *sa_dec_key(const char *const *bases, int k, int64_t stride, int64_t stride3) {
  const char *p = bases[k >> 2];
  return (k & 3) == 0 ? p : (k & 3) == 1 ? p + stride : (k & 3) == 2 ? p + 2 * stride : p + stride3;
}

/* ---- Q.K^T ------------------------------------------------------------------------------------- */

/* 4 bytes (half: 2, zero-extended) of a cache row. */
SA_INL int32_t sa_dec_ld32(const char *p, int half) {
  if (half) {
    uint16_t h;
    memcpy(&h, p, 2);
    return (int32_t)h;
  }
  int32_t w;
  memcpy(&w, p, 4);
  return w;
}

/* The broadcast operand of one key at byte offset off of its rows: head h's dword (its row hoff[h] bytes
   from head 0's) in lanes [h * 16 / HPV, (h + 1) * 16 / HPV). */
SA_INL __m512i sa_dec_kb(const int HPV, const char *row, const int64_t *hoff, int64_t off, int half) {
  __m512i x = _mm512_set1_epi32(sa_dec_ld32(row + off, half));
  for (int h = 1; h < HPV; h++)
    x = _mm512_mask_set1_epi32(x, (__mmask16)(((1u << (16 / HPV)) - 1u) << (h * (16 / HPV))),
                               sa_dec_ld32(row + hoff[h] + off, half));
  return x;
}

/* Scores of NK keys (rows at key0, key0 + kstride bytes, ...) for row vectors v0 .. v0 + NV - 1 of S^T.
   DOT 0: fp32 k elements broadcast against Q^T [H][Rp] (q pre-scaled). DOT 1: bf16 pairs, Q^T [H2][Rp]
   holding each row's raw bf16 pair (2d, 2d + 1) per lane and the key's pair one dword of its cache row
   (vdpbf16ps: two exact products per lane into fp32), the scale applied to the sums; an odd H's last pair
   takes the key's last element with a zero high half, so no element of the next row is read. HPV > 1
   (NV 1): that many kv heads share the vector, 16 / HPV lanes each. */
SA_INL SA_BF16_TARGET void sa_dec_qk(const int DOT, const int NK, const int NV, const int HPV, int64_t H, int64_t Rp,
                                     const char *key0, int64_t kstride, const int64_t *hoff, const float *qt,
                                     int64_t v0, float qscale, float *st) {
  const char *bases[4] = {key0, key0 + 4 * kstride, key0 + 8 * kstride, key0 + 12 * kstride};
  const int64_t s3 = 3 * kstride, steps = DOT ? H / 2 : H;
  __m512 acc[16][4];
  for (int k = 0; k < NK; k++)
    for (int v = 0; v < NV; v++) acc[k][v] = _mm512_setzero_ps();
#define SA_DEC_QK_STEP(D, HALF)                                                                  \
  do {                                                                                           \
    __m512 q[4];                                                                                 \
    for (int v = 0; v < NV; v++) q[v] = _mm512_load_ps(qt + (D)*Rp + (v0 + v) * 16);             \
    for (int k = 0; k < NK; k++) {                                                               \
      const __m512i kb = sa_dec_kb(HPV, sa_dec_key(bases, k, kstride, s3), hoff, 4 * (D), HALF); \
      for (int v = 0; v < NV; v++)                                                               \
        acc[k][v] = DOT ? _mm512_dpbf16_ps(acc[k][v], (__m512bh)kb, (__m512bh)q[v])              \
                        : _mm512_fmadd_ps(_mm512_castsi512_ps(kb), q[v], acc[k][v]);             \
    }                                                                                            \
  } while (0)
  for (int64_t d = 0; d < steps; d++) SA_DEC_QK_STEP(d, 0);
  if (DOT && (H & 1)) SA_DEC_QK_STEP(steps, 1);
#undef SA_DEC_QK_STEP
  for (int k = 0; k < NK; k++)
    for (int v = 0; v < NV; v++)
      _mm512_store_ps(st + k * Rp + (v0 + v) * 16, DOT ? _mm512_mul_ps(acc[k][v], _mm512_set1_ps(qscale)) : acc[k][v]);
}

/* S^T of keys [0, nb) of the block for one group of HPV kv heads: groups of keys (16 / NV of them), then
   single keys; row vectors in groups of NV (4, 2 or 1; 1 when heads share a vector). */
#define SA_DEC_QK_BLOCK(DOT, HPV)                                                                                 \
  static SA_BF16_TARGET void sa_dec_qk_block_##DOT##_##HPV(int64_t H, int64_t Rp, int64_t nb, const char *key0,   \
                                                           int64_t kstride, const int64_t *hoff, const float *qt, \
                                                           float qscale, float *st) {                             \
    const int64_t Rv = Rp / 16;                                                                                   \
    for (int64_t v0 = 0; v0 < Rv;) {                                                                              \
      int64_t jj = 0;                                                                                             \
      if (HPV == 1 && Rv - v0 >= 4) {                                                                             \
        for (; jj + 4 <= nb; jj += 4) SA_DEC_QK_CALL(DOT, 4, 4, HPV);                                             \
        for (; jj < nb; jj++) SA_DEC_QK_CALL(DOT, 1, 4, HPV);                                                     \
        v0 += 4;                                                                                                  \
      } else if (HPV == 1 && Rv - v0 >= 2) {                                                                      \
        for (; jj + 8 <= nb; jj += 8) SA_DEC_QK_CALL(DOT, 8, 2, HPV);                                             \
        for (; jj < nb; jj++) SA_DEC_QK_CALL(DOT, 1, 2, HPV);                                                     \
        v0 += 2;                                                                                                  \
      } else {                                                                                                    \
        for (; jj + 16 <= nb; jj += 16) SA_DEC_QK_CALL(DOT, 16, 1, HPV);                                          \
        for (; jj < nb; jj++) SA_DEC_QK_CALL(DOT, 1, 1, HPV);                                                     \
        v0 += 1;                                                                                                  \
      }                                                                                                           \
    }                                                                                                             \
  }
#define SA_DEC_QK_CALL(DOT, NK, NV, HPV) \
  sa_dec_qk(DOT, NK, NV, HPV, H, Rp, key0 + jj * kstride, kstride, hoff, qt, v0, qscale, st + jj * Rp)
SA_DEC_QK_BLOCK(0, 1)
SA_DEC_QK_BLOCK(0, 2)
SA_DEC_QK_BLOCK(0, 4)
SA_DEC_QK_BLOCK(0, 8)
SA_DEC_QK_BLOCK(0, 16)
SA_DEC_QK_BLOCK(1, 1)
SA_DEC_QK_BLOCK(1, 2)
SA_DEC_QK_BLOCK(1, 4)
SA_DEC_QK_BLOCK(1, 8)
SA_DEC_QK_BLOCK(1, 16)
#undef SA_DEC_QK_CALL
#undef SA_DEC_QK_BLOCK

typedef void (*sa_dec_qk_fn)(int64_t, int64_t, int64_t, const char *, int64_t, const int64_t *, const float *, float,
                             float *);
static const sa_dec_qk_fn sa_dec_qk_blocks[2][5] = {
    {sa_dec_qk_block_0_1, sa_dec_qk_block_0_2, sa_dec_qk_block_0_4, sa_dec_qk_block_0_8, sa_dec_qk_block_0_16},
    {sa_dec_qk_block_1_1, sa_dec_qk_block_1_2, sa_dec_qk_block_1_4, sa_dec_qk_block_1_8, sa_dec_qk_block_1_16}};

/* ---- P.V --------------------------------------------------------------------------------------- */

/* 32 elements of a V row at element offset off (zeros past n <= 32) as two fp32 vectors. A bf16 row
   is split by parity, v0 = elements 0, 2, .., 30 and v1 = 1, 3, .., 31 (one shift, one and: each dword
   holds an even element in its low half), so its accumulators hold the dims in that order until
   sa_dec_unpair; f16 and f32 keep the natural order. */
SA_INL void sa_dec_v32(const int DT, const void *src, int64_t off, __mmask32 m, __m512 *v0, __m512 *v1) {
  if (DT == SA_F32) {
    const float *p = (const float *)src + off;
    *v0 = _mm512_maskz_loadu_ps((__mmask16)m, p);
    *v1 = _mm512_maskz_loadu_ps((__mmask16)(m >> 16), p + 16);
    return;
  }
  const __m512i x = _mm512_maskz_loadu_epi16(m, (const uint16_t *)src + off);
  if (DT == SA_F16) {
    *v0 = _mm512_cvtph_ps(_mm512_castsi512_si256(x));
    *v1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(x, 1));
  } else {
    *v0 = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    *v1 = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
  }
}

/* acc rows x .. x + NR - 1 (astride floats apart) = corr[r] * acc + sum over the block's nb keys of
   P^T[j][r] V[j]; V row j at element vrow + j * vstride. Each row keeps 32-dim blocks of two vectors. */
SA_INL void sa_dec_pv(const int DT, const int NR, int64_t Hv, int64_t Rp, int64_t nb, int64_t x, const float *st,
                      const float *corr, const void *v, int64_t vrow, int64_t vstride, float *acc, int64_t astride,
                      sa_dec_pf *pf) {
  for (int64_t d0 = 0; d0 < Hv; d0 += 32) {
    const int64_t n = Hv - d0 < 32 ? Hv - d0 : 32;
    const __mmask32 m = n >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1ull << n) - 1u);
    __m512 o[8][2];
    for (int i = 0; i < NR; i++) {
      const __m512 c = _mm512_set1_ps(corr[x + i]);
      o[i][0] = _mm512_mul_ps(c, _mm512_load_ps(acc + i * astride + d0));
      o[i][1] = _mm512_mul_ps(c, _mm512_load_ps(acc + i * astride + d0 + 16));
    }
    for (int64_t jj = 0; jj < nb; jj++) {
      __m512 v0, v1;
      sa_dec_pf_step(pf, pf->per);
      sa_dec_v32(DT, v, vrow + jj * vstride + d0, m, &v0, &v1);
      for (int i = 0; i < NR; i++) {
        const __m512 p = _mm512_set1_ps(st[jj * Rp + x + i]);
        o[i][0] = _mm512_fmadd_ps(p, v0, o[i][0]);
        o[i][1] = _mm512_fmadd_ps(p, v1, o[i][1]);
      }
    }
    for (int i = 0; i < NR; i++) {
      _mm512_store_ps(acc + i * astride + d0, o[i][0]);
      _mm512_store_ps(acc + i * astride + d0 + 16, o[i][1]);
    }
  }
}

/* The rows of one kv head in blocks of 8, then 4, 2, 1 (the block a compile-time constant per call). */
#define SA_DEC_PV_ROWS(DT)                                                                                           \
  static void sa_dec_pv_rows_##DT(int64_t R, int64_t Hv, int64_t Rp, int64_t nb, const float *st, const float *corr, \
                                  const void *v, int64_t vrow, int64_t vstride, float *acc, int64_t as,              \
                                  sa_dec_pf *pf) {                                                                   \
    int64_t x = 0;                                                                                                   \
    for (; x + 8 <= R; x += 8) sa_dec_pv(DT, 8, Hv, Rp, nb, x, st, corr, v, vrow, vstride, acc + x * as, as, pf);    \
    if (x + 4 <= R) {                                                                                                \
      sa_dec_pv(DT, 4, Hv, Rp, nb, x, st, corr, v, vrow, vstride, acc + x * as, as, pf);                             \
      x += 4;                                                                                                        \
    }                                                                                                                \
    if (x + 2 <= R) {                                                                                                \
      sa_dec_pv(DT, 2, Hv, Rp, nb, x, st, corr, v, vrow, vstride, acc + x * as, as, pf);                             \
      x += 2;                                                                                                        \
    }                                                                                                                \
    if (x < R) sa_dec_pv(DT, 1, Hv, Rp, nb, x, st, corr, v, vrow, vstride, acc + x * as, as, pf);                    \
  }
SA_DEC_PV_ROWS(SA_F32)
SA_DEC_PV_ROWS(SA_F16)
SA_DEC_PV_ROWS(SA_BF16)
#undef SA_DEC_PV_ROWS

/* A bf16 row's accumulators back in dim order: each 32-dim block from (even dims, odd dims). */
static void sa_dec_unpair(float *acc, int64_t rows, int64_t Hv, int64_t astride) {
  const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t d0 = 0; d0 < Hv; d0 += 32) {
      float *p = acc + r * astride + d0;
      const __m512 e = _mm512_load_ps(p), o = _mm512_load_ps(p + 16);
      _mm512_store_ps(p, _mm512_permutex2var_ps(e, lo, o));
      _mm512_store_ps(p + 16, _mm512_permutex2var_ps(e, hi, o));
    }
}

/* ---- the work item ----------------------------------------------------------------------------- */

/* Q^T of every group of kv heads: qt [g][d][lane] (fp32 pre-scaled into base 2), or with bf16 dot products
   [g][pair][lane] holding the row's raw bf16 pair; lane h * lanes + r is row r of head g * hpv + h, and
   padding lanes are 0. */
static void sa_dec_q_transpose(const sa_decode_item *it, const sa_dec_pack *pk, float *qt) {
  const sa_attn *a = it->a;
  const int64_t H = a->head_dim, G = it->group, R = it->plan->rows, N = a->q_heads, T = a->q_len, b = it->b;
  const int64_t Hq = it->plan->bf16_dot ? (H + 1) / 2 : H, Rp = pk->Rp;
  memset(qt, 0, (size_t)(pk->groups * Hq * Rp) * sizeof(float));
  for (int64_t kh = 0; kh < a->kv_heads; kh++)
    for (int64_t r = 0; r < R; r++) {
      const int64_t row = ((b * T + r / G) * N + kh * G + r % G) * H;
      float *col = qt + (kh / pk->hpv) * Hq * Rp + (kh % pk->hpv) * pk->lanes + r;
      if (it->plan->bf16_dot) { /* a pair is the dword at element 2d: element 2d in its low half */
        const uint16_t *q = (const uint16_t *)a->q + row;
        for (int64_t d = 0; d + 1 < H; d += 2) memcpy(col + (d / 2) * Rp, q + d, 4);
        if (H & 1) {
          const uint32_t w = q[H - 1];
          memcpy(col + (H / 2) * Rp, &w, 4);
        }
      } else {
        for (int64_t d = 0; d < H; d++) col[d * Rp] = sa_load(a->q, a->dtype, row + d) * it->qscale;
      }
    }
}

/* Rows [0, nb) of one head's K block in fp32 (kf [nb][Hp]), for caches whose elements cannot be broadcast
   as fp32 straight from memory. */
static void sa_dec_k_to_f32(const void *k, sa_dtype t, int64_t row0, int64_t stride, int64_t nb, int64_t H, int64_t Hp,
                            float *kf) {
  for (int64_t jj = 0; jj < nb; jj++) {
    const uint16_t *src = (const uint16_t *)k + row0 + jj * stride;
    float *dst = kf + jj * Hp;
    int64_t d = 0;
    for (; d + 16 <= H; d += 16) {
      const __m256i x = _mm256_loadu_si256((const __m256i *)(src + d));
      _mm512_store_ps(dst + d, t == SA_F16 ? _mm512_cvtph_ps(x)
                                           : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16)));
    }
    for (; d < H; d++) dst[d] = t == SA_F16 ? sa_f16_to_f32(src[d]) : sa_bf16_to_f32(src[d]);
  }
}

void sa_cpu_decode_avx512(const sa_decode_item *it, float *scratch) {
  const sa_attn *a = it->a;
  const sa_cpu_plan *p = it->plan;
  const int64_t H = a->head_dim, Hv = a->v_head_dim, R = p->rows, K = a->kv_heads;
  const int64_t S = a->kv_len, b = it->b, Hq = p->bf16_dot ? (H + 1) / 2 : H, Hp = sa_al16(H);
  const sa_dec_pack pk = sa_dec_pack_of(R, K);
  const int64_t Rp = pk.Rp, ng = pk.groups;
  const size_t es = sa_dtype_size(a->dtype);
  float *qt = scratch, *st = qt + ng * Hq * Rp, *corr = st + SA_DEC_BK * Rp, *gm = corr + 3 * Rp;
  float *gl = gm + ng * Rp, *kf = gl + ng * Rp;
  int32_t *rlo = (int32_t *)(void *)(corr + Rp), *rhi = rlo + Rp;
  sa_dec_q_transpose(it, &pk, qt);
  int64_t lo_max, hi_min;
  sa_dec_lanes_init(it, &pk, rlo, rhi, gm, gl, &lo_max, &hi_min);
  const int direct = a->dtype == SA_F32 || p->bf16_dot; /* K elements broadcast straight from the cache */
  const int hsel = pk.hpv == 1 ? 0 : pk.hpv == 2 ? 1 : pk.hpv == 4 ? 2 : pk.hpv == 8 ? 3 : 4;
  const sa_dec_qk_fn qk_block = sa_dec_qk_blocks[p->bf16_dot][hsel];
  /* P.V key steps per head: row blocks (8, then 4, 2, 1) x 32-dim halves x keys */
  const int64_t pv_steps = ((Hv + 31) / 32) * (R / 8 + ((R & 4) != 0) + ((R & 2) != 0) + (R & 1));

  for (int64_t j0 = it->jlo; j0 < it->jhi; j0 += SA_DEC_BK) {
    const int64_t nb = it->jhi - j0 < SA_DEC_BK ? it->jhi - j0 : SA_DEC_BK;
    const int mask = j0 < lo_max || j0 + nb > hi_min; /* some row's range cuts this block */
    const int64_t jp = j0 + SA_DEC_BK, np = it->jhi - jp < SA_DEC_BK ? it->jhi - jp : SA_DEC_BK;
    /* the next block's K and V regions (contiguous: every head of its keys) */
    const char *kn = np > 0 ? (const char *)a->k + (size_t)((b * S + jp) * K * H) * es : NULL;
    const char *vn = np > 0 ? (const char *)a->v + (size_t)((b * S + jp) * K * Hv) * es : NULL;
    const int64_t kl_lines = np > 0 ? (np * K * H * (int64_t)es + 63) / 64 : 0;
    const int64_t vl_lines = np > 0 ? (np * K * Hv * (int64_t)es + 63) / 64 : 0;
    for (int64_t g = 0; g < ng; g++) {
      const int64_t kh0 = g * pk.hpv, nh = K - kh0 < pk.hpv ? K - kh0 : pk.hpv;
      sa_dec_pf pf = {kn ? kn + 64 * (g * kl_lines / ng) : NULL, vn ? vn + 64 * (g * vl_lines / ng) : NULL,
                      (g + 1) * kl_lines / ng - g * kl_lines / ng, (g + 1) * vl_lines / ng - g * vl_lines / ng, 0};
      pf.per = (pf.n + pf.n2 + nh * pv_steps * nb - 1) / (nh * pv_steps * nb);
      if (g + SA_DEC_L1_AHEAD < ng) /* this block, a later group of heads: L1 */
        for (int64_t jj = 0; jj < nb; jj++) {
          const int64_t crow = (b * S + j0 + jj) * K + kh0 + SA_DEC_L1_AHEAD * pk.hpv;
          const int64_t hn =
              K - (kh0 + SA_DEC_L1_AHEAD * pk.hpv) < pk.hpv ? K - (kh0 + SA_DEC_L1_AHEAD * pk.hpv) : pk.hpv;
          const char *kp = (const char *)a->k + (size_t)(crow * H) * es;
          const char *vp = (const char *)a->v + (size_t)(crow * Hv) * es;
          for (size_t x = 0; x < (size_t)(hn * H) * es; x += 64) __builtin_prefetch(kp + x, 0, 3);
          for (size_t x = 0; x < (size_t)(hn * Hv) * es; x += 64) __builtin_prefetch(vp + x, 0, 3);
        }
      const int64_t row0 = (b * S + j0) * K + kh0; /* cache row of key j0, kv head kh0 */
      /* head h's rows: hoff[h] bytes from head 0's; heads past the last share head 0's (their q lanes are 0) */
      int64_t hoff[16];
      const char *key0;
      int64_t kstride;
      if (direct) {
        for (int64_t h = 0; h < pk.hpv; h++) hoff[h] = h < nh ? h * H * (int64_t)es : 0;
        key0 = (const char *)a->k + (size_t)(row0 * H) * es;
        kstride = K * H * (int64_t)es;
      } else {
        for (int64_t h = 0; h < pk.hpv; h++) {
          hoff[h] = h < nh ? h * SA_DEC_BK * Hp * (int64_t)sizeof(float) : 0;
          if (h < nh) sa_dec_k_to_f32(a->k, a->dtype, (row0 + h) * H, K * H, nb, H, Hp, kf + h * SA_DEC_BK * Hp);
        }
        key0 = (const char *)kf;
        kstride = Hp * (int64_t)sizeof(float);
      }
      qk_block(H, Rp, nb, key0, kstride, hoff, qt + g * Hq * Rp, it->qscale, st);
      sa_dec_softmax(Rp, nb, j0 - it->jlo, mask, rlo, rhi, st, gm + g * Rp, gl + g * Rp, corr);
      for (int64_t h = 0; h < nh; h++) {
        const int64_t lane = h * pk.lanes, vrow = (row0 + h) * Hv;
        float *acc = it->acc + (kh0 + h) * R * it->astride;
        if (a->dtype == SA_BF16)
          sa_dec_pv_rows_SA_BF16(R, Hv, Rp, nb, st + lane, corr + lane, a->v, vrow, K * Hv, acc, it->astride, &pf);
        else if (a->dtype == SA_F16)
          sa_dec_pv_rows_SA_F16(R, Hv, Rp, nb, st + lane, corr + lane, a->v, vrow, K * Hv, acc, it->astride, &pf);
        else sa_dec_pv_rows_SA_F32(R, Hv, Rp, nb, st + lane, corr + lane, a->v, vrow, K * Hv, acc, it->astride, &pf);
      }
      sa_dec_pf_step(&pf, pf.n + pf.n2); /* what the key loops left */
    }
  }
  sa_dec_lanes_out(it, &pk, gm, gl);
  if (a->dtype == SA_BF16) sa_dec_unpair(it->acc, K * R, Hv, it->astride);
}
