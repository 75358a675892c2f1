/*
 * cpu_kernel_amxemu.c — cpu_kernel_amx.c's code with the tile instructions emulated in C (cpu_tile_isa.h,
 * SA_TILE_EMULATED): the test vehicle of the tile layer on CPUs without AMX (plans cpu.fwd.amx.emulated /
 * cpu.bwd.amx.emulated, override-only; about 8k scalar multiply-adds per emulated TDPBF16PS, so for tests
 * only).
 */
#include "cpu_vec_avx512.h"

#define SA_TILE          1
#define SA_TILE_EMULATED 1
#define SA_K_TABLE       sa_cpu_kernels_amxemu
#define SA_K_NAME        "amxemu"

#include "cpu_kernel_body.h"
