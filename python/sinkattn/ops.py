"""sinkattn.dot_product_attention: argument checking, the fused path (custom_vjp over the two FFI calls of
primitives.py, partitioned over batch and heads by partitioning.py) and the pure-jnp reference path
(reference.py, differentiated by JAX), chosen by _routing.run."""

from __future__ import annotations

import functools
from typing import Any, Optional, Tuple, Union

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from . import _routing, _validate, partitioning, reference
from ._inputs import Inputs, lse_public
from ._validate import ArrayLike, Window


def _statics(o: _validate.Options):
  return dict(
    softmax=o.softmax,
    causal=o.causal,
    window_left=o.window_left,
    window_right=o.window_right,
    diag_offset=0,
    scale=o.scale,
    logits_soft_cap=o.logits_soft_cap,
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(o, x: Inputs):
  """-> (out, lse [B,N,T]); lse unused by the caller costs no backward work (a symbolic zero cotangent)."""
  return partitioning.attn_fwd(x, **_statics(o))


def _fused_fwd(o, x):
  # symbolic_zeros: each array of x comes as a CustomVJPPrimal with `perturbed`, so a bias that is not
  # differentiated (a constant, or one computed from undifferentiated values) costs no dbias in the backward.
  want_dbias = x.bias is not None and x.bias.perturbed
  x = jax.tree.map(lambda p: p.value, x)
  out, lse = partitioning.attn_fwd(x, **_statics(o))
  return (out, lse), (x, out, lse, want_dbias)


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
  x, out, lse, want_dbias = res
  dout, dlse = ct
  if isinstance(dlse, SymbolicZero):  # lse returned but not used
    dlse = None
  if isinstance(dout, SymbolicZero):
    dout = jnp.zeros(out.shape, out.dtype)
  g = partitioning.attn_bwd(x, out, lse, dout, dlse, **_statics(o), want_dbias=want_dbias)
  dsinks = g.dsinks if x.sinks is not None else None
  dbias = None if g.dbias is None else g.dbias.astype(x.bias.dtype)
  grads = Inputs(q=g.dq, k=g.dk, v=g.dv, sinks=dsinks, bias=dbias)
  # None for the integer arrays and the mask: no cotangent
  return (Inputs(*(None if d is None else _typed_like(d, p) for d, p in zip(grads, x))),)


_fused.defvjp(_fused_fwd, _fused_bwd, symbolic_zeros=True)


def _sow_weights(module, c: _validate.Checked):
  """What Flax's own attention does with `module` (given when the caller asks to sow): store the attention
  probabilities [B,N,T,S] as 'attention_weights' in the module's intermediates (computed by the reference:
  the fused kernels never hold them)."""
  w = reference.weights(c.inputs, **_statics(c.opts))
  from flax import nnx  # only a Flax module reaches this point

  collection = nnx.Intermediate if isinstance(module, nnx.Module) else "intermediates"
  module.sow(collection, "attention_weights", w)


def dot_product_attention(
  query: ArrayLike,
  key: ArrayLike,
  value: ArrayLike,
  bias: Optional[ArrayLike] = None,
  mask: Optional[ArrayLike] = None,
  *,
  scale: Optional[float] = None,
  is_causal: bool = False,
  query_seq_lengths: Optional[ArrayLike] = None,
  key_value_seq_lengths: Optional[ArrayLike] = None,
  local_window_size: Window = None,
  implementation: Optional[str] = None,
  return_residual: bool = False,
  sinks: Optional[ArrayLike] = None,
  softmax_type: Optional[str] = None,
  causal_alignment: str = "top_left",
  query_segment_ids: Optional[ArrayLike] = None,
  key_value_segment_ids: Optional[ArrayLike] = None,
  query_positions: Optional[ArrayLike] = None,
  key_value_positions: Optional[ArrayLike] = None,
  logits_soft_cap: Optional[float] = None,
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
  """Scaled dot-product attention with attention sinks: jax.nn.dot_product_attention's arguments, in its order
  and with its meaning, then sinkattn's as keywords.

  For each batch b, query head n and row i:
  lse_i = log(sum_j exp(s_ij) + exp(a_n)), out_i = sum_j exp(s_ij - lse_i) v_j, with
  s_ij = scale * q_i . k_j + bias[b, n, i, j] over the valid keys j (soft-capped to
  cap * tanh(s_ij / cap) with logits_soft_cap), and the sink logit a_n = -inf ('vanilla'), 0 ('off_by_one') or
  sinks[n] ('learnable'; float32, not scaled, not biased, not capped). Query head n reads kv head n // (N // K).

  Replacing jax.nn.dot_product_attention by this function changes no number of a call jax.nn accepts, with
  these exceptions, each either refused with an error naming the argument or a documented difference:
  - a row with no valid key (every key masked, or every key past key_value_seq_lengths, or a query row past
    query_seq_lengths): out 0 and lse = a_n (-inf for 'vanilla'). jax.nn gives such a row the mean of the
    values its mask hides (0 past query_seq_lengths) and lse -0.7 * float32 max + log(S): a value hidden by a
    mask never reaches an output here.
  - lse is float32 (jax.nn rounds it to the input dtype) and differentiable (jax.nn stops its gradient: wrap
    it in jax.lax.stop_gradient for jax.nn's gradients).
  - refused: a negative local_window_size side (jax.nn shifts the window off the diagonal; None is an
    unbounded side here), a traced or zero scale, a bool or integer bias, ranks other than jax.nn documents.
  Beyond jax.nn: a mask may be numeric (nonzero = attend, as Flax builds masks), value may have its own
  head dim Hv, lengths may be any integer dtype.

  The function also serves as the `attention_fn` of flax.linen.MultiHeadDotProductAttention and
  flax.nnx.MultiHeadAttention: it declares every argument they pass. dropout_rng, broadcast_dropout and
  deterministic matter only with dropout, which is not implemented (dropout_rate > 0 with
  deterministic other than True raises); precision and force_fp32_for_softmax are met by every path
  (products of the input dtype accumulated in float32, the softmax in float32); a custom einsum raises.

  Args:
    query: [B,T,N,H] (or [T,N,H], as jax.nn), float32, float16 or bfloat16 (float64 with
      implementation='reference').
    key: [B,S,K,H] (or [S,K,H]) in query's dtype; K divides N.
    value: [B,S,K,Hv] (or [S,K,Hv]) in query's dtype.
    bias: added to the scaled logits; broadcastable to [B,N,T,S] (rank 4, each dim 1 or full; a lower rank
      gets leading size-1 axes, as jax.nn); float32, float16 or bfloat16. Its gradient comes back reduced to
      its shape and dtype, and is computed only when the bias is differentiated.
    mask: broadcastable to [B,N,T,S] like bias; bool True = attend, or numeric nonzero = attend (as Flax's
      make_causal_mask / make_attention_mask build it; NaN counts as nonzero). A masked key is absent: no
      value of it (NaN and infinities included) reaches the output of a row that sees another key.
    scale: logit scale (static float); default 1/sqrt(H).
    is_causal: mask keys after the aligned diagonal (top-left by default, as jax.nn).
    query_seq_lengths: [B] int: valid query rows (padding at the end; clamped to [0, T]); the others give 0.
    key_value_seq_lengths: [B] int: valid keys (clamped to [0, S]).
    local_window_size: w (= (w, w)) or (left, right) around the aligned diagonal: key j is valid for row i
      when i - left <= j <= i + right (jax.nn's window); None: unbounded (a side None: that side unbounded).
    implementation: None (the fused kernel of the platform; env SINKATTN_IMPLEMENTATION=reference picks
      the reference), 'fused', 'reference' or 'xla' (the pure jnp twin, O(T*S) memory: tells a kernel bug
      from a model bug), 'cudnn' (the CUDA kernels; an error where they cannot run). On GPU, what the CUDA
      kernels do not take (the library says which: float32 inputs, head dims other than
      16/32/64/96/128/192/256, and for now a bias, mask, positions or logits_soft_cap) runs the reference, with
      one warning naming the reason.
    return_residual: also return lse [B,T,N] float32 (jax.nn's layout; it includes the sink).
    sinks: [N] or [1,N,1,1] (Transformer Engine's softmax_offset shape), any float dtype; the gradient
      comes back in its shape and dtype.
    softmax_type: 'vanilla', 'off_by_one' (alias 'off-by-one') or 'learnable'; None: 'learnable' when
      sinks is given, else 'vanilla'.
    causal_alignment: 'top_left' (j <= i) or 'bottom_right' (j <= i + kv_len - q_len: the last query sees
      the last key).
    query_segment_ids: [B,T] int; with key_value_segment_ids [B,S] int: packed documents, a query sees
      only the keys of its segment.
    key_value_segment_ids: see query_segment_ids.
    query_positions: [B,T] int, with key_value_positions [B,S] int (Transformer Engine's segment_pos):
      the causal and window masks compare positions instead of indices (key j valid for row i when
      kv_pos[j] <= q_pos[i], and within [q_pos[i] - left, q_pos[i] + right] with a window). They need
      is_causal or a window, and top-left alignment.
    key_value_positions: see query_positions.
    logits_soft_cap: Gemma's logit soft-capping (tokamax's definition): each logit l = scale * q.k + bias becomes
      cap * tanh(l / cap), bounded by cap, before any mask; the sink logit is not capped, and every gradient
      (query, key, value, sinks, bias, through lse too) flows through it. A static Python float > 0 and at most
      2.35e38 (as float32, the kernels' precision, with cap * log2(e) finite: they keep logits in base 2; each new
      value compiles anew), or None (no cap).
    dropout_rng: Flax's; used only with dropout (not implemented).
    dropout_rate: Flax's; 0.0, or any rate with deterministic=True.
    broadcast_dropout: Flax's; used only with dropout.
    deterministic: Flax's; True turns dropout off.
    dtype: Flax's computation dtype: query, key and value are cast to it first (None keeps theirs).
    precision: Flax's; None, a jax.lax.Precision, its name or a pair of them (met by every path: products
      accumulated in float32 from the inputs as given); anything else raises. DEFAULT alone lets a float32 call
      on a GPU run the CUDA kernels, which round float32 inputs to bf16 for their products (what DEFAULT gives a
      float32 matmul on a TPU); with any other precision such a call runs the reference there.
    module: Flax's: the module to sow the attention weights [B,N,T,S] into ('intermediates' /
      nnx.Intermediate, name 'attention_weights'), computed by the reference.
    force_fp32_for_softmax: Flax's; the softmax is always float32.
    qk_attn_weights_einsum: Flax's; must be None.
    attn_weights_value_einsum: Flax's; must be None.

  Returns:
    out [B,T,N,Hv] in query's dtype, or (out, lse [B,T,N] float32) with return_residual=True ([T,N,Hv] and
    [T,N] for a rank-3 query). Differentiable in query, key, value, sinks and bias, and through lse.

  Raises:
    ValueError / TypeError: an argument with a wrong shape, dtype or value (the message names it, the
      shape seen and the one expected), at trace time.
    NotImplementedError: dropout, a custom einsum.
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
  query, key, value, bias, mask, squeeze = _validate.as_rank4(query, key, value, bias, mask)
  if dtype is not None:
    query, key, value = (x.astype(dtype) if hasattr(x, "astype") else x for x in (query, key, value))
  c = _validate.arguments(
    query,
    key,
    value,
    sinks=sinks,
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
    logits_soft_cap=logits_soft_cap,
    return_residual=return_residual,
    allow_f64=impl == "reference",
  )
  o = c.opts
  out, lse = _routing.run(
    impl,
    query,
    c.inputs,
    op="dot_product_attention",
    fused=lambda x: _fused(o, x),
    reference=lambda x: reference.attention(x, **_statics(o)),
    cuda_reason=lambda: _routing.cuda_reason(
      c.inputs,
      statics=_statics(o),
      logits_soft_cap=o.logits_soft_cap,
      default_precision=_validate.default_precision(precision),
    ),
  )
  if module is not None:
    _sow_weights(module, c)
  lse = lse_public(lse)
  if squeeze:
    out, lse = out[0], lse[0]
  return (out, lse) if o.return_residual else out
