"""logits_soft_cap: each logit l = scale * q.k + bias becomes cap * tanh(l / cap) before the masks; the sink logit is
not capped. The fused CPU kernels against the jnp reference computed in float64 (and that reference against the
fp64 NumPy oracle, written apart from it), forward and every gradient (q, k, v, sinks, bias; through lse too);
finite differences of both paths; decode_attention; the refusals, by name; and nothing changed without a cap."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import numpy_ref
import sinkattn
from conftest import GRAD_TOL, LSE_TOL, OUT_TOL, _gpu_devices, assert_close, bnt, f64, make_inputs
from sinkattn import _lib, _routing
from sinkattn._inputs import Inputs

pytestmark = pytest.mark.skipif(not _lib.available(), reason="libsinkattn_jax.so is not built")

SOFTMAX = {"vanilla": 0, "off_by_one": 1, "learnable": 2}

# (id, shape, dot_product_attention options, arrays tag, cap, dtype). k is drawn 2 N(0, 1), so the logits reach
# +-8 at H = 16 and every cap below bites (a test checks that); sinks U(-10, 10), or +-50 where the shape says so.
CASES = [
  ("sinks_u10", dict(), dict(), None, 5.0, jnp.float32),
  ("sinks_pm50", dict(sink_range=50.0), dict(is_causal=True), None, 3.0, jnp.float32),
  ("bias_causal", dict(T=12, S=20), dict(is_causal=True), "bias", 2.0, jnp.float32),
  ("bias_b11s_window", dict(), dict(local_window_size=(3, 2)), "bias_b11s", 4.0, jnp.float32),
  ("gqa_8_1_bottom_right", dict(N=8, K=1, T=8, S=20), dict(is_causal=True, causal_alignment="bottom_right"), None, 1.0,
   jnp.float32),
  ("segments_lengths", dict(T=20, S=20), dict(is_causal=True), "segments_lengths", 5.0, jnp.float32),
  ("positions_window", dict(T=20, S=20), dict(is_causal=True, local_window_size=(6, 0)), "positions", 5.0,
   jnp.float32),
  ("mask_off_by_one", dict(), dict(softmax_type="off_by_one"), "mask", 3.0, jnp.float32),
  ("vanilla_lengths_empty", dict(B=3), dict(softmax_type="vanilla"), "lengths_empty", 30.0, jnp.float32),
  ("bf16_sinks_bias", dict(sink_range=50.0), dict(is_causal=True), "bias", 5.0, jnp.bfloat16),
  ("bf16_gqa_window", dict(N=8, K=2), dict(is_causal=True, local_window_size=(5, 0)), None, 2.0, jnp.bfloat16),
  ("f16_segments", dict(T=20, S=20), dict(), "segments_lengths", 5.0, jnp.float16),
]  # fmt: skip


def _arrays(tag, B, T, S, N, dtype, seed):
  """(bias or None, the other arrays as dot_product_attention keywords) for a case's tag."""
  rng = np.random.default_rng(seed + 11)
  bias, out = None, {}
  if tag in ("bias", "bias_b11s"):
    shape = (1, N, T, S) if tag == "bias" else (B, 1, 1, S)
    bias = jnp.asarray(3.0 * rng.standard_normal(shape), jnp.float32 if dtype == jnp.float32 else dtype)
  if tag == "mask":
    out["mask"] = jnp.asarray(rng.random((B, 1, T, S)) < 0.6)
  if tag in ("segments_lengths", "lengths_empty"):
    out["query_seq_lengths"] = jnp.asarray(rng.integers(1, T + 1, B), jnp.int32)
    out["key_value_seq_lengths"] = jnp.asarray(rng.integers(1, S + 1, B), jnp.int32)
  if tag == "lengths_empty":  # a batch with no valid key: out 0, lse -inf (vanilla)
    out["key_value_seq_lengths"] = out["key_value_seq_lengths"].at[1].set(0)
  if tag == "segments_lengths":
    ids = lambda n: jnp.asarray(np.sort(rng.integers(0, 3, (B, n)), axis=1), jnp.int32)  # noqa: E731
    out.update(query_segment_ids=ids(T), key_value_segment_ids=ids(S))
  if tag == "positions":  # two packed documents, positions restarting at the second
    pos = lambda n: jnp.asarray(np.tile(np.r_[np.arange(n // 2), np.arange(n - n // 2)], (B, 1)), jnp.int32)  # noqa: E731
    out.update(query_positions=pos(T), key_value_positions=pos(S))
  return bias, out


def _setup(case, seed=0):
  _, shape, opts, tag, cap, dtype = case
  shape = dict(shape)
  q, k, v, sinks = make_inputs(seed, dtype=dtype, sink_range=shape.pop("sink_range", 10.0), **shape)
  B, T, N = q.shape[:3]
  bias, arrays = _arrays(tag, B, T, k.shape[1], N, dtype, seed)
  s = sinks if opts.get("softmax_type", "learnable") == "learnable" else None
  rng = np.random.default_rng(seed + 1)
  dout = jnp.asarray(rng.standard_normal(q.shape[:3] + v.shape[3:]), dtype)
  dlse = jnp.asarray(rng.standard_normal((B, T, N)), jnp.float32)
  return (q, k, v, s, bias), arrays, dict(opts, logits_soft_cap=cap), (dout, dlse)


def _vjp(impl, primals, arrays, opts, cot):
  """(out, lse [B,T,N], grads of q, k, v, sinks, bias) for cotangents cot = (dout, dlse): a loss that uses lse."""

  def f(q, k, v, s, bias):
    return sinkattn.dot_product_attention(
      q, k, v, bias, sinks=s, return_residual=True, implementation=impl, **opts, **arrays
    )

  (out, lse), vjp = jax.vjp(f, *primals)
  dout, dlse = cot
  dlse = jnp.where(jnp.isfinite(lse), dlse.astype(lse.dtype), 0.0)
  return out, lse, vjp((dout.astype(out.dtype), dlse))


def _reference_f64(primals, arrays, opts, cot):
  """_vjp of the jnp reference in float64, as NumPy arrays."""
  with jax.enable_x64(True):
    up = lambda x: None if x is None else jnp.asarray(f64(x))  # noqa: E731
    out, lse, grads = _vjp("reference", [up(x) for x in primals], arrays, opts, [up(c) for c in cot])
    return np.asarray(out), np.asarray(lse), [None if g is None else np.asarray(g) for g in grads]


def _np_kwargs(opts, arrays, bias):
  w = opts.get("local_window_size")
  causal = 0 if not opts.get("is_causal") else 2 if opts.get("causal_alignment") == "bottom_right" else 1
  names = dict(
    query_seq_lengths="q_lens",
    key_value_seq_lengths="kv_lens",
    query_segment_ids="q_seg",
    key_value_segment_ids="kv_seg",
    query_positions="q_pos",
    key_value_positions="kv_pos",
    mask="attn_mask",
  )
  kw = {names[n]: np.asarray(a) for n, a in arrays.items()}
  window = (-1, -1) if w is None else w
  kw.update(softmax=SOFTMAX[opts.get("softmax_type", "learnable")], causal=causal, window=window, bias=f64(bias))
  return dict(kw, logits_soft_cap=opts["logits_soft_cap"])


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fused_matches_the_float64_reference(case):
  """The fused CPU kernels (at the case's dtype) against the jnp reference in float64: out, lse and the gradients
  of q, k, v, sinks and bias for a loss that uses lse."""
  primals, arrays, opts, cot = _setup(case)
  dtype = np.dtype(case[-1])
  out, lse, grads = jax.jit(lambda p, a, c: _vjp("fused", p, a, opts, c))(primals, arrays, cot)
  want_out, want_lse, want_grads = _reference_f64(primals, arrays, opts, cot)
  assert out.dtype == dtype and lse.dtype == jnp.float32
  assert_close(out, want_out, OUT_TOL[dtype], "out")
  assert_close(lse, want_lse, LSE_TOL[dtype], "lse")
  for name, g, w, x in zip(("dq", "dk", "dv", "dsinks", "dbias"), grads, want_grads, primals):
    assert (g is None) == (x is None), name
    if g is not None:
      assert g.dtype == x.dtype and g.shape == x.shape, name
      assert_close(g, w, GRAD_TOL[dtype], name)
  if primals[3] is not None:
    assert float(np.max(np.abs(want_grads[3]))) > 1e-3  # the sink gradient is exercised


@pytest.mark.parametrize("case", CASES[:9], ids=[c[0] for c in CASES[:9]])
def test_reference_matches_the_numpy_oracle_and_the_cap_bites(case):
  """The jnp reference in float64 against numpy_ref (fp64, its own code), forward and backward; and the same
  call without a cap differs by O(1): every case's cap changes the result."""
  primals, arrays, opts, cot = _setup(case)
  q, k, v, s, bias = (f64(x) for x in primals)
  want_out, want_lse, want_grads = _reference_f64(primals, arrays, opts, cot)
  kw = _np_kwargs(opts, arrays, primals[4])
  out, lse = numpy_ref.forward(q, k, v, s, **kw)
  np.testing.assert_allclose(want_out, out, atol=1e-9)
  np.testing.assert_allclose(bnt(want_lse), lse, atol=1e-9)
  dlse = np.where(np.isfinite(lse), np.swapaxes(f64(cot[1]), 1, 2), 0.0)
  oracle = numpy_ref.backward(q, k, v, s, f64(cot[0]), dlse, **kw)
  for name, g, w in zip(("dq", "dk", "dv", "dsinks", "dbias"), want_grads, oracle):
    if g is not None:
      np.testing.assert_allclose(g, w, atol=1e-9, err_msg=name)
  uncapped, _ = numpy_ref.forward(q, k, v, s, **dict(kw, logits_soft_cap=0.0))
  assert float(np.max(np.abs(uncapped - out))) > 1e-2


def test_the_sink_logit_is_not_capped():
  """A sink of +50 under a cap of 5 keeps its logit: lse = log(sum_j exp(s_j) + e^50) = 50 + O(e^-40), out ~ 0;
  a capped sink would give lse <= log(S + 1) + 5."""
  q, k, v, _ = make_inputs(3, B=1, T=4, S=16, N=2, K=1)
  sinks = jnp.asarray([50.0, -50.0], jnp.float32)
  for impl in ("fused", "reference"):
    out, lse = sinkattn.dot_product_attention(
      q, k, v, sinks=sinks, logits_soft_cap=5.0, return_residual=True, implementation=impl
    )
    np.testing.assert_allclose(np.asarray(lse[..., 0]), 50.0, rtol=1e-6)
    assert float(jnp.abs(out[:, :, 0]).max()) < 1e-15
    assert float(lse[..., 1].max()) <= np.log(16) + 5.0  # the capped keys: each logit at most the cap


def _loss(out, lse, w_out, w_lse):
  return jnp.sum(out * w_out) + jnp.sum(jnp.where(jnp.isfinite(lse), lse * w_lse, 0.0))


def test_finite_differences_of_the_reference():
  """jax.test_util.check_grads (float64) on the reference with a cap, sinks, a bias, causal and GQA: q, k, v,
  sinks and bias, through out and lse."""
  with jax.enable_x64(True):
    q, k, v, s = (jnp.asarray(f64(x)) for x in make_inputs(5, B=1, T=5, S=7, N=4, K=2, H=8))
    bias = jnp.asarray(np.random.default_rng(6).standard_normal((1, 4, 5, 7)))
    rng = np.random.default_rng(7)
    w_out, w_lse = jnp.asarray(rng.standard_normal((1, 5, 4, 8))), jnp.asarray(rng.standard_normal((1, 5, 4)))

    def f(q, k, v, s, bias):
      out, lse = sinkattn.dot_product_attention(
        q, k, v, bias, sinks=s, is_causal=True, logits_soft_cap=2.0, return_residual=True, implementation="reference"
      )
      return _loss(out, lse, w_out, w_lse)

    check_grads(f, (q, k, v, s, bias), order=1, modes=["rev"], atol=1e-6, rtol=1e-6, eps=1e-6)


def test_finite_differences_of_the_fused_kernels():
  """The fused backward (float32) against central differences of the fused forward, along a random direction in
  (q, k, v, sinks, bias) at once: d/dt L(x + t d) = <grad L, d>, to the float32 forward's rounding."""
  q, k, v, s = make_inputs(8, B=2, T=6, S=9, N=4, K=2, H=8)
  bias = jnp.asarray(np.random.default_rng(9).standard_normal((2, 1, 6, 9)), jnp.float32)
  rng = np.random.default_rng(10)
  w_out, w_lse = jnp.asarray(rng.standard_normal((2, 6, 4, 8))), jnp.asarray(rng.standard_normal((2, 6, 4)))
  x = (q, k, v, s, bias)
  d = [jnp.asarray(rng.standard_normal(a.shape), jnp.float32) for a in x]

  @jax.jit
  def f(q, k, v, s, bias):
    out, lse = sinkattn.dot_product_attention(
      q, k, v, bias, sinks=s, local_window_size=(3, 1), logits_soft_cap=1.5, return_residual=True
    )
    return _loss(out, lse, w_out, w_lse)

  grads = jax.grad(f, argnums=tuple(range(5)))(*x)
  want = sum(float(jnp.vdot(g, di)) for g, di in zip(grads, d))
  eps = 1e-3
  step = lambda t: f(*(a + t * di for a, di in zip(x, d)))  # noqa: E731
  got = (float(step(eps)) - float(step(-eps))) / (2 * eps)
  assert abs(got - want) <= 2e-3 * max(1.0, abs(want)), (got, want)


DECODE = [  # B, T, S, N, K, H, dtype, softmax, window, cap
  (3, 1, 300, 8, 2, 64, jnp.bfloat16, "learnable", None, 5.0),
  (2, 4, 200, 4, 4, 32, jnp.float32, "off_by_one", (63, 0), 2.0),
  (2, 16, 150, 8, 1, 64, jnp.float32, "learnable", None, 30.0),
]


@pytest.mark.parametrize("case", DECODE)
def test_decode_matches_the_float64_reference(case):
  """decode_attention with a cap (on CPU: the attention forward kernels) against the jnp reference in float64
  (causal bottom-right over the cache lengths), sinks +-50 included, empty caches too."""
  B, T, S, N, K, H, dtype, softmax, window, cap = case
  q, kc, vc, sinks = make_inputs(12, B=B, T=T, S=S, N=N, K=K, H=H, dtype=dtype)
  sinks = sinks.at[0].set(50.0).at[N - 1].set(-50.0) if softmax == "learnable" else None
  lens = jnp.asarray([0, S, S // 2][:B], jnp.int32)
  kw = dict(softmax_type=softmax, local_window_size=window, logits_soft_cap=cap, return_residual=True)
  out, lse = sinkattn.decode_attention(q, kc, vc, lens, sinks=sinks, **kw)
  with jax.enable_x64(True):
    up = lambda x: None if x is None else jnp.asarray(f64(x))  # noqa: E731
    rout, rlse = sinkattn.decode_attention(up(q), up(kc), up(vc), lens, sinks=up(sinks), implementation="xla", **kw)
    rout, rlse = np.asarray(rout), np.asarray(rlse)
  assert_close(out, rout, OUT_TOL[np.dtype(dtype)], "decode out")
  assert_close(lse, rlse, LSE_TOL[np.dtype(dtype)], "decode lse")
  uncapped = sinkattn.decode_attention(q, kc, vc, lens, sinks=sinks, **dict(kw, logits_soft_cap=None))[0]
  assert float(jnp.abs(uncapped.astype(jnp.float32) - out.astype(jnp.float32)).max()) > 1e-2


def test_vmap_with_a_cap_equals_a_loop():
  """Under vmap the handler folds or loops over the vmapped dim: the cap reaches every cell."""
  q, k, v, s = make_inputs(13, B=1, T=8, S=8)
  qs = jnp.stack([q, -q, 2 * q])
  f = lambda q: sinkattn.dot_product_attention(q, k, v, sinks=s, is_causal=True, logits_soft_cap=2.0)  # noqa: E731
  got = jax.vmap(f)(qs)
  for i in range(3):
    np.testing.assert_allclose(np.asarray(got[i]), np.asarray(f(qs[i])), atol=1e-6)


BAD = [  # value, exception, a word of the message
  (-1.0, ValueError, "> 0 and finite"),
  (0.0, ValueError, "None, not 0"),
  (0, ValueError, "None, not 0"),
  (float("nan"), ValueError, "> 0 and finite"),
  (float("inf"), ValueError, "> 0 and finite"),
  (1e-50, ValueError, "float32"),
  (1e39, ValueError, "float32"),
  (3e38, ValueError, "log2(e)"),
  (True, TypeError, "Python float"),
  ("5", TypeError, "Python float"),
  (jnp.float32(5.0), TypeError, "Python float"),
]


@pytest.mark.parametrize("value,exc,words", BAD, ids=[repr(b[0]) for b in BAD])
def test_bad_caps_are_refused_by_name(value, exc, words):
  """Every entry point refuses a bad cap before tracing anything, naming logits_soft_cap and the value seen."""
  q, k, v, s = make_inputs(14, B=1, T=4, S=4, N=2, K=1, H=8)
  lens = jnp.asarray([4], jnp.int32)
  calls = [
    lambda: sinkattn.dot_product_attention(q, k, v, sinks=s, logits_soft_cap=value),
    lambda: sinkattn.dot_product_attention(q, k, v, sinks=s, logits_soft_cap=value, implementation="reference"),
    lambda: sinkattn.decode_attention(q, k, v, lens, sinks=s, logits_soft_cap=value),
    lambda: sinkattn.ring_attention(q, k, v, sinks=s, axis_name="sp", logits_soft_cap=value),
  ]
  for call in calls:
    with pytest.raises(exc, match="logits_soft_cap") as e:
      call()
    assert words in str(e.value), str(e.value)
    if exc is ValueError:
      assert repr(float(value)) in str(e.value), str(e.value)


def test_a_traced_cap_is_refused():
  """The cap is a static attribute of the kernels, like scale: a traced value is a TypeError naming it."""
  q, k, v, s = make_inputs(15, B=1, T=4, S=4, N=2, K=1, H=8)
  f = jax.jit(lambda c: sinkattn.dot_product_attention(q, k, v, sinks=s, logits_soft_cap=c))
  with pytest.raises(TypeError, match="logits_soft_cap: .*traced"):
    f(5.0)
  g = jax.grad(lambda c: jnp.sum(sinkattn.decode_attention(q, k, v, jnp.asarray([4]), logits_soft_cap=c)))
  with pytest.raises(TypeError, match="logits_soft_cap: .*traced"):
    g(5.0)


@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_without_a_cap_nothing_changes(impl):
  """logits_soft_cap=None is the call without the argument: the same lowered program (the kernels get
  logits_soft_cap = 0, the C API's none), and bitwise the same out, lse and gradients."""
  primals, arrays, opts, cot = _setup(CASES[2])
  del opts["logits_soft_cap"]
  with_none = jax.jit(lambda p, a, c: _vjp(impl, p, a, dict(opts, logits_soft_cap=None), c))
  without = jax.jit(lambda p, a, c: _vjp(impl, p, a, opts, c))
  assert with_none.lower(primals, arrays, cot).as_text() == without.lower(primals, arrays, cot).as_text()
  for a, b in zip(jax.tree.leaves(with_none(primals, arrays, cot)), jax.tree.leaves(without(primals, arrays, cot))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  q, k, v, s, _ = primals
  lens = jnp.asarray([16, 5], jnp.int32)
  dec = lambda **kw: sinkattn.decode_attention(q[:, :2], k, v, lens, sinks=s, implementation=impl, **kw)  # noqa: E731
  np.testing.assert_array_equal(np.asarray(dec(logits_soft_cap=None)), np.asarray(dec()))


def test_the_kernels_get_the_cap_as_a_float32_attribute():
  """The forward, backward and decode custom calls carry logits_soft_cap (0 without a cap)."""
  q, k, v, s = make_inputs(16, B=1, T=4, S=4, N=2, K=1, H=8)

  def text(cap):
    loss = lambda q: jnp.sum(sinkattn.dot_product_attention(q, k, v, sinks=s, logits_soft_cap=cap))  # noqa: E731
    return (
      jax.jit(jax.grad(loss)).lower(q).as_text()
      + jax.jit(lambda q: sinkattn.decode_attention(q, k, v, jnp.asarray([4], jnp.int32), logits_soft_cap=cap))
      .lower(q)
      .as_text()
    )

  for cap, want in ((None, "logits_soft_cap = 0.000000e+00 : f32"), (7.5, "logits_soft_cap = 7.500000e+00 : f32")):
    calls = [line for line in text(cap).splitlines() if "@sinkattn_" in line]
    assert len(calls) == 3 and all(want in line for line in calls), calls


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_devices(), reason="no GPU visible to jax")
@pytest.mark.parametrize("op", ["dot_product_attention", "decode_attention"])
def test_on_a_gpu_the_library_decides(monkeypatch, op):
  """On a GPU a soft-capped call runs where the library says: on the CUDA kernels when it takes the cap, else on
  the reference with one warning in its words (and implementation='cudnn' refuses it); the numbers of the
  float64 reference either way."""
  monkeypatch.setattr(_routing, "_warned", set())
  q, k, v, s = make_inputs(30, B=2, T=1 if op == "decode_attention" else 128, S=256, N=4, K=2, H=64)
  q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
  lens = jnp.asarray([256, 77], jnp.int32)
  kw = dict(sinks=s, logits_soft_cap=5.0, return_residual=True)
  if op == "decode_attention":
    call = lambda *a, **c: sinkattn.decode_attention(*a, lens, **kw, **c)  # noqa: E731
  else:
    call = lambda *a, **c: sinkattn.dot_product_attention(*a, is_causal=True, key_value_seq_lengths=lens, **kw, **c)  # noqa: E731
  why = _routing.cuda_reason(Inputs(q, k, v, s), logits_soft_cap=5.0, decode=op == "decode_attention")
  gpu = jax.devices("gpu")[0]
  with warnings.catch_warnings(record=True) as seen, jax.default_device(gpu):
    warnings.simplefilter("always")
    out, lse = call(*jax.device_put((q, k, v), gpu))
  named = [w for w in seen if issubclass(w.category, RuntimeWarning) and why and why in str(w.message)]
  assert len(named) == (1 if why else 0), [str(w.message) for w in seen]
  with jax.enable_x64(True):
    up = lambda x: jnp.asarray(f64(x))  # noqa: E731
    with jax.default_device(jax.devices("cpu")[0]):
      want_out, want_lse = (np.asarray(x) for x in call(up(q), up(k), up(v), implementation="reference"))
  assert_close(out, want_out, OUT_TOL[np.dtype(jnp.bfloat16)], f"{op} out on GPU")
  assert_close(lse, want_lse, LSE_TOL[np.dtype(jnp.bfloat16)], f"{op} lse on GPU")
  if why:
    with jax.default_device(gpu), pytest.raises(ValueError, match="implementation='cudnn'") as e:
      call(*jax.device_put((q, k, v), gpu), implementation="cudnn")
    assert why in str(e.value)
