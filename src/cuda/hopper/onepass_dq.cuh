/*
 * hopper/onepass_dq.cuh — the ordered dQ adds and what else both one-pass backwards share: parameters, the dQ
 * adds' PTX (TMA store and reduce-add, proxy fences, the semaphore's acquire and release), their order (nat_rank),
 * the dQ staging, the transposed wgmma, the tile step, the query-tile walk, and the cooperative launch.
 * docs/hopper.md, "one-pass backward".
 */
#ifndef SA_HOPPER_ONEPASS_DQ_CUH
#define SA_HOPPER_ONEPASS_DQ_CUH

#include <utility>

#include "hopper/bwd_gemm.cuh"
#include "plan.h"

/* the one passes' parameters (outputs [B, L, heads, H] bf16); the kernel reads dk, dv, T, S, N, KH, the scales
   (dq_acc, lse2, D go by tensor map, dq by sa_hop_dq_convert_kernel). */
struct sa_hop_onepass_params {
  __nv_bfloat16 *dq, *dk, *dv;
  float *dq_acc;         /* [B, N, T, H] fp32 */
  const float *lse2, *D; /* [B, N, T] */
  int T, S, N, KH;
  float scale, scale_l2;
};

/* The CTA's query tiles in visiting order: head g of the kv head's G, query block q in [qb0, PT); a rotation
   start t0 wraps around the G (PT - qb0) tiles. Stepped, not divided out of the loop counter. */
