/*
 * test_cpu_tile.c — the AMX tile path's code (cpu_tile.h under the kernel body) over the emulated tile
 * instructions (plans cpu.fwd.amx.emulated / cpu.bwd.amx.emulated), so that its packing, VNNI layout,
 * padding and scaling are checked on any CPU with AVX-512 and AVX512-BF16: the table of sa_test_tile.h against the fp64
 * reference, and bitwise identical results on 1 and 2 threads. Exit 77 (skipped) where the CPU has no
 * AVX-512 (the emulated plans' vector layer) or no AVX512-BF16 (their packing). It also checks the AVX-512
 * layer's bf16 store (the output rows of the tile and AVX-512 kernels) on every fp32 input.
 * Last line: "N passed, N failed".
 */
#include "cpu/cpu_plan.h"
#include "sa_test_tile.h"

/* The AVX-512 vector layer's bf16 store (the tile and AVX-512 kernels' output rows), compiled for AVX-512
   here only: main runs it after checking the CPU has it. */
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
#endif
#include "cpu/cpu_vec_avx512.h"

/* sa_store_bf16_avx512 against sa_f32_to_bf16 over all 2^32 fp32 bit patterns (NaNs, infinities,
   denormals, every rounding tie): the number that differ. */
static uint64_t tt_store_bf16_mismatches(void) {
  uint64_t bad = 0;
  for (uint64_t base = 0; base < (1ull << 32); base += 16) {
    uint32_t u[16];
    uint16_t got[16];
    for (int i = 0; i < 16; i++) u[i] = (uint32_t)(base + (uint64_t)i);
    sa_store_bf16_avx512(got, _mm512_loadu_ps((const float *)(const void *)u));
    for (int i = 0; i < 16; i++) {
      float f;
      memcpy(&f, &u[i], 4);
      bad += got[i] != sa_f32_to_bf16(f);
    }
  }
  return bad;
}
#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* 1 and 2 threads give the same bits for every output (dbias of a bias shared by the heads included), and
   the 2-thread run used 2 threads. */
static void tt_threads(void) {
  const t_case c = {"threads",
                    TT_BF,
                    2,
                    129,
                    150,
                    8,
                    2,
                    64,
                    64,
                    TT_LEARN,
                    .sinks = T_SINK_BIG,
                    .causal = SA_CAUSAL_BOTTOM_RIGHT,
                    T_UNBOUNDED,
                    .lens = T_LENS_RANDOM,
                    .bias = T_BCAST(0, 1, 0, 0)};
  t_prob p;
  if (!tt_prepare(&p, &c, 1000)) {
    t_report("threads: reference failed: %s", sa_last_error());
    t_count(0);
    t_prob_free(&p);
    return;
  }
  size_t es = sa_dtype_size(c.dt);
  void *keep[7];
  const int64_t len[7] = {
      p.no * (int64_t)es, p.nl * 4, p.nq * (int64_t)es, p.nk * (int64_t)es, p.nv * (int64_t)es, c.N * 4, p.nb * 4};
  int same = 1, two = 0;
  for (int threads = 1; threads <= 2; threads++) {
    sa_cpu_set_num_threads(threads);
    int ok = tt_run(&p, &c, "cpu.fwd.amx.emulated", "cpu.bwd.amx.emulated", "threads");
    two = strstr(sa_plan_last(SA_PLAN_FWD), "threads=2") && strstr(sa_plan_last(SA_PLAN_BWD), "threads=2");
    const void *now[7] = {p.out_c, p.lse_c, p.dq_c, p.dk_c, p.dv_c, p.ds_c, p.db_c};
    for (int k = 0; k < 7; k++) {
      if (threads == 1) keep[k] = memcpy(malloc((size_t)len[k]), now[k], (size_t)len[k]);
      else same &= ok && memcmp(keep[k], now[k], (size_t)len[k]) == 0;
    }
  }
  sa_cpu_set_num_threads(0);
  if (!same) t_report("threads: 1 and 2 threads differ bitwise");
  if (!two) t_report("threads: the second run did not use 2 threads (%s)", sa_plan_last(SA_PLAN_FWD));
  t_count(same && two);
  printf("1 vs 2 threads (B2 T129 S150 N8 K2 H64, bias, lengths): %s\n", same && two ? "bitwise identical" : "FAIL");
  for (int k = 0; k < 7; k++) free(keep[k]);
  t_prob_free(&p);
}

int main(void) {
  if (sa_cpu_record_get()->simd < SA_CPU_AVX512) {
    printf("SKIP: the emulated tile plans run on the AVX-512 vector layer; this CPU (or SINKATTN_SIMD) has none\n");
    return 77;
  }
  if (!sa_cpu_record_get()->f.avx512_bf16) {
    printf("SKIP: the emulated tile plans pack their operands with AVX512-BF16, which this CPU lacks\n");
    return 77;
  }
  const uint64_t bad = tt_store_bf16_mismatches();
  if (bad)
    t_report("the AVX-512 bf16 store differs from sa_f32_to_bf16 on %llu of 2^32 inputs", (unsigned long long)bad);
  t_count(bad == 0);
  printf("AVX-512 bf16 store: %llu of 2^32 fp32 inputs differ from sa_f32_to_bf16\n", (unsigned long long)bad);
  double worst[7] = {0};
  for (int i = 0; i < TT_NCASES; i++) {
    const t_case *c = &tt_cases[i];
    char tag[160];
    snprintf(tag, sizeof tag, "tile case %d [%s]", i, c->name);
    t_prob p;
    if (!tt_prepare(&p, c, i)) {
      t_report("%s: reference failed: %s", tag, sa_last_error());
      t_count(0);
    } else if (tt_run(&p, c, "cpu.fwd.amx.emulated", "cpu.bwd.amx.emulated", tag)) {
      tt_check(&p, c, tag, worst);
    } else {
      t_count(0);
    }
    t_prob_free(&p);
  }
  printf("%d cases, emulated tiles against the fp64 reference; largest error / tolerance:", TT_NCASES);
  for (int k = 0; k < 7; k++) printf(" %s %.3f", tt_err_names[k], worst[k]);
  printf("\n");
  tt_threads();
  printf("%d passed, %d failed\n", t_passed, t_failed);
  return t_failed ? 1 : 0;
}
