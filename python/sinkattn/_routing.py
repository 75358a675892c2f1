"""Which implementation runs a call (dot_product_attention and decode_attention alike): the fused kernel,
the pure-jnp reference, or a choice per platform made when the computation is lowered (the CPU kernel takes
every input; what the CUDA kernels do not take, the library says (_lib.cuda_supported, and for a call with a bias,
a mask, positions or a soft-cap _lib.cuda_supported_call: float32, some head dims, shapes outside the feature
kernels' scope), and on GPU such calls run the reference, with one warning per reason)."""

from __future__ import annotations

import functools
import warnings
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from . import _lib
from ._enums import dtype_code

_warned: set = set()


def _warn_once(key, message):
  if key not in _warned:
    _warned.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


@functools.lru_cache(maxsize=None)
def gpu_present() -> bool:
  try:
    return bool(jax.devices("gpu"))
  except RuntimeError:
    return False


def likely_on_gpu(x) -> bool:
  """Whether a call on x will run on a GPU: x's devices when x is an array committed to them, else (a tracer,
  or an array that follows the computation, as jnp results without device_put do) the default device
  (jax.default_device, then the default backend). Only warnings and implementation='cudnn' depend on it: the
  kernel choice itself is made per platform when the computation is lowered."""
  try:
    if x.committed:
      return any(d.platform == "gpu" for d in x.devices())
  except (AttributeError, TypeError, jax.errors.ConcretizationTypeError):
    pass
  d = jax.config.jax_default_device
  if d is not None:
    return (d if isinstance(d, str) else d.platform) in ("gpu", "cuda")
  return jax.default_backend() == "gpu"


def has_features(x, logits_soft_cap: float = 0.0) -> bool:
  """Whether the call on inputs x carries what only the CUDA feature kernels take: a bias, a mask, positions or a
  soft-cap."""
  return x.bias is not None or x.mask is not None or x.q_pos is not None or bool(logits_soft_cap)


def cuda_mask_shape(x):
  """The shape of x.mask as the CUDA kernels take it, [B or 1, N or 1, T, S]: a mask broadcast along the queries or
  the keys is broadcast there before the call (primitives.py), one byte a (query, key) pair."""
  return (*x.mask.shape[:2], x.q.shape[1], x.k.shape[1])


def cuda_call(x, *, softmax, causal, window_left, window_right, diag_offset, logits_soft_cap=0.0, **_):
  """(ok, reason, bwd_workspace) of the CUDA kernels for the attention call on inputs x (an `_inputs.Inputs`, its
  shapes as the kernel sees them) described in full, as the library answers (sa_jax_cuda_supported_call)."""
  (B, T, N, H), (S, K), Hv = x.q.shape, x.k.shape[1:3], x.v.shape[3]
  return _lib.cuda_supported_call(
    dtype_code(x.q.dtype),
    B,
    T,
    S,
    N,
    K,
    H,
    Hv,
    softmax=softmax,
    causal=causal,
    window_left=window_left,
    window_right=window_right,
    diag_offset=diag_offset,
    has_lengths=x.q_lens is not None or x.kv_lens is not None,
    has_segments=x.q_seg is not None,
    bias_dims=None if x.bias is None else x.bias.shape,
    bias_dtype_code=0 if x.bias is None else dtype_code(x.bias.dtype),
    mask_dims=None if x.mask is None else cuda_mask_shape(x),
    positions=x.q_pos is not None,
    logits_soft_cap=logits_soft_cap,
  )


def cuda_reason(
  x,
  *,
  statics: Optional[dict] = None,
  logits_soft_cap: float = 0.0,
  decode: bool = False,
  default_precision: bool = False,
) -> Optional[str]:
  """Why the CUDA kernels cannot take the call on inputs x (an `_inputs.Inputs`) with this soft-cap (0.0 = none):
  its dtype, a head dim, an input or option they lack, as the library says; or None. decode: the question is about
  the decode kernels (decode_attention: sa_jax_cuda_supported), else the attention kernels; an attention call with a
  bias, a mask, positions or a soft-cap is decided by its shapes and options too (statics: the call's softmax,
  causal, window and diag_offset; sa_jax_cuda_supported_call), the rest by its sizes (sa_jax_cuda_supported).
  default_precision: the call's precision is jax.lax.Precision.DEFAULT, without which a float32 attention call
  stays off the kernels the library takes it on (they multiply in bf16: docs/hopper.md, "Float32 inputs")."""
  why = _library_reason(x, statics=statics, logits_soft_cap=logits_soft_cap, decode=decode)
  if why is None and not decode and x.q.dtype == jnp.float32 and not default_precision:
    why = (
      "float32 attention with a precision other than jax.lax.Precision.DEFAULT: the CUDA kernels round float32 "
      "inputs to bf16 for their products (DEFAULT's); pass precision=jax.lax.Precision.DEFAULT to run them"
    )
  return why


