"""flax.nnx modules around `sinkattn.dot_product_attention` (the twins of `sinkattn.flax`). Every mask is
jax.nn's and Flax's: True = attend.

- `DotProductAttention(num_heads=None, softmax_type=..., ...)`, called `(query, key, value, bias=None,
  mask=None, *, ...)`: the same constructor and call as sinkattn.flax.DotProductAttention. With 'learnable' it
  owns `softmax_offset`, an nnx.Param (1, N, 1, 1) fp32, zeros init, sharding metadata
  `out_sharding=(None, 'heads', None, None)`.
- `MultiHeadAttention(num_heads, in_features, qkv_features, out_features, num_kv_heads, in_kv_features, ...)`:
  flax.nnx.MultiHeadAttention's constructor (in its order) and call, LinearGeneral projections 'query', 'key',
  'value', 'out' (a Flax state loads), the core as 'attention', GQA, RoPE, sinks, a KV cache (`init_cache`).

Sharding metadata is always attached; it is applied eagerly (flax's `use_eager_sharding`) only when a mesh
is active, because flax raises for an eagerly sharded variable created without a mesh.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional

import jax.numpy as jnp
from flax import nnx

from . import layers
from ._nnx_dpa import DotProductAttention, data_slot, partitioned
from ._validate import ArrayLike, Window
from .layers import SOFTMAX_OFFSET_AXES as SOFTMAX_OFFSET_AXES
from .layers import normalize_softmax_type as normalize_softmax_type
from .layers import projection_dot_general

# __all__ (what the API page documents) names the two modules; SOFTMAX_OFFSET_AXES and normalize_softmax_type
# (explicit re-exports above) are importable from here as from sinkattn.flax, whose page documents them.
__all__ = ["DotProductAttention", "MultiHeadAttention"]

_NO_METADATA: Mapping[str, Any] = MappingProxyType({})


class MultiHeadAttention(nnx.Module):
  """Projections + fused attention with sinks, with flax.nnx.MultiHeadAttention's constructor (in its order)
  and call, then sinkattn's options as keywords.

  inputs_q [B,T,D], inputs_k [B,S,Dkv], inputs_v [B,S,Dkv] -> [B,T,out_features]. Kernels carry sharding
  metadata ('embed', 'heads' | 'kv_heads', 'head_dim') and ('heads', 'head_dim', 'embed') unless
  kernel_metadata / out_kernel_metadata say otherwise.

  Args:
    num_heads: N.
    in_features: D.
    qkv_features: N * H (default D): defines H = qkv_features // N, as in Flax.
    out_features: default D.
    num_kv_heads: K (default N; GQA when K < N).
    in_kv_features: Dkv (default D).
    dtype: computation dtype.
    param_dtype: of the parameters.
    broadcast_dropout: Flax's; used only with dropout.
    dropout_rate: Flax's; dropout is not implemented: > 0 needs deterministic=True.
    deterministic: Flax's default for the call.
    precision: of the projections and the attention.
    kernel_init: of the projections.
    out_kernel_init: of the out projection (default kernel_init).
    bias_init: of the projections' biases.
    out_bias_init: of the out projection's bias (default bias_init).
    use_bias: projection biases (Flax's default True).
    attention_fn: must be None: the module runs sinkattn.dot_product_attention.
    decode: the call's default for `decode`.
    normalize_qk: LayerNorm (no bias) on q and k ('query_ln', 'key_ln'), as Flax.
    qkv_promote_dtype: Flax's, for the q/k/v projections (None: Flax's default).
    out_promote_dtype: Flax's, for the out projection.
    ln_promote_dtype: Flax's, for the LayerNorms.
    qkv_dot_general: of the q/k/v projections (default: projection_dot_general).
    out_dot_general: of the out projection (default: projection_dot_general).
    qkv_dot_general_cls: Flax's.
    out_dot_general_cls: Flax's.
    rngs: for the parameters.
    keep_rngs: Flax's; the dropout stream is never used.
    kernel_metadata: Flax's, replacing the default sharding metadata of the q/k/v kernels.
    out_kernel_metadata: Flax's, for the out kernel.
    bias_metadata: Flax's.
    out_bias_metadata: Flax's.
    query_ln_scale_metadata: Flax's.
    key_ln_scale_metadata: Flax's.
    head_dim: H when given (qkv_features then defaults to N * H).
    softmax_type: as in DotProductAttention.
    scale: as in DotProductAttention.
    is_causal: as in DotProductAttention.
    causal_alignment: as in DotProductAttention.
    local_window_size: as in DotProductAttention.
    use_rope: rotary embedding on q and k.
    rope_base: its frequency base.
    implementation: as in sinkattn.dot_product_attention.
    logits_soft_cap: as in DotProductAttention.
  """

  def __init__(
    self,
    num_heads: int,
    in_features: int,
    qkv_features: Optional[int] = None,
    out_features: Optional[int] = None,
    num_kv_heads: Optional[int] = None,
    in_kv_features: Optional[int] = None,
    *,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    broadcast_dropout: bool = True,
    dropout_rate: float = 0.0,
    deterministic: Optional[bool] = None,
    precision: Any = None,
    kernel_init: Callable = nnx.initializers.lecun_normal(),
    out_kernel_init: Optional[Callable] = None,
    bias_init: Callable = nnx.initializers.zeros_init(),
    out_bias_init: Optional[Callable] = None,
    use_bias: bool = True,
    attention_fn: Optional[Callable] = None,
    decode: Optional[bool] = None,
    normalize_qk: bool = False,
    qkv_promote_dtype: Optional[Callable] = None,
    out_promote_dtype: Optional[Callable] = None,
    ln_promote_dtype: Optional[Callable] = None,
    qkv_dot_general: Optional[Callable] = None,
    out_dot_general: Optional[Callable] = None,
    qkv_dot_general_cls: Any = None,
    out_dot_general_cls: Any = None,
    rngs: nnx.Rngs,
    keep_rngs: bool = True,
    kernel_metadata: Mapping[str, Any] = _NO_METADATA,
    out_kernel_metadata: Mapping[str, Any] = _NO_METADATA,
    bias_metadata: Mapping[str, Any] = _NO_METADATA,
    out_bias_metadata: Mapping[str, Any] = _NO_METADATA,
    query_ln_scale_metadata: Mapping[str, Any] = _NO_METADATA,
    key_ln_scale_metadata: Mapping[str, Any] = _NO_METADATA,
    head_dim: Optional[int] = None,
    softmax_type: Optional[str] = "vanilla",
    scale: Optional[float] = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    local_window_size: Window = None,
    use_rope: bool = False,
    rope_base: float = 10000.0,
    implementation: Optional[str] = None,
    logits_soft_cap: Optional[float] = None,
  ):
    del broadcast_dropout, keep_rngs  # used only with dropout, refused at the call
    layers.flax_only_arguments(attention_fn)
    kvh, hd = layers.head_sizes(num_heads, num_kv_heads, qkv_features, head_dim, in_features)
    self.num_heads, self.num_kv_heads, self.head_dim, self.in_features = num_heads, kvh, hd, in_features
    self.dropout_rate, self.deterministic, self.decode = dropout_rate, deterministic, decode
    self.use_rope, self.rope_base, self.normalize_qk = use_rope, rope_base, normalize_qk
    kv_in = in_kv_features or in_features

    def dense(fin, fout, axis, axes, out):
      kw = dict(
        promote_dtype=out_promote_dtype if out else qkv_promote_dtype,
        kernel_metadata=(out_kernel_metadata or kernel_metadata) if out else kernel_metadata,
        bias_metadata=(out_bias_metadata or bias_metadata) if out else bias_metadata,
      )
      k_init, b_init = (out_kernel_init or kernel_init, out_bias_init or bias_init) if out else (kernel_init, bias_init)
      if not kw["kernel_metadata"]:
        k_init = partitioned(k_init, axes)
      if not kw["bias_metadata"]:
        b_init = partitioned(b_init, axes[-(1 if out else 2) :])
      return nnx.LinearGeneral(
        fin,
        fout,
        axis=axis,
        use_bias=use_bias,
        dtype=dtype,
        param_dtype=param_dtype,
        kernel_init=k_init,
        bias_init=b_init,
        precision=precision,
        dot_general=(out_dot_general if out else qkv_dot_general) or projection_dot_general,
        dot_general_cls=out_dot_general_cls if out else qkv_dot_general_cls,
        rngs=rngs,
        **{k: v for k, v in kw.items() if v},
      )

    self.query = dense(in_features, (num_heads, hd), -1, ("embed", "heads", "head_dim"), False)
    self.key = dense(kv_in, (kvh, hd), -1, ("embed", "kv_heads", "head_dim"), False)
    self.value = dense(kv_in, (kvh, hd), -1, ("embed", "kv_heads", "head_dim"), False)
    if normalize_qk:

      def norm(metadata):
        kw = {k: v for k, v in dict(promote_dtype=ln_promote_dtype, scale_metadata=metadata).items() if v}
        return nnx.LayerNorm(hd, use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs, **kw)

      self.query_ln, self.key_ln = norm(query_ln_scale_metadata), norm(key_ln_scale_metadata)
    else:
      self.query_ln = self.key_ln = data_slot(None)
    self.out = dense((num_heads, hd), out_features or in_features, (-2, -1), ("heads", "head_dim", "embed"), True)
    self.attention = DotProductAttention(
      num_heads,
      softmax_type=softmax_type,
      scale=scale,
      is_causal=is_causal,
      causal_alignment=causal_alignment,
      local_window_size=local_window_size,
      dtype=dtype,
      implementation=implementation,
      logits_soft_cap=logits_soft_cap,
    )
    self.precision = precision
    self.cached_key = self.cached_value = self.cache_index = data_slot(None)  # set by init_cache

  def init_cache(self, input_shape, dtype: Any = jnp.float32) -> None:
    """KV cache [*input_shape[:-1], K, H] (zeros) and its fill index, as flax.nnx.MultiHeadAttention's.

    Args:
      input_shape: the shape of the longest input, (B, L, D).
      dtype: of the cache.
    """
    shape = (*input_shape[:-1], self.num_kv_heads, self.head_dim)
    self.cached_key = nnx.Cache(jnp.zeros(shape, dtype))
    self.cached_value = nnx.Cache(jnp.zeros(shape, dtype))
    self.cache_index = nnx.Cache(jnp.array(0, jnp.int32))

  def __call__(
    self,
    inputs_q: ArrayLike,
    inputs_k: Optional[ArrayLike] = None,
    inputs_v: Optional[ArrayLike] = None,
    *,
    mask: Optional[ArrayLike] = None,
    deterministic: Optional[bool] = None,
    rngs: Any = None,
    sow_weights: bool = False,
    decode: Optional[bool] = None,
    is_causal: bool = False,
    out_sharding: Any = None,
    qkv_sharding: Any = None,
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
      inputs_k: [B,S,Dkv] (default inputs_q).
      inputs_v: [B,S,Dkv] (default inputs_k).
      mask: True / nonzero = attend, broadcastable to [B,N,T,S].
      deterministic: Flax's; True turns dropout off (default: the constructor's).
      rngs: Flax's; used only with dropout.
      sow_weights: store the attention weights [B,N,T,S] as nnx.Intermediate 'attention_weights' (computed by
        the jnp reference: O(T*S)).
      decode: use the KV cache of init_cache (default: the constructor's, else False): each call (a prefill of
        T tokens, then T = 1 steps) appends its keys / values and attends to the filled part with bottom-right
        alignment, through sinkattn.decode_attention when T <= DECODE_MAX_TOKENS (and causal, or T = 1, and no
        mask).
      is_causal: Flax's call-time causal mask, on top of the constructor's is_causal.
      out_sharding: of the out projection's output (Flax's).
      qkv_sharding: of the q/k/v projections' outputs (Flax's).
      query_positions: [B,T] int RoPE positions (default 0..T-1, or the cache index onwards).
      key_value_positions: [B,S] int RoPE positions (default: query_positions in self-attention).
      query_seq_lengths: [B] int, as in sinkattn.dot_product_attention.
      key_value_seq_lengths: [B] int.
      query_segment_ids: [B,T] int.
      key_value_segment_ids: [B,S] int.
      return_residual: also return lse [B,T,N] fp32.

    Returns:
      [B,T,out_features] (and lse with return_residual=True).
    """
    del rngs  # used only with dropout, refused by check_dropout
    inputs_k, inputs_v, key_value_positions, self_attention = layers.key_value_inputs(
      inputs_q, inputs_k, inputs_v, None, query_positions, key_value_positions
    )
    if inputs_q.shape[-1] != self.in_features:
      raise ValueError(
        f"inputs_q: last dim {inputs_q.shape[-1]}, expected in_features {self.in_features} (shape "
        f"{tuple(inputs_q.shape)})"
      )
    if self.dropout_rate > 0.0:
      layers.check_dropout(self.dropout_rate, self.deterministic if deterministic is None else deterministic)
    proj = {} if qkv_sharding is None else dict(out_sharding=qkv_sharding)
    q, k, v = self.query(inputs_q, **proj), self.key(inputs_k, **proj), self.value(inputs_v, **proj)
    if self.normalize_qk:
      q, k = self.query_ln(q), self.key_ln(k)
    decode = self.decode if decode is None else decode
    call = {}
    if decode:
      if self.cache_index is None:
        raise ValueError("decode=True needs init_cache(input_shape) first")
      layers.check_decode_inputs(
        self_attention,
        query_seq_lengths=query_seq_lengths,
        key_value_seq_lengths=key_value_seq_lengths,
        query_segment_ids=query_segment_ids,
        key_value_segment_ids=key_value_segment_ids,
      )
      index = self.cache_index[...]
      rope = self.rope_base if self.use_rope else None
      k, v, query_positions = layers.cache_update(
        self.cached_key[...], self.cached_value[...], index, k, v, query_positions, rope
      )
      self.cached_key[...], self.cached_value[...], self.cache_index[...] = k, v, index + q.shape[1]
      causal = self.attention.is_causal or is_causal
      call = layers.cached_call(q.shape[1], index + q.shape[1], q.shape[0], causal, mask)
    if self.use_rope:
      q, k = layers.rotate(q, k, query_positions, key_value_positions, self.rope_base, keys_cached=decode)
    res = self.attention(
      q,
      k,
      v,
      mask=mask,
      is_causal=is_causal,
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
    y = self.out(out) if out_sharding is None else self.out(out, out_sharding=out_sharding)
    return (y, lse) if return_residual else y
