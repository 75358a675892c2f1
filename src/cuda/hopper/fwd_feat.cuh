/*
 * hopper/fwd_feat.cuh — the forward's feature steps (plan hopper.fwd.features: sa_hop_fwd_kernel<HD, MASK, 1>): its
 * parameters; the class lists of a work tile (feat_class.cu wrote them into the tile's rows of out) copied into the
 * Q slot's shared memory by the producer, with the key tiles narrowed to those from the first to the last non-empty
 * one; each consumer warpgroup's own narrowing; and per key tile the scores of a bias and a soft-cap, then the
 * select of the mask array and the positions (-inf, never an add: a NaN behind the mask never reaches a row).
 * Included by hopper/fwd.cu only. docs/hopper.md, "feature kernels".
 */
#ifndef SA_HOPPER_FWD_FEAT_CUH
#define SA_HOPPER_FWD_FEAT_CUH

#include "feat.cuh"
#include "hopper/fwd_tile.cuh"

namespace {

struct sa_hop_fwd_feat_params : sa_hop_fwd_params {
  sa_cuda_feat f;
  int B;      /* batches (b_fast's divisor) */
  int b_fast; /* head / batch of a work tile's bh: n = bh / B, b = bh % B, so the B work tiles that read one (head,
                 m-block) of a bias or mask shared by the batch run side by side and its rows come from memory
                 once for all of them */
  int lists;  /* the work tiles have class lists (a mask array or positions) */
};

/* The kernel's parameter block: the plain one, or the feature one. */
template <int FEAT>
struct sa_hop_fwd_params_of {
  using type = sa_hop_fwd_params;
};
template <>
struct sa_hop_fwd_params_of<1> {
  using type = sa_hop_fwd_feat_params;
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* The first and the last index k in [lo, hi] of this lane's 16 list bytes (indices k0 .. k0 + 15 in w) with
   (byte >> sh) & m nonzero, over the warp (redux.sync): *first = INT_MAX and *last = -1 when there is none. */
__device__ __forceinline__ void feat_span(const uint32_t (&w)[4], int k0, int lo, int hi, int sh, uint32_t m,
                                          int *first, int *last) {
  uint32_t bits = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i)
    if (((w[i / 4] >> (8 * (i % 4) + sh)) & m) != 0u && k0 + i >= lo && k0 + i <= hi) bits |= 1u << i;
  *first = __reduce_min_sync(0xffffffffu, bits ? k0 + __ffs(bits) - 1 : 0x7fffffff);
  *last = __reduce_max_sync(0xffffffffu, bits ? k0 + 31 - __clz(bits) : -1);
}

/* The producer's step of a work tile (its whole warp): slab s's list (s < n_wg: the classes of its 128-key tiles,
   rows 64 s .. of the work tile in out) into the Q slot's list at slist, byte k holding slab s's class in bits
   2 s, 2 s + 1 (classes are < 4); then [*t0, *t0 + *n_tiles) narrowed to the tiles from the first to the last with
   a non-empty slab, written to the slot's range words at srange for the consumers. Lane l takes tiles 16 l ..
   16 l + 15 (at most 512 tiles in scope). The reads of out are done before the caller's __syncwarp and lane 0's
   Q-full arrive, which every store of a consumer into these rows waits for. */
template <int HD>
__device__ __forceinline__ void feat_fwd_lists(const sa_hop_fwd_feat_params &p, int b, int n, int m0, int n_wg,
                                               uint32_t slist, uint32_t srange, int *t0, int *n_tiles, int lane) {
  const int nt = (p.S + SA_HOP_FWD_BN - 1) / SA_HOP_FWD_BN, k0 = 16 * lane;
  uint32_t w[4] = {0u, 0u, 0u, 0u};
  if (k0 < nt) { /* 16 bytes of a row of 2 HD bytes (a multiple of 16): one aligned load */
    const uint8_t *out = reinterpret_cast<const uint8_t *>(p.out);
    for (int s = 0; s < n_wg; ++s) {
      const int64_t off = sa_feat_list_offset(b, n, m0 / 64 + s, k0, p.T, p.N, HD);
      const uint4 v = *reinterpret_cast<const uint4 *>(out + off);
      w[0] |= v.x << (2 * s), w[1] |= v.y << (2 * s), w[2] |= v.z << (2 * s), w[3] |= v.w << (2 * s);
    }
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(slist + k0), "r"(w[0]), "r"(w[1]), "r"(w[2]),
                 "r"(w[3])
                 : "memory");
  }
  int first, last;
  feat_span(w, k0, *t0, *t0 + *n_tiles - 1, 0, 0x3fu, &first, &last); /* any slab */
  if (last < 0) *n_tiles = 0;
  else *t0 = first, *n_tiles = last - first + 1;
  if (lane == 0) asm volatile("st.shared.v2.b32 [%0], {%1, %2};" ::"r"(srange), "r"(*t0), "r"(*n_tiles) : "memory");
}

