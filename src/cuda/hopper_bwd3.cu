/*
 * hopper_bwd3.cu — the sm_90a ONE-pass backward at H64 with THREE consumer warpgroups: dev/hopper_bwd_06.cu
 * (deterministic mode, order NAT) moved into the library. Measured on the H200 (bench/NOTES.md, H200 session 5):
 * 46/46 checks; the whole backward against dev 05's one pass at H64 (2 warpgroups, 128 keys) 1.22x at B4 T4096
 * N32 causal, 1.32x non-causal, 1.21x B1 T16384 causal, 1.19x B16 T1024 causal, 1.39x gpt-oss (B1 T4096 N64/8
 * causal, head split 2). At H64 the two passes of hopper_bwd.cu do 7 products to cuDNN's 5.
 *   CTA: (b, kv head, [head split,] 192 keys), 512 threads = producer warpgroup (setmaxnreg 32: TMA thread 0, dQ
 *   writer thread 32, dq converter warps 2-3) + 3 consumer warpgroups of 64 keys (setmaxnreg 160: 128 x 32 + 384
 *   x 160 = 65536). Per warpgroup and 64-query tile, as hopper_bwd1.cu: S^T = K Q^T, dP^T = V dO^T (wgmma SS
 *   m64n64), P^T and dS^T in registers, dV += P^T dO, dK += dS^T Q (RS): dK 32 + dV 32 + S^T 32 + dP^T 32
 *   accumulators + 32 fragments.
 *   S is a multiple of 128, not 192: a head's last CTA may hold 64 or 128 keys (n_wg = 1 or 2 warpgroups; the
 *   others leave before setmaxnreg.inc; every barrier count is n_wg's, from the ticket).
 *   dQ [64 q x 64] = dS [64 q x 192 keys] K [192 keys x 64]: M 64 is wgmma's minimum and 64 columns do not split
 *   in three, so one warpgroup computes the whole tile: the OWNER of tile k is warpgroup k % n_wg, in its
 *   iteration k + 1 (the others' dS^T(k) are then a tile old): 12 wgmma m64n64k16, both operands MN-major. The
 *   bursts of 12 every third tile also stagger the warpgroups' softmax phases, the point of a third warpgroup.
 *   dS^T: each warpgroup stores its [64 keys x 64 q] slice into buffer k % 3 of three [192][64] bf16 buffers, so
 *   each buffer has one reader per use. Staging and adds as hopper_bwd1.cu: the owner writes its fp32 tile into
 *   slot k & 1, every owner thread arrives on dq_full (racecheck does not carry a __syncwarp through an elected
 *   arrive: 1.2 M WAW reports between rotating owners when 4 warps arrived); the writer waits for its NAT rank on
 *   the (b, head, 64-query tile) semaphore, two TMA reduce-adds (rank 0: two TMA stores, so dq_acc is not zeroed;
 *   coverage above nat_rank3), .read wait, dq_empty, completion, release.
 *   Phases never two apart: the owner of k waits dq_empty(k & 1) after ds_full(k), whose completion means the
 *   owner of k - 2 staged k - 2 already (it saw k - 4 read first), so the barrier is never at k - 4's phase.
 *   Causal top-left: key block kb starts at query tile 3 kb; a warpgroup that no row of a tile sees skips its
 *   products and stores a zero dS^T slice (the owner's dQ reads all 192 keys).
 *   GQA head split: the G heads of a kv head over hs CTAs per key block while the grid is under 8 CTAs an SM
 *   (sa_hop3_split; gpt-oss: 176 CTAs become 1408, hs 8). Each writes fp32 partial dK / dV into the workspace;
 *   dkdv_sum adds them in head-split order (deterministic) into bf16.
 * Per call, on the caller's stream (no allocation, no sync): memset of the ticket and the semaphores (4 (1 + B N T /
 * 64) bytes; not dq_acc: 0.038 ms for its 128 MiB at B4 T4096 N32), bwd_onepass3, [dkdv_sum]; between the
 * preprocess and the sink reduction of cuda_bwd.cu, as hopper_bwd1.cu. No dq convert kernel (0.055 ms at B4 T4096
 * N32): the last visit of a tile (nat_last3) TMA-loads the final fp32 tile into one of 2 spare 16 KiB slots and
 * the producer warpgroup's idle warps 2-3 write dq = scale dq_acc in bf16 from there.
 * Scope (sa_hopper_bwd3_in_scope): sa_hopper_bwd_in_scope, H == Hv == 64, no lengths / segments / window, causal
 * none or top-left with diag_offset 0, ceil(S / 192) <= SMs (NAT: a head's CTAs co-resident, one per SM: 219 KiB
 * of shared memory), without a mask G / hs T / 64 >= ceil(S / 192) (distinct NAT start tiles), B N T < 2^27.
 * SINKATTN_HOP_BWD_ONEPASS=0 in the environment runs the two passes instead (A/B, tests); the workspace stays
 * reserved. The same items run on a persistent grid (hopper_bwd3p.cu; grid capped by SINKATTN_HOP_BWD_GRID;
 * SINKATTN_HOP_BWD3_PERSIST=0: one CTA an item, the kernel below); the constants and device helpers both kernels
 * use are in hopper_bwd3.cuh.
 */
