/*
 * common.cuh — what the portable (sm_80) kernels share: the parameter block, their tile table, the mask (a device
 * copy of sa_key_range), the mma.sync / ldmatrix / cp.async wrappers and the tile loads. docs/hopper.md.
 */
#ifndef SA_CUDA_COMMON_CUH
#define SA_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* Everything a kernel needs, passed by value. Lengths and segment ids are device arrays read in the
   kernels (clamped there), so the host never synchronises to learn them. */
struct sa_cuda_params {
  const void *q, *k, *v;
  void *out;
  float *lse;
  const float *sinks;
  const int32_t *q_lens, *kv_lens, *q_seg, *kv_seg;
  int64_t B, T, S, N, K, G, H, Hv;
  float scale;      /* softmax scale */
  float scale_log2; /* scale * log2(e): scores are kept in the exp2 domain */
  int softmax;      /* sa_softmax */
  int causal;       /* sa_causal */
  int64_t wl, wr, diag_offset;
  /* backward only */
  const void *dout;
  const float *dlse;
  void *dq, *dk, *dv;
  float *dsinks;
  float *D;          /* workspace [B, N, T]: rowsum(dout * out) - dlse */
  float *dsink_part; /* workspace [B, N, nqb]: per query block partial sums of the sink gradient */
  float *lse2;       /* workspace [B, N, T] or NULL: lse * log2(e), +inf where lse = -inf (hopper/bwd_twopass.cu) */
  int64_t nqb;       /* query blocks of the preprocess kernel */
};

#define SA_LOG2E 1.4426950408889634f
#define SA_LN2   0.6931471805599453f

/* Workspace regions start on 256-byte boundaries (TMA and 16-byte vector accesses need 16). */
static inline size_t sa_cuda_round256(size_t x) { return (x + 255) & ~(size_t)255; }

/* ---- the tile table -------------------------------------------------------------------------------
 * HD is the padded head dim max(H, Hv) rounded up to 32, 64, 128 or 256 (16 runs as 32, 96 as 128 and
 * 192 as 256 with zero-filled columns: 4 instantiations per kernel instead of 6 keeps the CUDA compile under
 * a few minutes on 2 cores). Forward: NW warps x 16 * MI rows, BN keys per tile. Measured on the H200
 * (docs/performance.md, "Tile tables"; bf16, learnable sinks; TFLOP/s of the 3 candidates
 * 4x32/BN64, 4x32/BN32, 8x16/BN64):
 *  fwd HD 128: 4 warps x 32 rows, BN 64 (FlashAttention-2's sm80 shape): 231 / 216 / 188 at B4 T4096 N16;
 *      2 m-tiles per warp read each K/V fragment once for two mma, and ~104 KB smem gives 2 CTAs per SM.
 *      255 registers, no spills since the tile loads keep one pointer (sa_load_rows).
 *  fwd HD 64: 8 warps x 16 rows, BN 64: 166 / 180 / 204 at B4 T4096 N32 (186 vs 160 GQA 64/8 causal):
 *      128 registers, 16 warps per SM hide the softmax between the two products; at HD 64 the ldmatrix
 *      traffic of one m-tile per fragment is half that of HD 128.
 *  fwd HD 32: 4 x 32, BN 64 (not measured against the others); HD 256: 4 x 16, BN 32 (128 fp32
 *      accumulators per thread already; 2 m-tiles would spill).
 *  dq (deterministic backward for dq): 16 rows per warp: dQ + S + dP accumulators = 128 floats at HD 128.
 *      A separate pass beat one pass with dQ added into an fp32 workspace (142 vs 135 TFLOP/s f+b with
 *      float atomics, 118 with per-tile ordered adds, B4 T4096 H128).
 *  dkdv: 4 warps x 16 keys, query tiles of BQ rows; HD 256 is split into two column halves (DSPLIT)
 *      so each CTA accumulates 16 x 128 of dK and of dV (128 floats) instead of 256 (spills).
 */
template <int MI_, int BN_, int NW_>
struct sa_fwd_cfg {
  static constexpr int MI = MI_, BN = BN_, NW = NW_;
};
template <int HD>
struct sa_tile {
  using FWD = sa_fwd_cfg<HD == 64 || HD == 256 ? 1 : 2, HD <= 128 ? 64 : 32, HD == 64 ? 8 : 4>;
  static constexpr int DQ_BN = HD <= 128 ? 64 : 32;
  static constexpr int DSPLIT = HD <= 128 ? 1 : 2;
  static constexpr int BQ = HD <= 64 ? 64 : 32;
};
#define SA_NW       4 /* warps per CTA of the backward kernels */
#define SA_NT       (SA_NW * 32)
#define SA_PRE_ROWS 64 /* query rows per CTA of the backward preprocess (and per dsinks partial) */

/* ---- the mask: a copy of sa_key_range (sa_internal.h) for the device ---------------------------- */

struct sa_krange {
  int64_t lo, hi;
};

