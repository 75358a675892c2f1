/*
 * hopper/bwd_twopass.cu — the sm_90a two-pass backward (plans hopper.bwd.twopass.*): dK/dV (K, V of a key block
 * once, Q / dO / lse2 / D streamed), then dQ (Q, dO once, K / V streamed); wgmma SS for S and dP, RS for the
 * products from registers; no atomics. Between the portable preprocess and sink reduction. docs/hopper.md,
 * "two-pass backward". Larger than 600 lines: the dK/dV kernel, the launches of both passes and their template
 * instantiations share one parameter struct and tile layout in this unit (the dQ kernel's body is
 * bwd_twopass_dq.cuh).
 */
#include "feat_class.h"
#include "hopper/bwd_feat.cuh"
#include "hopper/bwd_gemm.cuh"
#include "launch.h"

namespace {

/* from the tile table (hopper/tiles.h), where the reasons are */
constexpr int QB = SA_HOP_BWD_QB;     /* query rows per streamed tile of dK/dV: N of S^T / dP^T */
constexpr int KT = SA_HOP_BWD_KT;     /* keys per streamed tile of dQ */
constexpr int STAGES = SA_HOP_STAGES; /* ring depth (Q, dO tiles of dK/dV; K, V tiles of dQ): 130 KiB at H 128 */
/* consumer warpgroups and threads per CTA: sa_hop_dkdv_tile / sa_hop_dq_tile below (2 + producer at H128, 3 +
   producer at H64) */
/* Registers per consumer thread at H 128 (dK/dV): dK 64 + dV 64 + S^T 32 + dP^T 32 = 192 live accumulators,
   plus 32 for the bf16 fragments of P^T and dS^T: a 128-row query tile (S^T, dP^T 64 each) would not fit 240. */

/* What the dK/dV and dQ kernels take besides their tensor maps (outputs [B, L, heads, H] bf16). */
struct sa_hop_twopass_params {
  __nv_bfloat16 *dq, *dk, *dv;
  const float *lse2, *D; /* [B, N, T], workspace written by sa_bwd_pre_kernel */
  int T, S, N, KH;
  float scale, scale_l2;
  sa_hop_mask mask;              /* causal / window / offset (MASK kernels only) */
  sa_hop_shape shape;            /* lengths and the raw mask parameters (MASK 3, 4: each CTA builds its batch's mask) */
  int kb_slowest;                /* dK/dV grid (KH, B, S / KB) instead of (S / KB, KH, B): heaviest key blocks first */
  const int32_t *q_seg, *kv_seg; /* [B, T], [B, S] (MASK 4: segment ids; the streamed side's by TMA) */
};

/* The feature kernels' block (FEAT 1, hopper/bwd_feat.cuh): b0 / n0 offset the dQ grid's batch and head, so that
   each launch of a dbias broadcast over the batch or the heads holds one contributor per element (the launches
   add into dbias in order: sa_hop_twopass_launch). */
struct sa_hop_twopass_feat_params : sa_hop_twopass_params {
  sa_cuda_feat f;
  int b0, n0;
};
template <int FEAT>
struct sa_hop_twopass_params_of {
  using type = sa_hop_twopass_params;
};
template <>
struct sa_hop_twopass_params_of<1> {
  using type = sa_hop_twopass_feat_params;
};
/* FEAT 2 (hopper.bwd.twopass.features.tma, hopper/bwd_feat.cuh): the CTA's slice of the class table in shared memory,
   and the bias of each streamed tile landed by TMA beside it (the tensor map in the kernels' ids slot). */
struct sa_hop_twopass_tma_params : sa_hop_twopass_feat_params {
  int bias_es; /* the bias's element bytes: 2 (bf16, f16) or 4 (f32); 0 without a bias */
};
template <>
struct sa_hop_twopass_params_of<2> {
  using type = sa_hop_twopass_tma_params;
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* What the dQ kernel reads of the features whatever its block (the plain block has none: 0, false). */
__device__ __forceinline__ int feat_b0(const sa_hop_twopass_params &) { return 0; }
__device__ __forceinline__ int feat_b0(const sa_hop_twopass_feat_params &p) { return p.b0; }
__device__ __forceinline__ int feat_n0(const sa_hop_twopass_params &) { return 0; }
__device__ __forceinline__ int feat_n0(const sa_hop_twopass_feat_params &p) { return p.n0; }
__device__ __forceinline__ bool feat_classes(const sa_hop_twopass_params &) { return false; }
__device__ __forceinline__ bool feat_classes(const sa_hop_twopass_feat_params &p) { return p.f.cls != nullptr; }

/* dS of this thread's pairs of a 64-key tile (rows r0 + 8 h at dbias offsets rows[h], keys kc0 + 8 j + (e & 1) of
   ds[4 j + e]) added into dbias_out, which attn.cu zeroed: each element has one writer a launch and the launches run
   in order, so the sum's order is fixed. Rows past q_len add nothing (their dS is 0 x NaN where dO or out is
   padding). A bias broadcast along the keys takes each row's sum (the quad's, in a fixed order). */
__device__ __forceinline__ void feat_dbias_tile(const sa_cuda_feat &f, const float (&ds)[32], const int64_t (&rows)[2],
                                                int kc0, int r0, int ql, int t) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const bool live = r0 + 8 * h < ql;
    if (f.dbias_s) {
      if (live)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          float2 *d = reinterpret_cast<float2 *>(f.dbias_out + rows[h] + kc0 + 8 * j);
          float2 v = *d;
          v.x += ds[4 * j + 2 * h], v.y += ds[4 * j + 2 * h + 1];
          *d = v;
        }
    } else {
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) sum += ds[4 * j + 2 * h] + ds[4 * j + 2 * h + 1];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (live && t == 0) f.dbias_out[rows[h]] += sum;
    }
  }
}
#endif /* sm_90a */

