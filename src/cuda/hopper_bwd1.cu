/*
 * hopper_bwd1.cu — the sm_90a ONE-pass backward: dev/hopper_bwd_05.cu (deterministic mode, order NAT) moved into
 * the library. Measured on the H200 (bench/NOTES.md section 9, bench/results/h200x2-hopper-bwd05-a32a018.json):
 * 26/26 checks, racecheck 0 hazards, bitwise over 3 runs; the whole backward 1.09x (B4 T4096 N16 H128) / 1.08x
 * causal / 1.14x (B1 T16384) / 1.13x causal of the two passes of hopper_bwd.cu, but 0.91x at gpt-oss H64 GQA: so
 * H128 only. The kernel, its helpers and names are dev 05's so a fix made there ports by diff; the plain and ASC
 * modes stayed in dev.
 *   One CTA per (b, kv head, 128 keys), as the two-pass dK/dV kernel: K, V loaded once, Q / dO / lse2 / D of the
 *   G heads' 64-row query tiles streamed; S^T, dP^T by wgmma SS; dV += P^T dO, dK += dS^T Q by wgmma RS. It also
 *   computes each tile's dQ[64 q x H] = dS K (dS^T staged in shared memory, 8 wgmma m64n64k16 with both operands
 *   transposed, one tile late) and adds it to dq_acc [B, N, T, H] fp32 by four TMA reduces (cp.reduce.async.bulk
 *   .tensor .add) from one writer thread: 5 products per tile where the two passes take 7. The tile's first
 *   visitor (rank 0) stores instead (cp.async.bulk.tensor), so dq_acc is not zeroed (coverage: above nat_rank).
 *   Deterministic: the key blocks of a kv head add into a query tile in a fixed order. One int semaphore per
 *   (b, head, 64-query tile): the writer waits until it equals its rank (NAT: the order of the staggered walks'
 *   visit steps, closed form in nat_rank), stores / adds, waits for completion and increments it (red.release). NAT
 *   needs a head's S / 128 CTAs co-resident (one per SM: 227 KiB of shared memory); CTA tickets from an atomic
 *   counter make the started CTAs a prefix of the ticket order, so at most one head is part-started. Hence the
 *   scope S / 128 <= SMs (beyond it the two passes run, not dev's ASC order: a model gave ~1.8x slower causal).
 * Per call, all on the caller's stream (no allocation, no sync: CUDA-graph safe), between the preprocess (D,
 * lse2) and the sink reduction of cuda_bwd.cu, which stay as they are (dsinks bitwise the two passes'):
 *   1. one cudaMemsetAsync: the ticket counter and the semaphores, 4 (1 + B N T / 64) bytes (dq_acc is not
 *      zeroed: its fill of 128 MiB took 0.038 ms on the H200 at B4 T4096 N32 H64, 4% of B16 T1024 N16's 0.94);
 *   2. bwd_onepass<128, CAUSAL>: dK, dV (bf16, written once) and dq_acc (fp32: rank 0 stores, then ordered adds);
 *   3. dq_convert: dq = scale * dq_acc in bf16.
 * Scope (sa_hopper_bwd1_in_scope): sa_hopper_bwd_in_scope, H == 128, no lengths, no window, causal none or
 * top-left with diag_offset 0 (dev 05's own scope: its checks ran T 512 / S 1024 and T 768 / S 256 causal),
 * S / 128 <= SMs, without a mask at least as many query tiles per CTA (G T / 64) as key blocks (NAT's distinct
 * start tiles), and B N T < 2^27 (dq_convert's int index); the caller also checks that the workspace holds
 * sa_hopper_bwd1_workspace bytes.
 */
#include <algorithm>

#include "hopper_bwd1.cuh"
#include "hopper_bwd1_parts.cuh"

