/*
 * ref_attn.h — the fp64 core of the reference: the same math as sa_ref_attn_fwd / sa_ref_attn_bwd on
 * double arrays (dense, the layouts of sinkattn.h). The dtype entry points convert to double, call these,
 * and round once at the end. Exposed so tests can take central finite differences in fp64, where a
 * step of 1e-6 gives ~1e-9 relative accuracy instead of the ~1e-3 that float32 inputs would allow.
 *
 * Only the shape, mask (lengths, segments, positions, mask array), scale, softmax and logits_soft_cap fields
 * of *a are read;
 * the tensors come as double arrays (a->q, a->bias, a->out, ... are ignored). `sinks` is [N] double and
 * read for SA_SOFTMAX_LEARNABLE only (may be NULL otherwise); `bias` is [a->bias_dims] double, NULL for
 * none (then a->bias_dims must be all 0, as the struct's own bias would be).
 */
#ifndef SA_REF_ATTN_H
#define SA_REF_ATTN_H

#include "sa_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out [B,T,N,Hv], lse [B,N,T]. Returns SA_ERR_NO_MEMORY if the row buffer cannot be allocated. */
sa_status sa_ref_fwd64(const sa_attn *a, const double *q, const double *k, const double *v, const double *sinks,
                       const double *bias, double *out, double *lse);

/* Uses out and lse as given (normally sa_ref_fwd64's). dlse [B,N,T] or NULL; dsinks [N] or NULL
   (written for every softmax type: zeros unless LEARNABLE); dbias [a->bias_dims] or NULL. dq, dk, dv,
   dsinks and dbias are fully overwritten. */
sa_status sa_ref_bwd64(const sa_attn *a, const double *q, const double *k, const double *v, const double *sinks,
                       const double *bias, const double *out, const double *lse, const double *dout, const double *dlse,
                       double *dq, double *dk, double *dv, double *dsinks, double *dbias);

#ifdef __cplusplus
}
#endif
#endif /* SA_REF_ATTN_H */
