/*
 * ffi_attn.c — the XLA FFI handlers of libsinkattn_jax.so: attention forward and backward for the
 * "cpu" and "CUDA" platforms, plus the shape-only queries Python reads through ctypes.
 *
 * Buffers (positional, fixed order; an absent optional input is a placeholder the handler never reads,
 * announced by the has_* attributes or, for sinks, by softmax != LEARNABLE; a placeholder holding
 * elements is an error, so that nothing passed is ignored):
 *   forward  args  q k v sinks q_lens kv_lens q_seg kv_seg bias mask q_pos kv_pos            rets out lse
 *   backward args  q k v sinks q_lens kv_lens q_seg kv_seg bias mask q_pos kv_pos out lse dout dlse
 *            rets  dq dk dv dsinks dbias [workspace]
 * bias is f32, f16 or bf16 and mask PRED, both rank 4 with each dim 1 or the full B, N, T, S (their own
 * dims are bias_dims / mask_dims); positions int32 [B,T], [B,S]; dbias f32 with bias's dims, zero-size
 * when has_dbias is false. The workspace result exists on CUDA only; Python sizes it at trace time
 * (sa_jax_bwd_workspace_size). The attributes: causal, diag_offset, has_* flags, logits_soft_cap (float, 0 = no
 * cap), scale, softmax, window_left, window_right. Version 4 of this layout and of the attribute set, the decode
 * handler's (ffi_decode.c) included (sa_jax_attn_abi_version, which the Python package checks when it loads the
 * library).
 *
 * vmap: Python uses ffi_call(vmap_method="expand_dims"), so every buffer may carry the same number of
 * extra leading dims, each of the full vmapped size or 1 (an unbatched input). When every batched input
 * is full and sinks are shared, the leading dims fold into the batch (one kernel call); otherwise the
 * handler runs one call per grid cell, broadcasting the size-1 inputs. dsinks is per cell, so a
 * LEARNABLE backward under vmap always runs per cell. A bias or mask folds when it spans the grid with its
 * own batch dim full, or is shared by the whole grid with a batch dim of 1 (then not with dbias, which is
 * per cell).
 */
#include <stdio.h>
#include <string.h>

#include "sa_ffi.h"

enum {
  ARG_Q,
  ARG_K,
  ARG_V,
  ARG_SINKS,
  ARG_QLENS,
  ARG_KVLENS,
  ARG_QSEG,
  ARG_KVSEG,
  ARG_BIAS,
  ARG_MASK,
  ARG_QPOS,
  ARG_KVPOS,
  ARG_OUT,
  ARG_LSE,
  ARG_DOUT,
  ARG_DLSE
};
enum { RET_DQ, RET_DK, RET_DV, RET_DSINKS, RET_DBIAS, RET_WS };
enum {
  V_Q,
  V_K,
  V_V,
  V_SINKS,
  V_QLENS,
  V_KVLENS,
  V_QSEG,
  V_KVSEG,
  V_BIAS,
  V_MASK,
  V_QPOS,
  V_KVPOS,
  V_OUT,
  V_LSE,
  V_DOUT,
  V_DLSE,
  V_DQ,
  V_DK,
  V_DV,
  V_DSINKS,
  V_DBIAS,
  V_WS,
  V_COUNT
};

/* Version 5: a call with a bias, a mask, positions or a soft-cap is asked of sa_jax_cuda_supported_call (ffi_query.c),
   which sizes its CUDA backward's workspace (4: every handler takes `logits_soft_cap`; 3 dropped the backward's
   `deterministic` attribute). */
#define SA_FFI_ABI_VERSION 5

typedef struct {
  const char *target;
  int bwd;
  sa_attn a; /* options and the cell's dims; pointers are set per cell */
  sa_ffi_grid g;
  sa_ffi_view v[V_COUNT]; /* present = 0 for absent optional buffers */
  int has_dlse, has_bias, has_mask, has_pos, has_dbias;
} sa_ffi_call;

/* ---- decoding ------------------------------------------------------------------------------ */