def _library_reason(x, *, statics, logits_soft_cap, decode) -> Optional[str]:
  """cuda_reason's question to the library."""
  (B, T, N, H), (S, K), Hv = x.q.shape, x.k.shape[1:3], x.v.shape[3]
  try:
    code = dtype_code(x.q.dtype)
    if x.bias is not None:
      dtype_code(x.bias.dtype)
  except KeyError:
    return None
  if not decode and statics is not None and has_features(x, logits_soft_cap):
    ok, why, _ = cuda_call(x, **dict(statics, logits_soft_cap=logits_soft_cap))
    return None if ok else why
  ok, why = _lib.cuda_supported(
    code,
    B,
    T,
    S,
    N,
    K,
    H,
    Hv,
    bias=x.bias is not None,
    mask=x.mask is not None,
    positions=x.q_pos is not None,
    logits_soft_cap=logits_soft_cap,
    decode=decode,
  )
  return None if ok else why


def run(
  impl: Optional[str],
  query,
  x,
  *,
  op: str,
  fused: Callable,
  reference: Callable,
  cuda_reason: Callable[[], Optional[str]] = lambda: None,
):
  """fused(x), reference(x), or the choice of the two per platform, for `impl` (already checked); x is the
  call's inputs (a pytree, `_inputs.Inputs`).

  cuda_reason(): why the CUDA kernels do not take this call (asked of the library), or None.
  """
  if impl == "reference":
    return reference(x)
  if impl == "cudnn":
    _check_cudnn(query, op, cuda_reason)
    return fused(x)
  if jax.default_backend() == "gpu" and not _lib.has_cuda():
    if impl == "fused":
      _lib.load()  # a clear error when the library is missing altogether
      raise RuntimeError(
        f"implementation='fused': {_lib.LIB_NAME} was built without CUDA, so there is no GPU "
        f"kernel for {op}: rebuild with nvcc on PATH, or use implementation=None / 'reference'"
      )
    _warn_once(
      ("no cuda", op),
      f"sinkattn: {_lib.LIB_NAME} has no CUDA backend (built without nvcc); on GPU "
      f"{op} falls back to the pure-jnp reference (O(T*S) memory, slower).",
    )
    return reference(x)
  why = _cuda_fallback(cuda_reason)
  if why is None:
    return fused(x)
  if likely_on_gpu(query):
    _warn_once(
      ("cuda", why),
      f"sinkattn: {why}; on GPU such calls run the pure-jnp reference (O(T*S) memory, "
      "slower); on CPU they keep the fused kernel.",
    )
  # Chosen when the computation is lowered, per platform: the CPU kernel takes every dtype and head dim.
  return jax.lax.platform_dependent(x, cuda=reference, default=fused)


def _cuda_fallback(cuda_reason):
  """Why a GPU in this process could not run this call on the CUDA kernels, or None."""
  if not gpu_present() or not _lib.has_cuda():
    return None
  return cuda_reason()


def _check_cudnn(query, op, cuda_reason) -> None:
  """implementation='cudnn' (jax.nn's name for its fused GPU kernel): the CUDA kernels, or an error saying
  why they cannot run this call."""
  if not likely_on_gpu(query) or not gpu_present():
    raise RuntimeError(
      f"implementation='cudnn': {op} would not run on a GPU here (jax default backend "
      f"{jax.default_backend()!r}): use implementation=None or 'fused' for the CPU kernel"
    )
  if not _lib.has_cuda():
    _lib.load()
    raise RuntimeError(
      f"implementation='cudnn': {_lib.LIB_NAME} was built without CUDA: rebuild with nvcc on "
      "PATH, or use implementation=None"
    )
  why = _cuda_fallback(cuda_reason)
  if why is not None:
    raise ValueError(
      f"implementation='cudnn': {why}; use implementation=None (the reference runs such calls on GPU) or 'reference'"
    )
