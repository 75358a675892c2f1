/*
 * test_cuda.c — SA_BACKEND_CUDA against SA_BACKEND_REF (fp64), over EVERY plan legal for each case
 * (sa_plan_list; sa_plan_force runs it, sa_plan_last must name it: the override-only feature plans too). Larger
 * than 600 lines: its three case tables (97 cases, one a line) are most of it, beside the driver that walks them;
 * the feature plans' two tables (bias, mask array, positions, soft-cap; dbias) are in test_cuda_feat.h. Cases cover every mask (lengths with
 * clamped values, causal top-left / bottom-right, windows, diag_offset, segments), the three softmax types with
 * sinks from U(-10, 10) or U(-50, 50), empty rows, GQA, Hv != H, odd sizes, all head dims, every dtype,
 * and production schedules (T, S = 4096..8192). Outputs are NaN-poisoned, padding holds NaN, the backward runs
 * three times and must agree bitwise. Exit 77 (skipped) without a GPU.
 *   test_cuda [--list] [--table=general|hopper|prod|features|features-prod] [--plan=SUBSTR[$][,...]]
 *             [--case=SUBSTR] [--stride=K]
 * --list enumerates cases x plans (those --plan selects) on a mocked H200 record without a GPU (CI runs it).
 */
#define _POSIX_C_SOURCE 200112L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SINKATTN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "cuda/plan.h"
#include "sa_internal.h"
#include "sa_plan.h"

typedef struct {
  const char *name;
  sa_dtype dt;
  int64_t B, T, S, N, K, H, Hv;
  sa_softmax sm;
  sa_causal causal;
  int64_t wl, wr, diag;
  int lens, segs, dlse; /* lens: 1 random, 2 with out-of-range values that clamp; segs: 1 short runs of increasing
                           ids, 2 ids drawn from {0, 1, 2} (unsorted), 3 long runs (documents across tiles),
                           4 packed: 8 documents of T / 8 queries and S / 8 keys, the same ids on both sides */
  float sink_range;     /* sinks ~ U(-r, r); -r: the same with heads 0 and 1 at +50 and -50;
                           0: the special values +inf, -inf, 1e4, -1e4, ... */
  /* the feature plans' inputs (test_cuda_feat.h): bias dims and dtype ("1NTS/f32"), mask pattern and dims,
     positions pattern, soft-cap, NaN where every pair is masked */
  const char *bias;
  int mpat;
  const char *mdims;
  int pos;
  float cap;
  int nanm;
} tc_case;

#ifdef SINKATTN_WITH_CUDA
static double tc_rand(uint64_t *s) { /* splitmix64 -> U[0, 1) */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (double)((z ^ (z >> 31)) >> 11) * (1.0 / 9007199254740992.0);
}
#endif

#include "test_cuda_feat.h"

/* one case a line */
// clang-format off
static const tc_case tc_cases[] = {
    {.name = "odd 37x129", .dt = SA_BF16, .B = 2, .T = 37, .S = 129, .N = 4, .K = 4, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "odd 129x37 causal", .dt = SA_BF16, .B = 2, .T = 129, .S = 37, .N = 8, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10},
    {.name = "bottom-right lens", .dt = SA_BF16, .B = 2, .T = 64, .S = 200, .N = 4, .K = 1, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = -1, .wr = -1, .lens = 1, .sink_range = 10},
    {.name = "window 31,0", .dt = SA_BF16, .B = 1, .T = 200, .S = 200, .N = 8, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_TOP_LEFT, .wl = 31, .wr = 0, .sink_range = 10},
    {.name = "window 20,10 lens", .dt = SA_BF16, .B = 2, .T = 100, .S = 150, .N = 2, .K = 2, .H = 32, .Hv = 32, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_NONE, .wl = 20, .wr = 10, .lens = 1, .dlse = 1, .sink_range = 10},
    {.name = "segments", .dt = SA_BF16, .B = 2, .T = 96, .S = 96, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .segs = 1, .sink_range = 10},
    {.name = "segments causal lens", .dt = SA_BF16, .B = 2, .T = 130, .S = 130, .N = 6, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .lens = 1, .segs = 1, .dlse = 1, .sink_range = 10},
    {.name = "H96 causal", .dt = SA_BF16, .B = 1, .T = 150, .S = 150, .N = 2, .K = 1, .H = 96, .Hv = 96, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "H192", .dt = SA_BF16, .B = 1, .T = 70, .S = 90, .N = 2, .K = 2, .H = 192, .Hv = 192, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10},
    {.name = "H256 bottom-right", .dt = SA_BF16, .B = 1, .T = 65, .S = 97, .N = 2, .K = 1, .H = 256, .Hv = 256, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "H128 Hv64", .dt = SA_BF16, .B = 2, .T = 40, .S = 60, .N = 6, .K = 2, .H = 128, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10},
    {.name = "H64 Hv128 causal", .dt = SA_BF16, .B = 1, .T = 50, .S = 80, .N = 4, .K = 2, .H = 64, .Hv = 128, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "H16 causal", .dt = SA_BF16, .B = 2, .T = 45, .S = 45, .N = 4, .K = 2, .H = 16, .Hv = 16, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .lens = 1, .dlse = 1, .sink_range = 10},
    {.name = "H32 Hv256", .dt = SA_BF16, .B = 1, .T = 33, .S = 47, .N = 2, .K = 1, .H = 32, .Hv = 256, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "f16 causal", .dt = SA_F16, .B = 2, .T = 77, .S = 77, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10},
    {.name = "f16 window H128", .dt = SA_F16, .B = 1, .T = 160, .S = 160, .N = 4, .K = 4, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_TOP_LEFT, .wl = 63, .wr = 0, .lens = 1, .sink_range = 10},
    {.name = "f16 H256", .dt = SA_F16, .B = 1, .T = 40, .S = 70, .N = 2, .K = 2, .H = 256, .Hv = 256, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "sinks +-50", .dt = SA_BF16, .B = 2, .T = 64, .S = 64, .N = 4, .K = 4, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 50},
    {.name = "sinks +-50 causal f16", .dt = SA_F16, .B = 1, .T = 70, .S = 70, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .sink_range = 50},
    {.name = "diag_offset 150 window", .dt = SA_BF16, .B = 1, .T = 64, .S = 256, .N = 2, .K = 1, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = 100, .wr = -1, .diag = 150, .sink_range = 10},
    {.name = "diag_offset -20 vanilla", .dt = SA_BF16, .B = 1, .T = 64, .S = 64, .N = 2, .K = 1, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .diag = -20, .dlse = 1, .sink_range = 10},
    {.name = "clamped lens vanilla", .dt = SA_BF16, .B = 3, .T = 50, .S = 70, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .lens = 2, .dlse = 1, .sink_range = 10},
    {.name = "clamped lens learnable BR", .dt = SA_BF16, .B = 3, .T = 50, .S = 70, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = -1, .wr = -1, .lens = 2, .dlse = 1, .sink_range = 10},
    {.name = "S = 0", .dt = SA_BF16, .B = 1, .T = 16, .S = 0, .N = 2, .K = 1, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10},
    {.name = "T = 0", .dt = SA_BF16, .B = 1, .T = 0, .S = 16, .N = 2, .K = 1, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "GQA 8 bottom-right", .dt = SA_BF16, .B = 1, .T = 33, .S = 100, .N = 8, .K = 1, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10},
    {.name = "GQA 3 window BR lens segs", .dt = SA_BF16, .B = 2, .T = 90, .S = 120, .N = 6, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = 40, .wr = 5, .lens = 1, .segs = 1, .dlse = 1, .sink_range = 10},
    {.name = "decode T = 1", .dt = SA_BF16, .B = 2, .T = 1, .S = 300, .N = 8, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "512 causal H128", .dt = SA_BF16, .B = 1, .T = 512, .S = 512, .N = 2, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10},
    {.name = "gpt-oss window", .dt = SA_BF16, .B = 1, .T = 300, .S = 300, .N = 8, .K = 1, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = 127, .wr = 0, .sink_range = 10},
    {.name = "300x700 BR window lens", .dt = SA_BF16, .B = 1, .T = 300, .S = 700, .N = 4, .K = 1, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = 128, .wr = 0, .lens = 1, .sink_range = 10},
    {.name = "special sinks", .dt = SA_BF16, .B = 1, .T = 40, .S = 40, .N = 8, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 0},
    /* a window wider than the problem with a large negative diag_offset: the kernels' cap of "unbounded" windows
       must count the shift (it did not: hi = i - 500 + 402 cut every key of rows < 98) */
    {.name = "diag_offset -500 window 1000", .dt = SA_BF16, .B = 1, .T = 100, .S = 300, .N = 2, .K = 1, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = 1000, .wr = 1000, .diag = -500, .dlse = 1, .sink_range = 10},
    /* float32: the portable kernels' f32 instantiations (cuda.*.portable.f32), inputs rounded to bf16 */
    {.name = "f32 causal GQA lens", .dt = SA_F32, .B = 2, .T = 130, .S = 130, .N = 8, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .lens = 1, .dlse = 1, .sink_range = 10},
    {.name = "f32 H128 window obo", .dt = SA_F32, .B = 1, .T = 200, .S = 200, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_TOP_LEFT, .wl = 31, .wr = 0, .sink_range = 10},
    {.name = "f32 H16 +-50 vanilla BR", .dt = SA_F32, .B = 2, .T = 45, .S = 77, .N = 4, .K = 4, .H = 16, .Hv = 16, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 50},
    {.name = "f32 H256 +-50 clamped lens", .dt = SA_F32, .B = 3, .T = 50, .S = 70, .N = 2, .K = 1, .H = 256, .Hv = 256, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .lens = 2, .dlse = 1, .sink_range = -50},
    {.name = "f32 segments H96", .dt = SA_F32, .B = 2, .T = 96, .S = 96, .N = 4, .K = 2, .H = 96, .Hv = 96, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .segs = 1, .sink_range = 10},
    {.name = "f32 H128 Hv64 special sinks", .dt = SA_F32, .B = 1, .T = 40, .S = 60, .N = 8, .K = 2, .H = 128, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 0},
    {.name = "f32 512 causal H128", .dt = SA_F32, .B = 1, .T = 512, .S = 512, .N = 2, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10},
};
// clang-format on

