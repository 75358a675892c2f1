/*
 * hopper/fwd_tile.cuh — the Hopper forward's tile struct, parameters, barrier slots, work-tile order and device
 * helpers (the products, the mask tests, the online softmax, P's packing). Included by hopper/fwd.cu only.
 */
#ifndef SA_HOPPER_FWD_TILE_CUH
#define SA_HOPPER_FWD_TILE_CUH

#include "hopper/ptx.cuh"
#include "hopper/segments.cuh"

namespace {

/* The forward's tile per (head dim, mask kind, feature kernel or not): the numbers and their reasons are
   hopper/tiles.h's. */
template <int HD, int MASK, int FEAT = 0>
struct sa_hop_fwd_tile {
  static constexpr int QS = SA_HOP_FWD_QSLOTS;                             /* Q slots */
  static constexpr int NC = FEAT ? SA_HOP_FWD_FEAT_NC : SA_HOP_FWD_NC(HD); /* consumer warpgroups */
  static constexpr int BM = SA_HOP_WG_ROWS * NC;                           /* query rows per CTA */
  static constexpr int BN = SA_HOP_FWD_BN;                                 /* keys per tile */
  static constexpr int ST = SA_HOP_STAGES;                                 /* K / V ring depth */
  static constexpr int THREADS = 128 * (NC + 1);
  /* Registers after setmaxnreg, inside the CTA's launch pool (65536 / THREADS rounded down to 8: 168 a thread at
     H128, so 32 + 2 x 240 would ask 65536 and never return). Producer 24; kind 4's producer warp also narrows the
     key tiles (spills at 24): 32, and its H128 consumers give up 8; the feature kernels' producer warp also copies
     the class lists (spills 150 B at 24): 40, and their consumers give up 8. */
  static constexpr int PREGS = FEAT ? 56 : MASK == 4 ? 32 : 24;
  static constexpr int REGS = NC == 3 ? 160 : FEAT ? 224 : MASK == 4 ? 232 : 240;
  static constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;
  /* Q's TMA box: one per warpgroup when a CTA can be partial (BM 192), else one BM-row box per column block */
  static constexpr int QBOX = 128 % BM == 0 ? BM : 64;
  static constexpr int Q_BYTES = BM * HD * 2;
  /* kind 4 (segment ids): each K stage carries its 128 keys' ids (TMA, on K's full barrier) */
  static constexpr int IDS_BYTES = MASK == 4 ? 128 * 4 : 0;
  /* the feature kernels: per Q slot a work tile's class list (a byte a key tile) and its two range words */
  static constexpr int LIST_BYTES = FEAT ? SA_HOP_FEAT_MAX_KV_LEN / BN : 0;
  static constexpr int SMEM = FEAT ? SA_HOP_FWD_FEAT_SMEM(HD) : SA_HOP_FWD_SMEM(HD, MASK);
  static_assert(SMEM == 1024 + QS * Q_BYTES + ST * (2 * BN * HD * 2 + IDS_BYTES) + QS * (LIST_BYTES + (FEAT ? 16 : 0)),
                "the layout of the kernel");
  static_assert(!FEAT || MASK < 4, "the feature kernels take no segment ids");
  static_assert(128 * PREGS + 128 * NC * REGS <= LAUNCH_REGS * THREADS && REGS % 8 == 0,
                "setmaxnreg: producer + consumers within the CTA's launch pool");
  static_assert(SMEM + 1024 <= SA_HOP_SMEM_LIMIT, "shared memory over the sm_90 limit (+1 KiB of static barriers)");
  /* >= 2: the key-tile loop holds V_{j-1}'s stage while S_j reads K_j's; a power of two: x % ST and x / ST
     are shifts, and the ring position stays continuous as the uint32 tile counter x wraps */
  static_assert(ST >= 2 && (ST & (ST - 1)) == 0, "ring depth");
  static_assert(BN == 128, "mask_range and mask_segments read 128-key tiles");
};

struct sa_hop_fwd_params {
  __nv_bfloat16 *out; /* [B, T, N, H] */
  float *lse;         /* [B, N, T] or NULL */
  const float *sinks; /* [N], learnable only */
  int T, S, N, G, softmax;
  float scale_l2;                /* scale * log2(e) > 0 */
  sa_hop_mask mask;              /* causal / window / offset (MASK kernels only) */
  sa_hop_shape shape;            /* lengths and the raw mask parameters (MASK 3, 4: each CTA builds its batch's mask) */
  const int32_t *q_seg, *kv_seg; /* [B, T], [B, S] (MASK 4: the key ids by TMA for the mask, read for the tiles) */
  /* Work tiles (sa_hop_work_tile): B N n_mb of them, n_mb = ceil(T / BM); CTA c takes c, c + gridDim.x, ...
     (one each when the grid holds them all). hg > 0: the L2-section order with hg heads a section. nph > 0:
     the pair order with nph = ceil(n_mb / 2) pairs a head, and total = the index bound of the pairs' walk. */
  int BH, n_mb, total, hg, nph;
};

/* Work tile i -> (b N + head, m-block); m-block -1: no work (the pair order's padding). Pair order (nph > 0;
   persistent, causal: kind 1): m-blocks n_mb - 1 - k and k of one head form pair k (the middle one of an odd
   n_mb alone); a causal m-block's key tiles grow with its index (mb + 1 at BM = BN = 128, ~1.5 (mb + 1) at BM
   192), so every pair holds about the same work, n_mb + 1 key tiles at H128. CTA c walks pairs c, c + grid, ...
   (index i: round r = i / grid, pair (r / 2) grid + c, heavy member at even r, light at odd), so the static
   stride deals out equal shares: a list-scheduling model of B16 T1024 N16 H128 causal gives the SMs busy 0.97 of
   the time against 0.79 for the L2 sections below (B4 T4096: 1.00 / 0.78), and a pair keeps one head's K / V in
   L2 across its two m-blocks; grid consecutive pairs span grid / nph heads (T1024 H128: 33 heads, 17 MiB).
   hg = 0: the one-tile-per-CTA grid's order (m-block fastest, reversed under a mask: heaviest first within a head).
   hg > 0 (persistent, masked): sections of hg heads (their K/V <= 16 MiB, a third of the H200's L2), inside a
   section every head's heaviest m-block, then the next lighter level: with the static stride a CTA's successive
   tiles get lighter (the balance of a global heaviest-first order) while the K/V read at one time stays in L2. The
   last section may hold fewer heads. */
__device__ __forceinline__ void sa_hop_work_tile(const sa_hop_fwd_params &p, bool masked, int i, int *bh, int *mb) {
  if (p.nph > 0) { /* the pair order (below) */
    const int g = gridDim.x, r = i / g, pair = (r >> 1) * g + (i - r * g), k = pair % p.nph;
    *bh = pair / p.nph;
    *mb = (r & 1) == 0 ? p.n_mb - 1 - k : k;
    if (*bh >= p.BH || ((r & 1) && k == p.n_mb - 1 - k)) *mb = -1; /* past the last pair; an odd n_mb's middle */
    return;
  }
  if (masked && p.hg > 0) {
    const int span = p.hg * p.n_mb, sec = i / span, r = i - sec * span;
    const int left = p.BH - sec * p.hg, hg = p.hg < left ? p.hg : left, lvl = r / hg;
    *mb = p.n_mb - 1 - lvl;
    *bh = sec * p.hg + (r - lvl * hg);
  } else {
    *bh = i / p.n_mb;
    const int r = i - *bh * p.n_mb;
    *mb = masked ? p.n_mb - 1 - r : r;
  }
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* Barrier slots in bar[]: 0-1 Q full, 2-3 Q empty (Q slot q); then ST each of K full, V full, K empty, V empty
   (stage s). */
template <int ST>
constexpr int N_BARS = 4 + 4 * ST;
__device__ __forceinline__ uint32_t bar_qf(uint32_t b0, uint32_t q) { return b0 + 8 * q; }
__device__ __forceinline__ uint32_t bar_qe(uint32_t b0, uint32_t q) { return b0 + 8 * (2 + q); }
template <int ST>
__device__ __forceinline__ uint32_t bar_kf(uint32_t b0, int s) {
  return b0 + 8 * (4 + s);
}
template <int ST>
__device__ __forceinline__ uint32_t bar_vf(uint32_t b0, int s) {
  return b0 + 8 * (4 + ST + s);
}
template <int ST>
__device__ __forceinline__ uint32_t bar_ke(uint32_t b0, int s) {
  return b0 + 8 * (4 + 2 * ST + s);
}
template <int ST>
__device__ __forceinline__ uint32_t bar_ve(uint32_t b0, int s) {
  return b0 + 8 * (4 + 3 * ST + s);
}

/* Descriptors by offset: a descriptor's start field is (address & 0x3FFFF) >> 4 in bits 0-13, and every
   operand here lies inside the CTA's shared memory (< 228 KiB < 2^18 from the window's base), so for a
   16-byte multiple off, gmma_desc(a + off) = gmma_desc(a) + off / 16 (no carry out of the field). The key-tile
   loop then forms each k-step's descriptor with one add to a base made once, not a mask-shift-or of an
   address per k-step (-3 uniform instructions per descriptor, H / 16 + BN / 16 of them a tile: 36 at H64, 48 at
   H128). */
__device__ __forceinline__ uint64_t desc_add(uint64_t d, uint32_t off) { return d + (off >> 4); }

/* S = Q K^T for one warpgroup: H / 16 k-steps, 32 bytes apart inside a 128-byte swizzled row, 4 per block;
   Q's column blocks are BM x 128 bytes apart, K's BN x 128 (128 rows = 16 swizzle atoms: 1024-aligned).
   dq, dk: the descriptors of the warpgroup's Q rows and of the K stage (K-major, LBO 16, SBO 1024). */
template <int HD, int BM, int BN>
__device__ __forceinline__ void gemm_qk(float (&sacc)[BN / 2], uint64_t dq, uint64_t dk) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    const uint64_t da = desc_add(dq, (kk / 4) * BM * 128 + (kk % 4) * 32);
    const uint64_t db = desc_add(dk, (kk / 4) * BN * 128 + (kk % 4) * 32);
    wgmma_ss_n128(sacc, da, db, kk > 0);
  }
}

