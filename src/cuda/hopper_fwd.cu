/*
 * hopper_fwd.cu — the sm_90a forward fast path: the kernel of dev/hopper_fwd_02.cu moved into the library,
 * with the tiles of dev/hopper_fwd_03 (H64: 3 consumer warpgroups, 192-row CTAs) and dev/hopper_fwd_04 (H128
 * without a mask: 176-key tiles) where they measured faster (the numbers are at sa_hop_fwd_tile). The PTX
 * wrappers of dev/hopper_common.cuh are in hopper_ptx.cuh, shared with hopper_bwd.cu. On the H200
 * dev/hopper_fwd_02 passed 24/24 checks against an fp32 GPU reference and reached 615 / 552 TFLOP/s (B4 T4096
 * N16 H128, non-causal / causal), against 224 / 189 for the portable mma.sync kernel (cuda_fwd.cu). The
 * ping-pong variant (02pp) was not taken: mixed (+5% / -3% non-causal / causal at H128 T4096, -5% / +1% at
 * T16384, +6% / -5% at H64; bench/results/h200-hopper-dev.json) for two more named barriers whose turn count
 * must stay exact.
 *
 * One CTA = BM = 64 x NC query rows of one (batch, head), 128 x (NC + 1) threads: warpgroup 0 is the producer
 * (one thread issues TMA loads of Q once and of BN-key K, V tiles into a 2-stage mbarrier ring, 128-byte
 * swizzle), consumer warpgroups 1..NC each own 64 rows: S = Q K^T by wgmma (both operands in shared memory),
 * online softmax in registers in the log2 domain, O += P V by wgmma with P from registers. Iteration j issues
 * S_j and P_{j-1} V_{j-1} as two commit groups and runs the softmax of S_j while P_{j-1} V_{j-1} is on the
 * tensor core. T is a multiple of 128, so a 192-row CTA can be partial (T - m0 = 64 or 128): only its
 * warpgroups with rows run (n_wg); the others return at once and no barrier counts them.
 *
 * Scope (sa_hop_in_scope in hopper_ptx.cuh, plus an aligned out; everything else runs the portable kernel):
 * a CC 9.0 device and sm_90a code in the binary, bf16, H == Hv in {64, 128}, T and S multiples of 128 (the
 * buffers; lengths may be anything), no segments, scale > 0 (the row max is taken before scaling), 16-byte
 * aligned tensors; any causal alignment, window and diag_offset (the MASK kernels: only the key tiles some row
 * of the CTA sees are loaded, each warpgroup computes only those some row of its own sees, and only tiles on a
 * mask boundary test positions, by sa_hop_mask), and per-batch lengths (MASK 3: each CTA builds its batch's
 * mask; V rows past kv_len in the last tile are zeroed in shared memory before P V, rows past q_len are written
 * as 0). SINKATTN_CUDA_HOPPER=0 in the environment disables it.
 * Output semantics are the portable kernel's: lse [B, N, T] includes the sink; the sink enters once, in the
 * final normalisation (the running max is seeded with it: bf16 P has fp32's range, so 2^(s - a) for a sink
 * far above the scores stays normal); a row without any key gives out 0, lse = sink (a CTA none of whose rows
 * sees a key loads nothing).
 */
#include "hopper_fwd.cuh"
#include "hopper_ptx.cuh"

