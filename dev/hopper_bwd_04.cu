/*
 * dev/hopper_bwd_04.cu — variant 04 of the Hopper (sm_90a) backward: variant 01's two-pass kernels (not the
 * one-pass 01a) with one change in bwd_dkdv: the producer stages lse2[64] and D[64] of each query tile by
 * tensor-map copies (cp.async.bulk.tensor.2d, UTMALDG) instead of raw bulk copies (cp.async.bulk, UBLKCP).
 *   Why: compute-sanitizer racecheck on the H200 reports 12 hazards in the library's copy of this kernel, all
 *   between the raw bulk copy of lse2 / D into a stage and the consumer lanes' ld.shared of them (bench/NOTES.md,
 *   H200 session 2, point 6). The flash-attention project documents this pattern as a racecheck false positive
 *   (AI/RACECHECK_TMA_HAZARD.md, mirrored at contextqmd.com/libraries/flash-attention/versions/2.8.3/pages/AI/
 *   RACECHECK_TMA_HAZARD): racecheck attributes a raw cp.async.bulk's shared-memory write to the issuing thread
 *   and does not take the mbarrier complete_tx completion as a happens-before edge across warps, while a
 *   descriptor-based cp.async.bulk.tensor write is attributed to no thread, so no hazard pair exists; their fix
 *   was to load those small vectors by tensor copies, which is what 04 does. Variant 02 removes the staging
 *   instead (per-thread loads from global memory, R237 of 240 at H128); 04 keeps 01's registers and loop.
 *   Same shared layout, same full barrier, same expect_tx (2 x 16 KiB + 512 B at H128) as 01; the two boxes of
 *   64 fp32 (256 B each) land where 01's bulk copies did. Two more tensor maps: lse2 and D as 2-D fp32 tensors
 *   {T, B N} (innermost first), box {64, 1}, no swizzle; kept in a static of this file (Bwd::maps has 8 slots,
 *   all used by 01's maps). Consumers are 01's, plus the library's __syncwarp() before the elected empty arrive.
 * bwd_pre, bwd_dsink (hopper_bwd_common.cuh) and bwd_dq are 01's unchanged. Everything else keeps 01's names and
 * structure, so `diff dev/hopper_bwd_01.cu dev/hopper_bwd_04.cu` shows the change (and the removed one-pass code).
 * `hopper_bwd_04 racecheck` runs two small checks only, for compute-sanitizer (see main).
 * Scope: bf16, H = Hv in {64, 128}, T and S multiples of 128, N % K == 0, causal none or top-left.
 * The reference and the harness (checks, timing, JSON lines) live in dev/hopper_bwd_common.cuh, the PTX
 * wrappers in dev/hopper_common.cuh.
 */
#include "hopper_bwd_parts.cuh" /* tiles, helpers, the dQ pass */

/* One TMA box of a 2-D tensor map at coordinates {c0 (innermost), c1} into dst, completing on bar. Tile mode,
   no swizzle here: the box lands as it is in global memory. dst must be 128-byte aligned (tensor copies; a raw
   bulk copy needs 16). */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

/* ---- 2. dK, dV -------------------------------------------------------------------------------------- */

/* K, V, the Q / dO ring, then per stage lse2[QB] and D[QB] (fp32, 512 B): 01's layout without 01a's dS^T. */
template <int HD>
constexpr int dkdv_smem() { return 1024 + 2 * KB * HD * 2 + STAGES * 2 * QB * HD * 2 + STAGES * 2 * QB * 4; }
/* TMA rules for the lse2 / D boxes: the box's inner extent a multiple of 16 bytes (64 fp32 = 256 B) and at
   most 256 elements; each box's shared destination 128-byte aligned: the region follows K, V and the Q / dO
   ring from a 1024-byte boundary (multiples of 8 KiB at H 64 and 128), and the boxes sit QB * 4 = 256 B apart. */
static_assert(QB * 4 % 16 == 0 && QB <= 256, "lse2 / D box: inner extent 16-byte multiple, <= 256 elements");
static_assert(QB * 4 % 128 == 0 && (KB * 64 * 2) % 128 == 0 && (QB * 64 * 2) % 128 == 0,
              "lse2 / D box destinations must be 128-byte aligned");
static_assert(dkdv_smem<128>() <= 227 * 1024 && dq_smem<128>() <= 227 * 1024, "over the sm_90 limit");

