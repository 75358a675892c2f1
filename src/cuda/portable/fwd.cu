/*
 * portable/fwd.cu — the forward on mma.sync (sm_80+, every shape and mask): FlashAttention-2's online softmax,
 * GQA heads packed into one CTA's rows, K / V double-buffered by cp.async; the sink enters once, in the final
 * normalisation. Runs for plans cuda.fwd.portable (and .f32) and, with FEAT, cuda.fwd.portable.features: a bias,
 * a mask array, positions and a soft-cap (feat.h), tested per pair. docs/hopper.md.
 */
#include <type_traits>

#include "feat.cuh"
#include "launch.h"

/* F: none (the plain kernel) or sa_cuda_feat (FEAT: the feature kernel, cuda.fwd.portable.features: bf16 / f16,
   no segment ids; plan.c). */
template <typename T, int HD, class C, class... F>
__global__ void __launch_bounds__(C::NW * 32) sa_portable_fwd_kernel(const sa_cuda_params p, const F... fa) {
  constexpr int FEAT = sizeof...(F);
  const auto &f = sa_feat_arg(fa...);
  constexpr int MI = C::MI, BN = C::BN, NTH = C::NW * 32, BM = C::NW * 16 * MI, LD = HD + 8;
  constexpr int NT = BN / 8, DT = HD / 8;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t *sQ = smem, *sK = sQ + BM * LD, *sV = sK + 2 * BN * LD;

  const int64_t b = blockIdx.z, kvh = blockIdx.y;
  const int64_t nrows = p.T * p.G;
  const int64_t P0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * BM; /* longest causal blocks first */
  const int64_t P1 = P0 + BM < nrows ? P0 + BM : nrows;
  const int64_t ql = sa_dev_q_len(p, b), kl = sa_dev_kv_len(p, b);
  int t0, t1;
  int64_t lo_max, hi_min;
  sa_dev_tile_span(p, ql, kl, P0, P1, BN, &t0, &t1, &lo_max, &hi_min);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, tq = lane % 4;
  using E = typename sa_elem<T>::type;
  const E *qb = (const E *)p.q + (b * p.T * p.N + kvh * p.G) * p.H;
  const E *kb = (const E *)p.k + (b * p.S * p.K + kvh) * p.H;
  const E *vb = (const E *)p.v + (b * p.S * p.K + kvh) * p.Hv;

  /* this thread's rows: (mi, h) -> row warp*16*MI + mi*16 + gr + 8h of the block */
  int lo[MI][2], hi[MI][2]; /* T, S < 2^30 (sa_cuda_attn_supported) */
  int qseg[MI][2];
  float m[MI][2], l[MI][2];
#pragma unroll
  for (int mi = 0; mi < MI; mi++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      int64_t P = P0 + warp * 16 * MI + mi * 16 + gr + 8 * h, i = P / p.G;
      sa_krange r = sa_dev_key_range(p, ql, kl, P < nrows ? i : ql);
      lo[mi][h] = (int)r.lo;
      hi[mi][h] = (int)r.hi;
      qseg[mi][h] = (p.q_seg && P < nrows) ? p.q_seg[b * p.T + i] : 0;
      m[mi][h] = -INFINITY;
      l[mi][h] = 0.0f;
    }
  /* FEAT: this thread's rows as the feature tests read them: bias and mask row offsets, positions' key bounds */
  int64_t fbias[MI][2], fmask[MI][2];
  int32_t plo[MI][2], phi[MI][2];
  if constexpr (FEAT) {
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int64_t P = P0 + warp * 16 * MI + mi * 16 + gr + 8 * h, i = P / p.G, n = kvh * p.G + (P - i * p.G);
        const bool ok = P < nrows && i < ql;
        fbias[mi][h] = ok ? b * f.bias_b + n * f.bias_n + i * f.bias_t : 0;
        fmask[mi][h] = ok ? b * f.mask_b + n * f.mask_n + i * f.mask_t : 0;
        plo[mi][h] = 1, phi[mi][h] = 0;
        if (ok && f.q_pos) sa_feat_pos_bounds(&f, f.q_pos[b * p.T + i], &plo[mi][h], &phi[mi][h]);
      }
  }
  float acc[MI][DT][4];
#pragma unroll
  for (int mi = 0; mi < MI; mi++)
