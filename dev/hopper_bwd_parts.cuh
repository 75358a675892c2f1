/*
 * dev/hopper_bwd_parts.cuh — what the Hopper backward variants dev/hopper_bwd_NN.cu share verbatim: the tile
 * constants, the wgmma / copy / fragment helpers, and the dQ pass (bwd_dq and its launch), which no variant
 * changes. Each variant keeps only its own dK/dV pass and launches, so `diff hopper_bwd_01.cu hopper_bwd_NN.cu`
 * shows exactly what it tries. The reference and the harness are in dev/hopper_bwd_common.cuh, the PTX
 * wrappers in dev/hopper_common.cuh.
 */
#ifndef HOPPER_BWD_PARTS_CUH
#define HOPPER_BWD_PARTS_CUH
#include "hopper_bwd_common.cuh"

constexpr int KB = 128; /* keys per dK/dV CTA: 2 consumer warpgroups x 64 (the wgmma M) */
constexpr int QB = 64;  /* query rows per streamed tile of dK/dV: N of S^T / dP^T, 4 k-steps of dV / dK */
constexpr int QM = 128; /* query rows per dQ CTA: 2 consumer warpgroups x 64 */
constexpr int KT = 64;  /* keys per streamed tile of dQ */
/* Registers per consumer thread at H 128 (dK/dV): dK 64 + dV 64 + S^T 32 + dP^T 32 = 192 live accumulators,
   plus 32 for the bf16 fragments of P^T and dS^T: a 128-row query tile (S^T, dP^T 64 each) would not fit 240. */

/* D[64x64] (+)= A[64x16] B[16x64], both K-major in shared memory; scale_d 0 overwrites D. */
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" SA_REGS32 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : SA_F32(d)
      : "l"(da), "l"(db), "r"(scale_d));
}
/* Plain bulk copy (no tensor map) of `bytes` (multiple of 16, 16-byte aligned) completing on bar. */
__device__ __forceinline__ void bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
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
/* Accumulator [64 x 64] -> bf16 A fragments of 4 k-steps (accumulator blocks 2kk, 2kk + 1 per k-step). */
__device__ __forceinline__ void pack_frag(uint32_t (&f)[16], const float (&a)[32]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) f[i] = pack_bf16(a[2 * i], a[2 * i + 1]);
}
/* ptxas hoists wgmma.wait_group 0 above the exp2s that follow a wait_group 1, so they stop overlapping the
   second product (2-9 of 32 MUFU.EX2 inside the window without this, nvcc 13.0). As in hopper_fwd_02, a shared
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
/* This thread's rows r0, r0 + 8 of an accumulator, scaled, as bf16; base = row 0 of the head, rows row_stride apart. */
template <int HD>
__device__ __forceinline__ void store_rows(__nv_bfloat16 *base, const float (&acc)[HD / 2], size_t row_stride,
                                           int r0, int t, float scale) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    __nv_bfloat16 *dst = base + (size_t)(r0 + 8 * h) * row_stride + 2 * t;
#pragma unroll
    for (int j = 0; j < HD / 8; ++j)
      *reinterpret_cast<__nv_bfloat162 *>(dst + 8 * j) =
          __floats2bfloat162_rn(acc[4 * j + 2 * h] * scale, acc[4 * j + 2 * h + 1] * scale);
  }
}
template <int HD>
constexpr int dq_smem() { return 1024 + 2 * QM * HD * 2 + STAGES * 2 * KT * HD * 2; }
static_assert(QB == 64 && KT == 64, "gemm_rs and pack_frag read 64-row tiles");

/* ---- 3. dQ ------------------------------------------------------------------------------------------ */

