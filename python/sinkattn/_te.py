"""Transformer Engine's conventions (transformer_engine.jax.flax.DotProductAttention) on sinkattn's terms, for
`sinkattn.te`: its mask types, bias types, windows, layouts and sequence descriptors as dot_product_attention
arguments, and its checkpoint layout for the learnable sink. Written from TE's documented API; TE itself is not
needed."""

from collections.abc import Mapping
from typing import Any, NamedTuple, Optional, Tuple

import jax.numpy as jnp

# attn_mask_type -> (causal, alignment, padding: whether a sequence descriptor / mask may be given)
MASK_TYPES = {
  "no_mask": (False, "top_left", False),
  "padding": (False, "top_left", True),
  "causal": (True, "top_left", False),
  "padding_causal": (True, "top_left", True),
  "causal_padding": (True, "top_left", True),
  "causal_bottom_right": (True, "bottom_right", False),
  "bottom_right_causal": (True, "bottom_right", False),
  "padding_causal_bottom_right": (True, "bottom_right", True),
  "causal_padding_bottom_right": (True, "bottom_right", True),
  "bottom_right_causal_padding": (True, "bottom_right", True),
  "bottom_right_padding_causal": (True, "bottom_right", True),
}
BIAS_TYPES = (None, "no_bias", "pre_scale_bias", "post_scale_bias")
SEPARATE_LAYOUT = "bshd_bshd_bshd"
PACKED_LAYOUTS = ("bs3hd", "bshd_bs2hd", "t3hd", "thd_t2hd", "thd_thd_thd")
CP_STRATEGIES = ("DEFAULT", "ALL_GATHER", "ALLGATHER", "RING")
FUSED_SCOPE, UNFUSED_SCOPE = "_FusedDotProductAttention_0", "_UnfusedDotProductAttention_0"
TE_HEAD_AXIS, HEAD_AXIS = "nvte_head", "heads"


class SequenceDescriptor(NamedTuple):
  """Transformer Engine's sequence descriptor (same fields and factories), for DotProductAttention's
  `sequence_descriptor`; a TE SequenceDescriptor instance is read the same way.

  Attributes:
    seqlens: (q_seqlens [B], kv_seqlens [B]) int: valid lengths, padding at the end.
    seq_offsets: (q, kv) offsets of THD packing: not implemented (a ValueError names it at the call).
    segment_ids: (q [B,T], kv [B,S]) int, 1, 2, ... per packed document, 0 = padding.
    segment_pos: (q [B,T], kv [B,S]) int positions within each document: the causal and window masks
      compare them.
  """

  seqlens: Optional[Tuple[Any, Any]] = None
  seq_offsets: Optional[Tuple[Any, Any]] = None
  segment_ids: Optional[Tuple[Any, Any]] = None
  segment_pos: Optional[Tuple[Any, Any]] = None

  @classmethod
  def from_seqlens(cls, seqlens) -> "SequenceDescriptor":
    """From sequence lengths: one array for q and kv alike, or a pair (q_seqlens, kv_seqlens)."""
    return cls(seqlens=_pair(seqlens))

  @classmethod
  def from_segment_ids_and_pos(cls, segment_ids, segment_pos) -> "SequenceDescriptor":
    """From segment ids (0 = padding) and positions: each one array for q and kv alike, or a pair."""
    return cls(segment_ids=_pair(segment_ids), segment_pos=_pair(segment_pos))

  @classmethod
  def from_seqlens_and_offsets(cls, seqlens, seq_offsets) -> "SequenceDescriptor":
    """THD packing (lengths and offsets); DotProductAttention refuses it at the call."""
    return cls(seqlens=_pair(seqlens), seq_offsets=_pair(seq_offsets))


def _pair(x):
  return tuple(x) if isinstance(x, (tuple, list)) else (x, x)


def _given(pair):
  """A descriptor field as a pair of arrays, or None when absent (TE fills absent fields with size-0 arrays)."""
  if pair is None:
    return None
  q, kv = pair
  return None if getattr(q, "size", 1) == 0 and getattr(kv, "size", 1) == 0 else (q, kv)