/* A consumer warp's narrowing of its warpgroup's tiles [*a, *e) (relative to the work tile's t0) to those from
   the first to the last where slab cw is not empty (the tiles between stay, fully masked when empty); the list
   in shared memory at slist holds nt bytes. Warp-collective; *a = *e = 0 when none is left. */
__device__ __forceinline__ void feat_fwd_slab(uint32_t slist, int nt, int t0, int cw, int *a, int *e, int lane) {
  uint32_t w[4] = {0u, 0u, 0u, 0u};
  const int k0 = 16 * lane;
  if (k0 < nt)
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                 : "r"(slist + k0)
                 : "memory");
  int first, last;
  feat_span(w, k0, t0 + *a, t0 + *e - 1, 2 * cw, 3u, &first, &last);
  if (last < 0) *a = *e = 0;
  else *a = first - t0, *e = last + 1 - t0;
}

/* This thread's rows r0, r0 + 8 of a work tile as the feature steps read them: the element offsets of their bias and
   mask rows, and their positions' key bounds (int2 {lo, hi}). */
struct sa_hop_feat_rows {
  int64_t bias[2], mask[2];
  int2 pos[2];
};
__device__ __forceinline__ sa_hop_feat_rows feat_rows(const sa_hop_fwd_feat_params &p, int b, int n, int r0) {
  sa_hop_feat_rows r;
  const sa_cuda_feat &f = p.f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = r0 + 8 * h;
    r.bias[h] = b * f.bias_b + n * f.bias_n + row * f.bias_t;
    r.mask[h] = b * f.mask_b + n * f.mask_n + row * f.mask_t;
    r.pos[h] = make_int2(1, 0);
    if (f.q_pos) sa_feat_pos_bounds(&f, f.q_pos[(int64_t)b * p.T + row], &r.pos[h].x, &r.pos[h].y);
  }
  return r;
}

/* Scores of one 128-key tile (key kc = the tile's first key + 2 t for element j = 0), in place: the base-2 logits of
   sa_feat_logit2, bias of rows r0, r0 + 8 at offsets rows.bias[0], [1]. m64n128 layout: s[4 j + e] is row
   r0 + 8 (e >> 1), key kc + 8 j + (e & 1). */
__device__ __forceinline__ void feat_fwd_scores(float (&s)[64], const sa_cuda_feat &f, const sa_hop_feat_rows &rows,
                                                int kc) {
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 bv = sa_feat_bias2(f, rows.bias[h], kc + 8 * j);
      s[4 * j + 2 * h] = sa_feat_logit2(&f, s[4 * j + 2 * h], bv.x);
      s[4 * j + 2 * h + 1] = sa_feat_logit2(&f, s[4 * j + 2 * h + 1], bv.y);
    }
}

/* The mask array's and the positions' select of one 128-key tile of class cls (for this warpgroup's rows): nothing
   when full, -inf everywhere when empty, else per pair (the mask's bytes and the key positions of batch row kp). */
__device__ __forceinline__ void feat_fwd_select(float (&s)[64], int cls, const sa_cuda_feat &f,
                                                const sa_hop_feat_rows &rows, const int32_t *kp, int kc) {
  if (cls == SA_FEAT_FULL) return;
  const bool part = cls == SA_FEAT_PARTIAL;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    uint32_t ok[2] = {0u, 0u};
    if (part) {
      const int k = kc + 8 * j;
      int2 kv = make_int2(0, 0);
      if (kp) kv = __ldg(reinterpret_cast<const int2 *>(kp + k));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        ok[h] = sa_feat_mask2_aligned(f, rows.mask[h], k);
        if (kp) ok[h] &= sa_feat_pos2(kv, rows.pos[h].x, rows.pos[h].y);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (!(ok[h] & 1u)) s[4 * j + 2 * h] = -INFINITY;
      if (!(ok[h] & 2u)) s[4 * j + 2 * h + 1] = -INFINITY;
    }
  }
}

#endif /* sm_90a */

} /* namespace */

#endif /* SA_HOPPER_FWD_FEAT_CUH */
