"""Trace-time checking and normalisation of the attention functions' arguments.

Every error names the argument, the shape (or value) seen and the one expected, so that nothing reaches
a kernel unchecked, and no argument is accepted without an effect it is documented to have.
"""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple, Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from ._enums import FLOAT_DTYPES as _FLOATS
from ._enums import SOFTMAX_NAMES, Causal, Softmax

# None: the fused kernel of the platform; 'xla' (jax.nn's name for its jnp path) = 'reference'; 'cudnn'
# (jax.nn's name for its fused GPU kernel) = the CUDA kernels, an error where they cannot run.
IMPLEMENTATIONS = (None, "fused", "reference", "xla", "cudnn")
_F64 = np.dtype(np.float64)

ArrayLike = Any  # a jax.Array, a NumPy array or a tracer
Window = Optional[Union[int, Tuple[Optional[int], Optional[int]]]]  # w, (left, right), None / -1 = unbounded


class Options(NamedTuple):
  """The static part of one call (hashable: used as a custom_vjp nondiff argument)."""

  softmax: int
  causal: int
  window_left: int
  window_right: int
  scale: float
  return_residual: bool


class Checked(NamedTuple):
  """The checked arguments of one call: static options and the arrays the kernels read (None = absent)."""

  opts: Options
  sinks: object
  q_lens: object
  kv_lens: object
  q_seg: object
  kv_seg: object
  bias: object
  mask: object
  q_pos: object
  kv_pos: object


def _shape(x):
  return tuple(getattr(x, "shape", ()))


def _check_rank(name, x, rank, letters):
  if not hasattr(x, "shape") or not hasattr(x, "dtype"):
    raise TypeError(f"{name}: expected an array of shape [{letters}], got {type(x).__name__}")
  if len(x.shape) != rank:
    raise ValueError(f"{name}: expected shape [{letters}] (rank {rank}), got shape {_shape(x)}")


def _check_float(name, x, allowed=_FLOATS):
  if np.dtype(x.dtype) not in allowed:
    raise TypeError(f"{name}: dtype {np.dtype(x.dtype).name} unsupported: use " + ", ".join(d.name for d in allowed))


def _check_int_array(name, x, shape, letters):
  if x is None:
    return None
  _check_rank(name, x, len(shape), letters)
  if not jnp.issubdtype(x.dtype, jnp.integer):
    raise TypeError(f"{name}: dtype {np.dtype(x.dtype).name} unsupported: expected an integer dtype (int32)")
  if tuple(x.shape) != shape:
    raise ValueError(f"{name}: expected shape [{letters}] = {shape}, got shape {_shape(x)}")
  return jnp.asarray(x).astype(jnp.int32)


def _static_int(name, x):
  if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
    raise TypeError(f"{name}: expected a Python int (static), got {type(x).__name__} {x!r}")
  return int(x)


def window(local_window_size):
  """None -> (-1, -1); w -> (w, w) (-1: unbounded); (left, right) with None or -1 for an unbounded side."""
  if local_window_size is None:
    return -1, -1
  if isinstance(local_window_size, (tuple, list)):
    if len(local_window_size) != 2:
      raise ValueError(f"local_window_size: expected an int or a pair (left, right), got {local_window_size!r}")
    sides = [-1 if w is None else _static_int("local_window_size", w) for w in local_window_size]
    if min(sides) < -1:
      raise ValueError(
        f"local_window_size: each side must be >= 0 (or -1 / None for unbounded), got {tuple(local_window_size)}"
      )
    return sides[0], sides[1]
  w = _static_int("local_window_size", local_window_size)
  if w < -1:
    raise ValueError(f"local_window_size: expected an int >= 0 (or -1 for unbounded) or a pair (left, right), got {w}")
  return w, w


