/*
 * hopper/bwd_gemm.cuh — the device helpers every Hopper backward uses: the m64n64 wgmma, the SS and RS product
 * loops, fragment packing, the exp2 anchor, the accumulator row store.
 */
#ifndef SA_HOPPER_BWD_GEMM_CUH
#define SA_HOPPER_BWD_GEMM_CUH

#include "hopper/ptx.cuh"
#include "hopper/segments.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* D[64x64] (+)= A[64x16] B[16x64], both K-major in shared memory; scale_d 0 overwrites D. */
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" SA_REGS32 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : SA_F32(d)
      : "l"(da), "l"(db), "r"(scale_d));
}

/* acc[64x64] = A B^T over HD: A = 64 rows at a (K-major, its tile has a_rows rows per 64-column block),
   B = 64 rows at b (K-major, b_rows rows per block); H / 16 k-steps of 32 bytes inside the swizzled row. */
template <int HD>
__device__ __forceinline__ void gemm_ss(float (&acc)[32], uint32_t a, int a_rows, uint32_t b, int b_rows) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk)
    wgmma_ss_n64(acc, gmma_desc(a + (kk / 4) * a_rows * 128 + (kk % 4) * 32, 16, 1024),
                 gmma_desc(b + (kk / 4) * b_rows * 128 + (kk % 4) * 32, 16, 1024), kk > 0);
}

/* acc[64xHD] += F[64x64] B[64xHD]: F bf16 fragments in registers (4 k-steps of 16), B a 64-row tile N-major
   (imm-trans-b 1): a k-step is 16 rows = 2048 bytes, the 64-column blocks are 64 * 128 bytes apart. */
template <int HD>
__device__ __forceinline__ void gemm_rs(float (&acc)[HD / 2], const uint32_t (&f)[16], uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_rs(acc, &f[4 * kk], gmma_desc(b + kk * 2048, 64 * 128, 1024));
}

/* dV += P^T dO and dK += dS^T Q of one tile (RS: the fragments in registers, dO / Q this stage's tiles), issued as
   one commit group; dvdk_retire waits for it. Every backward kernel's pair: between the two a kernel may wait for
   something else while the products run. The pins keep the compiler from moving the accumulators' and fragments'
   uses across the asynchronous products. */
template <int HD>
__device__ __forceinline__ void dvdk_issue(float (&dv)[HD / 2], float (&dk)[HD / 2], uint32_t (&pf)[16],
                                           uint32_t (&df)[16], uint32_t sdo_s, uint32_t sq_s) {
  pin(dv);
  pin(dk);
  pin(pf);
  pin(df);
  wgmma_fence();
  gemm_rs<HD>(dv, pf, sdo_s); /* dV += P^T dO */
  gemm_rs<HD>(dk, df, sq_s);  /* dK += dS^T Q */
  wgmma_commit();
}
template <int HD>
__device__ __forceinline__ void dvdk_retire(float (&dv)[HD / 2], float (&dk)[HD / 2], uint32_t (&pf)[16],
                                            uint32_t (&df)[16]) {
  wgmma_wait0();
  pin(dv);
  pin(dk);
  pin(pf);
  pin(df);
}

/* Accumulator [64 x 64] -> bf16 A fragments of 4 k-steps (accumulator blocks 2kk, 2kk + 1 per k-step). */
__device__ __forceinline__ void pack_frag(uint32_t (&f)[16], const float (&a)[32]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) f[i] = pack_bf16(a[2 * i], a[2 * i + 1]);
}

/* ptxas hoists wgmma.wait_group 0 above the exp2s that follow a wait_group 1, so they stop overlapping the
   second product (2-9 of 32 MUFU.EX2 inside the window without this, nvcc 13.0). As in hopper_fwd, a shared
   store of a value that depends on every exp2 anchors the wait after them: one word per warp, never read. */
__device__ __forceinline__ void anchor_exp2(const float (&x)[32], float *slot, int lane) {
  float a = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) a += x[i];
  if (lane == 0) asm volatile("st.shared.f32 [%0], %1;" ::"r"(smem_u32(slot)), "f"(a) : "memory");
}

template <int R>
__device__ __forceinline__ void zero(float (&r)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) r[i] = 0.f;
}

/* This thread's rows r0, r0 + 8 of an accumulator, scaled, as bf16 (16-byte stores: store_row_bf16); base = row 0
   of the head, rows row_stride apart. All 32 lanes. */
template <int HD>
__device__ __forceinline__ void store_rows(__nv_bfloat16 *base, const float (&acc)[HD / 2], size_t row_stride, int r0,
                                           int t, float scale) {
#pragma unroll
  for (int h = 0; h < 2; ++h) store_row_bf16<HD>(base + (size_t)(r0 + 8 * h) * row_stride, acc, h, scale, t);
}

#endif /* sm_90a */

#endif /* SA_HOPPER_BWD_GEMM_CUH */
