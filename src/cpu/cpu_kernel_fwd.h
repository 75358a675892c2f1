/*
 * cpu_kernel_fwd.h — the vector kernels' forward item, included by cpu_kernel_body.h (not under SA_TILE: the tile
 * kernels' forward item is cpu_tile_fwd.h's) after its scratch, ranges and row helpers: per item (b, kv head,
 * query block of G heads x bq positions) the online softmax over S^T tiles seeded by the sink, the sink added once
 * at the end.
 */
#ifndef SA_CPU_KERNEL_FWD_H
#define SA_CPU_KERNEL_FWD_H

/* One online-softmax step on S^T [nk x Mp] (base 2 once multiplied by mul, score_mul; column c = query
   row c, c < M): s becomes p = 2^(mul s - m_new); l and the output rows o are rescaled by 2^(m_old - m_new). While a running max is
   still -inf (vanilla, nothing valid yet) the reference point is 0 so that masked entries give p = 0, not
   NaN; equal old and new maxima (also +inf == +inf, a +inf sink) rescale by exactly 1. */
static void softmax_cols(float *s, int64_t nk, int64_t Mp, int64_t M, float mul, float *m, float *l, float *o,
                         int64_t hvp, float *cm, float *cl) {
  for (int64_t c0 = 0; c0 < Mp; c0 += VW) {
    vf mx = V_SET1(-INFINITY);
    for (int64_t jj = 0; jj < nk; jj++) mx = V_MAX(mx, V_LOAD(s + jj * Mp + c0));
    V_STORE(cm + c0, mx);
  }
  for (int64_t c = 0; c < Mp; c++) {
    if (c >= M) { /* padding columns: any finite reference */
      cm[c] = 0.0f;
      continue;
    }
    float mx = cm[c] * mul, mold = m[c], mnew = mx > mold ? mx : mold, mu = mnew == -INFINITY ? 0.0f : mnew;
    cl[c] = mold == mu ? 1.0f : exp2f(mold - mu);
    cm[c] = -mu;
    m[c] = mnew;
  }
  const vf mulv = V_SET1(mul);
  (void)mulv; /* the vector layer's EXP_ARG does not read it */
  for (int64_t c0 = 0; c0 < Mp; c0 += VW) {
    vf nmu = V_LOAD(cm + c0), sum = V_ZERO();
    for (int64_t jj = 0; jj < nk; jj++) {
      vf p = V_EXP2(EXP_ARG(V_LOAD(s + jj * Mp + c0), mulv, nmu));
      V_STORE(s + jj * Mp + c0, p);
      sum = V_ADD(sum, p);
    }
    V_STORE(cm + c0, sum);
  }
  for (int64_t c = 0; c < M; c++) {
    l[c] = l[c] * cl[c] + cm[c];
    if (cl[c] != 1.0f) scale_row(o + c * hvp, hvp, cl[c]);
  }
}

static void fwd_item(const sa_cpu_ctx *c, int64_t item, float *ws) {
  const sa_attn *a = c->a;
  const sa_dtype dt = a->dtype;
  const int64_t T = a->q_len, N = a->q_heads, Kh = a->kv_heads, H = a->head_dim, Hv = a->v_head_dim;
  const int64_t G = c->G, hvp = c->hvp, BK = BODY_BK;
  const int64_t qb = item % c->nqb, kh = (item / c->nqb) % Kh, b = item / (c->nqb * Kh);
  const int64_t i0 = qb * c->bq, np = SA_MIN(c->bq, T - i0), M = G * np, Mp = pad_to(M);
  const int64_t ql = sa_q_len_of(a, b), kl = sa_kv_len_of(a, b);
  sa_bufs B;
  carve(c, SA_CPU_FWD, ws, &B);
  sa_range rg[SA_CPU_ROWS];
  int64_t jlo, jhi;
  ranges(a, ql, kl, i0, np, rg, &jlo, &jhi);
  if (Mp > M) memset(B.qt, 0, (size_t)(H * Mp) * sizeof(float));
  /* position by position, its G heads' rows adjacent in q, the position ROW_AHEAD on asked for meanwhile */
  for (int64_t p = 0; p < np; p++) {
    if (p + ROW_AHEAD < np) prefetch_rows(a->q, dt, b * T + i0 + p + ROW_AHEAD, 1, N * H, kh * G * H, G * H);
    for (int64_t g = 0; g < G; g++) {
      int64_t r = g * np + p, n = kh * G + g;
      T_COL_CVT(B, B.qt, Mp, r, a->q, dt, ((b * T + i0 + p) * N + n) * H, H, QSCALE(c), B.ra);
      B.r1[r] = sa_sink_logit(a, n) * SA_LOG2E; /* running max, seeded with the sink */
      B.r2[r] = 0.0f;                           /* running sum, without the sink */
    }
  }
  memset(B.acc, 0, (size_t)(M * hvp) * sizeof(float));
  STAGE_T(B.sq, H, M, Mp, B.ra);

  for (int64_t j0 = jlo; j0 < jhi; j0 += BK) {
    const int64_t nk = SA_MIN(BK, jhi - j0);
    const int cls = tile_class(a, b, rg, i0, np, j0, nk), pos = a->q_positions && cls == 1, add = c->fill;
    float *kill = c->kill || pos ? B.kl : NULL;
    if (cls == 0 ||
        ((add || kill) && !fill_cols(c, b, kh, add ? B.s : NULL, B.row, kill, B.krow, nk, Mp, M, np, i0, j0, pos)))
      continue;
    const float mul = score_mul(c, add);
    const kv_rows kv = load_kv_rows(c, &B, b, kh, j0, nk, jhi);
    PRODUCT(B, B.sq, nk, Mp, H, kv.k, kv.kld, 1, B.qt, Mp, B.s, Mp, add, PSCALE(c) / mul); /* S^T = (bias^T +) k q^T */
    finish_scores(c, B.s, kill, nk * Mp);
    if (cls == 1) mask_cols(a, b, B.s, nk, Mp, M, np, rg, i0, j0, B.mlo, B.mhi);
    softmax_cols(B.s, nk, Mp, M, mul, B.r1, B.r2, B.acc, hvp, B.cm, B.cl);
    PRODUCT(B, NULL, M, hvp, nk, B.s, 1, Mp, kv.v, kv.vld, B.acc, hvp, 1, 1.0f); /* o += P v, P through S^T */
  }

  /* The sink enters here, once: l_total = l + 2^(a - m). No valid key contributed (l == 0): out = 0 and
     lse = a exactly (also right when every p underflowed under a huge sink: the rest is below fp32). */
  for (int64_t r = 0; r < M; r++) {
    int64_t g = r / np, p = r % np, n = kh * G + g, i = i0 + p;
    float sink = sa_sink_logit(a, n), m = B.r1[r], l = B.r2[r], lse;
    float *o = B.acc + r * hvp;
    /* l == 0 alone: m = -inf implies l = 0, except when a NaN score made l NaN (the max skips NaN):
       that row must come out NaN, not look empty. */
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

#endif
