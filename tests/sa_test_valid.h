/*
 * sa_test_valid.h — the validity of (i, j) written out from include/sinkattn.h's prose (lengths, causal,
 * window, segments, positions, the mask array), without the library's helpers (sa_key_range, sa_pair_ok):
 * tests/test_mask.c and fuzz/fuzz_attn.c check the shared definition, sa_attn_valid, against it.
 * Window and diagonal arithmetic in 128 bits, so that INT64_MAX windows and int32 positions cannot wrap.
 */
#ifndef SA_TEST_VALID_H
#define SA_TEST_VALID_H

#include <stdint.h>

#include "sinkattn.h"

static inline int64_t t_valid_clamp(int64_t x, int64_t hi) { return x < 0 ? 0 : x > hi ? hi : x; }

static inline int t_valid_written(const sa_attn *a, int64_t b, int64_t n, int64_t i, int64_t j) {
  int64_t ql = a->q_lens ? t_valid_clamp(a->q_lens[b], a->q_len) : a->q_len;
  int64_t kl = a->kv_lens ? t_valid_clamp(a->kv_lens[b], a->kv_len) : a->kv_len;
  if (i >= ql || j >= kl) return 0;
  __int128 d, x;
  if (a->q_positions) {
    d = (__int128)a->q_positions[b * a->q_len + i] + a->diag_offset;
    x = a->kv_positions[b * a->kv_len + j];
  } else {
    d = (__int128)(a->causal == SA_CAUSAL_BOTTOM_RIGHT ? i + kl - ql : i) + a->diag_offset;
    x = j;
  }
  if (a->causal != SA_CAUSAL_NONE && x > d) return 0;
  if (a->window_left >= 0 && x < d - a->window_left) return 0;
  if (a->window_right >= 0 && x > d + a->window_right) return 0;
  if (a->q_segment_ids && a->q_segment_ids[b * a->q_len + i] != a->kv_segment_ids[b * a->kv_len + j]) return 0;
  if (a->mask) {
    const int64_t *md = a->mask_dims, idx[4] = {b, n, i, j};
    int64_t off = 0;
    for (int k = 0; k < 4; k++) off = off * md[k] + (md[k] == 1 ? 0 : idx[k]);
    if (!a->mask[off]) return 0;
  }
  return 1;
}

#endif /* SA_TEST_VALID_H */
