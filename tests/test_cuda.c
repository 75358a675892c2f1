/*
 * test_cuda.c — SA_BACKEND_CUDA against SA_BACKEND_REF (fp64) on a table of cases covering every mask
 * (lengths with clamped values, causal top-left / bottom-right, windows, diag_offset, segments), the
 * three softmax types with sinks drawn from U(-10, 10) or U(-50, 50), empty rows, GQA, Hv != H, odd
 * sizes (37, 129), all head dims and both 16-bit dtypes. Outputs are NaN-poisoned before each call,
 * padding (q rows past q_len, k/v rows past kv_len) holds NaN, and the backward is run three times
 * (deterministic = 1 twice, 0 once): all three must agree bitwise. Cases inside the scope of the sm_90a
 * forward and backward run with and without them (SINKATTN_CUDA_HOPPER=0), and each run checks which
 * forward and which backward kernels ran. Exit 77 (skipped) without a GPU.
 */
#define _POSIX_C_SOURCE 200112L /* setenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sa_internal.h"

#ifndef SINKATTN_WITH_CUDA
int main(void) {
  printf("test_cuda: SKIPPED: sinkattn was built without CUDA (nvcc not found at configure time)\n");
  return 77;
}
#else
#include <cuda_runtime_api.h>

typedef struct {
  const char *name;
  sa_dtype dt;
  int64_t B, T, S, N, K, H, Hv;
  sa_softmax sm;
  sa_causal causal;
  int64_t wl, wr, diag;
  int lens, segs, dlse; /* lens: 1 random, 2 with out-of-range values that clamp; segs: 1 short runs of increasing
                           ids, 2 ids drawn from {0, 1, 2} (unsorted), 3 long runs (documents across tiles) */
  float sink_range;     /* sinks ~ U(-r, r); -r: the same with heads 0 and 1 at +50 and -50;
                           0: the special values +inf, -inf, 1e4, -1e4, ... */
} tc_case;

static const tc_case tc_cases[] = {
    {"odd 37x129", SA_BF16, 2, 37, 129, 4, 4, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 0, 10},
    {"odd 129x37 causal", SA_BF16, 2, 129, 37, 8, 2, 128, 128, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 1, 10},
    {"bottom-right lens", SA_BF16, 2, 64, 200, 4, 1, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 1, 0, 0, 10},
    {"window 31,0", SA_BF16, 1, 200, 200, 8, 2, 128, 128, SA_SOFTMAX_OFF_BY_ONE, SA_CAUSAL_TOP_LEFT, 31, 0, 0, 0, 0, 0, 10},
    {"window 20,10 lens", SA_BF16, 2, 100, 150, 2, 2, 32, 32, SA_SOFTMAX_VANILLA, SA_CAUSAL_NONE, 20, 10, 0, 1, 0, 1, 10},
    {"segments", SA_BF16, 2, 96, 96, 4, 2, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, -1, -1, 0, 0, 1, 0, 10},
    {"segments causal lens", SA_BF16, 2, 130, 130, 6, 2, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 1, 1, 1, 10},
    {"H96 causal", SA_BF16, 1, 150, 150, 2, 1, 96, 96, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 0, 10},
    {"H192", SA_BF16, 1, 70, 90, 2, 2, 192, 192, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 1, 10},
    {"H256 bottom-right", SA_BF16, 1, 65, 97, 2, 1, 256, 256, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 0, 0, 0, 10},
    {"H128 Hv64", SA_BF16, 2, 40, 60, 6, 2, 128, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 1, 10},
    {"H64 Hv128 causal", SA_BF16, 1, 50, 80, 4, 2, 64, 128, SA_SOFTMAX_VANILLA, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 0, 10},
    {"H16 causal", SA_BF16, 2, 45, 45, 4, 2, 16, 16, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 1, 0, 1, 10},
    {"H32 Hv256", SA_BF16, 1, 33, 47, 2, 1, 32, 256, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 0, 10},
    {"f16 causal", SA_F16, 2, 77, 77, 4, 2, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 1, 10},
    {"f16 window H128", SA_F16, 1, 160, 160, 4, 4, 128, 128, SA_SOFTMAX_OFF_BY_ONE, SA_CAUSAL_TOP_LEFT, 63, 0, 0, 1, 0, 0, 10},
    {"f16 H256", SA_F16, 1, 40, 70, 2, 2, 256, 256, SA_SOFTMAX_VANILLA, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 0, 10},
    {"sinks +-50", SA_BF16, 2, 64, 64, 4, 4, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 1, 50},
    {"sinks +-50 causal f16", SA_F16, 1, 70, 70, 4, 2, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 0, 50},
    {"diag_offset 150 window", SA_BF16, 1, 64, 256, 2, 1, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, 100, -1, 150, 0, 0, 0, 10},
    {"diag_offset -20 vanilla", SA_BF16, 1, 64, 64, 2, 1, 64, 64, SA_SOFTMAX_VANILLA, SA_CAUSAL_TOP_LEFT, -1, -1, -20, 0, 0, 1, 10},
    {"clamped lens vanilla", SA_BF16, 3, 50, 70, 4, 2, 64, 64, SA_SOFTMAX_VANILLA, SA_CAUSAL_NONE, -1, -1, 0, 2, 0, 1, 10},
    {"clamped lens learnable BR", SA_BF16, 3, 50, 70, 4, 2, 128, 128, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 2, 0, 1, 10},
    {"S = 0", SA_BF16, 1, 16, 0, 2, 1, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 1, 10},
    {"T = 0", SA_BF16, 1, 0, 16, 2, 1, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 0, 10},
    {"GQA 8 bottom-right", SA_BF16, 1, 33, 100, 8, 1, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 0, 0, 1, 10},
    {"GQA 3 window BR lens segs", SA_BF16, 2, 90, 120, 6, 2, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_BOTTOM_RIGHT, 40, 5, 0, 1, 1, 1, 10},
    {"decode T = 1", SA_BF16, 2, 1, 300, 8, 2, 128, 128, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 0, 0, 0, 10},
    {"512 causal H128", SA_BF16, 1, 512, 512, 2, 2, 128, 128, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 1, 10},
    {"gpt-oss window", SA_BF16, 1, 300, 300, 8, 1, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, 127, 0, 0, 0, 0, 0, 10},
    {"300x700 BR window lens", SA_BF16, 1, 300, 700, 4, 1, 64, 64, SA_SOFTMAX_OFF_BY_ONE, SA_CAUSAL_BOTTOM_RIGHT, 128, 0, 0, 1, 0, 0, 10},
    {"special sinks", SA_BF16, 1, 40, 40, 8, 2, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 1, 0},
    /* a window wider than the problem with a large negative diag_offset: the kernels' cap of "unbounded" windows
       must count the shift (it did not: hi = i - 500 + 402 cut every key of rows < 98) */
    {"diag_offset -500 window 1000", SA_BF16, 1, 100, 300, 2, 1, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, 1000, 1000, -500, 0, 0, 1, 10},
};

