/*
 * cpu_mask.h — the masks, the bias and dbias of the CPU kernels' score tiles, included by cpu_kernel_body.h
 * (it uses that file's vector layer, cvt and scatter_col). Validity itself is sa_internal.h's
 * (sa_key_range, sa_segment_ok, sa_positions_ok, the mask array); this file applies it to tiles:
 *   tile_class   whether a tile can be skipped, needs the per-element mask, or is wholly valid (lengths,
 *                causal, window, segments and positions, from per-tile ranges and min / max);
 *   fill_*       the additive tile a score tile starts from when there is a bias or a mask array (and, in
 *                partial tiles, positions): bias * log2(e) where the pair is allowed, -inf where the mask
 *                or the positions forbid it. The product then accumulates onto it, so the bias costs one
 *                pass over the tile, not a second pass after the product. A tile the fill finds wholly
 *                forbidden is skipped;
 *   mask_*       lengths, causal / window on indices and segments, applied after the product;
 *   dbias_*      ds added to the dbias elements the tile's pairs read.
 * Scores are in base 2 here (cpu_kernel_body.h), so a bias enters as bias * log2(e).
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

/* Keys [j0, j0 + nk) of row (b, n, i) of the additive tile into row[0, nk): bias * log2(e), or 0, and -inf
   where the mask (or, with pos, the positions) forbid the pair. Returns 1 when some pair is allowed. The
   row `rows_ahead` rows further (dk/dv pass) or 2 key tiles further (else) is prefetched. */
static int fill_row(const sa_cpu_ctx *c, int64_t b, int64_t n, int64_t i, int64_t j0, int64_t nk, float *row, int pos,
                    int64_t rows_ahead) {
  const sa_attn *a = c->a;
  const sa_bcast bs = c->bias_st, ms = c->mask_st;
  if (!a->bias) {
    memset(row, 0, (size_t)nk * sizeof *row);
  } else if (bs.s) {
    const int64_t off = sa_bcast_at(bs, b, n, i, j0);
    cvt(row, a->bias, a->bias_dtype, off, nk, nk, SA_LOG2E);
    prefetch_ahead(a->bias, sa_dtype_size(a->bias_dtype), off, rows_ahead ? rows_ahead * bs.t : 2 * BODY_BK, nk,
                   sa_dims_count(a->bias_dims));
  } else { /* one bias for every key of the row */
    float x = sa_load(a->bias, a->bias_dtype, sa_bcast_at(bs, b, n, i, 0)) * SA_LOG2E;
    for (int64_t jj = 0; jj < nk; jj++) row[jj] = x;
  }
  if (!a->mask && !pos) return 1;
  const uint8_t *m = a->mask ? a->mask + sa_bcast_at(ms, b, n, i, j0) : NULL;
  if (m && ms.s)
    prefetch_ahead(a->mask, 1, m - a->mask, rows_ahead ? rows_ahead * ms.t : 2 * BODY_BK, nk,
                   sa_dims_count(a->mask_dims));
  const int64_t qp = pos ? a->q_positions[b * a->q_len + i] + a->diag_offset : 0;
  const int32_t *kp = pos ? a->kv_positions + b * a->kv_len + j0 : NULL;
  int any = 0;
  for (int64_t jj = 0; jj < nk; jj++) {
    int ok = (!m || m[jj * ms.s]) && (!pos || sa_positions_ok(a, qp, kp[jj]));
    if (!ok) row[jj] = -INFINITY;
    any |= ok;
  }
  return any;
}

/* The additive S^T tile [nk x Mp] (keys j0.. x the G * np rows of kv head kh; column r is head
   kh * G + r / np at position i0 + r % np), 0 in the padding columns. VW columns at a time are built as
   rows of keys (blk [VW x BODY_BK], along which bias and mask are contiguous), then written across:
   each store of the transpose then lands in the line the previous one did. Written one column at a time,
   down the tile's 64 lines, the same transpose cost 26% of the forward with a full bias (perf, f32,
   T = S = 2048, N = 8, H = 128). 0: no pair allowed. */
static int fill_cols(const sa_cpu_ctx *c, int64_t b, int64_t kh, float *s, float *blk, int64_t nk, int64_t Mp,
                     int64_t M, int64_t np, int64_t i0, int64_t j0, int pos) {
  int any = 0;
  for (int64_t r0 = 0; r0 < Mp; r0 += VW) {
    const int64_t nc = SA_MAX(0, SA_MIN(VW, M - r0));
    for (int64_t x = 0; x < nc; x++)
      any |= fill_row(c, b, kh * c->G + (r0 + x) / np, i0 + (r0 + x) % np, j0, nk, blk + x * BODY_BK, pos, 0);
    for (int64_t jj = 0; jj < nk; jj++) {
      float *dst = s + jj * Mp + r0;
      for (int64_t x = 0; x < nc; x++) dst[x] = blk[x * BODY_BK + jj];
      for (int64_t x = nc; x < VW; x++) dst[x] = 0.0f;
    }
  }
  return any;
}

/* The additive S tile [np x bk] of head n (positions i0.. x keys j0..), 0 past nk. 0: no pair allowed. */
static int fill_rows(const sa_cpu_ctx *c, int64_t b, int64_t n, float *s, int64_t np, int64_t bk, int64_t nk,
                     int64_t i0, int64_t j0, int pos) {
  int any = 0;
  for (int64_t p = 0; p < np; p++) {
    any |= fill_row(c, b, n, i0 + p, j0, nk, s + p * bk, pos, 2 * BODY_BQ2);
    memset(s + p * bk + nk, 0, (size_t)(bk - nk) * sizeof *s);
  }
  return any;
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
