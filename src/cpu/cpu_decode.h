/*
 * cpu_decode.h — the CPU split-KV decode kernel's plan, shared by cpu_decode.c (threads, combine,
 * portable kernel) and cpu_decode_avx512.c (the same kernel compiled for AVX-512).
 *
 * One work item is (batch b, chunk c): for each kv head kh, the R = G * Tq query rows that read it
 * (G heads x Tq tokens, "GQA packing") against keys [c * chunk, (c + 1) * chunk), the heads interleaved
 * per tile of keys so the cache is read in address order. Each (b, kh, c) gets a vanilla partial (out normalised by its own sum, lse without the sink; -inf when no key is valid);
 * the combine merges the chunks of a row in chunk order and adds the sink once.
 */
#ifndef SA_CPU_DECODE_H
#define SA_CPU_DECODE_H

#include "../sa_internal.h"

/* Keys per inner tile: 16 in the portable kernel, 32 (two AVX-512 registers of fp32 scores per query row)
   in the AVX-512 one. */
#define SA_DECODE_TILE 16
#define SA_DECODE_TILE_WIDE 32

typedef struct sa_decode_plan {
  const sa_attn *a;
  int64_t group;   /* G = N / K */
  int64_t rows;    /* R = G * Tq, rows per work item, ordered r = t * G + g */
  int64_t chunk;   /* keys per work item, a multiple of SA_DECODE_TILE */
  int64_t splits;  /* chunks per (b, kh): ceil(S / chunk), at least 1 */
  float qscale;    /* scale * log2(e): scores are kept in base 2 */
  int bf16_dot;    /* AVX-512 kernel only: bf16 cache and a CPU with AVX512-BF16 (vdpbf16ps scores) */
} sa_decode_plan;

/* Floats of per-thread scratch one work item needs. */
int64_t sa_cpu_decode_scratch_floats(const sa_decode_plan *p);

/* One work item (b, c): every kv head of batch b against chunk c; writes the partials of slots
   (b, kh, c) = (b * K + kh) * splits + c: out [R][Hv] and lse [R] (natural log, no sink). */
typedef void (*sa_decode_partial_fn)(const sa_decode_plan *p, int64_t b, int64_t c, float *scratch,
                                     float *part_out, float *part_lse);
void sa_cpu_decode_partial_generic(const sa_decode_plan *p, int64_t b, int64_t c, float *scratch, float *part_out,
                                   float *part_lse);
void sa_cpu_decode_partial_avx512(const sa_decode_plan *p, int64_t b, int64_t c, float *scratch, float *part_out,
                                  float *part_lse);

#endif /* SA_CPU_DECODE_H */
