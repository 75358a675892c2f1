"""decode_attention: a few query tokens against a long KV cache, with sinks (split-KV C kernels).

The same math as dot_product_attention(..., is_causal=True, causal_alignment='bottom_right',
key_value_seq_lengths=cache_lengths): query token i of batch b sits at position cache_lengths[b] - T + i
and sees the cache entries j <= i + cache_lengths[b] - T (and j >= that diagonal - left with a window).
The kernel cuts the cache into chunks processed in parallel (CPU threads / CUDA thread blocks), each
giving a partial without the sink, then merges them in a fixed order adding the sink once.

Forward only: there is no custom_vjp, so jax.grad through decode_attention raises (decoding is
inference; train with dot_product_attention). vmap runs the call once per vmapped element.
"""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from . import _lib, _validate, reference

MAX_QUERY_TOKENS = 64   # the C library's decode limit (longer queries are prefill: dot_product_attention)
_DTYPE_CODE = {np.dtype(np.float32): 0, np.dtype(jnp.float16): 1, np.dtype(jnp.bfloat16): 2}
_BACKEND_CUDA = 3
_warned_no_cuda = False


def _check(query, k_cache, v_cache, cache_lengths):
  """Decode-specific checks, naming decode_attention's own arguments (the shared ones follow)."""
  _validate._check_rank("query", query, 4, "B,T,N,H")
  _validate._check_rank("k_cache", k_cache, 4, "B,S,K,H")
  _validate._check_rank("v_cache", v_cache, 4, "B,S,K,Hv")
  B, T, N, H = query.shape
  if tuple(k_cache.shape[:1]) + tuple(k_cache.shape[3:]) != (B, H):
    raise ValueError(f"k_cache: expected shape [B,S,K,H] = ({B}, S, K, {H}) to match query {tuple(query.shape)}, "
                     f"got shape {tuple(k_cache.shape)}")
  if tuple(v_cache.shape[:3]) != tuple(k_cache.shape[:3]):
    raise ValueError(f"v_cache: expected shape [B,S,K,Hv] = {tuple(k_cache.shape[:3]) + ('Hv',)} to match k_cache "
                     f"{tuple(k_cache.shape)}, got shape {tuple(v_cache.shape)}")
  for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
    if np.dtype(x.dtype) != np.dtype(query.dtype):
      raise TypeError(f"{name}: dtype {np.dtype(x.dtype).name} differs from query's {np.dtype(query.dtype).name}: "
                      "query and the caches must share one dtype")
  if T > MAX_QUERY_TOKENS:
    raise ValueError(f"query: decode takes at most T = {MAX_QUERY_TOKENS} query tokens, got shape "
                     f"{tuple(query.shape)} (T = {T}); use dot_product_attention for prefill")
  if cache_lengths is None:
    raise ValueError(f"cache_lengths: expected an int32 array of shape [B] = ({B},), got None")
  _validate._check_int_array("cache_lengths", cache_lengths, (B,), "B")


def _use_reference(impl):
  """None -> fused, except on a GPU with a library built without CUDA (then the reference, warned once)."""
  global _warned_no_cuda
  if impl == "reference":
    return True
  if jax.default_backend() == "gpu" and not _lib.has_cuda():
    if impl == "fused":
      _lib.load()
      raise RuntimeError("implementation='fused': libsinkattn_jax.so was built without CUDA, so there is no GPU "
                         "decode kernel: rebuild with nvcc on PATH, or use implementation=None / 'reference'")
    if not _warned_no_cuda:
      _warned_no_cuda = True
      warnings.warn("sinkattn: libsinkattn_jax.so has no CUDA backend; decode_attention falls back to the "
                    "pure-jnp reference on GPU.", RuntimeWarning, stacklevel=3)
    return True
  return False