#pragma unroll
    for (int d = 0; d < DT; d++) acc[mi][d][0] = acc[mi][d][1] = acc[mi][d][2] = acc[mi][d][3] = 0.0f;

  if (t0 < t1) {
    sa_load_packed<HD, NTH>(sQ, qb, P0, BM, p.G, p.N, p.H, nrows, ql);
    sa_load_rows<HD, NTH>(sK, kb, (int64_t)t0 * BN, BN, kl, p.K * p.H, p.H);
    sa_load_rows<HD, NTH>(sV, vb, (int64_t)t0 * BN, BN, kl, p.K * p.Hv, p.Hv);
    sa_cp_async_commit();
  }
  for (int t = t0; t < t1; t++) {
    sa_cp_async_wait_all();
    __syncthreads();
    const int buf = (t - t0) & 1;
    if (t + 1 < t1) {
      sa_load_rows<HD, NTH>(sK + (buf ^ 1) * BN * LD, kb, (int64_t)(t + 1) * BN, BN, kl, p.K * p.H, p.H);
      sa_load_rows<HD, NTH>(sV + (buf ^ 1) * BN * LD, vb, (int64_t)(t + 1) * BN, BN, kl, p.K * p.Hv, p.Hv);
      sa_cp_async_commit();
    }
    const uint16_t *cK = sK + buf * BN * LD, *cV = sV + buf * BN * LD;

    /* S = Q K^T for this warp's 16*MI rows and the BN keys of the tile */
    float s[MI][NT][4];
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
      for (int n = 0; n < NT; n++) s[mi][n][0] = s[mi][n][1] = s[mi][n][2] = s[mi][n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
      uint32_t a[MI][4];
#pragma unroll
      for (int mi = 0; mi < MI; mi++)
        sa_ldmatrix_x4(a[mi], sQ + (warp * 16 * MI + mi * 16 + lane % 16) * LD + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int nn = 0; nn < NT / 2; nn++) {
        uint32_t bk[4];
        sa_ldmatrix_x4(bk, cK + (nn * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int mi = 0; mi < MI; mi++) {
          sa_mma<T>::run(s[mi][2 * nn], a[mi], bk[0], bk[1]);
          sa_mma<T>::run(s[mi][2 * nn + 1], a[mi], bk[2], bk[3]);
        }
      }
    }

    /* mask (only tiles not wholly inside every row's range), online softmax in the exp2 domain */
    const int64_t k0 = (int64_t)t * BN;
    const bool interior = !p.kv_seg && k0 >= lo_max && k0 + BN <= hi_min;
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            float x = s[mi][n][2 * h + e] * p.scale_log2;
            if constexpr (FEAT) { /* every pair tested; the logit (bias, soft-cap) only of a pair that passes */
              const int j = (int)k0 + n * 8 + 2 * tq + e;
              bool ok = j >= lo[mi][h] && j < hi[mi][h];
              if (ok && f.mask) ok = sa_feat_mask1(f, fmask[mi][h] + (int64_t)j * f.mask_s);
              if (ok && f.q_pos) ok = f.kv_pos[b * p.S + j] >= plo[mi][h] && f.kv_pos[b * p.S + j] <= phi[mi][h];
              const float bv =
                  ok && f.bias ? sa_feat_ld1(f.bias, f.bias_dtype, fbias[mi][h] + (int64_t)j * f.bias_s) : 0.0f;
              x = ok ? sa_feat_logit2(&f, s[mi][n][2 * h + e], bv) : -INFINITY;
            } else if (!interior) {
              int j = (int)k0 + n * 8 + 2 * tq + e;
              bool ok = j >= lo[mi][h] && j < hi[mi][h];
              if (ok && p.kv_seg) ok = p.kv_seg[b * p.S + j] == qseg[mi][h];
              x = ok ? x : -INFINITY;
            }
            s[mi][n][2 * h + e] = x;
            mx = fmaxf(mx, x);
          }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mnew = fmaxf(m[mi][h], mx);
        const float base = mnew == -INFINITY ? 0.0f : mnew; /* no valid key yet: keep exp2(-inf) = 0 */
        const float alpha = exp2f(m[mi][h] - base);
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            float pe = exp2f(s[mi][n][2 * h + e] - base);
            s[mi][n][2 * h + e] = pe;
            sum += pe;
          }
        l[mi][h] = l[mi][h] * alpha + sum;
        m[mi][h] = mnew;
#pragma unroll
        for (int d = 0; d < DT; d++) {
          acc[mi][d][2 * h] *= alpha;
          acc[mi][d][2 * h + 1] *= alpha;
        }
      }

      /* O += P V: P from the accumulators (see the header), V through ldmatrix.trans */
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
      uint32_t a[MI][4];
