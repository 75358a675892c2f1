/*
 * hopper/onepass64.cu — the sm_90a one-pass backward at H64 (plans hopper.bwd.onepass, .plain, .narrow): 3
 * consumer warpgroups, 192-key items, dQ by one owner warpgroup a tile, the final dq written by the producer's
 * idle warps; a head split with sa_hop_dkdv_sum_kernel on short grids. docs/hopper.md, "one-pass backward".
 */
#include "hopper/onepass64.cuh"
#include "launch.h"

namespace {

/* A persistent CTA's item (the default kernel's per-CTA values), the same in the producer, writer and consumers. */
struct sa_hop_onepass64_item {
  int kb, hh, kvh, b, n_wg, qb0, per_head, n_tiles, rot, hd0;
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* %laneid, re-read where it is tested: as a value kept from the warp's start it is one register too many in
   the consumers (they spill). */
__device__ __forceinline__ int lane_id() {
  int l;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
  return l;
}

/* The producer's decode of ticket vid (runtime divisions: done once, by the producer warp) ... */
template <bool CAUSAL>
__device__ __forceinline__ sa_hop_onepass64_item item64_of(int vid, const sa_hop_onepass64_sched &sc,
                                                           const sa_hop_onepass_params &p, int PT) {
  sa_hop_onepass64_item it;
  const int g = vid / sc.nkb, h = g / sc.hs; /* group (b KH + kvh) hs + hh; b KH + kvh */
  it.kb = vid - g * sc.nkb;
  it.hh = g - h * sc.hs;
  it.b = h / p.KH;
  it.kvh = h - it.b * p.KH;
  it.n_wg = min(NC64, (p.S - it.kb * KB64) / 64);
  it.qb0 = CAUSAL ? it.kb * KB64 / QB : 0;
  it.per_head = max(0, PT - it.qb0);
  it.n_tiles = CAUSAL ? sc.Gc * it.per_head : sc.n_all;
  it.rot = (!CAUSAL && it.n_tiles > 0) ? it.kb * sc.d % it.n_tiles : 0;
  it.hd0 = it.kvh * (p.N / p.KH) + it.hh * sc.Gc;
  return it;
}

/* ... published in the item slot: vid, kb, b, kvh, hh, n_tiles, rot, hd0 (the rest follows without a runtime
   division). The consumers and the writer read it there: no division in their item loops (one of the changes that
   took the non-causal consumers from 16-72 B of spills to none; the consumers' comment has the others). */
constexpr int SLOT = 8;
__device__ __forceinline__ void item64_put(volatile int *slot, const sa_hop_onepass64_item &it, int vid) {
  slot[0] = vid, slot[1] = it.kb, slot[2] = it.b, slot[3] = it.kvh, slot[4] = it.hh, slot[5] = it.n_tiles;
  slot[6] = it.rot, slot[7] = it.hd0;
}
template <bool CAUSAL>
__device__ __forceinline__ sa_hop_onepass64_item item64_get(const int (&f)[SLOT], const sa_hop_onepass_params &p,
                                                            int PT) {
  sa_hop_onepass64_item it;
  it.kb = f[1], it.b = f[2], it.kvh = f[3], it.hh = f[4], it.n_tiles = f[5], it.rot = f[6], it.hd0 = f[7];
  it.n_wg = min(NC64, (p.S - it.kb * KB64) / 64);
  it.qb0 = CAUSAL ? it.kb * KB64 / QB : 0;
  it.per_head = max(0, PT - it.qb0);
  return it;
}

#endif /* sm_90a */

/* WAIT: the producer waits on wr_done for every item, the counter's value aside (onepass128.cu's WAIT: plans
   hopper.bwd.onepass.wait, .narrow.wait). */
template <bool CAUSAL, bool WAIT>
__global__ void __launch_bounds__(THREADS64, 1)
    sa_hop_onepass64_kernel(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmdo,
                            const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv,
                            const __grid_constant__ CUtensorMap tml, const __grid_constant__ CUtensorMap tmd,
                            const __grid_constant__ CUtensorMap tma, const sa_hop_onepass_params p,
                            const sa_hop_onepass64_sched sc, const int total) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int HD = 64;
  constexpr uint32_t KV_BYTES = KB64 * HD * 2, QT_BYTES = QB * HD * 2, LD_BYTES = 2 * QB * 4, DQ_BYTES = QB * HD * 4;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar[24]; /* the header's table, in its order */
  __shared__ float anchor[4 * NC64];
  __shared__ int item_slot[SLOT];       /* the item, written by the producer before item_full, read after it */
  __shared__ int cv_row[2], cv_head[2]; /* converter slot v & 1: dq row b T + q 64 and head of its tile */
  __shared__ int wstate[4 * NC64][5];   /* per consumer warp: what it carries over items (lane 0 only) */

