/*
 * ffi_decode.c — the XLA FFI handlers of sinkattn.decode_attention (forward only), "cpu" and "CUDA":
 *   args   q [B,T,N,H]  k_cache [B,S,K,H]  v_cache [B,S,K,Hv]  sinks [N] f32  cache_lengths [B] s32
 *   rets   out [B,T,N,Hv]  lse [B,N,T] f32  [workspace u8 (CUDA only; Python sizes it through
 *          sa_jax_decode_workspace_size at trace time)]
 *   attrs  logits_soft_cap (float, 0 = no cap), scale (float), softmax (int), window_left, window_right (int)
 * sinks is a placeholder that is never read unless softmax is LEARNABLE. The mask is always causal
 * bottom-right with per-batch cache lengths: query row i sits at position cache_len - T + i.
 * Python calls these with vmap_method="sequential", so buffers never carry vmap dims here.
 */
#include <string.h>

#include "sa_ffi.h"

enum { D_Q, D_K, D_V, D_SINKS, D_LENS, D_OUT, D_LSE, D_WS, D_COUNT };
enum { DA_SCALE, DA_SOFTMAX, DA_WINDOW_LEFT, DA_WINDOW_RIGHT, DA_LOGITS_SOFT_CAP, DA_COUNT }; /* the attributes */

static XLA_FFI_Error *sa_ffi_decode_call(XLA_FFI_CallFrame *f, const char *target, int cuda) {
  if (sa_ffi_metadata(f, 0)) return NULL;
  if (f->stage != XLA_FFI_ExecutionStage_EXECUTE)
    return sa_ffi_error(f, XLA_FFI_Error_Code_UNIMPLEMENTED, "%s: only the execute stage is implemented", target);
  sa_ffi_attr at[DA_COUNT] = {
      [DA_SCALE] = {"scale", SA_ATTR_FLOAT, 1, 0, 0, 0},
      [DA_SOFTMAX] = {"softmax", SA_ATTR_INT, 1, 0, 0, 0},
      [DA_WINDOW_LEFT] = {"window_left", SA_ATTR_INT, 1, 0, 0, 0},
      [DA_WINDOW_RIGHT] = {"window_right", SA_ATTR_INT, 1, 0, 0, 0},
      [DA_LOGITS_SOFT_CAP] = {"logits_soft_cap", SA_ATTR_FLOAT, 1, 0, 0, 0},
  };
  XLA_FFI_Error *e = sa_ffi_attrs_decode(f, target, at, DA_COUNT);
  if (e) return e;
  const int64_t softmax = at[DA_SOFTMAX].i;
  if (softmax < 0 || softmax > 2)
    return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s: softmax %lld invalid: use 0, 1 or 2", target,
                        (long long)softmax);
  if (f->args.size != D_OUT || f->rets.size != 2 + cuda)
    return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                        "%s: got %lld inputs and %lld results: expected %d and %d", target, (long long)f->args.size,
                        (long long)f->rets.size, D_OUT, 2 + cuda);

  sa_ffi_grid g;
  sa_ffi_view v[D_COUNT];
  memset(v, 0, sizeof v);
  XLA_FFI_Buffer *r0 = sa_ffi_buffer(f, 1, 0);
  if (!r0) return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s: result 0 is not a buffer", target);
  if ((e = sa_ffi_grid_from(f, target, r0, "out", 4, &g))) return e;
  if (g.nlead != 0)
    return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s: out has rank %lld: expected 4", target,
                        (long long)r0->rank);
  int64_t qd[4], kd[4], vd[4];
  const int64_t any4[4] = {-1, -1, -1, -1};
  if ((e = sa_ffi_view_make(f, target, &g, sa_ffi_buffer(f, 0, D_Q), "query", XLA_FFI_DataType_INVALID, 4, any4, qd,
                            &v[D_Q])))
    return e;
  XLA_FFI_DataType dt = v[D_Q].buf->dtype;
  const int64_t B = qd[0], T = qd[1], N = qd[2], H = qd[3];
  const int64_t kw[4] = {B, -1, -1, H};
  if ((e = sa_ffi_view_make(f, target, &g, sa_ffi_buffer(f, 0, D_K), "k_cache", dt, 4, kw, kd, &v[D_K]))) return e;
  const int64_t S = kd[1], K = kd[2];
  const int64_t vw[4] = {B, S, K, -1};
  if ((e = sa_ffi_view_make(f, target, &g, sa_ffi_buffer(f, 0, D_V), "v_cache", dt, 4, vw, vd, &v[D_V]))) return e;
  const int64_t Hv = vd[3];
  const int64_t nw[1] = {N}, bw[1] = {B}, ow[4] = {B, T, N, Hv}, lw[3] = {B, N, T};
  if (softmax == SA_SOFTMAX_LEARNABLE && (e = sa_ffi_view_make(f, target, &g, sa_ffi_buffer(f, 0, D_SINKS), "sinks",
                                                               XLA_FFI_DataType_F32, 1, nw, NULL, &v[D_SINKS])))
    return e;
  if ((e = sa_ffi_view_make(f, target, &g, sa_ffi_buffer(f, 0, D_LENS), "cache_lengths", XLA_FFI_DataType_S32, 1, bw,
                            NULL, &v[D_LENS])) ||
      (e = sa_ffi_view_make(f, target, &g, r0, "out", dt, 4, ow, NULL, &v[D_OUT])) ||
      (e = sa_ffi_view_make(f, target, &g, sa_ffi_buffer(f, 1, D_LSE - D_OUT), "lse", XLA_FFI_DataType_F32, 3, lw, NULL,
                            &v[D_LSE])))
    return e;
  const int64_t anyw[1] = {-1};
  if (cuda && (e = sa_ffi_view_make(f, target, &g, sa_ffi_buffer(f, 1, D_WS - D_OUT), "workspace", XLA_FFI_DataType_U8,
                                    1, anyw, NULL, &v[D_WS])))
    return e;

  sa_attn a;
  sa_attn_init(&a);
  if (!sa_ffi_dtype_of(dt, &a.dtype))
    return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s: query dtype unsupported", target);
  a.batch = B;
  a.q_len = T;
  a.kv_len = S;
  a.q_heads = N;
  a.kv_heads = K;
  a.head_dim = H;
  a.v_head_dim = Hv;
  a.scale = (float)at[DA_SCALE].f;
  a.softmax = (sa_softmax)softmax;
  a.window_left = at[DA_WINDOW_LEFT].i;
  a.window_right = at[DA_WINDOW_RIGHT].i;
  if ((e = sa_ffi_soft_cap(f, target, at[DA_LOGITS_SOFT_CAP].f, &a.logits_soft_cap))) return e;
  a.causal = SA_CAUSAL_BOTTOM_RIGHT;
  a.q = v[D_Q].buf->data;
  a.k = v[D_K].buf->data;
  a.v = v[D_V].buf->data;
  a.sinks = v[D_SINKS].present ? (const float *)v[D_SINKS].buf->data : NULL;
  a.kv_lens = (const int32_t *)v[D_LENS].buf->data;
  a.out = v[D_OUT].buf->data;
  a.lse = (float *)v[D_LSE].buf->data;

  void *stream = NULL, *ws = NULL;
  size_t wsz = 0;
  if (cuda) {
    XLA_FFI_Stream_Get_Args sg;
    memset(&sg, 0, sizeof sg);
    sg.struct_size = XLA_FFI_Stream_Get_Args_STRUCT_SIZE;
    sg.extension_start = NULL;
    sg.ctx = f->ctx;
    if ((e = f->api->XLA_FFI_Stream_Get(&sg))) return e;
    stream = sg.stream;
    ws = v[D_WS].buf->data;
    wsz = (size_t)v[D_WS].base_count;
  }
  sa_status s = sa_attn_decode_fwd(&a, ws, wsz, cuda ? SA_BACKEND_CUDA : SA_BACKEND_CPU, stream);
  return s == SA_OK ? NULL : sa_ffi_status_error(f, target, s);
}

