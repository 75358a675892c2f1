/*
 * decode/split.cu — split-KV decode (sa_attn_decode_fwd): the register split kernel, the combine (the sink enters
 * there, once) and the host side of the decode plans (cuda.decode.mma, .pipe, .register). docs/hopper.md.
 */
#include <string.h>

#include <type_traits>

#include "decode/decode.cuh"
#include "sa_plan.h"

/* The NE elements of row `off` (length n) that lane `sub` owns: 16-byte path, elements [sub*NE, sub*NE+NE);
   generic path, elements sub + 32 e. Zeros when !valid or past n. */
template <typename T, bool CONTIG, int NE>
__device__ __forceinline__ void sa_dec_row(const void *base, int64_t off, int64_t n, int sub, bool valid, float *x) {
  if (CONTIG) {
    if (valid) {
      uint4 u = __ldg(reinterpret_cast<const uint4 *>((const T *)base + off) + sub);
      sa_dec_io<T>::unpack(u, x);
    } else {
#pragma unroll
      for (int e = 0; e < NE; e++) x[e] = 0.0f;
    }
  } else {
#pragma unroll
    for (int e = 0; e < NE; e++) {
      int64_t d = sub + 32 * e;
      x[e] = (valid && d < n) ? sa_dec_io<T>::load(base, off + d) : 0.0f;
    }
  }
}

