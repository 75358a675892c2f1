"""bias, mask and positions in dot_product_attention: against jax.nn.dot_product_attention(implementation='xla')
for every broadcast form (vanilla softmax: jax.nn has no sink), against the fp64 NumPy reference with learnable
sinks, causal / window / lengths / segments combined, GQA, T != S, f32 and bf16, outputs and gradients (dbias
included). Each test runs the jnp twin and, when the loaded library takes the bias / mask / positions buffers,
the fused kernel, on the CPU; on a GPU such calls run the reference, with one warning (the last test)."""

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numpy_ref
import sinkattn
from conftest import GRAD_TOL, LSE_TOL, OUT_TOL, _gpu_devices, assert_close, bnt, f64, make_inputs
from sinkattn import _lib, _routing

pytestmark = pytest.mark.usefixtures("on_cpu")

HAVE_LIB = _lib.available()
IMPLS = [
  "reference",
  pytest.param(
    "fused",
    marks=pytest.mark.skipif(
      not HAVE_LIB,
      reason="libsinkattn_jax.so is not built: only the jnp twin runs",
    ),
  ),
]
B, T, S, N, K, H = 2, 8, 12, 4, 2, 16  # GQA 2, T != S


def _attn(impl, **kw):
  return lambda q, k, v, s, b, m: sinkattn.dot_product_attention(
    q, k, v, sinks=s, bias=b, mask=m, implementation=impl, return_residual=True, **kw
  )


def _jax_nn(**kw):
  return lambda q, k, v, s, b, m: (jax.nn.dot_product_attention(q, k, v, b, m, implementation="xla", **kw), None)


def _out_and_grads(fn, q, k, v, s, b, m, dout):
  """out and the VJP (dq, dk, dv, dbias) for cotangent dout on out."""
  out, vjp = jax.vjp(lambda q, k, v, b: fn(q, k, v, s, b, m)[0], q, k, v, b)
  return out, vjp(dout)


def _rows_with_keys(valid):
  """[B,T,N,1] bool: rows that see at least one key (jax.nn gives an empty row the mean of the values)."""
  return np.asarray(valid).any(-1).transpose(0, 2, 1)[..., None]


def _valid(B_, T_, S_, N_, mask=None, **np_kw):
  return numpy_ref._valid(
    B_,
    T_,
    S_,
    N_,
    np_kw.get("q_lens"),
    np_kw.get("kv_lens"),
    None,
    None,
    np_kw.get("causal", 0),
    np_kw.get("window", (-1, -1)),
    0,
    None,
    None,
    mask,
  )


def _forms(full):
  """Every shape with each of the 4 dims either 1 or full."""
  return [tuple(f if keep else 1 for keep, f in zip(bits, full)) for bits in itertools.product((1, 0), repeat=4)]


@pytest.mark.parametrize("impl", IMPLS)
def test_bias_every_broadcast_form_vs_jax_nn(impl):
  """The 16 bias shapes, causal: out and dbias equal jax.nn's (dbias reduced to bias's shape; dq, dk, dv with
  a bias: test_combined_vs_jax_nn_and_fp64). All forms in one jit: one compilation instead of 16."""
  q, k, v, _ = make_inputs(0, B=B, T=T, S=S, N=N, K=K, H=H)
  rng = np.random.default_rng(1)
  dout = jnp.asarray(rng.standard_normal((B, T, N, H)), jnp.float32)
  shapes = _forms((B, N, T, S))
  biases = [jnp.asarray(2.0 * rng.standard_normal(shape), jnp.float32) for shape in shapes]

  def every_form(fn):
    def one(b):
      out, vjp = jax.vjp(lambda b: fn(q, k, v, None, b, None)[0], b)
      return out, vjp(dout)[0]

    return jax.jit(lambda bs: [one(b) for b in bs])(biases)

  got, want = every_form(_attn(impl, is_causal=True)), every_form(_jax_nn(is_causal=True))
  for shape, (go, gb), (wo, wb) in zip(shapes, got, want):
    assert gb.shape == shape and gb.dtype == jnp.float32
    assert_close(go, f64(wo), OUT_TOL[np.dtype(np.float32)], f"{impl} out bias {shape}")
    assert_close(gb, f64(wb), GRAD_TOL[np.dtype(np.float32)], f"{impl} dbias {shape}")


MASK_FORMS = [(B, N, T, S), (B, 1, T, S), (1, 1, T, S), (B, 1, 1, S), (1, N, 1, S), (1, 1, T, 1)]


