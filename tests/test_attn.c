/*
 * test_attn.c — the C test driver: the CPU backend against the fp64 reference on a table of several
 * hundred problems (shapes, GQA, Hv != H, every mask, the three softmax types with wide sinks, f32 / f16
 * / bf16, forward and backward with and without dlse; bias and mask in each of their 16 broadcast forms,
 * positions, dbias), the reference against finite differences, thread count determinism, rows without
 * keys, and the invalid-argument table.
 * Prints one line per failure, a summary per group, and last `N passed, N failed`; exit 1 on failure.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include <time.h>

#include "sa_test.h"
#include "sa_test_absent.h"
#include "sa_test_case.h"
#include "sa_test_fd.h"
#include "sa_test_invalid.h"

/* ---- the case table -------------------------------------------------------------------------- */

typedef struct {
  sa_causal causal;
  int64_t wl, wr, diag;
  int lens, segs;
} t_mask;

#define TL SA_CAUSAL_TOP_LEFT
#define BR SA_CAUSAL_BOTTOM_RIGHT

/* Every mask kind alone, then in combination (diag_offset both ways; windows that empty whole rows). */
/* one case a line */
// clang-format off
static const t_mask t_masks[] = {
    {T_UNBOUNDED},
    {.causal = TL, T_UNBOUNDED},
    {.causal = BR, T_UNBOUNDED},
    {.wl = 3, .wr = 2},
    {.causal = TL, .wl = 7, .wr = 0},
    {.causal = BR, .wl = 5, .wr = 0},
    {.wl = 0, .wr = 0},
    {.wl = -1, .wr = 4},
    {.wl = 4, .wr = -1},
    {T_UNBOUNDED, .lens = T_LENS_RANDOM},
    {.causal = BR, T_UNBOUNDED, .lens = T_LENS_EDGE},
    {.causal = TL, T_UNBOUNDED, .lens = T_LENS_KV_ONLY},
    {.causal = BR, T_UNBOUNDED, .lens = T_LENS_Q_ONLY},
    {T_UNBOUNDED, .segs = T_SEGS_PACKED},
    {.causal = TL, T_UNBOUNDED, .lens = T_LENS_RANDOM, .segs = T_SEGS_RANDOM},
    {.causal = TL, T_UNBOUNDED, .diag = 7},
    {.causal = BR, .wl = 3, .wr = 3, .diag = -5},
    {.wl = 2, .wr = 2, .diag = -40},
    {.causal = BR, .wl = 2, .wr = 1, .diag = 3, .lens = T_LENS_EDGE, .segs = T_SEGS_PACKED},
    {.causal = TL, .wl = 127, .wr = 0, .diag = -2, .lens = T_LENS_RANDOM, .segs = T_SEGS_PACKED},
};
// clang-format on
#define T_NMASK ((int)(sizeof t_masks / sizeof t_masks[0]))

/* Positions replace the index-based causal alignment: bottom-right with positions is invalid, so those
   rows run top-left (with T_POS_SHIFT that is the same mask as bottom-right without lengths). */
static void t_apply_mask(t_case *c, const t_mask *m) {
  c->causal = m->causal;
  c->wl = m->wl;
  c->wr = m->wr;
  c->diag = m->diag;
  c->lens = m->lens;
  c->segs = m->segs;
  if (c->pos && c->causal == BR) c->causal = TL;
}

static int64_t t_cost(const t_case *c) { return c->B * c->N * c->T * c->S * (c->H + c->Hv); }

static const int64_t t_head_dims[] = {32, 64, 80, 96, 128, 256};
static const int64_t t_lens_set[] = {1, 2, 3, 5, 16, 17, 31, 37, 64, 65, 129};
static const int64_t t_heads[][2] = {{1, 1}, {2, 1}, {4, 4}, {4, 2}, {8, 1}, {8, 4}, {16, 2}, {6, 3}, {8, 8}};

/* Rows written by hand: S = 0, T = 0, B = 0, single elements, every batch empty, decode against a long
   cache; then bias, mask and positions where they meet edges. */
