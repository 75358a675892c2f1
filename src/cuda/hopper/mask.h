/*
 * mask.h — the position mask of the Hopper kernels as arithmetic on key - row, shared by the kernels (device),
 * the plan (host, C) and tests/test_hop_mask.cu, which checks it against sa_key_range. docs/hopper.md, "masks".
 */
#ifndef SA_HOPPER_MASK_H
#define SA_HOPPER_MASK_H

#include <stdint.h>

#ifdef __CUDACC__
#define SA_HD __host__ __device__ __forceinline__
#else
#define SA_HD static inline
#endif

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
   (sa_hop_mask_kind_of) so a causal mask pays no lower-bound compare.
   Lengths (kind 3): batch b is the problem T = q_len[b], S = kv_len[b] (clamped to the buffers' T, S, as
   sa_dev_q_len / sa_dev_kv_len do): its mask is sa_hop_mask_make of those, built by each CTA from `shape`, and
   each thread folds the length bounds into per-row bounds: a query row i sees keys j < kv_len only, i.e.
   x <= kv_len - 1 - i, and a row past q_len sees nothing (sa_hop_row_bounds). */
typedef struct sa_hop_mask {
  long long off, wl, wr; /* wl, wr < 0: unbounded; capped at T + S + |off| + 1 like sa_dev_key_range */
  int S, causal;
  int dlo, dhi;
} sa_hop_mask;

/* What a kind-3 kernel needs to build a batch's mask: the lengths and the unclamped mask parameters. */
typedef struct sa_hop_shape {
  const int32_t *q_lens, *kv_lens; /* [B] device pointers or NULL (= T, S) */
  int causal;                      /* sa_causal: 0 none, 1 top-left, 2 bottom-right */
  long long wl, wr, diag;          /* as sa_cuda_params */
} sa_hop_shape;

/* x = key - row is always inside +-2^30 (T, S < 2^30 in scope), so these bounds decide nothing / everything. */
#define SA_HOP_XLIM ((1 << 30) + 256)

SA_HD sa_hop_mask sa_hop_mask_make(long long T, long long S, int causal, long long wl, long long wr, long long diag) {
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

/* The mask kind a call needs: 0 none, 1 an upper bound on key - row only (causal in either alignment, a right
   window, any diag_offset), 2 a lower bound too (a left window), 3 per-batch lengths, 4 segment ids (kind 3's
   bounds and q_seg[b, i] == kv_seg[b, j] per element). */
SA_HD int sa_hop_mask_kind_of(int causal, long long wl, long long wr, int lens, int segs) {
  if (segs) return 4;
  if (lens) return 3;
  return wl >= 0 ? 2 : (causal != 0 || wr >= 0) ? 1 : 0;
}

#ifdef __cplusplus /* the per-row and per-tile forms: kernels and host C++ only */
/* Batch b's lengths, clamped to [0, T] and [0, S] (NULL: the whole buffer). */
SA_HD void sa_hop_lens(const sa_hop_shape &sh, int b, int T, int S, int *ql, int *kl) {
  const int q = sh.q_lens ? sh.q_lens[b] : T, k = sh.kv_lens ? sh.kv_lens[b] : S;
  *ql = q < 0 ? 0 : q > T ? T : q;
  *kl = k < 0 ? 0 : k > S ? S : k;
}

/* The bounds dlo <= key - row <= dhi for one query row i of a batch with lengths ql, kl: keys j < kl means
   x <= kl - 1 - i; a row i >= ql sees no key (dhi below every x). Without lengths (ql = T, kl = S) they are
   the mask's own: keys < S and rows < T always hold. */
SA_HD void sa_hop_row_bounds(const sa_hop_mask &m, int ql, int kl, int i, int *dlo, int *dhi) {
  *dlo = m.dlo;
  *dhi = i >= ql ? -SA_HOP_XLIM : (kl - 1 - i < m.dhi ? kl - 1 - i : m.dhi);
}

/* The same for one key j (the dK/dV kernel's rows): rows i < ql means x = j - i >= j - ql + 1; a key j >= kl
   is seen by no row. */
SA_HD void sa_hop_key_bounds(const sa_hop_mask &m, int ql, int kl, int j, int *dlo, int *dhi) {
  *dlo = j - ql + 1 > m.dlo ? j - ql + 1 : m.dlo;
  *dhi = j >= kl ? -SA_HOP_XLIM : m.dhi;
}

SA_HD int sa_hop_lo(const sa_hop_mask &m, int i) {
  const long long lo = m.wl >= 0 ? i + m.off - m.wl : 0;
  return lo < 0 ? 0 : lo > m.S ? m.S : (int)lo;
}

SA_HD int sa_hop_hi(const sa_hop_mask &m, int i) {
  const long long d = i + m.off;
  long long hi = m.S;
  if (m.causal && d + 1 < hi) hi = d + 1;
  if (m.wr >= 0 && d + m.wr + 1 < hi) hi = d + m.wr + 1;
  const int lo = sa_hop_lo(m, i);
  return hi < lo ? lo : (int)hi;
}

/* The key tiles (of `tile` keys) a block of rows [r0, r0 + rows) needs: t0 .. t0 + *n_tiles - 1 hold every key
   one of its rows sees (*n_tiles = 0: no row sees a key); the forward's and dQ's CTAs load only those. */
SA_HD int sa_hop_key_tiles(const sa_hop_mask &m, int r0, int rows, int tile, int *n_tiles) {
  const int lo = sa_hop_lo(m, r0), hi = sa_hop_hi(m, r0 + rows - 1);
  const int t0 = lo / tile;
  *n_tiles = hi > lo ? (hi + tile - 1) / tile - t0 : 0;
  return t0;
}

/* The rows [i_beg, *i_end) that can see a key of [k0, k0 + keys) (a superset: rows with an empty range may be
   in it; the per-element test is exact): i_beg is the first row with hi(i) > k0, *i_end the first with
   lo(i) >= k0 + keys (T: none). Binary searches, as lo and hi never decrease with i; a dK/dV CTA streams
   only the query blocks of these rows. */
SA_HD int sa_hop_query_rows(const sa_hop_mask &m, int T, int k0, int keys, int *i_end) {
  int a = 0, z = T;
  while (a < z) {
    const int mid = (a + z) / 2;
    if (sa_hop_hi(m, mid) > k0) z = mid;
    else a = mid + 1;
  }
  const int i_beg = a;
  a = 0, z = T;
  while (a < z) {
    const int mid = (a + z) / 2;
    if (sa_hop_lo(m, mid) >= k0 + keys) z = mid;
    else a = mid + 1;
  }
  *i_end = a;
  return i_beg;
}

#endif /* __cplusplus */
#endif /* SA_HOPPER_MASK_H */