/* Inside the scope of the sm_90a forward and backward (src/cuda/hopper/fwd.cu, hopper/bwd_twopass.cu: bf16, H == Hv
   in {64, 128}, T and S multiples of 128; any causal alignment, window, diag_offset, lengths and segment ids):
   every legal plan of each case (the Hopper ones and the portable kernels) against the reference: out, lse, and
   dq, dk, dv, dsinks of three backward runs that must agree bitwise. The backward covers GQA 1 to 8 (64 / 8
   heads), T < S and T > S top-left causal (keys past T: zero dk, dv), the three softmax types, and dlse != 0. */
/* one case a line */
// clang-format off
static const tc_case tc_hopper_cases[] = {
    {.name = "hop H128 256 GQA2", .dt = SA_BF16, .B = 2, .T = 256, .S = 256, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "hop H128 256x512 causal +-50", .dt = SA_BF16, .B = 1, .T = 256, .S = 512, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .sink_range = 50},
    {.name = "hop H128 512x256 causal obo", .dt = SA_BF16, .B = 1, .T = 512, .S = 256, .N = 4, .K = 4, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "hop H128 256x512 vanilla", .dt = SA_BF16, .B = 1, .T = 256, .S = 512, .N = 2, .K = 1, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "hop H64 256 causal vanilla", .dt = SA_BF16, .B = 2, .T = 256, .S = 256, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "hop H64 256x512 +-50", .dt = SA_BF16, .B = 1, .T = 256, .S = 512, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = 50},
    {.name = "hop H64 384 BR=TL GQA3 obo", .dt = SA_BF16, .B = 1, .T = 384, .S = 384, .N = 6, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "hop H64 512x256 causal", .dt = SA_BF16, .B = 1, .T = 512, .S = 256, .N = 2, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "hop H128 special sinks", .dt = SA_BF16, .B = 1, .T = 128, .S = 256, .N = 8, .K = 4, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 0},
    {.name = "hop H128 GQA 64/8 128x256 dlse", .dt = SA_BF16, .B = 1, .T = 128, .S = 256, .N = 64, .K = 8, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .dlse = 1, .sink_range = -10},
    {.name = "hop H64 GQA 64/8 256 causal dlse", .dt = SA_BF16, .B = 1, .T = 256, .S = 256, .N = 64, .K = 8, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = -10},
    {.name = "hop H128 384x128 causal dlse", .dt = SA_BF16, .B = 2, .T = 384, .S = 128, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = -10},
    {.name = "hop H64 128x384 causal obo dlse", .dt = SA_BF16, .B = 2, .T = 128, .S = 384, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10},
    {.name = "hop H128 256 causal van GQA4 dlse", .dt = SA_BF16, .B = 1, .T = 256, .S = 256, .N = 4, .K = 1, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10},
    {.name = "hop H64 384x256 obo GQA4 dlse", .dt = SA_BF16, .B = 1, .T = 384, .S = 256, .N = 8, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10},
    /* position masks (sa_hop_mask): windows, bottom-right with T != S, diag_offset (ring attention's blocks) */
    {.name = "hop gpt-oss window 127,0 GQA8", .dt = SA_BF16, .B = 1, .T = 512, .S = 512, .N = 16, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = 127, .wr = 0, .dlse = 1, .sink_range = -10},
    {.name = "hop H128 window 64,32", .dt = SA_BF16, .B = 2, .T = 384, .S = 384, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = 64, .wr = 32, .dlse = 1, .sink_range = 10},
    {.name = "hop H64 BR 256x512 causal", .dt = SA_BF16, .B = 1, .T = 256, .S = 512, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10},
    {.name = "hop H128 BR 512x256 causal van", .dt = SA_BF16, .B = 1, .T = 512, .S = 256, .N = 4, .K = 4, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10},
    {.name = "hop H64 BR 128x384 window 100,0 obo", .dt = SA_BF16, .B = 1, .T = 128, .S = 384, .N = 4, .K = 1, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = 100, .wr = 0, .sink_range = 10},
    {.name = "hop H64 diag -200 causal (empty rows)", .dt = SA_BF16, .B = 1, .T = 512, .S = 512, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .diag = -200, .dlse = 1, .sink_range = 10},
    {.name = "hop H128 diag -300 vanilla (empty rows)", .dt = SA_BF16, .B = 1, .T = 384, .S = 384, .N = 2, .K = 1, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .diag = -300, .sink_range = 10},
    {.name = "hop H64 diag 200 window 50,20", .dt = SA_BF16, .B = 2, .T = 256, .S = 640, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = 50, .wr = 20, .diag = 200, .dlse = 1, .sink_range = 50},
    {.name = "hop H128 diag 5000 causal (full)", .dt = SA_BF16, .B = 1, .T = 256, .S = 256, .N = 2, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .diag = 5000, .sink_range = 10},
    /* per-batch lengths (mask kind 3): random q_len / kv_len in [0.3, 1) of T / S (lens 1), or -3, 1e9, -5
       clamped (lens 2: a batch without rows, one full, one without keys); padding is NaN */
    {.name = "hop H128 lens 256x384 +-50", .dt = SA_BF16, .B = 2, .T = 256, .S = 384, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .lens = 1, .dlse = 1, .sink_range = 50},
    {.name = "hop H64 lens causal GQA4 dlse", .dt = SA_BF16, .B = 3, .T = 384, .S = 384, .N = 8, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .lens = 1, .dlse = 1, .sink_range = -10},
    {.name = "hop H64 lens BR window 100,0 obo", .dt = SA_BF16, .B = 2, .T = 256, .S = 512, .N = 4, .K = 1, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = 100, .wr = 0, .lens = 1, .sink_range = 10},
    {.name = "hop H128 clamped lens BR causal", .dt = SA_BF16, .B = 3, .T = 256, .S = 384, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = -1, .wr = -1, .lens = 2, .dlse = 1, .sink_range = 10},
    {.name = "hop H64 lens vanilla window 64,32", .dt = SA_BF16, .B = 2, .T = 512, .S = 256, .N = 2, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_NONE, .wl = 64, .wr = 32, .lens = 1, .dlse = 1, .sink_range = 10},
    {.name = "hop H128 lens causal diag -50 obo", .dt = SA_BF16, .B = 2, .T = 384, .S = 256, .N = 4, .K = 4, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .diag = -50, .lens = 1, .dlse = 1, .sink_range = 10},
    {.name = "hop H64 clamped lens", .dt = SA_BF16, .B = 3, .T = 128, .S = 256, .N = 2, .K = 1, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .lens = 2, .sink_range = 10},
    /* segment ids (mask kind 4 in both directions): short runs, unsorted ids
       from {0, 1, 2}, long runs across tiles; with lengths, causal alignments, a window, GQA, 192-row CTAs */
    {.name = "hop H128 segs causal", .dt = SA_BF16, .B = 2, .T = 256, .S = 384, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .segs = 1, .dlse = 1, .sink_range = 50},
    {.name = "hop H64 segs unsorted GQA2", .dt = SA_BF16, .B = 1, .T = 384, .S = 256, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .segs = 2, .sink_range = 10},
    {.name = "hop H128 segs long runs lens BR", .dt = SA_BF16, .B = 2, .T = 512, .S = 640, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = -1, .wr = -1, .lens = 1, .segs = 3, .dlse = 1, .sink_range = 10},
    {.name = "hop H64 segs long window 100,0 640", .dt = SA_BF16, .B = 1, .T = 640, .S = 640, .N = 4, .K = 1, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_TOP_LEFT, .wl = 100, .wr = 0, .segs = 3, .sink_range = 10},
    {.name = "hop H128 segs unsorted vanilla", .dt = SA_BF16, .B = 1, .T = 256, .S = 256, .N = 2, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .segs = 2, .dlse = 1, .sink_range = 10},
    {.name = "hop H64 segs clamped lens causal", .dt = SA_BF16, .B = 3, .T = 384, .S = 384, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .lens = 2, .segs = 1, .dlse = 1, .sink_range = -10},
    {.name = "hop H128 segs packed 8 causal", .dt = SA_BF16, .B = 2, .T = 1024, .S = 1024, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .segs = 4, .dlse = 1, .sink_range = -10},
    {.name = "hop H64 segs packed 8 GQA4 lens BR", .dt = SA_BF16, .B = 2, .T = 1024, .S = 1280, .N = 8, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = -1, .wr = -1, .lens = 1, .segs = 4, .sink_range = 10},
    {.name = "hop H64 segs long runs 1024", .dt = SA_BF16, .B = 1, .T = 1024, .S = 1024, .N = 4, .K = 1, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .segs = 3, .dlse = 1, .sink_range = 10},
    /* the forward's tiles: 192-row CTAs at H64 (T = 640 = 3 x 192 + 64: a last CTA of one warpgroup), 176-key
       tiles at H128 without a mask (S = 128: one partial tile; 384 = 176 + 176 + 32; 1408 = 8 x 176 exactly) */
    {.name = "hop H64 640 causal window 127,0 GQA2", .dt = SA_BF16, .B = 1, .T = 640, .S = 640, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = 127, .wr = 0, .dlse = 1, .sink_range = 10},
    {.name = "hop H64 640x384 obo (1-wg last CTA)", .dt = SA_BF16, .B = 2, .T = 640, .S = 384, .N = 4, .K = 1, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "hop H64 lens causal 640 partial", .dt = SA_BF16, .B = 3, .T = 640, .S = 640, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .lens = 1, .dlse = 1, .sink_range = 10},
    {.name = "hop H64 lens BR window 200,0 640x768", .dt = SA_BF16, .B = 2, .T = 640, .S = 768, .N = 4, .K = 4, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_BOTTOM_RIGHT, .wl = 200, .wr = 0, .lens = 1, .sink_range = 10},
    {.name = "hop H128 384 (176+176+32)", .dt = SA_BF16, .B = 1, .T = 384, .S = 384, .N = 6, .K = 3, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .dlse = 1, .sink_range = -10},
    {.name = "hop H128 256x640 vanilla (3x176+112)", .dt = SA_BF16, .B = 2, .T = 256, .S = 640, .N = 4, .K = 4, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "hop H128 128x128 one 176-key tile", .dt = SA_BF16, .B = 1, .T = 128, .S = 128, .N = 2, .K = 1, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 50},
    {.name = "hop H128 256x1408 (8x176 exact)", .dt = SA_BF16, .B = 1, .T = 256, .S = 1408, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = 10},
    /* the one-pass backward (hopper/onepass128.cu: H128, no lengths / window, causal none or top-left on the diagonal,
       S / 128 <= SMs and, without a mask, G T / 64 >= S / 128) takes the H128 cases above that fit that scope
       (10 of them; 256x640 and 256x1408 have fewer query tiles than key blocks and keep the two passes) and
       these: 4 key blocks a head in the causal order, 5 in staggered starts (d = 20 / 5 = 4 tiles apart) */
    {.name = "hop H128 512 causal GQA2 dlse (1 pass)", .dt = SA_BF16, .B = 1, .T = 512, .S = 512, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10},
    {.name = "hop H128 640 vanilla GQA2 (1 pass)", .dt = SA_BF16, .B = 2, .T = 640, .S = 640, .N = 4, .K = 2, .H = 128, .Hv = 128, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = 10},
    /* the H64 one pass (hopper/onepass64.cu: 192-key CTAs of 3 warpgroups, the head split hs = 2 when G is even on
       these small grids) takes the H64 cases above without lengths / window / BR / diag_offset, and these: a
       head's last key block of 64 keys (S 1024, 640: 1 warpgroup) or 128 (S 512: 2), 6 whole blocks with and
       without the split (G 8, G 3), causal T > S and T < S (keys past T: zero dk, dv; skipped warpgroups) */
    {.name = "hop H64 512x1024 causal GQA2 dlse (1 pass)", .dt = SA_BF16, .B = 1, .T = 512, .S = 1024, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10},
    {.name = "hop H64 384x640 vanilla (1 pass)", .dt = SA_BF16, .B = 1, .T = 384, .S = 640, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "hop H64 512 causal B2 +-50 (1 pass)", .dt = SA_BF16, .B = 2, .T = 512, .S = 512, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = -10},
    {.name = "hop H64 1152 GQA8 (1 pass, split)", .dt = SA_BF16, .B = 1, .T = 1152, .S = 1152, .N = 8, .K = 1, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = 50},
    {.name = "hop H64 1152 causal GQA3 van (1 pass)", .dt = SA_BF16, .B = 1, .T = 1152, .S = 1152, .N = 6, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_VANILLA, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = 10},
    {.name = "hop H64 768x256 causal obo (1 pass)", .dt = SA_BF16, .B = 1, .T = 768, .S = 256, .N = 4, .K = 2, .H = 64, .Hv = 64, .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .sink_range = 10},
};
// clang-format on

