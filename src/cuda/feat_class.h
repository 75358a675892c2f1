/*
 * feat_class.h — the class pre-pass of the Hopper feature kernels (feat_class.cu): what it writes where.
 */
#ifndef SA_CUDA_FEAT_CLASS_H
#define SA_CUDA_FEAT_CLASS_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "feat.h"

/* The shape the pre-pass walks: cb x cn mask / positions indices (feat.h's cls), T x S pairs (multiples of 128),
   and for the forward's lists the out tensor [B, T, N, Hv] bf16 that holds them. */
struct sa_feat_class_args {
  int64_t B, T, S, N, Hv, cb, cn;
  uint8_t *out;
};

/* fwd_lists 1: the class of every (64-row slab, 128-key tile) into the slab's rows of a.out (feat_class.cu's header);
   0: the class of every 64 x 64 block into f.cls. */
cudaError_t sa_feat_class_launch(const sa_cuda_feat &f, const sa_feat_class_args &a, int fwd_lists, cudaStream_t st);

#endif /* SA_CUDA_FEAT_CLASS_H */
