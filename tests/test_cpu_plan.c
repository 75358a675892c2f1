/*
 * test_cpu_plan.c — the CPU backend's dispatch (src/cpu/cpu_plan.h): the record built from CPUID-like
 * features, SINKATTN_SIMD (which may only lower the level) and SINKATTN_NUM_THREADS, which plans are legal and which is the
 * default (on a record with AMX and one without: the AMX tile plans are the bf16 default with AMX at the shapes
 * they win, the vector plans elsewhere), the errors of forced plans (unknown: SA_ERR_INVALID; not legal here,
 * the AMX tile path on a CPU without it: SA_ERR_UNSUPPORTED naming the plan and why; the emulated tile plans
 * legal on any AVX-512 + AVX512-BF16 CPU for bf16, never a default; the tile decode's own limits: head_dim a
 * multiple of 32, no bias, mask or positions), the record read once per process, and every
 * plan legal on this machine forced in turn (sa_plan_force) on small problems against the fp64 reference,
 * sa_plan_last naming it, and every CPU plan name forced on every kind of call and dtype: it runs or the
 * error names it.
 * Last line: "N passed, N failed".
 */
#define _POSIX_C_SOURCE 200112L /* setenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_plan.h"
#include "sa_internal.h"
#include "sa_plan.h"

static int n_pass, n_fail;

static void check(int ok, const char *what) {
  if (ok) n_pass++;
  else {
    n_fail++;
    printf("FAIL: %s (last error: %s)\n", what, sa_last_error());
  }
}

static const sa_cpu_features f_avx512 = {1, 1, 1, 0, 0, 0}, f_avx2 = {1, 0, 0, 0, 0, 0};

static sa_attn problem(sa_dtype t) {
  sa_attn a;
  sa_attn_init(&a);
  a.dtype = t;
  a.batch = 1;
  a.q_len = 8;
  a.kv_len = 8;
  a.q_heads = 4;
  a.kv_heads = 2;
  a.head_dim = 16;
  a.v_head_dim = 16;
  return a;
}

static int plan_is(const sa_attn *a, int which, const sa_cpu_record *r, const char *forced, const char *name) {
  sa_cpu_plan p;
  return sa_cpu_plan_make(a, which, r, forced, &p) == SA_OK && strcmp(p.name, name) == 0;
}

/* forced on a: status want, and the message names every word given */
static int fails(const sa_attn *a, int which, const sa_cpu_record *r, const char *forced, sa_status want,
                 const char *w1, const char *w2) {
  sa_cpu_plan p;
  sa_status s = sa_cpu_plan_make(a, which, r, forced, &p);
  return s == want && (!w1 || strstr(sa_last_error(), w1)) && (!w2 || strstr(sa_last_error(), w2));
}

static void test_record(void) {
  sa_cpu_record r;
  sa_cpu_record_make(&f_avx512, NULL, NULL, 2, &r);
  check(r.simd_cpu == SA_CPU_AVX512 && r.simd == SA_CPU_AVX512 && !r.env_bad, "AVX-512 CPU: level avx512");
  sa_cpu_record_make(&f_avx512, "avx2", NULL, 2, &r);
  check(r.simd == SA_CPU_AVX2 && r.simd_cpu == SA_CPU_AVX512, "SINKATTN_SIMD=avx2 lowers avx512 to avx2");
  sa_cpu_record_make(&f_avx512, "scalar", NULL, 2, &r);
  check(r.simd == SA_CPU_SCALAR, "SINKATTN_SIMD=scalar lowers to scalar");
  sa_cpu_record_make(&f_avx2, "avx512", NULL, 2, &r);
  check(r.simd == SA_CPU_AVX2 && !r.env_bad, "SINKATTN_SIMD=avx512 cannot raise an AVX2 CPU");
  sa_cpu_record_make(&f_avx2, "", NULL, 2, &r);
  check(r.simd == SA_CPU_AVX2 && !r.env_bad, "empty SINKATTN_SIMD is unset");
  sa_cpu_record_make(&f_avx512, "avx-512", NULL, 2, &r);
  check(r.env_bad && strcmp(r.env, "avx-512") == 0, "unknown SINKATTN_SIMD flagged");
  sa_attn a = problem(SA_F32);
  sa_cpu_plan p;
  check(sa_cpu_plan_make(&a, SA_PLAN_FWD, &r, NULL, &p) == SA_ERR_INVALID && strstr(sa_last_error(), "SINKATTN_SIMD") &&
            strstr(sa_last_error(), "avx-512"),
        "unknown SINKATTN_SIMD: every plan fails with SA_ERR_INVALID naming it");
  const char *names[8];
  check(sa_cpu_plan_list(&a, SA_PLAN_FWD, &r, names, 8) == 0, "unknown SINKATTN_SIMD: no legal plan");

  sa_cpu_record_make(&f_avx512, NULL, "3", 2, &r);
  check(r.threads == 3 && !r.threads_bad, "SINKATTN_NUM_THREADS=3");
  sa_cpu_record_make(&f_avx512, NULL, "0", 5, &r);
  check(r.threads == 5 && !r.threads_bad, "SINKATTN_NUM_THREADS=0: the online cores");
  sa_cpu_record_make(&f_avx512, NULL, NULL, 0, &r);
  check(r.threads == 1, "no core count known: one thread");
  sa_cpu_record_make(&f_avx512, NULL, "99999", 2, &r);
  check(r.threads == 4096, "SINKATTN_NUM_THREADS above 4096 is 4096");
  sa_cpu_record_make(&f_avx512, NULL, "4x", 2, &r);
  check(r.threads_bad && sa_cpu_plan_make(&a, SA_PLAN_BWD, &r, NULL, &p) == SA_ERR_INVALID &&
            strstr(sa_last_error(), "SINKATTN_NUM_THREADS") && strstr(sa_last_error(), "4x"),
        "SINKATTN_NUM_THREADS=4x: every plan fails with SA_ERR_INVALID naming it");
  sa_cpu_record_make(&f_avx512, NULL, "-2", 2, &r);
  check(r.threads_bad, "SINKATTN_NUM_THREADS=-2 flagged");
}

