/*
 * portable/bwd.cu — the backward on mma.sync (sm_80+): the preprocess (D, lse2, the sink-gradient partials), dK/dV
 * and dQ without atomics, and the fixed-order sink reduction. The preprocess and the reduction run for every
 * backward plan; dK/dV and dQ for cuda.bwd.portable. docs/hopper.md.
 */
#include <type_traits>

#include "feat.cuh"
#include "launch.h"

/* ---- 1. preprocess -------------------------------------------------------------------------------- */

template <typename T>
__global__ void __launch_bounds__(SA_NT) sa_bwd_pre_kernel(const sa_cuda_params p) {
  __shared__ float part[SA_PRE_ROWS];
  const int64_t b = blockIdx.z, n = blockIdx.y, i0 = (int64_t)blockIdx.x * SA_PRE_ROWS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < SA_PRE_ROWS; r += SA_NW) {
    int64_t i = i0 + r;
    float c = 0.0f;
    if (i < p.T) {
      const int64_t off = ((b * p.T + i) * p.N + n) * p.Hv;
      float d = 0.0f;
      for (int64_t x = lane; x < p.Hv; x += 32) d += sa_mma<T>::load(p.dout, off + x) * sa_mma<T>::load(p.out, off + x);
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) d += __shfl_xor_sync(0xffffffffu, d, s);
      const int64_t li = (b * p.N + n) * p.T + i;
      if (p.dlse) d -= p.dlse[li];
      /* lse = -inf only for a vanilla row without keys, which has no gradient; a = lse (a +inf sink,
         or a row whose only mass is the sink) is weight 1 exactly, as in the reference */
      const float a = p.softmax == 2 ? p.sinks[n] : 0.0f, l = p.lse[li];
      if (lane == 0) {
        p.D[li] = d;
        /* the Hopper kernels take P = exp2(s * scale * log2(e) - lse2): lse2 = +inf makes an empty row's P 0 */
        if (p.lse2) p.lse2[li] = l == -INFINITY ? INFINITY : l * SA_LOG2E;
      }
      if (p.softmax == 2 && l != -INFINITY) c = -(a == l ? 1.0f : expf(a - l)) * d;
    }
    if (lane == 0) part[r] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0 && p.dsink_part) {
    float s = 0.0f;
    for (int r = 0; r < SA_PRE_ROWS; r++) s += part[r];
    p.dsink_part[(b * p.N + n) * p.nqb + blockIdx.x] = s;
  }
}

/* The vector form of 1, for 16-byte aligned dout / out with Hv = 8 TPR: each thread loads 8 elements (16 bytes)
   of dout and of out per row, TPR threads a row, SA_NT / TPR rows a pass, every pass's loads issued before the
   first sum. The scalar form above reads 2 bytes a lane and a row a warp at a time: 0.16 ms for the 134 MB of
   B4 T4096 N32 H64 (ncu on the H200, 0.84 TB/s of 4.8), 3% of that backward. Same D, lse2 and partials up to the
   order of the fp32 sum over Hv. */
__device__ __forceinline__ float2 sa_f2(uint32_t w, __nv_bfloat16) { /* two bf16: the high halves of fp32 */
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ float2 sa_f2(uint32_t w, __half) {
  return __half22float2(*reinterpret_cast<const __half2 *>(&w));
}
template <typename T>
__device__ __forceinline__ float sa_dot8(uint4 a, uint4 b) {
  const uint32_t x[4] = {a.x, a.y, a.z, a.w}, y[4] = {b.x, b.y, b.z, b.w};
  float d = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 u = sa_f2(x[k], T()), v = sa_f2(y[k], T());
    d = fmaf(u.x, v.x, d);
    d = fmaf(u.y, v.y, d);
  }
  return d;
}