__device__ __forceinline__ sa_krange sa_dev_key_range(const sa_cuda_params &p, int64_t ql, int64_t kl, int64_t i) {
  sa_krange r = {0, kl};
  if (i >= ql) {
    r.hi = 0;
    return r;
  }
  /* as sa_key_range: "wider than the problem" counts the diagonal's shift, else with diag_offset -500 a
     right window of 1000 over 300 keys would be capped to 301 and cut keys it reaches */
  int64_t big = ql + kl + (p.diag_offset < 0 ? -p.diag_offset : p.diag_offset) + 1;
  int64_t wl = p.wl > big ? big : p.wl;
  int64_t wr = p.wr > big ? big : p.wr;
  int64_t diag = (p.causal == 2 ? i + kl - ql : i) + p.diag_offset;
  if (p.causal != 0 && diag + 1 < r.hi) r.hi = diag + 1;
  if (wr >= 0 && diag + wr + 1 < r.hi) r.hi = diag + wr + 1;
  if (wl >= 0 && diag - wl > r.lo) r.lo = diag - wl;
  if (r.lo < 0) r.lo = 0;
  if (r.hi < r.lo) r.hi = r.lo;
  return r;
}

__device__ __forceinline__ int64_t sa_dev_clamp(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : x > hi ? hi : x;
}
__device__ __forceinline__ int64_t sa_dev_q_len(const sa_cuda_params &p, int64_t b) {
  return p.q_lens ? sa_dev_clamp(p.q_lens[b], 0, p.T) : p.T;
}
__device__ __forceinline__ int64_t sa_dev_kv_len(const sa_cuda_params &p, int64_t b) {
  return p.kv_lens ? sa_dev_clamp(p.kv_lens[b], 0, p.S) : p.S;
}

/* The key tiles [t0, t1) that can hold a valid key for the packed query rows [P0, P1) (row P is query
   i = P / G): lo and hi of sa_key_range never decrease with i, so the union of the rows' ranges lies
   in [lo(first row), hi(last valid row)). */
__device__ __forceinline__ void sa_dev_tile_span(const sa_cuda_params &p, int64_t ql, int64_t kl, int64_t P0,
                                                 int64_t P1, int BN, int *t0, int *t1, int64_t *lo_max,
                                                 int64_t *hi_min) {
  int64_t i0 = P0 / p.G, i1 = (P1 - 1) / p.G;
  if (i1 > ql - 1) i1 = ql - 1;
  *t0 = 0;
  *t1 = 0;
  *lo_max = 0;
  *hi_min = 0;
  if (i0 > i1) return;
  sa_krange a = sa_dev_key_range(p, ql, kl, i0), z = sa_dev_key_range(p, ql, kl, i1);
  if (z.hi <= a.lo) return;
  *t0 = (int)(a.lo / BN);
  *t1 = (int)((z.hi + BN - 1) / BN);
  /* A tile inside [lo of the last row, hi of the first row) is valid for every row of the block, unless
     some row of the block lies past ql (then no tile is interior). */
  int full = (P1 - 1) / p.G <= ql - 1;
  *lo_max = full ? z.lo : INT64_MAX;
  *hi_min = full ? a.hi : INT64_MIN;
}

/* ---- sm_80 instruction wrappers ------------------------------------------------------------------ */

__device__ __forceinline__ uint32_t sa_smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16-byte asynchronous copy; src_bytes = 0 writes zeros (rows past a length, columns past H). */
__device__ __forceinline__ void sa_cp_async16(void *dst, const void *src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa_smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void sa_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void sa_cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

__device__ __forceinline__ void sa_ldmatrix_x4(uint32_t r[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(sa_smem_addr(p)));
}
__device__ __forceinline__ void sa_ldmatrix_x4_trans(uint32_t r[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(sa_smem_addr(p)));
}

template <typename T>
struct sa_mma;
template <>
struct sa_mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
  }
  static __device__ __forceinline__ float load(const void *p, int64_t i) {
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16 *>(p)[i]);
  }
  static __device__ __forceinline__ void store2(void *p, int64_t i, float x, float y) {
    *reinterpret_cast<__nv_bfloat162 *>(reinterpret_cast<__nv_bfloat16 *>(p) + i) = __floats2bfloat162_rn(x, y);
  }
};
template <>
struct sa_mma<__half> {
  static __device__ __forceinline__ void run(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
  }
  static __device__ __forceinline__ float load(const void *p, int64_t i) {
    return __half2float(reinterpret_cast<const __half *>(p)[i]);
  }
  static __device__ __forceinline__ void store2(void *p, int64_t i, float x, float y) {
    *reinterpret_cast<__half2 *>(reinterpret_cast<__half *>(p) + i) = __floats2half2_rn(x, y);
  }
};

/* float32 inputs on the mma.sync kernels (plans cuda.fwd.portable.f32, cuda.bwd.portable.f32): q, k, v and dout
   are rounded to bf16 on their way into shared memory (sa_load_rows / sa_load_packed from a float source), the
   products run on the bf16 tensor cores with fp32 accumulation, and out, dq, dk, dv are written as fp32: the
   error of bf16 inputs (docs/hopper.md, "Float32 inputs"), at O(T) memory. */
