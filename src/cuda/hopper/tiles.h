/*
 * tiles.h — the tile table of the Hopper (sm_90a) kernels: one entry per fact, each with the measurement that
 * chose it (H200, bf16; the figures and the rejected alternatives are in docs/hopper.md and docs/decisions.md).
 * Plain C: the kernels (C++), the plan (src/cuda/plan.c) and the CPU tests read the same numbers.
 */
#ifndef SA_HOPPER_TILES_H
#define SA_HOPPER_TILES_H

/* Rows of one consumer warpgroup: wgmma's M. 128 x (NC + 1) threads a CTA: one producer warpgroup (TMA) and NC
   consumers. T and S are multiples of 128 in the Hopper scope, so a CTA of 64 NC rows or keys may be partial. */
#define SA_HOP_WG_ROWS 64
/* mbarrier ring depth of every streamed operand: 2 (a 4-stage forward ring at H64 gained nothing beyond the
   noise; at H128 there is no room: 209 KiB of 227 with 2 stages). */
#define SA_HOP_STAGES 2
/* The sm_90 opt-in limit of one CTA's shared memory (cudaDevAttrMaxSharedMemoryPerBlockOptin on H100 / H200). */
#define SA_HOP_SMEM_LIMIT (227 * 1024)

/* ---- forward ----
   H64: 3 consumer warpgroups, 192-row CTAs: at k = 64 one warpgroup's two products per 128-key tile (512 tensor
   clocks) cost as much as its 8192 exp2 (512 MUFU clocks); a third warpgroup's products cover one softmax
   (B4 T4096 N32: 468 / 410 TFLOP/s non-causal / causal against 331..407 / 364 with 128-row CTAs).
   H128: 2 warpgroups, 128-row CTAs (615 / 552 TFLOP/s at B4 T4096 N16). 128 keys a tile at both. */
#define SA_HOP_FWD_NC(hd) ((hd) == 64 ? 3 : 2)
#define SA_HOP_FWD_BM(hd) (SA_HOP_WG_ROWS * SA_HOP_FWD_NC(hd))
#define SA_HOP_FWD_BN     128
/* Two Q slots: the next work tile's Q loads under this one's last P V (+9% at H64 T1024, +7% at H128 T1024). */
#define SA_HOP_FWD_QSLOTS 2
/* Q slots, the K / V ring, and with segment ids (mask kind 4) each stage's 128 key ids; 1 KiB alignment slack. */
#define SA_HOP_FWD_SMEM(hd, mask)                          \
  (1024 + SA_HOP_FWD_QSLOTS * SA_HOP_FWD_BM(hd) * (hd)*2 + \
   SA_HOP_STAGES * (2 * SA_HOP_FWD_BN * (hd)*2 + ((mask) == 4 ? SA_HOP_FWD_BN * 4 : 0)))
/* Persistent CTAs (one per SM, work tiles c, c + grid, ...) hide each work tile's ~1-2 us prologue and
   epilogue: without a mask always (H128 B16 T1024: 1.27x), with a mask while a work tile sees at most 8 key
   tiles (a static share of unequal tiles left SMs idle past that: 0.79x at H128 B1 T16384 causal). */
#define SA_HOP_FWD_PERSIST_MAX_KEY_TILES 8
/* Causal work tiles in heavy / light pairs of one head balance the static share: up to 32 key tiles at H128
   (T1024 +9%, T4096 +4%, T16384 -4%), 8 at H64 (on a grid coprime to the pairs). */
#define SA_HOP_FWD_PAIRS_MAX_KEY_TILES(hd) ((hd) == 128 ? 32 : 8)
/* The masked persistent order walks heads in sections whose K and V fit a third of the H200's 50 MiB L2. */
#define SA_HOP_FWD_L2_SECTION_BYTES (16.0 * 1024 * 1024)
/* Persistent test schedule (hopper.fwd.persistent.narrow): 3 CTAs, so every CTA crosses many work tiles. */
#define SA_HOP_FWD_NARROW_GRID 3
/* The feature kernels (hopper.fwd.features, hopper.bwd.twopass.features): a work tile's class list (a byte a key
   tile, hopper/fwd_feat.cuh) lives in its Q slot, 512 B at most: kv_len <= 65536 (a 1 KiB pair of lists beside the
   H128 forward's 193 KiB). The forward's feature steps (bias loads, soft-cap, selects) need registers that 3
   consumer warpgroups of 160 do not have (740-990 B of spills at H64): 2 warpgroups at both head dims. */