def implementation(impl):
  """The implementation asked for: 'xla' reads as 'reference'; None reads env SINKATTN_IMPLEMENTATION."""
  if not isinstance(impl, (str, type(None))) or impl not in IMPLEMENTATIONS:
    raise ValueError(f"implementation: expected None, 'fused', 'reference', 'xla' or 'cudnn', got {impl!r}")
  if impl is None and os.environ.get("SINKATTN_IMPLEMENTATION", "").strip().lower() == "reference":
    return "reference"
  return "reference" if impl == "xla" else impl


def _check_broadcast(name, x, full):
  """x must be rank 4 with every dim 1 or the full size of [B,N,T,S] = full (jax.nn's broadcast rule)."""
  want = f"[B,N,T,S] = {full}, each dim 1 or that size"
  if not hasattr(x, "shape") or not hasattr(x, "dtype"):
    raise TypeError(f"{name}: expected an array broadcastable to {want}, got {type(x).__name__}")
  if len(x.shape) != 4:
    raise ValueError(
      f"{name}: expected rank 4, broadcastable to {want}, got shape {_shape(x)} (rank "
      f"{len(x.shape)}: add the leading size-1 axes)"
    )
  for d, (n, f, letter) in enumerate(zip(x.shape, full, "BNTS")):
    if n not in (1, f):
      raise ValueError(
        f"{name}: dim {d} is {n}, expected 1 or {letter} = {f} (broadcastable to {want}), got shape {_shape(x)}"
      )


def _bias(bias, full, allow_f64):
  """A float bias, rank 4 broadcastable to [B,N,T,S]; float64 only where the computation is float64."""
  if bias is None:
    return None
  _check_broadcast("bias", bias, full)
  allowed = _FLOATS + ((_F64,) if allow_f64 else ())
  if np.dtype(bias.dtype) not in allowed:
    hint = ": a boolean / 0-1 array belongs in mask=" if not jnp.issubdtype(bias.dtype, jnp.floating) else ""
    raise TypeError(
      f"bias: dtype {np.dtype(bias.dtype).name} unsupported: use " + ", ".join(d.name for d in allowed) + hint
    )
  return jnp.asarray(bias)


def _mask(mask, full):
  """bool [B|1,N|1,T|1,S|1]: True (numeric: nonzero, NaN included, as jnp.where reads it) = attend."""
  if mask is None:
    return None
  _check_broadcast("mask", mask, full)
  if not (
    jnp.issubdtype(mask.dtype, jnp.bool_)
    or jnp.issubdtype(mask.dtype, jnp.integer)
    or jnp.issubdtype(mask.dtype, jnp.floating)
  ):
    raise TypeError(
      f"mask: dtype {np.dtype(mask.dtype).name} unsupported: use bool (True = attend), or an "
      "integer / float array (nonzero = attend)"
    )
  mask = jnp.asarray(mask)
  return mask if mask.dtype == jnp.bool_ else mask != 0


def _positions(q_pos, kv_pos, B, T, S, causal, wl, wr):
  """int32 [B,T] / [B,S] (both or neither), which place the causal and window masks: an error when neither
  mask is on (the positions would change nothing) or with bottom-right alignment (they place every query)."""
  q_pos = _check_int_array("query_positions", q_pos, (B, T), "B,T")
  kv_pos = _check_int_array("key_value_positions", kv_pos, (B, S), "B,S")
  if (q_pos is None) != (kv_pos is None):
    missing = "key_value_positions" if q_pos is not None else "query_positions"
    raise ValueError(f"{missing}: None, but the other position array is given: pass both or neither")
  if q_pos is not None:
    if causal == Causal.BOTTOM_RIGHT:
      raise ValueError(
        "causal_alignment: 'bottom_right' with query_positions / key_value_positions: the "
        "positions already place every query; use causal_alignment='top_left'"
      )
    if causal == Causal.NONE and (wl, wr) == (-1, -1):
      raise ValueError(
        "query_positions / key_value_positions: given, but neither is_causal nor "
        "local_window_size is set: positions only place the causal and window masks"
      )
  return q_pos, kv_pos


