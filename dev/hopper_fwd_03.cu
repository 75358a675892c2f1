/*
 * dev/hopper_fwd_03.cu — experimental variant 03 of the Hopper (sm_90a) forward with sinks, head dim 64 only:
 * variant 02's kernel (producer warpgroup + TMA / mbarrier ring, S = Q K^T by wgmma SS, O += P V by wgmma RS
 * with P from registers, the softmax of S_j under P_{j-1} V_{j-1}) with THREE consumer warpgroups: one CTA =
 * 192 query rows of one (batch, head), 512 threads.
 *
 * Why: at H64 the Q K^T product has k = 64, so one warpgroup's 64 x 128 tile is 2 x 0.52 M MAC = 512 clocks of
 * the SM's tensor core at its 2048 MAC/clk peak against 8192 exp2 = 512 clocks of its MUFU (16/clk): the
 * softmax costs as much as the two products, and 02 at H64 ran at 331-360 TFLOP/s (01, without any overlap
 * inside a warpgroup: 371), 0.86-0.89x cuDNN, about what tensor time + MUFU time in series gives. With three
 * consumer warpgroups each SM sub-partition holds three consumer warps (one per warpgroup), so two
 * warpgroups' products can cover the third's softmax (FlashAttention-3's tile at head dim 64).
 *
 * Tiles (numbers for H64, bf16):
 * - BM 192 = 3 consumer warpgroups x 64 rows (the wgmma M). Registers: 512 threads x 128 = 65536 at launch;
 *   setmaxnreg 24 for the producer leaves (65536 - 128 x 24) / 384 = 162 per consumer thread -> 160 (a multiple
 *   of 8): 128 x 24 + 384 x 160 = 64512. The consumer's live set: S 64 + O 32 + P 32 (packed) + softmax state;
 *   02 needed R151 for it at H64, so 160 fits (ptxas: no spills, see bench/NOTES.md).
 * - BN 128 keys. BN 192 would fit shared memory (Q 24 KiB + 2 stages x (K + V) 2 x 24 KiB = 120 KiB, 3 stages
 *   168 KiB, of 227) but not registers: S m64n192 is 96 fp32 + P_{j-1} 48 + O 32 = 176 > 160 while the
 *   overlap keeps S_j and P_{j-1} alive together; and 192 does not divide S (multiples of 128), so every
 *   last tile would need a key mask.
 * - STAGES 3 (K/V ring). A K or V tile is 128 x 64 x 2 = 16 KiB: 2 stages = 1 + 24 + 64 = 89 KiB, 3 stages
 *   121 KiB; registers already hold the SM to one CTA (512 x 128 = 65536), so the third stage costs nothing.
 *   It pays because V_j is released one iteration late (P_j V_j runs in iteration j + 1): with 2 stages the
 *   producer's V_{j+2}, and K_{j+3} queued behind it, wait for the end of iteration j + 1, so K_{j+3} lands
 *   with about one iteration of lead, ~2 us here (6.3 MFLOP per CTA tile at ~400 TFLOP/s over 132 SMs), not
 *   far above a TMA's latency from L2 (~1 us) when all 132 SMs stream at once. 3 stages doubles the lead.
 *   Both are timed ("hopper_fwd_03" 3 stages, "hopper_fwd_03s2" 2 stages).
 * - Q: three 64-row TMA boxes (one per warpgroup) instead of one 192-row box: T is a multiple of 128, not of
 *   192, so the last CTA of a head may own only 64 or 128 rows (T = 640: 576 + 64; T = 4096: 21 x 192 + 64).
 *   Its warpgroups past T (n_wg below) load nothing, compute nothing and store nothing: the producer loads
 *   n_wg boxes (expect_tx n_wg x 8 KiB), the empty barriers count 4 x n_wg warps, the idle warpgroups return
 *   at once. No box is ever out of bounds. A causal CTA's key range comes from its last real row, and each
 *   warpgroup computes only the tiles its own rows see (n_mine; the CTA's last one or two tiles can be wholly
 *   masked for its first warpgroups, which release them unread).
 * Timed in the same program, same shapes: "hopper_fwd_03nc2", this kernel with 2 consumer warpgroups and 2
 * stages, i.e. 02's kernel at H64 (setmaxnreg 240), as the same-run baseline.
 *
 * Semantics are 02's: log2-domain online softmax, running max seeded with the sink; the sink enters the
 * denominator once, in the final normalisation, written in the library's form (src/cuda/hopper_fwd.cu: a +inf
 * sink gives out 0, lse +inf; equal to 02's for finite sinks); lse [B, N, T] includes the sink; a row without
 * keys: out 0, lse = sink. Causal is top-left (key j visible to row i iff j <= i); GQA: kv head = n / (N / K).
 * Scope: bf16, H = Hv = 64, T and S multiples of 128. The PTX wrappers, the reference and the harness (check,
 * bench) are dev/hopper_common.cuh's; its "by_row_warp" diagnostics count 16-row slots of 128-row blocks, so
 * for this kernel a row's warpgroup is (i % 192) / 64 and its warp (i % 64) / 16 (read them off "first").
 */
