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


_STATICS = dict(softmax=2, causal=0, window_left=-1, window_right=-1, diag_offset=0)


@pytest.mark.skipif(not _lib.available(), reason="libsinkattn_jax.so is not built")
@pytest.mark.parametrize("feature", ["bias", "mask", "positions"])
def test_what_the_cuda_kernels_lack_comes_from_the_library(feature):
  """Python asks the library which calls the CUDA kernels take; the answer needs no GPU. The query by sizes alone
  (sa_jax_cuda_supported) cannot decide a bias, a mask or positions and says so, naming the input and the query
  that can; the op asks that one (sa_jax_cuda_supported_call) with the call's shapes and options, and its reason for
  a call the feature kernels do not take (4 queries: not a multiple of 128) is that answer."""
  from sinkattn._inputs import Inputs

  shape = (2, 4, 6, 4, 2, 64, 64)  # B T S N K H Hv
  ok, why = _lib.cuda_supported(2, *shape, **{feature: True})
  assert not ok and feature in why and "sa_jax_cuda_supported_call" in why, why
  q, k = jnp.zeros((2, 4, 4, 64), jnp.bfloat16), jnp.zeros((2, 6, 2, 64), jnp.bfloat16)
  arrays = dict(
    bias=dict(bias=jnp.zeros((1, 1, 4, 6), jnp.bfloat16)),
    mask=dict(mask=jnp.ones((1, 1, 4, 6), bool)),
    positions=dict(q_pos=jnp.zeros((2, 4), jnp.int32), kv_pos=jnp.zeros((2, 6), jnp.int32)),
  )[feature]
  x = Inputs(q, k, k, **arrays)
  ok, full, ws = _routing.cuda_call(x, **_STATICS)
  assert not ok and ws == 0 and feature in full and "multiple of 128" in full, full
  assert _routing.cuda_reason(x, statics=_STATICS) == full
  assert not hasattr(_routing, "CUDA_LACKS")


def _supported_call(shape, *, causal=0, segments=False, bias=None, mask=None, positions=False, cap=0.0):
  """sa_jax_cuda_supported_call for a bf16 learnable-sink call (the query a call with a feature input needs)."""
  statics = dict(_STATICS, causal=causal)
  return _lib.cuda_supported_call(
    2,
    *shape,
    **statics,
    has_lengths=False,
    has_segments=segments,
    bias_dims=bias,
    bias_dtype_code=2,
    mask_dims=mask,
    positions=positions,
    logits_soft_cap=cap,
  )


@pytest.mark.skipif(not _lib.available(), reason="libsinkattn_jax.so is not built")
def test_the_full_query_names_what_the_feature_kernels_refuse():
  """sa_jax_cuda_supported_call decides with the bias's and mask's shapes and the segment ids, on any machine: each
  call the feature plans cannot take is refused naming the input and the reason; one they take is refused only for
  want of a device here (no workspace then), and the sizes-only query refuses every bias, mask or positions, naming
  the query that can decide."""
  B, T, N, K, H = 2, 256, 4, 2, 64
  shape = (B, T, T, N, K, H, H)
  refused = [
    (dict(bias=(1, N, 1, T)), "bias", "shared by the query rows"),
    (dict(mask=(B, 1, 1, T)), "mask", "[B or 1, N or 1, q_len, kv_len]"),
    (dict(mask=(1, 1, T, T), segments=True), "mask", "segment ids"),
    (dict(positions=True, causal=1, segments=True), "positions", "segment ids"),
  ]
  for kw, feature, reason in refused:
    ok, why, ws = _supported_call(shape, **kw)
    assert not ok and feature in why and reason in why and ws == 0, (kw, why)
  ok, why, _ = _supported_call((B, 200, T, N, K, H, H), bias=(1, N, 200, T))
  assert not ok and "bias" in why and "multiple of 128" in why, why
  ok, why, ws = _supported_call(shape, bias=(1, N, T, T), mask=(B, 1, T, T), positions=True, causal=1)
  if not ok:  # no GPU here, or one the feature plans do not run on: the device's reason, not the inputs'
    device = ("no CUDA device", "built without CUDA", "not CC 9.0", "no sm_90a code", "SINKATTN_CUDA_HOPPER=0")
    assert any(d in why for d in device) and ws == 0, why
  else:
    assert ws > 0
  ok, why = _lib.cuda_supported(2, *shape, mask=True)
  assert not ok and "sa_jax_cuda_supported_call" in why, why


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


