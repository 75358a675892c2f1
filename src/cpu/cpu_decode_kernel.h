/*
 * cpu_decode_kernel.h — body of one split-KV decode work item, included by cpu_decode.c (portable build)
 * and cpu_decode_avx512.c (compiled with -mavx512f/bw/vl/dq -mfma -mf16c), which set SA_DECODE_PARTIAL to
 * the function's name. Scores are base-2 logits so exp is exp2.
 *
 * Portable build: plain loops over 16 keys or over a head dim; K is converted and transposed (Kt [H][16])
 * once per tile and reused by all R rows (the GQA packing: each cache byte is read once per work item).
 * AVX-512 build, per tile of 32 keys and kv head: K^T by in-register 16 x 16 transposes (fp32, or bf16
 * pairs for vdpbf16ps dot products on CPUs with AVX512-BF16), then the rows in register blocks of 8: one
 * K^T load feeds 8 rows' FMAs, one V load (converted from the cache in place) feeds 8 rows' P.V FMAs with
 * the 8 x 16 accumulators in registers; two-level software prefetch. Measured in bench/NOTES.md (gpt-oss
 * shape: 1.8 -> 12-13 GB/s on 2 Zen 4 cores).
 */
#include <stdlib.h>

#include "cpu_decode.h"

/* Software prefetch, two levels (measured on the 2-core Zen 4 VM, gpt-oss shape, B 8, S 32k, DRAM-resident):
   - the next tile of keys, all kv heads, into L2 (locality 2), spread over the kv-head loop: one tile of
     all heads is 64 KiB here (32 keys x K 8 x (H + Hv) 128 x bf16), twice the L1D, and L1 prefetches of a
     whole tile evicted lines before use (3.7 -> 7.3 GB/s, 2 threads, moving to L2); 1 tile ahead beat 2
     and 4 (5.7 vs 5.5 vs 5.2 GB/s, 1 thread);
   - the rows of the kv head 2 steps ahead in the current tile (8 KiB) into L1 (locality 3): 1 thread
     5.9 (none) -> 6.0-6.3 (next head) -> 6.6-6.9 (2 ahead; 3 ahead the same; wrapping into the next
     tile's first heads 6.0), 2 threads 11.7 -> 13.2 GB/s (L3-resident: 10.1-10.5 per thread).
   Written inline in the loop: the same prefetches in two small helper functions ran at 4.3 GB/s (gcc
   12 kept them out of line) and at 6.3 forced inline, against 6.8 for the loops below. */
#define SA_DEC_PREFETCH_TILES 1
#define SA_DEC_L1_HEADS_AHEAD 2

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

#if defined(__AVX512F__)
/* sa_dec_exp2 on 16 lanes (same clamp and polynomial; NaN stays NaN: max_ps returns its second operand
   when one is NaN). */
static inline __m512 sa_dec_exp2_v(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-127.0f), x);
  __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.5403530393381608e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402265069591007e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471805599453e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

/* n (<= 16) elements of a cache row at element off as fp32 lanes, zeros past n. */
static inline __m512 sa_dec_load16(const void *src, sa_dtype t, int64_t off, int64_t n) {
  const __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
  if (t == SA_F32) return _mm512_maskz_loadu_ps(m, (const float *)src + off);
  __m256i x = _mm256_maskz_loadu_epi16(m, (const uint16_t *)src + off);
  return t == SA_BF16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16)) : _mm512_cvtph_ps(x);
}

/* In-register 16x16 transpose: r[i] lane d becomes out[d * ld + i]. Four rounds of 16 shuffles (128-bit
   unpacks of floats, of float pairs, then two rounds of 128-bit lane shuffles) instead of 256 scalar
   stores: the scalar transpose was the largest cost of the first AVX-512 kernel (bench/NOTES.md). */
