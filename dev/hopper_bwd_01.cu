/*
 * dev/hopper_bwd_01.cu — experimental variant 01 of the Hopper (sm_90a) backward with sinks, FlashAttention-3
 * style, in the library's atomic-free two-pass shape (src/cuda/cuda_bwd.cu):
 *   1. bwd_pre    (hopper_bwd_common.cuh) one warp per (b, n, row): D = rowsum(dO * O) (no dlse here),
 *                 lse2 = lse * log2(e) (+inf for an empty row, so its P is 0), the row's sink term -exp(a - lse) D;
 *   2. bwd_dkdv   one CTA per (b, kv head, 128 keys); K and V loaded once by TMA; Q, dO tiles of 64 rows and the
 *                 matching lse2 / D (bulk copies) of each query block of the G heads streamed by a producer
 *                 warpgroup through a 2-stage mbarrier ring; 2 consumer warpgroups of 64 keys compute
 *                 S^T = K Q^T and dP^T = V dO^T with wgmma SS (m64n64), P^T = exp2(S^T sl2 - lse2),
 *                 dS^T = P^T (dP^T - D), then dV += P^T dO and dK += dS^T Q with wgmma RS (P^T / dS^T straight
 *                 from the accumulators: the transposed formulation needs no shared-memory round trip);
 *   3. bwd_dq     one CTA per (b, head, 128 queries); Q, dO loaded once; K, V tiles of 64 keys streamed;
 *                 S, dP recomputed (SS), dQ += dS K (RS, K read N-major from the same tile);
 *   4. bwd_dsink  (hopper_bwd_common.cuh) dsinks[n] = sum of the row terms in a fixed order, one block per head.
 * No atomics: every output element has one writer, so the result is bitwise reproducible.
 * "hopper_bwd_01a" (template flag ATOMIC, H 128): the one-pass form — bwd_dkdv also computes dQ^T from dS^T
 * staged in shared memory and adds it to an fp32 buffer by atomics; dq_convert replaces bwd_dq. Both timed.
 * Scope: bf16, H = Hv in {64, 128}, T and S multiples of 128, N % K == 0, causal none or top-left.
 * The reference and the harness (checks, timing, JSON lines) live in dev/hopper_bwd_common.cuh, the PTX
 * wrappers in dev/hopper_common.cuh.
 */
#include "hopper_bwd_parts.cuh" /* tiles, helpers, the dQ pass */

/* D[64x64] (+)= A[64x16] B[16x64], A and B both N-major (M- resp. N-contiguous) in shared memory. */
__device__ __forceinline__ void wgmma_ss_n64_tt(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" SA_REGS32 "}, %32, %33, p, 1, 1, 1, 1;\n}\n"
      : SA_F32(d)
      : "l"(da), "l"(db), "r"(scale_d));
}

/* ---- 2. dK, dV -------------------------------------------------------------------------------------- */

constexpr uint32_t DS_BYTES = KB * QB * 2; /* one dS^T tile [128 keys][64 queries] bf16 (one-pass only) */
template <int HD, bool ATOMIC>
constexpr int dkdv_smem() {
  return 1024 + 2 * KB * HD * 2 + STAGES * 2 * QB * HD * 2 + (ATOMIC ? 2 * DS_BYTES : 0) + STAGES * 2 * QB * 4;
}
static_assert(dkdv_smem<128, true>() <= 227 * 1024 && dq_smem<128>() <= 227 * 1024, "over the sm_90 limit");

/* ATOMIC: the one-pass form (FA3's): each tile's dS^T also goes to shared memory (swizzled, as wgmma reads
   it), and after a barrier of the two consumer warpgroups each computes dQ^T for 64 of the head's columns,
   K^T[64 x 128 keys] dS^T[128 keys x 64 queries] by 8 wgmma with both operands N-major, and adds it to the fp32
   dq_acc [B, N, H, T] by red.global.add.v2.f32 (query pairs are adjacent there); bwd_dq is then not run. */
template <int HD, bool CAUSAL, bool ATOMIC>
__global__ void __launch_bounds__(THREADS, 1)
    bwd_dkdv(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmdo,
             const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv, const BwdParams p) {
  static_assert(!ATOMIC || HD == 128, "one-pass: each consumer warpgroup takes one 64-column half of dQ^T");
  constexpr int CB = HD / 64;
  constexpr uint32_t KV_BYTES = KB * HD * 2, QT_BYTES = QB * HD * 2, LD_BYTES = 2 * QB * 4;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar[1 + 2 * STAGES]; /* K+V full; per stage full; per stage empty */
  __shared__ float anchor[4 * NC];

  const uint32_t raw = smem_u32(smem_raw), sk = (raw + 1023u) & ~1023u, sv = sk + KV_BYTES;
  const uint32_t sq = sv + KV_BYTES, sdo = sq + STAGES * QT_BYTES, sds = sdo + STAGES * QT_BYTES;
  const uint32_t sld = sds + (ATOMIC ? 2 * DS_BYTES : 0);
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
        const size_t li = ((size_t)b * p.N + n) * T + i0;
        bulk_load(sld + s * LD_BYTES, p.lse2 + li, QB * 4, bar_full(s));
        bulk_load(sld + s * LD_BYTES + QB * 4, p.D + li, QB * 4, bar_full(s));
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
  float dk[HD / 2], dv[HD / 2], st[32], dpt[32], dqt[32]; /* dqt: one-pass only */
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
    /* One-pass: dS^T rows of this thread (keys kr - k0, + 8; df[2j + h] holds queries 8j + 2t, + 1 of row h)
       into the 128-byte swizzled layout: 16-byte chunk j of row r lands at chunk j ^ (r % 8). Two buffers by
       tile parity: a warpgroup passing tile j + 1's barrier knows the other finished tile j's products. */
    const uint32_t sds_s = sds + (it & 1) * DS_BYTES;
    if (ATOMIC) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = kr - k0 + 8 * h;
#pragma unroll
        for (int j = 0; j < 8; ++j)
          asm volatile("st.shared.b32 [%0], %1;" ::"r"(sds_s + r * 128 + ((j ^ (r & 7)) << 4) + 4 * t),
                       "r"(df[2 * j + h]) : "memory");
      }
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* generic stores -> wgmma reads */
      asm volatile("bar.sync 1, 256;" ::: "memory");                /* both warpgroups' dS^T are in */
      zero(dqt);
      pin(dqt);
    }
    pin(dv);
    pin(dk);
    pin(pf);
    pin(df);
    wgmma_fence();
    gemm_rs<HD>(dv, pf, sdo_s); /* dV += P^T dO */
    gemm_rs<HD>(dk, df, sq_s);  /* dK += dS^T Q */
    if (ATOMIC) /* dQ^T[64 cw + .., q] = K^T dS^T: K's column block cw read N-major, 16 keys = 2048 B per step */
