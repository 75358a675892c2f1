/*
 * cpu_decode_portable.c — the decode work item in plain C (cpu.decode.portable: CPUs without AVX-512, or
 * SINKATTN_SIMD avx2 / scalar). Per tile of 16 keys and kv head, K is converted and transposed once
 * (Kt [H][16]) and reused by all R rows; the online softmax runs per row. Scores are base-2 logits.
 */
#include <stdlib.h>

#include "cpu_decode.h"

#define SA_DEC_TILE 16

/* 2^x for x <= 0 (x = -inf allowed): x = n + f with f in [-0.5, 0.5], 2^f by its degree-6 Taylor
   polynomial (relative error < 2e-7 there), 2^n written into the exponent. x < -126.5 gives exactly 0,
   which is what a masked score needs. Branch-free so a loop over it vectorises. */
static inline float sa_dec_exp2(float x) {
  x = x < -127.0f ? -127.0f : x;
  float n = floorf(x + 0.5f), f = x - n;
  float p = 1.5403530393381608e-4f;
  p = p * f + 1.3333558146428443e-3f;
  p = p * f + 9.618129107628477e-3f;
  p = p * f + 5.550410866482158e-2f;
  p = p * f + 2.402265069591007e-1f;
  p = p * f + 6.931471805599453e-1f;
  p = p * f + 1.0f;
  uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
  float s;
  memcpy(&s, &bits, 4);
  return p * s;
}

/* dst[0..n) = fp32 of the n contiguous elements of src starting at element off. */
static void sa_dec_row_load(const void *src, sa_dtype t, int64_t off, int64_t n, float *dst) {
  for (int64_t i = 0; i < n; i++) dst[i] = sa_load(src, t, off + i);
}

/* Per kv head the rows' q [R][H] (scaled into base 2), then Kt [H][16], Vt [16][Hv] and one row. */
int64_t sa_cpu_decode_portable_scratch(const sa_attn *a, const sa_cpu_plan *p) {
  const int64_t H = a->head_dim, Hv = a->v_head_dim;
  return a->kv_heads * p->rows * H + H * SA_DEC_TILE + SA_DEC_TILE * Hv + (H > Hv ? H : Hv);
}

void sa_cpu_decode_portable(const sa_decode_item *it, float *scratch) {
  const sa_attn *a = it->a;
  const int64_t H = a->head_dim, Hv = a->v_head_dim, G = it->group, R = it->plan->rows, N = a->q_heads, K = a->kv_heads,
                T = a->q_len, S = a->kv_len, b = it->b;
  float *qs = scratch, *kt = qs + K * R * H, *vf = kt + H * SA_DEC_TILE, *row = vf + SA_DEC_TILE * Hv;
  for (int64_t kh = 0; kh < K; kh++)
    for (int64_t r = 0; r < R; r++) {
      int64_t t = r / G, n = kh * G + r % G;
      float *qr = qs + (kh * R + r) * H;
      sa_dec_row_load(a->q, a->dtype, ((b * T + t) * N + n) * H, H, qr);
      for (int64_t d = 0; d < H; d++) qr[d] *= it->qscale;
    }

  /* Tiles of 16 keys; all kv heads of a tile are done together so the cache is read front to back: one
     head's rows alone are K * H elements apart (1 KiB at gpt-oss bf16), a stride that ran at 0.3 GB/s on
     a 2-core Zen 4. The next tile is asked into L2 meanwhile. */
  const size_t es = sa_dtype_size(a->dtype);
  for (int64_t j0 = it->jlo; j0 < it->jhi; j0 += SA_DEC_TILE) {
    const int64_t nj = it->jhi - j0 < SA_DEC_TILE ? it->jhi - j0 : SA_DEC_TILE;
    const int64_t jp = j0 + SA_DEC_TILE, np = it->jhi - jp < SA_DEC_TILE ? it->jhi - jp : SA_DEC_TILE;
    for (int64_t jj = 0; jj < np; jj++) {
      const char *kp = (const char *)a->k + (size_t)((b * S + jp + jj) * K * H) * es;
      const char *vp = (const char *)a->v + (size_t)((b * S + jp + jj) * K * Hv) * es;
      for (size_t x = 0; x < (size_t)(K * H) * es; x += 64) __builtin_prefetch(kp + x, 0, 2);
      for (size_t x = 0; x < (size_t)(K * Hv) * es; x += 64) __builtin_prefetch(vp + x, 0, 2);
    }
    for (int64_t kh = 0; kh < K; kh++) {
      for (int64_t jj = 0; jj < SA_DEC_TILE; jj++) {
        if (jj < nj) {
          sa_dec_row_load(a->k, a->dtype, ((b * S + j0 + jj) * K + kh) * H, H, row);
          sa_dec_row_load(a->v, a->dtype, ((b * S + j0 + jj) * K + kh) * Hv, Hv, vf + jj * Hv);
        } else {
          memset(row, 0, (size_t)H * sizeof(float));
          memset(vf + jj * Hv, 0, (size_t)Hv * sizeof(float));
        }
        for (int64_t d = 0; d < H; d++) kt[d * SA_DEC_TILE + jj] = row[d];
      }
      for (int64_t r = 0; r < R; r++) {
        const int64_t lo = it->rng[2 * r], hi = it->rng[2 * r + 1], x = kh * it->mstride + r;
        if (hi <= j0 || lo >= j0 + nj) continue;
        float s[SA_DEC_TILE], e[SA_DEC_TILE];
        const float *q = qs + (kh * R + r) * H;
        for (int jj = 0; jj < SA_DEC_TILE; jj++) s[jj] = 0.0f;
        for (int64_t d = 0; d < H; d++)
          for (int jj = 0; jj < SA_DEC_TILE; jj++) s[jj] += q[d] * kt[d * SA_DEC_TILE + jj];
        float mt = -INFINITY;
        for (int jj = 0; jj < SA_DEC_TILE; jj++) {
          int64_t j = j0 + jj;
          s[jj] = (j >= lo && j < hi) ? s[jj] : -INFINITY;
          mt = s[jj] > mt ? s[jj] : mt;
        }
        float mold = it->m[x], mnew = mt > mold ? mt : mold; /* finite: the tile holds a valid key of this row */
        float corr = sa_dec_exp2(mold - mnew);               /* 0 on the first tile (m = -inf) */
        float sum = 0.0f;
        for (int jj = 0; jj < SA_DEC_TILE; jj++) e[jj] = sa_dec_exp2(s[jj] - mnew);
        for (int jj = 0; jj < SA_DEC_TILE; jj++) sum += e[jj];
        it->m[x] = mnew;
        it->l[x] = it->l[x] * corr + sum;
        float *o = it->acc + (kh * R + r) * it->astride;
        if (corr != 1.0f)
          for (int64_t d = 0; d < Hv; d++) o[d] *= corr;
        for (int jj = 0; jj < nj; jj++) {
          const float w = e[jj], *vr = vf + jj * Hv;
          for (int64_t d = 0; d < Hv; d++) o[d] += w * vr[d];
        }
      }
    }
  }
}
