/*
 * cpu_tile.h — the tile implementation of the matrix-product layer under the kernel body (cpu_gemm.h is the
 * vector one), included by cpu_kernel_body.h when SA_TILE is defined, after the AVX-512 vector layer. The
 * instructions are cpu_tile_isa.h's: the real ones (cpu_kernel_amx.c) or their emulation
 * (cpu_kernel_amxemu.c), the same code above them.
 *
 * Every product of the body is C (+)= alpha A B with fp32 A (any row / k strides) and B (rows ldb apart):
 * here both are rounded to bf16 (exact for K, V, dout and the unscaled q, which are bf16 inputs; P and dS
 * lose their low bits, as in GPU flash-attention kernels), multiplied on tiles with fp32 accumulation, and
 * alpha (the softmax scale in base 2 for the products with q) and the accumulation into C are applied in
 * fp32 by AVX-512 when the tiles are stored.
 *
 * Palette 1, all eight tiles 16 rows x 64 bytes, configured once per worker thread (tile_begin) and released
 * when it ends (tile_end). Tiles 0-3: C, 2 x 2 blocks of 16 x 16 fp32; 4, 5: A, 16 rows x 32 bf16 each;
 * 6, 7: B, 16 VNNI pair-rows x 16 columns each. Per k step of 32: 4 loads, 4 TDPBF16PS.
 * Operands are staged in the worker's scratch, zero-padded to whole tiles: A as 32-row panels [32][kp]
 * bf16, B as VNNI blocks of 32 k x 16 columns (1 KiB each, one tile load), both rounded to nearest even.
 * The B operands an item reuses for all its tiles (q^T and dout^T of the forward and dq items, k^T and v^T
 * of the dk/dv items) are staged once per item by the body (STAGE_B), the others per product.
 */
#ifndef SA_CPU_TILE_H
#define SA_CPU_TILE_H

#include "cpu_tile_isa.h"

#define SA_TILE_K 32 /* bf16 per A tile row: one TDPBF16PS k step */
#define SA_TILE_N 16 /* fp32 columns per C tile */
#define SA_TILE_M 16 /* rows per tile */

static int64_t tile_round(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* bf16 elements of staging for products of depth up to kmax and width up to nmax (A panel, B blocks), and
   fp32 elements of the four stored C tiles. */
static size_t tile_a_elems(int64_t kmax) { return (size_t)(2 * SA_TILE_M * tile_round(kmax, SA_TILE_K)); }
static size_t tile_b_elems(int64_t kmax, int64_t nmax) {
  return (size_t)(tile_round(kmax, SA_TILE_K) * tile_round(nmax, 2 * SA_TILE_N));
}
#define SA_TILE_C_FLOATS (4 * SA_TILE_M * SA_TILE_N)

static void tile_begin(void) {
  sa_tile_cfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = SA_TILE_M;
  }
  TILE_LOADCONFIG(&cfg);
}

static void tile_end(void) { TILE_RELEASE(); }

/* B [kd x N] (rows ldb apart) as VNNI blocks: block (nb, s) holds k in [32 s, 32 s + 32) and columns
   [16 nb, 16 nb + 16), pair-row e of column x at (e * 16 + x) * 2: (B[32 s + 2e][.], B[32 s + 2e + 1][.]). */
static void tile_pack_b(uint16_t *pb, int64_t kd, int64_t N, const float *B, int64_t ldb) {
  const int64_t ks = tile_round(kd, SA_TILE_K) / SA_TILE_K, nbs = tile_round(N, 2 * SA_TILE_N) / SA_TILE_N;
  for (int64_t nb = 0; nb < nbs; nb++)
    for (int64_t s = 0; s < ks; s++) {
      uint16_t *blk = pb + (nb * ks + s) * (SA_TILE_K * SA_TILE_N);
      for (int64_t e = 0; e < SA_TILE_K / 2; e++)
        for (int64_t x = 0; x < SA_TILE_N; x++)
          for (int64_t h = 0; h < 2; h++) {
            const int64_t k = s * SA_TILE_K + 2 * e + h, n = nb * SA_TILE_N + x;
            blk[(e * SA_TILE_N + x) * 2 + h] = k < kd && n < N ? sa_f32_to_bf16(B[k * ldb + n]) : 0;
          }
    }
}

