"""sinkattn.dot_product_attention: argument checking, the fused path (custom_vjp over the two FFI calls of
primitives.py, partitioned over batch and heads by partitioning.py) and the pure-jnp reference path
(reference.py, differentiated by JAX), chosen by _routing.run."""

from __future__ import annotations

import functools
from typing import Any, Optional, Tuple, Union

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from . import _lib, _routing, _validate, partitioning, reference
from ._enums import dtype_code
from ._validate import ArrayLike, Window


def _statics(o: _validate.Options):
  return dict(
    softmax=o.softmax,
    causal=o.causal,
    window_left=o.window_left,
    window_right=o.window_right,
    diag_offset=0,
    scale=o.scale,
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(o, q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, bias, mask, q_pos, kv_pos):
  out, lse = partitioning.attn_fwd(
    q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, bias, mask, q_pos, kv_pos, **_statics(o)
  )
  return (out, lse) if o.return_residual else out


def _fused_fwd(o, *primals):
  # symbolic_zeros: each primal comes with `perturbed`, so a bias that is not differentiated (a constant,
  # or one computed from undifferentiated values) costs no dbias in the backward.
  args = [None if p is None else p.value for p in primals]
  out, lse = partitioning.attn_fwd(*args, **_statics(o))
  want_dbias = () if args[8] is not None and primals[8].perturbed else None  # a static flag: () or None
  return ((out, lse) if o.return_residual else out), (args, out, lse, want_dbias)


def _typed_like(g, x):
  """Cotangent g with its primal x's sharding type. Under an Explicit mesh the gradients come typed by
  partitioning.py's plan (batch and heads), but custom_vjp wants each typed like its primal, which may be
  split otherwise (e.g. over T, or heads that the plan keeps whole): reshard to it."""
  if g is None:
    return None
  want, have = jax.typeof(x).sharding, jax.typeof(g).sharding
  if jax.sharding.AxisType.Explicit not in getattr(want.mesh, "axis_types", ()) or want.spec == have.spec:
    return g
  return jax.sharding.reshard(g, want)


def _fused_bwd(o, res, ct):
  args, out, lse, want_dbias = res
  dout, dlse = ct if o.return_residual else (ct, None)
  if isinstance(dlse, SymbolicZero):  # lse returned but not used
    dlse = None
  if isinstance(dout, SymbolicZero):
    dout = jnp.zeros(out.shape, out.dtype)
  dq, dk, dv, dsinks, dbias = partitioning.attn_bwd(
    *args, out, lse, dout, dlse, **_statics(o), want_dbias=want_dbias is not None
  )
  q, k, v, sinks, bias = args[0], args[1], args[2], args[3], args[8]
  dsinks = dsinks if sinks is not None else None
  dbias = None if dbias is None else dbias.astype(bias.dtype)
  dq, dk, dv, dsinks, dbias = (_typed_like(g, x) for g, x in zip((dq, dk, dv, dsinks, dbias), (q, k, v, sinks, bias)))
  return dq, dk, dv, dsinks, None, None, None, None, dbias, None, None, None


_fused.defvjp(_fused_fwd, _fused_bwd, symbolic_zeros=True)


def _cuda_reason(query, key, value):
  """Why the CUDA kernels cannot take this dtype / shape (float32, a head dim outside 16..256), or None."""
  (B, T, N, H), (S, K), Hv = query.shape, key.shape[1:3], value.shape[3]
  try:
    code = dtype_code(query.dtype)
  except KeyError:
    return None
  ok, why = _lib.cuda_supported(code, B, T, S, N, K, H, Hv)
  return None if ok else why


def _sow_weights(module, c: _validate.Checked, query, key, sinks):
  """What Flax's own attention does with `module` (given when the caller asks to sow): store the attention
  probabilities [B,N,T,S] as 'attention_weights' in the module's intermediates (computed by the reference:
  the fused kernels never hold them)."""
  w = reference.weights(
    query, key, sinks, c.q_lens, c.kv_lens, c.q_seg, c.kv_seg, c.bias, c.mask, c.q_pos, c.kv_pos, **_statics(c.opts)
  )
  from flax import nnx  # only a Flax module reaches this point

  collection = nnx.Intermediate if isinstance(module, nnx.Module) else "intermediates"
  module.sow(collection, "attention_weights", w)


def dot_product_attention(
  query: ArrayLike,
  key: ArrayLike,
  value: ArrayLike,
  sinks: Optional[ArrayLike] = None,
  *,
  softmax_type: Optional[str] = None,
  scale: Optional[float] = None,
  is_causal: bool = False,
  causal_alignment: str = "top_left",
  local_window_size: Window = None,
  query_seq_lengths: Optional[ArrayLike] = None,
  key_value_seq_lengths: Optional[ArrayLike] = None,
  query_segment_ids: Optional[ArrayLike] = None,
  key_value_segment_ids: Optional[ArrayLike] = None,
  bias: Optional[ArrayLike] = None,
  mask: Optional[ArrayLike] = None,
  query_positions: Optional[ArrayLike] = None,
  key_value_positions: Optional[ArrayLike] = None,
  return_residual: bool = False,
  implementation: Optional[str] = None,
  dropout_rng: Optional[ArrayLike] = None,
  dropout_rate: float = 0.0,
  broadcast_dropout: bool = True,
  deterministic: Optional[bool] = None,
  dtype: Any = None,
  precision: Any = None,
  module: Any = None,
  force_fp32_for_softmax: bool = False,
  qk_attn_weights_einsum: Any = None,
  attn_weights_value_einsum: Any = None,
) -> Union[jax.Array, Tuple[jax.Array, jax.Array]]:
  """Scaled dot-product attention with attention sinks (layout BTNH, like jax.nn.dot_product_attention).

  For each batch b, query head n and row i:
  lse_i = log(sum_j exp(s_ij) + exp(a_n)), out_i = sum_j exp(s_ij - lse_i) v_j, with
  s_ij = scale * q_i . k_j + bias[b, n, i, j] over the valid keys j, and the sink logit a_n = -inf
  ('vanilla'), 0 ('off_by_one') or sinks[n] ('learnable'; float32, not scaled, not biased). Query head n
  reads kv head n // (N // K). A row with no valid key (or a -inf bias on every key) gives out 0 and
  lse = a_n; jax.nn and Flax give such a row the mean of the values instead.

  The function also serves as the `attention_fn` of flax.linen.MultiHeadDotProductAttention and
  flax.nnx.MultiHeadAttention: it declares every argument they pass. dropout_rng, broadcast_dropout and
  deterministic matter only with dropout, which is not implemented (dropout_rate > 0 with
  deterministic other than True raises); precision and force_fp32_for_softmax are met by every path
  (products of the input dtype accumulated in float32, the softmax in float32); a custom einsum raises.

  Args:
    query: [B,T,N,H], float32, float16 or bfloat16 (float64 with implementation='reference').
    key: [B,S,K,H] in query's dtype; K divides N.
    value: [B,S,K,Hv] in query's dtype.
    sinks: [N] or [1,N,1,1] (Transformer Engine's softmax_offset shape), any float dtype; the gradient
      comes back in its shape and dtype.
    softmax_type: 'vanilla', 'off_by_one' (alias 'off-by-one') or 'learnable'; None: 'learnable' when
      sinks is given, else 'vanilla'.
    scale: logit scale (static float); default 1/sqrt(H).
    is_causal: mask keys after the aligned diagonal.
    causal_alignment: 'top_left' (j <= i) or 'bottom_right' (j <= i + kv_len - q_len: the last query sees
      the last key).
    local_window_size: w (= (w, w)) or (left, right) around that diagonal; None or -1: unbounded side.
    query_seq_lengths: [B] int: valid query rows (padding at the end; clamped to [0, T]).
    key_value_seq_lengths: [B] int: valid keys (clamped to [0, S]).
    query_segment_ids: [B,T] int; with key_value_segment_ids [B,S] int: packed documents, a query sees
      only the keys of its segment.
    key_value_segment_ids: see query_segment_ids.
    bias: added to the scaled logits; rank 4, broadcastable to [B,N,T,S] (each dim 1 or full); float32,
      float16 or bfloat16. Its gradient comes back reduced to its shape and dtype, and is computed only
      when the bias is differentiated.
    mask: rank 4, broadcastable to [B,N,T,S]; bool True = attend, or numeric nonzero = attend (as Flax's
      make_causal_mask / make_attention_mask build it; NaN counts as nonzero).
    query_positions: [B,T] int, with key_value_positions [B,S] int (Transformer Engine's segment_pos):
      the causal and window masks compare positions instead of indices (key j valid for row i when
      kv_pos[j] <= q_pos[i], and within [q_pos[i] - left, q_pos[i] + right] with a window). They need
      is_causal or a window, and top-left alignment.
    key_value_positions: see query_positions.
    return_residual: also return lse [B,N,T] float32 (it includes the sink).
    implementation: None (the fused kernel of the platform; env SINKATTN_IMPLEMENTATION=reference picks
      the reference), 'fused', 'reference' or 'xla' (the pure jnp twin, O(T*S) memory: tells a kernel bug
      from a model bug), 'cudnn' (the CUDA kernels; an error where they cannot run). On GPU, what the CUDA
      kernels do not take (float32 inputs, head dims other than 16/32/64/96/128/192/256, and for now any
      bias, mask or positions) runs the reference, with one warning naming the reason.
    dropout_rng: Flax's; used only with dropout (not implemented).
    dropout_rate: Flax's; 0.0, or any rate with deterministic=True.
    broadcast_dropout: Flax's; used only with dropout.
    deterministic: Flax's; True turns dropout off.
    dtype: Flax's computation dtype: query, key and value are cast to it first (None keeps theirs).
    precision: Flax's; None, a jax.lax.Precision or its name (met by every path).
    module: Flax's: the module to sow the attention weights [B,N,T,S] into ('intermediates' /
      nnx.Intermediate, name 'attention_weights'), computed by the reference.
    force_fp32_for_softmax: Flax's; the softmax is always float32.
    qk_attn_weights_einsum: Flax's; must be None.
    attn_weights_value_einsum: Flax's; must be None.

  Returns:
    out [B,T,N,Hv] in query's dtype, or (out, lse [B,N,T] float32) with return_residual=True.
    Differentiable in query, key, value, sinks and bias, and through lse.

  Raises:
    ValueError / TypeError: an argument with a wrong shape, dtype or value (the message names it, the
      shape seen and the one expected), at trace time.
    NotImplementedError: dropout, a custom einsum, or implementation='fused' with bias / mask / positions
      in a library built without them.
    RuntimeError: implementation='fused' / 'cudnn' where that kernel cannot run.
  """
  impl = _validate.implementation(implementation)
  _validate.flax_arguments(
    dropout_rate=dropout_rate,
    deterministic=deterministic,
    broadcast_dropout=broadcast_dropout,
    precision=precision,
    force_fp32_for_softmax=force_fp32_for_softmax,
    qk_attn_weights_einsum=qk_attn_weights_einsum,
    attn_weights_value_einsum=attn_weights_value_einsum,
  )
  del dropout_rng  # used only with dropout, refused above
  if dtype is not None:
    query, key, value = (x.astype(dtype) if hasattr(x, "astype") else x for x in (query, key, value))
  ref = impl == "reference"
  c = _validate.arguments(
    query,
    key,
    value,
    sinks,
    softmax_type=softmax_type,
    scale=scale,
    is_causal=is_causal,
    causal_alignment=causal_alignment,
    local_window_size=local_window_size,
    query_seq_lengths=query_seq_lengths,
    key_value_seq_lengths=key_value_seq_lengths,
    query_segment_ids=query_segment_ids,
    key_value_segment_ids=key_value_segment_ids,
    bias=bias,
    mask=mask,
    query_positions=query_positions,
    key_value_positions=key_value_positions,
    return_residual=return_residual,
    allow_f64=ref,
  )
  o = c.opts
  # Sinks enter the kernels as float32 [N]; autodiff of this reshape/cast returns the gradient in the
  # caller's shape and dtype.
  sink_dtype = jnp.promote_types(c.sinks.dtype, jnp.float32) if ref and c.sinks is not None else jnp.float32
  s32 = None if c.sinks is None else c.sinks.reshape(query.shape[2]).astype(sink_dtype)
  args = (query, key, value, s32, c.q_lens, c.kv_lens, c.q_seg, c.kv_seg, c.bias, c.mask, c.q_pos, c.kv_pos)

  def ref_path(*a):
    out, lse = reference.attention(*a, **_statics(o))
    return (out, lse) if o.return_residual else out

  features = [n for n, x in (("bias", c.bias), ("mask", c.mask), ("query_positions", c.q_pos)) if x is not None]
  result = _routing.run(
    impl,
    query,
    args,
    op="dot_product_attention",
    fused=lambda *a: _fused(o, *a),
    reference=ref_path,
    features=features,
    cuda_reason=lambda: _cuda_reason(query, key, value),
  )
  if module is not None:
    _sow_weights(module, c, query, key, s32)
  return result
