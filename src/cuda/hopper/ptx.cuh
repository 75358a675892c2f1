/*
 * hopper/ptx.cuh — what the sm_90a kernels share: PTX wrappers (mbarrier, TMA, wgmma and its descriptors, fences,
 * ex2, bf16 packing), the tensor maps (cuTensorMapEncodeTiled through the runtime: no -lcuda) and the 16-byte
 * row store. The device wrappers exist in sm_90a code only; the sm_80 pass compiles the kernels empty and the
 * plans never pick them there. docs/hopper.md.
 */
#ifndef SA_HOPPER_PTX_CUH
#define SA_HOPPER_PTX_CUH

#include <cuda.h>         /* CUtensorMap and its enums (types only: the driver is reached at run time) */
#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled_v12000 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "hopper/mask.h"
#include "hopper/tiles.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return sa_smem_addr(p); }

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
/* Returns once the phase with this parity has completed. A fresh barrier is in phase 0, so waiting for
   parity 1 returns at once: that is how the producer's first pass over the ring finds every slot empty. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

/* Named barrier `id` over `count` threads that may arrive divergent: bar.sync is barrier.sync.aligned, which
   requires every thread of a warp at the same instruction, and the spin of mbar_wait or the strided loop of
   zero_tile_rows before it may leave a warp diverged. compute-sanitizer's synccheck flagged exactly that (654
   "divergent thread(s)" at the lengths kernels' tail barrier, and racecheck 3 hazards on the stores it should
   order; ). __syncwarp reconverges the warp; the non-aligned form is then legal either way.
   Only the boundary tile of a lengths mask takes it: no measurable cost. */
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  __syncwarp();
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

/* One TMA box {64 elements, 1 head, rows, 1 batch} into 128-byte swizzled rows at dst (1024-aligned). */
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1, int c2,
                                         int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];" ::"r"(dst),
      "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

/* One box of a 2-D tensor map (the backward's lse2 / D, the forward's key segment ids) at {c0 (innermost), c1}
   into dst (128-byte aligned), completing on bar; no swizzle: the box lands as laid out in global memory. A
   tensor copy rather than a raw bulk copy (cp.async.bulk) of the same 256 B: racecheck takes the raw copy's
   shared write for the issuing thread's and reports it against the consumers' loads despite the mbarrier
   (45056 hazards over the two-pass backward; the tensor copy: none). */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          dst),
      "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

/* Rows [r_from, rows) of a [rows x 64-column block] bf16 tile of cb blocks, set to zero by `nthr` threads
   (tid 0 .. nthr - 1) and made visible to the async proxy (wgmma reads, the next TMA write). The 128-byte
   swizzle permutes the 16-byte chunks inside a row, so a whole row is bytes [r * 128, r * 128 + 128) of its
   block whatever the swizzle. The caller then syncs the threads that read the tile. Used with lengths: a row
   past q_len / kv_len may hold anything, NaN included, and 0 x NaN = NaN in a product even where P = 0. */
__device__ __forceinline__ void zero_tile_rows(uint32_t tile, int rows, int r_from, int cb, int tid, int nthr) {
  const int chunks = (rows - r_from) * 8; /* 16-byte chunks per column block */
  for (int c = 0; c < cb; ++c)
    for (int x = tid; x < chunks; x += nthr)
      asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};" ::"r"(tile + c * rows * 128 + r_from * 128 + 16 * x),
                   "r"(0)
                   : "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/* wgmma shared-memory descriptor: start >> 4 in bits 0-13, leading byte offset >> 4 in 16-29, stride byte
   offset >> 4 in 32-45, base offset 0 (every swizzle atom starts on a 1024-byte boundary), 128-byte swizzle
   (1) in bits 62-63. K-major operands (Q, K): LBO unused (16), SBO = 1024 between 8-row groups.
   N-major operand (V): LBO = distance between 64-column blocks, SBO = 1024 between 8-key groups. */
__device__ __forceinline__ uint64_t gmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
         ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }

/* Pins registers that an in-flight wgmma reads or writes: the compiler may not move other accesses to them
   across this point (the wgmma asm statements themselves are only ordered among volatile asm). */