namespace {

constexpr int STAGES = sa_hop_tiles::STAGES; /* K/V ring depth: 2 in every configuration */

/* The forward's tile per (head dim, mask kind) (the table of hopper_ptx.cuh points here), measured on the H200 (dev/run_hopper.sh,
   commit 667373e, standalone TFLOP/s, all checks passed; bench/NOTES.md):
   - H64, every mask: 3 consumer warpgroups, BM 192 (dev 03's configuration "03s2", 2 stages). At k = 64 one warpgroup's
     two products (512 tensor clocks per 128-key tile) cost as much as its 8192 exp2 (512 MUFU clocks): with a
     third warpgroup two products cover the third's softmax. B4 T4096 N32 468 non-causal / 410 causal (02's
     128-row tile: 331..407 / 364), B16 T1024 causal 263 (244), gpt-oss B1 T4096 N64/8 causal 386 (346), B1
     T16384 causal 471 (417); cuDNN 398 / 273 / 361-374 on the same rows. Registers: 512 threads, setmaxnreg
     160 / 24 (128 x 24 + 384 x 160 = 64512 of 65536); the consumers need R151 of 160 (ptxas, nvcc 13.0).
   - H128 without a mask: BN 176 (dev 04, FlashAttention-3's 128 x 176): the per-tile costs (shuffles, the
     rescale of O, barrier handshakes, two commit groups) over 1.375x the keys. B4 T4096 N16 630 (02: 611;
     cuDNN 628), B1 T16384 654 (614; issue target >= 600), B2 T8192 607. S is a multiple of 128, not of 176:
     the last tile holds 16..176 keys, TMA zero-fills the rest and the tile masks keys >= S. 210 KiB of 227.
   - H128 with a mask (kinds 1..3): 02's 2 warpgroups x 128 keys (552 causal at B4 T4096). 176 keys were
     measured without a mask only; mask_range and the tile ranges take tiles that divide S, and FlashAttention-3
     also keeps 128 keys for causal / local masks at head dim 128. */
template <int HD, int MASK>
struct sa_hop_fwd_tile {
  static constexpr int NC = HD == 64 ? 3 : 2;                  /* consumer warpgroups */
  static constexpr int BM = 64 * NC;                           /* query rows per CTA */
  static constexpr int BN = HD == 128 && MASK == 0 ? 176 : 128; /* keys per tile */
  static constexpr int THREADS = 128 * (NC + 1);
  static constexpr int REGS = NC == 3 ? 160 : 240;             /* consumer registers after setmaxnreg */
  /* Q's TMA box: one per warpgroup when a CTA can be partial (BM 192), else one BM-row box per column block */
  static constexpr int QBOX = 128 % BM == 0 ? BM : 64;
  static constexpr int SMEM = 1024 /* alignment slack */ + BM * HD * 2 + STAGES * 2 * BN * HD * 2;
  static_assert(128 * 24 + 128 * NC * REGS <= 65536 && REGS % 8 == 0, "register file: producer 24 + consumers");
  static_assert(SMEM + 1024 <= 227 * 1024, "shared memory over the sm_90 limit (+1 KiB of static barriers)");
  static_assert(BN % 16 == 0 && BN <= 256 && (BN * 128) % 1024 == 0, "k16 steps, TMA box, swizzle atoms");
  static_assert(MASK == 0 || 128 % BN == 0, "mask_range reads 128-key tiles; keys >= S only in kind 0");
};

struct sa_hop_params {
  __nv_bfloat16 *out; /* [B, T, N, H] */
  float *lse;         /* [B, N, T] or NULL */
  const float *sinks; /* [N], learnable only */
  int T, S, N, G, softmax;
  float scale_l2;     /* scale * log2(e) > 0 */
  sa_hop_mask mask;   /* causal / window / offset (MASK kernels only) */
  sa_hop_shape shape; /* lengths and the raw mask parameters (MASK 3: each CTA builds its batch's mask) */
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* Barrier slots in bar[]: 0 Q full; then per stage K full, V full, K empty, V empty. */
__device__ __forceinline__ uint32_t bar_q(uint32_t b0) { return b0; }
__device__ __forceinline__ uint32_t bar_kf(uint32_t b0, int s) { return b0 + 8 * (1 + s); }
__device__ __forceinline__ uint32_t bar_vf(uint32_t b0, int s) { return b0 + 8 * (1 + STAGES + s); }
__device__ __forceinline__ uint32_t bar_ke(uint32_t b0, int s) { return b0 + 8 * (1 + 2 * STAGES + s); }
__device__ __forceinline__ uint32_t bar_ve(uint32_t b0, int s) { return b0 + 8 * (1 + 3 * STAGES + s); }

#define SA_F88(d) SA_F64(d), SA_F8(d, 64), SA_F8(d, 72), SA_F8(d, 80)
#define SA_REGS88 SA_REGS64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, " \
                  "%79, %80, %81, %82, %83, %84, %85, %86, %87"

/* D[64x176] (+)= A[64x16] B[16x176], A and B K-major in shared memory; scale_d 0 overwrites D (the 176-key S
   of H128 without a mask: 88 fp32 per thread). */
__device__ __forceinline__ void wgmma_ss_n176(float (&d)[88], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %90, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 {" SA_REGS88 "}, %88, %89, p, 1, 1, 0, 0;\n}\n"
      : SA_F88(d)
      : "l"(da), "l"(db), "r"(scale_d));
}

