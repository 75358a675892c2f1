"""The nnx `DotProductAttention` of `sinkattn.nnx`, which re-exports it and documents it on its page, and the
two flax.nnx version shims that it and `sinkattn.nnx.MultiHeadAttention` share: sharding metadata applied
eagerly only under a mesh (`partitioned`) and attribute slots that stay data when first set to None
(`data_slot`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from . import layers
from ._validate import ArrayLike, Window, soft_cap
from .layers import SOFTMAX_OFFSET_AXES, normalize_softmax_type


def partitioned(init: Callable, axes) -> Callable:
  """`init` with sharding metadata `axes`; eager sharding (flax >= 0.12) only under an active mesh."""
  if not hasattr(nnx, "using_eager_sharding"):  # flax < 0.12: metadata only, nothing eager
    return nnx.with_partitioning(init, axes)
  eager = nnx.using_eager_sharding() and not jax.sharding.get_abstract_mesh().empty
  return nnx.with_partitioning(init, axes, eager_sharding=eager)


# flax >= 0.12 makes an attribute first set to None static; nnx.data keeps the cache slots data.
data_slot = getattr(nnx, "data", lambda x: x)


class DotProductAttention(nnx.Module):
  """Fused attention with sinks as an nnx module: query [B,T,N,H], key [B,S,K,H], value [B,S,K,Hv] -> out
  [B,T,N,Hv], or (out, lse [B,T,N] fp32, including the sink) with return_residual=True.

  Its constructor and call are those of sinkattn.flax.DotProductAttention (in the same order, with the same
  defaults): an nnx state and a linen checkpoint of one model hold the same `softmax_offset`, and the same mask
  means the same thing in both.

  Args:
    num_heads: N (sizes `softmax_offset`): needed with 'learnable' only (an nnx parameter exists before the
      first call); when given, calls check query's heads against it.
    softmax_type: 'vanilla' (or None), 'off_by_one' (or 'off-by-one') or 'learnable'; only 'learnable'
      creates the parameter `softmax_offset` (1, N, 1, 1) fp32, zeros init, sharding metadata
      (None, 'heads', None, None) (Transformer Engine's name, shape and layout).
    scale: as in sinkattn.dot_product_attention.
    is_causal: as in sinkattn.dot_product_attention.
    causal_alignment: as in sinkattn.dot_product_attention.
    local_window_size: as in sinkattn.dot_product_attention.
    dtype: cast q, k, v to it first (None keeps theirs).
    implementation: as in sinkattn.dot_product_attention.
    logits_soft_cap: as in sinkattn.dot_product_attention (cap * tanh(l / cap) on every logit, not the sink's);
      None: no cap.
  """

  def __init__(
    self,
    num_heads: Optional[int] = None,
    softmax_type: Optional[str] = "vanilla",
    scale: Optional[float] = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    local_window_size: Window = None,
    dtype: Any = None,
    implementation: Optional[str] = None,
    logits_soft_cap: Optional[float] = None,
  ):
    soft_cap(logits_soft_cap)  # a bad cap fails here, as linen's at init
    self.num_heads = num_heads
    self.softmax_type = normalize_softmax_type(softmax_type)
    self.scale, self.is_causal, self.causal_alignment = scale, is_causal, causal_alignment
    self.local_window_size, self.dtype, self.implementation = local_window_size, dtype, implementation
    self.logits_soft_cap = logits_soft_cap
    if self.softmax_type == "learnable":
      if num_heads is None:
        raise ValueError(
          "num_heads: None, but softmax_type='learnable' needs it to size softmax_offset (1, num_heads, 1, 1)"
        )
      init = partitioned(nnx.initializers.zeros_init(), SOFTMAX_OFFSET_AXES)
      self.softmax_offset = nnx.Param(init(jax.random.key(0), (1, num_heads, 1, 1), jnp.float32))
    else:
      self.softmax_offset = data_slot(None)

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
      is_causal: adds a causal mask for this call (Flax's call-time flag), on top of the constructor's.
      causal_alignment: overrides the constructor's for this call.
      return_residual: also return lse [B,T,N] fp32.
      cache_lengths: [B] int: key / value are KV caches filled up to it, the T queries being the last T
        entries: runs sinkattn.decode_attention (causal, bottom-right; no bias, mask or other arrays).
      precision: as in sinkattn.dot_product_attention.
      sow_module: an nnx module to sow the attention weights into (MultiHeadAttention's sow_weights).

    Returns:
      out (and lse with return_residual=True).
    """
    return layers.module_call(
      self,
      lambda n: self.softmax_offset[...],
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