/* dK/dV's warpgroups (the tile table of hopper/tiles.h points here). H128: 2 consumer warpgroups of 64 keys (KB
   128), 240 registers each. H64: 3 (KB 192), 160 registers each (128 x 24 + 384 x 160 = 64512; the consumer
   needs R152 at H64): at k = 64 a warpgroup's four m64n64 products per tile are 512 tensor clocks against its
   4096 exp2 (256 MUFU clocks) plus the dS arithmetic, and with two warpgroups waiting on the same tile both are
   often in their softmax at once; ncu at B4 T4096 N32 H64 (NC 2): tensor pipe 51%, 0.60 eligible warps per
   scheduler, 56% of cycles with none. A third warpgroup is the forward's H64 remedy (+15%, hopper/fwd.cu); here
   it also loads each Q / dO tile once for 192 keys instead of 128. S is a multiple of 128, not of 192: the last
   CTA of a head may hold 64 or 128 keys (n_wg warpgroups; the others leave at once). */
template <int HD, int NCK>
struct sa_hop_dkdv_tile {
  static constexpr int NC = NCK, KB = 64 * NC, THREADS = 128 * (NC + 1), REGS = NC == 3 ? 160 : 240;
  static_assert(128 * 24 + 128 * NC * REGS <= 65536, "register file: producer 24 + consumers");
  /* per stage: the Q and dO tiles, lse2 and D (QB fp32 each) and, MASK 4, the tile's query segment ids (QB int32;
     reserved for every kind: 512 B) */
  static constexpr int SMEM = 1024 + 2 * KB * HD * 2 + STAGES * 2 * QB * HD * 2 + STAGES * 3 * QB * 4;
  static_assert(SMEM <= 227 * 1024, "over the sm_90 limit");
  /* FEAT 2 (2 warpgroups): the lse2 / D region rounded up to 2 KiB, per stage the tile's bias (f32 at most), the class
     slice (hopper/tiles.h) */
  static constexpr int SMEM_TMA = SA_HOP_BWD_DKDV_TMA_SMEM(HD);
  static_assert(NC != 2 || SMEM_TMA == 1024 + 2 * KB * HD * 2 + STAGES * 2 * QB * HD * 2 + 2048 + STAGES * KB * QB * 4 +
                                           SA_HOP_BWD_TMA_CLS,
                "the layout of the FEAT 2 kernel");
  static_assert(STAGES * 3 * QB * 4 <= 2048 && SMEM_TMA + 1024 <= 227 * 1024, "over the sm_90 limit");
};
/* dQ likewise: NCQ consumer warpgroups of 64 query rows (QM 128 at H128, 192 at H64: 3 products per 64-key tile
   against the same exp2s, each K / V tile loaded once for 192 rows); T is a multiple of 128, so the last CTA of a
   head may hold 64 or 128 rows. */
template <int HD, int NCQ>
struct sa_hop_dq_tile {
  static constexpr int NC = NCQ, QM = 64 * NC, THREADS = 128 * (NC + 1), REGS = NC == 3 ? 160 : 240;
  static_assert(128 * 24 + 128 * NC * REGS <= 65536, "register file: producer 24 + consumers");
  /* per stage: the K and V tiles and, MASK 4, the tile's key segment ids (KT int32; reserved for every kind) */
  static constexpr int SMEM = 1024 + 2 * QM * HD * 2 + STAGES * (2 * KT * HD * 2 + KT * 4);
  static_assert(SMEM <= 227 * 1024, "over the sm_90 limit");
  /* FEAT 2 (2 warpgroups): the ids region rounded up to 1 KiB, per stage the tile's bias (f32 at most), the class row
     (S / 64 <= 1024 bytes; hopper/tiles.h) */
  static constexpr int SMEM_TMA = SA_HOP_BWD_DQ_TMA_SMEM(HD);
  static_assert(NC != 2 ||
                    SMEM_TMA == 1024 + 2 * QM * HD * 2 + STAGES * 2 * KT * HD * 2 + 1024 + STAGES * QM * KT * 4 + 1024,
                "the layout of the FEAT 2 kernel");
  static_assert(STAGES * KT * 4 <= 1024 && SMEM_TMA + 1024 <= 227 * 1024, "over the sm_90 limit");
};
static_assert(QB == 64 && KT == 64, "gemm_rs and pack_frag read 64-row tiles");
/* lse2 / D boxes: inner extent a multiple of 16 bytes and <= 256 elements; shared destinations 128-byte aligned
   (the region follows K, V and the Q / dO ring from a 1024-byte boundary, boxes QB * 4 = 256 B apart). */
static_assert(QB * 4 % 128 == 0 && QB <= 256 && (SA_HOP_WG_ROWS * 64 * 2) % 128 == 0 && (QB * 64 * 2) % 128 == 0,
              "lse2 / D box destinations must be 128-byte aligned");
static_assert(128 % SA_HOP_WG_ROWS == 0 && 128 % QB == 0 && 128 % KT == 0,
              "the Hopper scope (sa_hop_scope) admits T and S that are multiples of 128");

/* the device helpers (wgmma m64n64, the lse2 / D box, gemm_ss / gemm_rs, pack_frag, anchor_exp2, zero,
   store_rows) are in hopper/bwd_gemm.cuh */

/* ---- 2. dK, dV -------------------------------------------------------------------------------------- */