template <int HD, bool CAUSAL>
__global__ void __launch_bounds__(THREADS, 1)
    bwd_dq(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmdo,
           const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv, const BwdParams p) {
  constexpr int CB = HD / 64;
  constexpr uint32_t Q_BYTES = QM * HD * 2, KT_BYTES = KT * HD * 2;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar[1 + 2 * STAGES]; /* Q+dO full; per stage K+V full; per stage empty */
  __shared__ float anchor[4 * NC];

  const uint32_t sq = (smem_u32(smem_raw) + 1023u) & ~1023u, sdo = sq + Q_BYTES;
  const uint32_t sk = sdo + Q_BYTES, sv = sk + STAGES * KT_BYTES, b0 = smem_u32(bar);
  auto bar_full = [&](int s) { return b0 + 8 * (1 + s); };
  auto bar_empty = [&](int s) { return b0 + 8 * (1 + STAGES + s); };

  /* Causal: the query blocks with the most key tiles are launched first. */
  const int mb = CAUSAL ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
  const int n = blockIdx.y, b = blockIdx.z, kvh = n / (p.N / p.KH), m0 = mb * QM, T = p.T;
  const int n_tiles = CAUSAL ? min(p.S / KT, (m0 + QM - 1) / KT + 1) : p.S / KT; /* >= 1 */
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    mbar_init(b0, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bar_full(s), 1);
      mbar_init(bar_empty(s), 4 * NC);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (threadIdx.x == 0) {
      mbar_arrive_tx(b0, 2 * Q_BYTES);
      for (int c = 0; c < CB; ++c) {
        tma_load(sq + c * QM * 128, &tmq, b0, c * 64, n, m0, b);
        tma_load(sdo + c * QM * 128, &tmdo, b0, c * 64, n, m0, b);
      }
      for (int it = 0; it < n_tiles; ++it) {
        const int s = it % STAGES;
        mbar_wait(bar_empty(s), ((it / STAGES) & 1) ^ 1);
        mbar_arrive_tx(bar_full(s), 2 * KT_BYTES);
        for (int c = 0; c < CB; ++c) {
          tma_load(sk + s * KT_BYTES + c * KT * 128, &tmk, bar_full(s), c * 64, kvh, it * KT, b);
          tma_load(sv + s * KT_BYTES + c * KT * 128, &tmv, bar_full(s), c * 64, kvh, it * KT, b);
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  const int cw = wg - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, t = lane % 4;
  const int wg_row0 = m0 + 64 * cw, r0 = wg_row0 + 16 * warp + lane / 4; /* rows r0, r0 + 8 */
  const uint32_t sq_wg = sq + cw * 64 * 128, sdo_wg = sdo + cw * 64 * 128;
  const float sl2 = p.scale_l2;
  float lr[2], Dr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const size_t li = ((size_t)b * p.N + n) * T + r0 + 8 * h;
    lr[h] = p.lse2[li];
    Dr[h] = p.D[li];
  }
  float dq[HD / 2], sa[32], dpa[32];
  uint32_t df[16];
  zero(dq);
  mbar_wait(b0, 0);

  for (int it = 0; it < n_tiles; ++it) {
    const int s = it % STAGES, key0 = it * KT;
    const uint32_t sk_s = sk + s * KT_BYTES, sv_s = sv + s * KT_BYTES;
    mbar_wait(bar_full(s), (it / STAGES) & 1);
    zero(sa);
    zero(dpa);
    pin(sa);
    pin(dpa);
    wgmma_fence();
    gemm_ss<HD>(sa, sq_wg, QM, sk_s, KT); /* S = Q K^T */
    wgmma_commit();
    gemm_ss<HD>(dpa, sdo_wg, QM, sv_s, KT); /* dP = dO V^T */
    wgmma_commit();
    wgmma_wait1();
    pin(sa);
    const bool masked = CAUSAL && key0 + KT - 1 > wg_row0;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = ex2(fmaf(sa[4 * j + e], sl2, -lr[e >> 1]));
        if (masked && key0 + 8 * j + 2 * t + (e & 1) > r0 + 8 * (e >> 1)) x = 0.f;
        sa[4 * j + e] = x;
      }
    anchor_exp2(sa, &anchor[4 * cw + warp], lane);
    wgmma_wait0();
    pin(dpa);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dpa[4 * j + e] = sa[4 * j + e] * (dpa[4 * j + e] - Dr[e >> 1]);
    pack_frag(df, dpa);
    pin(dq);
    pin(df);
    wgmma_fence();
    gemm_rs<HD>(dq, df, sk_s); /* dQ += dS K: K N-major from the same tile */
    wgmma_commit();
    wgmma_wait0();
    pin(dq);
    pin(df);
    if (lane == 0) mbar_arrive(bar_empty(s));
  }

  store_rows<HD>(p.dq + ((size_t)b * T * p.N + n) * HD, dq, (size_t)p.N * HD, r0, t, p.scale);
}

template <int HD, bool CAUSAL>
static void launch_dq_t(const Bwd &w) {
  static bool attr_set = false;
  if (!attr_set) {
    CK(cudaFuncSetAttribute(bwd_dq<HD, CAUSAL>, cudaFuncAttributeMaxDynamicSharedMemorySize, dq_smem<HD>()));
    attr_set = true;
  }
  const Case &c = w.pr.c;
  bwd_dq<HD, CAUSAL><<<dim3(c.T / QM, c.N, c.B), THREADS, dq_smem<HD>()>>>(w.maps[4], w.maps[5], w.maps[6], w.maps[7],
                                                                         w.p);
}

static void launch_dq(const Bwd &w) {
  const Case &c = w.pr.c;
  if (c.H == 128) c.causal ? launch_dq_t<128, true>(w) : launch_dq_t<128, false>(w);
  else c.causal ? launch_dq_t<64, true>(w) : launch_dq_t<64, false>(w);
}

#endif /* HOPPER_BWD_PARTS_CUH */
