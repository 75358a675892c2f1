/*
 * cuda_mock.cpp — a CUDA runtime that runs nothing: the entry points the library calls (device queries,
 * kernel registration and launch, memset, driver entry points), answering as one H200 would (CC 9.0, 132
 * SMs, 227 KiB of shared memory a block) and writing every enqueued operation as one line to the log that
 * sa_mock_log_set names. Linked instead of cudart into plan_record (tests/plan/plan_record.cpp), it lets a
 * CPU see which kernels a call launches, on which grids, with which workspace: docs/hopper.md, "plans".
 */
#include <cxxabi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <string>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cuda_mock.h"

static FILE *g_log;
static std::map<const void *, std::string> g_names; /* host stub -> demangled kernel name */
static sa_mock_device g_dev = {9, 0, 132, 132, 232448, 233472, "NVIDIA H200 (mock)"};
static int g_refuse_coop; /* cooperative launches answer cudaErrorCooperativeLaunchTooLarge */
static sa_mock_decoder g_decoder;

void sa_mock_log_set(FILE *f) { g_log = f; }
void sa_mock_device_set(const sa_mock_device *d) { g_dev = *d; }
void sa_mock_refuse_cooperative(int on) { g_refuse_coop = on; }
void sa_mock_decoder_set(sa_mock_decoder d) { g_decoder = d; }

static void logf_(const char *fmt, ...) {
  if (!g_log) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(g_log, fmt, ap);
  va_end(ap);
}

static std::string name_of(const void *fn) {
  auto it = g_names.find(fn);
  return it == g_names.end() ? std::string("?") : it->second;
}

static void log_launch(const char *how, const void *fn, dim3 g, dim3 b, size_t smem, void **args) {
  const std::string n = name_of(fn);
  char extra[256] = "";
  if (g_decoder) g_decoder(n.c_str(), args, extra, sizeof extra);
  logf_("  %s %s grid=%u,%u,%u block=%u smem=%zu%s%s\n", how, n.c_str(), g.x, g.y, g.z, b.x, smem, *extra ? " " : "",
        extra);
}

extern "C" {

void **__cudaRegisterFatBinary(void *) {
  static void *h;
  return &h;
}
void __cudaRegisterFatBinaryEnd(void **) {}
void __cudaUnregisterFatBinary(void **) {}
void __cudaRegisterFunction(void **, const char *hostFun, char *deviceFun, const char *, int, uint3 *, uint3 *, dim3 *,
                            dim3 *, int *) {
  int st = 0;
  char *d = abi::__cxa_demangle(deviceFun, nullptr, nullptr, &st);
  std::string s = st == 0 && d ? d : deviceFun;
  free(d);
  /* the parameter list says nothing the name and template arguments do not */
  const std::string anon = "(anonymous namespace)::";
  for (size_t p; (p = s.find(anon)) != std::string::npos;) s.erase(p, anon.size());
  const size_t paren = s.find('(');
  if (paren != std::string::npos) s = s.substr(0, paren);
  if (s.rfind("void ", 0) == 0) s = s.substr(5);
  g_names[hostFun] = s;
}
void __cudaRegisterVar(void **, char *, char *, const char *, int, size_t, int, int) {}

static dim3 g_grid, g_block;
static size_t g_smem;
static cudaStream_t g_stream;
unsigned __cudaPushCallConfiguration(dim3 g, dim3 b, size_t smem, struct CUstream_st *st) {
  g_grid = g, g_block = b, g_smem = smem, g_stream = st;
  return 0;
}
cudaError_t __cudaPopCallConfiguration(dim3 *g, dim3 *b, size_t *smem, void *st) {
  *g = g_grid, *b = g_block, *smem = g_smem, *(cudaStream_t *)st = g_stream;
  return cudaSuccess;
}
cudaError_t __cudaGetKernel(cudaKernel_t *k, const void *fn) {
  *k = (cudaKernel_t)fn;
  return cudaSuccess;
}
cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 g, dim3 b, void **args, size_t smem, cudaStream_t) {
  log_launch("launch", (const void *)k, g, b, smem, args);
  return cudaSuccess;
}
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t k, dim3 g, dim3 b, void **args, size_t smem, cudaStream_t s) {
  return __cudaLaunchKernel(k, g, b, args, smem, s);
}
cudaError_t cudaLaunchKernel(const void *fn, dim3 g, dim3 b, void **args, size_t smem, cudaStream_t) {
  log_launch("launch", fn, g, b, smem, args);
  return cudaSuccess;
}
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *cfg, const void *fn, void **args) {
  int coop = 0;
  for (unsigned i = 0; i < cfg->numAttrs; ++i)
    if (cfg->attrs[i].id == cudaLaunchAttributeCooperative && cfg->attrs[i].val.cooperative) coop = 1;
  if (coop && g_refuse_coop) {
    logf_("  refused %s grid=%u (cooperative)\n", name_of(fn).c_str(), cfg->gridDim.x);
    return cudaErrorCooperativeLaunchTooLarge;
  }
  log_launch(coop ? "launch.coop" : "launch", fn, cfg->gridDim, cfg->blockDim, cfg->dynamicSmemBytes, args);
  return cudaSuccess;
}