#include <algorithm>

#include "hopper_bwd3.cuh"

namespace {

/* tml / tmd: lse2, D [B N, T] fp32 (box 64); tma: dq_acc {H, T, B N} fp32 (box {32, 64, 1}, 128-byte swizzle);
   tmk / tmv: 192-row boxes (past S: TMA's zero fill, counted in the transaction bytes). */
template <bool CAUSAL>
__global__ void __launch_bounds__(THREADS3, 1)
    bwd_onepass3(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmdo,
                 const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv,
                 const __grid_constant__ CUtensorMap tml, const __grid_constant__ CUtensorMap tmd,
                 const __grid_constant__ CUtensorMap tma, const BwdParams p, const Sched3 sc) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int HD = 64;
  constexpr uint32_t KV_BYTES = KB3 * HD * 2, QT_BYTES = QB * HD * 2, LD_BYTES = 2 * QB * 4, DQ_BYTES = QB * HD * 4;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  /* K+V full; per stage full, empty; per dS^T buffer full, empty; per dQ slot full, empty; per converter slot
     full, empty */
  __shared__ __align__(8) uint64_t bar[1 + 2 * STAGES + 2 * NDS + 8];
  __shared__ float anchor[4 * NC3];
  __shared__ int ticket;

  const uint32_t raw = smem_u32(smem_raw), sk = (raw + 1023u) & ~1023u, sv = sk + KV_BYTES;
  const uint32_t sq = sv + KV_BYTES, sdo = sq + STAGES * QT_BYTES, sds = sdo + STAGES * QT_BYTES;
  const uint32_t sdq = sds + NDS * DS3_BYTES, sld = sdq + 2 * DQ_BYTES, scv = sld + STAGES * LD_BYTES;
  const float *ld_f = reinterpret_cast<const float *>(smem_raw + (sld - raw)); /* per stage: lse2[QB], D[QB] */
  const uint32_t b0 = smem_u32(bar);
  auto bar_full = [&](int s) { return b0 + 8 * (1 + s); };
  auto bar_empty = [&](int s) { return b0 + 8 * (1 + STAGES + s); };
  auto ds_full = [&](int x) { return b0 + 8 * (1 + 2 * STAGES + x); };
  auto ds_empty = [&](int x) { return b0 + 8 * (1 + 2 * STAGES + NDS + x); };
  auto dq_full = [&](int x) { return b0 + 8 * (1 + 2 * STAGES + 2 * NDS + x); };
  auto dq_empty = [&](int x) { return b0 + 8 * (3 + 2 * STAGES + 2 * NDS + x); };
  auto cv_full = [&](int x) { return b0 + 8 * (5 + 2 * STAGES + 2 * NDS + x); };
  auto cv_empty = [&](int x) { return b0 + 8 * (7 + 2 * STAGES + 2 * NDS + x); };