#pragma unroll
      for (int kk = 0; kk < KB / 16; ++kk)
        wgmma_ss_n64_tt(dqt, gmma_desc(sk + cw * KB * 128 + kk * 2048, KB * 128, 1024),
                        gmma_desc(sds_s + kk * 2048, QB * 128, 1024), kk > 0);
    wgmma_commit();
    wgmma_wait0();
    pin(dv);
    pin(dk);
    pin(pf);
    pin(df);
    if (ATOMIC) {
      pin(dqt);
      const int n = kvh * G + it / per_head;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float *row = p.dq_acc + (((size_t)b * p.N + n) * HD + 64 * cw + 16 * warp + lane / 4 + 8 * h) * T + i0;
#pragma unroll
        for (int j = 0; j < 8; ++j)
          asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(row + 8 * j + 2 * t), "f"(dqt[4 * j + 2 * h]),
                       "f"(dqt[4 * j + 2 * h + 1]) : "memory");
      }
    }
    if (lane == 0) mbar_arrive(bar_empty(s));
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

template <int HD, bool CAUSAL, bool ATOMIC>
static void launch_dkdv_t(const Bwd &w) {
  constexpr int smem = dkdv_smem<HD, ATOMIC>();
  static bool attr_set = false;
  if (!attr_set) {
    CK(cudaFuncSetAttribute(bwd_dkdv<HD, CAUSAL, ATOMIC>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr_set = true;
  }
  const Case &c = w.pr.c;
  bwd_dkdv<HD, CAUSAL, ATOMIC><<<dim3(c.S / KB, c.KH, c.B), THREADS, smem>>>(w.maps[0], w.maps[1], w.maps[2],
                                                                            w.maps[3], w.p);
}

static void launch_dkdv(const Bwd &w) {
  const Case &c = w.pr.c;
  if (c.H == 128) c.causal ? launch_dkdv_t<128, true, false>(w) : launch_dkdv_t<128, false, false>(w);
  else c.causal ? launch_dkdv_t<64, true, false>(w) : launch_dkdv_t<64, false, false>(w);
}

/* One-pass (H 128 only): dq_acc zeroed, then dK/dV with the dQ^T atomics; the convert kernel is its "dq". */
static void launch_dkdv_atomic(const Bwd &w) {
  const Case &c = w.pr.c;
  CK(cudaMemsetAsync(w.dq_acc, 0, (size_t)c.B * c.T * c.N * c.H * 4));
  c.causal ? launch_dkdv_t<128, true, true>(w) : launch_dkdv_t<128, false, true>(w);
}

/* dq [B, T, N, H] bf16 = scale * dq_acc [B, N, H, T]: 32 x 32 tiles transposed through shared memory. */
__global__ void dq_convert(const float *acc, __nv_bfloat16 *dq, int T, int N, int HD, float scale) {
  __shared__ float tile[32][33];
  const int i0 = blockIdx.x * 32, d0 = blockIdx.y * 32, bn = blockIdx.z, b = bn / N, n = bn % N;
  for (int y = threadIdx.y; y < 32; y += 8)
    tile[y][threadIdx.x] = acc[((size_t)bn * HD + d0 + y) * T + i0 + threadIdx.x];
  __syncthreads();
  for (int y = threadIdx.y; y < 32; y += 8)
    dq[(((size_t)b * T + i0 + y) * N + n) * HD + d0 + threadIdx.x] = __float2bfloat16(tile[threadIdx.x][y] * scale);
}

static void launch_dq_convert(const Bwd &w) {
  const Case &c = w.pr.c;
  dq_convert<<<dim3(c.T / 32, c.H / 32, c.B * c.N), dim3(32, 8)>>>(w.dq_acc, w.dq, c.T, c.N, c.H, w.p.scale);
}

int main(int argc, char **argv) {
  harness_init();
  const BwdVariant two = {"hopper_bwd_01", prepare, launch_dkdv, launch_dq, 2.0, 1.5, true};
  const int rc = racecheck_checks(argc, argv, two); /* `hopper_bwd_01 racecheck`: two checks, no timing */
  if (rc >= 0) return rc ? 1 : 0;
  const BwdVariant one = {"hopper_bwd_01a", prepare, launch_dkdv_atomic, launch_dq_convert, 2.5, 0.0, false};
  const int failed = run_all(two) + run_all(one);
  return failed ? 1 : 0;
}