/* FEAT 1: the feature kernel (hopper/bwd_feat.cuh: bias, mask array, positions, soft-cap; kinds 0-3). */
template <int HD, int MASK, int NCK, int FEAT = 0>
__global__ void __launch_bounds__(sa_hop_dkdv_tile<HD, NCK>::THREADS, 1)
    sa_hop_twopass_dkdv_kernel(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmdo,
                               const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv,
                               const __grid_constant__ CUtensorMap tml, const __grid_constant__ CUtensorMap tmd,
                               const __grid_constant__ CUtensorMap tmqid,
                               const typename sa_hop_twopass_params_of<FEAT>::type p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using TL = sa_hop_dkdv_tile<HD, NCK>;
  constexpr int CB = HD / 64, NC = TL::NC, KB = TL::KB;
  constexpr uint32_t KV_BYTES = KB * HD * 2, QT_BYTES = QB * HD * 2, LD_BYTES = (MASK == 4 ? 3 : 2) * QB * 4;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar[1 + 2 * STAGES]; /* K+V full; per stage full; per stage empty */
  __shared__ float anchor[4 * NC];

  const uint32_t raw = smem_u32(smem_raw), sk = (raw + 1023u) & ~1023u, sv = sk + KV_BYTES;
  const uint32_t sq = sv + KV_BYTES, sdo = sq + STAGES * QT_BYTES, sld = sdo + STAGES * QT_BYTES;
  /* per stage: lse2[QB], D[QB] and, MASK 4, the query ids[QB] */
  const float *ld_f = reinterpret_cast<const float *>(smem_raw + (sld - raw));
  /* FEAT 2: stage s's bias tile at sfb + s FB (1024-aligned), the class slice at scls (hopper/bwd_feat.cuh) */
  constexpr uint32_t FB = KB * QB * 4;
  const uint32_t sfb = sld + 2048, scls = sfb + STAGES * FB;
  const uint32_t b0 = smem_u32(bar);
  auto bar_full = [&](int s) { return b0 + 8 * (1 + s); };
  auto bar_empty = [&](int s) { return b0 + 8 * (1 + STAGES + s); };

  const int kb = p.kb_slowest ? blockIdx.z : blockIdx.x, kvh = p.kb_slowest ? blockIdx.x : blockIdx.y;
  const int b = p.kb_slowest ? blockIdx.y : blockIdx.z, k0 = kb * KB, G = p.N / p.KH, T = p.T;
  /* Lengths (MASK 3): batch b is the problem q_len[b] x kv_len[b] with its own mask. Rows past q_len are never
     streamed but in the query block that holds q_len, whose rows past it (Q, dO, D) are zeroed in shared memory;
     keys past kv_len see no row and get dK = dV = 0 (their S^T / dP^T rows are never used). */
  sa_hop_mask mk = p.mask;
  int ql = T, kl = p.S;
  if (MASK >= 3) {
    sa_hop_lens(p.shape, b, T, p.S, &ql, &kl);
    mk = sa_hop_mask_make(ql, kl, p.shape.causal, p.shape.wl, p.shape.wr, p.shape.diag);
  }
  /* The query blocks qb0 .. qb0 + per_head - 1 (of each of the G heads) hold every row that sees a key of
     [k0, k0 + KB); the others are skipped. Causal top-left: key block 0 sees every query, and key blocks come
     in order of decreasing work. */
  /* Warpgroups with keys: S - k0 is a positive multiple of 64 (S % 128 == 0). */
  const int n_wg = min(NC, (p.S - k0) / 64);
  int qb0 = 0, per_head = T / QB;
  if (MASK) {
    int i_end;
    const int i_beg = sa_hop_query_rows(mk, ql, k0, 64 * n_wg, &i_end);
    qb0 = i_beg / QB;
    per_head = i_end > i_beg ? (i_end + QB - 1) / QB - qb0 : 0;
    /* MASK 4: only the query tiles from the first to the last holding a row of the keys' documents (the same
       for every head of the batch; warp-collective: every warp of the CTA, before any leaves). Packed
       documents of 256 tokens in T 4096 leave 2-5 of the 64 tiles a causal key block streams otherwise. */
    if (MASK == 4 && per_head > 0)
      seg_tiles<QB>(p.kv_seg + (size_t)b * p.S + k0, 64 * n_wg, p.q_seg + (size_t)b * T, &qb0, &per_head,
                    (int)threadIdx.x % 32);
  }
  const int n_tiles = G * per_head;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    mbar_init(b0, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bar_full(s), 1);
      mbar_init(bar_empty(s), 4 * n_wg); /* one arrive per warp of a consumer warpgroup with keys */
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if constexpr (FEAT == 2)
    if (p.f.cls) feat_cls_slice_kv(p.f, scls, b, kvh * G, G, T / 64, k0 / 64, n_wg);
  __syncthreads();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (threadIdx.x == 0 && n_tiles > 0) {
      mbar_arrive_tx(b0, 2 * KV_BYTES);
      for (int c = 0; c < CB; ++c) {
        tma_load(sk + c * KB * 128, &tmk, b0, c * 64, kvh, k0, b);
        tma_load(sv + c * KB * 128, &tmv, b0, c * 64, kvh, k0, b);
      }
      int xs = 0; /* FEAT: the ring position of the loaded tiles (a tile whose every block is empty is not) */
      for (int it = 0; it < n_tiles; ++it) {
        const int s = (FEAT ? xs : it) % STAGES, n = kvh * G + it / per_head, i0 = (qb0 + it % per_head) * QB;
        if constexpr (FEAT == 2) {
          if (feat_cls_byte(p.f, scls + (it / per_head) * (T / 64) + i0 / 64) == 0u) continue;
        } else if constexpr (FEAT) {
          if (feat_tile_empty(p.f, b, n, i0 / 64, k0 / 64, n_wg, false)) continue;
        }
        mbar_wait(bar_empty(s), (((FEAT ? xs : it) / STAGES) & 1) ^ 1);
        if constexpr (FEAT) ++xs;
        if constexpr (FEAT == 2) { /* and the tile's bias (64 queries x KB keys) */
          const int fb = KB * p.bias_es;
          mbar_arrive_tx(bar_full(s), 2 * QT_BYTES + LD_BYTES + QB * fb);
          if (fb) feat_tma_bias(p.f, &tmqid, sfb + s * FB, bar_full(s), p.bias_es, fb, QB, k0, i0, b, n);
        } else {
          mbar_arrive_tx(bar_full(s), 2 * QT_BYTES + LD_BYTES);
        }
        for (int c = 0; c < CB; ++c) {
          tma_load(sq + s * QT_BYTES + c * QB * 128, &tmq, bar_full(s), c * 64, n, i0, b);
          tma_load(sdo + s * QT_BYTES + c * QB * 128, &tmdo, bar_full(s), c * 64, n, i0, b);
        }
        tma_load_2d(sld + s * LD_BYTES, &tml, bar_full(s), i0, b * p.N + n);
        tma_load_2d(sld + s * LD_BYTES + QB * 4, &tmd, bar_full(s), i0, b * p.N + n);
        if (MASK == 4) tma_load_2d(sld + s * LD_BYTES + 2 * QB * 4, &tmqid, bar_full(s), i0, b);
      }
    }
    return;
  }

  /* A warpgroup past S leaves before setmaxnreg.inc (a per-warpgroup instruction); no barrier counts it. */
  const int cw = wg - 1;
  if (cw >= n_wg) return;
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(TL::REGS) : "memory");
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, t = lane % 4;
  const int kw0 = k0 + 64 * cw, kr = kw0 + 16 * warp + lane / 4; /* this thread's keys: kr, kr + 8 */
  /* The rows [w_beg, w_end) that see one of this warpgroup's keys: a tile outside them is released unread (a
     192-key causal CTA's first tiles are invisible to its second and third warpgroups: without this H64 causal
     would do ~3% (T4096) / ~12% (T1024) more tensor work than 64-key warpgroups need). */
  int w_beg = 0, w_end = T;
  if (MASK) w_beg = sa_hop_query_rows(mk, ql, kw0, 64, &w_end);
  /* MASK 4: the rows of the query tiles that hold one of its keys' documents (a document boundary inside the
     CTA's keys leaves each warpgroup the tiles of its own documents only) */
  if (MASK == 4 && w_end > w_beg) {
    int wq0 = w_beg / QB, wn = (w_end + QB - 1) / QB - wq0;
    seg_tiles<QB>(p.kv_seg + (size_t)b * p.S + kw0, 64, p.q_seg + (size_t)b * T, &wq0, &wn, lane);
    w_beg = wq0 * QB, w_end = wn > 0 ? (wq0 + wn) * QB : w_beg;
  }
  const uint32_t sk_wg = sk + cw * 64 * 128, sv_wg = sv + cw * 64 * 128;
  const float sl2 = p.scale_l2;
  /* Accumulators d[4j + e]: row (key) lane/4 + 8 (e >> 1) of the warp's 16, column 8j + 2t + (e & 1). */
  float dk[HD / 2], dv[HD / 2], st[32], dpt[32];
  uint32_t pf[16], df[16];
  zero(dk);
  zero(dv);
  /* Per key-row bounds on key - query (sa_hop_key_bounds: lengths make them depend on the key); without lengths
     both rows take the mask's own. */
  int dlo0 = mk.dlo, dhi0 = mk.dhi, dlo1 = dlo0, dhi1 = dhi0;
  if (MASK >= 3) {
    sa_hop_key_bounds(mk, ql, kl, kr, &dlo0, &dhi0);
    sa_hop_key_bounds(mk, ql, kl, kr + 8, &dlo1, &dhi1);
  }
  /* MASK 4: this thread's keys' segment ids (keys kr, kr + 8 < S) */
  int kid0 = 0, kid1 = 0;
  if (MASK == 4) {
    kid0 = p.kv_seg[(size_t)b * p.S + kr];
    kid1 = p.kv_seg[(size_t)b * p.S + kr + 8];
  }
  /* FEAT: the query positions that see this thread's keys kr, kr + 8 (sa_feat_pos_qbounds) */
  int2 fq[2] = {make_int2(1, 0), make_int2(1, 0)};
  if constexpr (FEAT)
    if (p.f.q_pos)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        sa_feat_pos_qbounds(&p.f, p.f.kv_pos[(int64_t)b * p.S + kr + 8 * h], &fq[h].x, &fq[h].y);
  /* FEAT 2: the offset in a bias stage of this thread's element (j = 0, e): row (query) 2 t + (e & 1), column (key)
     64 cw + 16 warp + lane / 4 + 8 (e >> 1); element (j, e) is 8 j rows = 1024 j bytes further (sa_feat_swz) */
  uint32_t fbo[4] = {0u, 0u, 0u, 0u};
  if constexpr (FEAT == 2)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      fbo[e] = sa_feat_swz(QB, 2 * t + (e & 1), (64 * cw + 16 * warp + lane / 4 + 8 * (e >> 1)) * p.bias_es);
  if (n_tiles > 0) mbar_wait(b0, 0);

  int xs = 0; /* FEAT: as the producer's */
  for (int it = 0; it < n_tiles; ++it) {
    const int s = (FEAT ? xs : it) % STAGES, i0 = (qb0 + it % per_head) * QB;
    /* FEAT: the class of this warpgroup's block of the tile; the bias / mask / query positions of its element
       (query i0 + 2 t, key kr): element (j, e) is 8 j + (e & 1) queries, 8 (e >> 1) keys further (32-bit steps) */
    int fcls = SA_FEAT_FULL;
    const uint8_t *fbp = nullptr, *fmp = nullptr;
    const int32_t *fqp = nullptr;
    if constexpr (FEAT == 2) { /* the class slice; the bias from the stage below */
      const int n = kvh * G + it / per_head;
      const uint32_t cv = feat_cls_byte(p.f, scls + (it / per_head) * (T / 64) + i0 / 64);
      if (cv == 0u) continue;
      fcls = (int)((cv >> (2 * cw)) & 3u);
      const int64_t q = i0 + 2 * t;
      if (p.f.mask) fmp = p.f.mask + b * p.f.mask_b + n * p.f.mask_n + q * p.f.mask_t + (int64_t)kr * p.f.mask_s;
      if (p.f.q_pos) fqp = p.f.q_pos + (int64_t)b * T + q;
    } else if constexpr (FEAT) {
      const int n = kvh * G + it / per_head;
      if (feat_tile_empty(p.f, b, n, i0 / 64, k0 / 64, n_wg, false)) continue;
      fcls = feat_cls(p.f, b, n, i0 / 64, kw0 / 64);
      const int64_t q = i0 + 2 * t;
      if (p.f.bias)
        fbp =
            (const uint8_t *)p.f.bias + (b * p.f.bias_b + n * p.f.bias_n + q * p.f.bias_t + (int64_t)kr * p.f.bias_s) *
                                            (p.f.bias_dtype == SA_F32 ? 4 : 2);
      if (p.f.mask) fmp = p.f.mask + b * p.f.mask_b + n * p.f.mask_n + q * p.f.mask_t + (int64_t)kr * p.f.mask_s;
      if (p.f.q_pos) fqp = p.f.q_pos + (int64_t)b * T + q;
    }
    const uint32_t sq_s = sq + s * QT_BYTES, sdo_s = sdo + s * QT_BYTES;
    const uint8_t *fbs = smem_raw + (sfb + s * FB - raw); /* FEAT 2: the stage's bias */
    mbar_wait(bar_full(s), ((FEAT ? xs : it) / STAGES) & 1);
    if constexpr (FEAT) ++xs;
    if (MASK >= 3 && i0 + QB > ql) { /* the block holding q_len (CTA-uniform): rows past it may be NaN padding */
      const int r = ql - i0, tid = threadIdx.x - 128;
      zero_tile_rows(sq_s, QB, r, CB, tid, 128 * n_wg);
      zero_tile_rows(sdo_s, QB, r, CB, tid, 128 * n_wg);
      named_bar_sync(1, 128 * n_wg);
    }
    if ((MASK && (i0 + QB <= w_beg || i0 >= w_end)) || (FEAT && fcls == SA_FEAT_EMPTY)) { /* no row of the
                                                                    tile sees this warpgroup's keys */
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_empty(s));
      continue;
    }
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
    const float *lse2 = ld_f + s * (LD_BYTES / 4), *Dq = lse2 + QB;
    const int *qid = reinterpret_cast<const int *>(Dq + QB); /* MASK 4 */
    /* Only tiles on a mask boundary test positions (sa_hop_mask: visible iff dlo <= key - query <= dhi): the
       warpgroup's keys [kw0, kw0 + 64) and the tile's queries [i0, i0 + 64) span key - query from
       kw0 - i0 - 63 to kw0 - i0 + 63. */
    const int dlo = mk.dlo, dhi = mk.dhi, x0 = kr - i0 - 2 * t; /* key - query of element j = 0, e = 0 */
    const bool masked =
        MASK && (kw0 - i0 - 63 < dlo || kw0 - i0 + 63 > dhi || (MASK >= 3 && (i0 + QB > ql || kw0 + 64 > kl)));
    /* element c (below) of key row h invisible iff xh_h > -c or xl_h < -c */
    const int xh0 = x0 - dhi0, xl0 = x0 - dlo0, xh1 = x0 - dhi1, xl1 = x0 - dlo1;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 l2 = *reinterpret_cast<const float2 *>(lse2 + 8 * j + 2 * t);
      int2 qi = make_int2(0, 0);
      if (MASK == 4) qi = *reinterpret_cast<const int2 *>(qid + 8 * j + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x;
        if constexpr (FEAT) { /* the logit of bias and soft-cap, the mask array's and the positions' select */
          const int dq = 8 * j + (e & 1), dk = 8 * (e >> 1);
          float bias;
          if constexpr (FEAT == 2)
            bias = p.bias_es ? feat_bias_at(fbs + fbo[e] + 1024 * j, p.bias_es, p.f.bias_dtype) : 0.f;
          else bias = fbp ? sa_feat_ld1(fbp, p.f.bias_dtype, (int64_t)dq * p.f.bias_t + dk * p.f.bias_s) : 0.f;
          x = ex2(sa_feat_logit2(&p.f, st[4 * j + e], bias) - ((e & 1) ? l2.y : l2.x));
          if (fcls == SA_FEAT_PARTIAL) {
            bool ok = !fmp || __ldg(fmp + (int64_t)dq * p.f.mask_t + dk * p.f.mask_s) != 0;
            if (fqp) {
              const int32_t qp = __ldg(fqp + dq);
              ok = ok && qp >= fq[e >> 1].x && qp <= fq[e >> 1].y;
            }
            if (!ok) x = 0.f;
          }
        } else {
          x = ex2(fmaf(st[4 * j + e], sl2, -((e & 1) ? l2.y : l2.x)));
        }
        const int c = 8 * (e >> 1) - 8 * j - (e & 1); /* key kr + 8 (e >> 1), query i0 + 8j + 2t + (e & 1) */
        const int xh = (e >> 1) ? xh1 : xh0, xl = (e >> 1) ? xl1 : xl0;
        if (masked && (xh > -c || (MASK >= 2 && xl < -c))) x = 0.f;
        if (MASK == 4 && ((e & 1) ? qi.y : qi.x) != ((e >> 1) ? kid1 : kid0)) x = 0.f; /* another document */
        st[4 * j + e] = x;
      }
    }
    anchor_exp2(st, &anchor[4 * cw + warp], lane);
    wgmma_wait0();
    pin(dpt);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float2 dd = *reinterpret_cast<const float2 *>(Dq + 8 * j + 2 * t);
      /* D of a row past q_len may be NaN (padding dO / out), and P = 0 times NaN is NaN: 0 in registers. Not by
         a store into the stage: a plain store there races (compute-sanitizer racecheck reports it) with
         the reads of lanes 1..31 in the stage's previous tile, which only lane 0's empty arrive releases. */
      if (MASK >= 3 && i0 + 8 * j + 2 * t + 1 >= ql) {
        if (i0 + 8 * j + 2 * t >= ql) dd.x = 0.f;
        dd.y = 0.f;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) dpt[4 * j + e] = st[4 * j + e] * (dpt[4 * j + e] - ((e & 1) ? dd.y : dd.x));
      if constexpr (FEAT) /* the soft-cap's 1 - tanh^2, from P and lse2 (sa_feat_cap_grad) */
        if (p.f.cap > 0.f) {
          const float2 l2 = *reinterpret_cast<const float2 *>(lse2 + 8 * j + 2 * t);
#pragma unroll
          for (int e = 0; e < 4; ++e) dpt[4 * j + e] *= sa_feat_cap_grad(&p.f, st[4 * j + e], (e & 1) ? l2.y : l2.x);
        }
    }
    pack_frag(pf, st);
    pack_frag(df, dpt);
    dvdk_issue<HD>(dv, dk, pf, df, sdo_s, sq_s);
    dvdk_retire<HD>(dv, dk, pf, df);
    /* lse2 / D of this stage were read by every lane with plain loads; mbarrier.arrive releases only the
       arriving thread's accesses, so the warp synchronises first (compute-sanitizer racecheck flagged the
       producer's next bulk copy into the stage against lanes 1..31's reads without it). */
    __syncwarp();
    if (lane == 0) mbar_arrive(bar_empty(s));
  }

  if (MASK >= 3) /* keys past kv_len: 0 (their dP^T rows came from padding V, maybe NaN) */
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (kr + 8 * h >= kl)
#pragma unroll
        for (int j = 0; j < HD / 8; ++j) {
          dk[4 * j + 2 * h] = dk[4 * j + 2 * h + 1] = 0.f;
          dv[4 * j + 2 * h] = dv[4 * j + 2 * h + 1] = 0.f;
        }
  const size_t rs = (size_t)p.KH * HD;
  const size_t base = ((size_t)b * p.S * p.KH + kvh) * HD;
  store_rows<HD>(p.dk + base, dk, rs, kr, t, p.scale); /* zeros where no query sees the keys */
  store_rows<HD>(p.dv + base, dv, rs, kr, t, 1.f);