/* The attributes, by name; the table below lists them in this order. */
enum {
  AT_CAUSAL,
  AT_DIAG_OFFSET,
  AT_HAS_DLSE,
  AT_HAS_KV_LENS,
  AT_HAS_Q_LENS,
  AT_HAS_SEGMENTS,
  AT_SCALE,
  AT_SOFTMAX,
  AT_WINDOW_LEFT,
  AT_WINDOW_RIGHT,
  AT_HAS_BIAS,
  AT_HAS_MASK,
  AT_HAS_POSITIONS,
  AT_HAS_DBIAS,
  AT_LOGITS_SOFT_CAP,
  AT_COUNT
};

static XLA_FFI_Error *sa_ffi_decode_attrs(XLA_FFI_CallFrame *f, sa_ffi_call *c, int *has_ql, int *has_kl,
                                          int *has_seg) {
  sa_ffi_attr at[AT_COUNT] = {
      [AT_CAUSAL] = {"causal", SA_ATTR_INT, 1, 0, 0, 0},
      [AT_DIAG_OFFSET] = {"diag_offset", SA_ATTR_INT, 1, 0, 0, 0},
      [AT_HAS_DLSE] = {"has_dlse", SA_ATTR_BOOL, c->bwd, 0, 0, 0},
      [AT_HAS_KV_LENS] = {"has_kv_lens", SA_ATTR_BOOL, 1, 0, 0, 0},
      [AT_HAS_Q_LENS] = {"has_q_lens", SA_ATTR_BOOL, 1, 0, 0, 0},
      [AT_HAS_SEGMENTS] = {"has_segments", SA_ATTR_BOOL, 1, 0, 0, 0},
      [AT_SCALE] = {"scale", SA_ATTR_FLOAT, 1, 0, 0, 0},
      [AT_SOFTMAX] = {"softmax", SA_ATTR_INT, 1, 0, 0, 0},
      [AT_WINDOW_LEFT] = {"window_left", SA_ATTR_INT, 1, 0, 0, 0},
      [AT_WINDOW_RIGHT] = {"window_right", SA_ATTR_INT, 1, 0, 0, 0},
      [AT_HAS_BIAS] = {"has_bias", SA_ATTR_BOOL, 1, 0, 0, 0},
      [AT_HAS_MASK] = {"has_mask", SA_ATTR_BOOL, 1, 0, 0, 0},
      [AT_HAS_POSITIONS] = {"has_positions", SA_ATTR_BOOL, 1, 0, 0, 0},
      [AT_HAS_DBIAS] = {"has_dbias", SA_ATTR_BOOL, c->bwd, 0, 0, 0},
      [AT_LOGITS_SOFT_CAP] = {"logits_soft_cap", SA_ATTR_FLOAT, 1, 0, 0, 0},
  };
  XLA_FFI_Error *e = sa_ffi_attrs_decode(f, c->target, at, AT_COUNT);
  if (e) return e;
  c->has_bias = (int)at[AT_HAS_BIAS].i;
  c->has_mask = (int)at[AT_HAS_MASK].i;
  c->has_pos = (int)at[AT_HAS_POSITIONS].i;
  c->has_dbias = (int)at[AT_HAS_DBIAS].i;
  if (c->has_dbias && !c->has_bias)
    return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                        "%s: has_dbias is true but has_bias is false: "
                        "dbias is the gradient of a bias",
                        c->target);
  /* Enum values outside int range would wrap when cast: reject them here, sa_attn_check does the rest. */
  const int64_t softmax = at[AT_SOFTMAX].i, causal = at[AT_CAUSAL].i;
  if (causal < 0 || causal > 2 || softmax < 0 || softmax > 2)
    return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s: softmax %lld / causal %lld invalid: use 0, 1 or 2",
                        c->target, (long long)softmax, (long long)causal);
  c->a.causal = (sa_causal)causal;
  c->a.diag_offset = at[AT_DIAG_OFFSET].i;
  c->has_dlse = (int)at[AT_HAS_DLSE].i;
  *has_kl = (int)at[AT_HAS_KV_LENS].i;
  *has_ql = (int)at[AT_HAS_Q_LENS].i;
  *has_seg = (int)at[AT_HAS_SEGMENTS].i;
  c->a.scale = (float)at[AT_SCALE].f;
  c->a.softmax = (sa_softmax)softmax;
  c->a.window_left = at[AT_WINDOW_LEFT].i;
  c->a.window_right = at[AT_WINDOW_RIGHT].i;
  return sa_ffi_soft_cap(f, c->target, at[AT_LOGITS_SOFT_CAP].f, &c->a.logits_soft_cap);
}

