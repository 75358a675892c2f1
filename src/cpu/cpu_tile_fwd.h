/*
 * cpu_tile_fwd.h — the forward item of the tile kernels (cpu.fwd.amx, cpu.fwd.amx.emulated), included by
 * cpu_kernel_body.h under SA_TILE after its helpers (ranges, tile_class, fill_rows, finish_scores, mask_rows,
 * put): the same item as the body's fwd_item (b, kv head, query block of G heads x bq positions; online softmax seeded by the sink,
 * the sink added once at the end), with its scores kept as S (query rows x keys) instead of S^T, in strips of 32
 * query rows:
 *   per key tile (SA_CPU_TILE_BK keys): K^T and V packed once into VNNI B blocks (tile_pack_b_t, tile_pack_b_bf16);
 *   per strip of 32 rows of the tile's item: S = Q K^T into C tiles stored as 32 rows x the strip's keys (A = the
 *   item's q rows, staged once per item as bf16 A-tile rows), the masks, then each row's online-softmax step along
 *   its keys, which writes P straight in A-tile layout (two 16-key vectors, one VCVTNE2PS2BF16, one 64-byte store),
 *   then o += P V through C tiles loaded from and stored to the strip's o rows. The next strip's S = Q K^T is
 *   issued a 32-key block at a time between the rows of this strip's softmax (two S buffers), so that the tile
 *   products can run beside the vector work: 0.96-0.98x the time of one after the other (B1 T = S = 2048 N8 H128
 *   and N64/8 H64 causal, 2 threads; with 128-key tiles 1.06x).
 * Why: with S^T (the vector kernels' layout) P had to be transposed into A tiles, 256 x 256 fp32 S^T lived in L2
 * and every softmax pass crossed it; here a strip's S (32 KiB), P (16 KiB) and q rows (8 KiB at H 128) stay in
 * L1, and a strip reads only the keys its rows can see (causal: its diagonal block rounded to 32 keys).
 * Measured against the S^T item on 2 cores of a Xeon with AMX (docs/performance.md).
 * Precision as the S^T item: Q K^T exact products in fp32, P rounded to bf16 before P V, l summed from the fp32 p.
 */
#ifndef SA_CPU_TILE_FWD_H
#define SA_CPU_TILE_FWD_H

#define TF_STRIP 32 /* query rows per strip: two 16-row tiles */

/* 2^x for x <= 0 on 16 lanes, as the P of the tile products needs it: x clamped below at -200 (2^-200 is 0 in
   fp32, so a masked -inf score gives p = 0 exactly), f = x - floor(x) in [0, 1) by one VREDUCEPS, 2^f by a
   degree-5 near-minimax polynomial (relative error 1.7e-7 in fp32, against P's bf16 rounding of 2^-8), then
   VSCALEFPS by floor(x). 8 vector instructions, where the vector kernels' exp2 takes 14: the exp pass is most of
   the softmax's time. NaN propagates (max returns its second operand, x). */
static inline __m512 tf_exp2(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-200.0f), x);
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_set1_ps(1.8775766948238015e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(8.98933969438076e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.582631751894951e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4015361070632935e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931530833244324e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.999999403953552e-1f));
  return _mm512_scalef_ps(p, x);
}

/* The item's scratch (each piece 64-byte aligned): q rows [Mr][h32] (bf16; Mr = M rounded to a strip), the
   packed K^T [BK / 16][h32 / 32] blocks and V [hvp / 16][BK / 32] blocks (bf16), the scores of two strips
   [2][32][BK] (fp32), the additive tile of every row [Mr][BK] (only with a bias, a mask array or positions), P of a strip
   [32][BK] (bf16), o [Mr][hvp], the running max and sum [Mr], a copy of V's rows [BK][Hv rounded to 32] (bf16,
   where V cannot be read in place), the key rows' addresses [BK] and each strip's key window [Mr / 32][2]. */
typedef struct {
  uint16_t *q, *kt, *vb, *p, *vr;
  float *s, *add, *kl, *o, *m, *l;
  const uint16_t **krow;
  int64_t *win;
} tf_bufs;