static inline void sa_dec_transpose16(__m512 r[16], float *out, int64_t ld) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; i++) {  /* lane L of t[2i]: r[2i][4L], r[2i+1][4L], r[2i][4L+1], r[2i+1][4L+1] */
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; g++)    /* u[4g + c], 128-bit lane L: column 4L + c of rows 4g .. 4g + 3 */
    for (int h = 0; h < 2; h++) {
      __m512d a = _mm512_castps_pd(t[4 * g + h]), b = _mm512_castps_pd(t[4 * g + 2 + h]);
      u[4 * g + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
      u[4 * g + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
    }
  for (int c = 0; c < 4; c++) {  /* gather lane L of u[c], u[4 + c], u[8 + c], u[12 + c] */
    __m512 a = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), b = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xdd);
    __m512 x = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88), y = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xdd);
    _mm512_storeu_ps(out + (0 + c) * ld, _mm512_shuffle_f32x4(a, x, 0x88));
    _mm512_storeu_ps(out + (8 + c) * ld, _mm512_shuffle_f32x4(a, x, 0xdd));
    _mm512_storeu_ps(out + (4 + c) * ld, _mm512_shuffle_f32x4(b, y, 0x88));
    _mm512_storeu_ps(out + (12 + c) * ld, _mm512_shuffle_f32x4(b, y, 0xdd));
  }
}

/* Where a tile's V rows are: element off of the cache is key j0's row, stride elements between keys. */
typedef struct { const void *p; sa_dtype dt; int64_t off, stride; } sa_dec_vsrc;

/* Masks of the tile's 32 keys inside each row's range [lo, hi) for the tile at j0; 0 when no row sees one. */
static inline __attribute__((always_inline)) uint32_t sa_dec_masks(const int NR, int64_t j0, const int64_t *rng,
                                                                   uint32_t *km) {
  uint32_t any = 0;
  for (int i = 0; i < NR; i++) {
    int64_t lo = rng[2 * i] - j0, hi = rng[2 * i + 1] - j0;
    lo = lo < 0 ? 0 : lo > 32 ? 32 : lo;
    hi = hi < 0 ? 0 : hi > 32 ? 32 : hi;
    km[i] = (uint32_t)(((1ull << hi) - 1ull) & ~((1ull << lo) - 1ull));
    any |= km[i];
  }
  return any;
}

/* Online softmax and P.V for rows 0 .. NR - 1 (NR a constant after inlining: 8, 4, 2 or 1, so s[] and the
   accumulators stay in registers) given their base-2 scores s (two registers: keys 0-15, 16-31) against
   the tile's nj <= 32 keys. 32-key tiles amortise each row's max / sum reductions and scalar bookkeeping
   over twice the keys of a 16-key tile (L3-resident 9.6 -> 11.7 GB/s per core). P.V converts
   each V vector straight from the cache once for NR rows (no fp32 copy of the tile: that pass, reloading
   its pointers each row, was ~20% of the L3-resident time), the NR accumulators of 16 columns kept in
   registers across the tile's keys. */
