/*
 * hopper/fwd.cu — the sm_90a forward (plans hopper.fwd.persistent, .onetile, .persistent.narrow): a producer
 * warpgroup streams Q and K / V by TMA through mbarrier rings, consumer warpgroups run S = Q K^T and O += P V on
 * wgmma with the online softmax in registers; persistent CTAs walk work tiles in the plan's order. Protocol,
 * work orders and masks: docs/hopper.md, "forward".
 */
#include "feat_class.h"
#include "hopper/fwd_feat.cuh"
#include "hopper/fwd_tile.cuh"
#include "launch.h"

namespace {

/* FEAT 1: the feature kernel (hopper/fwd_feat.cuh: bias, mask array, positions, soft-cap; kinds 0-3). */
template <int HD, int MASK, int FEAT>
__global__ void __launch_bounds__(sa_hop_fwd_tile<HD, MASK, FEAT>::THREADS, 1)
    sa_hop_fwd_kernel(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmk,
                      const __grid_constant__ CUtensorMap tmv, const __grid_constant__ CUtensorMap tmids,
                      const typename sa_hop_fwd_params_of<FEAT>::type p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using TL = sa_hop_fwd_tile<HD, MASK, FEAT>;
  constexpr int NC = TL::NC, BM = TL::BM, BN = TL::BN, QBOX = TL::QBOX, ST = TL::ST, QS = TL::QS;
  constexpr int CB = HD / 64; /* 128-byte column blocks per row */
  constexpr uint32_t KV_BYTES = BN * HD * 2;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar[N_BARS<ST>];
  __shared__ float anchor[4 * NC]; /* see the wait_group 0 of the main loop */

  const uint32_t sq = (smem_u32(smem_raw) + 1023u) & ~1023u; /* swizzle atoms need 1024-byte alignment */
  /* work tile jq's Q: slot jq % QS, the (jq / QS)-th use of that slot */
  const uint32_t sk = sq + QS * TL::Q_BYTES, sv = sk + ST * KV_BYTES, b0 = smem_u32(bar);
  const uint32_t sids = sv + ST * KV_BYTES; /* MASK 4: stage s's 128 key ids at sids + s IDS_BYTES */
  /* FEAT: Q slot q's class list at slist + q LIST_BYTES, its range words (t0, n_tiles) at srange + 8 q */
  const uint32_t slist = sids + ST * TL::IDS_BYTES, srange = slist + QS * TL::LIST_BYTES;

  /* A work tile's geometry, the same in the producer and every consumer warp: (b, head, m-block), the warpgroups
     with rows, the batch's lengths and mask, the key tiles t0 .. t0 + n_tiles - 1. */
  struct sa_hop_fwd_work {
    int b, n, m0, n_wg, ql, kl, t0, n_tiles;
    sa_hop_mask mk;
  };
  auto work_of = [&](int tile) {
    sa_hop_fwd_work w;
    int bh, mb;
    bool masked = MASK != 0;
    if constexpr (FEAT) masked = masked || p.lists;
    sa_hop_work_tile(p, masked, tile, &bh, &mb);
    if (mb < 0) { /* the pair order's padding: no rows, no key tiles (a plain Q-full arrive, nothing stored) */
      w.b = 0, w.n = 0, w.m0 = 0, w.n_wg = 0, w.ql = 0, w.kl = 0, w.t0 = 0, w.n_tiles = 0, w.mk = p.mask;
      return w;
    }
    w.b = bh / p.N, w.n = bh - w.b * p.N, w.m0 = mb * BM;
    if constexpr (FEAT)
      if (p.b_fast) w.n = bh / p.B, w.b = bh - w.n * p.B;
    /* Warpgroups with rows: T - m0 is a positive multiple of 64 (T % 128 == 0), so a warpgroup's 64 rows are
       all below T or all at or past it; at BM 192 the last m-block of a head has 1, 2 or 3 (T / 128 % 3 = 2,
       1, 0). */
    w.n_wg = QBOX == BM ? NC : min(NC, (p.T - w.m0) / 64);
    /* Lengths (MASK 3): batch b is the problem q_len[b] x kv_len[b], with its own mask (bottom-right's
       diagonal moves with the lengths); rows past q_len see no key, keys past kv_len are never loaded but in
       the tile that holds kv_len. */
    w.mk = p.mask;
    w.ql = p.T, w.kl = p.S;
    if (MASK >= 3) {
      sa_hop_lens(p.shape, w.b, p.T, p.S, &w.ql, &w.kl);
      w.mk = sa_hop_mask_make(w.ql, w.kl, p.shape.causal, p.shape.wl, p.shape.wr, p.shape.diag);
    }
    /* Key tiles: those holding a key some real row of the tile sees; the rest are fully masked and skipped.
       n_tiles = 0 (no row sees a key, e.g. a negative diag_offset): out 0, lse = sink. Without a mask
       S / BN (S is a multiple of 128 in the Hopper scope, BN is 128). */
    w.t0 = 0, w.n_tiles = (p.S + BN - 1) / BN;
    if (MASK) {
      const int rows = w.ql - w.m0 < BM ? w.ql - w.m0 : BM; /* <= 64 n_wg (ql <= T) */
      if (rows > 0) w.t0 = sa_hop_key_tiles(w.mk, w.m0, rows, BN, &w.n_tiles);
      else w.n_tiles = 0;
      /* MASK 4: only the tiles from the first to the last holding a key of the rows' documents (warp-collective:
         the producer's whole warp and every consumer warp call work_of) */
      if (MASK == 4 && w.n_tiles > 0)
        seg_tiles<128>(p.q_seg + (size_t)w.b * p.T + w.m0, rows, p.kv_seg + (size_t)w.b * p.S, &w.t0, &w.n_tiles,
                       (int)threadIdx.x % 32);
    }
    return w;
  };
  /* The warpgroup, through a shuffle so that ptxas knows it is warp-uniform (as CUTLASS does): the loop
     counters below start at a per-warpgroup tile a and would otherwise live in vector registers, with every
     wgmma descriptor moved to uniform registers per iteration (+21 / +27 loop instructions at H64 / H128). */
  const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);

