/*
 * cpu_decode_avx512.h — what the two AVX-512 decode work items share: the AVX-512 one (cpu_decode_avx512.c,
 * plans cpu.decode.avx512 / avx512bf16) and the tile one (cpu_decode_tile.h, plans cpu.decode.amx and
 * cpu.decode.amx.emulated). Both keep S^T [keys][rows] with the query rows in the 16 vector lanes: how the
 * rows of the kv heads fill the lanes, the online-softmax step down the lanes, and the spread L2 prefetch of
 * the next block. Included only by translation units compiled with AVX-512 (F, BW, VL, DQ).
 */
#ifndef SA_CPU_DECODE_AVX512_H
#define SA_CPU_DECODE_AVX512_H

#include <immintrin.h>
#include <stdint.h>

#include "cpu_decode.h"
#include "cpu_exp2_avx512.h"

#define SA_INL static inline __attribute__((always_inline))

static inline int64_t sa_al16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* How the rows of the kv heads fill the lanes: hpv heads per 16-lane vector, lanes per head (the head's R
   rows, then padding), Rp lanes per group of heads. R <= 8 rows of one head would leave half the lanes of
   a score vector empty (gpt-oss decode: G = 8, one token), so 16 / lanes heads share one: half the
   vdpbf16ps and the exp2 of a vector per head. */
typedef struct {
  int64_t hpv, lanes, Rp, groups;
} sa_dec_pack;

static inline sa_dec_pack sa_dec_pack_of(int64_t R, int64_t K) {
  sa_dec_pack p = {1, sa_al16(R), sa_al16(R), K};
  if (R <= 8 && K > 1) {
    int64_t lanes = R <= 1 ? 1 : R <= 2 ? 2 : R <= 4 ? 4 : 8;
    while (16 / lanes > K) lanes *= 2; /* no more heads per vector than there are */
    p.hpv = 16 / lanes;
    p.lanes = lanes;
    p.Rp = 16;
    p.groups = (K + p.hpv - 1) / p.hpv;
  }
  return p;
}

/* Each lane's key range relative to jlo (a chunk is at most 4096 keys, whatever S) into rlo, rhi [Rp]: a
   row's range is the same in every head; padding lanes see every key (their q is 0: finite scores, never
   written out). *lo_max, *hi_min: the latest start and the earliest end over the lanes, so a block inside
   both needs no mask. The running maxima gm and sums gl [groups][Rp] start at -inf and 0. */
static inline void sa_dec_lanes_init(const sa_decode_item *it, const sa_dec_pack *pk, int32_t *rlo, int32_t *rhi,
                                     float *gm, float *gl, int64_t *lo_max, int64_t *hi_min) {
  const int64_t R = it->plan->rows;
  *lo_max = it->jlo;
  *hi_min = it->jhi;
  for (int64_t x = 0; x < pk->Rp; x++) {
    const int64_t r = pk->hpv > 1 ? x % pk->lanes : x;
    const int64_t lo = r < R ? it->rng[2 * r] : it->jlo, hi = r < R ? it->rng[2 * r + 1] : it->jhi;
    rlo[x] = (int32_t)(lo > it->jlo ? lo - it->jlo : 0);
    rhi[x] = (int32_t)(hi > it->jlo ? hi - it->jlo : 0);
    if (lo > *lo_max) *lo_max = lo;
    if (hi < *hi_min) *hi_min = hi;
  }
  for (int64_t x = 0; x < pk->groups * pk->Rp; x++) {
    gm[x] = -INFINITY;
    gl[x] = 0.0f;
  }
}

/* The item's m and l per (kv head, row) from the lanes' gm, gl. */
static inline void sa_dec_lanes_out(const sa_decode_item *it, const sa_dec_pack *pk, const float *gm, const float *gl) {
  for (int64_t kh = 0; kh < it->a->kv_heads; kh++)
    for (int64_t r = 0; r < it->plan->rows; r++) {
      const int64_t x = (kh / pk->hpv) * pk->Rp + (kh % pk->hpv) * pk->lanes + r;
      it->m[kh * it->mstride + r] = gm[x];
      it->l[kh * it->mstride + r] = gl[x];
    }
}

/* Lines still to be asked into L2: [p, p + n * 64) then [p2, p2 + n2 * 64); per lines a step. */
typedef struct {
  const char *p, *p2;
  int64_t n, n2, per;
} sa_dec_pf;

SA_INL void sa_dec_pf_step(sa_dec_pf *f, int64_t lines) {
  /* two straight runs, not a test per line: at gpt-oss's shape a block asks 4 lines per key and head */
  const int64_t a = lines < f->n ? lines : f->n, b = lines - a < f->n2 ? lines - a : f->n2;
  for (int64_t x = 0; x < a; x++) __builtin_prefetch(f->p + 64 * x, 0, 2);
  for (int64_t x = 0; x < b; x++) __builtin_prefetch(f->p2 + 64 * x, 0, 2);
  if (a > 0) { /* p, p2 are NULL past the last block */
    f->p += 64 * a;
    f->n -= a;
  }
  if (b > 0) {
    f->p2 += 64 * b;
    f->n2 -= b;
  }
}

/* One block's online-softmax step for every row vector of a kv head (the block's first key at j0, lane
   ranges [rlo, rhi) in the same coordinates): masks (when some row's range cuts the block), the new maxima, st becomes p = 2^(s - m), l and m updated, corr = 2^(m_old - m_new). While
   a row's max is still -inf the reference point is 0, so its masked entries give p = 0, not NaN. */
static inline void sa_dec_softmax(int64_t Rp, int64_t nb, int64_t j0, int mask, const int32_t *rlo, const int32_t *rhi,
                                  float *st, float *m, float *l, float *corr) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  for (int64_t v = 0; v < Rp; v += 16) {
    __m512 mx = ninf;
    if (mask) {
      const __m512i lo = _mm512_load_si512(rlo + v), hi = _mm512_load_si512(rhi + v);
      for (int64_t jj = 0; jj < nb; jj++) {
        const __m512i j = _mm512_set1_epi32((int32_t)(j0 + jj));
        const __mmask16 ok = _mm512_cmple_epi32_mask(lo, j) & _mm512_cmplt_epi32_mask(j, hi);
        const __m512 s = _mm512_mask_blend_ps(ok, ninf, _mm512_load_ps(st + jj * Rp + v));
        _mm512_store_ps(st + jj * Rp + v, s);
        mx = _mm512_max_ps(mx, s);
      }
    } else {
      for (int64_t jj = 0; jj < nb; jj++) mx = _mm512_max_ps(mx, _mm512_load_ps(st + jj * Rp + v));
    }
    const __m512 mold = _mm512_load_ps(m + v), mnew = _mm512_max_ps(mold, mx);
    const __m512 mu = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mnew, ninf, _CMP_EQ_OQ), mnew, _mm512_setzero_ps());
    const __m512 cr = sa_exp2_avx512(_mm512_sub_ps(mold, mu));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t jj = 0; jj < nb; jj++) {
      const __m512 p = sa_exp2_avx512(_mm512_sub_ps(_mm512_load_ps(st + jj * Rp + v), mu));
      _mm512_store_ps(st + jj * Rp + v, p);
      sum = _mm512_add_ps(sum, p);
    }
    _mm512_store_ps(l + v, _mm512_fmadd_ps(_mm512_load_ps(l + v), cr, sum));
    _mm512_store_ps(m + v, mnew);
    _mm512_store_ps(corr + v, cr);
  }
}

#endif /* SA_CPU_DECODE_AVX512_H */
