/*
 * dev/hopper_bwd_05.cu — variant 05 of the Hopper (sm_90a) backward: ONE pass. 04's dK/dV kernel (one CTA per
 * (b, kv head, 128 keys); K, V loaded once; Q / dO / lse2 / D of the G heads' 64-row query tiles streamed through
 * the 2-stage TMA ring; S^T, dP^T by wgmma SS; dV += P^T dO, dK += dS^T Q by wgmma RS) also computes each tile's
 * dQ[64 q x H] = dS[64 q x 128 keys] K[128 keys x H] and adds it to dq_acc [B, N, T, H] fp32; 04's dQ pass (which
 * recomputes S and dP: 7 products where one pass does 5) is gone. cuDNN's backward is such a pass (2.30 ms at B4
 * T4096 N16 H128 on the H200, ncu); 04 takes 1.84 + 1.235 ms in two.
 *   dQ: each consumer warpgroup stores its dS^T [64 keys x 64 q] as bf16 into a shared [128 keys][64 q] tile (01a's
 *   swizzled store; two buffers, mbarriers ds_full / ds_empty), then computes one 64-column half of H over all 128
 *   keys: M = 64 queries (dS read MN-major), N = 64 (K's column block, MN-major), 8 wgmma m64n64k16 with both
 *   operands transposed (01a's dQ^T = K^T dS^T with A and B swapped: rows are queries, H is contiguous). A half
 *   needs both warpgroups' dS^T, so dQ of tile j is computed in tile j + 1 after that tile's dV / dK: the wait for
 *   the other warpgroup is a tile old (01a's per-tile bar.sync kept them in step), and the dQ accumulator (32) never
 *   lives beside the P^T / dS^T fragments (32): at most 192 accumulators (dK, dV, S^T, dP^T), as in 04.
 *   No per-element atomics: the dQ halves go to a staging slot in shared memory (four 32-column boxes of [64 rows]
 *   [128 B] in TMA's 128-byte swizzle: 2 wavefronts per float2 warp store, the minimum) and one writer thread of the
 *   producer warpgroup adds the 64 x H tile to dq_acc by four TMA reduces (cp.reduce.async.bulk.tensor .add, fp32
 *   map {H, T, B N}, box {32, 64, 1}) as FlashAttention-3 does; 2 slots (dq_full / dq_empty). dq_convert then
 *   writes dq = scale * dq_acc in bf16; a memset zeroes dq_acc before the kernel.
 *   DET (template flag; our contract): the key blocks of a kv head add into a query tile in a fixed order. One int
 *   semaphore per (b, head, 64-query tile), zeroed with dq_acc: the writer waits until it equals its rank, issues
 *   the reduces, waits for their completion (cp.async.bulk.wait_group 0), fences the async proxy and increments it
 *   (red.release.gpu). Order NAT (default): a head's key blocks visit the tiles staggered (non-causal: key block kb
 *   starts at tile kb d, d = G T / 64 / nkb; causal: the natural order, where key block kb reaches a tile 2 kb steps
 *   before key block 0) and the rank is the visit-step order, so co-started key blocks find their turn come. It
 *   needs a head's S / 128 CTAs co-resident (tickets from an atomic counter make the started CTAs a prefix of the
 *   ticket order: at most one head is part-started); else order ASC: rank = kb, no stagger, waits only on smaller
 *   tickets (deadlock-free on any schedule) but co-started key blocks queue (bench/NOTES.md: a model, causal ~1.8x).
 *   Timed: DET (NAT), DET ASC, and plain (not deterministic; NAT's visiting order, no semaphores).
 * Consumers up to R236 of 240 at H128, no spills. Shared memory at H128: K, V 64 KiB, Q / dO ring 64 KiB, dS^T 32 KiB,
 * staging 64 KiB, lse2 / D 1 KiB, alignment slack 1 KiB, static 1 KiB: 227 KiB, the opt-in limit. H64 (32-column
 * halves, m64n32k16, B at +64 B inside K's swizzled rows) falls out of the templates. bwd_pre, bwd_dsink, the
 * reference and the harness are hopper_bwd_common.cuh's; `hopper_bwd_05 racecheck` runs racecheck_checks for DET
 * (order ASC: it cannot hang however the tool schedules blocks) and plain.
 * Scope: bf16, H = Hv in {64, 128}, T and S multiples of 128, N % K == 0, causal none or top-left.
 */
#include "hopper_bwd_parts.cuh" /* tiles, helpers (04's consumer code uses them) */

enum { ORDER_NAT = 0, ORDER_ASC = 1 };