static inline __attribute__((always_inline)) void sa_dec_softmax_pv(
    const int NR, int64_t Hv, int64_t nj, const __m512 (*s)[2], const uint32_t *km, float *acc, float *m,
    float *l, sa_dec_vsrc vs) {
  float e[8][32] __attribute__((aligned(64)));
  for (int i = 0; i < NR; i++) {
    if (!km[i]) {
      _mm512_store_ps(e[i], _mm512_setzero_ps());
      _mm512_store_ps(e[i] + 16, _mm512_setzero_ps());
      continue;
    }
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512 s0 = _mm512_mask_blend_ps((__mmask16)km[i], ninf, s[i][0]);
    const __m512 s1 = _mm512_mask_blend_ps((__mmask16)(km[i] >> 16), ninf, s[i][1]);
    const float mt = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
    const float mnew = mt > m[i] ? mt : m[i];   /* finite: the tile holds a valid key of this row */
    const float corr = sa_dec_exp2(m[i] - mnew); /* 0 on the row's first tile (m = -inf) */
    const __m512 e0 = sa_dec_exp2_v(_mm512_sub_ps(s0, _mm512_set1_ps(mnew)));
    const __m512 e1 = sa_dec_exp2_v(_mm512_sub_ps(s1, _mm512_set1_ps(mnew)));
    l[i] = l[i] * corr + _mm512_reduce_add_ps(_mm512_add_ps(e0, e1));
    m[i] = mnew;
    _mm512_store_ps(e[i], e0);
    _mm512_store_ps(e[i] + 16, e1);
    if (corr != 1.0f) {
      float *o = acc + i * Hv;
      for (int64_t d0 = 0; d0 < Hv; d0 += 16) {
        const __mmask16 md = Hv - d0 >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (Hv - d0)) - 1u);
        _mm512_mask_storeu_ps(o + d0, md, _mm512_mul_ps(_mm512_maskz_loadu_ps(md, o + d0), _mm512_set1_ps(corr)));
      }
    }
  }
  for (int64_t d0 = 0; d0 < Hv; d0 += 16) {
    const __mmask16 md = Hv - d0 >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (Hv - d0)) - 1u);
    __m512 o[8];
    for (int i = 0; i < NR; i++) o[i] = _mm512_maskz_loadu_ps(md, acc + i * Hv + d0);
#define SA_DEC_PV_KEYS(LOADV)                                                                \
  for (int64_t jj = 0; jj < nj; jj++) {                                                      \
    const __m512 v = (LOADV);                                                                \
    for (int i = 0; i < NR; i++) o[i] = _mm512_fmadd_ps(_mm512_set1_ps(e[i][jj]), v, o[i]); \
  }
    if (vs.dt == SA_BF16) {
      const uint16_t *vp = (const uint16_t *)vs.p + vs.off + d0;
      SA_DEC_PV_KEYS(_mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(md, vp + jj * vs.stride)), 16)));
    } else if (vs.dt == SA_F16) {
      const uint16_t *vp = (const uint16_t *)vs.p + vs.off + d0;
      SA_DEC_PV_KEYS(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(md, vp + jj * vs.stride)));
    } else {
      const float *vp = (const float *)vs.p + vs.off + d0;
      SA_DEC_PV_KEYS(_mm512_maskz_loadu_ps(md, vp + jj * vs.stride));
    }
#undef SA_DEC_PV_KEYS
    for (int i = 0; i < NR; i++) _mm512_mask_storeu_ps(acc + i * Hv + d0, md, o[i]);
  }
}

/* fp32 scores: kt [Hpad][32] holds K^T, qs the rows pre-scaled into base 2; each q broadcast feeds two
   FMAs, each kt load NR. */
static inline __attribute__((always_inline)) void sa_dec_rows_f32(
    const int NR, int64_t H, int64_t Hv, int64_t j0, int64_t nj, const float *qs, float *acc, float *m, float *l,
    const int64_t *rng, const float *kt, sa_dec_vsrc vs) {
  __m512 s[8][2];
  uint32_t km[8];
  if (!sa_dec_masks(NR, j0, rng, km)) return;
  for (int i = 0; i < NR; i++) s[i][0] = s[i][1] = _mm512_setzero_ps();
  for (int64_t d = 0; d < H; d++) {
    const __m512 k0 = _mm512_loadu_ps(kt + d * 32), k1 = _mm512_loadu_ps(kt + d * 32 + 16);
    for (int i = 0; i < NR; i++) {
      const __m512 q = _mm512_set1_ps(qs[i * H + d]);
      s[i][0] = _mm512_fmadd_ps(q, k0, s[i][0]);
      s[i][1] = _mm512_fmadd_ps(q, k1, s[i][1]);
    }
  }
  sa_dec_softmax_pv(NR, Hv, nj, s, km, acc, m, l, vs);
}

/* bf16 scores with AVX512-BF16 dot products (vdpbf16ps: two exact bf16 products per lane into fp32): kt
   [H2][32] holds K^T as bf16 pairs (dim 2d, 2d + 1) per key, qs each row's raw bf16 pairs (H2 of the row's
   H floats; the scale is applied to the sums). Half the FMAs and half the transposes of the fp32 path, no K conversion. */