template <int R>
__device__ __forceinline__ void pin(float (&r)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int R>
__device__ __forceinline__ void pin(uint32_t (&r)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

#define SA_F8(d, i)                                                                                           \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define SA_F32(d) SA_F8(d, 0), SA_F8(d, 8), SA_F8(d, 16), SA_F8(d, 24)
#define SA_F64(d) SA_F32(d), SA_F8(d, 32), SA_F8(d, 40), SA_F8(d, 48), SA_F8(d, 56)
#define SA_REGS32                                                          \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define SA_REGS64                                                                 \
  SA_REGS32                                                                       \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, " \
  "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

/* D[64x128] (+)= A[64x16] B[16x128], A and B K-major in shared memory; scale_d 0 overwrites D. */
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" SA_REGS64 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : SA_F64(d)
      : "l"(da), "l"(db), "r"(scale_d));
}

/* D[64xH] += A[64x16] B[16xH], A in registers (bf16x2), B N-major in shared memory (imm-trans-b = 1).
   scale-d is a predicate operand, so the constant 1 goes through setp. */
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t *a, uint64_t db) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" SA_REGS64
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : SA_F64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ __forceinline__ void wgmma_rs(float (&d)[32], const uint32_t *a, uint64_t db) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" SA_REGS32
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : SA_F32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi); /* .x (low half) = lo: the lower column */
  return *reinterpret_cast<uint32_t *>(&h);
}

/* Row r0 + 8 h of this thread's m64nHD accumulator (d[4j + 2h], d[4j + 2h + 1]: columns 8j + 2t, +1, t = lane % 4),
   scaled, as bf16 at row[0 .. HD): in 16-byte stores. Stored as they lie, each thread writes 4 bytes of every
   8-column group, a warp's store 16 bytes of each of 8 rows: half of every 32-byte sector, twice the sectors of the
   data (ncu over the H200 forward at T1024), and HD / 8 stores a row. A 4 x 4 transpose of 4-byte
   words inside the quad (two butterfly stages, 4 shuffles per 4 words) gives thread t the 8 contiguous columns of
   group 4k + t: HD / 32 16-byte stores a row, a quad's 64 bytes contiguous. All 32 lanes must call it (shuffles);
   row 16-byte aligned (the Hopper scope's aligned tensors, a row pitch of N H 2 bytes). zero: store zeros (a row
   past q_len: 0 x NaN would not be 0). */
template <int HD>
__device__ __forceinline__ void store_row_bf16(__nv_bfloat16 *row, const float (&d)[HD / 2], int h, float scale, int t,
                                               bool zero = false) {
  const bool t2 = (t & 2) != 0, t1 = (t & 1) != 0;
#pragma unroll
  for (int k = 0; k < HD / 32; ++k) {
    uint32_t w[4]; /* w[u]: this thread's word of group 4k + u; the quad's words form a 4 x 4 matrix (t, u) */
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = 4 * k + u;
      w[u] = zero ? 0u : pack_bf16(d[4 * j + 2 * h] * scale, d[4 * j + 2 * h + 1] * scale);
    }
    /* stage 1, lanes t and t ^ 2: the off-diagonal 2 x 2 blocks change places */
    const uint32_t a0 = __shfl_xor_sync(0xffffffffu, t2 ? w[0] : w[2], 2);
    const uint32_t a1 = __shfl_xor_sync(0xffffffffu, t2 ? w[1] : w[3], 2);
    const uint32_t v0 = t2 ? a0 : w[0], v1 = t2 ? a1 : w[1], v2 = t2 ? w[2] : a0, v3 = t2 ? w[3] : a1;
    /* stage 2, lanes t and t ^ 1: each 2 x 2 block transposed; thread t then holds column t = group 4k + t */
    const uint32_t b0 = __shfl_xor_sync(0xffffffffu, t1 ? v0 : v1, 1);
    const uint32_t b1 = __shfl_xor_sync(0xffffffffu, t1 ? v2 : v3, 1);
    uint4 q;
    q.x = t1 ? b0 : v0, q.y = t1 ? v1 : b0, q.z = t1 ? b1 : v2, q.w = t1 ? v3 : b1;
    *reinterpret_cast<uint4 *>(row + 8 * (4 * k + t)) = q;
  }
}

#endif /* sm_90a */

/* ---- host ------------------------------------------------------------------------------------------- */

/* cuTensorMapEncodeTiled from the driver the runtime already loaded (no -lcuda at link time). */
static inline PFN_cuTensorMapEncodeTiled_v12000 sa_hop_encode_fn() {
  void *fn = nullptr;
  cudaDriverEntryPointQueryResult qr;
#if CUDART_VERSION >= 12050
  cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &qr);