namespace {

/* from the tile table (hopper_ptx.cuh), where the reasons are; as in hopper_bwd.cu */
constexpr int KB = sa_hop_tiles::BWD_KB;     /* keys per CTA: 2 consumer warpgroups x 64 (the wgmma M) */
constexpr int QB = sa_hop_tiles::BWD_QB;     /* query rows per streamed tile: N of S^T / dP^T, M of dQ */
constexpr int STAGES = sa_hop_tiles::STAGES; /* Q / dO ring depth */
constexpr int NC = sa_hop_tiles::NC;         /* consumer warpgroups */
constexpr int THREADS = 128 * (NC + 1);       /* = sa_hop_tiles::THREADS */
static_assert(KB == 2 * QB, "nat_rank (causal): key block kb starts at query tile 2 kb");

/* How the CTAs of a launch find their work and their turn. */
struct Sched {
  int *sync;  /* [0]: CTA ticket counter; then one semaphore per (b, head, 64-query tile); zeroed per call */
  int nkb;    /* key blocks per kv head: S / KB */
  int G;      /* query heads per kv head */
  int n_all;  /* G T / QB: tiles of a key block without a mask (a constant-bank loop bound: no register) */
  int d;      /* non-causal NAT: key block kb starts at tile kb * d of its G T / QB */
};

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

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* NAT rank of key block kb's visit to tile (g, q): how many key blocks visit it at an earlier step of their walk
   (ties cannot occur). Causal: the visitors are key blocks 0..m, m = min(nkb - 1, q / 2), and key block j reaches
   (g, q) at step g (PT - 2j) + q - 2j: descending j, rank m - kb. Non-causal: key block j starts at tile j d
   (distinct offsets below n_all = G PT when n_all >= nkb, which the host ensures), so tile t = g PT + q comes at
   step t - j d for j <= m = min(nkb - 1, t / d), else t - j d + n_all: the order m, m - 1, .., 0, nkb - 1, .., m + 1,
   rank (m - kb) mod nkb. Equal to counting the earlier visits (15.1 M visits checked on the host, T, S <= 4096).
   dq_acc is not zeroed: every (b, head, 64-query tile) has exactly one rank-0 visit, which stores the whole tile
   before any add to it. The grid is one CTA per (b, kv head, key block kb < nkb), nkb = S / 128 >= 1 (S > 0 in
   sa_hop_in_scope); a CTA's walk visits n_tiles distinct tiles of heads kvh G + g, g < G (all N heads over the kv
   heads). Causal top-left: key block j visits (g, q) iff q >= 2 j; key block 0 visits every tile, so the visitors
   of (g, q) are 0..m (T > S: all nkb from q = 2 nkb - 2 on; T < S: key blocks with 2 kb >= T / 64 have no tile
   and no writer, but 2 m <= q < T / 64), ranks m - kb: a bijection onto 0..m, rank 0 is key block m. Non-causal: every
   key block visits all n_all tiles, (m - kb) mod nkb is a bijection of kb onto 0..nkb-1, rank 0 is key block m.
   The semaphores start at 0 and rank r waits for r: rank 0 goes first, and the next rank's acquire sees its store
   complete (bulk_wait0 + fence.proxy.async.global before the release, as for an add). H / 32 boxes {32, 64} cover
   the 64 x H tile, none clipped (64 | T). Results as with a zeroed buffer (+0 + x == x), except x == -0 (+0 +
   -0 == +0; a rank-0 -0 now stays -0 unless a later partial is +0 or nonzero). */
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

#endif /* sm_90a */

