/*
 * plan_ctx.h — what the CUDA plan files share (plan.c: the plain plans, the list and the pick; plan_feat.c: the
 * feature plans): the facts of one call that every plan reads, and the helpers and schedules both files use.
 * Private to src/cuda.
 */
#ifndef SA_CUDA_PLAN_CTX_H
#define SA_CUDA_PLAN_CTX_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"
#include "sinkattn.h"

typedef struct {
  const sa_attn *a;
  const sa_cuda_device *dev;
  int which, bf16, hd, lens, segs, mask, sms;
  const char *feat; /* the call's first input only the feature plans take, or NULL */
  int64_t B, T, S, N, K, G, H, Hv;
  char hop_why[160]; /* "" when the Hopper kernels may take the call (the family's own rules aside) */
} sa_pctx;

size_t sa_r256(size_t x);
int64_t sa_cdiv(int64_t a, int64_t b);
int sa_aligned16(const void *p);
void sa_plan_init(sa_cuda_plan *p, const sa_pctx *c, const char *name, sa_cuda_family f);
const char *sa_feature_of(const sa_attn *a);
void sa_pctx_make(sa_pctx *c, const sa_attn *a, int which, const sa_cuda_device *dev);

/* plan.c's schedules, which the feature plans reuse: each returns why not (NULL: p is filled). */
const char *sa_fwd_hopper_sched(const sa_pctx *c, sa_cuda_plan *p, int persistent, int feat);
int sa_fwd_persist_default(const sa_pctx *c);
const char *sa_bwd_twopass(const sa_pctx *c, sa_cuda_plan *p, int nck, int ncq);

/* plan_feat.c: the feature plans (why not, NULL when p is filled), why the verified ones refuse a call on dev
   (into buf), and the refusal's status. */
const char *sa_fwd_hopper_feat(const sa_pctx *c, sa_cuda_plan *p);
const char *sa_fwd_hopper_feat_tma(const sa_pctx *c, sa_cuda_plan *p);
const char *sa_bwd_twopass_feat(const sa_pctx *c, sa_cuda_plan *p);
const char *sa_bwd_twopass_feat_tma(const sa_pctx *c, sa_cuda_plan *p);
const char *sa_feature_why(const sa_attn *a, const sa_cuda_device *dev, char *buf, size_t n);
sa_status sa_feature_refuse(const char *what, const char *why);

#endif