/* Inside the scope of the sm_90a forward and backward (src/cuda/hopper_fwd.cu, hopper_bwd.cu: bf16, H == Hv
   in {64, 128}, T and S multiples of 128; any causal alignment, window, diag_offset, lengths and, in the forward,
   segment ids). main runs each twice: with the fast paths (the default; on a CC 9.0
   device, with sm_90a code built, the Hopper forward and backward must be the ones that ran) and with
   SINKATTN_CUDA_HOPPER=0 (the portable kernels), both against the reference: out, lse, and dq, dk, dv,
   dsinks of three backward runs that must agree bitwise. The backward covers GQA 1 to 8 (64 / 8 heads),
   T < S and T > S top-left causal (keys past T: zero dk, dv), the three softmax types, and dlse != 0. */
static const tc_case tc_hopper_cases[] = {
    {"hop H128 256 GQA2", SA_BF16, 2, 256, 256, 4, 2, 128, 128, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 0, 10},
    {"hop H128 256x512 causal +-50", SA_BF16, 1, 256, 512, 4, 2, 128, 128, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 0, 50},
    {"hop H128 512x256 causal obo", SA_BF16, 1, 512, 256, 4, 4, 128, 128, SA_SOFTMAX_OFF_BY_ONE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 0, 10},
    {"hop H128 256x512 vanilla", SA_BF16, 1, 256, 512, 2, 1, 128, 128, SA_SOFTMAX_VANILLA, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 0, 10},
    {"hop H64 256 causal vanilla", SA_BF16, 2, 256, 256, 4, 2, 64, 64, SA_SOFTMAX_VANILLA, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 0, 10},
    {"hop H64 256x512 +-50", SA_BF16, 1, 256, 512, 4, 2, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 0, 50},
    {"hop H64 384 BR=TL GQA3 obo", SA_BF16, 1, 384, 384, 6, 2, 64, 64, SA_SOFTMAX_OFF_BY_ONE, SA_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 0, 0, 0, 10},
    {"hop H64 512x256 causal", SA_BF16, 1, 512, 256, 2, 2, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 0, 10},
    {"hop H128 special sinks", SA_BF16, 1, 128, 256, 8, 4, 128, 128, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 1, 0},
    {"hop H128 GQA 64/8 128x256 dlse", SA_BF16, 1, 128, 256, 64, 8, 128, 128, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 1, -10},
    {"hop H64 GQA 64/8 256 causal dlse", SA_BF16, 1, 256, 256, 64, 8, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 1, -10},
    {"hop H128 384x128 causal dlse", SA_BF16, 2, 384, 128, 4, 2, 128, 128, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 1, -10},
    {"hop H64 128x384 causal obo dlse", SA_BF16, 2, 128, 384, 4, 2, 64, 64, SA_SOFTMAX_OFF_BY_ONE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 1, 10},
    {"hop H128 256 causal van GQA4 dlse", SA_BF16, 1, 256, 256, 4, 1, 128, 128, SA_SOFTMAX_VANILLA, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 1, 10},
    {"hop H64 384x256 obo GQA4 dlse", SA_BF16, 1, 384, 256, 8, 2, 64, 64, SA_SOFTMAX_OFF_BY_ONE, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 1, 10},
    /* position masks (sa_hop_mask): windows, bottom-right with T != S, diag_offset (ring attention's blocks) */
    {"hop gpt-oss window 127,0 GQA8", SA_BF16, 1, 512, 512, 16, 2, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, 127, 0, 0, 0, 0, 1, -10},
    {"hop H128 window 64,32", SA_BF16, 2, 384, 384, 4, 2, 128, 128, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, 64, 32, 0, 0, 0, 1, 10},
    {"hop H64 BR 256x512 causal", SA_BF16, 1, 256, 512, 4, 2, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 0, 0, 1, 10},
    {"hop H128 BR 512x256 causal van", SA_BF16, 1, 512, 256, 4, 4, 128, 128, SA_SOFTMAX_VANILLA, SA_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 0, 0, 1, 10},
    {"hop H64 BR 128x384 window 100,0 obo", SA_BF16, 1, 128, 384, 4, 1, 64, 64, SA_SOFTMAX_OFF_BY_ONE, SA_CAUSAL_BOTTOM_RIGHT, 100, 0, 0, 0, 0, 0, 10},
    {"hop H64 diag -200 causal (empty rows)", SA_BF16, 1, 512, 512, 4, 2, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, -200, 0, 0, 1, 10},
    {"hop H128 diag -300 vanilla (empty rows)", SA_BF16, 1, 384, 384, 2, 1, 128, 128, SA_SOFTMAX_VANILLA, SA_CAUSAL_TOP_LEFT, -1, -1, -300, 0, 0, 0, 10},
    {"hop H64 diag 200 window 50,20", SA_BF16, 2, 256, 640, 4, 2, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, 50, 20, 200, 0, 0, 1, 50},
    {"hop H128 diag 5000 causal (full)", SA_BF16, 1, 256, 256, 2, 2, 128, 128, SA_SOFTMAX_OFF_BY_ONE, SA_CAUSAL_TOP_LEFT, -1, -1, 5000, 0, 0, 0, 10},
    /* per-batch lengths (mask kind 3): random q_len / kv_len in [0.3, 1) of T / S (lens 1), or -3, 1e9, -5
       clamped (lens 2: a batch without rows, one full, one without keys); padding is NaN */
    {"hop H128 lens 256x384 +-50", SA_BF16, 2, 256, 384, 4, 2, 128, 128, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, -1, -1, 0, 1, 0, 1, 50},
    {"hop H64 lens causal GQA4 dlse", SA_BF16, 3, 384, 384, 8, 2, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 1, 0, 1, -10},
    {"hop H64 lens BR window 100,0 obo", SA_BF16, 2, 256, 512, 4, 1, 64, 64, SA_SOFTMAX_OFF_BY_ONE, SA_CAUSAL_BOTTOM_RIGHT, 100, 0, 0, 1, 0, 0, 10},
    {"hop H128 clamped lens BR causal", SA_BF16, 3, 256, 384, 4, 2, 128, 128, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 2, 0, 1, 10},
    {"hop H64 lens vanilla window 64,32", SA_BF16, 2, 512, 256, 2, 2, 64, 64, SA_SOFTMAX_VANILLA, SA_CAUSAL_NONE, 64, 32, 0, 1, 0, 1, 10},
    {"hop H128 lens causal diag -50 obo", SA_BF16, 2, 384, 256, 4, 4, 128, 128, SA_SOFTMAX_OFF_BY_ONE, SA_CAUSAL_TOP_LEFT, -1, -1, -50, 1, 0, 1, 10},
    {"hop H64 clamped lens", SA_BF16, 3, 128, 256, 2, 1, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, -1, -1, 0, 2, 0, 0, 10},
    /* segment ids (the forward's mask kind 4; the backward runs the portable kernels): short runs, unsorted ids
       from {0, 1, 2}, long runs across tiles; with lengths, causal alignments, a window, GQA, 192-row CTAs */
    {"hop H128 segs causal", SA_BF16, 2, 256, 384, 4, 2, 128, 128, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 1, 1, 50},
    {"hop H64 segs unsorted GQA2", SA_BF16, 1, 384, 256, 4, 2, 64, 64, SA_SOFTMAX_OFF_BY_ONE, SA_CAUSAL_NONE, -1, -1, 0, 0, 2, 0, 10},
    {"hop H128 segs long runs lens BR", SA_BF16, 2, 512, 640, 4, 2, 128, 128, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_BOTTOM_RIGHT, -1, -1, 0, 1, 3, 1, 10},
    {"hop H64 segs long window 100,0 640", SA_BF16, 1, 640, 640, 4, 1, 64, 64, SA_SOFTMAX_VANILLA, SA_CAUSAL_TOP_LEFT, 100, 0, 0, 0, 3, 0, 10},
    {"hop H128 segs unsorted vanilla", SA_BF16, 1, 256, 256, 2, 2, 128, 128, SA_SOFTMAX_VANILLA, SA_CAUSAL_NONE, -1, -1, 0, 0, 2, 1, 10},
    {"hop H64 segs clamped lens causal", SA_BF16, 3, 384, 384, 4, 2, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 2, 1, 1, -10},
    /* the forward's tiles: 192-row CTAs at H64 (T = 640 = 3 x 192 + 64: a last CTA of one warpgroup), 176-key
       tiles at H128 without a mask (S = 128: one partial tile; 384 = 176 + 176 + 32; 1408 = 8 x 176 exactly) */
    {"hop H64 640 causal window 127,0 GQA2", SA_BF16, 1, 640, 640, 4, 2, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, 127, 0, 0, 0, 0, 1, 10},
    {"hop H64 640x384 obo (1-wg last CTA)", SA_BF16, 2, 640, 384, 4, 1, 64, 64, SA_SOFTMAX_OFF_BY_ONE, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 0, 10},
    {"hop H64 lens causal 640 partial", SA_BF16, 3, 640, 640, 4, 2, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 1, 0, 1, 10},
    {"hop H64 lens BR window 200,0 640x768", SA_BF16, 2, 640, 768, 4, 4, 64, 64, SA_SOFTMAX_VANILLA, SA_CAUSAL_BOTTOM_RIGHT, 200, 0, 0, 1, 0, 0, 10},
    {"hop H128 384 (176+176+32)", SA_BF16, 1, 384, 384, 6, 3, 128, 128, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 1, -10},
    {"hop H128 256x640 vanilla (3x176+112)", SA_BF16, 2, 256, 640, 4, 4, 128, 128, SA_SOFTMAX_VANILLA, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 0, 10},
    {"hop H128 128x128 one 176-key tile", SA_BF16, 1, 128, 128, 2, 1, 128, 128, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 1, 50},
    {"hop H128 256x1408 (8x176 exact)", SA_BF16, 1, 256, 1408, 4, 2, 128, 128, SA_SOFTMAX_OFF_BY_ONE, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 0, 10},
    /* the one-pass backward (hopper_bwd1.cu: H128, no lengths / window, causal none or top-left on the diagonal,
       S / 128 <= SMs and, without a mask, G T / 64 >= S / 128) takes the H128 cases above that fit that scope
       (10 of them; 256x640 and 256x1408 have fewer query tiles than key blocks and keep the two passes) and
       these: 4 key blocks a head in the causal order, 5 in staggered starts (d = 20 / 5 = 4 tiles apart) */
    {"hop H128 512 causal GQA2 dlse (1 pass)", SA_BF16, 1, 512, 512, 4, 2, 128, 128, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 1, 10},
    {"hop H128 640 vanilla GQA2 (1 pass)", SA_BF16, 2, 640, 640, 4, 2, 128, 128, SA_SOFTMAX_VANILLA, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 0, 10},
    /* the H64 one pass (hopper_bwd3.cu: 192-key CTAs of 3 warpgroups, the head split hs = 2 when G is even on
       these small grids) takes the H64 cases above without lengths / window / BR / diag_offset, and these: a
       head's last key block of 64 keys (S 1024, 640: 1 warpgroup) or 128 (S 512: 2), 6 whole blocks with and
       without the split (G 8, G 3), causal T > S and T < S (keys past T: zero dk, dv; skipped warpgroups) */
    {"hop H64 512x1024 causal GQA2 dlse (1 pass)", SA_BF16, 1, 512, 1024, 4, 2, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 1, 10},
    {"hop H64 384x640 vanilla (1 pass)", SA_BF16, 1, 384, 640, 4, 2, 64, 64, SA_SOFTMAX_VANILLA, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 0, 10},
    {"hop H64 512 causal B2 +-50 (1 pass)", SA_BF16, 2, 512, 512, 4, 2, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 1, -10},
    {"hop H64 1152 GQA8 (1 pass, split)", SA_BF16, 1, 1152, 1152, 8, 1, 64, 64, SA_SOFTMAX_LEARNABLE, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 0, 50},
    {"hop H64 1152 causal GQA3 van (1 pass)", SA_BF16, 1, 1152, 1152, 6, 2, 64, 64, SA_SOFTMAX_VANILLA, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 1, 10},
    {"hop H64 768x256 causal obo (1 pass)", SA_BF16, 1, 768, 256, 4, 2, 64, 64, SA_SOFTMAX_OFF_BY_ONE, SA_CAUSAL_TOP_LEFT, -1, -1, 0, 0, 0, 0, 10},
};

