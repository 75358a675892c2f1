/*
 * decode/mma.cu — the split kernel of plan cuda.decode.mma, the default decode for bf16 / f16 at H = Hv = 64 or
 * 128: scores and P V on mma.sync, the (up to 16) query rows of one kv head as the A operand, so each K / V byte is
 * read once for all G heads of the group and costs no fp32 FMA (the fp32 kernel of cuda.decode.pipe issued on 66%
 * of cycles at 27% of DRAM bandwidth). Each warp streams its own key tiles (tiles w, w + 4, ...) through a private
 * 3-stage cp.async pipeline: the loop has no block barrier. The 4 warps' softmax states merge once, at the end, in
 * warp order, into the split's partial (out, lse) that the combine of split.cu reads; on sm_90 the kernel lets
 * that combine launch early (programmatic dependent launch). docs/hopper.md, "Decode".
 */
#include "decode/decode.cuh"

#define SA_DM_WARPS  4
#define SA_DM_STAGES 3  /* 2 tiles in flight per warp: 8 warps an SM keep 128 KiB of K / V requested */
#define SA_DM_RB     16 /* query rows per CTA: the mma's M */

template <int HD>
struct sa_dm_cfg {
  static constexpr int TK = 2048 / HD; /* keys per warp tile: 32 at HD 64, 16 at HD 128 (8 KiB of K and V) */
  static constexpr int LD = HD + 8;    /* padded row: the 8 rows one ldmatrix reads fall in 8 bank groups */
  static constexpr int TILE = TK * LD; /* 16-bit elements of one K (or V) tile */
  static constexpr int SMEM = SA_DM_WARPS * SA_DM_STAGES * 2 * TILE * 2;
  /* the final merge reuses the stage buffers: [WARPS][RB][HD] accumulators, then m and l of [WARPS][RB] */
  static_assert(SA_DM_WARPS * SA_DM_RB * (HD + 2) * 4 <= SMEM, "the merge fits in the stage buffers");
};
static_assert(sa_dm_cfg<64>::SMEM == SA_DEC_MMA_SMEM(64) && sa_dm_cfg<128>::SMEM == SA_DEC_MMA_SMEM(128),
              "the plan's occupancy reads the mma kernel's shared memory");

template <int N>
__device__ __forceinline__ void sa_dm_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <typename T, int HD>
__global__ void __launch_bounds__(SA_DM_WARPS * 32, 2) sa_decode_mma_kernel(const sa_decode_params dp) {
  using C = sa_dm_cfg<HD>;
  constexpr int TK = C::TK, LD = C::LD, NT = TK / 8, KT = HD / 16, DT = HD / 8, CH = HD / 8, RB = SA_DM_RB;
  extern __shared__ __align__(16) uint16_t sm_dm[];
  const sa_cuda_params &p = dp.p;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gr = lane >> 2, tq = lane & 3;
  const int64_t c = blockIdx.x, b = blockIdx.z;
  const int64_t kh = blockIdx.y / dp.rowgroups, r0 = (int64_t)(blockIdx.y % dp.rowgroups) * RB;
  const int64_t ql = sa_dev_q_len(p, b), kl = sa_dev_kv_len(p, b);
  const int64_t c0 = c * dp.chunk, c1 = c0 + dp.chunk < kl ? c0 + dp.chunk : kl;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); /* the combine may launch, then waits */
#endif

  /* this thread's rows r0 + gr + 8h: key ranges clipped to the chunk (kv_len < 2^31), the q fragments (A of
     m16n8k16: registers 0 / 2 hold row gr, columns 2tq and 2tq + 8 of a 16-column step; 1 / 3 row gr + 8) */
  int lo[2], hi[2], jb = INT32_MAX, je = 0;
  uint32_t qa[KT][4];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int64_t r = r0 + gr + 8 * h, t = r / p.G, n = kh * p.G + r % p.G;
    const bool ok = r < dp.rows;
    lo[h] = hi[h] = 0;
    if (ok) {
      const sa_krange kr = sa_dev_key_range(p, ql, kl, t);
      const int64_t a0 = kr.lo > c0 ? kr.lo : c0, a1 = kr.hi < c1 ? kr.hi : c1;
      if (a0 < a1) {
        lo[h] = (int)a0;
        hi[h] = (int)a1;
        jb = min(jb, lo[h]);
        je = max(je, hi[h]);
      }
    }
    const uint32_t *qr = reinterpret_cast<const uint32_t *>((const T *)p.q + ((b * p.T + t) * p.N + n) * HD);
