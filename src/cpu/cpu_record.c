/*
 * cpu_record.c — the CPU record (cpu_plan.h): what this CPU and OS can run, SINKATTN_SIMD and
 * SINKATTN_NUM_THREADS, read once per process under pthread_once. A call then never asks CPUID or the environment again, so a setenv
 * between calls cannot switch kernels (forced plans are the way to compare levels in one process).
 */
#define _GNU_SOURCE /* syscall() under -std=c11 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_plan.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#define SA_CPU_X86 1
#endif
#include <unistd.h>
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#endif

/* dst = the first 31 chars of src (strncpy would warn on truncation; a longer value is unknown anyway). */
static void sa_cpu_copy_env(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  memcpy(dst, src, n < cap ? n : cap - 1);
}

/* SINKATTN_NUM_THREADS: an integer >= 0 (0 means the default), at most 4096 threads. */
static void sa_cpu_record_threads(const char *env, int cores, sa_cpu_record *r) {
  r->threads = cores > 0 ? cores : 1;
  if (!env || !*env) return;
  sa_cpu_copy_env(r->threads_env, sizeof r->threads_env, env);
  char *end = NULL;
  long v = strtol(env, &end, 10);
  if (*end || v < 0) {
    r->threads_bad = 1;
    return;
  }
  if (v > 0) r->threads = v > 4096 ? 4096 : (int)v;
}

void sa_cpu_record_make(const sa_cpu_features *f, const char *simd_env, const char *threads_env, int cores,
                        sa_cpu_record *r) {
  memset(r, 0, sizeof *r);
  r->f = *f;
  r->simd_cpu = f->avx512 && f->avx2 ? SA_CPU_AVX512 : f->avx2 ? SA_CPU_AVX2 : SA_CPU_SCALAR;
  r->simd = r->simd_cpu;
  sa_cpu_record_threads(threads_env, cores, r);
  if (!simd_env || !*simd_env) return;
  sa_cpu_copy_env(r->env, sizeof r->env, simd_env);
  /* SINKATTN_SIMD may only lower the level: a level the CPU lacks would crash on its first instruction. */
  sa_cpu_simd want;
  if (strcmp(simd_env, "avx512") == 0) want = SA_CPU_AVX512;
  else if (strcmp(simd_env, "avx2") == 0) want = SA_CPU_AVX2;
  else if (strcmp(simd_env, "scalar") == 0) want = SA_CPU_SCALAR;
  else {
    r->env_bad = 1;
    return;
  }
  if (want < r->simd) r->simd = want;
}

#ifdef SA_CPU_X86
/* XCR0 (the state components the OS saves on a context switch); 0 without OSXSAVE. */
static uint64_t sa_cpu_xcr0(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1u)) return 0;
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}
#endif

/* Linux hands the 8 KiB tile data state to a process only on request (arch_prctl ARCH_REQ_XCOMP_PERM
   for XFEATURE_XTILEDATA, 18); the first tile instruction without it is SIGILL. Granted for the whole
   process and never taken back, so asking once here is enough. */
static int sa_cpu_amx_permitted(void) {
#if defined(SA_CPU_X86) && defined(__linux__) && defined(__x86_64__)
  const uint64_t tile_state = (1ull << 17) | (1ull << 18); /* XTILECFG, XTILEDATA */
  if ((sa_cpu_xcr0() & tile_state) != tile_state) return 0;
  return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#else
  return 0;
#endif
}

static void sa_cpu_features_read(sa_cpu_features *f) {
  memset(f, 0, sizeof *f);
#ifdef SA_CPU_X86
  /* libgcc's checks include the OS's xgetbv test for the ymm / zmm state. */
  __builtin_cpu_init();
#if defined(__clang__) && __clang_major__ < 15
  /* clang 14 (the fuzz build) rejects the "f16c" feature string; every AVX2 CPU (Haswell, Zen) has F16C. */
  f->avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  f->avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
  f->avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  /* Leaf 7 read directly: clang 14 has no "avx512bf16" / "amx-*" strings for __builtin_cpu_supports. */
  unsigned a, b, c, d, a1 = 0, b1, c1, d1;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    if (a >= 1) __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
    f->avx512_bf16 = f->avx512 && ((a1 >> 5) & 1u);
    int tile = (d >> 24) & 1u;
    f->amx_bf16 = tile && ((d >> 22) & 1u);
    f->amx_fp16 = tile && ((a1 >> 21) & 1u);
    f->amx_os = (f->amx_bf16 || f->amx_fp16) && sa_cpu_amx_permitted();
  }
#endif
}

static sa_cpu_record sa_cpu_rec;
static pthread_once_t sa_cpu_rec_once = PTHREAD_ONCE_INIT;

static void sa_cpu_record_init(void) {
  sa_cpu_features f;
  sa_cpu_features_read(&f);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  sa_cpu_record_make(&f, getenv("SINKATTN_SIMD"), getenv("SINKATTN_NUM_THREADS"), cores > 0 ? (int)cores : 1,
                     &sa_cpu_rec);
}

const sa_cpu_record *sa_cpu_record_get(void) {
  pthread_once(&sa_cpu_rec_once, sa_cpu_record_init);
  return &sa_cpu_rec;
}