template <typename T, bool CONTIG>
__global__ void __launch_bounds__(SA_DEC_WARPS * 32) sa_decode_register_kernel(const sa_decode_params dp) {
  constexpr int NE = CONTIG ? 16 / (int)sizeof(T) : SA_DEC_MAXD / 32;
  constexpr int RB = SA_DEC_RB;
  __shared__ float sm_acc[SA_DEC_WARPS][RB][SA_DEC_MAXD];
  __shared__ float sm_m[SA_DEC_WARPS][RB], sm_l[SA_DEC_WARPS][RB];
  const sa_cuda_params &p = dp.p;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int L = CONTIG ? dp.lanes : 32, grp = lane / L, sub = lane % L, KPI = 32 / L;
  const int64_t c = blockIdx.x, b = blockIdx.z;
  const int64_t kh = blockIdx.y / dp.rowgroups, r0 = (int64_t)(blockIdx.y % dp.rowgroups) * RB;
  const int64_t ql = sa_dev_q_len(p, b), kl = sa_dev_kv_len(p, b);
  const int64_t c0 = c * dp.chunk, c1 = c0 + dp.chunk < kl ? c0 + dp.chunk : kl;

  int lo[RB], hi[RB]; /* kv_len < 2^31 (sa_cuda_decode_supported) */
  int64_t jlo = c1, jhi = c0;
  float q[RB][NE], acc[RB][NE], m[RB], l[RB];
#pragma unroll
  for (int i = 0; i < RB; i++) {
    const int64_t r = r0 + i, t = r / p.G, n = kh * p.G + r % p.G;
    lo[i] = hi[i] = 0;
    if (r < dp.rows) {
      sa_krange kr = sa_dev_key_range(p, ql, kl, t);
      int64_t a0 = kr.lo > c0 ? kr.lo : c0, a1 = kr.hi < c1 ? kr.hi : c1;
      if (a0 < a1) {
        lo[i] = (int)a0;
        hi[i] = (int)a1;
        jlo = a0 < jlo ? a0 : jlo;
        jhi = a1 > jhi ? a1 : jhi;
      }
    }
    sa_dec_row<T, CONTIG, NE>(p.q, ((b * p.T + t) * p.N + n) * p.H, p.H, sub, r < dp.rows, q[i]);
#pragma unroll
    for (int e = 0; e < NE; e++) {
      q[i][e] *= p.scale_log2;
      acc[i][e] = 0.0f;
    }
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }

  /* main loop: warp w takes keys jb + grp, jb = jlo + (w + 4 s) KPI; the next step's K and V rows are
     loaded before this step's math so two 16-byte loads per lane stay in flight */
  const int64_t step = (int64_t)SA_DEC_WARPS * KPI;
  int64_t jb = jlo + (int64_t)warp * KPI;
  /* the 16-byte path keeps the prefetched rows packed (4 registers per 16 bytes instead of 8) */
  typedef typename std::conditional<CONTIG, uint4, float[NE]>::type sa_raw;
  sa_raw kr_, vr_;
  float kx[NE], vx[NE];
  auto fetch = [&](int64_t jj, sa_raw &kdst, sa_raw &vdst) {
    const bool ok = jj < jhi;
    if constexpr (CONTIG) {
      const uint4 z = make_uint4(0u, 0u, 0u, 0u);
      kdst = ok ? __ldg(reinterpret_cast<const uint4 *>((const T *)p.k + ((b * p.S + jj) * p.K + kh) * p.H) + sub) : z;
      vdst = ok ? __ldg(reinterpret_cast<const uint4 *>((const T *)p.v + ((b * p.S + jj) * p.K + kh) * p.Hv) + sub) : z;
    } else {
      sa_dec_row<T, false, NE>(p.k, ((b * p.S + jj) * p.K + kh) * p.H, p.H, sub, ok, kdst);
      sa_dec_row<T, false, NE>(p.v, ((b * p.S + jj) * p.K + kh) * p.Hv, p.Hv, sub, ok, vdst);
    }
  };
  auto unpack = [&](const sa_raw &src, float *dst) {
    if constexpr (CONTIG) {
      sa_dec_io<T>::unpack(src, dst);
    } else {
#pragma unroll
      for (int e = 0; e < NE; e++) dst[e] = src[e];
    }
  };
  fetch(jb + grp, kr_, vr_);
  for (; jb < jhi; jb += step) {
    const int64_t j = jb + grp;
    const bool valid = j < jhi;
    unpack(kr_, kx);
    unpack(vr_, vx);
    fetch(j + step, kr_, vr_);
    float s[RB];
    bool need = false;
#pragma unroll
    for (int i = 0; i < RB; i++) {
      float d = 0.0f;
#pragma unroll
      for (int e = 0; e < NE; e++) d = fmaf(q[i][e], kx[e], d);
      for (int o = L / 2; o > 0; o >>= 1) d += __shfl_xor_sync(SA_DEC_FULL, d, o);
      s[i] = (valid && j >= lo[i] && j < hi[i]) ? d : -INFINITY;
      need |= s[i] > m[i] + 8.0f;
    }
    if (__any_sync(SA_DEC_FULL, need)) {
#pragma unroll
      for (int i = 0; i < RB; i++) {
        const float mn = fmaxf(m[i], s[i]);
        if (mn > m[i]) {
          const float cr = exp2f(m[i] - mn); /* 0 when m was -inf */
          l[i] *= cr;
#pragma unroll
          for (int e = 0; e < NE; e++) acc[i][e] *= cr;
          m[i] = mn;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < RB; i++) {
      const float pr = s[i] == -INFINITY ? 0.0f : exp2f(s[i] - m[i]); /* <= 2^8 by the lazy rescale */
      l[i] += pr;
#pragma unroll
      for (int e = 0; e < NE; e++) acc[i][e] = fmaf(pr, vx[e], acc[i][e]);
    }
  }

  /* merge the KPI key groups of the warp (lanes sub + L g), then the warps through shared memory */
  for (int o = L; o < 32; o <<= 1) {
#pragma unroll
    for (int i = 0; i < RB; i++) {
      const float mo = __shfl_xor_sync(SA_DEC_FULL, m[i], o), lo_ = __shfl_xor_sync(SA_DEC_FULL, l[i], o);
      const float mn = fmaxf(m[i], mo);
      const float wa = m[i] == -INFINITY ? 0.0f : exp2f(m[i] - mn), wb = mo == -INFINITY ? 0.0f : exp2f(mo - mn);
      l[i] = l[i] * wa + lo_ * wb;
#pragma unroll
      for (int e = 0; e < NE; e++) acc[i][e] = acc[i][e] * wa + __shfl_xor_sync(SA_DEC_FULL, acc[i][e], o) * wb;
      m[i] = mn;
    }
  }
  if (grp == 0) {
#pragma unroll
    for (int i = 0; i < RB; i++) {
      if (sub == 0) {
        sm_m[warp][i] = m[i];
        sm_l[warp][i] = l[i];
      }
#pragma unroll
      for (int e = 0; e < NE; e++) {
        const int d = CONTIG ? sub * NE + e : sub + 32 * e;
        if (d < p.Hv) sm_acc[warp][i][d] = acc[i][e];
      }
    }
  }
  __syncthreads();
  const int64_t item = (b * p.K + kh) * dp.splits + c;
  for (int idx = threadIdx.x; idx < RB * p.Hv; idx += SA_DEC_WARPS * 32) {
    const int i = idx / (int)p.Hv, d = idx % (int)p.Hv;
    const int64_t r = r0 + i;
    if (r >= dp.rows) continue;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < SA_DEC_WARPS; w++) mx = fmaxf(mx, sm_m[w][i]);
    float o = 0.0f, ls = 0.0f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < SA_DEC_WARPS; w++) {
        const float wt = sm_m[w][i] == -INFINITY ? 0.0f : exp2f(sm_m[w][i] - mx);
        ls += sm_l[w][i] * wt;
        o += sm_acc[w][i][d] * wt;
      }
      o /= ls;
    }
    dp.part_out[(item * dp.rows + r) * p.Hv + d] = o;
    if (d == 0) dp.part_lse[item * dp.rows + r] = mx == -INFINITY ? -INFINITY : (mx + log2f(ls)) * SA_LN2;
  }
}