  /* Initialised once per CTA; the phases run on across its work tiles (the header's protocol). Every consumer
     warp arrives on every K / V / Q empty phase, a warpgroup without rows in a work tile included: 4 NC. */
  if (threadIdx.x == 0) {
    for (int q = 0; q < QS; ++q) {
      mbar_init(bar_qf(b0, q), 1);      /* the producer's arrive(.expect_tx), then Q's bytes */
      mbar_init(bar_qe(b0, q), 4 * NC); /* one arrive per consumer warp and work tile, after its last S */
    }
    for (int s = 0; s < ST; ++s) {
      mbar_init(bar_kf<ST>(b0, s), 1); /* the producer's arrive.expect_tx, then the TMA bytes */
      mbar_init(bar_vf<ST>(b0, s), 1);
      mbar_init(bar_ke<ST>(b0, s), 4 * NC);
      mbar_init(bar_ve<ST>(b0, s), 4 * NC);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    /* Producer: 24 registers. Per work tile: wait Q empty of the previous one (parity (j & 1) ^ 1 for the j-th:
       a fresh barrier returns at once for j = 0), then Q and the key tiles, K before V (the
       consumers need K_j one step before V_j), at ring position x, which runs on across work tiles (up to ST
       key tiles ahead of the consumers' releases; the expect_tx bytes of a stage do not depend on ST). Q: only
       the boxes of warpgroups with rows (no box is ever past T); no K / V box is past S (BN divides S), so
       expect_tx is the whole box. A work tile without key tiles: a plain arrive. */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(TL::PREGS) : "memory");
    /* Thread 0 issues everything; at MASK 4 its whole warp walks the work tiles with it, for work_of's
       warp-collective narrowing (the other lanes only that). */
    if (threadIdx.x < (MASK == 4 || FEAT ? 32 : 1)) {
      const bool issuer = threadIdx.x == 0;
      uint32_t x = 0, jq = 0;
      for (int tile = blockIdx.x;; tile += gridDim.x, ++jq) {
        if (tile >= p.total) break;
        /* every consumer warp is past its last S of work tile jq - QS, the slot's previous use */
        const uint32_t qs = jq % QS, qf = bar_qf(b0, qs), sqj = sq + qs * TL::Q_BYTES;
        if (issuer || FEAT) mbar_wait(bar_qe(b0, qs), ((jq / QS) & 1) ^ 1);
        sa_hop_fwd_work w = work_of(tile);
        if constexpr (FEAT) /* the class lists into the slot, the key tiles narrowed (hopper/fwd_feat.cuh) */
          if (p.lists) {
            feat_fwd_lists<HD>(p, w.b, w.n, w.m0, w.n_wg, slist + qs * TL::LIST_BYTES, srange + 8 * qs, &w.t0,
                               &w.n_tiles, (int)threadIdx.x);
            __syncwarp();
          }
        if (!issuer) continue;
        if (w.n_tiles == 0) {
          mbar_arrive(qf);
          continue;
        }
        const int q_boxes = QBOX == BM ? 1 : w.n_wg, kvh = w.n / p.G; /* Q boxes per column block */
        mbar_arrive_tx(qf, q_boxes * CB * QBOX * 128);
        for (int c = 0; c < CB; ++c)
          for (int q = 0; q < q_boxes; ++q)
            tma_load(sqj + c * BM * 128 + q * QBOX * 128, &tmq, qf, c * 64, w.n, w.m0 + q * QBOX, w.b);
        for (int it = 0; it < w.n_tiles; ++it, ++x) {
          const int s = x % ST, key0 = (w.t0 + it) * BN;
          const uint32_t ph = (x / ST) & 1;
          mbar_wait(bar_ke<ST>(b0, s), ph ^ 1);
          mbar_arrive_tx(bar_kf<ST>(b0, s), KV_BYTES + TL::IDS_BYTES);
          for (int c = 0; c < CB; ++c)
            tma_load(sk + s * KV_BYTES + c * BN * 128, &tmk, bar_kf<ST>(b0, s), c * 64, kvh, key0, w.b);
          if (MASK == 4) tma_load_2d(sids + s * TL::IDS_BYTES, &tmids, bar_kf<ST>(b0, s), key0, w.b);
          mbar_wait(bar_ve<ST>(b0, s), ph ^ 1);
          mbar_arrive_tx(bar_vf<ST>(b0, s), KV_BYTES);
          for (int c = 0; c < CB; ++c)
            tma_load(sv + s * KV_BYTES + c * BN * 128, &tmv, bar_vf<ST>(b0, s), c * 64, kvh, key0, w.b);
        }
      }
    }
    return;
  }

