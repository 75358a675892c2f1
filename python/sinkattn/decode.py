"""decode_attention: a few query tokens against a long KV cache, with sinks (split-KV C kernels).

The same math as dot_product_attention(..., is_causal=True, causal_alignment='bottom_right',
key_value_seq_lengths=cache_lengths): query token i of batch b sits at position cache_lengths[b] - T + i
and sees the cache entries j <= i + cache_lengths[b] - T (and j >= that diagonal - left with a window).
The kernel cuts the cache into chunks processed in parallel (CPU threads / CUDA thread blocks), each
giving a partial without the sink, then merges them in a fixed order adding the sink once.

Forward only: there is no custom_vjp, so jax.grad through decode_attention raises (decoding is
inference; train with dot_product_attention). vmap runs the call once per vmapped element.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import jax
import numpy as np

from . import _lib, _routing, _validate, primitives, reference
from ._enums import Causal
from ._inputs import lse_public
from ._validate import ArrayLike, Window


def _check(query, k_cache, v_cache, cache_lengths, fused):
  """Decode-specific checks, naming decode_attention's own arguments (the shared ones follow)."""
  _validate._check_rank("query", query, 4, "B,T,N,H")
  _validate._check_rank("k_cache", k_cache, 4, "B,S,K,H")
  _validate._check_rank("v_cache", v_cache, 4, "B,S,K,Hv")
  B, T, N, H = query.shape
  if tuple(k_cache.shape[:1]) + tuple(k_cache.shape[3:]) != (B, H):
    raise ValueError(
      f"k_cache: expected shape [B,S,K,H] = ({B}, S, K, {H}) to match query {tuple(query.shape)}, "
      f"got shape {tuple(k_cache.shape)}"
    )
  if tuple(v_cache.shape[:3]) != tuple(k_cache.shape[:3]):
    raise ValueError(
      f"v_cache: expected shape [B,S,K,Hv] = {tuple(k_cache.shape[:3]) + ('Hv',)} to match k_cache "
      f"{tuple(k_cache.shape)}, got shape {tuple(v_cache.shape)}"
    )
  for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
    if np.dtype(x.dtype) != np.dtype(query.dtype):
      raise TypeError(
        f"{name}: dtype {np.dtype(x.dtype).name} differs from query's {np.dtype(query.dtype).name}: "
        "query and the caches must share one dtype"
      )
  if fused and T > _lib.decode_max_query_tokens():
    raise ValueError(
      f"query: the decode kernels take at most T = {_lib.decode_max_query_tokens()} query tokens, got shape "
      f"{tuple(query.shape)} (T = {T}); use dot_product_attention for prefill"
    )
  if cache_lengths is None:
    raise ValueError(f"cache_lengths: expected an int32 array of shape [B] = ({B},), got None")
  _validate._check_int_array("cache_lengths", cache_lengths, (B,), "B")


def decode_attention(
  query: ArrayLike,
  k_cache: ArrayLike,
  v_cache: ArrayLike,
  cache_lengths: ArrayLike,
  *,
  sinks: Optional[ArrayLike] = None,
  softmax_type: Optional[str] = None,
  local_window_size: Window = None,
  scale: Optional[float] = None,
  return_residual: bool = False,
  implementation: Optional[str] = None,
  logits_soft_cap: Optional[float] = None,
) -> Union[jax.Array, Tuple[jax.Array, jax.Array]]:
  """Attention of a few new query tokens (T <= 64, the library's SA_DECODE_MAX_Q_LEN) over a KV cache, with
  attention sinks (forward only).

  Query token i of batch b sits at position cache_lengths[b] - T + i and sees the cache entries up to it
  (causal, bottom-right); a window (left, right) also limits it to entries >= that position - left
  (gpt-oss: (127, 0), a 128-token window). Rows with no valid entry give out 0 and lse = the sink logit.

  Args:
    query: [B,T,N,H], T <= 64 (any T with implementation='reference'); float32, float16 or bfloat16
      (float64 with implementation='reference').
    k_cache: [B,S,K,H] in query's dtype; K divides N.
    v_cache: [B,S,K,Hv] in query's dtype.
    cache_lengths: [B] int: the valid entries of each cache, the T new tokens included (their keys and
      values already written at positions cache_lengths - T .. cache_lengths - 1).
    sinks: as in dot_product_attention.
    softmax_type: as in dot_product_attention.
    local_window_size: w or (left, right), as in dot_product_attention.
    scale: as in dot_product_attention.
    return_residual: also return lse [B,T,N] float32 (jax.nn's residual layout).
    implementation: None / 'fused' (the split-KV kernel of the platform), 'cudnn' (the CUDA kernel; an
      error where it cannot run), 'reference' / 'xla' (the pure jnp twin of dot_product_attention with
      causal_alignment='bottom_right'). On GPU, a call the CUDA decode kernel does not take (the library says
      which: for now one with logits_soft_cap) runs the reference, with one warning naming the reason.
    logits_soft_cap: as in dot_product_attention: each logit becomes cap * tanh(l / cap), the sink's not
      (on CPU such a call runs the attention forward kernels: the same result, no split).

  Returns:
    out [B,T,N,Hv] in query's dtype, or (out, lse [B,T,N] float32) with return_residual=True.

  Raises:
    ValueError / TypeError: an argument with a wrong shape, dtype or value, naming it.
    RuntimeError: implementation='fused' / 'cudnn' where that kernel cannot run.
  """
  impl = _validate.implementation(implementation)
  ref = impl == "reference"
  _check(query, k_cache, v_cache, cache_lengths, fused=not ref)
  c = _validate.arguments(
    query,
    k_cache,
    v_cache,
    sinks=sinks,
    softmax_type=softmax_type,
    scale=scale,
    is_causal=True,
    causal_alignment="bottom_right",
    local_window_size=local_window_size,
    query_seq_lengths=None,
    key_value_seq_lengths=cache_lengths,
    query_segment_ids=None,
    key_value_segment_ids=None,
    return_residual=return_residual,
    logits_soft_cap=logits_soft_cap,
    allow_f64=ref,
  )
  o = c.opts
  statics = dict(
    softmax=o.softmax,
    window_left=o.window_left,
    window_right=o.window_right,
    scale=o.scale,
    logits_soft_cap=o.logits_soft_cap,
  )
  out, lse = _routing.run(
    impl,
    query,
    c.inputs,
    op="decode_attention",
    fused=lambda x: primitives.decode_fwd(x, **statics),
    reference=lambda x: reference.attention(x, causal=Causal.BOTTOM_RIGHT, diag_offset=0, **statics),
    cuda_reason=lambda: _routing.cuda_reason(c.inputs, logits_soft_cap=o.logits_soft_cap, decode=True),
  )
  return (out, lse_public(lse)) if o.return_residual else out