/* S = Q K^T for one warpgroup: H / 16 k-steps, 32 bytes apart inside a 128-byte swizzled row, 4 per block;
   Q's column blocks are BM x 128 bytes apart, K's BN x 128 (176 rows = 22 swizzle atoms: still 1024-aligned). */
template <int HD, int BM, int BN>
__device__ __forceinline__ void gemm_qk(float (&sacc)[BN / 2], uint32_t sq_wg, uint32_t skb) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    const uint64_t da = gmma_desc(sq_wg + (kk / 4) * BM * 128 + (kk % 4) * 32, 16, 1024);
    const uint64_t db = gmma_desc(skb + (kk / 4) * BN * 128 + (kk % 4) * 32, 16, 1024);
    if constexpr (BN == 176) wgmma_ss_n176(sacc, da, db, kk > 0);
    else wgmma_ss_n128(sacc, da, db, kk > 0);
  }
}

/* O += P V: V N-major; a k-step is 16 keys = 2048 bytes (BN / 16 of them); the 64-column blocks of V are
   BN * 128 bytes apart (the LBO: 16384 at 128 keys, 22528 at 176). */
template <int HD, int BN>
__device__ __forceinline__ void gemm_pv(float (&o)[HD / 2], const uint32_t (&pf)[BN / 4], uint32_t svb) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) wgmma_rs(o, &pf[4 * kk], gmma_desc(svb + kk * 2048, BN * 128, 1024));
}

/* Scores of invisible (key, row) pairs become -inf: visible iff dlo <= key - row <= dhi (sa_hop_mask). With x0
   the key - row of the thread's first element (the tile's first key + 2 * (lane % 4) - r0), element (j, e) of
   row r0 is x0 + c with c = 8j + e (row r0 + 8: c - 8), so it is invisible iff xh = x0 - dhi > -c or (KIND 2)
   xl = x0 - dlo < -c: one compare with an immediate per bound. Only tiles on a mask boundary call it. With
   lengths (KIND 3) the upper bound is per row (sa_hop_row_bounds): xh0 for row r0, xh1 for r0 + 8; without,
   both are the same value. 128-key tiles (the masked kinds' BN). */
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

/* Keys past S in the last 176-key tile (kind 0): TMA filled their K and V rows with zeros, so they would score
   0, not -inf. lim = S - key0 - 2 (lane % 4): column 8j + 2 (lane % 4) + e is a key < S iff 8j + e < lim, one
   compare with an immediate for both rows (r0 and r0 + 8 see the same keys). */
