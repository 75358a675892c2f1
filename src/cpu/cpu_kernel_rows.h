/*
 * cpu_kernel_rows.h — how the kernel body (cpu_kernel_body.h) moves rows of its inputs and outputs: conversion to
 * fp32 and back to the dtype, the prefetch of rows that lie on their own lines, and the scatter of a converted row
 * into a transposed tile. Included by the body only, after the vector layer (VW, V_*), once per SIMD level.
 */
#ifndef SA_CPU_KERNEL_ROWS_H
#define SA_CPU_KERNEL_ROWS_H

/* dst[0, n) = mul * src[off, off + n) in fp32; dst[n, npad) = 0. */
static void cvt(float *dst, const void *src, sa_dtype t, int64_t off, int64_t n, int64_t npad, float mul) {
  int64_t i = 0;
  vf m = V_SET1(mul);
  if (t == SA_F32) {
    const float *s = (const float *)src + off;
    for (; i + VW <= n; i += VW) V_STORE(dst + i, V_MUL(V_LOAD(s + i), m));
  } else if (t == SA_F16) {
    const uint16_t *s = (const uint16_t *)src + off;
    for (; i + VW <= n; i += VW) V_STORE(dst + i, V_MUL(V_LOAD_F16(s + i), m));
  } else {
    const uint16_t *s = (const uint16_t *)src + off;
    for (; i + VW <= n; i += VW) V_STORE(dst + i, V_MUL(V_LOAD_BF16(s + i), m));
  }
  for (; i < n; i++) dst[i] = sa_load(src, t, off + i) * mul;
  for (; i < npad; i++) dst[i] = 0.0f;
}

/* dst[off, off + n) = mul * src[0, n), rounded to the dtype (V_STORE_BF16, where the layer has it, rounds
   as sa_store does). */
static void put(void *dst, sa_dtype t, int64_t off, const float *src, int64_t n, float mul) {
  int64_t i = 0;
  vf m = V_SET1(mul);
  if (t == SA_F32) {
    float *d = (float *)dst + off;
    for (; i + VW <= n; i += VW) V_STORE(d + i, V_MUL(V_LOAD(src + i), m));
  }
#ifdef V_STORE_BF16
  if (t == SA_BF16) {
    uint16_t *d = (uint16_t *)dst + off;
    for (; i + VW <= n; i += VW) V_STORE_BF16(d + i, V_MUL(V_LOAD(src + i), m));
  }
#endif
  for (; i < n; i++) sa_store(dst, t, off + i, src[i] * mul);
}

/* Asks for rows [r0, r0 + n) of an operand (row r at element offset r * stride + off, len elements) to be
   brought into cache while the current tile computes. The rows of one tile are N*H or K*H elements apart
   (4 KiB at N = 8, H = 128): each is on its own page, and without this the loads of the next tile waited
   on TLB and L3 misses for 40% of the forward's time (perf, T = S = 2048, H = 128). */
static void prefetch_rows(const void *base, sa_dtype t, int64_t r0, int64_t n, int64_t stride, int64_t off,
                          int64_t len) {
  const char *p = (const char *)base;
  int64_t es = (int64_t)sa_dtype_size(t), bytes = len * es;
  for (int64_t r = r0; r < r0 + n; r++) {
    const char *row = p + (r * stride + off) * es;
    for (int64_t x = 0; x < bytes; x += 64) __builtin_prefetch(row + x, 0, 3);
  }
}

/* How far ahead (positions, or rows in the dq pass) an item asks for its q, dout and out rows while it
   converts them: each row is on its own lines (N * H elements apart), which the hardware prefetchers do not
   follow; without it the q rows' misses are 6% of the tile forward's non-product samples (T = S = 2048,
   N8 H128). */
#define ROW_AHEAD 8

/* Column col of the transposed tile dst[n x ld] from a converted row. */
static inline void scatter_col(float *dst, int64_t ld, int64_t col, const float *row, int64_t n) {
  for (int64_t d = 0; d < n; d++) dst[d * ld + col] = row[d];
}

#endif /* SA_CPU_KERNEL_ROWS_H */
