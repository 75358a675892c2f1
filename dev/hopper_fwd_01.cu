/*
 * dev/hopper_fwd_01.cu — experimental variant 01 of a Hopper (sm_90a) forward attention kernel with sinks
 * (issue "Hopper fast path", first step). Standalone program: validates against a naive fp32 GPU reference,
 * then times itself and prints JSON lines. Build and run with dev/run_hopper.sh.
 *
 * Scope: bf16, H = Hv in {64, 128}, non-causal and causal top-left, vanilla / off-by-one / learnable sinks,
 * GQA (N % K == 0), T and S multiples of 128. No lengths, windows or segments yet.
 *
 * Design (one CTA = 128 query rows of one (b, n); 3 warpgroups, 384 threads, 1 CTA per SM):
 * - warpgroup 0 is the producer: setmaxnreg 24, one thread issues TMA (cp.async.bulk.tensor) loads of the Q
 *   tile once and of K/V tiles (128 keys) into a 2-stage ring; each load completes on an mbarrier
 *   (expect_tx). Separate full/empty barriers for K and V, so S = Q K^T starts before V has landed.
 * - warpgroups 1 and 2 are consumers (setmaxnreg 240), 64 query rows each (the wgmma M):
 *   S = Q K^T with wgmma m64n128k16, A and B from shared memory (K-major, 128-byte swizzle, as TMA wrote them);
 *   online softmax in registers (exp2, running max seeded with the sink logit); P converted to bf16 in
 *   registers and O += P V with wgmma m64n{H}k16, A from registers, B = V from shared memory (N-major,
 *   imm-trans-b = 1). The sink enters the denominator once, in the final normalisation; lse includes it.
 * - This variant runs the two products and the softmax of one warpgroup in sequence (wait_group 0 after
 *   each); the overlap comes from the two consumer warpgroups sharing the tensor core. Intra-warpgroup
 *   overlap (FA3's two-stage softmax pipelining) and ping-pong are variant 02 (dev/hopper_fwd_02.cu).
 * Shared memory: Q 32 KiB + 2 stages x (K 32 KiB + V 32 KiB) = 160 KiB at H = 128.
 * The PTX wrappers, the reference and the harness live in dev/hopper_common.cuh.
 */
#include "hopper_common.cuh"

