/*
 * dev/hopper_fwd_05.cu — experimental variant 05 of the Hopper (sm_90a) forward with sinks: PERSISTENT CTAs.
 * The library's kernel (src/cuda/hopper_fwd.cu: dev 02's producer / consumer warpgroups, TMA + mbarrier ring,
 * wgmma, the softmax of S_j under P_{j-1} V_{j-1}; dev 04's 176-key tiles at H128 without a mask, dev 03's
 * 3 consumer warpgroups at H64) with one CTA per SM that loops over work tiles (batch, head, m-block).
 *
 * Why: ncu on the H200, B16 T1024 N16 H128 non-causal: ours 0.362 ms (2048 CTAs of 6 key tiles), cuDNN 0.292 ms
 * (persistent, 132 CTAs). Every one of our CTAs pays a prologue (barrier init, Q and first K latency, ~1-2 us,
 * the first S without overlap) and an epilogue (last P V, normalise, O / lse stores) with the tensor core idle;
 * at 6 tiles of ~0.5 us that is ~20%. Here a CTA's producer loads the NEXT work tile's Q and first K/V stages
 * while the consumers finish the current one, and the barriers are initialised once.
 *
 * Work tiles and the scheduler (Sched): tile i in [0, B N n_mb), n_mb = ceil(T / BM).
 * - order: non-causal, and every non-persistent launch: the library's grid order (m-block fastest; causal:
 *   m-blocks of a head heaviest first). Causal persistent: L2 sections of hg query heads (hg x the K/V bytes of
 *   a head / G <= 16 MiB), inside a section all heads' heaviest m-blocks first (the m-block with the most key
 *   tiles), then the next lighter level: the load balances like a global heaviest-first order while the K/V
 *   being read at one time stays in L2 (a global order would read all 256 heads' K/V at T1024 B16 N16: 128 MiB).
 * - persistent non-causal: static stride, tile = blockIdx.x + k gridDim.x (every tile costs the same).
 * - persistent causal: dynamic. The first tile of a CTA is blockIdx.x; the producer thread then fetches
 *   gridDim.x + atomicAdd(ctr, 1) — issued at the top of a tile, used after its K/V loads, so the atomic's
 *   latency hides under them. The counter resets itself: after its last fetch (an index >= total) each CTA's
 *   producer bumps ctr[1]; the last CTA (ctr[1] == gridDim.x - 1) zeroes both (fenced), so the next launch in
 *   the stream starts from 0 without a memset in the timed loop. The checks below run launch after launch on
 *   the same counters, and main reads them back as 0 at the end.
 * - non-persistent mode ("05np"): grid = all tiles, tile = blockIdx.x, no atomics: the library's launch with
 *   this file's code: the fair A/B, timed in the same run, alternating launch by launch.
 * - SA05_HG / SA05_DYNAMIC in the environment override the section size (0: library order) and the counter.
 *
 * MERGE (template switch, "05m", H128 only): persistence hides the next tile's loads, not a warpgroup's own
 * fill and drain: S_0 of a work tile has no P V under its softmax and the last P V has no softmax over it
 * (~1 key tile of tensor time per work tile, 1/6 at T1024). With MERGE the last P V of work tile j is issued
 * with S_0 of work tile j + 1 as the loop body's two commit groups, the softmax of S_0 runs under it, then
 * tile j's epilogue (O, m, l of tile j kept: pb / pn / pr0 / psink / pm / pl); the CTA's last tile drains at
 * the end. Deferred only when the warpgroup releases no key tile after its last one (always at H128): a
 * release would arrive on V empty for a later key tile of the same stage first. At H64 (160 registers) the
 * pending state spills (4-12 B), so "05m" rows at H64 run the 05 kernel.
 *
 * Barriers (initialised once per CTA, phases continue across work tiles):
 * - Q full (count 1): the producer writes the tile index into shared memory (tile_slot), then arrive.expect_tx
 *   Q's bytes and the Q boxes; the consumers of the j-th work tile of this CTA wait parity j & 1 and read the
 *   index (mbarrier arrive = release, try_wait = acquire: the slot needs no other fence). The end: an index >=
 *   total, a plain arrive (no bytes), and the consumers leave.
 * - Q empty (count 4 NC: one arrive per consumer warp, per work tile): after a warpgroup's LAST S = Q K^T of the
 *   tile has landed (the wait_group that returns S), or at once for a warpgroup without tiles (a 192-row
 *   m-block partial past T, or (H64 causal) none of its rows sees a key — not possible in this scope). The
 *   producer waits parity (j & 1) ^ 1 before writing the slot / Q of its j-th tile (j = 0: a fresh barrier,
 *   returns at once). Q then lands under the last P V and the epilogue. No aliasing: Q full of tile j + 1 needs
 *   Q empty of tile j, which needs every consumer warp past Q full of tile j, and back.
 * - K/V ring (2 stages; per stage K full, V full (count 1), K empty, V empty (count 4 NC)): the producer and every
 *   consumer warp walk the same sequence x = 0, 1, 2, ... of key tiles over all work tiles of the CTA (each work
 *   tile adds its n_tiles; all decode the same index), stage x % 2, parity (x / 2) & 1, exactly as one long
 *   key loop of the library's kernel; a warpgroup that computes only tiles [0, e) of a work tile releases [e,
 *   n_tiles) unread, in order, each after its full barrier (the library's release loop). So the next tile's K_0
 *   goes into the stage K_{n-2} left (released after S_{n-2}), V_0 after P_{n-2} V_{n-2}, K_1 after S_{n-1}.
 * - WAR hazards: TMA writes Q' only after every consumer warp's last wgmma reading Q has completed (Q empty);
 *   K / V stages as in the library (K empty after S lands, V empty after P V lands). The tile slot is rewritten
 *   only after Q empty, i.e. after every consumer warp has read it (read right after Q full, arrive later).
 *
 * Configurations (Cfg<HD, NC, BN, CAUSAL>): H128 non-causal 2 consumer warpgroups x 176 keys (dev 04, one Q
 * buffer: Q 32 KiB + 2 x (K + V) x 44 KiB = 208 KiB + 1 KiB slack; a second Q buffer would not fit, hence the
 * Q-empty barrier); H128 causal 2 x 128 keys (160 KiB); H64 3 consumer warpgroups x 128 keys (BM 192: Q one
 * 192-row box per CTA, rows past T zero-filled by TMA and counted in complete_tx like 04's 176-key boxes past S;
 * a warpgroup whose rows are all past T computes nothing, stores nothing, releases every tile; 88 KiB).
 * Causal is top-left (key j visible to row i iff j <= i; every row sees key 0, so no empty rows here); T != S
 * both ways. Semantics are the library's: log2-domain online softmax with the running max seeded with the sink
 * (capped below +inf), the sink once in the final normalisation (the library's form), lse [B, N, T] includes it;
 * a row without a visible key would give out 0, lse = sink.
 * Scope: bf16, H = Hv in {64, 128}, T and S multiples of 128, N % K == 0. PTX wrappers, reference and harness:
 * dev/hopper_common.cuh. `hopper_fwd_05 racecheck`: two small checks (persistent, small grids), no timing.
 */
