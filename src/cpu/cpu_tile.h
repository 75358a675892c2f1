/*
 * cpu_tile.h — the tile implementation of the matrix-product layer under the kernel body (cpu_gemm.h is the
 * vector one), included by cpu_kernel_body.h when SA_TILE is defined, after the AVX-512 vector layer. The
 * instructions are cpu_tile_isa.h's: the real ones (cpu_kernel_amx.c) or their emulation
 * (cpu_kernel_amxemu.c), the same code above them; the operand layouts are cpu_tile_pack.h's.
 *
 * The tile kernels' forward and dq items are their own (cpu_tile_fwd.h, cpu_tile_bwd.h); the body's dk/dv item
 * multiplies through this layer, its four products of two kinds (PRODUCT in cpu_kernel_body.h picks by whether
 * B is staged): A = the bf16 rows of q or dout (exact) times k^T or v^T, staged once per item (tile_pack_b_t),
 * or A = P / dS (fp32, rounded to bf16 as GPU flash-attention kernels do), read transposed from the body's S,
 * times B = the bf16 rows of q or dout. Products accumulate in fp32; alpha (the softmax scale in base 2 for the
 * products with q) is applied in fp32 by AVX-512 when the tiles are stored.
 *
 * Palette 1, all eight tiles 16 rows x 64 bytes, configured once per worker thread (tile_begin) and released
 * when it ends (tile_end). Tiles 0-3: C, 2 x 2 blocks of 16 x 16 fp32; 4, 5: A, 16 rows x 32 bf16 each;
 * 6, 7: B, 16 VNNI pair-rows x 16 columns each. Per k step of 32: 4 loads, 4 TDPBF16PS. A block on the
 * edge of C uses the tiles it covers only (1 x 1, 1 x 2 or 2 x 1).
 */
#ifndef SA_CPU_TILE_H
#define SA_CPU_TILE_H

#include "cpu_tile_isa.h"
#include "cpu_tile_pack.h"

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

static void tile_config_read(void *cfg64) { TILE_STORECONFIG((sa_tile_cfg *)cfg64); }

/* The C block of rows [m0, m0 + 16 mt) and columns [n0, n0 + 16 nt) (mt, nt 1 or 2; tile (i, j) is tile
   2 i + j) over ks k steps: A tiles at a0, a1 (rows astride bytes apart, k step s at + 32 s), B blocks at
   b0, b1 (step s at + s * SA_TILE_BLK). C (+)= alpha A B: straight through the tiles (C loaded or zeroed,
   accumulated, stored) when alpha is 1 and every row of the block is below M, else through the fp32
   store at pc, alpha and the accumulation applied by AVX-512. */
static void tile_block(int64_t m0, int64_t M, int64_t n0, int mt, int nt, int64_t ks, const uint16_t *a0,
                       const uint16_t *a1, int64_t astride, const uint16_t *b0, const uint16_t *b1, float *C,
                       int64_t ldc, int acc, float alpha, float *pc) {
  const int direct = alpha == 1.0f && m0 + mt * SA_TILE_M <= M;
  const int64_t cs = ldc * (int64_t)sizeof(float), bstride = SA_TILE_N * 2 * (int64_t)sizeof(uint16_t);
  float *c0 = C + m0 * ldc + n0, *c1 = c0 + SA_TILE_M * ldc;
  if (direct && acc) {
    TILE_LOADD(0, c0, cs);
    if (nt > 1) TILE_LOADD(1, c0 + SA_TILE_N, cs);
    if (mt > 1) TILE_LOADD(2, c1, cs);
    if (mt > 1 && nt > 1) TILE_LOADD(3, c1 + SA_TILE_N, cs);
  } else {
    TILE_ZERO(0);
    TILE_ZERO(1);
    TILE_ZERO(2);
    TILE_ZERO(3);
  }
  for (int64_t s = 0; s < ks; s++) {
    TILE_LOADD(4, a0 + s * SA_TILE_K, astride);
    TILE_LOADD(6, b0 + s * SA_TILE_BLK, bstride);
    if (mt > 1) TILE_LOADD(5, a1 + s * SA_TILE_K, astride);
    if (nt > 1) TILE_LOADD(7, b1 + s * SA_TILE_BLK, bstride);
    TILE_DPBF16PS(0, 4, 6);
    if (nt > 1) TILE_DPBF16PS(1, 4, 7);
    if (mt > 1) TILE_DPBF16PS(2, 5, 6);
    if (mt > 1 && nt > 1) TILE_DPBF16PS(3, 5, 7);
  }
  if (direct) {
    TILE_STORED(0, c0, cs);
    if (nt > 1) TILE_STORED(1, c0 + SA_TILE_N, cs);
    if (mt > 1) TILE_STORED(2, c1, cs);
    if (mt > 1 && nt > 1) TILE_STORED(3, c1 + SA_TILE_N, cs);
    return;
  }
  const int64_t ps = SA_TILE_N * (int64_t)sizeof(float);
  TILE_STORED(0, pc, ps);
  if (nt > 1) TILE_STORED(1, pc + SA_TILE_M * SA_TILE_N, ps);
  if (mt > 1) TILE_STORED(2, pc + 2 * SA_TILE_M * SA_TILE_N, ps);
  if (mt > 1 && nt > 1) TILE_STORED(3, pc + 3 * SA_TILE_M * SA_TILE_N, ps);
  const vf av = V_SET1(alpha);
  /* tile (i, j) of the block at pc + (2 i + j) * 256: rows m0 + 16 i.., columns n0 + 16 j.. */
  for (int i = 0; i < mt; i++)
    for (int j = 0; j < nt; j++)
      for (int64_t r = 0; r < SA_TILE_M && m0 + i * SA_TILE_M + r < M; r++) {
        const float *t = pc + ((2 * i + j) * SA_TILE_M + r) * SA_TILE_N;
        float *c = C + (m0 + i * SA_TILE_M + r) * ldc + n0 + j * SA_TILE_N;
        vf x = V_MUL(av, V_LOAD(t));
        V_STORE(c, acc ? V_ADD(V_LOAD(c), x) : x);
      }
}

