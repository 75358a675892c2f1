/*
 * ffi_util.c — call-frame decoding for the XLA FFI handlers: errors, attributes by name with type checks,
 * and buffers seen through the vmap grid (see sa_ffi.h).
 */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "sa_ffi.h"

static XLA_FFI_Error *sa_ffi_verror(const XLA_FFI_CallFrame *f, XLA_FFI_Error_Code code, const char *fmt, va_list ap) {
  char msg[768];
  vsnprintf(msg, sizeof msg, fmt, ap);
  XLA_FFI_Error_Create_Args args;
  memset(&args, 0, sizeof args);
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.extension_start = NULL;
  args.message = msg; /* copied by XLA */
  args.errc = code;
  return f->api->XLA_FFI_Error_Create(&args);
}

XLA_FFI_Error *sa_ffi_error(const XLA_FFI_CallFrame *f, XLA_FFI_Error_Code code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  XLA_FFI_Error *e = sa_ffi_verror(f, code, fmt, ap);
  va_end(ap);
  return e;
}

XLA_FFI_Error *sa_ffi_status_error(const XLA_FFI_CallFrame *f, const char *target, sa_status s) {
  XLA_FFI_Error_Code code;
  switch (s) {
    case SA_ERR_INVALID: code = XLA_FFI_Error_Code_INVALID_ARGUMENT; break;
    case SA_ERR_UNSUPPORTED: code = XLA_FFI_Error_Code_UNIMPLEMENTED; break;
    case SA_ERR_NO_MEMORY: code = XLA_FFI_Error_Code_RESOURCE_EXHAUSTED; break;
    default: code = XLA_FFI_Error_Code_INTERNAL; break;
  }
  const char *why = sa_last_error();
  return sa_ffi_error(f, code, "%s: %s: %s", target, sa_status_name(s), why && *why ? why : "(no detail)");
}

/* ---- attributes ---------------------------------------------------------------------------- */

static int sa_ffi_name_is(const XLA_FFI_ByteSpan *s, const char *name) {
  size_t n = strlen(name);
  return s->len == n && memcmp(s->ptr, name, n) == 0;
}

/* Python ints arrive as S64 (np.int32 as S32), bools as PRED, floats as F64 (np.float32 as F32). */
static int sa_ffi_scalar_int(const XLA_FFI_Scalar *sc, int64_t *out) {
  switch (sc->dtype) {
    case XLA_FFI_DataType_S64: *out = *(const int64_t *)sc->value; return 1;
    case XLA_FFI_DataType_S32: *out = *(const int32_t *)sc->value; return 1;
    case XLA_FFI_DataType_PRED: *out = *(const uint8_t *)sc->value != 0; return 1;
    default: return 0;
  }
}

XLA_FFI_Error *sa_ffi_attrs_decode(const XLA_FFI_CallFrame *f, const char *target, sa_ffi_attr *want, int n) {
  for (int k = 0; k < n; k++) want[k].found = 0;
  for (int64_t a = 0; a < f->attrs.size; a++) {
    const XLA_FFI_ByteSpan *name = f->attrs.names[a];
    int k = 0;
    while (k < n && !sa_ffi_name_is(name, want[k].name)) k++;
    if (k == n)
      return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s: unknown attribute '%.*s'", target,
                          (int)name->len, name->ptr);
    if (f->attrs.types[a] != XLA_FFI_AttrType_SCALAR)
      return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s: attribute %s must be a scalar", target,
                          want[k].name);
    const XLA_FFI_Scalar *sc = (const XLA_FFI_Scalar *)f->attrs.attrs[a];
    int ok = 0;
    if (want[k].kind == SA_ATTR_FLOAT) {
      if (sc->dtype == XLA_FFI_DataType_F32) {
        want[k].f = *(const float *)sc->value;
        ok = 1;
      }
      if (sc->dtype == XLA_FFI_DataType_F64) {
        want[k].f = *(const double *)sc->value;
        ok = 1;
      }
    } else if (want[k].kind == SA_ATTR_BOOL) {
      ok = sa_ffi_scalar_int(sc, &want[k].i) && (want[k].i == 0 || want[k].i == 1);
    } else {
      ok = sc->dtype != XLA_FFI_DataType_PRED && sa_ffi_scalar_int(sc, &want[k].i);
    }
    if (!ok)
      return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s: attribute %s has XLA dtype %d: expected %s",
                          target, want[k].name, (int)sc->dtype,
                          want[k].kind == SA_ATTR_FLOAT  ? "f32 or f64"
                          : want[k].kind == SA_ATTR_BOOL ? "bool (or an integer 0/1)"
                                                         : "s32 or s64");
    want[k].found = 1;
  }
  for (int k = 0; k < n; k++)
    if (want[k].required && !want[k].found)
      return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s: missing attribute %s", target, want[k].name);
  return NULL;
}