/* one case a line */
// clang-format off
static const t_case t_edges[] = {
    {.name = "S = 0", .dt = SA_F32, .B = 2, .T = 5, .S = 0, .N = 4, .K = 2, .H = 32, .Hv = 32,
     .sm = SA_SOFTMAX_LEARNABLE, .dlse = 1, T_UNBOUNDED},
    {.name = "S = 0 vanilla", .dt = SA_BF16, .B = 2, .T = 5, .S = 0, .N = 4, .K = 2, .H = 32, .Hv = 32, .dlse = 1,
     T_UNBOUNDED},
    {.name = "T = 0", .dt = SA_F16, .B = 2, .T = 0, .S = 7, .N = 4, .K = 2, .H = 32, .Hv = 32,
     .sm = SA_SOFTMAX_LEARNABLE, T_UNBOUNDED},
    {.name = "B = 0", .dt = SA_F32, .B = 0, .T = 5, .S = 7, .N = 4, .K = 2, .H = 32, .Hv = 32,
     .sm = SA_SOFTMAX_OFF_BY_ONE, T_UNBOUNDED},
    {.name = "one element", .dt = SA_F32, .B = 1, .T = 1, .S = 1, .N = 1, .K = 1, .H = 32, .Hv = 32,
     .sm = SA_SOFTMAX_LEARNABLE, .dlse = 1, T_UNBOUNDED},
    {.name = "one element causal", .dt = SA_BF16, .B = 1, .T = 1, .S = 1, .N = 1, .K = 1, .H = 64, .Hv = 32,
     .causal = TL, T_UNBOUNDED},
    {.name = "decode window", .dt = SA_F16, .B = 3, .T = 1, .S = 129, .N = 8, .K = 1, .H = 64, .Hv = 64,
     .sm = SA_SOFTMAX_LEARNABLE, .sinks = T_SINK_BIG, .lens = T_LENS_RANDOM, .dlse = 1, .causal = BR, .wl = 127,
     .wr = 0},
    {.name = "decode", .dt = SA_BF16, .B = 2, .T = 1, .S = 129, .N = 8, .K = 2, .H = 128, .Hv = 128,
     .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = BR, T_UNBOUNDED},
    {.name = "every batch edge", .dt = SA_F32, .B = 4, .T = 9, .S = 11, .N = 2, .K = 1, .H = 32, .Hv = 32,
     .sm = SA_SOFTMAX_LEARNABLE, .sinks = T_SINK_BIG, .lens = T_LENS_EDGE, .dlse = 1, T_UNBOUNDED},
    {.name = "edges and segments", .dt = SA_BF16, .B = 4, .T = 9, .S = 11, .N = 2, .K = 1, .H = 32, .Hv = 32,
     .lens = T_LENS_EDGE, .segs = T_SEGS_RANDOM, .dlse = 1, .causal = TL, T_UNBOUNDED},
    {.name = "diagonal below every key", .dt = SA_F32, .B = 2, .T = 16, .S = 16, .N = 4, .K = 4, .H = 32, .Hv = 32,
     .sm = SA_SOFTMAX_LEARNABLE, .dlse = 1, .causal = TL, T_UNBOUNDED, .diag = -100},
    {.name = "diagonal past every key", .dt = SA_F16, .B = 2, .T = 16, .S = 16, .N = 4, .K = 4, .H = 32,
     .Hv = 32, .dlse = 1, .causal = BR, .wl = 0, .wr = 0, .diag = 100},
    {.name = "H 256 window", .dt = SA_BF16, .B = 1, .T = 129, .S = 129, .N = 4, .K = 1, .H = 256, .Hv = 256,
     .sm = SA_SOFTMAX_LEARNABLE, .sinks = T_SINK_BIG, .dlse = 1, .causal = TL, .wl = 127, .wr = 0},
    {.name = "T 200 S 300", .dt = SA_BF16, .B = 1, .T = 200, .S = 300, .N = 2, .K = 1, .H = 64, .Hv = 64,
     .sm = SA_SOFTMAX_LEARNABLE, .lens = T_LENS_RANDOM, .dlse = 1, .causal = BR, .wl = 100, .wr = 0},
    {.name = "long cache", .dt = SA_F16, .B = 2, .T = 3, .S = 1000, .N = 4, .K = 1, .H = 128, .Hv = 128,
     .sm = SA_SOFTMAX_OFF_BY_ONE, .lens = T_LENS_RANDOM, .dlse = 1, .causal = BR, T_UNBOUNDED},
    {.name = "Hv != H, scale 1", .dt = SA_F32, .B = 1, .T = 129, .S = 129, .N = 4, .K = 2, .H = 80, .Hv = 96,
     .sm = SA_SOFTMAX_LEARNABLE, .lens = T_LENS_RANDOM, .segs = T_SEGS_PACKED, .dlse = 1, T_UNBOUNDED,
     .scale = 1.0f},
    {.name = "bias, S = 0", .dt = SA_F32, .B = 2, .T = 5, .S = 0, .N = 4, .K = 2, .H = 32, .Hv = 32,
     .sm = SA_SOFTMAX_LEARNABLE, T_UNBOUNDED, .bias = T_BCAST(1, 0, 0, 1)},
    {.name = "bias, T = 0", .dt = SA_F32, .B = 2, .T = 0, .S = 5, .N = 4, .K = 2, .H = 32, .Hv = 32,
     .sm = SA_SOFTMAX_LEARNABLE, T_UNBOUNDED, .bias = T_BCAST(0, 1, 1, 0)},
    {.name = "bias and mask, one element", .dt = SA_BF16, .B = 1, .T = 1, .S = 1, .N = 2, .K = 1, .H = 32,
     .Hv = 32, .sm = SA_SOFTMAX_LEARNABLE, .dlse = 1, T_UNBOUNDED, .bias = T_BCAST(0, 0, 0, 0),
     .bias_dt = SA_F16, .mask = T_BCAST(1, 0, 1, 1)},
    {.name = "-inf rows, every batch edge", .dt = SA_F32, .B = 4, .T = 9, .S = 11, .N = 2, .K = 1, .H = 32,
     .Hv = 32, .sm = SA_SOFTMAX_LEARNABLE, .sinks = T_SINK_BIG, .lens = T_LENS_EDGE, .dlse = 1, T_UNBOUNDED,
     .bias = T_BCAST(1, 0, 0, 0), .bias_kind = T_BIAS_NEGINF},
    {.name = "vanilla -inf rows and masked rows", .dt = SA_F32, .B = 2, .T = 33, .S = 70, .N = 4, .K = 2,
     .H = 32, .Hv = 32, .dlse = 1, T_UNBOUNDED, .bias = T_BCAST(0, 0, 0, 1), .bias_kind = T_BIAS_NEGINF,
     .mask = T_BCAST(1, 0, 0, 0)},
    {.name = "decode with bias and positions", .dt = SA_BF16, .B = 2, .T = 2, .S = 300, .N = 8, .K = 2, .H = 64,
     .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .sinks = T_SINK_BIG, .lens = T_LENS_RANDOM, .causal = TL, .wl = 100,
     .wr = 0, .bias = T_BCAST(1, 0, 0, 0), .bias_dt = SA_BF16, .pos = T_POS_SHIFT},
    {.name = "gpt-oss-like window, bias shared", .dt = SA_BF16, .B = 1, .T = 200, .S = 200, .N = 16, .K = 2,
     .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .dlse = 1, .causal = TL, .wl = 127, .wr = 0,
     .bias = T_BCAST(1, 1, 0, 0), .bias_dt = SA_BF16},
    {.name = "packed documents, positions, mask", .dt = SA_F32, .B = 2, .T = 150, .S = 150, .N = 4, .K = 2,
     .H = 32, .Hv = 32, .sm = SA_SOFTMAX_LEARNABLE, .segs = T_SEGS_PACKED, .dlse = 1, .causal = TL, .wl = 20,
     .wr = 0, .mask = T_BCAST(0, 1, 0, 0), .pos = T_POS_SEGMENT},
    {.name = "a scalar bias", .dt = SA_F16, .B = 3, .T = 70, .S = 90, .N = 4, .K = 1, .H = 32, .Hv = 32,
     .sm = SA_SOFTMAX_LEARNABLE, .dlse = 1, T_UNBOUNDED, .bias = T_BCAST(1, 1, 1, 1)},
    {.name = "a bias per batch and head", .dt = SA_F32, .B = 3, .T = 70, .S = 90, .N = 4, .K = 2, .H = 32,
     .Hv = 32, .sm = SA_SOFTMAX_LEARNABLE, .dlse = 1, .causal = TL, T_UNBOUNDED, .bias = T_BCAST(0, 0, 1, 1)},
};
// clang-format on