static cudaError_t g_last = cudaSuccess;
cudaError_t cudaGetLastError(void) {
  cudaError_t e = g_last;
  g_last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return g_last; }
const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "mock error"; }
const char *cudaGetErrorName(cudaError_t e) {
  return e == cudaErrorCooperativeLaunchTooLarge ? "cudaErrorCooperativeLaunchTooLarge" : "cudaErrorMock";
}
cudaError_t cudaGetDeviceCount(int *n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int) {
  switch (a) {
    case cudaDevAttrComputeCapabilityMajor: *v = g_dev.cc_major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = g_dev.cc_minor; break;
    case cudaDevAttrMultiProcessorCount: *v = g_dev.sms; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = g_dev.smem_optin; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = g_dev.smem_per_sm; break;
    case cudaDevAttrCooperativeLaunch: *v = 1; break;
    default: *v = 0; break;
  }
  return cudaSuccess;
}
cudaError_t cudaDeviceGetName(char *name, int len, int) {
  snprintf(name, (size_t)len, "%s", g_dev.name);
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", g_dev.name);
  p->major = g_dev.cc_major, p->minor = g_dev.cc_minor, p->multiProcessorCount = g_dev.sms;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void *, enum cudaFuncAttribute, int) { return cudaSuccess; }
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *at, const void *) {
  memset(at, 0, sizeof *at);
  at->type = cudaMemoryTypeDevice;
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *, int v, size_t n, cudaStream_t) {
  logf_("  memset bytes=%zu value=%d\n", n, v);
  return cudaSuccess;
}

/* The driver entry points the library asks the runtime for. */
static CUresult mock_encode(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                            const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                            CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  return CUDA_SUCCESS;
}
static CUresult mock_ctx_current(CUcontext *c) {
  *c = (CUcontext)&g_dev;
  return CUDA_SUCCESS;
}
static CUresult mock_ctx_resource(CUcontext, CUdevResource *r, CUdevResourceType t) {
  memset(r, 0, sizeof *r);
  r->type = t;
  r->sm.smCount = (unsigned)g_dev.ctx_sms;
  return CUDA_SUCCESS;
}
cudaError_t cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned int, unsigned long long,
                                             cudaDriverEntryPointQueryResult *qr) {
  *fn = nullptr;
  if (!strcmp(sym, "cuTensorMapEncodeTiled")) *fn = (void *)mock_encode;
  else if (!strcmp(sym, "cuCtxGetCurrent")) *fn = (void *)mock_ctx_current;
  else if (!strcmp(sym, "cuCtxGetDevResource")) *fn = (void *)mock_ctx_resource;
  if (qr) *qr = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return *fn ? cudaSuccess : cudaErrorSymbolNotFound;
}

} /* extern "C" */
