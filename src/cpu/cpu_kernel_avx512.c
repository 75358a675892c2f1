/*
 * cpu_kernel_avx512.c — the vector layer for AVX-512 (16 floats, cpu_vec_avx512.h), then the shared kernel
 * body.
 */
#include "cpu_vec_avx512.h"

#define SA_K(name) sa_cpu_##name##_avx512
#define SA_K_TABLE sa_cpu_kernels_avx512
#define SA_K_NAME  "avx512"

#include "cpu_kernel_body.h"