#define SA_F32T XLA_FFI_DataType_F32
#define SA_S32T XLA_FFI_DataType_S32

/* An input or result the has_* attributes call absent must be a zero-size placeholder: data in it would
   be ignored. */
static XLA_FFI_Error *sa_ffi_check_absent(XLA_FFI_CallFrame *f, const char *target, XLA_FFI_Buffer *b, const char *name,
                                          const char *flag) {
  if (!b)
    return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s: %s is missing or not a buffer", target, name);
  int64_t n = 1;
  for (int64_t d = 0; d < b->rank; d++) n *= b->dims[d];
  if (n != 0)
    return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                        "%s: %s holds %lld elements but %s is false (an "
                        "absent %s is a zero-size placeholder)",
                        target, name, (long long)n, flag, name);
  return NULL;
}

/* bias or mask: rank 4, dtype dt (INVALID: any of f32 / f16 / bf16), each dim 1 or the full size. */
static XLA_FFI_Error *sa_ffi_bcast_view(XLA_FFI_CallFrame *f, sa_ffi_call *c, XLA_FFI_Buffer *b, const char *name,
                                        XLA_FFI_DataType dt, const int64_t *full, int64_t *dims, sa_ffi_view *v) {
  const int64_t any4[4] = {-1, -1, -1, -1};
  XLA_FFI_Error *e = sa_ffi_view_make(f, c->target, &c->g, b, name, dt, 4, any4, dims, v);
  if (e) return e;
  for (int x = 0; x < 4; x++)
    if (dims[x] != 1 && dims[x] != full[x])
      return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                          "%s: %s has shape [%lld,%lld,%lld,%lld]: expected "
                          "each dim 1 or the full [B,N,T,S] = [%lld,%lld,%lld,%lld] (dim %d)",
                          c->target, name, (long long)dims[0], (long long)dims[1], (long long)dims[2],
                          (long long)dims[3], (long long)full[0], (long long)full[1], (long long)full[2],
                          (long long)full[3], x);
  return NULL;
}

/* bias, mask, q_pos, kv_pos (inputs 8-11 of version 2) and dbias (result 4 of the backward). */
static XLA_FFI_Error *sa_ffi_decode_extras(XLA_FFI_CallFrame *f, sa_ffi_call *c, const int64_t *full) {
  const sa_ffi_grid *g = &c->g;
  sa_ffi_view *v = c->v;
  const char *t = c->target;
  const int64_t tw[2] = {full[0], full[2]}, sw[2] = {full[0], full[3]};
  XLA_FFI_Error *e;
  if (c->has_bias ? (e = sa_ffi_bcast_view(f, c, sa_ffi_buffer(f, 0, ARG_BIAS), "bias", XLA_FFI_DataType_INVALID, full,
                                           c->a.bias_dims, &v[V_BIAS]))
                  : (e = sa_ffi_check_absent(f, t, sa_ffi_buffer(f, 0, ARG_BIAS), "bias", "has_bias")))
    return e;
  if (c->has_mask ? (e = sa_ffi_bcast_view(f, c, sa_ffi_buffer(f, 0, ARG_MASK), "mask", XLA_FFI_DataType_PRED, full,
                                           c->a.mask_dims, &v[V_MASK]))
                  : (e = sa_ffi_check_absent(f, t, sa_ffi_buffer(f, 0, ARG_MASK), "mask", "has_mask")))
    return e;
  if (c->has_pos) {
    if ((e = sa_ffi_view_make(f, t, g, sa_ffi_buffer(f, 0, ARG_QPOS), "query_positions", SA_S32T, 2, tw, NULL,
                              &v[V_QPOS])) ||
        (e = sa_ffi_view_make(f, t, g, sa_ffi_buffer(f, 0, ARG_KVPOS), "key_value_positions", SA_S32T, 2, sw, NULL,
                              &v[V_KVPOS])))
      return e;
  } else if ((e = sa_ffi_check_absent(f, t, sa_ffi_buffer(f, 0, ARG_QPOS), "query_positions", "has_positions")) ||
             (e = sa_ffi_check_absent(f, t, sa_ffi_buffer(f, 0, ARG_KVPOS), "key_value_positions", "has_positions"))) {
    return e;
  }
  if (v[V_BIAS].present && !sa_ffi_dtype_of(v[V_BIAS].buf->dtype, &c->a.bias_dtype))
    return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s: bias dtype unsupported", t);
  if (!c->bwd) return NULL;
  if (c->has_dbias)
    return sa_ffi_view_make(f, t, g, sa_ffi_buffer(f, 1, RET_DBIAS), "dbias", SA_F32T, 4, c->a.bias_dims, NULL,
                            &v[V_DBIAS]);
  return sa_ffi_check_absent(f, t, sa_ffi_buffer(f, 1, RET_DBIAS), "dbias", "has_dbias");
}