def _on_a_gpu(monkeypatch, answer=None, ws=0):
  """The routing as on a machine with a GPU and a CUDA build: the lowering for CUDA then holds what a GPU runs.
  answer(**flags) replaces the library's (sa_jax_cuda_supported, and sa_jax_cuda_supported_call with ws as its
  backward workspace) when given; every question is recorded, decode=False for the full query."""
  monkeypatch.setattr(_routing, "_warned", set())
  monkeypatch.setattr(_routing, "gpu_present", lambda: True)
  monkeypatch.setattr(_routing, "likely_on_gpu", lambda x: True)
  monkeypatch.setattr(_lib, "has_cuda", lambda: True)
  asked, real, real_call = [], _lib.cuda_supported, _lib.cuda_supported_call

  def ask(*shape, **flags):
    asked.append(flags)
    return answer(**flags) if answer else real(*shape, **flags)

  def ask_call(*shape, **flags):
    asked.append(dict(flags, decode=False))
    return (*answer(**flags), ws) if answer else real_call(*shape, **flags)

  monkeypatch.setattr(_lib, "cuda_supported", ask)
  monkeypatch.setattr(_lib, "cuda_supported_call", ask_call)
  return asked


def _cuda_calls(fn, *args):
  """The sinkattn custom calls in fn's program lowered for CUDA (jax.export: no GPU needed). The tests change the
  library's answer within the process, and jax reuses the traces of the custom_vjp's rules (the routing made when
  they were traced) across calls: the caches go first."""
  jax.clear_caches()
  targets = (_lib.FWD_TARGET, _lib.BWD_TARGET_CUDA, _lib.DECODE_TARGET_CUDA)
  checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in targets]
  text = jax.export.export(jax.jit(fn), platforms=("cuda",), disabled_checks=checks)(*args).mlir_module()
  return [line for line in text.splitlines() if "@sinkattn_" in line]


@pytest.mark.skipif(not _lib.available(), reason="libsinkattn_jax.so is not built")
@pytest.mark.parametrize("feature", ["bias", "mask", "positions"])
def test_a_gpu_runs_feature_calls_on_the_kernels_the_library_takes(monkeypatch, feature):
  """On a GPU, a call with a bias, a mask or positions is asked of the library in full (its shapes, causal, the
  segment ids): one the feature kernels do not take (T = 4 here) runs the reference with one warning naming the
  input; one they take (a mocked answer) lowers to the kernels, forward and backward, the backward's workspace
  being the size that same answer gives (the class table of a mask lives there)."""
  from conftest import make_inputs

  q, k, v, s = make_inputs(41, B=2, T=4, S=8, N=4, K=2, H=64, dtype=jnp.bfloat16)
  pos = jnp.tile(jnp.arange(8, dtype=jnp.int32), (2, 1))
  kw = dict(
    bias=dict(bias=jnp.zeros((1, 4, 4, 8), jnp.bfloat16)),
    mask=dict(mask=jnp.tril(jnp.ones((4, 8), bool))[None, None]),
    positions=dict(is_causal=True, query_positions=pos[:, :4], key_value_positions=pos),
  )[feature]

  def loss(q):
    return sinkattn.dot_product_attention(q, k, v, sinks=s, **kw).astype(jnp.float32).sum()

  asked = _on_a_gpu(monkeypatch)
  with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    loss(q)
  named = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
  assert len(named) == 1 and feature in named[0] and "multiple of 128" in named[0], named
  assert asked and all("bias_dims" in a for a in asked), asked  # the full query, not the sizes
  assert _cuda_calls(jax.grad(loss), q) == []
  _on_a_gpu(monkeypatch, answer=lambda **flags: (True, ""), ws=12345)
  calls = _cuda_calls(jax.grad(loss), q)
  assert len(calls) == 2 and any("tensor<12345xui8>" in c for c in calls), calls


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


