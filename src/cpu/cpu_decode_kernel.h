/*
 * cpu_decode_kernel.h — body of one split-KV decode work item, included by cpu_decode.c (portable build)
 * and cpu_decode_avx512.c (compiled with -mavx512f/bw/vl/dq -mfma -mf16c), which set SA_DECODE_PARTIAL to
 * the function's name. Written as plain loops over 16 keys or over a head dim so the compiler vectorises
 * them; the AVX-512 build spells out three hot loops with intrinsics (row conversion, Q.K^T over a tile, P.V
 * with the accumulator kept in registers) because gcc 12 left the first two scalar (0.2 GB/s).
 *
 * Per tile of 16 keys: K is converted to fp32 and transposed (Kt [H][16]) once, then reused by all R rows
 * (the GQA packing: each cache byte is read once per work item); scores are base-2 logits so exp is exp2.
 */
#include <stdlib.h>

#include "cpu_decode.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__FMA__)
#define SA_DEC_FMA(x, y, z) fmaf((x), (y), (z))
#else
#define SA_DEC_FMA(x, y, z) ((x) * (y) + (z))
#endif

/* 2^x for x <= 0 (x = -inf allowed): x = n + f with f in [-0.5, 0.5], 2^f by its degree-6 Taylor
   polynomial (relative error < 2e-7 there), 2^n written into the exponent. x < -126.5 gives exactly 0,
   which is what a masked score needs. Branch-free so a loop over it vectorises. */
static inline float sa_dec_exp2(float x) {
  x = x < -127.0f ? -127.0f : x;
  float n = floorf(x + 0.5f), f = x - n;
  float p = 1.5403530393381608e-4f;
  p = SA_DEC_FMA(p, f, 1.3333558146428443e-3f);
  p = SA_DEC_FMA(p, f, 9.618129107628477e-3f);
  p = SA_DEC_FMA(p, f, 5.550410866482158e-2f);
  p = SA_DEC_FMA(p, f, 2.402265069591007e-1f);
  p = SA_DEC_FMA(p, f, 6.931471805599453e-1f);
  p = SA_DEC_FMA(p, f, 1.0f);
  uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
  float s;
  memcpy(&s, &bits, 4);
  return p * s;
}

/* dst[0..n) = fp32 of the n contiguous elements of src starting at element off. */
static inline void sa_dec_row_load(const void *src, sa_dtype t, int64_t off, int64_t n, float *dst) {
  int64_t i = 0;
  if (t == SA_F32) {
    memcpy(dst, (const float *)src + off, (size_t)n * 4);
    return;
  }
  const uint16_t *h = (const uint16_t *)src + off;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    __m256i x = _mm256_loadu_si256((const __m256i *)(h + i));
    __m512 f = t == SA_BF16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16))
                            : _mm512_cvtph_ps(x);
    _mm512_storeu_ps(dst + i, f);
  }
#endif
  for (; i < n; i++) dst[i] = t == SA_BF16 ? sa_bf16_to_f32(h[i]) : sa_f16_to_f32(h[i]);
}

