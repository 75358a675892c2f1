/*
 * hopper/onepass64.cuh — the H64 one pass's constants and device helpers: 192-key blocks of 3 warpgroups, NAT's rank
 * and last-visit rule, the owner warpgroup's dQ product and staging, the converter's row loop.
 */
#ifndef SA_HOPPER_ONEPASS64_CUH
#define SA_HOPPER_ONEPASS64_CUH

#include "hopper/onepass_dq.cuh"

/* How the CTAs of a launch find their work and their turn (hopper/onepass128.cu's sa_hop_onepass128_sched plus the
   head split). */
struct sa_hop_onepass64_sched {
  int *sync;    /* [0]: CTA ticket counter; then one semaphore per (b, head, 64-query tile); zeroed per call */
  float *part;  /* hs > 1: partial dK (hs slices), then dV (hs slices), fp32 [B, S, KH, 64] each */
  int nkb;      /* key blocks per kv head: ceil(S / 192) */
  int Gc;       /* query heads per CTA: G / hs */
  int hs;       /* CTAs per (key block, kv head) */
  int n_all;    /* Gc T / QB: tiles of a key block without a mask */
  int d;        /* non-causal NAT: key block kb starts at tile kb * d */
  size_t slice; /* elements of one partial: B S KH 64 */
};

namespace {

/* from the tile table (hopper/tiles.h), where the reasons are */
constexpr int QB = SA_HOP_BWD_QB;      /* query rows per streamed tile: N of S^T / dP^T, M of dQ */
constexpr int STAGES = SA_HOP_STAGES;  /* Q / dO ring depth */
constexpr int NC64 = SA_HOP_OP_NC(64); /* consumer warpgroups */
constexpr int KB64 = SA_HOP_OP_KB(64); /* keys per CTA: 64 NC64 */
constexpr int THREADS64 = 128 * (NC64 + 1);
constexpr int PREGS64 = 32; /* producer warpgroup: the dq converter spills at 24 (LDL/STL 13-48) */
constexpr int REGS64 = 160; /* consumers: (65536 - 128 x 32) / 384 */
constexpr int NDS = 3;      /* dS^T buffers: tile k in buffer k % 3 */
static_assert(128 * PREGS64 + 128 * NC64 * REGS64 <= 65536, "register file: producer + consumers");
constexpr uint32_t DS64_BYTES = KB64 * QB * 2; /* one dS^T tile [192 keys][64 queries] bf16: 24 KiB */

/* K, V; the Q / dO ring; 3 dS^T tiles; 2 dQ staging slots [2 boxes][64 rows][32 fp32]; per stage lse2, D; 2
   converter slots as the staging slots: 223232 B, + 1 KiB for the static part's alignment padding. */
constexpr int op64_smem() {
  return 1024 + 2 * KB64 * 64 * 2 + STAGES * 2 * QB * 64 * 2 + NDS * DS64_BYTES + 2 * QB * 64 * 4 +
         STAGES * 2 * QB * 4 + 2 * QB * 64 * 4;
}
static_assert(STAGES * 2 * QB * 4 % 1024 == 0, "the converter slots (128-byte swizzle) 1024-aligned after lse2 / D");
static_assert(op64_smem() + 1024 <= 227 * 1024, "over the sm_90 limit");

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* NAT (nat_rank of hopper/onepass_dq.cuh) with 192-key blocks: causal key block j sees query tile q iff q >= 3 j
   (q 64 + 63 >= 192 j), and reaches tile (g, q) at step g (PT - 3j) + q - 3j, earlier for larger j: rank m - kb,
   m = min(nkb - 1, q / 3). dq_acc is not zeroed: each (b, head, 64-query tile) has exactly one rank-0 visit, which
   stores the tile before any add (nat_rank's comment has the ordering argument). The grid is one CTA per (b, kv
   head, head split hh < hs, key block kb < nkb), nkb = ceil(S / 192) >= 1 (S > 0 in sa_hop_scope); CTA hh walks n_tiles
   distinct tiles of heads kvh G + hh Gc + g, g < Gc = G / hs (hs | G): each head's tiles are visited by the nkb
   CTAs of one hh only, and the semaphores are per query head. Causal top-left: key block j visits (g, q) iff
   q >= 3 j (its first query block k0 / 64); key block 0 visits every tile, the visitors of (g, q) are 0..m
   (T > S: all nkb from q = 3 nkb - 3 on; T < S: key blocks with 3 kb >= T / 64 have no tile and no writer, but
   3 m <= q < T / 64), ranks m - kb: a bijection onto 0..m. Non-causal: every key block visits all n_all tiles,
   (m - kb) mod nkb is a bijection onto 0..nkb-1. Either way rank 0 is key block m, whatever its n_wg (a last CTA
   of 64 or 128 keys visits the same tiles). 2 boxes {32, 64} cover the 64 x 64 tile, none clipped (64 | T). */

/* Whether key block kb's visit to (g, q) is the tile's last (rank V - 1 of its V visitors), after which the tile
   is final: causal V = m + 1 and rank m - kb, so key block 0 (the last visitor of every tile); non-causal V = nkb.
   By the bijections above, exactly one visit per tile, so the converter covers dq whole (no
   sa_hop_dq_convert_kernel). */
template <bool CAUSAL>
__device__ __forceinline__ bool nat_last64(int kb, int g, int q, int nkb, int PT, int d) {
  return CAUSAL ? kb == 0 : nat_rank<KB64, false>(kb, g, q, nkb, PT, d) == nkb - 1;
}

/* dQ [64 q x 64] = dS [64 q x 16 NKS keys] K [16 NKS keys x 64]: A = dS^T buffer read MN-major (rows are keys),
   B = K read MN-major (one 64-column block); 16 keys = 2048 B a step. A whole fence / commit / wait section, so
   it can sit under a (warpgroup-uniform) branch without ptxas serialising the other wgmmas. */
template <int NKS>
__device__ __forceinline__ void dq_product(float (&dq)[32], uint32_t sds_x, uint32_t sk) {
  zero(dq);
  pin(dq);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < NKS; ++kk)
    wgmma_ss_tt(dq, gmma_desc(sds_x + kk * 2048, QB * 128, 1024), gmma_desc(sk + kk * 2048, KB64 * 128, 1024), kk > 0);
  wgmma_commit();
  wgmma_wait0();
  pin(dq);
}