  if (threadIdx.x == 0) {
    /* Tickets in start order (05): the waits are then on CTAs that hold an SM or are done. The counts need
       the CTA's warpgroups with keys, so the ticket comes first. */
    const int v = atomicAdd(sc.sync, 1);
    ticket = v;
    const int nw = min(NC3, (p.S - (v % sc.nkb) * KB3) / 64); /* S - k0: a positive multiple of 64 */
    mbar_init(b0, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bar_full(s), 1);
      mbar_init(bar_empty(s), 4 * nw); /* one arrive per warp of a warpgroup with keys */
    }
    for (int x = 0; x < NDS; ++x) {
      mbar_init(ds_full(x), 4 * nw); /* every warpgroup stores its slice of every dS^T */
      mbar_init(ds_empty(x), 4);     /* the owner's 4 warps, after its dQ product */
    }
    for (int x = 0; x < 2; ++x) {
      mbar_init(dq_full(x), 128); /* every thread of the owner: racecheck does not carry a __syncwarp through an
                                     elected arrive (1.2 M WAW reports between owners, lanes 1-31 only) */
      mbar_init(dq_empty(x), 1); /* the writer */
      mbar_init(cv_full(x), 1);   /* the writer's load */
      mbar_init(cv_empty(x), 64); /* every converter thread, after its shared reads */
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  /* Key block fastest, then the head split: a head's key blocks start together (05). Through __shfl_sync so ptxas
     knows it is warp-uniform (05: else n_tiles is spilled). */
  const int vid = __shfl_sync(0xffffffffu, ticket, 0);
  const int kb = vid % sc.nkb, hh = (vid / sc.nkb) % sc.hs, kvh = (vid / (sc.nkb * sc.hs)) % p.KH;
  const int b = vid / (sc.nkb * sc.hs * p.KH);
  const int k0 = kb * KB3, G = sc.Gc, T = p.T, PT = T / QB;
  const int n_wg = min(NC3, (p.S - k0) / 64);
  /* Top-left causal: query i sees key j iff j <= i, so query blocks ending before k0 are skipped. */
  const int qb0 = CAUSAL ? k0 / QB : 0, per_head = max(0, PT - qb0), n_tiles = CAUSAL ? G * per_head : sc.n_all;
  const int rot = (!CAUSAL && n_tiles > 0) ? kb * sc.d % n_tiles : 0;
  const int hd0 = kvh * (p.N / p.KH) + hh * G; /* the CTA's first query head */
  const int wg = threadIdx.x / 128;

  if (wg == 0) {
    /* 128 x 32 + 384 x 160 = 65536 = 512 x 128, the CTA's registers at launch: the pool setmaxnreg.inc draws on */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS3P) : "memory");
    if (n_tiles > 0 && threadIdx.x == 0) { /* the TMA producer (05's, 192-row K / V boxes) */
      mbar_arrive_tx(b0, 2 * KV_BYTES);
      tma_load(sk, &tmk, b0, 0, kvh, k0, b);
      tma_load(sv, &tmv, b0, 0, kvh, k0, b);
      Walk w(rot, qb0, PT, G);
      for (int it = 0; it < n_tiles; ++it, w.next()) {
        const int s = it % STAGES, n = hd0 + w.g, i0 = w.q * QB;
        mbar_wait(bar_empty(s), ((it / STAGES) & 1) ^ 1);
        mbar_arrive_tx(bar_full(s), 2 * QT_BYTES + LD_BYTES);
        tma_load(sq + s * QT_BYTES, &tmq, bar_full(s), 0, n, i0, b);
        tma_load(sdo + s * QT_BYTES, &tmdo, bar_full(s), 0, n, i0, b);
        tma_load_2d(sld + s * LD_BYTES, &tml, bar_full(s), i0, b * p.N + n);
        tma_load_2d(sld + s * LD_BYTES + QB * 4, &tmd, bar_full(s), i0, b * p.N + n);
      }
    } else if (n_tiles > 0 && threadIdx.x == 32) { /* the dQ writer (warp 1), 05's */
      Walk w(rot, qb0, PT, G);
      const int bn0 = b * p.N + hd0; /* row (b N + n) of the CTA's head g: bn0 + g */
      int nv = 0;                    /* tiles handed to the converter */
      for (int k = 0; k < n_tiles; ++k, w.next()) {
        const int x = k & 1;
        int *sem = sc.sync + 1 + (size_t)(bn0 + w.g) * PT + w.q;
        mbar_wait(dq_full(x), (k >> 1) & 1);
        const int rank = nat_rank3<CAUSAL>(kb, w.g, w.q, sc.nkb, PT, sc.d);
        while (ld_acquire(sem) != rank) {
        }
        fence_async_global(); /* the reduce (async proxy) after the acquire that saw the previous adds */
        const uint32_t src = sdq + x * DQ_BYTES;
        /* rank 0 stores (dq_acc is not zeroed; coverage: above nat_rank3), later ranks add */
        write_dq_tile<HD>(&tma, src, rank, w.q * QB, bn0 + w.g, dq_empty(x), sem);
        if (nat_last3<CAUSAL>(kb, w.g, w.q, sc.nkb, PT, sc.d)) { /* final: back to shared for the converter */
          const int cb = nv & 1;
          mbar_wait(cv_empty(cb), ((nv >> 1) & 1) ^ 1);
          mbar_arrive_tx(cv_full(cb), DQ_BYTES);
          for (int c = 0; c < HD / 32; ++c)
            tma_load_3d(scv + cb * DQ_BYTES + c * QB * 128, &tma, cv_full(cb), c * 32, w.q * QB, bn0 + w.g);
          ++nv;
        }
      }
      bulk_wait0();
    } else if (n_tiles > 0 && threadIdx.x >= 64) { /* warps 2-3: the dq converter */
      /* dq [B, T, N, 64] bf16 = scale * the tiles this CTA finishes (dq_convert's products, bitwise): 8 fp32 of
         row r of box c (16-byte units 2 v, 2 v + 1 at u ^ (r % 8)) -> one 16-byte store; a thread's 8 rows r0 + 8 i
         share r % 8; 8 threads write a row's 128 B. Per tile and thread 16 LDS.128, 64 FMUL, 32 F2FP, 8 STG.128
         (~180 instructions a warp) on the producer's otherwise idle warps; dq_convert re-read the tile from DRAM. */
      const int tid = threadIdx.x - 64, r0 = tid / 8, c = tid % 8 / 4, v = tid % 4;
      const uint32_t off = c * QB * 128 + r0 * 128 + (((2 * v) ^ r0) << 4); /* unit 2 v; 2 v + 1: off ^ 16 */
      const float scale = p.scale;
      Walk w(rot, qb0, PT, G);
      int nv = 0;
      for (int k = 0; k < n_tiles; ++k, w.next()) {
        if (!nat_last3<CAUSAL>(kb, w.g, w.q, sc.nkb, PT, sc.d)) continue;
        const int cb = nv & 1;
        mbar_wait(cv_full(cb), (nv >> 1) & 1);
        uint32_t box = scv + cb * DQ_BYTES + off;
        uint4 *dst = reinterpret_cast<uint4 *>(p.dq + (((size_t)b * T + w.q * QB + r0) * p.N + hd0 + w.g) * HD +
                                               8 * (tid % 8));
        convert_dq_rows(box, dst, p.N * HD, scale);
        mbar_arrive(cv_empty(cb)); /* releases this thread's shared reads before the writer's next load */
        ++nv;
      }
    }
    return;
  }

  /* A warpgroup past S leaves before setmaxnreg.inc (a per-warpgroup instruction); no barrier counts it. Warp-
     uniform through __shfl_sync: the owner's branch holds wgmma. */
  const int cw = __shfl_sync(0xffffffffu, wg - 1, 0);
  if (cw >= n_wg) return;
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS3) : "memory");
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, t = lane % 4;
  const int kw0 = k0 + 64 * cw, kr = kw0 + 16 * warp + lane / 4; /* this thread's keys: kr, kr + 8 */
  const uint32_t sk_wg = sk + cw * 64 * 128, sv_wg = sv + cw * 64 * 128;
  const float sl2 = p.scale_l2;
  /* Accumulators d[4j + e]: row lane/4 + 8 (e >> 1) of the warp's 16, column 8j + 2t + (e & 1). */
  float dk[HD / 2], dv[HD / 2];
  zero(dk);
  zero(dv);
  if (n_tiles > 0) mbar_wait(b0, 0);

  /* Iteration it: tile it (if it < n_tiles), then dQ(it - 1) if this warpgroup owns it; one loop so the dQ
     section exists once (the last tile's dQ is iteration n_tiles). ow: owner of tile it - 1. */
  int ow = n_wg - 1;
  for (int it = 0; it <= n_tiles; ++it) {
    if (it < n_tiles) {
      const int s = it % STAGES, i0 = (qb0 + it % per_head) * QB; /* i0: causal only (no rotation there) */
      const uint32_t sq_s = sq + s * QT_BYTES, sdo_s = sdo + s * QT_BYTES;
      /* No row of the tile sees this warpgroup's keys (causal: the CTA's first tiles, keys past T). */
      const bool skip = CAUSAL && i0 + QB <= kw0;
      float st[32], dpt[32];
      uint32_t pf[16], df[16];
      mbar_wait(bar_full(s), (it / STAGES) & 1);
      if (!skip) {
        /* ---- 05's tile: S^T, dP^T, P^T, dS^T ---- */
        onepass_tile<HD, CAUSAL>(st, dpt, pf, df, sk_wg, sv_wg, KB3, sq_s, sdo_s, ld_f + s * 2 * QB, sl2, i0, kw0, kr,
                                 t, &anchor[4 * cw + warp], lane);
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) df[i] = 0u; /* bf16 +0: the owner's dQ reads all 192 keys */
      }
      /* ---- this warpgroup's slice of dS^T(it) into buffer it % 3, once dQ(it - 3) has read it ---- */
      const int x = it % NDS;
      const uint32_t sds_x = sds + x * DS3_BYTES;
      mbar_wait(ds_empty(x), ((it / NDS) & 1) ^ 1);
      store_ds_rows(sds_x, df, kr - k0, t); /* rows 0 .. 191 */
      fence_async_shared(); /* generic stores -> the owner's wgmma reads */
      __syncwarp();
      if (lane == 0) mbar_arrive(ds_full(x));
      if (!skip) { /* ---- dV, dK of this tile ---- */
        dvdk_issue<HD>(dv, dk, pf, df, sdo_s, sq_s);
        dvdk_retire<HD>(dv, dk, pf, df);
      }
      /* lse2 / D of this stage were read by every lane with plain loads: the warp synchronises before the elected
         arrive (mbarrier.arrive releases only the arriving thread's accesses). */
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_empty(s));
    }
    if (it > 0 && ow == cw) { /* ---- dQ(it - 1): every warpgroup's dS^T(it - 1) is a tile old ---- */
      const int k = it - 1, xk = k % NDS;
      const uint32_t sds_k = sds + xk * DS3_BYTES;
      float dq[32];
      mbar_wait(ds_full(xk), (k / NDS) & 1);
      dq_product_nwg(dq, sds_k, sk, n_wg);
      if (lane == 0) mbar_arrive(ds_empty(xk));
      mbar_wait(dq_empty(k & 1), ((k >> 1) & 1) ^ 1); /* the writer's reduce of dQ(k - 2) has read the slot */
      stage_dq64(dq, sdq + (k & 1) * DQ_BYTES, warp, lane);
      fence_async_shared(); /* generic stores -> the TMA reduce's reads */
      mbar_arrive(dq_full(k & 1)); /* each thread its own stores (see dq_full's count) */
    }
    ow = ow + 1 == n_wg ? 0 : ow + 1; /* owner of tile it */
  }

  const size_t rs = (size_t)p.KH * HD;
  const size_t base = ((size_t)b * p.S * p.KH + kvh) * HD;
  if (sc.hs == 1) {
    store_rows<HD>(p.dk + base, dk, rs, kr, t, p.scale); /* zeros where no query sees the keys */
    store_rows<HD>(p.dv + base, dv, rs, kr, t, 1.f);
  } else { /* partial sums of this CTA's G / hs heads, unscaled; dkdv_sum adds them in hh order */
    const size_t slice = sc.slice; /* B S KH H */
    store_rows_f32(sc.part + hh * slice + base, dk, rs, kr, t);
    store_rows_f32(sc.part + (sc.hs + hh) * slice + base, dv, rs, kr, t);
  }