template <typename T, int TPR>
__global__ void __launch_bounds__(SA_NT) sa_bwd_pre_vec_kernel(const sa_cuda_params p) {
  constexpr int RPP = SA_NT / TPR, PASSES = SA_PRE_ROWS / RPP; /* rows per pass, passes per CTA */
  static_assert(SA_PRE_ROWS % RPP == 0 && TPR <= 32, "a row's threads inside one warp");
  __shared__ float part[SA_PRE_ROWS];
  const int64_t b = blockIdx.z, n = blockIdx.y, i0 = (int64_t)blockIdx.x * SA_PRE_ROWS;
  const int sub = threadIdx.x % TPR, rr = threadIdx.x / TPR;
  uint4 dv[PASSES], ov[PASSES];
#pragma unroll
  for (int k = 0; k < PASSES; ++k) {
    const int64_t i = i0 + rr + k * RPP;
    dv[k] = ov[k] = make_uint4(0u, 0u, 0u, 0u);
    if (i < p.T) {
      const int64_t off = ((b * p.T + i) * p.N + n) * p.Hv + sub * 8;
      dv[k] = __ldg(reinterpret_cast<const uint4 *>(reinterpret_cast<const uint16_t *>(p.dout) + off));
      ov[k] = __ldg(reinterpret_cast<const uint4 *>(reinterpret_cast<const uint16_t *>(p.out) + off));
    }
  }
#pragma unroll
  for (int k = 0; k < PASSES; ++k) {
    float d = sa_dot8<T>(dv[k], ov[k]);
#pragma unroll
    for (int s = TPR / 2; s > 0; s >>= 1) d += __shfl_xor_sync(0xffffffffu, d, s);
    const int r = rr + k * RPP;
    const int64_t i = i0 + r;
    float c = 0.0f;
    if (i < p.T) { /* as in the scalar form */
      const int64_t li = (b * p.N + n) * p.T + i;
      if (p.dlse) d -= p.dlse[li];
      const float a = p.softmax == 2 ? p.sinks[n] : 0.0f, l = p.lse[li];
      if (sub == 0) {
        p.D[li] = d;
        if (p.lse2) p.lse2[li] = l == -INFINITY ? INFINITY : l * SA_LOG2E;
      }
      if (p.softmax == 2 && l != -INFINITY) c = -(a == l ? 1.0f : expf(a - l)) * d;
    }
    if (sub == 0) part[r] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0 && p.dsink_part) {
    float s = 0.0f;
    for (int r = 0; r < SA_PRE_ROWS; r++) s += part[r];
    p.dsink_part[(b * p.N + n) * p.nqb + blockIdx.x] = s;
  }
}

/* ---- 2. dK, dV ---------------------------------------------------------------------------------------
 * Warp w owns keys k0 + 16w .. +15 and works on transposed tiles: S^T = K Q^T (16 keys x BQ queries),
 * P^T = exp2(S^T - lse), dP^T = V dO^T, dS^T = P^T (dP^T - D); then dV += P^T dO and dK += dS^T Q take
 * P^T / dS^T straight from the accumulators as A fragments. HD 256 runs as two CTAs per key block,
 * each accumulating one half (HDA = 128 columns) of dK and dV. FEAT (cuda.bwd.portable.features): the mask array,
 * the positions and the soft-cap (feat.h) per pair, each query tile's mask rows and position bounds beside its key
 * ranges in shared memory; no bias (dbias), no segment ids (plan.c). */
template <int HD>
constexpr size_t sa_dkdv_feat_smem() {
  return (size_t)2 * sa_tile<HD>::BQ * (4 + 4 + 8);
}