SA_FFI_EXPORT XLA_FFI_Error *sa_jax_decode_fwd_cpu(XLA_FFI_CallFrame *f) {
  return sa_ffi_decode_call(f, "sinkattn_decode(cpu)", 0);
}
SA_FFI_EXPORT XLA_FFI_Error *sa_jax_decode_fwd_cuda(XLA_FFI_CallFrame *f) {
  return sa_ffi_decode_call(f, "sinkattn_decode(CUDA)", 1);
}

/* Bytes of decode workspace for this shape on `backend` (an sa_backend; CUDA is the one that needs it),
   at least 1 so the workspace result is never a zero-size buffer. Shape-only. */
SA_FFI_EXPORT size_t sa_jax_decode_workspace_size(int dtype, int64_t batch, int64_t q_len, int64_t kv_len,
                                                  int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                                                  int64_t v_head_dim, int backend) {
  sa_attn a;
  sa_ffi_attn_of_shape(&a, dtype, batch, q_len, kv_len, q_heads, kv_heads, head_dim, v_head_dim);
  a.causal = SA_CAUSAL_BOTTOM_RIGHT;
  size_t n = sa_attn_decode_workspace_size(&a, (sa_backend)backend);
  return n > 0 ? n : 1;
}

/* The longest query the decode handlers take (SA_DECODE_MAX_Q_LEN of sinkattn.h), for Python's checks. */
SA_FFI_EXPORT int sa_jax_decode_max_q_len(void) { return SA_DECODE_MAX_Q_LEN; }