static size_t tf_carve(const sa_cpu_ctx *c, float *ws, tf_bufs *B) {
  size_t off = 0;
#define TF_TAKE(ptr, type, floats)                \
  do {                                            \
    (ptr) = ws ? (type)(void *)(ws + off) : 0;    \
    off += ((size_t)(floats) + 15) & ~(size_t)15; \
  } while (0)
  const int64_t M = c->G * c->bq, Mr = tile_round(M, TF_STRIP), BK = SA_CPU_TILE_BK;
  const int64_t h32 = tile_round(c->a->head_dim, SA_TILE_K), hvp = c->hvp;
  TF_TAKE(B->q, uint16_t *, Mr * h32 / 2);
  TF_TAKE(B->kt, uint16_t *, tile_b_elems(c->a->head_dim, BK) / 2);
  TF_TAKE(B->vb, uint16_t *, tile_b_elems(BK, hvp) / 2);
  TF_TAKE(B->s, float *, 2 * TF_STRIP * BK);
  TF_TAKE(B->add, float *, c->fill ? Mr *BK : 0);
  TF_TAKE(B->kl, float *, c->kill || c->a->q_positions ? Mr * BK : 0);
  TF_TAKE(B->p, uint16_t *, TF_STRIP * BK / 2);
  TF_TAKE(B->o, float *, Mr *hvp);
  TF_TAKE(B->m, float *, Mr);
  TF_TAKE(B->l, float *, Mr);
  TF_TAKE(B->vr, uint16_t *, BK * tile_round(c->a->v_head_dim, SA_TILE_K) / 2);
  TF_TAKE(B->krow, const uint16_t **, BK *(int64_t)(sizeof(void *) / sizeof(float)));
  TF_TAKE(B->win, int64_t *, 2 * (Mr / TF_STRIP) * (int64_t)(sizeof(int64_t) / sizeof(float)));
#undef TF_TAKE
  return off;
}

/* S [32 x keys [k0, k1)] of one strip (k0, k1 multiples of 32) into s (rows ld floats apart): A = q rows (rows
   astride bytes apart; mt 16-row tiles), B = K^T blocks (ks k steps each). Per 32 keys: C zeroed, ks k steps of 4
   loads and mt * 2 TDPBF16PS, C stored. A job runs one 32-key block a step (tf_scores_step), so that a strip's
   products can be issued between the rows of the previous strip's softmax, whose vector work they overlap. */
typedef struct {
  const uint16_t *qa, *kt;
  int64_t astride, ks, n0, k1, ld;
  float *s;
  int mt;
} tf_job;

static inline int tf_scores_step(tf_job *j) {
  if (j->n0 >= j->k1) return 0;
  const int64_t bstride = 2 * SA_TILE_N * (int64_t)sizeof(uint16_t), cs = j->ld * (int64_t)sizeof(float);
  const uint16_t *qa = j->qa, *a1 = qa + j->astride / 2 * SA_TILE_M;
  const uint16_t *b0 = j->kt + (j->n0 / SA_TILE_N) * j->ks * SA_TILE_BLK, *b1 = b0 + j->ks * SA_TILE_BLK;
  const int64_t astride = j->astride, n0 = j->n0;
  float *s = j->s;
  TILE_ZERO(0);
  TILE_ZERO(1);
  if (j->mt > 1) {
    TILE_ZERO(2);
    TILE_ZERO(3);
  }
  for (int64_t st = 0; st < j->ks; st++) {
    TILE_LOADD(4, qa + st * SA_TILE_K, astride);
    TILE_LOADD(6, b0 + st * SA_TILE_BLK, bstride);
    TILE_LOADD(7, b1 + st * SA_TILE_BLK, bstride);
    TILE_DPBF16PS(0, 4, 6);
    TILE_DPBF16PS(1, 4, 7);
    if (j->mt > 1) {
      TILE_LOADD(5, a1 + st * SA_TILE_K, astride);
      TILE_DPBF16PS(2, 5, 6);
      TILE_DPBF16PS(3, 5, 7);
    }
  }
  TILE_STORED(0, s + n0, cs);
  TILE_STORED(1, s + n0 + SA_TILE_N, cs);
  if (j->mt > 1) {
    TILE_STORED(2, s + SA_TILE_M * j->ld + n0, cs);
    TILE_STORED(3, s + SA_TILE_M * j->ld + n0 + SA_TILE_N, cs);
  }
  j->n0 += 2 * SA_TILE_N;
  return 1;
}

