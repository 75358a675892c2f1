/*
 * amx_check.c — the AMX tile kernels on the real instructions (plans cpu.fwd.amx / cpu.bwd.amx), for an AMX
 * CPU: the table of sa_test_tile.h against the fp64 reference with the bf16 tolerances, and against the
 * same tile code over the emulated instructions (cpu.fwd.amx.emulated / cpu.bwd.amx.emulated), which
 * test_cpu_tile checks on any AVX-512 + AVX512-BF16 CPU. The emulation follows the Intel SDM's order of the fp32 additions
 * in TDPBF16PS; a CPU that rounds inside an instruction differently moves a result by an ulp or so, so the
 * real and emulated outputs must agree to 1e-2 of the largest reference value (half the reference
 * tolerance), and how many elements differ in their bits is printed.
 * Exit 77 (skipped, with the reason) where CPUID reports no AMX-TILE + AMX-BF16, the OS did not grant the
 * tile state, or the library was built without the AMX kernels.
 * Last line: "N passed, N failed".
 * The decode plans likewise (amx_check_decode.h): cpu.decode.amx against the reference and against
 * cpu.decode.amx.emulated on sa_test_decode.h's tile decode cases.
 * amx_check --bench: after the checks, the forward and forward+backward of B1 T = S = 2048 N8 H128 bf16 (learnable
 * sinks) under cpu.fwd.amx / cpu.bwd.amx and the AVX-512 plans, interleaved, median of 5 rounds, in GFLOP/s; then
 * gpt-oss decode at S 32768, B1 and B8, under cpu.decode.amx and cpu.decode.avx512bf16 in GB/s beside the read
 * bandwidth of the same rounds: figures printed for the lab log, never a pass / fail criterion.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <string.h>
#include <time.h>
#include "cpu/cpu_plan.h"
#include "sa_test_tile.h"

#define AC_TOL_EMU 1e-2

/* Elements of x and y that differ in their bits, and max |x - y| / max |ref|. */
static double ac_diff(const void *x, const void *y, const void *ref, sa_dtype t, int64_t n, int64_t *nbits) {
  size_t es = sa_dtype_size(t);
  double e = 0.0, m = 1e-30;
  for (int64_t i = 0; i < n; i++) {
    if (memcmp((const char *)x + i * es, (const char *)y + i * es, es) != 0) (*nbits)++;
    double a = sa_load(x, t, i), b = sa_load(y, t, i), r = sa_load(ref, t, i);
    if (isnan(a) != isnan(b)) return INFINITY;
    if (!isnan(a) && a != b) e = fmax(e, fabs(a - b));
    if (isfinite(r)) m = fmax(m, fabs(r));
  }
  return e / m;
}

/* The skip reason, or NULL when the real tile plans can run a bf16 call here. */
static const char *ac_skip_reason(void) {
  const sa_cpu_record *r = sa_cpu_record_get();
  if (!r->f.amx_bf16) return "this CPU has no AMX-TILE + AMX-BF16 (CPUID leaf 7 EDX bits 24 and 22)";
  if (!r->f.amx_os) return "the OS did not grant the tile state (XCR0 bits 17-18, arch_prctl ARCH_REQ_XCOMP_PERM)";
  sa_attn a;
  sa_attn_init(&a);
  a.dtype = SA_BF16;
  a.batch = a.q_len = a.kv_len = a.q_heads = a.kv_heads = 1;
  a.head_dim = a.v_head_dim = 64;
  sa_cpu_plan p;
  if (sa_cpu_plan_make(&a, SA_PLAN_FWD, r, "cpu.fwd.amx", &p) != SA_OK) return sa_last_error();
  return NULL;
}