/* Production schedules: the natural grid with several work tiles a CTA (132 SMs), the one passes with 32..43 key
   blocks a head co-resident, the two passes' 3-warpgroup tiles on a grid of >= 4 CTAs an SM. */
/* one case a line */
// clang-format off
static const tc_case tc_prod_cases[] = {
    {.name = "prod H64 4096 GQA 8/2 causal", .dt = SA_BF16, .B = 1, .T = 4096, .S = 4096, .N = 8, .K = 2, .H = 64,
     .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .dlse = 1, .sink_range = -10},
    {.name = "prod H128 4096 N4", .dt = SA_BF16, .B = 1, .T = 4096, .S = 4096, .N = 4, .K = 4, .H = 128, .Hv = 128,
     .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_NONE, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "prod H64 8192 N2 causal", .dt = SA_BF16, .B = 1, .T = 8192, .S = 8192, .N = 2, .K = 1, .H = 64, .Hv = 64,
     .sm = SA_SOFTMAX_OFF_BY_ONE, .causal = SA_CAUSAL_TOP_LEFT, .wl = -1, .wr = -1, .sink_range = 10},
    {.name = "prod H64 4096 window 127,0 GQA 8/1", .dt = SA_BF16, .B = 1, .T = 4096, .S = 4096, .N = 8, .K = 1, .H = 64,
     .Hv = 64, .sm = SA_SOFTMAX_LEARNABLE, .causal = SA_CAUSAL_TOP_LEFT, .wl = 127, .wr = 0, .sink_range = 50},
};
// clang-format on

