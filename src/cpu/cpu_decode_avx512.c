/* cpu_decode_avx512.c — the decode work item compiled with AVX-512 (CMake adds the flags by file name);
   cpu_decode.c calls it only when CPUID reports AVX-512 F/BW/VL/DQ, FMA and F16C. */
#define SA_DECODE_PARTIAL sa_cpu_decode_partial_avx512
#include "cpu_decode_kernel.h"
