/*
 * decode/pipe.cu — the split kernel of plan cuda.decode.pipe (bf16 / f16, H = Hv = 64 or 128): K and V through a
 * 4-stage cp.async pipeline in shared memory, so the bytes in flight are shared memory's, not registers'.
 * docs/hopper.md.
 */
#include "decode/decode.cuh"

#define SA_DP_TK     32 /* keys per tile: one per lane in the score phase */
#define SA_DP_STAGES 4  /* 3 tiles in flight: 48 KiB per CTA at H = 128 bf16 */
#define SA_DP_WARPS  4
#define SA_DP_RB     8 /* rows per CTA: 4 warps x 2 score rows */
static_assert(SA_DP_RB == SA_DEC_RB, "the combine and the plan count rows in groups of SA_DEC_RB");

template <int HD>
struct sa_dp_cfg {
  static constexpr int CH = HD * 2 / 16;               /* 16-byte chunks per cache row: 8 or 16 */
  static constexpr int NC = HD / 32;                   /* P.V columns per lane: 2 or 4 */
  static constexpr int TILE_BYTES = SA_DP_TK * HD * 2; /* K (or V) bytes of one tile */
  static constexpr int SMEM = SA_DP_STAGES * 2 * TILE_BYTES + SA_DP_RB * HD * 4 + SA_DP_TK * SA_DP_RB * 4 +
                              3 * SA_DP_RB * 4; /* stages, q, P, corr / m / l */
};

/* Byte offset of 16-byte chunk c of key row j inside a tile: chunks XOR-swizzled by j & 7 (CH >= 8). */
template <int HD>
__device__ __forceinline__ int sa_dp_chunk(int j, int c) {
  return j * (HD * 2) + ((c ^ (j & 7)) << 4);
}

