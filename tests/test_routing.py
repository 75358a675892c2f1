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