  /* Consumers: every warpgroup takes its registers (128 x 24 + 384 x 160 = 64512 of 65536 at H64) and walks
     every work tile, those where it has no rows too (its barrier arrivals keep the counts at 4 NC). */
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(TL::REGS) : "memory");
  const int cw = wg - 1;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, t = lane % 4;
  /* Made once, not per key tile (the key-tile loop's SASS: at its ring position). The warp's anchor word (see the
     wait_group 0 of the key-tile loop), warp-uniform through a shuffle (else rebuilt from threadIdx every tile: 6
     instructions at H64). wgmma descriptors (desc_add): this warpgroup's 64 rows of each Q column block, K's stage 0
     (stage s: + s KV_DESC), and V's as K's moved by a constant (start + ST KV_BYTES, LBO BN * 128 instead of 16),
     which ptxas folds into the k-steps' immediates instead of rebuilding gmma_desc(sv, ...) from the shared window
     every tile (7 instructions at H64). */
  constexpr uint32_t KV_DESC = KV_BYTES / 16;
  const uint32_t anchor_w = __shfl_sync(0xffffffffu, smem_u32(&anchor[4 * cw + warp]), 0);
  const uint64_t dq0 = gmma_desc(sq + cw * 64 * 128, 16, 1024), dk0 = gmma_desc(sk, 16, 1024); /* Q: slot 0 */
  const uint64_t dv0 = dk0 + ST * KV_DESC + ((uint64_t)(BN * 128 / 16 - 16 / 16) << 16);
  const float sl2 = FEAT ? 1.f : p.scale_l2; /* FEAT: the scores reach the softmax in base 2 (fwd_feat.cuh) */

  /* Accumulator layout of m64nN (per warp 16 rows): d[4j + e]: row lane/4 + 8 * (e >> 1),
     column 8j + 2 * (lane % 4) + (e & 1). */
  float o[HD / 2], sacc[BN / 2], corr[2];
  uint32_t pf[BN / 4];
  uint32_t x0 = 0; /* ring position of this work tile's first key tile */
  for (uint32_t jq = 0;; ++jq) {
    /* The work tile is the producer's walk, blockIdx.x + jq gridDim.x (no slot to read): known before Q full,
       so the sink's global load (and MASK 3's lengths) is issued before the wait and lands under it. Read after
       the wait it costs 2.7% of the H128 forward's stall samples at T1024 (ncu on the H200), its use right
       behind it at every work tile's start. */
    const int tile = blockIdx.x + (int)jq * (int)gridDim.x; /* < total + gridDim.x <= 2^31 (sa_hop_run) */
    if (tile >= p.total) break;
    const sa_hop_fwd_work w = work_of(tile);
    const float sink = p.softmax == 2 ? p.sinks[w.n] : p.softmax == 1 ? 0.f : -INFINITY;
    /* MASK 4: the ids of this thread's rows (r0 and r0 + 8 below; a warpgroup without rows reads none) */
    int qid0 = 0, qid1 = 0;
    if (MASK == 4 && cw < w.n_wg) {
      const int32_t *qs = p.q_seg + (size_t)w.b * p.T + w.m0 + 64 * cw + 16 * warp + lane / 4;
      qid0 = qs[0];
      qid1 = qs[8];
    }
    const uint64_t dq = dq0 + (jq % QS) * (TL::Q_BYTES / 16); /* this work tile's Q slot */
    mbar_wait(bar_qf(b0, jq % QS), (jq / QS) & 1);
    int t0 = w.t0, n_tiles = w.n_tiles;
    if constexpr (FEAT) /* the producer's narrowing of the key tiles (hopper/fwd_feat.cuh) */
      if (p.lists)
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];"
                     : "=r"(t0), "=r"(n_tiles)
                     : "r"(srange + 8 * (jq % QS))
                     : "memory");
    const int ql = w.ql, kl = w.kl;
    const int wg_row0 = w.m0 + 64 * cw;            /* first row of this warpgroup; < T iff cw < n_wg */
    const int r0 = wg_row0 + 16 * warp + lane / 4; /* this thread's rows: r0 and r0 + 8 */
    const float sink_l2 = sink * SA_LOG2E;
    /* Running max seeded with the sink, capped below +inf so a +inf sink leaves exp2(m - m) = 1, not NaN
       (fminf passes a NaN sink's cap on; the NaN returns in the normalisation). */
    const float seed = fminf(sink_l2, 3.0e38f);
    float m_[2] = {seed, seed}, l_[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
    /* A tile of keys [k, k + BN) is visible to every row of the warpgroup iff its smallest key - row, k -
       wg_row0 - 63, is >= dlo and its largest, k + BN - 1 - wg_row0, is <= dhi (and, with lengths, it ends by
       kv_len and the warpgroup's rows by q_len): then no per-element test. Without a mask no tile tests (BN
       divides S). */
    const int dlo = w.mk.dlo, dhi = w.mk.dhi;
    int dhi0 = dhi, dhi1 = dhi, unused;
    if (MASK >= 3) {
      sa_hop_row_bounds(w.mk, ql, kl, r0, &unused, &dhi0);
      sa_hop_row_bounds(w.mk, ql, kl, r0 + 8, &unused, &dhi1);
    }
    /* FEAT: this thread's rows as the feature steps read them, the batch's key positions */
    sa_hop_feat_rows frows = {};
    const int32_t *kpos = nullptr;
    if constexpr (FEAT) {
      frows = feat_rows(p, w.b, w.n, r0);
      if (p.f.kv_pos) kpos = p.f.kv_pos + (size_t)w.b * p.S;
    }
    /* The tile of keys [k, k + BN) in K stage s. MASK 4: its ids are read here, so the K stage is released after
       (release_k), not as soon as S has landed. FEAT: first the scores of the bias and the soft-cap (in base 2),
       then the selects of every mask, the class's last (the list in the Q slot: read before the Q-empty arrive). */
    auto mask_tile = [&](int k, uint32_t s) {
      if constexpr (FEAT) {
        if (p.f.bias || p.f.cap > 0.f) feat_fwd_scores(sacc, p.f, frows, k + 2 * t);
        else
#pragma unroll
          for (int i = 0; i < BN / 2; ++i) sacc[i] *= p.scale_l2;
      }
      if constexpr (MASK != 0) {
        if (k - wg_row0 - 63 < dlo || k + BN - 1 - wg_row0 > dhi || (MASK >= 3 && (k + BN > kl || wg_row0 + 64 > ql)))
          mask_range<MASK>(sacc, k + 2 * t - r0 - dhi0, k + 2 * t - r0 - dhi1, k + 2 * t - r0 - dlo);
      }
      if constexpr (MASK == 4) mask_segments(sacc, sids + s * TL::IDS_BYTES, qid0, qid1, t);
      if constexpr (FEAT)
        if (p.lists) {
          uint32_t c;
          asm volatile("ld.shared.u8 %0, [%1];"
                       : "=r"(c)
                       : "r"(slist + (jq % QS) * TL::LIST_BYTES + k / BN)
                       : "memory");
          feat_fwd_select(sacc, (int)((c >> (2 * cw)) & 3u), p.f, frows, kpos, k + 2 * t);
        }
    };
    /* K stage s read: by the wgmma of S (landed) and, MASK 4, by every lane's id loads (__syncwarp: an mbarrier
       arrive releases only the arriving thread's own accesses). Called before the mask but at MASK 4 (after it
       there); one lambda doing both reordered the SASS of the H128 causal and window kernels, so two calls. */
    auto release_k = [&](uint32_t s) {
      if (MASK == 4) __syncwarp();
      if (lane == 0) mbar_arrive(bar_ke<ST>(b0, s));
    };
    /* The last tile with lengths: V rows past kv_len become 0 (a key row past kv_len may hold NaN, and 0 x NaN
       = NaN). Every consumer warpgroup meets here once per such work tile, whether it reads the tile or
       releases it unread (see release), so barrier 1 counts all 128 NC consumer threads. Tile-uniform. */
    const int kend = (t0 + n_tiles) * BN;
    auto zero_tail = [&](int s) {
      if (MASK >= 3 && kend > kl) {
        zero_tile_rows(sv + s * KV_BYTES, BN, kl - (kend - BN), CB, threadIdx.x - 128, 128 * NC);
        named_bar_sync(1, 128 * NC);
      }
    };
    /* This warpgroup's tiles: [a, e) of the work tile's 0 .. n_tiles - 1, those holding a key one of its real
       rows sees (sa_hop_key_tiles of its rows; a subset, lo and hi never decrease with the row). A 192-row
       causal m-block's first warpgroups skip its last 1-2 tiles, a windowed one's last warpgroups its first
       1-2 (without this H64 causal would do 3% (T4096) / 11% (T1024) more tensor work than 128-row CTAs, a
       (127, 0) window 50%; with it exactly as much as 128-row CTAs in both). The others are released unread,
       in order, each after its full barrier, so every arrive lands in the phase of its own key tile (an arrive
       before the load could complete the previous phase of that stage while another warpgroup still reads
       it). No rows (cw >= n_wg: Q not loaded) or no key for its rows: a = e = 0, all released. */
    int a = 0, e = cw < w.n_wg ? n_tiles : 0;
    if (MASK && e > 0) {
      const int rows = ql - wg_row0 < 64 ? ql - wg_row0 : 64;
      int nw = 0;
      const int tw = rows > 0 ? sa_hop_key_tiles(w.mk, wg_row0, rows, BN, &nw) : 0;
      a = nw > 0 ? tw - t0 : 0;
      e = nw > 0 ? a + nw : 0;
      if (MASK == 4 || FEAT) { /* the work tile's range was narrowed to the rows' documents / classes: intersect */
        a = a > 0 ? a : 0;
        e = e < n_tiles ? e : n_tiles;
        if (e <= a) a = e = 0;
      }
    }
    if constexpr (FEAT) /* and to the tiles where this warpgroup's slab is not empty (hopper/fwd_feat.cuh) */
      if (p.lists && e > a)
        feat_fwd_slab(slist + (jq % QS) * TL::LIST_BYTES, (p.S + BN - 1) / BN, t0, cw, &a, &e, lane);
    auto release = [&](int from, int to) {
      for (int it = from; it < to; ++it) {
        const uint32_t x = x0 + it;
        const int s = x % ST;
        const uint32_t ph = (x / ST) & 1;
        mbar_wait(bar_kf<ST>(b0, s), ph);
        if (lane == 0) mbar_arrive(bar_ke<ST>(b0, s));
        mbar_wait(bar_vf<ST>(b0, s), ph);
        if (it == n_tiles - 1) zero_tail(s);
        if (lane == 0) mbar_arrive(bar_ve<ST>(b0, s));
      }
    };
    /* Q empty: exactly once per work tile and warp, and never inside the key-tile loop (a test there cost 3
       instructions a tile): at once without an S (a >= e), else after the loop, when the warp's last S of the
       work tile has landed (and been through its softmax); the next work tile's Q then lands under this one's
       last P V and epilogue. */
    if (FEAT) __syncwarp(); /* every lane read the slot's class list: the arrive releases only lane 0's reads */
    if (a >= e && lane == 0) mbar_arrive(bar_qe(b0, jq % QS));
    release(0, a);

    if (a < e) {
      /* The ring position as (stage, parity) = (x % ST, (x / ST) & 1), carried through the loop and
       advanced by one per key tile instead of derived from x = x0 + it in each (which costs ~8 integer
       instructions a tile). Invariant: (sp, pp) is the position of x0 + it - 1 at the top of iteration
       it (the tile whose V is pending), of x0 + a after tile a and of x0 + e - 1 after the loop, i.e. exactly
       the values release() and the producer derive from x. The advance: the stage steps and wraps ST - 1 -> 0,
       the parity flips as it wraps; at ST 2 (sp is 0 or 1) in the toggle form, which the general one costs 1 / 5
       more loop instructions at H64 / H128 (ptxas does not know sp < 2); ST 4 pays that 1 (every H64 kind).
       The key-tile loop in SASS (nvcc 13.0, sm_90a), instructions at H64 / H128 without a mask, H128 causal:
       400 / 718 / 570, against 478 / 806 / 642 with the position derived from x in every tile; HGMMA and MUFU.EX2
       the same. */
      uint32_t sp = (x0 + a) % ST, pp = ((x0 + a) / ST) & 1;
      { /* Tile a: S_a alone, then its softmax (O is still 0: nothing to rescale). */
        mbar_wait(bar_kf<ST>(b0, sp), pp);
        pin(sacc);
        wgmma_fence();
        gemm_qk<HD, BM, BN>(sacc, dq, dk0 + sp * KV_DESC);
        wgmma_commit();
        wgmma_wait0();
        pin(sacc);
        if (MASK != 4) release_k(sp);
        mask_tile((t0 + a) * BN, sp);
        if (MASK == 4) release_k(sp);
        softmax_tile(sacc, m_, l_, corr, sl2);
        pack_p(pf, sacc);
      }

      for (int it = a + 1; it < e; ++it) {
        /* K of tile it at the next position (s, ps) = that of x0 + it; V of tile it - 1 at the previous (sp, pp) */
        const uint32_t s = ST == 2 ? sp ^ 1 : sp + 1 == ST ? 0 : sp + 1;
        const uint32_t ps = ST == 2 ? pp ^ sp : pp ^ (s == 0);
        mbar_wait(bar_kf<ST>(b0, s), ps);
        mbar_wait(bar_vf<ST>(b0, sp), pp);
        pin(sacc);
        pin(o);
        pin(pf);
        wgmma_fence();
        gemm_qk<HD, BM, BN>(sacc, dq, dk0 + s * KV_DESC); /* group 1: S_j */
        wgmma_commit();
        gemm_pv<HD, BN>(o, pf, dv0 + sp * KV_DESC); /* group 2: O += P_{j-1} V_{j-1} */
        wgmma_commit();
        wgmma_wait1(); /* S_j has landed; P V may still run */
        pin(sacc);
        if (MASK != 4) release_k(s);
        mask_tile((t0 + it) * BN, s);
        if (MASK == 4) release_k(s);
        softmax_tile(sacc, m_, l_, corr, sl2);
        /* ptxas schedules WARPGROUP.DEPBAR (wait_group 0) into the first stall slot after the row-max shuffle,
         i.e. before the 64 exp2s, which then no longer overlap P V (seen in the SASS of nvcc 13.0). A shared
         store of a value that depends on every exp2 (the row sums) is an anchor it does not cross: with it the
         wait lands after the last MUFU.EX2. One 4-byte store per warp per tile, to a word nobody reads. */
        if (lane == 0) asm volatile("st.shared.f32 [%0], %1;" ::"r"(anchor_w), "f"(l_[0] + l_[1]) : "memory");
        wgmma_wait0(); /* P_{j-1} V_{j-1} has landed: O and pf are free */
        pin(o);
        pin(pf);
        if (lane == 0) mbar_arrive(bar_ve<ST>(b0, sp));
#pragma unroll
        for (int j = 0; j < HD / 8; ++j)
#pragma unroll
          for (int q = 0; q < 4; ++q) o[4 * j + q] *= corr[q >> 1];
        pack_p(pf, sacc);
        sp = s, pp = ps;
      }
      if (FEAT) __syncwarp();                          /* as above: the lanes' reads of the class list */
      if (lane == 0) mbar_arrive(bar_qe(b0, jq % QS)); /* the warp's last S (tile e - 1) has landed: Q is dead */

      { /* The last P V (of tile e - 1; with lengths the work tile's last key tile is zeroed past kv_len first). */
        mbar_wait(bar_vf<ST>(b0, sp), pp);
        if (e == n_tiles) zero_tail(sp);
        pin(o);
        pin(pf);
        wgmma_fence();
        gemm_pv<HD, BN>(o, pf, dv0 + sp * KV_DESC);
        wgmma_commit();
        wgmma_wait0();
        pin(o);
        if (lane == 0) mbar_arrive(bar_ve<ST>(b0, sp));
      }
    } /* a < e */
    release(e, n_tiles);
    /* warp-uniform for ptxas (as wg above): the ring's stage and parity stay in uniform registers */
    x0 = __shfl_sync(0xffffffffu, x0 + n_tiles, 0);
    if (cw >= w.n_wg) continue; /* rows past T: nothing to store */

    /* Final normalisation, the one place the sink enters, in the portable kernel's form: the larger of the
       running max m and the sink a contributes 2^0 = 1 exactly, and lse is formed from it in the natural-log
       domain (a dominant sink gives lse = a exactly, +inf included). m >= the seed, so a >= m means a is the
       max. No valid key and no sink (m = -inf): out 0, lse = sink. Every row stored here is below T. The
       producer may already be loading the next work tile's Q: this touches no shared memory. */
    const int T = p.T, N = p.N;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float mm = m_[h];
      float f = 0.f, lse = sink;
      if (mm != -INFINITY) {
        const bool sink_max = sink_l2 >= mm;
        const float wt = sink_max ? ex2(mm - sink_l2) : 1.f;
        const float ltot = l * wt + (sink_max ? 1.f : ex2(sink_l2 - mm));
        f = wt / ltot;
        lse = (sink_max ? sink : mm * SA_LN2) + logf(ltot);
      }
      const int row = r0 + 8 * h;
      /* A row past q_len is exactly 0 (its Q row, padding, may hold NaN; P is 0 there, but not 0 x NaN). */
      const bool dead = MASK >= 3 && row >= ql;
      __nv_bfloat16 *orow = p.out + (((size_t)w.b * T + row) * N + w.n) * HD;
      store_row_bf16<HD>(orow, o, h, f, t, dead); /* 16-byte stores (hopper/ptx.cuh) */
      if (p.lse && t == 0) p.lse[((size_t)w.b * N + w.n) * T + row] = lse;
    }
  }