/* dq_product over the keys of n_wg warpgroups (a head's last key block may hold 64 or 128 keys): 4 k-steps each. */
__device__ __forceinline__ void dq_product_nwg(float (&dq)[32], uint32_t sds_x, uint32_t sk, int n_wg) {
  if (n_wg == 3) dq_product<12>(dq, sds_x, sk);
  else if (n_wg == 2) dq_product<8>(dq, sds_x, sk);
  else dq_product<4>(dq, sds_x, sk);
}

/* The converter warps' share of a finished dq_acc tile: rows r0 + 8 i (i < 8) of a converter slot (fp32, the
   128-byte swizzle: this thread's two 16-byte units at box and box ^ 16) -> 8 bf16 of dq each, times scale; dst
   steps 8 rows (row_step uint4s). Not unrolled: unrolled, ptxas keeps 8 row addresses live (spills at 24
   registers). */
__device__ __forceinline__ void convert_dq_rows(uint32_t box, uint4 *dst, int row_step, float scale) {
#pragma unroll 1
  for (int i = 0; i < 8; ++i, box += 8 * 128, dst += row_step) {
    float4 a, e;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(a.x), "=f"(a.y), "=f"(a.z), "=f"(a.w)
                 : "r"(box)
                 : "memory");
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(e.x), "=f"(e.y), "=f"(e.z), "=f"(e.w)
                 : "r"(box ^ 16u)
                 : "memory");
    uint4 o;
    o.x = pack_bf16(a.x * scale, a.y * scale);
    o.y = pack_bf16(a.z * scale, a.w * scale);
    o.z = pack_bf16(e.x * scale, e.y * scale);
    o.w = pack_bf16(e.z * scale, e.w * scale);
    *dst = o;
  }
}

/* This thread's rows r0, r0 + 8 of an accumulator as fp32 (the head split's partial dK / dV). */
__device__ __forceinline__ void store_rows_f32(float *base, const float (&acc)[32], size_t row_stride, int r0, int t) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float *dst = base + (size_t)(r0 + 8 * h) * row_stride + 2 * t;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      *reinterpret_cast<float2 *>(dst + 8 * j) = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
  }
}

#endif /* sm_90a */

} /* namespace */

#endif /* SA_HOPPER_ONEPASS64_CUH */
