"""Trace-time checking and normalisation of the attention functions' arguments.

Every error names the argument, the shape (or value) seen and the one expected, so that nothing reaches
a kernel unchecked, and no argument is accepted without an effect it is documented to have. Larger than 400 lines:
every argument's check and error text stays in this one place, which the public functions and modules share.
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
from ._inputs import Inputs

# None: the fused kernel of the platform; 'xla' (jax.nn's name for its jnp path) = 'reference'; 'cudnn'
# (jax.nn's name for its fused GPU kernel) = the CUDA kernels, an error where they cannot run.
IMPLEMENTATIONS = (None, "fused", "reference", "xla", "cudnn")
_F64 = np.dtype(np.float64)

ArrayLike = Any  # a jax.Array, a NumPy array or a tracer
Window = Optional[Union[int, Tuple[Optional[int], Optional[int]]]]  # w, (left, right); None = unbounded (side)


class Options(NamedTuple):
  """The static part of one call (hashable: used as a custom_vjp nondiff argument)."""

  softmax: int
  causal: int
  window_left: int
  window_right: int
  scale: float
  return_residual: bool
  logits_soft_cap: float = 0.0  # the C API's: 0.0 = no cap


class Checked(NamedTuple):
  """The checked arguments of one call: static options and the arrays the kernels read, sinks as [N] float32
  (float64 sinks stay float64 where the computation may be float64), integer arrays as int32, the mask bool."""

  opts: Options
  inputs: Inputs


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
  """-> (left, right) in the C API's terms (-1 = unbounded): None -> (-1, -1); w -> (w, w); (left, right) with
  None for an unbounded side. A negative side is refused: jax.nn reads it as a window shifted off the diagonal
  (local_window_size=(-1, 3): keys i+1 .. i+3), which sinkattn does not take."""
  if local_window_size is None:
    return -1, -1
  if isinstance(local_window_size, (tuple, list)):
    if len(local_window_size) != 2:
      raise ValueError(f"local_window_size: expected an int or a pair (left, right), got {local_window_size!r}")
    sides = [None if w is None else _static_int("local_window_size", w) for w in local_window_size]
  else:
    sides = [_static_int("local_window_size", local_window_size)] * 2
  if any(w is not None and w < 0 for w in sides):
    raise ValueError(
      f"local_window_size: {local_window_size!r} has a negative side, which jax.nn reads as a window shifted off "
      "the diagonal and sinkattn does not implement: use sides >= 0, and None for an unbounded side"
    )
  return tuple(-1 if w is None else w for w in sides)


def soft_cap(logits_soft_cap) -> float:
  """The cap of logits = cap * tanh(l / cap), l = scale * q.k + bias, as the kernels take it: a float32 value
  (returned as a Python float) > 0 with cap * log2(e) a finite float32 (cap <= 2.35e38), or 0.0 for None (no
  cap). A static attribute of the kernels, like scale: a traced value is refused, and each new cap compiles
  anew."""
  x = logits_soft_cap
  if x is None:
    return 0.0
  if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)):
    seen = f"a traced value ({type(x).__name__})" if isinstance(x, jax.core.Tracer) else f"{type(x).__name__} {x!r}"
    raise TypeError(
      f"logits_soft_cap: expected a Python float (static) or None, got {seen}: the cap is a static "
      "attribute of the kernels, like scale"
    )
  cap = float(x)
  if not (math.isfinite(cap) and cap > 0.0):
    hint = " (None, not 0, means no cap)" if cap == 0.0 else ""
    raise ValueError(f"logits_soft_cap: expected a float > 0 and finite, or None for no cap{hint}, got {cap!r}")
  with np.errstate(over="ignore"):  # a cap beyond float32's range becomes inf, refused below
    cap32 = float(np.float32(cap))
    base2 = float(np.float32(cap32) * np.float32(1.4426950408889634))
  if not (math.isfinite(base2) and cap32 > 0.0):  # the kernels keep logits in base 2, as the C API checks
    f32 = np.finfo(np.float32)
    raise ValueError(
      f"logits_soft_cap: {cap!r} is {cap32!r} in float32, the kernels' precision: expected a float in "
      f"[{float(f32.smallest_subnormal)!r}, 2.35e38] (cap * log2(e) a finite float32: the kernels keep logits in "
      "base 2), or None for no cap"
    )
  return cap32


def implementation(impl):
  """The implementation asked for: 'xla' reads as 'reference'; None reads env SINKATTN_IMPLEMENTATION."""
  if not isinstance(impl, (str, type(None))) or impl not in IMPLEMENTATIONS:
    raise ValueError(f"implementation: expected None, 'fused', 'reference', 'xla' or 'cudnn', got {impl!r}")
  if impl is None and os.environ.get("SINKATTN_IMPLEMENTATION", "").strip().lower() == "reference":
    return "reference"
  return "reference" if impl == "xla" else impl


def _check_broadcast(name, x, full):
  """x must be rank 4 with every dim 1 or the full size of [B,N,T,S] = full (jax.nn's broadcast rule; a lower
  rank was given its leading size-1 axes by as_rank4)."""
  want = f"[B,N,T,S] = {full}, each dim 1 or that size"
  if not hasattr(x, "shape") or not hasattr(x, "dtype"):
    raise TypeError(f"{name}: expected an array broadcastable to {want}, got {type(x).__name__}")
  if len(x.shape) != 4:
    raise ValueError(f"{name}: expected rank 4 or lower, broadcastable to {want}, got shape {_shape(x)}")
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
  _precision(precision)


def _precision(precision):
  """None, a jax.lax.Precision, a name jax.lax.Precision takes ('default', 'high', 'highest', 'float32', ...) or a
  pair of them: every path meets the highest (products accumulated in float32, the reference at HIGHEST);
  anything else, a dot algorithm preset included, is refused rather than read as something it does not say."""
  if precision is None:
    return
  one = lambda p: isinstance(p, (str, jax.lax.Precision))  # noqa: E731
  pair = isinstance(precision, (tuple, list)) and len(precision) == 2
  if not (one(precision) or (pair and all(one(p) for p in precision))):
    raise TypeError(
      f"precision: expected None, a jax.lax.Precision, its name or a pair of them, got {precision!r} "
      f"({type(precision).__name__})"
    )
  for p in precision if pair else (precision,):
    if isinstance(p, str):
      try:
        jax.lax.Precision(p)
      except ValueError:
        names = ", ".join(repr(m.name.lower()) for m in jax.lax.Precision)
        raise ValueError(f"precision: {p!r} is not a jax.lax.Precision name: use {names} (or a Precision)") from None


def default_precision(precision) -> bool:
  """Whether precision (already checked by _precision) is jax.lax.Precision.DEFAULT (alone or as both of a pair): the
  one precision whose products the CUDA kernels' float32 path meets, bf16 products of inputs rounded to bf16 (what
  DEFAULT gives a float32 matmul on a TPU). None is not DEFAULT here: it keeps the float32 products it has always
  had."""
  if precision is None:
    return False
  ps = precision if isinstance(precision, (tuple, list)) else (precision,)
  return all(jax.lax.Precision(p) == jax.lax.Precision.DEFAULT for p in ps)


def as_rank4(query, key, value, bias, mask):
  """jax.nn's ranks: query / key / value [T,N,H] / [S,K,H] (or the [B,...] of rank 4), bias and mask of rank
  <= 4, each given the leading size-1 axes it lacks. -> (query, key, value, bias, mask, squeeze) where squeeze
  says the outputs lose the batch axis again (query was rank 3)."""
  for name, x in (("query", query), ("key", key), ("value", value)):
    if hasattr(x, "shape") and hasattr(x, "dtype") and len(x.shape) not in (3, 4):
      letters = {"query": "T,N,H", "key": "S,K,H", "value": "S,K,Hv"}[name]
      raise ValueError(f"{name}: expected shape [B,{letters}] (rank 4) or [{letters}] (rank 3), got shape {_shape(x)}")

  def lift(x):  # anything without a shape is left to the checks that name it
    if x is None or not hasattr(x, "shape") or len(x.shape) >= 4:
      return x
    return x.reshape((1,) * (4 - len(x.shape)) + tuple(x.shape))

  squeeze = hasattr(query, "shape") and len(query.shape) == 3
  return lift(query), lift(key), lift(value), lift(bias), lift(mask), squeeze


def arguments(
  query,
  key,
  value,
  *,
  sinks,
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
  logits_soft_cap=None,
  allow_f64=False,
) -> Checked:
  """allow_f64: accept float64 q/k/v, bias and sinks (the reference computes in it; the kernels do not).
  -> Checked: sinks as [N] float32 (float64 kept with allow_f64), integer arrays int32, the mask bool, the
  soft-cap as the float32 value the kernels take (0.0 = none)."""
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
  softmax, sinks = _sinks(sinks, softmax_type, N, allow_f64)

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
  cap = soft_cap(logits_soft_cap)
  opts = Options(int(softmax), int(causal), wl, wr, scale, bool(return_residual), cap)
  x = Inputs(query, key, value, sinks, q_lens, kv_lens, q_seg, kv_seg, bias, mask, q_pos, kv_pos)
  return Checked(opts, x)


def _sinks(sinks, softmax_type, N, allow_f64):
  """-> (the sa_softmax, sinks as [N] float32 or None); float64 sinks stay float64 with allow_f64. The
  reshape and cast are differentiated by JAX: the gradient returns in the caller's shape and dtype."""
  if softmax_type is None:
    softmax_type = "vanilla" if sinks is None else "learnable"
  if not isinstance(softmax_type, str) or softmax_type.lower() not in SOFTMAX_NAMES:
    raise ValueError(
      f"softmax_type: expected 'vanilla', 'off_by_one' (or 'off-by-one') or 'learnable', got {softmax_type!r}"
    )
  softmax = SOFTMAX_NAMES[softmax_type.lower()]
  if softmax != Softmax.LEARNABLE:
    if sinks is not None:
      raise ValueError(
        f"sinks: given, but softmax_type={softmax_type!r} has no learnable sink: "
        "use softmax_type='learnable' (or leave it None)"
      )
    return softmax, None
  if sinks is None:
    raise ValueError("sinks: softmax_type='learnable' needs sinks of shape [N] or [1,N,1,1], got None")
  if not hasattr(sinks, "shape") or not hasattr(sinks, "dtype"):
    raise TypeError(
      f"sinks: expected an array of shape [N] = ({N},) or [1,N,1,1] = (1, {N}, 1, 1), got {type(sinks).__name__}"
    )
  _check_float("sinks", sinks, _FLOATS + (_F64,))
  if tuple(sinks.shape) not in ((N,), (1, N, 1, 1)):
    raise ValueError(f"sinks: expected shape [N] = ({N},) or [1,N,1,1] = (1, {N}, 1, 1), got shape {_shape(sinks)}")
  dtype = jnp.promote_types(sinks.dtype, jnp.float32) if allow_f64 else jnp.float32
  return softmax, jnp.asarray(sinks).reshape(N).astype(dtype)
