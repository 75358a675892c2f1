/*
 * hopper/onepass128.cu — the sm_90a one-pass backward at H128 (plans hopper.bwd.onepass, .plain, .narrow): dK,
 * dV and dQ in one persistent kernel, dQ added into an fp32 workspace in a fixed order (NAT), then
 * sa_hop_dq_convert_kernel.
 * Barrier table, ordering and progress argument: docs/hopper.md, "one-pass backward".
 */
#include <algorithm>

#include "hopper/onepass_dq.cuh"
#include "launch.h"

namespace {

/* from the tile table (hopper/tiles.h), where the reasons are */
constexpr int HD = 128;               /* the head dim of this kernel (onepass64.cu has H64's) */
constexpr int KB = SA_HOP_OP_KB(HD);  /* keys per CTA: 2 consumer warpgroups x 64 (the wgmma M) */
constexpr int QB = SA_HOP_BWD_QB;     /* query rows per streamed tile: N of S^T / dP^T, M of dQ */
constexpr int STAGES = SA_HOP_STAGES; /* Q / dO ring depth */
constexpr int NC = SA_HOP_OP_NC(HD);  /* consumer warpgroups */
constexpr int THREADS = 128 * (NC + 1);
static_assert(KB == 2 * QB, "nat_rank (causal): key block kb starts at query tile 2 kb");

/* How the CTAs of a launch find their work and their turn. */
struct sa_hop_onepass128_sched {
  int *sync; /* [0]: CTA ticket counter; then one semaphore per (b, head, 64-query tile); zeroed per call */
  int nkb;   /* key blocks per kv head: S / KB */
  int G;     /* query heads per kv head */
  int n_all; /* G T / QB: tiles of a key block without a mask (a constant-bank loop bound: no register) */
  int d;     /* non-causal NAT: key block kb starts at tile kb * d of its G T / QB */
  int total; /* items (the non-persistent kernel's CTAs): B KH nkb; a ticket >= total ends a CTA */
};

/* ---- the one-pass kernel ----------------------------------------------------------------------------- */

constexpr uint32_t DS_BYTES = KB * QB * 2; /* one dS^T tile [128 keys][64 queries] bf16 */
/* K, V; the Q / dO ring; 2 dS^T tiles; 2 dQ staging slots [H / 32 boxes][64 rows][32 fp32]; per stage lse2, D. */
constexpr int op_smem() {
  return 1024 + 2 * KB * HD * 2 + STAGES * 2 * QB * HD * 2 + 2 * DS_BYTES + 2 * QB * HD * 4 + STAGES * 2 * QB * 4;
}
/* 231424 B at H128; the static part (13 barriers, 8 anchors, the ticket: 140 B) is padded to 1 KiB by smem_raw's
   1024-byte alignment: 232448 B in all, exactly the opt-in limit (sharedMemPerBlockOptin on the H200). */
static_assert(op_smem() + 1024 <= 227 * 1024, "over the sm_90 limit");

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* dQ half [64 q x NQ] = dS [64 q x 128 keys] K[128 keys x this warpgroup's NQ columns]; 16 keys = 2048 B a step. */
__device__ __forceinline__ void gemm_dq(float (&dq)[HD / 4], uint32_t sds_x, uint32_t sk, int cw) {
  const int col0 = cw * HD / 2;
  const uint32_t kcol = sk + (col0 / 64) * KB * 128 + (col0 % 64) * 2;
#pragma unroll
  for (int kk = 0; kk < KB / 16; ++kk)
    wgmma_ss_tt(dq, gmma_desc(sds_x + kk * 2048, QB * 128, 1024), gmma_desc(kcol + kk * 2048, KB * 128, 1024), kk > 0);
}

/* An item's geometry (what a CTA of the non-persistent kernel derived from its ticket), the same in the producer,
   the writer and every consumer warp. Key block fastest in the ticket order: a head's key blocks start together. */
struct sa_hop_onepass128_item {
  int kb, kvh, b, qb0, per_head, n_tiles, rot;
};
template <bool CAUSAL>
__device__ __forceinline__ sa_hop_onepass128_item item_of(int vid, const sa_hop_onepass128_sched &sc, int KH, int PT) {
  sa_hop_onepass128_item im;
  const int h = vid / sc.nkb; /* b KH + kvh: two divisions (the producer has 24 registers) */
  im.kb = vid - h * sc.nkb;
  im.b = h / KH;
  im.kvh = h - im.b * KH;
  /* Top-left causal: query i sees key j iff j <= i, so query blocks ending before k0 are skipped. */
  im.qb0 = CAUSAL ? im.kb * KB / QB : 0;
  im.per_head = max(0, PT - im.qb0);
  im.n_tiles = CAUSAL ? sc.G * im.per_head : sc.n_all;
  im.rot = (!CAUSAL && im.n_tiles > 0) ? im.kb * sc.d % im.n_tiles : 0;
  return im;
}

/* dQ(k) of the item (both operands a tile old or older) into staging slot k & 1 for the writer; last: the item's
   last dQ product, K's last read (kv_empty: the next item's K / V may land). */
__device__ __forceinline__ void dq_step(float (&dq)[HD / 4], uint32_t k, bool last, uint32_t sds, uint32_t sk,
                                        uint32_t sdq, uint32_t ds_empty, uint32_t dq_empty, uint32_t dq_full,
                                        uint32_t kv_empty, int cw, int warp, int lane) {
  constexpr uint32_t DQ_BYTES = QB * HD * 4;
  const uint32_t kx = k & 1;
  zero(dq); /* dead between tiles: not carried through S^T / dP^T */
  pin(dq);
  wgmma_fence();
  gemm_dq(dq, sds + kx * DS_BYTES, sk, cw);
  wgmma_commit();
  wgmma_wait0();
  pin(dq);
  if (lane == 0) {
    mbar_arrive(ds_empty + 8 * kx);
    if (last) mbar_arrive(kv_empty);
  }
  mbar_wait(dq_empty + 8 * kx, ((k >> 1) & 1) ^ 1); /* the writer's store / add of dQ(k - 2) has read the slot */
  stage_dq(dq, sdq + kx * DQ_BYTES, cw * (HD / 64), warp, lane);
  fence_async_shared(); /* generic stores -> the TMA store / reduce's reads */
  __syncwarp();
  if (lane == 0) mbar_arrive(dq_full + 8 * kx);
}

#endif /* sm_90a */

/* PERSISTENT: grid min(SMs, items) CTAs (at least nkb: the deadlock argument in the header), each
   taking item tickets from the counter until one is past the last item. Barriers initialised once; every parity
   from a running counter: j the CTA's items (the end marker included), x its query tiles over all items, jk its
   items with tiles (causal T < S has items without). STAGES = 2: tile x's ring stage, dS^T buffer and staging slot
   are all x & 1, their phase (x >> 1) & 1. Barriers (count; who arrives; who waits, parity):
     item_full    1    producer after writing the slot with item j         consumer warps, writer: j & 1
     item_empty   9    lane 0 of the 8 consumer warps, the writer         producer before slot j + 1: j & 1
     kv_full      1+tx producer: expect_tx 64 KiB, 4 TMA                   consumers before item jk's tiles: jk & 1
     kv_empty     8    lane 0 per consumer warp after the last dQ product producer before item jk + 1's K / V
     full[s]      1+tx producer: Q, dO, lse2, D of tile x                 consumers: (x >> 1) & 1
     empty[s]     8    per consumer warp after tile x's dV, dK            producer before tile x + 2
     ds_full[s]   8    per warp after storing its dS^T(x) rows            both warpgroups before dQ(x)
     ds_empty[s]  8    per warp after its dQ(x) product                   every warp before storing dS^T(x + 2)
     dq_full[s]   8    per warp after staging its dQ(x) half              writer before tile x's store / add
     dq_empty[s]  1    writer once the store / add has read the slot      every warp before staging dQ(x + 2)
     wr_done[c]   1    writer, item j (c = j & 1), once its last          producer before item j + 1's ticket when
                       semaphore wait passed (at once without tiles)      the counter is not past j's head: (j >> 1) & 1
   Never two phases outstanding: item, kv and ring pairs alternate strictly; per warp the dS^T / dQ order over x is
   T(x) < D(x) < T(x + 2) (an item's last D(x) runs before T(x + 1)), and the writer takes x in order. wr_done is a
   pair: when the producer waits for item j the writer has arrived for every item <= j - 2 (it read slot j - 1) and
   for none past j, so barrier j & 1 has completed j >> 1 or (j >> 1) + 1 phases.
   Deadlock freedom (NAT). A writer waits only on visits of its own head (b, kv head); in a head whose nkb items are
   all held by CTAs that reach them, the pending visit of least walk step waits on nothing unfinished. Tickets are
   taken as a prefix [0, M): every head but the one holding ticket M - 1 (H*) is fully taken. The ticket RULE: after
   issuing an item's last loads the producer takes the next ticket at once if the counter is already past the item's
   head (the new ticket is of a later head, which the item never waits on), else once the writer's last semaphore
   wait of the item passed (wr_done). So of two items a CTA holds, the earlier is of an earlier head or past its
   waits; by induction the heads below H* finish, and a stuck state would need each of the P co-resident CTAs (one an
   SM) to hold its own waiting item of H*: P >= nkb items of H*, all of them, and H* finishes. Without the rule a CTA
   could hold X and a later X' of the same head that X waits on (causal: key block kb waits for kb + 1).
   Overlap: the producer issues the next item's first two ring tiles as their slots free (under this item's last two
   tiles), its K / V once both warpgroups passed their last dQ product; the last dQ staging and the dK / dV stores
   then run under the next K / V load.
   Causal diagonal skip (as hopper/onepass64.cu): in query tile 2 kb warpgroup 1's keys are above every row: no S^T,
   dP^T, softmax, dV, dK; a zero dS^T slice (each dQ half reads all 128 keys); every arrive as usual (4.4% of the
   tensor work at T1024).
   tml / tmd: lse2, D [B N, T] fp32 (box 64); tma: dq_acc {H, T, B N} fp32 (box {32, 64, 1}, 128-byte swizzle).
   WAIT (plans hopper.bwd.onepass.wait, .narrow.wait): the producer always takes the RULE's second branch, waiting on
   wr_done for every item whatever the counter says, so every phase of wr_done is observed (the skip leaves phases
   unobserved, which compute-sanitizer synccheck reports: docs/hopper.md); the argument's invariant holds a fortiori
   and wr_done's phases alternate strictly. */
template <bool CAUSAL, bool WAIT>
__global__ void __launch_bounds__(THREADS, 1)
    sa_hop_onepass128_kernel(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmdo,
                             const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv,
                             const __grid_constant__ CUtensorMap tml, const __grid_constant__ CUtensorMap tmd,
                             const __grid_constant__ CUtensorMap tma, const sa_hop_onepass_params p,
                             const sa_hop_onepass128_sched sc) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(STAGES == 2, "tile x's ring stage, dS^T buffer and staging slot are one index, x & 1");
  constexpr int CB = HD / 64;
  constexpr uint32_t KV_BYTES = KB * HD * 2, QT_BYTES = QB * HD * 2, LD_BYTES = 2 * QB * 4, DQ_BYTES = QB * HD * 4;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar[18]; /* the table above, in its order */
  __shared__ float anchor[4 * NC];
  __shared__ int item_slot; /* the item, written by the producer before item_full, read after it */

  const uint32_t raw = smem_u32(smem_raw), sk = (raw + 1023u) & ~1023u, sv = sk + KV_BYTES;
  const uint32_t sq = sv + KV_BYTES, sdo = sq + STAGES * QT_BYTES, sds = sdo + STAGES * QT_BYTES;
  const uint32_t sdq = sds + 2 * DS_BYTES, sld = sdq + 2 * DQ_BYTES;
  const float *ld_f = reinterpret_cast<const float *>(smem_raw + (sld - raw)); /* per stage: lse2[QB], D[QB] */
  const uint32_t b0 = smem_u32(bar);
  const uint32_t item_full = b0, item_empty = b0 + 8, kv_full = b0 + 16, kv_empty = b0 + 24;
  const uint32_t full0 = b0 + 32, empty0 = b0 + 48, ds_full0 = b0 + 64, ds_empty0 = b0 + 80, dq_full0 = b0 + 96,
                 dq_empty0 = b0 + 112, wr_done0 = b0 + 128; /* pairs: + 8 x */

  if (threadIdx.x == 0) {
    mbar_init(item_full, 1);
    mbar_init(item_empty, 4 * NC + 1); /* the consumer warps and the writer */
    mbar_init(kv_full, 1);
    mbar_init(kv_empty, 4 * NC);
    for (int x = 0; x < 2; ++x) {
      mbar_init(full0 + 8 * x, 1);
      mbar_init(empty0 + 8 * x, 4 * NC); /* one arrive per consumer warp */
      mbar_init(ds_full0 + 8 * x, 4 * NC);
      mbar_init(ds_empty0 + 8 * x, 4 * NC);
      mbar_init(dq_full0 + 8 * x, 4 * NC);
      mbar_init(dq_empty0 + 8 * x, 1); /* the writer */
      mbar_init(wr_done0 + 8 * x, 1);  /* the writer */
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  const int PT = p.T / QB, wg = threadIdx.x / 128;

  if (wg == 0) {
    /* 128 x 24 + 256 x 240 = 64512 = 384 x 168, the CTA's registers at launch: the pool setmaxnreg.inc draws on */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (threadIdx.x < 32) {
      /* The TMA producer: publishes the items, loads their tiles, takes the tickets. The whole warp walks so that
         the item's values are warp-uniform (uniform registers: as one thread, with 24 registers, the causal
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
        const sa_hop_onepass128_item im = item_of<CAUSAL>(vid, sc, p.KH, PT);
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
        sa_hop_walk w(im.rot, im.qb0, PT, sc.G);
        for (int it = 0; it < im.n_tiles; ++it, ++x, w.next()) {
          if (it == n0) load_kv();
          const uint32_t s = x & 1;
          const int i0 = w.q * QB;
          mbar_wait(empty0 + 8 * s, ((x >> 1) & 1) ^ 1);
          if (lead) {
            const uint32_t fb = full0 + 8 * s;
            mbar_arrive_tx(fb, 2 * QT_BYTES + LD_BYTES);
            for (int c = 0; c < CB; ++c) {
              tma_load(sq + s * QT_BYTES + c * QB * 128, &tmq, fb, c * 64, nb + w.g, i0, im.b);
              tma_load(sdo + s * QT_BYTES + c * QB * 128, &tmdo, fb, c * 64, nb + w.g, i0, im.b);
            }
            tma_load_2d(sld + s * LD_BYTES, &tml, fb, i0, rb + w.g);
            tma_load_2d(sld + s * LD_BYTES + QB * 4, &tmd, fb, i0, rb + w.g);
          }
        }
        if (im.n_tiles > 0 && im.n_tiles <= STAGES) load_kv();
        /* The next ticket (the RULE): at once when the counter is past this item's head, else once the writer's last
           semaphore wait of this item passed; WAIT: always once it passed. */
        if constexpr (WAIT) {
          mbar_wait(wr_done0 + 8 * (j & 1), (j >> 1) & 1);
        } else {
          int past = 0;
          if (lead) past = ld_relaxed(sc.sync) >= vid - im.kb + sc.nkb;
          if (!__shfl_sync(0xffffffffu, past, 0)) mbar_wait(wr_done0 + 8 * (j & 1), (j >> 1) & 1);
        }
        if (lead) tk = atomicAdd(sc.sync, 1);
        vid = __shfl_sync(0xffffffffu, tk, 0);
      }
    } else if (threadIdx.x == 32) { /* the dQ writer (warp 1): tiles x in order */
      uint32_t x = 0;
      for (uint32_t j = 0;; ++j) {
        mbar_wait(item_full, j & 1);
        const int vid = *(volatile int *)&item_slot;
        mbar_arrive(item_empty);
        if (vid >= sc.total) break;
        const sa_hop_onepass128_item im = item_of<CAUSAL>(vid, sc, p.KH, PT);
        sa_hop_walk w(im.rot, im.qb0, PT, sc.G);
        const int bn0 = im.b * p.N + im.kvh * sc.G; /* row (b N + n) of head g: bn0 + g */
        for (int kk = 0; kk < im.n_tiles; ++kk, ++x, w.next()) {
          const uint32_t xb = x & 1;
          int *sem = sc.sync + 1 + (size_t)(bn0 + w.g) * PT + w.q;
          mbar_wait(dq_full0 + 8 * xb, (x >> 1) & 1);
          const int rank = nat_rank<KB, CAUSAL>(im.kb, w.g, w.q, sc.nkb, PT, sc.d);
          while (ld_acquire(sem) != rank) {}
          fence_async_global(); /* the store / reduce (async proxy) after the acquire that saw the earlier adds */
          if (kk == im.n_tiles - 1) mbar_arrive(wr_done0 + 8 * (j & 1)); /* no wait left in this item */
          const uint32_t src = sdq + xb * DQ_BYTES;
          /* rank 0 stores (dq_acc is not zeroed; coverage: above nat_rank), later ranks add */
          write_dq_tile<HD>(&tma, src, rank, w.q * QB, bn0 + w.g, dq_empty0 + 8 * xb, sem);
        }
        if (im.n_tiles == 0) mbar_arrive(wr_done0 + 8 * (j & 1));
      }
      bulk_wait0();
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  /* Warp-uniform through a shuffle: the skip branch holds wgmma sections. */
  const int cw = __shfl_sync(0xffffffffu, wg - 1, 0), warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int t = lane % 4;
  const uint32_t sk_wg = sk + cw * 64 * 128, sv_wg = sv + cw * 64 * 128;
  const float sl2 = p.scale_l2;
  /* Accumulators d[4j + e]: row lane/4 + 8 (e >> 1) of the warp's 16, column 8j + 2t + (e & 1). */
  float dk[HD / 2], dv[HD / 2], st[32], dpt[32], dq[HD / 4];
  uint32_t pf[16], df[16];

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
    const sa_hop_onepass128_item im = item_of<CAUSAL>(vid, sc, p.KH, PT);
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
        mbar_wait(full0 + 8 * xb, xp);
        if (!skip) { /* ---- S^T, dP^T, P^T, dS^T ---- */
          onepass_tile<HD, CAUSAL>(st, dpt, pf, df, sk_wg, sv_wg, KB, sq_s, sdo_s, ld_f + xb * 2 * QB, sl2, i0, kw0, kr,
                                   t, &anchor[4 * cw + warp], lane);
        } else {
#pragma unroll
          for (int i = 0; i < 16; ++i) df[i] = 0u; /* bf16 +0: both dQ halves read all 128 keys */
        }
        /* ---- dS^T(x) to shared memory (a 128-byte swizzled store), for both warpgroups' dQ halves ---- */
        const uint32_t sds_x = sds + xb * DS_BYTES;
        mbar_wait(ds_empty0 + 8 * xb, xp ^ 1); /* both halves of dQ(x - 2) have read this buffer */
        store_ds_rows(sds_x, df, kr - k0, t);
        fence_async_shared(); /* generic stores -> wgmma reads */
        __syncwarp();
        if (lane == 0) mbar_arrive(ds_full0 + 8 * xb);
        /* ---- dV, dK of this tile; then dQ of the previous one, once P^T / dS^T fragments are dead ---- */
        if (!skip) {
          dvdk_issue<HD>(dv, dk, pf, df, sdo_s, sq_s);
          if (it > 0) mbar_wait(ds_full0 + 8 * (xb ^ 1), ((x - 1) >> 1) & 1); /* the other half's dS^T(x - 1) */
          dvdk_retire<HD>(dv, dk, pf, df);
        } else if (it > 0) {
          mbar_wait(ds_full0 + 8 * (xb ^ 1), ((x - 1) >> 1) & 1);
        }
        /* lse2 / D of this stage were read by every lane with plain loads: the warp synchronises before the elected
           arrive (mbarrier.arrive releases only the arriving thread's accesses). */
        __syncwarp();
        if (lane == 0) mbar_arrive(empty0 + 8 * xb);
        if (it > 0) dq_step(dq, x - 1, false, sds, sk, sdq, ds_empty0, dq_empty0, dq_full0, kv_empty, cw, warp, lane);
      }
      /* dQ of the item's last tile: K's last read; the next item's K / V may land from here on */
      const uint32_t k = x0 + n_tiles - 1;
      mbar_wait(ds_full0 + 8 * (k & 1), (k >> 1) & 1);
      dq_step(dq, k, true, sds, sk, sdq, ds_empty0, dq_empty0, dq_full0, kv_empty, cw, warp, lane);
      x0 += n_tiles;
      ++jk;
    }
    const size_t rs = (size_t)p.KH * HD;
    const size_t base = ((size_t)im.b * p.S * p.KH + im.kvh) * HD;
    store_rows<HD>(p.dk + base, dk, rs, kr, t, p.scale); /* zeros where no query sees the keys */
    store_rows<HD>(p.dv + base, dv, rs, kr, t, 1.f);
  }
#endif /* sm_90a */
}

/* dq [B, T, N, H] bf16 = scale * dq_acc [B, N, T, H]: 8 elements per thread (two float4 in, one 16-byte store),
   consecutive threads along H then N, so the stores are contiguous. Rows (b, i, n) in 32 bits (B T N < 2^31). */
__global__ void sa_hop_dq_convert_kernel(const float *acc, __nv_bfloat16 *dq, int T, int N, int H, float scale,
                                         int rows) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const int per_row = H / 8;
  for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < rows * per_row; x += gridDim.x * blockDim.x) {
    const int row = x / per_row, h = (x % per_row) * 8, n = row % N, i = (row / N) % T, b = row / (N * T);
    const float4 *src = reinterpret_cast<const float4 *>(acc + (((size_t)b * N + n) * T + i) * H + h);
    const float4 a = src[0], c = src[1];
    uint4 o;
    o.x = pack_bf16(a.x * scale, a.y * scale);
    o.y = pack_bf16(a.z * scale, a.w * scale);
    o.z = pack_bf16(c.x * scale, c.y * scale);
    o.w = pack_bf16(c.z * scale, c.w * scale);
    reinterpret_cast<uint4 *>(dq)[x] = o;
  }
