"""Where sinkattn guesses a call runs (the GPU fallback warning and implementation='cudnn' depend on it)."""

import jax

from sinkattn import _routing


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
