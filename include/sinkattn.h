/*
 * sinkattn.h — fused scaled-dot-product attention with attention sinks.
 *
 * WHAT IT COMPUTES
 * For batch b, query head n, query row i (the "BTNH" layout of jax.nn.dot_product_attention):
 *
 *     l_ij  = scale * q_i . k_j + bias[b,n,i,j]    for every valid (i, j)   (scale default 1/sqrt(H);
 *                                                  bias optional, below; the sink is not biased)
 *     s_ij  = l_ij, or cap * tanh(l_ij / cap) with logits_soft_cap = cap > 0 (Gemma's soft-capping,
 *             tokamax's definition); the sink logit a_n is not capped
 *     a_n   = -inf (VANILLA) | 0 (OFF_BY_ONE) | sinks[n] (LEARNABLE; fp32, NOT multiplied by scale)
 *     lse_i = log( sum_{j valid} exp(s_ij) + exp(a_n) )     the log-sum-exp INCLUDES the sink
 *     p_ij  = exp(s_ij - lse_i)
 *     out_i = sum_j p_ij v_j                                the sink is a column with no value row
 *
 * A row with no valid key gives out_i = 0 and lse_i = a_n (-inf for VANILLA). Never NaN.
 * (i, j) is valid when every enabled mask agrees:
 *     lengths      i < q_lens[b] and j < kv_lens[b]; values outside [0, T] / [0, S] are CLAMPED to
 *                  that range (a length is data, never an error: -3 acts as 0, 1e9 as T or S)
 *     causal       TOP_LEFT:     j <= i
 *                  BOTTOM_RIGHT: j <= i + kv_len[b] - q_len[b]   (last query sees last key; decode)
 *     window       (left, right) around the aligned diagonal i' (i' = i, or i + kv_len - q_len when
 *                  causal is BOTTOM_RIGHT): i' - left <= j <= i' + right; -1 = unbounded side.
 *                  gpt-oss's 128-token sliding window is causal TOP_LEFT with window (127, 0).
 *                  diag_offset (default 0) is added to i' (a block of a larger problem).
 *     segments     q_segment_ids[b,i] == kv_segment_ids[b,j]  (packed sequences)
 *     positions    with q_positions / kv_positions (Transformer Engine's segment_pos), causal and window
 *                  compare positions instead of indices: with qp' = q_positions[b,i] + diag_offset,
 *                  causal kv_positions[b,j] <= qp', window qp' - left <= kv_positions[b,j] <= qp' + right.
 *                  Causal BOTTOM_RIGHT with positions is invalid (the positions already place every query).
 *                  Lengths still count indices.
 *     mask         mask[b,n,i,j] != 0   (True = attend; broadcast as bias, below)
 * Here kv_len[b] / q_len[b] are the clamped lengths, or S / T when no lengths are given.
 *
 * BIAS AND MASK (the meaning of jax.nn.dot_product_attention's bias and mask)
 *     Each is rank 4 and broadcast to [B,N,T,S]: bias_dims / mask_dims hold its shape, every dim 1 (shared
 *     along that axis) or the full size (B, N = q_heads, T, S); the data is dense row-major in those dims.
 *     bias is added to the scaled logits in its own dtype (bias_dtype, independent of dtype); a row whose
 *     every key has bias -inf is a row with no valid key. mask holds one byte per element, nonzero = attend.
 *     +inf or NaN in bias propagate as in q and k (see EDGES). Under a soft-cap the bias is capped with the
 *     product (l = scale * q.k + bias), so a bias of -inf gives the logit -cap: it masks nothing there.
 *
 * SOFT-CAPPING (logits_soft_cap)
 *     0 = off. Otherwise cap > 0 with cap * log2(e) a finite float, i.e. cap <= 2.35e38 (the kernels keep logits
 *     in base 2; else SA_ERR_INVALID naming logits_soft_cap): s = cap * tanh(l / cap),
 *     bounded by cap, applied to every pair's logit l before the masks; the sink logit is not capped. Every
 *     gradient flows through it: with t = tanh(l / cap), d s / d l = 1 - t^2, so the backward's ds_ij below is
 *     the gradient of s and the one of l (dq, dk, dbias) is ds_ij * (1 - t_ij^2). lse, out and dsinks read s.
 *     The CUDA backend takes it where its feature kernels do (see Backends), else SA_ERR_UNSUPPORTED naming it.
 *
 * Backward with upstream dout (and optionally dlse, when the caller's loss uses lse):
 *     D_i   = sum_d dout_id * out_id - dlse_i
 *     ds_ij = p_ij * (dout_i . v_j - D_i)                  (times 1 - t_ij^2 under a soft-cap, above)
 *     dq_i  = scale * sum_j ds_ij k_j,   dk_j = scale * sum_i ds_ij q_i,   dv_j = sum_i p_ij dout_i
 *     dsinks[n] = - sum_{b,i} exp(a_n - lse_i) * D_i      (LEARNABLE only; fixed reduction order,
 *                                                          bitwise reproducible run to run)
 *     dbias[b',n',i',j'] = sum of ds_ij over every (b,n,i,j) that read that bias element (the sum over
 *                  bias's size-1 axes), fp32 with bias_dims, reduced in a fixed order (bitwise reproducible)
 * dk and dv are summed over the G = N/K query heads that share a kv head. Every backend's backward is bitwise
 * reproducible run to run (fixed reduction orders, no float atomics): there is no other mode.
 *
 * LAYOUT (dense, row-major, no strides)
 *     q [B,T,N,H]  k [B,S,K,H]  v [B,S,K,Hv]  out [B,T,N,Hv]  lse [B,N,T] fp32  sinks [N] fp32
 *     q_lens, kv_lens [B] int32; q_segment_ids, q_positions [B,T] and kv_segment_ids, kv_positions [B,S]
 *     int32; bias [bias_dims] and mask [mask_dims] (uint8), broadcast to [B,N,T,S]; dbias like bias, fp32.
 *     Query head n reads kv head n / G. dq/dk/dv/dout have the shapes of q/k/v/out.
 *     Pointers are host memory for the REF and CPU backends and device memory for CUDA.
 *
 * NUMERICS
 *     Inputs f32, f16 or bf16 (one dtype for q, k, v, out, dout, dq, dk, dv); lse, sinks, dsinks fp32.
 *     Backends accumulate in fp32 (the reference in fp64). The running max starts at the sink logit, so
 *     huge sinks (|a| = 100) and empty rows stay finite.
 *
 * EDGES (tested in tests/test_edges.c, tests/sa_test_absent.h and fuzz/fuzz_attn.c)
 *     Sizes        B, T or S may be 0 (NULL buffers then allowed; nothing is written); T = S = 1 is
 *                  an ordinary problem. A row with no valid key (i >= q_len[b], kv_len[b] = 0, S = 0,
 *                  or every key masked) gives out 0 and lse a_n bitwise, and adds nothing to dq/dk/dv/dbias.
 *     Sinks        +-1e4: exact limits (+1e4: out 0, lse 1e4; -1e4: vanilla within rounding).
 *                  -inf: identical to VANILLA, bitwise, with dsinks 0. +inf: out 0, lse +inf,
 *                  dq/dk/dv get nothing from those rows; dsinks of that head is unspecified (NaN).
 *                  NaN: every lse of that head is NaN and out is NaN in its rows with a valid key;
 *                  other heads are untouched, bitwise. No sink value makes a call fail or crash.
 *     NaN/inf data NaN or inf in q, k, v propagate (never a crash, never an error status). Positions
 *                  outside the lengths (padding: i >= q_lens[b], j >= kv_lens[b]) never reach any
 *                  result, whatever they hold (bias elements that only such positions read included).
 *                  Masks select, never add: a pair that any mask hides (lengths, causal, window,
 *                  segments, positions, the mask array) has the score -inf whatever q, k and bias hold
 *                  (under a soft-cap too: the cap first, then the masks). On REF and CPU a NaN or inf in
 *                  a key hidden from a row therefore reaches neither that row's out and lse nor its dq,
 *                  and a key that no row sees changes no result (dk, dv, dsinks, dbias included). A
 *                  non-finite value row hidden from a row may still reach that row's out and gradients
 *                  (p = 0 times NaN, as jax.nn's probs @ v), never lse, dv, the dk of a key that no row
 *                  sees or the dbias of a hidden pair. A non-finite q, or a key or bias element that a
 *                  row does see, reaches at least that row and may reach every row of its (batch, kv
 *                  head).
 *     Backends     A size or option one backend lacks is SA_ERR_UNSUPPORTED naming the field (e.g.
 *                  CUDA head_dim 72). REF and CPU take bias, mask, positions and logits_soft_cap everywhere; CUDA
 *                  on an sm_90a device with bf16, head_dim = v_head_dim in {64, 128}, q_len and kv_len multiples of
 *                  128, kv_len <= 65536, no segment ids, a mask of [B or 1, q_heads or 1, q_len, kv_len] and a
 *                  bias not shared by the query rows (else SA_ERR_UNSUPPORTED naming the input and the reason,
 *                  for the forward and the backward alike); SA_BACKEND_CUDA in a build without CUDA, or on a
 *                  machine without a CUDA device, is SA_ERR_DEVICE (before any other CUDA rule).
 *     Threads      Every entry point may be called from many threads at once; CPU and REF results are
 *                  bitwise identical to a serial call and across sa_cpu_set_num_threads counts.
 *
 * ERRORS
 *     Nothing aborts, exits or prints. Every call returns an sa_status; on failure sa_last_error()
 *     (thread-local) names the field and the accepted values.
 *
 * EXAMPLE
 *     sa_attn a = {0};
 *     a.dtype = SA_F32;
 *     a.batch = 1; a.q_len = 128; a.kv_len = 128; a.q_heads = 8; a.kv_heads = 2;
 *     a.head_dim = 64; a.v_head_dim = 64;
 *     a.q = q; a.k = k; a.v = v; a.out = out; a.lse = lse;          // host buffers
 *     a.softmax = SA_SOFTMAX_LEARNABLE; a.sinks = sinks;              // float[8]
 *     a.causal = SA_CAUSAL_TOP_LEFT; a.window_left = 127; a.window_right = 0;
 *     a.scale = 0.125f;                                               // 0 also means 1/sqrt(H)
 *     if (sa_attn_fwd(&a, SA_BACKEND_AUTO, NULL) != SA_OK)
 *         fprintf(stderr, "sinkattn: %s\n", sa_last_error());
 *
 *     sa_attn_grad g = {0};
 *     g.dout = dout; g.dq = dq; g.dk = dk; g.dv = dv; g.dsinks = dsinks;
 *     size_t ws = sa_attn_bwd_workspace_size(&a, SA_BACKEND_AUTO);
 *     void *w = ws ? malloc(ws) : NULL;
 *     sa_attn_bwd(&a, &g, w, ws, SA_BACKEND_AUTO, NULL);            // a.out and a.lse from the fwd
 *
 * Note: window_left/right of 0 means "only the diagonal"; set both to -1 for no window (a
 * zero-initialised struct has window (0, 0): call sa_attn_init() to get the unbounded defaults).
 */