template <int N>
__device__ __forceinline__ void sa_dp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <typename T, int HD>
__global__ void __launch_bounds__(SA_DP_WARPS * 32, 4) sa_decode_pipe_kernel(const sa_decode_params dp) {
  using C = sa_dp_cfg<HD>;
  constexpr int RB = SA_DP_RB, TK = SA_DP_TK, NT = SA_DP_WARPS * 32;
  extern __shared__ __align__(16) unsigned char sm_raw[];
  unsigned char *sm_kv = sm_raw;                                            /* [STAGES][K tile, V tile] */
  float *sm_q = (float *)(sm_raw + SA_DP_STAGES * 2 * C::TILE_BYTES);       /* [RB][HD] */
  float *sm_p = sm_q + RB * HD;                                             /* [TK][RB] */
  float *sm_corr = sm_p + TK * RB, *sm_m = sm_corr + RB, *sm_l = sm_m + RB; /* [RB] each */

  const sa_cuda_params &p = dp.p;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t c = blockIdx.x, b = blockIdx.z;
  const int64_t kh = blockIdx.y / dp.rowgroups, r0 = (int64_t)(blockIdx.y % dp.rowgroups) * RB;
  const int64_t ql = sa_dev_q_len(p, b), kl = sa_dev_kv_len(p, b);
  const int64_t c0 = c * dp.chunk, c1 = c0 + dp.chunk < kl ? c0 + dp.chunk : kl;

  /* rows' key ranges inside the chunk (kv_len < 2^31: sa_cuda_decode_supported), and q pre-scaled */
  __shared__ int sm_lo[RB], sm_hi[RB];
  if (tid < RB) {
    const int64_t r = r0 + tid;
    int lo = 0, hi = 0;
    if (r < dp.rows) {
      const sa_krange kr = sa_dev_key_range(p, ql, kl, r / p.G);
      const int64_t a0 = kr.lo > c0 ? kr.lo : c0, a1 = kr.hi < c1 ? kr.hi : c1;
      if (a0 < a1) {
        lo = (int)a0;
        hi = (int)a1;
      }
    }
    sm_lo[tid] = lo;
    sm_hi[tid] = hi;
  }
  for (int idx = tid; idx < RB * HD; idx += NT) {
    const int i = idx / HD, d = idx % HD;
    const int64_t r = r0 + i, t = r / p.G, n = kh * p.G + r % p.G;
    sm_q[idx] = r < dp.rows ? sa_dec_io<T>::load(p.q, ((b * p.T + t) * p.N + n) * HD + d) * p.scale_log2 : 0.0f;
  }
  __syncthreads();
  int jbeg = INT32_MAX, jend = 0;
#pragma unroll
  for (int i = 0; i < RB; i++)
    if (sm_lo[i] < sm_hi[i]) {
      jbeg = min(jbeg, sm_lo[i]);
      jend = max(jend, sm_hi[i]);
    }
  const int ntiles = jbeg < jend ? (jend - jbeg + TK - 1) / TK : 0;

  /* tile t -> stage buffer s: 2 * TK * CH 16-byte chunks (K then V), zero-filled past jend */
  const T *kbase = (const T *)p.k, *vbase = (const T *)p.v;
  auto load_tile = [&](int t, int s) {
    unsigned char *dk = sm_kv + s * 2 * C::TILE_BYTES, *dv = dk + C::TILE_BYTES;
#pragma unroll
    for (int x = tid; x < TK * C::CH; x += NT) {
      const int j = x / C::CH, ch = x % C::CH;
      const int64_t key = (int64_t)jbeg + (int64_t)t * TK + j;
      const bool ok = key < jend;
      const int64_t row = ((b * p.S + (ok ? key : 0)) * p.K + kh) * HD + ch * 8;
      sa_cp_async16(dk + sa_dp_chunk<HD>(j, ch), ok ? (const void *)(kbase + row) : (const void *)kbase, ok ? 16 : 0);
      sa_cp_async16(dv + sa_dp_chunk<HD>(j, ch), ok ? (const void *)(vbase + row) : (const void *)vbase, ok ? 16 : 0);
    }
  };
#pragma unroll
  for (int s = 0; s < SA_DP_STAGES - 1; s++) {
    if (s < ntiles) load_tile(s, s);
    sa_cp_async_commit(); /* one group per tile slot, empty or not, so wait_group counts tiles */
  }

  const int ra = 2 * warp, rb = ra + 1; /* score rows of this warp */
  const int lo_a = sm_lo[ra], hi_a = sm_hi[ra], lo_b = sm_lo[rb], hi_b = sm_hi[rb];
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f; /* m per row, l per lane */
  float acc[RB][C::NC];
#pragma unroll
  for (int i = 0; i < RB; i++)
#pragma unroll
    for (int e = 0; e < C::NC; e++) acc[i][e] = 0.0f;

  for (int t = 0; t < ntiles; t++) {
    sa_dp_wait<SA_DP_STAGES - 2>();
    __syncthreads(); /* tile t landed for every thread; every warp is done with tile t - 1 */
    if (t + SA_DP_STAGES - 1 < ntiles) load_tile(t + SA_DP_STAGES - 1, (t + SA_DP_STAGES - 1) % SA_DP_STAGES);
    sa_cp_async_commit();
    const unsigned char *tk = sm_kv + (t % SA_DP_STAGES) * 2 * C::TILE_BYTES, *tv = tk + C::TILE_BYTES;

    /* scores of rows ra, rb against key j = lane */
    float sa = 0.0f, sb = 0.0f;
#pragma unroll
    for (int ch = 0; ch < C::CH; ch++) {
      float kx[8];
      sa_dec_io<T>::unpack(*reinterpret_cast<const uint4 *>(tk + sa_dp_chunk<HD>(lane, ch)), kx);
      const float4 *qa = reinterpret_cast<const float4 *>(sm_q + ra * HD + ch * 8);
      const float4 *qb = reinterpret_cast<const float4 *>(sm_q + rb * HD + ch * 8);
      const float4 a0 = qa[0], a1 = qa[1], b0 = qb[0], b1 = qb[1];
      sa = fmaf(a0.x, kx[0], sa);
      sa = fmaf(a0.y, kx[1], sa);
      sa = fmaf(a0.z, kx[2], sa);
      sa = fmaf(a0.w, kx[3], sa);
      sa = fmaf(a1.x, kx[4], sa);
      sa = fmaf(a1.y, kx[5], sa);
      sa = fmaf(a1.z, kx[6], sa);
      sa = fmaf(a1.w, kx[7], sa);
      sb = fmaf(b0.x, kx[0], sb);
      sb = fmaf(b0.y, kx[1], sb);
      sb = fmaf(b0.z, kx[2], sb);
      sb = fmaf(b0.w, kx[3], sb);
      sb = fmaf(b1.x, kx[4], sb);
      sb = fmaf(b1.y, kx[5], sb);
      sb = fmaf(b1.z, kx[6], sb);
      sb = fmaf(b1.w, kx[7], sb);
    }
    const int64_t j = (int64_t)jbeg + t * TK + lane;
    sa = (j >= lo_a && j < hi_a) ? sa : -INFINITY;
    sb = (j >= lo_b && j < hi_b) ? sb : -INFINITY;
    float ma = sa, mb = sb;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      ma = fmaxf(ma, __shfl_xor_sync(SA_DEC_FULL, ma, o));
      mb = fmaxf(mb, __shfl_xor_sync(SA_DEC_FULL, mb, o));
    }
    /* new running max; correction 1 while a row has seen no valid key (both -inf), 0 on its first one */
    const float na = fmaxf(m_a, ma), nb = fmaxf(m_b, mb);
    const float ca = na == -INFINITY ? 1.0f : exp2f(m_a - na), cb = nb == -INFINITY ? 1.0f : exp2f(m_b - nb);
    const float pa = sa == -INFINITY ? 0.0f : exp2f(sa - na), pb = sb == -INFINITY ? 0.0f : exp2f(sb - nb);
    m_a = na;
    m_b = nb;
    l_a = l_a * ca + pa;
    l_b = l_b * cb + pb;
    sm_p[lane * RB + ra] = pa;
    sm_p[lane * RB + rb] = pb;
    if (lane == 0) {
      sm_corr[ra] = ca;
      sm_corr[rb] = cb;
    }
    __syncthreads(); /* P and the corrections of all 8 rows */

    /* P.V: keys 8w .. 8w + 7 of the tile, columns lane * NC .. + NC of every row */
#pragma unroll
    for (int i = 0; i < RB; i++) {
      const float cr = sm_corr[i];
      if (cr != 1.0f) {
#pragma unroll
        for (int e = 0; e < C::NC; e++) acc[i][e] *= cr;
      }
    }
#pragma unroll
    for (int jj = warp * (TK / SA_DP_WARPS); jj < (warp + 1) * (TK / SA_DP_WARPS); jj++) {
      const float4 p0 = *reinterpret_cast<const float4 *>(sm_p + jj * RB);
      const float4 p1 = *reinterpret_cast<const float4 *>(sm_p + jj * RB + 4);
      const float pr[RB] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
      /* this lane's NC columns: bytes lane * NC * 2 .. of the row, inside chunk lane * NC / 8 */
      const int byte = lane * C::NC * 2;
      const unsigned char *vp = tv + sa_dp_chunk<HD>(jj, byte >> 4) + (byte & 15);
      float vx[C::NC];
      if constexpr (C::NC == 4) {
        const uint2 u = *reinterpret_cast<const uint2 *>(vp);
        sa_dec_io<T>::unpack2(u.x, vx);
        sa_dec_io<T>::unpack2(u.y, vx + 2);
      } else {
        sa_dec_io<T>::unpack2(*reinterpret_cast<const uint32_t *>(vp), vx);
      }
#pragma unroll
      for (int i = 0; i < RB; i++)
#pragma unroll
        for (int e = 0; e < C::NC; e++) acc[i][e] = fmaf(pr[i], vx[e], acc[i][e]);
    }
  }
  sa_dp_wait<0>();

  /* row sums over the lanes (fixed butterfly), then the warps' accumulators summed in warp order */
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    l_a += __shfl_xor_sync(SA_DEC_FULL, l_a, o);
    l_b += __shfl_xor_sync(SA_DEC_FULL, l_b, o);
  }
  __syncthreads();             /* every warp is done with the stage buffers: reuse them for the reduction */
  float *red = (float *)sm_kv; /* [WARPS][RB][HD]: 16 KiB at HD 128, within the 64 KiB of stages */
  if (lane == 0) {
    sm_m[ra] = m_a;
    sm_m[rb] = m_b;
    sm_l[ra] = l_a;
    sm_l[rb] = l_b;
  }