#define SA_HOP_FEAT_MAX_KV_LEN 65536
#define SA_HOP_FWD_FEAT_NC     2
#define SA_HOP_FWD_FEAT_BM     (SA_HOP_WG_ROWS * SA_HOP_FWD_FEAT_NC)
#define SA_HOP_FWD_FEAT_SMEM(hd)                                                                         \
  (1024 + SA_HOP_FWD_QSLOTS * SA_HOP_FWD_FEAT_BM * (hd)*2 + SA_HOP_STAGES * 2 * SA_HOP_FWD_BN * (hd)*2 + \
   SA_HOP_FWD_QSLOTS * (SA_HOP_FEAT_MAX_KV_LEN / SA_HOP_FWD_BN + 16))

/* ---- two-pass backward ----
   dK/dV: K, V of 64 NC keys loaded once, Q / dO streamed in 64-row tiles (dK 64 + dV 64 + S^T 32 + dP^T 32 = 192
   live accumulators at H128, R216 of 240); dQ: Q, dO of 64 NC rows once, K / V streamed in 64-key tiles.
   NC 3 at H64 (no lengths, no segment ids: their kernels spill at 160 registers) for grids of at least 4 CTAs
   an SM (f+b +5-15% with 2700-3100 CTAs; gpt-oss's 176 CTAs of 192 keys: 272 against 297 TFLOP/s with 2). */
#define SA_HOP_BWD_QB               64
#define SA_HOP_BWD_KT               64
#define SA_HOP_BWD_NC_MAX(hd, mask) ((hd) == 64 && (mask) < 3 ? 3 : 2)
#define SA_HOP_BWD_NC3_CTAS_PER_SM  4
/* Under a falling mask the dK/dV grid puts the key block slowest (heaviest CTAs first) while it is under 8 CTAs
   an SM (gpt-oss 276 against 211 TFLOP/s; with 2048 CTAs the fast order keeps L2 locality: 382 vs 363). */
#define SA_HOP_BWD_KB_SLOWEST_CTAS_PER_SM 8
#define SA_HOP_BWD_DKDV_SMEM(hd, nc)                                                        \
  (1024 + 2 * SA_HOP_WG_ROWS * (nc) * (hd)*2 + SA_HOP_STAGES * 2 * SA_HOP_BWD_QB * (hd)*2 + \
   SA_HOP_STAGES * 3 * SA_HOP_BWD_QB * 4)
#define SA_HOP_BWD_DQ_SMEM(hd, nc) \
  (1024 + 2 * SA_HOP_WG_ROWS * (nc) * (hd)*2 + SA_HOP_STAGES * (2 * SA_HOP_BWD_KT * (hd)*2 + SA_HOP_BWD_KT * 4))

/* ---- one-pass backward ----
   dK, dV and dQ in one kernel, dQ added into an fp32 workspace in a fixed order: 5 products a tile where the
   two passes take 7. H128: 2 warpgroups, 128-key blocks (the whole backward 1.08-1.14x the two passes);
   H64: 3 warpgroups, 192-key blocks, dQ by one owner warpgroup a tile (1.19-1.39x the 128-key form).
   One CTA an SM (227 KiB), persistent over items (b, kv head, [head split,] key block). */
#define SA_HOP_OP_NC(hd) ((hd) == 64 ? 3 : 2)
#define SA_HOP_OP_KB(hd) (SA_HOP_WG_ROWS * SA_HOP_OP_NC(hd))
/* The H64 head split: the G heads of a kv head over hs CTAs while the grid is under 8 CTAs an SM (gpt-oss f+b
   318 / 353 / 362 TFLOP/s at hs 2 / 4 / 8). */
#define SA_HOP_OP_SPLIT_CTAS_PER_SM 8
/* K, V; the Q / dO ring; the dS^T buffers (2 at H128, 3 at H64: tile k in buffer k % 3, one reader a use); 2 dQ
   staging slots; lse2 / D per stage; at H64 2 converter slots (the producer's idle warps write dq from them). */
#define SA_HOP_OP_SMEM(hd)                                                                    \
  (1024 + 2 * SA_HOP_OP_KB(hd) * (hd)*2 + SA_HOP_STAGES * 2 * SA_HOP_BWD_QB * (hd)*2 +        \
   ((hd) == 64 ? 3 : 2) * SA_HOP_OP_KB(hd) * SA_HOP_BWD_QB * 2 + 2 * SA_HOP_BWD_QB * (hd)*4 + \
   SA_HOP_STAGES * 2 * SA_HOP_BWD_QB * 4 + ((hd) == 64 ? 2 * SA_HOP_BWD_QB * (hd)*4 : 0))
/* B N T below 2^27: sa_hop_dq_convert_kernel's int index (rows x H / 8 < 2^31). */
#define SA_HOP_OP_MAX_ROWS (1LL << 27)

#endif /* SA_HOPPER_TILES_H */
