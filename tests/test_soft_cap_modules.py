"""logits_soft_cap in the modules: sinkattn.flax and sinkattn.nnx take it as a constructor field, one contract for
both, and pass it to the op (DotProductAttention and MultiHeadAttention, the KV-cache decode included); a bad cap
fails when the module is built; sinkattn.te has no such field (Transformer Engine's JAX module has none)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import sinkattn
import sinkattn.flax as sa_linen
import sinkattn.nnx as sa_nnx
import sinkattn.te as sa_te
from conftest import make_inputs
from sinkattn import _lib

pytestmark = pytest.mark.skipif(not _lib.available(), reason="libsinkattn_jax.so is not built")

B, T, N, K, H, D = 2, 12, 4, 2, 8, 16
Q, KEY, V, SINKS = make_inputs(70, B=B, T=T, S=T, N=N, K=K, H=H, sink_range=5.0)
OFFSET = SINKS.reshape(1, N, 1, 1)
OPTS = dict(softmax_type="learnable", is_causal=True, local_window_size=(5, 0))


def _op(cap, **kw):
  return sinkattn.dot_product_attention(Q, KEY, V, sinks=SINKS, logits_soft_cap=cap, **OPTS, **kw)


def test_dot_product_attention_modules_pass_the_cap():
  """linen and nnx DotProductAttention(logits_soft_cap=c) give the op's out and lse with that cap, bitwise, and
  the op's sink gradient for their softmax_offset; the cap changes the result."""
  linen = sa_linen.DotProductAttention(N, logits_soft_cap=2.5, **OPTS)
  mod = sa_nnx.DotProductAttention(N, logits_soft_cap=2.5, **OPTS)
  mod.softmax_offset[...] = OFFSET
  want = _op(2.5, return_residual=True)
  got_linen = linen.apply({"params": {"softmax_offset": OFFSET}}, Q, KEY, V, return_residual=True)
  got_nnx = mod(Q, KEY, V, return_residual=True)
  for a, b, c in zip(want, got_linen, got_nnx):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
  assert float(jnp.abs(_op(None) - got_nnx[0]).max()) > 1e-2
  w = jax.random.normal(jax.random.key(71), want[0].shape)
  g_nnx = nnx.grad(lambda m: jnp.sum(m(Q, KEY, V) * w))(mod)["softmax_offset"][...]
  g_linen = jax.grad(lambda o: jnp.sum(linen.apply({"params": {"softmax_offset": o}}, Q, KEY, V) * w))(OFFSET)
  g_op = jax.grad(
    lambda s: jnp.sum(sinkattn.dot_product_attention(Q, KEY, V, sinks=s, logits_soft_cap=2.5, **OPTS) * w)
  )(SINKS)
  np.testing.assert_allclose(np.asarray(g_nnx).reshape(N), np.asarray(g_op), rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(np.asarray(g_linen).reshape(N), np.asarray(g_op), rtol=1e-6, atol=1e-7)


def _mha_pair(cap, **kw):
  """nnx and linen MultiHeadAttention with the same weights: (nnx module, linen apply)."""
  args = dict(num_kv_heads=K, head_dim=H, softmax_type="learnable", use_rope=True, use_bias=False, **kw)
  mha = sa_nnx.MultiHeadAttention(N, D, rngs=nnx.Rngs(0), logits_soft_cap=cap, **args)
  mha.attention.softmax_offset[...] = OFFSET
  params = nnx.to_pure_dict(nnx.state(mha, nnx.Param))
  linen = sa_linen.MultiHeadAttention(num_heads=N, logits_soft_cap=cap, **args)
  return mha, lambda x, **c: linen.apply({"params": params}, x, **c)


def test_mha_twins_pass_the_cap():
  """The MultiHeadAttention twins with a cap give the same output, and a different one from the same weights
  without a cap: the field reaches the op in both."""
  x = jax.random.normal(jax.random.key(72), (B, T, D))
  mha, linen = _mha_pair(1.5, is_causal=True)
  got = mha(x)
  np.testing.assert_allclose(np.asarray(linen(x)), np.asarray(got), atol=1e-6)
  uncapped, _ = _mha_pair(None, is_causal=True)
  assert float(jnp.abs(uncapped(x) - got).max()) > 1e-2


def test_mha_kv_cache_decode_with_a_cap_matches_full_forward():
  """A prefill then one token per call (decode_attention over the cache for T <= DECODE_MAX_TOKENS) with a cap
  gives the full causal forward with that cap."""
  x = jax.random.normal(jax.random.key(73), (B, T, D))
  mha, _ = _mha_pair(2.0, is_causal=True, local_window_size=(3, 0))
  full = mha(x)
  mha.init_cache((B, T, D))
  step = nnx.jit(lambda m, xt: m(xt, decode=True))
  ys = [step(mha, x[:, :4])] + [step(mha, x[:, t : t + 1]) for t in range(4, T)]
  np.testing.assert_allclose(np.asarray(jnp.concatenate(ys, axis=1)), np.asarray(full), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("bad", [-1.0, 0.0, float("nan")])
def test_a_bad_cap_fails_when_the_module_is_built(bad):
  """nnx raises in the constructor, linen at init, naming logits_soft_cap (as each does for softmax_type)."""
  x = jnp.zeros((B, T, D))
  calls = [
    lambda: sa_nnx.DotProductAttention(N, softmax_type="learnable", logits_soft_cap=bad),
    lambda: sa_nnx.MultiHeadAttention(N, D, rngs=nnx.Rngs(0), logits_soft_cap=bad),
    lambda: sa_linen.DotProductAttention(N, logits_soft_cap=bad).init(jax.random.key(0), Q, KEY, V),
    lambda: sa_linen.MultiHeadAttention(num_heads=N, logits_soft_cap=bad).init(jax.random.key(0), x),
  ]
  for call in calls:
    with pytest.raises(ValueError, match="logits_soft_cap"):
      call()


def test_the_transformer_engine_class_has_no_cap():
  """Transformer Engine's JAX DotProductAttention has no soft-cap, so its sinkattn twin has none either: the
  field is refused, not ignored."""
  assert "logits_soft_cap" not in {f.name for f in dataclasses.fields(sa_te.DotProductAttention)}
  with pytest.raises(TypeError):
    sa_te.DotProductAttention(logits_soft_cap=5.0)