static XLA_FFI_Error *sa_ffi_decode(XLA_FFI_CallFrame *f, sa_ffi_call *c, int cuda) {
  int has_ql = 0, has_kl = 0, has_seg = 0;
  sa_attn_init(&c->a);
  XLA_FFI_Error *e = sa_ffi_decode_attrs(f, c, &has_ql, &has_kl, &has_seg);
  if (e) return e;
  int64_t want_args = c->bwd ? ARG_DLSE + 1 : ARG_KVPOS + 1;
  int64_t want_rets = c->bwd ? RET_WS + cuda : 2;
  if (f->args.size != want_args || f->rets.size != want_rets)
    return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                        "%s: got %lld inputs and %lld results: expected %lld and %lld", c->target,
                        (long long)f->args.size, (long long)f->rets.size, (long long)want_args, (long long)want_rets);
  XLA_FFI_Buffer *r0 = sa_ffi_buffer(f, 1, 0);
  if (!r0) return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s: result 0 is not a buffer", c->target);
  if ((e = sa_ffi_grid_from(f, c->target, r0, c->bwd ? "dq" : "out", 4, &c->g))) return e;

  const sa_ffi_grid *g = &c->g;
  sa_ffi_view *v = c->v;
  int64_t qd[4], kd[4], vd[4];
  const int64_t any4[4] = {-1, -1, -1, -1};
  if ((e = sa_ffi_view_make(f, c->target, g, sa_ffi_buffer(f, 0, ARG_Q), "query", XLA_FFI_DataType_INVALID, 4, any4, qd,
                            &v[V_Q])))
    return e;
  XLA_FFI_DataType dt = v[V_Q].buf->dtype;
  int64_t B = qd[0], T = qd[1], N = qd[2], H = qd[3];
  const int64_t kw[4] = {B, -1, -1, H};
  if ((e = sa_ffi_view_make(f, c->target, g, sa_ffi_buffer(f, 0, ARG_K), "key", dt, 4, kw, kd, &v[V_K]))) return e;
  int64_t S = kd[1], K = kd[2];
  const int64_t vw[4] = {B, S, K, -1};
  if ((e = sa_ffi_view_make(f, c->target, g, sa_ffi_buffer(f, 0, ARG_V), "value", dt, 4, vw, vd, &v[V_V]))) return e;
  int64_t Hv = vd[3];
  const int64_t ow[4] = {B, T, N, Hv}, lw[3] = {B, N, T}, nw[1] = {N}, bw[1] = {B}, tw[2] = {B, T}, sw[2] = {B, S};
  int learn = c->a.softmax == SA_SOFTMAX_LEARNABLE;
  if (learn && (e = sa_ffi_view_make(f, c->target, g, sa_ffi_buffer(f, 0, ARG_SINKS), "sinks", SA_F32T, 1, nw, NULL,
                                     &v[V_SINKS])))
    return e;
  if (has_ql && (e = sa_ffi_view_make(f, c->target, g, sa_ffi_buffer(f, 0, ARG_QLENS), "query_seq_lengths", SA_S32T, 1,
                                      bw, NULL, &v[V_QLENS])))
    return e;
  if (has_kl && (e = sa_ffi_view_make(f, c->target, g, sa_ffi_buffer(f, 0, ARG_KVLENS), "key_value_seq_lengths",
                                      SA_S32T, 1, bw, NULL, &v[V_KVLENS])))
    return e;
  if (has_seg && ((e = sa_ffi_view_make(f, c->target, g, sa_ffi_buffer(f, 0, ARG_QSEG), "query_segment_ids", SA_S32T, 2,
                                        tw, NULL, &v[V_QSEG])) ||
                  (e = sa_ffi_view_make(f, c->target, g, sa_ffi_buffer(f, 0, ARG_KVSEG), "key_value_segment_ids",
                                        SA_S32T, 2, sw, NULL, &v[V_KVSEG]))))
    return e;
  const int64_t full[4] = {B, N, T, S};
  if ((e = sa_ffi_decode_extras(f, c, full))) return e;
  int ob = c->bwd ? 0 : 1; /* out and lse: results of the forward, inputs of the backward */
  if ((e = sa_ffi_view_make(f, c->target, g, sa_ffi_buffer(f, ob, c->bwd ? ARG_OUT : 0), "out", dt, 4, ow, NULL,
                            &v[V_OUT])) ||
      (e = sa_ffi_view_make(f, c->target, g, sa_ffi_buffer(f, ob, c->bwd ? ARG_LSE : 1), "lse", SA_F32T, 3, lw, NULL,
                            &v[V_LSE])))
    return e;
  if (c->bwd) {
    if ((e = sa_ffi_view_make(f, c->target, g, sa_ffi_buffer(f, 0, ARG_DOUT), "dout", dt, 4, ow, NULL, &v[V_DOUT])))
      return e;
    if (c->has_dlse && (e = sa_ffi_view_make(f, c->target, g, sa_ffi_buffer(f, 0, ARG_DLSE), "dlse", SA_F32T, 3, lw,
                                             NULL, &v[V_DLSE])))
      return e;
    const int64_t dkw[4] = {B, S, K, H}, dvw[4] = {B, S, K, Hv}; /* dv: Hv is known now (vw leaves it open) */
    if ((e = sa_ffi_view_make(f, c->target, g, sa_ffi_buffer(f, 1, RET_DQ), "dq", dt, 4, qd, NULL, &v[V_DQ])) ||
        (e = sa_ffi_view_make(f, c->target, g, sa_ffi_buffer(f, 1, RET_DK), "dk", dt, 4, dkw, NULL, &v[V_DK])) ||
        (e = sa_ffi_view_make(f, c->target, g, sa_ffi_buffer(f, 1, RET_DV), "dv", dt, 4, dvw, NULL, &v[V_DV])))
      return e;
    if (learn && (e = sa_ffi_view_make(f, c->target, g, sa_ffi_buffer(f, 1, RET_DSINKS), "dsinks", SA_F32T, 1, nw, NULL,
                                       &v[V_DSINKS])))
      return e;
    const int64_t anyw[1] = {-1};
    if (cuda && (e = sa_ffi_view_make(f, c->target, g, sa_ffi_buffer(f, 1, RET_WS), "workspace", XLA_FFI_DataType_U8, 1,
                                      anyw, NULL, &v[V_WS])))
      return e;
  }
  if (!sa_ffi_dtype_of(dt, &c->a.dtype))
    return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s: query dtype unsupported", c->target);
  c->a.batch = B;
  c->a.q_len = T;
  c->a.kv_len = S;
  c->a.q_heads = N;
  c->a.kv_heads = K;
  c->a.head_dim = H;
  c->a.v_head_dim = Hv;
  return NULL;
}