def call_arrays(sequence_descriptor, mask, *, attn_mask_type: Optional[str], positions_used: bool) -> dict:
  """dot_product_attention arrays from TE's call arguments: an array descriptor (or `mask`, its older
  name) is TE's mask, True = masked OUT (returned inverted, as dot_product_attention's True = attend); a
  descriptor object gives lengths, segment ids (0 = padding, so never equal across q and kv) and positions
  (passed where a causal or window mask reads them)."""
  if sequence_descriptor is not None and mask is not None:
    raise ValueError("mask: given together with sequence_descriptor: pass one (mask is TE's older name for it)")
  desc = mask if sequence_descriptor is None else sequence_descriptor
  name = "mask" if sequence_descriptor is None else "sequence_descriptor"
  if desc is None:
    return {}
  if attn_mask_type in MASK_TYPES and not MASK_TYPES[attn_mask_type][2]:
    raise ValueError(
      f"{name}: given, but attn_mask_type={attn_mask_type!r} takes none (Transformer Engine "
      "ignores it): use a 'padding...' mask type"
    )
  if hasattr(desc, "shape"):
    return dict(mask=jnp.logical_not(jnp.asarray(desc).astype(bool)))
  if not all(hasattr(desc, f) for f in SequenceDescriptor._fields):
    raise TypeError(
      f"{name}: expected an array (TE's mask, True = masked out) or a SequenceDescriptor, got {type(desc).__name__}"
    )
  if _given(desc.seq_offsets) is not None:
    raise NotImplementedError(
      f"{name}: seq_offsets (THD packing) is not implemented: describe packed documents "
      "with SequenceDescriptor.from_segment_ids_and_pos on BSHD inputs"
    )
  out = {}
  seqlens, ids, pos = _given(desc.seqlens), _given(desc.segment_ids), _given(desc.segment_pos)
  if seqlens is not None:
    out.update(query_seq_lengths=seqlens[0], key_value_seq_lengths=seqlens[1])
  if ids is not None:
    q_ids, kv_ids = (jnp.asarray(x, jnp.int32) for x in ids)
    out.update(
      query_segment_ids=jnp.where(q_ids == 0, -1, q_ids), key_value_segment_ids=jnp.where(kv_ids == 0, -2, kv_ids)
    )
  if pos is not None and positions_used:
    out.update(query_positions=pos[0], key_value_positions=pos[1])
  return out


def module_options(m) -> dict:
  """dot_product_attention options from the fields of a sinkattn.te.DotProductAttention (TE's), refusing the
  TE features that are not implemented."""
  layout = str(m.qkv_layout).lower()
  if layout in PACKED_LAYOUTS:
    raise NotImplementedError(
      f"qkv_layout: {m.qkv_layout!r} (packed) is not implemented: pass separate query, "
      f"key and value ({SEPARATE_LAYOUT!r})"
    )
  if layout != SEPARATE_LAYOUT:
    raise ValueError(f"qkv_layout: expected {SEPARATE_LAYOUT!r}, got {m.qkv_layout!r}")
  if m.attn_bias_type not in BIAS_TYPES:
    raise ValueError(f"attn_bias_type: expected one of {BIAS_TYPES}, got {m.attn_bias_type!r}")
  for name in ("score_mod", "score_mod_bprop"):
    if getattr(m, name) is not None:
      raise NotImplementedError(f"{name}: cuDNN score modification is not implemented")
  if m.context_parallel_axis or m.context_parallel_causal_load_balanced:
    raise NotImplementedError(
      "context_parallel_axis: context parallelism inside the module is not implemented: "
      "call sinkattn.ring_attention inside shard_map"
    )
  if str(m.context_parallel_strategy).upper() not in CP_STRATEGIES:
    raise ValueError(f"context_parallel_strategy: expected one of {CP_STRATEGIES}, got {m.context_parallel_strategy!r}")
  if m.attn_mask_type not in MASK_TYPES:
    raise ValueError(f"attn_mask_type: expected one of {tuple(MASK_TYPES)}, got {m.attn_mask_type!r}")
  is_causal, alignment, _ = MASK_TYPES[m.attn_mask_type]
  return dict(
    is_causal=is_causal, causal_alignment=alignment, local_window_size=window(m.window_size), scale=m.scale_factor
  )


