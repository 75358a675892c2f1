"""Flax linen modules around `sinkattn.dot_product_attention` (the twins of `sinkattn.nnx`). Every mask is
jax.nn's and Flax's: True = attend (Transformer Engine's inverted mask lives in `sinkattn.te`).

- `DotProductAttention(num_heads=None, softmax_type=..., scale, is_causal, causal_alignment, local_window_size,
  dtype, implementation, logits_soft_cap)`, called `(query, key, value, bias=None, mask=None, *, ...)`: the op as a
  module, the same constructor and call as sinkattn.nnx.DotProductAttention. With softmax_type='learnable' it owns
  `softmax_offset` (1, N, 1, 1) fp32, zeros, logical axes (None, 'heads', None, None).
- `MultiHeadAttention`: flax.linen.MultiHeadDotProductAttention's fields and call (num_heads, dtype,
  param_dtype, qkv_features, out_features, ...; `(inputs_q, inputs_k, inputs_v, *, inputs_kv, mask,
  deterministic, dropout_rng, sow_weights)`), plus GQA (num_kv_heads), head_dim, RoPE, sinks, and a KV cache
  (decode=True) that also takes prefill chunks.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import flax.linen as nn
import jax.numpy as jnp

from . import layers
from ._flax_dpa import DotProductAttention
from ._validate import ArrayLike, Window
from .layers import DECODE_MAX_TOKENS, SOFTMAX_OFFSET_AXES, apply_rope, normalize_softmax_type, projection_dot_general

__all__ = [
  "DotProductAttention",
  "MultiHeadAttention",
  "apply_rope",
  "normalize_softmax_type",
  "projection_dot_general",
  "SOFTMAX_OFFSET_AXES",
  "DECODE_MAX_TOKENS",
]


class MultiHeadAttention(nn.Module):
  """Projections + fused attention with sinks, with flax.linen.MultiHeadDotProductAttention's fields (in its
  order) first, then sinkattn's.

  inputs_q [B,T,D], inputs_k [B,S,Dk], inputs_v [B,S,Dv] -> [B,T,out_features]. q = inputs_q W_q [B,T,N,H];
  k, v = [B,S,K,H]; out = attn(q, k, v) W_o. Submodules: 'query', 'key', 'value', 'out' (DenseGeneral, with
  Flax's names and shapes: a Flax checkpoint loads), 'query_ln' / 'key_ln' (normalize_qk), and 'attention'
  (DotProductAttention, which holds `softmax_offset` when softmax_type='learnable'). Kernels carry the logical
  axes ('embed', 'heads' | 'kv_heads', 'head_dim') and ('heads', 'head_dim', 'embed').

  Attributes:
    num_heads: N.
    dtype: computation dtype (None: from the inputs and params).
    param_dtype: of the parameters.
    qkv_features: N * H (default: the input width D): defines H = qkv_features // N, as in Flax.
    out_features: default D.
    broadcast_dropout: Flax's; used only with dropout.
    dropout_rate: Flax's; dropout is not implemented: > 0 needs deterministic=True.
    deterministic: Flax's, merged with the call's.
    precision: of the projections and the attention.
    kernel_init: of the projections.
    out_kernel_init: of the out projection (default kernel_init).
    bias_init: of the projections' biases (None: zeros, Flax's default).
    out_bias_init: of the out projection's bias (default bias_init).
    use_bias: projection biases (Flax's default True).
    attention_fn: must be None: the module runs sinkattn.dot_product_attention.
    decode: keep a KV cache in the 'cache' collection ('cached_key', 'cached_value', 'cache_index', as Flax).
      `init` with a full-length input [B,L,D] sizes it; each later call (a prefill of T tokens, then T = 1
      steps: Flax takes single steps only) appends its keys / values and attends to the filled part with
      bottom-right alignment, through sinkattn.decode_attention when T <= DECODE_MAX_TOKENS (and is_causal,
      or T = 1, and no mask), else dot_product_attention.
    normalize_qk: LayerNorm (no bias) on q and k, as Flax.
    force_fp32_for_softmax: Flax's; the softmax is always float32.
    qkv_dot_general: of the q/k/v projections (default: projection_dot_general).
    out_dot_general: of the out projection (default: projection_dot_general).
    qkv_dot_general_cls: Flax's.
    out_dot_general_cls: Flax's.
    qk_attn_weights_einsum_cls: must be None.
    attn_weights_value_einsum_cls: must be None.
    head_dim: H when given (qkv_features then defaults to N * H).
    num_kv_heads: K (default N; GQA when K < N).
    softmax_type: as in DotProductAttention.
    scale: as in DotProductAttention.
    is_causal: as in DotProductAttention.
    causal_alignment: as in DotProductAttention.
    local_window_size: as in DotProductAttention.
    use_rope: rotary embedding on q and k (positions default to 0..T-1, or to the cache index onwards).
    rope_base: its frequency base.
    implementation: as in sinkattn.dot_product_attention.
    logits_soft_cap: as in DotProductAttention.
  """

  num_heads: int
  dtype: Any = None
  param_dtype: Any = jnp.float32
  qkv_features: Optional[int] = None
  out_features: Optional[int] = None
  broadcast_dropout: bool = True
  dropout_rate: float = 0.0
  deterministic: Optional[bool] = None
  precision: Any = None
  kernel_init: Callable = nn.initializers.lecun_normal()
  out_kernel_init: Optional[Callable] = None
  bias_init: Optional[Callable] = None
  out_bias_init: Optional[Callable] = None
  use_bias: bool = True
  attention_fn: Optional[Callable] = None
  decode: bool = False
  normalize_qk: bool = False
  force_fp32_for_softmax: bool = False
  qkv_dot_general: Optional[Callable] = None
  out_dot_general: Optional[Callable] = None
  qkv_dot_general_cls: Any = None
  out_dot_general_cls: Any = None
  qk_attn_weights_einsum_cls: Any = None
  attn_weights_value_einsum_cls: Any = None
  head_dim: Optional[int] = None
  num_kv_heads: Optional[int] = None
  softmax_type: Optional[str] = "vanilla"
  scale: Optional[float] = None
  is_causal: bool = False
  causal_alignment: str = "top_left"
  local_window_size: Window = None
  use_rope: bool = False
  rope_base: float = 10000.0
  implementation: Optional[str] = None
  logits_soft_cap: Optional[float] = None

  def _dense(self, features, axis, axes, name, out=False):
    kernel_init = (self.out_kernel_init or self.kernel_init) if out else self.kernel_init
    bias_init = (self.out_bias_init if out else None) or self.bias_init or nn.initializers.zeros_init()
    return nn.DenseGeneral(
      features=tuple(features),
      axis=axis,
      use_bias=self.use_bias,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      precision=self.precision,
      name=name,
      kernel_init=nn.with_logical_partitioning(kernel_init, axes),
      bias_init=nn.with_logical_partitioning(bias_init, axes[-len(features) :]),
      dot_general=(self.out_dot_general if out else self.qkv_dot_general) or projection_dot_general,
      dot_general_cls=self.out_dot_general_cls if out else self.qkv_dot_general_cls,
    )

  @nn.compact
  def __call__(
    self,
    inputs_q: ArrayLike,
    inputs_k: Optional[ArrayLike] = None,
    inputs_v: Optional[ArrayLike] = None,
    *,
    inputs_kv: Optional[ArrayLike] = None,
    mask: Optional[ArrayLike] = None,
    deterministic: Optional[bool] = None,
    dropout_rng: Any = None,
    sow_weights: bool = False,
    query_positions: Optional[ArrayLike] = None,
    key_value_positions: Optional[ArrayLike] = None,
    query_seq_lengths: Optional[ArrayLike] = None,
    key_value_seq_lengths: Optional[ArrayLike] = None,
    query_segment_ids: Optional[ArrayLike] = None,
    key_value_segment_ids: Optional[ArrayLike] = None,
    return_residual: bool = False,
  ):
    """Multi-head attention of inputs_q over inputs_k / inputs_v.

    Args:
      inputs_q: [B,T,D].
      inputs_k: [B,S,Dk] (default inputs_q).
      inputs_v: [B,S,Dv] (default inputs_k).
      inputs_kv: Flax's older name for inputs_k = inputs_v.
      mask: True / nonzero = attend, broadcastable to [B,N,T,S] (Flax's make_causal_mask /
        make_attention_mask build it).
      deterministic: Flax's; True turns dropout off.
      dropout_rng: Flax's; used only with dropout.
      sow_weights: store the attention weights [B,N,T,S] in 'intermediates' as 'attention_weights' (computed
        by the jnp reference: O(T*S)).
      query_positions: [B,T] int RoPE positions (default 0..T-1).
      key_value_positions: [B,S] int RoPE positions (default: query_positions in self-attention, else 0..S-1).
      query_seq_lengths: [B] int, as in sinkattn.dot_product_attention.
      key_value_seq_lengths: [B] int.
      query_segment_ids: [B,T] int.
      key_value_segment_ids: [B,S] int.
      return_residual: also return lse [B,T,N] fp32.

    Returns:
      [B,T,out_features] (and lse with return_residual=True).
    """
    del dropout_rng  # used only with dropout, refused by check_dropout
    layers.flax_only_arguments(self.attention_fn, self.qk_attn_weights_einsum_cls, self.attn_weights_value_einsum_cls)
    inputs_k, inputs_v, key_value_positions, self_attention = layers.key_value_inputs(
      inputs_q, inputs_k, inputs_v, inputs_kv, query_positions, key_value_positions
    )
    if self.dropout_rate > 0.0:
      layers.check_dropout(self.dropout_rate, nn.merge_param("deterministic", self.deterministic, deterministic))
    n = self.num_heads
    kvh, hd = layers.head_sizes(n, self.num_kv_heads, self.qkv_features, self.head_dim, inputs_q.shape[-1])
    q = self._dense((n, hd), -1, ("embed", "heads", "head_dim"), "query")(inputs_q)
    k = self._dense((kvh, hd), -1, ("embed", "kv_heads", "head_dim"), "key")(inputs_k)
    v = self._dense((kvh, hd), -1, ("embed", "kv_heads", "head_dim"), "value")(inputs_v)
    if self.normalize_qk:
      q = nn.LayerNorm(name="query_ln", use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype)(q)
      k = nn.LayerNorm(name="key_ln", use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype)(k)
    call = {}
    if self.decode:
      layers.check_decode_inputs(
        self_attention,
        query_seq_lengths=query_seq_lengths,
        key_value_seq_lengths=key_value_seq_lengths,
        query_segment_ids=query_segment_ids,
        key_value_segment_ids=key_value_segment_ids,
      )
      k, v, index, query_positions = self._cache_update(k, v, query_positions)
      call = layers.cached_call(q.shape[1], index + q.shape[1], q.shape[0], self.is_causal, mask)
    if self.use_rope:
      q, k = layers.rotate(q, k, query_positions, key_value_positions, self.rope_base, keys_cached=self.decode)
    attn = DotProductAttention(
      softmax_type=self.softmax_type,
      scale=self.scale,
      is_causal=self.is_causal,
      causal_alignment=self.causal_alignment,
      local_window_size=self.local_window_size,
      dtype=self.dtype,
      implementation=self.implementation,
      logits_soft_cap=self.logits_soft_cap,
      name="attention",
    )
    res = attn(
      q,
      k,
      v,
      mask=mask,
      query_seq_lengths=query_seq_lengths,
      key_value_seq_lengths=call.pop("key_value_seq_lengths", key_value_seq_lengths),
      query_segment_ids=query_segment_ids,
      key_value_segment_ids=key_value_segment_ids,
      return_residual=return_residual,
      precision=self.precision,
      sow_module=self if sow_weights else None,
      **call,
    )
    out, lse = res if return_residual else (res, None)
    features = self.out_features or inputs_q.shape[-1]
    y = self._dense((features,), (-2, -1), ("heads", "head_dim", "embed"), "out", out=True)(out)
    return (y, lse) if return_residual else y

  def _cache_update(self, k, v, query_positions):
    """Append k, v [B,T,K,H] at the cache index; returns the whole cache [B,L,K,H] (valid up to
    index + T), the old index and the positions of the new tokens [B,T]."""
    initialized = self.has_variable("cache", "cached_key")
    ck = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
    cv = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
    ci = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    index = ci.value
    if not initialized:  # init call: size the cache only
      pos = jnp.broadcast_to(index + jnp.arange(k.shape[1], dtype=jnp.int32), k.shape[:2])
      return k, v, index, pos if query_positions is None else query_positions
    ck.value, cv.value, pos = layers.cache_update(
      ck.value, cv.value, index, k, v, query_positions, self.rope_base if self.use_rope else None
    )
    ci.value = index + k.shape[1]
    return ck.value, cv.value, index, pos
