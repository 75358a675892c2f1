"""Trace-time checking and normalisation of dot_product_attention's arguments.

Every error names the argument, the shape (or value) seen and the one expected, so that nothing reaches
a kernel unchecked.
"""
from __future__ import annotations

import math
import os
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

_FLOATS = (np.dtype(np.float32), np.dtype(jnp.float16), np.dtype(jnp.bfloat16))
SOFTMAX_TYPES = {"vanilla": 0, "off_by_one": 1, "off-by-one": 1, "learnable": 2}
IMPLEMENTATIONS = (None, "fused", "reference")


class Options(NamedTuple):
  """The static part of one call (hashable: used as a custom_vjp nondiff argument)."""
  softmax: int
  causal: int
  window_left: int
  window_right: int
  scale: float
  return_residual: bool


def _shape(x):
  return tuple(getattr(x, "shape", ()))


def _check_rank(name, x, rank, letters):
  if not hasattr(x, "shape") or not hasattr(x, "dtype"):
    raise TypeError(f"{name}: expected an array of shape [{letters}], got {type(x).__name__}")
  if len(x.shape) != rank:
    raise ValueError(f"{name}: expected shape [{letters}] (rank {rank}), got shape {_shape(x)}")


def _check_float(name, x, allowed=_FLOATS):
  if np.dtype(x.dtype) not in allowed:
    raise TypeError(f"{name}: dtype {np.dtype(x.dtype).name} unsupported: use "
                    + ", ".join(d.name for d in allowed))


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
      raise ValueError(f"local_window_size: each side must be >= 0 (or -1 / None for unbounded), "
                       f"got {tuple(local_window_size)}")
    return sides[0], sides[1]
  w = _static_int("local_window_size", local_window_size)
  if w < -1:
    raise ValueError(f"local_window_size: expected an int >= 0 (or -1 for unbounded) or a pair (left, right), "
                     f"got {w}")
  return w, w


def implementation(impl):
  if impl not in IMPLEMENTATIONS:
    raise ValueError(f"implementation: expected None, 'fused' or 'reference', got {impl!r}")
  if impl is None and os.environ.get("SINKATTN_IMPLEMENTATION", "").strip().lower() == "reference":
    return "reference"
  return impl


def arguments(query, key, value, sinks, *, softmax_type, scale, is_causal, causal_alignment, local_window_size,
              query_seq_lengths, key_value_seq_lengths, query_segment_ids, key_value_segment_ids,
              return_residual, allow_f64=False):
  """allow_f64: accept float64 q/k/v (the reference computes in it; the kernels do not).
  -> (Options, sinks [N] or None, q_lens, kv_lens, q_seg, kv_seg) with integer arrays as int32."""
  _check_rank("query", query, 4, "B,T,N,H")
  _check_rank("key", key, 4, "B,S,K,H")
  _check_rank("value", value, 4, "B,S,K,Hv")
  _check_float("query", query, _FLOATS + ((np.dtype(np.float64),) if allow_f64 else ()))
  for name, x in (("key", key), ("value", value)):
    if np.dtype(x.dtype) != np.dtype(query.dtype):
      raise TypeError(f"{name}: dtype {np.dtype(x.dtype).name} differs from query's {np.dtype(query.dtype).name}: "
                      "query, key and value must share one dtype")
  B, T, N, H = query.shape
  Bk, S, K, Hk = key.shape
  if Bk != B or Hk != H:
    raise ValueError(f"key: expected shape [B,S,K,H] = ({B}, S, K, {H}) to match query {_shape(query)}, "
                     f"got shape {_shape(key)}")
  if tuple(value.shape[:3]) != (B, S, K):
    raise ValueError(f"value: expected shape [B,S,K,Hv] = ({B}, {S}, {K}, Hv) to match key {_shape(key)}, "
                     f"got shape {_shape(value)}")
  if N % K != 0:
    raise ValueError(f"key: kv heads K = {K} must divide the query heads N = {N} (query {_shape(query)}, "
                     f"key {_shape(key)})")
  if H < 1 or value.shape[3] < 1:
    raise ValueError(f"query/value: head dims must be >= 1, got H = {H}, Hv = {value.shape[3]}")

  if softmax_type is None:
    softmax_type = "vanilla" if sinks is None else "learnable"
  if not isinstance(softmax_type, str) or softmax_type.lower() not in SOFTMAX_TYPES:
    raise ValueError(f"softmax_type: expected 'vanilla', 'off_by_one' (or 'off-by-one') or 'learnable', "
                     f"got {softmax_type!r}")
  softmax = SOFTMAX_TYPES[softmax_type.lower()]
  if softmax == 2:
    if sinks is None:
      raise ValueError("sinks: softmax_type='learnable' needs sinks of shape [N] or [1,N,1,1], got None")
    if not hasattr(sinks, "shape") or not hasattr(sinks, "dtype"):
      raise TypeError(f"sinks: expected an array of shape [N] = ({N},) or [1,N,1,1] = (1, {N}, 1, 1), "
                      f"got {type(sinks).__name__}")
    _check_float("sinks", sinks, _FLOATS + (np.dtype(np.float64),))
    if tuple(sinks.shape) not in ((N,), (1, N, 1, 1)):
      raise ValueError(f"sinks: expected shape [N] = ({N},) or [1,N,1,1] = (1, {N}, 1, 1), "
                       f"got shape {_shape(sinks)}")
  elif sinks is not None:
    raise ValueError(f"sinks: given, but softmax_type={softmax_type!r} has no learnable sink: "
                     "use softmax_type='learnable' (or leave it None)")

  if not isinstance(is_causal, (bool, np.bool_)):
    raise TypeError(f"is_causal: expected a Python bool, got {type(is_causal).__name__}")
  if causal_alignment not in ("top_left", "bottom_right"):
    raise ValueError(f"causal_alignment: expected 'top_left' or 'bottom_right', got {causal_alignment!r}")
  wl, wr = window(local_window_size)
  bottom_right = causal_alignment == "bottom_right"
  if bottom_right and not is_causal and (wl, wr) != (-1, -1):
    raise ValueError("causal_alignment='bottom_right' with a local_window_size needs is_causal=True "
                     "(the kernels align the window with the causal diagonal)")
  causal = 0 if not is_causal else 2 if bottom_right else 1

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
  if not isinstance(return_residual, (bool, np.bool_)):
    raise TypeError(f"return_residual: expected a Python bool, got {type(return_residual).__name__}")
  opts = Options(softmax, causal, wl, wr, scale, bool(return_residual))
  return opts, sinks, q_lens, kv_lens, q_seg, kv_seg
