/*
 * hopper/segments.cuh — segment ids (mask kind 4) at tile level, shared by the forward (key tiles of a block of
 * query rows) and both kernels of the two-pass backward (dQ: key tiles of a block of rows; dK/dV: query tiles of a
 * block of keys). docs/hopper.md, "masks".
 */
#ifndef SA_HOPPER_SEGMENTS_CUH
#define SA_HOPPER_SEGMENTS_CUH

#include <stdint.h>

/* The streamed tiles [*t0, *t0 + *n) (of TILE ids each) narrowed to those from the first to the last holding an
   id in [lo, hi], the range of the fixed side's ids fs[0 .. count) (count > 0): an element with another id meets
   none of them, so the tiles outside are skipped by the producer and the consumers alike (those inside are tested
   per element). Any ids, sorted or not; packed documents (ids increasing) leave exactly the tiles of the fixed
   side's documents. Warp-collective: every lane of the calling warp, the same result in every warp. One round of
   loads when the range's first and last tiles meet [lo, hi] (one 16-byte load a lane for each, beside the fixed
   ids), else 32 tiles a round, one a lane (TILE ids: TILE / 4 loads). ss: the batch's streamed ids (16-byte
   aligned). TILE 128: the forward's key tiles; 64: the backward's streamed tiles (dQ's KT keys, dK/dV's QB rows). */
template <int TILE>
__device__ __forceinline__ void seg_tiles(const int32_t *fs, int count, const int32_t *ss, int *t0, int *n, int lane) {
  static_assert(TILE == 64 || TILE == 128, "a tile is 16 or 32 int4 loads");
  constexpr int Q = TILE / 4; /* int4 per tile */
  const int a = *t0, z = *t0 + *n;
  if (z <= a) return;
  const int4 *s4 = reinterpret_cast<const int4 *>(ss);
  int lo = 0x7fffffff, hi = -0x7fffffff - 1;
  for (int i = lane; i < count; i += 32) {
    const int v = __ldg(fs + i);
    lo = min(lo, v), hi = max(hi, v);
  }
  const int4 fa = __ldg(s4 + a * Q + lane % Q), fz = __ldg(s4 + (z - 1) * Q + lane % Q); /* the range's ends */
  const unsigned full = 0xffffffffu;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    lo = min(lo, __shfl_xor_sync(full, lo, o));
    hi = max(hi, __shfl_xor_sync(full, hi, o));
  }
  auto in4 = [&](int4 v) {
    return (v.x >= lo && v.x <= hi) || (v.y >= lo && v.y <= hi) || (v.z >= lo && v.z <= hi) || (v.w >= lo && v.w <= hi);
  };
  auto meets = [&](int tile) { /* this lane's tile: an id in [lo, hi] */
                               bool m = false;
#pragma unroll 2
                               for (int i = 0; i < Q; ++i) m |= in4(__ldg(s4 + tile * Q + i));
                               return m;
  };
  int first = z, last = z - 1;
  if (__any_sync(full, in4(fa))) {
    first = a;
  } else {
    for (int base = a + 1; base < z; base += 32) {
      const unsigned m = __ballot_sync(full, base + lane < z && meets(base + lane));
      if (m) {
        first = base + __ffs(m) - 1;
        break;
      }
    }
  }
  if (first == z) { /* no element of the fixed side's documents: nothing to load */
    *n = 0;
    return;
  }
  if (!__any_sync(full, in4(fz))) {
    for (int top = z - 2; top >= first; top -= 32) { /* tile first meets: the walk stops there at the latest */
      const unsigned m = __ballot_sync(full, top - lane >= first && meets(top - lane));
      if (m) {
        last = top - (__ffs(m) - 1);
        break;
      }
    }
  }
  *t0 = first;
  *n = last - first + 1;
}

#endif /* SA_HOPPER_SEGMENTS_CUH */
