/*
 * cpu_mask.h — the masks, the bias and dbias of the CPU kernels' score tiles, included by cpu_kernel_body.h
 * (it uses that file's vector layer, cvt and scatter_col). Validity itself is sa_internal.h's
 * (sa_key_range, sa_segment_ok, sa_positions_ok, the mask array); this file applies it to tiles:
 *   tile_class   whether a tile can be skipped, needs the per-element mask, or is wholly valid (lengths,
 *                causal, window, segments and positions, from per-tile ranges and min / max);
 *   fill_*       the tiles a score tile needs beside its product: with a bias the additive tile it starts
 *                from, bias * log2(e) (the product accumulates onto it, so the bias costs one pass over the
 *                tile, not a second pass after the product); with a mask array (and, in partial tiles,
 *                positions) the kill tile, -inf where they forbid the pair and 0 where they allow it. A tile
 *                the fill finds wholly forbidden is skipped;
 *   finish_scores  the hook between a score product and the softmax: the soft-cap, then the kill tile;
 *   mask_*       lengths, causal / window on indices and segments, applied after the product;
 *   dbias_*      ds added to the dbias elements the tile's pairs read.
 * Every mask selects: a forbidden pair's score becomes -inf whatever the product gave, so a NaN or an inf in a
 * masked key (0 * NaN, inf - inf in the product) never reaches a valid row. An additive -inf (the mask in the
 * tile the product starts from) would: -inf + NaN is NaN.
 * Scores are in base 2 here (cpu_kernel_body.h), so a bias enters as bias * log2(e) and the cap as
 * cap * log2(e): cap * tanh(l / cap) in natural units is log2(e) cap tanh(l log2(e) / (log2(e) cap)).
 */

/* ---- which tiles ----------------------------------------------------------------------------- */

/* How key tile [j0, j0 + nk) meets query positions [i0, i0 + np) (key ranges rg): 0 no valid pair
   (skip the tile), 1 some pairs (apply the mask), 2 every pair valid. Sorted segment ids (packed
   sequences) make most off-diagonal tiles disjoint in their [min, max] id range: those are skipped too,
   and so are tiles whose key positions all lie outside every query position's causal / window reach. */
static int tile_class(const sa_attn *a, int64_t b, const sa_range *rg, int64_t i0, int64_t np, int64_t j0, int64_t nk) {
  int any = 0, all = 1;
  for (int64_t p = 0; p < np; p++) {
    if (rg[p].lo < j0 + nk && rg[p].hi > j0) any = 1;
    if (rg[p].lo > j0 || rg[p].hi < j0 + nk) all = 0;
  }
  if (!any) return 0;
  if (a->q_segment_ids) {
    const int32_t *qs = a->q_segment_ids + b * a->q_len + i0, *ks = a->kv_segment_ids + b * a->kv_len + j0;
    int32_t qmin = qs[0], qmax = qs[0], kmin = ks[0], kmax = ks[0];
    for (int64_t p = 1; p < np; p++) {
      qmin = SA_MIN(qmin, qs[p]);
      qmax = SA_MAX(qmax, qs[p]);
    }
    for (int64_t j = 1; j < nk; j++) {
      kmin = SA_MIN(kmin, ks[j]);
      kmax = SA_MAX(kmax, ks[j]);
    }
    if (qmax < kmin || kmax < qmin) return 0;
    if (!(qmin == qmax && kmin == kmax && qmin == kmin)) all = 0;
  }
  if (a->q_positions) {
    /* Some pair may pass only if each bound can hold for the extreme positions; all pass if each holds
       for the opposite extremes. Windows are capped as in sa_positions_ok. */
    const int32_t *qs = a->q_positions + b * a->q_len + i0, *ks = a->kv_positions + b * a->kv_len + j0;
    int32_t qmin = qs[0], qmax = qs[0], kmin = ks[0], kmax = ks[0];
    for (int64_t p = 1; p < np; p++) {
      qmin = SA_MIN(qmin, qs[p]);
      qmax = SA_MAX(qmax, qs[p]);
    }
    for (int64_t j = 1; j < nk; j++) {
      kmin = SA_MIN(kmin, ks[j]);
      kmax = SA_MAX(kmax, ks[j]);
    }
    const int64_t cap = (int64_t)1 << 42, lo = (int64_t)qmin + a->diag_offset, hi = (int64_t)qmax + a->diag_offset;
    const int64_t wl = SA_MIN(a->window_left, cap), wr = SA_MIN(a->window_right, cap);
    if (a->causal != SA_CAUSAL_NONE && (kmin > hi || kmax > lo)) {
      if (kmin > hi) return 0;
      all = 0;
    }
    if (wl >= 0 && (kmax < lo - wl || kmin < hi - wl)) {
      if (kmax < lo - wl) return 0;
      all = 0;
    }
    if (wr >= 0 && (kmin > hi + wr || kmax > lo + wr)) {
      if (kmin > hi + wr) return 0;
      all = 0;
    }
  }
  return all ? 2 : 1;
}