def flax_arguments(
  *,
  dropout_rate,
  deterministic,
  broadcast_dropout,
  precision,
  force_fp32_for_softmax,
  qk_attn_weights_einsum,
  attn_weights_value_einsum,
):
  """The arguments Flax passes to an attention_fn: accepted where they leave the result as computed
  (no dropout applied, a precision and an fp32 softmax that the kernels meet or exceed), refused where they
  would change it."""
  if isinstance(dropout_rate, (bool, np.bool_)) or not isinstance(dropout_rate, (int, float, np.integer, np.floating)):
    raise TypeError(f"dropout_rate: expected a Python float (static), got {type(dropout_rate).__name__}")
  if not 0.0 <= float(dropout_rate) < 1.0:
    raise ValueError(f"dropout_rate: expected a float in [0, 1), got {dropout_rate!r}")
  for name, x in (
    ("deterministic", deterministic),
    ("broadcast_dropout", broadcast_dropout),
    ("force_fp32_for_softmax", force_fp32_for_softmax),
  ):
    if x is not None and not isinstance(x, (bool, np.bool_)):
      raise TypeError(f"{name}: expected a Python bool, got {type(x).__name__}")
  if dropout_rate > 0 and deterministic is not True:
    raise NotImplementedError(
      f"dropout_rate: {dropout_rate} with deterministic={deterministic} asks for "
      "attention dropout, which sinkattn does not implement: pass deterministic=True "
      "(or dropout_rate=0.0)"
    )
  for name, fn in (
    ("qk_attn_weights_einsum", qk_attn_weights_einsum),
    ("attn_weights_value_einsum", attn_weights_value_einsum),
  ):
    if fn is not None:
      raise NotImplementedError(
        f"{name}: a custom einsum ({fn!r}) replaces a product inside the fused "
        "kernel, which sinkattn cannot do: leave it None"
      )
  ok = (
    precision is None
    or isinstance(precision, (str, jax.lax.Precision))
    or (isinstance(precision, (tuple, list)) and len(precision) == 2)
  )
  if not ok:
    raise TypeError(f"precision: expected None, a jax.lax.Precision, its name or a pair of them, got {precision!r}")


