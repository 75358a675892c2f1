"""Every XLA FFI call of the package: attention forward and backward, and decode.

Layouts (the C API's): q [B,T,N,H], k [B,S,K,H], v [B,S,K,Hv], sinks fp32 [N] (or None), q_lens / kv_lens
int32 [B], q_seg [B,T], kv_seg [B,S] int32, bias [B|1,N|1,T|1,S|1] (f32, f16 or bf16), mask bool with bias's
rule, q_pos [B,T] / kv_pos [B,S] int32, out [B,T,N,Hv], lse fp32 [B,N,T]. Integer options are the C enums of
`_enums` (softmax, causal). No argument checking happens here beyond what the C handler does (it rejects
inconsistent buffers with INVALID_ARGUMENT): `sinkattn.dot_product_attention` validates user input first.

vmap: every call goes through `_ffi`, which picks the vmap method per handler in one table (`_VMAP`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _lib
from ._enums import Backend, Softmax, dtype_code

# The attention handlers fold vmapped leading dims into the batch (one kernel call), or loop over them reading
# unbatched inputs in place: vmap costs no copies. The decode handler takes no vmapped dims, so XLA runs it
# once per vmapped element.
_VMAP = {
  _lib.FWD_TARGET: "expand_dims",
  _lib.BWD_TARGET: "expand_dims",
  _lib.BWD_TARGET_CUDA: "expand_dims",
  _lib.DECODE_TARGET: "sequential",
  _lib.DECODE_TARGET_CUDA: "sequential",
}


def _ffi(target, results, args, attrs):
  return tuple(jax.ffi.ffi_call(target, results, vmap_method=_VMAP[target])(*args, **attrs))


def _placeholder(dtype):
  """Stands for an absent optional input; the handler never reads it."""
  return jnp.zeros((0,), dtype)


def _on_platform(args, cpu, cuda):
  """cpu(*args) or, in a library with the CUDA backend, the per-platform choice of cpu / cuda."""
  if _lib.has_cuda():
    return jax.lax.platform_dependent(*args, cpu=cpu, cuda=cuda)
  return cpu(*args)


def _attrs(statics, inputs):
  """The attributes of a forward / backward call; inputs: the 12 forward inputs (None = absent)."""
  q_lens, kv_lens, q_seg = inputs[4], inputs[5], inputs[6]
  attrs = dict(
    softmax=int(statics["softmax"]),
    causal=int(statics["causal"]),
    window_left=int(statics["window_left"]),
    window_right=int(statics["window_right"]),
    diag_offset=int(statics["diag_offset"]),
    scale=np.float32(statics["scale"]),
    has_q_lens=q_lens is not None,
    has_kv_lens=kv_lens is not None,
    has_segments=q_seg is not None,
    has_bias=inputs[8] is not None,
    has_mask=inputs[9] is not None,
    has_positions=inputs[10] is not None,
  )
  return attrs


def _buffers(inputs, softmax):
  """The forward's 12 input buffers, placeholders for the absent ones."""
  q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, bias, mask, q_pos, kv_pos = inputs
  if (q_seg is None) != (kv_seg is None):
    raise ValueError("q_seg and kv_seg: give both segment id arrays or neither")
  if (q_pos is None) != (kv_pos is None):
    raise ValueError("q_pos and kv_pos: give both position arrays or neither")
  if softmax == Softmax.LEARNABLE and sinks is None:
    raise ValueError("sinks is None but softmax is learnable (2): sinks [N] float32 is required")
  i32 = jnp.int32
  pick = lambda x: _placeholder(i32) if x is None else x.astype(i32)  # noqa: E731
  sinks = sinks.astype(jnp.float32) if softmax == Softmax.LEARNABLE else _placeholder(jnp.float32)
  out = [q, k, v, sinks, pick(q_lens), pick(kv_lens), pick(q_seg), pick(kv_seg)]
  out.append(_placeholder(jnp.float32) if bias is None else bias)
  out.append(_placeholder(jnp.bool_) if mask is None else mask.astype(jnp.bool_))
  out += [pick(q_pos), pick(kv_pos)]
  return out


def attn_fwd(
  q,
  k,
  v,
  sinks,
  q_lens,
  kv_lens,
  q_seg,
  kv_seg,
  bias=None,
  mask=None,
  q_pos=None,
  kv_pos=None,
  *,
  softmax: int,
  causal: int,
  window_left: int,
  window_right: int,
  diag_offset: int,
  scale: float,
):
  """-> (out [B,T,N,Hv] in q's dtype, lse [B,N,T] float32)."""
  _lib.load()
  B, T, N, _ = q.shape
  inputs = (q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, bias, mask, q_pos, kv_pos)
  statics = dict(
    softmax=softmax,
    causal=causal,
    window_left=window_left,
    window_right=window_right,
    diag_offset=diag_offset,
    scale=scale,
  )
  args = _buffers(inputs, softmax)
  results = (jax.ShapeDtypeStruct((B, T, N, v.shape[-1]), q.dtype), jax.ShapeDtypeStruct((B, N, T), jnp.float32))
  return _ffi(_lib.FWD_TARGET, results, args, _attrs(statics, inputs))