#include "hopper_common.cuh"

namespace v03 { /* 02's names (BM, NC, STAGES, bar_kf, gemm_qk, ...) shadow hopper_common.cuh's 128-row ones */

constexpr int HD = 64;     /* head dim: the only one this variant takes */
constexpr int CB = HD / 64; /* 128-byte column blocks per row: 1 */

/* Barrier slots in bar[]: 0 Q full; then per stage s: 1 + 4s K full, 2 + 4s V full, 3 + 4s K empty, 4 + 4s
   V empty (interleaved, unlike 02, so the helpers do not depend on STAGES, a template parameter here). */
__device__ __forceinline__ uint32_t bar_q(uint32_t b0) { return b0; }
__device__ __forceinline__ uint32_t bar_kf(uint32_t b0, int s) { return b0 + 8 * (1 + 4 * s); }
__device__ __forceinline__ uint32_t bar_vf(uint32_t b0, int s) { return b0 + 8 * (2 + 4 * s); }
__device__ __forceinline__ uint32_t bar_ke(uint32_t b0, int s) { return b0 + 8 * (3 + 4 * s); }
__device__ __forceinline__ uint32_t bar_ve(uint32_t b0, int s) { return b0 + 8 * (4 + 4 * s); }

/* S = Q K^T for one warpgroup: 4 k-steps of 16 columns, 32 bytes apart inside the 128-byte swizzled row. sq_wg
   is the warpgroup's own 64-row Q box (8 KiB, 1024-aligned), so the descriptors are 02's at H64. */
__device__ __forceinline__ void gemm_qk(float (&sacc)[64], uint32_t sq_wg, uint32_t skb) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk)
    wgmma_ss_n128(sacc, gmma_desc(sq_wg + kk * 32, 16, 1024), gmma_desc(skb + kk * 32, 16, 1024), kk > 0);
}

/* O += P V: V N-major; a k-step is 16 keys = 2048 bytes; 64-column blocks of V are BN * 128 bytes apart
   (one block at H64, so that LBO is never used). */
__device__ __forceinline__ void gemm_pv(float (&o)[HD / 2], const uint32_t (&pf)[32], uint32_t svb) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) wgmma_rs(o, &pf[4 * kk], gmma_desc(svb + kk * 2048, BN * 128, 1024));
}

/* Top-left causal mask of a tile on the diagonal: key j valid for row i iff j <= i (rows r0, r0 + 8). A tile
   wholly past a warpgroup's rows is skipped (n_mine); in the tiles it computes every row sees the tile's first
   key (wg_row0 is a multiple of 64, the last tile starts at wg_row0 or wg_row0 - 64), as in 02. */
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