/* The 16 broadcast forms of bias (each x 2 shapes) and of the mask, mixed with every mask kind of t_masks,
   the softmax types, dtypes of data and bias, GQA, T != S; then positions with each kind of causal and
   window, alone and with bias and mask. */
static int t_bias_cases(t_case *cs, int n, int max) {
  for (int f = 0; f < 32 && n < max; f++) {
    int sh = f / 16;
    t_case c = {.dt = (sa_dtype)(f % 3),
                .bias_dt = (sa_dtype)((f / 3) % 3),
                .sm = (sa_softmax)((f + 1) % 3),
                .B = sh ? 2 : 3,
                .T = sh ? 70 : (f % 2 ? 37 : 45),
                .S = sh ? 150 : (f % 2 ? 45 : 37),
                .N = sh ? 8 : 4,
                .K = 2,
                .H = sh ? 32 : 64,
                .Hv = sh ? 32 : 64,
                .sinks = f % 5 == 4 ? T_SINK_BIG : T_SINK_U10,
                .dlse = f % 2,
                .bias = 1 + f % 16,
                .bias_kind = f % 4 == 3 ? T_BIAS_NEGINF : T_BIAS_UNIFORM,
                .no_dbias = f == 21};
    t_apply_mask(&c, &t_masks[(f * 7) % T_NMASK]);
    cs[n++] = c;
  }
  for (int f = 0; f < 16 && n < max; f++) {
    t_case c = {.dt = (sa_dtype)((f + 2) % 3),
                .sm = (sa_softmax)(f % 3),
                .B = 2,
                .T = f % 2 ? 45 : 70,
                .S = f % 2 ? 70 : 45,
                .N = 4,
                .K = f % 3 ? 2 : 4,
                .H = 32,
                .Hv = 48,
                .sinks = f % 4 == 1 ? T_SINK_BIG : T_SINK_U10,
                .dlse = (f + 1) % 2,
                .mask = 1 + f,
                .bias = f % 3 == 2 ? T_BCAST(1, 0, 0, 0) : 0,
                .bias_dt = SA_BF16};
    t_apply_mask(&c, &t_masks[(f * 3) % T_NMASK]);
    cs[n++] = c;
  }
  static const t_mask pm[] = {{.causal = TL, T_UNBOUNDED},
                              {.causal = TL, .wl = 3, .wr = 0},
                              {.wl = 2, .wr = 2},
                              {.causal = TL, .wl = 5, .wr = 0, .diag = 2, .lens = T_LENS_RANDOM},
                              {.wl = -1, .wr = 1, .diag = -3, .segs = T_SEGS_PACKED}};
  for (int f = 0; f < 15 && n < max; f++) {
    int pos = 1 + f % 3, m = f % 5;
    t_case c = {.dt = (sa_dtype)(f % 3),
                .sm = (sa_softmax)((f + 2) % 3),
                .B = 2,
                .T = pos == T_POS_SHIFT ? 40 : 90,
                .S = 90,
                .N = 4,
                .K = 2,
                .H = 32,
                .Hv = 32,
                .dlse = f % 2,
                .pos = pos,
                .bias = f % 4 == 1 ? T_BCAST(1, 0, 0, 0) : 0,
                .mask = f % 4 == 2 ? T_BCAST(0, 1, 0, 0) : 0};
    t_apply_mask(&c, &pm[m]);
    if (pos == T_POS_SEGMENT && !c.segs) c.segs = T_SEGS_PACKED;
    cs[n++] = c;
  }
  return n;
}

