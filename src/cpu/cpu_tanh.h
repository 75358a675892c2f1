/*
 * cpu_tanh.h — the constants of the CPU kernels' fp32 tanh (the logits soft-cap, cap * tanh(l / cap)), one
 * definition for every vector layer (cpu_tanh_avx512.h, cpu_math_avx2.h; the scalar layer calls tanhf):
 *   |x| <  SA_TANH_SPLIT  tanh(x) = x + x^3 P(x^2), P of degree 4 fitted to tanh on [0, 0.625] for relative
 *                         error (the fit's own error 1e-8, under the fp32 rounding of 6e-8);
 *   |x| >= SA_TANH_SPLIT  tanh(x) = sign(x) (1 - 2 / (e^(2|x|) + 1)), |x| clamped to SA_TANH_CLAMP (tanh(9.1)
 *                         rounds to 1 in fp32), e^(2|x|) as the layer's exp2 of 2 log2(e) |x|: 1 - 2 / (e + 1)
 *                         loses under one bit to cancellation where tanh >= tanh(0.625) = 0.555.
 * Measured against the fp64 tanh on every 16th fp32 in [-10, 10]: at most 1.85 ulp on AVX-512 and AVX2 (relative
 * 2.2e-7); tests/test_cpu_tanh.c holds every 64th and the special values to 2 ulp: NaN stays NaN, +-inf gives
 * +-1, -0 stays -0. Under a soft-cap the logit cap * tanh(l / cap) then carries about 2 ulp of cap, the size of
 * the fp32 rounding of the logit itself.
 */
#ifndef SA_CPU_TANH_H
#define SA_CPU_TANH_H

#define SA_TANH_SPLIT  0.625f
#define SA_TANH_CLAMP  9.1f
#define SA_TANH_P0     -0.3333329446832176f
#define SA_TANH_P1     0.1333174851883367f
#define SA_TANH_P2     -0.05376369081167182f
#define SA_TANH_P3     0.020713991812592984f
#define SA_TANH_P4     -0.0057861474178266415f
#define SA_TANH_2LOG2E 2.88539008177792681472f /* 2 log2(e): e^(2x) = 2^(2 log2(e) x) */

#endif /* SA_CPU_TANH_H */
