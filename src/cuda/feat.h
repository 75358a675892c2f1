/*
 * feat.h — the inputs only the feature kernels take (a bias, a boolean mask array, query / key positions, the logits
 * soft-cap), as those kernels read them: one parameter block (sa_cuda_feat), made on the host from an sa_attn, and
 * the arithmetic that the feature kernels, their class pre-pass (feat_class.cu) and the host tests
 * (tests/test_cuda_feat.cu) share: the positions' key bounds of a query, the class of a tile (empty, partial, full)
 * from a mask's bytes and from the positions' min / max, the base-2 logit of a pair with bias and soft-cap, and the
 * soft-cap's derivative. Host and device, like hopper/mask.h; plain C so that plan.c includes it.
 * docs/hopper.md, "feature kernels".
 */
#ifndef SA_CUDA_FEAT_H
#define SA_CUDA_FEAT_H

#include <math.h>
#include <stdint.h>

#include "sinkattn.h"

#ifdef __CUDACC__
#define SA_FD __host__ __device__ __forceinline__
#else
#define SA_FD static inline
#endif

/* A tile's class: no pair of it is allowed (skip it), some are (test each), all are (test none). */
enum { SA_FEAT_EMPTY = 0, SA_FEAT_PARTIAL = 1, SA_FEAT_FULL = 2 };

/* What a feature kernel reads besides the plain kernels' parameters. Strides are in elements and 0 along an axis
   the operand is broadcast over (dense row-major in its dims, as sa_bcast_of); along the keys they are 1 or 0. */
typedef struct sa_cuda_feat {
  const void *bias; /* NULL: no bias */
  int bias_dtype;   /* sa_dtype of bias */
  int bias_s;       /* 1, or 0 when bias is broadcast along the keys */
  int64_t bias_b, bias_n, bias_t;
  const uint8_t *mask; /* NULL: no mask array; nonzero = attend */
  int mask_s;
  int64_t mask_b, mask_n, mask_t;
  const int32_t *q_pos, *kv_pos; /* [B, T], [B, S] or NULL: causal and window compare these */
  int pos_causal;                /* with positions: causal (top-left; bottom-right is invalid with positions) */
  long long pos_wl, pos_wr;      /* with positions: the window, -1 unbounded */
  long long pos_diag;            /* with positions: diag_offset, added to every query position */
  float cap, cap_inv, cap_l2, cap_l2_inv; /* the logits soft-cap (0: none), 1 / cap, cap log2(e), its inverse */
  float scale;                            /* the softmax scale (the plain parameter blocks carry it too) */
  /* Tile classes of the mask array and the positions together (Hopper plans; NULL otherwise): the backward's
     table of 64 x 64 blocks [cb][cn][ceil(T / 64)][ceil(S / 64)] bytes in the workspace, where cb is B when the
     mask or the positions vary with the batch, else 1, and cn is N when the mask varies with the head, else 1;
     cls_b, cls_n are its strides (0 when shared), cls_t = ceil(S / 64). */
  uint8_t *cls;
  int64_t cls_b, cls_n, cls_t;
  /* dbias (backward, NULL: not wanted): element (b, n, i, j) of the broadcast goes to dbias_out[b dbias_b +
     n dbias_n + i dbias_t + j dbias_s], which is dbias itself when each of its elements has one (b, n)
     contributor, else the partials [contributor][dbias] that feat_class.cu's sum reduces in contributor order. */
  float *dbias_out;
  int dbias_s;
  int64_t dbias_b, dbias_n, dbias_t;
} sa_cuda_feat;

/* The key positions that a query at position qp may attend (sa_positions_ok with qp' = qp + diag_offset): causal
   kp <= qp', window qp' - wl <= kp <= qp' + wr, as 64-bit bounds that never decrease with qp (windows capped at
   2^42 as sa_positions_ok does, which keeps the sums in range). */