static int tc_pass, tc_fail;
static int tc_expect_kernel = -1; /* sa_cuda_last_fwd_kernel() after the forward and sa_cuda_last_bwd_kernel()
                                     after each backward; -1: not checked */
static int tc_fwd_only; /* 1: the forward alone (the passes over the Hopper forward's launch variants) */
static int tc_seg_all;  /* 1: SINKATTN_HOP_FWD_SEG128=1 and SINKATTN_HOP_BWD_SEG=1 are set (segment ids on the
                           Hopper kernels at both head dims, forward and backward) */

#define TC_CUDA(x)                                                                  \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      printf("FATAL %s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

static void tc_check(int ok, const tc_case *c, const char *fmt, double x, double tol) {
  if (ok) { tc_pass++; return; }
  tc_fail++;
  printf("FAIL [%s] ", c->name);
  printf(fmt, x, tol);
  printf("\n");
}

static double tc_rand(uint64_t *s) { /* splitmix64 -> U[0, 1) */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (double)((z ^ (z >> 31)) >> 11) * (1.0 / 9007199254740992.0);
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
  int32_t *ql = malloc(B * 4 + 16), *kl = malloc(B * 4 + 16), *qs = malloc(B * T * 4 + 16), *ks = malloc(B * S * 4 + 16);
  float ds_c2[128], ds_c3[128]; /* N <= 128 in the tables (64 now) */

  for (int64_t b = 0; b < B; b++) {
    ql[b] = (int32_t)(T * (0.3 + 0.7 * tc_rand(&s)));
    kl[b] = (int32_t)(S * (0.3 + 0.7 * tc_rand(&s)));
    if (c->lens == 2) { /* out-of-range values clamp: -3 acts as 0, 1e9 as the full length */
      if (b == 0) ql[b] = -3;
      if (b == 1) { ql[b] = 1000000000; kl[b] = 1000000000; }
      if (b == 2) kl[b] = -5;
    }
  }
  for (int64_t b = 0; b < B; b++) { /* segments: runs of random length, ids increasing in both (segs 1, 3), or
                                        ids at random (segs 2); rows whose id no key has see nothing */
    const double step = c->segs == 3 ? 0.006 : 0.05;
    int32_t id = 0;
    for (int64_t i = 0; i < T; i++) {
      if (tc_rand(&s) < step) id++;
      qs[b * T + i] = c->segs == 2 ? (int32_t)(3 * tc_rand(&s)) : id;
    }
    id = 0;
    for (int64_t j = 0; j < S; j++) {
      if (tc_rand(&s) < step * 0.8) id++;
      ks[b * S + j] = c->segs == 2 ? (int32_t)(3 * tc_rand(&s)) : id;
    }
  }
  sa_attn a;
  sa_attn_init(&a);
  a.dtype = c->dt; a.batch = B; a.q_len = T; a.kv_len = S; a.q_heads = N; a.kv_heads = K;
  a.head_dim = H; a.v_head_dim = Hv; a.softmax = c->sm; a.causal = c->causal;
  a.window_left = c->wl; a.window_right = c->wr; a.diag_offset = c->diag;
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
  a.q_lens = c->lens ? ql : NULL; a.kv_lens = c->lens ? kl : NULL;
  a.q_segment_ids = c->segs ? qs : NULL; a.kv_segment_ids = c->segs ? ks : NULL;

  /* reference */
  a.q = q; a.k = k; a.v = v; a.out = out_r; a.lse = lse_r;
  sa_status st = sa_attn_fwd(&a, SA_BACKEND_REF, NULL);
  sa_attn_grad g = {0};
  g.dout = dout; g.dlse = c->dlse ? dlse : NULL; g.dq = g_r[0]; g.dk = g_r[1]; g.dv = g_r[2];
  g.dsinks = c->sm == SA_SOFTMAX_LEARNABLE ? ds_r : NULL;
  if (st == SA_OK && !tc_fwd_only) st = sa_attn_bwd(&a, &g, NULL, 0, SA_BACKEND_REF, NULL);
  tc_check(st == SA_OK, c, "reference failed %g %g", (double)st, 0);

  /* CUDA: device copies, outputs poisoned */
  sa_attn d = a;
  d.q = tc_dev(nq * es, q); d.k = tc_dev(nk * es, k); d.v = tc_dev(nv * es, v);
  d.out = tc_dev(no * es, NULL); d.lse = tc_dev(nl * 4, NULL);
  d.sinks = a.sinks ? tc_dev(N * 4, sinks) : NULL;
  d.q_lens = c->lens ? tc_dev(B * 4, ql) : NULL; d.kv_lens = c->lens ? tc_dev(B * 4, kl) : NULL;
  d.q_segment_ids = c->segs ? tc_dev(B * T * 4, qs) : NULL; d.kv_segment_ids = c->segs ? tc_dev(B * S * 4, ks) : NULL;
  st = sa_attn_fwd(&d, SA_BACKEND_CUDA, NULL);
  tc_check(st == SA_OK, c, "CUDA forward status %g %g", (double)st, 0);
  if (st != SA_OK) printf("  %s\n", sa_last_error());
  /* segment ids at H128: the portable forward unless SINKATTN_HOP_FWD_SEG128=1 (hopper_fwd.cu) */
  const int expect_fwd = tc_expect_kernel == 2 && c->segs && c->H == 128 && !tc_seg_all ? 1 : tc_expect_kernel;
  if (expect_fwd >= 0)
    tc_check(sa_cuda_last_fwd_kernel() == expect_fwd, c, "forward ran kernel %g, expected %g",
             sa_cuda_last_fwd_kernel(), expect_fwd);
  TC_CUDA(cudaDeviceSynchronize());
  tc_get(out_c, d.out, no * es);
  tc_get(lse_c, d.lse, nl * 4);
  const double tol = c->dt == SA_BF16 ? 2e-2 : 1e-2;
  double e = tc_relerr(out_c, out_r, c->dt, no);
  tc_check(e <= tol, c, "out rel err %.3g > %.3g", e, tol);
  double lerr = 0;
  int lbad = 0;
  for (int64_t i = 0; i < nl; i++) {
    if (isnan(lse_r[i]) != isnan(lse_c[i]) || (isinf(lse_r[i]) && lse_r[i] != lse_c[i])) lbad++;
    else if (isfinite(lse_r[i])) lerr = fmax(lerr, fabs(lse_c[i] - lse_r[i]) / fmax(1.0, fabs(lse_r[i])));
  }
  tc_check(lbad == 0, c, "lse: %g non-finite mismatches (tol %g)", lbad, 0);
  tc_check(lerr <= 1e-4, c, "lse max rel err %.3g > %.3g", lerr, 1e-4);
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
  tc_check(ebad == 0, c, "empty rows: %g elements not exactly out 0 / lse sink (tol %g)", ebad, 0);

  sa_attn_grad dg = {0};
  if (tc_fwd_only) goto done;

  /* backward from the reference's out and lse, so only the backward kernels are compared */
  TC_CUDA(cudaMemcpy(d.out, out_r, no * es, cudaMemcpyHostToDevice));
  TC_CUDA(cudaMemcpy(d.lse, lse_r, nl * 4, cudaMemcpyHostToDevice));
  dg.dout = tc_dev(no * es, dout);
  dg.dlse = c->dlse ? tc_dev(nl * 4, dlse) : NULL;
  for (int rep = 0; rep < 3; rep++) {
    dg.dq = tc_dev(nq * es, NULL); dg.dk = tc_dev(nk * es, NULL); dg.dv = tc_dev(nv * es, NULL);
    dg.dsinks = g.dsinks ? tc_dev(N * 4, NULL) : NULL;
    dg.deterministic = rep < 2;
    size_t ws = sa_attn_bwd_workspace_size(&d, SA_BACKEND_CUDA);
    void *w = tc_dev(ws, NULL);
    st = sa_attn_bwd(&d, &dg, w, ws, SA_BACKEND_CUDA, NULL);
    tc_check(st == SA_OK, c, "CUDA backward status %g %g", (double)st, 0);
    if (st != SA_OK) printf("  %s\n", sa_last_error());
    /* segment ids: the portable backward unless SINKATTN_HOP_BWD_SEG=1 (hopper_bwd.cu) */
    const int expect_bwd = tc_expect_kernel == 2 && c->segs && !tc_seg_all ? 1 : tc_expect_kernel;
    if (expect_bwd >= 0)
      tc_check(sa_cuda_last_bwd_kernel() == expect_bwd, c, "backward ran kernel %g, expected %g",
               sa_cuda_last_bwd_kernel(), expect_bwd);
    TC_CUDA(cudaDeviceSynchronize());
    tc_get(g_c[rep][0], dg.dq, nq * es); tc_get(g_c[rep][1], dg.dk, nk * es); tc_get(g_c[rep][2], dg.dv, nv * es);
    if (dg.dsinks) tc_get(rep == 0 ? ds_c : rep == 1 ? ds_c2 : ds_c3, dg.dsinks, N * 4);
    TC_CUDA(cudaFree(dg.dq)); TC_CUDA(cudaFree(dg.dk)); TC_CUDA(cudaFree(dg.dv)); TC_CUDA(cudaFree(w));
    if (dg.dsinks) TC_CUDA(cudaFree(dg.dsinks));
  }
  static const char *gname[3] = {"dq", "dk", "dv"};
  const double gtol = c->dt == SA_BF16 ? 3e-2 : 2e-2;
  for (int x = 0; x < 3; x++) {
    e = tc_relerr(g_c[0][x], g_r[x], c->dt, gn[x]);
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
done:;
  const void *dp[] = {d.q, d.k, d.v, d.out, d.lse, d.sinks, d.q_lens, d.kv_lens, d.q_segment_ids,
                      d.kv_segment_ids, dg.dout, dg.dlse};
  for (size_t x = 0; x < sizeof dp / sizeof dp[0]; x++)
    if (dp[x]) TC_CUDA(cudaFree((void *)dp[x]));
  if (tc_fwd_only) printf("%-28s out %.2e  lse %.2e\n", c->name, tc_relerr(out_c, out_r, c->dt, no), lerr);
  else printf("%-28s out %.2e  lse %.2e  dq %.2e  dk %.2e  dv %.2e\n", c->name, tc_relerr(out_c, out_r, c->dt, no), lerr,
         tc_relerr(g_c[0][0], g_r[0], c->dt, nq), tc_relerr(g_c[0][1], g_r[1], c->dt, nk),
         tc_relerr(g_c[0][2], g_r[2], c->dt, nv));
  free(q); free(k); free(v); free(dout); free(out_r); free(out_c); free(lse_r); free(lse_c); free(dlse);
  free(sinks); free(ds_r); free(ds_c); free(ql); free(kl); free(qs); free(ks);
  for (int x = 0; x < 3; x++) {
    free(g_r[x]);
    for (int y = 0; y < 3; y++) free(g_c[y][x]);
  }
}

/* What the backend refuses, with a message naming the field. */
static void tc_unsupported(void) {
  static const tc_case c = {"unsupported", SA_BF16, 1, 4, 4, 2, 1, 72, 72, SA_SOFTMAX_VANILLA, SA_CAUSAL_NONE, -1, -1, 0, 0, 0, 0, 0};
  sa_attn a;
  sa_attn_init(&a);
  a.dtype = SA_BF16; a.batch = 1; a.q_len = 4; a.kv_len = 4; a.q_heads = 2; a.kv_heads = 1;
  a.head_dim = 72; a.v_head_dim = 64;
  sa_status s = sa_cuda_attn_supported(&a);
  tc_check(s == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), "head_dim 72"), &c, "head_dim 72 accepted (%g %g)", s, 0);
  a.head_dim = 64;
  a.dtype = SA_F32;
  s = sa_cuda_attn_supported(&a);
  tc_check(s == SA_ERR_UNSUPPORTED && strstr(sa_last_error(), "SA_F32"), &c, "f32 accepted (%g %g)", s, 0);
}

