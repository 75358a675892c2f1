/*
 * sa_internal.h — what every backend shares: error reporting, dtype conversion, the mask predicate
 * (lengths, causal, window, segments, positions, the mask array), the broadcast indexing of bias and mask,
 * and the backend entry points dispatch calls.
 * The mask helpers are the single definition of "valid (i, j)": the reference, the CPU backend and the
 * CUDA host code all call them, so a mask bug cannot hide in one backend only.
 */
#ifndef SA_INTERNAL_H
#define SA_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sinkattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ---------------------------------------------------------------------------------- */

/* Sets the thread-local message (printf-style) and returns s, so callers write
   `return sa_error(SA_ERR_INVALID, "head_dim %lld ...", ...)`. */
sa_status sa_error(sa_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void sa_clear_error(void);

/* ---- dtypes ---------------------------------------------------------------------------------- */

static inline size_t sa_dtype_size(sa_dtype t) { return t == SA_F32 ? 4 : 2; }

static inline float sa_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Round to nearest even; NaN stays NaN (quiet bit forced so rounding cannot turn it into inf). */
static inline uint16_t sa_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float sa_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else { /* subnormal: renormalise */
      int e = -1;
      do {
        man <<= 1;
        e++;
      } while (!(man & 0x400u));
      u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Round to nearest even, with overflow to inf, subnormals and NaN handled. */
static inline uint16_t sa_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
  if (a < 0x38800000u) {                                   /* below 2^-14: subnormal or zero */
    if (a < 0x33000000u) return (uint16_t)sign;            /* below 2^-25: rounds to 0 */
    uint32_t man = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - (int)(a >> 23); /* 14..24 */
    uint32_t r = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 */
  r = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
  return (uint16_t)(sign | r);
}

static inline float sa_load(const void *p, sa_dtype t, int64_t idx) {
  switch (t) {
    case SA_F16: return sa_f16_to_f32(((const uint16_t *)p)[idx]);
    case SA_BF16: return sa_bf16_to_f32(((const uint16_t *)p)[idx]);
    default: return ((const float *)p)[idx];
  }
}

static inline void sa_store(void *p, sa_dtype t, int64_t idx, float x) {
  switch (t) {
    case SA_F16: ((uint16_t *)p)[idx] = sa_f32_to_f16(x); break;
    case SA_BF16: ((uint16_t *)p)[idx] = sa_f32_to_bf16(x); break;
    default: ((float *)p)[idx] = x; break;
  }
}

/* ---- the mask -------------------------------------------------------------------------------- */

static inline float sa_scale_of(const sa_attn *a) {
  return a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)a->head_dim);
}

/* The sink logit a_n: -inf, 0 or sinks[n]. */
static inline float sa_sink_logit(const sa_attn *a, int64_t n) {
  switch (a->softmax) {
    case SA_SOFTMAX_OFF_BY_ONE: return 0.0f;
    case SA_SOFTMAX_LEARNABLE: return a->sinks[n];
    default: return -INFINITY;
  }
}

static inline int64_t sa_clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }

/* Valid query / key lengths of batch b (clamped into [0, T] / [0, S]). Host pointers only: the CUDA
   host code never calls these on device arrays. */
static inline int64_t sa_q_len_of(const sa_attn *a, int64_t b) {
  return a->q_lens ? sa_clamp64(a->q_lens[b], 0, a->q_len) : a->q_len;
}
static inline int64_t sa_kv_len_of(const sa_attn *a, int64_t b) {
  return a->kv_lens ? sa_clamp64(a->kv_lens[b], 0, a->kv_len) : a->kv_len;
}

/* Half-open key range [lo, hi) that lengths, causal and window allow for query row i of a batch with
   valid lengths (ql, kl). With positions, causal and window are per pair (sa_pair_ok) and the range is the
   lengths' alone. Segments, positions and the mask are not included: test them per pair with sa_pair_ok.
   Empty (lo >= hi) when i >= ql. Pure arithmetic: usable on host and, copied, on device. */
typedef struct {
  int64_t lo, hi;
} sa_range;

