/*
 * amx_check_decode.h — amx_check's decode part, for an AMX CPU: the tile decode item on the real instructions
 * (cpu.decode.amx) against the fp64 reference with test_decode's tolerance (bf16: 1.6e-2 of 1 + |ref| per
 * element, lse 1e-4) and against the same item over emulated instructions (cpu.decode.amx.emulated, which
 * test_decode checks on any AVX-512 + AVX512-BF16 CPU), on sa_test_decode.h's td_cases; 1 vs 2 threads bitwise;
 * and with --bench, gpt-oss decode (B1 and B8, S 32768, N/K 64/8, H 64, bf16, learnable sinks) under
 * cpu.decode.amx beside cpu.decode.avx512bf16, in GB/s of K and V read, next to the read bandwidth measured
 * in the same rounds (bench/cpu_bench_lib.c's sab_read_bw, linked into amx_check).
 */
#ifndef AMX_CHECK_DECODE_H
#define AMX_CHECK_DECODE_H

#include "sa_test_decode.h"

double sab_read_bw(int threads, double bytes, int reps, double *per_cpu); /* bench/cpu_bench_lib.c */

/* out and lse of one decode of a under plan (forced); 0 on failure or when another plan ran. */
static int acd_run(sa_attn *a, const char *plan, void *out, float *lse) {
  a->out = out;
  a->lse = lse;
  sa_plan_force(SA_PLAN_DECODE, plan);
  size_t ws = sa_attn_decode_workspace_size(a, SA_BACKEND_CPU);
  void *w = ws ? malloc(ws) : NULL;
  sa_status s = sa_attn_decode_fwd(a, w, ws, SA_BACKEND_CPU, NULL);
  free(w);
  const size_t n = strlen(plan);
  const int ok =
      s == SA_OK && !strncmp(sa_plan_last(SA_PLAN_DECODE), plan, n) && sa_plan_last(SA_PLAN_DECODE)[n] == ' ';
  if (!ok) printf("  %s: %s (%s)\n", plan, sa_status_name(s), sa_last_error());
  sa_plan_force(SA_PLAN_DECODE, NULL);
  return ok;
}

/* Every td_case: real against the reference and against the emulation; the first also on 1 and 2 threads. */
static void acd_check(double *worst_ref, double *worst_emu, int64_t *differing, int64_t *total) {
  for (int i = 0; i < TD_NCASES; i++) {
    const dcase *c = &td_cases[i];
    float sinks[64];
    int32_t kvl[16], ql[16];
    sa_attn a;
    make_attn(c, &a, sinks, kvl, ql);
    const int64_t no = c->B * c->Tq * c->N * c->Hv, nl = c->B * c->N * c->Tq;
    const size_t ob = (size_t)(no > 0 ? no : 1) * sa_dtype_size(c->dtype), lb = (size_t)(nl + 1) * 4;
    void *o_ref = malloc(ob), *o_amx = malloc(ob), *o_emu = malloc(ob);
    float *l_ref = malloc(lb), *l_amx = malloc(lb), *l_emu = malloc(lb);
    char tag[200];
    snprintf(tag, sizeof tag, "decode case %d [%s]", i, c->name);
    a.out = o_ref;
    a.lse = l_ref;
    int ok = sa_attn_fwd(&a, SA_BACKEND_REF, NULL) == SA_OK;
    ok = ok && acd_run(&a, "cpu.decode.amx", o_amx, l_amx);
    double w = 0.0;
    if (ok && !close_enough(&a, o_amx, l_amx, o_ref, l_ref, &w)) {
      t_report("%s: AMX decode against the reference: largest error / tolerance %.3g", tag, w);
      ok = 0;
    }
    *worst_ref = fmax(*worst_ref, w);
    ok = ok && acd_run(&a, "cpu.decode.amx.emulated", o_emu, l_emu);
    if (ok) {
      const double e = fmax(ac_diff(o_amx, o_emu, o_ref, c->dtype, no, differing),
                            ac_diff(l_amx, l_emu, l_ref, SA_F32, nl, differing));
      *total += no + nl;
      *worst_emu = fmax(*worst_emu, e);
      if (!(e <= AC_TOL_EMU)) t_report("%s: real and emulated tiles differ by %.3g > %.3g", tag, e, AC_TOL_EMU);
      ok = e <= AC_TOL_EMU;
    }
    if (ok && i == 0) { /* the item's result does not depend on the thread that runs it */
      const int saved = sa_cpu_get_num_threads();
      sa_cpu_set_num_threads(1);
      ok = acd_run(&a, "cpu.decode.amx", o_emu, l_emu);
      sa_cpu_set_num_threads(2);
      ok = ok && acd_run(&a, "cpu.decode.amx", o_amx, l_amx) && !memcmp(o_amx, o_emu, ob) &&
           !memcmp(l_amx, l_emu, (size_t)nl * 4);
      sa_cpu_set_num_threads(saved);
      if (!ok) t_report("%s: AMX decode on 1 and 2 threads not bitwise equal", tag);
    }
    t_count(ok);
    free(o_ref);
    free(o_amx);
    free(o_emu);
    free(l_ref);
    free(l_amx);
    free(l_emu);
    free_attn(&a);
  }
}