struct sa_f32in {};
template <>
struct sa_mma<sa_f32in> : sa_mma<__nv_bfloat16> {
  static __device__ __forceinline__ float load(const void *p, int64_t i) {
    return reinterpret_cast<const float *>(p)[i];
  }
  static __device__ __forceinline__ void store2(void *p, int64_t i, float x, float y) {
    *reinterpret_cast<float2 *>(reinterpret_cast<float *>(p) + i) = make_float2(x, y);
  }
};

/* The element of a kernel's global tensors: 16-bit for bf16 / f16, float for sa_f32in. */
template <typename T>
struct sa_elem {
  using type = uint16_t;
};
template <>
struct sa_elem<sa_f32in> {
  using type = float;
};

/* ---- tile loads ------------------------------------------------------------------------------------
 * A tile is `rows` rows of HD 16-bit values in shared memory, row stride HD + 8: the 16-byte pad puts
 * the 8 rows one ldmatrix reads in 8 different bank groups (a stride of HD * 2 bytes = a multiple of
 * 128 would put all 8 in the same one: an 8-way conflict). */

/* One 16-byte chunk of a tile row into shared memory at dst (zeros when !ok): 8 16-bit values by cp.async, or
   (sa_f32in) 8 floats at src (16-byte aligned) rounded to bf16 by a plain load and store, which the caller's
   cp.async wait and barrier order as they order the chunks of the 16-bit tiles. */
__device__ __forceinline__ void sa_chunk(uint16_t *dst, const uint16_t *src, bool ok) {
  sa_cp_async16(dst, src, ok ? 16 : 0);
}
__device__ __forceinline__ void sa_chunk(uint16_t *dst, const float *src, bool ok) {
  uint4 w = make_uint4(0u, 0u, 0u, 0u);
  if (ok) {
    const float4 a = __ldg(reinterpret_cast<const float4 *>(src)), b = __ldg(reinterpret_cast<const float4 *>(src) + 1);
    w.x = sa_mma<__nv_bfloat16>::pack(a.x, a.y);
    w.y = sa_mma<__nv_bfloat16>::pack(a.z, a.w);
    w.z = sa_mma<__nv_bfloat16>::pack(b.x, b.y);
    w.w = sa_mma<__nv_bfloat16>::pack(b.z, b.w);
  }
  *reinterpret_cast<uint4 *>(dst) = w;
}

/* Rows r of a [*, rows_stride] matrix of E (uint16_t, or float for sa_f32in): global row = row0 + r, valid while
   < nvalid; columns < ncols. Each thread copies one fixed column chunk of every (NTH / CH)-th row, walking one
   pointer: the loop is kept rolled so no per-row address stays live in registers across the caller's tile loop
   (unrolled, the 2 x 8 addresses of the K and V loads pushed the HD 128 forward to 255 registers and spills). */
template <int HD, int NTH = SA_NT, typename E>
__device__ __forceinline__ void sa_load_rows(uint16_t *s, const E *g, int64_t row0, int rows, int64_t nvalid,
                                             int64_t row_stride, int64_t ncols) {
  constexpr int CH = HD / 8, RSTEP = NTH / CH;
  static_assert(NTH % CH == 0, "thread count a multiple of the chunks per row");
  const int r0 = threadIdx.x / CH, col = (threadIdx.x % CH) * 8;
  const E *src = g + (row0 + r0) * row_stride + col;
  const int64_t step = RSTEP * row_stride;
  const int valid = (int)(nvalid - row0 < rows ? (nvalid - row0 > 0 ? nvalid - row0 : 0) : rows);
  const bool colok = col < ncols;
#pragma unroll 1
  for (int r = r0; r < rows; r += RSTEP, src += step) {
    const bool ok = r < valid && colok;
    sa_chunk(s + r * (HD + 8) + col, ok ? src : g, ok);
  }
}

/* Packed query rows (GQA): row P of the block is query i = P / G of head n0 + P % G. base points at
   [b, 0, n0, 0]; rows with P >= nrows or i >= ql are zero-filled. P < 2^31 and G < 2^16
   (sa_cuda_attn_supported): 32-bit unsigned division. */
template <int HD, int NTH = SA_NT, typename E>
__device__ __forceinline__ void sa_load_packed(uint16_t *s, const E *base, int64_t P0, int rows, int64_t G, int64_t N,
                                               int64_t ncols, int64_t nrows, int64_t ql) {
  constexpr int CH = HD / 8, RSTEP = NTH / CH;
  const int r0 = threadIdx.x / CH, col = (threadIdx.x % CH) * 8;
  const bool colok = col < ncols;
#pragma unroll 1
  for (int r = r0; r < rows; r += RSTEP) {
    const unsigned P = (unsigned)(P0 + r), i = P / (unsigned)G, gg = P - i * (unsigned)G;
    const bool ok = P < nrows && i < ql && colok;
    const E *src = ok ? base + ((int64_t)i * N + gg) * ncols + col : base;
    sa_chunk(s + r * (HD + 8) + col, src, ok);
  }
}

#endif /* SA_CUDA_COMMON_CUH */