  const uint32_t raw = smem_u32(smem_raw), sk = (raw + 1023u) & ~1023u, sv = sk + KV_BYTES;
  const uint32_t sq = sv + KV_BYTES, sdo = sq + STAGES * QT_BYTES, sds = sdo + STAGES * QT_BYTES;
  const uint32_t sdq = sds + NDS * DS64_BYTES, sld = sdq + 2 * DQ_BYTES, scv = sld + STAGES * LD_BYTES;
  const float *ld_f = reinterpret_cast<const float *>(smem_raw + (sld - raw)); /* per stage: lse2[QB], D[QB] */
  const uint32_t b0 = smem_u32(bar);
  const uint32_t item_full = b0, item_empty = b0 + 8, kv_full = b0 + 16, kv_empty = b0 + 24;
  auto bar_full = [&](uint32_t s) { return b0 + 8 * (4 + s); };
  auto bar_empty = [&](uint32_t s) { return b0 + 8 * (6 + s); };
  auto ds_full = [&](uint32_t x) { return b0 + 8 * (8 + x); };
  auto ds_empty = [&](uint32_t x) { return b0 + 8 * (11 + x); };
  auto dq_full = [&](uint32_t x) { return b0 + 8 * (14 + x); };
  auto dq_empty = [&](uint32_t x) { return b0 + 8 * (16 + x); };
  auto cv_full = [&](uint32_t x) { return b0 + 8 * (18 + x); };
  auto cv_empty = [&](uint32_t x) { return b0 + 8 * (20 + x); };
  auto wr_done = [&](uint32_t c) { return b0 + 8 * (22 + c); };