#include "hopper_common.cuh"

#include <type_traits>

namespace v05 {

template <int HD_, int NC_, int BN_, bool CAUSAL_>
struct Cfg {
  static constexpr int HD = HD_, NC = NC_, BN = BN_;
  static constexpr bool CAUSAL = CAUSAL_;
  static constexpr int BM = 64 * NC, THREADS = 128 * (NC + 1);
  static constexpr int REGS = NC == 3 ? 160 : 240; /* consumers after setmaxnreg; producer 24 */
  static constexpr int CB = HD / 64;               /* 128-byte column blocks per row */
  static constexpr int SN = BN / 2, PN = BN / 4;   /* S accumulators, packed P registers per thread */
  static constexpr uint32_t Q_BYTES = BM * HD * 2, KV_BYTES = BN * HD * 2;
  static constexpr int SMEM = 1024 /* alignment slack */ + Q_BYTES + STAGES * 2 * KV_BYTES;
  static constexpr bool KEY_TAIL = 128 % BN != 0; /* 176 keys: the last tile may hold keys >= S */
  static_assert(128 * 24 + 128 * NC * REGS <= 65536 && REGS % 8 == 0, "register file: producer 24 + consumers");
  static_assert(SMEM + 1024 <= 227 * 1024, "shared memory over the sm_90 limit (+1 KiB of static barriers)");
  static_assert(BN % 16 == 0 && BN <= 256 && BM <= 256 && (BN * 128) % 1024 == 0, "k16 steps, TMA boxes, atoms");
  static_assert(!CAUSAL || BN == 128, "the causal mask and tile counts take 128-key tiles");
  static_assert(BN == 128 || (BN == 176 && HD == 128), "S product shapes: m64n128 / m64n176");
};

struct Sched {
  int total;     /* work tiles: B N n_mb */
  int n_mb;      /* m-blocks per (b, head): ceil(T / BM) */
  int hg;        /* > 0: causal L2-section order with hg heads per section; 0: the library's grid order */
  int dynamic;   /* 1: atomic tile counter (ctr[0]) after the first tile; 0: static stride */
  unsigned *ctr; /* [2]: next tile, CTAs done; zero before the first launch, zeroed by each launch's last CTA */
};

/* Barrier slots: 0 Q full, 1 Q empty, then per stage s: K full, V full, K empty, V empty (8 bytes each). */
__device__ __forceinline__ uint32_t b_qf(uint32_t b0) { return b0; }
__device__ __forceinline__ uint32_t b_qe(uint32_t b0) { return b0 + 8; }
__device__ __forceinline__ uint32_t b_kf(uint32_t b0, int s) { return b0 + 16 + 32 * s; }
__device__ __forceinline__ uint32_t b_vf(uint32_t b0, int s) { return b0 + 24 + 32 * s; }
__device__ __forceinline__ uint32_t b_ke(uint32_t b0, int s) { return b0 + 32 + 32 * s; }
__device__ __forceinline__ uint32_t b_ve(uint32_t b0, int s) { return b0 + 40 + 32 * s; }

#define SA_F88(d) SA_F64(d), SA_F8(d, 64), SA_F8(d, 72), SA_F8(d, 80)
#define SA_REGS88 SA_REGS64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, " \
                  "%79, %80, %81, %82, %83, %84, %85, %86, %87"

/* D[64x176] (+)= A[64x16] B[16x176], A and B K-major in shared memory; scale_d 0 overwrites D. */
__device__ __forceinline__ void wgmma_ss_n176(float (&d)[88], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %90, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 {" SA_REGS88 "}, %88, %89, p, 1, 1, 0, 0;\n}\n"
      : SA_F88(d)
      : "l"(da), "l"(db), "r"(scale_d));
}