/* ---- the additive tile: bias, mask array, positions ------------------------------------------ */

/* Asks for elements [off + ahead, off + ahead + n) of an operand of `count` elements to be brought into cache.
   A tile reads up to 256 rows of bias or mask, each one stream of 64 keys; prefetching a whole tile in one
   burst did nothing measurable, one row's at a time, as each row is read, took the forward with a full
   f32 bias from 1.42x to 1.23x the call without one (CPU time, T = S = 2048, N = 8, H = 128, one thread). */
static void prefetch_ahead(const void *base, size_t es, int64_t off, int64_t ahead, int64_t n, int64_t count) {
  if (ahead <= 0 || off + ahead + n > count) return;
  const char *p = (const char *)base + (size_t)(off + ahead) * es;
  for (int64_t x = 0; x < n * (int64_t)es; x += 64) __builtin_prefetch(p + x, 0, 3);
}

/* Keys [j0, j0 + nk) of row (b, n, i): row[0, nk) = bias * log2(e) (row NULL: no bias), kill[0, nk) = -inf
   where the mask (or, with pos, the positions) forbid the pair, else 0 (kill NULL: neither applies).
   Returns 1 when some pair is allowed. The row `rows_ahead` rows further (dk/dv pass) or 2 key tiles
   further (else) is prefetched. */
static int fill_row(const sa_cpu_ctx *c, int64_t b, int64_t n, int64_t i, int64_t j0, int64_t nk, float *row,
                    float *kill, int pos, int64_t rows_ahead) {
  const sa_attn *a = c->a;
  const sa_bcast bs = c->bias_st, ms = c->mask_st;
  if (row && bs.s) {
    const int64_t off = sa_bcast_at(bs, b, n, i, j0);
    cvt(row, a->bias, a->bias_dtype, off, nk, nk, SA_LOG2E);
    prefetch_ahead(a->bias, sa_dtype_size(a->bias_dtype), off, rows_ahead ? rows_ahead * bs.t : 2 * BODY_BK, nk,
                   sa_dims_count(a->bias_dims));
  } else if (row) { /* one bias for every key of the row */
    float x = sa_load(a->bias, a->bias_dtype, sa_bcast_at(bs, b, n, i, 0)) * SA_LOG2E;
    for (int64_t jj = 0; jj < nk; jj++) row[jj] = x;
  }
  if (!kill) return 1;
  const uint8_t *m = a->mask ? a->mask + sa_bcast_at(ms, b, n, i, j0) : NULL;
  if (m && ms.s)
    prefetch_ahead(a->mask, 1, m - a->mask, rows_ahead ? rows_ahead * ms.t : 2 * BODY_BK, nk,
                   sa_dims_count(a->mask_dims));
  const int64_t qp = pos ? a->q_positions[b * a->q_len + i] + a->diag_offset : 0;
  const int32_t *kp = pos ? a->kv_positions + b * a->kv_len + j0 : NULL;
  int any = 0;
  for (int64_t jj = 0; jj < nk; jj++) {
    int ok = (!m || m[jj * ms.s]) && (!pos || sa_positions_ok(a, qp, kp[jj]));
    kill[jj] = ok ? 0.0f : -INFINITY;
    any |= ok;
  }
  return any;
}

/* Rows [0, nk) x columns [r0, r0 + VW) of the S^T tile dst [nk x Mp] from the VW rows of keys in blk
   [VW x BODY_BK] (nc of them real, the rest 0). */
static void fill_across(float *dst, const float *blk, int64_t nk, int64_t Mp, int64_t r0, int64_t nc) {
  for (int64_t jj = 0; jj < nk; jj++) {
    float *d = dst + jj * Mp + r0;
    for (int64_t x = 0; x < nc; x++) d[x] = blk[x * BODY_BK + jj];
    for (int64_t x = nc; x < VW; x++) d[x] = 0.0f;
  }
}

