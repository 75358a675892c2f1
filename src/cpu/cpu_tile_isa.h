/*
 * cpu_tile_isa.h — the seven AMX instructions the tile layer (cpu_tile.h) uses, in one of two forms chosen
 * when the including file is compiled:
 *   default             the instructions themselves (LDTILECFG, STTILECFG, TILELOADD, TILEZERO, TDPBF16PS, TILESTORED,
 *                       TILERELEASE), for a translation unit compiled with -mamx-tile -mamx-bf16;
 *   SA_TILE_EMULATED    plain C that does what the Intel SDM's pseudocode of each instruction does, on eight
 *                       per-thread tile registers of 16 rows x 64 bytes, so that the tile layer's packing,
 *                       VNNI layout and tile shapes run and are tested on CPUs without AMX;
 *   SA_TILE_PROXY       (with SA_TILE_EMULATED; CMake's SINKATTN_TILE_PROXY, bench/tile_proxy.sh) the emulation
 *                       keeps the data movement and drops the products: TDPBF16PS does nothing, TILELOADD and
 *                       TILESTORED move each 64-byte row with one vector load and store, and the tile state is
 *                       reached through an initial-exec thread-local pointer (the dynamic TLS lookups of a
 *                       dlopen'd library were 13% of the emulation's samples). Its tile plans then time what
 *                       the tile path does besides its products on a CPU without AMX; their results are wrong.
 * Tile numbers are constants (the instructions encode them). The configuration is the 64-byte LDTILECFG
 * block: palette, start row, then colsb[16] (bytes per row) and rows[16] of each tile.
 */
#ifndef SA_CPU_TILE_ISA_H
#define SA_CPU_TILE_ISA_H

#include <stdint.h>
#include <string.h>

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((aligned(64))) sa_tile_cfg; /* one cache line, as LDTILECFG reads it */

#ifndef SA_TILE_EMULATED

#include <immintrin.h>

/* LDTILECFG and STTILECFG as asm statements whose memory operand is the whole 64-byte block. GCC 12's
   _tile_loadconfig declares an 8-byte operand, so the stores that fill colsb and rows are deleted as dead
   and every tile stays unconfigured: the first TILEZERO faults (SIGILL). tests/test_tile_config.c reads
   the configuration back after each configuration routine, under both compilers that `make test` builds. */
static inline void sa_tile_ldtilecfg(const sa_tile_cfg *cfg) { __asm__ volatile("ldtilecfg %0" : : "m"(*cfg)); }
static inline void sa_tile_sttilecfg(sa_tile_cfg *cfg) { __asm__ volatile("sttilecfg %0" : "=m"(*cfg)); }

/* TILELOADD with a memory clobber: GCC's _tile_loadd names no memory operand, so nothing orders it after
   the stores that stage its operand (cpu_tile_pack.h); _tile_stored already clobbers memory. */
#define TILE_LOADD(t, p, stride) SA_TILE_LOADD_(t, p, stride) /* t expanded first (TD_Q -> 4) */
#define SA_TILE_LOADD_(t, p, stride) \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t : : "r"((const void *)(p)), "r"((long)(stride)) : "memory")

#define TILE_LOADCONFIG(cfg)      sa_tile_ldtilecfg(cfg)
#define TILE_STORECONFIG(cfg)     sa_tile_sttilecfg(cfg)
#define TILE_ZERO(t)              _tile_zero(t)
#define TILE_DPBF16PS(c, a, b)    _tile_dpbf16ps(c, a, b)
#define TILE_STORED(t, p, stride) _tile_stored(t, p, stride)
#define TILE_RELEASE()            _tile_release()

#else

/* The tile state of this thread, as the OS keeps it per thread for the real registers. */
typedef struct {
  sa_tile_cfg cfg;
  uint8_t t[8][16][64] __attribute__((aligned(64)));
} sa_tile_emu_state;
#ifdef SA_TILE_PROXY
#include <immintrin.h>
#include <stdlib.h>
static __thread __attribute__((tls_model("initial-exec"))) sa_tile_emu_state *sa_tile_emu_p;
#define sa_tile_emu (*sa_tile_emu_p)
#else
static _Thread_local sa_tile_emu_state sa_tile_emu;
#endif

/* LDTILECFG: takes the configuration and zeroes every tile. */
static void sa_tile_emu_loadconfig(const void *cfg) {
#ifdef SA_TILE_PROXY
  if (!sa_tile_emu_p) sa_tile_emu_p = (sa_tile_emu_state *)aligned_alloc(64, sizeof(sa_tile_emu_state));
#endif
  memcpy(&sa_tile_emu.cfg, cfg, sizeof sa_tile_emu.cfg);
  memset(sa_tile_emu.t, 0, sizeof sa_tile_emu.t);
}

/* TILELOADD: rows[t] rows of colsb[t] bytes, stride bytes apart; the bytes past colsb and the rows past
   rows[t] are zeroed. */
static void sa_tile_emu_loadd(int t, const void *p, int64_t stride) {
  const int rows = sa_tile_emu.cfg.rows[t], colsb = sa_tile_emu.cfg.colsb[t];
#ifdef SA_TILE_PROXY
  (void)colsb;
  for (int r = 0; r < rows; r++)
    _mm512_store_si512(sa_tile_emu.t[t][r], _mm512_loadu_si512((const char *)p + r * stride));
#else
  memset(sa_tile_emu.t[t], 0, sizeof sa_tile_emu.t[t]);
  for (int r = 0; r < rows; r++) memcpy(sa_tile_emu.t[t][r], (const char *)p + r * stride, (size_t)colsb);
#endif
}

