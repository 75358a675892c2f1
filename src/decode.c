/*
 * decode.c — the public decode entry points (sa_attn_decode_workspace_size, sa_attn_decode_fwd):
 * the validation of sa_attn_fwd (sinkattn.c's pieces), the decode limit q_len <= SA_DECODE_MAX_Q_LEN (sinkattn.h), the backend choice
 * and dispatch. REF runs the reference forward itself: decode is sa_attn_fwd with a short query, so the
 * reference is the oracle with no new math. The split-KV kernels take no bias, mask, positions or
 * logits_soft_cap: with any of them the CPU backend's plan is its attention forward (cpu.decode.fwd: the
 * same result, bitwise independent of the thread count too) and CUDA answers SA_ERR_UNSUPPORTED naming
 * the field.
 */
#include "sa_internal.h"
#include "sa_plan.h"

static sa_backend sa_decode_resolve(const sa_attn *a, sa_backend be) {
  if (be != SA_BACKEND_AUTO) return be;
  if (sa_cuda_available() && sa_cuda_is_device_pointer(a->q)) return SA_BACKEND_CUDA;
  if (sa_cpu_decode_supported(a) == SA_OK) return SA_BACKEND_CPU;
  return SA_BACKEND_REF;
}

static sa_status sa_decode_limit(const sa_attn *a) {
  if (a->q_len > SA_DECODE_MAX_Q_LEN)
    return sa_error(SA_ERR_UNSUPPORTED,
                    "q_len %lld unsupported by decode: use q_len <= %d "
                    "(sa_attn_fwd handles longer queries)",
                    (long long)a->q_len, SA_DECODE_MAX_Q_LEN);
  return SA_OK;
}

static sa_status sa_decode_check(const sa_attn *a, sa_backend be, sa_backend *resolved) {
  sa_clear_error();
  sa_status s = sa_check_backend_enum(be);
  if (s != SA_OK) return s;
  if ((s = sa_check_shapes(a)) != SA_OK) return s;
  if ((s = sa_decode_limit(a)) != SA_OK) return s;
  sa_backend r = sa_decode_resolve(a, be);
  sa_clear_error(); /* AUTO may have asked a backend that declined */
  switch (r) {
    case SA_BACKEND_CPU: s = sa_cpu_decode_supported(a); break;
    case SA_BACKEND_CUDA:
      if ((s = sa_check_cuda_present()) == SA_OK && (s = sa_check_cuda_inputs(a)) == SA_OK)
        s = sa_cuda_decode_supported(a);
      break;
    default: break;
  }
  if (s != SA_OK) return s;
  *resolved = r;
  return sa_check_memory_kind(a, r); /* after the shape rules, as in sa_attn_check */
}

size_t sa_attn_decode_workspace_size(const sa_attn *a, sa_backend be) {
  if (sa_check_backend_enum(be) != SA_OK || sa_check_dims(a) != SA_OK || sa_decode_limit(a) != SA_OK) return 0;
  switch (sa_decode_resolve(a, be)) {
    case SA_BACKEND_CUDA: return sa_cuda_decode_workspace_size(a);
    case SA_BACKEND_CPU: return sa_cpu_decode_workspace_size(a);
    default: return 0;
  }
}

sa_status sa_attn_decode_fwd(const sa_attn *a, void *workspace, size_t workspace_size, sa_backend be, void *stream) {
  sa_backend r = SA_BACKEND_REF;
  sa_status s = sa_decode_check(a, be, &r);
  if (s != SA_OK) return s;
  if (r != SA_BACKEND_CUDA && (s = sa_plan_host(SA_PLAN_DECODE, r, a)) != SA_OK) return s;
  if (a->batch == 0 && r != SA_BACKEND_CUDA) return SA_OK; /* nothing to write (see sa_attn_fwd) */
  if (r == SA_BACKEND_CUDA) {
    size_t need = sa_cuda_decode_workspace_size(a);
    if (workspace_size < need || (need && !workspace))
      return sa_error(SA_ERR_INVALID,
                      "workspace_size %zu too small: this decode needs %zu bytes "
                      "(sa_attn_decode_workspace_size)",
                      workspace_size, need);
    return sa_cuda_decode_fwd(a, workspace, workspace_size, stream);
  }
  if (r == SA_BACKEND_CPU)
    return sa_cpu_decode_fwd(a, workspace, workspace ? workspace_size : 0); /* its plan says which kernels */
  return sa_ref_attn_fwd(a);
}
