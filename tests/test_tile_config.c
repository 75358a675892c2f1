/*
 * test_tile_config.c — every tile configuration routine, read back: the tile kernels' per-worker begin
 * (palette 1, eight tiles of 16 rows x 64 bytes) and the tile decode item's per-shape configuration, each
 * run as the library runs it, then STTILECFG, compared byte for byte with the intended 64-byte block stated
 * here from the Intel SDM's layout (palette, start row, 14 reserved bytes, colsb[16], rows[16]).
 * A compiler that deletes the stores filling the block (GCC 12's _tile_loadconfig declares an 8-byte
 * operand) leaves every tile unconfigured and the first tile instruction faults; this test names the
 * routine and the bytes instead. The real instructions run where CPUID reports AMX-TILE + AMX-BF16, the OS
 * granted the tile state and the library has the AMX kernels; the emulated ones (the same routines over
 * cpu_tile_isa.h's emulation) where the CPU has AVX-512 + AVX512-BF16. Exit 77 (skipped, with the reason)
 * where neither runs. Last line: "N passed, N failed".
 */
#include <stdio.h>
#include <string.h>

#include "cpu/cpu_decode.h"
#include "cpu/cpu_internal.h"
#include "cpu/cpu_plan.h"

static int passed, failed;

/* The intended block: palette 1, tiles 0-7 with the given bytes per row and rows, everything else zero. */
static void want_block(uint8_t w[64], const int colsb[8], const int rows[8]) {
  memset(w, 0, 64);
  w[0] = 1;
  for (int t = 0; t < 8; t++) {
    w[16 + 2 * t] = (uint8_t)(colsb[t] & 0xff);
    w[17 + 2 * t] = (uint8_t)(colsb[t] >> 8);
    w[48 + t] = (uint8_t)rows[t];
  }
}

static void compare(const char *what, const uint8_t got[64], const uint8_t want[64]) {
  if (!memcmp(got, want, 64)) {
    passed++;
    return;
  }
  failed++;
  printf("FAIL %s: the configuration read back differs from the intended one\n  byte:", what);
  for (int i = 0; i < 64; i++)
    if (got[i] != want[i]) printf(" [%d] %u (want %u)", i, got[i], want[i]);
  printf("\n");
}

static sa_attn problem(int64_t T, int64_t N, int64_t K, int64_t H) {
  sa_attn a;
  sa_attn_init(&a);
  a.dtype = SA_BF16;
  a.batch = 1;
  a.q_len = T;
  a.kv_len = 4096;
  a.q_heads = N;
  a.kv_heads = K;
  a.head_dim = a.v_head_dim = H;
  a.causal = SA_CAUSAL_BOTTOM_RIGHT;
  return a;
}

/* The kernels' begin under plan `fwd` (cpu.fwd.amx or its emulation), read back, then their end: after
   TILERELEASE the configuration is all zero. */
static void check_kernels(const char *fwd) {
  const sa_cpu_record *r = sa_cpu_record_get();
  sa_attn a = problem(256, 8, 8, 128);
  sa_cpu_plan p;
  if (sa_cpu_plan_make(&a, SA_PLAN_FWD, r, fwd, &p) != SA_OK) {
    failed++;
    printf("FAIL %s: no plan: %s\n", fwd, sa_last_error());
    return;
  }
  const sa_cpu_kernels *k = sa_cpu_kernels_of(&p);
  if (!k->begin || !k->end || !k->config_read) {
    failed++;
    printf("FAIL %s: kernel table %s has no tile configuration routines\n", fwd, k->name);
    return;
  }
  uint8_t got[64] __attribute__((aligned(64))), want[64];
  const int colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64}, rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
  char what[96];
  k->begin();
  k->config_read(got);
  want_block(want, colsb, rows);
  snprintf(what, sizeof what, "%s begin", fwd);
  compare(what, got, want);
  k->end();
  k->config_read(got);
  memset(want, 0, 64);
  snprintf(what, sizeof what, "%s end", fwd);
  compare(what, got, want);
}

/* The decode item's configuration for 1..16 query tokens over gpt-oss heads and a few other groupings: S^T
   and its K rows, Q^T, P, V pairs and o (cpu_decode_tile.h), tw = a head's lanes per tile. */
static void check_decode(const char *plan) {
  static const int64_t shapes[][4] = {{1, 64, 8, 64},  {2, 64, 8, 64},  {4, 64, 8, 64}, {8, 64, 8, 64},
                                      {16, 64, 8, 64}, {1, 8, 8, 128},  {1, 16, 1, 64}, {3, 32, 4, 96},
                                      {1, 4, 4, 32},   {5, 24, 3, 256}, {16, 8, 1, 64}};
  const sa_cpu_record *r = sa_cpu_record_get();
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    sa_attn a = problem(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3]);
    char what[128];
    snprintf(what, sizeof what, "%s T%lld N%lld K%lld H%lld", plan, (long long)a.q_len, (long long)a.q_heads,
             (long long)a.kv_heads, (long long)a.head_dim);
    sa_cpu_plan p;
    if (sa_cpu_plan_make(&a, SA_PLAN_DECODE, r, plan, &p) != SA_OK) {
      failed++;
      printf("FAIL %s: no plan: %s\n", what, sa_last_error());
      continue;
    }
    uint8_t got[64] __attribute__((aligned(64))), want[64];
    const int64_t tw = sa_cpu_decode_tile_config(&a, &p, got);
    if (tw != 1 && tw != 2 && tw != 4 && tw != 8 && tw != 16) {
      failed++;
      printf("FAIL %s: tile width %lld (want 1, 2, 4, 8 or 16)\n", what, (long long)tw);
      continue;
    }
    const int w = (int)(4 * tw), h = (int)tw;
    const int colsb[8] = {w, w, 64, 64, w, 64, 64, 64}, rows[8] = {16, 16, 16, 16, 16, h, 16, h};
    want_block(want, colsb, rows);
    compare(what, got, want);
  }
}

int main(void) {
  const sa_cpu_record *r = sa_cpu_record_get();
  sa_attn a = problem(256, 8, 8, 128);
  sa_cpu_plan p;
  const int real = sa_cpu_plan_make(&a, SA_PLAN_FWD, r, "cpu.fwd.amx", &p) == SA_OK;
  char why_real[256];
  snprintf(why_real, sizeof why_real, "%s", real ? "" : sa_last_error());
  const int emu = sa_cpu_plan_make(&a, SA_PLAN_FWD, r, "cpu.fwd.amx.emulated", &p) == SA_OK;
  if (!real && !emu) {
    printf("skipped: neither the AMX instructions (%s) nor their emulation (%s) run here\n", why_real, sa_last_error());
    return 77;
  }
  if (real) {
    check_kernels("cpu.fwd.amx");
    check_decode("cpu.decode.amx");
  } else {
    printf("the real instructions are not checked here: %s\n", why_real);
  }
  if (emu) {
    check_kernels("cpu.fwd.amx.emulated");
    check_decode("cpu.decode.amx.emulated");
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