static double ac_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int ac_cmp(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

/* Seconds of one forward (bwd = 0) or forward + backward under the two plans. */
static double ac_time(t_prob *p, const t_case *c, const char *fwd, const char *bwd) {
  sa_plan_force(SA_PLAN_FWD, fwd);
  sa_plan_force(SA_PLAN_BWD, bwd);
  double t0 = ac_now();
  sa_status s = t_fwd(p, SA_BACKEND_CPU, p->out_c, p->lse_c);
  if (s == SA_OK && bwd) s = t_bwd(p, c, SA_BACKEND_CPU, p->dq_c, p->dk_c, p->dv_c, p->ds_c, p->db_c);
  double t = ac_now() - t0;
  if (s != SA_OK) printf("bench: %s / %s: %s (%s)\n", fwd, bwd ? bwd : "-", sa_status_name(s), sa_last_error());
  sa_plan_force(SA_PLAN_FWD, NULL);
  sa_plan_force(SA_PLAN_BWD, NULL);
  return s == SA_OK ? t : -1.0;
}

static void ac_bench(void) {
  const t_case c = {"bench", TT_BF, 1, 2048, 2048, 8, 8, 128, 128, TT_LEARN, T_UNBOUNDED};
  t_rng r = {0xbe4c0000ull};
  t_prob p;
  t_prob_make(&p, &c, &r, 0);
  /* the backward reads the reference buffers' out and lse: fill them with a real forward */
  sa_plan_force(SA_PLAN_FWD, "cpu.fwd.avx512");
  t_fwd(&p, SA_BACKEND_CPU, p.out_r, p.lse_r);
  sa_plan_force(SA_PLAN_FWD, NULL);
  const double flops_fwd = 4.0 * c.B * c.N * (double)c.T * c.S * c.H, flops_fb = 3.5 * flops_fwd;
  const char *names[4][2] = {{"cpu.fwd.amx", NULL},
                             {"cpu.fwd.avx512", NULL},
                             {"cpu.fwd.amx", "cpu.bwd.amx"},
                             {"cpu.fwd.avx512", "cpu.bwd.avx512"}};
  double t[4][5];
  for (int k = 0; k < 4; k++) ac_time(&p, &c, names[k][0], names[k][1]); /* warm-up */
  for (int round = 0; round < 5; round++)
    for (int k = 0; k < 4; k++) t[k][round] = ac_time(&p, &c, names[k][0], names[k][1]);
  printf("bench: B1 T=S=2048 N8 H128 bf16 learnable, %d threads, median of 5 interleaved rounds\n",
         sa_cpu_get_num_threads());
  for (int k = 0; k < 4; k++) {
    qsort(t[k], 5, sizeof(double), ac_cmp);
    const double fl = names[k][1] ? flops_fb : flops_fwd;
    printf("bench: %-8s %-15s %8.1f ms  %7.0f GFLOP/s  (rounds %.1f..%.1f ms)\n", names[k][1] ? "fwd+bwd" : "fwd",
           names[k][0] + 8, 1e3 * t[k][2], fl / t[k][2] * 1e-9, 1e3 * t[k][0], 1e3 * t[k][4]);
  }
  t_prob_free(&p);
}

#include "amx_check_decode.h"

int main(int argc, char **argv) {
  const char *skip = ac_skip_reason();
  if (skip) {
    printf(
        "SKIP: %s: the real AMX tile kernels cannot run here (test_cpu_tile checks their code over emulated "
        "instructions)\n",
        skip);
    return 77;
  }
  double worst[7] = {0}, worst_emu = 0.0;
  int64_t differing = 0, total = 0;
  for (int i = 0; i < TT_NCASES; i++) {
    const t_case *c = &tt_cases[i];
    char tag[160];
    snprintf(tag, sizeof tag, "amx case %d [%s]", i, c->name);
    t_prob p;
    if (!tt_prepare(&p, c, i)) {
      t_report("%s: reference failed: %s", tag, sa_last_error());
      t_count(0);
      t_prob_free(&p);
      continue;
    }
    if (!tt_run(&p, c, "cpu.fwd.amx", "cpu.bwd.amx", tag)) {
      t_count(0);
      t_prob_free(&p);
      continue;
    }
    tt_check(&p, c, tag, worst);
    /* keep the real outputs, then run the emulated plans into the same buffers */
    const size_t es = sa_dtype_size(c->dt);
    const int64_t n[5] = {p.no, p.nq, p.nk, p.nv, p.nl};
    void *real[5], *cur[5] = {p.out_c, p.dq_c, p.dk_c, p.dv_c, p.lse_c},
                   *ref[5] = {p.out_r, p.dq_r, p.dk_r, p.dv_r, p.lse_r};
    for (int k = 0; k < 5; k++) {
      size_t bytes = (size_t)n[k] * (k == 4 ? 4 : es);
      real[k] = memcpy(malloc(bytes ? bytes : 1), cur[k], bytes);
    }
    int ok = tt_run(&p, c, "cpu.fwd.amx.emulated", "cpu.bwd.amx.emulated", tag);
    double e = 0.0;
    for (int k = 0; ok && k < 5; k++) {
      e = fmax(e, ac_diff(real[k], cur[k], ref[k], k == 4 ? SA_F32 : c->dt, n[k], &differing));
      total += n[k];
    }
    worst_emu = fmax(worst_emu, e);
    if (ok && !(e <= AC_TOL_EMU)) t_report("%s: real and emulated tiles differ by %.3g > %.3g", tag, e, AC_TOL_EMU);
    t_count(ok && e <= AC_TOL_EMU);
    for (int k = 0; k < 5; k++) free(real[k]);
    t_prob_free(&p);
  }
  printf("%d cases, AMX tiles against the fp64 reference; largest error / tolerance:", TT_NCASES);
  for (int k = 0; k < 7; k++) printf(" %s %.3f", tt_err_names[k], worst[k]);
  printf(
      "\nAMX against emulated tiles: largest difference %.3g of max |ref| (bound %.3g), %lld of %lld elements "
      "differ in their bits\n",
      worst_emu, AC_TOL_EMU, (long long)differing, (long long)total);
  double worst_dec = 0.0, worst_dec_emu = 0.0;
  int64_t differing_dec = 0, total_dec = 0;
  acd_check(&worst_dec, &worst_dec_emu, &differing_dec, &total_dec);
  printf(
      "%d decode cases, cpu.decode.amx against the fp64 reference: largest error / tolerance %.3f; against the "
      "emulated tiles: largest difference %.3g of max |ref| (bound %.3g), %lld of %lld elements differ in their "
      "bits\n",
      TD_NCASES, worst_dec, worst_dec_emu, AC_TOL_EMU, (long long)differing_dec, (long long)total_dec);
  if (argc > 1 && !strcmp(argv[1], "--bench") && !t_failed) {
    ac_bench();
    acd_bench();
  }
  printf("%d passed, %d failed\n", t_passed, t_failed);
  return t_failed ? 1 : 0;
}
