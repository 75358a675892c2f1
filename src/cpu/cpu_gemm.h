/*
 * cpu_gemm.h — the matrix-product layer under the attention kernel body (cpu_kernel_body.h), compiled with
 * the vector layer of the including file (VW floats per vf, V_LOAD / V_SET1 / V_FMA / V_STORE / V_ZERO, the
 * micro-kernel shape MK_R x MK_C). Every product of the body is C (+)= A B with A read as broadcast scalars
 * at any (row, k) strides and B as vectors along its rows, all fp32. The AMX tile path (docs/cpu.md) is the
 * other implementation of this layer: the same products with bf16 operands on tiles.
 */
#ifndef SA_CPU_GEMM_H
#define SA_CPU_GEMM_H

/* C[R x CV*VW] (+)= A[R x kd] B[kd x CV*VW]: R x CV accumulators live in registers for the whole kd loop;
   each step loads CV vectors of B and broadcasts R scalars of A for R*CV FMAs. */
SA_INLINE void mk(const int R, const int CV, int64_t kd, const float *A, int64_t ar, int64_t ak, const float *B,
                  int64_t ldb, float *C, int64_t ldc, int acc) {
  vf c[MK_R][MK_C];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
#pragma GCC unroll 8
    for (int v = 0; v < CV; v++) c[r][v] = acc ? V_LOAD(C + r * ldc + v * VW) : V_ZERO();
  for (int64_t k = 0; k < kd; k++) {
    vf bv[MK_C];
#pragma GCC unroll 8
    for (int v = 0; v < CV; v++) bv[v] = V_LOAD(B + k * ldb + v * VW);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      vf a = V_SET1(A[r * ar + k * ak]);
#pragma GCC unroll 8
      for (int v = 0; v < CV; v++) c[r][v] = V_FMA(a, bv[v], c[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
#pragma GCC unroll 8
    for (int v = 0; v < CV; v++) V_STORE(C + r * ldc + v * VW, c[r][v]);
}

/* C[M x N] = A B (acc 0) or C += A B (acc 1); A(r, k) = A[r * ar + k * ak]; N a multiple of VW. */
static void gemm(int64_t M, int64_t N, int64_t kd, const float *A, int64_t ar, int64_t ak, const float *B, int64_t ldb,
                 float *C, int64_t ldc, int acc) {
  int64_t n0 = 0;
  for (; n0 + MK_C * VW <= N; n0 += MK_C * VW) {
    int64_t r = 0;
    for (; r + MK_R <= M; r += MK_R) mk(MK_R, MK_C, kd, A + r * ar, ar, ak, B + n0, ldb, C + r * ldc + n0, ldc, acc);
    for (; r < M; r++) mk(1, MK_C, kd, A + r * ar, ar, ak, B + n0, ldb, C + r * ldc + n0, ldc, acc);
  }
  for (; n0 < N; n0 += VW) {
    int64_t r = 0;
    for (; r + MK_R <= M; r += MK_R) mk(MK_R, 1, kd, A + r * ar, ar, ak, B + n0, ldb, C + r * ldc + n0, ldc, acc);
    for (; r < M; r++) mk(1, 1, kd, A + r * ar, ar, ak, B + n0, ldb, C + r * ldc + n0, ldc, acc);
  }
}

#endif /* SA_CPU_GEMM_H */
