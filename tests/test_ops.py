"""Forward of sinkattn.dot_product_attention: fused and reference against the fp64 NumPy reference, for
every option; vmap, jit caching, sinks shapes and dtypes, edge rows."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numpy_ref
import sinkattn
from conftest import LSE_TOL, OUT_TOL, assert_close, bnt, f64, make_inputs

SOFTMAX = {"vanilla": 0, "off_by_one": 1, "off-by-one": 1, "learnable": 2}

# (id, shape overrides, dot_product_attention options, extra arrays). Lengths/segments are built by
# `_extras` from a tag so the ids stay readable.
CASES = [
  ("vanilla", {}, dict(softmax_type="vanilla"), None),
  ("off_by_one", {}, dict(softmax_type="off_by_one"), None),
  ("off-by-one_alias_causal", {}, dict(softmax_type="off-by-one", is_causal=True), None),
  ("learnable", {}, dict(), None),
  ("learnable_sinks_pm50", dict(sink_range=50.0), dict(), None),
  ("causal_top_left", dict(T=12, S=20), dict(is_causal=True), None),
  ("causal_bottom_right", dict(T=12, S=20), dict(is_causal=True, causal_alignment="bottom_right"), None),
  ("causal_bottom_right_T>S", dict(T=20, S=12), dict(is_causal=True, causal_alignment="bottom_right"), None),
  ("window_sym", {}, dict(local_window_size=3), None),
  ("window_gptoss", dict(T=24, S=24), dict(is_causal=True, local_window_size=(5, 0)), None),
  ("window_left_only", {}, dict(local_window_size=(4, None)), None),
  (
    "window_bottom_right",
    dict(T=8, S=20),
    dict(is_causal=True, causal_alignment="bottom_right", local_window_size=(6, 0)),
    None,
  ),
  ("lengths", dict(B=3), dict(is_causal=True), "lengths"),
  ("lengths_zero_and_empty_batch", dict(B=3), dict(), "lengths0"),
  ("lengths_vanilla_empty", dict(B=3), dict(softmax_type="vanilla"), "lengths0"),
  ("lengths_bottom_right", dict(B=3, T=10, S=18), dict(is_causal=True, causal_alignment="bottom_right"), "lengths"),
  ("segments", dict(T=20, S=20), dict(), "segments"),
  ("segments_causal_lengths", dict(T=20, S=20), dict(is_causal=True), "both"),
  ("gqa_8_1", dict(N=8, K=1), dict(is_causal=True), None),
  ("mha_4_4", dict(N=4, K=4), dict(), None),
  ("hv_ne_h", dict(H=16, Hv=8), dict(), None),
  ("head_dim_64_scale", dict(H=64, Hv=32, T=9, S=33), dict(scale=0.3), None),
]


def _extras(tag, B, T, S, seed=0):
  rng = np.random.default_rng(seed + 7)
  out = {}
  if tag in ("lengths", "both"):
    out["query_seq_lengths"] = jnp.asarray(rng.integers(1, T + 1, B), jnp.int32)
    out["key_value_seq_lengths"] = jnp.asarray(rng.integers(1, S + 1, B), jnp.int32)
  if tag == "lengths0":  # a zero query length, a zero key length (whole batch empty) and an over-long one
    out["query_seq_lengths"] = jnp.asarray([0, T, T // 2][:B], jnp.int32)
    out["key_value_seq_lengths"] = jnp.asarray([S, 0, S + 5][:B], jnp.int32)
  if tag in ("segments", "both"):
    cut_q = np.sort(rng.integers(0, T, (B, 2)), axis=1)
    cut_k = np.sort(rng.integers(0, S, (B, 2)), axis=1)
    out["query_segment_ids"] = jnp.asarray(
      (np.arange(T)[None] >= cut_q[:, :1]) + (np.arange(T)[None] >= cut_q[:, 1:]), jnp.int32
    )
    out["key_value_segment_ids"] = jnp.asarray(
      (np.arange(S)[None] >= cut_k[:, :1]) + (np.arange(S)[None] >= cut_k[:, 1:]), jnp.int32
    )
  return out


def _np_kwargs(opts, extras, N):
  """dot_product_attention options -> numpy_ref keywords."""
  st = opts.get("softmax_type") or "learnable"
  w = opts.get("local_window_size")
  w = (-1, -1) if w is None else (w, w) if isinstance(w, int) else tuple(-1 if x is None else x for x in w)
  causal = 0 if not opts.get("is_causal") else 2 if opts.get("causal_alignment") == "bottom_right" else 1
  kw = dict(softmax=SOFTMAX[st], causal=causal, window=w, scale=opts.get("scale"))
  names = dict(
    query_seq_lengths="q_lens",
    key_value_seq_lengths="kv_lens",
    query_segment_ids="q_seg",
    key_value_segment_ids="kv_seg",
  )
  kw.update({names[k]: np.asarray(v) for k, v in extras.items()})
  return kw


def run_case(case, dtype, seed=0):
  _, shape, opts, tag = case
  shape = dict(shape)
  sink_range = shape.pop("sink_range", 10.0)
  q, k, v, sinks = make_inputs(seed, dtype=dtype, sink_range=sink_range, **shape)
  B, T, N = q.shape[:3]
  extras = _extras(tag, B, T, k.shape[1], seed)
  learn = (opts.get("softmax_type") or "learnable") == "learnable"
  s = sinks if learn else None
  want_out, want_lse = numpy_ref.forward(f64(q), f64(k), f64(v), f64(s), **_np_kwargs(opts, extras, N))
  res = {}
  for impl in ("fused", "reference"):
    out, lse = jax.jit(
      lambda q, k, v, s, ex, impl=impl: sinkattn.dot_product_attention(
        q, k, v, sinks=s, return_residual=True, implementation=impl, **opts, **ex
      )
    )(q, k, v, s, extras)
    res[impl] = out, bnt(lse)
  return res, want_out, want_lse


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_f32(platform, case):
  res, want_out, want_lse = run_case(case, jnp.float32)
  for impl, (out, lse) in res.items():
    assert out.dtype == jnp.float32 and lse.dtype == jnp.float32
    assert_close(out, want_out, OUT_TOL[np.dtype(np.float32)], f"{impl} out")
    assert_close(lse, want_lse, LSE_TOL[np.dtype(np.float32)], f"{impl} lse")


LOW = [
  c
  for c in CASES
  if c[0]
  in (
    "learnable",
    "causal_bottom_right",
    "window_gptoss",
    "lengths_zero_and_empty_batch",
    "segments_causal_lengths",
    "gqa_8_1",
    "hv_ne_h",
    "learnable_sinks_pm50",
  )
]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("case", LOW, ids=[c[0] for c in LOW])
def test_forward_low_precision(platform, case, dtype):
  res, want_out, want_lse = run_case(case, dtype)
  for impl, (out, lse) in res.items():
    assert out.dtype == dtype
    assert_close(out, want_out, OUT_TOL[np.dtype(dtype)], f"{impl} out")
    assert_close(lse, want_lse, LSE_TOL[np.dtype(dtype)], f"{impl} lse")


def test_sink_changes_output(platform):
  """The tests can see a wrong sink: U(-10,10) sinks move the output far beyond the f32 tolerance."""
  q, k, v, sinks = make_inputs(1)
  a = sinkattn.dot_product_attention(q, k, v, sinks=sinks)
  b = sinkattn.dot_product_attention(q, k, v, sinks=sinks + 1.0)
  c = sinkattn.dot_product_attention(q, k, v, softmax_type="vanilla")
  assert float(jnp.max(jnp.abs(a - b))) > 1e-2 and float(jnp.max(jnp.abs(a - c))) > 1e-2


@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_empty_rows_and_huge_sinks(platform, impl):
  q, k, v, sinks = make_inputs(2, B=2, T=6, S=6, N=4, K=2)
  sinks = jnp.asarray([100.0, -100.0, 50.0, -50.0], jnp.float32)
  ql = jnp.asarray([3, 4], jnp.int32)
  kl = jnp.asarray([0, 6], jnp.int32)  # batch 0: every row empty
  for st, s in (("vanilla", None), ("off_by_one", None), ("learnable", sinks)):
    out, lse = sinkattn.dot_product_attention(
      q,
      k,
      v,
      sinks=s,
      softmax_type=st,
      query_seq_lengths=ql,
      key_value_seq_lengths=kl,
      return_residual=True,
      implementation=impl,
    )
    lse = bnt(lse)
    assert not np.any(np.isnan(np.asarray(out))) and not np.any(np.isnan(np.asarray(lse)))
    assert np.all(np.asarray(out[0]) == 0.0) and np.all(np.asarray(out[1, 4:]) == 0.0)
    want = {"vanilla": -np.inf, "off_by_one": 0.0}.get(st)
    want = np.broadcast_to(np.asarray(sinks)[:, None] if want is None else want, (4, 6))
    np.testing.assert_array_equal(np.asarray(lse[0]), want)
    np.testing.assert_array_equal(np.asarray(lse[1, :, 4:]), want[:, 4:])
    assert np.all(np.isfinite(np.asarray(lse[1, :, :4])))


@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_no_keys_at_all(platform, impl):
  """S = 0: every row is empty (out 0, lse = sink), in the forward and in the gradients."""
  q, _, _, sinks = make_inputs(4, B=2, T=3, S=1, N=4, K=2)
  k, v = jnp.zeros((2, 0, 2, q.shape[3]), q.dtype), jnp.zeros((2, 0, 2, 8), q.dtype)
  out, lse = sinkattn.dot_product_attention(q, k, v, sinks=sinks, return_residual=True, implementation=impl)
  assert out.shape == (2, 3, 4, 8) and np.all(np.asarray(out) == 0.0)
  np.testing.assert_array_equal(np.asarray(bnt(lse)), np.broadcast_to(np.asarray(sinks)[None, :, None], (2, 4, 3)))
  loss = lambda q, s: jnp.sum(
    sinkattn.dot_product_attention(q, k, v, sinks=s, return_residual=True, implementation=impl)[1]
  )
  dq, ds = jax.grad(loss, argnums=(0, 1))(q, sinks)
  np.testing.assert_array_equal(np.asarray(dq), 0.0)
  np.testing.assert_allclose(np.asarray(ds), 6.0)  # d lse / d a_n = exp(a_n - lse) = 1, over B*T rows


def test_sinks_shapes_and_dtypes(platform):
  q, k, v, sinks = make_inputs(3)
  base = sinkattn.dot_product_attention(q, k, v, sinks=sinks)
  out4 = sinkattn.dot_product_attention(q, k, v, sinks=sinks.reshape(1, -1, 1, 1))
  np.testing.assert_array_equal(np.asarray(base), np.asarray(out4))
  sb = sinks.astype(jnp.bfloat16)
  for impl in ("fused", "reference"):
    g = jax.grad(lambda s: jnp.sum(sinkattn.dot_product_attention(q, k, v, sinks=s, implementation=impl) ** 2))(
      sb.reshape(1, -1, 1, 1)
    )
    assert g.dtype == jnp.bfloat16 and g.shape == (1, 4, 1, 1)
    assert float(jnp.max(jnp.abs(g.astype(jnp.float32)))) > 0


def _loop(fn, *xs):
  return jnp.stack([fn(*[x[i] for x in xs]) for i in range(xs[0].shape[0])])


@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_vmap(platform, impl):
  q, k, v, sinks = make_inputs(4, B=2, T=8, S=8)
  qs = jnp.stack([q, 0.5 * q, -q])
  ks = jnp.stack([k, k[::-1], 2 * k])
  ss = jnp.stack([sinks, -sinks, sinks + 3])
  lens = jnp.asarray([[3, 8], [8, 0], [1, 5]], jnp.int32)
  f = lambda q, k, s, l: sinkattn.dot_product_attention(
    q, k, v, sinks=s, is_causal=True, key_value_seq_lengths=l, implementation=impl
  )
  # fold path (everything batched but sinks) and loop path (batched sinks, unbatched k)
  got = jax.vmap(f, in_axes=(0, 0, None, 0))(qs, ks, sinks, lens)
  np.testing.assert_allclose(got, _loop(lambda q, k, l: f(q, k, sinks, l), qs, ks, lens), atol=1e-6)
  got = jax.vmap(f, in_axes=(0, None, 0, None))(qs, k, ss, lens[0])
  np.testing.assert_allclose(got, _loop(lambda q, s: f(q, k, s, lens[0]), qs, ss), atol=1e-6)
  # every input batched, sinks shared: the handler folds the vmap dim into the batch
  vs = jnp.stack([v, -v, v[::-1]])
  g = lambda q, k, v, l: sinkattn.dot_product_attention(q, k, v, sinks=sinks, query_seq_lengths=l, implementation=impl)
  np.testing.assert_allclose(jax.vmap(g)(qs, ks, vs, lens), _loop(g, qs, ks, vs, lens), atol=1e-6)
  # two extra dims
  q2 = jnp.stack([qs, qs[::-1]])
  got = jax.vmap(jax.vmap(lambda q: f(q, k, sinks, lens[0])))(q2)
  assert got.shape == (2, 3) + q.shape
  np.testing.assert_allclose(got[1, 0], f(qs[2], k, sinks, lens[0]), atol=1e-6)


def test_jit_caches(platform):
  traces = []

  @jax.jit
  def f(q, k, v, s):
    traces.append(1)
    return sinkattn.dot_product_attention(q, k, v, sinks=s, is_causal=True)

  q, k, v, sinks = make_inputs(5)
  a = f(q, k, v, sinks)
  b = f(q + 1, k, v, sinks * 2)
  assert len(traces) == 1 and a.shape == b.shape


def test_env_selects_reference(platform, monkeypatch):
  q, k, v, sinks = make_inputs(6)
  monkeypatch.setenv("SINKATTN_IMPLEMENTATION", "reference")
  jaxpr = str(jax.make_jaxpr(lambda q: sinkattn.dot_product_attention(q, k, v, sinks=sinks))(q))
  assert "ffi_call" not in jaxpr and "custom_vjp" not in jaxpr
  monkeypatch.delenv("SINKATTN_IMPLEMENTATION")
  jaxpr = str(jax.make_jaxpr(lambda q: sinkattn.dot_product_attention(q, k, v, sinks=sinks))(q))
  assert "custom_vjp" in jaxpr


def test_primitives_signature(platform):
  """The internal primitives other modules build on: q/k/v BTNH, sinks fp32 [N], lse [B,N,T]."""
  from sinkattn import primitives
  from sinkattn._inputs import Inputs

  # The raw FFI calls have no fallback: the CUDA kernels take 16-bit inputs only.
  dtype = jnp.float32 if platform == "cpu" else jnp.bfloat16
  q, k, v, sinks = make_inputs(7, T=8, S=8, dtype=dtype)
  kw = dict(softmax=2, causal=1, window_left=-1, window_right=-1, diag_offset=4, scale=0.25)
  out, lse = primitives.attn_fwd(Inputs(q, k, v, sinks), **kw)
  want_out, want_lse = numpy_ref.forward(
    f64(q), f64(k), f64(v), f64(sinks), softmax=2, causal=1, scale=0.25, diag_offset=4
  )
  assert_close(out, want_out, OUT_TOL[np.dtype(dtype)], "out")
  assert_close(lse, want_lse, LSE_TOL[np.dtype(dtype)], "lse")
  dout = jnp.ones_like(out)
  dq, dk, dv, ds, db = primitives.attn_bwd(Inputs(q, k, v, sinks), out, lse, dout, None, **kw)
  assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape and ds.shape == (4,) and db is None
  kw["softmax"] = 0
  out, lse = primitives.attn_fwd(Inputs(q, k, v), **kw)
  ds = primitives.attn_bwd(Inputs(q, k, v), out, lse, dout, None, **kw).dsinks
  np.testing.assert_array_equal(np.asarray(ds), np.zeros(4))


def test_no_warning_on_cpu(platform):
  if platform != "cpu":
    pytest.skip("CPU only")
  q, k, v, sinks = make_inputs(8)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    sinkattn.dot_product_attention(q, k, v, sinks=sinks)


def packed_ids(B, L, shift=0):
  """Packed documents, one layout per batch row, boundaries off the 128-row / 128-key grid of the GPU tiles (row b:
  documents of 100, 200 and L - 300 tokens, then 37, 250 and the rest, ...); shift moves every boundary right by
  that many tokens (key ids against query ids: rows near a boundary then have no key of their document)."""
  layouts = [(100, 200), (37, 250), (129, 127)]
  ids = np.zeros((B, L), np.int32)
  for b in range(B):
    for cut in np.cumsum(layouts[b % len(layouts)]):
      ids[b, min(L, cut + shift) :] += 1
  return jnp.asarray(ids)


@pytest.mark.parametrize("H", [64, 128])
@pytest.mark.parametrize("shift", [0, 5], ids=["self", "shifted_kv"])
def test_packed_documents_tile_sizes(platform, H, shift):
  """Segment ids at the sizes the GPU kernels tile (bf16, T = S = 384, H 64 / 128, causal, GQA 2): on an H200 the
  Hopper forward's kind-4 kernels (hopper/fwd.cu) take them and skip the key tiles of other documents; a shifted
  key layout leaves rows without any key of their document (out 0, lse = sink)."""
  q, k, v, sinks = make_inputs(21, B=2, T=384, S=384, N=4, K=2, H=H, dtype=jnp.bfloat16)
  ex = dict(query_segment_ids=packed_ids(2, 384), key_value_segment_ids=packed_ids(2, 384, shift))
  opts = dict(is_causal=True)
  want_out, want_lse = numpy_ref.forward(f64(q), f64(k), f64(v), f64(sinks), **_np_kwargs(opts, ex, 4))
  out, lse = jax.jit(
    lambda q, k, v, s, ex: sinkattn.dot_product_attention(q, k, v, sinks=s, return_residual=True, **opts, **ex)
  )(q, k, v, sinks, ex)
  lse = bnt(lse)
  assert_close(out, want_out, OUT_TOL[np.dtype(jnp.bfloat16)], "out")
  assert_close(lse, want_lse, LSE_TOL[np.dtype(jnp.bfloat16)], "lse")
  if shift:  # the rows that see no key: exactly 0 out and the sink as lse
    empty = ~numpy_ref.mask(
      2, 384, 384, q_seg=np.asarray(ex["query_segment_ids"]), kv_seg=np.asarray(ex["key_value_segment_ids"]), causal=1
    ).any(-1)  # [B, T]
    assert empty.any()
    assert np.all(np.asarray(out, np.float32)[empty] == 0)
    assert np.all(np.asarray(lse).transpose(0, 2, 1)[empty] == np.asarray(sinks))


def test_xla_is_the_reference(platform):
  """jax.nn's implementation name 'xla' runs the pure jnp twin (no FFI call), bitwise equal to 'reference'."""
  q, k, v, sinks = make_inputs(30)
  f = lambda impl: lambda q: sinkattn.dot_product_attention(q, k, v, sinks=sinks, is_causal=True, implementation=impl)
  assert "ffi_call" not in str(jax.make_jaxpr(f("xla"))(q))
  np.testing.assert_array_equal(np.asarray(f("xla")(q)), np.asarray(f("reference")(q)))


def test_last_plan_names_the_kernel(platform):
  """sinkattn.last_plan: the plan of the last fused call of each kind, '' for a library without the plan API."""
  from sinkattn import _lib

  q, k, v, sinks = make_inputs(31, dtype=jnp.bfloat16)
  jax.block_until_ready(jax.grad(lambda q: jnp.sum(sinkattn.dot_product_attention(q, k, v, sinks=sinks)))(q))
  fwd, bwd = sinkattn.last_plan("fwd"), sinkattn.last_plan("bwd")
  if getattr(_lib.load(), "sa_plan_last_any", None) is None:
    assert fwd == bwd == ""
  else:
    backend = "cuda" if platform == "gpu" else "cpu"
    assert fwd.split()[0].startswith((f"{backend}.fwd", "ref.fwd", "hopper.fwd")), fwd
    assert bwd.split()[0].startswith((f"{backend}.bwd", "ref.bwd", "hopper.bwd")), bwd
  with pytest.raises(ValueError, match="kind"):
    sinkattn.last_plan("forward")