#pragma unroll
    for (int kk = 0; kk < KT; kk++) {
      qa[kk][h] = ok ? qr[kk * 8 + tq] : 0u;
      qa[kk][2 + h] = ok ? qr[kk * 8 + 4 + tq] : 0u;
    }
  }
  /* the keys of the CTA: the union of its rows' ranges (every warp computes the same union) */
  const int jbeg = __reduce_min_sync(SA_DEC_FULL, jb), jend = __reduce_max_sync(SA_DEC_FULL, je);
  const int ntiles = jbeg < jend ? (jend - jbeg + TK - 1) / TK : 0;
  const int mine = ntiles > warp ? (ntiles - warp + SA_DM_WARPS - 1) / SA_DM_WARPS : 0;

  /* this warp's tile i (the CTA's tile warp + 4 i) -> stage s: K then V, rows past jend zero-filled */
  uint16_t *wbuf = sm_dm + warp * SA_DM_STAGES * 2 * C::TILE;
  const T *kg = (const T *)p.k, *vg = (const T *)p.v;
  auto load_tile = [&](int i, int s) {
    uint16_t *dk = wbuf + s * 2 * C::TILE, *dv = dk + C::TILE;
    const int64_t key0 = (int64_t)jbeg + (int64_t)(warp + i * SA_DM_WARPS) * TK;
#pragma unroll
    for (int x = lane; x < TK * CH; x += 32) {
      const int j = x / CH, ch = x % CH;
      const bool ok = key0 + j < jend;
      const int64_t off = ((b * p.S + (ok ? key0 + j : 0)) * p.K + kh) * HD + ch * 8;
      sa_cp_async16(dk + j * LD + ch * 8, ok ? (const void *)(kg + off) : (const void *)kg, ok ? 16 : 0);
      sa_cp_async16(dv + j * LD + ch * 8, ok ? (const void *)(vg + off) : (const void *)vg, ok ? 16 : 0);
    }
  };
#pragma unroll
  for (int s = 0; s < SA_DM_STAGES - 1; s++) {
    if (s < mine) load_tile(s, s);
    sa_cp_async_commit(); /* one group per slot, empty or not, so wait_group counts tiles */
  }

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, acc[DT][4];
#pragma unroll
  for (int d = 0; d < DT; d++) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;

  for (int i = 0; i < mine; i++) {
    sa_dm_wait<SA_DM_STAGES - 2>();
    __syncwarp(); /* tile i landed for every lane; every lane is done reading tile i - 1's stage */
    if (i + SA_DM_STAGES - 1 < mine) load_tile(i + SA_DM_STAGES - 1, (i + SA_DM_STAGES - 1) % SA_DM_STAGES);
    sa_cp_async_commit();
    const uint16_t *cK = wbuf + (i % SA_DM_STAGES) * 2 * C::TILE, *cV = cK + C::TILE;

    /* S = Q K^T: 16 rows x TK keys */
    float s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KT; kk++)
#pragma unroll
      for (int nn = 0; nn < NT / 2; nn++) {
        uint32_t bk[4];
        sa_ldmatrix_x4(bk, cK + (nn * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
        sa_mma<T>::run(s[2 * nn], qa[kk], bk[0], bk[1]);
        sa_mma<T>::run(s[2 * nn + 1], qa[kk], bk[2], bk[3]);
      }

    /* mask and online softmax in the exp2 domain (a row with no valid key yet keeps m = -inf, p = 0) */
    const int k0 = jbeg + (warp + i * SA_DM_WARPS) * TK;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int j = k0 + n * 8 + 2 * tq + e;
          const float x = j >= lo[h] && j < hi[h] ? s[n][2 * h + e] * p.scale_log2 : -INFINITY;
          s[n][2 * h + e] = x;
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, __shfl_xor_sync(SA_DEC_FULL, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(SA_DEC_FULL, mx, 2));
      const float mnew = fmaxf(m[h], mx), base = mnew == -INFINITY ? 0.0f : mnew;
      const float alpha = exp2f(m[h] - base);
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const float pe = exp2f(s[n][2 * h + e] - base);
          s[n][2 * h + e] = pe;
          sum += pe;
        }
      l[h] = l[h] * alpha + sum;
      m[h] = mnew;
#pragma unroll
      for (int d = 0; d < DT; d++) {
        acc[d][2 * h] *= alpha;
        acc[d][2 * h + 1] *= alpha;
      }
    }

    /* O += P V: P from the score accumulators as the A operand, V through ldmatrix.trans */