/* SA_TEST_CUDA_PASSES="a,b": run only the named passes (unset: all). Names: cases (the general cases), hopper (the
   Hopper cases in the default launch), portable (the same with SINKATTN_CUDA_HOPPER=0), nc3 (the H64 two passes
   with 3 consumer warpgroups), bwd (the backward launch variants), fwd (the forward launch variants). For a
   sanitizer run aimed at one kernel family: the whole binary under racecheck takes minutes. */
static int tc_pass_on(const char *name) {
  const char *sel = getenv("SA_TEST_CUDA_PASSES");
  if (!sel || !*sel) return 1;
  const size_t len = strlen(name);
  for (const char *q = sel; (q = strstr(q, name)) != NULL; q += len)
    if ((q == sel || q[-1] == ',') && (q[len] == ',' || q[len] == 0)) return 1;
  return 0;
}

/* A launch-variant pass's environment: names[k] = vals[k], or unset where vals is NULL (or vals[k] is NULL); the
   settings printed on the pass's header line. */
static void tc_env(const char *const *names, const char *const *vals, int n) {
  for (int k = 0; k < n; k++) {
    if (vals && vals[k]) {
      setenv(names[k], vals[k], 1);
      printf(" %s=%s", names[k], vals[k]);
    } else {
      unsetenv(names[k]);
    }
  }
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* a line at a time: a run killed by a time limit shows where it stood */
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("test_cuda: SKIPPED: no CUDA device present (the CUDA backend is built but cannot run here)\n");
    return 77;
  }
  tc_unsupported();
  /* SA_TEST_CUDA_STRIDE=k runs every k-th case (compute-sanitizer runs are ~100x slower) */
  const char *st = getenv("SA_TEST_CUDA_STRIDE");
  size_t stride = st && atoi(st) > 0 ? (size_t)atoi(st) : 1;
  /* SA_TEST_CUDA_HOPPER_STRIDE=k: every k-th Hopper case instead (the sanitizer's share of the sm_90a kernels) */
  const char *hst = getenv("SA_TEST_CUDA_HOPPER_STRIDE");
  const size_t hstride = hst && atoi(hst) > 0 ? (size_t)atoi(hst) : stride;
  if (tc_pass_on("cases"))
    for (size_t i = 0; i < sizeof tc_cases / sizeof tc_cases[0]; i += stride) tc_run(&tc_cases[i], 1234 + 77 * i);
  /* 1: the portable mma.sync kernels, 2: the sm_90a ones (only on a CC 9.0 device, and only when the
     library was built with sm_90a code: CMakeLists.txt defines SA_CUDA_HAVE_SM90A for this test then) */
  int dev = 0, major = 0, minor = 0;
  TC_CUDA(cudaGetDevice(&dev));
  TC_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  TC_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  const size_t nh = sizeof tc_hopper_cases / sizeof tc_hopper_cases[0];
  for (int portable = 0; portable < 2; portable++) {
    if (!tc_pass_on(portable ? "portable" : "hopper")) continue;
    if (portable) setenv("SINKATTN_CUDA_HOPPER", "0", 1);
    else unsetenv("SINKATTN_CUDA_HOPPER");
#ifdef SA_CUDA_HAVE_SM90A
    tc_expect_kernel = portable || !(major == 9 && minor == 0) ? 1 : 2;
#else
    tc_expect_kernel = 1;
    (void)major; (void)minor;
#endif
    printf("-- in the Hopper scope, %s (expect kernel %d)\n", portable ? "SINKATTN_CUDA_HOPPER=0" : "default",
           tc_expect_kernel);
    for (size_t i = 0; i < nh; i += hstride) tc_run(&tc_hopper_cases[i], 4321 + 77 * i);
  }
  unsetenv("SINKATTN_CUDA_HOPPER");
  /* The H64 two passes pick 3 consumer warpgroups only for grids of >= 4 CTAs an SM (hopper_bwd.cu), which no
     case here reaches: SINKATTN_HOP_BWD_NC=3 forces them (lengths keep 2), a third run of the H64 cases, with
     SINKATTN_HOP_BWD_ONEPASS=0 so that the cases the H64 one pass (hopper_bwd3.cu) took above run them too. */
  setenv("SINKATTN_HOP_BWD_NC", "3", 1);
  setenv("SINKATTN_HOP_BWD_ONEPASS", "0", 1);