XLA_FFI_Error *sa_ffi_soft_cap(const XLA_FFI_CallFrame *f, const char *target, double v, float *out) {
  if ((isfinite(v) && fabs(v) > FLT_MAX) || (v != 0.0 && (float)v == 0.0f))
    return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                        "%s: logits_soft_cap %g is outside float32's range: use a cap in [%g, %g], or 0 for none",
                        target, v, (double)FLT_TRUE_MIN, (double)FLT_MAX);
  *out = (float)v;
  return NULL;
}

/* ---- buffers ------------------------------------------------------------------------------- */

int sa_ffi_dtype_of(XLA_FFI_DataType t, sa_dtype *out) {
  switch (t) {
    case XLA_FFI_DataType_F32: *out = SA_F32; return 1;
    case XLA_FFI_DataType_F16: *out = SA_F16; return 1;
    case XLA_FFI_DataType_BF16: *out = SA_BF16; return 1;
    default: return 0;
  }
}

size_t sa_ffi_elem_size(XLA_FFI_DataType t) {
  switch (t) {
    case XLA_FFI_DataType_F64:
    case XLA_FFI_DataType_S64:
    case XLA_FFI_DataType_U64: return 8;
    case XLA_FFI_DataType_F32:
    case XLA_FFI_DataType_S32:
    case XLA_FFI_DataType_U32: return 4;
    case XLA_FFI_DataType_F16:
    case XLA_FFI_DataType_BF16:
    case XLA_FFI_DataType_S16:
    case XLA_FFI_DataType_U16: return 2;
    default: return 1;
  }
}

static const char *sa_ffi_dtype_name(XLA_FFI_DataType t) {
  switch (t) {
    case XLA_FFI_DataType_F32: return "float32";
    case XLA_FFI_DataType_F16: return "float16";
    case XLA_FFI_DataType_BF16: return "bfloat16";
    case XLA_FFI_DataType_F64: return "float64";
    case XLA_FFI_DataType_S32: return "int32";
    case XLA_FFI_DataType_S64: return "int64";
    case XLA_FFI_DataType_U8: return "uint8";
    case XLA_FFI_DataType_PRED: return "bool";
    default: return "(other)";
  }
}

XLA_FFI_Buffer *sa_ffi_buffer(const XLA_FFI_CallFrame *f, int is_ret, int64_t i) {
  if (is_ret) {
    if (i >= f->rets.size || f->rets.types[i] != XLA_FFI_RetType_BUFFER) return NULL;
    return (XLA_FFI_Buffer *)f->rets.rets[i];
  }
  if (i >= f->args.size || f->args.types[i] != XLA_FFI_ArgType_BUFFER) return NULL;
  return (XLA_FFI_Buffer *)f->args.args[i];
}

XLA_FFI_Error *sa_ffi_grid_from(const XLA_FFI_CallFrame *f, const char *target, XLA_FFI_Buffer *b, const char *name,
                                int base_rank, sa_ffi_grid *g) {
  int nlead = (int)b->rank - base_rank;
  if (nlead < 0 || nlead > SA_FFI_MAX_LEAD)
    return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                        "%s: %s has rank %lld: expected %d, plus at most %d vmap dims in front", target, name,
                        (long long)b->rank, base_rank, SA_FFI_MAX_LEAD);
  g->nlead = nlead;
  g->cells = 1;
  for (int d = 0; d < nlead; d++) {
    g->lead[d] = b->dims[d];
    g->cells *= b->dims[d];
  }
  return NULL;
}

