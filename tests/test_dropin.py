"""The drop-in contract: jax.nn.dot_product_attention replaced by sinkattn.dot_product_attention changes no number
of a call jax.nn accepts, or raises naming what sinkattn refuses; the documented differences (rows without a key,
the residual's dtype and gradient) show as documented. One test per row of the table that motivated the contract
(a per-head bias taken as sinks, bias / mask by position, the residual's layout, a bogus precision; NaN in masked
keys: test_masked.py), then every jax.nn keyword, jax.nn's ranks, and the signature itself."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sinkattn
from conftest import OUT_TOL, assert_close, f64, make_inputs
from sinkattn import _lib

pytestmark = pytest.mark.usefixtures("on_cpu")  # jax.nn's float32 products run in TF32 on a GPU

IMPLS = [
  "reference",
  pytest.param("fused", marks=pytest.mark.skipif(not _lib.available(), reason="libsinkattn_jax.so is not built")),
]
B, T, S, N, K, H = 2, 8, 12, 4, 2, 16
TOL = OUT_TOL[np.dtype(np.float32)]
Q, KEY, V, SINKS = make_inputs(40, B=B, T=T, S=S, N=N, K=K, H=H)
RNG = np.random.default_rng(41)
BIAS = jnp.asarray(RNG.standard_normal((B, N, T, S)), jnp.float32)
MASK = jnp.asarray(RNG.random((B, 1, T, S)) < 0.7).at[..., 0].set(True)  # every row sees key 0


def _same(got, want, what, rows=None):
  """got equals jax.nn's want (on `rows`, [B,T] bool, when given: the rows that see a key)."""
  got, want = f64(got), f64(want)
  if rows is not None:
    keep = rows.reshape(rows.shape + (1,) * (got.ndim - rows.ndim))
    got, want = np.where(keep, got, 0), np.where(keep, want, 0)
  assert_close(got, want, TOL, what)


# ---- the table ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_a_per_head_bias_is_a_bias_not_sinks(impl):
  """f(q, k, v, bias) with bias [1,N,1,1]: jax.nn adds it (a per-head shift of every logit: no effect); sinkattn
  once read the fourth positional argument as learnable sinks."""
  shift = jnp.asarray([[[[3.0]], [[-2.0]], [[7.0]], [[0.5]]]], jnp.float32)  # [1,N,1,1]
  got = sinkattn.dot_product_attention(Q, KEY, V, shift, implementation=impl)
  _same(got, jax.nn.dot_product_attention(Q, KEY, V, shift), "bias [1,N,1,1]")
  _same(got, sinkattn.dot_product_attention(Q, KEY, V, implementation=impl), "a shift changes nothing")


@pytest.mark.parametrize("impl", IMPLS)
def test_a_full_bias_by_position(impl):
  """f(q, k, v, bias) with bias [B,N,T,S]."""
  got = sinkattn.dot_product_attention(Q, KEY, V, BIAS, implementation=impl)
  _same(got, jax.nn.dot_product_attention(Q, KEY, V, BIAS), "bias [B,N,T,S]")


@pytest.mark.parametrize("impl", IMPLS)
def test_bias_and_mask_by_position(impl):
  """f(q, k, v, bias, mask) and f(q, k, v, None, mask): jax.nn's positional order."""
  for bias in (BIAS, None):
    got = sinkattn.dot_product_attention(Q, KEY, V, bias, MASK, implementation=impl)
    _same(got, jax.nn.dot_product_attention(Q, KEY, V, bias, MASK), f"bias {bias is not None}, mask")


@pytest.mark.parametrize("impl", IMPLS)
def test_the_residual_in_jax_nn_layout(impl):
  """return_residual=True: lse [B,T,N] as jax.nn's, the same numbers (float32 input: the same dtype too)."""
  out, lse = sinkattn.dot_product_attention(Q, KEY, V, BIAS, MASK, return_residual=True, implementation=impl)
  want_out, want_lse = jax.nn.dot_product_attention(Q, KEY, V, BIAS, MASK, return_residual=True)
  assert lse.shape == want_lse.shape == (B, T, N) and lse.dtype == want_lse.dtype
  _same(out, want_out, "out")
  _same(lse, want_lse, "lse")