/* How the CTAs of a launch find their work and their turn. */
struct Sched {
  int *sync;  /* [0]: CTA ticket counter (DET); then one semaphore per (b, head, 64-query tile); zeroed per call */
  int nkb;    /* key blocks per kv head: S / KB */
  int G;      /* query heads per kv head */
  int n_all;  /* G T / QB: tiles of a key block without a mask (a constant-bank loop bound: no register) */
  int d;      /* non-causal NAT: key block kb starts at tile kb * d of its G T / QB */
  int order;  /* ORDER_NAT / ORDER_ASC */
};

/* ---- PTX wrappers not in hopper_common.cuh ------------------------------------------------------------- */

/* One TMA box of a 2-D tensor map at {c0 (innermost), c1} into dst (128-byte aligned), completing on bar. */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
/* global[box at {c0, c1, c2}] += shared[src] (fp32, element type from the map), tracked by bulk async-groups. */
__device__ __forceinline__ void tma_reduce_add(const CUtensorMap *map, uint32_t src, int c0, int c1, int c2) {
  asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];"
               ::"l"((uint64_t)map), "r"(src), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
/* .read: the source shared memory may be rewritten; without it: the global writes are complete. */
__device__ __forceinline__ void bulk_wait_read0() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait0() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void fence_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }
__device__ __forceinline__ int ld_acquire(const int *p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_add(int *p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* D[64xN] (+)= A[64x16] B[16xN], A and B both MN-major in shared memory (imm-trans-a = imm-trans-b = 1). */
__device__ __forceinline__ void wgmma_ss_tt(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" SA_REGS32 "}, %32, %33, p, 1, 1, 1, 1;\n}\n"
      : SA_F32(d)
      : "l"(da), "l"(db), "r"(scale_d));
}
__device__ __forceinline__ void wgmma_ss_tt(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15}, %16, %17, p, 1, 1, 1, 1;\n}\n"
      : SA_F8(d, 0), SA_F8(d, 8)
      : "l"(da), "l"(db), "r"(scale_d));
}

/* ---- the one-pass kernel ----------------------------------------------------------------------------- */

constexpr uint32_t DS_BYTES = KB * QB * 2; /* one dS^T tile [128 keys][64 queries] bf16 */
/* K, V; the Q / dO ring; 2 dS^T tiles; 2 dQ staging slots [H / 32 boxes][64 rows][32 fp32]; per stage lse2, D. */
template <int HD>
constexpr int op_smem() {
  return 1024 + 2 * KB * HD * 2 + STAGES * 2 * QB * HD * 2 + 2 * DS_BYTES + 2 * QB * HD * 4 + STAGES * 2 * QB * 4;
}
/* 231424 B at H128; the static part (13 barriers, 8 anchors, the ticket: 140 B) is padded to 1 KiB by smem_raw's
   1024-byte alignment: 232448 B in all, exactly the opt-in limit (sharedMemPerBlockOptin on the H200). */
static_assert(op_smem<128>() + 1024 <= 227 * 1024, "over the sm_90 limit");

/* The CTA's query tiles in visiting order: head g of the kv head's G, query block q in [qb0, PT); a rotation
   start t0 wraps around the G (PT - qb0) tiles. Stepped, not divided out of the loop counter. */
struct Walk {
  int g, q, qb0, PT, G;
  __host__ __device__ Walk(int t0, int qb0_, int PT_, int G_) : qb0(qb0_), PT(PT_), G(G_) {
    g = t0 / (PT - qb0);
    q = qb0 + t0 % (PT - qb0);
  }
  __host__ __device__ void next() {
    if (++q == PT) {
      q = qb0;
      if (++g == G) g = 0;
    }
  }
};

/* NAT rank of key block kb's visit to tile (g, q): how many key blocks visit it at an earlier step of their walk
   (ties cannot occur). Causal: the visitors are key blocks 0..m, m = min(nkb - 1, q / 2), and key block j reaches
   (g, q) at step g (PT - 2j) + q - 2j: descending j, rank m - kb. Non-causal: key block j starts at tile j d
   (distinct offsets below n_all = G PT when n_all >= nkb, which the host ensures), so tile t = g PT + q comes at
   step t - j d for j <= m = min(nkb - 1, t / d), else t - j d + n_all: the order m, m - 1, .., 0, nkb - 1, .., m + 1,
   rank (m - kb) mod nkb. Equal to counting the earlier visits (15.1 M visits checked on the host, T, S <= 4096). */
template <bool CAUSAL>
__host__ __device__ __forceinline__ int nat_rank(int kb, int g, int q, int nkb, int PT, int d) {
  const int x = CAUSAL ? q * QB / KB : (g * PT + q) / d, m = x < nkb - 1 ? x : nkb - 1;
  return m >= kb ? m - kb : m + nkb - kb; /* causal: always m >= kb */
}

