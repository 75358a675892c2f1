/*
 * dev/hopper_bwd_02.cu — variant 02 of the Hopper (sm_90a) backward: variant 01's two-pass kernels (not the
 * one-pass 01a) with one change in bwd_dkdv: lse2 and D of a query tile are no longer staged in shared memory.
 *   01: the producer bulk-copies (cp.async.bulk) lse2[64] and D[64] of each query tile into the stage next to
 *       Q and dO, on the same full barrier (expect_tx 2 x 16 KiB + 512 B at H128), and every consumer lane reads
 *       its float2 pairs from there with plain ld.shared. compute-sanitizer racecheck on the H200 reports 12
 *       hazards in the library's copy of this kernel, all between that bulk copy and those reads (bench/NOTES.md,
 *       H200 session 2, point 6): the mbarrier protocol orders them, but whether racecheck merely fails to
 *       model bulk-copy completion through mbarrier transactions was not settled.
 *   02: each consumer thread loads the 16 float2 pairs it needs (columns 8j + 2t, j = 0..7, of lse2 and D of
 *       the tile's 64 queries) from global memory by ld.global.nc (__ldg), issued right after the stage's full
 *       barrier wait and before the first wgmma wait, so their L1/L2 latency hides under the S^T / dP^T
 *       products; the producer copies Q and dO only (expect_tx 2 x 16 KiB), the lse2 / D region is gone. The
 *       stage's shared memory is then read only by wgmma, so no generic-proxy read of bulk-copied data is left.
 *       Cost: 16 LDG.E.64 per thread per tile (the CTA's 8 warps read the same 512 B; L1 / L2 hits) against
 *       524-596 SASS instructions and 24 wgmma per tile at H128. Query block and head of a tile are stepped, not
 *       divided (see bwd_dkdv), so the loop keeps 01's length (SASS per tile, 01 -> 02: H128 524 -> 524,
 *       causal 618 -> 596; H64 408 -> 417, causal 513 -> 494); the exp2 window (wait_group 1 .. 0) loses its
 *       LDS (H128 235 -> 215, causal 389 -> 373); registers R216 -> R237 of 240 at H128, no spills.
 * bwd_pre, bwd_dsink (hopper_bwd_common.cuh) and bwd_dq are 01's unchanged (bwd_dq already keeps lse2 / D per
 * row in registers, loaded once per CTA). Everything else keeps 01's names and structure, so
 * `diff dev/hopper_bwd_01.cu dev/hopper_bwd_02.cu` shows the change (and the removed one-pass code).
 * Scope: bf16, H = Hv in {64, 128}, T and S multiples of 128, N % K == 0, causal none or top-left.
 * The reference and the harness (checks, timing, JSON lines) live in dev/hopper_bwd_common.cuh, the PTX
 * wrappers in dev/hopper_common.cuh.
 */
#include "hopper_bwd_parts.cuh" /* tiles, helpers, the dQ pass */

/* Registers per consumer thread at H 128 (dK/dV): dK 64 + dV 64 + S^T 32 + dP^T 32 = 192 live accumulators,
   plus 32 for the bf16 fragments of P^T and dS^T: a 128-row query tile (S^T, dP^T 64 each) would not fit 240.
   02 adds the tile's lse2 / D pairs in registers: 32 while the products run, 16 (D) once the exp2s used lse2. */

/* ---- 2. dK, dV -------------------------------------------------------------------------------------- */

/* 01's STAGES * 2 * QB * 4 bytes of lse2 / D are gone: K, V and the Q / dO ring only (129 KiB at H 128). */
template <int HD>
constexpr int dkdv_smem() { return 1024 + 2 * KB * HD * 2 + STAGES * 2 * QB * HD * 2; }
static_assert(dkdv_smem<128>() <= 227 * 1024 && dq_smem<128>() <= 227 * 1024, "over the sm_90 limit");