#endif /* sm_90a */
}

#include "hopper/bwd_twopass_dq.cuh" /* 3. dQ (sa_hop_twopass_dq_kernel) */

/* ---- host ------------------------------------------------------------------------------------------- */

/* Tensor maps: dK/dV streams 64-row Q / dO tiles and loads 128-row K / V blocks; dQ the other way round; dK/dV
   also streams the 64-query boxes of lse2 and D. */
enum { M_Q_QB, M_DO_QB, M_K_KB, M_V_KB, M_Q_QM, M_DO_QM, M_K_KT, M_V_KT, M_LSE2, M_D, M_QID, M_KID, M_COUNT };

/* The dK/dV kernel with NCK consumer warpgroups (ceil(S / KB) key blocks a head). */
template <int HD, int MASK, int NCK>
cudaError_t sa_hop_twopass_dkdv_launch(const CUtensorMap (&m)[M_COUNT], const sa_hop_twopass_params &hp, int64_t B,
                                       cudaStream_t st) {
  using TL = sa_hop_dkdv_tile<HD, NCK>;
  cudaError_t e = cudaFuncSetAttribute(sa_hop_twopass_dkdv_kernel<HD, MASK, NCK>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, TL::SMEM);
  if (e != cudaSuccess) return e;
  const unsigned nkb = (unsigned)((hp.S + TL::KB - 1) / TL::KB);
  const dim3 gk = hp.kb_slowest ? dim3((unsigned)hp.KH, (unsigned)B, nkb) : dim3(nkb, (unsigned)hp.KH, (unsigned)B);
  sa_hop_twopass_dkdv_kernel<HD, MASK, NCK>
      <<<gk, TL::THREADS, TL::SMEM, st>>>(m[M_Q_QB], m[M_DO_QB], m[M_K_KB], m[M_V_KB], m[M_LSE2], m[M_D], m[M_QID], hp);
  return cudaGetLastError();
}

