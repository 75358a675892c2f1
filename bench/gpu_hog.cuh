/*
 * gpu_hog.cuh — what bench/gpu_progress.cu shares the GPU with: a HOG kernel that holds k SMs (one CTA an SM, the
 * most shared memory each) until a deadline on %globaltimer or a host flag in mapped memory, the GPU clock read
 * into mapped memory around a call, and green contexts of a reduced SM count (the driver's functions taken from
 * the runtime's entry-point query: the program needs no libcuda at link time and starts without a driver).
 */
#ifndef SA_BENCH_GPU_HOG_CUH
#define SA_BENCH_GPU_HOG_CUH
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define CK(x)  ck_rt((x), #x, __LINE__)
#define CKD(x) ck_drv((x), #x, __LINE__)
static void ck_rt(cudaError_t e, const char *what, int line) {
  if (e == cudaSuccess) return;
  printf("PROGRESS {\"fatal\":\"line %d %s: %s\"}\n", line, what, cudaGetErrorString(e));
  exit(2);
}
static void ck_drv(CUresult e, const char *what, int line) {
  if (e == CUDA_SUCCESS) return;
  printf("PROGRESS {\"fatal\":\"line %d %s: CUresult %d\"}\n", line, what, (int)e);
  exit(2);
}

/* The driver's green-context functions, from the runtime's entry-point query: no link against libcuda, so the
   program starts (and says there is no GPU) on a machine without a driver. Asked by the toolkit's version (the
   prototypes compiled here): cuGreenCtxStreamCreate exists from CUDA 12.5, and a query by 12.4 does not find it. */
#define SA_DRV(f) static decltype(&f) d_##f
SA_DRV(cuInit);
SA_DRV(cuDeviceGet);
SA_DRV(cuDeviceGetDevResource);
SA_DRV(cuDevSmResourceSplitByCount);
SA_DRV(cuDevResourceGenerateDesc);
SA_DRV(cuGreenCtxCreate);
SA_DRV(cuCtxFromGreenCtx);
SA_DRV(cuCtxSetCurrent);
SA_DRV(cuGreenCtxStreamCreate);
static void drv_sym(const char *name, void **f) {
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, f, CUDART_VERSION, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    printf("PROGRESS {\"fatal\":\"driver entry point %s not found at CUDA %d (no driver, or an older one)\"}\n", name,
           CUDART_VERSION);
    exit(2);
  }
}
#define SA_DRV_LOAD(f) drv_sym(#f, (void **)&d_##f)
static void drv_load(void) {
  SA_DRV_LOAD(cuInit);
  SA_DRV_LOAD(cuDeviceGet);
  SA_DRV_LOAD(cuDeviceGetDevResource);
  SA_DRV_LOAD(cuDevSmResourceSplitByCount);
  SA_DRV_LOAD(cuDevResourceGenerateDesc);
  SA_DRV_LOAD(cuGreenCtxCreate);
  SA_DRV_LOAD(cuCtxFromGreenCtx);
  SA_DRV_LOAD(cuCtxSetCurrent);
  SA_DRV_LOAD(cuGreenCtxStreamCreate);
}

/* ---- the GPU clock and the hog ------------------------------------------------------------------------- */
__device__ __forceinline__ unsigned long long gtime(void) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned smid(void) {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}
struct hog_rec {
  unsigned long long start, end;
  unsigned sm, pad;
};
struct shared_rec { /* mapped host memory: the host reads it while kernels run */
  volatile int started, stop;
  volatile unsigned long long now, launched, done;
};

/* One CTA per SM (the caller gives it the most dynamic shared memory), spinning until the deadline or stop. */
__global__ void hog_kernel(unsigned long long deadline, shared_rec *sh, hog_rec *rec) {
  extern __shared__ char smem[];
  if (threadIdx.x) return;
  smem[0] = 1;
  rec[blockIdx.x].start = gtime();
  rec[blockIdx.x].sm = smid();
  __threadfence_system();
  atomicAdd((int *)&sh->started, 1);
  while (gtime() < deadline && !sh->stop) __nanosleep(2000);
  rec[blockIdx.x].end = gtime();
}
/* The GPU clock into mapped memory: before and after a call on its stream, or now on a stream of its own. */
__global__ void time_kernel(volatile unsigned long long *dst) {
  *dst = gtime();
  __threadfence_system();
}
static double wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