  if (threadIdx.x == 0) {
    mbar_init(item_full, 1);
    mbar_init(item_empty, 4 * NC64 + 1); /* the consumer warps and the writer */
    mbar_init(kv_full, 1);
    mbar_init(kv_empty, 4 * NC64);
    for (int x = 0; x < NDS; ++x) {
      mbar_init(ds_full(x), 4 * NC64); /* every warpgroup stores its slice (a zero one without keys) */
      mbar_init(ds_empty(x), 4);       /* the owner's 4 warps, after its dQ product */
    }
    for (int x = 0; x < 2; ++x) {
      mbar_init(bar_full(x), 1);
      mbar_init(bar_empty(x), 4 * NC64); /* one arrive per consumer warp, idle warpgroups too */
      mbar_init(dq_full(x), 128);        /* every owner thread (racecheck: hopper/onepass64.cu) */
      mbar_init(dq_empty(x), 1);         /* the writer */
      mbar_init(cv_full(x), 1);          /* the writer's load (or the end marker) */
      mbar_init(cv_empty(x), 64);        /* every converter thread, after its shared reads */
      mbar_init(wr_done(x), 1);          /* the writer */
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  const int T = p.T, PT = T / QB, wg = threadIdx.x / 128;

  if (wg == 0) {
    /* 128 x 32 + 384 x 160 = 65536 = 512 x 128, the CTA's registers at launch: the pool setmaxnreg.inc draws on */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PREGS64) : "memory");
    if (threadIdx.x < 32) {
      /* The TMA producer: publishes the items, loads their tiles, takes the tickets; the whole warp walks (item
         values warp-uniform), lane 0 issues. */
      const bool lead = threadIdx.x == 0;
      uint32_t x = 0, jk = 0;
      int tk = 0;
      if (lead) tk = atomicAdd(sc.sync, 1);
      int vid = __shfl_sync(0xffffffffu, tk, 0);
      for (uint32_t j = 0;; ++j) {
        mbar_wait(item_empty, (j & 1) ^ 1); /* every reader has read item j - 1 (j = 0: a fresh barrier) */
        const sa_hop_onepass64_item im = item64_of<CAUSAL>(vid, sc, p, PT); /* garbage past the end: not used there */
        if (lead) {
          item64_put(item_slot, im, vid);
          mbar_arrive(item_full);
        }
        if (vid >= total) break;
        auto load_kv = [&]() {
          mbar_wait(kv_empty, (jk & 1) ^ 1); /* every consumer warp is past item jk - 1's last K / V read */
          ++jk;
          if (lead) {
            mbar_arrive_tx(kv_full, 2 * KV_BYTES);
            tma_load(sk, &tmk, kv_full, 0, im.kvh, im.kb * KB64, im.b);
            tma_load(sv, &tmv, kv_full, 0, im.kvh, im.kb * KB64, im.b);
          }
        };
        /* The first two tiles' slots free under the previous item's last tiles, K / V only after its last dQ:
           ring first (tile 2 waits for tile 0's release, which needs K / V: issued by then). */
        const int n0 = min(im.n_tiles, STAGES);
        sa_hop_walk w(im.rot, im.n_tiles > 0 ? im.qb0 : 0, PT, sc.Gc); /* no tiles: PT - qb0 may be <= 0 */
        for (int it = 0; it < im.n_tiles; ++it, ++x, w.next()) {
          if (it == n0) load_kv();
          const uint32_t s = x & 1;
          const int n = im.hd0 + w.g, i0 = w.q * QB;
          mbar_wait(bar_empty(s), ((x >> 1) & 1) ^ 1);
          if (lead) {
            mbar_arrive_tx(bar_full(s), 2 * QT_BYTES + LD_BYTES);
            tma_load(sq + s * QT_BYTES, &tmq, bar_full(s), 0, n, i0, im.b);
            tma_load(sdo + s * QT_BYTES, &tmdo, bar_full(s), 0, n, i0, im.b);
            tma_load_2d(sld + s * LD_BYTES, &tml, bar_full(s), i0, im.b * p.N + n);
            tma_load_2d(sld + s * LD_BYTES + QB * 4, &tmd, bar_full(s), i0, im.b * p.N + n);
          }
        }
        if (im.n_tiles > 0 && im.n_tiles <= STAGES) load_kv();
        /* The next ticket (the header's RULE): at once when the counter is past this item's group, else once the
           writer's last semaphore wait of this item passed; WAIT: always once it passed. */
        if constexpr (WAIT) {
          mbar_wait(wr_done(j & 1), (j >> 1) & 1);
        } else {
          int past = 0;
          if (lead) past = ld_relaxed(sc.sync) >= vid - im.kb + sc.nkb;
          if (!__shfl_sync(0xffffffffu, past, 0)) mbar_wait(wr_done(j & 1), (j >> 1) & 1);
        }
        if (lead) tk = atomicAdd(sc.sync, 1);
        vid = __shfl_sync(0xffffffffu, tk, 0);
      }
    } else if (threadIdx.x == 32) { /* the dQ writer (warp 1): the default kernel's sequence, tiles x in order */
      uint32_t x = 0, nv = 0;
      for (uint32_t j = 0;; ++j) {
        mbar_wait(item_full, j & 1);
        int f[SLOT];
        for (int i = 0; i < SLOT; ++i) f[i] = ((volatile int *)item_slot)[i];
        mbar_arrive(item_empty);
        if (f[0] >= total) break;
        const sa_hop_onepass64_item im = item64_get<CAUSAL>(f, p, PT);
        sa_hop_walk w(im.rot, im.n_tiles > 0 ? im.qb0 : 0, PT, sc.Gc); /* no tiles: PT - qb0 may be <= 0 */
        const int bn0 = im.b * p.N + im.hd0;                           /* row (b N + n) of the item's head g: bn0 + g */
        for (int kk = 0; kk < im.n_tiles; ++kk, ++x, w.next()) {
          const uint32_t xb = x & 1;
          int *sem = sc.sync + 1 + (size_t)(bn0 + w.g) * PT + w.q;
          mbar_wait(dq_full(xb), (x >> 1) & 1);
          const int rank = nat_rank<KB64, CAUSAL>(im.kb, w.g, w.q, sc.nkb, PT, sc.d);
          while (ld_acquire(sem) != rank) {}
          fence_async_global(); /* the store / reduce (async proxy) after the acquire that saw the earlier adds */
          if (kk == im.n_tiles - 1) mbar_arrive(wr_done(j & 1)); /* no wait on other CTAs left in this item */
          const uint32_t src = sdq + xb * DQ_BYTES;
          /* rank 0 stores (dq_acc is not zeroed; coverage: nat_rank), later ranks add */
          write_dq_tile<HD>(&tma, src, rank, w.q * QB, bn0 + w.g, dq_empty(xb), sem);
          if (nat_last64<CAUSAL>(im.kb, w.g, w.q, sc.nkb, PT, sc.d)) { /* final: back to shared for the converter */
            const uint32_t cb = nv & 1;
            mbar_wait(cv_empty(cb), ((nv >> 1) & 1) ^ 1);
            *(volatile int *)&cv_row[cb] = im.b * T + w.q * QB;
            *(volatile int *)&cv_head[cb] = im.hd0 + w.g;
            mbar_arrive_tx(cv_full(cb), DQ_BYTES); /* releases the two stores above */
            for (int c = 0; c < HD / 32; ++c)
              tma_load_3d(scv + cb * DQ_BYTES + c * QB * 128, &tma, cv_full(cb), c * 32, w.q * QB, bn0 + w.g);
            ++nv;
          }
        }
        if (im.n_tiles == 0) mbar_arrive(wr_done(j & 1));
      }
      const uint32_t cb = nv & 1; /* the converter's end marker */
      mbar_wait(cv_empty(cb), ((nv >> 1) & 1) ^ 1);
      *(volatile int *)&cv_head[cb] = -1;
      mbar_arrive(cv_full(cb));
      bulk_wait0();
    } else if (threadIdx.x >= 64) { /* warps 2-3: the dq converter (hopper/onepass64.cu's), tiles from the writer */
      const int tid = threadIdx.x - 64, r0 = tid / 8, c = tid % 8 / 4, v = tid % 4;
      const uint32_t off = c * QB * 128 + r0 * 128 + (((2 * v) ^ r0) << 4); /* unit 2 v; 2 v + 1: off ^ 16 */
      const float scale = p.scale;
      for (uint32_t nv = 0;; ++nv) {
        const uint32_t cb = nv & 1;
        mbar_wait(cv_full(cb), (nv >> 1) & 1);
        const int n = *(volatile int *)&cv_head[cb], row = *(volatile int *)&cv_row[cb];
        if (n < 0) break;
        uint32_t box = scv + cb * DQ_BYTES + off;
        uint4 *dst = reinterpret_cast<uint4 *>(p.dq + (((size_t)row + r0) * p.N + n) * HD + 8 * (tid % 8));
        convert_dq_rows(box, dst, p.N * HD, scale);
        mbar_arrive(cv_empty(cb)); /* releases this thread's shared reads before the writer's next load */
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS64) : "memory");
  /* Warp-uniform through a shuffle: the owner's and the skip branches hold wgmma sections. */
  const int cw = __shfl_sync(0xffffffffu, wg - 1, 0), warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int t = lane % 4;
  const uint32_t sk_wg = sk + cw * 64 * 128, sv_wg = sv + cw * 64 * 128;
  const float sl2 = p.scale_l2;
  const int rloc = 64 * cw + 16 * warp + lane / 4; /* this thread's key rows in a block: rloc, rloc + 8 */
  /* Registers: the default kernel's non-causal consumers are at R156 of 160; each value carried through the
     softmax spilled here (4-72 B, variant by variant). So: the item's values come through __shfl_sync (uniform
     registers), what only the item's start and end need (the running tile count, the parities, the dK / dV
     row) waits in the warp's word set ws (lane 0's alone, shuffled), the dQ owner is recomputed from it (no
     carried register), and the lane index is re-read from %laneid where it is tested (lane_id). */
  float dk[HD / 2], dv[HD / 2];
  volatile int *ws = wstate[threadIdx.x / 32 - 4]; /* x0, ph (bit 0: j & 1, bit 1: jk & 1), dK / dV row, hh, k0 */
  if (lane_id() == 0) ws[0] = 0, ws[1] = 0;
  for (;;) {
    const bool l0 = lane_id() == 0;
    const uint32_t x0 = __shfl_sync(0xffffffffu, l0 ? ws[0] : 0, 0), ph = __shfl_sync(0xffffffffu, l0 ? ws[1] : 0, 0);
    mbar_wait(item_full, ph & 1);
    int f[SLOT]; /* lane 0 alone reads the slot: its arrive is the one that lets the producer rewrite it */
    for (int i = 0; i < SLOT; ++i) f[i] = __shfl_sync(0xffffffffu, l0 ? ((volatile int *)item_slot)[i] : 0, 0);
    if (l0) mbar_arrive(item_empty);
    if (f[0] >= total) break;
    const sa_hop_onepass64_item im = item64_get<CAUSAL>(f, p, PT);
    const int k0 = im.kb * KB64, qb0 = im.qb0, per_head = im.per_head, n_tiles = im.n_tiles, n_wg = im.n_wg;
    const int kw0 = k0 + 64 * cw, kr = k0 + rloc; /* this thread's keys: kr, kr + 8 */
    /* A head's last block of 64 or 128 keys leaves this warpgroup none: it runs the item as if every tile were
       causally skipped (every wait and arrive, the counts are 12; a zero dS^T slice in rows the owner's dQ does
       not read: it reads 64 n_wg) and stores no dK / dV. */
    const bool idle = cw >= n_wg;
    if (l0) /* b S KH + kvh < 2^31: dK's rows (B S KH 64 bf16 would be 256 GiB) */
      ws[0] = x0 + n_tiles, ws[1] = ph ^ (n_tiles > 0 ? 3 : 1), ws[2] = im.b * (int)p.S * p.KH + im.kvh, ws[3] = im.hh,
      ws[4] = k0;
    zero(dk);
    zero(dv);
    if (n_tiles > 0) {
      mbar_wait(kv_full, (ph >> 1) & 1);
      /* Iteration it: tile x0 + it (if it < n_tiles), then dQ(x0 + it - 1) if this warpgroup owns it; the item's
         last dQ is iteration n_tiles. The item's tile m is owned by warpgroup m % n_wg. */
      for (int it = 0; it <= n_tiles; ++it) {
        const uint32_t x = x0 + it;
        if (it < n_tiles) {
          const uint32_t s = x & 1;
          const int i0 = (qb0 + it % per_head) * QB; /* i0: causal only (no rotation there) */
          const uint32_t sq_s = sq + s * QT_BYTES, sdo_s = sdo + s * QT_BYTES;
          const bool skip = idle || (CAUSAL && i0 + QB <= kw0); /* causal: no row of the tile sees these keys */
          float st[32], dpt[32];
          uint32_t pf[16], df[16];
          mbar_wait(bar_full(s), (x >> 1) & 1);
          if (!skip) {
            onepass_tile<HD, CAUSAL>(st, dpt, pf, df, sk_wg, sv_wg, KB64, sq_s, sdo_s, ld_f + s * 2 * QB, sl2, i0, kw0,
                                     kr, t, &anchor[4 * cw + warp], lane_id());
          } else {
#pragma unroll
            for (int i = 0; i < 16; ++i) df[i] = 0u; /* bf16 +0: the owner's dQ reads all 64 n_wg keys */
          }
          const uint32_t xd = x % NDS, sds_x = sds + xd * DS64_BYTES;
          mbar_wait(ds_empty(xd), ((x / NDS) & 1) ^ 1); /* dQ(x - 3) has read this buffer */
          store_ds_rows(sds_x, df, rloc, t);            /* rows 0 .. 191 */
          fence_async_shared();                         /* generic stores -> the owner's wgmma reads */
          __syncwarp();
          if (lane_id() == 0) mbar_arrive(ds_full(xd));
          if (!skip) {
            dvdk_issue<HD>(dv, dk, pf, df, sdo_s, sq_s);
            dvdk_retire<HD>(dv, dk, pf, df);
          }
          __syncwarp(); /* lse2 / D read by every lane: before the elected arrive */
          if (lane_id() == 0) mbar_arrive(bar_empty(s));
        }
        const int m = it - 1; /* ---- dQ(x - 1), the item's tile m: every warpgroup's dS^T(x - 1) is a tile old */
        if (it > 0 && (n_wg == 3 ? m % 3 : n_wg == 2 ? m & 1 : 0) == cw) {
          const uint32_t k = x - 1, xk = k % NDS;
          const uint32_t sds_k = sds + xk * DS64_BYTES;
          float dq[32];
          mbar_wait(ds_full(xk), (k / NDS) & 1);
          dq_product_nwg(dq, sds_k, sk, n_wg);
          if (lane_id() == 0) mbar_arrive(ds_empty(xk));
          mbar_wait(dq_empty(k & 1), ((k >> 1) & 1) ^ 1); /* the writer's store of dQ(k - 2) has read the slot */
          stage_dq(dq, sdq + (k & 1) * DQ_BYTES, 0, warp, lane_id());
          fence_async_shared();        /* generic stores -> the TMA's reads */
          mbar_arrive(dq_full(k & 1)); /* each thread its own stores */
        }
      }
      /* this warp's last K / V read of the item is done (its wgmma waited): the next item's K / V may land */
      if (lane_id() == 0) mbar_arrive(kv_empty);
    }
    if (idle) continue; /* keys past S */
    const bool l1 = lane_id() == 0;
    const int row = __shfl_sync(0xffffffffu, l1 ? ws[2] : 0, 0), hh = __shfl_sync(0xffffffffu, l1 ? ws[3] : 0, 0);
    const int ks = __shfl_sync(0xffffffffu, l1 ? ws[4] : 0, 0) + rloc;
    const size_t rs = (size_t)p.KH * HD, base = (size_t)row * HD;
    if (sc.hs == 1) {
      store_rows<HD>(p.dk + base, dk, rs, ks, t, p.scale); /* zeros where no query sees the keys */
      store_rows<HD>(p.dv + base, dv, rs, ks, t, 1.f);
    } else { /* partial sums of this item's G / hs heads, unscaled; sa_hop_dkdv_sum_kernel adds them in hh order */
      store_rows_f32(sc.part + hh * sc.slice + base, dk, rs, ks, t);
      store_rows_f32(sc.part + (sc.hs + hh) * sc.slice + base, dv, rs, ks, t);
    }
  }
#endif /* sm_90a */
}

/* dk = scale sum_hh part[hh], dv = sum_hh part[hs + hh] in bf16, hh ascending: the head split's fixed order. */
__global__ void sa_hop_dkdv_sum_kernel(const float *part, __nv_bfloat16 *dk, __nv_bfloat16 *dv, size_t n, int hs,
                                       float scale) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  for (size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * 4; i < n; i += (size_t)gridDim.x * blockDim.x * 4) {
    float4 a = *reinterpret_cast<const float4 *>(part + i), c = *reinterpret_cast<const float4 *>(part + hs * n + i);
    for (int h = 1; h < hs; ++h) {
      const float4 a1 = *reinterpret_cast<const float4 *>(part + h * n + i);
      const float4 c1 = *reinterpret_cast<const float4 *>(part + (hs + h) * n + i);
      a.x += a1.x, a.y += a1.y, a.z += a1.z, a.w += a1.w;
      c.x += c1.x, c.y += c1.y, c.z += c1.z, c.w += c1.w;
    }
    uint2 ok, ov;
    ok.x = pack_bf16(a.x * scale, a.y * scale);
    ok.y = pack_bf16(a.z * scale, a.w * scale);
    ov.x = pack_bf16(c.x, c.y);
    ov.y = pack_bf16(c.z, c.w);
    *reinterpret_cast<uint2 *>(dk + i) = ok;
    *reinterpret_cast<uint2 *>(dv + i) = ov;
  }
#endif /* sm_90a */
}

template <bool CAUSAL, bool WAIT>
cudaError_t sa_hop_onepass64_run(const CUtensorMap (&m)[7], const sa_hop_onepass_params &bp,
                                 const sa_hop_onepass64_sched &sc, const sa_cuda_plan &plan, cudaStream_t st) {
  constexpr int smem = op64_smem();
  cudaError_t e =
      cudaFuncSetAttribute(sa_hop_onepass64_kernel<CAUSAL, WAIT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  if ((e = cudaMemsetAsync(sc.sync, 0, plan.sync_bytes, st)) != cudaSuccess) return e; /* not dq_acc */
  return sa_hop_launch_items(sa_hop_onepass64_kernel<CAUSAL, WAIT>, plan, THREADS64, smem, st, m[0], m[1], m[2], m[3],
                             m[4], m[5], m[6], bp, sc, plan.items);
}

} /* namespace */

cudaError_t sa_hop_onepass64_launch(const sa_cuda_plan &plan, const sa_cuda_params &p, void *ws, cudaStream_t st) {
  const int hs = plan.split;
  float *acc = (float *)ws;
  int *sync = (int *)((char *)ws + plan.off_sync);
  float *part = (float *)((char *)ws + plan.off_part);
  CUtensorMap m[7];
  sa_hop_onepass_params bp;
  if (!sa_hop_onepass_prepare(p, acc, KB64, m, &bp)) return cudaErrorInvalidValue; /* K / V as 192-row boxes */
  const sa_hop_onepass64_sched sc = {sync,   hs > 1 ? part : nullptr,        plan.nkb, (int)(p.G / hs), hs, plan.n_all,
                                     plan.d, (size_t)(p.B * p.S * p.K * p.H)};
  cudaError_t e = plan.op_wait ? (p.causal ? sa_hop_onepass64_run<true, true>(m, bp, sc, plan, st)
                                           : sa_hop_onepass64_run<false, true>(m, bp, sc, plan, st))
                               : (p.causal ? sa_hop_onepass64_run<true, false>(m, bp, sc, plan, st)
                                           : sa_hop_onepass64_run<false, false>(m, bp, sc, plan, st));
  if (e != cudaSuccess) return e;
  if (hs > 1) { /* every element of every partial was written by its item: no memset */
    const size_t blocks = (sc.slice / 4 + 255) / 256, cap = (size_t)plan.sms * 8;
    sa_hop_dkdv_sum_kernel<<<(unsigned)(blocks < cap ? blocks : cap), 256, 0, st>>>(sc.part, bp.dk, bp.dv, sc.slice, hs,
                                                                                    bp.scale);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  return cudaSuccess; /* dq: written by the kernel's converter warps (nat_last64), no sa_hop_dq_convert_kernel */
}
