/*
 * dev/hopper_fwd_02.cu — experimental variant 02 of the Hopper (sm_90a) forward with sinks: variant 01
 * (TMA + mbarrier ring, producer warpgroup, 2 consumer warpgroups, wgmma SS for Q K^T and RS for P V) plus
 * the two schedules FlashAttention-3 uses to keep the tensor core busy during the softmax:
 * - intra-warpgroup overlap: iteration j issues S_j = Q K_j^T and then O += P_{j-1} V_{j-1} (two commit
 *   groups), waits for S_j only (wait_group 1) and runs the softmax of tile j while P_{j-1} V_{j-1} is still
 *   on the tensor core; O is rescaled after that product lands (wait_group 0). Registers: S 64 + O 64 + P 32.
 * - ping-pong (template flag PINGPONG, timed as "hopper_fwd_02pp"): the two consumer warpgroups take turns
 *   issuing their products through two named barriers, so one warpgroup's softmax runs under the other's
 *   products instead of both fighting for the tensor core at once.
 * The producer, the shared-memory layout, the descriptors and the final normalisation are variant 01's.
 * The PTX wrappers, the reference and the harness live in dev/hopper_common.cuh.
 */
#include "hopper_common.cuh"

/* Named barriers 1 and 2 (0 is __syncthreads): barrier 1 + w is "warpgroup w may issue"; 256 threads =
   the 128 of w that wait (bar.sync) + the 128 of the other warpgroup that hand over the turn (bar.arrive). */
__device__ __forceinline__ void named_bar_sync(int id) { asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory"); }
__device__ __forceinline__ void named_bar_arrive(int id) { asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory"); }

/* S = Q K^T for one warpgroup: H / 16 k-steps, 32 bytes apart inside a 128-byte swizzled row, 4 per block. */
template <int HD>
__device__ __forceinline__ void gemm_qk(float (&sacc)[64], uint32_t sq_wg, uint32_t skb) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk)
    wgmma_ss_n128(sacc, gmma_desc(sq_wg + (kk / 4) * BM * 128 + (kk % 4) * 32, 16, 1024),
                  gmma_desc(skb + (kk / 4) * BN * 128 + (kk % 4) * 32, 16, 1024), kk > 0);
}

/* O += P V: V N-major; a k-step is 16 keys = 2048 bytes; 64-column blocks of V are BN * 128 bytes apart. */
template <int HD>
__device__ __forceinline__ void gemm_pv(float (&o)[HD / 2], const uint32_t (&pf)[32], uint32_t svb) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) wgmma_rs(o, &pf[4 * kk], gmma_desc(svb + kk * 2048, BN * 128, 1024));
}

/* Top-left causal mask of the diagonal tile: key j valid for row i iff j <= i (rows r0, r0 + 8). */
__device__ __forceinline__ void mask_causal(float (&sacc)[64], int key0, int r0) {
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (key0 + 8 * j + e > r0) sacc[4 * j + e] = -INFINITY;
      if (key0 + 8 * j + e > r0 + 8) sacc[4 * j + 2 + e] = -INFINITY;
    }
}

/* Online softmax of one tile, in place (scores -> fp32 probabilities relative to the new running max m_);
   returns in corr the factor that rescales what was accumulated against the old max. */
__device__ __forceinline__ void softmax_tile(float (&sacc)[64], float (&m_)[2], float (&l_)[2], float (&corr)[2],
                                             float sl2) {
  float mx[2] = {-INFINITY, -INFINITY}, base[2];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    mx[0] = fmaxf(mx[0], fmaxf(sacc[4 * j], sacc[4 * j + 1]));
    mx[1] = fmaxf(mx[1], fmaxf(sacc[4 * j + 2], sacc[4 * j + 3]));
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    const float mnew = fmaxf(m_[h], mx[h] * sl2); /* scale > 0: max commutes with scaling */
    base[h] = mnew == -INFINITY ? 0.f : mnew;      /* vanilla, nothing valid yet: keep exp2 finite */
    corr[h] = ex2(m_[h] - base[h]);
    m_[h] = mnew;
    l_[h] *= corr[h]; /* per-thread partial sums; the quad sums at the end */
  }
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      sacc[4 * j + e] = ex2(fmaf(sacc[4 * j + e], sl2, -base[e >> 1]));
      l_[e >> 1] += sacc[4 * j + e];
    }
}

