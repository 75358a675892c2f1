"""Loads libsinkattn_jax.so (the C core plus its XLA FFI handlers) and registers its targets with JAX.

Search order: env SINKATTN_LIBRARY (a file), the package directory, then <repo>/build*/ (a source tree
built with `cmake -S . -B build && cmake --build build`). Loading is lazy: importing sinkattn never
fails for a missing library; the first fused call does, with the build command in the message.

Before registering, the first load compares the XLA FFI API version the handlers declare with the one
the running jaxlib implements, and raises FFIVersionError (an ImportError) naming both and the fix,
instead of the registration error XLA would give at the first call.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import threading

import jax

from ._version import jax_requirement

LIB_NAME = "libsinkattn_jax.so"
FWD_TARGET = "sinkattn_fwd"  # platforms "cpu" and "CUDA"
BWD_TARGET = "sinkattn_bwd"  # "cpu": results dq dk dv dsinks
BWD_TARGET_CUDA = "sinkattn_bwd_cuda"  # "CUDA": results dq dk dv dsinks workspace
DECODE_TARGET = "sinkattn_decode"  # "cpu": results out lse (decode.py)
DECODE_TARGET_CUDA = "sinkattn_decode_cuda"  # "CUDA": results out lse workspace
# The attention and decode handlers' buffers and attributes (sa_jax_attn_abi_version in src/ffi/ffi_attn.c): 12
# forward inputs (bias, mask and positions included), dbias among the backward's results, no `deterministic`
# attribute, `logits_soft_cap` in every handler.
ATTN_ABI = 4

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_DIR = os.path.dirname(os.path.dirname(_PKG_DIR))
_lock = threading.Lock()
_lib = None


class LibraryNotFoundError(RuntimeError):
  """libsinkattn_jax.so is missing: the fused kernels cannot run (implementation='reference' can)."""


class StaleLibraryError(LibraryNotFoundError):
  """The library found was built from other sources: its attention handlers take another buffer layout."""


class FFIVersionError(ImportError):
  """The library's XLA FFI handlers declare an API version that the running jaxlib does not accept."""


def jaxlib_ffi_api_version() -> tuple[int, int] | None:
  """(major, minor) of the XLA FFI API the running jaxlib implements, read from the C header it ships
  (`jax.ffi.include_dir()`, the header handlers are built against); None when that header is absent."""
  header = os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")
  try:
    with open(header, encoding="utf-8") as f:
      text = f.read()
  except OSError:
    return None
  major = re.search(r"#define\s+XLA_FFI_API_MAJOR\s+(\d+)", text)
  minor = re.search(r"#define\s+XLA_FFI_API_MINOR\s+(\d+)", text)
  return (int(major.group(1)), int(minor.group(1))) if major and minor else None


def check_ffi_api_version(path: str, declared: tuple[int, int], running: tuple[int, int] | None) -> None:
  """Raises FFIVersionError unless XLA accepts handlers declaring `declared` (what the library at path says)
  on a jaxlib implementing `running`: the same major and a minor from 1 to running's (measured on jaxlib
  0.7 .. 0.12). running None (no header to read) is not checked: XLA's own registration then decides."""
  if running is None:
    return
  if declared[0] == running[0] and 1 <= declared[1] <= running[1]:
    return
  import jaxlib

  raise FFIVersionError(
    "sinkattn: %s declares XLA FFI API %d.%d, which jaxlib %s (FFI API %d.%d, accepting %d.1 to %d.%d) does "
    "not register. Fix: install the jax this sinkattn supports (pip install '%s'), or rebuild sinkattn "
    "against this jaxlib (pip install --no-build-isolation --force-reinstall . from its source tree)."
    % (
      path,
      declared[0],
      declared[1],
      getattr(jaxlib, "__version__", "?"),
      running[0],
      running[1],
      running[0],
      running[0],
      running[1],
      jax_requirement(),
    )
  )