#pragma unroll
  for (int i = 0; i < RB; i++)
#pragma unroll
    for (int e = 0; e < C::NC; e++) red[(warp * RB + i) * HD + lane * C::NC + e] = acc[i][e];
  __syncthreads();
  const int64_t item = (b * p.K + kh) * dp.splits + c;
  for (int idx = tid; idx < RB * HD; idx += NT) {
    const int i = idx / HD, d = idx % HD;
    const int64_t r = r0 + i;
    if (r >= dp.rows) continue;
    const float l = sm_l[i];
    float o = 0.0f;
    if (l > 0.0f) {
#pragma unroll
      for (int w = 0; w < SA_DP_WARPS; w++) o += red[(w * RB + i) * HD + d];
      o /= l;
    }
    dp.part_out[(item * dp.rows + r) * HD + d] = o;
    if (d == 0) dp.part_lse[item * dp.rows + r] = l > 0.0f ? (sm_m[i] + log2f(l)) * SA_LN2 : -INFINITY;
  }
}

static_assert(sa_dp_cfg<64>::SMEM == SA_DEC_PIPE_SMEM(64) && sa_dp_cfg<128>::SMEM == SA_DEC_PIPE_SMEM(128),
              "the plan's occupancy reads the pipeline kernel's shared memory");

template <typename T, int HD>
static cudaError_t sa_dp_launch(const sa_decode_params &dp, cudaStream_t st) {
  return sa_dec_launch_split(sa_decode_pipe_kernel<T, HD>, SA_DP_WARPS * 32, sa_dp_cfg<HD>::SMEM, dp, st);
}

cudaError_t sa_decode_pipe_launch(const sa_decode_params &dp, sa_dtype dtype, cudaStream_t st) {
  if (dtype == SA_BF16)
    return dp.p.H == 64 ? sa_dp_launch<__nv_bfloat16, 64>(dp, st) : sa_dp_launch<__nv_bfloat16, 128>(dp, st);
  return dp.p.H == 64 ? sa_dp_launch<__half, 64>(dp, st) : sa_dp_launch<__half, 128>(dp, st);
}