@pytest.mark.parametrize("precision", ["bogus", ("foo", 3), ("highest", "fastest!"), 1.5, jnp.float32])
def test_a_precision_that_is_not_one_is_refused(precision):
  """jax.nn has no precision argument (a TypeError); Flax passes one to its einsums: sinkattn takes what
  jax.lax does (a Precision, its name, a pair) and refuses the rest instead of computing in float32 anyway."""
  with pytest.raises((TypeError, ValueError), match="precision"):
    sinkattn.dot_product_attention(Q, KEY, V, precision=precision)


def test_precisions_jax_takes_are_accepted():
  want = sinkattn.dot_product_attention(Q, KEY, V)
  for p in (
    "highest",
    "default",
    "float32",
    jax.lax.Precision.HIGH,
    ("default", "highest"),
    [jax.lax.Precision.HIGHEST] * 2,
  ):
    np.testing.assert_array_equal(np.asarray(sinkattn.dot_product_attention(Q, KEY, V, precision=p)), np.asarray(want))


# ---- every jax.nn keyword ------------------------------------------------------------------------------------

Q_LENS, KV_LENS = jnp.asarray([T, 5], jnp.int32), jnp.asarray([S, 7], jnp.int32)
KEYWORDS = {  # id: jax.nn keywords (the same call for both)
  "scale": dict(scale=0.3),
  "is_causal": dict(is_causal=True),
  "query_seq_lengths": dict(query_seq_lengths=Q_LENS),
  "key_value_seq_lengths": dict(key_value_seq_lengths=KV_LENS),
  "both_lengths_causal": dict(query_seq_lengths=Q_LENS, key_value_seq_lengths=KV_LENS, is_causal=True),
  "window_int": dict(local_window_size=2),
  "window_pair": dict(local_window_size=(3, 0)),
  "window_causal": dict(local_window_size=(2, 1), is_causal=True),
  "implementation_none": dict(implementation=None),
  "implementation_xla": dict(implementation="xla"),
  "everything": dict(scale=0.5, is_causal=True, key_value_seq_lengths=KV_LENS, local_window_size=(4, 0)),
}


def _rows_with_keys(**kw):
  """[B,T] bool: the query rows that see at least one key (the padding rows past query_seq_lengths don't)."""
  i, j = np.arange(T)[:, None], np.arange(S)[None, :]
  ok = np.broadcast_to(np.asarray(MASK)[:, 0], (B, T, S)).copy()
  if kw.get("is_causal"):
    ok &= j <= i
  w = kw.get("local_window_size")
  if w is not None:
    left, right = (w, w) if isinstance(w, int) else w
    ok &= (j >= i - left) & (j <= i + right)
  if "key_value_seq_lengths" in kw:
    ok &= j[None] < np.asarray(kw["key_value_seq_lengths"])[:, None, None]
  if "query_seq_lengths" in kw:
    ok &= i[None] < np.asarray(kw["query_seq_lengths"])[:, None, None]
  return ok.any(-1)


@pytest.mark.parametrize("name", sorted(KEYWORDS))
@pytest.mark.parametrize("impl", IMPLS)
def test_every_jax_nn_keyword(name, impl):
  """Each jax.nn keyword with jax.nn's meaning (with a bias and mask, to see them combine): out and lse equal
  jax.nn's on every row that sees a key; a row that sees none gives out 0 (jax.nn: 0 past the query lengths,
  the mean of the masked values elsewhere) and lse -inf."""
  kw = KEYWORDS[name]
  ours = dict(kw, implementation=impl) if "implementation" not in kw or impl == "reference" else kw
  out, lse = sinkattn.dot_product_attention(Q, KEY, V, BIAS, MASK, return_residual=True, **ours)
  want_out, want_lse = jax.nn.dot_product_attention(Q, KEY, V, BIAS, MASK, return_residual=True, **kw)
  rows = _rows_with_keys(**kw)
  _same(out, want_out, f"{name} out", rows)
  _same(lse, want_lse, f"{name} lse", rows)
  assert np.all(np.asarray(out)[~rows] == 0) and np.all(np.asarray(lse)[~rows] == -np.inf)


