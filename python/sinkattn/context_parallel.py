"""Context parallelism with attention sinks: ring attention over a mesh axis that shards the sequence.

Each of the P devices of `axis_name` holds a slice of the sequence of q, k and v; K/V blocks travel around
the ring, every block pair runs the fused kernel without the sink, and the sink enters exactly once, when the
partial results are merged (Transformer Engine's context-parallel paths reject sinks). The layout
'contiguous' gives device r tokens [r*T/P, (r+1)*T/P); 'zigzag' (zigzag_shard / zigzag_unshard) gives it
chunks r and 2P-1-r of 2P, so causal work is the same on every device. How the ring runs: _ring.py.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from . import _ring, _validate
from ._enums import Causal
from ._inputs import lse_public
from ._validate import ArrayLike, Window
from .partitioning import to_varying as _to_varying
from .partitioning import vma as _vma


def zigzag_shard(x: jax.Array, num_shards: int, axis: int = 1) -> jax.Array:
  """Reorders the sequence axis so that splitting it into `num_shards` equal slices gives slice r the
  chunks r and 2P-1-r of the original order.

  Args:
    x: any array; its sequence axis must divide by 2P (P = num_shards).
    num_shards: P, the devices of the ring.
    axis: the sequence axis.

  Returns:
    x reordered along `axis`.

  Raises:
    ValueError: a sequence length that does not divide by 2P.
  """
  return _zigzag(x, num_shards, axis, inverse=False)


def zigzag_unshard(x: jax.Array, num_shards: int, axis: int = 1) -> jax.Array:
  """The inverse of zigzag_shard: back to the original token order.

  Args:
    x: an array in zigzag order along `axis`.
    num_shards: P, the devices of the ring.
    axis: the sequence axis.

  Returns:
    x in the original order.

  Raises:
    ValueError: a sequence length that does not divide by 2P.
  """
  return _zigzag(x, num_shards, axis, inverse=True)


def _zigzag(x, n, axis, inverse):
  axis = axis % x.ndim
  length = x.shape[axis]
  if length % (2 * n):
    raise ValueError(
      f"zigzag: sequence length {length} (axis {axis} of shape {x.shape}) must divide by 2 * num_shards = {2 * n}"
    )
  order = np.array([c for r in range(n) for c in (r, 2 * n - 1 - r)])
  if inverse:
    order = np.argsort(order)
  chunks = x.reshape(x.shape[:axis] + (2 * n, length // (2 * n)) + x.shape[axis + 1 :])
  return jnp.take(chunks, order, axis=axis).reshape(x.shape)


def ring_attention(
  query: ArrayLike,
  key: ArrayLike,
  value: ArrayLike,
  *,
  sinks: Optional[ArrayLike] = None,
  axis_name: Any,
  layout: str = "contiguous",
  softmax_type: Optional[str] = None,
  scale: Optional[float] = None,
  is_causal: bool = False,
  causal_alignment: str = "top_left",
  local_window_size: Window = None,
  query_seq_lengths: Optional[ArrayLike] = None,
  key_value_seq_lengths: Optional[ArrayLike] = None,
  query_segment_ids: Optional[ArrayLike] = None,
  key_value_segment_ids: Optional[ArrayLike] = None,
  return_residual: bool = False,
  logits_soft_cap: Optional[float] = None,
) -> Union[jax.Array, Tuple[jax.Array, jax.Array]]:
  """dot_product_attention over a sequence sharded on mesh axis `axis_name`; call it inside shard_map.

  Each argument is this device's slice of the sequence, in the `layout` 'contiguous' (slice r of the natural
  order) or 'zigzag' (chunks r and 2P-1-r of 2P: see zigzag_shard; balances causal work). Bottom-right causal
  alignment is supported without sequence lengths (its offset S - T is then static).

  Args:
    query: [B,T/P,N,H].
    key: [B,S/P,K,H].
    value: [B,S/P,K,Hv].
    sinks: [N] or [1,N,1,1], as in sinkattn.dot_product_attention.
    axis_name: the mesh axis (or axes) of the ring.
    layout: 'contiguous' or 'zigzag'.
    softmax_type: as in sinkattn.dot_product_attention.
    scale: as in sinkattn.dot_product_attention.
    is_causal: as in sinkattn.dot_product_attention.
    causal_alignment: as in sinkattn.dot_product_attention.
    local_window_size: as in sinkattn.dot_product_attention.
    query_seq_lengths: [B], the GLOBAL lengths (replicated).
    key_value_seq_lengths: [B], the GLOBAL lengths (replicated).
    query_segment_ids: [B,T/P], sharded like the sequence.
    key_value_segment_ids: [B,S/P], sharded like the sequence.
    return_residual: also return lse [B,T/P,N] (jax.nn's residual layout).
    logits_soft_cap: as in sinkattn.dot_product_attention: every block caps its own logits the same way, so the
      merge of the blocks' partial results is the one of uncapped attention.

  Returns:
    This device's rows of out [B,T/P,N,Hv] (and lse [B,T/P,N] with return_residual=True); differentiable in
    query, key, value and sinks, and through lse.

  Raises:
    ValueError / TypeError: a bad argument, named.
    NotImplementedError: bottom-right alignment with sequence lengths.
  """
  o, x = _validate.arguments(
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
    return_residual=return_residual,
    logits_soft_cap=logits_soft_cap,
  )
  if layout not in ("contiguous", "zigzag"):
    raise ValueError(f"layout: expected 'contiguous' or 'zigzag', got {layout!r}")
  size = jax.lax.axis_size(axis_name)
  T, S = query.shape[1], key.shape[1]
  if layout == "zigzag" and (T % 2 or S % 2):
    raise ValueError(
      f"layout='zigzag': local query/key lengths must be even (two chunks per device), "
      f"got query {tuple(query.shape)}, key {tuple(key.shape)}"
    )
  shift = 0
  if o.causal == Causal.BOTTOM_RIGHT:
    if x.q_lens is not None or x.kv_lens is not None:
      raise NotImplementedError(
        "ring_attention: causal_alignment='bottom_right' with sequence lengths "
        "has a per-batch diagonal; use 'top_left' or no lengths"
      )
    shift = size * (S - T)
  cfg = _ring.Ring(
    axis_name,
    size,
    layout == "zigzag",
    o.softmax,
    o.causal != 0,
    o.window_left,
    o.window_right,
    shift,
    o.scale,
    o.return_residual,
    o.logits_soft_cap,
  )
  if x.sinks is not None:  # partial dsinks of each device are summed by the transpose of this cast
    x = x._replace(sinks=_to_varying(x.sinks, _vma(query)))
  if not o.return_residual:
    return _ring.ring(cfg, x)
  out, lse = _ring.ring(cfg, x)
  return out, lse_public(lse)


def _entry(axes):
  axes = tuple(a for a in (axes if isinstance(axes, (tuple, list)) else (axes,)) if a is not None)
  return None if not axes else axes[0] if len(axes) == 1 else axes


def ring_attention_sharded(
  query: ArrayLike,
  key: ArrayLike,
  value: ArrayLike,
  *,
  sinks: Optional[ArrayLike] = None,
  mesh: jax.sharding.Mesh,
  axis_name: Any,
  batch_axes: Any = None,
  head_axes: Any = None,
  query_seq_lengths: Optional[ArrayLike] = None,
  key_value_seq_lengths: Optional[ArrayLike] = None,
  query_segment_ids: Optional[ArrayLike] = None,
  key_value_segment_ids: Optional[ArrayLike] = None,
  **options: Any,
) -> Union[jax.Array, Tuple[jax.Array, jax.Array]]:
  """ring_attention on global arrays: runs the shard_map for the caller.

  Args:
    query: [B,T,N,H], global, in `layout` order (zigzag_shard it first for layout='zigzag').
    key: [B,S,K,H], global.
    value: [B,S,K,Hv], global.
    sinks: [N] or [1,N,1,1].
    mesh: the device mesh.
    axis_name: the mesh axis that splits the sequence (the ring).
    batch_axes: mesh axis (or axes) that split the batch.
    head_axes: mesh axis (or axes) that split the heads, q and kv alike (their size must divide K).
    query_seq_lengths: [B], global.
    key_value_seq_lengths: [B], global.
    query_segment_ids: [B,T], global.
    key_value_segment_ids: [B,S], global.
    **options: ring_attention's other keywords (layout, softmax_type, scale, is_causal, logits_soft_cap, ...).

  Returns:
    The global out [B,T,N,Hv] (and lse [B,T,N] with return_residual=True).

  Raises:
    ValueError: head axes that do not divide K, or any error of ring_attention.
  """
  b, h = _entry(batch_axes), _entry(head_axes)
  m = int(np.prod([mesh.shape[a] for a in ((h,) if isinstance(h, str) else h or ())]))
  if key.shape[2] % m:
    raise ValueError(
      f"head_axes={head_axes!r}: {m} shards do not divide the K = {key.shape[2]} kv heads of key {tuple(key.shape)}"
    )
  seq = P(b, axis_name, h, None)
  lse_spec = P(b, axis_name, h)
  arrays = dict(
    query_seq_lengths=query_seq_lengths,
    key_value_seq_lengths=key_value_seq_lengths,
    query_segment_ids=query_segment_ids,
    key_value_segment_ids=key_value_segment_ids,
  )
  specs = dict(
    query_seq_lengths=P(b),
    key_value_seq_lengths=P(b),
    query_segment_ids=P(b, axis_name),
    key_value_segment_ids=P(b, axis_name),
  )
  given = {n: x for n, x in arrays.items() if x is not None}
  sink_spec = None if sinks is None else P(None, h, None, None) if sinks.ndim == 4 else P(h)

  def body(q, k, v, s, extra):
    return ring_attention(q, k, v, sinks=s, axis_name=axis_name, **extra, **options)

  out_specs = (seq, lse_spec) if options.get("return_residual", False) else seq
  fn = jax.shard_map(
    body, mesh=mesh, in_specs=(seq, seq, seq, sink_spec, {n: specs[n] for n in given}), out_specs=out_specs
  )
  return fn(query, key, value, sinks, given)