template <int HD, bool CAUSAL>
__global__ void __launch_bounds__(THREADS, 1)
    bwd_dkdv(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmdo,
             const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv, const BwdParams p) {
  constexpr int CB = HD / 64;
  constexpr uint32_t KV_BYTES = KB * HD * 2, QT_BYTES = QB * HD * 2;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar[1 + 2 * STAGES]; /* K+V full; per stage full; per stage empty */
  __shared__ float anchor[4 * NC];

  const uint32_t raw = smem_u32(smem_raw), sk = (raw + 1023u) & ~1023u, sv = sk + KV_BYTES;
  const uint32_t sq = sv + KV_BYTES, sdo = sq + STAGES * QT_BYTES;
  const uint32_t b0 = smem_u32(bar);
  auto bar_full = [&](int s) { return b0 + 8 * (1 + s); };
  auto bar_empty = [&](int s) { return b0 + 8 * (1 + STAGES + s); };

  const int kb = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, k0 = kb * KB, G = p.N / p.KH, T = p.T;
  /* Top-left causal: query i sees key j iff j <= i, so query blocks ending before k0 are skipped. Key blocks
     come in order of decreasing work (kb 0 sees every query). */
  const int qb0 = CAUSAL ? k0 / QB : 0, per_head = max(0, T / QB - qb0), n_tiles = G * per_head;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    mbar_init(b0, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bar_full(s), 1);
      mbar_init(bar_empty(s), 4 * NC); /* one arrive per consumer warp */
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (threadIdx.x == 0 && n_tiles > 0) {
      mbar_arrive_tx(b0, 2 * KV_BYTES);
      for (int c = 0; c < CB; ++c) {
        tma_load(sk + c * KB * 128, &tmk, b0, c * 64, kvh, k0, b);
        tma_load(sv + c * KB * 128, &tmv, b0, c * 64, kvh, k0, b);
      }
      for (int it = 0; it < n_tiles; ++it) {
        const int s = it % STAGES, n = kvh * G + it / per_head, i0 = (qb0 + it % per_head) * QB;
        mbar_wait(bar_empty(s), ((it / STAGES) & 1) ^ 1);
        mbar_arrive_tx(bar_full(s), 2 * QT_BYTES); /* 01: + 512 B of lse2 / D */
        for (int c = 0; c < CB; ++c) {
          tma_load(sq + s * QT_BYTES + c * QB * 128, &tmq, bar_full(s), c * 64, n, i0, b);
          tma_load(sdo + s * QT_BYTES + c * QB * 128, &tmdo, bar_full(s), c * 64, n, i0, b);
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  const int cw = wg - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, t = lane % 4;
  const int kw0 = k0 + 64 * cw, kr = kw0 + 16 * warp + lane / 4; /* this thread's keys: kr, kr + 8 */
  const uint32_t sk_wg = sk + cw * 64 * 128, sv_wg = sv + cw * 64 * 128;
  const float sl2 = p.scale_l2;
  /* Accumulators d[4j + e]: row (key) lane/4 + 8 (e >> 1) of the warp's 16, column 8j + 2t + (e & 1). */
  float dk[HD / 2], dv[HD / 2], st[32], dpt[32];
  uint32_t pf[16], df[16];
  zero(dk);
  zero(dv);
  /* Tile it is query block qb0 + it % per_head of head kvh G + it / per_head. 02 steps both instead of dividing:
     li, the offset in [B, N, T] of this thread's first lse2 / D pair (query i0 + 2t), and qi = it % per_head.
     An integer division is ~40 SASS instructions per tile: with n = kvh G + it / per_head the non-causal loop
     grew by 41 (01 divides only for i0, which only the causal kernels use; 02's causal loops are ~20 shorter). */
  size_t li = ((size_t)b * p.N + kvh * G) * T + qb0 * QB + 2 * t;
  int qi = 0;
  if (n_tiles > 0) mbar_wait(b0, 0);

  for (int it = 0; it < n_tiles; ++it) {
    const int s = it % STAGES, i0 = (qb0 + qi) * QB;
    const uint32_t sq_s = sq + s * QT_BYTES, sdo_s = sdo + s * QT_BYTES;
    mbar_wait(bar_full(s), (it / STAGES) & 1);
    /* This thread's lse2 / D pairs (queries i0 + 8j + 2t, + 1) straight from global memory: written by bwd_pre
       before this kernel, so read-only here (ld.global.nc). Issued before the first wait (ptxas interleaves the
       16 LDG.E.64 with the S^T / dP^T wgmma), their latency hides under those products (8 + 8 wgmma at H128):
       the CTA's 8 warps read the same 512 B, which every key block of the head re-reads (L2-resident). */
    float2 l2[8], dd[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      l2[j] = __ldg(reinterpret_cast<const float2 *>(p.lse2 + li + 8 * j));
      dd[j] = __ldg(reinterpret_cast<const float2 *>(p.D + li + 8 * j));
    }
    /* Zeroed, so the previous tile's values are dead after packing: 192 live accumulators, not 224. */
    zero(st);
    zero(dpt);
    pin(st);
    pin(dpt);
    wgmma_fence();
    gemm_ss<HD>(st, sk_wg, KB, sq_s, QB); /* S^T = K Q^T */
    wgmma_commit();
    gemm_ss<HD>(dpt, sv_wg, KB, sdo_s, QB); /* dP^T = V dO^T */
    wgmma_commit();
    wgmma_wait1();
    pin(st);
    /* Only tiles with a query below one of the warpgroup's keys carry masked elements. */
    const bool masked = CAUSAL && i0 < kw0 + 63;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = ex2(fmaf(st[4 * j + e], sl2, -((e & 1) ? l2[j].y : l2[j].x)));
        if (masked && kr + 8 * (e >> 1) > i0 + 8 * j + 2 * t + (e & 1)) x = 0.f;
        st[4 * j + e] = x;
      }
    }
    anchor_exp2(st, &anchor[4 * cw + warp], lane);
    wgmma_wait0();
    pin(dpt);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        dpt[4 * j + e] = st[4 * j + e] * (dpt[4 * j + e] - ((e & 1) ? dd[j].y : dd[j].x));
    pack_frag(pf, st);
    pack_frag(df, dpt);
    pin(dv);
    pin(dk);
    pin(pf);
    pin(df);
    wgmma_fence();
    gemm_rs<HD>(dv, pf, sdo_s); /* dV += P^T dO */
    gemm_rs<HD>(dk, df, sq_s);  /* dK += dS^T Q */
    wgmma_commit();
    wgmma_wait0();
    pin(dv);
    pin(dk);
    pin(pf);
    pin(df);
    /* The stage's shared memory is read only by this warpgroup's wgmma, complete once wait_group 0 returns: the
       elected arrive needs no __syncwarp (the library's was for lanes 1..31's ld.shared of lse2 / D). */
    if (lane == 0) mbar_arrive(bar_empty(s));
    li += QB;
    if (++qi == per_head) { /* next head, at its query block qb0 (li is at row T of this head = row 0 of the next) */
      qi = 0;
      li += T - per_head * QB;
    }
  }

  const size_t rs = (size_t)p.KH * HD;
  const size_t base = ((size_t)b * p.S * p.KH + kvh) * HD;
  store_rows<HD>(p.dk + base, dk, rs, kr, t, p.scale); /* zeros where no query sees the keys */
  store_rows<HD>(p.dv + base, dv, rs, kr, t, 1.f);
}

/* Tensor maps: dK/dV streams 64-row Q / dO tiles and loads 128-row K / V blocks; dQ the other way round. */
static void prepare(Bwd &w) {
  const Case &c = w.pr.c;
  w.maps[0] = make_map(w.pr.q, c.B, c.T, c.N, c.H, QB);
  w.maps[1] = make_map(w.dout, c.B, c.T, c.N, c.H, QB);
  w.maps[2] = make_map(w.pr.k, c.B, c.S, c.KH, c.H, KB);
  w.maps[3] = make_map(w.pr.v, c.B, c.S, c.KH, c.H, KB);
  w.maps[4] = make_map(w.pr.q, c.B, c.T, c.N, c.H, QM);
  w.maps[5] = make_map(w.dout, c.B, c.T, c.N, c.H, QM);
  w.maps[6] = make_map(w.pr.k, c.B, c.S, c.KH, c.H, KT);
  w.maps[7] = make_map(w.pr.v, c.B, c.S, c.KH, c.H, KT);
}

template <int HD, bool CAUSAL>
static void launch_dkdv_t(const Bwd &w) {
  constexpr int smem = dkdv_smem<HD>();
  static bool attr_set = false;
  if (!attr_set) {
    CK(cudaFuncSetAttribute(bwd_dkdv<HD, CAUSAL>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr_set = true;
  }
  const Case &c = w.pr.c;
  bwd_dkdv<HD, CAUSAL><<<dim3(c.S / KB, c.KH, c.B), THREADS, smem>>>(w.maps[0], w.maps[1], w.maps[2], w.maps[3],
                                                                    w.p);
}

static void launch_dkdv(const Bwd &w) {
  const Case &c = w.pr.c;
  if (c.H == 128) c.causal ? launch_dkdv_t<128, true>(w) : launch_dkdv_t<128, false>(w);
  else c.causal ? launch_dkdv_t<64, true>(w) : launch_dkdv_t<64, false>(w);
}

int main(int argc, char **argv) {
  harness_init();
  const BwdVariant two = {"hopper_bwd_02", prepare, launch_dkdv, launch_dq, 2.0, 1.5, true};
  const int rc = racecheck_checks(argc, argv, two); /* `hopper_bwd_02 racecheck`: two checks, no timing */
  if (rc >= 0) return rc ? 1 : 0;
  return run_all(two) ? 1 : 0;
}