/* The logits soft-cap (caps 0.5 to 30 against scores of standard deviation ~2, so that the tanh is far from
   linear in most cases) with every mask kind of t_masks, the softmax types with sinks U(-10, 10) and +-50,
   f32 / f16 / bf16, GQA, bias (with -inf elements, which the cap makes -cap), a mask array, positions, segments,
   empty rows (edge lengths) and decode shapes (a few queries, a long cache). */
static int t_cap_cases(t_case *cs, int n, int max) {
  static const float caps[] = {0.5f, 1.5f, 3.0f, 5.0f, 30.0f};
  for (int f = 0; f < 40 && n < max; f++) {
    const int decode = f % 8 == 5;
    t_case c = {.dt = (sa_dtype)(f % 3),
                .sm = (sa_softmax)((f + 2) % 3),
                .B = 2,
                .T = decode ? 1 + f % 3 : (f % 2 ? 37 : 70),
                .S = decode ? 300 : (f % 2 ? 70 : 45),
                .N = f % 4 == 1 ? 8 : 4,
                .K = f % 4 == 1 ? 1 : 2,
                .H = f % 3 == 1 ? 64 : 32,
                .Hv = f % 5 == 2 ? 48 : 32,
                .sinks = f % 3 == 0 ? T_SINK_BIG : T_SINK_U10,
                .dlse = f % 2,
                .cap = caps[f % 5],
                .bias = f % 4 == 2   ? T_BCAST(0, 0, 0, 0)
                        : f % 4 == 3 ? T_BCAST(1, 0, 1, 0)
                                     : 0,
                .bias_dt = (sa_dtype)((f / 4) % 3),
                .bias_kind = f % 8 == 2 ? T_BIAS_NEGINF : T_BIAS_UNIFORM,
                .mask = f % 6 == 4 ? T_BCAST(0, 1, 0, 0) : 0,
                .pos = f % 10 == 7   ? T_POS_RANDOM
                       : f % 10 == 9 ? T_POS_SEGMENT
                                     : T_POS_NONE};
    t_apply_mask(&c, &t_masks[(f * 3) % T_NMASK]);
    if (decode) {
      c.causal = c.pos ? SA_CAUSAL_TOP_LEFT : SA_CAUSAL_BOTTOM_RIGHT;
      c.lens = T_LENS_RANDOM;
    }
    if (f % 10 == 3) c.lens = T_LENS_EDGE;
    if (c.pos == T_POS_SEGMENT && !c.segs) c.segs = T_SEGS_PACKED;
    cs[n++] = c;
  }
  return n;
}