#define SA_DEC_BF16_TARGET __attribute__((target("avx512bf16")))
static inline __attribute__((always_inline)) SA_DEC_BF16_TARGET void sa_dec_rows_bf16(
    const int NR, int64_t H, int64_t H2, int64_t Hv, int64_t j0, int64_t nj, float qscale, const float *qs,
    float *acc, float *m, float *l, const int64_t *rng, const float *kt, sa_dec_vsrc vs) {
  __m512 s[8][2];
  uint32_t km[8];
  if (!sa_dec_masks(NR, j0, rng, km)) return;
  for (int i = 0; i < NR; i++) s[i][0] = s[i][1] = _mm512_setzero_ps();
  for (int64_t d = 0; d < H2; d++) {
    const __m512bh k0 = (__m512bh)_mm512_loadu_ps(kt + d * 32), k1 = (__m512bh)_mm512_loadu_ps(kt + d * 32 + 16);
    for (int i = 0; i < NR; i++) {
      int32_t w;  /* a bf16 pair stored in the float buffer: memcpy keeps the read well-typed */
      memcpy(&w, qs + i * H + d, 4);
      const __m512bh q = (__m512bh)_mm512_set1_epi32(w);
      s[i][0] = _mm512_dpbf16_ps(s[i][0], q, k0);
      s[i][1] = _mm512_dpbf16_ps(s[i][1], q, k1);
    }
  }
  for (int i = 0; i < NR; i++) {
    s[i][0] = _mm512_mul_ps(s[i][0], _mm512_set1_ps(qscale));
    s[i][1] = _mm512_mul_ps(s[i][1], _mm512_set1_ps(qscale));
  }
  sa_dec_softmax_pv(NR, Hv, nj, s, km, acc, m, l, vs);
}

/* Rows in blocks of 8, then 4, 2, 1 (the block size a compile-time constant in each call). */
#define SA_DEC_ROW_BLOCKS(CALL)                                           \
  do {                                                                    \
    int64_t x = 0;                                                        \
    for (; x + 8 <= R; x += 8) CALL(8);                                   \
    if (x + 4 <= R) { CALL(4); x += 4; }                                  \
    if (x + 2 <= R) { CALL(2); x += 2; }                                  \
    if (x < R) CALL(1);                                                   \
  } while (0)

/* One tile of 32 keys (nj valid) of kv head kh for all R rows (fp32 scores, any dtype): K^T by register
   transposes of 16 x 16 fp32 blocks. qs, acc, m, l point at kv head kh's rows. */
static void sa_dec_tile_f32(const sa_attn *a, int64_t R, int64_t b, int64_t kh, int64_t j0, int64_t nj,
                            const float *qs, float *acc, float *m, float *l, const int64_t *rng, float *kt) {
  const int64_t H = a->head_dim, Hv = a->v_head_dim, K = a->kv_heads;
  const int64_t row0 = (b * a->kv_len + j0) * K + kh;  /* cache row of key j0, kv head kh */
  for (int64_t d0 = 0; d0 < H; d0 += 16)
    for (int h = 0; h < 2; h++) {  /* keys 16h .. 16h + 15 */
      __m512 r[16];
      for (int jj = 0; jj < 16; jj++)
        r[jj] = 16 * h + jj < nj ? sa_dec_load16(a->k, a->dtype, (row0 + (16 * h + jj) * K) * H + d0, H - d0)
                                 : _mm512_setzero_ps();
      sa_dec_transpose16(r, kt + d0 * 32 + 16 * h, 32);
    }
  const sa_dec_vsrc vs = {a->v, a->dtype, row0 * Hv, K * Hv};
#define SA_DEC_CALL_F32(NR) \
  sa_dec_rows_f32(NR, H, Hv, j0, nj, qs + x * H, acc + x * Hv, m + x, l + x, rng + 2 * x, kt, vs)
  SA_DEC_ROW_BLOCKS(SA_DEC_CALL_F32);
#undef SA_DEC_CALL_F32
}