#ifdef SA_CUDA_HAVE_SM90A
  tc_expect_kernel = major == 9 && minor == 0 ? 2 : 1;
#endif
  size_t n64 = 0;
  printf("-- the H64 cases with SINKATTN_HOP_BWD_NC=3 SINKATTN_HOP_BWD_ONEPASS=0 (expect kernel %d)\n", tc_expect_kernel);
  for (size_t i = 0; i < nh && tc_pass_on("nc3"); i += hstride)
    if (tc_hopper_cases[i].H == 64 && !tc_hopper_cases[i].lens && !tc_hopper_cases[i].segs) {
      tc_run(&tc_hopper_cases[i], 4321 + 77 * i);
      n64++;
    }
  unsetenv("SINKATTN_HOP_BWD_NC");
  unsetenv("SINKATTN_HOP_BWD_ONEPASS");
  /* The persistent one-pass backwards on their smallest legal grid (SINKATTN_HOP_BWD_GRID=1 is raised to a kv head's
     key blocks, the NAT minimum): many items a CTA, so K / V, the ring, dS^T, staging and the ticket rule all cross
     items (hopper_bwd1.cu at H128, hopper_bwd3p.cu at H64); then the H64 one pass's one-CTA-an-item kernel
     (SINKATTN_HOP_BWD3_PERSIST=0, hopper_bwd3.cu). Cases outside the one passes' scope run the two passes again. */
  size_t nbvar = 0;