/* Fills cases[] and returns the count: ~54 shape cases, 3 x 3 x masks, ~250 random ones, the hand-written
   rows, ~80 bias / mask / positions ones, 40 soft-capped ones. */
static int t_build_cases(t_case *cs, int max) {
  int n = 0;
  t_rng r = {2024};
  /* 1. every head dim x dtype x softmax, on odd and 1-long sequences, G = 1, 2, 8 */
  static const int64_t ts[][2] = {{37, 37}, {1, 129}, {129, 1}, {64, 45}, {17, 129}, {129, 37}};
  static const int64_t nk[][2] = {{8, 8}, {8, 4}, {8, 1}};
  for (int h = 0; h < 6; h++)
    for (int d = 0; d < 3; d++)
      for (int s = 0; s < 3; s++) {
        t_case c = {0};
        int i = n;
        c.dt = (sa_dtype)d;
        c.sm = (sa_softmax)s;
        c.H = t_head_dims[h];
        c.Hv = i % 3 == 0 ? c.H : i % 3 == 1 ? 64 : 32 + 16 * (i % 5);
        c.B = 1 + i % 2;
        c.T = ts[i % 6][0];
        c.S = ts[i % 6][1];
        c.N = nk[i % 3][0] / (c.H >= 128 ? 2 : 1);
        c.K = nk[i % 3][1] / (c.H >= 128 && i % 3 != 2 ? 2 : 1);
        c.sinks = i % 4 == 3 ? T_SINK_BIG : T_SINK_U10;
        c.dlse = i % 2;
        t_apply_mask(&c, &t_masks[i % T_NMASK]);
        cs[n++] = c;
      }
  /* 2. every mask x softmax x dtype on one small GQA shape with T != S (both ways) */
  for (int m = 0; m < T_NMASK; m++)
    for (int s = 0; s < 3; s++)
      for (int d = 0; d < 3; d++) {
        t_case c = {0};
        c.dt = (sa_dtype)d;
        c.sm = (sa_softmax)s;
        c.B = 2;
        c.T = (m + s) % 2 ? 37 : 45;
        c.S = (m + s) % 2 ? 45 : 37;
        c.N = 4;
        c.K = 2;
        c.H = 64;
        c.Hv = d == 1 ? 32 : 64;
        c.sinks = (m + d) % 3 == 0 ? T_SINK_BIG : T_SINK_U10;
        c.dlse = (m + s + d) % 2;
        c.no_dsinks = (m + s + d) % 7 == 6;
        t_apply_mask(&c, &t_masks[m]);
        cs[n++] = c;
      }
  /* 3. random combinations, capped at ~6M multiply-adds per pass so the table runs in seconds */
  for (int k = 0; k < 250 && n < max; k++) {
    t_case c = {0};
    do {
      c.dt = (sa_dtype)t_int(&r, 0, 2);
      c.sm = (sa_softmax)t_int(&r, 0, 2);
      c.B = t_int(&r, 1, 3);
      c.T = t_lens_set[t_int(&r, 0, 10)];
      c.S = t_lens_set[t_int(&r, 0, 10)];
      int hk = (int)t_int(&r, 0, 8);
      c.N = t_heads[hk][0];
      c.K = t_heads[hk][1];
      c.H = t_head_dims[t_int(&r, 0, 5)];
      c.Hv = t_int(&r, 0, 2) ? c.H : t_head_dims[t_int(&r, 0, 5)];
    } while (t_cost(&c) > 6000000);
    c.sinks = (int)t_int(&r, 0, 1);
    c.dlse = (int)t_int(&r, 0, 1);
    c.no_dsinks = t_int(&r, 0, 9) == 0;
    /* an explicit scale within 2x of the default, either sign: scores of the same size as elsewhere
       (a scale 8x the default at H = 256 gives |s| ~ 100, where fp32 itself loses 1e-5 in p) */
    c.scale = t_int(&r, 0, 3) == 0 ? (float)(t_unif(&r, -2, 2) / sqrt((double)c.H)) : 0.0f;
    if (t_int(&r, 0, 1)) {
      t_apply_mask(&c, &t_masks[t_int(&r, 0, T_NMASK - 1)]);
    } else { /* independent random draws of each mask part */
      c.causal = (sa_causal)t_int(&r, 0, 2);
      c.wl = t_int(&r, -1, 9);
      c.wr = t_int(&r, -1, 9);
      c.diag = t_int(&r, 0, 3) ? 0 : t_int(&r, -20, 20);
      c.lens = (int)t_int(&r, 0, 4);
      c.segs = (int)t_int(&r, 0, 2);
    }
    cs[n++] = c;
  }
  /* 4. the hand-written rows */
  for (size_t e = 0; e < sizeof t_edges / sizeof t_edges[0] && n < max; e++) cs[n++] = t_edges[e];
  /* 5. bias, mask, positions; 6. the soft-cap */
  return t_cap_cases(cs, t_bias_cases(cs, n, max), max);
}