def window(window_size) -> Optional[Tuple[Optional[int], Optional[int]]]:
  """TE's window_size (left, right), -1 = an unbounded side, as local_window_size (None = unbounded)."""
  if window_size is None:
    return None
  if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
    raise ValueError(f"window_size: expected a pair (left, right) with -1 for an unbounded side, got {window_size!r}")
  if any(isinstance(w, int) and w < -1 for w in window_size):
    raise ValueError(f"window_size: each side must be >= 0, or -1 for unbounded, got {tuple(window_size)}")
  return tuple(None if w == -1 else w for w in window_size)


def _rename_axis(box, old, new):
  names = getattr(box, "names", None)
  if names is None or not hasattr(box, "replace"):
    return box
  return box.replace(names=tuple(new if n == old else n for n in names))


def _like(tree, items):
  """A mapping of tree's type (dict or Flax's FrozenDict) with these items."""
  return dict(items) if isinstance(tree, dict) else type(tree)(dict(items))


def from_transformer_engine(params: Any) -> Any:
  """A Transformer Engine parameter tree with sinkattn's layout for the learnable sink.

  What maps: each TE DotProductAttention keeps its sink at `<path>/_FusedDotProductAttention_0/softmax_offset`
  (or `_UnfusedDotProductAttention_0` when TE ran its unfused path); sinkattn.te.DotProductAttention (and
  sinkattn.flax.DotProductAttention) keep the same array (shape (1, N, 1, 1), fp32) at `<path>/softmax_offset`.
  The logical head axis of its LogicallyPartitioned box, 'nvte_head' in TE, becomes 'heads'. Every other entry
  is returned unchanged (a sinkattn module in place of the TE one at `<path>` then loads the tree); TE's other
  modules (its MultiHeadAttention's fused qkv projections, LayerNorm, ...) have no sinkattn counterpart and are
  not mapped.

  Args:
    params: a nested mapping (dict or FrozenDict) such as `variables` or `variables['params']`.

  Returns:
    A new tree of the same mapping types.

  Raises:
    ValueError: a TE scope holding more than softmax_offset, or a softmax_offset already beside it.
  """
  if not isinstance(params, Mapping):
    return params
  items = {}
  for key, sub in params.items():
    if key in (FUSED_SCOPE, UNFUSED_SCOPE) and isinstance(sub, Mapping) and "softmax_offset" in sub:
      if set(sub) != {"softmax_offset"} or "softmax_offset" in params:
        raise ValueError(
          f"{key}: expected TE's scope with only softmax_offset, got keys {sorted(sub)} beside {sorted(params)}"
        )
      items["softmax_offset"] = _rename_axis(sub["softmax_offset"], TE_HEAD_AXIS, HEAD_AXIS)
    else:
      items[key] = from_transformer_engine(sub)
  return _like(params, items)


def to_transformer_engine(params: Any, fused: bool = True) -> Any:
  """The inverse of `from_transformer_engine`: each `<path>/softmax_offset` moves to
  `<path>/_FusedDotProductAttention_0/softmax_offset` (fused=False: `_UnfusedDotProductAttention_0`), its head
  axis renamed 'nvte_head'.

  Args:
    params: a nested mapping in which every mapping holding `softmax_offset` is a sinkattn DotProductAttention.
    fused: which of TE's two scopes to write (TE picks one at run time from NVTE_FUSED_ATTN and the kernels it
      finds; both hold the same parameter).

  Returns:
    A new tree of the same mapping types.

  Raises:
    ValueError: the TE scope exists already.
  """
  if not isinstance(params, Mapping):
    return params
  items = {k: to_transformer_engine(v, fused) for k, v in params.items() if k != "softmax_offset"}
  if "softmax_offset" in params:
    scope = FUSED_SCOPE if fused else UNFUSED_SCOPE
    if scope in items:
      raise ValueError(f"softmax_offset: its TE scope {scope} exists already beside it")
    items[scope] = _like(params, {"softmax_offset": _rename_axis(params["softmax_offset"], HEAD_AXIS, TE_HEAD_AXIS)})
  return _like(params, items)
