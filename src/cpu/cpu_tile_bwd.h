/*
 * cpu_tile_bwd.h — the dq item of the tile kernels (cpu.bwd.amx, cpu.bwd.amx.emulated), included by
 * cpu_kernel_body.h under SA_TILE after cpu_tile_fwd.h, whose strips, products and exp2 it shares: the same item
 * as the body's dq_item (b, kv head, query block; D_i = dout_i . out_i - dlse_i, the dsinks partials, then
 * dq = scale dS K over the key tiles, P recomputed from lse), with S and dP kept as query rows x keys in strips of
 * 32 rows:
 *   per key tile: K^T, V^T and K's key pairs as VNNI B blocks, packed once per call (SA_CPU_DQ_PACK) when a kv
 *   head has several query blocks, else by the item;
 *   per strip: S = Q K^T and dP = dout V^T into C tiles (A = the item's q and dout rows, staged once), the masks,
 *   per row p = 2^(mul s - lse2) and dS = p (dP - D) written straight as bf16 A-tile rows (and summed per row for
 *   a dbias shared along the keys), then dq += dS K through C tiles loaded from and stored to the strip's rows.
 * The body's S^T item transposed P and dS into A tiles and crossed a 256 KiB S^T and dP^T per key tile; here a
 * strip's S, dP and dS stay in L1. The dk/dv pass stays the body's.
 */
#ifndef SA_CPU_TILE_BWD_H
#define SA_CPU_TILE_BWD_H

/* The dq item's scratch: q and dout rows [Mr][h32], [Mr][v32] (bf16), the key tile's K^T, V^T and K pairs
   (bf16, where the item packs them), S and dP of a strip [32][BK] (fp32), dS of a strip [32][BK] (bf16), dq
   [Mr][hp], per row -lse2, D and the dS sums of a dbias shared along the keys [Mr], one dout and one out row in
   fp32 [2][hvp], the additive tile [Mr][BK] (a bias, a mask array or positions), K rows copied [BK][h32] (bf16,
   where K cannot be read in place), and the key rows' addresses [BK]. V^T has V's packed size, K's key pairs K^T's
   (sa_cpu_tile_vb_elems, sa_cpu_tile_kt_elems). */
typedef struct {
  uint16_t *q, *d, *kt, *vt, *kp, *ds, *kr;
  float *s, *dp, *dq, *nl2, *D, *db, *row, *add, *kl;
  const uint16_t **krow;
} tb_bufs;

static size_t tb_carve(const sa_cpu_ctx *c, float *ws, tb_bufs *B) {
  size_t off = 0;
#define TB_TAKE(ptr, type, floats)                \
  do {                                            \
    (ptr) = ws ? (type)(void *)(ws + off) : 0;    \
    off += ((size_t)(floats) + 15) & ~(size_t)15; \
  } while (0)
  const sa_attn *a = c->a;
  const int64_t M = c->G * c->bq, Mr = tile_round(M, TF_STRIP), BK = SA_CPU_TILE_BK;
  const int64_t h32 = tile_round(a->head_dim, SA_TILE_K), v32 = tile_round(a->v_head_dim, SA_TILE_K);
  TB_TAKE(B->q, uint16_t *, Mr * h32 / 2);
  TB_TAKE(B->d, uint16_t *, Mr * v32 / 2);
  TB_TAKE(B->kt, uint16_t *, sa_cpu_tile_kt_elems(a) / 2);
  TB_TAKE(B->vt, uint16_t *, sa_cpu_tile_vb_elems(a) / 2);
  TB_TAKE(B->kp, uint16_t *, sa_cpu_tile_kt_elems(a) / 2);
  TB_TAKE(B->s, float *, TF_STRIP *BK);
  TB_TAKE(B->dp, float *, TF_STRIP *BK);
  TB_TAKE(B->ds, uint16_t *, TF_STRIP * BK / 2);
  TB_TAKE(B->dq, float *, Mr * c->hp);
  TB_TAKE(B->nl2, float *, Mr);
  TB_TAKE(B->D, float *, Mr);
  TB_TAKE(B->db, float *, Mr);
  TB_TAKE(B->row, float *, 2 * c->hvp);
  TB_TAKE(B->add, float *, c->fill ? Mr *BK : 0);
  TB_TAKE(B->kl, float *, c->kill || a->q_positions ? Mr * BK : 0);
  TB_TAKE(B->kr, uint16_t *, BK * h32 / 2);
  TB_TAKE(B->krow, const uint16_t **, BK *(int64_t)(sizeof(void *) / sizeof(float)));
#undef TB_TAKE
  return off;
}