#endif /* sm_90a */
}

/* dk = scale sum_hh part[hh], dv = sum_hh part[hs + hh] in bf16, hh ascending: the head split's fixed order. */
__global__ void dkdv_sum(const float *part, __nv_bfloat16 *dk, __nv_bfloat16 *dv, size_t n, int hs, float scale) {
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

/* ---- host ------------------------------------------------------------------------------------------- */

static int64_t sa_hop3_nkb(const sa_cuda_params &p) { return (p.S + KB3 - 1) / KB3; }

/* The head split hs: the G heads of a kv head over hs CTAs per key block, doubled while G allows and the grid is
   under 8 CTAs an SM. Causal CTAs differ in length (key block kb of 22 at T4096 walks 64 - 3 kb query tiles a
   head) and the tickets start a head's key blocks together, heaviest first, so a short grid ends on a tail:
   gpt-oss (B1 T4096 N64/8) has 176 CTAs for 132 SMs; a list-scheduling model of the tickets gives the busy share
   of the SMs as 0.59 / 0.70 / 0.82 / 0.90 for hs 1 / 2 / 4 / 8. Measured (f+b TFLOP/s at gpt-oss, one run, H200
   session 5): hs 2 / 4 / 8 = 318 / 353 / 362 (dev 06: hs 1 / 2 = 238 / 286 for the backward alone). The
   partials cost 2 hs fp32 copies of dK, dV: 8 MiB each at gpt-oss (hs 8: 128 MiB of workspace).
   SINKATTN_HOP_BWD_SPLIT=n forces hs = n where n divides G (A/B, tests). */
static int sa_hop3_split(const sa_cuda_params &p) {
  const int64_t force = sa_cuda_env_int("SINKATTN_HOP_BWD_SPLIT", 0);
  if (force > 0) return p.G % force == 0 ? (int)force : 1;
  const int64_t grid = sa_hop3_nkb(p) * p.K * p.B, target = 8 * (int64_t)sa_cuda_sm_count();
  int hs = 1;
  while (p.G % (2 * hs) == 0 && grid * hs < target) hs *= 2;
  return hs;
}

static size_t sa_hop3_slice(const sa_cuda_params &p) { return (size_t)(p.B * p.S * p.K * p.H); }
static size_t sa_hop3_part_bytes(const sa_cuda_params &p, int hs) {
  return hs > 1 ? 2 * (size_t)hs * sa_hop3_slice(p) * 4 : 0;
}

/* A refused shared-memory opt-in leaves *used = 0: the two passes run instead. grid 0: one CTA an item (the
   default); else the persistent kernel of hopper_bwd3p.cu on grid CTAs. */
template <bool CAUSAL>
cudaError_t sa_hop3_run(const CUtensorMap (&m)[7], const BwdParams &bp, const Sched3 &sc, int64_t B,
                        size_t sync_bytes, int sms, int grid, cudaStream_t st, int *used) {
  constexpr int smem = op_smem3();
  const int total = (int)(sc.nkb * sc.hs * bp.KH * B);
  if (grid > 0 ? !sa_hop3p_smem(CAUSAL)
               : cudaFuncSetAttribute(bwd_onepass3<CAUSAL>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
                     cudaSuccess) {
    cudaGetLastError();
    return cudaSuccess;
  }
  *used = 1;
  cudaError_t e = cudaMemsetAsync(sc.sync, 0, sync_bytes, st); /* the ticket, the semaphores (not dq_acc) */
  if (e != cudaSuccess) return e;
  if (grid > 0)
    e = sa_hop3p_launch(CAUSAL, m, bp, sc, total, grid, st);
  else
    bwd_onepass3<CAUSAL><<<(unsigned)total, THREADS3, smem, st>>>(m[0], m[1], m[2], m[3], m[4], m[5], m[6], bp, sc);
  if (e != cudaSuccess || (e = cudaGetLastError()) != cudaSuccess) return e;
  if (sc.hs > 1) { /* every element of every partial was written by its CTA: no memset */
    dkdv_sum<<<(unsigned)std::min<size_t>((sc.slice / 4 + 255) / 256, (size_t)sms * 8), 256, 0, st>>>(
        sc.part, bp.dk, bp.dv, sc.slice, sc.hs, bp.scale);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  return cudaSuccess; /* dq: written by the kernel's converter warps (nat_last3), no dq_convert */
}

} /* namespace */

bool sa_hopper_bwd3_in_scope(const sa_cuda_params &p, int bf16) {
  if (p.H != 64 || p.Hv != 64 || p.q_lens || p.kv_lens || p.q_seg || p.kv_seg || p.wl >= 0 || p.wr >= 0)
    return false;
  /* causal none (a diag_offset alone changes nothing) or top-left on the main diagonal: the kernel's mask */
  if (!(p.causal == 0 || (p.causal == 1 && p.diag_offset == 0))) return false;
  if (p.B * p.N * p.T >= ((int64_t)1 << 27)) return false; /* hopper_bwd1.cu's bound (dq_convert), kept */
  if (!sa_hopper_bwd_in_scope(p, bf16)) return false; /* bf16, T, S multiples of 128, CC 9.0, sm_90a code */
  const int64_t nkb = sa_hop3_nkb(p), n_all = p.G / sa_hop3_split(p) * (p.T / QB);
  if (p.causal == 0 && n_all < nkb) return false; /* NAT's start tiles kb * d must be distinct */
  return nkb <= sa_cuda_sm_count(); /* NAT: a head's key blocks co-resident, one CTA per SM */
}

size_t sa_hopper_bwd3_workspace(const sa_cuda_params &p) {
  return sa_cuda_round256(sa_hop1_acc_bytes(p)) + sa_cuda_round256(sa_hop1_sync_bytes(p)) +
         sa_cuda_round256(sa_hop3_part_bytes(p, sa_hop3_split(p)));
}

cudaError_t sa_hopper_bwd3_try(const sa_cuda_params &p, int bf16, void *ws, size_t ws_bytes, cudaStream_t st,
                               int *used) {
  *used = 0;
  if (!p.lse2 || !p.D || !sa_hop_aligned(p.lse2) || !sa_hop_aligned(p.D) || !ws || !sa_hop_aligned(ws) ||
      !sa_hopper_bwd3_in_scope(p, bf16) || ws_bytes < sa_hopper_bwd3_workspace(p) ||
      sa_cuda_env_int("SINKATTN_HOP_BWD_ONEPASS", 1) == 0)
    return cudaSuccess;
  const int sms = sa_cuda_sm_count(), hs = sa_hop3_split(p);
  float *acc = (float *)ws;
  int *sync = (int *)((char *)ws + sa_cuda_round256(sa_hop1_acc_bytes(p)));
  float *part = (float *)((char *)sync + sa_cuda_round256(sa_hop1_sync_bytes(p)));
  CUtensorMap m[7];
  BwdParams bp;
  if (!sa_hop1_prepare(p, acc, KB3, m, &bp)) return cudaSuccess; /* K / V as 192-row boxes */
  const int nkb = (int)sa_hop3_nkb(p), Gc = (int)(p.G / hs), n_all = Gc * (int)(p.T / QB);
  const Sched3 sc = {sync, hs > 1 ? part : nullptr, nkb, Gc, hs, n_all, std::max(1, n_all / nkb), sa_hop3_slice(p)};
  const size_t sb = sa_hop1_sync_bytes(p);
  /* The persistent kernel (hopper_bwd3p.cu) on sa_hop1_grid's CTAs: same items, same head split (hopper_bwd3p.cu
     says why), same workspace. Measured against the one-CTA-an-item kernel in one run (H200 session 6, f+b):
     B16 T1024 N32 +3.6%, causal +8%, B4 T4096 causal +7%, gpt-oss +2.5%, B4 T4096 / B1 T16384 -0.4% / -0.7%.
     SINKATTN_HOP_BWD3_PERSIST=0 runs the one-CTA-an-item kernel (A/B, tests). */
  int grid = 0;
  if (sa_cuda_env_int("SINKATTN_HOP_BWD3_PERSIST", 1) != 0)
    grid = sa_hop1_grid(nkb, (int64_t)nkb * hs * p.K * p.B, sms);
  return p.causal ? sa_hop3_run<true>(m, bp, sc, p.B, sb, sms, grid, st, used)
                  : sa_hop3_run<false>(m, bp, sc, p.B, sb, sms, grid, st, used);
}