/* S = Q K^T for one warpgroup: H / 16 k-steps, 32 bytes apart inside a 128-byte swizzled row, 4 per block;
   Q's column blocks are BM x 128 bytes apart, K's BN x 128 (176 rows = 22 swizzle atoms: still 1024-aligned). */
template <class C>
__device__ __forceinline__ void gemm_qk(float (&sacc)[C::SN], uint32_t sq_wg, uint32_t skb) {
#pragma unroll
  for (int kk = 0; kk < C::HD / 16; ++kk) {
    const uint64_t da = gmma_desc(sq_wg + (kk / 4) * C::BM * 128 + (kk % 4) * 32, 16, 1024);
    const uint64_t db = gmma_desc(skb + (kk / 4) * C::BN * 128 + (kk % 4) * 32, 16, 1024);
    if constexpr (C::BN == 176) wgmma_ss_n176(sacc, da, db, kk > 0);
    else wgmma_ss_n128(sacc, da, db, kk > 0);
  }
}

/* O += P V: V N-major; a k-step is 16 keys = 2048 bytes; V's 64-column blocks are BN x 128 bytes apart (LBO).
   m64n128k16 at H128, m64n64k16 at H64 (wgmma_rs overloads on O's size). */
template <class C>
__device__ __forceinline__ void gemm_pv(float (&o)[C::HD / 2], const uint32_t (&pf)[C::PN], uint32_t svb) {
#pragma unroll
  for (int kk = 0; kk < C::BN / 16; ++kk) wgmma_rs(o, &pf[4 * kk], gmma_desc(svb + kk * 2048, C::BN * 128, 1024));
}

/* Top-left causal on a 128-key tile crossing the diagonal: with x = key0 + 2 (lane % 4) - r0, element (j, e)
   of row r0 is key - row = x + c (c = 8j + e), invisible iff x > -c; of row r0 + 8 iff x > 8 - c. One compare
   with an immediate per element (the library's mask_range with dhi = 0). */
template <int SN>
__device__ __forceinline__ void mask_causal(float (&sacc)[SN], int x) {
#pragma unroll
  for (int j = 0; j < SN / 4; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int c = 8 * j + e;
      if (x > -c) sacc[4 * j + e] = -INFINITY;
      if (x > 8 - c) sacc[4 * j + 2 + e] = -INFINITY;
    }
}

