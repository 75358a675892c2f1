"""Where sinkattn guesses a call runs (the GPU fallback warning and implementation='cudnn' depend on it), and
what it asks the library about the CUDA kernels."""

import jax
import jax.numpy as jnp
import pytest

from sinkattn import _lib, _routing


def test_placement_follows_a_committed_array_else_the_default_device():
  """The GPU warning's guess of where a call runs: an array committed to a device (device_put) runs there; one
  that follows the computation (a plain jnp result) runs on the default device, as jax places it."""

  class Placed:
    def __init__(self, committed, platform):
      self.committed, self._platform = committed, platform

    def devices(self):
      return {type("D", (), {"platform": self._platform})()}

  assert _routing.likely_on_gpu(Placed(True, "gpu"))
  assert not _routing.likely_on_gpu(Placed(True, "cpu"))
  with jax.default_device(jax.devices("cpu")[0]):
    assert not _routing.likely_on_gpu(Placed(False, "gpu"))


@pytest.mark.skipif(not _lib.available(), reason="libsinkattn_jax.so is not built")
@pytest.mark.parametrize("feature", ["bias", "mask", "positions"])
def test_what_the_cuda_kernels_lack_comes_from_the_library(feature):
  """Python asks the library (sa_jax_cuda_supported, sa_check_cuda_inputs in C) which inputs the CUDA kernels
  take; the answer needs no GPU. Today they lack bias, mask and positions: the reason names the input, and the
  op's reason for a call with it is that answer."""
  from sinkattn import ops
  from sinkattn._inputs import Inputs

  shape = (0, 2, 4, 6, 4, 2, 64, 64)  # dtype bf16, B T S N K H Hv
  ok, why = _lib.cuda_supported(2, *shape[1:], **{feature: True})
  if ok:
    pytest.skip(f"this library's CUDA kernels take {feature}")
  assert feature in why and "CUDA" in why, why
  q, k = jnp.zeros((2, 4, 4, 64), jnp.bfloat16), jnp.zeros((2, 6, 2, 64), jnp.bfloat16)
  arrays = dict(
    bias=dict(bias=jnp.zeros((1, 1, 4, 6))),
    mask=dict(mask=jnp.ones((1, 1, 4, 6), bool)),
    positions=dict(q_pos=jnp.zeros((2, 4), jnp.int32), kv_pos=jnp.zeros((2, 6), jnp.int32)),
  )[feature]
  assert ops._cuda_reason(Inputs(q, k, k, **arrays)) == why
  assert not hasattr(_routing, "CUDA_LACKS")


def _supported_call(lib, shape, *, causal=0, segments=False, bias=None, mask=None, positions=False, cap=0.0):
  """sa_jax_cuda_supported_call through ctypes (the query a call with a bias, mask or positions needs)."""
  import ctypes

  i64, c_int = ctypes.c_int64, ctypes.c_int
  f = lib.sa_jax_cuda_supported_call
  f.restype = c_int
  dims = ctypes.POINTER(i64)
  f.argtypes = [c_int] + [i64] * 7 + [c_int, c_int, i64, i64, i64, c_int, c_int, dims, c_int, dims, c_int]
  f.argtypes += [ctypes.c_float, ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p, ctypes.c_size_t]
  as_dims = lambda d: None if d is None else (i64 * 4)(*d)  # noqa: E731
  why, ws = ctypes.create_string_buffer(512), ctypes.c_size_t(7)
  ok = f(
    2,
    *shape,
    2,
    causal,
    -1,
    -1,
    0,
    0,
    int(segments),
    as_dims(bias),
    2,
    as_dims(mask),
    int(positions),
    cap,
    ctypes.byref(ws),
    why,
    len(why),
  )
  return bool(ok), why.value.decode(), ws.value


@pytest.mark.skipif(not _lib.available(), reason="libsinkattn_jax.so is not built")
def test_the_full_query_names_what_the_feature_kernels_refuse():
  """sa_jax_cuda_supported_call decides with the bias's and mask's shapes and the segment ids, on any machine: each
  call the feature plans cannot take is refused naming the input and the reason; one they take is refused only for
  want of a device here (no workspace then), and the sizes-only query refuses every bias, mask or positions, naming
  the query that can decide."""
  lib = _lib.load()
  B, T, N, K, H = 2, 256, 4, 2, 64
  shape = (B, T, T, N, K, H, H)
  refused = [
    (dict(bias=(1, N, 1, T)), "bias", "shared by the query rows"),
    (dict(mask=(B, 1, 1, T)), "mask", "[B or 1, N or 1, q_len, kv_len]"),
    (dict(mask=(1, 1, T, T), segments=True), "mask", "segment ids"),
    (dict(positions=True, causal=1, segments=True), "positions", "segment ids"),
  ]
  for kw, feature, reason in refused:
    ok, why, ws = _supported_call(lib, shape, **kw)
    assert not ok and feature in why and reason in why and ws == 0, (kw, why)
  ok, why, _ = _supported_call(lib, (B, 200, T, N, K, H, H), bias=(1, N, 200, T))
  assert not ok and "bias" in why and "multiple of 128" in why, why
  ok, why, ws = _supported_call(lib, shape, bias=(1, N, T, T), mask=(B, 1, T, T), positions=True, causal=1)
  if not ok:  # no GPU here, or one the feature plans do not run on: the device's reason, not the inputs'
    device = ("no CUDA device", "built without CUDA", "not CC 9.0", "no sm_90a code", "SINKATTN_CUDA_HOPPER=0")
    assert any(d in why for d in device) and ws == 0, why
  else:
    assert ws > 0
  ok, why = _lib.cuda_supported(2, *shape, mask=True)
  assert not ok and "sa_jax_cuda_supported_call" in why, why