@pytest.mark.parametrize("impl", IMPLS)
def test_mask_forms_and_dtypes_vs_jax_nn(impl):
  """Masks of several broadcast forms, bool and numeric (nonzero = attend, as Flax builds them), with a window
  and lengths: equal to jax.nn's bool mask on every row that sees a key; rows that see none give 0."""
  q, k, v, _ = make_inputs(2, B=B, T=T, S=S, N=N, K=K, H=H)
  rng = np.random.default_rng(3)
  lens = dict(query_seq_lengths=jnp.asarray([T, 6], jnp.int32), key_value_seq_lengths=jnp.asarray([S, 9], jnp.int32))
  kw = dict(local_window_size=(6, 3), **lens)
  dtypes = list(zip(MASK_FORMS, itertools.cycle((jnp.bool_, jnp.float32, jnp.int32))))
  keeps = [rng.random(shape) < 0.7 for shape, _ in dtypes]
  masks = [jnp.asarray(keep * rng.integers(1, 5, keep.shape), dt) for keep, (_, dt) in zip(keeps, dtypes)]  # nonzero
  every = lambda fn, ms: jax.jit(lambda q, k, v, ms: [fn(q, k, v, None, None, m)[0] for m in ms])(q, k, v, ms)
  got_all, want_all = every(_attn(impl, **kw), masks), every(_jax_nn(**kw), [jnp.asarray(m) for m in keeps])
  np_lens = dict(q_lens=np.asarray(lens["query_seq_lengths"]), kv_lens=np.asarray(lens["key_value_seq_lengths"]))
  for (shape, dtype), keep, got, want in zip(dtypes, keeps, got_all, want_all):
    seen = _rows_with_keys(_valid(B, T, S, N, keep, window=(6, 3), **np_lens))
    what = f"{impl} out mask {shape} {jnp.dtype(dtype).name}"
    assert_close(np.where(seen, f64(got), 0), np.where(seen, f64(want), 0), OUT_TOL[np.dtype(np.float32)], what)
    assert np.all(np.asarray(got)[~np.broadcast_to(seen, got.shape)] == 0), "a row without keys must give 0"


COMBINED = [  # id, shape overrides, options, bias shape, mask shape
  ("causal_lengths", {}, dict(is_causal=True, lengths=True), (B, N, T, S), (B, 1, 1, S)),
  ("window_gqa4", dict(N=8, K=2), dict(local_window_size=(3, 1)), (1, 8, T, S), (1, 1, T, S)),
  ("causal_window_mqa", dict(N=4, K=1), dict(is_causal=True, local_window_size=(4, 0)), (B, 1, T, S), (B, 4, T, S)),
]


@pytest.mark.parametrize(
  "case,dtype",
  [(c, jnp.float32) for c in COMBINED] + [(COMBINED[1], jnp.bfloat16)],
  ids=[c[0] + "-f32" for c in COMBINED] + [COMBINED[1][0] + "-bf16"],
)
@pytest.mark.parametrize("impl", IMPLS)
def test_combined_vs_jax_nn_and_fp64(impl, case, dtype):
  """bias and mask with causal / window / lengths, GQA and MQA, T != S: against the fp64 reference (outputs and
  gradients, dbias included, in the dtype's tolerance) and against jax.nn on the rows that see a key."""
  _, shape, opts, bias_shape, mask_shape = case
  opts = dict(opts)
  n = shape.get("N", N)
  q, k, v, _ = make_inputs(4, B=B, T=T, S=S, H=H, dtype=dtype, **{"N": N, "K": K, **shape})
  rng = np.random.default_rng(5)
  bias = jnp.asarray(rng.standard_normal(bias_shape), dtype)
  keep = rng.random(mask_shape) < 0.8
  extra = {}
  if opts.pop("lengths", False):
    extra = dict(query_seq_lengths=jnp.asarray([T, 5], jnp.int32), key_value_seq_lengths=jnp.asarray([S, 7], jnp.int32))
  kw = dict(opts, **extra)
  dout = jnp.asarray(rng.standard_normal((B, T, n, H)), dtype)
  got = jax.jit(lambda *a: _out_and_grads(_attn(impl, **kw), *a))(q, k, v, None, bias, jnp.asarray(keep), dout)
  w = opts.get("local_window_size")
  np_kw = dict(
    causal=int(opts.get("is_causal", False)),
    window=w if w else (-1, -1),
    bias=f64(bias),
    attn_mask=keep,
    **{{"query_seq_lengths": "q_lens", "key_value_seq_lengths": "kv_lens"}[a]: np.asarray(x) for a, x in extra.items()},
  )
  want = numpy_ref.backward(f64(q), f64(k), f64(v), None, f64(dout), **np_kw)
  want_out, _ = numpy_ref.forward(f64(q), f64(k), f64(v), None, **np_kw)
  tol = GRAD_TOL[np.dtype(dtype)]
  assert_close(got[0], want_out, OUT_TOL[np.dtype(dtype)], f"{impl} out")
  for name, g, ww in zip(("dq", "dk", "dv", "dbias"), got[1], want[:3] + want[4:]):
    assert g.dtype == dtype, name
    assert_close(g, ww, tol, f"{impl} {name}")
  seen = _rows_with_keys(
    _valid(
      B,
      T,
      S,
      n,
      keep,
      causal=np_kw["causal"],
      window=np_kw["window"],
      q_lens=np_kw.get("q_lens"),
      kv_lens=np_kw.get("kv_lens"),
    )
  )
  nn_out = jax.jit(_jax_nn(**kw))(q, k, v, None, bias, jnp.asarray(keep))[0]
  assert_close(
    np.where(seen, f64(got[0]), 0),
    np.where(seen, f64(nn_out), 0),
    2 * OUT_TOL[np.dtype(dtype)],
    f"{impl} out vs jax.nn",
  )