XLA_FFI_Error *sa_ffi_view_make(const XLA_FFI_CallFrame *f, const char *target, const sa_ffi_grid *g, XLA_FFI_Buffer *b,
                                const char *name, XLA_FFI_DataType dtype, int base_rank, const int64_t *want_dims,
                                int64_t *got_dims, sa_ffi_view *v) {
  memset(v, 0, sizeof *v);
  v->name = name;
  v->buf = b;
  v->present = 1;
  if (!b)
    return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s: %s is missing or not a buffer", target, name);
  if (b->rank != g->nlead + base_rank)
    return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s: %s has rank %lld: expected %d (%d vmap + %d)",
                        target, name, (long long)b->rank, g->nlead + base_rank, g->nlead, base_rank);
  int dtype_ok =
      dtype == XLA_FFI_DataType_INVALID
          ? (b->dtype == XLA_FFI_DataType_F32 || b->dtype == XLA_FFI_DataType_F16 || b->dtype == XLA_FFI_DataType_BF16)
          : b->dtype == dtype;
  if (!dtype_ok)
    return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s: %s has dtype %s: expected %s", target, name,
                        sa_ffi_dtype_name(b->dtype),
                        dtype == XLA_FFI_DataType_INVALID ? "float32, float16 or bfloat16" : sa_ffi_dtype_name(dtype));
  const int64_t *base = b->dims + g->nlead;
  v->base_count = 1;
  for (int d = 0; d < base_rank; d++) {
    if (want_dims && want_dims[d] >= 0 && base[d] != want_dims[d]) {
      char seen[160], want[160];
      int ps = 0, pw = 0;
      for (int e = 0; e < base_rank; e++) {
        ps += snprintf(seen + ps, sizeof seen - (size_t)ps, "%s%lld", e ? "," : "", (long long)base[e]);
        if (want_dims[e] >= 0)
          pw += snprintf(want + pw, sizeof want - (size_t)pw, "%s%lld", e ? "," : "", (long long)want_dims[e]);
        else pw += snprintf(want + pw, sizeof want - (size_t)pw, "%s?", e ? "," : "");
      }
      return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT, "%s: %s has shape [%s]: expected [%s] (dim %d)",
                          target, name, seen, want, d);
    }
    if (got_dims) got_dims[d] = base[d];
    v->base_count *= base[d];
  }
  v->lead_full = 1;
  v->lead_ones = 1;
  int64_t stride = v->base_count;
  for (int d = g->nlead - 1; d >= 0; d--) {
    int64_t n = b->dims[d];
    if (n != g->lead[d] && n != 1)
      return sa_ffi_error(f, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                          "%s: %s vmap dim %d has size %lld: expected %lld or 1", target, name, d, (long long)n,
                          (long long)g->lead[d]);
    if (n != g->lead[d]) v->lead_full = 0;
    if (n != 1) v->lead_ones = 0;
    v->lead_stride[d] = n == 1 ? 0 : stride;
    stride *= n;
  }
  return NULL;
}

int64_t sa_ffi_view_offset(const sa_ffi_grid *g, const sa_ffi_view *v, int64_t c) {
  int64_t off = 0;
  for (int d = g->nlead - 1; d >= 0; d--) {
    int64_t n = g->lead[d];
    off += (c % n) * v->lead_stride[d];
    c /= n;
  }
  return off;
}

void sa_ffi_attn_of_shape(sa_attn *a, int dtype, int64_t batch, int64_t q_len, int64_t kv_len, int64_t q_heads,
                          int64_t kv_heads, int64_t head_dim, int64_t v_head_dim) {
  sa_attn_init(a);
  a->dtype = (sa_dtype)dtype;
  a->batch = batch;
  a->q_len = q_len;
  a->kv_len = kv_len;
  a->q_heads = q_heads;
  a->kv_heads = kv_heads;
  a->head_dim = head_dim;
  a->v_head_dim = v_head_dim;
}