/* The bias tile s and the kill tile kill, S^T [nk x Mp] each (keys j0.. x the G * np rows of kv head kh;
   column r is head kh * G + r / np at position i0 + r % np), 0 in the padding columns; s or kill NULL: not
   wanted. VW columns at a time are built as rows of keys (blk, kblk [VW x BODY_BK], along which bias and mask
   are contiguous), then written across: each store of the transpose then lands in the line the previous one
   did. Written one column at a time, down the tile's 64 lines, the same transpose cost 26% of the forward
   with a full bias (perf, f32, T = S = 2048, N = 8, H = 128). 0: no pair allowed. */
static int fill_cols(const sa_cpu_ctx *c, int64_t b, int64_t kh, float *s, float *blk, float *kill, float *kblk,
                     int64_t nk, int64_t Mp, int64_t M, int64_t np, int64_t i0, int64_t j0, int pos) {
  int any = 0;
  for (int64_t r0 = 0; r0 < Mp; r0 += VW) {
    const int64_t nc = SA_MAX(0, SA_MIN(VW, M - r0));
    for (int64_t x = 0; x < nc; x++)
      any |= fill_row(c, b, kh * c->G + (r0 + x) / np, i0 + (r0 + x) % np, j0, nk, s ? blk + x * BODY_BK : NULL,
                      kill ? kblk + x * BODY_BK : NULL, pos, 0);
    if (s) fill_across(s, blk, nk, Mp, r0, nc);
    if (kill) fill_across(kill, kblk, nk, Mp, r0, nc);
  }
  return any;
}

/* The bias tile s and the kill tile kill, S [np x bk] each, of head n (positions i0.. x keys j0..), 0 past
   nk; s or kill NULL: not wanted. 0: no pair allowed. */
static int fill_rows(const sa_cpu_ctx *c, int64_t b, int64_t n, float *s, float *kill, int64_t np, int64_t bk,
                     int64_t nk, int64_t i0, int64_t j0, int pos) {
  int any = 0;
  for (int64_t p = 0; p < np; p++) {
    float *sr = s ? s + p * bk : NULL, *kr = kill ? kill + p * bk : NULL;
    any |= fill_row(c, b, n, i0 + p, j0, nk, sr, kr, pos, 2 * BODY_BQ2);
    if (sr) memset(sr + nk, 0, (size_t)(bk - nk) * sizeof *s);
    if (kr) memset(kr + nk, 0, (size_t)(bk - nk) * sizeof *kill);
  }
  return any;
}

/* fill_rows for the G heads of a key head's group, kh G .. kh G + G - 1, as the tile kernels stack them: head g's
   rows np bk floats after head g - 1's (add: the bias tiles wanted; kill NULL: no kill tile). 0: no pair allowed. */
static inline int fill_group(const sa_cpu_ctx *c, int64_t b, int64_t kh, int64_t G, int add, float *bias, float *kill,
                             int64_t np, int64_t bk, int64_t nk, int64_t i0, int64_t j0, int pos) {
  int any = 0;
  for (int64_t g = 0; g < G; g++)
    any |= fill_rows(c, b, kh * G + g, add ? bias + g * np * bk : NULL, kill ? kill + g * np * bk : NULL, np, bk, nk,
                     i0, j0, pos);
  return any;
}

/* ---- the scores of a tile: soft-cap, then the kill tile ------------------------------------------ */

/* The n scores at s (base 2, scaled: score_mul 1) as the softmax takes them: capped, s = cap2 tanh(s / cap2)
   (c->cap2 = cap * log2(e) > 0), then -inf where kill is -inf (kill NULL: no kill tile). Capping first makes
   a masked pair -inf, not -cap. With neither, nothing is done: the uncapped kernels pay one test per tile. */
static void finish_scores(const sa_cpu_ctx *c, float *s, const float *kill, int64_t n) {
  if (c->cap2 > 0.0f) {
    const vf cv = V_SET1(c->cap2), iv = V_SET1(1.0f / c->cap2);
    for (int64_t e = 0; e < n; e += VW) V_STORE(s + e, V_MUL(cv, V_TANH(V_MUL(V_LOAD(s + e), iv))));
  }
  if (kill)
    for (int64_t e = 0; e < n; e += VW) V_STORE(s + e, V_KEEP(V_LOAD(s + e), V_LOAD(kill + e)));
}

/* ds/dl of the soft-cap, 1 - t^2 with t = s / cap2 the tanh, from a capped score s; -inf where s is (a masked
   pair: its ds is taken as 0 by V_MUL_NZ, never multiplied out). */