static void tf_scores(const uint16_t *qa, int64_t astride, int mt, int64_t ks, const uint16_t *kt, int64_t k0,
                      int64_t k1, float *s, int64_t ld) {
  tf_job j = {qa, kt, astride, ks, k0, k1, ld, s, mt};
  while (tf_scores_step(&j)) {}
}

/* o [32 x hvp] (rows ldo floats apart) += P V over the k steps [s0, s1) of 32 keys: A = P (rows pstride bytes
   apart, mt tiles), B = V blocks (ksv k steps each). C goes through the tiles: loaded from o, stored back. */
static void tf_pv(const uint16_t *pa, int64_t pstride, int mt, const uint16_t *vb, int64_t ksv, int64_t s0, int64_t s1,
                  float *o, int64_t ldo, int64_t hvp) {
  const int64_t bstride = 2 * SA_TILE_N * (int64_t)sizeof(uint16_t), cs = ldo * (int64_t)sizeof(float);
  const uint16_t *a1 = pa + pstride / 2 * SA_TILE_M;
  for (int64_t n0 = 0; n0 < hvp; n0 += 2 * SA_TILE_N) {
    const int nt = n0 + SA_TILE_N < hvp ? 2 : 1;
    const uint16_t *b0 = vb + (n0 / SA_TILE_N) * ksv * SA_TILE_BLK, *b1 = b0 + ksv * SA_TILE_BLK;
    float *c0 = o + n0, *c1 = c0 + SA_TILE_M * ldo;
    TILE_LOADD(0, c0, cs);
    if (nt > 1) TILE_LOADD(1, c0 + SA_TILE_N, cs);
    if (mt > 1) TILE_LOADD(2, c1, cs);
    if (mt > 1 && nt > 1) TILE_LOADD(3, c1 + SA_TILE_N, cs);
    for (int64_t st = s0; st < s1; st++) {
      TILE_LOADD(4, pa + st * SA_TILE_K, pstride);
      TILE_LOADD(6, b0 + st * SA_TILE_BLK, bstride);
      if (nt > 1) TILE_LOADD(7, b1 + st * SA_TILE_BLK, bstride);
      TILE_DPBF16PS(0, 4, 6);
      if (nt > 1) TILE_DPBF16PS(1, 4, 7);
      if (mt > 1) {
        TILE_LOADD(5, a1 + st * SA_TILE_K, pstride);
        TILE_DPBF16PS(2, 5, 6);
        if (nt > 1) TILE_DPBF16PS(3, 5, 7);
      }
    }
    TILE_STORED(0, c0, cs);
    if (nt > 1) TILE_STORED(1, c0 + SA_TILE_N, cs);
    if (mt > 1) TILE_STORED(2, c1, cs);
    if (mt > 1 && nt > 1) TILE_STORED(3, c1 + SA_TILE_N, cs);
  }
}

/* cpu_mask.h's finish_scores (the soft-cap, then the kill tile) on a strip's rows r < mr over the keys they
   computed, [k0, kn) rounded up to 16 (rows ld floats apart; kill: the strip's rows of the kill tile, or NULL).
   Out of line, behind the inline test: inlined into the strip loops, its tanh made the plain forward 4-8% slower
   (bf16, 2 threads on the Xeon with AMX; docs/performance.md). */
static __attribute__((noinline)) void tf_finish_rows(const sa_cpu_ctx *c, float *s, const float *kill, int64_t ld,
                                                     int64_t mr, int64_t k0, int64_t kn) {
  const int64_t n = tile_round(kn - k0, SA_TILE_N);
  for (int64_t r = 0; r < mr; r++) finish_scores(c, s + r * ld + k0, kill ? kill + r * ld + k0 : NULL, n);
}

static inline void tf_finish(const sa_cpu_ctx *c, float *s, const float *kill, int64_t ld, int64_t mr, int64_t k0,
                             int64_t kn) {
  if (c->cap2 > 0.0f || kill) tf_finish_rows(c, s, kill, ld, mr, k0, kn);
}

/* Lanes [0, n) of 16 as a mask, from a signed count (n <= 0: none). */
static inline __mmask16 tf_lanes(int64_t n) { return tile_lanes(n); }

