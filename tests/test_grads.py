"""Gradients: jax.test_util.check_grads on the reference; fused gradients (dsinks included, and through
lse) against the fp64 analytic backward of numpy_ref and against the reference's autodiff."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from test_ops import CASES, _extras, _np_kwargs

import numpy_ref
import sinkattn
from conftest import GRAD_TOL, assert_close, f64, make_inputs

GRAD_CASES = [
  c
  for c in CASES
  if c[0]
  in (
    "vanilla",
    "off_by_one",
    "learnable",
    "learnable_sinks_pm50",
    "causal_bottom_right",
    "window_gptoss",
    "lengths",
    "lengths_zero_and_empty_batch",
    "lengths_vanilla_empty",
    "segments_causal_lengths",
    "gqa_8_1",
    "hv_ne_h",
  )
]


def _setup(case, dtype, seed=0):
  _, shape, opts, tag = case
  shape = dict(shape)
  sink_range = shape.pop("sink_range", 10.0)
  q, k, v, sinks = make_inputs(seed, dtype=dtype, sink_range=sink_range, **shape)
  extras = _extras(tag, q.shape[0], q.shape[1], k.shape[1], seed)
  learn = (opts.get("softmax_type") or "learnable") == "learnable"
  dout = jnp.asarray(np.random.default_rng(seed + 1).standard_normal(q.shape[:3] + v.shape[3:]), dtype)
  dlse = jnp.asarray(np.random.default_rng(seed + 2).standard_normal((q.shape[0], q.shape[2], q.shape[1])), jnp.float32)
  return q, k, v, (sinks if learn else None), extras, opts, dout, dlse


def _grads(impl, q, k, v, s, extras, opts, dout, dlse):
  """VJP of (out, lse) with cotangents (dout, dlse), differentiated in q, k, v (and sinks); dlse [B,N,T] as
  numpy_ref takes it, given to the public lse [B,T,N] transposed."""

  def f(q, k, v, s):
    return sinkattn.dot_product_attention(q, k, v, sinks=s, return_residual=True, implementation=impl, **opts, **extras)

  (out, lse), vjp = jax.vjp(f, q, k, v, s)
  return vjp((dout, jnp.where(jnp.isfinite(lse), jnp.swapaxes(dlse, 1, 2), 0.0)))


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_fused_grads_f32(platform, case):
  q, k, v, s, extras, opts, dout, dlse = _setup(case, jnp.float32)
  npkw = _np_kwargs(opts, extras, q.shape[2])
  _, lse64 = numpy_ref.forward(f64(q), f64(k), f64(v), f64(s), **npkw)
  dlse_np = np.where(np.isfinite(lse64), f64(dlse), 0.0)
  want = numpy_ref.backward(f64(q), f64(k), f64(v), f64(s), f64(dout), dlse_np, **npkw)
  tol = GRAD_TOL[np.dtype(np.float32)]
  for impl in ("fused", "reference"):
    got = jax.jit(lambda *a, impl=impl: _grads(impl, *a[:4], a[4], opts, *a[5:]))(q, k, v, s, extras, dout, dlse)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
      assert_close(g, w, tol, f"{impl} {name}")
    if s is not None:
      assert_close(got[3], want[3], tol, f"{impl} dsinks")
      assert float(np.max(np.abs(want[3]))) > 1e-3  # the sink gradient is not trivially zero here


LOW = [c for c in GRAD_CASES if c[0] in ("learnable", "window_gptoss", "segments_causal_lengths", "gqa_8_1")]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("case", LOW, ids=[c[0] for c in LOW])
def test_fused_grads_low_precision(platform, case, dtype):
  q, k, v, s, extras, opts, dout, dlse = _setup(case, dtype)
  npkw = _np_kwargs(opts, extras, q.shape[2])
  _, lse64 = numpy_ref.forward(f64(q), f64(k), f64(v), f64(s), **npkw)
  want = numpy_ref.backward(
    f64(q), f64(k), f64(v), f64(s), f64(dout), np.where(np.isfinite(lse64), f64(dlse), 0), **npkw
  )
  got = _grads("fused", q, k, v, s, extras, opts, dout, dlse)
  for name, g, w in zip(("dq", "dk", "dv", "dsinks"), got, want):
    if g is not None:
      assert g.dtype == (jnp.float32 if name == "dsinks" else dtype)
      assert_close(g, w, GRAD_TOL[np.dtype(dtype)], f"fused {name}")


@pytest.mark.parametrize(
  "case",
  [
    c
    for c in GRAD_CASES
    if c[0] in ("learnable", "causal_bottom_right", "window_gptoss", "lengths_vanilla_empty", "segments_causal_lengths")
  ],
  ids=lambda c: c[0],
)
def test_reference_check_grads(case):
  """Finite differences in float64 on the reference (x64 only inside this test)."""
  with jax.enable_x64(True):
    q, k, v, s, extras, opts, _, _ = _setup(case, jnp.float32)
    q, k, v = (jnp.asarray(f64(x))[:, :8] if i == 0 else jnp.asarray(f64(x)) for i, x in enumerate((q, k, v)))
    s = None if s is None else jnp.asarray(f64(s))
    extras = {n: (a[:, :8] if n == "query_segment_ids" else a) for n, a in extras.items()}

    def f(q, k, v, s):
      out, lse = sinkattn.dot_product_attention(
        q, k, v, sinks=s, return_residual=True, implementation="reference", **opts, **extras
      )
      return jnp.sum(jnp.sin(out)) + jnp.sum(jnp.where(jnp.isfinite(lse), jnp.tanh(lse), 0.0))

    args = (q, k, v) if s is None else (q, k, v, s)
    g = f if s is not None else (lambda q, k, v: f(q, k, v, None))
    check_grads(g, args, order=1, modes=["rev"], atol=1e-5, rtol=1e-5, eps=1e-6)
    grads = jax.grad(g, argnums=tuple(range(len(args))))(*args)
    assert all(not np.any(np.isnan(np.asarray(x))) for x in grads)


def test_vmap_of_grad_per_example_dsinks(platform):
  """vmap(grad): dsinks per example (the handler loops), equal to a Python loop of grads."""
  q, k, v, sinks = make_inputs(11, B=1, T=8, S=8)
  qs = jnp.stack([q, -q, 2 * q])
  f = lambda q, s: jnp.sum(sinkattn.dot_product_attention(q, k, v, sinks=s, is_causal=True) ** 2)
  g = jax.vmap(jax.grad(f, argnums=(0, 1)), in_axes=(0, None))(qs, sinks)
  for i in range(3):
    gi = jax.grad(f, argnums=(0, 1))(qs[i], sinks)
    np.testing.assert_allclose(g[0][i], gi[0], atol=1e-5)
    np.testing.assert_allclose(g[1][i], gi[1], atol=1e-5)
  # grad of a vmapped loss: dsinks summed over the examples
  gs = jax.grad(lambda s: jnp.sum(jax.vmap(lambda q: f(q, s))(qs)))(sinks)
  np.testing.assert_allclose(gs, g[1].sum(0), rtol=1e-5, atol=1e-5)


def test_vmap_of_grad_all_batched(platform):
  """vmap(grad) with every input batched and no learnable sink: the backward folds the vmap dim."""
  q, k, v, _ = make_inputs(13, B=2, T=8, S=8)
  qs, ks, vs = (jnp.stack([x, -x, 0.5 * x]) for x in (q, k, v))
  f = lambda q, k, v: jnp.sum(
    jnp.sin(sinkattn.dot_product_attention(q, k, v, softmax_type="off_by_one", is_causal=True))
  )
  g = jax.vmap(jax.grad(f, argnums=(0, 1, 2)))(qs, ks, vs)
  for i in range(3):
    for got, want in zip(g, jax.grad(f, argnums=(0, 1, 2))(qs[i], ks[i], vs[i])):
      np.testing.assert_allclose(got[i], want, atol=1e-5)


def test_dsinks_deterministic(platform):
  q, k, v, sinks = make_inputs(12, B=3, T=32, S=32)
  f = jax.jit(jax.grad(lambda s: jnp.sum(sinkattn.dot_product_attention(q, k, v, sinks=s) ** 2)))
  a, b = f(sinks), f(sinks)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("H", [64, 128])
def test_packed_documents_grads_tile_sizes(platform, H):
  """Gradients of packed documents at the GPU kernels' tile sizes (bf16, T = S = 384; test_ops.py's
  test_packed_documents_tile_sizes): dq, dk, dv and dsinks against the fp64 backward, with a shifted key layout
  that leaves rows without keys, and dlse."""
  from test_ops import packed_ids

  q, k, v, s = make_inputs(23, B=2, T=384, S=384, N=4, K=2, H=H, dtype=jnp.bfloat16)
  extras = dict(query_segment_ids=packed_ids(2, 384), key_value_segment_ids=packed_ids(2, 384, 5))
  opts = dict(is_causal=True)
  dout = jnp.asarray(np.random.default_rng(24).standard_normal(q.shape), jnp.bfloat16)
  dlse = jnp.asarray(np.random.default_rng(25).standard_normal((2, 4, 384)), jnp.float32)
  npkw = _np_kwargs(opts, extras, 4)
  _, lse64 = numpy_ref.forward(f64(q), f64(k), f64(v), f64(s), **npkw)
  want = numpy_ref.backward(
    f64(q), f64(k), f64(v), f64(s), f64(dout), np.where(np.isfinite(lse64), f64(dlse), 0), **npkw
  )
  got = jax.jit(lambda *a: _grads("fused", *a[:4], a[4], opts, *a[5:]))(q, k, v, s, extras, dout, dlse)
  for name, g, w in zip(("dq", "dk", "dv", "dsinks"), got, want):
    assert_close(g, w, GRAD_TOL[np.dtype(jnp.bfloat16)], f"fused {name}")