static const char *tc_plan_sel, *tc_case_sel; /* --plan, --case substrings */

/* --plan=SEL: a comma-separated list of plan-name substrings, an entry ending in '$' matching the whole name (so
   that hopper.fwd.features$ leaves out hopper.fwd.features.tma); no --plan: every plan. */
static int tc_plan_selected(const char *name) {
  if (!tc_plan_sel) return 1;
  const size_t len = strlen(name);
  for (const char *e = tc_plan_sel; *e;) {
    const char *end = strchr(e, ',');
    const size_t n = end ? (size_t)(end - e) : strlen(e);
    const int exact = n > 0 && e[n - 1] == '$';
    const size_t m = exact ? n - 1 : n;
    if (exact && len == m && !strncmp(name, e, m)) return 1;
    for (size_t i = 0; !exact && m > 0 && i + m <= len; i++)
      if (!strncmp(name + i, e, m)) return 1;
    e += n + (end != NULL);
  }
  return 0;
}

#ifdef SINKATTN_WITH_CUDA
static int tc_pass, tc_fail;
static const char *tc_plan_now = ""; /* the plan a failure message names */

/* The description of the last plan of kind `which` starts with `name` and a space. */
static int tc_plan_ran(int which, const char *name) {
  const char *last = sa_plan_last(which);
  const size_t n = strlen(name);
  return strncmp(last, name, n) == 0 && last[n] == ' ';
}
#define TC_CUDA(x)                                                                    \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      printf("FATAL %s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

static void tc_check(int ok, const tc_case *c, const char *fmt, double x, double tol) {
  if (ok) {
    tc_pass++;
    return;
  }
  tc_fail++;
  printf("FAIL [%s] [%s] ", c->name, tc_plan_now);
  printf(fmt, x, tol);
  printf("\n");
}