/* The online-softmax step of a strip's rows r < mr over keys [k0, k1) of their scores s (rows ld floats apart;
   base 2 once multiplied by mul; keys from kn on do not exist): the new maxima m (seeded by the sink, so finite
   unless a vanilla row has seen nothing valid; then the reference point is 0 and masked entries give p = 0, not
   NaN), p = 2^(mul s - m) written as bf16 into the P rows pr (ld elements apart) for keys [k0, k1) (0 from kn
   on), l += the fp32 sums, and corr[r] = 2^(m_old - m_new), by which row r's o must be rescaled (1 exactly when
   the max did not move). The maxima and factors of the 32 rows are two vectors: one exp2 each, no libm call. */
static inline void tf_softmax_strip(const float *s, uint16_t *pr, int64_t ld, int64_t mr, int64_t k0, int64_t k1,
                                    int64_t kn, float mul, float *m, float *l, float *corr, tf_job *job) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  float mx[TF_STRIP], nmu[TF_STRIP], sums[TF_STRIP];
  for (int64_t r = 0; r < TF_STRIP; r++) {
    __m512 v = ninf;
    if (r < mr)
      for (int64_t k = k0; k < kn; k += SA_TILE_N)
        v = _mm512_max_ps(v, _mm512_mask_loadu_ps(ninf, tf_lanes(kn - k), s + r * ld + k));
    mx[r] = _mm512_reduce_max_ps(v);
  }
  for (int64_t h = 0; h < TF_STRIP; h += SA_TILE_N) {
    const __mmask16 live = tf_lanes(mr - h);
    const __m512 mold = _mm512_maskz_loadu_ps(live, m + h);
    const __m512 mnew = _mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(mx + h), _mm512_set1_ps(mul)), mold);
    const __m512 mu = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mnew, ninf, _CMP_EQ_OQ), mnew, _mm512_setzero_ps());
    const __m512 c = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mold, mu, _CMP_EQ_OQ), tf_exp2(_mm512_sub_ps(mold, mu)),
                                          _mm512_set1_ps(1.0f));
    _mm512_mask_storeu_ps(m + h, live, mnew);
    _mm512_storeu_ps(nmu + h, _mm512_sub_ps(_mm512_setzero_ps(), mu));
    _mm512_storeu_ps(corr + h, c);
  }
  const __m512 mulv = _mm512_set1_ps(mul);
  const int64_t per = job ? SA_MAX(1, mr / SA_MAX(1, (job->k1 - job->n0) / (2 * SA_TILE_N))) : 0;
  for (int64_t r = 0; r < mr; r++) {
    if (job && r % per == 0) tf_scores_step(job);
    const float *x = s + r * ld;
    const __m512 nm = _mm512_set1_ps(nmu[r]);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t k = k0; k < k1; k += 2 * SA_TILE_N) {
      const __m512 x0 = _mm512_mask_loadu_ps(ninf, tf_lanes(kn - k), x + k);
      const __m512 x1 = _mm512_mask_loadu_ps(ninf, tf_lanes(kn - k - SA_TILE_N), x + k + SA_TILE_N);
      const __m512 p0 = tf_exp2(_mm512_fmadd_ps(x0, mulv, nm)), p1 = tf_exp2(_mm512_fmadd_ps(x1, mulv, nm));
      sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
      _mm512_storeu_si512(pr + r * ld + k, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
    }
    sums[r] = _mm512_reduce_add_ps(sum);
  }
  for (int64_t h = 0; h < mr; h += SA_TILE_N) {
    const __mmask16 live = tf_lanes(mr - h);
    _mm512_mask_storeu_ps(l + h, live,
                          _mm512_fmadd_ps(_mm512_maskz_loadu_ps(live, l + h), _mm512_loadu_ps(corr + h),
                                          _mm512_maskz_loadu_ps(live, sums + h)));
  }
}

/* K^T and V of keys [j0, j0 + nk) of (b, kv head kh) as the B blocks of one key tile (kt: tile_pack_b_t's layout
   over the keys, h32 / 32 k steps per 16 keys; vb: tile_pack_b_bf16's over hvp columns, nk rounded to 32 / 32 k
   steps), zero past nk: keys from kv_len on are never read (whatever they hold, a 0 in P must not meet a NaN).
   krow: nk row addresses; vr: V rows copied where they cannot be read in place (Hv not a multiple of 16). */