#else
  cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &qr);
#endif
  if (e != cudaSuccess || qr != cudaDriverEntryPointSuccess) {
    cudaGetLastError(); /* not sticky: clear it so the portable launch's cudaGetLastError starts clean */
    return nullptr;
  }
  return (PFN_cuTensorMapEncodeTiled_v12000)fn;
}

/* [B, L, heads, HD] bf16 as a 4-D tensor {HD, heads, L, B} (innermost first; strides increase, as the driver
   wants); one box is 64 elements (128 bytes, the swizzle span) x 1 head x rows x 1 batch. */
static inline bool sa_hop_map(PFN_cuTensorMapEncodeTiled_v12000 enc, CUtensorMap *m, const void *base, int64_t B,
                              int64_t L, int64_t heads, int64_t HD, int rows) {
  cuuint64_t dims[4] = {(cuuint64_t)HD, (cuuint64_t)heads, (cuuint64_t)L, (cuuint64_t)B};
  cuuint64_t strides[3] = {(cuuint64_t)HD * 2, (cuuint64_t)(heads * HD * 2), (cuuint64_t)(L * heads * HD * 2)};
  cuuint32_t box[4] = {64, 1, (cuuint32_t)rows, 1}, estr[4] = {1, 1, 1, 1};
  return enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void *>(base), dims, strides, box, estr,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* An fp32 tensor of rank 2 or 3 (dims and box innermost first), no interleave, L2 promotion as the bf16 maps. */
static inline bool sa_hop_map_f32(PFN_cuTensorMapEncodeTiled_v12000 enc, CUtensorMap *m, const float *base, int rank,
                                  const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                                  CUtensorMapSwizzle sw) {
  const cuuint32_t estr[3] = {1, 1, 1};
  return enc(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, rank, const_cast<float *>(base), dims, strides, box, estr,
             CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* lse2 / D [B N, T] fp32 (the backward's workspace rows) as a 2-D tensor {T, B N}, box {box_rows queries, 1 row},
   no swizzle: a box lands as laid out in global memory. TMA wants a 16-byte aligned base and a row stride
   (T * 4) that is a multiple of 16: T % 128 == 0 in scope. */
static inline bool sa_hop_map_rows(PFN_cuTensorMapEncodeTiled_v12000 enc, CUtensorMap *m, const float *base,
                                   int64_t rows, int64_t T, int box_rows) {
  const cuuint64_t dims[2] = {(cuuint64_t)T, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)T * 4};
  const cuuint32_t box[2] = {(cuuint32_t)box_rows, 1};
  return sa_hop_map_f32(enc, m, base, 2, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_NONE);
}

/* Segment ids [B, L] int32 as a 2-D tensor {L, B}, box {box_keys ids, 1 batch}, no swizzle: the streamed side's ids
   land beside their tile (the forward's and dQ's key ids, dK/dV's query ids). 16-byte aligned base, L * 4 a
   multiple of 16 (L % 128 == 0). */
static inline bool sa_hop_map_ids(PFN_cuTensorMapEncodeTiled_v12000 enc, CUtensorMap *m, const int32_t *base, int64_t B,
                                  int64_t S, int box_keys) {
  const cuuint64_t dims[2] = {(cuuint64_t)S, (cuuint64_t)B}, strides[1] = {(cuuint64_t)S * 4};
  const cuuint32_t box[2] = {(cuuint32_t)box_keys, 1}, estr[2] = {1, 1};
  return enc(m, CU_TENSOR_MAP_DATA_TYPE_INT32, 2, const_cast<int32_t *>(base), dims, strides, box, estr,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

static inline sa_hop_mask sa_hop_mask_of(const sa_cuda_params &p) {
  return sa_hop_mask_make(p.T, p.S, p.causal, p.wl, p.wr, p.diag_offset);
}

static inline sa_hop_shape sa_hop_shape_of(const sa_cuda_params &p) {
  sa_hop_shape sh;
  sh.q_lens = p.q_lens;
  sh.kv_lens = p.kv_lens;
  sh.causal = p.causal;
  sh.wl = p.wl;
  sh.wr = p.wr;
  sh.diag = p.diag_offset;
  return sh;
}

/* TMA, bulk copies and the 16-byte vector stores need 16-byte aligned bases. */
static inline bool sa_hop_aligned(const void *x) { return (uintptr_t)x % 16 == 0; }

#endif /* SA_HOPPER_PTX_CUH */