/* K^T, V^T and K's key pairs of keys [j0, j0 + nk) of (b, kv head kh) into kt, vt, kp (zero past nk). krow: nk
   row addresses; kr: K rows copied where they cannot be read in place (H not a multiple of 16). */
static void tb_pack(const sa_cpu_ctx *c, int64_t b, int64_t kh, int64_t j0, int64_t nk, uint16_t *kt, uint16_t *vt,
                    uint16_t *kp, const uint16_t **krow, uint16_t *kr) {
  const sa_attn *a = c->a;
  const int64_t Kh = a->kv_heads, H = a->head_dim, Hv = a->v_head_dim, row0 = (b * a->kv_len + j0) * Kh + kh;
  for (int64_t jj = 0; jj < nk; jj++) krow[jj] = (const uint16_t *)a->k + (row0 + jj * Kh) * H;
  tile_pack_b_t(kt, H, nk, nk, krow);
  for (int64_t jj = 0; jj < nk; jj++) krow[jj] = (const uint16_t *)a->v + (row0 + jj * Kh) * Hv;
  tile_pack_b_t(vt, Hv, nk, nk, krow);
  const uint16_t *k0 = (const uint16_t *)a->k + row0 * H;
  if (!c->k_bad && H % SA_TILE_N == 0 && (Kh * H) % 2 == 0 && ((uintptr_t)k0 & 3) == 0) {
    tile_pack_b_bf16(kp, nk, c->hp, (const float *)(const void *)k0, Kh * H / 2);
  } else {
    const int64_t h32 = tile_round(H, SA_TILE_K); /* tile_load_row zero-pads a row to 32 elements */
    for (int64_t jj = 0; jj < nk; jj++) {
      tile_load_row((float *)(void *)(kr + jj * h32), a->k, (row0 + jj * Kh) * H, H);
      /* a key with a NaN or an inf leaves dq += dS K (its 0 ds for a hidden pair would make NaN): tb_bad_keys_in
         adds it back for the pairs whose ds is not 0 (cpu_kernel_keys.h says why) */
      if (c->k_bad && key_row_bad(a, row0 + jj * Kh)) memset(kr + jj * h32, 0, (size_t)h32 * sizeof(uint16_t));
    }
    tile_pack_b_bf16(kp, nk, c->hp, (const float *)(void *)kr, h32 / 2);
  }
}

/* dq rows r < mr of a strip (dq rows hp floats apart) += ds k for its keys [k0, kn) that hold a NaN or an inf
   (zeroed in K's key pairs by tb_pack), for the pairs whose ds (the bf16 the product takes, in the dS rows ld
   elements apart) is not 0. */
static void tb_bad_keys_in(const sa_cpu_ctx *c, int64_t b, int64_t kh, int64_t j0, int64_t k0, int64_t kn,
                           const uint16_t *ds, int64_t ld, int64_t mr, float *dq) {
  const sa_attn *a = c->a;
  const int64_t H = a->head_dim, row0 = (b * a->kv_len + j0) * a->kv_heads + kh;
  for (int64_t jj = k0; jj < kn; jj++) {
    const int64_t row = row0 + jj * a->kv_heads;
    if (!key_row_bad(a, row)) continue;
    for (int64_t r = 0; r < mr; r++) {
      const uint32_t u = (uint32_t)ds[r * ld + jj] << 16;
      float x;
      memcpy(&x, &u, 4);
      if (x != 0.0f)
        for (int64_t e = 0; e < H; e++) dq[r * c->hp + e] += x * sa_load(a->k, a->dtype, row * H + e);
    }
  }
}

/* The packing pass's scratch: the key rows' addresses and K's copied rows of one tile. */
static size_t tb_pack_scratch(const sa_cpu_ctx *c) {
  return (size_t)(SA_CPU_TILE_BK * (int64_t)(sizeof(void *) / sizeof(float)) +
                  SA_CPU_TILE_BK * tile_round(c->a->head_dim, SA_TILE_K) / 2);
}

/* Item (b, kv head, key tile) of the dq pass's packing: the tile's keys below kv_len into c->kpack (K^T),
   c->vpack (V^T), c->kpair (K's key pairs). */