template <int SN>
__device__ __forceinline__ void mask_keys(float (&sacc)[SN], int lim) {
#pragma unroll
  for (int j = 0; j < SN / 4; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      if (8 * j + e >= lim) sacc[4 * j + e] = sacc[4 * j + 2 + e] = -INFINITY;
}

/* Online softmax of one tile, in place (scores -> fp32 probabilities relative to the new running max m_);
   returns in corr the factor that rescales what was accumulated against the old max. SN = BN / 2 scores. */
template <int SN>
__device__ __forceinline__ void softmax_tile(float (&sacc)[SN], float (&m_)[2], float (&l_)[2], float (&corr)[2],
                                             float sl2) {
  float mx[2] = {-INFINITY, -INFINITY}, base[2];
#pragma unroll
  for (int j = 0; j < SN / 4; ++j) {
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
  for (int j = 0; j < SN / 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      sacc[4 * j + e] = ex2(fmaf(sacc[4 * j + e], sl2, -base[e >> 1]));
      l_[e >> 1] += sacc[4 * j + e];
    }
}

/* P in bf16 as the A operand of m64nHk16: k-step kk = accumulator blocks 2kk, 2kk + 1, whose register order
   (row g, row g + 8, row g cols + 8, row g + 8 cols + 8) is the A fragment order. */
template <int SN>
__device__ __forceinline__ void pack_p(uint32_t (&pf)[SN / 2], const float (&sacc)[SN]) {
#pragma unroll
  for (int i = 0; i < SN / 2; ++i) pf[i] = pack_bf16(sacc[2 * i], sacc[2 * i + 1]);
}

#endif /* sm_90a */

template <int HD, int MASK>
__global__ void __launch_bounds__(sa_hop_fwd_tile<HD, MASK>::THREADS, 1)
    sa_hop_fwd_kernel(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmk,
                      const __grid_constant__ CUtensorMap tmv, const sa_hop_params p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using TL = sa_hop_fwd_tile<HD, MASK>;
  constexpr int NC = TL::NC, BM = TL::BM, BN = TL::BN, QBOX = TL::QBOX;
  constexpr int CB = HD / 64; /* 128-byte column blocks per row */
  constexpr uint32_t KV_BYTES = BN * HD * 2;
  /* Keys past S can sit in a tile only when BN does not divide S (176: the last tile; S % 128 == 0). */
  constexpr bool KEY_TAIL = 128 % BN != 0;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar[1 + 4 * STAGES];
  __shared__ float anchor[4 * NC]; /* see the wait_group 0 of the main loop */

  const uint32_t sq = (smem_u32(smem_raw) + 1023u) & ~1023u; /* swizzle atoms need 1024-byte alignment */
  const uint32_t sk = sq + BM * HD * 2, sv = sk + STAGES * KV_BYTES, b0 = smem_u32(bar);

  /* Causal: the heaviest m-blocks (most key tiles) are launched first. */
  const int mb = MASK ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
  const int n = blockIdx.y, b = blockIdx.z, kvh = n / p.G, m0 = mb * BM;
  /* Warpgroups with rows: T - m0 is a positive multiple of 64 (T % 128 == 0), so a warpgroup's 64 rows are all
     below T or all at or past it; at BM 192 the last CTA of a head has 1, 2 or 3 (T / 128 % 3 = 2, 1, 0). */
  const int n_wg = QBOX == BM ? NC : min(NC, (p.T - m0) / 64);
  /* Lengths (MASK 3): batch b is the problem q_len[b] x kv_len[b], with its own mask (bottom-right's diagonal
     moves with the lengths); rows past q_len see no key, keys past kv_len are never loaded but in the tile that
     holds kv_len. */
  sa_hop_mask mk = p.mask;
  int ql = p.T, kl = p.S;
  if (MASK == 3) {
    sa_hop_lens(p.shape, b, p.T, p.S, &ql, &kl);
    mk = sa_hop_mask_make(ql, kl, p.shape.causal, p.shape.wl, p.shape.wr, p.shape.diag);
  }
  /* Key tiles t0 .. t0 + n_tiles - 1: those holding a key some real row of the CTA sees; the rest are fully
     masked and skipped. n_tiles = 0 (no row sees a key, e.g. a negative diag_offset): out 0, lse = sink.
     Without a mask ceil(S / BN) (BN 176: the last holds 16..176 keys). */
  int t0 = 0, n_tiles = (p.S + BN - 1) / BN;
  if (MASK) {
    const int rows = ql - m0 < BM ? ql - m0 : BM; /* <= 64 n_wg (ql <= T) */
    if (rows > 0) t0 = sa_hop_key_tiles(mk, m0, rows, BN, &n_tiles);
    else n_tiles = 0;
  }
  /* The warpgroup, through a shuffle so that ptxas knows it is warp-uniform (as CUTLASS does): the loop
     counters below start at a per-warpgroup tile a and would otherwise live in vector registers, with every
     wgmma descriptor moved to uniform registers per iteration (+21 / +27 loop instructions at H64 / H128). */
  const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);

  if (threadIdx.x == 0) {
    mbar_init(bar_q(b0), 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bar_kf(b0, s), 1);        /* the producer's arrive.expect_tx, then the TMA bytes */
      mbar_init(bar_vf(b0, s), 1);
      mbar_init(bar_ke(b0, s), 4 * n_wg); /* one arrive per warp of a warpgroup with rows */
      mbar_init(bar_ve(b0, s), 4 * n_wg);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    /* Producer: 24 registers. K before V of each tile: the consumers need K_j one step before V_j. Q: only the
       boxes of warpgroups with rows (no box is ever past T). A 176-key box past S: TMA fills the rows past S
       with zeros and counts them in complete_tx, so expect_tx is the whole box. */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (threadIdx.x == 0 && n_tiles > 0) {
      const int q_boxes = QBOX == BM ? 1 : n_wg; /* per column block */
      mbar_arrive_tx(bar_q(b0), q_boxes * CB * QBOX * 128);
      for (int c = 0; c < CB; ++c)
        for (int w = 0; w < q_boxes; ++w)
          tma_load(sq + c * BM * 128 + w * QBOX * 128, &tmq, bar_q(b0), c * 64, n, m0 + w * QBOX, b);
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

  const int cw = wg - 1;
  /* A warpgroup past T: its Q box was not loaded and no barrier counts it; it leaves before setmaxnreg.inc (a
     per-warpgroup instruction). The others' inc needs none of its registers: the producer's dec freed 128 x
     (128 - 24) = 13312, three consumers' inc to 160 take 384 x (160 - 128) = 12288. */
  if (cw >= n_wg) return;
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(TL::REGS) : "memory");
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, t = lane % 4;
  const int wg_row0 = m0 + 64 * cw;              /* first row of this warpgroup; wg_row0 + 63 < T */
  const int r0 = wg_row0 + 16 * warp + lane / 4; /* this thread's rows: r0 and r0 + 8 */
  const float sink = p.softmax == 2 ? p.sinks[n] : p.softmax == 1 ? 0.f : -INFINITY;
  const float sink_l2 = sink * SA_LOG2E, sl2 = p.scale_l2;
  const uint32_t sq_wg = sq + cw * 64 * 128; /* this warpgroup's 64 rows of each Q column block */

  /* Accumulator layout of m64nN (per warp 16 rows): d[4j + e]: row lane/4 + 8 * (e >> 1),
     column 8j + 2 * (lane % 4) + (e & 1). */
  float o[HD / 2], sacc[BN / 2], corr[2];
  uint32_t pf[BN / 4];
  /* Running max seeded with the sink, capped below +inf so a +inf sink leaves exp2(m - m) = 1, not NaN
     (fminf passes a NaN sink's cap on; the NaN returns in the normalisation). */
  const float seed = fminf(sink_l2, 3.0e38f);
  float m_[2] = {seed, seed}, l_[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
  /* A tile of keys [k, k + BN) is visible to every row of the warpgroup iff its smallest key - row, k - wg_row0
     - 63, is >= dlo and its largest, k + BN - 1 - wg_row0, is <= dhi (and, with lengths, it ends by kv_len and
     the warpgroup's rows by q_len): then no per-element test. Without a mask only a 176-key tile past S tests
     (the last one), against kl = S. */
  const int dlo = mk.dlo, dhi = mk.dhi;
  int dhi0 = dhi, dhi1 = dhi, unused;
  if (MASK == 3) {
    sa_hop_row_bounds(mk, ql, kl, r0, &unused, &dhi0);
    sa_hop_row_bounds(mk, ql, kl, r0 + 8, &unused, &dhi1);
  }
  auto mask_tile = [&](int k) {
    if constexpr (MASK == 0) {
      if (KEY_TAIL && k + BN > kl) mask_keys(sacc, kl - k - 2 * t);
    } else if (k - wg_row0 - 63 < dlo || k + BN - 1 - wg_row0 > dhi ||
               (MASK == 3 && (k + BN > kl || wg_row0 + 64 > ql))) {
      mask_range<MASK>(sacc, k + 2 * t - r0 - dhi0, k + 2 * t - r0 - dhi1, k + 2 * t - r0 - dlo);
    }
  };
  /* The last tile with lengths: V rows past kv_len become 0 (a key row past kv_len may hold NaN, and 0 x NaN
     = NaN). Every warpgroup with rows meets here once, whether it reads the tile or releases it unread (see
     release), so barrier 1 counts 128 n_wg threads: never one that returned above. CTA-uniform condition. */
  const int kend = (t0 + n_tiles) * BN;
  auto zero_tail = [&](int s) {
    if (MASK == 3 && kend > kl) {
      zero_tile_rows(sv + s * KV_BYTES, BN, kl - (kend - BN), CB, threadIdx.x - 128, 128 * n_wg);
      named_bar_sync(1, 128 * n_wg);
    }
  };
  /* This warpgroup's tiles: [a, e) of the CTA's 0 .. n_tiles - 1, those holding a key one of its real rows sees
     (sa_hop_key_tiles of its rows; a subset, lo and hi never decrease with the row). A 192-row causal CTA's
     first warpgroups skip its last 1-2 tiles, a windowed one's last warpgroups its first 1-2 (without this
     H64 causal would do 3% (T4096) / 11% (T1024) more tensor work than 128-row CTAs, a (127, 0) window 50%,
     25% if only the last tiles were skipped; with it exactly as much as 128-row CTAs in both).
     The others are released unread, in order, each after its full barrier, so every arrive lands in the phase
     of its own tile (an arrive before the load could complete the previous phase of that stage while another
     warpgroup still reads it). No key for its rows (e.g. all past q_len): a = e = 0, all released. */
  int a = 0, e = n_tiles;
  if (MASK && n_tiles > 0) {
    const int rows = ql - wg_row0 < 64 ? ql - wg_row0 : 64;
    int nw = 0;
    const int tw = rows > 0 ? sa_hop_key_tiles(mk, wg_row0, rows, BN, &nw) : 0;
    a = nw > 0 ? tw - t0 : 0;
    e = nw > 0 ? a + nw : 0;
  }
  auto release = [&](int from, int to) {
    for (int it = from; it < to; ++it) {
      const int s = it % STAGES;
      const uint32_t ph = (it / STAGES) & 1;
      mbar_wait(bar_kf(b0, s), ph);
      if (lane == 0) mbar_arrive(bar_ke(b0, s));
      mbar_wait(bar_vf(b0, s), ph);
      if (it == n_tiles - 1) zero_tail(s);
      if (lane == 0) mbar_arrive(bar_ve(b0, s));
    }
  };
  if (n_tiles > 0) mbar_wait(bar_q(b0), 0); /* every warpgroup: no exit before the Q box has landed */
  if (MASK) release(0, a);

  if (a < e) {
  { /* Tile a: S_a alone, then its softmax (O is still 0: nothing to rescale). */
    const int s = a % STAGES;
    mbar_wait(bar_kf(b0, s), (a / STAGES) & 1);
    pin(sacc);
    wgmma_fence();
    gemm_qk<HD, BM, BN>(sacc, sq_wg, sk + s * KV_BYTES);
    wgmma_commit();
    wgmma_wait0();
    pin(sacc);
    if (lane == 0) mbar_arrive(bar_ke(b0, s));
    mask_tile((t0 + a) * BN);
    softmax_tile(sacc, m_, l_, corr, sl2);
    pack_p(pf, sacc);
  }

  for (int it = a + 1; it < e; ++it) {
    const int s = it % STAGES, sp = (it - 1) % STAGES;
    const uint32_t ph = (it / STAGES) & 1, php = ((it - 1) / STAGES) & 1;
    mbar_wait(bar_kf(b0, s), ph);
    mbar_wait(bar_vf(b0, sp), php);
    pin(sacc);
    pin(o);
    pin(pf);
    wgmma_fence();
    gemm_qk<HD, BM, BN>(sacc, sq_wg, sk + s * KV_BYTES); /* group 1: S_j */
    wgmma_commit();
    gemm_pv<HD, BN>(o, pf, sv + sp * KV_BYTES);         /* group 2: O += P_{j-1} V_{j-1} */
    wgmma_commit();
    wgmma_wait1();                                       /* S_j has landed; P V may still run */
    pin(sacc);
    if (lane == 0) mbar_arrive(bar_ke(b0, s));
    mask_tile((t0 + it) * BN);
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
      for (int x = 0; x < 4; ++x) o[4 * j + x] *= corr[x >> 1];
    pack_p(pf, sacc);
  }

  { /* The last P V (of tile e - 1; with lengths the CTA's last tile is zeroed past kv_len first). */
    const int sp = (e - 1) % STAGES;
    mbar_wait(bar_vf(b0, sp), ((e - 1) / STAGES) & 1);
    if (e == n_tiles) zero_tail(sp);
    pin(o);
    pin(pf);
    wgmma_fence();
    gemm_pv<HD, BN>(o, pf, sv + sp * KV_BYTES);
    wgmma_commit();
    wgmma_wait0();
    pin(o);
    if (lane == 0) mbar_arrive(bar_ve(b0, sp));
  }
  } /* a < e */
  if (MASK) release(e, n_tiles);

  /* Final normalisation, the one place the sink enters, in the portable kernel's form: the larger of the
     running max m and the sink a contributes 2^0 = 1 exactly, and lse is formed from it in the natural-log
     domain (a dominant sink gives lse = a exactly, +inf included). m >= the seed, so a >= m means a is the
     max. No valid key and no sink (m = -inf): out 0, lse = sink. Every row stored here is below T. */
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

/* The maps take the configuration's boxes (Q: QBOX rows, K / V: BN rows). A map the driver refuses, or a
   refused shared-memory opt-in (up to 210 KiB at H 128), leaves *used = 0: the portable kernel runs instead. */
template <int HD, int MASK>
cudaError_t sa_hop_run(PFN_cuTensorMapEncodeTiled_v12000 enc, const sa_cuda_params &p, const sa_hop_params &hp,
                       cudaStream_t st, int *used) {
  using TL = sa_hop_fwd_tile<HD, MASK>;
  CUtensorMap mq, mk, mv;
  if (!sa_hop_map(enc, &mq, p.q, p.B, p.T, p.N, p.H, TL::QBOX) ||
      !sa_hop_map(enc, &mk, p.k, p.B, p.S, p.K, p.H, TL::BN) || !sa_hop_map(enc, &mv, p.v, p.B, p.S, p.K, p.Hv, TL::BN))
    return cudaSuccess;
  if (cudaFuncSetAttribute(sa_hop_fwd_kernel<HD, MASK>, cudaFuncAttributeMaxDynamicSharedMemorySize, TL::SMEM) !=
      cudaSuccess) {
    cudaGetLastError();
    return cudaSuccess;
  }
  *used = 1;
  dim3 grid((unsigned)((hp.T + TL::BM - 1) / TL::BM), (unsigned)hp.N, (unsigned)p.B); /* BM 192: last CTA partial */
  sa_hop_fwd_kernel<HD, MASK><<<grid, TL::THREADS, TL::SMEM, st>>>(mq, mk, mv, hp);
  return cudaGetLastError();
}

} /* namespace */

cudaError_t sa_hopper_fwd_try(const sa_cuda_params &p, int bf16, cudaStream_t st, int *used) {
  *used = 0;
  if (!sa_hop_in_scope(p, bf16) || !sa_hop_aligned(p.out)) return cudaSuccess;
  static const PFN_cuTensorMapEncodeTiled_v12000 enc = sa_hop_encode_fn(); /* thread-safe static init */
  if (!enc) return cudaSuccess;
  sa_hop_params hp;
  hp.out = (__nv_bfloat16 *)p.out;
  hp.lse = p.lse;
  hp.sinks = p.sinks;
  hp.T = (int)p.T; hp.S = (int)p.S; hp.N = (int)p.N; hp.G = (int)p.G; hp.softmax = p.softmax;
  hp.scale_l2 = p.scale_log2;
  hp.mask = sa_hop_mask_of(p);
  hp.shape = sa_hop_shape_of(p);
  switch (sa_hop_mask_kind(p) + 4 * (p.H == 128)) {
    case 0: return sa_hop_run<64, 0>(enc, p, hp, st, used);
    case 1: return sa_hop_run<64, 1>(enc, p, hp, st, used);
    case 2: return sa_hop_run<64, 2>(enc, p, hp, st, used);
    case 3: return sa_hop_run<64, 3>(enc, p, hp, st, used);
    case 4: return sa_hop_run<128, 0>(enc, p, hp, st, used);
    case 5: return sa_hop_run<128, 1>(enc, p, hp, st, used);
    case 6: return sa_hop_run<128, 2>(enc, p, hp, st, used);
    default: return sa_hop_run<128, 3>(enc, p, hp, st, used);
  }
}