def candidates() -> list[str]:
  """Paths tried, in order."""
  out = []
  env = os.environ.get("SINKATTN_LIBRARY")
  if env:
    out.append(env)
  out.append(os.path.join(_PKG_DIR, LIB_NAME))
  out.append(os.path.join(_REPO_DIR, "build", LIB_NAME))
  out.extend(sorted(glob.glob(os.path.join(_REPO_DIR, "build*", LIB_NAME))))
  return list(dict.fromkeys(out))


def _declare(lib):
  i64, c_int, f32 = ctypes.c_int64, ctypes.c_int, ctypes.c_float
  lib.sa_has_cuda.restype = c_int
  lib.sa_has_cuda.argtypes = []
  lib.sa_jax_bwd_workspace_size.restype = ctypes.c_size_t
  lib.sa_jax_bwd_workspace_size.argtypes = [c_int] + [i64] * 7 + [c_int, c_int, i64, i64, i64, c_int, c_int, f32, c_int]
  lib.sa_jax_ffi_api_version.restype = c_int
  lib.sa_jax_ffi_api_version.argtypes = []
  lib.sa_jax_cuda_supported.restype = c_int
  lib.sa_jax_cuda_supported.argtypes = (
    [c_int] + [i64] * 7 + [c_int] * 3 + [f32, c_int, ctypes.c_char_p, ctypes.c_size_t]
  )
  lib.sa_jax_decode_workspace_size.restype = ctypes.c_size_t
  lib.sa_jax_decode_workspace_size.argtypes = [c_int] + [i64] * 7 + [c_int]
  lib.sa_jax_decode_max_q_len.restype = c_int
  lib.sa_jax_decode_max_q_len.argtypes = []
  lib.sa_cpu_set_num_threads.argtypes = [c_int]
  lib.sa_cpu_get_num_threads.restype = c_int
  lib.sa_cpu_simd_name.restype = ctypes.c_char_p


def _register(lib):
  cap = jax.ffi.pycapsule
  jax.ffi.register_ffi_target(FWD_TARGET, cap(lib.sa_jax_attn_fwd_cpu), platform="cpu")
  jax.ffi.register_ffi_target(BWD_TARGET, cap(lib.sa_jax_attn_bwd_cpu), platform="cpu")
  jax.ffi.register_ffi_target(DECODE_TARGET, cap(lib.sa_jax_decode_fwd_cpu), platform="cpu")
  if lib.sa_has_cuda():
    jax.ffi.register_ffi_target(FWD_TARGET, cap(lib.sa_jax_attn_fwd_cuda), platform="CUDA")
    jax.ffi.register_ffi_target(BWD_TARGET_CUDA, cap(lib.sa_jax_attn_bwd_cuda), platform="CUDA")
    jax.ffi.register_ffi_target(DECODE_TARGET_CUDA, cap(lib.sa_jax_decode_fwd_cuda), platform="CUDA")


def load():
  """The loaded ctypes library, with its FFI targets registered (once per process)."""
  global _lib
  if _lib is not None:
    return _lib
  with _lock:
    if _lib is not None:
      return _lib
    tried = candidates()
    path = next((p for p in tried if os.path.isfile(p)), None)
    if path is None:
      raise LibraryNotFoundError(
        "sinkattn: %s not found (looked in: %s). Build it from the repository root with\n"
        "  cmake -S . -B build -DPython_EXECUTABLE=$(which python) && cmake --build build -j\n"
        "(found there by a source tree on PYTHONPATH), or `pip install .`; or set SINKATTN_LIBRARY to its path. "
        "implementation='reference' works without it." % (LIB_NAME, ", ".join(tried))
      )
    lib = ctypes.CDLL(path)
    _declare(lib)
    abi = _attn_abi_version(lib)
    if abi != ATTN_ABI:
      raise StaleLibraryError(
        "sinkattn: %s was built from other sources: its attention handlers take buffer layout %d, this "
        "package passes layout %d. Rebuild it (cmake --build build) or reinstall sinkattn." % (path, abi, ATTN_ABI)
      )
    declared = divmod(int(lib.sa_jax_ffi_api_version()), 1000)
    check_ffi_api_version(path, declared, jaxlib_ffi_api_version())
    _register(lib)
    _lib = lib
    return lib


