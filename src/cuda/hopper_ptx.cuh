/*
 * hopper_ptx.cuh — what the sm_90a kernels (hopper_fwd.cu, hopper_bwd.cu) share: the PTX wrappers of
 * dev/hopper_common.cuh (mbarrier, TMA, wgmma and its shared-memory descriptors, fences, ex2, bf16 packing),
 * the tensor-map encoding (cuTensorMapEncodeTiled reached through the runtime, no -lcuda), and the part of
 * the scope that the forward and the backward have in common. The names are the dev files' so that a fix
 * made in dev/ ports by diff.
 *
 * The device wrappers only exist in sm_90a code (__CUDA_ARCH_FEAT_SM90_ALL): the sm_80 pass of the same
 * file compiles the kernels with empty bodies, and the host never launches them there (sa_hop_in_scope).
 */
#ifndef SA_HOPPER_PTX_CUH
#define SA_HOPPER_PTX_CUH

#include <cuda.h>         /* CUtensorMap and its enums (types only: the driver is reached at run time) */
#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled_v12000 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

/* ---- the Hopper tile table ------------------------------------------------------------------------
 * Both directions (the forward at H128): 384 threads = 1 producer warpgroup (setmaxnreg 24) + NC = 2 consumer warpgroups (240
 * registers each: 128 x 24 + 256 x 240 = 64512 of 65536), each consumer owning 64 rows (the wgmma M), so a CTA
 * covers 128 rows; K/V (forward, dQ) or Q/dO (dK/dV) stream through a 2-stage mbarrier ring. Measured on the
 * H200 (bench/NOTES.md; B4 T4096 N16 H128, bf16):
 *  forward  per (head dim, mask kind): sa_hop_fwd_tile in hopper_fwd.cu, with its measured reasons. H128 with a
 *           mask: BM 128 query rows, BN 128 keys (S is m64n128: 64 accumulators, O 64, P 32 packed; 2 stages
 *           = 160 KiB of 227; 615 / 552 TFLOP/s standalone, non-causal / causal); H128 without a mask: BN 176
 *           (630 / 654 at T 4096 / 16384); H64: 3 consumer warpgroups, BM 192 (468 / 410 at T4096).
 *  dK/dV    KB 128 keys per CTA, Q / dO streamed in QB 64-row tiles: dK 64 + dV 64 + S^T 32 + dP^T 32 = 192
 *           live accumulators at H128 (R216 of 240); 128-row tiles would need 256. 562 TFLOP/s of its products.
 *           H64: 3 consumer warpgroups, KB 192 (dkdv_tile in hopper_bwd.cu) when the grid has >= 4 CTAs an SM.
 *  dQ       QM 128 queries per CTA, K / V streamed in KT 64-key tiles: dQ 64 + S 32 + dP 32. 633 TFLOP/s.
 *           H64: 3 consumer warpgroups, QM 192 likewise (f+b +11-15% non-causal, +4-7% causal, bench/NOTES.md).
 *  A one-pass backward with dQ by per-element float atomics (dev 01a) ran at 366 against 437 for these two
 *  passes and was not deterministic; the one pass of hopper_bwd1.cu (dev 05: dQ staged in shared memory, one
 *  TMA reduce-add per tile, ordered by semaphores) runs at 484 / 501 (T4096 / T16384) and is, at H128.
 *  At H64 the one pass (hopper_bwd3.cu, dev 06) has BWD1_NC64 = 3 consumer warpgroups, 192 keys a CTA: dK 32 +
 *           dV 32 + S^T 32 + dP^T 32 + fragments 32 in 160 registers; dQ by one owner warpgroup per tile. Against
 *           dev 05's one pass with 2 (128 keys): 1.19-1.32x on the H64 rows, 1.39x at gpt-oss with its head split. */
struct sa_hop_tiles {
  static constexpr int NC = 2, THREADS = 128 * (NC + 1), STAGES = 2;
  static constexpr int BWD_KB = 128, BWD_QB = 64, BWD_QM = 128, BWD_KT = 64, BWD1_NC64 = 3;
};

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
        : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}

/* Named barrier `id` over `count` threads that may arrive divergent: bar.sync is barrier.sync.aligned, which
   requires every thread of a warp at the same instruction, and the spin of mbar_wait or the strided loop of
   zero_tile_rows before it may leave a warp diverged. compute-sanitizer's synccheck flagged exactly that (654
   "divergent thread(s)" at the lengths kernels' tail barrier, and racecheck 3 hazards on the stores it should
   order; H200 session 4). __syncwarp reconverges the warp; the non-aligned form is then legal either way.
   Only the boundary tile of a lengths mask takes it: no measurable cost. */
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  __syncwarp();
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