#endif /* sm_90a */
}

/* ---- host ------------------------------------------------------------------------------------------- */

/* The maps take the configuration's boxes (Q: QBOX rows, K / V: BN rows). */
template <int HD, int MASK, int FEAT = 0>
cudaError_t sa_hop_run(PFN_cuTensorMapEncodeTiled_v12000 enc, const sa_cuda_params &p,
                       const typename sa_hop_fwd_params_of<FEAT>::type &hp, int grid, cudaStream_t st) {
  using TL = sa_hop_fwd_tile<HD, MASK, FEAT>;
  CUtensorMap mq, mk, mv, mids;
  if (!sa_hop_map(enc, &mq, p.q, p.B, p.T, p.N, p.H, TL::QBOX) ||
      !sa_hop_map(enc, &mk, p.k, p.B, p.S, p.K, p.H, TL::BN) || !sa_hop_map(enc, &mv, p.v, p.B, p.S, p.K, p.Hv, TL::BN))
    return cudaErrorInvalidValue;
  mids = mq; /* without segment ids the kernel never reads its ids map: any valid map will do */
  if (MASK == 4 && !sa_hop_map_ids(enc, &mids, p.kv_seg, p.B, p.S, 128)) return cudaErrorInvalidValue;
  cudaError_t e =
      cudaFuncSetAttribute(sa_hop_fwd_kernel<HD, MASK, FEAT>, cudaFuncAttributeMaxDynamicSharedMemorySize, TL::SMEM);
  if (e != cudaSuccess) return e;
  sa_hop_fwd_kernel<HD, MASK, FEAT><<<(unsigned)grid, TL::THREADS, TL::SMEM, st>>>(mq, mk, mv, mids, hp);
  return cudaGetLastError();
}