/* dQ half [64 q x NQ] = dS [64 q x 128 keys] K[128 keys x this warpgroup's NQ columns]; 16 keys = 2048 B a step. */
template <int HD>
__device__ __forceinline__ void gemm_dq(float (&dq)[HD / 4], uint32_t sds_x, uint32_t sk, int cw) {
  const int col0 = cw * HD / 2;
  const uint32_t kcol = sk + (col0 / 64) * KB * 128 + (col0 % 64) * 2;
#pragma unroll
  for (int kk = 0; kk < KB / 16; ++kk)
    wgmma_ss_tt(dq, gmma_desc(sds_x + kk * 2048, QB * 128, 1024), gmma_desc(kcol + kk * 2048, KB * 128, 1024), kk > 0);
}

/* This thread's dQ accumulators into staging slot `dst`: 32-column box c holds [64 rows][32 fp32] = 128-byte rows,
   16-byte unit u of row r at u ^ (r % 8) (TMA's 128-byte swizzle). A warp's float2 store covers 8 rows x 32 B:
   the 8 row phases spread them over all 32 banks, 2 wavefronts (the minimum for 256 B). */
template <int HD>
__device__ __forceinline__ void stage_dq(const float (&dq)[HD / 4], uint32_t dst, int cw, int warp, int lane) {
  const int t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * warp + lane / 4 + 8 * h;
#pragma unroll
    for (int j = 0; j < HD / 16; ++j) {
      const int c = cw * (HD / 64) + j / 4, u = 2 * (j % 4) + (t >> 1);
      const uint32_t a = dst + c * QB * 128 + r * 128 + ((u ^ (r & 7)) << 4) + 8 * (t & 1);
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(a), "f"(dq[4 * j + 2 * h]), "f"(dq[4 * j + 2 * h + 1])
                   : "memory");
    }
  }
}