/* ---- determinism: thread counts must not change a single bit ---------------------------------- */

static int t_determinism_case(const t_case *c, int idx) {
  char name[400];
  t_case_name(c, name, sizeof name);
  t_rng r = {0xd7e7000ull + (uint64_t)idx};
  t_prob p;
  t_prob_make(&p, c, &r, idx);
  size_t es = sa_dtype_size(c->dt);
  int ok = t_fwd(&p, SA_BACKEND_REF, p.out_r, p.lse_r) == SA_OK;
  void *o1 = t_alloc(p.no, es), *q1 = t_alloc(p.nq, es), *k1 = t_alloc(p.nk, es), *v1 = t_alloc(p.nv, es);
  float *l1 = t_alloc(p.nl, 4), *s1 = t_alloc(c->N, 4), *b1 = t_alloc(p.nb, 4);
  for (int th = 1; th <= 3 && ok; th++) {
    sa_cpu_set_num_threads(th);
    ok &= t_fwd(&p, SA_BACKEND_CPU, p.out_c, p.lse_c) == SA_OK;
    ok &= t_bwd(&p, c, SA_BACKEND_CPU, p.dq_c, p.dk_c, p.dv_c, p.ds_c, p.db_c) == SA_OK;
    if (!ok) {
      t_report("determinism case %d [%s]: cpu call failed with %d threads: %s", idx, name, th, sa_last_error());
      break;
    }
    size_t nb = c->bias && !c->no_dbias ? (size_t)p.nb * 4 : 0;
    if (th == 1) {
      memcpy(o1, p.out_c, (size_t)p.no * es);
      memcpy(l1, p.lse_c, (size_t)p.nl * 4);
      memcpy(q1, p.dq_c, (size_t)p.nq * es);
      memcpy(k1, p.dk_c, (size_t)p.nk * es);
      memcpy(v1, p.dv_c, (size_t)p.nv * es);
      memcpy(s1, p.ds_c, (size_t)c->N * 4);
      if (nb) memcpy(b1, p.db_c, nb);
      continue;
    }
    const char *diff = memcmp(o1, p.out_c, (size_t)p.no * es)  ? "out"
                       : memcmp(l1, p.lse_c, (size_t)p.nl * 4) ? "lse"
                       : memcmp(q1, p.dq_c, (size_t)p.nq * es) ? "dq"
                       : memcmp(k1, p.dk_c, (size_t)p.nk * es) ? "dk"
                       : memcmp(v1, p.dv_c, (size_t)p.nv * es) ? "dv"
                       : memcmp(s1, p.ds_c, (size_t)c->N * 4)  ? "dsinks"
                       : nb && memcmp(b1, p.db_c, nb)          ? "dbias"
                                                               : NULL;
    if (diff) {
      t_report("determinism case %d [%s]: %s with %d threads differs bitwise from 1 thread", idx, name, diff, th);
      ok = 0;
    }
  }
  sa_cpu_set_num_threads(0);
  free(o1);
  free(q1);
  free(k1);
  free(v1);
  free(l1);
  free(s1);
  free(b1);
  t_prob_free(&p);
  t_count(ok);
  return ok;
}