/* Block-wide max or sum of 128 threads in a fixed tree (deterministic). */
__device__ __forceinline__ float sa_dec_block_reduce(float x, bool is_max, float *red) {
  for (int o = 16; o > 0; o >>= 1) {
    const float y = __shfl_xor_sync(SA_DEC_FULL, x, o);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
  __syncthreads();
  x = red[0];
  for (int w = 1; w < SA_DEC_WARPS; w++) x = is_max ? fmaxf(x, red[w]) : x + red[w];
  return x;
}

template <typename T>
__global__ void __launch_bounds__(SA_DEC_WARPS * 32) sa_decode_combine_kernel(const sa_decode_params dp) {
  extern __shared__ float sm_w[]; /* [splits] weights exp(lse_c - max) */
  __shared__ float red[SA_DEC_WARPS];
  const sa_cuda_params &p = dp.p;
  const int64_t r = blockIdx.x, kh = blockIdx.y, b = blockIdx.z;
  const int64_t t = r / p.G, n = kh * p.G + r % p.G, C = dp.splits, base = (b * p.K + kh) * C;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory"); /* the split kernel's partials (a no-op without PDL) */
#endif
  const float sink = p.softmax == 1 ? 0.0f : p.softmax == 2 ? p.sinks[n] : -INFINITY;
  const int64_t obase = ((b * p.T + t) * p.N + n) * p.Hv;
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) mx = fmaxf(mx, dp.part_lse[(base + c) * dp.rows + r]);
  mx = fmaxf(sa_dec_block_reduce(mx, true, red), sink);
  if (mx == -INFINITY) { /* vanilla row with no valid key: out 0, lse -inf */
    for (int64_t d = threadIdx.x; d < p.Hv; d += blockDim.x) sa_dec_io<T>::store(p.out, obase + d, 0.0f);
    if (threadIdx.x == 0 && p.lse) p.lse[(b * p.N + n) * p.T + t] = -INFINITY;
    return;
  }
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float w = expf(dp.part_lse[(base + c) * dp.rows + r] - mx);
    sm_w[c] = w;
    sum += w;
  }
  sum = sa_dec_block_reduce(sum, false, red) + expf(sink - mx); /* the sink, exactly once */
  const float inv = 1.0f / sum;
  for (int64_t d = threadIdx.x; d < p.Hv; d += blockDim.x) {
    float o = 0.0f;
    for (int64_t c = 0; c < C; c++) o = fmaf(sm_w[c], dp.part_out[((base + c) * dp.rows + r) * p.Hv + d], o);
    sa_dec_io<T>::store(p.out, obase + d, o * inv);
  }
  if (threadIdx.x == 0 && p.lse) p.lse[(b * p.N + n) * p.T + t] = mx + logf(sum);
}

