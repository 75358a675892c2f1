/*
 * cpu_kernel_scalar.c — the vector layer with a width of one float (portable C), then the shared body.
 * Used where no AVX2 exists, or when SINKATTN_SIMD=scalar asks for it (tests compare the levels).
 */
#include <math.h>

#include "cpu_internal.h"

#define VW 1
typedef float vf;
#define V_ZERO()      0.0f
#define V_SET1(x)     (x)
#define V_LOAD(p)     (*(p))
#define V_STORE(p, x) (*(p) = (x))
/* a * b + c, not fmaf: without -mfma fmaf is a libm call (0.6 GFLOP/s) */
#define V_FMA(a, b, c) ((a) * (b) + (c))
#define V_ADD(a, b)    ((a) + (b))
#define V_SUB(a, b)    ((a) - (b))
#define V_MUL(a, b)    ((a) * (b))
/* Keeps a NaN b, like the x86 max with the value second. */
#define V_MAX(a, b)                ((a) > (b) ? (a) : (b))
#define V_RADD(x)                  (x)
#define V_LOAD_F16(p)              sa_f16_to_f32(*(const uint16_t *)(p))
#define V_LOAD_BF16(p)             sa_bf16_to_f32(*(const uint16_t *)(p))
#define V_EXP2(x)                  exp2f(x)
#define V_TANH(x)                  tanhf(x)
#define V_KEEP(x, k)               ((k) == -INFINITY ? -INFINITY : (x))
#define V_MUL_NZ(p, x)             ((p) != 0.0f ? (p) * (x) : 0.0f)
#define V_MASK_RANGE(x, j, lo, hi) ((lo) <= (j) && (j) < (hi) ? (x) : -INFINITY)
#define MK_R                       4
#define MK_C                       4

#define SA_K(name) sa_cpu_##name##_scalar
#define SA_K_TABLE sa_cpu_kernels_scalar
#define SA_K_NAME  "scalar"

#include "cpu_kernel_body.h"