static void sa_tile_emu_zero(int t) { memset(sa_tile_emu.t[t], 0, sizeof sa_tile_emu.t[t]); }

/* TILESTORED: rows[t] rows of colsb[t] bytes. */
static void sa_tile_emu_stored(int t, void *p, int64_t stride) {
  const int rows = sa_tile_emu.cfg.rows[t], colsb = sa_tile_emu.cfg.colsb[t];
#ifdef SA_TILE_PROXY
  (void)colsb;
  for (int r = 0; r < rows; r++) _mm512_storeu_si512((char *)p + r * stride, _mm512_load_si512(sa_tile_emu.t[t][r]));
#else
  for (int r = 0; r < rows; r++) memcpy((char *)p + r * stride, sa_tile_emu.t[t][r], (size_t)colsb);
#endif
}

/* STTILECFG: the configuration this thread holds (all zero after TILERELEASE). */
static void sa_tile_emu_storeconfig(sa_tile_cfg *cfg) { memcpy(cfg, &sa_tile_emu.cfg, sizeof *cfg); }

/* TILERELEASE: the tile state returns to its initial one (configuration and data zero). */
static void sa_tile_emu_release(void) {
#ifdef SA_TILE_PROXY
  if (!sa_tile_emu_p) return;
#endif
  memset(&sa_tile_emu, 0, sizeof sa_tile_emu);
}

/* A bf16 operand element as fp32, denormals read as zero (the instruction's DAZ). */
static float sa_tile_emu_bf16(const uint8_t *row, int idx) {
  uint32_t u = (uint32_t)(row[2 * idx] | row[2 * idx + 1] << 8) << 16;
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* An fp32 result with denormals flushed to zero (the instruction's FTZ; RNE is C's rounding). */
static float sa_tile_emu_ftz(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  memcpy(&x, &u, 4);
  return x;
}

/* TDPBF16PS c, a, b: for each row m of c and each dword k of a's row, for each fp32 column n of c:
   c[m][n] += a[m].bf16[2k] * b[k].bf16[2n], then += a[m].bf16[2k+1] * b[k].bf16[2n+1], in that order, each
   an fp32 operation; the bytes of c past colsb and its rows past rows[c] are zeroed. B is thus in VNNI
   form: row k holds the pairs (B[2k][n], B[2k+1][n]) of the matrix B. */
static void sa_tile_emu_dpbf16ps(int c, int a, int b) {
  const int rows = sa_tile_emu.cfg.rows[c], nk = sa_tile_emu.cfg.colsb[a] / 4, nn = sa_tile_emu.cfg.colsb[c] / 4;
  float acc[16];
  /* C is m x n, A m x k pairs, B k pair-rows x n: a configuration that disagrees is #UD on the CPU, here a
     C of NaN, which every test then reports (the tile decode configures its tiles per shape). */
  if (sa_tile_emu.cfg.rows[a] != rows || sa_tile_emu.cfg.colsb[b] != sa_tile_emu.cfg.colsb[c] ||
      sa_tile_emu.cfg.colsb[a] != 4 * sa_tile_emu.cfg.rows[b] || rows == 0 || nn == 0 || nk == 0) {
    memset(sa_tile_emu.t[c], 0xff, sizeof sa_tile_emu.t[c]);
    return;
  }
  for (int m = 0; m < rows; m++) {
    memcpy(acc, sa_tile_emu.t[c][m], (size_t)nn * 4);
    const uint8_t *ar = sa_tile_emu.t[a][m];
    for (int k = 0; k < nk; k++) {
      const uint8_t *br = sa_tile_emu.t[b][k];
      const float a0 = sa_tile_emu_bf16(ar, 2 * k), a1 = sa_tile_emu_bf16(ar, 2 * k + 1);
      for (int n = 0; n < nn; n++) {
        acc[n] = sa_tile_emu_ftz(acc[n] + a0 * sa_tile_emu_bf16(br, 2 * n));
        acc[n] = sa_tile_emu_ftz(acc[n] + a1 * sa_tile_emu_bf16(br, 2 * n + 1));
      }
    }
    memset(sa_tile_emu.t[c][m], 0, 64);
    memcpy(sa_tile_emu.t[c][m], acc, (size_t)nn * 4);
  }
  for (int m = rows; m < 16; m++) memset(sa_tile_emu.t[c][m], 0, 64);
}

#define TILE_LOADCONFIG(cfg)     sa_tile_emu_loadconfig(cfg)
#define TILE_STORECONFIG(cfg)    sa_tile_emu_storeconfig(cfg)
#define TILE_LOADD(t, p, stride) sa_tile_emu_loadd(t, p, stride)
#define TILE_ZERO(t)             sa_tile_emu_zero(t)
#ifdef SA_TILE_PROXY
#define TILE_DPBF16PS(c, a, b) ((void)sa_tile_emu_dpbf16ps)
#else
#define TILE_DPBF16PS(c, a, b) sa_tile_emu_dpbf16ps(c, a, b)
#endif
#define TILE_STORED(t, p, stride) sa_tile_emu_stored(t, p, stride)
#define TILE_RELEASE()            sa_tile_emu_release()

#endif /* SA_TILE_EMULATED */

#endif /* SA_CPU_TILE_ISA_H */