/* The tile decode (cpu.decode.amx, cpu.decode.amx.emulated): bf16 caches with head_dim a multiple of 32, no
   bias, mask or positions; cpu.decode.amx the bf16 default with AMX (listed first), the emulation never a
   default (listed last); each refusal names why. */
static void test_decode_tile_plans(const sa_cpu_record *r512, const sa_cpu_record *r2, const sa_cpu_record *rlow) {
  sa_attn bf = problem(SA_BF16);
  bf.q_len = 1;
  bf.head_dim = bf.v_head_dim = 64;
  sa_attn f32 = bf, f16 = bf, h40 = bf, biased = bf, pos = bf;
  f32.dtype = SA_F32;
  f16.dtype = SA_F16;
  h40.head_dim = 40;
  biased.bias_dims[0] = biased.bias_dims[1] = biased.bias_dims[2] = biased.bias_dims[3] = 1;
  pos.q_positions = pos.kv_positions = (const int32_t *)&bf.batch;
  const char *names[8];
  int n = sa_cpu_plan_list(&bf, SA_PLAN_DECODE, r512, names, 8);
  check(n == 5 && !strcmp(names[0], "cpu.decode.avx512bf16") && !strcmp(names[3], "cpu.decode.fwd") &&
            !strcmp(names[4], "cpu.decode.amx.emulated"),
        "bf16 H 64 decode plans without AMX: avx512bf16, avx512, portable, fwd, amx.emulated");
  check(plan_is(&bf, SA_PLAN_DECODE, r512, "cpu.decode.amx.emulated", "cpu.decode.amx.emulated"),
        "cpu.decode.amx.emulated legal on AVX-512 + AVX512-BF16 (bf16, H 64)");
  check(fails(&bf, SA_PLAN_DECODE, r512, "cpu.decode.amx", SA_ERR_UNSUPPORTED, "cpu.decode.amx", "AMX-BF16"),
        "cpu.decode.amx without AMX: SA_ERR_UNSUPPORTED naming the plan and AMX-BF16");
  check(fails(&f32, SA_PLAN_DECODE, r512, "cpu.decode.amx.emulated", SA_ERR_UNSUPPORTED, "bf16 inputs only", NULL) &&
            fails(&f16, SA_PLAN_DECODE, r512, "cpu.decode.amx.emulated", SA_ERR_UNSUPPORTED, "AMX-FP16", NULL) &&
            fails(&f32, SA_PLAN_DECODE, r512, "cpu.decode.amx", SA_ERR_UNSUPPORTED, "bf16 inputs only", NULL),
        "tile decode on f32 / f16 caches: SA_ERR_UNSUPPORTED naming the dtype");
  check(fails(&h40, SA_PLAN_DECODE, r512, "cpu.decode.amx.emulated", SA_ERR_UNSUPPORTED, "head_dim", "multiple of 32"),
        "tile decode at head_dim 40: SA_ERR_UNSUPPORTED naming head_dim");
  check(fails(&biased, SA_PLAN_DECODE, r512, "cpu.decode.amx.emulated", SA_ERR_UNSUPPORTED, "bias", NULL) &&
            fails(&pos, SA_PLAN_DECODE, r512, "cpu.decode.amx", SA_ERR_UNSUPPORTED, "positions", NULL),
        "tile decode with a bias or positions: SA_ERR_UNSUPPORTED naming them");
  check(fails(&bf, SA_PLAN_DECODE, r2, "cpu.decode.amx.emulated", SA_ERR_UNSUPPORTED, "CPUID", NULL) &&
            fails(&bf, SA_PLAN_DECODE, rlow, "cpu.decode.amx.emulated", SA_ERR_UNSUPPORTED, "SINKATTN_SIMD", NULL),
        "emulated tile decode on an AVX2 CPU or under SINKATTN_SIMD=avx2: SA_ERR_UNSUPPORTED");
  const sa_cpu_features f_nobf16 = {1, 1, 0, 0, 0, 0};
  sa_cpu_features f = f_nobf16;
  sa_cpu_record r;
  sa_cpu_record_make(&f, NULL, NULL, 2, &r);
  check(fails(&bf, SA_PLAN_DECODE, &r, "cpu.decode.amx.emulated", SA_ERR_UNSUPPORTED, "AVX512-BF16", NULL),
        "emulated tile decode without AVX512-BF16: SA_ERR_UNSUPPORTED naming it");
  f.avx512_bf16 = f.amx_bf16 = 1;
  sa_cpu_record_make(&f, NULL, NULL, 2, &r);
  check(fails(&bf, SA_PLAN_DECODE, &r, "cpu.decode.amx", SA_ERR_UNSUPPORTED, "cpu.decode.amx", "arch_prctl"),
        "cpu.decode.amx without the OS's tile state: SA_ERR_UNSUPPORTED naming arch_prctl");
  f.amx_os = 1;
  sa_cpu_record_make(&f, NULL, NULL, 2, &r);
  sa_cpu_plan p;
  sa_status s = sa_cpu_plan_make(&bf, SA_PLAN_DECODE, &r, "cpu.decode.amx", &p);
  check(s == SA_OK ? p.tile == SA_CPU_TILE_AMX : s == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), "-mamx-tile"),
        "AMX CPU and OS: cpu.decode.amx legal, or refused naming the compiler's missing -mamx-tile");
  check(plan_is(&bf, SA_PLAN_DECODE, &r, NULL, s == SA_OK ? "cpu.decode.amx" : "cpu.decode.avx512bf16"),
        "AMX CPU: the bf16 decode default is cpu.decode.amx (avx512bf16 where the tile kernels are not built)");
  n = sa_cpu_plan_list(&bf, SA_PLAN_DECODE, &r, names, 8);
  check(s == SA_OK ? n == 6 && !strcmp(names[0], "cpu.decode.amx") && !strcmp(names[1], "cpu.decode.avx512bf16") &&
                         !strcmp(names[5], "cpu.decode.amx.emulated")
                   : n == 5,
        "AMX CPU: cpu.decode.amx listed first, its emulation last");
  check(plan_is(&f16, SA_PLAN_DECODE, &r, NULL, "cpu.decode.avx512") &&
            plan_is(&f32, SA_PLAN_DECODE, &r, NULL, "cpu.decode.avx512"),
        "AMX CPU: f16 and f32 caches keep the vector decode");
  sa_attn biased64 = biased;
  biased64.kv_len = 64;
  check(plan_is(&biased64, SA_PLAN_DECODE, &r, NULL, "cpu.decode.fwd") &&
            sa_cpu_plan_make(&biased64, SA_PLAN_DECODE, &r, NULL, &p) == SA_OK &&
            p.tile == (s == SA_OK ? SA_CPU_TILE_AMX : SA_CPU_TILE_NONE) &&
            sa_cpu_plan_make(&biased, SA_PLAN_DECODE, &r, NULL, &p) == SA_OK && p.tile == SA_CPU_TILE_NONE,
        "AMX CPU: a bf16 decode with a bias runs the forward's default kernels (AMX tiles from 32 keys on)");
  check(sa_cpu_plan_make(&h40, SA_PLAN_DECODE, &r, NULL, &p) == SA_OK && !strcmp(p.name, "cpu.decode.avx512bf16") &&
            sa_cpu_plan_list(&h40, SA_PLAN_DECODE, &r, names, 8) == 4,
        "head_dim 40 on an AMX CPU: the tile decode plans not listed");
}