/* Work enough for 3 threads to split, and dbias summed by items that span batches, kv heads and key
   blocks (bias shared along them), by the dq pass (shared along the keys), or by every item's own rows. */
/* one case a line */
// clang-format off
static const t_case t_determinism_cases[] = {
    {.name = "causal, lengths", .dt = SA_F32, .B = 2, .T = 129, .S = 129, .N = 8, .K = 2, .H = 64, .Hv = 64,
     .sm = SA_SOFTMAX_LEARNABLE, .lens = T_LENS_RANDOM, .dlse = 1, .causal = TL, T_UNBOUNDED},
    {.name = "packed segments", .dt = SA_BF16, .B = 3, .T = 65, .S = 129, .N = 16, .K = 2, .H = 64, .Hv = 64,
     .sm = SA_SOFTMAX_LEARNABLE, .lens = T_LENS_RANDOM, .segs = T_SEGS_PACKED, .dlse = 1, T_UNBOUNDED},
    {.name = "bias shared by batches and heads", .dt = SA_F32, .B = 3, .T = 65, .S = 200, .N = 8, .K = 4, .H = 32,
     .Hv = 32, .sm = SA_SOFTMAX_LEARNABLE, .dlse = 1, .causal = TL, T_UNBOUNDED, .bias = T_BCAST(1, 1, 0, 0)},
    {.name = "bias shared along the keys", .dt = SA_BF16, .B = 2, .T = 130, .S = 100, .N = 8, .K = 2, .H = 32,
     .Hv = 32, .sm = SA_SOFTMAX_LEARNABLE, T_UNBOUNDED, .bias = T_BCAST(0, 1, 0, 1), .bias_dt = SA_BF16,
     .mask = T_BCAST(1, 0, 0, 0)},
    {.name = "bias per key only", .dt = SA_F16, .B = 2, .T = 90, .S = 200, .N = 4, .K = 2, .H = 32, .Hv = 32,
     .sm = SA_SOFTMAX_OFF_BY_ONE, .dlse = 1, T_UNBOUNDED, .bias = T_BCAST(1, 1, 1, 0), .bias_dt = SA_F16},
    {.name = "scalar bias, positions", .dt = SA_F32, .B = 2, .T = 100, .S = 150, .N = 4, .K = 2, .H = 32,
     .Hv = 32, .sm = SA_SOFTMAX_LEARNABLE, .causal = TL, .wl = 30, .wr = 0, .bias = T_BCAST(1, 1, 1, 1),
     .pos = T_POS_RANDOM},
    {.name = "full bias and mask", .dt = SA_F32, .B = 2, .T = 100, .S = 150, .N = 4, .K = 4, .H = 32, .Hv = 32,
     .sm = SA_SOFTMAX_LEARNABLE, .dlse = 1, T_UNBOUNDED, .bias = T_BCAST(0, 0, 0, 0), .bias_kind = T_BIAS_NEGINF,
     .mask = T_BCAST(0, 0, 0, 0)},
};
// clang-format on

