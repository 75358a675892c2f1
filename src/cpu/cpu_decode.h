/*
 * cpu_decode.h — what the CPU split-KV decode's driver (cpu_decode.c: plan, threads, combine) shares with
 * its work-item kernels (cpu_decode_portable.c, cpu_decode_avx512.c, and the tile one of cpu_decode_tile.h
 * compiled as cpu_decode_amx.c and cpu_decode_amxemu.c).
 *
 * One work item is (batch b, chunk c): every kv head kh against keys [c * chunk, (c + 1) * chunk), the
 * R = G * Tq query rows that read kh together ("GQA packing": each cache byte is read once per item, for
 * all G heads), the heads taken in turn per block of keys so the cache is read front to back. A kernel
 * leaves per (kh, row) the running max m (base 2), the sum l and the unnormalised output acc; the driver
 * turns them into vanilla partials (out normalised by l, lse without the sink, -inf when no key is
 * valid), and the combine merges the chunks of a row in chunk order and adds the sink once.
 */
#ifndef SA_CPU_DECODE_H
#define SA_CPU_DECODE_H

#include "cpu_plan.h"

typedef struct sa_decode_item {
  const sa_attn *a;
  const sa_cpu_plan *plan; /* rows R, chunk (keys), splits, bf16_dot */
  int64_t group;           /* G = N / K */
  float qscale;            /* scale * log2(e): scores are kept in base 2 */
  int64_t b, c;            /* this item */
  int64_t jlo, jhi;        /* the keys of chunk c that some row may see (jlo >= jhi: none) */
  const int64_t *rng;      /* [R][2]: each row's key range inside the chunk ([0, 0) when empty) */
  /* results, per kv head kh and row r: m [kh * mstride + r], l likewise, acc [(kh * R + r) * astride + d]
     (mstride R rounded up to 16, astride Hv rounded up to 32) */
  float *m, *l, *acc;
  int64_t mstride, astride;
} sa_decode_item;

/* Floats of the kernel's own scratch for one item (beyond the driver's m, l, acc, rng). */
int64_t sa_cpu_decode_portable_scratch(const sa_attn *a, const sa_cpu_plan *p);
int64_t sa_cpu_decode_avx512_scratch(const sa_attn *a, const sa_cpu_plan *p);
/* Fills it->m, l, acc over keys [jlo, jhi) (the driver set m = -inf, l = 0, acc = 0). */
void sa_cpu_decode_portable(const sa_decode_item *it, float *scratch);
void sa_cpu_decode_avx512(const sa_decode_item *it, float *scratch);
/* The tile item: AMX instructions (built where the compiler takes them: SA_CPU_HAVE_AMX) or their emulation. */
#ifdef SA_CPU_HAVE_AMX
int64_t sa_cpu_decode_amx_scratch(const sa_attn *a, const sa_cpu_plan *p);
void sa_cpu_decode_amx(const sa_decode_item *it, float *scratch);
int64_t sa_cpu_decode_amx_config(const sa_attn *a, const sa_cpu_plan *p, void *got);
#endif
int64_t sa_cpu_decode_amxemu_scratch(const sa_attn *a, const sa_cpu_plan *p);
void sa_cpu_decode_amxemu(const sa_decode_item *it, float *scratch);
int64_t sa_cpu_decode_amxemu_config(const sa_attn *a, const sa_cpu_plan *p, void *got);
/* A tile decode plan's configuration routine as its items run it, the configuration then held read back
   into got (64 bytes, STTILECFG) and released: the item's tile width tw, or -1 for a plan without tiles. */
int64_t sa_cpu_decode_tile_config(const sa_attn *a, const sa_cpu_plan *p, void *got);

#endif /* SA_CPU_DECODE_H */