#ifndef SINKATTN_H
#define SINKATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SINKATTN_VERSION_MAJOR  0
#define SINKATTN_VERSION_MINOR  1
#define SINKATTN_VERSION_PATCH  0
#define SINKATTN_VERSION_STRING "0.1.0"

#if defined(_WIN32)
#define SA_API __declspec(dllexport)
#else
#define SA_API __attribute__((visibility("default")))
#endif

typedef enum { SA_F32 = 0, SA_F16 = 1, SA_BF16 = 2 } sa_dtype;
typedef enum { SA_SOFTMAX_VANILLA = 0, SA_SOFTMAX_OFF_BY_ONE = 1, SA_SOFTMAX_LEARNABLE = 2 } sa_softmax;
typedef enum { SA_CAUSAL_NONE = 0, SA_CAUSAL_TOP_LEFT = 1, SA_CAUSAL_BOTTOM_RIGHT = 2 } sa_causal;
typedef enum { SA_BACKEND_AUTO = 0, SA_BACKEND_REF = 1, SA_BACKEND_CPU = 2, SA_BACKEND_CUDA = 3 } sa_backend;
typedef enum {
  SA_OK = 0,
  SA_ERR_INVALID = 1,     /* an argument is wrong (a workspace below its size query too): the message names it */
  SA_ERR_UNSUPPORTED = 2, /* valid, but the chosen backend cannot do it (e.g. a head dim) */
  SA_ERR_NO_MEMORY = 3,   /* a host allocation (REF / CPU scratch) failed */
  SA_ERR_DEVICE = 4       /* a CUDA error, or SA_BACKEND_CUDA without the backend compiled in or a device */
} sa_status;