def _packed(lengths, L):
  """Segment ids 1, 2, ... and positions restarting at 0 in each document (0 past the last one)."""
  ids, pos = np.zeros(L, np.int32), np.zeros(L, np.int32)
  start = 0
  for d, n in enumerate(lengths):
    ids[start : start + n], pos[start : start + n] = d + 1, np.arange(n)
    start += n
  return ids, pos


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("impl", IMPLS)
def test_learnable_sinks_everything_vs_fp64(impl, dtype):
  """Learnable sinks from U(-10, 10) and +-50 with a bias, a mask, packed documents whose causal window is
  measured in positions (Transformer Engine's segment_pos: the query and key documents differ in length), and
  lengths: out, lse, dq, dk, dv, dsinks and dbias against the fp64 reference."""
  q, k, v, sinks = make_inputs(6, B=B, T=T, S=S, N=N, K=K, H=H, dtype=dtype)
  sinks = sinks.at[0].set(50.0).at[1].set(-50.0)
  rng = np.random.default_rng(7)
  q_ids, q_pos = zip(*[_packed(n, T) for n in ((3, 5), (8,))])
  kv_ids, kv_pos = zip(*[_packed(n, S) for n in ((5, 7), (10,))])
  arr = lambda x: jnp.asarray(np.stack(x))  # noqa: E731
  extra = dict(
    query_segment_ids=arr(q_ids),
    key_value_segment_ids=arr(kv_ids),
    query_positions=arr(q_pos),
    key_value_positions=arr(kv_pos),
    key_value_seq_lengths=jnp.asarray([S, 9], jnp.int32),
  )
  bias = jnp.asarray(rng.standard_normal((1, N, T, S)), jnp.float32)
  keep = rng.random((B, 1, T, S)) < 0.85
  opts = dict(is_causal=True, local_window_size=(3, 0))
  dout = jnp.asarray(rng.standard_normal((B, T, N, H)), dtype)
  dlse = jnp.asarray(rng.standard_normal((B, N, T)), jnp.float32)

  def f(q, k, v, s, b):
    return sinkattn.dot_product_attention(
      q, k, v, sinks=s, bias=b, mask=jnp.asarray(keep), return_residual=True, implementation=impl, **opts, **extra
    )

  (out, lse), vjp = jax.vjp(f, q, k, v, sinks, bias)
  np_kw = dict(
    softmax=2,
    causal=1,
    window=(3, 0),
    bias=f64(bias),
    attn_mask=keep,
    q_seg=np.stack(q_ids),
    kv_seg=np.stack(kv_ids),
    q_pos=np.stack(q_pos),
    kv_pos=np.stack(kv_pos),
    kv_lens=np.asarray([S, 9]),
  )
  want_out, want_lse = numpy_ref.forward(f64(q), f64(k), f64(v), f64(sinks), **np_kw)
  dlse = jnp.where(jnp.isfinite(want_lse), dlse, 0.0)
  grads = jax.jit(vjp)((dout, bnt(dlse)))  # numpy_ref's [B,N,T] as the public lse's [B,T,N]
  want = numpy_ref.backward(f64(q), f64(k), f64(v), f64(sinks), f64(dout), f64(dlse), **np_kw)
  assert_close(out, want_out, OUT_TOL[np.dtype(dtype)], f"{impl} out")
  assert_close(bnt(lse), want_lse, LSE_TOL[np.dtype(dtype)], f"{impl} lse")
  for name, g, w in zip(("dq", "dk", "dv", "dsinks", "dbias"), grads, want):
    assert_close(g, w, GRAD_TOL[np.dtype(dtype)], f"{impl} {name}")
  assert float(np.abs(want[4]).max()) > 1e-3 and float(np.abs(want[3]).max()) > 1e-3
  # the positions matter: with indices instead, other keys are in the window
  moved = numpy_ref.forward(f64(q), f64(k), f64(v), f64(sinks), **dict(np_kw, q_pos=None, kv_pos=None))[0]
  assert float(np.abs(moved - want_out).max()) > 1e-2