static void t_determinism_group(const t_case *cs, int n) {
  int pass = 0, total = 0;
  /* every 25th table case (small and edge shapes) and the rows above */
  for (int i = 0; i < n; i += 25, total++) pass += t_determinism_case(&cs[i], i);
  for (size_t x = 0; x < sizeof t_determinism_cases / sizeof t_determinism_cases[0]; x++, total++)
    pass += t_determinism_case(&t_determinism_cases[x], 9000 + (int)x);
  printf("determinism (cpu with 1, 2, 3 threads, bitwise out lse dq dk dv dsinks dbias): %d/%d cases pass\n", pass,
         total);
}

/* Where the bf16 default is a tile plan (an AMX CPU: sa_test_bf16.h's bounds then apply), the bf16 cases again
   under the vector plans of this CPU's level, which the fp32 budgets hold to. */
static void t_vector_bf16(const t_case *cs, int n) {
  sa_attn probe;
  sa_attn_init(&probe);
  probe.dtype = SA_BF16;
  probe.batch = probe.q_heads = probe.kv_heads = 1;
  probe.q_len = probe.kv_len = probe.head_dim = probe.v_head_dim = 64;
  const char *names[8];
  if (sa_plan_list(&probe, SA_PLAN_FWD, SA_BACKEND_CPU, names, 8) < 1 || !strstr(names[0], ".amx")) return;
  char fwd[32], bwd[32];
  snprintf(fwd, sizeof fwd, "cpu.fwd.%s", sa_cpu_simd_name());
  snprintf(bwd, sizeof bwd, "cpu.bwd.%s", sa_cpu_simd_name());
  t_stats st = {0};
  t_cpu_plan[0] = fwd;
  t_cpu_plan[1] = bwd;
  for (int i = 0; i < n; i++)
    if (cs[i].dt == SA_BF16) t_run_case(&cs[i], i, &st);
  t_cpu_plan[0] = t_cpu_plan[1] = NULL;
  printf(
      "cpu vs reference, bf16 under %s / %s (the default is %s): %d/%d cases pass (largest error / bound: out %.2f "
      "lse %.2f dq %.2f dk %.2f dv %.2f dsinks %.2f dbias %.2f)\n",
      fwd, bwd, names[0], st.passed, st.cases, st.worst[0], st.worst[1], st.worst[2], st.worst[3], st.worst[4],
      st.worst[5], st.worst[6]);
}

/* ---- main ------------------------------------------------------------------------------------ */

static double t_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(void) {
  double t0 = t_now();
  t_fd_group();
  double t1 = t_now();

  static t_case cs[700];
  int n = t_build_cases(cs, 700);
  t_stats st[3] = {{0}};
  for (int i = 0; i < n; i++) t_run_case(&cs[i], i, &st[cs[i].dt]);
  for (int d = 0; d < 3; d++)
    printf(
        "cpu vs reference, %s: %d/%d cases pass (largest error / bound: out %.2f lse %.2f dq %.2f dk %.2f "
        "dv %.2f dsinks %.2f dbias %.2f)\n",
        t_dtype_name((sa_dtype)d), st[d].passed, st[d].cases, st[d].worst[0], st[d].worst[1], st[d].worst[2],
        st[d].worst[3], st[d].worst[4], st[d].worst[5], st[d].worst[6]);
  t_vector_bf16(cs, n);
  double t2 = t_now();

  t_determinism_group(cs, n);
  double t3 = t_now();
  t_invalid_group();
  double t4 = t_now();
  t_absent_group();
  printf(
      "time: finite differences %.1f s, table %.1f s, determinism %.1f s, masked means absent %.1f s, total %.1f s "
      "(cpu simd %s, %d threads)\n",
      t1 - t0, t2 - t1, t3 - t2, t_now() - t4, t_now() - t0, sa_cpu_simd_name(), sa_cpu_get_num_threads());
  printf("%d passed, %d failed\n", t_passed, t_failed);
  return t_failed ? 1 : 0;
}