#ifdef SA_CUDA_HAVE_SM90A
  if (major == 9 && minor == 0 && tc_pass_on("bwd")) {
    static const struct {
      int H;
      const char *persist3, *grid; /* NULL: unset */
    } bwd_vars[] = {{128, NULL, "1"}, {64, NULL, "1"}, {64, "0", NULL}};
    tc_expect_kernel = 2;
    static const char *const names[2] = {"SINKATTN_HOP_BWD3_PERSIST", "SINKATTN_HOP_BWD_GRID"};
    for (size_t v = 0; v < sizeof bwd_vars / sizeof bwd_vars[0]; v++, nbvar++) {
      const char *vals[2] = {bwd_vars[v].persist3, bwd_vars[v].grid};
      printf("-- the H%d Hopper cases,", bwd_vars[v].H);
      tc_env(names, vals, 2);
      printf(" (expect kernel 2)\n");
      for (size_t i = 0; i < nh; i += hstride)
        if (tc_hopper_cases[i].H == bwd_vars[v].H && !tc_hopper_cases[i].segs)
          tc_run(&tc_hopper_cases[i], 4321 + 77 * i);
    }
    tc_env(names, NULL, 2);
  }
#endif
  /* The Hopper forward's launch variants (hopper_fwd.cu; the default pass above takes its persistent launch, on
     grids of <= 128 work tiles: one a CTA), the forward alone: one work tile per CTA on a grid of all of them
     (SINKATTN_HOP_FWD_PERSISTENT=0: masked calls past 8 key tiles), then persistent CTAs on a grid of 3
     (SINKATTN_HOP_FWD_GRID=3: each CTA loops over up to 43 work tiles here, so the Q and K/V ring phases, the
     work-tile walk, the H64 partial m-blocks, masks and lengths all cross work tiles, and at H64 the two Q slots
     alternate), then one Q slot (SINKATTN_HOP_FWD_QSLOTS=1, the form before sessions 7 and 8; at H128 176-key
     tiles without a mask), on the default grid and persistent on a grid of 3. */
  size_t nvar = 0;
