/*
 * cpu_tile_pack.h — the operands of the tile products (cpu_tile.h) put into the layouts that TILELOADD
 * reads, with AVX-512 (BW, VL) and AVX512-BF16: the translation units that include it are compiled with
 * -mavx512bf16 (CMakeLists.txt) and their plans run only where CPUID reports AVX512-BF16 (cpu_plan.c).
 *
 * fp32 is rounded to bf16 by VCVTNE2PS2BF16: nearest even, NaN quieted (as sa_f32_to_bf16), and fp32
 * denormal inputs read as zero, where sa_f32_to_bf16 rounds them to bf16 denormals (or, from 0x007f8000 up,
 * to the smallest normal). TDPBF16PS reads bf16 denormals as zero anyway, so the only values that differ
 * are the fp32 denormals of [0x007f8000, 0x00800000) (and their negatives): 0 instead of 2^-126.
 *
 * Rows of bf16 inputs (K, V, q, dout) are kept in the body's fp32 row buffers at the same row starts, two
 * bf16 per float slot (tile_load_row): a row r of a buffer with rows ar floats apart starts at uint16
 * element 2 r ar, and holds zeros from its length to the next multiple of 32, so that it is a ready A tile
 * row (k steps of 32) or B row. Each of these operands is converted once, not rounded twice.
 *
 * Why vectors: a forward key tile at N8 H128 (256 query rows, 64 keys) packs P as A in 0.9 us this way and
 * in 14.5 us element by element in scalar C (0.056 vs 0.89 ns per element on a Zen 4 core),
 * where its two products take about 3.6 us on the tiles at the AMX peak; docs/cpu.md has the others.
 */
#ifndef SA_CPU_TILE_PACK_H
#define SA_CPU_TILE_PACK_H

#include <immintrin.h>
#include <stdint.h>

#define SA_TILE_K   32                      /* bf16 per A tile row: one TDPBF16PS k step */
#define SA_TILE_N   16                      /* fp32 columns per C tile */
#define SA_TILE_M   16                      /* rows per tile */
#define SA_TILE_BLK (SA_TILE_K * SA_TILE_N) /* bf16 of one VNNI B block: 1 KiB, one tile load */

static inline int64_t tile_round(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Lanes [0, n) of a 16-lane mask, n clamped to [0, 16]. */
static inline __mmask16 tile_lanes(int64_t n) {
  return n <= 0 ? (__mmask16)0 : n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}

/* 16 dwords whose dword x is (lo[x], hi[x]) in bf16, lo in the low half: the VNNI pair of two rows. */
static inline __m512i tile_pair_f32(__m512 lo, __m512 hi) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

/* r[j] becomes column j of the 16 x 16 dword matrix whose row i is r[i]: 32-bit and 64-bit unpacks within
   128-bit lanes give 4 x 4 blocks, two rounds of lane shuffles move the blocks (64 shuffles). */
static inline void tile_transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) { /* u[i + c], lane L: column 4 L + c of rows i .. i + 3 */
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; c++) { /* a 4 x 4 transpose of lanes across u[c], u[4 + c], u[8 + c], u[12 + c] */
    __m512i p0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), p1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);
    __m512i p2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88), p3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
    r[c] = _mm512_shuffle_i32x4(p0, p2, 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(p0, p2, 0xdd);
    r[4 + c] = _mm512_shuffle_i32x4(p1, p3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(p1, p3, 0xdd);
  }
}

/* n bf16 of src (from element off) into the row buffer dst, zeros up to the next multiple of 32. */
static inline void tile_load_row(float *dst, const void *src, int64_t off, int64_t n) {
  const uint16_t *s = (const uint16_t *)src + off;
  uint16_t *d = (uint16_t *)dst;
  for (int64_t i = 0; i < n; i += 32) {
    const __mmask32 m = n - i >= 32 ? (__mmask32)~0u : (__mmask32)((1u << (n - i)) - 1u);
    _mm512_storeu_si512(d + i, _mm512_maskz_loadu_epi16(m, s + i));
  }
}

/* B [kd x N] as VNNI blocks: block (nb, s) holds k in [32 s, 32 s + 32) and columns [16 nb, 16 nb + 16),
   pair-row e of column x at (e * 16 + x) * 2: (B[32 s + 2e][x], B[32 s + 2e + 1][x]); zeros past kd and N,
   up to multiples of 32. tile_pack_b_t and tile_pack_b_bf16 write them. */

/* The blocks from B's columns given as bf16 rows: B(k, n) = rows[n][k] for k < kd and n < N, zeros
   for n in [N, Nt) and past kd (q^T, dout^T, k^T, v^T straight from the input's rows, no fp32 copy). Per 16
   columns and k step: the 16 rows' 32 elements (one 64-byte load each) as 16 x 16 dwords, transposed, so that
   dword x of pair-row e is (B(2e, x), B(2e + 1, x)); the next 16 rows are asked into L1 meanwhile (rows
   N * H elements apart in q: lines the hardware prefetchers do not follow). */