def attn_bwd(
  q,
  k,
  v,
  sinks,
  q_lens,
  kv_lens,
  q_seg,
  kv_seg,
  bias,
  mask,
  q_pos,
  kv_pos,
  out,
  lse,
  dout,
  dlse,
  *,
  softmax: int,
  causal: int,
  window_left: int,
  window_right: int,
  diag_offset: int,
  scale: float,
  want_dbias: bool = False,
  deterministic: bool = True,
):
  """-> (dq, dk, dv, dsinks, dbias): dq/dk/dv like q/k/v, dsinks [N] float32 (zeros unless learnable), dbias
  float32 in bias's shape when want_dbias (else None).

  out and lse are the forward's results; dlse (the cotangent of lse, [B,N,T]) may be None.
  deterministic=False lets the CUDA backend reduce dq with atomics (dsinks is always deterministic).
  """
  _lib.load()
  B, T, N, H = q.shape
  _, S, K, Hv = v.shape
  if want_dbias and bias is None:
    raise ValueError("want_dbias: True, but bias is None")
  learn = softmax == Softmax.LEARNABLE
  inputs = (q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, bias, mask, q_pos, kv_pos)
  statics = dict(
    softmax=softmax,
    causal=causal,
    window_left=window_left,
    window_right=window_right,
    diag_offset=diag_offset,
    scale=scale,
  )
  args = _buffers(inputs, softmax)
  args += [out, lse, dout.astype(out.dtype), _placeholder(jnp.float32) if dlse is None else dlse.astype(jnp.float32)]
  attrs = _attrs(statics, inputs)
  attrs.update(has_dlse=dlse is not None, deterministic=bool(deterministic), has_dbias=bool(want_dbias))
  grads = (
    jax.ShapeDtypeStruct(q.shape, q.dtype),
    jax.ShapeDtypeStruct(k.shape, k.dtype),
    jax.ShapeDtypeStruct(v.shape, v.dtype),
    jax.ShapeDtypeStruct((N if learn else 0,), jnp.float32),
    jax.ShapeDtypeStruct(bias.shape if want_dbias else (0,), jnp.float32),
  )

  def cuda(*a):
    # XLA allocates the kernel's scratch as one more result, sized here at trace time (graph-safe).
    ws = _lib.bwd_workspace_size(
      dtype_code(q.dtype),
      B,
      T,
      S,
      N,
      K,
      H,
      Hv,
      softmax,
      causal,
      window_left,
      window_right,
      diag_offset,
      q_lens is not None or kv_lens is not None,
      q_seg is not None,
      Backend.CUDA,
    )
    return _ffi(_lib.BWD_TARGET_CUDA, grads + (jax.ShapeDtypeStruct((ws,), jnp.uint8),), a, attrs)[: len(grads)]

  res = _on_platform(args, lambda *a: _ffi(_lib.BWD_TARGET, grads, a, attrs), cuda)
  dq, dk, dv, dsinks = res[:4]
  if not learn:
    dsinks = jnp.zeros((N,), jnp.float32)
  return dq, dk, dv, dsinks, (res[4] if want_dbias else None)


def decode_fwd(q, k, v, sinks, lens, *, softmax: int, window_left: int, window_right: int, scale: float):
  """The split-KV decode kernel: q [B,T,N,H] (T <= 64) against caches k [B,S,K,H], v [B,S,K,Hv] valid up to
  lens [B] int32, causal bottom-right; -> (out [B,T,N,Hv], lse [B,N,T] float32)."""
  _lib.load()
  B, T, N, H = q.shape
  _, S, K, Hv = v.shape
  results = (jax.ShapeDtypeStruct((B, T, N, Hv), q.dtype), jax.ShapeDtypeStruct((B, N, T), jnp.float32))
  attrs = dict(
    softmax=int(softmax), window_left=int(window_left), window_right=int(window_right), scale=np.float32(scale)
  )
  args = (q, k, v, _placeholder(jnp.float32) if sinks is None else sinks.astype(jnp.float32), lens.astype(jnp.int32))

  def cuda(*a):
    # The split partials live in a workspace result that XLA allocates, sized here at trace time.
    ws = _lib.decode_workspace_size(dtype_code(q.dtype), B, T, S, N, K, H, Hv, Backend.CUDA)
    return _ffi(_lib.DECODE_TARGET_CUDA, results + (jax.ShapeDtypeStruct((ws,), jnp.uint8),), a, attrs)[:2]

  return _on_platform(args, lambda *a: _ffi(_lib.DECODE_TARGET, results, a, attrs), cuda)
