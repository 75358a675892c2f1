"""Where sinkattn guesses a call runs (the GPU fallback warning and implementation='cudnn' depend on it), what it
asks the library about the CUDA kernels, and where the answer sends a call on a GPU (the lowering for CUDA, made
here without one)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sinkattn
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
  assert _routing.cuda_reason(Inputs(q, k, k, **arrays)) == why
  assert not hasattr(_routing, "CUDA_LACKS")


@pytest.mark.skipif(not _lib.available(), reason="libsinkattn_jax.so is not built")
@pytest.mark.parametrize("decode", [False, True], ids=["attention", "decode"])
def test_the_library_names_the_soft_cap(decode):
  """The soft-cap is asked of the library like the inputs (sa_jax_cuda_supported with the cap, of the attention
  kernels or the decode kernels): no GPU is needed for the answer, which names logits_soft_cap."""
  from sinkattn._inputs import Inputs

  ok, why = _lib.cuda_supported(2, 2, 4, 6, 4, 2, 64, 64, logits_soft_cap=5.0, decode=decode)
  if ok:
    pytest.skip("this library's CUDA kernels take logits_soft_cap")
  assert "logits_soft_cap" in why and "CUDA" in why, why
  q, k = jnp.zeros((2, 4, 4, 64), jnp.bfloat16), jnp.zeros((2, 6, 2, 64), jnp.bfloat16)
  assert _routing.cuda_reason(Inputs(q, k, k), logits_soft_cap=5.0, decode=decode) == why


def _on_a_gpu(monkeypatch, answer=None):
  """The routing as on a machine with a GPU and a CUDA build: the lowering for CUDA then holds what a GPU runs.
  answer(**flags) replaces the library's (sa_jax_cuda_supported) when given; every question is recorded."""
  monkeypatch.setattr(_routing, "_warned", set())
  monkeypatch.setattr(_routing, "gpu_present", lambda: True)
  monkeypatch.setattr(_routing, "likely_on_gpu", lambda x: True)
  monkeypatch.setattr(_lib, "has_cuda", lambda: True)
  asked, real = [], _lib.cuda_supported

  def ask(*shape, **flags):
    asked.append(flags)
    return answer(**flags) if answer else real(*shape, **flags)

  monkeypatch.setattr(_lib, "cuda_supported", ask)
  return asked


def _cuda_calls(fn, *args):
  """The sinkattn custom calls in fn's program lowered for CUDA (jax.export: no GPU needed)."""
  targets = (_lib.FWD_TARGET, _lib.DECODE_TARGET_CUDA)
  checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in targets]
  text = jax.export.export(jax.jit(fn), platforms=("cuda",), disabled_checks=checks)(*args).mlir_module()
  return [line for line in text.splitlines() if "@sinkattn_" in line]


@pytest.mark.skipif(not _lib.available(), reason="libsinkattn_jax.so is not built")
@pytest.mark.parametrize("op", ["dot_product_attention", "decode_attention"])
def test_a_gpu_runs_soft_capped_calls_on_the_reference_while_the_library_refuses_them(monkeypatch, op):
  """On a GPU, a soft-capped call the library says CUDA refuses runs the pure-jnp reference (its CUDA lowering
  has no sinkattn call) with one warning in the library's words; on the CPU it keeps the fused kernel;
  implementation='cudnn' refuses it. Once the library takes it (a mocked answer), the CUDA lowering is the kernel."""
  from conftest import make_inputs

  q, k, v, s = make_inputs(40, B=2, T=4, S=8, N=4, K=2, H=64, dtype=jnp.bfloat16)
  lens = jnp.asarray([8, 5], jnp.int32)
  call = {
    "dot_product_attention": lambda q, **kw: sinkattn.dot_product_attention(q, k, v, sinks=s, is_causal=True, **kw),
    "decode_attention": lambda q, **kw: sinkattn.decode_attention(q, k, v, lens, sinks=s, **kw),
  }[op]
  cpu = call(q, logits_soft_cap=5.0, implementation="fused")
  asked = _on_a_gpu(monkeypatch)
  with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    got = [call(q, logits_soft_cap=5.0) for _ in range(2)]
  named = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
  assert len(named) == 1 and "logits_soft_cap" in named[0] and "reference" in named[0], named
  assert asked and all(a["logits_soft_cap"] == 5.0 and a["decode"] == (op == "decode_attention") for a in asked)
  for g in got:  # this process runs on the CPU: the fused kernel
    np.testing.assert_array_equal(np.asarray(g), np.asarray(cpu))
  assert _cuda_calls(lambda q: call(q, logits_soft_cap=5.0), q) == []
  with pytest.raises(ValueError, match="logits_soft_cap"):
    call(q, logits_soft_cap=5.0, implementation="cudnn")
  _on_a_gpu(monkeypatch, answer=lambda **flags: (True, ""))
  assert len(_cuda_calls(lambda q: call(q, logits_soft_cap=5.0), q)) == 1