template <int HD, int MASK, int NCK, int NCQ>
cudaError_t sa_hop_twopass_run_nc(const CUtensorMap (&m)[M_COUNT], const sa_hop_twopass_params &hp, int64_t B,
                                  cudaStream_t st) {
  using TQ = sa_hop_dq_tile<HD, NCQ>;
  cudaError_t e = cudaFuncSetAttribute(sa_hop_twopass_dq_kernel<HD, MASK, NCQ>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, TQ::SMEM);
  if (e != cudaSuccess || (e = sa_hop_twopass_dkdv_launch<HD, MASK, NCK>(m, hp, B, st)) != cudaSuccess) return e;
  dim3 gq((unsigned)((hp.T + TQ::QM - 1) / TQ::QM), (unsigned)hp.N, (unsigned)B);
  sa_hop_twopass_dq_kernel<HD, MASK, NCQ>
      <<<gq, TQ::THREADS, TQ::SMEM, st>>>(m[M_Q_QM], m[M_DO_QM], m[M_K_KT], m[M_V_KT], m[M_KID], hp);
  return cudaGetLastError();
}

template <int HD, int MASK>
cudaError_t sa_hop_twopass_run(const CUtensorMap (&m)[M_COUNT], const sa_hop_twopass_params &hp, int64_t B, int nck,
                               int ncq, cudaStream_t st) {
  if constexpr (HD == 64 && MASK < 3) { /* lengths and segment ids: 2 (at 3 their kernels spill) */
    if (nck == 3)
      return ncq == 3 ? sa_hop_twopass_run_nc<HD, MASK, 3, 3>(m, hp, B, st)
                      : sa_hop_twopass_run_nc<HD, MASK, 3, 2>(m, hp, B, st);
    if (ncq == 3) return sa_hop_twopass_run_nc<HD, MASK, 2, 3>(m, hp, B, st);
  }
  return sa_hop_twopass_run_nc<HD, MASK, 2, 2>(m, hp, B, st);
}