static void tf_pack(const sa_cpu_ctx *c, int64_t b, int64_t kh, int64_t j0, int64_t nk, uint16_t *kt, uint16_t *vb,
                    const uint16_t **krow, uint16_t *vr) {
  const sa_attn *a = c->a;
  const int64_t Kh = a->kv_heads, H = a->head_dim, Hv = a->v_head_dim, row0 = (b * a->kv_len + j0) * Kh + kh;
  for (int64_t jj = 0; jj < nk; jj++) krow[jj] = (const uint16_t *)a->k + (row0 + jj * Kh) * H;
  tile_pack_b_t(kt, H, nk, nk, krow);
  const uint16_t *v0 = (const uint16_t *)a->v + row0 * Hv;
  if (Hv % SA_TILE_N == 0 && (Kh * Hv) % 2 == 0 && ((uintptr_t)v0 & 3) == 0) {
    tile_pack_b_bf16(vb, nk, c->hvp, (const float *)(const void *)v0, Kh * Hv / 2);
  } else {
    const int64_t v32 = tile_round(Hv, SA_TILE_K); /* tile_load_row zero-pads a row to 32 elements */
    for (int64_t jj = 0; jj < nk; jj++)
      tile_load_row((float *)(void *)(vr + jj * v32), a->v, (row0 + jj * Kh) * Hv, Hv);
    tile_pack_b_bf16(vb, nk, c->hvp, (const float *)(void *)vr, v32 / 2);
  }
}

/* The packing pass's scratch: the key rows' addresses and V's copied rows of one tile. */
static size_t tf_pack_scratch(const sa_cpu_ctx *c) {
  return (size_t)(SA_CPU_TILE_BK * (int64_t)(sizeof(void *) / sizeof(float)) +
                  SA_CPU_TILE_BK * tile_round(c->a->v_head_dim, SA_TILE_K) / 2);
}

/* Item (b, kv head, key tile) of the packing pass: the tile's keys below kv_len into c->kpack, c->vpack. */
static void tf_pack_item(const sa_cpu_ctx *c, int64_t item, float *ws) {
  const sa_attn *a = c->a;
  const int64_t t = item % c->nkt, kh = (item / c->nkt) % a->kv_heads, b = item / (c->nkt * a->kv_heads);
  const int64_t j0 = t * SA_CPU_TILE_BK, nk = SA_MIN(SA_CPU_TILE_BK, sa_kv_len_of(a, b) - j0);
  if (nk <= 0) return; /* past this batch's kv_len: no item reads it */
  const uint16_t **krow = (const uint16_t **)(void *)ws;
  uint16_t *vr = (uint16_t *)(void *)(ws + SA_CPU_TILE_BK * (int64_t)(sizeof(void *) / sizeof(float)));
  tf_pack(c, b, kh, j0, nk, c->kpack + item * sa_cpu_tile_kt_elems(a), c->vpack + item * sa_cpu_tile_vb_elems(a), krow,
          vr);
}

