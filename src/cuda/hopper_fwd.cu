/*
 * hopper_fwd.cu — the sm_90a forward fast path: the kernel of dev/hopper_fwd_02.cu, moved into the library
 * (the PTX wrappers of dev/hopper_common.cuh are in hopper_ptx.cuh, shared with hopper_bwd.cu). On the H200
 * dev/hopper_fwd_02 passed 24/24 checks against an fp32 GPU reference and reached 615 / 552 TFLOP/s (B4 T4096
 * N16 H128, non-causal / causal) and 331 / 360 (H64), against 224 / 189 for the portable mma.sync kernel
 * (cuda_fwd.cu) at H128. The ping-pong variant (02pp) was not taken: mixed (+5% / -3% non-causal / causal at
 * H128 T4096, -5% / +1% at T16384, +6% / -5% at H64; bench/results/h200-hopper-dev.json) for two more named
 * barriers whose turn count must stay exact.
 *
 * One CTA = 128 query rows of one (batch, head), 384 threads: warpgroup 0 is the producer (one thread issues
 * TMA loads of Q once and of 128-key K, V tiles into a 2-stage mbarrier ring, 128-byte swizzle), warpgroups
 * 1 and 2 each own 64 rows: S = Q K^T by wgmma (both operands in shared memory), online softmax in registers
 * in the log2 domain, O += P V by wgmma with P from registers. Iteration j issues S_j and P_{j-1} V_{j-1} as
 * two commit groups and runs the softmax of S_j while P_{j-1} V_{j-1} is on the tensor core.
 *
 * Scope (sa_hop_in_scope in hopper_ptx.cuh, plus an aligned out; everything else runs the portable kernel):
 * a CC 9.0 device and sm_90a code in the binary, bf16, H == Hv in {64, 128}, T and S multiples of 128 (the
 * buffers; lengths may be anything), no segments, scale > 0 (the row max is taken before scaling), 16-byte
 * aligned tensors; any causal alignment, window and diag_offset (the MASK kernels: only the key tiles some row
 * of the CTA sees are loaded, and only tiles on a mask boundary test positions, by sa_hop_mask), and per-batch
 * lengths (MASK 3: each CTA builds its batch's mask; V rows past kv_len in the last tile are zeroed in shared
 * memory before P V, rows past q_len are written as 0). SINKATTN_CUDA_HOPPER=0 in the environment disables it.
 * Output semantics are the portable kernel's: lse [B, N, T] includes the sink; the sink enters once, in the
 * final normalisation (the running max is seeded with it: bf16 P has fp32's range, so 2^(s - a) for a sink
 * far above the scores stays normal); a row without any key gives out 0, lse = sink (a CTA none of whose rows
 * sees a key loads nothing).
 */
#include "hopper_fwd.cuh"
#include "hopper_ptx.cuh"