/* The feature kernels (plans hopper.bwd.twopass.features, FEAT 1, and .features.tma, FEAT 2; 2 consumer warpgroups
   each): dK/dV once, then dQ once, or with a dbias that a batch / head broadcast shares, once per contributor (b0, n0)
   in order, each adding into the zeroed dbias (the dQ grid then spans the other batches / heads only). */
template <int HD, int MASK, int FEAT>
cudaError_t sa_hop_twopass_feat_run(const CUtensorMap (&m)[M_COUNT],
                                    const typename sa_hop_twopass_params_of<FEAT>::type &hp, int64_t B,
                                    cudaStream_t st) {
  using TK = sa_hop_dkdv_tile<HD, 2>;
  using TQ = sa_hop_dq_tile<HD, 2>;
  const int smk = FEAT == 2 ? TK::SMEM_TMA : TK::SMEM, smq = FEAT == 2 ? TQ::SMEM_TMA : TQ::SMEM;
  cudaError_t e = cudaFuncSetAttribute(sa_hop_twopass_dkdv_kernel<HD, MASK, 2, FEAT>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, smk);
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(sa_hop_twopass_dq_kernel<HD, MASK, 2, FEAT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             smq);
  if (e != cudaSuccess) return e;
  const unsigned nkb = (unsigned)((hp.S + TK::KB - 1) / TK::KB);
  const dim3 gk = hp.kb_slowest ? dim3((unsigned)hp.KH, (unsigned)B, nkb) : dim3(nkb, (unsigned)hp.KH, (unsigned)B);
  sa_hop_twopass_dkdv_kernel<HD, MASK, 2, FEAT>
      <<<gk, TK::THREADS, smk, st>>>(m[M_Q_QB], m[M_DO_QB], m[M_K_KB], m[M_V_KB], m[M_LSE2], m[M_D], m[M_QID], hp);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  const sa_cuda_feat &f = hp.f;
  const bool per_b = f.dbias_out && f.bias_b == 0 && B > 1, per_n = f.dbias_out && f.bias_n == 0 && hp.N > 1;
  const dim3 gq((unsigned)((hp.T + TQ::QM - 1) / TQ::QM), per_n ? 1u : (unsigned)hp.N, per_b ? 1u : (unsigned)B);
  typename sa_hop_twopass_params_of<FEAT>::type c = hp;
  for (int b0 = 0; b0 < (per_b ? B : 1); ++b0)
    for (int n0 = 0; n0 < (per_n ? hp.N : 1); ++n0) {
      c.b0 = b0, c.n0 = n0;
      sa_hop_twopass_dq_kernel<HD, MASK, 2, FEAT>
          <<<gq, TQ::THREADS, smq, st>>>(m[M_Q_QM], m[M_DO_QM], m[M_K_KT], m[M_V_KT], m[M_KID], c);
      if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
  return cudaSuccess;
}

template <int FEAT>
cudaError_t sa_hop_twopass_feat_kind(const CUtensorMap (&m)[M_COUNT],
                                     const typename sa_hop_twopass_params_of<FEAT>::type &hp, int kind, int64_t H,
                                     int64_t B, cudaStream_t st) {
  switch (kind + 4 * (H == 128)) {
    case 0: return sa_hop_twopass_feat_run<64, 0, FEAT>(m, hp, B, st);
    case 1: return sa_hop_twopass_feat_run<64, 1, FEAT>(m, hp, B, st);
    case 2: return sa_hop_twopass_feat_run<64, 2, FEAT>(m, hp, B, st);
    case 3: return sa_hop_twopass_feat_run<64, 3, FEAT>(m, hp, B, st);
    case 4: return sa_hop_twopass_feat_run<128, 0, FEAT>(m, hp, B, st);
    case 5: return sa_hop_twopass_feat_run<128, 1, FEAT>(m, hp, B, st);
    case 6: return sa_hop_twopass_feat_run<128, 2, FEAT>(m, hp, B, st);
    default: return sa_hop_twopass_feat_run<128, 3, FEAT>(m, hp, B, st);
  }
}

} /* namespace */