@pytest.mark.parametrize("impl", IMPLS)
def test_positions_equal_to_indices_change_nothing(impl):
  q, k, v, sinks = make_inputs(8, B=B, T=T, S=T, N=N, K=K, H=H)
  pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))

  def both(q, k, v, s, pos):
    return [
      (
        sinkattn.dot_product_attention(q, k, v, sinks=s, implementation=impl, **o),
        sinkattn.dot_product_attention(
          q, k, v, sinks=s, query_positions=pos, key_value_positions=pos, implementation=impl, **o
        ),
      )
      for o in (dict(is_causal=True), dict(local_window_size=(2, 3)), dict(is_causal=True, local_window_size=(4, 0)))
    ]

  for i, (want, got) in enumerate(jax.jit(both)(q, k, v, sinks, pos)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, err_msg=str(i))


@pytest.mark.parametrize("impl", IMPLS)
def test_rows_emptied_by_mask_or_bias(impl):
  """A row whose keys are all masked, or all biased by -inf, gives out 0 and lse = the sink logit (no NaN, in the
  gradients either, and zero gradients for that row)."""
  q, k, v, sinks = make_inputs(9, B=B, T=T, S=S, N=N, K=K, H=H)
  mask = jnp.ones((B, 1, T, S), bool).at[0, 0, 2].set(False)
  bias = jnp.zeros((1, N, T, S), jnp.float32).at[0, 1, 5].set(-jnp.inf)

  def f(q, s, b):
    return sinkattn.dot_product_attention(
      q, k, v, sinks=s, bias=b, mask=mask, return_residual=True, implementation=impl
    )

  out, lse = jax.jit(f)(q, sinks, bias)
  out, lse = np.asarray(out), np.asarray(bnt(lse))
  assert np.all(out[0, 2] == 0) and np.all(lse[0, :, 2] == np.asarray(sinks))
  assert np.all(out[:, 5, 1] == 0) and np.all(lse[:, 1, 5] == np.asarray(sinks)[1])
  grads = jax.jit(jax.grad(lambda q, s, b: jnp.sum(f(q, s, b)[0] ** 2) + jnp.sum(f(q, s, b)[1]), argnums=(0, 1, 2)))(
    q, sinks, bias
  )
  for g in grads:
    assert not np.any(np.isnan(np.asarray(g)))
  assert np.all(np.asarray(grads[0])[0, 2] == 0) and np.all(np.asarray(grads[2])[0, 1, 5] == 0)


@pytest.mark.parametrize("impl", IMPLS)
def test_bias_dtypes_and_vmap(impl):
  """A bf16 / f16 bias gets its gradient in its dtype; vmap over q with a shared bias, and vmap(grad) with a
  per-example dbias, equal a Python loop."""
  q, k, v, sinks = make_inputs(10, B=B, T=T, S=S, N=N, K=K, H=H)
  grad = jax.jit(
    jax.grad(lambda b: jnp.sum(sinkattn.dot_product_attention(q, k, v, sinks=sinks, bias=b, implementation=impl)))
  )
  for dt in (jnp.bfloat16, jnp.float16):
    bias = jnp.asarray(np.random.default_rng(11).standard_normal((B, 1, T, S)), dt)
    g = grad(bias)
    assert g.dtype == dt and g.shape == bias.shape
  bias = jnp.asarray(np.random.default_rng(12).standard_normal((1, N, T, S)), jnp.float32)
  qs = jnp.stack([q, -q, 0.5 * q])
  f = lambda q, b: sinkattn.dot_product_attention(
    q,
    k,
    v,
    sinks=sinks,
    bias=b,
    is_causal=True,  # noqa: E731
    implementation=impl,
  )
  loss = lambda q, b: jnp.sum(f(q, b) ** 2)  # noqa: E731
  vmapped = jax.jit(
    lambda qs, b: (jax.vmap(f, (0, None))(qs, b), jax.vmap(jax.grad(loss, argnums=1), (0, None))(qs, b))
  )
  looped = jax.jit(lambda qs, b: (jnp.stack([f(x, b) for x in qs]), jnp.stack([jax.grad(loss, 1)(x, b) for x in qs])))
  for got, want in zip(vmapped(qs, bias), looped(qs, bias)):
    np.testing.assert_allclose(got, want, atol=1e-5)