static void tb_pack_item(const sa_cpu_ctx *c, int64_t item, float *ws) {
  const sa_attn *a = c->a;
  const int64_t t = item % c->nkt, kh = (item / c->nkt) % a->kv_heads, b = item / (c->nkt * a->kv_heads);
  const int64_t j0 = t * SA_CPU_TILE_BK, nk = SA_MIN(SA_CPU_TILE_BK, sa_kv_len_of(a, b) - j0);
  if (nk <= 0) return; /* past this batch's kv_len: no item reads it */
  const uint16_t **krow = (const uint16_t **)(void *)ws;
  uint16_t *kr = (uint16_t *)(void *)(ws + SA_CPU_TILE_BK * (int64_t)(sizeof(void *) / sizeof(float)));
  tb_pack(c, b, kh, j0, nk, c->kpack + item * sa_cpu_tile_kt_elems(a), c->vpack + item * sa_cpu_tile_vb_elems(a),
          c->kpair + item * sa_cpu_tile_kt_elems(a), krow, kr);
}

/* Rows r < mr of a strip: p = 2^(mul s + nl2_r) over keys [k0, kn) (0 past kn, up to k1), dS = p (dp - D_r),
   times the soft-cap's 1 - t^2 from the capped score under a cap (icap = 1 / cap2, else 0), and 0 where p is 0 (a
   masked pair: whatever a NaN or an inf value made of its dp); written as bf16 into the dS rows (ld elements
   apart); with db, each row's fp32 sum of dS added to db[r]. */
static inline void tb_ds_strip(const float *s, const float *dp, uint16_t *ds, int64_t ld, int64_t mr, int64_t k0,
                               int64_t k1, int64_t kn, float mul, float icap, const float *nl2, const float *D,
                               float *db) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY), mulv = _mm512_set1_ps(mul), ic = _mm512_set1_ps(icap);
  for (int64_t r = 0; r < mr; r++) {
    const __m512 nl = _mm512_set1_ps(nl2[r]), dv = _mm512_set1_ps(D[r]);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t k = k0; k < k1; k += 2 * SA_TILE_N) {
      const __mmask16 m0 = tf_lanes(kn - k), m1 = tf_lanes(kn - k - SA_TILE_N);
      const __m512 s0 = _mm512_mask_loadu_ps(ninf, m0, s + r * ld + k);
      const __m512 s1 = _mm512_mask_loadu_ps(ninf, m1, s + r * ld + k + SA_TILE_N);
      const __m512 p0 = tf_exp2(_mm512_fmadd_ps(s0, mulv, nl)), p1 = tf_exp2(_mm512_fmadd_ps(s1, mulv, nl));
      __m512 x0 = _mm512_sub_ps(_mm512_maskz_loadu_ps(m0, dp + r * ld + k), dv);
      __m512 x1 = _mm512_sub_ps(_mm512_maskz_loadu_ps(m1, dp + r * ld + k + SA_TILE_N), dv);
      if (icap > 0.0f) {
        x0 = _mm512_mul_ps(x0, cap_grad(s0, ic));
        x1 = _mm512_mul_ps(x1, cap_grad(s1, ic));
      }
      const __m512 d0 = V_MUL_NZ(p0, x0), d1 = V_MUL_NZ(p1, x1);
      sum = _mm512_add_ps(sum, _mm512_add_ps(d0, d1));
      _mm512_storeu_si512(ds + r * ld + k, (__m512i)_mm512_cvtne2ps_pbh(d1, d0));
    }
    if (db) db[r] += _mm512_reduce_add_ps(sum);
  }
}

