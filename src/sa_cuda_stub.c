/*
 * sa_cuda_stub.c — the CUDA entry points of a build without nvcc: every call says the backend is absent,
 * so SA_BACKEND_CUDA fails cleanly with SA_ERR_DEVICE and SA_BACKEND_AUTO never picks it.
 */
#include "cuda/plan.h"
#include "sa_internal.h"

static sa_status sa_no_cuda(void) {
  return sa_error(SA_ERR_DEVICE,
                  "backend SA_BACKEND_CUDA unavailable: sinkattn was built without CUDA "
                  "(nvcc not found at configure time)");
}

int sa_cuda_available(void) { return 0; }
int sa_cuda_is_device_pointer(const void *p) {
  (void)p;
  return 0;
}
sa_status sa_cuda_attn_supported(const sa_attn *a) {
  (void)a;
  return sa_no_cuda();
}
sa_status sa_cuda_attn_fwd(const sa_attn *a, void *stream) {
  (void)a;
  (void)stream;
  return sa_no_cuda();
}
size_t sa_cuda_attn_bwd_workspace_size(const sa_attn *a) {
  (void)a;
  return 0;
}
sa_status sa_cuda_attn_bwd(const sa_attn *a, const sa_attn_grad *g, void *w, size_t ws, void *stream) {
  (void)a;
  (void)g;
  (void)w;
  (void)ws;
  (void)stream;
  return sa_no_cuda();
}
sa_status sa_cuda_decode_supported(const sa_attn *a) {
  (void)a;
  return sa_no_cuda();
}
size_t sa_cuda_decode_workspace_size(const sa_attn *a) {
  (void)a;
  return 0;
}
sa_status sa_cuda_decode_fwd(const sa_attn *a, void *w, size_t ws, void *stream) {
  (void)a;
  (void)w;
  (void)ws;
  (void)stream;
  return sa_no_cuda();
}
const sa_cuda_device *sa_cuda_device_current(void) { return NULL; }