namespace {

/* from the tile table (hopper_ptx.cuh), where the reasons are */
constexpr int BM = sa_hop_tiles::FWD_BM;         /* query rows per CTA: 2 consumer warpgroups x 64 */
constexpr int BN = sa_hop_tiles::FWD_BN;         /* keys per tile: m64n128 for S, 8 k-steps for P V */
constexpr int STAGES = sa_hop_tiles::STAGES;     /* K/V ring depth */
constexpr int NC = sa_hop_tiles::NC;             /* consumer warpgroups */
constexpr int THREADS = 128 * (NC + 1);       /* = sa_hop_tiles::THREADS */

struct sa_hop_params {
  __nv_bfloat16 *out; /* [B, T, N, H] */
  float *lse;         /* [B, N, T] or NULL */
  const float *sinks; /* [N], learnable only */
  int T, S, N, G, softmax;
  float scale_l2;   /* scale * log2(e) > 0 */
  sa_hop_mask mask;   /* causal / window / offset (MASK kernels only) */
  sa_hop_shape shape; /* lengths and the raw mask parameters (MASK 3: each CTA builds its batch's mask) */
};

template <int HD>
constexpr int sa_hop_smem() { return 1024 /* alignment slack */ + BM * HD * 2 + STAGES * 2 * BN * HD * 2; }
static_assert(sa_hop_smem<128>() + 1024 <= 227 * 1024, "shared memory over the sm_90 limit");
static_assert(128 % BM == 0 && 128 % BN == 0, "sa_hop_in_scope admits T and S that are multiples of 128");

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* Barrier slots in bar[]: 0 Q full; then per stage K full, V full, K empty, V empty. */
__device__ __forceinline__ uint32_t bar_q(uint32_t b0) { return b0; }
__device__ __forceinline__ uint32_t bar_kf(uint32_t b0, int s) { return b0 + 8 * (1 + s); }
__device__ __forceinline__ uint32_t bar_vf(uint32_t b0, int s) { return b0 + 8 * (1 + STAGES + s); }
__device__ __forceinline__ uint32_t bar_ke(uint32_t b0, int s) { return b0 + 8 * (1 + 2 * STAGES + s); }
__device__ __forceinline__ uint32_t bar_ve(uint32_t b0, int s) { return b0 + 8 * (1 + 3 * STAGES + s); }

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

/* Scores of invisible (key, row) pairs become -inf: visible iff dlo <= key - row <= dhi (sa_hop_mask). With x0
   the key - row of the thread's first element (the tile's first key + 2 * (lane % 4) - r0), element (j, e) of
   row r0 is x0 + c with c = 8j + e (row r0 + 8: c - 8), so it is invisible iff xh = x0 - dhi > -c or (KIND 2)
   xl = x0 - dlo < -c: one compare with an immediate per bound. Only tiles on a mask boundary call it. With
   lengths (KIND 3) the upper bound is per row (sa_hop_row_bounds): xh0 for row r0, xh1 for r0 + 8; without,
   both are the same value. */
template <int KIND>
__device__ __forceinline__ void mask_range(float (&sacc)[64], int xh0, int xh1, int xl) {
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int c = 8 * j + e;
      if (xh0 > -c || (KIND >= 2 && xl < -c)) sacc[4 * j + e] = -INFINITY;
      if (xh1 > 8 - c || (KIND >= 2 && xl < 8 - c)) sacc[4 * j + 2 + e] = -INFINITY;
    }
}

/* Rows [r_from, rows) of a [rows x 64-column block] bf16 tile, CB blocks (128-byte swizzled rows: the swizzle
   permutes 16-byte chunks inside a row, so a whole row is bytes [r * 128, r * 128 + 128) whatever it does),
   set to zero by `nthr` threads, then made visible to the async proxy (wgmma, the next TMA). The caller syncs
   the threads that read the tile. Lengths: a key row past kv_len may hold anything (NaN included), and
   0 x NaN = NaN in a product even where P = 0. */
__device__ __forceinline__ void zero_rows(uint32_t tile, int rows, int r_from, int cb, int tid, int nthr) {
  const int chunks = (rows - r_from) * 8; /* 16-byte chunks per column block */
  for (int c = 0; c < cb; ++c)
    for (int x = tid; x < chunks; x += nthr)
      asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};" ::"r"(tile + c * rows * 128 + r_from * 128 + 16 * x),
                   "r"(0) : "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
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

#endif /* sm_90a */