/* tml / tmd: lse2, D [B N, T] fp32 (box 64); tma: dq_acc {H, T, B N} fp32 (box {32, 64, 1}, 128-byte swizzle). */
template <int HD, bool CAUSAL, bool DET>
__global__ void __launch_bounds__(THREADS, 1)
    bwd_onepass(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmdo,
                const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv,
                const __grid_constant__ CUtensorMap tml, const __grid_constant__ CUtensorMap tmd,
                const __grid_constant__ CUtensorMap tma, const BwdParams p, const Sched sc) {
  constexpr int CB = HD / 64;
  constexpr uint32_t KV_BYTES = KB * HD * 2, QT_BYTES = QB * HD * 2, LD_BYTES = 2 * QB * 4, DQ_BYTES = QB * HD * 4;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  /* K+V full; per stage full, empty; per dS^T buffer full, empty; per dQ slot full, empty */
  __shared__ __align__(8) uint64_t bar[1 + 2 * STAGES + 8];
  __shared__ float anchor[4 * NC];
  __shared__ int ticket;

  const uint32_t raw = smem_u32(smem_raw), sk = (raw + 1023u) & ~1023u, sv = sk + KV_BYTES;
  const uint32_t sq = sv + KV_BYTES, sdo = sq + STAGES * QT_BYTES, sds = sdo + STAGES * QT_BYTES;
  const uint32_t sdq = sds + 2 * DS_BYTES, sld = sdq + 2 * DQ_BYTES;
  const float *ld_f = reinterpret_cast<const float *>(smem_raw + (sld - raw)); /* per stage: lse2[QB], D[QB] */
  const uint32_t b0 = smem_u32(bar);
  auto bar_full = [&](int s) { return b0 + 8 * (1 + s); };
  auto bar_empty = [&](int s) { return b0 + 8 * (1 + STAGES + s); };
  auto ds_full = [&](int x) { return b0 + 8 * (1 + 2 * STAGES + x); };
  auto ds_empty = [&](int x) { return b0 + 8 * (3 + 2 * STAGES + x); };
  auto dq_full = [&](int x) { return b0 + 8 * (5 + 2 * STAGES + x); };
  auto dq_empty = [&](int x) { return b0 + 8 * (7 + 2 * STAGES + x); };

  if (threadIdx.x == 0) {
    mbar_init(b0, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bar_full(s), 1);
      mbar_init(bar_empty(s), 4 * NC); /* one arrive per consumer warp */
    }
    for (int x = 0; x < 2; ++x) {
      mbar_init(ds_full(x), 4 * NC);
      mbar_init(ds_empty(x), 4 * NC);
      mbar_init(dq_full(x), 4 * NC);
      mbar_init(dq_empty(x), 1); /* the writer */
    }
    /* DET: tickets in start order, so every CTA with a smaller ticket has started (CUB's decoupled look-back
       does the same): the waits below are then on CTAs that hold an SM or are done, whatever order the
       hardware launches blocks in. */
    if (DET) ticket = atomicAdd(sc.sync, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  /* Key block fastest: a head's key blocks start together. The ticket goes through __shfl_sync so ptxas knows it is
     warp-uniform: n_tiles and the loop state then live in uniform registers (else n_tiles is spilled, DET H128). */
  const int vid = DET ? __shfl_sync(0xffffffffu, ticket, 0) : (int)blockIdx.x;
  const int kb = vid % sc.nkb, kvh = (vid / sc.nkb) % p.KH, b = vid / (sc.nkb * p.KH);
  const int k0 = kb * KB, G = sc.G, T = p.T, PT = T / QB;
  /* Top-left causal: query i sees key j iff j <= i, so query blocks ending before k0 are skipped. */
  const int qb0 = CAUSAL ? k0 / QB : 0, per_head = max(0, PT - qb0), n_tiles = CAUSAL ? G * per_head : sc.n_all;
  const int rot = (!CAUSAL && sc.order == ORDER_NAT && n_tiles > 0) ? kb * sc.d % n_tiles : 0;
  const int wg = threadIdx.x / 128;

  if (wg == 0) {
    /* 128 x 24 + 256 x 240 = 64512 = 384 x 168, the CTA's registers at launch: the pool setmaxnreg.inc draws on */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (n_tiles > 0 && threadIdx.x == 0) { /* the TMA producer (04's, in visiting order) */
      mbar_arrive_tx(b0, 2 * KV_BYTES);
      for (int c = 0; c < CB; ++c) {
        tma_load(sk + c * KB * 128, &tmk, b0, c * 64, kvh, k0, b);
        tma_load(sv + c * KB * 128, &tmv, b0, c * 64, kvh, k0, b);
      }
      Walk w(rot, qb0, PT, G);
      for (int it = 0; it < n_tiles; ++it, w.next()) {
        const int s = it % STAGES, n = kvh * G + w.g, i0 = w.q * QB;
        mbar_wait(bar_empty(s), ((it / STAGES) & 1) ^ 1);
        mbar_arrive_tx(bar_full(s), 2 * QT_BYTES + LD_BYTES);
        for (int c = 0; c < CB; ++c) {
          tma_load(sq + s * QT_BYTES + c * QB * 128, &tmq, bar_full(s), c * 64, n, i0, b);
          tma_load(sdo + s * QT_BYTES + c * QB * 128, &tmdo, bar_full(s), c * 64, n, i0, b);
        }
        tma_load_2d(sld + s * LD_BYTES, &tml, bar_full(s), i0, b * p.N + n);
        tma_load_2d(sld + s * LD_BYTES + QB * 4, &tmd, bar_full(s), i0, b * p.N + n);
      }
    } else if (n_tiles > 0 && threadIdx.x == 32) { /* the dQ writer (warp 1) */
      Walk w(rot, qb0, PT, G);
      const int bn0 = b * p.N + kvh * G; /* row (b N + n) of head g: bn0 + g */
      for (int k = 0; k < n_tiles; ++k, w.next()) {
        const int x = k & 1;
        int *sem = sc.sync + 1 + (size_t)(bn0 + w.g) * PT + w.q;
        mbar_wait(dq_full(x), (k >> 1) & 1);
        if (DET) {
          const int rank = sc.order == ORDER_ASC ? kb : nat_rank<CAUSAL>(kb, w.g, w.q, sc.nkb, PT, sc.d);
          while (ld_acquire(sem) != rank) {
          }
          fence_async_global(); /* the reduce (async proxy) after the acquire that saw the previous adds */
        }
        for (int c = 0; c < HD / 32; ++c)
          tma_reduce_add(&tma, sdq + x * DQ_BYTES + c * QB * 128, c * 32, w.q * QB, bn0 + w.g);
        bulk_commit();
        bulk_wait_read0();
        mbar_arrive(dq_empty(x));
        if (DET) {
          bulk_wait0();         /* this tile's adds are done in L2 ... */
          fence_async_global(); /* ... and ordered before the release */
          red_release_add(sem, 1);
        }
      }
      bulk_wait0();
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  const int cw = wg - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, t = lane % 4;
  const int kw0 = k0 + 64 * cw, kr = kw0 + 16 * warp + lane / 4; /* this thread's keys: kr, kr + 8 */
  const uint32_t sk_wg = sk + cw * 64 * 128, sv_wg = sv + cw * 64 * 128;
  const float sl2 = p.scale_l2;
  /* Accumulators d[4j + e]: row lane/4 + 8 (e >> 1) of the warp's 16, column 8j + 2t + (e & 1). */
  float dk[HD / 2], dv[HD / 2], st[32], dpt[32], dq[HD / 4];
  uint32_t pf[16], df[16];
  zero(dk);
  zero(dv);
  if (n_tiles > 0) mbar_wait(b0, 0);

  for (int it = 0; it < n_tiles; ++it) {
    const int s = it % STAGES, i0 = (qb0 + it % per_head) * QB; /* i0: causal only (no rotation there) */
    const uint32_t sq_s = sq + s * QT_BYTES, sdo_s = sdo + s * QT_BYTES;
    mbar_wait(bar_full(s), (it / STAGES) & 1);
    /* ---- 04's tile: S^T, dP^T, P^T, dS^T ---- */
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
    /* ---- dS^T(it) to shared memory (01a's swizzled store), for both warpgroups' dQ halves ---- */
    const int x = it & 1;
    const uint32_t sds_x = sds + x * DS_BYTES;
    mbar_wait(ds_empty(x), ((it >> 1) & 1) ^ 1); /* both halves of dQ(it - 2) have read this buffer */
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = kr - k0 + 8 * h;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(sds_x + r * 128 + ((j ^ (r & 7)) << 4) + 4 * t),
                     "r"(df[2 * j + h]) : "memory");
    }
    fence_async_shared(); /* generic stores -> wgmma reads */
    __syncwarp();
    if (lane == 0) mbar_arrive(ds_full(x));
    /* ---- dV, dK of this tile; then dQ of the previous one, once P^T / dS^T fragments are dead ---- */
    pin(dv);
    pin(dk);
    pin(pf);
    pin(df);
    wgmma_fence();
    gemm_rs<HD>(dv, pf, sdo_s); /* dV += P^T dO */
    gemm_rs<HD>(dk, df, sq_s);  /* dK += dS^T Q */
    wgmma_commit();
    if (it > 0) mbar_wait(ds_full(x ^ 1), ((it - 1) >> 1) & 1); /* the other half's dS^T(it - 1): a tile old */
    wgmma_wait0();
    pin(dv);
    pin(dk);
    pin(pf);
    pin(df);
    /* lse2 / D of this stage were read by every lane with plain loads: the warp synchronises before the elected
       arrive (mbarrier.arrive releases only the arriving thread's accesses). */
    __syncwarp();
    if (lane == 0) mbar_arrive(bar_empty(s));
    if (it > 0) { /* dQ(it - 1) -> staging slot (it - 1) & 1, once the writer's reduce of dQ(it - 3) read it */
      const int k = it - 1;
      zero(dq); /* dead between tiles: not carried through S^T / dP^T */
      pin(dq);
      wgmma_fence();
      gemm_dq<HD>(dq, sds + (k & 1) * DS_BYTES, sk, cw);
      wgmma_commit();
      wgmma_wait0();
      pin(dq);
      if (lane == 0) mbar_arrive(ds_empty(k & 1));
      mbar_wait(dq_empty(k & 1), ((k >> 1) & 1) ^ 1);
      stage_dq<HD>(dq, sdq + (k & 1) * DQ_BYTES, cw, warp, lane);
      fence_async_shared(); /* generic stores -> the TMA reduce's reads */
      __syncwarp();
      if (lane == 0) mbar_arrive(dq_full(k & 1));
    }
  }
  if (n_tiles > 0) { /* dQ of the last tile */
    const int k = n_tiles - 1;
    mbar_wait(ds_full(k & 1), (k >> 1) & 1);
    zero(dq);
    pin(dq);
    wgmma_fence();
    gemm_dq<HD>(dq, sds + (k & 1) * DS_BYTES, sk, cw);
    wgmma_commit();
    wgmma_wait0();
    pin(dq);
    mbar_wait(dq_empty(k & 1), ((k >> 1) & 1) ^ 1);
    stage_dq<HD>(dq, sdq + (k & 1) * DQ_BYTES, cw, warp, lane);
    fence_async_shared();
    __syncwarp();
    if (lane == 0) mbar_arrive(dq_full(k & 1));
  }

  const size_t rs = (size_t)p.KH * HD;
  const size_t base = ((size_t)b * p.S * p.KH + kvh) * HD;
  store_rows<HD>(p.dk + base, dk, rs, kr, t, p.scale); /* zeros where no query sees the keys */
  store_rows<HD>(p.dv + base, dv, rs, kr, t, 1.f);
}

/* dq [B, T, N, H] bf16 = scale * dq_acc [B, N, T, H]: 8 elements per thread (two float4 in, one 16-byte store),
   consecutive threads along H then N, so the stores are contiguous. Rows (b, i, n) in 32 bits (B T N < 2^31). */
__global__ void dq_convert(const float *acc, __nv_bfloat16 *dq, int T, int N, int HD, float scale, int rows) {
  const int per_row = HD / 8;
  for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < rows * per_row; x += gridDim.x * blockDim.x) {
    const int row = x / per_row, h = (x % per_row) * 8, n = row % N, i = (row / N) % T, b = row / (N * T);
    const float4 *src = reinterpret_cast<const float4 *>(acc + (((size_t)b * N + n) * T + i) * HD + h);
    const float4 a = src[0], c = src[1];
    uint4 o;
    o.x = pack_bf16(a.x * scale, a.y * scale);
    o.y = pack_bf16(a.z * scale, a.w * scale);
    o.z = pack_bf16(c.x * scale, c.y * scale);
    o.w = pack_bf16(c.z * scale, c.w * scale);
    reinterpret_cast<uint4 *>(dq)[x] = o;
  }
}