void SA_DECODE_PARTIAL(const sa_decode_plan *p, int64_t b, int64_t c, float *scratch, float *part_out,
                       float *part_lse) {
  enum { TJ = SA_DECODE_TILE };
  const sa_attn *a = p->a;
  const int64_t H = a->head_dim, Hv = a->v_head_dim, G = p->group, R = p->rows, N = a->q_heads,
                K = a->kv_heads, T = a->q_len, S = a->kv_len;
  const int64_t ql = sa_q_len_of(a, b), kl = sa_kv_len_of(a, b);
  const int64_t c0 = c * p->chunk, c1 = c0 + p->chunk < kl ? c0 + p->chunk : kl;

  /* scratch layout (sa_cpu_decode_scratch_floats): per kv head Qs [K][R][H], acc [K][R][Hv], m, l [K][R];
     shared Kt [H][TJ], Vf [TJ][Hv], row [max(H, Hv)], and the per-row key ranges as int64 [2R] */
  float *qs = scratch, *acc = qs + K * R * H, *m = acc + K * R * Hv, *l = m + K * R, *kt = l + K * R;
  float *vf = kt + H * TJ, *row = vf + TJ * Hv;
  /* Rounded up to 8 bytes: the float count before it may be odd (UBSan: misaligned int64 store). The
     rounding adds at most one float, which the scratch size reserves. */
  uintptr_t rng_at = ((uintptr_t)(row + (H > Hv ? H : Hv)) + 7) & ~(uintptr_t)7;
  int64_t *rng = (int64_t *)(void *)rng_at;

  /* pass 1: which keys of this chunk each row may see (lengths, causal, window via sa_key_range); the
     mask depends on the token t = r / G only, so every kv head shares it */
  int64_t jlo = c1, jhi = c0;
  for (int64_t r = 0; r < R; r++) {
    sa_range kr = sa_key_range(a, ql, kl, r / G);
    int64_t lo = kr.lo > c0 ? kr.lo : c0, hi = kr.hi < c1 ? kr.hi : c1;
    if (lo >= hi) lo = hi = 0;
    rng[2 * r] = lo;
    rng[2 * r + 1] = hi;
    if (lo < hi) {
      if (lo < jlo) jlo = lo;
      if (hi > jhi) jhi = hi;
    }
  }
  for (int64_t x = 0; x < K * R; x++) {
    m[x] = -INFINITY;
    l[x] = 0.0f;
  }
  memset(acc, 0, (size_t)(K * R * Hv) * sizeof(float));
  if (jlo < jhi) {
    for (int64_t kh = 0; kh < K; kh++)
      for (int64_t r = 0; r < R; r++) {  /* q rows of kv head kh, pre-scaled into base 2 */
        int64_t t = r / G, n = kh * G + r % G;
        float *qr = qs + (kh * R + r) * H;
        sa_dec_row_load(a->q, a->dtype, ((b * T + t) * N + n) * H, H, qr);
        for (int64_t d = 0; d < H; d++) qr[d] *= p->qscale;
      }
  }

  /* pass 2: online softmax over tiles of 16 keys (running max m, sum l, unnormalised acc). All kv heads
     of a tile are done together so the cache is read front to back: one head's rows alone are K * H
     elements apart (1 KiB at gpt-oss bf16), a stride that ran at 0.3 GB/s on the 2-core Zen 4 VM. */
  const size_t es = sa_dtype_size(a->dtype);
  for (int64_t j0 = jlo; j0 < jhi; j0 += TJ) {
    const int64_t nj = jhi - j0 < TJ ? jhi - j0 : TJ;
    const int64_t jp = j0 + 2 * TJ, np = jhi - jp < TJ ? jhi - jp : TJ;
    for (int64_t jj = 0; jj < np; jj++) {  /* two tiles ahead: K * (H + Hv) contiguous elements per key */
      const char *kp = (const char *)a->k + (size_t)((b * S + jp + jj) * K * H) * es;
      const char *vp = (const char *)a->v + (size_t)((b * S + jp + jj) * K * Hv) * es;
      for (size_t x = 0; x < (size_t)(K * H) * es; x += 64) __builtin_prefetch(kp + x);
      for (size_t x = 0; x < (size_t)(K * Hv) * es; x += 64) __builtin_prefetch(vp + x);
    }
    for (int64_t kh = 0; kh < K; kh++) {
      for (int64_t jj = 0; jj < TJ; jj++) {
        if (jj < nj) {
          sa_dec_row_load(a->k, a->dtype, ((b * S + j0 + jj) * K + kh) * H, H, row);
          sa_dec_row_load(a->v, a->dtype, ((b * S + j0 + jj) * K + kh) * Hv, Hv, vf + jj * Hv);
        } else {
          memset(row, 0, (size_t)H * sizeof(float));
          memset(vf + jj * Hv, 0, (size_t)Hv * sizeof(float));
        }
        for (int64_t d = 0; d < H; d++) kt[d * TJ + jj] = row[d];
      }
      for (int64_t r = 0; r < R; r++) {
        const int64_t lo = rng[2 * r], hi = rng[2 * r + 1], x = kh * R + r;
        if (hi <= j0 || lo >= j0 + nj) continue;
        float s[TJ], e[TJ];
        const float *q = qs + x * H;
#if defined(__AVX512F__)
        /* gcc keeps s[16] in 16 scalar registers here instead of one vector: spell the vector out */
        __m512 sv = _mm512_setzero_ps();
        for (int64_t d = 0; d < H; d++) sv = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), _mm512_loadu_ps(kt + d * TJ), sv);
        _mm512_storeu_ps(s, sv);
#else
        for (int jj = 0; jj < TJ; jj++) s[jj] = 0.0f;
        for (int64_t d = 0; d < H; d++)
          for (int jj = 0; jj < TJ; jj++) s[jj] = SA_DEC_FMA(q[d], kt[d * TJ + jj], s[jj]);
#endif
        float mt = -INFINITY;
        for (int jj = 0; jj < TJ; jj++) {
          int64_t j = j0 + jj;
          s[jj] = (j >= lo && j < hi) ? s[jj] : -INFINITY;
          mt = s[jj] > mt ? s[jj] : mt;
        }
        float mnew = mt > m[x] ? mt : m[x];      /* finite: the tile holds a valid key of this row */
        float corr = sa_dec_exp2(m[x] - mnew);   /* 0 on the first tile (m = -inf) */
        float sum = 0.0f;
        for (int jj = 0; jj < TJ; jj++) e[jj] = sa_dec_exp2(s[jj] - mnew);
        for (int jj = 0; jj < TJ; jj++) sum += e[jj];
        m[x] = mnew;
        l[x] = l[x] * corr + sum;
        float *o = acc + x * Hv;
        if (corr != 1.0f)
          for (int64_t d = 0; d < Hv; d++) o[d] *= corr;
        int64_t d0 = 0;
#if defined(__AVX512F__)
        /* 16 columns of the accumulator stay in a register across the tile's keys */
        for (; d0 + 16 <= Hv; d0 += 16) {
          __m512 ov = _mm512_loadu_ps(o + d0);
          for (int jj = 0; jj < nj; jj++)
            ov = _mm512_fmadd_ps(_mm512_set1_ps(e[jj]), _mm512_loadu_ps(vf + jj * Hv + d0), ov);
          _mm512_storeu_ps(o + d0, ov);
        }
#endif
        for (int jj = 0; jj < nj; jj++) {
          const float w = e[jj], *vr = vf + jj * Hv;
          for (int64_t d = d0; d < Hv; d++) o[d] = SA_DEC_FMA(w, vr[d], o[d]);
        }
      }
    }
  }

  /* pass 3: the vanilla partials, slot (b, kh, c) (the sink is added once, in the combine) */
  for (int64_t kh = 0; kh < K; kh++) {
    const int64_t slot = (b * K + kh) * p->splits + c;
    for (int64_t r = 0; r < R; r++) {
      const int64_t x = kh * R + r;
      float *o = part_out + (slot * R + r) * Hv;
      if (l[x] > 0.0f) {
        float inv = 1.0f / l[x];
        for (int64_t d = 0; d < Hv; d++) o[d] = acc[x * Hv + d] * inv;
        part_lse[slot * R + r] = (m[x] + log2f(l[x])) * 0.69314718055994531f;
      } else {
        memset(o, 0, (size_t)Hv * sizeof(float));
        part_lse[slot * R + r] = -INFINITY;
      }
    }
  }
}
