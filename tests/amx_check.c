/*
 * amx_check.c — the AMX tile kernels on the real instructions (plans cpu.fwd.amx / cpu.bwd.amx), for an AMX
 * CPU: the table of sa_test_tile.h against the fp64 reference with the bf16 tolerances, and against the
 * same tile code over the emulated instructions (cpu.fwd.amx.emulated / cpu.bwd.amx.emulated), which
 * test_cpu_tile checks on any AVX-512 CPU. The emulation follows the Intel SDM's order of the fp32 additions
 * in TDPBF16PS; a CPU that rounds inside an instruction differently moves a result by an ulp or so, so the
 * real and emulated outputs must agree to 1e-2 of the largest reference value (half the reference
 * tolerance), and how many elements differ in their bits is printed.
 * Exit 77 (skipped, with the reason) where CPUID reports no AMX-TILE + AMX-BF16, the OS did not grant the
 * tile state, or the library was built without the AMX kernels.
 * Last line: "N passed, N failed".
 */
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

int main(void) {
  const char *skip = ac_skip_reason();
  if (skip) {
    printf("SKIP: %s: the real AMX tile kernels cannot run here (test_cpu_tile checks their code over emulated "
           "instructions)\n", skip);
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
    void *real[5], *cur[5] = {p.out_c, p.dq_c, p.dk_c, p.dv_c, p.lse_c}, *ref[5] = {p.out_r, p.dq_r, p.dk_r, p.dv_r,
                                                                                     p.lse_r};
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
  printf("\nAMX against emulated tiles: largest difference %.3g of max |ref| (bound %.3g), %lld of %lld elements "
         "differ in their bits\n", worst_emu, AC_TOL_EMU, (long long)differing, (long long)total);
  printf("%d passed, %d failed\n", t_passed, t_failed);
  return t_failed ? 1 : 0;
}