typedef struct sa_attn {
  sa_dtype dtype;                                                        /* of q, k, v, out, dout, dq, dk, dv */
  int64_t batch, q_len, kv_len, q_heads, kv_heads, head_dim, v_head_dim; /* B T S N K H Hv */
  const void *q, *k, *v;                         /* host pointers for REF/CPU, device for CUDA */
  const float *sinks;                            /* [N], LEARNABLE only, else NULL (ignored there) */
  const int32_t *q_lens, *kv_lens;               /* [B] or NULL; clamped to [0,T] / [0,S] */
  const int32_t *q_segment_ids, *kv_segment_ids; /* [B,T], [B,S] or NULL (both or neither) */
  float scale;                                   /* 0 = 1/sqrt(head_dim) */
  sa_softmax softmax;
  sa_causal causal;
  int64_t window_left, window_right; /* -1 = unbounded; 0 = the diagonal only (see sa_attn_init) */
  void *out;                         /* [B,T,N,Hv] */
  float *lse;                        /* [B,N,T]; may be NULL in a forward-only call */
  /* Added to the aligned diagonal i' used by causal and window masks (0 by default): lets a caller run
     one block of a larger attention with global positions (context parallelism, chunked prefill).
     Query row i of this call is global row i + diag_offset relative to key 0 of this call. */
  int64_t diag_offset;
  /* Added to the scaled logits; NULL = no bias. Broadcast to [B,N,T,S]: bias_dims[d] is 1 or the full size
     of that axis (B, q_heads, q_len, kv_len), all 0 when bias is NULL; dense row-major in bias_dims. NULL
     with bias_dims set is allowed only for an empty bias (a zero in the full sizes), as for every buffer. */
  const void *bias;
  sa_dtype bias_dtype; /* SA_F32, SA_F16 or SA_BF16, independent of dtype */
  int64_t bias_dims[4];
  const uint8_t *mask; /* NULL or broadcast like bias (mask_dims); nonzero = attend */
  int64_t mask_dims[4];
  /* [B,T], [B,S] or NULL (both or neither): causal and window compare these instead of i and j. */
  const int32_t *q_positions, *kv_positions;
  /* 0 = none; else cap > 0 and finite: logits = cap * tanh(l / cap), l = scale * q.k + bias, before the
     masks; the sink is not capped (SOFT-CAPPING above). */
  float logits_soft_cap;
} sa_attn;