struct sa_hop_walk {
  int g, q, qb0, PT, G;
  __host__ __device__ sa_hop_walk(int t0, int qb0_, int PT_, int G_) : qb0(qb0_), PT(PT_), G(G_) {
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

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* global[box at {c0, c1, c2}] += shared[src] (fp32, element type from the map), tracked by bulk async-groups. */
__device__ __forceinline__ void tma_reduce_add(const CUtensorMap *map, uint32_t src, int c0, int c1, int c2) {
  asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
                   (uint64_t)map),
               "r"(src), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
/* global[box at {c0, c1, c2}] = shared[src]: tma_reduce_add's store (same map, same shared layout, same groups);
   a tile's first visitor stores, so dq_acc needs no memset. */
__device__ __forceinline__ void tma_store_3d(const CUtensorMap *map, uint32_t src, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"((uint64_t)map),
      "r"(src), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
/* shared[dst] = global[box at {c0, c1, c2}], completing on bar: a finished dq_acc tile back for the H64 one pass's
   dq converter (hopper/onepass64.cu), same map and shared layout as the two above. */
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1,
                                            int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::
          "r"(dst),
      "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
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
/* The ticket counter's value without ordering: the persistent kernels' "is the counter past this head?" test
   (a stale value only delays a ticket). */
__device__ __forceinline__ int ld_relaxed(const int *p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_add(int *p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* The dQ writer's turn at a dq_acc tile [64 rows from row0][HD] of plane (b N + head), once its semaphore reached
   its rank (and fence_async_global ordered the async proxy after that acquire): rank 0 stores the staged tile at
   src (H / 32 boxes of [64][32] fp32), later ranks add it; the staging slot is released (arrive on dq_empty) as
   soon as the copies have read it, the semaphore once the writes are done in L2 and ordered before the release. */
template <int HD>
__device__ __forceinline__ void write_dq_tile(const CUtensorMap *tma, uint32_t src, int rank, int row0, int plane,
                                              uint32_t dq_empty, int *sem) {
  constexpr int QB = SA_HOP_BWD_QB;
  if (rank == 0) /* the tile's first visit stores: dq_acc is not zeroed */
    for (int c = 0; c < HD / 32; ++c) tma_store_3d(tma, src + c * QB * 128, c * 32, row0, plane);
  else
    for (int c = 0; c < HD / 32; ++c) tma_reduce_add(tma, src + c * QB * 128, c * 32, row0, plane);
  bulk_commit();
  bulk_wait_read0();
  mbar_arrive(dq_empty);
  bulk_wait0();         /* this tile's store / adds are done in L2 ... */
  fence_async_global(); /* ... and ordered before the release */
  red_release_add(sem, 1);
}

/* D[64xN] (+)= A[64x16] B[16xN], A and B both MN-major in shared memory (imm-trans-a = imm-trans-b = 1). */
__device__ __forceinline__ void wgmma_ss_tt(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" SA_REGS32 "}, %32, %33, p, 1, 1, 1, 1;\n}\n"
      : SA_F32(d)
      : "l"(da), "l"(db), "r"(scale_d));
}

/* NAT rank of key block kb's visit to tile (g, q) (key blocks of KB keys; written for KB = 128, H128's, and the same
   with 192, H64's: hopper/onepass64.cuh): how many key blocks visit it at an earlier step of their walk
   (ties cannot occur). Causal: the visitors are key blocks 0..m, m = min(nkb - 1, q / 2), and key block j reaches
   (g, q) at step g (PT - 2j) + q - 2j: descending j, rank m - kb. Non-causal: key block j starts at tile j d
   (distinct offsets below n_all = G PT when n_all >= nkb, which the host ensures), so tile t = g PT + q comes at
   step t - j d for j <= m = min(nkb - 1, t / d), else t - j d + n_all: the order m, m - 1, .., 0, nkb - 1, .., m + 1,
   rank (m - kb) mod nkb. Equal to counting the earlier visits (15.1 M visits checked on the host, T, S <= 4096).
   dq_acc is not zeroed: every (b, head, 64-query tile) has exactly one rank-0 visit, which stores the whole tile
   before any add to it. The grid is one CTA per (b, kv head, key block kb < nkb), nkb = S / 128 >= 1 (S > 0 in
   sa_hop_scope); a CTA's walk visits n_tiles distinct tiles of heads kvh G + g, g < G (all N heads over the kv
   heads). Causal top-left: key block j visits (g, q) iff q >= 2 j; key block 0 visits every tile, so the visitors
   of (g, q) are 0..m (T > S: all nkb from q = 2 nkb - 2 on; T < S: key blocks with 2 kb >= T / 64 have no tile
   and no writer, but 2 m <= q < T / 64), ranks m - kb: a bijection onto 0..m, rank 0 is key block m. Non-causal: every
   key block visits all n_all tiles, (m - kb) mod nkb is a bijection of kb onto 0..nkb-1, rank 0 is key block m.
   The semaphores start at 0 and rank r waits for r: rank 0 goes first, and the next rank's acquire sees its store
   complete (bulk_wait0 + fence.proxy.async.global before the release, as for an add). H / 32 boxes {32, 64} cover
   the 64 x H tile, none clipped (64 | T). Results as with a zeroed buffer (+0 + x == x), except x == -0 (+0 +
   -0 == +0; a rank-0 -0 stays -0 unless a later partial is +0 or nonzero). */
template <int KB, bool CAUSAL>
__host__ __device__ __forceinline__ int nat_rank(int kb, int g, int q, int nkb, int PT, int d) {
  const int x = CAUSAL ? q * SA_HOP_BWD_QB / KB : (g * PT + q) / d, m = x < nkb - 1 ? x : nkb - 1;
  return m >= kb ? m - kb : m + nkb - kb; /* causal: always m >= kb */
}

/* This thread's share of a warpgroup's dQ [64 rows][64 fp32 columns] into staging slot `dst`, from box box0 on
   (H128: the warpgroup's half, box0 = 2 cw; H64: the owner's whole tile, box0 = 0): 32-column box c holds
   [64 rows][32 fp32] = 128-byte rows, 16-byte unit u of row r at u ^ (r % 8) (TMA's 128-byte swizzle). A warp's float2 store covers 8 rows x 32 B:
   the 8 row phases spread them over all 32 banks, 2 wavefronts (the minimum for 256 B). */
__device__ __forceinline__ void stage_dq(const float (&dq)[32], uint32_t dst, int box0, int warp, int lane) {
  constexpr int QB = SA_HOP_BWD_QB;
  const int t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * warp + lane / 4 + 8 * h;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int c = box0 + j / 4, u = 2 * (j % 4) + (t >> 1);
      const uint32_t a = dst + c * QB * 128 + r * 128 + ((u ^ (r & 7)) << 4) + 8 * (t & 1);
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(a), "f"(dq[4 * j + 2 * h]), "f"(dq[4 * j + 2 * h + 1])
                   : "memory");
    }
  }
}

