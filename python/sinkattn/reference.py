"""Pure jnp attention with sinks: the twin of the fused kernels, same arguments as primitives.attn_fwd.

It materialises the [B,N,T,S] scores (O(T*S) memory), accumulates in float32 (float64 for float64 input) and is differentiated by
JAX autodiff. Semantics match the C library exactly: lengths clamped to [0,T] / [0,S]; causal and window
masks around the aligned diagonal i' = i (+ kv_len - q_len when bottom-right) + diag_offset; a row with
no valid key gives out = 0 and lse = the sink logit (-inf for vanilla); neither the values nor the
gradients are ever NaN (every exp/log sees a finite argument or an explicit -inf that masks to 0).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

VANILLA, OFF_BY_ONE, LEARNABLE = 0, 1, 2
CAUSAL_NONE, CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT = 0, 1, 2


def mask(B, T, S, q_lens, kv_lens, q_seg, kv_seg, *, causal, window_left, window_right, diag_offset):
  """Validity of (b, i, j) as a bool [B,T,S] array."""
  i = jnp.arange(T)[None, :, None]
  j = jnp.arange(S)[None, None, :]
  ql = jnp.full((B,), T, jnp.int32) if q_lens is None else jnp.clip(q_lens.astype(jnp.int32), 0, T)
  kl = jnp.full((B,), S, jnp.int32) if kv_lens is None else jnp.clip(kv_lens.astype(jnp.int32), 0, S)
  ql, kl = ql[:, None, None], kl[:, None, None]
  ok = (i < ql) & (j < kl)
  diag = i + diag_offset + ((kl - ql) if causal == CAUSAL_BOTTOM_RIGHT else 0)
  if causal != CAUSAL_NONE:
    ok &= j <= diag
  if window_left >= 0:
    ok &= j >= diag - window_left
  if window_right >= 0:
    ok &= j <= diag + window_right
  if q_seg is not None:
    ok &= q_seg[:, :, None] == kv_seg[:, None, :]
  return ok


def sink_logits(N, sinks, softmax):
  """a_n as float32 [N] (float64 for float64 sinks): -inf, 0 or sinks."""
  if softmax == LEARNABLE:
    return sinks.astype(jnp.promote_types(sinks.dtype, jnp.float32)).reshape(N)
  return jnp.full((N,), -jnp.inf if softmax == VANILLA else 0.0, jnp.float32)


def attention(q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, *, softmax: int, causal: int, window_left: int,
              window_right: int, diag_offset: int, scale: float):
  """-> (out [B,T,N,Hv] in q's dtype, lse [B,N,T] float32)."""
  B, T, N, H = q.shape
  _, S, K, Hv = v.shape
  G = N // K
  f32 = jnp.promote_types(q.dtype, jnp.float32).type  # float32, or float64 for float64 inputs
  qf = q.astype(f32).reshape(B, T, K, G, H)
  kf, vf = k.astype(f32), v.astype(f32)
  if kv_lens is not None:  # padding never reaches a result: 0 * NaN in P.V or dS.K would
    valid = (jnp.arange(S)[None, :] < jnp.clip(kv_lens.astype(jnp.int32), 0, S)[:, None])[:, :, None, None]
    kf, vf = jnp.where(valid, kf, 0), jnp.where(valid, vf, 0)
  # HIGHEST: on GPU an f32 product defaults to TF32 (~1e-3 error), too coarse for a reference.
  hi = jax.lax.Precision.HIGHEST
  s = jnp.einsum("btkgh,bskh->bkgts", qf, kf, precision=hi) * f32(scale)       # [B,K,G,T,S]
  ok = mask(B, T, S, q_lens, kv_lens, q_seg, kv_seg, causal=causal, window_left=window_left,
            window_right=window_right, diag_offset=diag_offset)[:, None, None]   # [B,1,1,T,S]
  a = sink_logits(N, sinks, softmax).astype(f32).reshape(1, K, G, 1)                          # [1,K,G,1]
  # Running max seeded with the sink (so huge sinks and empty rows stay finite); it cancels exactly in
  # lse and p, so no gradient flows through it.
  # (initial=-inf: with S = 0 every row is empty, and max of a zero-size axis needs a start value.)
  m = jax.lax.stop_gradient(jnp.maximum(jnp.max(jnp.where(ok, s, -jnp.inf), axis=-1, initial=-jnp.inf), a))
  m = jnp.where(jnp.isfinite(m), m, 0.0)                                          # vanilla empty row
  e = jnp.exp(jnp.where(ok, s - m[..., None], -jnp.inf))                          # 0 where masked
  l = jnp.sum(e, axis=-1) + jnp.exp(a - m)
  empty = l == 0.0                                                                # vanilla, no key
  l_safe = jnp.where(empty, 1.0, l)
  lse = jnp.where(empty, -jnp.inf, m + jnp.log(l_safe))                           # [B,K,G,T]
  p = e / l_safe[..., None]
  out = jnp.einsum("bkgts,bske->btkge", p, vf, precision=hi).reshape(B, T, N, Hv)
  return out.astype(q.dtype), lse.reshape(B, N, T)
