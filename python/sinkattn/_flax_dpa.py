"""The linen `DotProductAttention` of `sinkattn.flax`, which re-exports it and documents it on its page:
Transformer Engine's constructor and call (transformer_engine.jax.flax.DotProductAttention), read through the
conventions of `_te`, then sinkattn's options, running `layers.attend`. `sinkattn.flax.MultiHeadAttention`
builds its 'attention' submodule from it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import flax.linen as nn
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from . import _te, layers
from ._validate import ArrayLike, Window
from .layers import SOFTMAX_OFFSET_AXES, normalize_softmax_type


class DotProductAttention(nn.Module):
  """Fused attention with sinks as a module, with Transformer Engine's fields first, then sinkattn's.

  query [B,T,N,H], key [B,S,K,H], value [B,S,K,Hv] -> out [B,T,N,Hv] ([T,B,...] in and out with
  transpose_batch_sequence=True); with return_residual=True also lse [B,N,T] fp32 (it includes the sink: the
  attention mass on the sink of row i is exp(a_n - lse_i)).

  Defaults that differ from Transformer Engine's: attn_mask_type None (TE: 'causal') means no mask unless
  is_causal is set; pass attn_mask_type explicitly when porting TE code. A `mask` (or an array
  sequence_descriptor) follows TE's convention, True = masked OUT; `attention_mask` follows jax.nn's and
  Flax's, True = attend.

  Attributes:
    head_dim: TE's; checked against query's last dim when given.
    num_attention_heads: TE's; checked against query's heads when given.
    num_gqa_groups: TE's kv head count; checked against key's heads when given.
    attention_dropout: TE's; dropout is not implemented: > 0 needs deterministic=True at the call.
    attn_mask_type: TE's 'no_mask', 'padding', 'causal', 'padding_causal' ('causal_padding'),
      'causal_bottom_right', 'padding_causal_bottom_right' (and TE's other spellings); the 'padding' types
      take a sequence_descriptor / mask. None: is_causal and causal_alignment decide.
    attn_bias_type: TE's None (post-scale when a bias is given), 'no_bias', 'post_scale_bias' (added to the
      scaled logits) or 'pre_scale_bias' (added before the scale: the op gets scale * bias).
    dtype: cast query, key and value to it (None keeps theirs).
    dropout_rng_name: TE's; used only with dropout.
    float32_logits: TE's; the logits are always float32.
    qkv_layout: 'bshd_bshd_bshd' (TE's separate layout); packed layouts raise NotImplementedError.
    scale_factor: TE's name of `scale`.
    transpose_batch_sequence: inputs and output are [T,B,N,H] (TE's SBHD).
    window_size: TE's (left, right), -1 unbounded; the same as local_window_size.
    max_segments_per_seq: TE's THD buffer size; no limit here.
    context_parallel_causal_load_balanced: TE's; True raises (use sinkattn.ring_attention).
    context_parallel_axis: TE's; non-empty raises (use sinkattn.ring_attention).
    context_parallel_strategy: TE's; checked, used only with context parallelism.
    context_checkpoint_name: the jax.ad_checkpoint name of the output (as TE names it).
    softmax_type: 'vanilla' (or None), 'off_by_one' (or 'off-by-one') or 'learnable'; only 'learnable'
      creates the parameter `softmax_offset`.
    score_mod: TE's; must be None.
    score_mod_bprop: TE's; must be None.
    scale: logit scale, default 1/sqrt(H) (the sink is not scaled).
    is_causal: as in sinkattn.dot_product_attention.
    causal_alignment: as in sinkattn.dot_product_attention.
    local_window_size: as in sinkattn.dot_product_attention (gpt-oss: is_causal=True, (127, 0)).
    implementation: as in sinkattn.dot_product_attention.
  """

  head_dim: Optional[int] = None
  num_attention_heads: Optional[int] = None
  num_gqa_groups: Optional[int] = None
  attention_dropout: float = 0.0
  attn_mask_type: Optional[str] = None
  attn_bias_type: Optional[str] = None
  dtype: Any = None
  dropout_rng_name: str = "dropout"
  float32_logits: bool = False
  qkv_layout: str = _te.SEPARATE_LAYOUT
  scale_factor: Optional[float] = None
  transpose_batch_sequence: bool = False
  window_size: Optional[Tuple[int, int]] = None
  max_segments_per_seq: Optional[int] = 1
  context_parallel_causal_load_balanced: bool = False
  context_parallel_axis: str = ""
  context_parallel_strategy: str = "DEFAULT"
  context_checkpoint_name: str = "context"
  softmax_type: Optional[str] = "vanilla"
  score_mod: Optional[Callable] = None
  score_mod_bprop: Optional[Callable] = None
  scale: Optional[float] = None
  is_causal: bool = False
  causal_alignment: str = "top_left"
  local_window_size: Window = None
  implementation: Optional[str] = None

  @nn.compact
  def __call__(
    self,
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    sequence_descriptor: Any = None,
    bias: Optional[ArrayLike] = None,
    *,
    deterministic: bool = False,
    mask: Optional[ArrayLike] = None,
    score_mod_tensors: Any = None,
    score_mod_bprop_tensors: Any = None,
    attention_mask: Optional[ArrayLike] = None,
    query_seq_lengths: Optional[ArrayLike] = None,
    key_value_seq_lengths: Optional[ArrayLike] = None,
    query_segment_ids: Optional[ArrayLike] = None,
    key_value_segment_ids: Optional[ArrayLike] = None,
    query_positions: Optional[ArrayLike] = None,
    key_value_positions: Optional[ArrayLike] = None,
    causal_alignment: Optional[str] = None,
    return_residual: bool = False,
    cache_lengths: Optional[ArrayLike] = None,
    precision: Any = None,
    sow_module: Any = None,
  ):
    """Attention of query over key / value.

    Args:
      query: [B,T,N,H] ([T,B,N,H] with transpose_batch_sequence).
      key: [B,S,K,H].
      value: [B,S,K,Hv].
      sequence_descriptor: TE's: a SequenceDescriptor (lengths, segment ids with 0 = padding, positions) or
        an array mask (True = masked out); only with a 'padding' attn_mask_type (or none).
      bias: added to the logits (see attn_bias_type), broadcastable to [B,N,T,S]; differentiable.
      deterministic: TE's; True turns dropout off.
      mask: TE's older name of an array sequence_descriptor (True = masked out).
      score_mod_tensors: TE's; must be None.
      score_mod_bprop_tensors: TE's; must be None.
      attention_mask: jax.nn's mask, True = attend, broadcastable to [B,N,T,S].
      query_seq_lengths: [B] int, as in sinkattn.dot_product_attention.
      key_value_seq_lengths: [B] int.
      query_segment_ids: [B,T] int.
      key_value_segment_ids: [B,S] int.
      query_positions: [B,T] int, placing the causal / window masks.
      key_value_positions: [B,S] int.
      causal_alignment: overrides the attribute for this call (the KV-cache path uses it).
      return_residual: also return lse [B,N,T] fp32.
      cache_lengths: [B] int: key / value are KV caches filled up to it, the T <= 64 queries being the last
        T entries: runs sinkattn.decode_attention (causal, bottom-right; no other arrays).
      precision: as in sinkattn.dot_product_attention.
      sow_module: a Flax module to sow the attention weights into (MultiHeadAttention's sow_weights).

    Returns:
      out (and lse with return_residual=True).
    """
    for name, x in (("score_mod_tensors", score_mod_tensors), ("score_mod_bprop_tensors", score_mod_bprop_tensors)):
      if x is not None:
        raise NotImplementedError(f"{name}: cuDNN score modification is not implemented")
    if self.attention_dropout and deterministic is not True:
      raise NotImplementedError(
        f"attention_dropout: {self.attention_dropout} with deterministic={deterministic} "
        "asks for dropout, which sinkattn does not implement: pass deterministic=True"
      )
    opts = _te.module_options(self)
    if causal_alignment is not None:
      opts["causal_alignment"] = causal_alignment
    if self.transpose_batch_sequence:
      query, key, value = (jnp.swapaxes(x, 0, 1) for x in (query, key, value))
    self._check_heads(query, key)
    softmax_type = normalize_softmax_type(self.softmax_type)
    sinks = None
    if softmax_type == "learnable":
      init = nn.with_logical_partitioning(nn.initializers.zeros_init(), SOFTMAX_OFFSET_AXES)
      sinks = self.param("softmax_offset", init, (1, query.shape[2], 1, 1), jnp.float32)
    if self.dtype is not None:
      query, key, value = (jnp.asarray(x, self.dtype) for x in (query, key, value))
    positions_used = opts["is_causal"] or opts["local_window_size"] is not None
    arrays = _te.call_arrays(
      sequence_descriptor, mask, attn_mask_type=self.attn_mask_type, positions_used=positions_used
    )
    ours = dict(
      query_seq_lengths=query_seq_lengths,
      key_value_seq_lengths=key_value_seq_lengths,
      query_segment_ids=query_segment_ids,
      key_value_segment_ids=key_value_segment_ids,
      query_positions=query_positions,
      key_value_positions=key_value_positions,
    )
    for name, x in ours.items():
      if x is not None:
        if name in arrays:
          raise ValueError(f"{name}: given, and the sequence_descriptor gives it too: pass one")
        arrays[name] = x
    if attention_mask is not None:
      arrays["mask"] = attention_mask if "mask" not in arrays else jnp.logical_and(arrays["mask"], attention_mask != 0)
    arrays["bias"] = self._bias(bias, query.shape[-1], opts["scale"])
    res = layers.attend(
      query,
      key,
      value,
      sinks,
      softmax_type=softmax_type,
      implementation=self.implementation,
      cache_lengths=cache_lengths,
      return_residual=return_residual,
      module=sow_module,
      precision=precision,
      **opts,
      **arrays,
    )
    out, lse = res if return_residual else (res, None)
    out = checkpoint_name(out, self.context_checkpoint_name)
    if self.transpose_batch_sequence:
      out = jnp.swapaxes(out, 0, 1)
    return (out, lse) if return_residual else out

  def _check_heads(self, query, key):
    for name, want, got, what in (
      ("head_dim", self.head_dim, query.shape[-1], "query's last dim"),
      ("num_attention_heads", self.num_attention_heads, query.shape[-2], "query's heads"),
      ("num_gqa_groups", self.num_gqa_groups, key.shape[-2], "key's heads"),
    ):
      if want is not None and want != got:
        raise ValueError(f"{name}: {want}, but {what} is {got} (query {tuple(query.shape)}, key {tuple(key.shape)})")

  def _bias(self, bias, head_dim, scale):
    """TE's attn_bias_type: None / 'post_scale_bias' add the bias to the scaled logits, 'pre_scale_bias'
    before the scale (so scale * bias after it)."""
    kind = self.attn_bias_type
    if kind == "no_bias" and bias is not None:
      raise ValueError("bias: given, but attn_bias_type='no_bias'")
    if kind in ("pre_scale_bias", "post_scale_bias") and bias is None:
      raise ValueError(f"bias: None, but attn_bias_type={kind!r} needs one")
    if kind == "pre_scale_bias":
      return bias * (head_dim**-0.5 if scale is None else scale)
    return bias
