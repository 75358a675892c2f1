"""sinkattn.dot_product_attention: argument checking, the fused path (custom_vjp over the two FFI calls of
primitives.py, partitioned over batch and heads by sharding.py) and the pure-jnp reference path (reference.py,
differentiated by JAX)."""
from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp

from . import _lib, _validate, reference, sharding

_warned_no_cuda = False


def _statics(o: _validate.Options):
  return dict(softmax=o.softmax, causal=o.causal, window_left=o.window_left, window_right=o.window_right,
              diag_offset=0, scale=o.scale)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(o, q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg):
  out, lse = sharding.attn_fwd(q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, **_statics(o))
  return (out, lse) if o.return_residual else out


def _fused_fwd(o, q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg):
  out, lse = sharding.attn_fwd(q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, **_statics(o))
  res = (q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, out, lse)
  return ((out, lse) if o.return_residual else out), res


def _typed_like(g, x):
  """Cotangent g with its primal x's sharding type. Under an Explicit mesh the gradients come typed by
  sharding.py's plan (batch and heads), but custom_vjp wants each typed like its primal, which may be
  split otherwise (e.g. over T, or heads that the plan keeps whole): reshard to it."""
  if g is None:
    return None
  want, have = jax.typeof(x).sharding, jax.typeof(g).sharding
  if jax.sharding.AxisType.Explicit not in getattr(want.mesh, "axis_types", ()) or want.spec == have.spec:
    return g
  return jax.sharding.reshard(g, want)


def _fused_bwd(o, res, ct):
  q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, out, lse = res
  dout, dlse = ct if o.return_residual else (ct, None)
  dq, dk, dv, dsinks = sharding.attn_bwd(q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, out, lse, dout, dlse,
                                         **_statics(o))
  dsinks = dsinks if sinks is not None else None
  dq, dk, dv, dsinks = (_typed_like(g, x) for g, x in zip((dq, dk, dv, dsinks), (q, k, v, sinks)))
  return dq, dk, dv, dsinks, None, None, None, None


_fused.defvjp(_fused_fwd, _fused_bwd)


def _use_reference(impl):
  """Resolves implementation=None: fused, except on a GPU with a library built without CUDA."""
  global _warned_no_cuda
  if impl == "reference":
    return True
  if jax.default_backend() == "gpu" and not _lib.has_cuda():
    if impl == "fused":
      _lib.load()  # a clear error when the library is missing altogether
      raise RuntimeError("implementation='fused': libsinkattn_jax.so was built without CUDA, so there is no "
                         "GPU kernel: rebuild with nvcc on PATH, or use implementation=None / 'reference'")
    if not _warned_no_cuda:
      _warned_no_cuda = True
      warnings.warn("sinkattn: libsinkattn_jax.so has no CUDA backend (built without nvcc); on GPU "
                    "dot_product_attention falls back to the pure-jnp reference (O(T*S) memory, slower).",
                    RuntimeWarning, stacklevel=3)
    return True
  return False


@functools.lru_cache(maxsize=None)
def _gpu_present():
  try:
    return bool(jax.devices("gpu"))
  except RuntimeError:
    return False


_warned_fallback = set()


def _likely_on_gpu(x):
  """Whether a call on x will run on a GPU: x's devices when x is a concrete array, else (a tracer) the
  default device (jax.default_device, then the default backend). Only the warning depends on it: the
  kernel choice itself is made per platform when the computation is lowered."""
  try:
    return any(d.platform == "gpu" for d in x.devices())
  except (AttributeError, TypeError, jax.errors.ConcretizationTypeError):
    pass
  d = jax.config.jax_default_device
  if d is not None:
    return (d if isinstance(d, str) else d.platform) in ("gpu", "cuda")
  return jax.default_backend() == "gpu"


def _cuda_fallback_reason(query, key, value):
  """Why the CUDA kernels cannot take this call (f32 inputs, a head dim outside 16..256), or None."""
  if not _gpu_present() or not _lib.has_cuda():
    return None
  (B, T, N, H), (S, K), Hv = query.shape, key.shape[1:3], value.shape[3]
  code = {jnp.dtype(jnp.float32): 0, jnp.dtype(jnp.float16): 1, jnp.dtype(jnp.bfloat16): 2}.get(
      jnp.dtype(query.dtype))
  if code is None:
    return None
  ok, why = _lib.cuda_supported(code, B, T, S, N, K, H, Hv)
  if ok:
    return None
  if why not in _warned_fallback and _likely_on_gpu(query):
    _warned_fallback.add(why)
    warnings.warn(f"sinkattn: {why}; on GPU such calls run the pure-jnp reference (O(T*S) memory, slower); "
                  "on CPU they keep the fused kernel.", RuntimeWarning, stacklevel=3)
  return why