#ifdef SA_CUDA_HAVE_SM90A
  if (major == 9 && minor == 0 && tc_pass_on("fwd")) {
    static const struct {
      const char *persistent, *grid, *qslots; /* NULL: unset */
    } fwd_vars[] = {{"0", NULL, NULL}, {"1", "3", NULL}, {NULL, NULL, "1"}, {"1", "3", "1"}};
    tc_expect_kernel = 2;
    tc_fwd_only = 1;
    static const char *const names[3] = {"SINKATTN_HOP_FWD_PERSISTENT", "SINKATTN_HOP_FWD_GRID",
                                         "SINKATTN_HOP_FWD_QSLOTS"};
    for (size_t v = 0; v < sizeof fwd_vars / sizeof fwd_vars[0]; v++, nvar++) {
      const char *vals[3] = {fwd_vars[v].persistent, fwd_vars[v].grid, fwd_vars[v].qslots};
      printf("-- the Hopper cases, forward only,");
      tc_env(names, vals, 3);
      printf(" (expect kernel 2)\n");
      for (size_t i = 0; i < nh; i += hstride)
        tc_run(&tc_hopper_cases[i], 4321 + 77 * i);
    }
    tc_env(names, NULL, 3);
    tc_fwd_only = 0;
  }
  /* Last: segment ids on the Hopper kernels where they have not run on a GPU yet (written after session 8's
     device time was spent): the H128 forward (SINKATTN_HOP_FWD_SEG128=1; its first form hung in setmaxnreg) and
     the two-pass backward at both head dims (SINKATTN_HOP_BWD_SEG=1), over every segment case, on the default
     grid and with the forward persistent on a grid of 3. */
  if (major == 9 && minor == 0 && tc_pass_on("segments")) {
    static const char *const names2[3] = {"SINKATTN_HOP_FWD_SEG128", "SINKATTN_HOP_BWD_SEG", "SINKATTN_HOP_FWD_GRID"};
    static const char *const vals[2][3] = {{"1", "1", NULL}, {"1", "1", "3"}};
    tc_expect_kernel = 2;
    tc_seg_all = 1;
    for (int v = 0; v < 2; v++, nvar++) {
      printf("-- the segment-id cases,");
      tc_env(names2, vals[v], 3);
      printf(" (expect kernel 2)\n");
      for (size_t i = 0; i < nh; i++)
        if (tc_hopper_cases[i].segs) tc_run(&tc_hopper_cases[i], 4321 + 77 * i);
    }
    tc_env(names2, NULL, 3);
    tc_seg_all = 0;
  }
#endif
  printf("test_cuda: %d passed, %d failed (%zu cases, %zu of them twice, %zu of those three times; the Hopper "
         "backward in %zu more launch variants over one head dim each, the forward in %zu)\n", tc_pass, tc_fail,
         sizeof tc_cases / sizeof tc_cases[0] + nh, nh, n64, nbvar, nvar);
  return tc_fail ? 1 : 0;
}
#endif
