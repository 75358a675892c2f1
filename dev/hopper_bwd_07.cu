/*
 * dev/hopper_bwd_07.cu — variant 07 of the Hopper (sm_90a) backward: dev 05's deterministic ONE pass at H128 as
 * the library runs it (src/cuda/hopper_bwd1.cu: rank 0 stores into dq_acc, later ranks add, no dq_acc memset),
 * made PERSISTENT, plus the causal diagonal skip. Why: B16 T1024 N16 H128 is 2048 CTAs of 8-16 query tiles, one
 * per SM (227 KiB), each paying a prologue (barrier init, the 64 KiB K / V load, ring fill, the first S^T without
 * overlap) and an epilogue (last dQ, dK / dV stores) with the tensor cores idle: ~2-4 us of a ~50 us (causal ~28 us
 * on average) CTA, and f+b there is 0.85-0.86x cuDNN (bench/NOTES.md, H200 session 5). This file includes 05 (its
 * main renamed, as 06 does) for its helpers, and times 05 beside 07 in one program.
 *   Items: an item is 05's CTA (b, kv head, 128-key block), tickets in 05's order (key block fastest). The grid is
 *   min(SMs, items) CTAs (at least nkb under NAT, below); each takes tickets from 05's atomic counter until one is
 *   >= the item count. Per item exactly 05's work: K, V once; the G heads' 64-query tiles through the 2-stage
 *   Q / dO ring; S^T, dP^T by wgmma SS, dV += P^T dO, dK += dS^T Q by RS; dS^T to shared memory; dQ halves one
 *   tile late, staged, stored / added by the writer thread in NAT order (semaphores, ranks, fences as 05).
 *   Overlap: the producer issues the next item's first two ring tiles as soon as their slots free (under this
 *   item's last two tiles) and its K / V once both consumer warpgroups arrived on kv_empty (after their last dQ
 *   product, K's last reader); the last dQ staging and the dK / dV stores (registers -> global) then run under the
 *   next item's K / V load.
 *   Causal diagonal skip (dev 06's): in query tile q = 2 kb (rows k0 .. k0 + 63) consumer warpgroup 1's keys
 *   k0 + 64 .. k0 + 127 are above every row. It skips S^T, dP^T, the softmax, dV and dK, stores a zero dS^T slice
 *   (each dQ half reads all 128 keys) and arrives on every barrier as usual: 32 of a tile's 80 m64n64k16-steps,
 *   on 8 of 72 tiles (B16 T1024 causal: 4.4% of the tensor work), 32 of 1056 at T4096.
 * Protocol: barriers initialised once, every phase counted, parities from running counters (as hopper_fwd.cu).
 * j: the CTA's item count (end marker included); x: its running query-tile count over all items (x0 at an item's
 * start); jk: its count of items with tiles (those that load K / V; causal T < S has items without). STAGES = 2,
 * so tile x's ring stage, dS^T buffer and dQ staging slot are all x & 1, their phase (x >> 1) & 1.
 *   barrier      count  arrives                                         waits (parity)
 *   item_full    1      producer after writing item_slot = item j      consumer warps, writer: j & 1
 *   item_empty   9      lane 0 of the 8 consumer warps, the writer,     producer before writing item j + 1: j & 1
 *                       each after reading slot j
 *   kv_full      1+tx   producer: arrive.expect_tx 64 KiB + 4 TMA       consumers before item jk's tiles: jk & 1
 *   kv_empty     8      lane 0 per consumer warp after item jk's last   producer before item jk + 1's K / V:
 *                       dQ product                                      jk & 1 (a fresh barrier passes parity 1)
 *   full[b]      1+tx   producer: Q, dO, lse2, D of tile x              consumers: (x >> 1) & 1
 *   empty[b]     8      per consumer warp after tile x's dV, dK         producer before tile x + 2
 *   ds_full[b]   8      per warp after storing its dS^T(x) rows         both warpgroups before dQ(x)
 *   ds_empty[b]  8      per warp after its dQ(x) product                every warp before storing dS^T(x + 2)
 *   dq_full[b]   8      per warp after staging its dQ(x) half           writer before adding tile x
 *   dq_empty[b]  1      writer once the add has read the slot           every warp before staging dQ(x + 2)
 *   wr_done[c]   1      writer, item j (c = j & 1), once its last       producer before item j + 1's ticket, when
 *                       semaphore wait passed (at once without tiles)   the counter is not past j's head: (j >> 1) & 1
 * Never two phases outstanding (a parity wait cannot tell phase n from n + 2): item, kv and ring pairs alternate
 * strictly (the producer's next arrive needs every waiter's arrive of the phase before). dS^T / dQ: per warp the
 * order over x is T(x) < D(x) < T(x + 2) (tile, dQ), as in 05 (the only change: an item's last D(x) runs before
 * T(x + 1), and its ds_empty arrive, which 05 could omit, is kept); dS^T(x + 2) needs every warp's D(x), which
 * follows that warp's ds_full wait of x, and the writer takes x in order. wr_done is a pair by item parity: when
 * the producer waits for item j the writer has arrived for every item <= j - 2 (slot j - 1 was read, which
 * item_empty required before slot j was written) and for none past j (j + 1 is not published): barrier j & 1 has
 * completed j >> 1 or (j >> 1) + 1 phases. One barrier, waited only when needed, could lag by two.
 * Deadlock freedom (NAT). A writer waits only on visits of its own head (b, kv head); NAT orders a tile's
 * visitors by walk step, so in a head whose nkb items are all held by CTAs that reach them, the pending visit of
 * least step waits on nothing unfinished, and the head finishes. Tickets come from one counter: the taken ones
 * are a prefix [0, M), so every head but the one holding ticket M - 1 (H*) is fully taken. The RULE: after
 * issuing an item's last loads the producer takes the next ticket at once if the counter is already past the
 * item's head (relaxed load >= its head's last ticket + 1: the atomicAdd then returns a ticket of a later head,
 * which the item, waiting only within its head, never waits on), else only once the writer's last semaphore wait
 * of the item passed (wr_done). Invariant: of two items a CTA holds, the earlier is in an earlier head or past
 * its waits; a CTA works its items in order, so by induction over the heads below H* each finishes. A CTA whose
 * items are past their waits takes a new ticket; in a stuck state each of the grid's P CTAs (co-resident: P <=
 * SMs, one CTA an SM) would hold its own unfinished waiting item of H*, so H* would have >= P >= nkb items taken:
 * all, and it finishes. Hence grid >= nkb (launch7_t ensures it; nkb <= SMs is NAT's condition in auto_order).
 * Without the rule a CTA could hold X and a later X' of the same head that X waits on (causal: key block kb waits
 * for kb + 1's visit), and X' starts only after X. ORDER_ASC (rank = kb) waits only on earlier tickets: safe on
 * any grid and schedule; the racecheck mode runs it on 2 CTAs.
 * Shared memory 05's (232448 B with the static part: 18 barriers, 8 anchors, the slot: 180 B of the 1 KiB pad).
 * Registers 05's split: producer warpgroup 24 (the TMA producer as all of warp 0, so that an item's values are
 * warp-uniform: as one thread the causal kernel spilled 16-32 B; lane 0 issues; the writer thread 32), consumers 240.
 * Scope: bf16, H = Hv = 128, T and S multiples of 128, N % K == 0, causal none or top-left, and 05's order rule.
 */