static void test_plans(void) {
  sa_cpu_record r512, r2, rlow;
  sa_cpu_record_make(&f_avx512, NULL, NULL, 2, &r512);
  sa_cpu_record_make(&f_avx2, NULL, NULL, 2, &r2);
  sa_cpu_record_make(&f_avx512, "avx2", NULL, 2, &rlow);
  sa_attn f32 = problem(SA_F32), bf = problem(SA_BF16), f16 = problem(SA_F16);

  check(plan_is(&f32, SA_PLAN_FWD, &r512, NULL, "cpu.fwd.avx512"), "default fwd avx512");
  check(plan_is(&f32, SA_PLAN_BWD, &r2, NULL, "cpu.bwd.avx2"), "AVX2 CPU: default bwd avx2");
  check(plan_is(&f32, SA_PLAN_FWD, &rlow, NULL, "cpu.fwd.avx2"), "SINKATTN_SIMD=avx2: default fwd avx2");
  check(plan_is(&bf, SA_PLAN_DECODE, &r512, NULL, "cpu.decode.avx512bf16"), "bf16 decode: vdpbf16ps default");
  check(plan_is(&f32, SA_PLAN_DECODE, &r512, NULL, "cpu.decode.avx512"), "f32 decode: avx512 default");
  check(plan_is(&bf, SA_PLAN_DECODE, &rlow, NULL, "cpu.decode.portable"), "SINKATTN_SIMD=avx2: portable decode");
  check(plan_is(&f32, SA_PLAN_FWD, &r512, "cpu.fwd.scalar", "cpu.fwd.scalar"), "forcing a lower level works");
  check(plan_is(&f32, SA_PLAN_FWD, &r512, "", "cpu.fwd.avx512"), "an empty forced name is the default");

  check(fails(&f32, SA_PLAN_FWD, &r2, "cpu.fwd.avx512", SA_ERR_UNSUPPORTED, "cpu.fwd.avx512", "CPUID"),
        "avx512 forced on an AVX2 CPU: SA_ERR_UNSUPPORTED naming the plan and CPUID");
  check(fails(&f32, SA_PLAN_BWD, &rlow, "cpu.bwd.avx512", SA_ERR_UNSUPPORTED, "cpu.bwd.avx512", "SINKATTN_SIMD"),
        "avx512 forced under SINKATTN_SIMD=avx2: SA_ERR_UNSUPPORTED naming SINKATTN_SIMD");
  check(fails(&f32, SA_PLAN_FWD, &r512, "cpu.fwd.sse", SA_ERR_INVALID, "cpu.fwd.sse", "cpu.fwd.avx2"),
        "unknown plan: SA_ERR_INVALID naming it and the known plans");
  check(fails(&f32, SA_PLAN_FWD, &r512, "cpu.decode.avx512", SA_ERR_INVALID, "cpu.decode.avx512", NULL),
        "a decode plan forced on a forward: SA_ERR_INVALID");
  check(fails(&f32, SA_PLAN_FWD, &r512, "hopper.fwd.persistent", SA_ERR_UNSUPPORTED, "hopper.fwd.persistent", "CPU"),
        "another backend's plan on a CPU call: SA_ERR_UNSUPPORTED naming it");
  check(fails(&f32, SA_PLAN_DECODE, &r512, "cpu.decode.avx512bf16", SA_ERR_UNSUPPORTED, "bf16", NULL),
        "vdpbf16ps decode forced on an f32 cache: SA_ERR_UNSUPPORTED");

  /* the tile path: each missing piece named; the default where AMX is there */
  sa_cpu_features f = f_avx512;
  sa_cpu_record r;
  sa_cpu_record_make(&f, NULL, NULL, 2, &r);
  check(fails(&bf, SA_PLAN_FWD, &r, "cpu.fwd.amx", SA_ERR_UNSUPPORTED, "cpu.fwd.amx", "AMX-BF16"),
        "AMX forced without AMX-BF16: SA_ERR_UNSUPPORTED naming the plan and CPUID");
  f.amx_bf16 = 1;
  sa_cpu_record_make(&f, NULL, NULL, 2, &r);
  check(fails(&bf, SA_PLAN_BWD, &r, "cpu.bwd.amx", SA_ERR_UNSUPPORTED, "cpu.bwd.amx", "arch_prctl"),
        "AMX without the OS's tile state: SA_ERR_UNSUPPORTED naming arch_prctl");
  check(fails(&f16, SA_PLAN_FWD, &r, "cpu.fwd.amx", SA_ERR_UNSUPPORTED, "AMX-FP16", NULL),
        "f16 on the tile path: SA_ERR_UNSUPPORTED naming AMX-FP16");
  f.amx_os = 1;
  sa_cpu_record_make(&f, NULL, NULL, 2, &r);
  check(fails(&f32, SA_PLAN_FWD, &r, "cpu.fwd.amx", SA_ERR_UNSUPPORTED, "bf16 inputs only", NULL),
        "AMX forced on f32: SA_ERR_UNSUPPORTED");
  {
    sa_cpu_plan p;
    sa_status s = sa_cpu_plan_make(&bf, SA_PLAN_FWD, &r, "cpu.fwd.amx", &p);
    check(s == SA_OK ? p.tile == SA_CPU_TILE_AMX : s == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), "-mamx-tile"),
          "AMX CPU and OS: cpu.fwd.amx legal, or refused naming the compiler's missing -mamx-tile");
  }
  { /* the defaults with AMX: bf16 on the tiles from SA_CPU_TILE_MIN_KEYS (32) keys on, the rest vectors */
    sa_cpu_plan p;
    const int built = sa_cpu_plan_make(&bf, SA_PLAN_FWD, &r, "cpu.fwd.amx", &p) == SA_OK;
    sa_attn big = bf, big16 = f16, big32 = f32;
    big.kv_len = big16.kv_len = big32.kv_len = 32;
    check(plan_is(&big, SA_PLAN_FWD, &r, NULL, built ? "cpu.fwd.amx" : "cpu.fwd.avx512") &&
              plan_is(&big, SA_PLAN_BWD, &r, NULL, built ? "cpu.bwd.amx" : "cpu.bwd.avx512"),
          "AMX CPU: bf16 with 32 keys defaults to cpu.fwd.amx / cpu.bwd.amx (avx512 where they are not built)");
    check(!built || (sa_cpu_plan_make(&big, SA_PLAN_FWD, &r, NULL, &p) == SA_OK && p.tile == SA_CPU_TILE_AMX &&
                     strstr(p.reason, "AMX tiles")),
          "AMX CPU: the tile default's reason names the AMX tiles");
    check(sa_cpu_plan_make(&bf, SA_PLAN_FWD, &r, NULL, &p) == SA_OK && !strcmp(p.name, "cpu.fwd.avx512") &&
              (!built || strstr(p.reason, "fewer keys")) && plan_is(&bf, SA_PLAN_BWD, &r, NULL, "cpu.bwd.avx512"),
          "AMX CPU: bf16 with 8 keys stays on the vector plans, the reason naming the tile threshold");
    check(plan_is(&big16, SA_PLAN_FWD, &r, NULL, "cpu.fwd.avx512") &&
              plan_is(&big32, SA_PLAN_BWD, &r, NULL, "cpu.bwd.avx512"),
          "AMX CPU: f16 and f32 stay on the vector plans");
    const char *nm[8];
    int nn = sa_cpu_plan_list(&big, SA_PLAN_FWD, &r, nm, 8);
    check(built ? nn == 5 && !strcmp(nm[0], "cpu.fwd.amx") && !strcmp(nm[1], "cpu.fwd.avx512") &&
                      !strcmp(nm[4], "cpu.fwd.amx.emulated")
                : nn == 4 && !strcmp(nm[0], "cpu.fwd.avx512"),
          "AMX CPU, bf16: amx (the default), avx512, avx2, scalar, amx.emulated");
    nn = sa_cpu_plan_list(&bf, SA_PLAN_FWD, &r, nm, 8);
    check(built ? nn == 5 && !strcmp(nm[0], "cpu.fwd.avx512") && !strcmp(nm[1], "cpu.fwd.amx") : nn == 4,
          "AMX CPU, bf16 below the threshold: the default avx512 listed first, amx after it");
    sa_cpu_record rl;
    sa_cpu_record_make(&f, "avx2", NULL, 2, &rl);
    check(plan_is(&big, SA_PLAN_FWD, &rl, NULL, "cpu.fwd.avx2") &&
              plan_is(&big, SA_PLAN_DECODE, &rl, NULL, "cpu.decode.portable"),
          "AMX CPU under SINKATTN_SIMD=avx2: the avx2 / portable defaults (the tile kernels are AVX-512)");
    check(plan_is(&big, SA_PLAN_FWD, &r512, NULL, "cpu.fwd.avx512") &&
              plan_is(&big, SA_PLAN_BWD, &r512, NULL, "cpu.bwd.avx512"),
          "the same bf16 call without AMX: the avx512 defaults");
  }

  /* the emulated tile plans: legal on any AVX-512 + AVX512-BF16 CPU for bf16, never a default, listed last */
  check(plan_is(&bf, SA_PLAN_FWD, &r512, "cpu.fwd.amx.emulated", "cpu.fwd.amx.emulated") &&
            plan_is(&bf, SA_PLAN_BWD, &r512, "cpu.bwd.amx.emulated", "cpu.bwd.amx.emulated"),
        "emulated tile plans legal on an AVX-512 CPU without AMX (bf16)");
  check(fails(&bf, SA_PLAN_FWD, &r512, "cpu.fwd.amx", SA_ERR_UNSUPPORTED, "cpu.fwd.amx", "AMX-BF16"),
        "the same CPU: the real tile plan refused naming AMX-BF16");
  check(fails(&bf, SA_PLAN_FWD, &r2, "cpu.fwd.amx.emulated", SA_ERR_UNSUPPORTED, "CPUID", NULL),
        "emulated tile plan on an AVX2 CPU: SA_ERR_UNSUPPORTED (its vector layer is AVX-512)");
  check(fails(&bf, SA_PLAN_BWD, &rlow, "cpu.bwd.amx.emulated", SA_ERR_UNSUPPORTED, "SINKATTN_SIMD", NULL),
        "emulated tile plan under SINKATTN_SIMD=avx2: SA_ERR_UNSUPPORTED");
  check(fails(&f32, SA_PLAN_FWD, &r512, "cpu.fwd.amx.emulated", SA_ERR_UNSUPPORTED, "bf16", NULL) &&
            fails(&f16, SA_PLAN_BWD, &r512, "cpu.bwd.amx.emulated", SA_ERR_UNSUPPORTED, "AMX-FP16", NULL),
        "emulated tile plans on f32 / f16: SA_ERR_UNSUPPORTED");
  check(plan_is(&bf, SA_PLAN_BWD, &r512, NULL, "cpu.bwd.avx512"), "emulated tile plans are never a default");
  {
    const sa_cpu_features f_nobf16 = {1, 1, 0, 0, 0, 0};
    sa_cpu_record rn;
    sa_cpu_record_make(&f_nobf16, NULL, NULL, 2, &rn);
    check(fails(&bf, SA_PLAN_FWD, &rn, "cpu.fwd.amx.emulated", SA_ERR_UNSUPPORTED, "AVX512-BF16", NULL),
          "emulated tile plan on AVX-512 without AVX512-BF16 (its packing converts with it): SA_ERR_UNSUPPORTED");
  }
  {
    const char *nm[8];
    int nn = sa_cpu_plan_list(&bf, SA_PLAN_FWD, &r512, nm, 8);
    check(nn == 4 && !strcmp(nm[0], "cpu.fwd.avx512") && !strcmp(nm[3], "cpu.fwd.amx.emulated"),
          "bf16 fwd plans on AVX-512 without AMX: avx512, avx2, scalar, amx.emulated");
  }

  const char *names[8];
  int n = sa_cpu_plan_list(&bf, SA_PLAN_DECODE, &r512, names, 8);
  check(n == 4 && !strcmp(names[0], "cpu.decode.avx512bf16") && !strcmp(names[2], "cpu.decode.portable") &&
            !strcmp(names[3], "cpu.decode.fwd"),
        "bf16 decode plans: avx512bf16, avx512, portable, fwd");
  test_decode_tile_plans(&r512, &r2, &rlow);

  sa_attn biased = bf;
  biased.bias_dims[0] = biased.bias_dims[1] = biased.bias_dims[2] = biased.bias_dims[3] = 1;
  check(plan_is(&biased, SA_PLAN_DECODE, &r512, NULL, "cpu.decode.fwd"),
        "a decode with a bias: the attention forward's kernels by default");
  check(fails(&biased, SA_PLAN_DECODE, &r512, "cpu.decode.avx512", SA_ERR_UNSUPPORTED, "cpu.decode.avx512", "bias"),
        "split-KV decode forced with a bias: SA_ERR_UNSUPPORTED naming the bias");
  biased.bias_dims[0] = biased.bias_dims[1] = biased.bias_dims[2] = biased.bias_dims[3] = 0;
  biased.q_positions = biased.kv_positions = (const int32_t *)&n;
  check(sa_cpu_plan_list(&biased, SA_PLAN_DECODE, &r512, names, 8) == 1 && !strcmp(names[0], "cpu.decode.fwd"),
        "a decode with positions: only cpu.decode.fwd");
  n = sa_cpu_plan_list(&f32, SA_PLAN_FWD, &r2, names, 8);
  check(n == 2 && !strcmp(names[0], "cpu.fwd.avx2") && !strcmp(names[1], "cpu.fwd.scalar"),
        "AVX2 CPU fwd plans: avx2, scalar");
  check(sa_cpu_plan_list(&f32, SA_PLAN_BWD, &r512, names, 1) == 3 && !strcmp(names[0], "cpu.bwd.avx512"),
        "the count exceeds max when more plans are legal");
  check(sa_cpu_plan_known("cpu.bwd.amx") && !sa_cpu_plan_known("cpu.bwd") && !sa_cpu_plan_known(NULL), "known names");
}