/* Keys past S in the last 176-key tile: TMA zero-filled their K and V rows, so they would score 0, not -inf.
   lim = S - key0 - 2 (lane % 4): column 8j + 2 (lane % 4) + e is a key < S iff 8j + e < lim (both rows). */
template <int SN>
__device__ __forceinline__ void mask_keys(float (&sacc)[SN], int lim) {
#pragma unroll
  for (int j = 0; j < SN / 4; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      if (8 * j + e >= lim) sacc[4 * j + e] = sacc[4 * j + 2 + e] = -INFINITY;
}

/* Online softmax of one tile, in place (scores -> fp32 probabilities relative to the new running max m_);
   corr rescales what was accumulated against the old max. The library's softmax_tile. */
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

/* P in bf16 as the A operand of the P V wgmma: k-step kk = accumulator blocks 2kk, 2kk + 1. */
template <int SN>
__device__ __forceinline__ void pack_p(uint32_t (&pf)[SN / 2], const float (&sacc)[SN]) {
#pragma unroll
  for (int i = 0; i < SN / 2; ++i) pf[i] = pack_bf16(sacc[2 * i], sacc[2 * i + 1]);
}

/* Work tile i -> (b N + head, m-block). hg > 0 (causal persistent): sections of hg heads, in a section the
   heaviest m-block of every head first; the last section may hold fewer heads. Else the library's grid order:
   m-block fastest, reversed when causal (heaviest first within a head). */
__device__ __forceinline__ void decode_tile(int i, const Sched &sc, int BH, bool causal, int &bh, int &mb) {
  if (causal && sc.hg > 0) {
    const int span = sc.hg * sc.n_mb, sec = i / span, r = i - sec * span;
    const int hg = min(sc.hg, BH - sec * sc.hg), lvl = r / hg;
    mb = sc.n_mb - 1 - lvl;
    bh = sec * sc.hg + (r - lvl * hg);
  } else {
    bh = i / sc.n_mb;
    const int r = i - bh * sc.n_mb;
    mb = causal ? sc.n_mb - 1 - r : r;
  }
}

/* Key tiles of a work tile: top-left causal skips the tiles past its last real row. n_keyt = ceil(S / BN). */
template <class C>
__device__ __forceinline__ int cta_key_tiles(int m0, int T, int n_keyt) {
  if (!C::CAUSAL) return n_keyt;
  const int last_row = min(T, m0 + C::BM) - 1;
  return min(n_keyt, last_row / C::BN + 1);
}

template <class C, bool MERGE>
__global__ void __launch_bounds__(C::THREADS, 1)
    hopper_fwd05(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmk,
                 const __grid_constant__ CUtensorMap tmv, const FwdParams p, const Sched sc) {
  constexpr int HD = C::HD, NC = C::NC, BM = C::BM, BN = C::BN, SN = C::SN, PN = C::PN;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar[2 + 4 * STAGES];
  __shared__ float anchor[4 * NC]; /* the library's wait_group-0 anchor, one word per consumer warp */
  __shared__ int tile_slot;        /* the current work tile, written before Q full, read after it */

  const uint32_t sq = (smem_u32(smem_raw) + 1023u) & ~1023u; /* swizzle atoms need 1024-byte alignment */
  const uint32_t sk = sq + C::Q_BYTES, sv = sk + STAGES * C::KV_BYTES, b0 = smem_u32(bar);
  const int BH = p.B * p.N, G = p.N / p.KH, n_keyt = (p.S + BN - 1) / BN;
  /* Warp-uniform for ptxas (the library's shuffle): descriptors and ring state stay in uniform registers. */
  const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);

  if (threadIdx.x == 0) {
    mbar_init(b_qf(b0), 1);      /* the producer's arrive (.expect_tx), then Q's bytes */
    mbar_init(b_qe(b0), 4 * NC); /* one arrive per consumer warp per work tile */
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(b_kf(b0, s), 1);
      mbar_init(b_vf(b0, s), 1);
      mbar_init(b_ke(b0, s), 4 * NC);
      mbar_init(b_ve(b0, s), 4 * NC);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    /* Producer: 24 registers (128 x 24 + 128 NC x REGS <= 65536). One thread: per work tile the slot, Q, then
       the key tiles K before V, into the ring whose position x carries over from the previous work tile. */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (threadIdx.x == 0) {
      int tile = blockIdx.x;
      uint32_t x = 0, jq = 0;
      for (;;) {
        /* The next index, fetched before this tile's loads so the atomic's latency hides under them. */
        int next = tile + (int)gridDim.x;
        if (sc.dynamic && tile < sc.total) next = (int)gridDim.x + (int)atomicAdd(sc.ctr, 1u);
        mbar_wait(b_qe(b0), (jq & 1) ^ 1); /* every consumer warp is past its last S of work tile jq - 1 */
        *(volatile int *)&tile_slot = tile;
        if (tile >= sc.total) {            /* the end: consumers read the index and leave */
          mbar_arrive(b_qf(b0));
          break;
        }
        int bh, mb;
        decode_tile(tile, sc, BH, C::CAUSAL, bh, mb);
        const int b = bh / p.N, n = bh - b * p.N, kvh = n / G, m0 = mb * BM;
        const int n_tiles = cta_key_tiles<C>(m0, p.T, n_keyt);
        /* One BM-row box per column block; rows past T (a partial 192-row m-block) are zero-filled and counted. */
        mbar_arrive_tx(b_qf(b0), C::Q_BYTES);
        for (int c = 0; c < C::CB; ++c) tma_load(sq + c * BM * 128, &tmq, b_qf(b0), c * 64, n, m0, b);
        for (int it = 0; it < n_tiles; ++it, ++x) {
          const int s = x % STAGES;
          const uint32_t ph = (x / STAGES) & 1;
          mbar_wait(b_ke(b0, s), ph ^ 1);
          mbar_arrive_tx(b_kf(b0, s), C::KV_BYTES);
          for (int c = 0; c < C::CB; ++c)
            tma_load(sk + s * C::KV_BYTES + c * BN * 128, &tmk, b_kf(b0, s), c * 64, kvh, it * BN, b);
          mbar_wait(b_ve(b0, s), ph ^ 1);
          mbar_arrive_tx(b_vf(b0, s), C::KV_BYTES);
          for (int c = 0; c < C::CB; ++c)
            tma_load(sv + s * C::KV_BYTES + c * BN * 128, &tmv, b_vf(b0, s), c * 64, kvh, it * BN, b);
        }
        ++jq;
        tile = next;
      }
      if (sc.dynamic) {
        /* Self-reset: this CTA's fetches are done (fence: ordered before its ctr[1] bump); the last CTA to get
           here zeroes both counters for the next launch. No CTA touches them afterwards in this launch. */
        __threadfence();
        if (atomicAdd(sc.ctr + 1, 1u) == gridDim.x - 1) {
          __threadfence();
          atomicExch(sc.ctr, 0u);
          atomicExch(sc.ctr + 1, 0u);
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::REGS) : "memory");
  const int cw = wg - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, t = lane % 4;
  const uint32_t sq_wg = sq + cw * 64 * 128; /* this warpgroup's 64 rows of each Q column block */
  const uint32_t anc = smem_u32(&anchor[4 * cw + warp]);
  const int T = p.T, N = p.N;
  const float sl2 = p.scale_l2;

  /* Accumulator layout of m64nN (per warp 16 rows): d[4j + e]: row lane/4 + 8 (e >> 1), column 8j + 2 (lane %
     4) + (e & 1). */
  float o[HD / 2], sacc[SN], corr[2];
  uint32_t pf[PN];
  uint32_t x0 = 0, jq = 0; /* ring position at the start of this work tile; work tiles done */
  /* MERGE: the work tile whose last P V (key tile px, P in pf, O in o) and epilogue are still to do. */
  bool pend = false;
  uint32_t px = 0;
  int pb = 0, pn = 0, pr0 = 0;
  float psink = 0.f, pm[2] = {0.f, 0.f}, pl[2] = {0.f, 0.f};

  /* Final normalisation in the library's form: the larger of the running max and the sink contributes 2^0
     exactly; lse in the natural-log domain. No valid key and no sink (m = -inf): out 0, lse = sink. The
     producer may already be writing the next Q: this touches no shared memory. */
  auto store_out = [&](int b, int n, int r0, float sink, const float (&m_)[2], const float (&l_)[2]) {
    const float sink_l2 = sink * LOG2E;
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
  };
  /* The last P V of a work tile (key tile x), alone on the tensor core. */
  auto last_pv = [&](uint32_t x) {
    const int s = x % STAGES;
    mbar_wait(b_vf(b0, s), (x / STAGES) & 1);
    pin(o);
    pin(pf);
    wgmma_fence();
    gemm_pv<C>(o, pf, sv + s * C::KV_BYTES);
    wgmma_commit();
    wgmma_wait0();
    pin(o);
    if (lane == 0) mbar_arrive(b_ve(b0, s));
  };

  for (;;) {
    mbar_wait(b_qf(b0), jq & 1);
    /* Lane 0 alone reads the slot: the Q-empty arrive that lets the producer overwrite it is lane 0's, and an
       mbarrier arrive releases only the arriving thread's accesses (racecheck, H200 session 4: 112 WAR hazards
       between lanes 1..31's reads here and the producer's next write when every lane read it). */
    int slot = 0;
    if (lane == 0) slot = *(volatile int *)&tile_slot;
    const int tile = __shfl_sync(0xffffffffu, slot, 0);
    if (tile >= sc.total) break;
    int bh, mb;
    decode_tile(tile, sc, BH, C::CAUSAL, bh, mb);
    const int b = bh / N, n = bh - b * N, m0 = mb * BM;
    const int n_tiles = cta_key_tiles<C>(m0, T, n_keyt);
    const int wg_row0 = m0 + 64 * cw;              /* T % 64 == 0: all 64 rows below T or none */
    const int r0 = wg_row0 + 16 * warp + lane / 4; /* this thread's rows: r0 and r0 + 8 */
    /* This warpgroup computes key tiles [0, e): those its own rows see (causal: up to its last row's key). */
    const int e = wg_row0 >= T ? 0 : C::CAUSAL ? min(n_keyt, (wg_row0 + 63) / BN + 1) : n_tiles;
    const float sink = p.softmax == SM_LEARNABLE ? __ldg(p.sinks + n) : p.softmax == SM_OFF_BY_ONE ? 0.f : -INFINITY;

    /* Tiles [from, to) of this work tile released unread, each after its full barrier (its phase). */
    auto release = [&](int from, int to) {
      for (int it = from; it < to; ++it) {
        const uint32_t x = x0 + it;
        const int s = x % STAGES;
        const uint32_t ph = (x / STAGES) & 1;
        mbar_wait(b_kf(b0, s), ph);
        if (lane == 0) mbar_arrive(b_ke(b0, s));
        mbar_wait(b_vf(b0, s), ph);
        if (lane == 0) mbar_arrive(b_ve(b0, s));
      }
    };
    auto mask_tile = [&](int key0) {
      if constexpr (C::CAUSAL) {
        if (key0 + BN - 1 > wg_row0) mask_causal(sacc, key0 + 2 * t - r0);
      } else if constexpr (C::KEY_TAIL) {
        if (key0 + BN > p.S) mask_keys(sacc, p.S - key0 - 2 * t);
      }
    };

    if (e == 0) { /* no rows (or no visible key): Q unread, every key tile released */
      if (lane == 0) mbar_arrive(b_qe(b0));
      if (MERGE && pend) { /* the pending V stage first: each empty barrier takes its arrivals in key order */
        last_pv(px);
        store_out(pb, pn, pr0, psink, pm, pl);
        pend = false;
      }
      release(0, n_tiles);
    } else {
      const float seed = fminf(sink * LOG2E, 3.0e38f); /* the library's cap: a +inf sink keeps exp2(m - m) = 1 */
      float m_[2] = {seed, seed}, l_[2] = {0.f, 0.f};

      /* Tile 0: S_0, then its softmax; O is zeroed after it (nothing to rescale). MERGE with a pending work
         tile: S_0 and that tile's last P V as two commit groups, the softmax of S_0 under the P V (the loop
         body's shape across the work-tile boundary), then that tile's epilogue. Two whole copies (M = the
         merge): with one copy and two `if (merge)` tests ptxas joins the paths, sees O possibly written by an
         in-flight P V at `o = 0` and serialises every wgmma of the kernel (C7515). */
      auto tile0 = [&](auto merge_tag) {
        constexpr bool M = decltype(merge_tag)::value;
        const int s = x0 % STAGES, sp = px % STAGES;
        mbar_wait(b_kf(b0, s), (x0 / STAGES) & 1);
        if (M) mbar_wait(b_vf(b0, sp), (px / STAGES) & 1);
        pin(sacc);
        if (M) {
          pin(o);
          pin(pf);
        }
        wgmma_fence();
        gemm_qk<C>(sacc, sq_wg, sk + s * C::KV_BYTES);
        wgmma_commit();
        if (M) {
          gemm_pv<C>(o, pf, sv + sp * C::KV_BYTES);
          wgmma_commit();
          wgmma_wait1();
        } else {
          wgmma_wait0();
        }
        pin(sacc);
        if (lane == 0) mbar_arrive(b_ke(b0, s));
        if (e == 1 && lane == 0) mbar_arrive(b_qe(b0)); /* its last S: Q is free for the next work tile */
        mask_tile(0);
        softmax_tile(sacc, m_, l_, corr, sl2);
        if (M) {
          if (lane == 0) asm volatile("st.shared.f32 [%0], %1;" ::"r"(anc), "f"(l_[0] + l_[1]) : "memory");
          wgmma_wait0();
          pin(o);
          pin(pf);
          if (lane == 0) mbar_arrive(b_ve(b0, sp));
          store_out(pb, pn, pr0, psink, pm, pl);
        }
#pragma unroll
        for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
        pack_p(pf, sacc);
      };
      if (MERGE && pend) {
        tile0(std::true_type{});
        pend = false;
      } else {
        tile0(std::false_type{});
      }

      for (int it = 1; it < e; ++it) {
        const uint32_t x = x0 + it, xp = x - 1;
        const int s = x % STAGES, sp = xp % STAGES;
        mbar_wait(b_kf(b0, s), (x / STAGES) & 1);
        mbar_wait(b_vf(b0, sp), (xp / STAGES) & 1);
        pin(sacc);
        pin(o);
        pin(pf);
        wgmma_fence();
        gemm_qk<C>(sacc, sq_wg, sk + s * C::KV_BYTES); /* group 1: S_j */
        wgmma_commit();
        gemm_pv<C>(o, pf, sv + sp * C::KV_BYTES);      /* group 2: O += P_{j-1} V_{j-1} */
        wgmma_commit();
        wgmma_wait1();                                  /* S_j has landed; P V may still run */
        pin(sacc);
        if (lane == 0) mbar_arrive(b_ke(b0, s));
        if (it == e - 1 && lane == 0) mbar_arrive(b_qe(b0)); /* last S of this work tile: release Q */
        mask_tile(it * BN);
        softmax_tile(sacc, m_, l_, corr, sl2);
        /* The library's anchor: a shared store depending on every exp2 keeps ptxas from hoisting the
           wait_group 0 above them (nvcc 13.0), so the exp2s stay under P V. */
        if (lane == 0) asm volatile("st.shared.f32 [%0], %1;" ::"r"(anc), "f"(l_[0] + l_[1]) : "memory");
        wgmma_wait0(); /* P_{j-1} V_{j-1} has landed: O and pf are free */
        pin(o);
        pin(pf);
        if (lane == 0) mbar_arrive(b_ve(b0, sp));
#pragma unroll
        for (int j = 0; j < HD / 8; ++j)
#pragma unroll
          for (int q = 0; q < 4; ++q) o[4 * j + q] *= corr[q >> 1];
        pack_p(pf, sacc);
      }

      if (MERGE && e == n_tiles) {
        /* Defer the last P V and the epilogue to the next work tile's first step (or the end). Only when no
           tile of this work tile is released after it: a release would arrive on V empty for a later key tile
           of the same stage before this one's (counted into the wrong phase). */
        pend = true;
        px = x0 + e - 1;
        pb = b, pn = n, pr0 = r0, psink = sink;
        pm[0] = m_[0], pm[1] = m_[1], pl[0] = l_[0], pl[1] = l_[1];
      } else {
        last_pv(x0 + e - 1);
        release(e, n_tiles); /* causal H64: tiles only the CTA's later warpgroups see */
        store_out(b, n, r0, sink, m_, l_);
      }
    }
    x0 += n_tiles;
    ++jq;
  }
  if (MERGE && pend) { /* the CTA's last work tile */
    last_pv(px);
    store_out(pb, pn, pr0, psink, pm, pl);
  }
}

} /* namespace v05 */

#include "hopper_fwd_05_host.cuh" /* the host half: configurations, launches, checks, timing, main */