static inline sa_range sa_key_range(const sa_attn *a, int64_t ql, int64_t kl, int64_t i) {
  sa_range r = {0, kl};
  if (i >= ql) {
    r.hi = 0;
    return r;
  }
  if (a->q_positions) return r;
  /* Windows wider than the problem act as unbounded; capping them keeps the sums below from
     overflowing int64 (diag_offset is checked to |x| < 2^40 by sa_attn_check). "Wider" counts the
     diagonal's shift too: with diag_offset -8 a right window of 8 still reaches key 0. */
  int64_t big = ql + kl + (a->diag_offset < 0 ? -a->diag_offset : a->diag_offset) + 1;
  int64_t wl = a->window_left > big ? big : a->window_left;
  int64_t wr = a->window_right > big ? big : a->window_right;
  int64_t diag = (a->causal == SA_CAUSAL_BOTTOM_RIGHT ? i + kl - ql : i) + a->diag_offset; /* i' */
  if (a->causal != SA_CAUSAL_NONE && diag + 1 < r.hi) r.hi = diag + 1;
  if (wr >= 0 && diag + wr + 1 < r.hi) r.hi = diag + wr + 1;
  if (wl >= 0 && diag - wl > r.lo) r.lo = diag - wl;
  if (r.lo < 0) r.lo = 0;
  if (r.hi < r.lo) r.hi = r.lo;
  return r;
}

static inline int sa_segment_ok(const sa_attn *a, int64_t b, int64_t i, int64_t j) {
  if (!a->q_segment_ids) return 1;
  return a->q_segment_ids[b * a->q_len + i] == a->kv_segment_ids[b * a->kv_len + j];
}

/* Causal and window on positions: qp is the query's position plus diag_offset, kp the key's. Positions are
   int32 and |diag_offset| < 2^40, so |qp - kp| < 2^41: windows are capped at 2^42, which then acts as
   unbounded and keeps qp +- w from overflowing. */
static inline int sa_positions_ok(const sa_attn *a, int64_t qp, int64_t kp) {
  const int64_t cap = (int64_t)1 << 42;
  if (a->causal != SA_CAUSAL_NONE && kp > qp) return 0;
  if (a->window_left >= 0 && kp < qp - (a->window_left < cap ? a->window_left : cap)) return 0;
  if (a->window_right >= 0 && kp > qp + (a->window_right < cap ? a->window_right : cap)) return 0;
  return 1;
}

/* Element strides of a rank-4 operand broadcast to [B,N,T,S] (dims each 1 or the full size, dense
   row-major): 0 on its size-1 axes, so that element (b, n, i, j) of the broadcast is at sa_bcast_at. */
typedef struct {
  int64_t b, n, t, s;
} sa_bcast;

static inline sa_bcast sa_bcast_of(const int64_t d[4]) {
  sa_bcast x;
  x.s = d[3] == 1 ? 0 : 1;
  x.t = d[2] == 1 ? 0 : d[3];
  x.n = d[1] == 1 ? 0 : d[2] * d[3];
  x.b = d[0] == 1 ? 0 : d[1] * d[2] * d[3];
  return x;
}

static inline int64_t sa_bcast_at(sa_bcast x, int64_t b, int64_t n, int64_t i, int64_t j) {
  return b * x.b + n * x.n + i * x.t + j * x.s;
}

/* A bias or mask is given when its dims are (validation makes the pointer non-NULL unless it is empty). */
static inline int sa_dims_set(const int64_t d[4]) { return (d[0] | d[1] | d[2] | d[3]) != 0; }
static inline int64_t sa_dims_count(const int64_t d[4]) { return d[0] * d[1] * d[2] * d[3]; }

/* The per-pair part of validity for query head n: segments, causal / window on positions, the mask. */
static inline int sa_pair_ok(const sa_attn *a, int64_t b, int64_t n, int64_t i, int64_t j) {
  if (!sa_segment_ok(a, b, i, j)) return 0;
  if (a->q_positions &&
      !sa_positions_ok(a, a->q_positions[b * a->q_len + i] + a->diag_offset, a->kv_positions[b * a->kv_len + j]))
    return 0;
  return !a->mask || a->mask[sa_bcast_at(sa_bcast_of(a->mask_dims), b, n, i, j)] != 0;
}