/* ---- host ----------------------------------------------------------------------------------------- */

static CUtensorMap g_maps5[3]; /* lse2, D, dq_acc of the current problem (Bwd::maps has 8 slots for 01's maps) */
static int *g_sync;            /* Sched::sync */
static size_t g_sync_ints, g_sync_cap;
static int g_sms;

static void encode_or_die(CUtensorMap *m, CUtensorMapDataType ty, int rank, const void *base, const cuuint64_t *dims,
                          const cuuint64_t *strides, const cuuint32_t *box, CUtensorMapSwizzle sw, const char *what) {
  const cuuint32_t estr[3] = {1, 1, 1};
  CUresult r = g_encode(m, ty, rank, const_cast<void *>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    printf("{\"error\": \"cuTensorMapEncodeTiled (%s) failed with %d\"}\n", what, (int)r);
    exit(2);
  }
}

/* As 04: Q / dO 64-row boxes, K / V 128-row boxes, lse2 / D as {T, B N} fp32 boxes of 64; and dq_acc as the
   reduce target {H, T, B N} fp32, box {32, 64, 1}: 128 B inner (the 128-byte swizzle's limit), row stride 4 H. */
static void prepare(Bwd &w) {
  const Case &c = w.pr.c;
  w.maps[0] = make_map(w.pr.q, c.B, c.T, c.N, c.H, QB);
  w.maps[1] = make_map(w.dout, c.B, c.T, c.N, c.H, QB);
  w.maps[2] = make_map(w.pr.k, c.B, c.S, c.KH, c.H, KB);
  w.maps[3] = make_map(w.pr.v, c.B, c.S, c.KH, c.H, KB);
  const cuuint64_t ld_dims[2] = {(cuuint64_t)c.T, (cuuint64_t)c.B * c.N}, ld_str[1] = {(cuuint64_t)c.T * 4};
  const cuuint32_t ld_box[2] = {(cuuint32_t)QB, 1};
  encode_or_die(&g_maps5[0], CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, w.lse2, ld_dims, ld_str, ld_box,
                CU_TENSOR_MAP_SWIZZLE_NONE, "lse2");
  encode_or_die(&g_maps5[1], CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, w.D, ld_dims, ld_str, ld_box,
                CU_TENSOR_MAP_SWIZZLE_NONE, "D");
  const cuuint64_t a_dims[3] = {(cuuint64_t)c.H, (cuuint64_t)c.T, (cuuint64_t)c.B * c.N};
  const cuuint64_t a_str[2] = {(cuuint64_t)c.H * 4, (cuuint64_t)c.T * c.H * 4};
  const cuuint32_t a_box[3] = {32, (cuuint32_t)QB, 1};
  encode_or_die(&g_maps5[2], CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, w.dq_acc, a_dims, a_str, a_box,
                CU_TENSOR_MAP_SWIZZLE_128B, "dq_acc");
  g_sync_ints = 1 + (size_t)c.B * c.N * (c.T / QB);
  if (g_sync_ints > g_sync_cap) {
    if (g_sync) CK(cudaFree(g_sync));
    CK(cudaMalloc(&g_sync, g_sync_ints * 4));
    g_sync_cap = g_sync_ints;
  }
}