/* One key block's share of a 64-query tile, the same in both one-pass kernels: S^T = K Q^T and dP^T = V dO^T
   (wgmma SS, this warpgroup's 64 keys of a kv_rows-key block), P^T = exp2(S^T scale_l2 - lse2) (0 above the
   causal diagonal), dS^T = P^T (dP^T - D), both packed to bf16 fragments. ld_s: this stage's lse2[64], D[64];
   rows i0 .. i0 + 63, keys kw0 .. kw0 + 63, this thread's keys kr, kr + 8; the exp2s overlap dP^T (anchor_exp2). */
template <int HD, bool CAUSAL>
__device__ __forceinline__ void onepass_tile(float (&st)[32], float (&dpt)[32], uint32_t (&pf)[16], uint32_t (&df)[16],
                                             uint32_t sk_wg, uint32_t sv_wg, int kv_rows, uint32_t sq_s, uint32_t sdo_s,
                                             const float *ld_s, float sl2, int i0, int kw0, int kr, int t,
                                             float *anchor_slot, int lane) {
  constexpr int QB = SA_HOP_BWD_QB;
  zero(st);
  zero(dpt);
  pin(st);
  pin(dpt);
  wgmma_fence();
  gemm_ss<HD>(st, sk_wg, kv_rows, sq_s, QB); /* S^T = K Q^T */
  wgmma_commit();
  gemm_ss<HD>(dpt, sv_wg, kv_rows, sdo_s, QB); /* dP^T = V dO^T */
  wgmma_commit();
  wgmma_wait1();
  pin(st);
  const float *lse2 = ld_s, *Dq = ld_s + QB;
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
  anchor_exp2(st, anchor_slot, lane);
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
}

/* This thread's rows r0, r0 + 8 (keys from the block's first) of dS^T into a [keys][64 q] bf16 buffer: 128-byte
   rows, 16-byte unit j of row r at j ^ (r % 8) (the swizzle wgmma reads it with). */
__device__ __forceinline__ void store_ds_rows(uint32_t sds_x, const uint32_t (&df)[16], int r0, int t) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + 8 * h;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      asm volatile("st.shared.b32 [%0], %1;" ::"r"(sds_x + r * 128 + ((j ^ (r & 7)) << 4) + 4 * t), "r"(df[2 * j + h])
                   : "memory");
  }
}

#endif /* sm_90a */

/* ---- host ---- */

/* The tensor maps of both one-pass kernels (Q / dO 64-row boxes, K / V kv_rows-row boxes, lse2 / D rows, dq_acc as
   the reduce target) and their parameters; false when the driver has no encoder or refuses a map. */
bool sa_hop_onepass_prepare(const sa_cuda_params &p, float *acc, int kv_rows, CUtensorMap (&m)[7],
                            sa_hop_onepass_params *bp);

/* dq [B, T, N, H] bf16 = scale * dq_acc [B, N, T, H] on st (onepass128.cu); rows = B T N < 2^27. */
cudaError_t sa_hop_onepass_dq_convert(const float *acc, __nv_bfloat16 *dq, int T, int N, int HD, float scale, int rows,
                                      int sms, cudaStream_t st);

/* The H64 one pass (onepass64.cu); sa_hop_onepass_launch hands H64 plans to it. */
cudaError_t sa_hop_onepass64_launch(const sa_cuda_plan &plan, const sa_cuda_params &p, void *ws, cudaStream_t st);

/* A one-pass kernel on the plan's grid, cooperatively when the plan says so: the driver then starts every CTA
   co-resident or refuses the launch (docs/hopper.md, "progress"). */
template <typename... KP, typename... AP>
cudaError_t sa_hop_launch_items(void (*kernel)(KP...), const sa_cuda_plan &plan, int threads, int smem, cudaStream_t st,
                                AP &&...args) {
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = plan.cooperative;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)plan.grid[0]);
  cfg.blockDim = dim3((unsigned)threads);
  cfg.dynamicSmemBytes = (size_t)smem;
  cfg.stream = st;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<AP>(args)...);
}

#endif /* SA_HOPPER_ONEPASS_DQ_CUH */