/* The whole predicate: is (i, j) valid for batch b, query head n? */
static inline int sa_attn_valid(const sa_attn *a, int64_t b, int64_t n, int64_t i, int64_t j) {
  sa_range r = sa_key_range(a, sa_q_len_of(a, b), sa_kv_len_of(a, b), i);
  return j >= r.lo && j < r.hi && sa_pair_ok(a, b, n, i, j);
}

/* bias[b, n, i, j] of the broadcast, in fp32 (0 without a bias). */
static inline float sa_bias_at(const sa_attn *a, int64_t b, int64_t n, int64_t i, int64_t j) {
  return a->bias ? sa_load(a->bias, a->bias_dtype, sa_bcast_at(sa_bcast_of(a->bias_dims), b, n, i, j)) : 0.0f;
}

/* ---- validation pieces of sinkattn.c, reused by the decode entry points (src/decode.c) ---------- */
sa_status sa_check_backend_enum(sa_backend be);
sa_status sa_check_dims(const sa_attn *a);   /* sizes, enums, options; no pointers */
sa_status sa_check_shapes(const sa_attn *a); /* sa_check_dims plus the pointers a call dereferences */
sa_status sa_check_cuda_present(void);       /* SA_ERR_DEVICE unless built with CUDA and a device is present */
sa_status sa_check_memory_kind(const sa_attn *a, sa_backend be);
sa_status sa_check_cuda_inputs(const sa_attn *a);               /* SA_ERR_UNSUPPORTED: bias, mask, positions, soft-cap
                                                     the feature plans do not take (sa_cuda_feature_check) */
sa_status sa_cuda_feature_check(const sa_attn *a, int listing); /* src/cuda/plan.c (plan.h) */
/* float32 attention calls (not decode) on CUDA: SA_OK while listing plans or when a forward or backward plan is
   forced; else SA_ERR_UNSUPPORTED, since their only plans (cuda.*.portable.f32) are override-only. src/cuda/plan.c */
sa_status sa_cuda_dtype_check(const sa_attn *a, int listing);

/* ---- backends -------------------------------------------------------------------------------- */
/* Each backend says what it supports (SA_OK, or SA_ERR_UNSUPPORTED with the message set) and is only
   called after sa_attn_check passed. */

sa_status sa_ref_attn_fwd(const sa_attn *a);
sa_status sa_ref_attn_bwd(const sa_attn *a, const sa_attn_grad *g);

sa_status sa_cpu_attn_supported(const sa_attn *a);
sa_status sa_cpu_attn_fwd(const sa_attn *a);
size_t sa_cpu_attn_bwd_workspace_size(const sa_attn *a);
sa_status sa_cpu_attn_bwd(const sa_attn *a, const sa_attn_grad *g, void *workspace, size_t workspace_size);

/* The CUDA backend (src/cuda/); when built without CUDA, src/sa_cuda_stub.c answers SA_ERR_DEVICE. */
int sa_cuda_available(void);                  /* built with CUDA and a device is present */
int sa_cuda_is_device_pointer(const void *p); /* p is device (or managed) memory */
sa_status sa_cuda_attn_supported(const sa_attn *a);
sa_status sa_cuda_attn_fwd(const sa_attn *a, void *stream);
size_t sa_cuda_attn_bwd_workspace_size(const sa_attn *a);
sa_status sa_cuda_attn_bwd(const sa_attn *a, const sa_attn_grad *g, void *workspace, size_t workspace_size,
                           void *stream);

/* Split-KV decode (src/decode.c; CPU in src/cpu/cpu_decode.c, CUDA in src/cuda/decode/, q_len <=
   SA_DECODE_MAX_Q_LEN). */
sa_status sa_cpu_decode_supported(const sa_attn *a);
size_t sa_cpu_decode_workspace_size(const sa_attn *a);
sa_status sa_cpu_decode_fwd(const sa_attn *a, void *workspace, size_t workspace_size);
sa_status sa_cuda_decode_supported(const sa_attn *a);
size_t sa_cuda_decode_workspace_size(const sa_attn *a);
sa_status sa_cuda_decode_fwd(const sa_attn *a, void *workspace, size_t workspace_size, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* SA_INTERNAL_H */