#pragma unroll
      for (int mi = 0; mi < MI; mi++) {
        a[mi][0] = sa_mma<T>::pack(s[mi][2 * kk][0], s[mi][2 * kk][1]);
        a[mi][1] = sa_mma<T>::pack(s[mi][2 * kk][2], s[mi][2 * kk][3]);
        a[mi][2] = sa_mma<T>::pack(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
        a[mi][3] = sa_mma<T>::pack(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dd = 0; dd < DT / 2; dd++) {
        uint32_t bv[4];
        sa_ldmatrix_x4_trans(bv, cV + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dd * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int mi = 0; mi < MI; mi++) {
          sa_mma<T>::run(acc[mi][2 * dd], a[mi], bv[0], bv[1]);
          sa_mma<T>::run(acc[mi][2 * dd + 1], a[mi], bv[2], bv[3]);
        }
      }
    }
  }

  /* final normalisation, the one place the sink enters */
#pragma unroll
  for (int mi = 0; mi < MI; mi++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      int64_t P = P0 + warp * 16 * MI + mi * 16 + gr + 8 * h;
      float lsum = l[mi][h];
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
      if (P >= nrows) continue;
      int64_t i = P / p.G, n = kvh * p.G + (P - i * p.G);
      float a = p.softmax == 2 ? p.sinks[n] : p.softmax == 1 ? 0.0f : -INFINITY, f = 0.0f, lse = a;
      if (i < ql && m[mi][h] != -INFINITY) { /* else no valid key: out = 0, lse = a exactly */
        /* The larger of m and a contributes 2^0 = 1 exactly (no inf - inf for a = +inf); lse is
           formed from the larger one in the natural-log domain, so a dominant sink (1e4, +inf) gives
           lse = a exactly and a NaN sink gives NaN. */
        const float a2 = a * SA_LOG2E, mm = m[mi][h];
        const bool sink_max = a2 >= mm;
        const float w = sink_max ? exp2f(mm - a2) : 1.0f;
        const float ltot = lsum * w + (sink_max ? 1.0f : exp2f(a2 - mm));
        f = w / ltot;
        lse = (sink_max ? a : mm * SA_LN2) + logf(ltot);
      }
      E *o = (E *)p.out + ((b * p.T + i) * p.N + n) * p.Hv;
#pragma unroll
      for (int d = 0; d < DT; d++) {
        int col = d * 8 + 2 * tq;
        if (col < p.Hv) sa_mma<T>::store2(o, col, acc[mi][d][2 * h] * f, acc[mi][d][2 * h + 1] * f);
      }
      if (p.lse && tq == 0) p.lse[(b * p.N + n) * p.T + i] = lse;
    }
}

template <typename T, int HD, class C>
static cudaError_t sa_fwd_run(const sa_cuda_params &p, const sa_cuda_feat *f, cudaStream_t st) {
  constexpr int BM = C::NW * 16 * C::MI;
  size_t smem = (size_t)(BM + 4 * C::BN) * (HD + 8) * sizeof(uint16_t);
  dim3 grid((unsigned)((p.T * p.G + BM - 1) / BM), (unsigned)p.K, (unsigned)p.B);
  cudaError_t e;
  if constexpr (!std::is_same<T, sa_f32in>::value) {
    if (f) {
      /* the feature instantiation (a pack of one sa_cuda_feat: named by a cast) */
      const void *kf = (const void *)(void (*)(const sa_cuda_params,
                                               const sa_cuda_feat))sa_portable_fwd_kernel<T, HD, C, sa_cuda_feat>;
      e = cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
      if (e != cudaSuccess) return e;
      sa_portable_fwd_kernel<T, HD, C, sa_cuda_feat><<<grid, C::NW * 32, smem, st>>>(p, *f);
      return cudaGetLastError();
    }
  }
  void (*k)(const sa_cuda_params) = sa_portable_fwd_kernel<T, HD, C>; /* the plain one: an empty pack */
  e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return e;
  k<<<grid, C::NW * 32, smem, st>>>(p);
  return cudaGetLastError();
}

template <typename T>
static cudaError_t sa_fwd_dim(const sa_cuda_params &p, const sa_cuda_feat *f, int hd, cudaStream_t st) {
  switch (hd) {
    case 32: return sa_fwd_run<T, 32, sa_tile<32>::FWD>(p, f, st);
    case 64: return sa_fwd_run<T, 64, sa_tile<64>::FWD>(p, f, st);
    case 128: return sa_fwd_run<T, 128, sa_tile<128>::FWD>(p, f, st);
    default: return sa_fwd_run<T, 256, sa_tile<256>::FWD>(p, f, st);
  }
}

cudaError_t sa_cuda_fwd_launch(const sa_cuda_params &p, const sa_cuda_feat *f, int dtype, int hd, cudaStream_t st) {
  return dtype == SA_BF16  ? sa_fwd_dim<__nv_bfloat16>(p, f, hd, st)
         : dtype == SA_F16 ? sa_fwd_dim<__half>(p, f, hd, st)
                           : sa_fwd_dim<sa_f32in>(p, nullptr, hd, st);
}