/* ---- execution ----------------------------------------------------------------------------- */

static void *sa_ffi_ptr(const sa_ffi_call *c, int k, int64_t cell) {
  const sa_ffi_view *v = &c->v[k];
  if (!v->present || !v->buf->data) return NULL;
  int64_t off = cell < 0 ? 0 : sa_ffi_view_offset(&c->g, v, cell);
  return (char *)v->buf->data + off * (int64_t)sa_ffi_elem_size(v->buf->dtype);
}

/* A bias or mask spanning the grid with a full batch dim folds into the batch as [B * cells, ...]; one
   shared by the whole grid keeps its batch dim of 1. */
static int sa_ffi_bcast_full(const sa_ffi_call *c, int k, const int64_t *dims) {
  return c->v[k].lead_full && dims[0] == c->a.batch;
}

/* Points a/g at grid cell `cell` (-1: the whole grid folded into the batch). */
static void sa_ffi_bind(const sa_ffi_call *c, int64_t cell, sa_attn *a, sa_attn_grad *gr) {
  *a = c->a;
  if (cell < 0) {
    if (sa_ffi_bcast_full(c, V_BIAS, c->a.bias_dims)) a->bias_dims[0] *= c->g.cells;
    if (sa_ffi_bcast_full(c, V_MASK, c->a.mask_dims)) a->mask_dims[0] *= c->g.cells;
    a->batch *= c->g.cells;
  }
  a->q = sa_ffi_ptr(c, V_Q, cell);
  a->k = sa_ffi_ptr(c, V_K, cell);
  a->v = sa_ffi_ptr(c, V_V, cell);
  a->sinks = (const float *)sa_ffi_ptr(c, V_SINKS, cell);
  a->q_lens = (const int32_t *)sa_ffi_ptr(c, V_QLENS, cell);
  a->kv_lens = (const int32_t *)sa_ffi_ptr(c, V_KVLENS, cell);
  a->q_segment_ids = (const int32_t *)sa_ffi_ptr(c, V_QSEG, cell);
  a->kv_segment_ids = (const int32_t *)sa_ffi_ptr(c, V_KVSEG, cell);
  a->bias = sa_ffi_ptr(c, V_BIAS, cell);
  a->mask = (const uint8_t *)sa_ffi_ptr(c, V_MASK, cell);
  a->q_positions = (const int32_t *)sa_ffi_ptr(c, V_QPOS, cell);
  a->kv_positions = (const int32_t *)sa_ffi_ptr(c, V_KVPOS, cell);
  a->out = sa_ffi_ptr(c, V_OUT, cell);
  a->lse = (float *)sa_ffi_ptr(c, V_LSE, cell);
  if (!gr) return;
  memset(gr, 0, sizeof *gr);
  gr->dout = sa_ffi_ptr(c, V_DOUT, cell);
  gr->dlse = (const float *)sa_ffi_ptr(c, V_DLSE, cell);
  gr->dq = sa_ffi_ptr(c, V_DQ, cell);
  gr->dk = sa_ffi_ptr(c, V_DK, cell);
  gr->dv = sa_ffi_ptr(c, V_DV, cell);
  gr->dsinks = (float *)sa_ffi_ptr(c, V_DSINKS, cell);
  gr->dbias = (float *)sa_ffi_ptr(c, V_DBIAS, cell);
}