/* tml / tmd: lse2, D [B N, T] fp32 (box 64); tma: dq_acc {H, T, B N} fp32 (box {32, 64, 1}, 128-byte swizzle). */
template <int HD, bool CAUSAL>
__global__ void __launch_bounds__(THREADS, 1)
    bwd_onepass(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmdo,
                const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv,
                const __grid_constant__ CUtensorMap tml, const __grid_constant__ CUtensorMap tmd,
                const __grid_constant__ CUtensorMap tma, const BwdParams p, const Sched sc) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
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
    /* Tickets in start order, so every CTA with a smaller ticket has started (CUB's decoupled look-back
       does the same): the waits below are then on CTAs that hold an SM or are done, whatever order the
       hardware launches blocks in. */
    ticket = atomicAdd(sc.sync, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  /* Key block fastest: a head's key blocks start together. The ticket goes through __shfl_sync so ptxas knows it is
     warp-uniform: n_tiles and the loop state then live in uniform registers (else n_tiles is spilled, DET H128). */
  const int vid = __shfl_sync(0xffffffffu, ticket, 0);
  const int kb = vid % sc.nkb, kvh = (vid / sc.nkb) % p.KH, b = vid / (sc.nkb * p.KH);
  const int k0 = kb * KB, G = sc.G, T = p.T, PT = T / QB;
  /* Top-left causal: query i sees key j iff j <= i, so query blocks ending before k0 are skipped. */
  const int qb0 = CAUSAL ? k0 / QB : 0, per_head = max(0, PT - qb0), n_tiles = CAUSAL ? G * per_head : sc.n_all;
  const int rot = (!CAUSAL && n_tiles > 0) ? kb * sc.d % n_tiles : 0;
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
        const int rank = nat_rank<CAUSAL>(kb, w.g, w.q, sc.nkb, PT, sc.d);
        while (ld_acquire(sem) != rank) {
        }
        fence_async_global(); /* the reduce (async proxy) after the acquire that saw the previous adds */
        const uint32_t src = sdq + x * DQ_BYTES;
        if (rank == 0) /* the tile's first visit stores: dq_acc is not zeroed (coverage: above nat_rank) */
          for (int c = 0; c < HD / 32; ++c) tma_store_3d(&tma, src + c * QB * 128, c * 32, w.q * QB, bn0 + w.g);
        else
          for (int c = 0; c < HD / 32; ++c) tma_reduce_add(&tma, src + c * QB * 128, c * 32, w.q * QB, bn0 + w.g);
        bulk_commit();
        bulk_wait_read0();
        mbar_arrive(dq_empty(x));
        bulk_wait0();         /* this tile's store / adds are done in L2 ... */
        fence_async_global(); /* ... and ordered before the release */
        red_release_add(sem, 1);
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
    onepass_tile<HD, CAUSAL>(st, dpt, pf, df, sk_wg, sv_wg, KB, sq_s, sdo_s, ld_f + s * 2 * QB, sl2, i0, kw0, kr, t,
                             &anchor[4 * cw + warp], lane);
    /* ---- dS^T(it) to shared memory (01a's swizzled store), for both warpgroups' dQ halves ---- */
    const int x = it & 1;
    const uint32_t sds_x = sds + x * DS_BYTES;
    mbar_wait(ds_empty(x), ((it >> 1) & 1) ^ 1); /* both halves of dQ(it - 2) have read this buffer */
    store_ds_rows(sds_x, df, kr - k0, t);
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
#endif /* sm_90a */
}

/* dq [B, T, N, H] bf16 = scale * dq_acc [B, N, T, H]: 8 elements per thread (two float4 in, one 16-byte store),
   consecutive threads along H then N, so the stores are contiguous. Rows (b, i, n) in 32 bits (B T N < 2^31). */
__global__ void dq_convert(const float *acc, __nv_bfloat16 *dq, int T, int N, int HD, float scale, int rows) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
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
#endif /* sm_90a */
}

/* ---- host ------------------------------------------------------------------------------------------- */


/* A refused shared-memory opt-in (227 KiB) leaves *used = 0: the two passes run instead. */
template <bool CAUSAL>
cudaError_t sa_hop1_run(const CUtensorMap (&m)[7], const BwdParams &bp, const Sched &sc, int64_t B, size_t sync_bytes,
                        int sms, cudaStream_t st, int *used) {
  constexpr int smem = op_smem<128>();
  if (cudaFuncSetAttribute(bwd_onepass<128, CAUSAL>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
      cudaSuccess) {
    cudaGetLastError();
    return cudaSuccess;
  }
  *used = 1;
  cudaError_t e = cudaMemsetAsync(sc.sync, 0, sync_bytes, st); /* the ticket, the semaphores (not dq_acc) */
  if (e != cudaSuccess) return e;
  bwd_onepass<128, CAUSAL><<<(unsigned)(sc.nkb * bp.KH * B), THREADS, smem, st>>>(m[0], m[1], m[2], m[3], m[4], m[5],
                                                                                  m[6], bp, sc);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  const int rows = (int)(B * bp.T * bp.N); /* < 2^27 in scope: rows * 16 fits dq_convert's int */
  return sa_hop1_dq_convert(bp.dq_acc, bp.dq, bp.T, bp.N, 128, bp.scale, rows, sms, st);
}

} /* namespace */