/* ---- this machine ------------------------------------------------------------------------------ */

static void *rand_buf(sa_dtype t, int64_t n, unsigned *seed) {
  void *p = malloc((size_t)n * sa_dtype_size(t));
  for (int64_t i = 0; i < n; i++) {
    *seed = *seed * 1664525u + 1013904223u;
    sa_store(p, t, i, (float)((*seed >> 8) & 0xffff) / 32768.0f - 1.0f);
  }
  return p;
}

/* max |x - ref| / max |ref| over n elements; NaN in x gives +inf */
static double rel_err(const void *x, const void *ref, sa_dtype t, int64_t n) {
  double e = 0, m = 1e-30;
  for (int64_t i = 0; i < n; i++) {
    double g = sa_load(x, t, i), r = sa_load(ref, t, i);
    if (isnan(g)) return INFINITY;
    e = fmax(e, fabs(g - r));
    m = fmax(m, fabs(r));
  }
  return e / m;
}

static int last_is(int which, const char *name) {
  const char *d = sa_plan_last(which);
  size_t n = strlen(name);
  return strncmp(d, name, n) == 0 && d[n] == ' ' && strstr(d, "threads=") && strstr(d, "reason=");
}

/* Every fwd and bwd plan legal here, forced, on a causal GQA problem with learnable sinks. */
static void test_forced_runs(sa_dtype t) {
  sa_attn a = problem(t);
  a.q_len = 77;
  a.kv_len = 91;
  a.q_heads = 8;
  a.kv_heads = 2;
  a.head_dim = 40;
  a.v_head_dim = 24;
  a.causal = SA_CAUSAL_BOTTOM_RIGHT;
  a.softmax = SA_SOFTMAX_LEARNABLE;
  float sinks[8] = {-3, 0, 2, 50, -50, 1, 7, -9};
  a.sinks = sinks;
  unsigned seed = 7;
  const int64_t nq = a.q_len * 8 * 40, nk = a.kv_len * 2 * 40, nv = a.kv_len * 2 * 24, no = a.q_len * 8 * 24;
  a.q = rand_buf(t, nq, &seed);
  a.k = rand_buf(t, nk, &seed);
  a.v = rand_buf(t, nv, &seed);
  void *dout = rand_buf(t, no, &seed);
  size_t es = sa_dtype_size(t);
  void *o_ref = malloc(no * es), *o = malloc(no * es), *dq_ref = malloc(nq * es), *dq = malloc(nq * es);
  void *dk_ref = malloc(nk * es), *dk = malloc(nk * es), *dv_ref = malloc(nv * es), *dv = malloc(nv * es);
  float lse_ref[8 * 77], lse[8 * 77], ds_ref[8], ds[8];
  sa_attn_grad g = {0};
  g.dout = dout;
  a.out = o_ref;
  a.lse = lse_ref;
  g.dq = dq_ref;
  g.dk = dk_ref;
  g.dv = dv_ref;
  g.dsinks = ds_ref;
  check(sa_attn_fwd(&a, SA_BACKEND_REF, NULL) == SA_OK && sa_attn_bwd(&a, &g, NULL, 0, SA_BACKEND_REF, NULL) == SA_OK,
        "reference fwd / bwd");
  const double tol = t == SA_F32 ? 1e-5 : 2e-2;
  const char *names[8];
  for (int which = SA_PLAN_FWD; which <= SA_PLAN_BWD; which++) {
    int n = sa_plan_list(&a, which, SA_BACKEND_CPU, names, 8);
    for (int i = 0; i < n && i < 8; i++) {
      char what[160];
      check(sa_plan_force(which, names[i]) == SA_OK, "force a listed plan");
      a.out = o;
      a.lse = lse;
      memset(o, 0xff, no * es);
      sa_status s = sa_attn_fwd(&a, SA_BACKEND_CPU, NULL); /* the bwd needs this call's out and lse */
      if (which == SA_PLAN_FWD) {
        snprintf(what, sizeof what, "%s %s: forward against the reference", t == SA_F32 ? "f32" : "bf16", names[i]);
        check(s == SA_OK && last_is(which, names[i]) && rel_err(o, o_ref, t, no) < tol, what);
        continue;
      }
      g.dq = dq;
      g.dk = dk;
      g.dv = dv;
      g.dsinks = ds;
      size_t ws = sa_attn_bwd_workspace_size(&a, SA_BACKEND_CPU);
      void *w = malloc(ws ? ws : 1);
      s |= sa_attn_bwd(&a, &g, w, ws, SA_BACKEND_CPU, NULL);
      free(w);
      snprintf(what, sizeof what, "%s %s: gradients against the reference", t == SA_F32 ? "f32" : "bf16", names[i]);
      double e = fmax(fmax(rel_err(dq, dq_ref, t, nq), rel_err(dk, dk_ref, t, nk)), rel_err(dv, dv_ref, t, nv));
      e = fmax(e, rel_err(ds, ds_ref, SA_F32, 8));
      check(s == SA_OK && last_is(which, names[i]) && e < 4 * tol, what);
      g.dq = dq_ref;
      g.dk = dk_ref;
      g.dv = dv_ref;
      g.dsinks = ds_ref;
    }
    sa_plan_force(which, NULL);
  }
  /* a plan of another backend forced on a CPU call, and a CPU plan on a REF call: SA_ERR_UNSUPPORTED */
  a.out = o;
  a.lse = lse;
  check(sa_plan_force(SA_PLAN_FWD, "ref.fwd") == SA_OK && sa_attn_fwd(&a, SA_BACKEND_CPU, NULL) == SA_ERR_UNSUPPORTED &&
            strstr(sa_last_error(), "ref.fwd"),
        "ref.fwd forced on a CPU call: SA_ERR_UNSUPPORTED naming it");
  check(sa_plan_force(SA_PLAN_FWD, "cpu.fwd.scalar") == SA_OK &&
            sa_attn_fwd(&a, SA_BACKEND_REF, NULL) == SA_ERR_UNSUPPORTED,
        "a CPU plan forced on a REF call: SA_ERR_UNSUPPORTED");
  sa_plan_force(SA_PLAN_FWD, NULL);
  /* the tile path here: legal only on an AMX CPU with the tile kernels built, and never silently replaced */
  check(sa_plan_force(SA_PLAN_FWD, "cpu.fwd.amx") == SA_OK, "cpu.fwd.amx is a known name");
  a.out = o;
  a.lse = lse;
  sa_status s = sa_attn_fwd(&a, SA_BACKEND_CPU, NULL);
  const sa_cpu_record *rec = sa_cpu_record_get();
  if (t == SA_F32)
    check(s == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), "bf16 inputs only"), "cpu.fwd.amx forced on f32: refused");
  else if (!rec->f.amx_bf16 || !rec->f.amx_os)
    check(s == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), "cpu.fwd.amx") && strstr(sa_last_error(), "AMX"),
          "cpu.fwd.amx forced without AMX: SA_ERR_UNSUPPORTED naming the plan and AMX");
  sa_plan_force(SA_PLAN_FWD, NULL);
  free((void *)a.q);
  free((void *)a.k);
  free((void *)a.v);
  free(dout);
  free(o_ref);
  free(o);
  free(dq_ref);
  free(dq);
  free(dk_ref);
  free(dk);
  free(dv_ref);
  free(dv);
}

