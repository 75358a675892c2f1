"""The two XLA FFI calls of the fused kernels, as plain module-level functions.

Layouts (the C API's): q [B,T,N,H], k [B,S,K,H], v [B,S,K,Hv], sinks fp32 [N] (or None), q_lens /
kv_lens int32 [B], q_seg [B,T], kv_seg [B,S] int32, out [B,T,N,Hv], lse fp32 [B,N,T]. Integer options are
the C enums (softmax 0/1/2 = vanilla/off-by-one/learnable, causal 0/1/2 = none/top-left/bottom-right).
No argument checking happens here beyond what the C handler does (it rejects inconsistent shapes with
INVALID_ARGUMENT): `sinkattn.dot_product_attention` validates user input first.

Under jax.vmap both calls use vmap_method="expand_dims": the handler folds the extra leading dims into
the batch (or loops over them), so vmap costs no copies of q, k or v.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _lib

SOFTMAX_LEARNABLE = 2
_DTYPE_CODE = {np.dtype(np.float32): 0, np.dtype(jnp.float16): 1, np.dtype(jnp.bfloat16): 2}
_BACKEND_CUDA = 3


def _placeholder(dtype):
  """Stands for an absent optional input; the handler never reads it."""
  return jnp.zeros((0,), dtype)


def _attrs(softmax, causal, window_left, window_right, diag_offset, scale, q_lens, kv_lens, q_seg):
  return dict(softmax=int(softmax), causal=int(causal), window_left=int(window_left),
              window_right=int(window_right), diag_offset=int(diag_offset), scale=np.float32(scale),
              has_q_lens=q_lens is not None, has_kv_lens=kv_lens is not None, has_segments=q_seg is not None)


def _inputs(q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, softmax):
  i32 = jnp.int32
  if (q_seg is None) != (kv_seg is None):
    raise ValueError("q_seg and kv_seg: give both segment id arrays or neither")
  if softmax == SOFTMAX_LEARNABLE and sinks is None:
    raise ValueError("sinks is None but softmax is learnable (2): sinks [N] float32 is required")
  sinks = (sinks.astype(jnp.float32) if softmax == SOFTMAX_LEARNABLE else _placeholder(jnp.float32))
  pick = lambda x: _placeholder(i32) if x is None else x.astype(i32)
  return [q, k, v, sinks, pick(q_lens), pick(kv_lens), pick(q_seg), pick(kv_seg)]


def attn_fwd(q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, *, softmax: int, causal: int, window_left: int,
             window_right: int, diag_offset: int, scale: float):
  """-> (out [B,T,N,Hv] in q's dtype, lse [B,N,T] float32)."""
  _lib.load()
  B, T, N, _ = q.shape
  Hv = v.shape[-1]
  results = (jax.ShapeDtypeStruct((B, T, N, Hv), q.dtype), jax.ShapeDtypeStruct((B, N, T), jnp.float32))
  call = jax.ffi.ffi_call(_lib.FWD_TARGET, results, vmap_method="expand_dims")
  args = _inputs(q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, softmax)
  out, lse = call(*args, **_attrs(softmax, causal, window_left, window_right, diag_offset, scale, q_lens,
                                  kv_lens, q_seg))
  return out, lse


def attn_bwd(q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, out, lse, dout, dlse, *, softmax: int,
             causal: int, window_left: int, window_right: int, diag_offset: int, scale: float,
             deterministic: bool = True):
  """-> (dq, dk, dv, dsinks): dq/dk/dv like q/k/v, dsinks [N] float32 (zeros unless learnable).

  out and lse are the forward's results; dlse (the cotangent of lse, [B,N,T]) may be None.
  deterministic=False lets the CUDA backend reduce dq with atomics (dsinks is always deterministic).
  """
  _lib.load()
  B, T, N, H = q.shape
  _, S, K, Hv = v.shape
  learn = softmax == SOFTMAX_LEARNABLE
  args = _inputs(q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, softmax)
  args += [out, lse, dout.astype(out.dtype),
           _placeholder(jnp.float32) if dlse is None else dlse.astype(jnp.float32)]
  attrs = _attrs(softmax, causal, window_left, window_right, diag_offset, scale, q_lens, kv_lens, q_seg)
  attrs.update(has_dlse=dlse is not None, deterministic=bool(deterministic))
  grads = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
           jax.ShapeDtypeStruct(v.shape, v.dtype), jax.ShapeDtypeStruct((N if learn else 0,), jnp.float32))

  def cpu(*a):
    return tuple(jax.ffi.ffi_call(_lib.BWD_TARGET, grads, vmap_method="expand_dims")(*a, **attrs))

  def cuda(*a):
    # XLA allocates the kernel's scratch as a fifth result, sized here at trace time (graph-safe).
    ws = _lib.bwd_workspace_size(_DTYPE_CODE[np.dtype(q.dtype)], B, T, S, N, K, H, Hv, softmax, causal,
                                 window_left, window_right, diag_offset,
                                 q_lens is not None or kv_lens is not None, q_seg is not None, _BACKEND_CUDA)
    res = grads + (jax.ShapeDtypeStruct((ws,), jnp.uint8),)
    return tuple(jax.ffi.ffi_call(_lib.BWD_TARGET_CUDA, res, vmap_method="expand_dims")(*a, **attrs))[:4]

  if _lib.has_cuda():
    dq, dk, dv, dsinks = jax.lax.platform_dependent(*args, cpu=cpu, cuda=cuda)
  else:
    dq, dk, dv, dsinks = cpu(*args)
  if not learn:
    dsinks = jnp.zeros((N,), jnp.float32)
  return dq, dk, dv, dsinks