#define main hopper_bwd_05_main /* 05's program, for its kernel and helpers; its main is not run */
#include "hopper_bwd_05.cu"
#undef main

constexpr int H7 = 128; /* the head dim of this variant */
static_assert(STAGES == 2, "tile x's ring stage, dS^T buffer and staging slot are one index, x & 1");
static_assert(KB == 2 * QB, "nat_rank (causal) and the diagonal skip: key block kb starts at query tile 2 kb");

/* 05's Sched plus the item count (the end of the tickets). */
struct Sched7 {
  int *sync;  /* [0]: ticket counter; then one semaphore per (b, head, 64-query tile); zeroed per call */
  int nkb;    /* key blocks per kv head: S / KB */
  int G;      /* query heads per kv head */
  int n_all;  /* G T / QB */
  int d;      /* non-causal NAT stagger */
  int order;  /* ORDER_NAT / ORDER_ASC */
  int total;  /* items: B KH nkb */
};

/* An item's geometry (05's per-CTA values), the same in the producer, the writer and every consumer warp. */
struct Item7 {
  int kb, kvh, b, qb0, per_head, n_tiles, rot;
};
template <bool CAUSAL>
__device__ __forceinline__ Item7 item_of(int vid, const Sched7 &sc, int KH, int PT) {
  Item7 it;
  const int h = vid / sc.nkb; /* b KH + kvh: two divisions, not 05's three (the producer has 24 registers) */
  it.kb = vid - h * sc.nkb;
  it.b = h / KH;
  it.kvh = h - it.b * KH;
  /* Top-left causal: query i sees key j iff j <= i, so query blocks ending before k0 are skipped. */
  it.qb0 = CAUSAL ? it.kb * KB / QB : 0;
  it.per_head = max(0, PT - it.qb0);
  it.n_tiles = CAUSAL ? sc.G * it.per_head : sc.n_all;
  it.rot = (!CAUSAL && sc.order == ORDER_NAT && it.n_tiles > 0) ? it.kb * sc.d % it.n_tiles : 0;
  return it;
}