def _fused(q, k, v, sinks, lens, *, softmax, window_left, window_right, scale):
  _lib.load()
  B, T, N, H = q.shape
  _, S, K, Hv = v.shape
  results = (jax.ShapeDtypeStruct((B, T, N, Hv), q.dtype), jax.ShapeDtypeStruct((B, N, T), jnp.float32))
  attrs = dict(softmax=int(softmax), window_left=int(window_left), window_right=int(window_right),
               scale=np.float32(scale))
  sinks = sinks if sinks is not None else jnp.zeros((0,), jnp.float32)
  args = (q, k, v, sinks, lens)

  def cpu(*a):
    return tuple(jax.ffi.ffi_call(_lib.DECODE_TARGET, results, vmap_method="sequential")(*a, **attrs))

  def cuda(*a):
    # The split partials live in a workspace result that XLA allocates, sized here at trace time.
    ws = _lib.decode_workspace_size(_DTYPE_CODE[np.dtype(q.dtype)], B, T, S, N, K, H, Hv, _BACKEND_CUDA)
    res = results + (jax.ShapeDtypeStruct((ws,), jnp.uint8),)
    return tuple(jax.ffi.ffi_call(_lib.DECODE_TARGET_CUDA, res, vmap_method="sequential")(*a, **attrs))[:2]

  if _lib.has_cuda():
    return jax.lax.platform_dependent(*args, cpu=cpu, cuda=cuda)
  return cpu(*args)


def decode_attention(query, k_cache, v_cache, cache_lengths, sinks=None, *, softmax_type=None,
                     local_window_size=None, scale=None, return_residual=False, implementation=None):
  """Attention of T <= 64 new query tokens over a KV cache, with attention sinks (forward only).

  query [B,T,N,H]; k_cache [B,S,K,H] and v_cache [B,S,K,Hv] (one float dtype: float32, float16 or
  bfloat16; K divides N); cache_lengths [B] int: the valid entries of each cache, the T new tokens
  included (their keys and values already written at positions cache_lengths - T .. cache_lengths - 1).
  Query token i sees cache entries j <= cache_lengths[b] - T + i; local_window_size w or (left, right)
  limits that to j >= cache_lengths[b] - T + i - left (gpt-oss: 127, i.e. a 128-token window).
  sinks / softmax_type / scale as in dot_product_attention. Rows with no valid entry give out 0 and
  lse = the sink logit.

  Returns out [B,T,N,Hv] in query's dtype, or (out, lse [B,N,T] float32) with return_residual=True.
  implementation: None / 'fused' (the split-KV kernel of the platform) or 'reference' (the pure jnp
  twin of dot_product_attention with causal_alignment='bottom_right').
  """
  impl = _validate.implementation(implementation)
  ref = _use_reference(impl)
  _check(query, k_cache, v_cache, cache_lengths)
  o, sinks, _, lens, _, _ = _validate.arguments(
      query, k_cache, v_cache, sinks, softmax_type=softmax_type, scale=scale, is_causal=True,
      causal_alignment="bottom_right", local_window_size=local_window_size, query_seq_lengths=None,
      key_value_seq_lengths=cache_lengths, query_segment_ids=None, key_value_segment_ids=None,
      return_residual=return_residual, allow_f64=ref)
  N = query.shape[2]
  if ref:
    s = None if sinks is None else sinks.reshape(N).astype(jnp.promote_types(sinks.dtype, jnp.float32))
    out, lse = reference.attention(query, k_cache, v_cache, s, None, lens, None, None, softmax=o.softmax,
                                   causal=o.causal, window_left=o.window_left, window_right=o.window_right,
                                   diag_offset=0, scale=o.scale)
  else:
    s = None if sinks is None else sinks.reshape(N).astype(jnp.float32)
    out, lse = _fused(query, k_cache, v_cache, s, lens, softmax=o.softmax, window_left=o.window_left,
                      window_right=o.window_right, scale=o.scale)
  return (out, lse) if o.return_residual else out
