/*
 * cpu_kernel_amx.c — the tile kernels: the AVX-512 vector layer (cpu_vec_avx512.h) with the products on AMX
 * tiles (cpu_tile.h over the real instructions of cpu_tile_isa.h), then the shared kernel body. Compiled
 * with -mamx-tile -mamx-bf16 where the compiler takes them (CMakeLists.txt); plans cpu.fwd.amx /
 * cpu.bwd.amx run it only on a CPU whose CPUID reports AMX-TILE + AMX-BF16 and whose OS granted the tile
 * state (cpu_plan.c).
 */
#include "cpu_vec_avx512.h"

#define SA_TILE    1
#define SA_K_TABLE sa_cpu_kernels_amx
#define SA_K_NAME  "amx"

#include "cpu_kernel_body.h"