@pytest.mark.parametrize("impl", IMPLS)
def test_jax_nn_ranks(impl):
  """jax.nn takes query / key / value [T,N,H] / [S,K,H] and a bias or mask of lower rank (leading axes added):
  the same numbers, in the same shapes ([T,N,H] out, [T,N] lse)."""
  q, k, v, bias, mask = Q[0], KEY[0], V[0], BIAS[0, 0], MASK[0, 0]  # [T,N,H], [S,K,H], [T,S], [T,S]
  out, lse = sinkattn.dot_product_attention(q, k, v, bias, mask, return_residual=True, implementation=impl)
  want_out, want_lse = jax.nn.dot_product_attention(q, k, v, bias, mask, return_residual=True)
  assert out.shape == want_out.shape == (T, N, H) and lse.shape == want_lse.shape == (T, N)
  _same(out, want_out, "rank-3 out")
  _same(lse, want_lse, "rank-3 lse")
  for low in (BIAS[0], BIAS[0, 0, 0]):  # [N,T,S] and [S]
    got = sinkattn.dot_product_attention(Q, KEY, V, low, implementation=impl)
    _same(got, jax.nn.dot_product_attention(Q, KEY, V, low), f"bias of shape {low.shape}")


@pytest.mark.parametrize("impl", IMPLS)
def test_documented_differences(impl):
  """What the docstring lists: a row that sees no key gives out 0 and lse -inf (jax.nn: the mean of the values
  its mask hides, and lse -0.7 * float32 max + log S); lse is float32 for a 16-bit input (jax.nn rounds it to
  the input dtype) and has a gradient (jax.nn stops it); a negative window side is refused (jax.nn shifts the
  window off the diagonal)."""
  empty = MASK.at[0, 0, 3].set(False)
  out, lse = sinkattn.dot_product_attention(Q, KEY, V, None, empty, return_residual=True, implementation=impl)
  want_out, want_lse = jax.nn.dot_product_attention(Q, KEY, V, None, empty, return_residual=True)
  assert np.all(np.asarray(out)[0, 3] == 0) and np.all(np.asarray(lse)[0, 3] == -np.inf)
  np.testing.assert_allclose(np.asarray(want_out)[0, 3], np.asarray(jnp.mean(V[0], axis=0)).repeat(N // K, 0), 1e-5)
  assert np.all(np.asarray(want_lse)[0, 3] < -1e38)
  q16, k16, v16 = (x.astype(jnp.bfloat16) for x in (Q, KEY, V))
  _, lse16 = sinkattn.dot_product_attention(q16, k16, v16, return_residual=True, implementation=impl)
  _, want16 = jax.nn.dot_product_attention(q16, k16, v16, return_residual=True)
  assert lse16.dtype == jnp.float32 and want16.dtype == jnp.bfloat16
  assert_close(lse16.astype(jnp.bfloat16), want16, 1e-2, "lse rounded to bfloat16")
  g = jax.grad(
    lambda q: jnp.sum(sinkattn.dot_product_attention(q, KEY, V, return_residual=True, implementation=impl)[1])
  )
  assert float(jnp.abs(g(Q)).max()) > 1e-3
  g_nn = jax.grad(lambda q: jnp.sum(jax.nn.dot_product_attention(q, KEY, V, return_residual=True)[1]))
  assert float(jnp.abs(g_nn(Q)).max()) == 0.0
  for w in (-1, (-1, 2), (3, -2)):
    with pytest.raises(ValueError, match="local_window_size"):
      sinkattn.dot_product_attention(Q, KEY, V, local_window_size=w, implementation=impl)


def test_the_signature_is_jax_nn_s():
  """jax.nn's positional parameters in its order, every jax.nn keyword with its default, and sinkattn's own
  (sinks first) keyword-only."""
  ours = inspect.signature(sinkattn.dot_product_attention).parameters
  theirs = inspect.signature(jax.nn.dot_product_attention).parameters
  positional = [n for n, p in ours.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
  assert positional == [n for n, p in theirs.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
  assert positional == ["query", "key", "value", "bias", "mask"]
  for name, p in theirs.items():
    assert name in ours and ours[name].kind == p.kind and ours[name].default == p.default, name
  assert ours["sinks"].kind == inspect.Parameter.KEYWORD_ONLY
  with pytest.raises(TypeError):
    sinkattn.dot_product_attention(Q, KEY, V, None, None, SINKS)