size_t sa_hop1_acc_bytes(const sa_cuda_params &p) { return (size_t)(p.B * p.N * p.T * p.H) * 4; }
size_t sa_hop1_sync_bytes(const sa_cuda_params &p) { return (size_t)(1 + p.B * p.N * (p.T / QB)) * 4; }

bool sa_hop1_prepare(const sa_cuda_params &p, float *acc, int kv_rows, CUtensorMap (&m)[7], BwdParams *bp) {
  static const PFN_cuTensorMapEncodeTiled_v12000 enc = sa_hop_encode_fn(); /* thread-safe static init */
  if (!enc) return false;
  /* As dev 05: Q / dO 64-row boxes, K / V kv_rows-row boxes (past S: TMA's zero fill, counted in the transaction
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
  bp->T = (int)p.T; bp->S = (int)p.S; bp->N = (int)p.N; bp->KH = (int)p.K;
  bp->scale = p.scale;
  bp->scale_l2 = p.scale_log2;
  return true;
}

cudaError_t sa_hop1_dq_convert(const float *acc, __nv_bfloat16 *dq, int T, int N, int HD, float scale, int rows,
                               int sms, cudaStream_t st) {
  dq_convert<<<std::min((rows * (HD / 8) + 255) / 256, sms * 16), 256, 0, st>>>(acc, dq, T, N, HD, scale, rows);
  return cudaGetLastError();
}

bool sa_hopper_bwd1_in_scope(const sa_cuda_params &p, int bf16) {
  if (p.H == 64) return sa_hopper_bwd3_in_scope(p, bf16);
  if (p.H != 128 || p.Hv != 128 || p.q_lens || p.kv_lens || p.wl >= 0 || p.wr >= 0) return false;
  /* causal none (a diag_offset alone changes nothing) or top-left on the main diagonal: the kernel's mask */
  if (!(p.causal == 0 || (p.causal == 1 && p.diag_offset == 0))) return false;
  if (p.B * p.N * p.T >= ((int64_t)1 << 27)) return false; /* dq_convert's int index: rows * H / 8 < 2^31 */
  if (!sa_hopper_bwd_in_scope(p, bf16)) return false; /* bf16, T, S multiples of 128, CC 9.0, sm_90a code */
  const int64_t nkb = p.S / KB, n_all = p.G * (p.T / QB);
  if (p.causal == 0 && n_all < nkb) return false; /* NAT's start tiles kb * d must be distinct */
  return nkb <= sa_cuda_sm_count(); /* NAT: a head's key blocks co-resident, one CTA per SM */
}

size_t sa_hopper_bwd1_workspace(const sa_cuda_params &p) {
  if (p.H == 64) return sa_hopper_bwd3_workspace(p);
  return sa_cuda_round256(sa_hop1_acc_bytes(p)) + sa_cuda_round256(sa_hop1_sync_bytes(p));
}

cudaError_t sa_hopper_bwd1_try(const sa_cuda_params &p, int bf16, void *ws, size_t ws_bytes, cudaStream_t st,
                               int *used) {
  if (p.H == 64) return sa_hopper_bwd3_try(p, bf16, ws, ws_bytes, st, used);
  *used = 0;
  if (!p.lse2 || !p.D || !sa_hop_aligned(p.lse2) || !sa_hop_aligned(p.D) || !ws || !sa_hop_aligned(ws) ||
      !sa_hopper_bwd1_in_scope(p, bf16) || ws_bytes < sa_hopper_bwd1_workspace(p))
    return cudaSuccess;
  const int sms = sa_cuda_sm_count();
  float *acc = (float *)ws;
  int *sync = (int *)((char *)ws + sa_cuda_round256(sa_hop1_acc_bytes(p)));
  CUtensorMap m[7];
  BwdParams bp;
  if (!sa_hop1_prepare(p, acc, KB, m, &bp)) return cudaSuccess;
  const int nkb = (int)(p.S / KB), n_all = (int)(p.G * (p.T / QB));
  const Sched sc = {sync, nkb, (int)p.G, n_all, std::max(1, n_all / nkb)};
  const size_t sb = sa_hop1_sync_bytes(p);
  return p.causal ? sa_hop1_run<true>(m, bp, sc, p.B, sb, sms, st, used)
                  : sa_hop1_run<false>(m, bp, sc, p.B, sb, sms, st, used);
}