struct hog {
  shared_rec *sh;
  hog_rec *rec;
  int smem, sms;
  cudaStream_t st, clock; /* the hog's stream; a stream for reading the GPU clock while the hog runs */
};
static void hog_init(hog *h) {
  int dev = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&h->smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  CK(cudaDeviceGetAttribute(&h->sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaFuncSetAttribute(hog_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, h->smem));
  CK(cudaHostAlloc((void **)&h->sh, sizeof(shared_rec), cudaHostAllocMapped));
  CK(cudaHostAlloc((void **)&h->rec, 256 * sizeof(hog_rec), cudaHostAllocMapped));
  CK(cudaStreamCreateWithFlags(&h->st, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&h->clock, cudaStreamNonBlocking));
}
static unsigned long long gpu_now(hog *h) {
  time_kernel<<<1, 1, 0, h->clock>>>(&h->sh->now);
  CK(cudaStreamSynchronize(h->clock));
  return h->sh->now;
}
/* Starts k hog CTAs (one an SM) that spin until now + hold_ns or until released; returns the deadline once every
   CTA is running (they are, on distinct SMs: each takes the SM's whole shared memory). */
static unsigned long long hog_start(hog *h, int k, unsigned long long hold_ns) {
  h->sh->started = 0;
  h->sh->stop = 0;
  h->sh->launched = 0;
  h->sh->done = 0;
  unsigned long long deadline = gpu_now(h) + hold_ns;
  hog_kernel<<<k, 32, h->smem, h->st>>>(deadline, h->sh, h->rec);
  CK(cudaGetLastError());
  double t0 = wall();
  while (h->sh->started < k) {
    if (wall() - t0 > 5.0) {
      printf("PROGRESS {\"fatal\":\"only %d of %d hog CTAs started in 5 s\"}\n", h->sh->started, k);
      exit(2);
    }
    usleep(50);
  }
  return deadline;
}
static unsigned long long hog_release(hog *h, int k, int *distinct) {
  h->sh->stop = 1;
  CK(cudaStreamSynchronize(h->st));
  unsigned long long end = ~0ull;
  char seen[256] = {0};
  *distinct = 0;
  for (int i = 0; i < k; i++) {
    if (h->rec[i].end < end) end = h->rec[i].end;
    if (!seen[h->rec[i].sm & 255]) {
      seen[h->rec[i].sm & 255] = 1;
      (*distinct)++;
    }
  }
  return end;
}
/* Waits for the stamp that follows the call on stream st; past `limit` seconds of wall time it is a hang. */
static int wait_done(shared_rec *sh, cudaStream_t st, double limit, const char *what) {
  double t0 = wall();
  while (!sh->done) {
    if (wall() - t0 > limit) {
      printf("PROGRESS {%s,\"status\":\"HANG\",\"waited_s\":%.1f}\n", what, wall() - t0);
      fflush(stdout);
      _exit(3);
    }
    usleep(20);
  }
  CK(cudaStreamSynchronize(st));
  return 1;
}

/* Green contexts: a context limited to nsm SMs, current on this thread, and a stream in it. */
static CUstream green_setup(int nsm) {
  drv_load();
  CKD(d_cuInit(0));
  CUdevice dev;
  CKD(d_cuDeviceGet(&dev, 0));
  CUdevResource all, part[1], rest;
  CKD(d_cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
  unsigned groups = 1;
  CKD(d_cuDevSmResourceSplitByCount(part, &groups, &all, &rest, 0, nsm));
  CUdevResourceDesc desc;
  CKD(d_cuDevResourceGenerateDesc(&desc, part, 1));
  CUgreenCtx g;
  CKD(d_cuGreenCtxCreate(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  CUcontext c;
  CKD(d_cuCtxFromGreenCtx(&c, g));
  CKD(d_cuCtxSetCurrent(c));
  CUstream st;
  CKD(d_cuGreenCtxStreamCreate(&st, g, CU_STREAM_NON_BLOCKING, 0));
  printf("PROGRESS {\"green_sms\":%u,\"asked\":%d}\n", part[0].sm.smCount, nsm);
  return st;
}

#endif /* SA_BENCH_GPU_HOG_CUH */
