/*
 * cpu_decode_amx.c — the tile decode work item (cpu_decode_tile.h) over the AMX instructions: plan
 * cpu.decode.amx, which cpu_plan.c allows only where CPUID reports AMX-TILE + AMX-BF16 and AVX512-BF16 and
 * the OS granted the tile state. Compiled with -mavx512bf16 -mamx-tile -mamx-bf16 where the compiler takes
 * them (CMakeLists.txt; SA_CPU_HAVE_AMX).
 */
#define SA_DEC_TILE_FN      sa_cpu_decode_amx
#define SA_DEC_TILE_SCRATCH sa_cpu_decode_amx_scratch
#define SA_DEC_TILE_CONFIG  sa_cpu_decode_amx_config

#include "cpu_decode_tile.h"
