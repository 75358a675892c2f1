"""The linen `DotProductAttention` of `sinkattn.flax`, which re-exports it and documents it on its page: the same
constructor and call as `sinkattn.nnx.DotProductAttention` (`layers.module_call` runs both), in Flax's terms
(jax.nn's and Flax's argument order, a mask True = attend). `sinkattn.flax.MultiHeadAttention` builds its
'attention' submodule from it. Transformer Engine's constructor and inverted mask live in `sinkattn.te`.
"""

from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp

from . import layers
from ._validate import ArrayLike, Window, soft_cap
from .layers import SOFTMAX_OFFSET_AXES, normalize_softmax_type


class DotProductAttention(nn.Module):
  """Fused attention with sinks as a linen module: query [B,T,N,H], key [B,S,K,H], value [B,S,K,Hv] -> out
  [B,T,N,Hv], or (out, lse [B,T,N] fp32, including the sink) with return_residual=True.

  Its fields and call are those of sinkattn.nnx.DotProductAttention (in the same order, with the same defaults):
  a linen checkpoint and an nnx state of one model hold the same `softmax_offset`, and the same mask means the
  same thing in both.

  Attributes:
    num_heads: N: when given, calls check query's heads against it (linen sizes `softmax_offset` from the
      query's heads at init when it is None).
    softmax_type: 'vanilla' (or None), 'off_by_one' (or 'off-by-one') or 'learnable'; only 'learnable'
      creates the parameter `softmax_offset` (1, N, 1, 1) fp32, zeros init, logical axes
      (None, 'heads', None, None) (Transformer Engine's name, shape and layout).
    scale: as in sinkattn.dot_product_attention (the sink is not scaled).
    is_causal: as in sinkattn.dot_product_attention.
    causal_alignment: as in sinkattn.dot_product_attention.
    local_window_size: as in sinkattn.dot_product_attention (gpt-oss: is_causal=True, (127, 0)).
    dtype: cast query, key and value to it first (None keeps theirs).
    implementation: as in sinkattn.dot_product_attention.
    logits_soft_cap: as in sinkattn.dot_product_attention (cap * tanh(l / cap) on every logit, not the sink's);
      None: no cap.
  """

  num_heads: Optional[int] = None
  softmax_type: Optional[str] = "vanilla"
  scale: Optional[float] = None
  is_causal: bool = False
  causal_alignment: str = "top_left"
  local_window_size: Window = None
  dtype: Any = None
  implementation: Optional[str] = None
  logits_soft_cap: Optional[float] = None

  @nn.compact
  def __call__(
    self,
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    bias: Optional[ArrayLike] = None,
    mask: Optional[ArrayLike] = None,
    *,
    query_seq_lengths: Optional[ArrayLike] = None,
    key_value_seq_lengths: Optional[ArrayLike] = None,
    query_segment_ids: Optional[ArrayLike] = None,
    key_value_segment_ids: Optional[ArrayLike] = None,
    query_positions: Optional[ArrayLike] = None,
    key_value_positions: Optional[ArrayLike] = None,
    is_causal: bool = False,
    causal_alignment: Optional[str] = None,
    return_residual: bool = False,
    cache_lengths: Optional[ArrayLike] = None,
    precision: Any = None,
    sow_module: Any = None,
  ):
    """Attention of query over key / value.

    Args:
      query: [B,T,N,H].
      key: [B,S,K,H].
      value: [B,S,K,Hv].
      bias: as in sinkattn.dot_product_attention (added to the scaled logits).
      mask: as in sinkattn.dot_product_attention: True / nonzero = attend, broadcastable to [B,N,T,S].
      query_seq_lengths: [B] int.
      key_value_seq_lengths: [B] int.
      query_segment_ids: [B,T] int.
      key_value_segment_ids: [B,S] int.
      query_positions: [B,T] int, placing the causal / window masks.
      key_value_positions: [B,S] int.
      is_causal: adds a causal mask for this call (Flax's call-time flag), on top of the field.
      causal_alignment: overrides the field for this call.
      return_residual: also return lse [B,T,N] fp32.
      cache_lengths: [B] int: key / value are KV caches filled up to it, the T queries being the last T
        entries: runs sinkattn.decode_attention (causal, bottom-right; no bias, mask or other arrays).
      precision: as in sinkattn.dot_product_attention.
      sow_module: a Flax module to sow the attention weights into (MultiHeadAttention's sow_weights).

    Returns:
      out (and lse with return_residual=True).
    """
    normalize_softmax_type(self.softmax_type)  # a bad name or cap fails at init, as nnx's constructor does
    soft_cap(self.logits_soft_cap)
    init = nn.with_logical_partitioning(nn.initializers.zeros_init(), SOFTMAX_OFFSET_AXES)
    return layers.module_call(
      self,
      lambda n: self.param("softmax_offset", init, (1, n, 1, 1), jnp.float32),
      query,
      key,
      value,
      bias,
      mask,
      query_seq_lengths=query_seq_lengths,
      key_value_seq_lengths=key_value_seq_lengths,
      query_segment_ids=query_segment_ids,
      key_value_segment_ids=key_value_segment_ids,
      query_positions=query_positions,
      key_value_positions=key_value_positions,
      is_causal=is_causal,
      causal_alignment=causal_alignment,
      return_residual=return_residual,
      cache_lengths=cache_lengths,
      precision=precision,
      sow_module=sow_module,
    )
