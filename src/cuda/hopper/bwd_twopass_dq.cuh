/*
 * hopper/bwd_twopass_dq.cuh — the dQ kernel of the two-pass backward; included by hopper/bwd_twopass.cu only.
 */
#ifndef SA_HOPPER_BWD_TWOPASS_DQ_CUH
#define SA_HOPPER_BWD_TWOPASS_DQ_CUH

/* ---- 3. dQ ------------------------------------------------------------------------------------------ */

/* FEAT 1: the feature kernel (hopper/bwd_feat.cuh), which also writes dbias. */
template <int HD, int MASK, int NCQ, int FEAT = 0>
__global__ void __launch_bounds__(sa_hop_dq_tile<HD, NCQ>::THREADS, 1)
    sa_hop_twopass_dq_kernel(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmdo,
                             const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv,
                             const __grid_constant__ CUtensorMap tmkid,
                             const typename sa_hop_twopass_params_of<FEAT>::type p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using TL = sa_hop_dq_tile<HD, NCQ>;
  constexpr int CB = HD / 64, NC = TL::NC, QM = TL::QM;
  constexpr uint32_t Q_BYTES = QM * HD * 2, KT_BYTES = KT * HD * 2;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar[1 + 2 * STAGES]; /* Q+dO full; per stage K+V full; per stage empty */
  __shared__ float anchor[4 * NC];

  const uint32_t sq = (smem_u32(smem_raw) + 1023u) & ~1023u, sdo = sq + Q_BYTES;
  const uint32_t sk = sdo + Q_BYTES, sv = sk + STAGES * KT_BYTES, b0 = smem_u32(bar);
  const uint32_t sids = sv + STAGES * KT_BYTES; /* MASK 4: stage s's KT key segment ids at sids + s KT 4 */
  auto bar_full = [&](int s) { return b0 + 8 * (1 + s); };
  auto bar_empty = [&](int s) { return b0 + 8 * (1 + STAGES + s); };

  /* Causal: the query blocks with the most key tiles are launched first. */
  const int mb = MASK || feat_classes(p) ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
  const int n = blockIdx.y + feat_n0(p), b = blockIdx.z + feat_b0(p), kvh = n / (p.N / p.KH), m0 = mb * QM, T = p.T;
  /* Lengths (MASK 3): the batch's own mask; keys past kv_len in the tile that holds kv_len are zeroed in shared
     memory (K and V: padding may be NaN), rows past q_len get dq = 0. */
  sa_hop_mask mk = p.mask;
  int ql = T, kl = p.S;
  if (MASK >= 3) {
    sa_hop_lens(p.shape, b, T, p.S, &ql, &kl);
    mk = sa_hop_mask_make(ql, kl, p.shape.causal, p.shape.wl, p.shape.wr, p.shape.diag);
  }
  /* Warpgroups with rows: T - m0 is a positive multiple of 64 (T % 128 == 0). */
  const int n_wg = min(NC, (T - m0) / 64);
  /* Key tiles t0 .. t0 + n_tiles - 1: those holding a key some row of [m0, m0 + 64 n_wg) sees (none: dq = 0). */
  int t0 = 0, n_tiles = p.S / KT;
  if (MASK) {
    const int rows = min(ql - m0, 64 * n_wg); /* 64 n_wg without lengths */
    if (rows > 0) t0 = sa_hop_key_tiles(mk, m0, rows, KT, &n_tiles);
    else n_tiles = 0;
    /* MASK 4: only the key tiles from the first to the last holding a key of the rows' documents (warp-collective:
       every warp of the CTA, before any leaves) */
    if (MASK == 4 && n_tiles > 0)
      seg_tiles<KT>(p.q_seg + (size_t)b * T + m0, rows, p.kv_seg + (size_t)b * p.S, &t0, &n_tiles,
                    (int)threadIdx.x % 32);
  }
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    mbar_init(b0, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bar_full(s), 1);
      mbar_init(bar_empty(s), 4 * n_wg); /* one arrive per warp of a consumer warpgroup with rows */
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (threadIdx.x == 0 && n_tiles > 0) {
      mbar_arrive_tx(b0, 2 * Q_BYTES); /* rows past T (a partial CTA) are TMA's zero fill, counted in the bytes */
      for (int c = 0; c < CB; ++c) {
        tma_load(sq + c * QM * 128, &tmq, b0, c * 64, n, m0, b);
        tma_load(sdo + c * QM * 128, &tmdo, b0, c * 64, n, m0, b);
      }
      int xs = 0; /* FEAT: the ring position of the loaded tiles (a tile whose every block is empty is not) */
      for (int it = 0; it < n_tiles; ++it) {
        const int s = (FEAT ? xs : it) % STAGES;
        if constexpr (FEAT)
          if (feat_tile_empty(p.f, b, n, m0 / 64, t0 + it, n_wg, true)) continue;
        mbar_wait(bar_empty(s), (((FEAT ? xs : it) / STAGES) & 1) ^ 1);
        if constexpr (FEAT) ++xs;
        mbar_arrive_tx(bar_full(s), 2 * KT_BYTES + (MASK == 4 ? KT * 4 : 0));
        for (int c = 0; c < CB; ++c) {
          tma_load(sk + s * KT_BYTES + c * KT * 128, &tmk, bar_full(s), c * 64, kvh, (t0 + it) * KT, b);
          tma_load(sv + s * KT_BYTES + c * KT * 128, &tmv, bar_full(s), c * 64, kvh, (t0 + it) * KT, b);
        }
        if (MASK == 4) tma_load_2d(sids + s * KT * 4, &tmkid, bar_full(s), (t0 + it) * KT, b);
      }
    }
    return;
  }

  /* A warpgroup past T leaves before setmaxnreg.inc; no barrier counts it. */
  const int cw = wg - 1;
  if (cw >= n_wg) return;
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(TL::REGS) : "memory");
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, t = lane % 4;
  const int wg_row0 = m0 + 64 * cw, r0 = wg_row0 + 16 * warp + lane / 4; /* rows r0, r0 + 8 */
  /* The key tiles [w_a, w_e) of the CTA's that hold a key one of this warpgroup's rows sees; the others are
     released unread (a 192-row causal CTA's first warpgroups skip its last 1-2 tiles). */
  int w_a = 0, w_e = n_tiles;
  if (MASK && n_tiles > 0) {
    const int rows = min(ql - wg_row0, 64);
    int nw = 0;
    int tw = rows > 0 ? sa_hop_key_tiles(mk, wg_row0, rows, KT, &nw) : 0;
    /* MASK 4: and of those, the tiles of its rows' documents (a subset of the CTA's: fewer rows, fewer ids) */
    if (MASK == 4 && nw > 0)
      seg_tiles<KT>(p.q_seg + (size_t)b * T + wg_row0, rows, p.kv_seg + (size_t)b * p.S, &tw, &nw, lane);
    w_a = nw > 0 ? tw - t0 : 0;
    w_e = nw > 0 ? w_a + nw : 0;
    if (MASK == 4) w_a = max(w_a, 0), w_e = min(w_e, n_tiles);
  }
  const uint32_t sq_wg = sq + cw * 64 * 128, sdo_wg = sdo + cw * 64 * 128;
  const float sl2 = p.scale_l2;
  float lr[2], Dr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const size_t li = ((size_t)b * p.N + n) * T + r0 + 8 * h;
    lr[h] = p.lse2[li];
    Dr[h] = p.D[li];
  }
  float dq[HD / 2], sa[32], dpa[32];
  uint32_t df[16];
  zero(dq);
  const int dlo = mk.dlo, dhi = mk.dhi; /* visible iff dlo <= key - row <= dhi (sa_hop_mask) */
  int dhi0 = dhi, dhi1 = dhi, unused;   /* per row with lengths (sa_hop_row_bounds) */
  if (MASK >= 3) {
    sa_hop_row_bounds(mk, ql, kl, r0, &unused, &dhi0);
    sa_hop_row_bounds(mk, ql, kl, r0 + 8, &unused, &dhi1);
  }
  /* MASK 4: this thread's rows' segment ids (rows r0, r0 + 8 < T) */
  int qid0 = 0, qid1 = 0;
  if (MASK == 4) {
    qid0 = p.q_seg[(size_t)b * T + r0];
    qid1 = p.q_seg[(size_t)b * T + r0 + 8];
  }
  /* FEAT: this thread's rows as the feature steps read them: their bias, mask and dbias rows (element offsets), the
     key bounds of their positions, the batch's key positions */
  int64_t fb[2] = {0, 0}, fm[2] = {0, 0}, fd[2] = {0, 0};
  int2 fp[2] = {make_int2(1, 0), make_int2(1, 0)};
  const int32_t *kpos = nullptr;
  if constexpr (FEAT) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = r0 + 8 * h;
      fb[h] = b * p.f.bias_b + n * p.f.bias_n + row * p.f.bias_t;
      fm[h] = b * p.f.mask_b + n * p.f.mask_n + row * p.f.mask_t;
      fd[h] = b * p.f.dbias_b + n * p.f.dbias_n + row * p.f.dbias_t;
      if (p.f.q_pos) sa_feat_pos_bounds(&p.f, p.f.q_pos[(int64_t)b * T + row], &fp[h].x, &fp[h].y);
    }
    if (p.f.kv_pos) kpos = p.f.kv_pos + (int64_t)b * p.S;
  }
  if (n_tiles > 0) mbar_wait(b0, 0);

  int xs = 0; /* FEAT: as the producer's */
  for (int it = 0; it < n_tiles; ++it) {
    const int s = (FEAT ? xs : it) % STAGES, key0 = (t0 + it) * KT;
    int fcls = SA_FEAT_FULL; /* FEAT: the class of this warpgroup's block of the tile */
    if constexpr (FEAT) {
      if (feat_tile_empty(p.f, b, n, m0 / 64, t0 + it, n_wg, true)) continue;
      fcls = feat_cls(p.f, b, n, wg_row0 / 64, t0 + it);
    }
    const uint32_t sk_s = sk + s * KT_BYTES, sv_s = sv + s * KT_BYTES;
    mbar_wait(bar_full(s), ((FEAT ? xs : it) / STAGES) & 1);
    if constexpr (FEAT) ++xs;
    if (MASK >= 3 && key0 + KT > kl) { /* the tile holding kv_len (CTA-uniform): keys past it may be NaN padding */
      const int tid = threadIdx.x - 128;
      zero_tile_rows(sk_s, KT, kl - key0, CB, tid, 128 * n_wg);
      zero_tile_rows(sv_s, KT, kl - key0, CB, tid, 128 * n_wg);
      named_bar_sync(1, 128 * n_wg);
    }
    if ((MASK && (it < w_a || it >= w_e)) || (FEAT && fcls == SA_FEAT_EMPTY)) { /* no key of the tile is seen
                                                                                by this warpgroup's rows */
      __syncwarp();
      if (lane == 0) mbar_arrive(bar_empty(s));
      continue;
    }
    zero(sa);
    zero(dpa);
    pin(sa);
    pin(dpa);
    wgmma_fence();
    gemm_ss<HD>(sa, sq_wg, QM, sk_s, KT); /* S = Q K^T */
    wgmma_commit();
    gemm_ss<HD>(dpa, sdo_wg, QM, sv_s, KT); /* dP = dO V^T */
    wgmma_commit();
    wgmma_wait1();
    pin(sa);
    /* keys [key0, key0 + KT) against the warpgroup's rows [wg_row0, wg_row0 + 64) */
    const bool masked = MASK && (key0 - wg_row0 - 63 < dlo || key0 + KT - 1 - wg_row0 > dhi ||
                                 (MASK >= 3 && (key0 + KT > kl || wg_row0 + 64 > ql)));
    const int *kid = reinterpret_cast<const int *>(smem_raw + (sids + s * KT * 4 - smem_u32(smem_raw))); /* MASK 4 */
    const int x0 = key0 + 2 * t - r0; /* key - row of element j = 0, e = 0 */
    /* element c (below) of row h invisible iff xh_h > -c or xl < -c */
    const int xh0 = x0 - dhi0, xh1 = x0 - dhi1, xl = x0 - dlo;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      int2 ki = make_int2(0, 0);
      if (MASK == 4) ki = *reinterpret_cast<const int2 *>(kid + 8 * j + 2 * t);
      float2 fbias[2];            /* FEAT: the bias of the pair's two keys, per row */
      uint32_t fok[2] = {3u, 3u}; /* FEAT: which of them the mask array and the positions let in, per row */
      if constexpr (FEAT) {
        const int kc = key0 + 8 * j + 2 * t;
        int2 kv = make_int2(0, 0);
        if (fcls == SA_FEAT_PARTIAL && kpos) kv = __ldg(reinterpret_cast<const int2 *>(kpos + kc));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          fbias[h] = sa_feat_bias2(p.f, fb[h], kc);
          if (fcls == SA_FEAT_PARTIAL) {
            fok[h] = sa_feat_mask2_aligned(p.f, fm[h], kc);
            if (kpos) fok[h] &= sa_feat_pos2(kv, fp[h].x, fp[h].y);
          }
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x;
        if constexpr (FEAT) {
          const float2 bv = fbias[e >> 1];
          x = ex2(sa_feat_logit2(&p.f, sa[4 * j + e], (e & 1) ? bv.y : bv.x) - lr[e >> 1]);
          if (!((fok[e >> 1] >> (e & 1)) & 1u)) x = 0.f;
        } else {
          x = ex2(fmaf(sa[4 * j + e], sl2, -lr[e >> 1]));
        }
        const int c = 8 * j + (e & 1) - 8 * (e >> 1); /* key key0 + 8j + 2t + (e & 1), row r0 + 8 (e >> 1) */
        const int xh = (e >> 1) ? xh1 : xh0;
        if (masked && (xh > -c || (MASK >= 2 && xl < -c))) x = 0.f;
        if (MASK == 4 && ((e & 1) ? ki.y : ki.x) != ((e >> 1) ? qid1 : qid0)) x = 0.f; /* another document */
        sa[4 * j + e] = x;
      }
    }
    anchor_exp2(sa, &anchor[4 * cw + warp], lane);
    wgmma_wait0();
    pin(dpa);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dpa[4 * j + e] = sa[4 * j + e] * (dpa[4 * j + e] - Dr[e >> 1]);
    if constexpr (FEAT) { /* the soft-cap's factor, then dS (of the logit) into dbias */
      if (p.f.cap > 0.f)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) dpa[4 * j + e] *= sa_feat_cap_grad(&p.f, sa[4 * j + e], lr[e >> 1]);
      if (p.f.dbias_out) feat_dbias_tile(p.f, dpa, fd, key0 + 2 * t, r0, ql, t);
    }
    pack_frag(df, dpa);
    pin(dq);
    pin(df);
    wgmma_fence();
    gemm_rs<HD>(dq, df, sk_s); /* dQ += dS K: K N-major from the same tile */
    wgmma_commit();
    wgmma_wait0();
    pin(dq);
    pin(df);
    if (MASK == 4) __syncwarp(); /* every lane read the stage's ids: the arrive releases only lane 0's reads */
    if (lane == 0) mbar_arrive(bar_empty(s));
  }

  if (MASK >= 3) /* rows past q_len: 0 (their Q / dO rows are padding, maybe NaN) */
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (r0 + 8 * h >= ql)
#pragma unroll
        for (int j = 0; j < HD / 8; ++j) dq[4 * j + 2 * h] = dq[4 * j + 2 * h + 1] = 0.f;
  store_rows<HD>(p.dq + ((size_t)b * T * p.N + n) * HD, dq, (size_t)p.N * HD, r0, t, p.scale);
#endif /* sm_90a */
}

#endif /* SA_HOPPER_BWD_TWOPASS_DQ_CUH */