#endif /* sm_90a */
}

/* ---- host ------------------------------------------------------------------------------------------- */

template <bool CAUSAL, bool WAIT>
cudaError_t sa_hop_onepass128_run(const CUtensorMap (&m)[7], const sa_hop_onepass_params &bp,
                                  const sa_hop_onepass128_sched &sc, const sa_cuda_plan &plan, int64_t B,
                                  cudaStream_t st) {
  constexpr int smem = op_smem();
  cudaError_t e =
      cudaFuncSetAttribute(sa_hop_onepass128_kernel<CAUSAL, WAIT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  e = cudaMemsetAsync(sc.sync, 0, plan.sync_bytes, st); /* the ticket, the semaphores (not dq_acc) */
  if (e != cudaSuccess) return e;
  e = sa_hop_launch_items(sa_hop_onepass128_kernel<CAUSAL, WAIT>, plan, THREADS, smem, st, m[0], m[1], m[2], m[3], m[4],
                          m[5], m[6], bp, sc);
  if (e != cudaSuccess) return e;
  const int rows = (int)(B * bp.T * bp.N); /* < 2^27 in scope: rows * 16 fits sa_hop_dq_convert_kernel's int */
  return sa_hop_onepass_dq_convert(bp.dq_acc, bp.dq, bp.T, bp.N, 128, bp.scale, rows, plan.sms, st);
}

} /* namespace */