/* O += P V: V N-major; a k-step is 16 keys = 2048 bytes (BN / 16 of them); the 64-column blocks of V are
   BN * 128 bytes apart (dv: the V stage's descriptor with that LBO, 16384 at 128 keys). */
template <int HD, int BN>
__device__ __forceinline__ void gemm_pv(float (&o)[HD / 2], const uint32_t (&pf)[BN / 4], uint64_t dv) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) wgmma_rs(o, &pf[4 * kk], desc_add(dv, kk * 2048));
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

/* Segment ids (kind 4): element (j, e) of rows r0, r0 + 8 is column 8j + 2 (lane % 4) + e of the key tile, whose
   128 ids lie at ids (shared memory, landed with K); a key of another document than the row's becomes -inf.
   One 8-byte shared load per column pair (the quad's four lanes read four neighbouring pairs) and four compares:
   ~100 instructions a tile, against a loop of ~570. */
__device__ __forceinline__ void mask_segments(float (&sacc)[64], uint32_t ids, int q0, int q1, int t) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    int k0, k1;
    asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(k0), "=r"(k1) : "r"(ids + 4 * (8 * j + 2 * t)));
    if (k0 != q0) sacc[4 * j] = -INFINITY;
    if (k1 != q0) sacc[4 * j + 1] = -INFINITY;
    if (k0 != q1) sacc[4 * j + 2] = -INFINITY;
    if (k1 != q1) sacc[4 * j + 3] = -INFINITY;
  }
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
    base[h] = mnew == -INFINITY ? 0.f : mnew;     /* vanilla, nothing valid yet: keep exp2 finite */
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

} /* namespace */

#endif /* SA_HOPPER_FWD_TILE_CUH */