def dot_product_attention(query, key, value, sinks=None, *, softmax_type=None, scale=None, is_causal=False,
                          causal_alignment="top_left", local_window_size=None, query_seq_lengths=None,
                          key_value_seq_lengths=None, query_segment_ids=None, key_value_segment_ids=None,
                          return_residual=False, implementation=None):
  """Scaled dot-product attention with attention sinks (layout BTNH, like jax.nn.dot_product_attention).

  query [B,T,N,H], key [B,S,K,H], value [B,S,K,Hv] (one float dtype: float32, float16 or bfloat16; K
  divides N: query head n reads kv head n // (N // K)). For each row
      lse_i = log(sum_j exp(scale * q_i . k_j) + exp(a_n)),  out_i = sum_j exp(s_ij - lse_i) v_j
  with the sink logit a_n = -inf ('vanilla'), 0 ('off_by_one', alias 'off-by-one') or sinks[n]
  ('learnable': sinks of shape [N] or [1,N,1,1] in any float dtype, used in float32, not scaled).
  softmax_type None means 'learnable' when sinks is given, else 'vanilla'.

  Masks (all optional, combined with AND): is_causal with causal_alignment 'top_left' (j <= i) or
  'bottom_right' (j <= i + kv_len - q_len: the last query sees the last key); local_window_size w or
  (left, right) around that diagonal (None or -1 = unbounded side); query_seq_lengths /
  key_value_seq_lengths [B] (padding at the end; clamped to [0,T] / [0,S]); query_segment_ids [B,T] and
  key_value_segment_ids [B,S] (packed sequences). A row with no valid key gives out 0 and lse a_n.

  Returns out [B,T,N,Hv] in query's dtype, or (out, lse [B,N,T] float32) with return_residual=True.
  Differentiable in query, key, value, sinks (gradient in sinks' shape and dtype) and through lse.
  implementation: None (the fused kernel of the platform; env SINKATTN_IMPLEMENTATION=reference picks the
  reference), 'fused', or 'reference' (pure jnp, O(T*S) memory: tells a kernel bug from a model bug;
  it also accepts float64 inputs, e.g. for finite-difference checks). On GPU, what the CUDA kernels do not
  take (float32 inputs, head dims other than 16/32/64/96/128/192/256) runs the reference, with one warning.
  """
  impl = _validate.implementation(implementation)
  ref = _use_reference(impl)
  o, sinks, q_lens, kv_lens, q_seg, kv_seg = _validate.arguments(
      query, key, value, sinks, softmax_type=softmax_type, scale=scale, is_causal=is_causal,
      causal_alignment=causal_alignment, local_window_size=local_window_size,
      query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
      query_segment_ids=query_segment_ids, key_value_segment_ids=key_value_segment_ids,
      return_residual=return_residual, allow_f64=ref)
  # Sinks enter the kernels as float32 [N]; autodiff of this reshape/cast returns the gradient in the
  # caller's shape and dtype.
  sink_dtype = jnp.promote_types(sinks.dtype, jnp.float32) if ref and sinks is not None else jnp.float32
  s32 = None if sinks is None else sinks.reshape(query.shape[2]).astype(sink_dtype)
  if ref:
    out, lse = reference.attention(query, key, value, s32, q_lens, kv_lens, q_seg, kv_seg, **_statics(o))
    return (out, lse) if o.return_residual else out
  args = (query, key, value, s32, q_lens, kv_lens, q_seg, kv_seg)
  fused = lambda *a: _fused(o, *a)
  if _cuda_fallback_reason(query, key, value) is None:
    return fused(*args)

  def ref_path(*a):
    out, lse = reference.attention(*a, **_statics(o))
    return (out, lse) if o.return_residual else out
  # Chosen when the computation is lowered, per platform: the CPU kernel takes every dtype and head dim.
  return jax.lax.platform_dependent(*args, cuda=ref_path, default=fused)