template <typename T, int HD, class... F>
__global__ void __launch_bounds__(SA_NT) sa_portable_dkdv_kernel(const sa_cuda_params p, const F... fa) {
  constexpr int FEAT = sizeof...(F);
  const auto &f = sa_feat_arg(fa...);
  constexpr int BQ = sa_tile<HD>::BQ, DS = sa_tile<HD>::DSPLIT, HDA = HD / DS, BN = SA_NW * 16;
  constexpr int LD = HD + 8, NT = BQ / 8, AT = HDA / 8;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t *sK = smem, *sV = sK + BN * LD, *sQ = sV + BN * LD, *sO = sQ + 2 * BQ * LD;
  int *sLo = (int *)(sO + 2 * BQ * LD), *sHi = sLo + 2 * BQ, *sSeg = sHi + 2 * BQ;
  float *sLse = (float *)(sSeg + 2 * BQ), *sD = sLse + 2 * BQ;
  int32_t *sPlo = (int32_t *)(sD + 2 * BQ), *sPhi = sPlo + 2 * BQ; /* FEAT: sa_dkdv_feat_smem bytes */
  int64_t *sFm = (int64_t *)(sPhi + 2 * BQ);

  const int64_t b = blockIdx.z, kvh = blockIdx.y, kblk = blockIdx.x / DS, dcol0 = (blockIdx.x % DS) * HDA;
  const int64_t k0 = kblk * BN, nrows = p.T * p.G;
  const int64_t ql = sa_dev_q_len(p, b), kl = sa_dev_kv_len(p, b);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, tq = lane % 4;
  using E = typename sa_elem<T>::type;
  const E *qb = (const E *)p.q + (b * p.T * p.N + kvh * p.G) * p.H;
  const E *ob = (const E *)p.dout + (b * p.T * p.N + kvh * p.G) * p.Hv;

  /* Queries that can see a key of [k0, k0 + BN): hi(i) > k0 and lo(i) < k0 + BN, with lo and hi the
     unclamped bounds of sa_dev_key_range (a superset is harmless: the per-element mask is exact). */
  int64_t i_beg = 0, i_end = k0 < kl ? ql : 0;
  {
    int64_t big = ql + kl + (p.diag_offset < 0 ? -p.diag_offset : p.diag_offset) + 1; /* as sa_dev_key_range */
    int64_t wl = p.wl > big ? big : p.wl, wr = p.wr > big ? big : p.wr;
    int64_t off = (p.causal == 2 ? kl - ql : 0) + p.diag_offset;
    if (p.causal != 0 && k0 - off > i_beg) i_beg = k0 - off;
    if (wr >= 0 && k0 - off - wr > i_beg) i_beg = k0 - off - wr;
    if (wl >= 0 && k0 + BN - off + wl < i_end) i_end = k0 + BN - off + wl;
  }
  int qt0 = 0, qt1 = 0;
  if (i_beg < i_end) { /* then 0 <= i_beg < i_end <= ql < 2^30 */
    qt0 = (int)(i_beg * p.G / BQ);
    qt1 = (int)((i_end * p.G + BQ - 1) / BQ);
  }

  float dk[AT][4], dv[AT][4];
#pragma unroll
  for (int d = 0; d < AT; d++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = 0.0f;
  int jk[2], kseg[2], kpos[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    jk[h] = (int)(k0 + warp * 16 + gr + 8 * h);
    kseg[h] = (p.kv_seg && jk[h] < p.S) ? p.kv_seg[b * p.S + jk[h]] : 0;
    if constexpr (FEAT) kpos[h] = (f.kv_pos && jk[h] < p.S) ? f.kv_pos[b * p.S + jk[h]] : 0;
  }

  /* column data of a query tile: key range, segment, lse (exp2 domain) and D of each packed row */
  auto load_tile = [&](int qt, int buf) {
    const int64_t P0 = (int64_t)qt * BQ;
    sa_load_packed<HD>(sQ + buf * BQ * LD, qb, P0, BQ, p.G, p.N, p.H, nrows, ql);
    sa_load_packed<HD>(sO + buf * BQ * LD, ob, P0, BQ, p.G, p.N, p.Hv, nrows, ql);
    for (int r = threadIdx.x; r < BQ; r += SA_NT) {
      const unsigned P = (unsigned)(P0 + r), i = P / (unsigned)p.G; /* < 2^31 + BQ, G < 2^16 */
      const int64_t n = kvh * p.G + (P - i * (unsigned)p.G);
      bool ok = P < nrows && i < ql;
      sa_krange kr = sa_dev_key_range(p, ql, kl, ok ? i : ql);
      float lse = ok ? p.lse[(b * p.N + n) * p.T + i] : 0.0f;
      if (lse == -INFINITY) kr.hi = kr.lo; /* defensive: such a row has no valid key */
      sLo[buf * BQ + r] = (int)kr.lo;
      sHi[buf * BQ + r] = (int)kr.hi;
      sSeg[buf * BQ + r] = (ok && p.q_seg) ? p.q_seg[b * p.T + i] : 0;
      sLse[buf * BQ + r] = lse * SA_LOG2E;
      sD[buf * BQ + r] = ok ? p.D[(b * p.N + n) * p.T + i] : 0.0f;
      if constexpr (FEAT) {
        int32_t lo = 1, hi = 0;
        if (ok && f.q_pos) sa_feat_pos_bounds(&f, f.q_pos[b * p.T + i], &lo, &hi);
        sPlo[buf * BQ + r] = lo;
        sPhi[buf * BQ + r] = hi;
        sFm[buf * BQ + r] = ok ? b * f.mask_b + n * f.mask_n + (int64_t)i * f.mask_t : 0;
      }
    }
  };

  sa_load_rows<HD>(sK, (const E *)p.k + (b * p.S * p.K + kvh) * p.H, k0, BN, kl, p.K * p.H, p.H);
  sa_load_rows<HD>(sV, (const E *)p.v + (b * p.S * p.K + kvh) * p.Hv, k0, BN, kl, p.K * p.Hv, p.Hv);
  if (qt0 < qt1) load_tile(qt0, 0);
  sa_cp_async_commit();

  for (int qt = qt0; qt < qt1; qt++) {
    sa_cp_async_wait_all();
    __syncthreads();
    const int buf = (qt - qt0) & 1;
    if (qt + 1 < qt1) {
      load_tile(qt + 1, buf ^ 1);
      sa_cp_async_commit();
    }
    const uint16_t *cQ = sQ + buf * BQ * LD, *cO = sO + buf * BQ * LD;

    /* S^T = K Q^T and dP^T = V dO^T over the full (padded) head dim */
    float s[NT][4], dp[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
      uint32_t ak[4], av[4];
      sa_ldmatrix_x4(ak, sK + (warp * 16 + lane % 16) * LD + kk * 16 + (lane / 16) * 8);
      sa_ldmatrix_x4(av, sV + (warp * 16 + lane % 16) * LD + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int nn = 0; nn < NT / 2; nn++) {
        const int roff = (nn * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kk * 16 + ((lane >> 3) & 1) * 8;
        uint32_t bq[4], bo[4];
        sa_ldmatrix_x4(bq, cQ + roff);
        sa_ldmatrix_x4(bo, cO + roff);
        sa_mma<T>::run(s[2 * nn], ak, bq[0], bq[1]);
        sa_mma<T>::run(s[2 * nn + 1], ak, bq[2], bq[3]);
        sa_mma<T>::run(dp[2 * nn], av, bo[0], bo[1]);
        sa_mma<T>::run(dp[2 * nn + 1], av, bo[2], bo[3]);
      }
    }
    /* P^T and dS^T (in place of s and dp); element (h, e) of n-tile n is key jk[h], query col n*8+2tq+e */
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int c = buf * BQ + n * 8 + 2 * tq + e;
          bool ok = jk[h] >= sLo[c] && jk[h] < sHi[c];
          if (p.kv_seg) ok = ok && kseg[h] == sSeg[c];
          if constexpr (FEAT) {
            if (ok && f.mask) ok = sa_feat_mask1(f, sFm[c] + (int64_t)jk[h] * f.mask_s);
            if (ok && f.q_pos) ok = kpos[h] >= sPlo[c] && kpos[h] <= sPhi[c];
            const float pe = ok ? exp2f(sa_feat_logit2(&f, s[n][2 * h + e], 0.0f) - sLse[c]) : 0.0f;
            s[n][2 * h + e] = pe;
            dp[n][2 * h + e] = pe * (dp[n][2 * h + e] - sD[c]) * sa_feat_cap_grad(&f, pe, sLse[c]);
            continue;
          }
          float pe = ok ? exp2f(s[n][2 * h + e] * p.scale_log2 - sLse[c]) : 0.0f;
          s[n][2 * h + e] = pe;
          dp[n][2 * h + e] = pe * (dp[n][2 * h + e] - sD[c]);
        }
        /* dV += P^T dO, dK += dS^T Q over this CTA's HDA columns; B operands through ldmatrix.trans */
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++) {
      uint32_t ap[4], ad[4];
      ap[0] = sa_mma<T>::pack(s[2 * kk][0], s[2 * kk][1]);
      ap[1] = sa_mma<T>::pack(s[2 * kk][2], s[2 * kk][3]);
      ap[2] = sa_mma<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      ap[3] = sa_mma<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      ad[0] = sa_mma<T>::pack(dp[2 * kk][0], dp[2 * kk][1]);
      ad[1] = sa_mma<T>::pack(dp[2 * kk][2], dp[2 * kk][3]);
      ad[2] = sa_mma<T>::pack(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
      ad[3] = sa_mma<T>::pack(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
#pragma unroll
      for (int dd = 0; dd < AT / 2; dd++) {
        const int roff = (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dcol0 + dd * 16 + (lane >> 4) * 8;
        uint32_t bo[4], bq[4];
        sa_ldmatrix_x4_trans(bo, cO + roff);
        sa_ldmatrix_x4_trans(bq, cQ + roff);
        sa_mma<T>::run(dv[2 * dd], ap, bo[0], bo[1]);
        sa_mma<T>::run(dv[2 * dd + 1], ap, bo[2], bo[3]);
        sa_mma<T>::run(dk[2 * dd], ad, bq[0], bq[1]);
        sa_mma<T>::run(dk[2 * dd + 1], ad, bq[2], bq[3]);
      }
    }
  }

  /* every key row of the block is written, zeros included (keys no query sees) */
#pragma unroll
  for (int h = 0; h < 2; h++) {
    if (jk[h] >= p.S) continue;
    E *dkr = (E *)p.dk + ((b * p.S + jk[h]) * p.K + kvh) * p.H;
    E *dvr = (E *)p.dv + ((b * p.S + jk[h]) * p.K + kvh) * p.Hv;
#pragma unroll
    for (int d = 0; d < AT; d++) {
      const int col = (int)dcol0 + d * 8 + 2 * tq;
      if (col < p.H) sa_mma<T>::store2(dkr, col, dk[d][2 * h] * p.scale, dk[d][2 * h + 1] * p.scale);
      if (col < p.Hv) sa_mma<T>::store2(dvr, col, dv[d][2 * h], dv[d][2 * h + 1]);
    }
  }
}

/* ---- 3. dQ ---------------------------------------------------------------------------------------------
 * The forward's structure with 16 rows per warp: S = Q K^T, P = exp2(S - lse), dP = dO V^T,
 * dS = P (dP - D), dQ += dS K (K through ldmatrix.trans). FEAT: as in dK/dV, each row's mask offset and position
 * bounds in registers. */
template <typename T, int HD, class... F>
__global__ void __launch_bounds__(SA_NT) sa_portable_dq_kernel(const sa_cuda_params p, const F... fa) {
  constexpr int FEAT = sizeof...(F);
  const auto &f = sa_feat_arg(fa...);
  constexpr int BN = sa_tile<HD>::DQ_BN, BM = SA_NW * 16, LD = HD + 8, NT = BN / 8, DT = HD / 8;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t *sQ = smem, *sO = sQ + BM * LD, *sK = sO + BM * LD, *sV = sK + 2 * BN * LD;

  const int64_t b = blockIdx.z, kvh = blockIdx.y, nrows = p.T * p.G;
  const int64_t P0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * BM;
  const int64_t P1 = P0 + BM < nrows ? P0 + BM : nrows;
  const int64_t ql = sa_dev_q_len(p, b), kl = sa_dev_kv_len(p, b);
  int t0, t1;
  int64_t lo_max, hi_min;
  sa_dev_tile_span(p, ql, kl, P0, P1, BN, &t0, &t1, &lo_max, &hi_min);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, tq = lane % 4;
  using E = typename sa_elem<T>::type;
  const E *kb = (const E *)p.k + (b * p.S * p.K + kvh) * p.H;
  const E *vb = (const E *)p.v + (b * p.S * p.K + kvh) * p.Hv;

  int lo[2], hi[2], qseg[2];
  float lse2[2], Dr[2];
  int64_t fmask[2];       /* FEAT */
  int32_t plo[2], phi[2]; /* FEAT */
#pragma unroll
  for (int h = 0; h < 2; h++) {
    int64_t P = P0 + warp * 16 + gr + 8 * h, i = P / p.G, n = kvh * p.G + (P - i * p.G);
    bool ok = P < nrows && i < ql;
    sa_krange r = sa_dev_key_range(p, ql, kl, ok ? i : ql);
    lse2[h] = ok ? p.lse[(b * p.N + n) * p.T + i] * SA_LOG2E : 0.0f;
    if (lse2[h] == -INFINITY) r.hi = r.lo; /* defensive: such a row has no valid key */
    lo[h] = (int)r.lo;
    hi[h] = (int)r.hi;
    qseg[h] = (ok && p.q_seg) ? p.q_seg[b * p.T + i] : 0;
    Dr[h] = ok ? p.D[(b * p.N + n) * p.T + i] : 0.0f;
    if constexpr (FEAT) {
      fmask[h] = ok ? b * f.mask_b + n * f.mask_n + i * f.mask_t : 0;
      plo[h] = 1, phi[h] = 0;
      if (ok && f.q_pos) sa_feat_pos_bounds(&f, f.q_pos[b * p.T + i], &plo[h], &phi[h]);
    }
  }
  float acc[DT][4];
#pragma unroll
  for (int d = 0; d < DT; d++) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;

  if (t0 < t1) {
    sa_load_packed<HD>(sQ, (const E *)p.q + (b * p.T * p.N + kvh * p.G) * p.H, P0, BM, p.G, p.N, p.H, nrows, ql);
    sa_load_packed<HD>(sO, (const E *)p.dout + (b * p.T * p.N + kvh * p.G) * p.Hv, P0, BM, p.G, p.N, p.Hv, nrows, ql);
    sa_load_rows<HD>(sK, kb, (int64_t)t0 * BN, BN, kl, p.K * p.H, p.H);
    sa_load_rows<HD>(sV, vb, (int64_t)t0 * BN, BN, kl, p.K * p.Hv, p.Hv);
    sa_cp_async_commit();
  }
  for (int t = t0; t < t1; t++) {
    sa_cp_async_wait_all();
    __syncthreads();
    const int buf = (t - t0) & 1;
    if (t + 1 < t1) {
      sa_load_rows<HD>(sK + (buf ^ 1) * BN * LD, kb, (int64_t)(t + 1) * BN, BN, kl, p.K * p.H, p.H);
      sa_load_rows<HD>(sV + (buf ^ 1) * BN * LD, vb, (int64_t)(t + 1) * BN, BN, kl, p.K * p.Hv, p.Hv);
      sa_cp_async_commit();
    }
    const uint16_t *cK = sK + buf * BN * LD, *cV = sV + buf * BN * LD;
    float s[NT][4], dp[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
      uint32_t aq[4], ao[4];
      sa_ldmatrix_x4(aq, sQ + (warp * 16 + lane % 16) * LD + kk * 16 + (lane / 16) * 8);
      sa_ldmatrix_x4(ao, sO + (warp * 16 + lane % 16) * LD + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int nn = 0; nn < NT / 2; nn++) {
        const int roff = (nn * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kk * 16 + ((lane >> 3) & 1) * 8;
        uint32_t bk[4], bv[4];
        sa_ldmatrix_x4(bk, cK + roff);
        sa_ldmatrix_x4(bv, cV + roff);
        sa_mma<T>::run(s[2 * nn], aq, bk[0], bk[1]);
        sa_mma<T>::run(s[2 * nn + 1], aq, bk[2], bk[3]);
        sa_mma<T>::run(dp[2 * nn], ao, bv[0], bv[1]);
        sa_mma<T>::run(dp[2 * nn + 1], ao, bv[2], bv[3]);
      }
    }
    const int64_t k0 = (int64_t)t * BN;
    const bool interior = !p.kv_seg && k0 >= lo_max && k0 + BN <= hi_min;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int h = 0; h < 2; h++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          bool ok = true;
          if constexpr (FEAT) {
            const int j = (int)k0 + n * 8 + 2 * tq + e;
            ok = j >= lo[h] && j < hi[h];
            if (ok && f.mask) ok = sa_feat_mask1(f, fmask[h] + (int64_t)j * f.mask_s);
            if (ok && f.q_pos) ok = f.kv_pos[b * p.S + j] >= plo[h] && f.kv_pos[b * p.S + j] <= phi[h];
            const float pe = ok ? exp2f(sa_feat_logit2(&f, s[n][2 * h + e], 0.0f) - lse2[h]) : 0.0f;
            dp[n][2 * h + e] = pe * (dp[n][2 * h + e] - Dr[h]) * sa_feat_cap_grad(&f, pe, lse2[h]);
            continue;
          }
          if (!interior) {
            const int j = (int)k0 + n * 8 + 2 * tq + e;
            ok = j >= lo[h] && j < hi[h];
            if (ok && p.kv_seg) ok = p.kv_seg[b * p.S + j] == qseg[h];
          }
          float pe = ok ? exp2f(s[n][2 * h + e] * p.scale_log2 - lse2[h]) : 0.0f;
          dp[n][2 * h + e] = pe * (dp[n][2 * h + e] - Dr[h]);
        }
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
      uint32_t a[4];
      a[0] = sa_mma<T>::pack(dp[2 * kk][0], dp[2 * kk][1]);
      a[1] = sa_mma<T>::pack(dp[2 * kk][2], dp[2 * kk][3]);
      a[2] = sa_mma<T>::pack(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
      a[3] = sa_mma<T>::pack(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
#pragma unroll
      for (int dd = 0; dd < DT / 2; dd++) {
        uint32_t bk[4];
        sa_ldmatrix_x4_trans(bk, cK + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dd * 16 + (lane >> 4) * 8);
        sa_mma<T>::run(acc[2 * dd], a, bk[0], bk[1]);
        sa_mma<T>::run(acc[2 * dd + 1], a, bk[2], bk[3]);
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; h++) {
    int64_t P = P0 + warp * 16 + gr + 8 * h;
    if (P >= nrows) continue;
    int64_t i = P / p.G, n = kvh * p.G + (P - i * p.G);
    E *o = (E *)p.dq + ((b * p.T + i) * p.N + n) * p.H;
#pragma unroll
    for (int d = 0; d < DT; d++) {
      const int col = d * 8 + 2 * tq;
      if (col < p.H) sa_mma<T>::store2(o, col, acc[d][2 * h] * p.scale, acc[d][2 * h + 1] * p.scale);
    }
  }
}

/* ---- 4. dsinks: one warp per head; lane l sums the partials qb = l, l + 32, ... of each b in order, then a
   fixed xor tree: the same order every call (deterministic), and 32 loads in flight where one thread per head
   has one (ncu on the H200 at B4 T4096 N32: ~8 us, against 23 us for 256 dependent loads a head). ---------- */
__global__ void sa_bwd_dsink_kernel(const sa_cuda_params p) {
  const int64_t n = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= p.N) return; /* warp-uniform */
  float s = 0.0f;
  for (int64_t b = 0; b < p.B; b++)
    for (int64_t qb = lane; qb < p.nqb; qb += 32) s += p.dsink_part[(b * p.N + n) * p.nqb + qb];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) p.dsinks[n] = s;
}

/* ---- launch ------------------------------------------------------------------------------------------
 * Three entry points, so that attn.cu can put the Hopper dK/dV and dQ between 1 and 4. */

template <typename T>
static cudaError_t sa_bwd_pre_run(const sa_cuda_params &p, cudaStream_t st) {
  if (p.B > 0 && p.T > 0) {
    dim3 g((unsigned)((p.T + SA_PRE_ROWS - 1) / SA_PRE_ROWS), (unsigned)p.N, (unsigned)p.B);
    if constexpr (std::is_same<T, sa_f32in>::value) { /* the vector form reads 16-bit pairs */
      sa_bwd_pre_kernel<T><<<g, SA_NT, 0, st>>>(p);
    } else {
      const bool vec = ((uintptr_t)p.dout | (uintptr_t)p.out) % 16 == 0 && p.Hv % 8 == 0;
      if (vec && p.Hv == 32) sa_bwd_pre_vec_kernel<T, 4><<<g, SA_NT, 0, st>>>(p);
      else if (vec && p.Hv == 64) sa_bwd_pre_vec_kernel<T, 8><<<g, SA_NT, 0, st>>>(p);
      else if (vec && p.Hv == 128) sa_bwd_pre_vec_kernel<T, 16><<<g, SA_NT, 0, st>>>(p);
      else if (vec && p.Hv == 256) sa_bwd_pre_vec_kernel<T, 32><<<g, SA_NT, 0, st>>>(p);
      else sa_bwd_pre_kernel<T><<<g, SA_NT, 0, st>>>(p);
    }
    return cudaGetLastError();
  }
  return cudaSuccess;
}

template <typename T, int HD>
static cudaError_t sa_bwd_run(const sa_cuda_params &p, const sa_cuda_feat *f, cudaStream_t st) {
  constexpr int BQ = sa_tile<HD>::BQ, DS = sa_tile<HD>::DSPLIT, BNK = SA_NW * 16, BNQ = sa_tile<HD>::DQ_BN;
  constexpr bool F32 = std::is_same<T, sa_f32in>::value; /* the feature kernels take 16-bit inputs */
  cudaError_t e;
  if (p.B > 0 && p.S > 0) {
    size_t smem = (size_t)(2 * BNK + 4 * BQ) * (HD + 8) * sizeof(uint16_t) + (size_t)2 * BQ * 5 * 4;
    dim3 g((unsigned)(((p.S + BNK - 1) / BNK) * DS), (unsigned)p.K, (unsigned)p.B);
    if constexpr (!F32) {
      if (f) {
        smem += sa_dkdv_feat_smem<HD>();
        /* the feature instantiation (a pack of one sa_cuda_feat: named by a cast) */
        const void *kf = (const void *)(void (*)(const sa_cuda_params,
                                                 const sa_cuda_feat))sa_portable_dkdv_kernel<T, HD, sa_cuda_feat>;
        e = cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        sa_portable_dkdv_kernel<T, HD, sa_cuda_feat><<<g, SA_NT, smem, st>>>(p, *f);
      }
    }
    if (F32 || !f) {
      void (*k)(const sa_cuda_params) = sa_portable_dkdv_kernel<T, HD>; /* the plain one: an empty pack */
      e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
      if (e != cudaSuccess) return e;
      k<<<g, SA_NT, smem, st>>>(p);
    }
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  if (p.B > 0 && p.T > 0) {
    size_t smem = (size_t)(2 * SA_NW * 16 + 4 * BNQ) * (HD + 8) * sizeof(uint16_t);
    dim3 g((unsigned)((p.T * p.G + SA_NW * 16 - 1) / (SA_NW * 16)), (unsigned)p.K, (unsigned)p.B);
    if constexpr (!F32) {
      if (f) {
        /* the feature instantiation (a pack of one sa_cuda_feat: named by a cast) */
        const void *kf = (const void *)(void (*)(const sa_cuda_params,
                                                 const sa_cuda_feat))sa_portable_dq_kernel<T, HD, sa_cuda_feat>;
        e = cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        sa_portable_dq_kernel<T, HD, sa_cuda_feat><<<g, SA_NT, smem, st>>>(p, *f);
      }
    }
    if (F32 || !f) {
      void (*k)(const sa_cuda_params) = sa_portable_dq_kernel<T, HD>;
      e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
      if (e != cudaSuccess) return e;
      k<<<g, SA_NT, smem, st>>>(p);
    }
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <typename T>
static cudaError_t sa_bwd_dim(const sa_cuda_params &p, const sa_cuda_feat *f, int hd, cudaStream_t st) {
  switch (hd) {
    case 32: return sa_bwd_run<T, 32>(p, f, st);
    case 64: return sa_bwd_run<T, 64>(p, f, st);
    case 128: return sa_bwd_run<T, 128>(p, f, st);
    default: return sa_bwd_run<T, 256>(p, f, st);
  }
}

cudaError_t sa_cuda_bwd_pre_launch(const sa_cuda_params &p, int dtype, cudaStream_t st) {
  return dtype == SA_BF16  ? sa_bwd_pre_run<__nv_bfloat16>(p, st)
         : dtype == SA_F16 ? sa_bwd_pre_run<__half>(p, st)
                           : sa_bwd_pre_run<sa_f32in>(p, st);
}

cudaError_t sa_cuda_bwd_dkdv_dq_launch(const sa_cuda_params &p, const sa_cuda_feat *f, int dtype, int hd,
                                       cudaStream_t st) {
  return dtype == SA_BF16  ? sa_bwd_dim<__nv_bfloat16>(p, f, hd, st)
         : dtype == SA_F16 ? sa_bwd_dim<__half>(p, f, hd, st)
                           : sa_bwd_dim<sa_f32in>(p, nullptr, hd, st);
}

cudaError_t sa_cuda_bwd_dsink_launch(const sa_cuda_params &p, cudaStream_t st) {
  if (!p.dsinks) return cudaSuccess;
  sa_bwd_dsink_kernel<<<(unsigned)((p.N + 3) / 4), 128, 0, st>>>(p); /* 4 heads (warps) a CTA */
  return cudaGetLastError();
}