bool sa_hop_onepass_prepare(const sa_cuda_params &p, float *acc, int kv_rows, CUtensorMap (&m)[7],
                            sa_hop_onepass_params *bp) {
  static const PFN_cuTensorMapEncodeTiled_v12000 enc = sa_hop_encode_fn(); /* thread-safe static init */
  if (!enc) return false;
  /* Q / dO 64-row boxes, K / V kv_rows-row boxes (past S: TMA's zero fill, counted in the transaction
     bytes), lse2 / D as {T, B N} fp32 boxes of 64 (no swizzle), and dq_acc as the reduce target {H, T, B N} fp32,
     box {32, 64, 1}: 128 B inner (the 128-byte swizzle's limit), row stride 4 H. TMA wants 16-byte aligned bases
     and strides: T % 128 == 0, H in {64, 128}. */
  const cuuint64_t a_dims[3] = {(cuuint64_t)p.H, (cuuint64_t)p.T, (cuuint64_t)(p.B * p.N)};
  const cuuint64_t a_str[2] = {(cuuint64_t)p.H * 4, (cuuint64_t)(p.T * p.H) * 4};
  const cuuint32_t a_box[3] = {32, (cuuint32_t)QB, 1};
  if (!(sa_hop_map(enc, &m[0], p.q, p.B, p.T, p.N, p.H, QB) && sa_hop_map(enc, &m[1], p.dout, p.B, p.T, p.N, p.H, QB) &&
        sa_hop_map(enc, &m[2], p.k, p.B, p.S, p.K, p.H, kv_rows) &&
        sa_hop_map(enc, &m[3], p.v, p.B, p.S, p.K, p.H, kv_rows) &&
        sa_hop_map_rows(enc, &m[4], p.lse2, p.B * p.N, p.T, QB) &&
        sa_hop_map_rows(enc, &m[5], p.D, p.B * p.N, p.T, QB) &&
        sa_hop_map_f32(enc, &m[6], acc, 3, a_dims, a_str, a_box, CU_TENSOR_MAP_SWIZZLE_128B)))
    return false;
  bp->dq = (__nv_bfloat16 *)p.dq;
  bp->dk = (__nv_bfloat16 *)p.dk;
  bp->dv = (__nv_bfloat16 *)p.dv;
  bp->dq_acc = acc;
  bp->lse2 = p.lse2;
  bp->D = p.D;
  bp->T = (int)p.T;
  bp->S = (int)p.S;
  bp->N = (int)p.N;
  bp->KH = (int)p.K;
  bp->scale = p.scale;
  bp->scale_l2 = p.scale_log2;
  return true;
}