def arguments(
  query,
  key,
  value,
  sinks,
  *,
  softmax_type,
  scale,
  is_causal,
  causal_alignment,
  local_window_size,
  query_seq_lengths,
  key_value_seq_lengths,
  query_segment_ids,
  key_value_segment_ids,
  return_residual,
  bias=None,
  mask=None,
  query_positions=None,
  key_value_positions=None,
  allow_f64=False,
) -> Checked:
  """allow_f64: accept float64 q/k/v and bias (the reference computes in it; the kernels do not).
  -> Checked, with integer arrays as int32 and the mask as bool."""
  _check_rank("query", query, 4, "B,T,N,H")
  _check_rank("key", key, 4, "B,S,K,H")
  _check_rank("value", value, 4, "B,S,K,Hv")
  _check_float("query", query, _FLOATS + ((_F64,) if allow_f64 else ()))
  for name, x in (("key", key), ("value", value)):
    if np.dtype(x.dtype) != np.dtype(query.dtype):
      raise TypeError(
        f"{name}: dtype {np.dtype(x.dtype).name} differs from query's {np.dtype(query.dtype).name}: "
        "query, key and value must share one dtype"
      )
  B, T, N, H = query.shape
  Bk, S, K, Hk = key.shape
  if Bk != B or Hk != H:
    raise ValueError(
      f"key: expected shape [B,S,K,H] = ({B}, S, K, {H}) to match query {_shape(query)}, got shape {_shape(key)}"
    )
  if tuple(value.shape[:3]) != (B, S, K):
    raise ValueError(
      f"value: expected shape [B,S,K,Hv] = ({B}, {S}, {K}, Hv) to match key {_shape(key)}, got shape {_shape(value)}"
    )
  if N % K != 0:
    raise ValueError(
      f"key: kv heads K = {K} must divide the query heads N = {N} (query {_shape(query)}, key {_shape(key)})"
    )
  if H < 1 or value.shape[3] < 1:
    raise ValueError(f"query/value: head dims must be >= 1, got H = {H}, Hv = {value.shape[3]}")

  if softmax_type is None:
    softmax_type = "vanilla" if sinks is None else "learnable"
  if not isinstance(softmax_type, str) or softmax_type.lower() not in SOFTMAX_NAMES:
    raise ValueError(
      f"softmax_type: expected 'vanilla', 'off_by_one' (or 'off-by-one') or 'learnable', got {softmax_type!r}"
    )
  softmax = SOFTMAX_NAMES[softmax_type.lower()]
  if softmax == Softmax.LEARNABLE:
    if sinks is None:
      raise ValueError("sinks: softmax_type='learnable' needs sinks of shape [N] or [1,N,1,1], got None")
    if not hasattr(sinks, "shape") or not hasattr(sinks, "dtype"):
      raise TypeError(
        f"sinks: expected an array of shape [N] = ({N},) or [1,N,1,1] = (1, {N}, 1, 1), got {type(sinks).__name__}"
      )
    _check_float("sinks", sinks, _FLOATS + (_F64,))
    if tuple(sinks.shape) not in ((N,), (1, N, 1, 1)):
      raise ValueError(f"sinks: expected shape [N] = ({N},) or [1,N,1,1] = (1, {N}, 1, 1), got shape {_shape(sinks)}")
  elif sinks is not None:
    raise ValueError(
      f"sinks: given, but softmax_type={softmax_type!r} has no learnable sink: "
      "use softmax_type='learnable' (or leave it None)"
    )

  if not isinstance(is_causal, (bool, np.bool_)):
    raise TypeError(f"is_causal: expected a Python bool, got {type(is_causal).__name__}")
  if causal_alignment not in ("top_left", "bottom_right"):
    raise ValueError(f"causal_alignment: expected 'top_left' or 'bottom_right', got {causal_alignment!r}")
  wl, wr = window(local_window_size)
  bottom_right = causal_alignment == "bottom_right"
  if bottom_right and not is_causal and (wl, wr) != (-1, -1):
    raise ValueError(
      "causal_alignment='bottom_right' with a local_window_size needs is_causal=True "
      "(the kernels align the window with the causal diagonal)"
    )
  causal = Causal.NONE if not is_causal else Causal.BOTTOM_RIGHT if bottom_right else Causal.TOP_LEFT

  if scale is None:
    scale = 1.0 / math.sqrt(H)
  elif isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
    raise TypeError(f"scale: expected a Python float (static), got {type(scale).__name__}")
  scale = float(scale)
  if not math.isfinite(scale) or scale == 0.0:
    raise ValueError(f"scale: expected a finite non-zero float, got {scale}")

  q_lens = _check_int_array("query_seq_lengths", query_seq_lengths, (B,), "B")
  kv_lens = _check_int_array("key_value_seq_lengths", key_value_seq_lengths, (B,), "B")
  q_seg = _check_int_array("query_segment_ids", query_segment_ids, (B, T), "B,T")
  kv_seg = _check_int_array("key_value_segment_ids", key_value_segment_ids, (B, S), "B,S")
  if (q_seg is None) != (kv_seg is None):
    missing = "key_value_segment_ids" if q_seg is not None else "query_segment_ids"
    raise ValueError(f"{missing}: None, but the other segment id array is given: pass both or neither")
  full = (B, N, T, S)
  bias = _bias(bias, full, allow_f64)
  mask = _mask(mask, full)
  q_pos, kv_pos = _positions(query_positions, key_value_positions, B, T, S, causal, wl, wr)
  if not isinstance(return_residual, (bool, np.bool_)):
    raise TypeError(f"return_residual: expected a Python bool, got {type(return_residual).__name__}")
  opts = Options(int(softmax), int(causal), wl, wr, scale, bool(return_residual))
  return Checked(opts, sinks, q_lens, kv_lens, q_seg, kv_seg, bias, mask, q_pos, kv_pos)