SA_FD void sa_feat_pos_bounds64(const sa_cuda_feat *f, int64_t qp, int64_t *lo, int64_t *hi) {
  const int64_t cap = (int64_t)1 << 42, big = (int64_t)1 << 62, q = qp + f->pos_diag;
  const int64_t wl = f->pos_wl < cap ? f->pos_wl : cap, wr = f->pos_wr < cap ? f->pos_wr : cap;
  *lo = wl >= 0 ? q - wl : -big;
  int64_t h = f->pos_causal ? q : big;
  if (wr >= 0 && q + wr < h) h = q + wr;
  *hi = h;
}

/* The same as int32 bounds for the per-pair test lo <= kv_positions[b, j] <= hi (positions are int32); lo > hi
   when no key position passes. */
SA_FD void sa_feat_pos_bounds(const sa_cuda_feat *f, int32_t qp, int32_t *lo, int32_t *hi) {
  int64_t a, z;
  sa_feat_pos_bounds64(f, qp, &a, &z);
  const int64_t mn = -2147483647LL - 1, mx = 2147483647LL;
  if (a > z || a > mx || z < mn) {
    *lo = 1, *hi = 0;
    return;
  }
  *lo = (int32_t)(a < mn ? mn : a);
  *hi = (int32_t)(z > mx ? mx : z);
}

/* Whether key position kp passes query position qp's bounds (sa_positions_ok): the per-pair form of the dK/dV
   kernels, whose pairs vary in the query. */
SA_FD int sa_feat_pos_ok(const sa_cuda_feat *f, int32_t qp, int32_t kp) {
  int64_t lo, hi;
  sa_feat_pos_bounds64(f, qp, &lo, &hi);
  return kp >= lo && kp <= hi;
}

/* The other way round, for the dK/dV kernels (a key's pairs vary in the query): the query positions qp that see key
   position kp, lo <= qp <= hi as int32 bounds (lo > hi: none). qp + diag sees kp iff causal kp <= qp + diag, window
   qp + diag - wl <= kp <= qp + diag + wr, so qp >= kp - diag (causal), qp >= kp - wr - diag, qp <= kp + wl - diag
   (windows capped at 2^42 as above). */
SA_FD void sa_feat_pos_qbounds(const sa_cuda_feat *f, int32_t kp, int32_t *lo, int32_t *hi) {
  const int64_t cap = (int64_t)1 << 42, big = (int64_t)1 << 62, k = (int64_t)kp - f->pos_diag;
  const int64_t wl = f->pos_wl < cap ? f->pos_wl : cap, wr = f->pos_wr < cap ? f->pos_wr : cap;
  int64_t a = f->pos_causal ? k : -big;
  if (wr >= 0 && k - wr > a) a = k - wr;
  const int64_t z = wl >= 0 ? k + wl : big;
  const int64_t mn = -2147483647LL - 1, mx = 2147483647LL;
  if (a > z || a > mx || z < mn) {
    *lo = 1, *hi = 0;
    return;
  }
  *lo = (int32_t)(a < mn ? mn : a);
  *hi = (int32_t)(z > mx ? mx : z);
}

/* The class of the pairs of query positions [qmin, qmax] with key positions [kmin, kmax]: the bounds never
   decrease with the query position, so every pair passes iff [kmin, kmax] lies in the bounds of qmax's lower and
   qmin's upper end, and none can iff kmax is below qmin's lower bound or kmin above qmax's upper one. */
SA_FD int sa_feat_pos_class(const sa_cuda_feat *f, int32_t qmin, int32_t qmax, int32_t kmin, int32_t kmax) {
  int64_t lo_a, hi_a, lo_z, hi_z;
  sa_feat_pos_bounds64(f, qmin, &lo_a, &hi_a);
  sa_feat_pos_bounds64(f, qmax, &lo_z, &hi_z);
  if (kmax < lo_a || kmin > hi_z) return SA_FEAT_EMPTY;
  return kmin >= lo_z && kmax <= hi_a ? SA_FEAT_FULL : SA_FEAT_PARTIAL;
}

/* The class of a mask tile from whether some of its bytes, and whether all of them, are nonzero. */
SA_FD int sa_feat_mask_class(int any, int all) { return !any ? SA_FEAT_EMPTY : all ? SA_FEAT_FULL : SA_FEAT_PARTIAL; }