/* ---- host ------------------------------------------------------------------------------------------ */

extern "C" sa_status sa_cuda_decode_supported(const sa_attn *a) {
  if (!sa_cuda_available()) return sa_error(SA_ERR_DEVICE, "backend SA_BACKEND_CUDA unavailable: no CUDA device found");
  if (a->head_dim > SA_DEC_MAXD || a->v_head_dim > SA_DEC_MAXD)
    return sa_error(SA_ERR_UNSUPPORTED, "head_dim %lld / v_head_dim %lld unsupported by CUDA decode: use <= 256",
                    (long long)a->head_dim, (long long)a->v_head_dim);
  if (a->q_segment_ids)
    return sa_error(SA_ERR_UNSUPPORTED, "q_segment_ids/kv_segment_ids unsupported by CUDA decode: use sa_attn_fwd");
  const char *feat = sa_dims_set(a->bias_dims)    ? "bias"
                     : sa_dims_set(a->mask_dims)  ? "mask"
                     : a->q_positions             ? "q_positions / kv_positions"
                     : a->logits_soft_cap != 0.0f ? "logits_soft_cap"
                                                  : NULL;
  if (feat) /* the split-KV kernels take none of these (a forced forward plan lets them past sa_check_cuda_inputs) */
    return sa_error(SA_ERR_UNSUPPORTED, "%s unsupported by the CUDA backend's decode: use sa_attn_fwd", feat);
  const int64_t rg = (a->q_heads / a->kv_heads * a->q_len + SA_DEC_RB - 1) / SA_DEC_RB;
  if (a->batch > 65535 || a->kv_heads * rg > 65535 || a->kv_len >= ((int64_t)1 << 31))
    return sa_error(SA_ERR_UNSUPPORTED,
                    "batch %lld / kv_heads x row groups %lld / kv_len %lld unsupported by CUDA "
                    "decode: must be <= 65535 / <= 65535 / < 2^31",
                    (long long)a->batch, (long long)(a->kv_heads * rg), (long long)a->kv_len);
  return SA_OK;
}

/* The plan of this decode call (plan.c: the splits, and which split kernel). */
static sa_status sa_dec_plan_of(const sa_attn *a, sa_cuda_plan *plan) {
  sa_status s = sa_plan_env_check();
  if (s != SA_OK) return s;
  const sa_cuda_device *dev = sa_cuda_device_current();
  if (!dev) return sa_error(SA_ERR_DEVICE, "backend SA_BACKEND_CUDA unavailable: the device record cannot be read");
  return sa_cuda_plan_pick(a, SA_PLAN_DECODE, dev, sa_plan_forced(SA_PLAN_DECODE), (size_t)-1, plan);
}

extern "C" size_t sa_cuda_decode_workspace_size(const sa_attn *a) {
  sa_cuda_plan plan;
  return sa_dec_plan_of(a, &plan) == SA_OK ? plan.ws : 0;
}

template <typename T>
static cudaError_t sa_dec_launch(const sa_decode_params &dp, bool contig, const sa_cuda_plan &plan, sa_dtype dtype,
                                 cudaStream_t st) {
  const sa_cuda_params &p = dp.p;
  dim3 block(SA_DEC_WARPS * 32), g1((unsigned)dp.splits, (unsigned)(p.K * dp.rowgroups), (unsigned)p.B);
  cudaError_t e = cudaSuccess;
  if (plan.family == SA_CUDA_DECODE_MMA) e = sa_decode_mma_launch(dp, dtype, st);
  else if (plan.family == SA_CUDA_DECODE_PIPE) e = sa_decode_pipe_launch(dp, dtype, st);
  else if (contig) sa_decode_register_kernel<T, true><<<g1, block, 0, st>>>(dp);
  else sa_decode_register_kernel<T, false><<<g1, block, 0, st>>>(dp);
  if (e != cudaSuccess) return e;
  /* the combine; with dec_pdl it is launched while the split kernel runs and waits for it in the kernel
     (programmatic dependent launch: its launch latency hides behind the split kernel's tail) */
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)dp.rows, (unsigned)p.K, (unsigned)p.B);
  cfg.blockDim = block;
  /* the weights' loop reads sm_w four at a time (one 16-byte load) before it tests the count: whole quads */
  cfg.dynamicSmemBytes = (size_t)((dp.splits + 3) & ~(int64_t)3) * sizeof(float);
  cfg.stream = st;
  cfg.attrs = &attr;
  cfg.numAttrs = plan.dec_pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, sa_decode_combine_kernel<T>, dp);
}