static void *tc_dev(size_t bytes, const void *host) {
  void *d = NULL;
  TC_CUDA(cudaMalloc(&d, bytes ? bytes : 16));
  if (host && bytes) TC_CUDA(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  else TC_CUDA(cudaMemset(d, 0xff, bytes ? bytes : 16)); /* NaN in f32, f16 and bf16 */
  return d;
}
static void tc_get(void *host, const void *dev, size_t bytes) {
  if (bytes) TC_CUDA(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
}

/* ||x - r|| / ||r|| over n elements of dtype t; any non-finite x where r is finite counts as failure. */
static double tc_relerr(const void *x, const void *r, sa_dtype t, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    double a = sa_load(x, t, i), b = sa_load(r, t, i);
    if (!isfinite(b)) continue;
    if (!isfinite(a)) return INFINITY;
    num += (a - b) * (a - b);
    den += b * b;
  }
  if (den == 0) return sqrt(num) > 1e-6 ? INFINITY : 0.0;
  return sqrt(num / den);
}

static void tc_run(const tc_case *c, uint64_t seed) {
  const int64_t B = c->B, T = c->T, S = c->S, N = c->N, K = c->K, H = c->H, Hv = c->Hv;
  const size_t es = sa_dtype_size(c->dt);
  const int64_t nq = B * T * N * H, nk = B * S * K * H, nv = B * S * K * Hv, no = B * T * N * Hv, nl = B * N * T;
  uint64_t s = seed;
  void *q = malloc(nq * es + 16), *k = malloc(nk * es + 16), *v = malloc(nv * es + 16);
  void *dout = malloc(no * es + 16), *out_r = malloc(no * es + 16), *out_c = malloc(no * es + 16);
  float *lse_r = malloc(nl * 4 + 16), *lse_c = malloc(nl * 4 + 16), *dlse = malloc(nl * 4 + 16);
  float *sinks = malloc(N * 4 + 16), *ds_r = malloc(N * 4 + 16), *ds_c = malloc(N * 4 + 16);
  void *g_r[3], *g_c[3][3];
  int64_t gn[3] = {nq, nk, nv};
  for (int x = 0; x < 3; x++) {
    g_r[x] = malloc(gn[x] * es + 16);
    for (int y = 0; y < 3; y++) g_c[y][x] = malloc(gn[x] * es + 16);
  }
  int32_t *ql = malloc(B * 4 + 16), *kl = malloc(B * 4 + 16), *qs = malloc(B * T * 4 + 16),
          *ks = malloc(B * S * 4 + 16);
  float ds_c2[128], ds_c3[128]; /* N <= 128 in the tables (64 now) */

  for (int64_t b = 0; b < B; b++) {
    ql[b] = (int32_t)(T * (0.3 + 0.7 * tc_rand(&s)));
    kl[b] = (int32_t)(S * (0.3 + 0.7 * tc_rand(&s)));
    if (c->lens == 2) { /* out-of-range values clamp: -3 acts as 0, 1e9 as the full length */
      if (b == 0) ql[b] = -3;
      if (b == 1) {
        ql[b] = 1000000000;
        kl[b] = 1000000000;
      }
      if (b == 2) kl[b] = -5;
    }
  }
  for (int64_t b = 0; b < B; b++) { /* segments: runs of random length, ids increasing in both (segs 1, 3), or
                                        ids at random (segs 2); rows whose id no key has see nothing */
    const double step = c->segs == 3 ? 0.006 : 0.05;
    int32_t id = 0;
    for (int64_t i = 0; i < T; i++) {
      if (tc_rand(&s) < step) id++;
      qs[b * T + i] = c->segs == 2 ? (int32_t)(3 * tc_rand(&s)) : c->segs == 4 ? (int32_t)(8 * i / T) : id;
    }
    id = 0;
    for (int64_t j = 0; j < S; j++) {
      if (tc_rand(&s) < step * 0.8) id++;
      ks[b * S + j] = c->segs == 2 ? (int32_t)(3 * tc_rand(&s)) : c->segs == 4 ? (int32_t)(8 * j / S) : id;
    }
  }
  sa_attn a;
  sa_attn_init(&a);
  a.dtype = c->dt;
  a.batch = B;
  a.q_len = T;
  a.kv_len = S;
  a.q_heads = N;
  a.kv_heads = K;
  a.head_dim = H;
  a.v_head_dim = Hv;
  a.softmax = c->sm;
  a.causal = c->causal;
  a.window_left = c->wl;
  a.window_right = c->wr;
  a.diag_offset = c->diag;
  int64_t qlen_of[8], klen_of[8];
  for (int64_t b = 0; b < B; b++) {
    qlen_of[b] = c->lens ? sa_clamp64(ql[b], 0, T) : T;
    klen_of[b] = c->lens ? sa_clamp64(kl[b], 0, S) : S;
  }
  /* data: U(-2, 2) so scores spread over a few units; padding rows NaN (they must never be read) */
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < T; i++)
      for (int64_t e = 0; e < N * H; e++) {
        int64_t idx = (b * T + i) * N * H + e;
        sa_store(q, c->dt, idx, i < qlen_of[b] ? (float)(4 * tc_rand(&s) - 2) : NAN);
      }
  for (int64_t b = 0; b < B; b++)
    for (int64_t j = 0; j < S; j++) {
      for (int64_t e = 0; e < K * H; e++)
        sa_store(k, c->dt, (b * S + j) * K * H + e, j < klen_of[b] ? (float)(4 * tc_rand(&s) - 2) : NAN);
      for (int64_t e = 0; e < K * Hv; e++)
        sa_store(v, c->dt, (b * S + j) * K * Hv + e, j < klen_of[b] ? (float)(2 * tc_rand(&s) - 1) : NAN);
    }
  for (int64_t i = 0; i < no; i++) sa_store(dout, c->dt, i, (float)(2 * tc_rand(&s) - 1));
  for (int64_t i = 0; i < nl; i++) dlse[i] = (float)(2 * tc_rand(&s) - 1);
  static const float special[8] = {INFINITY, -INFINITY, 1e4f, -1e4f, 0.0f, 3.0f, -3.0f, 50.0f};
  for (int64_t n = 0; n < N; n++)
    sinks[n] = c->sink_range != 0 ? (float)((2 * tc_rand(&s) - 1) * fabsf(c->sink_range)) : special[n % 8];
  if (c->sink_range < 0) { /* a sink far above every score (P ~ 0) and one far below (no sink mass) */
    sinks[0] = 50.0f;
    if (N > 1) sinks[1] = -50.0f;
  }
  a.sinks = c->sm == SA_SOFTMAX_LEARNABLE ? sinks : NULL;
  a.q_lens = c->lens ? ql : NULL;
  a.kv_lens = c->lens ? kl : NULL;
  a.q_segment_ids = c->segs ? qs : NULL;
  a.kv_segment_ids = c->segs ? ks : NULL;
  tc_feat_bufs fb; /* bias, mask, positions, soft-cap (drawn after the rest: the other cases keep their data) */
  tc_feat_make(c, &a, &fb, &s);
  tc_feat_nan(c, &a, k, &fb);
  const size_t nbias = (size_t)fb.nbias, bes = fb.bias ? sa_dtype_size(a.bias_dtype) : 0;
  float *dbias_r = fb.bias ? malloc(nbias * 4 + 16) : NULL, *dbias_c[3] = {NULL, NULL, NULL};
  for (int y = 0; y < 3 && fb.bias; y++) dbias_c[y] = malloc(nbias * 4 + 16);

  /* reference */
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out_r;
  a.lse = lse_r;
  sa_status st = sa_attn_fwd(&a, SA_BACKEND_REF, NULL);
  sa_attn_grad g = {0};
  g.dout = dout;
  g.dlse = c->dlse ? dlse : NULL;
  g.dq = g_r[0];
  g.dk = g_r[1];
  g.dv = g_r[2];
  g.dsinks = c->sm == SA_SOFTMAX_LEARNABLE ? ds_r : NULL;
  g.dbias = dbias_r;
  if (st == SA_OK) st = sa_attn_bwd(&a, &g, NULL, 0, SA_BACKEND_REF, NULL);
  tc_check(st == SA_OK, c, "reference failed %g %g", (double)st, 0);

  /* CUDA: device copies, outputs poisoned */
  sa_attn d = a;
  d.q = tc_dev(nq * es, q);
  d.k = tc_dev(nk * es, k);
  d.v = tc_dev(nv * es, v);
  d.out = tc_dev(no * es, NULL);
  d.lse = tc_dev(nl * 4, NULL);
  d.sinks = a.sinks ? tc_dev(N * 4, sinks) : NULL;
  d.q_lens = c->lens ? tc_dev(B * 4, ql) : NULL;
  d.kv_lens = c->lens ? tc_dev(B * 4, kl) : NULL;
  d.q_segment_ids = c->segs ? tc_dev(B * T * 4, qs) : NULL;
  d.kv_segment_ids = c->segs ? tc_dev(B * S * 4, ks) : NULL;
  d.bias = fb.bias ? tc_dev(nbias * bes, fb.bias) : NULL;
  d.mask = fb.mask ? tc_dev((size_t)fb.nmask, fb.mask) : NULL;
  d.q_positions = fb.qp ? tc_dev(B * T * 4, fb.qp) : NULL;
  d.kv_positions = fb.kp ? tc_dev(B * S * 4, fb.kp) : NULL;
  const char *fplans[16], *bplans[16];
  const int nf = sa_plan_list(&d, SA_PLAN_FWD, SA_BACKEND_CUDA, fplans, 16);
  const int nb = sa_plan_list(&d, SA_PLAN_BWD, SA_BACKEND_CUDA, bplans, 16);
  tc_check(nf > 0 && nb > 0, c, "no CUDA plan (%g fwd, %g bwd)", nf, nb);
  double lerr = 0;
  for (int fi = 0; fi < nf && fi < 16; fi++) {
    if (!tc_plan_selected(fplans[fi])) continue;
    tc_plan_now = fplans[fi];
    sa_plan_force(SA_PLAN_FWD, fplans[fi]);
    TC_CUDA(cudaMemset((void *)d.out, 0xff, no * es > 0 ? no * es : 16));
    TC_CUDA(cudaMemset(d.lse, 0xff, nl * 4 > 0 ? nl * 4 : 16));
    st = sa_attn_fwd(&d, SA_BACKEND_CUDA, NULL);
    tc_check(st == SA_OK, c, "CUDA forward status %g %g", (double)st, 0);
    if (st != SA_OK) printf("  %s\n", sa_last_error());
    tc_check(tc_plan_ran(SA_PLAN_FWD, fplans[fi]), c, "forward ran another plan (%g %g)", 0, 0);
    TC_CUDA(cudaDeviceSynchronize());
    tc_get(out_c, d.out, no * es);
    tc_get(lse_c, d.lse, nl * 4);
    /* float32 runs on inputs rounded to bf16 (common.cuh, sa_f32in): bf16's bound on out, and on lse the error of
       that rounding (6e-4 at most in an fp64 model of these cases' data, against 1e-4 for 16-bit inputs, whose
       rounding the reference shares) */
    const double tol = c->dt == SA_F16 ? 1e-2 : 2e-2, ltol = c->dt == SA_F32 ? 2e-3 : 1e-4;
    double e = tc_relerr(out_c, out_r, c->dt, no);
    tc_check(e <= tol, c, "out rel err %.3g > %.3g", e, tol);
    lerr = 0;
    int lbad = 0;
    for (int64_t i = 0; i < nl; i++) {
      if (isnan(lse_r[i]) != isnan(lse_c[i]) || (isinf(lse_r[i]) && lse_r[i] != lse_c[i])) lbad++;
      else if (isfinite(lse_r[i])) lerr = fmax(lerr, fabs(lse_c[i] - lse_r[i]) / fmax(1.0, fabs(lse_r[i])));
    }
    tc_check(lbad == 0, c, "lse: %g non-finite mismatches (tol %g)", lbad, 0);
    tc_check(lerr <= ltol, c, "lse max rel err %.3g > %.3g", lerr, ltol);
    /* empty rows (i >= q_len): out exactly 0, lse exactly the sink logit */
    int ebad = 0;
    for (int64_t b = 0; b < B; b++)
      for (int64_t i = qlen_of[b]; i < T; i++)
        for (int64_t n = 0; n < N; n++) {
          float sk = sa_sink_logit(&a, n);
          uint32_t u1, u2;
          memcpy(&u1, &lse_c[(b * N + n) * T + i], 4);
          memcpy(&u2, &sk, 4);
          if (u1 != u2) ebad++;
          for (int64_t x = 0; x < Hv; x++)
            if (sa_load(out_c, c->dt, ((b * T + i) * N + n) * Hv + x) != 0.0f) ebad++;
        }
    if (c->mpat || c->pos) /* rows that the mask array or the positions leave without a key: exact too */
      for (int64_t b = 0; b < B; b++)
        for (int64_t n = 0; n < N; n++)
          for (int64_t i = 0; i < qlen_of[b]; i++) {
            int any = 0;
            for (int64_t j = 0; j < S && !any; j++) any = sa_attn_valid(&a, b, n, i, j);
            if (any) continue;
            const float sk = sa_sink_logit(&a, n);
            if (memcmp(&lse_c[(b * N + n) * T + i], &sk, 4) != 0) ebad++;
            for (int64_t x = 0; x < Hv; x++)
              if (sa_load(out_c, c->dt, ((b * T + i) * N + n) * Hv + x) != 0.0f) ebad++;
          }
    tc_check(ebad == 0, c, "empty rows: %g elements not exactly out 0 / lse sink (tol %g)", ebad, 0);
    printf("%-40s %-30s out %.2e  lse %.2e\n", c->name, fplans[fi], tc_relerr(out_c, out_r, c->dt, no), lerr);
  }
  sa_plan_force(SA_PLAN_FWD, NULL);

  sa_attn_grad dg = {0};

  /* backward from the reference's out and lse, so only the backward kernels are compared */
  TC_CUDA(cudaMemcpy(d.out, out_r, no * es, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemcpy(d.lse, lse_r, nl * 4, cudaMemcpyHostToDevice));
  dg.dout = tc_dev(no * es, dout);
  dg.dlse = c->dlse ? tc_dev(nl * 4, dlse) : NULL;
  for (int bi = 0; bi < nb && bi < 16; bi++) {
    if (!tc_plan_selected(bplans[bi])) continue;
    tc_plan_now = bplans[bi];
    sa_plan_force(SA_PLAN_BWD, bplans[bi]);
    for (int rep = 0; rep < 3; rep++) {
      dg.dq = tc_dev(nq * es, NULL);
      dg.dk = tc_dev(nk * es, NULL);
      dg.dv = tc_dev(nv * es, NULL);
      dg.dsinks = g.dsinks ? tc_dev(N * 4, NULL) : NULL;
      dg.dbias = fb.bias ? (float *)tc_dev(nbias * 4, NULL) : NULL;
      size_t ws = sa_attn_bwd_workspace_size(&d, SA_BACKEND_CUDA);
      void *w = tc_dev(ws, NULL);
      st = sa_attn_bwd(&d, &dg, w, ws, SA_BACKEND_CUDA, NULL);
      tc_check(st == SA_OK, c, "CUDA backward status %g %g", (double)st, 0);
      if (st != SA_OK) printf("  %s\n", sa_last_error());
      tc_check(tc_plan_ran(SA_PLAN_BWD, bplans[bi]), c, "backward ran another plan (%g %g)", 0, 0);
      TC_CUDA(cudaDeviceSynchronize());
      tc_get(g_c[rep][0], dg.dq, nq * es);
      tc_get(g_c[rep][1], dg.dk, nk * es);
      tc_get(g_c[rep][2], dg.dv, nv * es);
      if (dg.dsinks) tc_get(rep == 0 ? ds_c : rep == 1 ? ds_c2 : ds_c3, dg.dsinks, N * 4);
      if (dg.dbias) {
        tc_get(dbias_c[rep], dg.dbias, nbias * 4);
        TC_CUDA(cudaFree(dg.dbias));
      }
      TC_CUDA(cudaFree(dg.dq));
      TC_CUDA(cudaFree(dg.dk));
      TC_CUDA(cudaFree(dg.dv));
      TC_CUDA(cudaFree(w));
      if (dg.dsinks) TC_CUDA(cudaFree(dg.dsinks));
    }
    static const char *const gname[3] = {"dq", "dk", "dv"};
    const double gtol = c->dt == SA_F16 ? 2e-2 : 3e-2;
    for (int x = 0; x < 3; x++) {
      if (x == 0 && c->nanm == 2) { /* dS K: the zero dS of a NaN key row is NaN in dq, as in jax.nn's gradient */
        printf("%-40s %-30s dq not compared (NaN in masked keys)\n", c->name, bplans[bi]);
        continue;
      }
      double e = tc_relerr(g_c[0][x], g_r[x], c->dt, gn[x]);
      char msg[96];
      snprintf(msg, sizeof msg, "%s rel err %%.3g > %%.3g", gname[x]);
      tc_check(e <= gtol, c, msg, e, gtol);
      int same = memcmp(g_c[0][x], g_c[1][x], gn[x] * es) == 0 && memcmp(g_c[0][x], g_c[2][x], gn[x] * es) == 0;
      snprintf(msg, sizeof msg, "%s differs bitwise between runs (%%g %%g)", gname[x]);
      tc_check(same, c, msg, 0, 0);
    }
    if (g.dsinks) {
      double num = 0, den = 0;
      int bad = 0;
      for (int64_t n = 0; n < N; n++) {
        if (!isfinite(ds_r[n])) continue; /* +inf sink: unspecified */
        if (!isfinite(ds_c[n])) bad++;
        num += (ds_c[n] - ds_r[n]) * (ds_c[n] - ds_r[n]);
        den += (double)ds_r[n] * ds_r[n];
      }
      double de = bad ? INFINITY : den > 0 ? sqrt(num / den) : sqrt(num);
      tc_check(de <= 2e-3, c, "dsinks rel err %.3g > %.3g", de, 2e-3);
      tc_check(memcmp(ds_c, ds_c2, N * 4) == 0 && memcmp(ds_c, ds_c3, N * 4) == 0, c,
               "dsinks differ bitwise between runs (%g %g)", 0, 0);
    }
    if (fb.bias) { /* dbias: fp32, reduced over the bias's broadcast axes in a fixed order */
      const double e = tc_relerr(dbias_c[0], dbias_r, SA_F32, (int64_t)nbias);
      tc_check(e <= gtol, c, "dbias rel err %.3g > %.3g", e, gtol);
      tc_check(memcmp(dbias_c[0], dbias_c[1], nbias * 4) == 0 && memcmp(dbias_c[0], dbias_c[2], nbias * 4) == 0, c,
               "dbias differs bitwise between runs (%g %g)", 0, 0);
    }
    printf("%-40s %-30s dq %.2e  dk %.2e  dv %.2e\n", c->name, bplans[bi], tc_relerr(g_c[0][0], g_r[0], c->dt, nq),
           tc_relerr(g_c[0][1], g_r[1], c->dt, nk), tc_relerr(g_c[0][2], g_r[2], c->dt, nv));
  }
  sa_plan_force(SA_PLAN_BWD, NULL);
  const void *dp[] = {d.q,           d.k,      d.v,       d.out,           d.lse,
                      d.sinks,       d.q_lens, d.kv_lens, d.q_segment_ids, d.kv_segment_ids,
                      dg.dout,       dg.dlse,  d.bias,    d.mask,          d.q_positions,
                      d.kv_positions};
  for (size_t x = 0; x < sizeof dp / sizeof dp[0]; x++)
    if (dp[x]) TC_CUDA(cudaFree((void *)dp[x]));
  free(q);
  free(k);
  free(v);
  free(dout);
  free(out_r);
  free(out_c);
  free(lse_r);
  free(lse_c);
  free(dlse);
  free(sinks);
  free(ds_r);
  free(ds_c);
  free(ql);
  free(kl);
  free(qs);
  free(ks);
  tc_feat_free(&fb);
  free(dbias_r);
  for (int y = 0; y < 3; y++) free(dbias_c[y]);
  for (int x = 0; x < 3; x++) {
    free(g_r[x]);
    for (int y = 0; y < 3; y++) free(g_c[y][x]);
  }
}

/* What the backend refuses, with a message naming the field. */
static void tc_unsupported(void) {
  static const tc_case c = {.name = "unsupported",
                            .dt = SA_BF16,
                            .B = 1,
                            .T = 4,
                            .S = 4,
                            .N = 2,
                            .K = 1,
                            .H = 72,
                            .Hv = 72,
                            .sm = SA_SOFTMAX_VANILLA,
                            .causal = SA_CAUSAL_NONE,
                            .wl = -1,
                            .wr = -1,
                            .sink_range = 0};
  sa_attn a;
  sa_attn_init(&a);
  a.dtype = SA_BF16;
  a.batch = 1;
  a.q_len = 4;
  a.kv_len = 4;
  a.q_heads = 2;
  a.kv_heads = 1;
  a.head_dim = 72;
  a.v_head_dim = 64;
  sa_status s = sa_cuda_attn_supported(&a);
  tc_check(s == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), "head_dim 72"), &c, "head_dim 72 accepted (%g %g)", s, 0);
  a.head_dim = 64;
  a.dtype = SA_F32;
  s = sa_cuda_attn_supported(&a);
  tc_check(s == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), "SA_F32"), &c, "f32 accepted (%g %g)", s, 0);
}

