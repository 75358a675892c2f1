/*
 * decode/decode.cuh — what the decode split kernels and the combine share: parameters and dtype unpacking.
 */
#ifndef SA_DECODE_CUH
#define SA_DECODE_CUH

#include <stdint.h>

#include "common.cuh"
#include "plan.h"
#include "sa_internal.h"

#define SA_DEC_RB         8 /* query rows per block: gpt-oss's G = 8 at one token fills it exactly */
#define SA_DEC_WARPS      4
#define SA_DEC_MAXD       256 /* generic path: 8 strided elements per lane */
#define SA_DEC_MAX_SPLITS 1024
#define SA_DEC_FULL       0xffffffffu

struct sa_decode_params {
  sa_cuda_params p;
  int64_t rows, rowgroups, chunk, splits;
  int lanes;       /* 16-byte path: lanes per key row */
  float *part_out; /* [B, K, splits, rows, Hv] */
  float *part_lse; /* [B, K, splits, rows], natural log, no sink */
};

template <typename T>
struct sa_dec_io;
template <>
struct sa_dec_io<__nv_bfloat16> {
  static __device__ __forceinline__ void unpack(const uint4 &u, float *x) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
      x[2 * i] = __uint_as_float(w[i] << 16);
      x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
  static __device__ __forceinline__ void unpack2(uint32_t w, float *x) {
    x[0] = __uint_as_float(w << 16);
    x[1] = __uint_as_float(w & 0xffff0000u);
  }
  static __device__ __forceinline__ float load(const void *p, int64_t i) {
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  }
  static __device__ __forceinline__ void store(void *p, int64_t i, float x) {
    ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x);
  }
};
template <>
struct sa_dec_io<__half> {
  static __device__ __forceinline__ void unpack(const uint4 &u, float *x) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
      __half2 h = *reinterpret_cast<const __half2 *>(&w[i]);
      float2 f = __half22float2(h);
      x[2 * i] = f.x;
      x[2 * i + 1] = f.y;
    }
  }
  static __device__ __forceinline__ void unpack2(uint32_t w, float *x) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&w));
    x[0] = f.x;
    x[1] = f.y;
  }
  static __device__ __forceinline__ float load(const void *p, int64_t i) {
    return __half2float(((const __half *)p)[i]);
  }
  static __device__ __forceinline__ void store(void *p, int64_t i, float x) { ((__half *)p)[i] = __float2half_rn(x); }
};
template <>
struct sa_dec_io<float> {
  static __device__ __forceinline__ void unpack(const uint4 &u, float *x) {
    x[0] = __uint_as_float(u.x);
    x[1] = __uint_as_float(u.y);
    x[2] = __uint_as_float(u.z);
    x[3] = __uint_as_float(u.w);
  }
  static __device__ __forceinline__ float load(const void *p, int64_t i) { return ((const float *)p)[i]; }
  static __device__ __forceinline__ void store(void *p, int64_t i, float x) { ((float *)p)[i] = x; }
};

/* A split kernel on the decode grid (splits, kv heads x row groups, batch) with `smem` bytes of dynamic shared
   memory; above the 48 KiB default it opts in (a host-side attribute, no stream operation, no sync). */
static inline cudaError_t sa_dec_launch_split(void (*kernel)(const sa_decode_params), int threads, int smem,
                                              const sa_decode_params &dp, cudaStream_t st) {
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  dim3 grid((unsigned)dp.splits, (unsigned)(dp.p.K * dp.rowgroups), (unsigned)dp.p.B);
  kernel<<<grid, threads, smem, st>>>(dp);
  return cudaGetLastError();
}

/* Enqueue the split kernel of plan cuda.decode.pipe (pipe.cu) or cuda.decode.mma (mma.cu); the combine is
   split.cu's. */
cudaError_t sa_decode_pipe_launch(const sa_decode_params &dp, sa_dtype dtype, cudaStream_t st);
cudaError_t sa_decode_mma_launch(const sa_decode_params &dp, sa_dtype dtype, cudaStream_t st);

#endif /* SA_DECODE_CUH */