template <int HD, int MASK>
__global__ void __launch_bounds__(THREADS, 1)
    sa_hop_fwd_kernel(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmk,
                      const __grid_constant__ CUtensorMap tmv, const sa_hop_params p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int CB = HD / 64; /* 128-byte column blocks per row */
  constexpr uint32_t Q_BYTES = BM * HD * 2, KV_BYTES = BN * HD * 2;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar[1 + 4 * STAGES];
  __shared__ float anchor[4 * NC]; /* see the wait_group 0 of the main loop */

  const uint32_t sq = (smem_u32(smem_raw) + 1023u) & ~1023u; /* swizzle atoms need 1024-byte alignment */
  const uint32_t sk = sq + Q_BYTES, sv = sk + STAGES * KV_BYTES, b0 = smem_u32(bar);

  /* Causal: the heaviest m-blocks (most key tiles) are launched first. */
  const int mb = MASK ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
  const int n = blockIdx.y, b = blockIdx.z, kvh = n / p.G, m0 = mb * BM;
  /* Lengths (MASK 3): batch b is the problem q_len[b] x kv_len[b], with its own mask (bottom-right's diagonal
     moves with the lengths); rows past q_len see no key, keys past kv_len are never loaded but in the tile that
     holds kv_len. */
  sa_hop_mask mk = p.mask;
  int ql = p.T, kl = p.S;
  if (MASK == 3) {
    sa_hop_lens(p.shape, b, p.T, p.S, &ql, &kl);
    mk = sa_hop_mask_make(ql, kl, p.shape.causal, p.shape.wl, p.shape.wr, p.shape.diag);
  }
  /* Key tiles t0 .. t0 + n_tiles - 1: those holding a key some row of [m0, m0 + BM) sees; the rest are fully
     masked and skipped. n_tiles = 0 (no row sees a key, e.g. a negative diag_offset): out 0, lse = sink. */
  int t0 = 0, n_tiles = p.S / BN;
  if (MASK) {
    const int rows = ql - m0 < BM ? ql - m0 : BM; /* BM without lengths */
    if (rows > 0) t0 = sa_hop_key_tiles(mk, m0, rows, BN, &n_tiles);
    else n_tiles = 0;
  }
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
    if (threadIdx.x == 0 && n_tiles > 0) {
      mbar_arrive_tx(bar_q(b0), Q_BYTES);
      for (int c = 0; c < CB; ++c) tma_load(sq + c * BM * 128, &tmq, bar_q(b0), c * 64, n, m0, b);
      for (int it = 0; it < n_tiles; ++it) {
        const int s = it % STAGES;
        const uint32_t ph = (it / STAGES) & 1;
        mbar_wait(bar_ke(b0, s), ph ^ 1);
        mbar_arrive_tx(bar_kf(b0, s), KV_BYTES);
        for (int c = 0; c < CB; ++c)
          tma_load(sk + s * KV_BYTES + c * BN * 128, &tmk, bar_kf(b0, s), c * 64, kvh, (t0 + it) * BN, b);
        mbar_wait(bar_ve(b0, s), ph ^ 1);
        mbar_arrive_tx(bar_vf(b0, s), KV_BYTES);
        for (int c = 0; c < CB; ++c)
          tma_load(sv + s * KV_BYTES + c * BN * 128, &tmv, bar_vf(b0, s), c * 64, kvh, (t0 + it) * BN, b);
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  const int cw = wg - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, t = lane % 4;
  const int wg_row0 = m0 + 64 * cw;              /* first row of this warpgroup */
  const int r0 = wg_row0 + 16 * warp + lane / 4; /* this thread's rows: r0 and r0 + 8 */
  const float sink = p.softmax == 2 ? p.sinks[n] : p.softmax == 1 ? 0.f : -INFINITY;
  const float sink_l2 = sink * SA_LOG2E, sl2 = p.scale_l2;
  const uint32_t sq_wg = sq + cw * 64 * 128; /* this warpgroup's 64 rows of each Q column block */

  /* Accumulator layout of m64nN (per warp 16 rows): d[4j + e]: row lane/4 + 8 * (e >> 1),
     column 8j + 2 * (lane % 4) + (e & 1). */
  float o[HD / 2], sacc[64], corr[2];
  uint32_t pf[32];
  /* Running max seeded with the sink, capped below +inf so a +inf sink leaves exp2(m - m) = 1, not NaN
     (fminf passes a NaN sink's cap on; the NaN returns in the normalisation). */
  const float seed = fminf(sink_l2, 3.0e38f);
  float m_[2] = {seed, seed}, l_[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
  /* A tile of keys [k, k + BN) is visible to every row of the warpgroup iff its smallest key - row, k - wg_row0
     - 63, is >= dlo and its largest, k + BN - 1 - wg_row0, is <= dhi (and, with lengths, it ends by kv_len and
     the warpgroup's rows by q_len): then no per-element test. */
  const int dlo = mk.dlo, dhi = mk.dhi;
  int dhi0 = dhi, dhi1 = dhi, unused;
  if (MASK == 3) {
    sa_hop_row_bounds(mk, ql, kl, r0, &unused, &dhi0);
    sa_hop_row_bounds(mk, ql, kl, r0 + 8, &unused, &dhi1);
  }
  auto boundary = [&](int k) {
    return k - wg_row0 - 63 < dlo || k + BN - 1 - wg_row0 > dhi || (MASK == 3 && (k + BN > kl || wg_row0 + 64 > ql));
  };
  if (n_tiles > 0) {
  mbar_wait(bar_q(b0), 0);

  /* Tile 0: S_0 alone, then its softmax (O is still 0: nothing to rescale). */
  mbar_wait(bar_kf(b0, 0), 0);
  pin(sacc);
  wgmma_fence();
  gemm_qk<HD>(sacc, sq_wg, sk);
  wgmma_commit();
  wgmma_wait0();
  pin(sacc);
  if (lane == 0) mbar_arrive(bar_ke(b0, 0));
  if (MASK && boundary(t0 * BN))
    mask_range<MASK>(sacc, t0 * BN + 2 * t - r0 - dhi0, t0 * BN + 2 * t - r0 - dhi1, t0 * BN + 2 * t - r0 - dlo);
  softmax_tile(sacc, m_, l_, corr, sl2);
  pack_p(pf, sacc);

  for (int it = 1; it < n_tiles; ++it) {
    const int s = it % STAGES, sp = (it - 1) % STAGES;
    const uint32_t ph = (it / STAGES) & 1, php = ((it - 1) / STAGES) & 1;
    mbar_wait(bar_kf(b0, s), ph);
    mbar_wait(bar_vf(b0, sp), php);
    pin(sacc);
    pin(o);
    pin(pf);
    wgmma_fence();
    gemm_qk<HD>(sacc, sq_wg, sk + s * KV_BYTES); /* group 1: S_j */
    wgmma_commit();
    gemm_pv<HD>(o, pf, sv + sp * KV_BYTES);      /* group 2: O += P_{j-1} V_{j-1} */
    wgmma_commit();
    wgmma_wait1();                                /* S_j has landed; P V may still run */
    pin(sacc);
    if (lane == 0) mbar_arrive(bar_ke(b0, s));
    const int key0 = (t0 + it) * BN;
    if (MASK && boundary(key0))
      mask_range<MASK>(sacc, key0 + 2 * t - r0 - dhi0, key0 + 2 * t - r0 - dhi1, key0 + 2 * t - r0 - dlo);
    softmax_tile(sacc, m_, l_, corr, sl2);
    /* ptxas schedules WARPGROUP.DEPBAR (wait_group 0) into the first stall slot after the row-max shuffle,
       i.e. before the 64 exp2s, which then no longer overlap P V (seen in the SASS of nvcc 13.0). A shared
       store of a value that depends on every exp2 (the row sums) is an anchor it does not cross: with it the
       wait lands after the last MUFU.EX2. One 4-byte store per warp per tile, to a word nobody reads. */
    if (lane == 0)
      asm volatile("st.shared.f32 [%0], %1;" ::"r"(smem_u32(&anchor[4 * cw + warp])), "f"(l_[0] + l_[1])
                   : "memory");
    wgmma_wait0(); /* P_{j-1} V_{j-1} has landed: O and pf are free */
    pin(o);
    pin(pf);
    if (lane == 0) mbar_arrive(bar_ve(b0, sp));
#pragma unroll
    for (int j = 0; j < HD / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[4 * j + e] *= corr[e >> 1];
    pack_p(pf, sacc);
  }

  { /* The last P V. With lengths the last tile is the only one that can hold keys past kv_len: their V rows
       become 0 first (both warpgroups read the whole tile: they zero half each, then meet at barrier 1). */
    const int sp = (n_tiles - 1) % STAGES;
    const uint32_t php = ((n_tiles - 1) / STAGES) & 1;
    mbar_wait(bar_vf(b0, sp), php);
    const int kend = (t0 + n_tiles) * BN; /* CTA-uniform */
    if (MASK == 3 && kend > kl) {
      zero_rows(sv + sp * KV_BYTES, BN, kl - (kend - BN), CB, threadIdx.x - 128, 128 * NC);
      asm volatile("bar.sync 1, %0;" ::"n"(128 * NC) : "memory");
    }
    pin(o);
    pin(pf);
    wgmma_fence();
    gemm_pv<HD>(o, pf, sv + sp * KV_BYTES);
    wgmma_commit();
    wgmma_wait0();
    pin(o);
    if (lane == 0) mbar_arrive(bar_ve(b0, sp));
  }
  } /* n_tiles > 0 */

  /* Final normalisation, the one place the sink enters, in the portable kernel's form: the larger of the
     running max m and the sink a contributes 2^0 = 1 exactly, and lse is formed from it in the natural-log
     domain (a dominant sink gives lse = a exactly, +inf included). m >= the seed, so a >= m means a is the
     max. No valid key and no sink (m = -inf): out 0, lse = sink. */
  const int T = p.T, N = p.N;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float mm = m_[h];
    float f = 0.f, lse = sink;
    if (mm != -INFINITY) {
      const bool sink_max = sink_l2 >= mm;
      const float w = sink_max ? ex2(mm - sink_l2) : 1.f;
      const float ltot = l * w + (sink_max ? 1.f : ex2(sink_l2 - mm));
      f = w / ltot;
      lse = (sink_max ? sink : mm * SA_LN2) + logf(ltot);
    }
    const int row = r0 + 8 * h;
    /* A row past q_len is exactly 0 (its Q row, padding, may hold NaN; P is 0 there, but not 0 x NaN). */
    const bool dead = MASK == 3 && row >= ql;
    __nv_bfloat16 *orow = p.out + (((size_t)b * T + row) * N + n) * HD + 2 * t;
#pragma unroll
    for (int j = 0; j < HD / 8; ++j)
      *reinterpret_cast<__nv_bfloat162 *>(orow + 8 * j) = dead ? __floats2bfloat162_rn(0.f, 0.f)
                                                               : __floats2bfloat162_rn(o[4 * j + 2 * h] * f,
                                                                                       o[4 * j + 2 * h + 1] * f);
    if (p.lse && t == 0) p.lse[((size_t)b * N + n) * T + row] = lse;
  }
#endif /* sm_90a */
}

/* ---- host ------------------------------------------------------------------------------------------- */

/* A refused shared-memory opt-in (164 KiB at H 128) leaves *used = 0: the portable kernel runs instead. */
template <int HD, int MASK>
cudaError_t sa_hop_run(const CUtensorMap &mq, const CUtensorMap &mk, const CUtensorMap &mv,
                       const sa_hop_params &hp, int64_t B, cudaStream_t st, int *used) {
  if (cudaFuncSetAttribute(sa_hop_fwd_kernel<HD, MASK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           sa_hop_smem<HD>()) != cudaSuccess) {
    cudaGetLastError();
    return cudaSuccess;
  }
  *used = 1;
  dim3 grid((unsigned)(hp.T / BM), (unsigned)hp.N, (unsigned)B);
  sa_hop_fwd_kernel<HD, MASK><<<grid, THREADS, sa_hop_smem<HD>(), st>>>(mq, mk, mv, hp);
  return cudaGetLastError();
}

} /* namespace */

cudaError_t sa_hopper_fwd_try(const sa_cuda_params &p, int bf16, cudaStream_t st, int *used) {
  *used = 0;
  if (!sa_hop_in_scope(p, bf16) || !sa_hop_aligned(p.out)) return cudaSuccess;
  static const PFN_cuTensorMapEncodeTiled_v12000 enc = sa_hop_encode_fn(); /* thread-safe static init */
  if (!enc) return cudaSuccess;
  CUtensorMap mq, mk, mv;
  if (!sa_hop_map(enc, &mq, p.q, p.B, p.T, p.N, p.H, BM) || !sa_hop_map(enc, &mk, p.k, p.B, p.S, p.K, p.H, BN) ||
      !sa_hop_map(enc, &mv, p.v, p.B, p.S, p.K, p.Hv, BN))
    return cudaSuccess; /* the driver refused a map: the portable kernel runs instead */
  sa_hop_params hp;
  hp.out = (__nv_bfloat16 *)p.out;
  hp.lse = p.lse;
  hp.sinks = p.sinks;
  hp.T = (int)p.T; hp.S = (int)p.S; hp.N = (int)p.N; hp.G = (int)p.G; hp.softmax = p.softmax;
  hp.scale_l2 = p.scale_log2;
  hp.mask = sa_hop_mask_of(p);
  hp.shape = sa_hop_shape_of(p);
  switch (sa_hop_mask_kind(p) + 4 * (p.H == 128)) {
    case 0: return sa_hop_run<64, 0>(mq, mk, mv, hp, p.B, st, used);
    case 1: return sa_hop_run<64, 1>(mq, mk, mv, hp, p.B, st, used);
    case 2: return sa_hop_run<64, 2>(mq, mk, mv, hp, p.B, st, used);
    case 3: return sa_hop_run<64, 3>(mq, mk, mv, hp, p.B, st, used);
    case 4: return sa_hop_run<128, 0>(mq, mk, mv, hp, p.B, st, used);
    case 5: return sa_hop_run<128, 1>(mq, mk, mv, hp, p.B, st, used);
    case 6: return sa_hop_run<128, 2>(mq, mk, mv, hp, p.B, st, used);
    default: return sa_hop_run<128, 3>(mq, mk, mv, hp, p.B, st, used);
  }
}