/* Every CPU plan name there is, forced on a forward, a backward and a decode call of each dtype: it runs (and
   sa_plan_last names it) or the call fails naming it. A forced plan never takes the process down (a tile plan
   whose configuration was compiled away died here with SIGILL). */
static void test_every_forced_plan(void) {
  for (int ti = 0; ti < 3; ti++) {
    const sa_dtype t = ti == 0 ? SA_F32 : ti == 1 ? SA_F16 : SA_BF16;
    sa_attn a = problem(t);
    a.q_len = 40;
    a.kv_len = 70;
    a.head_dim = a.v_head_dim = 64;
    a.causal = SA_CAUSAL_BOTTOM_RIGHT;
    unsigned seed = 11;
    const int64_t nq = a.q_len * 4 * 64, nk = a.kv_len * 2 * 64;
    void *q = rand_buf(t, nq, &seed), *k = rand_buf(t, nk, &seed), *v = rand_buf(t, nk, &seed);
    void *dout = rand_buf(t, nq, &seed), *o = rand_buf(t, nq, &seed), *dq = rand_buf(t, nq, &seed);
    void *dk = rand_buf(t, nk, &seed), *dv = rand_buf(t, nk, &seed);
    float lse[4 * 40];
    a.q = q;
    a.k = k;
    a.v = v;
    a.out = o;
    a.lse = lse;
    sa_attn_grad g = {0};
    g.dout = dout;
    g.dq = dq;
    g.dk = dk;
    g.dv = dv;
    for (int i = 0; sa_cpu_plan_name(i); i++) {
      const char *name = sa_cpu_plan_name(i);
      for (int which = SA_PLAN_FWD; which <= SA_PLAN_DECODE; which++) {
        if (sa_plan_force(which, name) != SA_OK) continue; /* a plan of another kind: refused at once */
        sa_attn c = a;
        if (which == SA_PLAN_DECODE) c.q_len = 2;
        sa_status s = sa_attn_fwd(&c, SA_BACKEND_CPU, NULL);
        if (which == SA_PLAN_BWD && s == SA_OK) {
          size_t ws = sa_attn_bwd_workspace_size(&c, SA_BACKEND_CPU);
          void *w = malloc(ws ? ws : 1);
          s = sa_attn_bwd(&c, &g, w, ws, SA_BACKEND_CPU, NULL);
          free(w);
        } else if (which == SA_PLAN_DECODE) {
          size_t ws = sa_attn_decode_workspace_size(&c, SA_BACKEND_CPU);
          void *w = malloc(ws ? ws : 1);
          s = sa_attn_decode_fwd(&c, w, ws, SA_BACKEND_CPU, NULL);
          free(w);
        }
        char what[160];
        snprintf(what, sizeof what, "%s forced on a %s call (dtype %d): runs, or the error names it", name,
                 which == SA_PLAN_FWD   ? "forward"
                 : which == SA_PLAN_BWD ? "backward"
                                        : "decode",
                 (int)t);
        check(s == SA_OK ? last_is(which, name) : strstr(sa_last_error(), name) != NULL, what);
        sa_plan_force(which, NULL);
      }
    }
    free(q);
    free(k);
    free(v);
    free(dout);
    free(o);
    free(dq);
    free(dk);
    free(dv);
  }
}