typedef struct sa_attn_grad {
  const void *dout;   /* [B,T,N,Hv] */
  const float *dlse;  /* [B,N,T] or NULL */
  void *dq, *dk, *dv; /* like q, k, v; fully overwritten */
  float *dsinks;      /* [N] or NULL; fully overwritten (zeros unless LEARNABLE) */
  float *dbias;       /* NULL (not wanted) or [bias_dims] fp32, bias required; fully overwritten */
} sa_attn_grad;

/* Fill *a with the defaults: everything zero/NULL except window_left = window_right = -1. */
SA_API void sa_attn_init(sa_attn *a);

SA_API sa_status sa_attn_check(const sa_attn *a, sa_backend be); /* validation only */
SA_API sa_status sa_attn_fwd(const sa_attn *a, sa_backend be, void *stream);
/* Bytes of scratch sa_attn_bwd needs for this problem on this backend (0 for REF; CPU works without a
   workspace but uses one when given). Returns 0 too when *a is invalid: sa_attn_bwd reports why. */
SA_API size_t sa_attn_bwd_workspace_size(const sa_attn *a, sa_backend be);
/* a->out and a->lse must hold the forward results of the same call (lse is required here). */
SA_API sa_status sa_attn_bwd(const sa_attn *a, const sa_attn_grad *g, void *workspace, size_t workspace_size,
                             sa_backend be, void *stream);