static inline void tile_pack_b_t(uint16_t *pb, int64_t kd, int64_t N, int64_t Nt, const uint16_t *const *rows) {
  const int64_t ks = tile_round(kd, SA_TILE_K) / SA_TILE_K, nbs = tile_round(Nt, 2 * SA_TILE_N) / SA_TILE_N;
  for (int64_t nb = 0; nb < nbs; nb++) {
    for (int64_t x = (nb + 1) * SA_TILE_N; x < (nb + 2) * SA_TILE_N && x < N; x++)
      for (int64_t k = 0; k < kd; k += 32) __builtin_prefetch(rows[x] + k, 0, 3);
    for (int64_t s = 0; s < ks; s++) {
      const int64_t k0 = s * SA_TILE_K;
      const __mmask32 m = kd - k0 >= 32 ? (__mmask32)~0u : (__mmask32)((1u << (kd - k0)) - 1u);
      __m512i v[16];
      for (int x = 0; x < 16; x++) {
        const int64_t n = nb * SA_TILE_N + x;
        v[x] = n < N ? _mm512_maskz_loadu_epi16(m, rows[n] + k0) : _mm512_setzero_si512();
      }
      tile_transpose16(v);
      uint16_t *blk = pb + (nb * ks + s) * SA_TILE_BLK;
      for (int e = 0; e < 16; e++) _mm512_storeu_si512(blk + e * 2 * SA_TILE_N, v[e]);
    }
  }
}

/* The same blocks from B in bf16 rows (tile_load_row's; row k at uint16 element 2 k ldb), 32 columns (two
   blocks) at a time: the two rows of a pair-row, one 64-byte load each, interleaved by 16-bit unpacks (within
   128-bit lanes: columns 8L .. 8L + 3 and 8L + 4 .. 8L + 7 of lane L), then the lanes put in column order.
   A 16-column block at a time (two 32-byte loads, widened, shifted and merged) costs 7% of the tile forward's
   work besides the products (T = S = 2048, N8 H128). */
static inline void tile_pack_b_bf16(uint16_t *pb, int64_t kd, int64_t N, const float *B, int64_t ldb) {
  const int64_t ks = tile_round(kd, SA_TILE_K) / SA_TILE_K, nbs = tile_round(N, 2 * SA_TILE_N) / SA_TILE_N;
  const __m512i first = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0),
                second = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  const uint16_t *b16 = (const uint16_t *)B;
  for (int64_t nb = 0; nb < nbs; nb += 2) {
    const int64_t left = N - nb * SA_TILE_N;
    const __mmask32 m = left >= 32 ? (__mmask32)~0u : (__mmask32)((1u << left) - 1u);
    for (int64_t s = 0; s < ks; s++) {
      uint16_t *b0 = pb + (nb * ks + s) * SA_TILE_BLK, *b1 = b0 + ks * SA_TILE_BLK;
      const uint16_t *src = b16 + 2 * s * SA_TILE_K * ldb + nb * SA_TILE_N;
      for (int64_t e = 0; e < SA_TILE_K / 2; e++) {
        const int64_t k = s * SA_TILE_K + 2 * e;
        const __m512i r0 = _mm512_maskz_loadu_epi16(k < kd ? m : 0, src + 4 * e * ldb);
        const __m512i r1 = _mm512_maskz_loadu_epi16(k + 1 < kd ? m : 0, src + (4 * e + 2) * ldb);
        const __m512i lo = _mm512_unpacklo_epi16(r0, r1), hi = _mm512_unpackhi_epi16(r0, r1);
        _mm512_storeu_si512(b0 + e * 2 * SA_TILE_N, _mm512_permutex2var_epi64(lo, first, hi));
        _mm512_storeu_si512(b1 + e * 2 * SA_TILE_N, _mm512_permutex2var_epi64(lo, second, hi));
      }
    }
  }
}

/* Rows [m0, m0 + 32) of A(r, k) = A[r + k ak] (fp32: S^T or S read transposed) as a panel [32][kp] of
   bf16, zeros past M and kd: per 16 rows and k step, the 16 VNNI pairs of k rows (2e, 2e + 1), then a dword
   transpose, so that row r holds A(r, 0 .. 31) in order. Returns the panel's valid rows in tiles: 1 or 2. */
static inline int tile_pack_a_t(uint16_t *pa, int64_t kp, int64_t m0, int64_t M, int64_t kd, const float *A,
                                int64_t ak) {
  const int halves = m0 + SA_TILE_M < M ? 2 : 1;
  for (int h = 0; h < halves; h++) {
    const int64_t r0 = m0 + h * SA_TILE_M;
    const __mmask16 m = tile_lanes(M - r0);
    for (int64_t k0 = 0; k0 < kp; k0 += SA_TILE_K) {
      __m512i v[16];
      for (int e = 0; e < 16; e++) {
        const int64_t k = k0 + 2 * e;
        __m512 lo = _mm512_maskz_loadu_ps(k < kd ? m : 0, A + r0 + k * ak);
        __m512 hi = _mm512_maskz_loadu_ps(k + 1 < kd ? m : 0, A + r0 + (k + 1) * ak);
        v[e] = tile_pair_f32(lo, hi);
      }
      tile_transpose16(v);
      uint16_t *dst = pa + h * SA_TILE_M * kp + k0;
      for (int r = 0; r < 16; r++) _mm512_storeu_si512(dst + r * kp, v[r]);
    }
  }
  return halves;
}

#endif /* SA_CPU_TILE_PACK_H */