@pytest.mark.skipif(not _lib.available(), reason="libsinkattn_jax.so is not built")
def test_a_mask_broadcast_along_the_queries_reaches_the_cuda_kernels_broadcast(monkeypatch):
  """The CUDA feature kernels take masks of [B or 1, N or 1, T, S]: a key-padding mask [B, 1, 1, S] is asked of the
  library in that form and broadcast to it in the CUDA lowering only, forward and backward; the CPU kernels keep the
  mask as given, and the numbers do not change."""
  from conftest import make_inputs

  q, k, v, s = make_inputs(42, B=2, T=4, S=8, N=4, K=2, H=64, dtype=jnp.bfloat16)
  pad = jnp.asarray([[True] * 8, [True] * 5 + [False] * 3])[:, None, None, :]

  def loss(q):
    return sinkattn.dot_product_attention(q, k, v, mask=pad, sinks=s).astype(jnp.float32).sum()

  want = jax.grad(loss)(q)
  asked = _on_a_gpu(monkeypatch, answer=lambda **flags: (True, ""), ws=64)
  calls = _cuda_calls(jax.grad(loss), q)
  assert asked and all(tuple(a["mask_dims"]) == (2, 1, 4, 8) for a in asked), asked
  assert len(calls) == 2 and all("tensor<2x1x4x8xi1>" in c for c in calls), calls
  assert not any("tensor<2x1x1x8xi1>" in c for c in calls), calls
  jax.clear_caches()
  np.testing.assert_array_equal(np.asarray(jax.grad(loss)(q)), np.asarray(want))  # this CPU: the mask as given


@pytest.mark.skipif(not _lib.available(), reason="libsinkattn_jax.so is not built")
def test_a_gpu_runs_float32_on_the_kernels_only_at_default_precision(monkeypatch):
  """The CUDA kernels multiply float32 inputs rounded to bf16 (docs/hopper.md, "Float32 inputs"): even where the
  library takes a float32 call (a mocked answer), it lowers to them only with precision=DEFAULT; with None, HIGH or
  HIGHEST it runs the reference on a GPU, with one warning naming the precision, and implementation='cudnn' refuses
  it. 16-bit calls do not depend on the precision; the CPU keeps the fused kernel for every precision."""
  from conftest import make_inputs

  q, k, v, s = make_inputs(42, B=2, T=4, S=8, N=4, K=2, H=64, dtype=jnp.float32)

  def loss(q, precision):
    return sinkattn.dot_product_attention(q, k, v, sinks=s, is_causal=True, precision=precision).sum()

  _on_a_gpu(monkeypatch, answer=lambda **flags: (True, ""))
  with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    for p in (None, jax.lax.Precision.HIGH, "highest", (jax.lax.Precision.DEFAULT, jax.lax.Precision.HIGHEST)):
      assert _cuda_calls(jax.grad(lambda q, p=p: loss(q, p)), q) == [], p
      with pytest.raises(ValueError, match="precision"):
        sinkattn.dot_product_attention(q, k, v, sinks=s, precision=p, implementation="cudnn")
  named = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
  assert len(named) == 1 and "precision" in named[0] and "float32" in named[0], named
  for p in (jax.lax.Precision.DEFAULT, "bfloat16", ("default", "default")):
    assert len(_cuda_calls(jax.grad(lambda q, p=p: loss(q, p)), q)) == 2, p
  qb, kb, vb = (x.astype(jnp.bfloat16) for x in (q, k, v))
  assert len(_cuda_calls(lambda q: sinkattn.dot_product_attention(q, kb, vb, sinks=s), qb)) == 1