/* The grid folds into the batch when every batched buffer spans it fully and the shared ones (sinks) do
   not vary; a per-cell result that is reduced over the batch (dsinks, a dbias shared by the batch) forbids
   it. A bias or mask folds spanning the grid with a full batch dim, or shared by it with a batch dim of 1. */
static int sa_ffi_can_fold(const sa_ffi_call *c) {
  if (c->g.nlead == 0) return 1;
  for (int k = 0; k < V_COUNT; k++) {
    const sa_ffi_view *v = &c->v[k];
    if (!v->present || k == V_WS) continue;
    if (k == V_BIAS || k == V_MASK || k == V_DBIAS) {
      const int64_t *d = k == V_MASK ? c->a.mask_dims : c->a.bias_dims;
      if (!sa_ffi_bcast_full(c, k, d) && !(k != V_DBIAS && v->lead_ones && d[0] == 1)) return 0;
    } else if (k == V_SINKS ? !v->lead_ones : !v->lead_full) {
      return 0;
    }
  }
  return !c->v[V_DSINKS].present || c->g.cells == 1;
}

static XLA_FFI_Error *sa_ffi_run(XLA_FFI_CallFrame *f, sa_ffi_call *c, sa_backend be, void *stream) {
  sa_attn a;
  sa_attn_grad gr;
  if (be == SA_BACKEND_CPU && c->g.cells > 0) { /* an empty vmap grid has no cell 0 to bind */
    /* Cell 0 stands for all: support depends on sizes and options only. A configuration the CPU
       backend declines still runs, on the (slower, fp64) reference. */
    sa_ffi_bind(c, 0, &a, NULL);
    if (sa_attn_check(&a, SA_BACKEND_CPU) == SA_ERR_UNSUPPORTED) be = SA_BACKEND_REF;
  }
  int fold = sa_ffi_can_fold(c);
  size_t ws_total = c->v[V_WS].present ? (size_t)(c->v[V_WS].base_count * (c->g.cells ? c->g.cells : 1)) : 0;
  if (fold && c->bwd && be == SA_BACKEND_CUDA) {
    sa_ffi_bind(c, -1, &a, NULL);
    if (sa_attn_bwd_workspace_size(&a, be) > ws_total) fold = 0; /* Python sized it per cell */
  }
  int64_t ncalls = fold ? 1 : c->g.cells;
  for (int64_t cell = 0; cell < ncalls; cell++) {
    sa_ffi_bind(c, fold ? -1 : cell, &a, c->bwd ? &gr : NULL);
    sa_status s;
    if (c->bwd) {
      void *ws = fold ? sa_ffi_ptr(c, V_WS, -1) : sa_ffi_ptr(c, V_WS, cell);
      size_t wsz = !c->v[V_WS].present ? 0 : fold ? ws_total : (size_t)c->v[V_WS].base_count;
      s = sa_attn_bwd(&a, &gr, ws, wsz, be, stream);
    } else {
      s = sa_attn_fwd(&a, be, stream);
    }
    if (s != SA_OK) return sa_ffi_status_error(f, c->target, s);
  }
  return NULL;
}