def _bwd_calls(fn, *args):
  """The sinkattn backward custom calls in the lowered module of jit(fn)."""
  return [line for line in jax.jit(fn).lower(*args).as_text().splitlines() if "@sinkattn_bwd" in line]


@pytest.mark.skipif(not HAVE_LIB, reason="libsinkattn_jax.so is not built")
def test_dbias_only_when_the_bias_is_differentiated():
  """The backward asks the kernel for dbias only when the bias is perturbed: a constant bias (or one from
  undifferentiated values) costs no dbias."""
  q, k, v, sinks = make_inputs(13, B=B, T=T, S=S, N=N, K=K, H=H)
  bias = jnp.ones((1, N, T, S), jnp.float32)
  f = lambda q, b: jnp.sum(sinkattn.dot_product_attention(q, k, v, sinks=sinks, bias=b, implementation="fused"))
  wrt_q, wrt_b = _bwd_calls(jax.grad(f), q, bias), _bwd_calls(jax.grad(f, argnums=1), q, bias)
  assert wrt_q and all("has_dbias = false" in line for line in wrt_q), wrt_q
  assert wrt_b and all("has_dbias = true" in line for line in wrt_b), wrt_b


@pytest.mark.parametrize("impl", IMPLS)
def test_numeric_masks_read_nonzero_as_attend(impl):
  """A float mask attends where it is nonzero, NaN included (as jnp.where reads it, and Flax with it)."""
  q, k, v, sinks = make_inputs(14, B=B, T=T, S=S, N=N, K=K, H=H)
  keep = jnp.asarray(np.random.default_rng(15).random((B, 1, T, S)) < 0.6).at[..., 0].set(True)
  f = jax.jit(lambda m: sinkattn.dot_product_attention(q, k, v, sinks=sinks, mask=m, implementation=impl))
  want = f(keep)
  for numeric in (jnp.where(keep, jnp.nan, 0.0), jnp.where(keep, -2.5, 0.0), keep.astype(jnp.int8)):
    np.testing.assert_array_equal(np.asarray(f(numeric)), np.asarray(want))


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_devices(), reason="no GPU visible to jax")
def test_gpu_runs_bias_mask_positions_on_the_reference(monkeypatch):
  """The CUDA kernels take no bias / mask / positions yet: on a GPU such a call runs the reference (the same
  numbers as on the CPU), with one warning naming the argument (the library's words: 'positions' for
  query_positions / key_value_positions); implementation='cudnn' refuses it."""
  monkeypatch.setattr(_routing, "_warned", set())
  q, k, v, sinks = make_inputs(16, B=B, T=T, S=S, N=N, K=K, H=64, dtype=jnp.bfloat16)
  bias = jnp.asarray(np.random.default_rng(17).standard_normal((1, N, T, S)), jnp.float32)
  pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  calls = dict(
    bias=dict(bias=bias),
    mask=dict(mask=bias > 0),
    positions=dict(
      query_positions=pos, key_value_positions=jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S)), is_causal=True
    ),
  )
  cpu = jax.devices("cpu")[0]
  for name, kw in calls.items():
    with warnings.catch_warnings(record=True) as seen:
      warnings.simplefilter("always")
      with jax.default_device(jax.devices("gpu")[0]):
        got = [sinkattn.dot_product_attention(q, k, v, sinks=sinks, **kw) for _ in range(2)]
    named = [w for w in seen if issubclass(w.category, RuntimeWarning) and name in str(w.message)]
    assert len(named) == 1, [str(w.message) for w in seen]
    on_cpu = {n: jax.device_put(x, cpu) if hasattr(x, "shape") else x for n, x in kw.items()}  # is_causal stays a bool
    q_c, k_c, v_c, s_c = jax.device_put((q, k, v, sinks), cpu)
    want = sinkattn.dot_product_attention(q_c, k_c, v_c, sinks=s_c, **on_cpu)
    for g in got:
      assert_close(g, f64(want), OUT_TOL[np.dtype(jnp.bfloat16)], f"{name} on GPU")
    with jax.default_device(jax.devices("gpu")[0]), pytest.raises(ValueError, match=name):
      sinkattn.dot_product_attention(q, k, v, sinks=sinks, implementation="cudnn", **kw)