/* P in bf16 as the A operand of m64nHk16: k-step kk = accumulator blocks 2kk, 2kk + 1, whose register order
   (row g, row g + 8, row g cols + 8, row g + 8 cols + 8) is the A fragment order. */
__device__ __forceinline__ void pack_p(uint32_t (&pf)[32], const float (&sacc)[64]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) pf[i] = pack_bf16(sacc[2 * i], sacc[2 * i + 1]);
}

template <int HD, bool CAUSAL, bool PINGPONG>
__global__ void __launch_bounds__(THREADS, 1)
    hopper_fwd(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmk,
               const __grid_constant__ CUtensorMap tmv, const FwdParams p) {
  constexpr int CB = HD / 64; /* 128-byte column blocks per row */
  constexpr uint32_t Q_BYTES = BM * HD * 2, KV_BYTES = BN * HD * 2;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar[1 + 4 * STAGES];
  __shared__ float anchor[4 * NC]; /* see the wait_group 0 of the main loop */

  const uint32_t sq = (smem_u32(smem_raw) + 1023u) & ~1023u; /* swizzle atoms need 1024-byte alignment */
  const uint32_t sk = sq + Q_BYTES, sv = sk + STAGES * KV_BYTES, b0 = smem_u32(bar);

  /* Causal: the heaviest m-blocks (most key tiles) are launched first. */
  const int mb = CAUSAL ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
  const int n = blockIdx.y, b = blockIdx.z, kvh = n / (p.N / p.KH), m0 = mb * BM;
  /* Top-left causal: key tiles past the CTA's last row (m0 + BM - 1) are fully masked and skipped.
     The host guarantees S >= BN, so n_tiles >= 1 (the schedule below counts on one S and one P V at least). */
  const int n_tiles = CAUSAL ? min(p.S / BN, (m0 + BM - 1) / BN + 1) : p.S / BN;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    mbar_init(bar_q(b0), 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bar_kf(b0, s), 1);      /* the producer's arrive.expect_tx, then the TMA bytes */
      mbar_init(bar_vf(b0, s), 1);
      mbar_init(bar_ke(b0, s), 4 * NC); /* one arrive per consumer warp */
      mbar_init(bar_ve(b0, s), 4 * NC);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    /* Producer: 24 registers; 128 x 24 + 256 x 240 = 64512 of the SM's 65536. K before V of each tile: the
       consumers need K_j one step before V_j. */
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
  const int wg_row0 = m0 + 64 * cw;              /* first row of this warpgroup */
  const int r0 = wg_row0 + 16 * warp + lane / 4; /* this thread's rows: r0 and r0 + 8 */
  const float sink = p.softmax == SM_LEARNABLE ? p.sinks[n] : p.softmax == SM_OFF_BY_ONE ? 0.f : -INFINITY;
  const float sink_l2 = sink * LOG2E, sl2 = p.scale_l2;
  const uint32_t sq_wg = sq + cw * 64 * 128; /* this warpgroup's 64 rows of each Q column block */

  /* Ping-pong turns: n_tiles + 1 issue phases per warpgroup (S_0; S_j with P_{j-1} V_{j-1}; the last P V).
     Warpgroup 1 gives warpgroup 0 the first turn and skips handing over after its last phase, so every
     bar.sync meets exactly one bar.arrive and no arrival is left pending at exit. */
  const int my_turn = 1 + cw, other_turn = 2 - cw;
  if (PINGPONG && cw == 1) named_bar_arrive(1);

  /* Accumulator layout of m64nN (per warp 16 rows): d[4j + e]: row lane/4 + 8 * (e >> 1),
     column 8j + 2 * (lane % 4) + (e & 1). */
  float o[HD / 2], sacc[64], corr[2];
  uint32_t pf[32];
  float m_[2] = {sink_l2, sink_l2}, l_[2] = {0.f, 0.f}; /* running max seeded with the sink */
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
  mbar_wait(bar_q(b0), 0);

  /* Tile 0: S_0 alone, then its softmax (O is still 0: nothing to rescale). */
  mbar_wait(bar_kf(b0, 0), 0);
  if (PINGPONG) named_bar_sync(my_turn);
  pin(sacc);
  wgmma_fence();
  gemm_qk<HD>(sacc, sq_wg, sk);
  wgmma_commit();
  if (PINGPONG) named_bar_arrive(other_turn);
  wgmma_wait0();
  pin(sacc);
  if (lane == 0) mbar_arrive(bar_ke(b0, 0));
  if (CAUSAL && BN - 1 > wg_row0) mask_causal(sacc, 2 * t, r0);
  softmax_tile(sacc, m_, l_, corr, sl2);
  pack_p(pf, sacc);

  for (int it = 1; it < n_tiles; ++it) {
    const int s = it % STAGES, sp = (it - 1) % STAGES;
    const uint32_t ph = (it / STAGES) & 1, php = ((it - 1) / STAGES) & 1;
    mbar_wait(bar_kf(b0, s), ph);
    mbar_wait(bar_vf(b0, sp), php);
    if (PINGPONG) named_bar_sync(my_turn);
    pin(sacc);
    pin(o);
    pin(pf);
    wgmma_fence();
    gemm_qk<HD>(sacc, sq_wg, sk + s * KV_BYTES);      /* group 1: S_j */
    wgmma_commit();
    gemm_pv<HD>(o, pf, sv + sp * KV_BYTES);           /* group 2: O += P_{j-1} V_{j-1} */
    wgmma_commit();
    if (PINGPONG) named_bar_arrive(other_turn);
    wgmma_wait1();                                     /* S_j has landed; P V may still run */
    pin(sacc);
    if (lane == 0) mbar_arrive(bar_ke(b0, s));
    if (CAUSAL && it * BN + BN - 1 > wg_row0) mask_causal(sacc, it * BN + 2 * t, r0);
    softmax_tile(sacc, m_, l_, corr, sl2);
    /* ptxas schedules WARPGROUP.DEPBAR (wait_group 0) into the first stall slot after the row-max shuffle,
       i.e. before the 64 exp2s, which then no longer overlap P V (seen in the SASS of nvcc 13.0). A shared
       store of a value that depends on every exp2 (the row sums) is an anchor it does not cross: with it the
       wait lands after the last MUFU.EX2. One 4-byte store per warp per tile, to a word nobody reads. */
    if (lane == 0)
      asm volatile("st.shared.f32 [%0], %1;" ::"r"(smem_u32(&anchor[4 * cw + warp])), "f"(l_[0] + l_[1]) : "memory");
    wgmma_wait0();                                     /* P_{j-1} V_{j-1} has landed: O and pf are free */
    pin(o);
    pin(pf);
    if (lane == 0) mbar_arrive(bar_ve(b0, sp));
#pragma unroll
    for (int j = 0; j < HD / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[4 * j + e] *= corr[e >> 1];
    pack_p(pf, sacc);
  }

  { /* The last P V. */
    const int sp = (n_tiles - 1) % STAGES;
    const uint32_t php = ((n_tiles - 1) / STAGES) & 1;
    mbar_wait(bar_vf(b0, sp), php);
    if (PINGPONG) named_bar_sync(my_turn);
    pin(o);
    pin(pf);
    wgmma_fence();
    gemm_pv<HD>(o, pf, sv + sp * KV_BYTES);
    wgmma_commit();
    if (PINGPONG && cw == 0) named_bar_arrive(other_turn);
    wgmma_wait0();
    pin(o);
    if (lane == 0) mbar_arrive(bar_ve(b0, sp));
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

template <int HD, bool CAUSAL, bool PINGPONG>
static void launch_t(const Problem &pr) {
  static bool attr_set = false;
  if (!attr_set) {
    CK(cudaFuncSetAttribute(hopper_fwd<HD, CAUSAL, PINGPONG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            smem_bytes<HD>()));
    attr_set = true;
  }
  dim3 grid(pr.c.T / BM, pr.c.N, pr.c.B);
  hopper_fwd<HD, CAUSAL, PINGPONG><<<grid, THREADS, smem_bytes<HD>()>>>(pr.mq, pr.mk, pr.mv, pr.p);
}

template <bool PINGPONG>
static void launch(const Problem &pr) {
  const Case &c = pr.c;
  if (c.H == 128) c.causal ? launch_t<128, true, PINGPONG>(pr) : launch_t<128, false, PINGPONG>(pr);
  else c.causal ? launch_t<64, true, PINGPONG>(pr) : launch_t<64, false, PINGPONG>(pr);
  CK(cudaGetLastError());
}

int main() {
  harness_init();
  const int failed = run_all("hopper_fwd_02", launch<false>) + run_all("hopper_fwd_02pp", launch<true>);
  return failed ? 1 : 0;
}