static void dq_item_tile(const sa_cpu_ctx *c, int64_t item, float *ws) {
  const sa_attn *a = c->a;
  const sa_attn_grad *gr = c->g;
  const sa_dtype dt = a->dtype;
  const int64_t T = a->q_len, N = a->q_heads, Kh = a->kv_heads, H = a->head_dim, Hv = a->v_head_dim;
  const int64_t G = c->G, hp = c->hp, hvp = c->hvp, BK = SA_CPU_TILE_BK;
  const int64_t h32 = tile_round(H, SA_TILE_K), v32 = tile_round(Hv, SA_TILE_K);
  const int64_t qb = item % c->nqb, kh = (item / c->nqb) % Kh, b = item / (c->nqb * Kh);
  const int64_t i0 = qb * c->bq, np = SA_MIN(c->bq, T - i0), M = G * np, Mr = tile_round(M, TF_STRIP);
  const int64_t ql = sa_q_len_of(a, b), kl = sa_kv_len_of(a, b);
  tb_bufs B;
  tb_carve(c, ws, &B);
  sa_range rg[SA_CPU_ROWS];
  int64_t jlo, jhi;
  ranges(a, ql, kl, i0, np, rg, &jlo, &jhi);
  float *dtmp = B.row, *otmp = B.row + hvp;
  /* q and dout rows as A-tile rows; D, -lse2 and the dsinks partials, head by head */
  for (int64_t g = 0; g < G; g++) {
    const int64_t n = kh * G + g;
    float sink = sa_sink_logit(a, n), part = 0.0f;
    for (int64_t p = 0; p < np; p++) {
      const int64_t r = g * np + p, i = i0 + p, orow = ((b * T + i) * N + n) * Hv, lrow = (b * N + n) * T + i;
      if (r + ROW_AHEAD < M) { /* the rows of the step ROW_AHEAD on */
        const int64_t ra = r + ROW_AHEAD, ta = b * T + i0 + ra % np, na = kh * G + ra / np;
        prefetch_rows(a->q, dt, ta, 1, N * H, na * H, H);
        prefetch_rows(gr->dout, dt, ta, 1, N * Hv, na * Hv, Hv);
        prefetch_rows(a->out, dt, ta, 1, N * Hv, na * Hv, Hv);
      }
      tile_load_row((float *)(void *)(B.q + r * h32), a->q, ((b * T + i) * N + n) * H, H);
      tile_load_row((float *)(void *)(B.d + r * v32), gr->dout, orow, Hv);
      cvt(dtmp, gr->dout, dt, orow, Hv, hvp, 1.0f);
      cvt(otmp, a->out, dt, orow, Hv, hvp, 1.0f);
      vf acc = V_ZERO();
      for (int64_t e = 0; e < hvp; e += VW) acc = V_FMA(V_LOAD(dtmp + e), V_LOAD(otmp + e), acc);
      float D = V_RADD(acc) - (gr->dlse ? gr->dlse[lrow] : 0.0f), lse = a->lse[lrow];
      c->dbuf[lrow] = D;
      B.nl2[r] = -lse_base2(lse);
      B.D[r] = D;
      /* As the reference: a row with lse = -inf has no mass; sink == lse (+inf sink) gives mass 1. */
      if (a->softmax == SA_SOFTMAX_LEARNABLE && lse != -INFINITY) part += (sink == lse ? 1.0f : expf(sink - lse)) * D;
    }
    if (a->softmax == SA_SOFTMAX_LEARNABLE) c->dsink_part[(n * a->batch + b) * c->nqb + qb] = part;
  }
  if (Mr > M) {
    memset(B.q + M * h32, 0, (size_t)((Mr - M) * h32) * sizeof(uint16_t));
    memset(B.d + M * v32, 0, (size_t)((Mr - M) * v32) * sizeof(uint16_t));
  }
  memset(B.dq, 0, (size_t)(Mr * hp) * sizeof(float));
  const int dbias = c->dbias_pass == SA_CPU_BWD_DQ;
  if (dbias) memset(B.db, 0, (size_t)M * sizeof(float));

  for (int64_t j0 = jlo / BK * BK; j0 < jhi; j0 += BK) {
    const int64_t nk = SA_MIN(BK, jhi - j0), kr = tile_round(nk, SA_TILE_K);
    const int cls = tile_class(a, b, rg, i0, np, j0, nk), pos = a->q_positions && cls == 1, add = c->fill;
    float *kill = c->kill || pos ? B.kl : NULL; /* the kill tile: mask array, positions (cpu_mask.h) */
    if (cls == 0) continue;
    if ((add || kill) && !fill_group(c, b, kh, G, add, B.add, kill, np, BK, nk, i0, j0, pos)) continue;
    const uint16_t *kt = B.kt, *vt = B.vt, *kp = B.kp;
    const int64_t nkp = SA_MIN(BK, kl - j0), ksk = tile_round(nkp, SA_TILE_K) / SA_TILE_K;
    if (c->kpack) {
      const int64_t t = (b * Kh + kh) * c->nkt + j0 / BK;
      kt = c->kpack + t * sa_cpu_tile_kt_elems(a);
      vt = c->vpack + t * sa_cpu_tile_vb_elems(a);
      kp = c->kpair + t * sa_cpu_tile_kt_elems(a);
    } else {
      tb_pack(c, b, kh, j0, nkp, B.kt, B.vt, B.kp, B.krow, B.kr);
    }
    const int pre = add || c->cap2 > 0.0f || !(c->scale2 > 0.0f);
    const float mul = pre ? 1.0f : c->scale2;
    for (int64_t r0 = 0; r0 < M; r0 += TF_STRIP) {
      const int64_t mr = SA_MIN(TF_STRIP, M - r0);
      const int mt = mr > SA_TILE_M ? 2 : 1;
      int64_t lo = j0 + nk, hi = j0;
      for (int64_t r = r0; r < r0 + mr; r++) {
        const sa_range x = rg[r % np];
        if (x.lo < x.hi) {
          lo = SA_MIN(lo, SA_MAX(x.lo, j0));
          hi = SA_MAX(hi, SA_MIN(x.hi, j0 + nk));
        }
      }
      if (lo >= hi) continue;
      const int64_t k0 = (lo - j0) / SA_TILE_K * SA_TILE_K, k1 = SA_MIN(tile_round(hi - j0, SA_TILE_K), kr);
      const int64_t kn = SA_MIN(k1, nk);
      tf_scores(B.q + r0 * h32, h32 * (int64_t)sizeof(uint16_t), mt, h32 / SA_TILE_K, kt, k0, k1, B.s, BK);
      tf_scores(B.d + r0 * v32, v32 * (int64_t)sizeof(uint16_t), mt, v32 / SA_TILE_K, vt, k0, k1, B.dp, BK);
      if (pre) { /* s = scale2 qk (+ add), before the masks */
        const __m512 sv = _mm512_set1_ps(c->scale2);
        for (int64_t r = 0; r < mr; r++)
          for (int64_t k = k0; k < kn; k += SA_TILE_N) {
            const __mmask16 lm = tf_lanes(kn - k);
            float *x = B.s + r * BK + k;
            const __m512 bias = add ? _mm512_maskz_loadu_ps(lm, B.add + (r0 + r) * BK + k) : _mm512_setzero_ps();
            _mm512_mask_storeu_ps(x, lm, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(lm, x), sv, bias));
          }
      }
      tf_finish(c, B.s, kill ? kill + r0 * BK : NULL, BK, mr, k0, kn);
      if (cls == 1) /* each head's rows of the strip, over the keys it computed */
        for (int64_t g = r0 / np; g < G && g * np < r0 + mr; g++) {
          const int64_t p0 = SA_MAX(0, r0 - g * np), p1 = SA_MIN(np, r0 + mr - g * np);
          mask_rows(a, b, B.s + (g * np + p0 - r0) * BK, p1 - p0, BK, kn, rg + p0, i0 + p0, j0);
        }
      tb_ds_strip(B.s, B.dp, B.ds, BK, mr, k0, k1, kn, mul, c->cap2 > 0.0f ? 1.0f / c->cap2 : 0.0f, B.nl2 + r0,
                  B.D + r0, dbias ? B.db + r0 : NULL);
      for (int64_t r = mr; r < mt * SA_TILE_M; r++) memset(B.ds + r * BK + k0, 0, (size_t)(k1 - k0) * sizeof(uint16_t));
      tf_pv(B.ds, BK * (int64_t)sizeof(uint16_t), mt, kp, ksk, k0 / SA_TILE_K, k1 / SA_TILE_K, B.dq + r0 * hp, hp, hp);
      if (c->k_bad) tb_bad_keys_in(c, b, kh, j0, k0, kn, B.ds, BK, mr, B.dq + r0 * hp);
    }
  }
  for (int64_t r = 0; r < M; r++) {
    const int64_t g = r / np, p = r % np, n = kh * G + g;
    put(gr->dq, dt, ((b * T + i0 + p) * N + n) * H, B.dq + r * hp, H, c->scale);
    if (dbias) gr->dbias[sa_bcast_at(c->bias_st, b, n, i0 + p, 0)] += B.db[r];
  }
}

#endif /* SA_CPU_TILE_BWD_H */