template <int NC, int STAGES>
constexpr int smem_bytes() { return 1024 /* alignment slack */ + 64 * NC * HD * 2 + STAGES * 2 * BN * HD * 2; }
static_assert(smem_bytes<3, 3>() == 123904 && smem_bytes<3, 3>() + 1024 <= 227 * 1024, "121 KiB of 227");
static_assert(BN == 128, "the kernel reads a 128-key tile as 8 k16 steps (P V) and 16 accumulator blocks (S)");

/* NC consumer warpgroups (3; 2 is 02's kernel at H64, kept as the same-run baseline), STAGES-deep K/V ring. */
template <int NC, int STAGES, bool CAUSAL>
__global__ void __launch_bounds__(128 * (NC + 1), 1)
    hopper_fwd(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmk,
               const __grid_constant__ CUtensorMap tmv, const FwdParams p) {
  constexpr int BM = 64 * NC;
  /* Consumer registers after setmaxnreg: 3 consumers (65536 - 128 x 24) / 384 = 162 -> 160; 2 consumers
     (65536 - 3072) / 256 = 244 -> 240 (02's value). */
  constexpr int CONSUMER_REGS = NC == 3 ? 160 : 240;
  static_assert(128 * 24 + 128 * NC * CONSUMER_REGS <= 65536 && CONSUMER_REGS % 8 == 0, "register file");
  constexpr uint32_t QW_BYTES = 64 * HD * 2, KV_BYTES = BN * HD * 2; /* 8 KiB per Q box, 16 KiB per K/V tile */
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar[1 + 4 * STAGES];
  __shared__ float anchor[4 * NC]; /* see the wait_group 0 of the main loop */

  const uint32_t sq = (smem_u32(smem_raw) + 1023u) & ~1023u; /* swizzle atoms need 1024-byte alignment */
  const uint32_t sk = sq + NC * QW_BYTES, sv = sk + STAGES * KV_BYTES, b0 = smem_u32(bar);

  /* Causal: the heaviest m-blocks (most key tiles) are launched first. */
  const int mb = CAUSAL ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
  const int n = blockIdx.y, b = blockIdx.z, kvh = n / (p.N / p.KH), m0 = mb * BM;
  /* Warpgroups with rows: T - m0 is a positive multiple of 64 (T % 128 == 0), so a warpgroup's 64 rows are
     all below T or all at or past it; the last CTA of a head has 1, 2 or 3 (T / 128 % 3 = 2, 1, 0). */
  const int n_wg = min(NC, (p.T - m0) / 64);
  /* Top-left causal: key tiles past the last real row (m0 + 64 n_wg - 1) are fully masked and skipped. The
     host guarantees S >= BN, so n_tiles >= 1 (the schedule below counts on one S and one P V at least). */
  const int n_tiles = CAUSAL ? min(p.S / BN, (m0 + 64 * n_wg - 1) / BN + 1) : p.S / BN;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    mbar_init(bar_q(b0), 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bar_kf(b0, s), 1);         /* the producer's arrive.expect_tx, then the TMA bytes */
      mbar_init(bar_vf(b0, s), 1);
      mbar_init(bar_ke(b0, s), 4 * n_wg);  /* one arrive per warp of a warpgroup with rows: 12 in a full CTA */
      mbar_init(bar_ve(b0, s), 4 * n_wg);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    /* Producer: 24 registers. K before V of each tile: the consumers need K_j one step before V_j. */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (threadIdx.x == 0) {
      mbar_arrive_tx(bar_q(b0), n_wg * QW_BYTES); /* only the boxes of warpgroups with rows */
      for (int w = 0; w < n_wg; ++w) tma_load(sq + w * QW_BYTES, &tmq, bar_q(b0), 0, n, m0 + 64 * w, b);
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

  const int cw = wg - 1;
  /* A warpgroup past T: its Q box was not loaded and the empty barriers do not count it; it leaves before
     setmaxnreg.inc (a per-warpgroup instruction). The others' inc needs no registers of its: the producer's
     dec freed 128 x (128 - 24) = 13312, the three increases take 384 x (160 - 128) = 12288. */
  if (cw >= n_wg) return;
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS) : "memory");
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, t = lane % 4;
  const int wg_row0 = m0 + 64 * cw;              /* first row of this warpgroup; wg_row0 + 63 < T */
  const int r0 = wg_row0 + 16 * warp + lane / 4; /* this thread's rows: r0 and r0 + 8 */
  const float sink = p.softmax == SM_LEARNABLE ? p.sinks[n] : p.softmax == SM_OFF_BY_ONE ? 0.f : -INFINITY;
  const float sink_l2 = sink * LOG2E, sl2 = p.scale_l2;
  const uint32_t sq_wg = sq + cw * QW_BYTES; /* this warpgroup's 64-row Q box */

  /* Accumulator layout of m64nN (per warp 16 rows): d[4j + e]: row lane/4 + 8 * (e >> 1),
     column 8j + 2 * (lane % 4) + (e & 1). */
  float o[HD / 2], sacc[64], corr[2];
  uint32_t pf[32];
  /* Running max seeded with the sink, capped below +inf as in the library (a +inf sink then gives exp2(0)). */
  const float seed = fminf(sink_l2, 3.0e38f);
  float m_[2] = {seed, seed}, l_[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
  /* Causal: the CTA's last 1-2 key tiles can lie wholly past this warpgroup's last row (wg_row0 + 63) when a
     later warpgroup of the CTA needs them; it computes only its own n_mine and releases the rest unread at the
     end. Without this a causal 192-row CTA grid does 3% (T 4096) / 11% (T 1024) more tensor work than 02's
     128-row grid; with it exactly as much. */
  const int n_mine = CAUSAL ? min(n_tiles, (wg_row0 + 63) / BN + 1) : n_tiles;
  mbar_wait(bar_q(b0), 0);

  /* Tile 0: S_0 alone, then its softmax (O is still 0: nothing to rescale). */
  mbar_wait(bar_kf(b0, 0), 0);
  pin(sacc);
  wgmma_fence();
  gemm_qk(sacc, sq_wg, sk);
  wgmma_commit();
  wgmma_wait0();
  pin(sacc);
  if (lane == 0) mbar_arrive(bar_ke(b0, 0));
  if (CAUSAL && BN - 1 > wg_row0) mask_causal(sacc, 2 * t, r0);
  softmax_tile(sacc, m_, l_, corr, sl2);
  pack_p(pf, sacc);

  for (int it = 1; it < n_mine; ++it) {
    const int s = it % STAGES, sp = (it - 1) % STAGES;
    const uint32_t ph = (it / STAGES) & 1, php = ((it - 1) / STAGES) & 1;
    mbar_wait(bar_kf(b0, s), ph);
    mbar_wait(bar_vf(b0, sp), php);
    pin(sacc);
    pin(o);
    pin(pf);
    wgmma_fence();
    gemm_qk(sacc, sq_wg, sk + s * KV_BYTES); /* group 1: S_j */
    wgmma_commit();
    gemm_pv(o, pf, sv + sp * KV_BYTES);      /* group 2: O += P_{j-1} V_{j-1} */
    wgmma_commit();
    wgmma_wait1();                            /* S_j has landed; P V may still run */
    pin(sacc);
    if (lane == 0) mbar_arrive(bar_ke(b0, s));
    if (CAUSAL && it * BN + BN - 1 > wg_row0) mask_causal(sacc, it * BN + 2 * t, r0);
    softmax_tile(sacc, m_, l_, corr, sl2);
    /* 02's anchor: without it ptxas hoists WARPGROUP.DEPBAR (wait_group 0) above the 64 exp2s, which then no
       longer overlap P V. A shared store of a value that depends on every exp2 (the row sums) is not crossed.
       One 4-byte store per warp per tile, to a word nobody reads. */
    if (lane == 0)
      asm volatile("st.shared.f32 [%0], %1;" ::"r"(smem_u32(&anchor[4 * cw + warp])), "f"(l_[0] + l_[1]) : "memory");
    wgmma_wait0();                            /* P_{j-1} V_{j-1} has landed: O and pf are free */
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
    const int sp = (n_mine - 1) % STAGES;
    const uint32_t php = ((n_mine - 1) / STAGES) & 1;
    mbar_wait(bar_vf(b0, sp), php);
    pin(o);
    pin(pf);
    wgmma_fence();
    gemm_pv(o, pf, sv + sp * KV_BYTES);
    wgmma_commit();
    wgmma_wait0();
    pin(o);
    if (lane == 0) mbar_arrive(bar_ve(b0, sp));
  }
  /* Tiles wholly masked for this warpgroup (causal only): released unread, in order, each after its full
     barrier, so every arrive lands in the phase of its own tile (an arrive before the load could complete the
     previous phase of that stage while another warpgroup still reads it). */
  for (int it = n_mine; it < n_tiles; ++it) {
    const int s = it % STAGES;
    const uint32_t ph = (it / STAGES) & 1;
    mbar_wait(bar_kf(b0, s), ph);
    if (lane == 0) mbar_arrive(bar_ke(b0, s));
    mbar_wait(bar_vf(b0, s), ph);
    if (lane == 0) mbar_arrive(bar_ve(b0, s));
  }

  /* Final normalisation (the library's form): the larger of the running max m and the sink a contributes
     2^0 = 1 exactly, lse formed from it in the natural-log domain. No key and no sink (m = -inf): out 0, lse =
     sink. Every row stored here is below T (the warpgroup has rows, see n_wg). */
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
      lse = (sink_max ? sink : mm * LN2) + logf(ltot);
    }
    const int row = r0 + 8 * h;
    __nv_bfloat16 *orow = p.out + (((size_t)b * T + row) * N + n) * HD + 2 * t;