extern "C" sa_status sa_cuda_decode_fwd(const sa_attn *a, void *workspace, size_t workspace_size, void *stream) {
  sa_cuda_plan plan;
  sa_status s = sa_dec_plan_of(a, &plan);
  if (s != SA_OK) return s;
  char desc[384];
  sa_cuda_plan_describe(&plan, desc, sizeof desc);
  sa_plan_record(SA_PLAN_DECODE, desc);
  sa_decode_params dp;
  memset(&dp, 0, sizeof dp);
  dp.rows = plan.rows, dp.rowgroups = plan.rowgroups, dp.chunk = plan.chunk, dp.splits = plan.splits;
  if (a->batch == 0 || dp.rows == 0) return SA_OK;
  if (workspace_size < plan.ws || (uintptr_t)workspace % 16 != 0)
    return sa_error(SA_ERR_INVALID, "workspace of %zu bytes too small or not 16-byte aligned: CUDA decode needs %zu",
                    workspace_size, plan.ws);
  sa_cuda_params &p = dp.p;
  p.q = a->q;
  p.k = a->k;
  p.v = a->v;
  p.out = a->out;
  p.lse = a->lse;
  p.sinks = a->sinks;
  p.q_lens = a->q_lens;
  p.kv_lens = a->kv_lens;
  p.B = a->batch;
  p.T = a->q_len;
  p.S = a->kv_len;
  p.N = a->q_heads;
  p.K = a->kv_heads;
  p.G = a->q_heads / a->kv_heads;
  p.H = a->head_dim;
  p.Hv = a->v_head_dim;
  p.scale = sa_scale_of(a);
  p.scale_log2 = p.scale * SA_LOG2E;
  p.softmax = (int)a->softmax;
  p.causal = (int)a->causal;
  p.wl = a->window_left;
  p.wr = a->window_right;
  p.diag_offset = a->diag_offset;
  dp.part_out = (float *)workspace;
  dp.part_lse = dp.part_out + a->batch * a->kv_heads * dp.splits * dp.rows * a->v_head_dim;

  /* the register kernel's 16-byte path: aligned rows of a power-of-two count of 16-byte chunks */
  const int64_t es = (int64_t)sa_dtype_size(a->dtype), row_bytes = a->head_dim * es;
  const int64_t lanes = row_bytes / 16;
  const bool aligned = ((uintptr_t)a->q | (uintptr_t)a->k | (uintptr_t)a->v) % 16 == 0;
  const bool contig = aligned && a->head_dim == a->v_head_dim && row_bytes % 16 == 0 && lanes >= 1 && lanes <= 32 &&
                      (lanes & (lanes - 1)) == 0;
  dp.lanes = contig ? (int)lanes : 32;
  cudaStream_t st = (cudaStream_t)stream;
  cudaError_t e;
  switch (a->dtype) {
    case SA_BF16: e = sa_dec_launch<__nv_bfloat16>(dp, contig, plan, a->dtype, st); break;
    case SA_F16: e = sa_dec_launch<__half>(dp, contig, plan, a->dtype, st); break;
    default: e = sa_dec_launch<float>(dp, contig, plan, a->dtype, st); break;
  }
  if (e != cudaSuccess) return sa_error(SA_ERR_DEVICE, "CUDA decode launch failed: %s", cudaGetErrorString(e));
  return SA_OK;
}
