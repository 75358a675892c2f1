/*
 * test_cpu_tanh.c — the fp32 tanh of the CPU kernels' logits soft-cap (cpu_tanh.h) against the fp64 tanh:
 * the AVX-512 layer's (cpu_tanh_avx512.h, also the tile kernels') and the AVX2 layer's (cpu_math_avx2.h), on
 * every 64th fp32 bit pattern in [0, 10] (3.4e7 inputs, both signs) and the special values: NaN stays NaN,
 * +-inf gives +-1, +-0 stays +-0, and the error stays within the 2 ulp that cpu_tanh.h states. Each level
 * is skipped where the CPU lacks it. Last line: "N passed, N failed".
 */
#include <immintrin.h> /* before the target pragmas: each intrinsic then keeps its own minimal target */
#include <stdint.h>

#include "cpu/cpu_plan.h"
#include "sa_test.h"

#define TT_ULPS 2.0

/* Error of got against tanh(x) in units of the fp32 ulp at |tanh(x)| (the spacing of fp32 numbers there;
   below 2^-126 the denormal spacing). */
static double tt_ulps(float x, float got) {
  const double want = tanh((double)x), aw = fabs(want);
  int e;
  frexp(aw, &e);
  const double ulp = aw < 0x1p-126 ? 0x1p-149 : ldexp(1.0, e - 24);
  return fabs((double)got - want) / ulp;
}

typedef void (*tt_fn)(const float *x, float *y); /* 16 lanes */

/* The largest error over the scan and the special values; *bad counts the special values that are wrong. */
static double tt_scan(tt_fn fn, int64_t *bad) {
  double worst = 0.0;
  float x[16], y[16];
  int n = 0;
  for (uint32_t u = 0; u <= 0x41200000u; u += 64) { /* [0, 10] */
    float f;
    memcpy(&f, &u, 4);
    x[n++] = f;
    x[n++] = -f;
    if (n == 16) {
      fn(x, y);
      for (int i = 0; i < 16; i++) worst = fmax(worst, tt_ulps(x[i], y[i]));
      n = 0;
    }
  }
  const float sp[16] = {0.0f,      -0.0f,   INFINITY, -INFINITY, NAN,   -NAN,   1e-45f,  -1e-45f,
                        0x1p-126f, 3.4e38f, -3.4e38f, 9.1f,      -9.1f, 0.625f, -0.625f, 88.0f};
  fn(sp, y);
  for (int i = 0; i < 16; i++) {
    int ok = isnan(sp[i]) ? isnan(y[i]) : tt_ulps(sp[i], y[i]) <= TT_ULPS;
    if (sp[i] == 0.0f) ok &= signbit(y[i]) == signbit(sp[i]) && y[i] == 0.0f;
    if (isinf(sp[i])) ok &= y[i] == (sp[i] > 0 ? 1.0f : -1.0f);
    if (!ok) t_report("tanh(%g) = %.9g, fp64 %.9g", (double)sp[i], (double)y[i], tanh((double)sp[i]));
    *bad += !ok;
  }
  return worst;
}

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
#endif
#include "cpu/cpu_tanh_avx512.h"
static void tt_avx512(const float *x, float *y) { _mm512_storeu_ps(y, sa_tanh_avx512(_mm512_loadu_ps(x))); }
#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#include "cpu/cpu_math_avx2.h"
static void tt_avx2(const float *x, float *y) {
  _mm256_storeu_ps(y, sa_tanh_avx2(_mm256_loadu_ps(x)));
  _mm256_storeu_ps(y + 8, sa_tanh_avx2(_mm256_loadu_ps(x + 8)));
}
#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

int main(void) {
  const sa_cpu_record *r = sa_cpu_record_get();
  const struct {
    const char *name;
    tt_fn fn;
    int have;
  } lv[2] = {{"avx512", tt_avx512, r->f.avx512}, {"avx2", tt_avx2, r->f.avx2}};
  for (int l = 0; l < 2; l++) {
    if (!lv[l].have) {
      printf("%s: skipped (this CPU lacks it)\n", lv[l].name);
      continue;
    }
    int64_t bad = 0;
    const double worst = tt_scan(lv[l].fn, &bad);
    const int ok = bad == 0 && worst <= TT_ULPS;
    if (!ok)
      t_report("%s tanh: largest error %.2f ulp (bound %.0f), %lld special values wrong", lv[l].name, worst, TT_ULPS,
               (long long)bad);
    t_count(ok);
    printf("%s tanh against fp64: largest error %.2f ulp over every 64th fp32 in [-10, 10] and the special values\n",
           lv[l].name, worst);
  }
  printf("%d passed, %d failed\n", t_passed, t_failed);
  return t_failed ? 1 : 0;
}
