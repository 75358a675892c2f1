"""Every XLA FFI call of the package: attention forward and backward, and decode.

Layouts (the C API's): the inputs as `_inputs.Inputs` (q [B,T,N,H], k [B,S,K,H], v [B,S,K,Hv], sinks fp32 [N] or
None, q_lens / kv_lens int32 [B], q_seg [B,T], kv_seg [B,S] int32, bias [B|1,N|1,T|1,S|1] (f32, f16 or bf16), mask
bool with bias's rule, q_pos [B,T] / kv_pos [B,S] int32), out [B,T,N,Hv], lse fp32 [B,N,T] (the public API turns
it into jax.nn's [B,T,N]: `_inputs.lse_public`). Integer options are the C enums of `_enums` (softmax, causal);
logits_soft_cap is the C API's float (0.0 = no cap), sent as a float32 attribute like scale. No
argument checking happens here beyond what the C handler does (it rejects inconsistent buffers with
INVALID_ARGUMENT): `sinkattn.dot_product_attention` validates user input first.

vmap: every call goes through `_ffi`, which picks the vmap method per handler in one table (`_VMAP`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _lib, _routing
from ._enums import Backend, Softmax, dtype_code
from ._inputs import Grads, Inputs

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


def _attrs(statics, x: Inputs):
  """The attributes of a forward / backward call (the handlers' `has_*` flags say which inputs are present)."""
  return dict(
    softmax=int(statics["softmax"]),
    causal=int(statics["causal"]),
    window_left=int(statics["window_left"]),
    window_right=int(statics["window_right"]),
    diag_offset=int(statics["diag_offset"]),
    scale=np.float32(statics["scale"]),
    logits_soft_cap=np.float32(statics["logits_soft_cap"]),
    has_q_lens=x.q_lens is not None,
    has_kv_lens=x.kv_lens is not None,
    has_segments=x.q_seg is not None,
    has_bias=x.bias is not None,
    has_mask=x.mask is not None,
    has_positions=x.q_pos is not None,
  )


def _buffers(x: Inputs, softmax):
  """The forward's 12 input buffers in Inputs' order, placeholders for the absent ones."""
  if (x.q_seg is None) != (x.kv_seg is None):
    raise ValueError("q_seg and kv_seg: give both segment id arrays or neither")
  if (x.q_pos is None) != (x.kv_pos is None):
    raise ValueError("q_pos and kv_pos: give both position arrays or neither")
  if softmax == Softmax.LEARNABLE and x.sinks is None:
    raise ValueError("sinks is None but softmax is learnable (2): sinks [N] float32 is required")
  i32 = jnp.int32
  pick = lambda a: _placeholder(i32) if a is None else a.astype(i32)  # noqa: E731
  return list(
    Inputs(
      q=x.q,
      k=x.k,
      v=x.v,
      sinks=x.sinks.astype(jnp.float32) if softmax == Softmax.LEARNABLE else _placeholder(jnp.float32),
      q_lens=pick(x.q_lens),
      kv_lens=pick(x.kv_lens),
      q_seg=pick(x.q_seg),
      kv_seg=pick(x.kv_seg),
      bias=_placeholder(jnp.float32) if x.bias is None else x.bias,
      mask=_placeholder(jnp.bool_) if x.mask is None else x.mask.astype(jnp.bool_),
      q_pos=pick(x.q_pos),
      kv_pos=pick(x.kv_pos),
    )
  )


def _cuda_buffers(x: Inputs, args):
  """The CUDA kernels' buffers from the call's (args, _buffers' list): the mask broadcast along the queries and the
  keys to _routing.cuda_mask_shape, which is the form they take (the CPU kernels take every broadcast form)."""
  if x.mask is None or x.mask.shape == _routing.cuda_mask_shape(x):
    return list(args)
  i = Inputs._fields.index("mask")
  return [jnp.broadcast_to(a, _routing.cuda_mask_shape(x)) if j == i else a for j, a in enumerate(args)]


def attn_fwd(
  x: Inputs,
  *,
  softmax: int,
  causal: int,
  window_left: int,
  window_right: int,
  diag_offset: int,
  scale: float,
  logits_soft_cap: float = 0.0,
):
  """-> (out [B,T,N,Hv] in q's dtype, lse [B,N,T] float32)."""
  _lib.load()
  B, T, N, _ = x.q.shape
  statics = dict(
    softmax=softmax,
    causal=causal,
    window_left=window_left,
    window_right=window_right,
    diag_offset=diag_offset,
    scale=scale,
    logits_soft_cap=logits_soft_cap,
  )
  results = (
    jax.ShapeDtypeStruct((B, T, N, x.v.shape[-1]), x.q.dtype),
    jax.ShapeDtypeStruct((B, N, T), jnp.float32),
  )
  args, attrs = _buffers(x, softmax), _attrs(statics, x)
  if x.mask is None or x.mask.shape == _routing.cuda_mask_shape(x):
    return _ffi(_lib.FWD_TARGET, results, args, attrs)
  return _on_platform(
    args,
    lambda *a: _ffi(_lib.FWD_TARGET, results, a, attrs),
    lambda *a: _ffi(_lib.FWD_TARGET, results, _cuda_buffers(x, a), attrs),
  )


def attn_bwd(
  x: Inputs,
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
  logits_soft_cap: float = 0.0,
  want_dbias: bool = False,
) -> Grads:
  """-> Grads: dq/dk/dv like q/k/v, dsinks [N] float32 (zeros unless learnable), dbias float32 in bias's shape
  when want_dbias (else None).

  out and lse are the forward's results; dlse (the cotangent of lse, [B,N,T]) may be None.
  """
  _lib.load()
  B, T, N, H = x.q.shape
  _, S, K, Hv = x.v.shape
  if want_dbias and x.bias is None:
    raise ValueError("want_dbias: True, but bias is None")
  learn = softmax == Softmax.LEARNABLE
  statics = dict(
    softmax=softmax,
    causal=causal,
    window_left=window_left,
    window_right=window_right,
    diag_offset=diag_offset,
    scale=scale,
    logits_soft_cap=logits_soft_cap,
  )
  args = _buffers(x, softmax)
  args += [out, lse, dout.astype(out.dtype), _placeholder(jnp.float32) if dlse is None else dlse.astype(jnp.float32)]
  attrs = _attrs(statics, x)
  attrs.update(has_dlse=dlse is not None, has_dbias=bool(want_dbias))
  grads = Grads(
    dq=jax.ShapeDtypeStruct(x.q.shape, x.q.dtype),
    dk=jax.ShapeDtypeStruct(x.k.shape, x.k.dtype),
    dv=jax.ShapeDtypeStruct(x.v.shape, x.v.dtype),
    dsinks=jax.ShapeDtypeStruct((N if learn else 0,), jnp.float32),
    dbias=jax.ShapeDtypeStruct(x.bias.shape if want_dbias else (0,), jnp.float32),
  )

  def cuda(*a):
    # XLA allocates the kernel's scratch as one more result, sized here at trace time (graph-safe): by the query
    # that describes the call in full when it has a bias, a mask, positions or a soft-cap (the feature plans' class
    # table lives in the workspace), else by its sizes. A call the kernels refuse gets the handler's error.
    ok, ws = False, 0
    if _routing.has_features(x, logits_soft_cap):
      ok, _, ws = _routing.cuda_call(x, **statics)
    if not ok:
      ws = _lib.bwd_workspace_size(
        dtype_code(x.q.dtype),
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
        x.q_lens is not None or x.kv_lens is not None,
        x.q_seg is not None,
        logits_soft_cap,
        Backend.CUDA,
      )
    ws_result = jax.ShapeDtypeStruct((ws,), jnp.uint8)
    return _ffi(_lib.BWD_TARGET_CUDA, tuple(grads) + (ws_result,), _cuda_buffers(x, a), attrs)[: len(grads)]

  res = Grads(*_on_platform(args, lambda *a: _ffi(_lib.BWD_TARGET, tuple(grads), a, attrs), cuda))
  return res._replace(
    dsinks=res.dsinks if learn else jnp.zeros((N,), jnp.float32), dbias=res.dbias if want_dbias else None
  )


def decode_fwd(
  x: Inputs, *, softmax: int, window_left: int, window_right: int, scale: float, logits_soft_cap: float = 0.0
):
  """The split-KV decode kernel: x.q [B,T,N,H] (T <= the library's decode limit) against caches x.k [B,S,K,H],
  x.v [B,S,K,Hv] valid up to x.kv_lens [B] int32, causal bottom-right, sinks x.sinks, a soft-cap (0.0 = none);
  the handler takes no other input. -> (out [B,T,N,Hv], lse [B,N,T] float32)."""
  others = [f for f in ("q_lens", "q_seg", "kv_seg", "bias", "mask", "q_pos", "kv_pos") if getattr(x, f) is not None]
  if others or x.kv_lens is None:
    raise ValueError(f"decode_fwd: takes q, k, v, sinks and kv_lens only, got {others or ['kv_lens None']}")
  _lib.load()
  B, T, N, H = x.q.shape
  _, S, K, Hv = x.v.shape
  results = (jax.ShapeDtypeStruct((B, T, N, Hv), x.q.dtype), jax.ShapeDtypeStruct((B, N, T), jnp.float32))
  attrs = dict(
    softmax=int(softmax),
    window_left=int(window_left),
    window_right=int(window_right),
    scale=np.float32(scale),
    logits_soft_cap=np.float32(logits_soft_cap),
  )
  sinks = _placeholder(jnp.float32) if x.sinks is None else x.sinks.astype(jnp.float32)
  args = (x.q, x.k, x.v, sinks, x.kv_lens.astype(jnp.int32))

  def cuda(*a):
    # The split partials live in a workspace result that XLA allocates, sized here at trace time.
    ws = _lib.decode_workspace_size(dtype_code(x.q.dtype), B, T, S, N, K, H, Hv, Backend.CUDA)
    return _ffi(_lib.DECODE_TARGET_CUDA, results + (jax.ShapeDtypeStruct((ws,), jnp.uint8),), a, attrs)[:2]

  return _on_platform(args, lambda *a: _ffi(_lib.DECODE_TARGET, results, a, attrs), cuda)
