/*
 * sinkattn.c — the public entry points: validation (sa_attn_check), backend choice and dispatch,
 * status names and the thread-local error message. Every argument is checked here, once, before any
 * backend runs; backends may then assume a well-formed sa_attn.
 */
#include <stdarg.h>
#include <stdio.h>

#include "sa_internal.h"
#include "sa_plan.h"

/* ---- errors ---------------------------------------------------------------------------------- */

static _Thread_local char sa_err_msg[512];

sa_status sa_error(sa_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sa_err_msg, sizeof sa_err_msg, fmt, ap);
  va_end(ap);
  return s;
}

void sa_clear_error(void) { sa_err_msg[0] = '\0'; }

const char *sa_last_error(void) { return sa_err_msg; }

const char *sa_status_name(sa_status s) {
  switch (s) {
    case SA_OK: return "SA_OK";
    case SA_ERR_INVALID: return "SA_ERR_INVALID";
    case SA_ERR_UNSUPPORTED: return "SA_ERR_UNSUPPORTED";
    case SA_ERR_NO_MEMORY: return "SA_ERR_NO_MEMORY";
    case SA_ERR_DEVICE: return "SA_ERR_DEVICE";
  }
  return "SA_ERR_UNKNOWN";
}

void sa_attn_init(sa_attn *a) {
  if (!a) return;
  memset(a, 0, sizeof *a);
  a->window_left = -1;
  a->window_right = -1;
}

