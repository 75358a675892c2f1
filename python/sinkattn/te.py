"""Transformer Engine's terms, for porting TE code and checkpoints: a linen module with TE's constructor and call
and TE's mask convention, TE's sequence descriptor, and converters of TE parameter trees.

- `DotProductAttention`: transformer_engine.jax.flax.DotProductAttention's fields (head_dim,
  num_attention_heads, num_gqa_groups, attn_mask_type, attn_bias_type, window_size, transpose_batch_sequence,
  scale_factor, softmax_type, ...) with TE's defaults (attn_mask_type 'causal'), and its call
  `(query, key, value, sequence_descriptor=None, bias=None, *, deterministic, mask)`, where an array mask is
  TE's: True = masked OUT. Everywhere else in sinkattn (the op, sinkattn.flax, sinkattn.nnx) a mask is
  jax.nn's and Flax's, True = attend.
- `SequenceDescriptor`: TE's (lengths, segment ids and positions of packed documents).
- `from_transformer_engine` / `to_transformer_engine`: a TE checkpoint's learnable sink in and out.

The learnable sink is TE's `softmax_offset`, shape (1, N, 1, 1), fp32, zeros init, logical axes
(None, 'heads', None, None) (TE names the head axis 'nvte_head': the converters rename it).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import flax.linen as nn
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from . import _te, layers
from ._te import SequenceDescriptor, from_transformer_engine, to_transformer_engine
from ._validate import ArrayLike
from .layers import SOFTMAX_OFFSET_AXES, normalize_softmax_type

__all__ = ["DotProductAttention", "SequenceDescriptor", "from_transformer_engine", "to_transformer_engine"]


class DotProductAttention(nn.Module):
  """Fused attention with sinks, with Transformer Engine's fields, defaults and mask convention.

  query [B,T,N,H], key [B,S,K,H], value [B,S,K,Hv] -> out [B,T,N,Hv] ([T,B,...] in and out with
  transpose_batch_sequence=True); with return_residual=True also lse [B,T,N] fp32 ([T,B,N]; it includes the
  sink: the attention mass on the sink of row i is exp(a_n - lse_i)).

  Attributes:
    head_dim: TE's; checked against query's last dim when given.
    num_attention_heads: TE's; checked against query's heads when given.
    num_gqa_groups: TE's kv head count; checked against key's heads when given.
    attention_dropout: TE's; dropout is not implemented: > 0 needs deterministic=True at the call.
    attn_mask_type: TE's 'no_mask', 'padding', 'causal' (the default, as TE's), 'padding_causal'
      ('causal_padding'), 'causal_bottom_right', 'padding_causal_bottom_right' (and TE's other spellings); the
      'padding' types take a sequence_descriptor / mask.
    attn_bias_type: TE's None (post-scale when a bias is given), 'no_bias', 'post_scale_bias' (added to the
      scaled logits) or 'pre_scale_bias' (added before the scale: the op gets scale * bias).
    dtype: cast query, key and value to it (None keeps theirs).
    dropout_rng_name: TE's; used only with dropout.
    float32_logits: TE's; the logits are always float32.
    qkv_layout: 'bshd_bshd_bshd' (TE's separate layout); packed layouts raise NotImplementedError.
    scale_factor: TE's logit scale; None: 1/sqrt(H) (the sink is not scaled).
    transpose_batch_sequence: inputs and output are [T,B,N,H] (TE's SBHD).
    window_size: TE's (left, right) around the aligned diagonal, -1 an unbounded side; None: no window
      (gpt-oss: attn_mask_type 'causal', (127, 0)).
    max_segments_per_seq: TE's THD buffer size; THD packing is refused, and segment ids have no limit here.
    context_parallel_causal_load_balanced: TE's; True raises (use sinkattn.ring_attention).
    context_parallel_axis: TE's; non-empty raises (use sinkattn.ring_attention).
    context_parallel_strategy: TE's; checked, used only with context parallelism.
    context_checkpoint_name: the jax.ad_checkpoint name of the output (as TE names it).
    softmax_type: 'vanilla' (or None), 'off_by_one' (or 'off-by-one') or 'learnable'; only 'learnable'
      creates the parameter `softmax_offset`.
    score_mod: TE's; must be None. (TE's JAX module has no soft-cap field, so this class has none either: a
      Gemma-style cap is sinkattn.flax.DotProductAttention's logits_soft_cap.)
    score_mod_bprop: TE's; must be None.
    implementation: sinkattn's, as in sinkattn.dot_product_attention.
  """

  head_dim: Optional[int] = None
  num_attention_heads: Optional[int] = None
  num_gqa_groups: Optional[int] = None
  attention_dropout: float = 0.0
  attn_mask_type: str = "causal"
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
    return_residual: bool = False,
  ):
    """Attention of query over key / value.

    Args:
      query: [B,T,N,H] ([T,B,N,H] with transpose_batch_sequence).
      key: [B,S,K,H].
      value: [B,S,K,Hv].
      sequence_descriptor: TE's: a SequenceDescriptor (lengths, segment ids with 0 = padding, positions) or
        an array mask (True = masked OUT, TE's convention); only with a 'padding' attn_mask_type.
      bias: added to the logits (see attn_bias_type), broadcastable to [B,N,T,S]; differentiable.
      deterministic: TE's; True turns dropout off.
      mask: TE's older name of an array sequence_descriptor (True = masked OUT).
      score_mod_tensors: TE's; must be None.
      score_mod_bprop_tensors: TE's; must be None.
      return_residual: sinkattn's: also return lse [B,T,N] fp32 ([T,B,N] with transpose_batch_sequence).

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
    arrays["bias"] = self._bias(bias, query.shape[-1], opts["scale"])
    res = layers.attend(
      query,
      key,
      value,
      sinks,
      softmax_type=softmax_type,
      implementation=self.implementation,
      return_residual=return_residual,
      **opts,
      **arrays,
    )
    out, lse = res if return_residual else (res, None)
    out = checkpoint_name(out, self.context_checkpoint_name)
    if self.transpose_batch_sequence:
      out = jnp.swapaxes(out, 0, 1)
      lse = None if lse is None else jnp.swapaxes(lse, 0, 1)
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