static inline vf cap_grad(vf s, vf inv_cap2) {
  const vf t = V_MUL(s, inv_cap2);
  return V_SUB(V_SET1(1.0f), V_MUL(t, t));
}

/* ---- lengths, causal / window on indices, segments ------------------------------------------- */

/* Masked scores of the S^T tile [nk x Mp] (keys j0.. x the G * np rows; column r is position r % np) to
   -inf: the key range of each column as a vector compare per row (a per-element byte mask cost 15% of the
   causal forward), then segments element by element. */
static void mask_cols(const sa_attn *a, int64_t b, float *s, int64_t nk, int64_t Mp, int64_t M, int64_t np,
                      const sa_range *rg, int64_t i0, int64_t j0, float *mlo, float *mhi) {
  for (int64_t r = 0; r < Mp; r++) {
    int64_t p = r % np;
    mlo[r] = r < M ? (float)SA_MAX(0, SA_MIN(rg[p].lo - j0, nk)) : 0.0f;
    mhi[r] = r < M ? (float)SA_MAX(0, SA_MIN(rg[p].hi - j0, nk)) : (float)nk;
  }
  for (int64_t jj = 0; jj < nk; jj++) {
    vf jv = V_SET1((float)jj);
    float *row = s + jj * Mp;
    for (int64_t e = 0; e < Mp; e += VW)
      V_STORE(row + e, V_MASK_RANGE(V_LOAD(row + e), jv, V_LOAD(mlo + e), V_LOAD(mhi + e)));
  }
  if (a->q_segment_ids)
    for (int64_t jj = 0; jj < nk; jj++)
      for (int64_t r = 0; r < M; r++)
        if (!sa_segment_ok(a, b, i0 + r % np, j0 + jj)) s[jj * Mp + r] = -INFINITY;
}

/* Masked scores of the S tile [np x bk] (positions i0.. x keys j0..; columns past nk are never read) to
   -inf: each row's valid keys are one interval, then segments element by element. */
static void mask_rows(const sa_attn *a, int64_t b, float *s, int64_t np, int64_t bk, int64_t nk, const sa_range *rg,
                      int64_t i0, int64_t j0) {
  for (int64_t p = 0; p < np; p++) {
    int64_t lo = SA_MAX(0, SA_MIN(rg[p].lo - j0, nk)), hi = SA_MAX(lo, SA_MIN(rg[p].hi - j0, nk));
    float *row = s + p * bk;
    for (int64_t jj = 0; jj < lo; jj++) row[jj] = -INFINITY;
    for (int64_t jj = hi; jj < nk; jj++) row[jj] = -INFINITY;
    if (a->q_segment_ids)
      for (int64_t jj = lo; jj < hi; jj++)
        if (!sa_segment_ok(a, b, i0 + p, j0 + jj)) row[jj] = -INFINITY;
  }
}

/* ---- dbias ------------------------------------------------------------------------------------- */

/* dS [np x bk] of head n (positions i0.., keys j0..; the first nk keys are real) into dbias, row by row in
   order (the dk/dv pass). A bias shared along the keys takes each row's sum. */
static void dbias_rows(const sa_cpu_ctx *c, int64_t b, int64_t n, const float *ds, int64_t np, int64_t bk, int64_t nk,
                       int64_t i0, int64_t j0) {
  for (int64_t p = 0; p < np; p++) {
    float *dst = c->g->dbias + sa_bcast_at(c->bias_st, b, n, i0 + p, j0);
    const float *x = ds + p * bk;
    if (c->bias_st.s) {
      int64_t jj = 0;
      for (; jj + VW <= nk; jj += VW) V_STORE(dst + jj, V_ADD(V_LOAD(dst + jj), V_LOAD(x + jj)));
      for (; jj < nk; jj++) dst[jj] += x[jj];
    } else {
      float acc = 0.0f;
      for (int64_t jj = 0; jj < nk; jj++) acc += x[jj];
      dst[0] += acc;
    }
  }
}

/* dS^T [nk x Mp] summed down its keys into acc[Mp] (the dq pass, for a bias shared along the keys). */
static void dbias_cols(const float *ds, int64_t nk, int64_t Mp, float *acc) {
  for (int64_t jj = 0; jj < nk; jj++)
    for (int64_t e = 0; e < Mp; e += VW) V_STORE(acc + e, V_ADD(V_LOAD(acc + e), V_LOAD(ds + jj * Mp + e)));
}