/* Seconds of the median of 3 decodes under plan (after one untimed), -1 on failure. */
static double acd_time(sa_attn *a, const char *plan, void *ws, size_t wss) {
  sa_plan_force(SA_PLAN_DECODE, plan);
  double t[3];
  sa_status s = sa_attn_decode_fwd(a, ws, wss, SA_BACKEND_CPU, NULL);
  for (int k = 0; k < 3 && s == SA_OK; k++) {
    const double t0 = ac_now();
    s = sa_attn_decode_fwd(a, ws, wss, SA_BACKEND_CPU, NULL);
    t[k] = ac_now() - t0;
  }
  sa_plan_force(SA_PLAN_DECODE, NULL);
  if (s != SA_OK) {
    printf("bench: decode %s: %s (%s)\n", plan, sa_status_name(s), sa_last_error());
    return -1.0;
  }
  qsort(t, 3, sizeof t[0], ac_cmp);
  return t[1];
}

/* gpt-oss decode, B1 and B8 at S 32768: the tile plan, the AVX-512 plan and a read of the same size (at least
   256 MiB, so that it streams from DRAM as the cache does), 5 interleaved rounds, the order rotating. */
static void acd_bench(void) {
  const char *plans[2] = {"cpu.decode.amx", "cpu.decode.avx512bf16"};
  const int threads = sa_cpu_get_num_threads();
  for (int64_t B = 1; B <= 8; B += 7) {
    const dcase c = {.dtype = SA_BF16,
                     .B = B,
                     .Tq = 1,
                     .S = 32768,
                     .N = 64,
                     .K = 8,
                     .H = 64,
                     .Hv = 64,
                     .softmax = SA_SOFTMAX_LEARNABLE,
                     D_ALL,
                     .causal = D_BR};
    float sinks[64];
    int32_t kvl[16], ql[16];
    sa_attn a;
    make_attn(&c, &a, sinks, kvl, ql);
    void *out = malloc((size_t)(c.B * c.N * c.Hv) * 2);
    float *lse = malloc((size_t)(c.B * c.N) * 4);
    a.out = out;
    a.lse = lse;
    const double bytes = (double)c.B * c.S * c.K * (c.H + c.Hv) * 2.0, rbytes = fmax(bytes, 256.0 * 1048576.0);
    size_t wss = 0;
    for (int k = 0; k < 2; k++) {
      sa_plan_force(SA_PLAN_DECODE, plans[k]);
      size_t w = sa_attn_decode_workspace_size(&a, SA_BACKEND_CPU);
      wss = w > wss ? w : wss;
    }
    sa_plan_force(SA_PLAN_DECODE, NULL);
    void *ws = malloc(wss ? wss : 1);
    double gbs[3][5], ratio[2][5];
    for (int r = 0; r < 5; r++)
      for (int i = 0; i < 3; i++) {
        const int k = (i + r) % 3;
        if (k == 2) gbs[2][r] = sab_read_bw(threads, rbytes, 3, NULL);
        else {
          const double t = acd_time(&a, plans[k], ws, wss);
          gbs[k][r] = t > 0 ? bytes / t / 1e9 : 0.0;
        }
      }
    for (int r = 0; r < 5; r++)
      for (int k = 0; k < 2; k++) ratio[k][r] = gbs[2][r] > 0 ? gbs[k][r] / gbs[2][r] : 0.0;
    for (int k = 0; k < 3; k++) qsort(gbs[k], 5, sizeof(double), ac_cmp);
    printf(
        "bench: decode B%lld S32768 N64/8 H64 bf16 learnable, %d threads, median of 5 interleaved rounds: read "
        "%.1f GB/s (%.1f..%.1f)\n",
        (long long)B, threads, gbs[2][2], gbs[2][0], gbs[2][4]);
    for (int k = 0; k < 2; k++) {
      qsort(ratio[k], 5, sizeof(double), ac_cmp);
      printf("bench: decode B%lld %-22s %6.1f GB/s of K+V (%.1f..%.1f), %.2f of the read bandwidth of its round\n",
             (long long)B, plans[k], gbs[k][2], gbs[k][0], gbs[k][4], ratio[k][2]);
    }
    free(ws);
    free(out);
    free(lse);
    free_attn(&a);
  }
}

#endif /* AMX_CHECK_DECODE_H */