/* The same for bf16 caches on CPUs with AVX512-BF16: K^T as bf16 pairs, 16 x 16 dword transposes. */
static SA_DEC_BF16_TARGET void sa_dec_tile_bf16(const sa_attn *a, float qscale, int64_t R, int64_t b, int64_t kh,
                                                int64_t j0, int64_t nj, const float *qs, float *acc, float *m,
                                                float *l, const int64_t *rng, float *kt) {
  const int64_t H = a->head_dim, H2 = (H + 1) / 2, Hv = a->v_head_dim;
  const int64_t K = a->kv_heads, row0 = (b * a->kv_len + j0) * K + kh;
  const uint16_t *k = (const uint16_t *)a->k;
  for (int64_t d0 = 0; d0 < H; d0 += 32) {  /* 32 bf16 = 16 dword pairs per row */
    const int64_t n = H - d0 < 32 ? H - d0 : 32;
    const __mmask32 mk = n >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << n) - 1u);
    for (int h = 0; h < 2; h++) {  /* keys 16h .. 16h + 15 */
      __m512 r[16];
      for (int jj = 0; jj < 16; jj++)
        r[jj] = 16 * h + jj < nj
                    ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(mk, k + (row0 + (16 * h + jj) * K) * H + d0))
                    : _mm512_setzero_ps();
      sa_dec_transpose16(r, kt + d0 / 2 * 32 + 16 * h, 32);
    }
  }
  const sa_dec_vsrc vs = {a->v, a->dtype, row0 * Hv, K * Hv};
#define SA_DEC_CALL_BF16(NR)                                                                         \
  sa_dec_rows_bf16(NR, H, H2, Hv, j0, nj, qscale, qs + x * H, acc + x * Hv, m + x, l + x, rng + 2 * x, \
                   kt, vs)
  SA_DEC_ROW_BLOCKS(SA_DEC_CALL_BF16);
#undef SA_DEC_CALL_BF16
}
#endif