/* The feature kernel (plan hopper.fwd.features): the class pre-pass writes the work tiles' lists into out
   (feat_class.cu) when there is a mask array or positions, then the kernel of the call's position-mask kind. */
cudaError_t sa_hop_fwd_feat_run(PFN_cuTensorMapEncodeTiled_v12000 enc, const sa_cuda_plan &plan,
                                const sa_cuda_params &p, const sa_hop_fwd_params &hp, const sa_cuda_feat &f,
                                cudaStream_t st) {
  sa_hop_fwd_feat_params fp;
  static_cast<sa_hop_fwd_params &>(fp) = hp;
  fp.f = f;
  fp.B = (int)p.B;
  fp.b_fast = plan.b_fast;
  fp.lists = f.mask != nullptr || f.q_pos != nullptr;
  if (fp.lists) {
    const sa_feat_class_args ca = {p.B, p.T, p.S, p.N, p.Hv, plan.cls_cb, plan.cls_cn, (uint8_t *)p.out};
    const cudaError_t e = sa_feat_class_launch(f, ca, 1, st);
    if (e != cudaSuccess) return e;
  }
  const int g = plan.grid[0];
  switch (plan.mask + 4 * (plan.hd == 128)) {
    case 0: return sa_hop_run<64, 0, 1>(enc, p, fp, g, st);
    case 1: return sa_hop_run<64, 1, 1>(enc, p, fp, g, st);
    case 2: return sa_hop_run<64, 2, 1>(enc, p, fp, g, st);
    case 3: return sa_hop_run<64, 3, 1>(enc, p, fp, g, st);
    case 4: return sa_hop_run<128, 0, 1>(enc, p, fp, g, st);
    case 5: return sa_hop_run<128, 1, 1>(enc, p, fp, g, st);
    case 6: return sa_hop_run<128, 2, 1>(enc, p, fp, g, st);
    default: return sa_hop_run<128, 3, 1>(enc, p, fp, g, st);
  }
}

} /* namespace */