cudaError_t sa_hop_onepass_dq_convert(const float *acc, __nv_bfloat16 *dq, int T, int N, int H, float scale, int rows,
                                      int sms, cudaStream_t st) {
  sa_hop_dq_convert_kernel<<<std::min((rows * (H / 8) + 255) / 256, sms * 16), 256, 0, st>>>(acc, dq, T, N, H, scale,
                                                                                             rows);
  return cudaGetLastError();
}

cudaError_t sa_hop_onepass_launch(const sa_cuda_plan &plan, const sa_cuda_params &p, void *ws, cudaStream_t st) {
  if (plan.hd == 64) return sa_hop_onepass64_launch(plan, p, ws, st);
  float *acc = (float *)ws;
  int *sync = (int *)((char *)ws + plan.off_sync);
  CUtensorMap m[7];
  sa_hop_onepass_params bp;
  if (!sa_hop_onepass_prepare(p, acc, KB, m, &bp)) return cudaErrorInvalidValue;
  const sa_hop_onepass128_sched sc = {sync, plan.nkb, (int)p.G, plan.n_all, plan.d, plan.items};
  if (plan.op_wait)
    return p.causal ? sa_hop_onepass128_run<true, true>(m, bp, sc, plan, p.B, st)
                    : sa_hop_onepass128_run<false, true>(m, bp, sc, plan, p.B, st);
  return p.causal ? sa_hop_onepass128_run<true, false>(m, bp, sc, plan, p.B, st)
                  : sa_hop_onepass128_run<false, false>(m, bp, sc, plan, p.B, st);
}
