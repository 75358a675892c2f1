/*
 * sa_test.h — small helpers of the C test driver (header-only: each C file in tests/ is its own executable):
 * a deterministic PRNG, NaN-poisoned buffers in any dtype, tolerance comparison and pass/fail counting.
 */
#ifndef SA_TEST_H
#define SA_TEST_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sa_internal.h"

/* ---- counting -------------------------------------------------------------------------------- */

static int t_passed, t_failed;

/* One line per failure, naming the case: the log must be enough to reproduce it. */
static inline void t_report(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("FAIL ", stdout);
  vprintf(fmt, ap);
  fputc('\n', stdout);
  va_end(ap);
}

static inline void t_count(int ok) {
  if (ok) t_passed++;
  else t_failed++;
}

/* ---- PRNG: splitmix64, fast and the same sequence on every platform --------------------------- */

typedef struct {
  uint64_t s;
} t_rng;

static inline uint64_t t_next(t_rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline double t_unif(t_rng *r, double lo, double hi) {
  return lo + (hi - lo) * (double)(t_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

static inline int64_t t_int(t_rng *r, int64_t lo, int64_t hi) { /* inclusive */
  return lo + (int64_t)(t_next(r) % (uint64_t)(hi - lo + 1));
}

/* ---- buffers --------------------------------------------------------------------------------- */

static inline void *t_alloc(int64_t n, size_t elem) {
  void *p = malloc((size_t)(n + 1) * elem);
  if (!p) {
    fprintf(stderr, "test: out of memory (%lld elements)\n", (long long)n);
    exit(2);
  }
  return p;
}

/* NaN in every element, so an element a backend forgets to write fails the comparison. */
static inline void t_poison(void *p, sa_dtype t, int64_t n) {
  for (int64_t i = 0; i < n; i++) sa_store(p, t, i, NAN);
}

/* Uniform in [lo, hi), rounded to the dtype: both backends then read exactly the same values. */
static inline void t_fill(void *p, sa_dtype t, int64_t n, t_rng *r, double lo, double hi) {
  for (int64_t i = 0; i < n; i++) sa_store(p, t, i, (float)t_unif(r, lo, hi));
}

static inline const char *t_dtype_name(sa_dtype t) { return t == SA_F32 ? "f32" : t == SA_F16 ? "f16" : "bf16"; }

/* Unit roundoff u of the dtype a result is stored in (2^-24, 2^-11, 2^-8). Two correct backends that
   round different fp32/fp64 values of the same result can land one ulp = 2u|x| apart. */
static inline double t_unit_roundoff(sa_dtype t) { return t == SA_F32 ? 0x1p-24 : t == SA_F16 ? 0x1p-11 : 0x1p-8; }

/* Smallest spacing of the dtype near 0: f16 results below 2^-14 are subnormal, with absolute steps of
   2^-24, so a relative bound alone cannot hold there. */
static inline double t_abs_floor(sa_dtype t) { return t == SA_F16 ? 0x1p-24 : 0.0; }

/* How a tensor splits into heads for the comparison: element i belongs to head (i / inner) % heads
   (out [B,T,N,Hv]: inner Hv, heads N; lse [B,N,T]: inner T, heads N; dk [B,S,K,H]: inner H, heads K). */
typedef struct {
  int64_t inner, heads;
  const double *floor;
} t_layout;

#define T_MAX_HEADS 64

/* got vs ref (n elements, dtype t):  |got - ref| <= 2u|ref| + acc * scale_h + abs_floor, -inf == -inf.
   scale_h is the largest |ref| of the element's head, raised to floor[h] when given: fp32 errors of a
   sum scale with the magnitude of its terms, not of the one result (a gradient that cancels to exactly
   0 in fp64 comes out ~1e-8 in fp32), and heads are scaled apart because a +50 sink makes one head's
   values e^-50 times another's. Returns the number of bad elements and reports the first; *worst gets
   the largest error / bound seen. extra (NULL: none): a further bound per element (sa_test_bf16.h). */
static inline int64_t t_compare_x(const char *what, const char *tag, const void *got, const void *ref, sa_dtype t,
                                  int64_t n, t_layout lay, double acc, const double *extra, double *worst) {
  double amax[T_MAX_HEADS] = {0};
  for (int64_t i = 0; i < n; i++) {
    int64_t h = (i / lay.inner) % lay.heads;
    double r = fabs((double)sa_load(ref, t, i));
    if (isfinite(r) && r > amax[h]) amax[h] = r;
  }
  for (int64_t h = 0; h < lay.heads && lay.floor; h++) amax[h] = fmax(amax[h], lay.floor[h]);
  double u2 = 2.0 * t_unit_roundoff(t), floor_ = t_abs_floor(t) + 1e-37;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    double g = sa_load(got, t, i), r = sa_load(ref, t, i);
    if (g == r) continue; /* covers -inf == -inf */
    double bound = u2 * fabs(r) + acc * amax[(i / lay.inner) % lay.heads] + floor_ + (extra ? extra[i] : 0.0);
    double err = fabs(g - r);
    if (!(err <= bound)) {
      if (!bad)
        t_report("%s: %s[%lld] = %.9g, reference %.9g (|err| %.3g > bound %.3g)", tag, what, (long long)i, g, r, err,
                 bound);
      bad++;
    } else if (worst && err / bound > *worst) {
      *worst = err / bound;
    }
  }
  return bad;
}

static inline int64_t t_compare(const char *what, const char *tag, const void *got, const void *ref, sa_dtype t,
                                int64_t n, t_layout lay, double acc, double *worst) {
  return t_compare_x(what, tag, got, ref, t, n, lay, acc, NULL, worst);
}

/* ---- bias and mask shapes ------------------------------------------------------------------ */

/* A bias or mask shape as its size-1 axes (1 = broadcast) over [B,N,T,S]; 0 in a case = none. */
#define T_BCAST(b, n, t, s) (1 + ((b) << 3 | (n) << 2 | (t) << 1 | (s)))

/* The dims of a T_BCAST form over the full sizes [B,N,T,S]. */
static inline void t_bcast_dims(int form, const int64_t full[4], int64_t *d) {
  for (int x = 0; x < 4; x++) d[x] = (form - 1) >> (3 - x) & 1 ? 1 : full[x];
}

/* Any NaN in n elements? (NaN is never a valid result: not even for rows without keys.) */
static inline int64_t t_count_nan(const void *p, sa_dtype t, int64_t n) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; i++) c += isnan(sa_load(p, t, i)) ? 1 : 0;
  return c;
}

#endif /* SA_TEST_H */