static void fwd_item_tile(const sa_cpu_ctx *c, int64_t item, float *ws) {
  const sa_attn *a = c->a;
  const sa_dtype dt = a->dtype;
  const int64_t T = a->q_len, N = a->q_heads, Kh = a->kv_heads, H = a->head_dim, Hv = a->v_head_dim;
  const int64_t G = c->G, hvp = c->hvp, BK = SA_CPU_TILE_BK, h32 = tile_round(H, SA_TILE_K), ks = h32 / SA_TILE_K;
  const int64_t qb = item % c->nqb, kh = (item / c->nqb) % Kh, b = item / (c->nqb * Kh);
  const int64_t i0 = qb * c->bq, np = SA_MIN(c->bq, T - i0), M = G * np, Mr = tile_round(M, TF_STRIP);
  const int64_t ql = sa_q_len_of(a, b), kl = sa_kv_len_of(a, b);
  tf_bufs B;
  tf_carve(c, ws, &B);
  sa_range rg[SA_CPU_ROWS];
  int64_t jlo, jhi;
  ranges(a, ql, kl, i0, np, rg, &jlo, &jhi);
  /* q rows as A-tile rows (bf16 as given: the scale goes on the scores), position by position */
  for (int64_t p = 0; p < np; p++) {
    if (p + ROW_AHEAD < np) prefetch_rows(a->q, dt, b * T + i0 + p + ROW_AHEAD, 1, N * H, kh * G * H, G * H);
    for (int64_t g = 0; g < G; g++) {
      const int64_t r = g * np + p, n = kh * G + g;
      tile_load_row((float *)(void *)(B.q + r * h32), a->q, ((b * T + i0 + p) * N + n) * H, H);
      B.m[r] = sa_sink_logit(a, n) * SA_LOG2E; /* running max, seeded with the sink */
      B.l[r] = 0.0f;                           /* running sum, without the sink */
    }
  }
  if (Mr > M) memset(B.q + M * h32, 0, (size_t)((Mr - M) * h32) * sizeof(uint16_t));
  memset(B.o, 0, (size_t)(Mr * hvp) * sizeof(float));

  /* key tiles at multiples of BK (the packed tiles'), the first one cut by the masks where jlo is inside it */
  for (int64_t j0 = jlo / BK * BK; j0 < jhi; j0 += BK) {
    const int64_t nk = SA_MIN(BK, jhi - j0), kr = tile_round(nk, SA_TILE_K);
    const int cls = tile_class(a, b, rg, i0, np, j0, nk), pos = a->q_positions && cls == 1, add = c->fill;
    float *kill = c->kill || pos ? B.kl : NULL; /* the kill tile: mask array, positions (cpu_mask.h) */
    if (cls == 0) continue;
    if ((add || kill) && !fill_group(c, b, kh, G, add, B.add, kill, np, BK, nk, i0, j0, pos)) continue;
    /* this tile's K^T and V as B blocks: packed once per call (cpu_attn.c), else here */
    const uint16_t *kt = B.kt, *vb = B.vb;
    const int64_t nkp = SA_MIN(BK, kl - j0), ksv = tile_round(nkp, SA_TILE_K) / SA_TILE_K;
    if (c->kpack) {
      const int64_t t = (b * Kh + kh) * c->nkt + j0 / BK;
      kt = c->kpack + t * sa_cpu_tile_kt_elems(a);
      vb = c->vpack + t * sa_cpu_tile_vb_elems(a);
    } else {
      tf_pack(c, b, kh, j0, nkp, B.kt, B.vb, B.krow, B.vr);
    }
    /* the scale goes into the exponent (mul) unless an additive tile, a soft-cap (which reads scaled scores) or a
       scale <= 0 (which would turn a masked -inf into +inf) needs it on the scores first */
    const int pre = add || c->cap2 > 0.0f || !(c->scale2 > 0.0f);
    const float mul = pre ? 1.0f : c->scale2;
    /* the keys each strip's rows can see, in 32-key steps ([0, 0): none) */
    const int64_t ns = (M + TF_STRIP - 1) / TF_STRIP;
    for (int64_t si = 0; si < ns; si++) {
      int64_t lo = j0 + nk, hi = j0;
      for (int64_t r = si * TF_STRIP; r < SA_MIN(M, (si + 1) * TF_STRIP); r++) {
        const sa_range x = rg[r % np];
        if (x.lo < x.hi) {
          lo = SA_MIN(lo, SA_MAX(x.lo, j0));
          hi = SA_MAX(hi, SA_MIN(x.hi, j0 + nk));
        }
      }
      B.win[2 * si] = lo < hi ? (lo - j0) / SA_TILE_K * SA_TILE_K : 0;
      B.win[2 * si + 1] = lo < hi ? SA_MIN(tile_round(hi - j0, SA_TILE_K), kr) : 0;
    }
    /* strip by strip, the next strip's S = Q K^T issued between the rows of this one's softmax */
    int64_t si = 0, par = 0;
    while (si < ns && B.win[2 * si + 1] == 0) si++;
    if (si < ns) {
      const int64_t mr = SA_MIN(TF_STRIP, M - si * TF_STRIP);
      tf_scores(B.q + si * TF_STRIP * h32, h32 * (int64_t)sizeof(uint16_t), mr > SA_TILE_M ? 2 : 1, ks, kt,
                B.win[2 * si], B.win[2 * si + 1], B.s, BK);
    }
    while (si < ns) {
      const int64_t r0 = si * TF_STRIP, mr = SA_MIN(TF_STRIP, M - r0);
      const int mt = mr > SA_TILE_M ? 2 : 1;
      const int64_t k0 = B.win[2 * si], k1 = B.win[2 * si + 1];
      float *sc = B.s + par * TF_STRIP * BK;
      int64_t sn = si + 1;
      while (sn < ns && B.win[2 * sn + 1] == 0) sn++;
      tf_job next = {0}, *job = NULL;
      if (sn < ns) {
        const int64_t mn = SA_MIN(TF_STRIP, M - sn * TF_STRIP);
        next = (tf_job){B.q + sn * TF_STRIP * h32,
                        kt,
                        h32 * (int64_t)sizeof(uint16_t),
                        ks,
                        B.win[2 * sn],
                        B.win[2 * sn + 1],
                        BK,
                        B.s + (par ^ 1) * TF_STRIP * BK,
                        mn > SA_TILE_M ? 2 : 1};
        job = &next;
      }
      const int64_t kn = SA_MIN(k1, nk); /* keys computed and existing */
      if (pre) {                         /* s = scale2 qk (+ add), before the masks */
        const __m512 sv = _mm512_set1_ps(c->scale2);
        for (int64_t r = 0; r < mr; r++)
          for (int64_t k = k0; k < kn; k += SA_TILE_N) {
            const __mmask16 lm = tf_lanes(kn - k);
            float *x = sc + r * BK + k;
            const __m512 bias = add ? _mm512_maskz_loadu_ps(lm, B.add + (r0 + r) * BK + k) : _mm512_setzero_ps();
            _mm512_mask_storeu_ps(x, lm, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(lm, x), sv, bias));
          }
      }
      tf_finish(c, sc, kill ? kill + r0 * BK : NULL, BK, mr, k0, kn);
      if (cls == 1) /* each head's rows of the strip, over the keys it computed */
        for (int64_t g = r0 / np; g < G && g * np < r0 + mr; g++) {
          const int64_t p0 = SA_MAX(0, r0 - g * np), p1 = SA_MIN(np, r0 + mr - g * np);
          mask_rows(a, b, sc + (g * np + p0 - r0) * BK, p1 - p0, BK, kn, rg + p0, i0 + p0, j0);
        }
      float corr[TF_STRIP];
      tf_softmax_strip(sc, B.p, BK, mr, k0, k1, kn, mul, B.m + r0, B.l + r0, corr, job);
      while (job && tf_scores_step(job)) {}
      for (int64_t r = 0; r < mr; r++)
        if (corr[r] != 1.0f) scale_row(B.o + (r0 + r) * hvp, hvp, corr[r]);
      for (int64_t r = mr; r < mt * SA_TILE_M; r++) memset(B.p + r * BK + k0, 0, (size_t)(k1 - k0) * sizeof(uint16_t));
      tf_pv(B.p, BK * (int64_t)sizeof(uint16_t), mt, vb, ksv, k0 / SA_TILE_K, k1 / SA_TILE_K, B.o + r0 * hvp, hvp, hvp);
      si = sn;
      par ^= 1;
    }
  }

  /* The sink enters here, once: l_total = l + 2^(a - m). No valid key contributed (l == 0): out = 0 and
     lse = a exactly (also right when every p underflowed under a huge sink: the rest is below fp32). */
  for (int64_t r = 0; r < M; r++) {
    int64_t g = r / np, p = r % np, n = kh * G + g, i = i0 + p;
    float sink = sa_sink_logit(a, n), m = B.m[r], l = B.l[r], lse;
    float *o = B.o + r * hvp;
    if (l == 0.0f) {
      memset(o, 0, (size_t)hvp * sizeof(float));
      lse = sink;
    } else {
      float lt = l + exp2f(sink * SA_LOG2E - m);
      scale_row(o, hvp, 1.0f / lt);
      lse = m * SA_LN2 + logf(lt);
    }
    put(a->out, dt, ((b * T + i) * N + n) * Hv, o, Hv, 1.0f);
    if (a->lse) a->lse[(b * N + n) * T + i] = lse;
  }
}

#endif /* SA_CPU_TILE_FWD_H */