__device__ __forceinline__ int ld_relaxed(const int *p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
/* global[box at {c0, c1, c2}] = shared[src]: the reduce's store form (hopper_bwd1_parts.cuh), rank 0's. */
__device__ __forceinline__ void tma_store_3d(const CUtensorMap *map, uint32_t src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];"
               ::"l"((uint64_t)map), "r"(src), "r"(c0), "r"(c1), "r"(c2) : "memory");
}

/* tml / tmd: lse2, D [B N, T] fp32 (box 64); tma: dq_acc {H, T, B N} fp32 (box {32, 64, 1}, 128-byte swizzle). */
template <bool CAUSAL>
__global__ void __launch_bounds__(THREADS, 1)
    bwd_persist(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmdo,
                const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv,
                const __grid_constant__ CUtensorMap tml, const __grid_constant__ CUtensorMap tmd,
                const __grid_constant__ CUtensorMap tma, const BwdParams p, const Sched7 sc) {
  constexpr int HD = H7, CB = HD / 64;
  constexpr uint32_t KV_BYTES = KB * HD * 2, QT_BYTES = QB * HD * 2, LD_BYTES = 2 * QB * 4, DQ_BYTES = QB * HD * 4;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar[18]; /* the header's table, in its order */
  __shared__ float anchor[4 * NC];
  __shared__ int item_slot; /* the item, written by the producer before item_full, read after it */

  const uint32_t raw = smem_u32(smem_raw), sk = (raw + 1023u) & ~1023u, sv = sk + KV_BYTES;
  const uint32_t sq = sv + KV_BYTES, sdo = sq + STAGES * QT_BYTES, sds = sdo + STAGES * QT_BYTES;
  const uint32_t sdq = sds + 2 * DS_BYTES, sld = sdq + 2 * DQ_BYTES;
  const float *ld_f = reinterpret_cast<const float *>(smem_raw + (sld - raw)); /* per stage: lse2[QB], D[QB] */
  const uint32_t b0 = smem_u32(bar);
  const uint32_t item_full = b0, item_empty = b0 + 8, kv_full = b0 + 16, kv_empty = b0 + 24;
  auto bar_full = [&](uint32_t s) { return b0 + 8 * (4 + s); };
  auto bar_empty = [&](uint32_t s) { return b0 + 8 * (6 + s); };
  auto ds_full = [&](uint32_t x) { return b0 + 8 * (8 + x); };
  auto ds_empty = [&](uint32_t x) { return b0 + 8 * (10 + x); };
  auto dq_full = [&](uint32_t x) { return b0 + 8 * (12 + x); };
  auto dq_empty = [&](uint32_t x) { return b0 + 8 * (14 + x); };
  auto wr_done = [&](uint32_t c) { return b0 + 8 * (16 + c); };

  if (threadIdx.x == 0) {
    mbar_init(item_full, 1);
    mbar_init(item_empty, 4 * NC + 1); /* the consumer warps and the writer */
    mbar_init(kv_full, 1);
    mbar_init(kv_empty, 4 * NC);
    for (int x = 0; x < 2; ++x) {
      mbar_init(bar_full(x), 1);
      mbar_init(bar_empty(x), 4 * NC); /* one arrive per consumer warp */
      mbar_init(ds_full(x), 4 * NC);
      mbar_init(ds_empty(x), 4 * NC);
      mbar_init(dq_full(x), 4 * NC);
      mbar_init(dq_empty(x), 1); /* the writer */
      mbar_init(wr_done(x), 1);  /* the writer */
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  const int T = p.T, PT = T / QB, wg = threadIdx.x / 128;

  if (wg == 0) {
    /* 128 x 24 + 256 x 240 = 64512 = 384 x 168, the CTA's registers at launch: the pool setmaxnreg.inc draws on */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (threadIdx.x < 32) {
      /* The TMA producer: publishes the items, loads their tiles, takes the tickets. The whole warp walks, so
         that the item's values are warp-uniform (uniform registers: as one thread, with 24 registers, the causal
         producer spilled 16-32 B); lane 0 issues the atomics, the slot, the arrives and the copies. */
      const bool lead = threadIdx.x == 0;
      uint32_t x = 0, jk = 0;
      int tk = 0;
      if (lead) tk = atomicAdd(sc.sync, 1);
      int vid = __shfl_sync(0xffffffffu, tk, 0);
      for (uint32_t j = 0;; ++j) {
        mbar_wait(item_empty, (j & 1) ^ 1); /* every reader has read item j - 1 (j = 0: a fresh barrier) */
        if (lead) {
          *(volatile int *)&item_slot = vid;
          mbar_arrive(item_full);
        }
        if (vid >= sc.total) break;
        const Item7 im = item_of<CAUSAL>(vid, sc, p.KH, PT);
        const int nb = im.kvh * sc.G, rb = im.b * p.N + nb; /* the kv head's first head; its lse2 / D row */
        auto load_kv = [&]() {
          mbar_wait(kv_empty, (jk & 1) ^ 1); /* both warpgroups are past item jk - 1's last dQ product */
          ++jk;
          if (lead) {
            mbar_arrive_tx(kv_full, 2 * KV_BYTES);
            for (int c = 0; c < CB; ++c) {
              tma_load(sk + c * KB * 128, &tmk, kv_full, c * 64, im.kvh, im.kb * KB, im.b);
              tma_load(sv + c * KB * 128, &tmv, kv_full, c * 64, im.kvh, im.kb * KB, im.b);
            }
          }
        };
        /* The first two tiles' slots free under the previous item's last tiles, K / V only after its last dQ:
           ring first (tile 2 waits for tile 0's release, which needs K / V: issued by then). */
        const int n0 = min(im.n_tiles, STAGES);
        Walk w(im.rot, im.qb0, PT, sc.G);
        for (int it = 0; it < im.n_tiles; ++it, ++x, w.next()) {
          if (it == n0) load_kv();
          const uint32_t s = x & 1;
          const int i0 = w.q * QB;
          mbar_wait(bar_empty(s), ((x >> 1) & 1) ^ 1);
          if (lead) {
            mbar_arrive_tx(bar_full(s), 2 * QT_BYTES + LD_BYTES);
            for (int c = 0; c < CB; ++c) {
              tma_load(sq + s * QT_BYTES + c * QB * 128, &tmq, bar_full(s), c * 64, nb + w.g, i0, im.b);
              tma_load(sdo + s * QT_BYTES + c * QB * 128, &tmdo, bar_full(s), c * 64, nb + w.g, i0, im.b);
            }
            tma_load_2d(sld + s * LD_BYTES, &tml, bar_full(s), i0, rb + w.g);
            tma_load_2d(sld + s * LD_BYTES + QB * 4, &tmd, bar_full(s), i0, rb + w.g);
          }
        }
        if (im.n_tiles > 0 && im.n_tiles <= STAGES) load_kv();
        /* The next ticket (the header's RULE): at once when the counter is past this item's head, else once the
           writer's last semaphore wait of this item passed. */
        int past = 0;
        if (lead) past = ld_relaxed(sc.sync) >= vid - im.kb + sc.nkb;
        if (!__shfl_sync(0xffffffffu, past, 0)) mbar_wait(wr_done(j & 1), (j >> 1) & 1);
        if (lead) tk = atomicAdd(sc.sync, 1);
        vid = __shfl_sync(0xffffffffu, tk, 0);
      }
    } else if (threadIdx.x == 32) { /* the dQ writer (warp 1): 05's sequence per tile, tiles x in order */
      uint32_t x = 0;
      for (uint32_t j = 0;; ++j) {
        mbar_wait(item_full, j & 1);
        const int vid = *(volatile int *)&item_slot;
        mbar_arrive(item_empty);
        if (vid >= sc.total) break;
        const Item7 im = item_of<CAUSAL>(vid, sc, p.KH, PT);
        Walk w(im.rot, im.qb0, PT, sc.G);
        const int bn0 = im.b * p.N + im.kvh * sc.G; /* row (b N + n) of head g: bn0 + g */
        for (int kk = 0; kk < im.n_tiles; ++kk, ++x, w.next()) {
          const uint32_t xb = x & 1;
          int *sem = sc.sync + 1 + (size_t)(bn0 + w.g) * PT + w.q;
          mbar_wait(dq_full(xb), (x >> 1) & 1);
          const int rank = sc.order == ORDER_ASC ? im.kb : nat_rank<CAUSAL>(im.kb, w.g, w.q, sc.nkb, PT, sc.d);
          while (ld_acquire(sem) != rank) {
          }
          fence_async_global(); /* the store / reduce (async proxy) after the acquire that saw the earlier adds */
          if (kk == im.n_tiles - 1) mbar_arrive(wr_done(j & 1)); /* no wait left in this item */
          const uint32_t src = sdq + xb * DQ_BYTES;
          if (rank == 0) /* the tile's first visit stores: dq_acc is not zeroed (coverage: hopper_bwd1.cu) */
            for (int c = 0; c < HD / 32; ++c) tma_store_3d(&tma, src + c * QB * 128, c * 32, w.q * QB, bn0 + w.g);
          else
            for (int c = 0; c < HD / 32; ++c) tma_reduce_add(&tma, src + c * QB * 128, c * 32, w.q * QB, bn0 + w.g);
          bulk_commit();
          bulk_wait_read0();
          mbar_arrive(dq_empty(xb));
          bulk_wait0();         /* this tile's store / adds are done in L2 ... */
          fence_async_global(); /* ... and ordered before the release */
          red_release_add(sem, 1);
        }
        if (im.n_tiles == 0) mbar_arrive(wr_done(j & 1));
      }
      bulk_wait0();
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  /* Warp-uniform through a shuffle: the skip branch holds wgmma sections (06). */
  const int cw = __shfl_sync(0xffffffffu, wg - 1, 0), warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int t = lane % 4;
  const uint32_t sk_wg = sk + cw * 64 * 128, sv_wg = sv + cw * 64 * 128;
  const float sl2 = p.scale_l2;
  /* Accumulators d[4j + e]: row lane/4 + 8 (e >> 1) of the warp's 16, column 8j + 2t + (e & 1). */
  float dk[HD / 2], dv[HD / 2], st[32], dpt[32], dq[HD / 4];
  uint32_t pf[16], df[16];

  /* dQ(k) (both operands a tile old or older), then its half into staging slot k & 1 for the writer. last: the
     item's last, K's last reader: kv_empty. */
  auto dq_tile = [&](uint32_t k, bool last) {
    const uint32_t kx = k & 1;
    zero(dq); /* dead between tiles: not carried through S^T / dP^T */
    pin(dq);
    wgmma_fence();
    gemm_dq<HD>(dq, sds + kx * DS_BYTES, sk, cw);
    wgmma_commit();
    wgmma_wait0();
    pin(dq);
    if (lane == 0) {
      mbar_arrive(ds_empty(kx));
      if (last) mbar_arrive(kv_empty);
    }
    mbar_wait(dq_empty(kx), ((k >> 1) & 1) ^ 1); /* the writer's add of dQ(k - 2) has read the slot */
    stage_dq<HD>(dq, sdq + kx * DQ_BYTES, cw, warp, lane);
    fence_async_shared(); /* generic stores -> the TMA store / reduce's reads */
    __syncwarp();
    if (lane == 0) mbar_arrive(dq_full(kx));
  };

  uint32_t x0 = 0, jk = 0;
  for (uint32_t j = 0;; ++j) {
    /* Lane 0 alone reads the slot: its arrive is the one that lets the producer rewrite it (an mbarrier arrive
       releases only the arriving thread's accesses; the forward's racecheck lesson). */
    mbar_wait(item_full, j & 1);
    int slot = 0;
    if (lane == 0) slot = *(volatile int *)&item_slot;
    const int vid = __shfl_sync(0xffffffffu, slot, 0);
    if (lane == 0) mbar_arrive(item_empty);
    if (vid >= sc.total) break;
    const Item7 im = item_of<CAUSAL>(vid, sc, p.KH, PT);
    const int k0 = im.kb * KB, qb0 = im.qb0, per_head = im.per_head, n_tiles = im.n_tiles;
    const int kw0 = k0 + 64 * cw, kr = kw0 + 16 * warp + lane / 4; /* this thread's keys: kr, kr + 8 */
    zero(dk);
    zero(dv);
    if (n_tiles > 0) {
      mbar_wait(kv_full, jk & 1);
      for (int it = 0; it < n_tiles; ++it) {
        const uint32_t x = x0 + it, xb = x & 1, xp = (x >> 1) & 1;
        const int i0 = (qb0 + it % per_head) * QB; /* i0: causal only (no rotation there) */
        const uint32_t sq_s = sq + xb * QT_BYTES, sdo_s = sdo + xb * QT_BYTES;
        /* Causal, q = 2 kb: no row of the tile sees this warpgroup's keys (warpgroup 1 only). */
        const bool skip = CAUSAL && i0 + QB <= kw0;
        mbar_wait(bar_full(xb), xp);
        if (!skip) {
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
          const float *lse2 = ld_f + xb * 2 * QB, *Dq = lse2 + QB;
          const bool masked = CAUSAL && i0 < kw0 + 63;
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) {
            const float2 l2 = *reinterpret_cast<const float2 *>(lse2 + 8 * jj + 2 * t);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float v = ex2(fmaf(st[4 * jj + e], sl2, -((e & 1) ? l2.y : l2.x)));
              if (masked && kr + 8 * (e >> 1) > i0 + 8 * jj + 2 * t + (e & 1)) v = 0.f;
              st[4 * jj + e] = v;
            }
          }
          anchor_exp2(st, &anchor[4 * cw + warp], lane);
          wgmma_wait0();
          pin(dpt);
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) {
            const float2 dd = *reinterpret_cast<const float2 *>(Dq + 8 * jj + 2 * t);
#pragma unroll
            for (int e = 0; e < 4; ++e)
              dpt[4 * jj + e] = st[4 * jj + e] * (dpt[4 * jj + e] - ((e & 1) ? dd.y : dd.x));
          }
          pack_frag(pf, st);
          pack_frag(df, dpt);
        } else {
#pragma unroll
          for (int i = 0; i < 16; ++i) df[i] = 0u; /* bf16 +0: both dQ halves read all 128 keys */
        }
        /* ---- dS^T(x) to shared memory (01a's swizzled store), for both warpgroups' dQ halves ---- */
        const uint32_t sds_x = sds + xb * DS_BYTES;
        mbar_wait(ds_empty(xb), xp ^ 1); /* both halves of dQ(x - 2) have read this buffer */
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = kr - k0 + 8 * h;
#pragma unroll
          for (int jj = 0; jj < 8; ++jj)
            asm volatile("st.shared.b32 [%0], %1;" ::"r"(sds_x + r * 128 + ((jj ^ (r & 7)) << 4) + 4 * t),
                         "r"(df[2 * jj + h]) : "memory");
        }
        fence_async_shared(); /* generic stores -> wgmma reads */
        __syncwarp();
        if (lane == 0) mbar_arrive(ds_full(xb));
        /* ---- dV, dK of this tile; then dQ of the previous one, once P^T / dS^T fragments are dead ---- */
        if (!skip) {
          pin(dv);
          pin(dk);
          pin(pf);
          pin(df);
          wgmma_fence();
          gemm_rs<HD>(dv, pf, sdo_s); /* dV += P^T dO */
          gemm_rs<HD>(dk, df, sq_s);  /* dK += dS^T Q */
          wgmma_commit();
          if (it > 0) mbar_wait(ds_full(xb ^ 1), ((x - 1) >> 1) & 1); /* the other half's dS^T(x - 1) */
          wgmma_wait0();
          pin(dv);
          pin(dk);
          pin(pf);
          pin(df);
        } else if (it > 0) {
          mbar_wait(ds_full(xb ^ 1), ((x - 1) >> 1) & 1);
        }
        /* lse2 / D of this stage were read by every lane with plain loads: the warp synchronises before the
           elected arrive (mbarrier.arrive releases only the arriving thread's accesses). */
        __syncwarp();
        if (lane == 0) mbar_arrive(bar_empty(xb));
        if (it > 0) dq_tile(x - 1, false);
      }
      /* dQ of the item's last tile: K's last read; the next item's K / V may land from here on */
      const uint32_t k = x0 + n_tiles - 1;
      mbar_wait(ds_full(k & 1), (k >> 1) & 1);
      dq_tile(k, true);
      x0 += n_tiles;
      ++jk;
    }
    const size_t rs = (size_t)p.KH * HD;
    const size_t base = ((size_t)im.b * p.S * p.KH + im.kvh) * HD;
    store_rows<HD>(p.dk + base, dk, rs, kr, t, p.scale); /* zeros where no query sees the keys */
    store_rows<HD>(p.dv + base, dv, rs, kr, t, 1.f);
  }
}