SA_API const char *sa_status_name(sa_status s);
SA_API const char *sa_last_error(void); /* thread-local; "" when the last call on this thread was fine */

/* The longest query sa_attn_decode_fwd takes: rows of one split-KV work item are G * q_len, and 64 tokens keep
   them (and the CUDA kernel's shared memory) bounded; longer queries are prefill and belong to sa_attn_fwd. */
#define SA_DECODE_MAX_Q_LEN 64

/* DECODE: a few query tokens (q_len <= SA_DECODE_MAX_Q_LEN) against a long KV cache, split-KV. Fill *a as for
   sa_attn_fwd:
   q [B,Tq,N,H], k/v the caches [B,S,K,H] / [B,S,K,Hv], kv_lens the cache lengths, causal
   SA_CAUSAL_BOTTOM_RIGHT (query row i sits at position kv_len - Tq + i), optionally a window. The result
   equals sa_attn_fwd's; the cache is cut into chunks processed in parallel, each producing a partial
   without the sink, merged in a fixed order with the sink added once (bitwise independent of the CPU
   thread count). The workspace holds the partials: on CUDA it is required (no allocation, no sync);
   on CPU it is used when large enough, else allocated. q_len > SA_DECODE_MAX_Q_LEN gives SA_ERR_UNSUPPORTED.
   With a bias, a mask, positions or a soft-cap the CPU backend runs sa_attn_fwd's kernels instead (no workspace;
   the same result) and CUDA answers SA_ERR_UNSUPPORTED naming the field. */
SA_API size_t sa_attn_decode_workspace_size(const sa_attn *a, sa_backend be); /* shape-only, like bwd */
SA_API sa_status sa_attn_decode_fwd(const sa_attn *a, void *workspace, size_t workspace_size, sa_backend be,
                                    void *stream);

/* Which backend SA_BACKEND_AUTO would pick for *a (REF, CPU or CUDA), without running anything. */
SA_API sa_backend sa_backend_resolve(const sa_attn *a, sa_backend be);
/* 1 when the library was built with the CUDA backend, else 0. */
SA_API int sa_has_cuda(void);

/* CPU backend threads: n >= 1 sets the count, n <= 0 restores the default (env SINKATTN_NUM_THREADS,
   else all online cores; read once per process). Results are bitwise identical for every thread count.
   Process-wide. */
SA_API void sa_cpu_set_num_threads(int n);
SA_API int sa_cpu_get_num_threads(void);
/* The SIMD level the CPU backend dispatches to: "avx512", "avx2" or "scalar" (CPUID, lowered by env
   SINKATTN_SIMD; both read once per process). */
SA_API const char *sa_cpu_simd_name(void);

#ifdef __cplusplus
}
#endif
#endif /* SINKATTN_H */