int sa_has_cuda(void) {
#ifdef SINKATTN_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

/* ---- validation ------------------------------------------------------------------------------ */

/* x * y * ... without overflow: element counts must fit in int64 (and so in size_t on 64-bit). */
static int sa_mul_ok(int64_t *acc, int64_t x) {
  if (x != 0 && *acc > INT64_MAX / x) return 0;
  *acc *= x;
  return 1;
}

static sa_status sa_check_count(const char *name, int64_t d0, int64_t d1, int64_t d2, int64_t d3, size_t elem,
                                int64_t *count) {
  int64_t n = 1;
  if (!sa_mul_ok(&n, d0) || !sa_mul_ok(&n, d1) || !sa_mul_ok(&n, d2) || !sa_mul_ok(&n, d3) ||
      !sa_mul_ok(&n, (int64_t)elem))
    return sa_error(SA_ERR_INVALID, "%s: size %lld x %lld x %lld x %lld overflows", name, (long long)d0, (long long)d1,
                    (long long)d2, (long long)d3);
  *count = n;
  return SA_OK;
}

/* Byte counts of q, k, v, out: part of the shape check (the workspace sizes multiply them too). */
static sa_status sa_check_counts(const sa_attn *a, int64_t *nq, int64_t *nk, int64_t *nv, int64_t *no) {
  size_t es = sa_dtype_size(a->dtype);
  sa_status s;
  if ((s = sa_check_count("q", a->batch, a->q_len, a->q_heads, a->head_dim, es, nq)) != SA_OK) return s;
  if ((s = sa_check_count("k", a->batch, a->kv_len, a->kv_heads, a->head_dim, es, nk)) != SA_OK) return s;
  if ((s = sa_check_count("v", a->batch, a->kv_len, a->kv_heads, a->v_head_dim, es, nv)) != SA_OK) return s;
  return sa_check_count("out", a->batch, a->q_len, a->q_heads, a->v_head_dim, es, no);
}

static const char *const sa_axis_names[4] = {"batch", "q_heads", "q_len", "kv_len"};

/* A bias or mask shape (name_dims) must broadcast to [B,N,T,S]: all 0 (absent), or each dim 1 or the full
   size; *count gets its elements (0 when absent). */
static sa_status sa_check_bcast_dims(const sa_attn *a, const char *name, const int64_t d[4], size_t elem,
                                     int64_t *count) {
  const int64_t full[4] = {a->batch, a->q_heads, a->q_len, a->kv_len};
  *count = 0;
  if (!sa_dims_set(d)) return SA_OK;
  for (int x = 0; x < 4; x++)
    if (d[x] != 1 && d[x] != full[x])
      return sa_error(SA_ERR_INVALID,
                      "%s_dims[%d] %lld invalid: must be 1 or %s %lld (%s broadcasts to "
                      "[batch, q_heads, q_len, kv_len] = [%lld, %lld, %lld, %lld])",
                      name, x, (long long)d[x], sa_axis_names[x], (long long)full[x], name, (long long)full[0],
                      (long long)full[1], (long long)full[2], (long long)full[3]);
  return sa_check_count(name, d[0], d[1], d[2], d[3], elem, count);
}

/* The pointer of a bias or mask against its dims: set with dims all 0 is a shape left out; NULL with dims
   set is allowed for an empty one only (as every buffer). */
static sa_status sa_check_bcast_ptr(const char *name, const void *p, const int64_t d[4], int64_t count) {
  if (p && !sa_dims_set(d))
    return sa_error(SA_ERR_INVALID,
                    "%s is set but %s_dims[0] is 0: give its shape (each dim 1 or the full "
                    "batch, q_heads, q_len, kv_len)",
                    name, name);
  if (!p && count > 0)
    return sa_error(SA_ERR_INVALID,
                    "%s is NULL but %s_dims is [%lld, %lld, %lld, %lld]: give the buffer, "
                    "or dims all 0 for none",
                    name, name, (long long)d[0], (long long)d[1], (long long)d[2], (long long)d[3]);
  return SA_OK;
}

#define SA_NEED_PTR(ptr, nonempty, name)                                                                         \
  do {                                                                                                           \
    if ((nonempty) && !(ptr)) return sa_error(SA_ERR_INVALID, name " is NULL (a non-empty buffer is required)"); \
  } while (0)

/* Sizes, enums and options: what the workspace size depends on. Pointers are not looked at. */
sa_status sa_check_dims(const sa_attn *a) {
  if (!a) return sa_error(SA_ERR_INVALID, "attn is NULL");
  if (a->dtype != SA_F32 && a->dtype != SA_F16 && a->dtype != SA_BF16)
    return sa_error(SA_ERR_INVALID, "dtype %d invalid: use SA_F32 (0), SA_F16 (1) or SA_BF16 (2)", (int)a->dtype);
  if (a->batch < 0) return sa_error(SA_ERR_INVALID, "batch %lld invalid: must be >= 0", (long long)a->batch);
  if (a->q_len < 0) return sa_error(SA_ERR_INVALID, "q_len %lld invalid: must be >= 0", (long long)a->q_len);
  if (a->kv_len < 0) return sa_error(SA_ERR_INVALID, "kv_len %lld invalid: must be >= 0", (long long)a->kv_len);
  if (a->q_heads < 1) return sa_error(SA_ERR_INVALID, "q_heads %lld invalid: must be >= 1", (long long)a->q_heads);
  if (a->kv_heads < 1) return sa_error(SA_ERR_INVALID, "kv_heads %lld invalid: must be >= 1", (long long)a->kv_heads);
  if (a->q_heads % a->kv_heads != 0)
    return sa_error(SA_ERR_INVALID, "q_heads %lld invalid: must be a multiple of kv_heads %lld", (long long)a->q_heads,
                    (long long)a->kv_heads);
  if (a->head_dim < 1) return sa_error(SA_ERR_INVALID, "head_dim %lld invalid: must be >= 1", (long long)a->head_dim);
  if (a->v_head_dim < 1)
    return sa_error(SA_ERR_INVALID, "v_head_dim %lld invalid: must be >= 1", (long long)a->v_head_dim);
  if (a->softmax != SA_SOFTMAX_VANILLA && a->softmax != SA_SOFTMAX_OFF_BY_ONE && a->softmax != SA_SOFTMAX_LEARNABLE)
    return sa_error(
        SA_ERR_INVALID,
        "softmax %d invalid: use SA_SOFTMAX_VANILLA (0), SA_SOFTMAX_OFF_BY_ONE (1) or SA_SOFTMAX_LEARNABLE (2)",
        (int)a->softmax);
  if (a->causal != SA_CAUSAL_NONE && a->causal != SA_CAUSAL_TOP_LEFT && a->causal != SA_CAUSAL_BOTTOM_RIGHT)
    return sa_error(SA_ERR_INVALID,
                    "causal %d invalid: use SA_CAUSAL_NONE (0), SA_CAUSAL_TOP_LEFT (1) or SA_CAUSAL_BOTTOM_RIGHT (2)",
                    (int)a->causal);
  if (a->window_left < -1)
    return sa_error(SA_ERR_INVALID, "window_left %lld invalid: must be >= 0, or -1 for unbounded",
                    (long long)a->window_left);
  if (a->window_right < -1)
    return sa_error(SA_ERR_INVALID, "window_right %lld invalid: must be >= 0, or -1 for unbounded",
                    (long long)a->window_right);
  if (a->diag_offset <= -((int64_t)1 << 40) || a->diag_offset >= ((int64_t)1 << 40))
    return sa_error(SA_ERR_INVALID, "diag_offset %lld invalid: must satisfy |diag_offset| < 2^40",
                    (long long)a->diag_offset);
  if (!isfinite(a->scale))
    return sa_error(SA_ERR_INVALID, "scale %g invalid: must be finite (0 = 1/sqrt(head_dim))", (double)a->scale);
  /* the kernels keep logits in base 2: cap log2(e) must be a float (cap <= 2.35e38), or a bias of -inf, which the
     cap makes -cap, overflows there */
  if (a->logits_soft_cap != 0.0f && !(a->logits_soft_cap > 0.0f && isfinite(a->logits_soft_cap * 1.4426950408889634f)))
    return sa_error(SA_ERR_INVALID,
                    "logits_soft_cap %g invalid: must be > 0 with cap * log2(e) a finite float (cap <= 2.35e38), "
                    "or 0 for none",
                    (double)a->logits_soft_cap);
  if ((a->q_segment_ids == NULL) != (a->kv_segment_ids == NULL))
    return sa_error(SA_ERR_INVALID, "%s is NULL but %s is set: give both segment id arrays or neither",
                    a->q_segment_ids ? "kv_segment_ids" : "q_segment_ids",
                    a->q_segment_ids ? "q_segment_ids" : "kv_segment_ids");
  if ((a->q_positions == NULL) != (a->kv_positions == NULL))
    return sa_error(SA_ERR_INVALID, "%s is NULL but %s is set: give both position arrays or neither",
                    a->q_positions ? "kv_positions" : "q_positions", a->q_positions ? "q_positions" : "kv_positions");
  if (a->q_positions && a->causal == SA_CAUSAL_BOTTOM_RIGHT)
    return sa_error(SA_ERR_INVALID,
                    "causal SA_CAUSAL_BOTTOM_RIGHT (2) invalid with q_positions / kv_positions: "
                    "the positions already place every query (use SA_CAUSAL_TOP_LEFT)");
  if (a->bias_dtype != SA_F32 && a->bias_dtype != SA_F16 && a->bias_dtype != SA_BF16)
    return sa_error(SA_ERR_INVALID, "bias_dtype %d invalid: use SA_F32 (0), SA_F16 (1) or SA_BF16 (2)",
                    (int)a->bias_dtype);
  int64_t nq = 0, nk = 0, nv = 0, no = 0, nb = 0, nm = 0;
  sa_status s = sa_check_counts(a, &nq, &nk, &nv, &no);
  if (s == SA_OK) s = sa_check_bcast_dims(a, "bias", a->bias_dims, sa_dtype_size(a->bias_dtype), &nb);
  if (s == SA_OK) s = sa_check_bcast_dims(a, "mask", a->mask_dims, 1, &nm);
  return s;
}

/* Everything sa_check_dims accepts, plus the pointers a call dereferences. */
sa_status sa_check_shapes(const sa_attn *a) {
  sa_status s = sa_check_dims(a);
  if (s != SA_OK) return s;
  if (a->softmax == SA_SOFTMAX_LEARNABLE && !a->sinks)
    return sa_error(SA_ERR_INVALID, "sinks is NULL: SA_SOFTMAX_LEARNABLE needs sinks [q_heads] fp32");
  int64_t nq = 0, nk = 0, nv = 0, no = 0;
  if ((s = sa_check_counts(a, &nq, &nk, &nv, &no)) != SA_OK) return s;
  SA_NEED_PTR(a->q, nq > 0, "q");
  SA_NEED_PTR(a->k, nk > 0, "k");
  SA_NEED_PTR(a->v, nv > 0, "v");
  SA_NEED_PTR(a->out, no > 0, "out");
  int64_t nb = 0, nm = 0;
  if ((s = sa_check_bcast_dims(a, "bias", a->bias_dims, sa_dtype_size(a->bias_dtype), &nb)) != SA_OK ||
      (s = sa_check_bcast_ptr("bias", a->bias, a->bias_dims, nb)) != SA_OK ||
      (s = sa_check_bcast_dims(a, "mask", a->mask_dims, 1, &nm)) != SA_OK)
    return s;
  return sa_check_bcast_ptr("mask", a->mask, a->mask_dims, nm);
}

sa_status sa_check_backend_enum(sa_backend be) {
  if (be != SA_BACKEND_AUTO && be != SA_BACKEND_REF && be != SA_BACKEND_CPU && be != SA_BACKEND_CUDA)
    return sa_error(
        SA_ERR_INVALID,
        "backend %d invalid: use SA_BACKEND_AUTO (0), SA_BACKEND_REF (1), SA_BACKEND_CPU (2) or SA_BACKEND_CUDA (3)",
        (int)be);
  return SA_OK;
}

sa_backend sa_backend_resolve(const sa_attn *a, sa_backend be) {
  if (be != SA_BACKEND_AUTO) return be;
  if (a && sa_cuda_available() && sa_cuda_is_device_pointer(a->q)) return SA_BACKEND_CUDA;
  if (a && sa_cpu_attn_supported(a) == SA_OK) return SA_BACKEND_CPU;
  return SA_BACKEND_REF;
}

/* SA_BACKEND_CUDA without a usable device is SA_ERR_DEVICE before any other CUDA rule, so that a build
   without nvcc and a CUDA build on a machine without a GPU answer alike (the stub's message names which). */
sa_status sa_check_cuda_present(void) {
  if (sa_cuda_available()) return SA_OK;
  if (!sa_has_cuda())
    return sa_error(SA_ERR_DEVICE,
                    "backend SA_BACKEND_CUDA unavailable: sinkattn was built without CUDA "
                    "(nvcc not found at configure time)");
  return sa_error(SA_ERR_DEVICE,
                  "backend SA_BACKEND_CUDA unavailable: sinkattn has the CUDA backend but "
                  "no CUDA device was found (use SA_BACKEND_CPU, SA_BACKEND_REF or SA_BACKEND_AUTO)");
}

/* Host backends must not get device memory, nor CUDA host memory: a wrong pointer kind would crash.
   Asked after the backend's own shape rules, so that an unsupported size is reported as such
   (SA_ERR_UNSUPPORTED naming the field) whatever memory the pointers are in. */
sa_status sa_check_memory_kind(const sa_attn *a, sa_backend be) {
  if (!sa_has_cuda() || !a->q) return SA_OK;
  int dev = sa_cuda_is_device_pointer(a->q);
  if (be == SA_BACKEND_CUDA && !dev)
    return sa_error(SA_ERR_INVALID, "q is host memory: SA_BACKEND_CUDA needs device pointers");
  if (be != SA_BACKEND_CUDA && dev)
    return sa_error(SA_ERR_INVALID, "q is device memory: SA_BACKEND_%s needs host pointers (use SA_BACKEND_CUDA)",
                    be == SA_BACKEND_REF ? "REF" : "CPU");
  return SA_OK;
}

/* What the CUDA kernels do not take, named before any of their own rules: a call with inputs only the feature plans
   take that those plans cannot run (src/cuda/plan.c, sa_cuda_feature_check; the device's part is
   sa_cuda_attn_supported's). */
sa_status sa_check_cuda_inputs(const sa_attn *a) { return sa_cuda_feature_check(a, 0); }

static sa_status sa_check_for(const sa_attn *a, sa_backend be) {
  sa_status s;
  if ((s = sa_check_shapes(a)) != SA_OK) return s;
  switch (be) {
    case SA_BACKEND_CPU: s = sa_cpu_attn_supported(a); break;
    case SA_BACKEND_CUDA:
      if ((s = sa_check_cuda_present()) == SA_OK && (s = sa_check_cuda_inputs(a)) == SA_OK &&
          (s = sa_cuda_dtype_check(a, 0)) == SA_OK)
        s = sa_cuda_attn_supported(a);
      break;
    default: break;
  }
  return s != SA_OK ? s : sa_check_memory_kind(a, be);
}

sa_status sa_attn_check(const sa_attn *a, sa_backend be) {
  sa_clear_error();
  sa_status s = sa_check_backend_enum(be);
  if (s != SA_OK) return s;
  if ((s = sa_check_shapes(a)) != SA_OK) return s;
  /* Resolving AUTO asks the CPU backend, whose "unsupported" leaves a message even though REF then
     takes the call: clear it, so that sa_last_error() is "" after every successful check. */
  if ((s = sa_check_for(a, sa_backend_resolve(a, be))) == SA_OK) sa_clear_error();
  return s;
}

/* ---- forward --------------------------------------------------------------------------------- */

sa_status sa_attn_fwd(const sa_attn *a, sa_backend be, void *stream) {
  sa_status s = sa_attn_check(a, be);
  if (s != SA_OK) return s;
  /* B = 0: no output element exists. Answered here because the reference sizes its row buffers by S and
     N alone, so B = 0 with S = 2^40 ran out of memory on an empty problem. */
  const sa_backend r = sa_backend_resolve(a, be);
  if (r != SA_BACKEND_CUDA && (s = sa_plan_host(SA_PLAN_FWD, r, a)) != SA_OK) return s;
  if (r == SA_BACKEND_CUDA) return sa_cuda_attn_fwd(a, stream); /* B = 0 too: its plan is checked and recorded */
  if (a->batch == 0) return SA_OK;
  switch (r) {
    case SA_BACKEND_CPU: return sa_cpu_attn_fwd(a);
    default: return sa_ref_attn_fwd(a);
  }
}

/* ---- backward -------------------------------------------------------------------------------- */

/* Depends on sizes and options only, so callers (the FFI layer at trace time) may ask with NULL data
   pointers. */
size_t sa_attn_bwd_workspace_size(const sa_attn *a, sa_backend be) {
  if (sa_check_backend_enum(be) != SA_OK || sa_check_dims(a) != SA_OK) return 0;
  switch (sa_backend_resolve(a, be)) {
    case SA_BACKEND_CUDA: return sa_cuda_attn_bwd_workspace_size(a);
    case SA_BACKEND_CPU: return sa_cpu_attn_bwd_workspace_size(a);
    default: return 0;
  }
}

static sa_status sa_check_grad(const sa_attn *a, const sa_attn_grad *g) {
  if (!g) return sa_error(SA_ERR_INVALID, "grad is NULL");
  int64_t rows = a->batch * a->q_heads * a->q_len;
  int64_t nq = a->batch * a->q_len * a->q_heads * a->head_dim;
  int64_t nk = a->batch * a->kv_len * a->kv_heads * a->head_dim;
  int64_t nv = a->batch * a->kv_len * a->kv_heads * a->v_head_dim;
  int64_t no = a->batch * a->q_len * a->q_heads * a->v_head_dim;
  SA_NEED_PTR(a->lse, rows > 0, "lse (the forward's lse is required by the backward)");
  SA_NEED_PTR(g->dout, no > 0, "dout");
  SA_NEED_PTR(g->dq, nq > 0, "dq");
  SA_NEED_PTR(g->dk, nk > 0, "dk");
  SA_NEED_PTR(g->dv, nv > 0, "dv");
  if (g->dbias && !sa_dims_set(a->bias_dims))
    return sa_error(SA_ERR_INVALID,
                    "dbias is set but bias is NULL: dbias is the gradient of a bias (give both, "
                    "or leave dbias NULL)");
  return SA_OK;
}

sa_status sa_attn_bwd(const sa_attn *a, const sa_attn_grad *g, void *workspace, size_t workspace_size, sa_backend be,
                      void *stream) {
  sa_status s = sa_attn_check(a, be);
  if (s != SA_OK) return s;
  if ((s = sa_check_grad(a, g)) != SA_OK) return s;
  sa_backend r = sa_backend_resolve(a, be);
  /* CUDA checks the workspace against its plan's need (a smaller one may still hold another plan's) */
  if (r == SA_BACKEND_CUDA) return sa_cuda_attn_bwd(a, g, workspace, workspace_size, stream);
  if ((s = sa_plan_host(SA_PLAN_BWD, r, a)) != SA_OK) return s;
  if (a->batch == 0) { /* host memory (CUDA returned above); dsinks [N] and dbias are sums over no rows */
    if (g->dsinks) memset(g->dsinks, 0, (size_t)a->q_heads * sizeof *g->dsinks);
    if (g->dbias) memset(g->dbias, 0, (size_t)sa_dims_count(a->bias_dims) * sizeof *g->dbias);
    return SA_OK;
  }
  if (r == SA_BACKEND_CPU) return sa_cpu_attn_bwd(a, g, workspace, workspace ? workspace_size : 0);
  return sa_ref_attn_bwd(a, g);
}