#endif /* SINKATTN_WITH_CUDA */

/* A case as the plans see it: shapes and which optional inputs exist (the data pointers stay NULL). */
static sa_attn tc_shape(const tc_case *c) {
  static const int32_t marker[4] __attribute__((aligned(16))) = {0};
  static const float sink __attribute__((aligned(16))) = 0.0f;
  sa_attn a;
  sa_attn_init(&a);
  a.dtype = c->dt;
  a.batch = c->B;
  a.q_len = c->T;
  a.kv_len = c->S;
  a.q_heads = c->N;
  a.kv_heads = c->K;
  a.head_dim = c->H;
  a.v_head_dim = c->Hv;
  a.softmax = c->sm;
  a.causal = c->causal;
  a.window_left = c->wl;
  a.window_right = c->wr;
  a.diag_offset = c->diag;
  if (c->sm == SA_SOFTMAX_LEARNABLE) a.sinks = &sink;
  if (c->lens) a.q_lens = a.kv_lens = marker;
  if (c->segs) a.q_segment_ids = a.kv_segment_ids = marker;
  const int64_t full[4] = {c->B, c->N, c->T, c->S};
  if (c->bias) { /* the plans read the dims, the dtype and the pointers' alignment */
    tc_dims(c->bias, full, a.bias_dims);
    a.bias_dtype = tc_dtype_of(c->bias);
    a.bias = marker;
  }
  if (c->mpat) {
    tc_dims(c->mdims ? c->mdims : "1111", full, a.mask_dims);
    a.mask = (const uint8_t *)marker;
  }
  if (c->pos) a.q_positions = a.kv_positions = marker;
  a.logits_soft_cap = c->cap;
  return a;
}