static XLA_FFI_Error *sa_ffi_attn(XLA_FFI_CallFrame *f, const char *target, int bwd, int cuda) {
  if (sa_ffi_metadata(f, 0)) return NULL;
  if (f->stage != XLA_FFI_ExecutionStage_EXECUTE)
    return sa_ffi_error(f, XLA_FFI_Error_Code_UNIMPLEMENTED, "%s: only the execute stage is implemented", target);
  sa_ffi_call c;
  memset(&c, 0, sizeof c);
  c.target = target;
  c.bwd = bwd;
  XLA_FFI_Error *e = sa_ffi_decode(f, &c, cuda);
  if (e) return e;
  void *stream = NULL;
  if (cuda) {
    XLA_FFI_Stream_Get_Args sg;
    memset(&sg, 0, sizeof sg);
    sg.struct_size = XLA_FFI_Stream_Get_Args_STRUCT_SIZE;
    sg.extension_start = NULL;
    sg.ctx = f->ctx;
    if ((e = f->api->XLA_FFI_Stream_Get(&sg))) return e;
    stream = sg.stream;
  }
  return sa_ffi_run(f, &c, cuda ? SA_BACKEND_CUDA : SA_BACKEND_CPU, stream);
}

SA_FFI_EXPORT XLA_FFI_Error *sa_jax_attn_fwd_cpu(XLA_FFI_CallFrame *f) {
  return sa_ffi_attn(f, "sinkattn_fwd(cpu)", 0, 0);
}
SA_FFI_EXPORT XLA_FFI_Error *sa_jax_attn_bwd_cpu(XLA_FFI_CallFrame *f) {
  return sa_ffi_attn(f, "sinkattn_bwd(cpu)", 1, 0);
}
SA_FFI_EXPORT XLA_FFI_Error *sa_jax_attn_fwd_cuda(XLA_FFI_CallFrame *f) {
  return sa_ffi_attn(f, "sinkattn_fwd(CUDA)", 0, 1);
}
SA_FFI_EXPORT XLA_FFI_Error *sa_jax_attn_bwd_cuda(XLA_FFI_CallFrame *f) {
  return sa_ffi_attn(f, "sinkattn_bwd(CUDA)", 1, 1);
}

/* ---- ctypes queries ------------------------------------------------------------------------ */

/* Bytes of backward workspace for one grid cell of this problem on `backend` (an sa_backend value);
   0 when none is needed or the problem is invalid (the handler then reports why). Shape-only: the
   lengths/segments flags only say whether those inputs exist. */
