/*
 * ffi_query.c — the CUDA backend's answer for one call described in full, read by Python through ctypes: whether the
 * CUDA kernels take it and the backward workspace its plan needs. sa_jax_cuda_supported (ffi_attn.c) describes a call
 * by its sizes and which optional inputs exist; a bias, a mask or positions also need their shapes, the segment ids,
 * the lengths and the masks beside them to decide whether the feature plans take the call, and a mask or positions
 * add the class table to the backward's workspace (src/cuda/plan.c). This query takes all of it.
 */
#include <stdio.h>
#include <string.h>

#include "sa_ffi.h"

/* 1 when the CUDA backend takes this call in both directions (forward and backward: Python routes a call once for
   both), else 0 with the reason in why[why_len]. The call: the sizes, softmax, causal (sa_causal), window and
   diag_offset, whether lengths / segment ids / positions exist, bias_dims [4] with bias_dtype (an sa_dtype) or NULL
   without a bias, mask_dims [4] or NULL without a mask, logits_soft_cap (0: none). Shape-only: no data is read, and
   the inputs stand as 16-byte aligned markers, as XLA's buffers are. *bwd_workspace (when not NULL): the bytes of the
   backward workspace of the plan this call runs (0 when unsupported). */
SA_FFI_EXPORT int sa_jax_cuda_supported_call(int dtype, int64_t batch, int64_t q_len, int64_t kv_len, int64_t q_heads,
                                             int64_t kv_heads, int64_t head_dim, int64_t v_head_dim, int softmax,
                                             int causal, int64_t window_left, int64_t window_right, int64_t diag_offset,
                                             int has_lengths, int has_segments, const int64_t *bias_dims,
                                             int bias_dtype, const int64_t *mask_dims, int has_positions,
                                             float logits_soft_cap, size_t *bwd_workspace, char *why, size_t why_len) {
  sa_attn a;
  sa_ffi_attn_of_shape(&a, dtype, batch, q_len, kv_len, q_heads, kv_heads, head_dim, v_head_dim);
  sa_ffi_attn_options(&a, softmax, causal, window_left, window_right, diag_offset, has_lengths, has_segments);
  if (bias_dims) {
    memcpy(a.bias_dims, bias_dims, sizeof a.bias_dims);
    a.bias_dtype = (sa_dtype)bias_dtype;
    a.bias = sa_ffi_present;
  }
  if (mask_dims) {
    memcpy(a.mask_dims, mask_dims, sizeof a.mask_dims);
    a.mask = (const uint8_t *)sa_ffi_present;
  }
  if (has_positions) a.q_positions = a.kv_positions = sa_ffi_present;
  a.logits_soft_cap = logits_soft_cap;
  sa_clear_error();
  const int ok = sa_check_dims(&a) == SA_OK && sa_check_cuda_inputs(&a) == SA_OK &&
                 sa_cuda_dtype_check(&a, 0) == SA_OK && sa_has_cuda() && sa_cuda_attn_supported(&a) == SA_OK;
  if (!ok && why && why_len) snprintf(why, why_len, "%s", *sa_last_error() ? sa_last_error() : "built without CUDA");
  if (bwd_workspace) *bwd_workspace = ok ? sa_attn_bwd_workspace_size(&a, SA_BACKEND_CUDA) : 0;
  return ok;
}