cudaError_t sa_hop_twopass_launch(const sa_cuda_plan &plan, const sa_cuda_params &p, const sa_cuda_feat *f,
                                  cudaStream_t st) {
  static const PFN_cuTensorMapEncodeTiled_v12000 enc = sa_hop_encode_fn(); /* thread-safe static init */
  if (!enc) return cudaErrorNotSupported;
  const int kind = plan.mask, kbk = 64 * plan.wg, qmk = 64 * plan.wg_dq;
  CUtensorMap m[M_COUNT];
  const bool ok = sa_hop_map(enc, &m[M_Q_QB], p.q, p.B, p.T, p.N, p.H, QB) &&
                  sa_hop_map(enc, &m[M_DO_QB], p.dout, p.B, p.T, p.N, p.H, QB) &&
                  sa_hop_map(enc, &m[M_K_KB], p.k, p.B, p.S, p.K, p.H, kbk) &&
                  sa_hop_map(enc, &m[M_V_KB], p.v, p.B, p.S, p.K, p.H, kbk) &&
                  sa_hop_map(enc, &m[M_Q_QM], p.q, p.B, p.T, p.N, p.H, qmk) &&
                  sa_hop_map(enc, &m[M_DO_QM], p.dout, p.B, p.T, p.N, p.H, qmk) &&
                  sa_hop_map(enc, &m[M_K_KT], p.k, p.B, p.S, p.K, p.H, KT) &&
                  sa_hop_map(enc, &m[M_V_KT], p.v, p.B, p.S, p.K, p.H, KT) &&
                  sa_hop_map_rows(enc, &m[M_LSE2], p.lse2, p.B * p.N, p.T, QB) &&
                  sa_hop_map_rows(enc, &m[M_D], p.D, p.B * p.N, p.T, QB);
  m[M_QID] = m[M_KID] = m[M_D]; /* without segment ids the kernels never read these: any valid map will do */
  const bool ids_ok = kind != 4 || (sa_hop_map_ids(enc, &m[M_QID], p.q_seg, p.B, p.T, QB) &&
                                    sa_hop_map_ids(enc, &m[M_KID], p.kv_seg, p.B, p.S, KT));
  if (!ok || !ids_ok) return cudaErrorInvalidValue;
  sa_hop_twopass_params hp;
  hp.dq = (__nv_bfloat16 *)p.dq;
  hp.dk = (__nv_bfloat16 *)p.dk;
  hp.dv = (__nv_bfloat16 *)p.dv;
  hp.lse2 = p.lse2;
  hp.D = p.D;
  hp.T = (int)p.T;
  hp.S = (int)p.S;
  hp.N = (int)p.N;
  hp.KH = (int)p.K;
  hp.scale = p.scale;
  hp.scale_l2 = p.scale_log2;
  hp.mask = sa_hop_mask_of(p);
  hp.shape = sa_hop_shape_of(p);
  hp.q_seg = p.q_seg;
  hp.kv_seg = p.kv_seg;
  hp.kb_slowest = plan.kb_slowest;
  if (plan.feat) { /* the class table into the workspace (feat_class.cu), then the feature kernels */
    if (!f) return cudaErrorInvalidValue;
    sa_hop_twopass_feat_params fp;
    static_cast<sa_hop_twopass_params &>(fp) = hp;
    fp.f = *f;
    fp.b0 = fp.n0 = 0;
    if (f->cls) {
      const sa_feat_class_args ca = {p.B, p.T, p.S, p.N, p.Hv, plan.cls_cb, plan.cls_cn, nullptr};
      const cudaError_t e = sa_feat_class_launch(*f, ca, 0, st);
      if (e != cudaSuccess) return e;
    }
    if (plan.feat == 2) { /* the bias's maps in the ids slots: 64-query boxes for dK/dV, QM-row boxes for dQ */
      sa_hop_twopass_tma_params tp;
      static_cast<sa_hop_twopass_feat_params &>(tp) = fp;
      tp.bias_es = !f->bias ? 0 : f->bias_dtype == SA_F32 ? 4 : 2;
      if (tp.bias_es) {
        const int64_t dims[4] = {f->bias_b ? p.B : 1, f->bias_n ? p.N : 1, p.T, p.S};
        const CUtensorMapDataType ty = sa_hop_feat_type(tp.bias_es, f->bias_dtype == SA_F16);
        if (!sa_hop_map_feat(enc, &m[M_QID], f->bias, ty, tp.bias_es, dims, QB) ||
            !sa_hop_map_feat(enc, &m[M_KID], f->bias, ty, tp.bias_es, dims, qmk))
          return cudaErrorInvalidValue;
      }
      return sa_hop_twopass_feat_kind<2>(m, tp, kind, p.H, p.B, st);
    }
    return sa_hop_twopass_feat_kind<1>(m, fp, kind, p.H, p.B, st);
  }
  const int nck = plan.wg, ncq = plan.wg_dq;
  switch (kind + 5 * (p.H == 128)) {
    case 0: return sa_hop_twopass_run<64, 0>(m, hp, p.B, nck, ncq, st);
    case 1: return sa_hop_twopass_run<64, 1>(m, hp, p.B, nck, ncq, st);
    case 2: return sa_hop_twopass_run<64, 2>(m, hp, p.B, nck, ncq, st);
    case 3: return sa_hop_twopass_run<64, 3>(m, hp, p.B, nck, ncq, st);
    case 4: return sa_hop_twopass_run<64, 4>(m, hp, p.B, nck, ncq, st);
    case 5: return sa_hop_twopass_run<128, 0>(m, hp, p.B, nck, ncq, st);
    case 6: return sa_hop_twopass_run<128, 1>(m, hp, p.B, nck, ncq, st);
    case 7: return sa_hop_twopass_run<128, 2>(m, hp, p.B, nck, ncq, st);
    case 8: return sa_hop_twopass_run<128, 3>(m, hp, p.B, nck, ncq, st);
    default: return sa_hop_twopass_run<128, 4>(m, hp, p.B, nck, ncq, st);
  }
}
