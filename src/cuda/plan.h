/*
 * plan.h — the CUDA backend's plans: pure functions of (problem, device record) -> plan (family, tiles, grid,
 * persistence, head split, workspace, reason), in C so that the CPU tests run them on a mocked device. The
 * workspace query and the launch compute the plan through the same function (sa_cuda_plan_pick).
 * docs/hopper.md, "plans"; the schedules' reasons in docs/hopper.md.
 */
#ifndef SA_CUDA_PLAN_H
#define SA_CUDA_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "feat.h"
#include "sinkattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the plans need to know of the device and of the current context, queried once per context
   (src/cuda/device.cu). ctx_sms: the SMs this context may use (a green context has fewer than sms). */
typedef struct sa_cuda_device {
  int cc_major, cc_minor;
  int sms, ctx_sms;
  int smem_optin, smem_per_sm; /* bytes: one CTA's opt-in limit, one SM's */
  int sm90a;                   /* the binary holds sm_90a code */
  int hopper_off;              /* SINKATTN_CUDA_HOPPER=0 in the environment (read once) */
  char name[96];
} sa_cuda_device;

typedef enum {
  SA_CUDA_FWD_PORTABLE,
  SA_CUDA_FWD_HOPPER,
  SA_CUDA_BWD_PORTABLE,
  SA_CUDA_BWD_TWOPASS,
  SA_CUDA_BWD_ONEPASS,
  SA_CUDA_DECODE_PIPE,
  SA_CUDA_DECODE_REGISTER,
  SA_CUDA_DECODE_MMA
} sa_cuda_family;

typedef struct sa_cuda_plan {
  const char *name; /* static: what sa_plan_list returns and sa_plan_force accepts */
  sa_cuda_family family;
  int hd;          /* head dim the kernels are compiled for (max(H, Hv) padded) */
  int mask;        /* Hopper mask kind 0..4 (hopper/mask.h) */
  int bm, bn;      /* rows and keys of the main kernel's tile (backward: keys of a CTA, queries a tile) */
  int qslots;      /* Hopper forward: Q slots */
  int wg, wg_dq;   /* consumer warpgroups: of the main kernel; of the two-pass dQ */
  int grid[3];     /* the main kernel's grid */
  int grid_dq[3];  /* two-pass and portable backward: the dQ kernel's grid */
  int persistent;  /* CTAs loop over work tiles / items */
  int cooperative; /* launched cooperatively: every CTA co-resident or the launch is refused */
  /* Hopper forward work order (hopper/fwd_tile.cuh, sa_hop_work_tile) */
  int BH, n_mb, total, hg, nph;
  int kb_slowest; /* two-pass dK/dV grid with the key block slowest */
  /* one pass */
  int nkb, items, split, n_all, d;
  int op_wait; /* the producer waits on wr_done for every item (the WAIT instantiations: hopper.bwd.onepass.wait) */
  size_t sync_bytes;         /* ticket + semaphores, zeroed per call */
  size_t off_sync, off_part; /* the one pass's regions after the common ones: dq_acc at 0, then these */
  /* decode */
  int64_t rows, rowgroups, chunk, splits;
  int dec_pdl; /* the combine is a programmatic dependent launch (sm_90) */
  int sms;     /* the SMs the schedule was sized for (the context's) */
  /* the feature kernels (feat.h: bias, mask array, positions, soft-cap) */
  int feat;               /* 1: this plan's kernels are the feature instantiations */
  int b_fast;             /* Hopper forward: work tiles of one (head, m-block) in consecutive batches */
  int64_t cls_cb, cls_cn; /* the class table's batch and head extents (feat.h), 0 without classes */
  size_t off_cls;         /* the backward's class table in the workspace */
  size_t ws;              /* workspace bytes the call needs */
  const char *reason;
  char note[112]; /* what the call adds to the reason (why not Hopper; a refused cooperative launch) */
} sa_cuda_plan;

/* The record of the calling thread's current device and context, queried once per context and cached
   (device.cu); NULL without a usable device. */
const sa_cuda_device *sa_cuda_device_current(void);

/* Every plan legal for this problem on this device, best first (plans[0] is the default); returns how many
   (may exceed max; plans may be NULL). which: SA_PLAN_FWD / BWD / DECODE. ws_avail: the workspace a backward or
   decode call was given (SIZE_MAX for a size query): a plan that needs more is not legal. */
int sa_cuda_plans(const sa_attn *a, int which, const sa_cuda_device *dev, size_t ws_avail, sa_cuda_plan *plans,
                  int max);

/* The plan a call runs: `forced` (a plan name, or NULL for the default). SA_ERR_UNSUPPORTED with the message set
   when nothing is legal (a device below sm_80) or the forced plan is not legal here (the message says why). */
sa_status sa_cuda_plan_pick(const sa_attn *a, int which, const sa_cuda_device *dev, const char *forced, size_t ws_avail,
                            sa_cuda_plan *out);

/* "NAME hd=.. tile=..x.. grid=.. persistent=.. split=.. ws=.. reason=..." into buf; returns the length. */
size_t sa_cuda_plan_describe(const sa_cuda_plan *p, char *buf, size_t n);

/* The inputs only the feature plans take (bias, mask array, positions, soft-cap): SA_OK without them; with them
   SA_OK while listing plans (listing 1) or when a forward or backward plan is forced, else SA_ERR_UNSUPPORTED
   naming the first one (the feature plans are reachable only through sa_plan_force / SINKATTN_PLAN until
   SA_CUDA_FEATURE_PLANS_DEFAULT in plan.c says they have been verified on a GPU). */
sa_status sa_cuda_feature_check(const sa_attn *a, int listing);

/* The feature kernels' view of a call (feat.h): bias and mask with their broadcast strides, positions, soft-cap;
   the class table and dbias are the backward launch's to fill in. */
sa_cuda_feat sa_cuda_feat_make(const sa_attn *a);

/* Every CUDA plan name (static strings), for sa_plan_force's check; NULL-terminated. */
extern const char *const sa_cuda_plan_names[];

/* The decode pipeline kernel's shared memory (decode/pipe.cu, sa_dp_cfg): 4 stages of 32-key K and V tiles, q,
   P and the statistics of 8 rows; the plan's occupancy and so its splits follow from it. */
#define SA_DEC_PIPE_SMEM(hd) (4 * 2 * 32 * (hd)*2 + 8 * (hd)*4 + 32 * 8 * 4 + 3 * 8 * 4)

/* The decode mma kernel's shared memory (decode/mma.cu, sa_dm_cfg): 4 warps x 3 stages of K and V tiles of
   2048 / hd keys, rows padded by 8 elements. */
#define SA_DEC_MMA_SMEM(hd) (4 * 3 * 2 * (2048 / (hd)) * ((hd) + 8) * 2)

/* The head dim the portable kernels are compiled for: 32, 64, 128 or 256 (16 runs as 32, 96 as 128, 192 as 256). */
int sa_cuda_padded_dim(int64_t h);

/* The workspace the backward kernels share (D, the sink-gradient partials, lse2): every backward plan's first
   bytes. */
size_t sa_cuda_bwd_common_ws(const sa_attn *a);

#ifdef __cplusplus
}
#endif
#endif /* SA_CUDA_PLAN_H */