#pragma unroll
    for (int kk = 0; kk < TK / 16; kk++) {
      uint32_t a[4];
      a[0] = sa_mma<T>::pack(s[2 * kk][0], s[2 * kk][1]);
      a[1] = sa_mma<T>::pack(s[2 * kk][2], s[2 * kk][3]);
      a[2] = sa_mma<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = sa_mma<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dd = 0; dd < DT / 2; dd++) {
        uint32_t bv[4];
        sa_ldmatrix_x4_trans(bv, cV + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dd * 16 + (lane >> 4) * 8);
        sa_mma<T>::run(acc[2 * dd], a, bv[0], bv[1]);
        sa_mma<T>::run(acc[2 * dd + 1], a, bv[2], bv[3]);
      }
    }
  }
  sa_cp_async_wait_all();

  /* the warps' states merged in warp order through the stage buffers (deterministic) */
#pragma unroll
  for (int h = 0; h < 2; h++) {
    l[h] += __shfl_xor_sync(SA_DEC_FULL, l[h], 1);
    l[h] += __shfl_xor_sync(SA_DEC_FULL, l[h], 2);
  }
  __syncthreads();                               /* every warp is done with its stages */
  float *red = reinterpret_cast<float *>(sm_dm); /* [WARPS][RB][HD] */
  float *red_m = red + SA_DM_WARPS * RB * HD, *red_l = red_m + SA_DM_WARPS * RB; /* [WARPS][RB] each */
#pragma unroll
  for (int h = 0; h < 2; h++) {
    float *row = red + (warp * RB + gr + 8 * h) * HD + 2 * tq;
#pragma unroll
    for (int d = 0; d < DT; d++)
      *reinterpret_cast<float2 *>(row + d * 8) = make_float2(acc[d][2 * h], acc[d][2 * h + 1]);
    if (tq == 0) {
      red_m[warp * RB + gr + 8 * h] = m[h];
      red_l[warp * RB + gr + 8 * h] = l[h];
    }
  }
  __syncthreads();
  const int64_t item = (b * p.K + kh) * dp.splits + c;
  for (int idx = threadIdx.x; idx < RB * HD; idx += SA_DM_WARPS * 32) {
    const int i = idx / HD, d = idx % HD;
    const int64_t r = r0 + i;
    if (r >= dp.rows) continue;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < SA_DM_WARPS; w++) mx = fmaxf(mx, red_m[w * RB + i]);
    float o = 0.0f, ls = 0.0f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < SA_DM_WARPS; w++) {
        const float mw = red_m[w * RB + i], wt = mw == -INFINITY ? 0.0f : exp2f(mw - mx);
        ls += red_l[w * RB + i] * wt;
        o += red[(w * RB + i) * HD + d] * wt;
      }
      o /= ls;
    }
    dp.part_out[(item * dp.rows + r) * HD + d] = o;
    if (d == 0) dp.part_lse[item * dp.rows + r] = mx == -INFINITY ? -INFINITY : (mx + log2f(ls)) * SA_LN2;
  }
}

template <typename T, int HD>
static cudaError_t sa_dm_launch(const sa_decode_params &dp, cudaStream_t st) {
  return sa_dec_launch_split(sa_decode_mma_kernel<T, HD>, SA_DM_WARPS * 32, sa_dm_cfg<HD>::SMEM, dp, st);
}

cudaError_t sa_decode_mma_launch(const sa_decode_params &dp, sa_dtype dtype, cudaStream_t st) {
  if (dtype == SA_BF16)
    return dp.p.H == 64 ? sa_dm_launch<__nv_bfloat16, 64>(dp, st) : sa_dm_launch<__nv_bfloat16, 128>(dp, st);
  return dp.p.H == 64 ? sa_dm_launch<__half, 64>(dp, st) : sa_dm_launch<__half, 128>(dp, st);
}
