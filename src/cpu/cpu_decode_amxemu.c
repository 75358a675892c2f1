/*
 * cpu_decode_amxemu.c — cpu_decode_amx.c's code over the emulated tile instructions (cpu_tile_isa.h,
 * SA_TILE_EMULATED): plan cpu.decode.amx.emulated, override-only, the test vehicle of the tile decode on any
 * AVX-512 + AVX512-BF16 CPU (about 8k scalar multiply-adds per emulated TDPBF16PS: for tests only).
 */
#define SA_TILE_EMULATED    1
#define SA_DEC_TILE_FN      sa_cpu_decode_amxemu
#define SA_DEC_TILE_SCRATCH sa_cpu_decode_amxemu_scratch
#define SA_DEC_TILE_CONFIG  sa_cpu_decode_amxemu_config

#include "cpu_decode_tile.h"