/* Whether every byte of a 32-bit word of a mask is nonzero (the pre-pass reads 16 bytes at once). */
SA_FD int sa_feat_word_all(uint32_t w) { return ((w - 0x01010101u) & ~w & 0x80808080u) == 0u; }

/* Where the forward's class list of a 64-row slab lives (feat_class.cu writes it, hopper/fwd_feat.cuh reads it):
   byte k (the slab's k-th 128-key tile) of slab rb of batch b, head n is byte k % (2 Hv) of row 64 rb + k / (2 Hv)
   of out [B, T, N, Hv] bf16, a row of the slab itself: the slab's warpgroup is the only writer of those rows, and
   it stores there only after the producer read the list. Returns the byte offset into out. */
SA_FD int64_t sa_feat_list_offset(int64_t b, int64_t n, int64_t rb, int64_t k, int64_t T, int64_t N, int64_t Hv) {
  const int64_t rowb = 2 * Hv;
  return ((b * T + 64 * rb + k / rowb) * N + n) * rowb + k % rowb;
}

/* A pair passes when both of two rules let it (the mask array and the positions): the class of their AND. */
SA_FD int sa_feat_and(int a, int b) {
  return a == SA_FEAT_EMPTY || b == SA_FEAT_EMPTY ? SA_FEAT_EMPTY
         : a == SA_FEAT_FULL && b == SA_FEAT_FULL ? SA_FEAT_FULL
                                                  : SA_FEAT_PARTIAL;
}

/* The class of a tile made of two side by side (two 64-key blocks in a 128-key tile). */
SA_FD int sa_feat_join(int a, int b) {
  return a == b ? a : a == SA_FEAT_EMPTY && b == SA_FEAT_EMPTY ? SA_FEAT_EMPTY : SA_FEAT_PARTIAL;
}

/* 2^x: ex2.approx on the device (2^-22 relative, flush to zero), exp2f on the host. */
SA_FD float sa_feat_exp2(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

/* tanh(y) for the soft-cap: for |y| < 1/16 its series to y^7 (the next term is below 1e-12 |y|), else
   (1 - e) / (1 + e) with e = 2^(-2 |y| log2 e) and the sign of y: 1 - e >= 0.117 there, so exp2's relative error
   (2^-22 on the device) gives < 2e-6 relative. +-1 at +-inf; NaN stays NaN. */
SA_FD float sa_feat_tanh(float y) {
  const float ay = y < 0.f ? -y : y;
  const float e = sa_feat_exp2(-2.8853900817779268f * ay); /* 2 log2(e) */
  float t = (1.f - e) / (1.f + e);
  t = y < 0.f ? -t : t;
  const float y2 = y * y;
  const float p = y * (1.f + y2 * (-0.33333333333f + y2 * (0.13333333333f + y2 * -0.053968253968f)));
  return ay < 0.0625f ? p : t;
}

/* The base-2 logit of a pair from its fp32 product q.k: (scale q.k + bias) log2(e), or with a soft-cap
   cap tanh((scale q.k + bias) / cap) log2(e). The masks come after (a select, never an add). */
SA_FD float sa_feat_logit2(const sa_cuda_feat *f, float qk, float bias) {
  const float l = qk * f->scale + bias;
  return f->cap > 0.f ? f->cap_l2 * sa_feat_tanh(l * f->cap_inv) : l * 1.4426950408889634f;
}

/* d s / d l of the soft-cap, 1 - tanh^2, at a pair whose probability is p = 2^(s2 - lse2) with s2 the capped base-2
   logit: s2 = log2(p) + lse2, tanh = s2 / (cap log2 e). Recomputed from p, so the backward keeps no tanh per pair:
   where p is 0 the pair's ds is 0 whatever this says. 1 without a cap. */
SA_FD float sa_feat_cap_grad(const sa_cuda_feat *f, float p, float lse2) {
  if (!(f->cap > 0.f)) return 1.f;
#ifdef __CUDA_ARCH__
  float lg;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(lg) : "f"(p));
#else
  const float lg = log2f(p);
#endif
  const float t = (lg + lse2) * f->cap_l2_inv;
  return p > 0.f ? 1.f - t * t : 0.f;
}

#endif /* SA_CUDA_FEAT_H */