template <int HD, bool CAUSAL>
__global__ void __launch_bounds__(THREADS, 1)
    hopper_fwd(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmk,
               const __grid_constant__ CUtensorMap tmv, const FwdParams p) {
  constexpr int CB = HD / 64;                      /* 128-byte column blocks per row */
  constexpr uint32_t Q_BYTES = BM * HD * 2, KV_BYTES = BN * HD * 2;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar[1 + 4 * STAGES];

  const uint32_t sq = (smem_u32(smem_raw) + 1023u) & ~1023u; /* swizzle atoms need 1024-byte alignment */
  const uint32_t sk = sq + Q_BYTES, sv = sk + STAGES * KV_BYTES, b0 = smem_u32(bar);

  /* Causal: the heaviest m-blocks (most key tiles) are launched first. */
  const int mb = CAUSAL ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
  const int n = blockIdx.y, b = blockIdx.z, kvh = n / (p.N / p.KH), m0 = mb * BM;
  /* Top-left causal: key tiles past the CTA's last row (m0 + BM - 1) are fully masked and skipped. */
  const int n_tiles = CAUSAL ? min(p.S / BN, (m0 + BM - 1) / BN + 1) : p.S / BN;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    mbar_init(bar_q(b0), 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bar_kf(b0, s), 1);       /* the producer's arrive.expect_tx, then the TMA bytes */
      mbar_init(bar_vf(b0, s), 1);
      mbar_init(bar_ke(b0, s), 4 * NC);  /* one arrive per consumer warp */
      mbar_init(bar_ve(b0, s), 4 * NC);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    /* Producer: 24 registers; 128 x 24 + 256 x 240 = 64512 of the SM's 65536. */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (threadIdx.x == 0) {
      mbar_arrive_tx(bar_q(b0), Q_BYTES);
      for (int c = 0; c < CB; ++c) tma_load(sq + c * BM * 128, &tmq, bar_q(b0), c * 64, n, m0, b);
      for (int it = 0; it < n_tiles; ++it) {
        const int s = it % STAGES;
        const uint32_t ph = (it / STAGES) & 1;
        mbar_wait(bar_ke(b0, s), ph ^ 1);
        mbar_arrive_tx(bar_kf(b0, s), KV_BYTES);
        for (int c = 0; c < CB; ++c)
          tma_load(sk + s * KV_BYTES + c * BN * 128, &tmk, bar_kf(b0, s), c * 64, kvh, it * BN, b);
        mbar_wait(bar_ve(b0, s), ph ^ 1);
        mbar_arrive_tx(bar_vf(b0, s), KV_BYTES);
        for (int c = 0; c < CB; ++c)
          tma_load(sv + s * KV_BYTES + c * BN * 128, &tmv, bar_vf(b0, s), c * 64, kvh, it * BN, b);
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  const int cw = wg - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, t = lane % 4;
  const int wg_row0 = m0 + 64 * cw;            /* first row of this warpgroup */
  const int r0 = wg_row0 + 16 * warp + lane / 4; /* this thread's rows: r0 and r0 + 8 */
  const float sink = p.softmax == SM_LEARNABLE ? p.sinks[n] : p.softmax == SM_OFF_BY_ONE ? 0.f : -INFINITY;
  const float sink_l2 = sink * LOG2E, sl2 = p.scale_l2;

  /* Accumulator layout of m64nN (per warp 16 rows): d[4j + e]: row lane/4 + 8 * (e >> 1),
     column 8j + 2 * (lane % 4) + (e & 1). */
  float o[HD / 2], sacc[64];
  float m_[2] = {sink_l2, sink_l2}, l_[2] = {0.f, 0.f}; /* running max seeded with the sink */
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;

  const uint32_t sq_wg = sq + cw * 64 * 128;   /* this warpgroup's 64 rows of each Q column block */
  mbar_wait(bar_q(b0), 0);

  for (int it = 0; it < n_tiles; ++it) {
    const int s = it % STAGES;
    const uint32_t ph = (it / STAGES) & 1;
    const uint32_t skb = sk + s * KV_BYTES, svb = sv + s * KV_BYTES;

    /* S = Q K^T: H / 16 k-steps; a k-step advances 32 bytes inside a 128-byte swizzled row, 4 per block. */
    mbar_wait(bar_kf(b0, s), ph);
    pin(sacc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
      wgmma_ss_n128(sacc, gmma_desc(sq_wg + (kk / 4) * BM * 128 + (kk % 4) * 32, 16, 1024),
                    gmma_desc(skb + (kk / 4) * BN * 128 + (kk % 4) * 32, 16, 1024), kk > 0);
    wgmma_commit();
    wgmma_wait0();
    pin(sacc);
    if (lane == 0) mbar_arrive(bar_ke(b0, s));

    if (CAUSAL && it * BN + BN - 1 > wg_row0) { /* the diagonal tile: key j valid for row i iff j <= i */
      const int kc = it * BN + 2 * t;
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (kc + 8 * j + e > r0) sacc[4 * j + e] = -INFINITY;
          if (kc + 8 * j + e > r0 + 8) sacc[4 * j + 2 + e] = -INFINITY;
        }
    }

    /* Online softmax for rows r0 (h = 0) and r0 + 8 (h = 1); a row's 128 scores sit in the 4 lanes of a quad. */
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      mx[0] = fmaxf(mx[0], fmaxf(sacc[4 * j], sacc[4 * j + 1]));
      mx[1] = fmaxf(mx[1], fmaxf(sacc[4 * j + 2], sacc[4 * j + 3]));
    }
    float corr[2], base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float mnew = fmaxf(m_[h], mx[h] * sl2);    /* scale > 0: max commutes with scaling */
      base[h] = mnew == -INFINITY ? 0.f : mnew;         /* vanilla, nothing valid yet: keep exp2 finite */
      corr[h] = ex2(m_[h] - base[h]);
      m_[h] = mnew;
      l_[h] *= corr[h];                                 /* per-thread partial sums; the quad sums at the end */
    }
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sacc[4 * j + e] = ex2(fmaf(sacc[4 * j + e], sl2, -base[e >> 1]));
        l_[e >> 1] += sacc[4 * j + e];
      }
#pragma unroll
    for (int j = 0; j < HD / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[4 * j + e] *= corr[e >> 1];

    /* P as the A operand of m64nHk16: k-step kk takes columns 16kk..16kk+15 = accumulator blocks 2kk, 2kk+1,
       whose register order (row g, row g+8, row g cols+8, row g+8 cols+8) is the A fragment order. */
    uint32_t pf[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) pf[i] = pack_bf16(sacc[2 * i], sacc[2 * i + 1]);

    /* O += P V: B = V tile, N-major (Hv contiguous); a k-step is 16 keys = 2048 bytes; the 64-column
       blocks of V are BN * 128 bytes apart (LBO). */
    mbar_wait(bar_vf(b0, s), ph);
    pin(o);
    pin(pf);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) wgmma_rs(o, &pf[4 * kk], gmma_desc(svb + kk * 2048, BN * 128, 1024));
    wgmma_commit();
    wgmma_wait0();
    pin(o);
    if (lane == 0) mbar_arrive(bar_ve(b0, s));
  }

  /* Final normalisation: the sink enters the denominator here, once. Empty row: out 0, lse = sink. */
  const int T = p.T, N = p.N;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float sink_term = sink == -INFINITY ? 0.f : ex2(sink_l2 - m_[h]); /* <= 1: m_ >= sink_l2 */
    const float L = l + sink_term;
    const float inv = L > 0.f ? 1.f / L : 0.f;
    const int row = r0 + 8 * h;
    __nv_bfloat16 *orow = p.out + (((size_t)b * T + row) * N + n) * HD + 2 * t;
#pragma unroll
    for (int j = 0; j < HD / 8; ++j)
      *reinterpret_cast<__nv_bfloat162 *>(orow + 8 * j) =
          __floats2bfloat162_rn(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
    if (t == 0) p.lse[((size_t)b * N + n) * T + row] = L > 0.f ? (m_[h] + log2f(L)) * LN2 : sink;
  }
}

template <int HD, bool CAUSAL>
static void launch_t(const Problem &pr) {
  static bool attr_set = false;
  if (!attr_set) {
    CK(cudaFuncSetAttribute(hopper_fwd<HD, CAUSAL>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<HD>()));
    attr_set = true;
  }
  dim3 grid(pr.c.T / BM, pr.c.N, pr.c.B);
  hopper_fwd<HD, CAUSAL><<<grid, THREADS, smem_bytes<HD>()>>>(pr.mq, pr.mk, pr.mv, pr.p);
}

static void launch(const Problem &pr) {
  const Case &c = pr.c;
  if (c.H == 128) c.causal ? launch_t<128, true>(pr) : launch_t<128, false>(pr);
  else c.causal ? launch_t<64, true>(pr) : launch_t<64, false>(pr);
  CK(cudaGetLastError());
}

/* A pipeline bug shows as a hang: wait at most 20 s, then report and exit instead of blocking the run. */

int main() {
  harness_init();
  return run_all("hopper_fwd_01", launch) ? 1 : 0;
}