void SA_DECODE_PARTIAL(const sa_decode_plan *p, int64_t b, int64_t c, float *scratch, float *part_out,
                       float *part_lse) {
#if defined(__AVX512F__)
  enum { TJ = SA_DECODE_TILE_WIDE };
#else
  enum { TJ = SA_DECODE_TILE };
#endif
  const sa_attn *a = p->a;
  const int64_t H = a->head_dim, Hv = a->v_head_dim, G = p->group, R = p->rows, N = a->q_heads,
                K = a->kv_heads, T = a->q_len, S = a->kv_len;
  const int64_t ql = sa_q_len_of(a, b), kl = sa_kv_len_of(a, b);
  const int64_t c0 = c * p->chunk, c1 = c0 + p->chunk < kl ? c0 + p->chunk : kl;

  /* scratch layout (sa_cpu_decode_scratch_floats): per kv head Qs [K][R][H], acc [K][R][Hv], m, l [K][R];
     shared Kt [Hpad][32], Vf [16][Hvpad] (portable kernel only), row [max(H, Hv)], and the per-row key
     ranges as int64 [2R] */
  float *qs = scratch, *acc = qs + K * R * H, *m = acc + K * R * Hv, *l = m + K * R, *kt = l + K * R;
  float *vf = kt + ((H + 15) & ~(int64_t)15) * SA_DECODE_TILE_WIDE;
  float *row = vf + SA_DECODE_TILE * ((Hv + 15) & ~(int64_t)15);
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
        if (p->bf16_dot) {  /* raw bf16 pairs, zero-padded to whole pairs; scaled after the dot */
          memset(qr, 0, (size_t)H * sizeof(float));
          memcpy(qr, (const uint16_t *)a->q + ((b * T + t) * N + n) * H, (size_t)H * 2);
          continue;
        }
        sa_dec_row_load(a->q, a->dtype, ((b * T + t) * N + n) * H, H, qr);
        for (int64_t d = 0; d < H; d++) qr[d] *= p->qscale;
      }
  }

  /* pass 2: online softmax over tiles of TJ keys (running max m, sum l, unnormalised acc). All kv heads
     of a tile are done together so the cache is read front to back: one head's rows alone are K * H
     elements apart (1 KiB at gpt-oss bf16), a stride that ran at 0.3 GB/s on the 2-core Zen 4 VM. */
  const size_t es = sa_dtype_size(a->dtype);
  for (int64_t j0 = jlo; j0 < jhi; j0 += TJ) {
    const int64_t nj = jhi - j0 < TJ ? jhi - j0 : TJ;
    const int64_t jp = j0 + SA_DEC_PREFETCH_TILES * TJ, np = jhi - jp < TJ ? jhi - jp : TJ;
#if defined(__AVX512F__)
    for (int64_t kh = 0; kh < K; kh++) {
      for (int64_t jj = kh * np / K; jj < (kh + 1) * np / K; jj++) {  /* next tile, all heads: L2 */
        const char *kp = (const char *)a->k + (size_t)((b * S + jp + jj) * K * H) * es;
        const char *vp = (const char *)a->v + (size_t)((b * S + jp + jj) * K * Hv) * es;
        for (size_t x = 0; x < (size_t)(K * H) * es; x += 64) __builtin_prefetch(kp + x, 0, 2);
        for (size_t x = 0; x < (size_t)(K * Hv) * es; x += 64) __builtin_prefetch(vp + x, 0, 2);
      }
      if (kh + SA_DEC_L1_HEADS_AHEAD < K)  /* this tile, a later head: L1 */
        for (int64_t jj = 0; jj < nj; jj++) {
          const int64_t crow = (b * S + j0 + jj) * K + kh + SA_DEC_L1_HEADS_AHEAD;  /* cache row */
          const char *kp = (const char *)a->k + (size_t)(crow * H) * es;
          const char *vp = (const char *)a->v + (size_t)(crow * Hv) * es;
          for (size_t x = 0; x < (size_t)H * es; x += 64) __builtin_prefetch(kp + x, 0, 3);
          for (size_t x = 0; x < (size_t)Hv * es; x += 64) __builtin_prefetch(vp + x, 0, 3);
        }
      float *qk = qs + kh * R * H, *ak = acc + kh * R * Hv, *mk = m + kh * R, *lk = l + kh * R;
      if (p->bf16_dot)
        sa_dec_tile_bf16(a, p->qscale, R, b, kh, j0, nj, qk, ak, mk, lk, rng, kt);
      else
        sa_dec_tile_f32(a, R, b, kh, j0, nj, qk, ak, mk, lk, rng, kt);
    }
#else
    for (int64_t jj = 0; jj < np; jj++) {
      const char *kp = (const char *)a->k + (size_t)((b * S + jp + jj) * K * H) * es;
      const char *vp = (const char *)a->v + (size_t)((b * S + jp + jj) * K * Hv) * es;
      for (size_t x = 0; x < (size_t)(K * H) * es; x += 64) __builtin_prefetch(kp + x, 0, 2);
      for (size_t x = 0; x < (size_t)(K * Hv) * es; x += 64) __builtin_prefetch(vp + x, 0, 2);
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
        for (int jj = 0; jj < TJ; jj++) s[jj] = 0.0f;
        for (int64_t d = 0; d < H; d++)
          for (int jj = 0; jj < TJ; jj++) s[jj] = SA_DEC_FMA(q[d], kt[d * TJ + jj], s[jj]);
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
        for (int jj = 0; jj < nj; jj++) {
          const float w = e[jj], *vr = vf + jj * Hv;
          for (int64_t d = 0; d < Hv; d++) o[d] = SA_DEC_FMA(w, vr[d], o[d]);
        }
      }
    }
#endif
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
