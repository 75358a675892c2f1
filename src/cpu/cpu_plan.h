/*
 * cpu_plan.h — what the CPU backend runs for a call, chosen in one place.
 *
 * The CPU record (CPUID, the OS's permission for the AMX tile state, SINKATTN_SIMD, SINKATTN_NUM_THREADS)
 * is read once per process (sa_cpu_record_get). The plan of a call is a pure function of the problem, the record and an
 * optional forced plan name (sa_cpu_plan_make): the workspace queries and the launches call the same
 * function, so they cannot disagree. The library's plan API (sa_plan.h) lists, forces and reports them. Plan
 * names are backend.kind.variant: cpu.fwd.avx512, cpu.bwd.avx2, cpu.fwd.scalar, cpu.decode.avx512bf16,
 * cpu.decode.portable, cpu.decode.fwd; cpu.fwd.amx / cpu.bwd.amx / cpu.decode.amx are the AMX tile path
 * (docs/cpu.md), the bf16 default where CPUID reports AMX-TILE + AMX-BF16 and AVX512-BF16, the OS granted the
 * tile state and the shape is one the tiles win (cpu_plan.c states the threshold; the vector plans take the
 * rest and stay forceable); cpu.fwd.amx.emulated / cpu.bwd.amx.emulated / cpu.decode.amx.emulated run the same
 * tile code over emulated instructions, a test vehicle on any AVX-512 + AVX512-BF16 CPU, never a default.
 */
#ifndef SA_CPU_PLAN_H
#define SA_CPU_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "../sa_internal.h"
#include "../sa_plan.h"

typedef enum { SA_CPU_SCALAR = 0, SA_CPU_AVX2 = 1, SA_CPU_AVX512 = 2 } sa_cpu_simd;
/* The products under the kernel body: fp32 vectors, AMX tiles, or the tile code over emulated tile
   instructions (a test vehicle, docs/cpu.md). */
typedef enum { SA_CPU_TILE_NONE = 0, SA_CPU_TILE_AMX = 1, SA_CPU_TILE_EMULATED = 2 } sa_cpu_tile;

/* What the CPU and the OS report: the record's input (tests build their own). */
typedef struct {
  int avx2;        /* AVX2 + FMA + F16C */
  int avx512;      /* AVX-512 F/BW/VL/DQ, zmm state enabled by the OS */
  int avx512_bf16; /* vdpbf16ps */
  int amx_bf16;    /* AMX-TILE + AMX-BF16 */
  int amx_fp16;    /* AMX-TILE + AMX-FP16 */
  int amx_os;      /* XCR0 enables the tile state and Linux granted it (arch_prctl ARCH_REQ_XCOMP_PERM) */
} sa_cpu_features;

typedef struct {
  sa_cpu_features f;
  sa_cpu_simd simd_cpu; /* the widest level the CPU has */
  sa_cpu_simd simd;     /* the default level: simd_cpu, lowered by SINKATTN_SIMD */
  int env_bad;          /* SINKATTN_SIMD holds something else than avx512 / avx2 / scalar */
  char env[32];         /* SINKATTN_SIMD as read ("" when unset), for messages */
  int threads;          /* default thread count: SINKATTN_NUM_THREADS (1..4096), else the online cores */
  int threads_bad;      /* SINKATTN_NUM_THREADS is not an integer >= 0 (0: the default) */
  char threads_env[32]; /* SINKATTN_NUM_THREADS as read, for messages */
} sa_cpu_record;

/* The record from features and SINKATTN_SIMD / SINKATTN_NUM_THREADS values (NULL: unset); cores: the
   online cores. Pure. */
void sa_cpu_record_make(const sa_cpu_features *f, const char *simd_env, const char *threads_env, int cores,
                        sa_cpu_record *r);
/* This process's record: CPUID, XCR0, arch_prctl, the core count and both variables read on the first
   call only. */
const sa_cpu_record *sa_cpu_record_get(void);

typedef struct sa_cpu_plan {
  const char *name;   /* static: "cpu.fwd.avx512" */
  int which;          /* SA_PLAN_FWD / BWD / DECODE */
  sa_cpu_simd simd;   /* vector level of the kernels */
  sa_cpu_tile tile;   /* the products under the kernel body */
  int bf16_dot;       /* decode: AVX512-BF16 dot products for Q.K^T */
  int fwd_kernels;    /* decode: served by the attention forward (bias, mask, positions, cap), at level simd */
  int64_t rows;       /* query rows per work item: fwd / bwd G * bq; decode R = G * Tq per kv head */
  int64_t bq;         /* fwd / bwd: query positions per forward / dq item */
  int64_t bq_min;     /* fwd / bwd: the smallest bq any mask gives this shape (sizes the dsinks partials) */
  int64_t keys;       /* fwd / bwd: keys per tile; decode: keys per work item (the chunk) */
  int64_t splits;     /* decode: chunks per (b, kv head) */
  const char *reason; /* static: why this plan */
} sa_cpu_plan;

/* Query positions per forward / dq item (bq) and the smallest any mask gives this shape (bq_min): the
   plans' rows, the same at every SIMD level; tile: the tile kernels' (which differ under a causal mask). */
void sa_cpu_plan_rows(const sa_attn *a, int tile, int64_t *bq, int64_t *bq_min);

/* The plan for problem a of kind which. forced NULL or "": the default, the first legal plan of the
   kind that is not override-only (an AMX tile plan only at a shape it wins). Else that plan: SA_ERR_INVALID (message naming it and the known
   names) when an unknown cpu.* name, SA_ERR_UNSUPPORTED (naming it and why) when it cannot run this call
   or is another backend's; never a silent fallback. SA_ERR_INVALID too when SINKATTN_SIMD holds an
   unknown value. */
sa_status sa_cpu_plan_make(const sa_attn *a, int which, const sa_cpu_record *r, const char *forced, sa_cpu_plan *p);
/* Every plan legal for a, default first, override-only ones last; writes up to max names and returns
   how many there are. */
int sa_cpu_plan_list(const sa_attn *a, int which, const sa_cpu_record *r, const char **names, int max);
/* The static copy of a CPU plan's name (of any kind), NULL when name is none; the i-th name, NULL past the
   last (the plan API lists and validates names with them). */
const char *sa_cpu_plan_known(const char *name);
const char *sa_cpu_plan_name(int i);
/* One line: "cpu.fwd.avx512 simd=avx512 rows=256 keys=64 threads=2 reason=..." (first word the name). */
size_t sa_cpu_plan_describe(const sa_cpu_plan *p, const sa_attn *a, int threads, char *buf, size_t n);

/* The plan of this thread's CPU call of kind which (sa_plan_forced's plan, else the default). */
sa_status sa_cpu_plan_of(const sa_attn *a, int which, sa_cpu_plan *p);
/* Records the description of a plan that ran (sa_plan_record) with the threads it ran on. */
void sa_cpu_plan_ran(const sa_cpu_plan *p, const sa_attn *a, int threads);

#endif /* SA_CPU_PLAN_H */
