"""Pure jnp attention with sinks: the twin of the fused kernels, same arguments as primitives.attn_fwd (the
inputs as one `_inputs.Inputs`).

It materialises the [B,N,T,S] scores (O(T*S) memory), accumulates in float32 (float64 for float64 input)
and is differentiated by JAX autodiff (the bias gradient comes back reduced to bias's shape and dtype).
Semantics match the C library exactly: lengths clamped to [0,T] / [0,S]; causal and window masks around the
aligned diagonal i' = i (+ kv_len - q_len when bottom-right) + diag_offset, or around q_pos[i] + diag_offset
against kv_pos[j] when positions are given; bias added to the scaled logits; with a soft-cap the logit
l = scale * q.k + bias becomes cap * tanh(l / cap) before any mask (the sink logit is not capped, and every
gradient flows through the cap by autodiff); mask nonzero = attend; a row
with no valid key (or -inf bias on every key) gives out = 0 and lse = the sink logit (-inf for vanilla);
neither the values nor the gradients are ever NaN for finite inputs (every exp/log sees a finite argument
or an explicit -inf that masks to 0).

Masked means absent: every mask (lengths, causal, window, segments, positions, the mask array) removes a logit by
selection (jnp.where), never by adding a large negative number, so a NaN or an infinity in a key (or a bias
element) that a mask hides cannot reach any output. Keys and values past the lengths are zeroed the same way,
so padding reaches no product at all. A value row hidden by the other masks still meets its probability 0 in
P V, as in jax.nn (0 * NaN is NaN there too).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._enums import Causal, Softmax
from ._inputs import Inputs

# On GPU an f32 product defaults to TF32 (~1e-3 error), too coarse for a reference.
_HIGHEST = jax.lax.Precision.HIGHEST


def valid(
  B, T, S, q_lens, kv_lens, q_seg, kv_seg, q_pos=None, kv_pos=None, *, causal, window_left, window_right, diag_offset
):
  """Validity of (b, i, j) from lengths, causal, window, segments and positions, as a bool [B,T,S] array."""
  i = jnp.arange(T)[None, :, None]
  j = jnp.arange(S)[None, None, :]
  ql = jnp.full((B,), T, jnp.int32) if q_lens is None else jnp.clip(q_lens.astype(jnp.int32), 0, T)
  kl = jnp.full((B,), S, jnp.int32) if kv_lens is None else jnp.clip(kv_lens.astype(jnp.int32), 0, S)
  ql, kl = ql[:, None, None], kl[:, None, None]
  ok = (i < ql) & (j < kl)
  if q_pos is None:
    row = i + diag_offset + ((kl - ql) if causal == Causal.BOTTOM_RIGHT else 0)
    col = j
  else:  # positions place every query and key; bottom-right alignment is refused before this point
    row = q_pos.astype(jnp.int32)[:, :, None] + diag_offset
    col = kv_pos.astype(jnp.int32)[:, None, :]
  if causal != Causal.NONE:
    ok &= col <= row
  if window_left >= 0:
    ok &= col >= row - window_left
  if window_right >= 0:
    ok &= col <= row + window_right
  if q_seg is not None:
    ok &= q_seg[:, :, None] == kv_seg[:, None, :]
  return ok


def sink_logits(N, sinks, softmax):
  """a_n as float32 [N] (float64 for float64 sinks): -inf, 0 or sinks."""
  if softmax == Softmax.LEARNABLE:
    return sinks.astype(jnp.promote_types(sinks.dtype, jnp.float32)).reshape(N)
  return jnp.full((N,), -jnp.inf if softmax == Softmax.VANILLA else 0.0, jnp.float32)


def _heads5(x, K, G):
  """A [B|1, N|1, T|1, S|1] array as [B|1, K|1, G|1, T|1, S|1] (query head n = kv head n // G, member n % G)."""
  b, n, t, s = x.shape
  return x.reshape(b, K, G, t, s) if n == K * G else x.reshape(b, 1, 1, t, s)


def _probabilities(
  x: Inputs,
  *,
  softmax,
  causal,
  window_left,
  window_right,
  diag_offset,
  scale,
  logits_soft_cap=0.0,
):
  """-> (p [B,K,G,T,S], lse [B,K,G,T]) in the compute dtype (float32, or float64 for float64 inputs)."""
  B, T, N, H = x.q.shape
  _, S, K, _ = x.k.shape
  G = N // K
  f32 = jnp.promote_types(x.q.dtype, jnp.float32).type
  qf = x.q.astype(f32).reshape(B, T, K, G, H)
  kf = x.k.astype(f32)
  if x.kv_lens is not None:  # padding never reaches a result: 0 * NaN in P.V or dS.K would
    kf = jnp.where(_key_valid(x.kv_lens, S), kf, 0)
  s = jnp.einsum("btkgh,bskh->bkgts", qf, kf, precision=_HIGHEST) * f32(scale)  # [B,K,G,T,S]
  if x.bias is not None:
    s = s + _heads5(x.bias, K, G).astype(jnp.promote_types(x.bias.dtype, f32))
  if logits_soft_cap:  # before the masks, which select among the capped logits
    s = f32(logits_soft_cap) * jnp.tanh(s / f32(logits_soft_cap))
  ok = valid(
    B,
    T,
    S,
    x.q_lens,
    x.kv_lens,
    x.q_seg,
    x.kv_seg,
    x.q_pos,
    x.kv_pos,
    causal=causal,
    window_left=window_left,
    window_right=window_right,
    diag_offset=diag_offset,
  )[:, None, None]  # [B,1,1,T,S]
  if x.mask is not None:
    ok = ok & _heads5(x.mask.astype(bool), K, G)
  a = sink_logits(N, x.sinks, softmax).astype(s.dtype).reshape(1, K, G, 1)  # [1,K,G,1]
  # Running max seeded with the sink (so huge sinks and empty rows stay finite); it cancels exactly in
  # lse and p, so no gradient flows through it.
  # (initial=-inf: with S = 0 every row is empty, and max of a zero-size axis needs a start value.)
  m = jax.lax.stop_gradient(jnp.maximum(jnp.max(jnp.where(ok, s, -jnp.inf), axis=-1, initial=-jnp.inf), a))
  m = jnp.where(jnp.isfinite(m), m, 0.0)  # vanilla empty row
  e = jnp.exp(jnp.where(ok, s - m[..., None], -jnp.inf))  # 0 where masked
  l = jnp.sum(e, axis=-1) + jnp.exp(a - m)
  empty = l == 0.0  # vanilla, no key
  l_safe = jnp.where(empty, 1.0, l)
  lse = jnp.where(empty, -jnp.inf, m + jnp.log(l_safe))  # [B,K,G,T]
  return e / l_safe[..., None], lse


def _key_valid(kv_lens, S):
  return (jnp.arange(S)[None, :] < jnp.clip(kv_lens.astype(jnp.int32), 0, S)[:, None])[:, :, None, None]


def attention(x: Inputs, **statics):
  """primitives.attn_fwd's arguments: the inputs x and the keywords softmax, causal, window_left, window_right,
  diag_offset, scale and logits_soft_cap (0.0 = none).

  Returns:
    (out [B,T,N,Hv] in q's dtype, lse [B,N,T] float32, float64 for float64 inputs).
  """
  B, T, N, _ = x.q.shape
  _, S, K, Hv = x.v.shape
  p, lse = _probabilities(x, **statics)
  vf = x.v.astype(p.dtype)
  if x.kv_lens is not None:
    vf = jnp.where(_key_valid(x.kv_lens, S), vf, 0)
  out = jnp.einsum("bkgts,bske->btkge", p, vf, precision=_HIGHEST).reshape(B, T, N, Hv)
  return out.astype(x.q.dtype), lse.reshape(B, N, T)


def weights(x: Inputs, **statics):
  """The attention probabilities p [B,N,T,S] in q's dtype (each row sums to 1 - the sink's share; 0 where
  masked), e.g. for a Flax module that sows its attention weights; arguments as attention's (v unused)."""
  B, T, N, _ = x.q.shape
  p, _ = _probabilities(x, **statics)
  return p.reshape(B, N, T, x.k.shape[1]).astype(x.q.dtype)