/* One TMA box {64 elements, 1 head, rows, 1 batch} into 128-byte swizzled rows at dst (1024-aligned). */
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1,
                                         int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];"
      ::"r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar) : "memory");
}

/* One box of a 2-D tensor map (the backward's lse2 / D, the forward's key segment ids) at {c0 (innermost), c1}
   into dst (128-byte aligned), completing on bar; no swizzle: the box lands as laid out in global memory. A
   tensor copy rather than a raw bulk copy (cp.async.bulk) of the same 256 B: racecheck takes the raw copy's
   shared write for the issuing thread's and reports it against the consumers' loads despite the mbarrier
   (dev/hopper_bwd_04, bench/NOTES.md). */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar) : "memory");
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
                   "r"(0) : "memory");
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

#define SA_F8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
                    "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define SA_F32(d) SA_F8(d, 0), SA_F8(d, 8), SA_F8(d, 16), SA_F8(d, 24)
#define SA_F64(d) SA_F32(d), SA_F8(d, 32), SA_F8(d, 40), SA_F8(d, 48), SA_F8(d, 56)
#define SA_REGS32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define SA_REGS64 SA_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, " \
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
      " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" SA_REGS64 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : SA_F64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ __forceinline__ void wgmma_rs(float (&d)[32], const uint32_t *a, uint64_t db) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" SA_REGS32 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
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
   data (ncu over the H200 forward at T1024, H200 session 6), and HD / 8 stores a row. A 4 x 4 transpose of 4-byte
   words inside the quad (two butterfly stages, 4 shuffles per 4 words) gives thread t the 8 contiguous columns of
   group 4k + t: HD / 32 16-byte stores a row, a quad's 64 bytes contiguous. All 32 lanes must call it (shuffles);
   row 16-byte aligned (the Hopper scope's aligned tensors, a row pitch of N H 2 bytes). zero: store zeros (a row
   past q_len: 0 x NaN would not be 0). */