static void test_machine(void) {
  const sa_cpu_record *r = sa_cpu_record_get();
  printf("this CPU: level %s (CPUID %d), AVX512-BF16 %d, AMX-BF16 %d, AMX-FP16 %d, tile state granted %d\n",
         sa_cpu_simd_name(), (int)r->simd_cpu, r->f.avx512_bf16, r->f.amx_bf16, r->f.amx_fp16, r->f.amx_os);
  check(sa_cpu_record_get() == r, "one record per process");
  check(sa_plan_force(SA_PLAN_FWD, "cpu.fwd.none") == SA_ERR_INVALID && strstr(sa_last_error(), "cpu.fwd.none"),
        "forcing an unknown name: SA_ERR_INVALID");
  check(sa_plan_force(3, "cpu.fwd.avx2") == SA_ERR_INVALID, "forcing kind 3: SA_ERR_INVALID");
  check(sa_plan_forced(SA_PLAN_FWD) == NULL, "a failed force leaves no plan forced");
  test_forced_runs(SA_F32);
  test_forced_runs(SA_BF16);
  test_every_forced_plan();
  { /* the tile decode through the plan API: refused here without AMX, naming the plan and AMX */
    sa_attn d = problem(SA_BF16);
    d.q_len = 1;
    d.head_dim = d.v_head_dim = 64;
    uint16_t q[4 * 64] = {0}, kv[8 * 2 * 64] = {0}, o[4 * 64];
    float l[4];
    d.q = q;
    d.k = d.v = kv;
    d.out = o;
    d.lse = l;
    check(sa_plan_force(SA_PLAN_DECODE, "cpu.decode.amx") == SA_OK, "cpu.decode.amx is a known name");
    sa_status ds = sa_attn_decode_fwd(&d, NULL, 0, SA_BACKEND_CPU, NULL);
    if (!r->f.amx_bf16 || !r->f.amx_os)
      check(ds == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), "cpu.decode.amx") && strstr(sa_last_error(), "AMX"),
            "cpu.decode.amx forced without AMX: SA_ERR_UNSUPPORTED naming the plan and AMX");
    else check(ds == SA_OK || strstr(sa_last_error(), "-mamx-tile"), "cpu.decode.amx forced on an AMX CPU runs");
    sa_plan_force(SA_PLAN_DECODE, NULL);
  }

  /* read once: the environment changed after the first call does not move the level */
  char before[16];
  snprintf(before, sizeof before, "%s", sa_cpu_simd_name());
  setenv("SINKATTN_SIMD", r->simd == SA_CPU_SCALAR ? "avx2" : "scalar", 1);
  sa_attn a = problem(SA_F32);
  unsigned seed = 3;
  a.q = rand_buf(SA_F32, 8 * 4 * 16, &seed);
  a.k = rand_buf(SA_F32, 8 * 2 * 16, &seed);
  a.v = rand_buf(SA_F32, 8 * 2 * 16, &seed);
  float out[8 * 4 * 16], lse[4 * 8];
  a.out = out;
  a.lse = lse;
  sa_status s = sa_attn_fwd(&a, SA_BACKEND_CPU, NULL);
  char want[40];
  snprintf(want, sizeof want, "cpu.fwd.%s", before);
  check(s == SA_OK && !strcmp(sa_cpu_simd_name(), before) && last_is(SA_PLAN_FWD, want),
        "SINKATTN_SIMD set after the first call changes nothing (read once)");
  setenv("SINKATTN_SIMD", "bogus", 1);
  check(sa_attn_fwd(&a, SA_BACKEND_CPU, NULL) == SA_OK, "nor does an unknown value set after it");
  unsetenv("SINKATTN_SIMD");
  const int threads = sa_cpu_get_num_threads();
  setenv("SINKATTN_NUM_THREADS", threads == 3 ? "5" : "3", 1);
  check(sa_cpu_get_num_threads() == threads && sa_attn_fwd(&a, SA_BACKEND_CPU, NULL) == SA_OK,
        "SINKATTN_NUM_THREADS set after the first call changes nothing (read once)");
  unsetenv("SINKATTN_NUM_THREADS");
  free((void *)a.q);
  free((void *)a.k);
  free((void *)a.v);
}

int main(void) {
  test_record();
  test_plans();
  test_machine();
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
