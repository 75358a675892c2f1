/*
 * device.cu — the device record the plans read (plan.h, sa_cuda_device): compute capability, SMs, shared
 * memory, whether sm_90a code is in the binary, and the SMs the CURRENT CONTEXT may use (a green context or
 * a partitioned device has fewer than the device). Queried once per (device, context) and cached under a
 * mutex; the driver is reached through the runtime's entry-point query, so the library does not link libcuda.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>

#include "plan.h"

namespace {

typedef CUresult (*sa_pfn_ctx_current)(CUcontext *);
typedef CUresult (*sa_pfn_ctx_resource)(CUcontext, CUdevResource *, CUdevResourceType);

void *sa_driver_fn(const char *name, unsigned version) {
  void *fn = nullptr;
  cudaDriverEntryPointQueryResult qr;
  if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &qr) != cudaSuccess ||
      qr != cudaDriverEntryPointSuccess) {
    cudaGetLastError(); /* not sticky: the next call starts clean */
    return nullptr;
  }
  return fn;
}

struct sa_dev_entry {
  int dev;
  CUcontext ctx;
  sa_cuda_device rec;
};

constexpr int SA_DEV_CACHE = 64; /* (device, context) pairs; past that a record is queried per call */
sa_dev_entry g_cache[SA_DEV_CACHE];
int g_count;
std::mutex g_mu;

bool sa_dev_query(int dev, CUcontext ctx, sa_pfn_ctx_resource res_fn, sa_cuda_device *r) {
  memset(r, 0, sizeof *r);
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&r->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&r->smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  r->cc_major = prop.major, r->cc_minor = prop.minor, r->sms = prop.multiProcessorCount;
  strncpy(r->name, prop.name, sizeof r->name - 1);
  r->ctx_sms = r->sms;
  CUdevResource res;
  if (ctx && res_fn && res_fn(ctx, &res, CU_DEV_RESOURCE_TYPE_SM) == CUDA_SUCCESS && res.sm.smCount > 0 &&
      (int)res.sm.smCount < r->sms)
    r->ctx_sms = (int)res.sm.smCount;
#ifdef SA_CUDA_HAVE_SM90A
  r->sm90a = 1;
#endif
  static const bool hopper_off = [] {
    const char *e = getenv("SINKATTN_CUDA_HOPPER");
    return e && strcmp(e, "0") == 0;
  }();
  r->hopper_off = hopper_off;
  return true;
}

} /* namespace */

extern "C" const sa_cuda_device *sa_cuda_device_current(void) {
  static const sa_pfn_ctx_current ctx_fn = (sa_pfn_ctx_current)sa_driver_fn("cuCtxGetCurrent", 4000);
  static const sa_pfn_ctx_resource res_fn = (sa_pfn_ctx_resource)sa_driver_fn("cuCtxGetDevResource", 12040);
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  CUcontext ctx = nullptr;
  if (ctx_fn && ctx_fn(&ctx) != CUDA_SUCCESS) ctx = nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  for (int i = 0; i < g_count; ++i)
    if (g_cache[i].dev == dev && g_cache[i].ctx == ctx) return &g_cache[i].rec;
  static thread_local sa_cuda_device uncached; /* the cache is full: this thread's own copy */
  sa_cuda_device *r = g_count < SA_DEV_CACHE ? &g_cache[g_count].rec : &uncached;
  if (!sa_dev_query(dev, ctx, res_fn, r)) return nullptr;
  if (r != &uncached) g_cache[g_count].dev = dev, g_cache[g_count].ctx = ctx, ++g_count;
  return r;
}