/* tml / tmd: lse2 and D [B N, T] fp32 as 2-D tensor maps, one box = the 64 values of a query tile. */
template <int HD, bool CAUSAL>
__global__ void __launch_bounds__(THREADS, 1)
    bwd_dkdv(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmdo,
             const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv,
             const __grid_constant__ CUtensorMap tml, const __grid_constant__ CUtensorMap tmd, const BwdParams p) {
  constexpr int CB = HD / 64;
  constexpr uint32_t KV_BYTES = KB * HD * 2, QT_BYTES = QB * HD * 2, LD_BYTES = 2 * QB * 4;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar[1 + 2 * STAGES]; /* K+V full; per stage full; per stage empty */
  __shared__ float anchor[4 * NC];

  const uint32_t raw = smem_u32(smem_raw), sk = (raw + 1023u) & ~1023u, sv = sk + KV_BYTES;
  const uint32_t sq = sv + KV_BYTES, sdo = sq + STAGES * QT_BYTES, sld = sdo + STAGES * QT_BYTES;
  const float *ld_f = reinterpret_cast<const float *>(smem_raw + (sld - raw)); /* per stage: lse2[QB], D[QB] */
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
        mbar_arrive_tx(bar_full(s), 2 * QT_BYTES + LD_BYTES);
        for (int c = 0; c < CB; ++c) {
          tma_load(sq + s * QT_BYTES + c * QB * 128, &tmq, bar_full(s), c * 64, n, i0, b);
          tma_load(sdo + s * QT_BYTES + c * QB * 128, &tmdo, bar_full(s), c * 64, n, i0, b);
        }
        /* 01: two raw bulk copies of 256 B from p.lse2 / p.D + (b N + n) T + i0; now the same bytes by TMA
           boxes at {query i0, row b N + n}, on the same barrier (the 512 B are in the expect_tx above). */
        tma_load_2d(sld + s * LD_BYTES, &tml, bar_full(s), i0, b * p.N + n);
        tma_load_2d(sld + s * LD_BYTES + QB * 4, &tmd, bar_full(s), i0, b * p.N + n);
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
  if (n_tiles > 0) mbar_wait(b0, 0);

  for (int it = 0; it < n_tiles; ++it) {
    const int s = it % STAGES, i0 = (qb0 + it % per_head) * QB;
    const uint32_t sq_s = sq + s * QT_BYTES, sdo_s = sdo + s * QT_BYTES;
    mbar_wait(bar_full(s), (it / STAGES) & 1);
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
    const float *lse2 = ld_f + s * 2 * QB, *Dq = lse2 + QB;
    /* Only tiles with a query below one of the warpgroup's keys carry masked elements. */
    const bool masked = CAUSAL && i0 < kw0 + 63;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 l2 = *reinterpret_cast<const float2 *>(lse2 + 8 * j + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = ex2(fmaf(st[4 * j + e], sl2, -((e & 1) ? l2.y : l2.x)));
        if (masked && kr + 8 * (e >> 1) > i0 + 8 * j + 2 * t + (e & 1)) x = 0.f;
        st[4 * j + e] = x;
      }
    }
    anchor_exp2(st, &anchor[4 * cw + warp], lane);
    wgmma_wait0();
    pin(dpt);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 dd = *reinterpret_cast<const float2 *>(Dq + 8 * j + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e) dpt[4 * j + e] = st[4 * j + e] * (dpt[4 * j + e] - ((e & 1) ? dd.y : dd.x));
    }
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
    /* lse2 / D of this stage were read by every lane with plain loads; mbarrier.arrive releases only the
       arriving thread's accesses, so the warp synchronises first (as the library does): otherwise the
       producer's next copy into the stage is ordered after lane 0's reads only. */
    __syncwarp();
    if (lane == 0) mbar_arrive(bar_empty(s));
  }

  const size_t rs = (size_t)p.KH * HD;
  const size_t base = ((size_t)b * p.S * p.KH + kvh) * HD;
  store_rows<HD>(p.dk + base, dk, rs, kr, t, p.scale); /* zeros where no query sees the keys */
  store_rows<HD>(p.dv + base, dv, rs, kr, t, 1.f);
}

/* lse2 / D [B N, T] fp32 as a 2-D tensor {T, B N} (innermost first), box {QB queries, 1 row}, no swizzle:
   the box is copied as laid out in global memory. TMA needs a 16-byte aligned base and a row stride T * 4 that
   is a multiple of 16 (T % 4 == 0; every case here has T % 128 == 0). L2 promotion 256 B: a box is 256 B. */
static CUtensorMap make_map_rows(const float *base, int rows, int T) {
  if ((uintptr_t)base % 16 != 0 || T % 4 != 0) {
    printf("{\"error\": \"lse2 / D tensor map: base %p or T %d not 16-byte aligned\"}\n", (const void *)base, T);
    exit(2);
  }
  CUtensorMap m;
  cuuint64_t dims[2] = {(cuuint64_t)T, (cuuint64_t)rows};
  cuuint64_t strides[1] = {(cuuint64_t)T * 4};
  cuuint32_t box[2] = {(cuuint32_t)QB, 1}, estr[2] = {1, 1};
  CUresult r = g_encode(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<float *>(base), dims, strides, box, estr,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    printf("{\"error\": \"cuTensorMapEncodeTiled (lse2 / D) failed with %d\"}\n", (int)r);
    exit(2);
  }
  return m;
}

/* Bwd::maps has 8 slots, all taken by 01's maps; the lse2 / D maps of the current problem live here (prepare()
   runs once per problem, before its launches; the harness runs one problem at a time). */
static CUtensorMap g_ld_maps[2];

/* Tensor maps: dK/dV streams 64-row Q / dO tiles and loads 128-row K / V blocks; dQ the other way round; dK/dV
   also streams 64-query boxes of lse2 and D. */
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
  g_ld_maps[0] = make_map_rows(w.lse2, c.B * c.N, c.T);
  g_ld_maps[1] = make_map_rows(w.D, c.B * c.N, c.T);
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
                                                                    g_ld_maps[0], g_ld_maps[1], w.p);
}

static void launch_dkdv(const Bwd &w) {
  const Case &c = w.pr.c;
  if (c.H == 128) c.causal ? launch_dkdv_t<128, true>(w) : launch_dkdv_t<128, false>(w);
  else c.causal ? launch_dkdv_t<64, true>(w) : launch_dkdv_t<64, false>(w);
}

/* `hopper_bwd_04 racecheck`: racecheck_checks (hopper_bwd_common.cuh); without an argument every check, then the
   timings (dev/run_hopper.sh). */
int main(int argc, char **argv) {
  harness_init();
  const BwdVariant two = {"hopper_bwd_04", prepare, launch_dkdv, launch_dq, 2.0, 1.5, true};
  const int rc = racecheck_checks(argc, argv, two);
  if (rc >= 0) return rc ? 1 : 0;
  return run_all(two) ? 1 : 0;
}
