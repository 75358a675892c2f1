"""Which implementation runs a call (dot_product_attention and decode_attention alike): the fused kernel,
the pure-jnp reference, or a choice per platform made when the computation is lowered (the CPU kernel takes
every input; what the CUDA kernels do not take, the library says (_lib.cuda_supported: float32, some head
dims, a bias / mask / positions / soft-cap for now), and on GPU such calls run the reference, with one warning
per reason)."""

from __future__ import annotations

import functools
import warnings
from typing import Callable, Optional

import jax

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


def cuda_reason(x, *, logits_soft_cap: float = 0.0, decode: bool = False) -> Optional[str]:
  """Why the CUDA kernels cannot take the call on inputs x (an `_inputs.Inputs`) with this soft-cap (0.0 = none):
  its dtype, a head dim, an input or option they lack, as the library says (sa_jax_cuda_supported); or None.
  decode: the question is about the decode kernels (decode_attention), else the attention kernels."""
  (B, T, N, H), (S, K), Hv = x.q.shape, x.k.shape[1:3], x.v.shape[3]
  try:
    code = dtype_code(x.q.dtype)
  except KeyError:
    return None
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