/* NAT needs a kv head's S / 128 CTAs co-resident (one per SM: 227 KiB of shared memory) and, non-causal, at least
   as many tiles per CTA as key blocks (distinct start tiles); otherwise ASC. */
static int auto_order(const Case &c) {
  const int nkb = c.S / KB, n_all = (c.N / c.KH) * (c.T / QB);
  return nkb <= g_sms && (c.causal || n_all >= nkb) ? ORDER_NAT : ORDER_ASC;
}

template <int HD, bool CAUSAL, bool DET>
static void launch_t(const Bwd &w, int order) {
  constexpr int smem = op_smem<HD>();
  static bool attr_set = false;
  if (!attr_set) {
    CK(cudaFuncSetAttribute(bwd_onepass<HD, CAUSAL, DET>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr_set = true;
  }
  const Case &c = w.pr.c;
  const int nkb = c.S / KB, n_all = (c.N / c.KH) * (c.T / QB);
  const Sched sc = {g_sync, nkb, c.N / c.KH, n_all, std::max(1, n_all / nkb), order};
  bwd_onepass<HD, CAUSAL, DET><<<nkb * c.KH * c.B, THREADS, smem>>>(w.maps[0], w.maps[1], w.maps[2], w.maps[3],
                                                                   g_maps5[0], g_maps5[1], g_maps5[2], w.p, sc);
}

template <bool DET>
static void launch_kernel(const Bwd &w, int order) {
  const Case &c = w.pr.c;
  if (c.H == 128) c.causal ? launch_t<128, true, DET>(w, order) : launch_t<128, false, DET>(w, order);
  else c.causal ? launch_t<64, true, DET>(w, order) : launch_t<64, false, DET>(w, order);
}

static void zero_sync(const Bwd &) { CK(cudaMemsetAsync(g_sync, 0, g_sync_ints * 4)); }
static void zero_acc(const Bwd &w) {
  const Case &c = w.pr.c;
  CK(cudaMemsetAsync(w.dq_acc, 0, (size_t)c.B * c.T * c.N * c.H * 4));
  zero_sync(w);
}

/* The harness's "dkdv" launch of each mode: both memsets, then the one-pass kernel. ORDER -1: auto_order. */
template <bool DET, int ORDER>
static void onepass(const Bwd &w) {
  zero_acc(w);
  launch_kernel<DET>(w, ORDER >= 0 ? ORDER : DET ? auto_order(w.pr.c) : ORDER_NAT);
}
/* The kernel alone (the semaphores must still start at 0; dq_acc just keeps accumulating). */
template <bool DET, int ORDER>
static void kernel_only(const Bwd &w) {
  if (DET) zero_sync(w);
  launch_kernel<DET>(w, ORDER >= 0 ? ORDER : DET ? auto_order(w.pr.c) : ORDER_NAT);
}
/* The harness's "dq" launch: the convert. */
static void convert(const Bwd &w) {
  const Case &c = w.pr.c;
  const int rows = c.B * c.T * c.N;
  dq_convert<<<std::min((rows * (c.H / 8) + 255) / 256, 132 * 16), 256>>>(w.dq_acc, w.dq, c.T, c.N, c.H, w.p.scale,
                                                                          rows);
}

/* Runs the whole backward 3 times on the same inputs (bench data: out random, lse 8) and compares dq, dk, dv,
   dsinks bitwise with the first run. DET: every run must match; plain: reported (dq may differ). */
static bool repeat_check(const BwdVariant &v, const Case &c, bool must_match) {
  g_var = &v;
  Bwd w;
  bwd_init(w, c, 77);
  v.prepare(w);
  const size_t nq = (size_t)c.B * c.T * c.N * c.H, nk = (size_t)c.B * c.S * c.KH * c.H;
  fill_uniform<<<1024, 256>>>(w.pr.out, nq, 98, 1.f);
  fill_const<<<1024, 256>>>(w.pr.lse, (size_t)c.B * c.N * c.T, 8.f);
  CK(cudaGetLastError());
  std::vector<uint16_t> q0, k0, v0;
  std::vector<float> s0;
  int same[4] = {1, 1, 1, 1};
  for (int r = 0; r < 3; ++r) {
    CK(cudaMemset(w.dq, 0xFF, nq * 2));
    launch_bwd(w);
    sync_or_die("hopper_bwd_05 (repeat)");
    const std::vector<uint16_t> q = d2h_bf16(w.dq, nq), k = d2h_bf16(w.dk, nk), vv = d2h_bf16(w.dv, nk);
    const std::vector<float> s = d2h_f32(w.dsinks, c.N);
    if (r == 0) { q0 = q; k0 = k; v0 = vv; s0 = s; continue; }
    same[0] &= q == q0, same[1] &= k == k0, same[2] &= vv == v0, same[3] &= !memcmp(s.data(), s0.data(), c.N * 4);
  }
  const bool all = same[0] && same[1] && same[2] && same[3];
  printf("{\"repeat\": \"%s\", \"B\": %d, \"T\": %d, \"S\": %d, \"N\": %d, \"K\": %d, \"H\": %d, \"causal\": %d, "
         "\"runs\": 3, \"dq_same\": %s, \"dk_same\": %s, \"dv_same\": %s, \"dsinks_same\": %s",
         v.name, c.B, c.T, c.S, c.N, c.KH, c.H, c.causal, same[0] ? "true" : "false", same[1] ? "true" : "false",
         same[2] ? "true" : "false", same[3] ? "true" : "false");
  if (must_match) printf(", \"pass\": %s", all ? "true" : "false");
  printf("}\n");
  fflush(stdout);
  bwd_free(w);
  return all || !must_match;
}

/* Times the pieces of one mode: the two memsets, the kernel alone, the convert (CUDA events, median of 20). */
static void parts(const char *name, const BwdVariant &v, bwd_fn kernel, const Case &c) {
  g_var = &v;
  Bwd w;
  bwd_init(w, c, 1234);
  v.prepare(w);
  fill_uniform<<<1024, 256>>>(w.pr.out, (size_t)c.B * c.T * c.N * c.H, 99, 1.f);
  fill_const<<<1024, 256>>>(w.pr.lse, (size_t)c.B * c.N * c.T, 8.f);
  launch_bwd(w);
  sync_or_die("hopper_bwd_05 (parts warm-up)");
  const double ms_set = median_ms(zero_acc, w, nullptr), ms_k = median_ms(kernel, w, nullptr),
               ms_cv = median_ms(convert, w, nullptr);
  const double f1 = 4.0 * c.B * c.N * (double)c.T * c.S * c.H * (c.causal ? 0.5 : 1.0);
  printf("{\"parts\": \"%s\", \"B\": %d, \"T\": %d, \"S\": %d, \"N\": %d, \"K\": %d, \"H\": %d, \"causal\": %d, "
         "\"ms_memset\": %.4f, \"ms_kernel\": %.4f, \"tflops_kernel\": %.1f, \"ms_convert\": %.4f}\n",
         name, c.B, c.T, c.S, c.N, c.KH, c.H, c.causal, ms_set, ms_k, 2.5 * f1 / (ms_k * 1e-3) / 1e12, ms_cv);
  fflush(stdout);
  bwd_free(w);
}

/* run_all (9 checks, 6 timings) for DET (auto_order) and plain; DET ASC timed; bitwise repeats; each mode's pieces. */
int main(int argc, char **argv) {
  harness_init();
  CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
  const BwdVariant det = {"hopper_bwd_05", prepare, onepass<true, -1>, convert, 2.5, 0.0, true};
  const BwdVariant det_asc = {"hopper_bwd_05asc", prepare, onepass<true, ORDER_ASC>, convert, 2.5, 0.0, true};
  const BwdVariant plain = {"hopper_bwd_05p", prepare, onepass<false, -1>, convert, 2.5, 0.0, true};
  const int rc = racecheck_checks(argc, argv, det_asc);
  if (rc >= 0) return rc + racecheck_checks(argc, argv, plain) ? 1 : 0;
  int failed = run_all(det) + run_all(plain);
  auto ls = [](int B, int T, int N, int K, int H, int causal, int S) { /* learnable sinks, S = T unless given */
    return Case{B, T, S ? S : T, N, K, H, causal, SM_LEARNABLE, 1};
  };
  g_var = &det_asc;
  for (int causal = 0; causal < 2; ++causal) bwd_bench(ls(4, 4096, 16, 16, 128, causal, 0), !failed);
  /* Repeats: 2048 CTAs (15.5 waves, heads straddling waves), causal, GQA 2:1 with T < S, H64; then the pieces. */
  for (const Case &c : {ls(4, 4096, 16, 16, 128, 0, 0), ls(4, 4096, 16, 16, 128, 1, 0), ls(2, 1024, 8, 4, 128, 1, 2048),
                        ls(2, 1024, 8, 4, 64, 0, 0)}) {
    failed += !repeat_check(det, c, true) + !repeat_check(det_asc, c, true);
    repeat_check(plain, c, false);
  }
  for (const Case &c : {ls(4, 4096, 16, 16, 128, 0, 0), ls(4, 4096, 16, 16, 128, 1, 0), ls(1, 16384, 16, 16, 128, 0, 0),
                        ls(1, 16384, 16, 16, 128, 1, 0)}) {
    parts("hopper_bwd_05", det, kernel_only<true, -1>, c);
    parts("hopper_bwd_05p", plain, kernel_only<false, -1>, c);
  }
  printf("{\"summary\": \"hopper_bwd_05 all\", \"failed\": %d}\n", failed);
  return failed ? 1 : 0;
}