static const struct {
  const char *name;
  const tc_case *cases;
  size_t n;
} tc_tables[] = {{"general", tc_cases, sizeof tc_cases / sizeof tc_cases[0]},
                 {"hopper", tc_hopper_cases, sizeof tc_hopper_cases / sizeof tc_hopper_cases[0]},
                 {"prod", tc_prod_cases, sizeof tc_prod_cases / sizeof tc_prod_cases[0]},
                 {"features", tc_feat_cases, sizeof tc_feat_cases / sizeof tc_feat_cases[0]},
                 {"features-prod", tc_feat_prod_cases, sizeof tc_feat_prod_cases / sizeof tc_feat_prod_cases[0]}};

/* --list: every case's plans on a mocked H200 (CC 9.0, 132 SMs, sm_90a code), no GPU needed. */
static int tc_list(const char *table) {
  const sa_cuda_device h200 = {9, 0, 132, 132, 232448, 233472, 1, 0, "NVIDIA H200 (mocked record)"};
  size_t cases = 0, runs = 0;
  for (size_t t = 0; t < sizeof tc_tables / sizeof tc_tables[0]; t++) {
    if (table && strcmp(table, tc_tables[t].name)) continue;
    for (size_t i = 0; i < tc_tables[t].n; i++) {
      const tc_case *c = &tc_tables[t].cases[i];
      const sa_attn a = tc_shape(c);
      sa_cuda_plan pf[16], pb[16];
      const int nf = sa_cuda_plans(&a, SA_PLAN_FWD, &h200, (size_t)-1, pf, 16);
      const int nb = sa_cuda_plans(&a, SA_PLAN_BWD, &h200, (size_t)-1, pb, 16);
      if (nf < 1 || nb < 1) {
        printf("FAIL [%s] no plan on the mocked H200 (%d fwd, %d bwd)\n", c->name, nf, nb);
        return 1;
      }
      printf("%-8s %-42s fwd:", tc_tables[t].name, c->name);
      for (int k = 0; k < nf && k < 16; k++)
        if (tc_plan_selected(pf[k].name)) printf(" %s", pf[k].name), runs++;
      printf("  bwd:");
      for (int k = 0; k < nb && k < 16; k++)
        if (tc_plan_selected(pb[k].name)) printf(" %s", pb[k].name), runs++;
      printf("\n");
      cases++;
    }
  }
  printf("test_cuda --list: %zu cases, %zu (case, plan) runs on a GPU\n", cases, runs);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* a line at a time: a run killed by a time limit shows where it stood */
  const char *table = NULL;
  size_t stride = 1;
  int list = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--list")) list = 1;
    else if (!strncmp(argv[i], "--table=", 8)) table = argv[i] + 8;
    else if (!strncmp(argv[i], "--plan=", 7)) tc_plan_sel = argv[i] + 7;
    else if (!strncmp(argv[i], "--case=", 7)) tc_case_sel = argv[i] + 7;
    else if (!strncmp(argv[i], "--stride=", 9) && atoi(argv[i] + 9) > 0) stride = (size_t)atoi(argv[i] + 9);
    else {
      fprintf(stderr, "test_cuda: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (list) return tc_list(table);
#ifndef SINKATTN_WITH_CUDA
  (void)stride;
  printf("test_cuda: SKIPPED: sinkattn was built without CUDA (nvcc not found at configure time)\n");
  return 77;
#else
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("test_cuda: SKIPPED: no CUDA device present (the CUDA backend is built but cannot run here)\n");
    return 77;
  }
  tc_unsupported();
  size_t ran = 0;
  for (size_t t = 0; t < sizeof tc_tables / sizeof tc_tables[0]; t++) {
    if (table && strcmp(table, tc_tables[t].name)) continue;
    printf("-- table %s\n", tc_tables[t].name);
    for (size_t i = 0; i < tc_tables[t].n; i += stride) {
      if (tc_case_sel && !strstr(tc_tables[t].cases[i].name, tc_case_sel)) continue;
      tc_run(&tc_tables[t].cases[i], 1234 + 77 * i + 1000 * t);
      ran++;
    }
  }
  printf("test_cuda: %d passed, %d failed (%zu cases, every legal plan each)\n", tc_pass, tc_fail, ran);
  return tc_fail ? 1 : 0;
#endif
}