SA_FFI_EXPORT size_t sa_jax_bwd_workspace_size(int dtype, int64_t batch, int64_t q_len, int64_t kv_len, int64_t q_heads,
                                               int64_t kv_heads, int64_t head_dim, int64_t v_head_dim, int softmax,
                                               int causal, int64_t window_left, int64_t window_right,
                                               int64_t diag_offset, int has_lengths, int has_segments,
                                               float logits_soft_cap, int backend) {
  sa_attn a;
  sa_ffi_attn_of_shape(&a, dtype, batch, q_len, kv_len, q_heads, kv_heads, head_dim, v_head_dim);
  sa_ffi_attn_options(&a, softmax, causal, window_left, window_right, diag_offset, has_lengths, has_segments);
  a.logits_soft_cap = logits_soft_cap;
  return sa_attn_bwd_workspace_size(&a, (sa_backend)backend);
}

/* Whether the CUDA backend takes a problem of this dtype, these sizes, these optional inputs and this soft-cap
   (shape-only: data pointers are NULL, which every alignment check accepts): the attention kernels (sa_attn_fwd /
   sa_attn_bwd), or with decode != 0 the decode kernels (sa_attn_decode_fwd: causal bottom-right over cache lengths).
   The inputs the CUDA kernels do not take are asked first and need no device, so Python learns them from the library
   (sa_check_cuda_inputs) on any machine. A bias, a mask, positions or a soft-cap of the attention kernels are not
   described enough here for the feature plans (their shapes, the segment ids, causal / window, the workspace): with
   one the answer is no, naming sa_jax_cuda_supported_call (ffi_query.c), the query that takes them. Writes the reason
   into why[why_len] when the answer is no, so Python can fall back to the reference and say why. 1 = supported. */
SA_FFI_EXPORT int sa_jax_cuda_supported(int dtype, int64_t batch, int64_t q_len, int64_t kv_len, int64_t q_heads,
                                        int64_t kv_heads, int64_t head_dim, int64_t v_head_dim, int has_bias,
                                        int has_mask, int has_positions, float logits_soft_cap, int decode, char *why,
                                        size_t why_len) {
  static const int32_t marker[1] = {0};
  sa_attn a;
  sa_ffi_attn_of_shape(&a, dtype, batch, q_len, kv_len, q_heads, kv_heads, head_dim, v_head_dim);
  for (int d = 0; d < 4; d++) {
    a.bias_dims[d] = has_bias ? 1 : 0;
    a.mask_dims[d] = has_mask ? 1 : 0;
  }
  if (has_positions) a.q_positions = a.kv_positions = marker;
  a.logits_soft_cap = logits_soft_cap;
  if (decode) {
    a.causal = SA_CAUSAL_BOTTOM_RIGHT;
    a.kv_lens = marker;
  }
  sa_clear_error();
  const char *feat = has_bias                 ? "bias"
                     : has_mask               ? "mask"
                     : has_positions          ? "q_positions / kv_positions"
                     : logits_soft_cap != 0.f ? "logits_soft_cap"
                                              : NULL;
  if (feat && !decode) {
    if (why && why_len)
      snprintf(why, why_len,
               "%s unsupported by the CUDA backend for a call described by sizes alone (its shape, the segment ids, "
               "causal / window and the workspace decide: sa_jax_cuda_supported_call)",
               feat);
    return 0;
  }
  int ok = sa_check_cuda_inputs(&a) == SA_OK && (decode || sa_cuda_dtype_check(&a, 0) == SA_OK);
  ok = ok && sa_has_cuda() && (decode ? sa_cuda_decode_supported(&a) : sa_cuda_attn_supported(&a)) == SA_OK;
  if (!ok && why && why_len) snprintf(why, why_len, "%s", *sa_last_error() ? sa_last_error() : "built without CUDA");
  return ok;
}

/* The buffer layout and attribute set of the attention and decode handlers (see the top of this file): 2 takes
   bias, mask and positions and returns dbias; 3 drops the backward's `deterministic` attribute; 4 adds
   `logits_soft_cap` to every handler. */
SA_FFI_EXPORT int sa_jax_attn_abi_version(void) { return SA_FFI_ABI_VERSION; }