/* Rows [m0, m0 + 32) of A (A(r, k) = A[r ar + k ak]) as a panel [32][kp] bf16, zero past M and kd. */
static void tile_pack_a(uint16_t *pa, int64_t kp, int64_t m0, int64_t M, int64_t kd, const float *A, int64_t ar,
                        int64_t ak) {
  for (int64_t r = 0; r < 2 * SA_TILE_M; r++) {
    uint16_t *row = pa + r * kp;
    if (m0 + r >= M) {
      memset(row, 0, (size_t)kp * sizeof *row);
      continue;
    }
    const float *src = A + (m0 + r) * ar;
    int64_t k = 0;
    for (; k < kd; k++) row[k] = sa_f32_to_bf16(src[k * ak]);
    for (; k < kp; k++) row[k] = 0;
  }
}

/* C[M x N] = alpha A B (acc 0) or C += alpha A B (acc 1), N a multiple of 16 (the body's padded widths).
   staged: B already as tile_pack_b(kd, N) made it (operands reused by a whole item, staged once), else
   NULL and B is staged into pb here. pa, pb: staging of tile_a_elems / tile_b_elems bf16; pc:
   SA_TILE_C_FLOATS. The k steps of each C block run in a fixed order, so the result does not depend on the
   thread that runs the item. */
static void tile_gemm(int64_t M, int64_t N, int64_t kd, const float *A, int64_t ar, int64_t ak, const float *B,
                      int64_t ldb, const uint16_t *staged, float *C, int64_t ldc, int acc, float alpha, uint16_t *pa,
                      uint16_t *pb, float *pc) {
  const int64_t kp = tile_round(kd, SA_TILE_K), ks = kp / SA_TILE_K;
  const int64_t np = tile_round(N, 2 * SA_TILE_N), bstride = SA_TILE_N * 2 * (int64_t)sizeof(uint16_t);
  const int64_t astride = kp * (int64_t)sizeof(uint16_t), cstride = SA_TILE_N * (int64_t)sizeof(float);
  const vf av = V_SET1(alpha);
  if (!staged) tile_pack_b(pb, kd, N, B, ldb);
  const uint16_t *bv = staged ? staged : pb;
  for (int64_t m0 = 0; m0 < M; m0 += 2 * SA_TILE_M) {
    tile_pack_a(pa, kp, m0, M, kd, A, ar, ak);
    for (int64_t n0 = 0; n0 < np; n0 += 2 * SA_TILE_N) {
      const uint16_t *b0 = bv + (n0 / SA_TILE_N) * ks * (SA_TILE_K * SA_TILE_N);
      const uint16_t *b1 = b0 + ks * (SA_TILE_K * SA_TILE_N);
      TILE_ZERO(0);
      TILE_ZERO(1);
      TILE_ZERO(2);
      TILE_ZERO(3);
      for (int64_t s = 0; s < ks; s++) {
        TILE_LOADD(4, pa + s * SA_TILE_K, astride);
        TILE_LOADD(5, pa + SA_TILE_M * kp + s * SA_TILE_K, astride);
        TILE_LOADD(6, b0 + s * (SA_TILE_K * SA_TILE_N), bstride);
        TILE_LOADD(7, b1 + s * (SA_TILE_K * SA_TILE_N), bstride);
        TILE_DPBF16PS(0, 4, 6);
        TILE_DPBF16PS(1, 4, 7);
        TILE_DPBF16PS(2, 5, 6);
        TILE_DPBF16PS(3, 5, 7);
      }
      TILE_STORED(0, pc, cstride);
      TILE_STORED(1, pc + SA_TILE_M * SA_TILE_N, cstride);
      TILE_STORED(2, pc + 2 * SA_TILE_M * SA_TILE_N, cstride);
      TILE_STORED(3, pc + 3 * SA_TILE_M * SA_TILE_N, cstride);
      /* tile (i, j) of the 2 x 2 block at pc + (2 i + j) * 256: rows m0 + 16 i.., columns n0 + 16 j.. */
      for (int64_t i = 0; i < 2; i++)
        for (int64_t j = 0; j < 2 && n0 + j * SA_TILE_N < N; j++)
          for (int64_t r = 0; r < SA_TILE_M && m0 + i * SA_TILE_M + r < M; r++) {
            const float *t = pc + ((2 * i + j) * SA_TILE_M + r) * SA_TILE_N;
            float *c = C + (m0 + i * SA_TILE_M + r) * ldc + n0 + j * SA_TILE_N;
            vf x = V_MUL(av, V_LOAD(t));
            V_STORE(c, acc ? V_ADD(V_LOAD(c), x) : x);
          }
    }
  }
}

#endif /* SA_CPU_TILE_H */