/* ---- host ----------------------------------------------------------------------------------------- */

/* grid: cap CTAs (0: the SMs), at least nkb under NAT (the header's deadlock argument), at most the items. */
template <bool CAUSAL>
static void launch7_t(const Bwd &w, int order, int cap) {
  constexpr int smem = op_smem<H7>();
  static bool attr_set = false;
  if (!attr_set) {
    CK(cudaFuncSetAttribute(bwd_persist<CAUSAL>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr_set = true;
  }
  const Case &c = w.pr.c;
  const int nkb = c.S / KB, n_all = (c.N / c.KH) * (c.T / QB), total = nkb * c.KH * c.B;
  int grid = cap > 0 ? cap : g_sms;
  if (order == ORDER_NAT) grid = std::max(grid, nkb);
  grid = std::min(grid, total);
  const Sched7 sc = {g_sync, nkb, c.N / c.KH, n_all, std::max(1, n_all / nkb), order, total};
  bwd_persist<CAUSAL><<<grid, THREADS, smem>>>(w.maps[0], w.maps[1], w.maps[2], w.maps[3], g_maps5[0], g_maps5[1],
                                               g_maps5[2], w.p, sc);
}

/* The harness's "dkdv" launch. ORDER -1: 05's auto_order; CAP: launch7_t's; ACC 0: only the ticket and the
   semaphores are zeroed (the library's form), 1: dq_acc zeroed too (05's memset: the A/B of persistence alone),
   2: dq_acc NaN-poisoned (the checks: a missed rank-0 store fails them). */
template <int ORDER, int CAP, int ACC>
static void persist(const Bwd &w) {
  const Case &c = w.pr.c;
  if (ACC == 2) CK(cudaMemsetAsync(w.dq_acc, 0xFF, (size_t)c.B * c.T * c.N * c.H * 4));
  if (ACC == 1) zero_acc(w);
  else zero_sync(w);
  const int order = ORDER >= 0 ? ORDER : auto_order(c);
  c.causal ? launch7_t<true>(w, order, CAP) : launch7_t<false>(w, order, CAP);
}

static Case ls(int B, int T, int N, int K, int causal, int S = 0) { /* learnable sinks, S = T unless given */
  return Case{B, T, S ? S : T, N, K, H7, causal, SM_LEARNABLE, 1};
}

/* `racecheck`: two small checks on 2 CTAs in ASC order (safe however the tool schedules them), each CTA's longest
   walk about 05's racecheck CTA's (16 tiles; the tool slows every launch toward the 20 s limit): causal GQA 2:1
   (4 items: two without tiles, 12 tiles, 4 diagonal skips) and non-causal (4 items of 8 tiles, 2 a CTA). */
static int racecheck7(int argc, char **argv, const BwdVariant &asc2) {
  if (argc < 2 || strcmp(argv[1], "racecheck") != 0) return -1;
  const Case cases[] = {{1, 256, 512, 2, 1, H7, 1, SM_LEARNABLE, 1}, {1, 256, 512, 2, 1, H7, 0, SM_OFF_BY_ONE, 1}};
  g_var = &asc2;
  int failed = 0;
  for (int i = 0; i < 2; ++i) failed += !bwd_check(cases[i], 21 + 25 * i);
  return failed;
}

/* Checks (fp32 reference) on the grid of the SMs (small cases: about one item a CTA) and on the smallest grid
   (nkb CTAs under NAT: many items a CTA), bitwise repeats, then the whole backward of 05 and 07 side by side. */
int main(int argc, char **argv) {
  harness_init();
  CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
  const BwdVariant v07c = {"hopper_bwd_07", prepare, persist<-1, 0, 2>, convert, 2.5, 0.0, false};
  const BwdVariant v07g = {"hopper_bwd_07g", prepare, persist<-1, 1, 2>, convert, 2.5, 0.0, false};
  const BwdVariant v07a = {"hopper_bwd_07asc3", prepare, persist<ORDER_ASC, 3, 2>, convert, 2.5, 0.0, false};
  const BwdVariant v07r = {"hopper_bwd_07asc2", prepare, persist<ORDER_ASC, 2, 2>, convert, 2.5, 0.0, false};
  const BwdVariant v07 = {"hopper_bwd_07", prepare, persist<-1, 0, 0>, convert, 2.5, 0.0, false};
  const BwdVariant v07m = {"hopper_bwd_07m", prepare, persist<-1, 0, 1>, convert, 2.5, 0.0, false};
  const BwdVariant v05 = {"hopper_bwd_05", prepare, onepass<true, -1>, convert, 2.5, 0.0, false};
  const int rc = racecheck7(argc, argv, v07r);
  if (rc >= 0) return rc ? 1 : 0;

  /* 05's H128 checks {B, T, S, N, K, H, causal, softmax, unused}: sinks U(-10, 10) with heads 0 / 1 at +50 / -50
     (problem_init); causal top-left with T = S, T < S (items without tiles: zero dK / dV) and T > S; GQA 1, 2;
     S 640 (5 key blocks, NAT stagger 2), S 128 (one key block, G T / 64 = 4 tiles, 2 diagonal skips). */
  const Case checks[] = {
      {2, 512, 512, 4, 4, H7, 0, SM_LEARNABLE, 1},   {2, 512, 512, 4, 4, H7, 1, SM_LEARNABLE, 1},
      {1, 512, 1024, 4, 2, H7, 1, SM_LEARNABLE, 1},  {1, 768, 256, 4, 2, H7, 1, SM_OFF_BY_ONE, 1},
      {1, 384, 640, 4, 2, H7, 0, SM_VANILLA, 1},     {1, 128, 128, 2, 2, H7, 1, SM_LEARNABLE, 1},
      {1, 2048, 2048, 8, 4, H7, 1, SM_LEARNABLE, 1},
  };
  const int n_checks = sizeof(checks) / sizeof(checks[0]);
  int failed = 0;
  for (const BwdVariant *v : {&v07c, &v07g}) {
    g_var = v;
    for (int i = 0; i < n_checks; ++i) failed += !bwd_check(checks[i], 11 + 5 * (uint32_t)i);
  }
  g_var = &v07a; /* ASC on 3 CTAs: the protocol on a grid that divides nothing */
  failed += !bwd_check(checks[1], 16) + !bwd_check(checks[4], 31);
  g_var = &v05; /* 05 once, so its timings below are of a validated kernel in this build */
  const int failed05 = !bwd_check(checks[1], 16);

  /* Repeats (bitwise over 3 runs, dq_acc not zeroed): 2048 items on the SMs (B16 T1024 causal, B4 T4096 both
     masks), T < S GQA causal on the SMs and on nkb CTAs. */
  for (const Case &c : {ls(16, 1024, 16, 16, 1), ls(4, 4096, 16, 16, 0), ls(4, 4096, 16, 16, 1),
                        ls(2, 1024, 8, 4, 1, 2048)})
    failed += !repeat_check(v07, c, true);
  failed += !repeat_check(v07g, ls(2, 1024, 8, 4, 1, 2048), true);

  /* The whole backward (pre + memsets + kernel + convert + dsinks): 05 (memset of dq_acc, one CTA an item),
     07m (the same memset: persistence and the skip alone), 07 (no dq_acc memset: the library's form). */
  for (const Case &c : {ls(16, 1024, 16, 16, 0), ls(16, 1024, 16, 16, 1), ls(4, 4096, 16, 16, 0),
                        ls(4, 4096, 16, 16, 1), ls(1, 16384, 16, 16, 1)}) {
    g_var = &v05;
    bwd_bench(c, failed05 == 0);
    g_var = &v07m;
    bwd_bench(c, failed == 0);
    g_var = &v07;
    bwd_bench(c, failed == 0);
  }
  for (const Case &c : {ls(16, 1024, 16, 16, 0), ls(16, 1024, 16, 16, 1)}) {
    parts("hopper_bwd_07", v07, persist<-1, 0, 0>, c);
    parts("hopper_bwd_05", v05, kernel_only<true, -1>, c);
  }
  printf("{\"summary\": \"hopper_bwd_07 all\", \"failed\": %d, \"failed05\": %d}\n", failed, failed05);
  return failed ? 1 : 0;
}