/* C[M x N] = alpha A B (acc 0) or C += alpha A B (acc 1), N a multiple of 16 (the body's padded widths),
   with A in bf16 rows (tile_load_row's: row r at uint16 element 2 r ar, zero from kd to a multiple of 32),
   loaded into A tiles where they lie, and B staged (tile_pack_b(kd, N)): the products whose B an item
   reuses. Rows of A past M are read (up to M rounded to 16, inside the row buffer) but their C rows are
   dropped. The k steps of each C block run in a fixed order, so the result does not depend on the thread
   that runs the item. pc: SA_TILE_C_FLOATS. */
static void tile_gemm_staged(int64_t M, int64_t N, int64_t kd, const float *A, int64_t ar, const uint16_t *staged,
                             float *C, int64_t ldc, int acc, float alpha, float *pc) {
  const int64_t ks = tile_round(kd, SA_TILE_K) / SA_TILE_K, astride = 4 * ar;
  const uint16_t *a16 = (const uint16_t *)A;
  for (int64_t m0 = 0; m0 < M; m0 += 2 * SA_TILE_M) {
    const int mt = m0 + SA_TILE_M < M ? 2 : 1;
    const uint16_t *a0 = a16 + 2 * m0 * ar, *a1 = a0 + 2 * SA_TILE_M * ar;
    for (int64_t n0 = 0; n0 < N; n0 += 2 * SA_TILE_N) {
      const uint16_t *b0 = staged + (n0 / SA_TILE_N) * ks * SA_TILE_BLK, *b1 = b0 + ks * SA_TILE_BLK;
      tile_block(m0, M, n0, mt, n0 + SA_TILE_N < N ? 2 : 1, ks, a0, a1, astride, b0, b1, C, ldc, acc, alpha, pc);
    }
  }
}

/* The same with A(r, k) = A[r + k ak] in fp32 (S^T or S read transposed: P, dS and their transposes),
   packed per 32-row panel (tile_pack_a_t), and B [kd x N] in bf16 rows ldb floats apart (K, V, q or dout,
   tile_load_row's), packed per product. pa, pb: tile_a_elems / tile_b_elems bf16. */
static void tile_gemm_rows(int64_t M, int64_t N, int64_t kd, const float *A, int64_t ak, const float *B, int64_t ldb,
                           float *C, int64_t ldc, int acc, float alpha, uint16_t *pa, uint16_t *pb, float *pc) {
  const int64_t kp = tile_round(kd, SA_TILE_K), ks = kp / SA_TILE_K;
  tile_pack_b_bf16(pb, kd, N, B, ldb);
  for (int64_t m0 = 0; m0 < M; m0 += 2 * SA_TILE_M) {
    const int mt = tile_pack_a_t(pa, kp, m0, M, kd, A, ak);
    for (int64_t n0 = 0; n0 < N; n0 += 2 * SA_TILE_N) {
      const uint16_t *b0 = pb + (n0 / SA_TILE_N) * ks * SA_TILE_BLK, *b1 = b0 + ks * SA_TILE_BLK;
      tile_block(m0, M, n0, mt, n0 + SA_TILE_N < N ? 2 : 1, ks, pa, pa + SA_TILE_M * kp, 2 * kp, b0, b1, C, ldc, acc,
                 alpha, pc);
    }
  }
}

#endif /* SA_CPU_TILE_H */