#pragma unroll
    for (int j = 0; j < HD / 8; ++j)
      *reinterpret_cast<__nv_bfloat162 *>(orow + 8 * j) =
          __floats2bfloat162_rn(o[4 * j + 2 * h] * f, o[4 * j + 2 * h + 1] * f);
    if (t == 0) p.lse[((size_t)b * N + n) * T + row] = lse;
  }
}

} /* namespace v03 */

/* ---- host ----------------------------------------------------------------------------------------- */

/* Q as 64-row boxes (problem_init's map has hopper_common's 128-row boxes), encoded once per problem: the
   timed launches then do no host work beyond the launch itself. */
static const CUtensorMap &q_map64(const Problem &pr) {
  static CUtensorMap m;
  static const void *q = nullptr;
  static int key[4] = {0, 0, 0, 0};
  const Case &c = pr.c;
  if (q != pr.q || key[0] != c.B || key[1] != c.T || key[2] != c.N || key[3] != c.H) {
    m = make_map(pr.q, c.B, c.T, c.N, c.H, 64);
    q = pr.q, key[0] = c.B, key[1] = c.T, key[2] = c.N, key[3] = c.H;
  }
  return m;
}

template <int NC, int STAGES, bool CAUSAL>
static void launch_t(const Problem &pr) {
  constexpr int BM = 64 * NC, SMEM = v03::smem_bytes<NC, STAGES>();
  static bool attr_set = false;
  if (!attr_set) {
    CK(cudaFuncSetAttribute(v03::hopper_fwd<NC, STAGES, CAUSAL>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    attr_set = true;
  }
  dim3 grid((pr.c.T + BM - 1) / BM, pr.c.N, pr.c.B); /* the last m-block may be partial (rows past T idle) */
  v03::hopper_fwd<NC, STAGES, CAUSAL><<<grid, 128 * (NC + 1), SMEM>>>(q_map64(pr), pr.mk, pr.mv, pr.p);
}

template <int NC, int STAGES>
static void launch(const Problem &pr) {
  if (pr.c.H != v03::HD) { printf("{\"error\": \"hopper_fwd_03 takes H = 64 only\"}\n"); exit(2); }
  pr.c.causal ? launch_t<NC, STAGES, true>(pr) : launch_t<NC, STAGES, false>(pr);
  CK(cudaGetLastError());
}

/* 02's checks at H64 (causal and not, GQA 2:1 / 3:1 / 8:1, T < S and T > S, all three softmax types with the
   +-50 sink heads), plus T = 128 x odd and other T with a partial last 192-row CTA: T % 192 = 128 (T 128,
   512: one idle warpgroup) and 64 (T 256, 640, 4096: two idle), and multi-tile rings (T = S = 1152, 4096). */
static int run_03(const char *name, launch_fn launch) {
  /* {B, T, S, N, K, H, causal, softmax, rows_every} */
  const Case checks[] = {
      {2, 512, 512, 4, 4, 64, 0, SM_LEARNABLE, 1},   {2, 512, 512, 4, 2, 64, 1, SM_OFF_BY_ONE, 1},
      {2, 256, 768, 4, 2, 64, 1, SM_OFF_BY_ONE, 1},  {1, 768, 256, 4, 4, 64, 1, SM_VANILLA, 1},
      {2, 512, 1024, 4, 4, 64, 0, SM_VANILLA, 1},    {1, 384, 384, 6, 3, 64, 0, SM_OFF_BY_ONE, 1},
      {2, 384, 384, 4, 4, 64, 1, SM_LEARNABLE, 1},   {1, 128, 128, 2, 2, 64, 1, SM_LEARNABLE, 1},
      {1, 128, 384, 2, 1, 64, 0, SM_VANILLA, 1},     {2, 640, 640, 4, 2, 64, 1, SM_LEARNABLE, 1},
      {1, 640, 512, 4, 4, 64, 0, SM_OFF_BY_ONE, 1},  {1, 640, 1024, 4, 4, 64, 1, SM_VANILLA, 1},
      {1, 1152, 1152, 4, 2, 64, 1, SM_LEARNABLE, 1}, {1, 1024, 1024, 16, 2, 64, 1, SM_LEARNABLE, 1},
      {4, 4096, 4096, 16, 16, 64, 0, SM_LEARNABLE, 61}, {4, 4096, 4096, 16, 16, 64, 1, SM_LEARNABLE, 61},
  };
  int failed = 0;
  for (size_t i = 0; i < sizeof(checks) / sizeof(checks[0]); ++i)
    failed += !check(name, launch, checks[i], 7 + 3 * (uint32_t)i);
  /* The H64 target rows of bench/NOTES.md: B4 T4096 N32 (causal and not), B16 T1024 N32 causal, gpt-oss
     (B1 T4096 N64 / K8) causal, B1 T16384 N16 causal. */
  const Case benches[] = {
      {4, 4096, 4096, 32, 32, 64, 0, SM_LEARNABLE, 1}, {4, 4096, 4096, 32, 32, 64, 1, SM_LEARNABLE, 1},
      {16, 1024, 1024, 32, 32, 64, 1, SM_LEARNABLE, 1}, {1, 4096, 4096, 64, 8, 64, 1, SM_LEARNABLE, 1},
      {1, 16384, 16384, 16, 16, 64, 1, SM_LEARNABLE, 1},
  };
  for (const Case &c : benches) bench(name, launch, c, failed == 0);
  printf("{\"summary\": \"%s\", \"checks_failed\": %d}\n", name, failed);
  fflush(stdout);
  return failed;
}

int main() {
  harness_init();
  const int failed = run_03("hopper_fwd_03", launch<3, 3>) + run_03("hopper_fwd_03s2", launch<3, 2>) +
                     run_03("hopper_fwd_03nc2", launch<2, 2>);
  return failed ? 1 : 0;
}