cudaError_t sa_hop_fwd_launch(const sa_cuda_plan &plan, const sa_cuda_params &p, const sa_cuda_feat *f,
                              cudaStream_t st) {
  static const PFN_cuTensorMapEncodeTiled_v12000 enc = sa_hop_encode_fn(); /* thread-safe static init */
  if (!enc) return cudaErrorNotSupported;
  sa_hop_fwd_params hp;
  hp.out = (__nv_bfloat16 *)p.out;
  hp.lse = p.lse;
  hp.sinks = p.sinks;
  hp.T = (int)p.T;
  hp.S = (int)p.S;
  hp.N = (int)p.N;
  hp.G = (int)p.G;
  hp.softmax = p.softmax;
  hp.scale_l2 = p.scale_log2;
  hp.mask = sa_hop_mask_of(p);
  hp.shape = sa_hop_shape_of(p);
  hp.q_seg = p.q_seg;
  hp.kv_seg = p.kv_seg;
  hp.BH = plan.BH, hp.n_mb = plan.n_mb, hp.total = plan.total, hp.hg = plan.hg, hp.nph = plan.nph;
  if (plan.feat) return f ? sa_hop_fwd_feat_run(enc, plan, p, hp, *f, st) : cudaErrorInvalidValue;
  const int g = plan.grid[0];
  switch (plan.mask + 5 * (plan.hd == 128)) {
    case 0: return sa_hop_run<64, 0>(enc, p, hp, g, st);
    case 1: return sa_hop_run<64, 1>(enc, p, hp, g, st);
    case 2: return sa_hop_run<64, 2>(enc, p, hp, g, st);
    case 3: return sa_hop_run<64, 3>(enc, p, hp, g, st);
    case 4: return sa_hop_run<64, 4>(enc, p, hp, g, st);
    case 5: return sa_hop_run<128, 0>(enc, p, hp, g, st);
    case 6: return sa_hop_run<128, 1>(enc, p, hp, g, st);
    case 7: return sa_hop_run<128, 2>(enc, p, hp, g, st);
    case 8: return sa_hop_run<128, 3>(enc, p, hp, g, st);
    default: return sa_hop_run<128, 4>(enc, p, hp, g, st);
  }
}