def available() -> bool:
  try:
    load()
    return True
  except (LibraryNotFoundError, OSError):
    return False


def has_cuda() -> bool:
  """The library was built with the CUDA backend (False when it is missing)."""
  return available() and bool(load().sa_has_cuda())


def cuda_supported(
  dtype_code, B, T, S, N, K, H, Hv, *, bias=False, mask=False, positions=False, logits_soft_cap=0.0, decode=False
):
  """(ok, reason): whether the CUDA kernels take this dtype, these sizes, these optional inputs and this soft-cap
  (0.0 = none), as the library answers (sa_jax_cuda_supported): the attention kernels, or with decode=True the
  decode kernels (causal bottom-right over cache lengths). The inputs they lack are named on any machine, the rest
  needs a GPU."""
  why = ctypes.create_string_buffer(512)
  flags = (int(bias), int(mask), int(positions), float(logits_soft_cap), int(decode))
  ok = bool(load().sa_jax_cuda_supported(dtype_code, B, T, S, N, K, H, Hv, *flags, why, len(why)))
  return ok, why.value.decode()


def decode_max_query_tokens() -> int:
  """The longest query decode_attention's kernels take (SA_DECODE_MAX_Q_LEN of include/sinkattn.h)."""
  return int(load().sa_jax_decode_max_q_len())


def bwd_workspace_size(
  dtype_code,
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
  has_lengths,
  has_segments,
  logits_soft_cap,
  backend,
):
  return int(
    load().sa_jax_bwd_workspace_size(
      dtype_code,
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
      int(has_lengths),
      int(has_segments),
      float(logits_soft_cap),
      backend,
    )
  )


def decode_workspace_size(dtype_code, B, T, S, N, K, H, Hv, backend):
  """Bytes of decode workspace (at least 1) for this shape on backend (an sa_backend value)."""
  return int(load().sa_jax_decode_workspace_size(dtype_code, B, T, S, N, K, H, Hv, backend))


def _attn_abi_version(lib) -> int:
  """The buffer layout of lib's attention handlers; a library without the symbol has layout 1."""
  fn = getattr(lib, "sa_jax_attn_abi_version", None)
  if fn is None:
    return 1
  fn.restype = ctypes.c_int
  return int(fn())


def last_plan(kind: str = "fwd") -> str:
  """A one-line description of the last plan of this kind that ran in the process (any thread).

  The plan API is internal and unsupported: the text names the kernel family and its configuration (its first
  word is the plan's name, e.g. "cpu.fwd.avx512"), for a user who wants to see which kernel ran.

  Args:
    kind: 'fwd', 'bwd' or 'decode'.

  Returns:
    The description, or '' before any call of that kind, or when the loaded library predates the plan API
    (it lacks sa_plan_last_any).

  Raises:
    ValueError: an unknown kind.
  """
  kinds = {"fwd": 0, "bwd": 1, "decode": 2}
  if kind not in kinds:
    raise ValueError(f"kind: expected 'fwd', 'bwd' or 'decode', got {kind!r}")
  fn = getattr(load(), "sa_plan_last_any", None)
  if fn is None:
    return ""
  fn.restype, fn.argtypes = ctypes.c_size_t, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
  buf = ctypes.create_string_buffer(512)
  n = int(fn(kinds[kind], buf, len(buf)))
  if n >= len(buf):  # a longer description: ask again with room for all of it
    buf = ctypes.create_string_buffer(n + 1)
    fn(kinds[kind], buf, len(buf))
  return buf.value.decode()


def set_num_threads(n: int) -> None:
  """CPU backend threads (n <= 0: the default, env SINKATTN_NUM_THREADS or all cores)."""
  load().sa_cpu_set_num_threads(int(n))


def get_num_threads() -> int:
  return int(load().sa_cpu_get_num_threads())


def simd_name() -> str:
  return load().sa_cpu_simd_name().decode()