template <int HD>
__device__ __forceinline__ void store_row_bf16(__nv_bfloat16 *row, const float (&d)[HD / 2], int h, float scale,
                                               int t, bool zero = false) {
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
static inline bool sa_hop_map_ids(PFN_cuTensorMapEncodeTiled_v12000 enc, CUtensorMap *m, const int32_t *base,
                                  int64_t B, int64_t S, int box_keys) {
  const cuuint64_t dims[2] = {(cuuint64_t)S, (cuuint64_t)B}, strides[1] = {(cuuint64_t)S * 4};
  const cuuint32_t box[2] = {(cuuint32_t)box_keys, 1}, estr[2] = {1, 1};
  return enc(m, CU_TENSOR_MAP_DATA_TYPE_INT32, 2, const_cast<int32_t *>(base), dims, strides, box, estr,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* The position mask of the Hopper kernels (lengths and segment ids: kinds 3 and 4 below): key j
   is visible to query i iff lo(i) <= j < hi(i), the range sa_dev_key_range gives with ql = T, kl = S. The row's
   diagonal is d = i + off (off = S - T for bottom-right, plus diag_offset); lo = max(0, d - wl) when wl >= 0;
   hi = min(S, d + 1 when causal, d + wr + 1 when wr >= 0), never below lo. Both never decrease with i, so the
   rows [i0, i1] together see keys [lo(i0), hi(i1)), and a tile of keys [k0, k1) is visible to every row of
   [i0, i1] iff lo(i1) <= k0 and k1 <= hi(i0). 64-bit sums: T + S + |off| passes 2^31.
   Per element the kernels use the equivalent test on x = j - i alone (keys < S, rows < T): visible iff
   dlo <= x <= dhi, with dlo = off - wl (wl >= 0) and dhi = off + min(0 if causal, wr if wr >= 0), clamped to
   +-(2^30 + 256) (|x| < 2^30, so clamping keeps every answer and x - dlo, x - dhi fit an int). A kernel
   forms x0 - dhi and x0 - dlo once per tile (x0: its first element's x) and tests each element against an
   immediate: one compare per bound, as cheap as a causal-only test; kernels are compiled per mask kind
   (sa_hop_mask_kind) so a causal mask pays no lower-bound compare.
   Lengths (kind 3): batch b is the problem T = q_len[b], S = kv_len[b] (clamped to the buffers' T, S, as
   sa_dev_q_len / sa_dev_kv_len do): its mask is sa_hop_mask_make of those, built by each CTA from `shape`, and
   each thread folds the length bounds into per-row bounds: a query row i sees keys j < kv_len only, i.e.
   x <= kv_len - 1 - i, and a row past q_len sees nothing (sa_hop_row_bounds). */
struct sa_hop_mask {
  long long off, wl, wr; /* wl, wr < 0: unbounded; capped at T + S + |off| + 1 like sa_dev_key_range */
  int S, causal;
  int dlo, dhi;
};

/* What a kind-3 kernel needs to build a batch's mask: the lengths and the unclamped mask parameters. */
struct sa_hop_shape {
  const int32_t *q_lens, *kv_lens; /* [B] device pointers or NULL (= T, S) */
  int causal;                      /* sa_causal: 0 none, 1 top-left, 2 bottom-right */
  long long wl, wr, diag;          /* as sa_cuda_params */
};

/* x = key - row is always inside +-2^30 (T, S < 2^30 in scope), so these bounds decide nothing / everything. */
#define SA_HOP_XLIM ((1 << 30) + 256)

__host__ __device__ __forceinline__ sa_hop_mask sa_hop_mask_make(long long T, long long S, int causal, long long wl,
                                                                 long long wr, long long diag) {
  sa_hop_mask m;
  m.off = (causal == 2 ? S - T : 0) + diag;
  const long long big = T + S + (m.off < 0 ? -m.off : m.off) + 1;
  m.wl = wl > big ? big : wl;
  m.wr = wr > big ? big : wr;
  m.S = (int)S;
  m.causal = causal != 0;
  const long long inf = 1LL << 40, lim = SA_HOP_XLIM;
  long long dmax = inf;
  if (m.causal) dmax = 0;
  if (m.wr >= 0 && m.wr < dmax) dmax = m.wr;
  const long long dlo = m.wl >= 0 ? m.off - m.wl : -inf, dhi = m.off + dmax;
  m.dlo = (int)(dlo < -lim ? -lim : dlo > lim ? lim : dlo);
  m.dhi = (int)(dhi < -lim ? -lim : dhi > lim ? lim : dhi);
  return m;
}

/* Batch b's lengths, clamped to [0, T] and [0, S] (NULL: the whole buffer). */
__host__ __device__ __forceinline__ void sa_hop_lens(const sa_hop_shape &sh, int b, int T, int S, int *ql, int *kl) {
  const int q = sh.q_lens ? sh.q_lens[b] : T, k = sh.kv_lens ? sh.kv_lens[b] : S;
  *ql = q < 0 ? 0 : q > T ? T : q;
  *kl = k < 0 ? 0 : k > S ? S : k;
}

/* The bounds dlo <= key - row <= dhi for one query row i of a batch with lengths ql, kl: keys j < kl means
   x <= kl - 1 - i; a row i >= ql sees no key (dhi below every x). Without lengths (ql = T, kl = S) they are
   the mask's own: keys < S and rows < T always hold. */
__host__ __device__ __forceinline__ void sa_hop_row_bounds(const sa_hop_mask &m, int ql, int kl, int i, int *dlo,
                                                           int *dhi) {
  *dlo = m.dlo;
  *dhi = i >= ql ? -SA_HOP_XLIM : (kl - 1 - i < m.dhi ? kl - 1 - i : m.dhi);
}

/* The same for one key j (the dK/dV kernel's rows): rows i < ql means x = j - i >= j - ql + 1; a key j >= kl
   is seen by no row. */
__host__ __device__ __forceinline__ void sa_hop_key_bounds(const sa_hop_mask &m, int ql, int kl, int j, int *dlo,
                                                           int *dhi) {
  *dlo = j - ql + 1 > m.dlo ? j - ql + 1 : m.dlo;
  *dhi = j >= kl ? -SA_HOP_XLIM : m.dhi;
}

__host__ __device__ __forceinline__ int sa_hop_lo(const sa_hop_mask &m, int i) {
  const long long lo = m.wl >= 0 ? i + m.off - m.wl : 0;
  return lo < 0 ? 0 : lo > m.S ? m.S : (int)lo;
}

__host__ __device__ __forceinline__ int sa_hop_hi(const sa_hop_mask &m, int i) {
  const long long d = i + m.off;
  long long hi = m.S;
  if (m.causal && d + 1 < hi) hi = d + 1;
  if (m.wr >= 0 && d + m.wr + 1 < hi) hi = d + m.wr + 1;
  const int lo = sa_hop_lo(m, i);
  return hi < lo ? lo : (int)hi;
}

/* The key tiles (of `tile` keys) a block of rows [r0, r0 + rows) needs: t0 .. t0 + *n_tiles - 1 hold every key
   one of its rows sees (*n_tiles = 0: no row sees a key); the forward's and dQ's CTAs load only those. */
__host__ __device__ __forceinline__ int sa_hop_key_tiles(const sa_hop_mask &m, int r0, int rows, int tile,
                                                         int *n_tiles) {
  const int lo = sa_hop_lo(m, r0), hi = sa_hop_hi(m, r0 + rows - 1);
  const int t0 = lo / tile;
  *n_tiles = hi > lo ? (hi + tile - 1) / tile - t0 : 0;
  return t0;
}

/* The rows [i_beg, *i_end) that can see a key of [k0, k0 + keys) (a superset: rows with an empty range may be
   in it; the per-element test is exact): i_beg is the first row with hi(i) > k0, *i_end the first with
   lo(i) >= k0 + keys (T: none). Binary searches, as lo and hi never decrease with i; a dK/dV CTA streams
   only the query blocks of these rows. */
__host__ __device__ __forceinline__ int sa_hop_query_rows(const sa_hop_mask &m, int T, int k0, int keys,
                                                          int *i_end) {
  int a = 0, z = T;
  while (a < z) {
    const int mid = (a + z) / 2;
    if (sa_hop_hi(m, mid) > k0) z = mid; else a = mid + 1;
  }
  const int i_beg = a;
  a = 0, z = T;
  while (a < z) {
    const int mid = (a + z) / 2;
    if (sa_hop_lo(m, mid) >= k0 + keys) z = mid; else a = mid + 1;
  }
  *i_end = a;
  return i_beg;
}

/* The mask kind a call needs: 0 none (every key visible to every row), 1 an upper bound on key - row only
   (causal in either alignment, a right window, with any diag_offset), 2 a lower bound too (a left window),
   3 per-batch lengths (both bounds, per row: sa_hop_row_bounds / sa_hop_key_bounds), 4 segment ids (kind 3's
   bounds, lengths or not, and q_seg[b, i] == kv_seg[b, j] per element; the forward and the two-pass backward). */
static inline int sa_hop_mask_kind(const sa_cuda_params &p) {
  if (p.q_seg || p.kv_seg) return 4;
  if (p.q_lens || p.kv_lens) return 3;
  return p.wl >= 0 ? 2 : (p.causal != 0 || p.wr >= 0) ? 1 : 0;
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

static inline bool sa_hop_disabled_by_env() {
  const char *e = getenv("SINKATTN_CUDA_HOPPER");
  return e && strcmp(e, "0") == 0;
}

/* TMA, bulk copies and the 16-byte vector stores need 16-byte aligned bases. */
static inline bool sa_hop_aligned(const void *x) { return (uintptr_t)x % 16 == 0; }

/* The validated scope of dev/hopper_fwd_02 and dev/hopper_bwd_01 (their harnesses' cases plus what their
   kernels hard-code), widened to every position mask (sa_hop_mask; validated by test_cuda's Hopper cases), less the tensors each direction adds (out; dout, dq, dk, dv and the workspace), whose
   alignment the caller checks. T and S multiples of 128: the forward's 128-row / 128-key tiles, the
   backward's 128-key and 128-query blocks and 64-row streamed tiles all divide them. */
static inline bool sa_hop_in_scope(const sa_cuda_params &p, int bf16, bool segments_ok = false) {
  if (!bf16 || p.H != p.Hv || (p.H != 64 && p.H != 128)) return false;
  /* lengths: the kind-3 kernels; segment ids: kind 4 where the caller takes it (segments_ok: the forward, the
     two-pass backward under its switch), both arrays given as sa_attn's check requires, kv ids 16-byte aligned
     for TMA (the backward checks q ids too) */
  if ((p.q_seg || p.kv_seg) && !(segments_ok && p.q_seg && p.kv_seg && sa_hop_aligned(p.kv_seg))) return false;
  /* windows, both causal alignments and diag_offset: the position mask above (a diag_offset alone, without
     causal or window, changes nothing) */
  if (p.T <= 0 || p.S <= 0 || p.T % 128 != 0 || p.S % 128 != 0) return false;
  if (p.T >= (1 << 29) || p.S >= (1 << 29)) return false; /* key - row inside +-2^30 (SA_HOP_XLIM) */
  if (!(p.scale_log2 > 0.f) || !isfinite(p.scale_log2)) return false; /* the row max is taken before scaling */
  if (!sa_hop_aligned(p.q) || !sa_hop_aligned(p.k) || !sa_hop_aligned(p.v)) return false;
  if (sa_hop_disabled_by_env()) return false;
#if !defined(SA_CUDA_HAVE_SM90A)
  return false; /* built without sm_90a code (CMakeLists.txt): the kernels have no body */
#else
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major == 9 && minor == 0; /* sm_90a code runs on CC 9.0 only */
#endif
}

#endif /* SA_HOPPER_PTX_CUH */
