"""One mask convention and one DotProductAttention contract across the modules: sinkattn.flax (linen) and
sinkattn.nnx share the constructor and the call (jax.nn's and Flax's terms: bias and mask by position, mask True
= attend) and give the same output for the same mask, equal to jax.nn's; Transformer Engine's convention (its
inverted mask, sequence descriptors, attn_mask_type 'causal' by default) lives in sinkattn.te only."""

import inspect

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

pytestmark = pytest.mark.usefixtures("on_cpu")  # jax.nn's and Flax's float32 products run in TF32 on a GPU

B, T, S, N, K, H, D = 2, 8, 10, 4, 2, 16, 32
Q, KEY, V, SINKS = make_inputs(60, B=B, T=T, S=S, N=N, K=K, H=H, sink_range=5.0)
RNG = np.random.default_rng(61)
MASK = jnp.asarray(RNG.random((B, N, T, S)) < 0.5).at[..., 0].set(True)  # a random mask; every row sees a key
BIAS = jnp.asarray(RNG.standard_normal((1, N, T, S)), jnp.float32)
OFFSET = SINKS.reshape(1, N, 1, 1)


def _linen(**kw):
  """sinkattn.flax.DotProductAttention as a function of its call arguments, with softmax_offset = OFFSET."""
  mod = sa_linen.DotProductAttention(N, **kw)
  params = {"params": {"softmax_offset": OFFSET}} if kw.get("softmax_type") == "learnable" else {}
  return lambda *a, **c: mod.apply(params, *a, **c)


def _nnx(**kw):
  mod = sa_nnx.DotProductAttention(N, **kw)
  if kw.get("softmax_type") == "learnable":
    mod.softmax_offset[...] = OFFSET
  return mod


def test_linen_and_nnx_share_one_constructor_and_call():
  """The same parameter names, order, kinds and defaults (linen's dataclass fields are its constructor; parent
  and name are linen's own)."""
  linen_init = inspect.signature(sa_linen.DotProductAttention)
  nnx_init = inspect.signature(sa_nnx.DotProductAttention.__init__)
  assert [(n, p.default) for n, p in linen_init.parameters.items() if n not in ("parent", "name")] == [
    (n, p.default) for n, p in nnx_init.parameters.items() if n != "self"
  ]
  call = lambda c: [(n, p.kind, p.default) for n, p in inspect.signature(c.__call__).parameters.items() if n != "self"]  # noqa: E731
  assert call(sa_linen.DotProductAttention) == call(sa_nnx.DotProductAttention)
  assert [n for n, *_ in call(sa_nnx.DotProductAttention)][:5] == ["query", "key", "value", "bias", "mask"]


@pytest.mark.parametrize("softmax_type", ["vanilla", "learnable"])
def test_linen_and_nnx_give_the_same_output_for_the_same_mask(softmax_type):
  """A model ported from linen to nnx keeps its mask's meaning: bias and a random mask by position, and by
  keyword, give the same out and lse in both (and a different result without the mask: it reached the op)."""
  kw = dict(softmax_type=softmax_type, is_causal=True, local_window_size=(5, 0))
  linen, mod = _linen(**kw), _nnx(**kw)
  got_linen = linen(Q, KEY, V, BIAS, MASK, return_residual=True)
  got_nnx = mod(Q, KEY, V, BIAS, MASK, return_residual=True)
  by_keyword = mod(Q, KEY, V, bias=BIAS, mask=MASK, return_residual=True)
  for a, b, c in zip(got_linen, got_nnx, by_keyword):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
  sinks = SINKS if softmax_type == "learnable" else None
  want = sinkattn.dot_product_attention(Q, KEY, V, BIAS, MASK, sinks=sinks, return_residual=True, **kw)
  for a, b in zip(got_linen, want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert float(jnp.abs(mod(Q, KEY, V, BIAS) - got_nnx[0]).max()) > 1e-2


@pytest.mark.parametrize("module", ["linen", "nnx"])
def test_modules_read_a_mask_as_jax_nn_does(module):
  """True = attend: with vanilla softmax each module equals jax.nn.dot_product_attention(q, k, v, bias, mask)."""
  fn = _linen() if module == "linen" else _nnx()
  want = jax.nn.dot_product_attention(Q, KEY, V, BIAS, MASK)
  np.testing.assert_allclose(np.asarray(fn(Q, KEY, V, BIAS, MASK)), np.asarray(want), atol=2e-5, rtol=2e-5)


def test_mha_linen_and_nnx_read_one_mask():
  """The MultiHeadAttention twins with the same weights give the same output under the same random mask."""
  x = jax.random.normal(jax.random.key(62), (B, T, D))
  kw = dict(num_kv_heads=K, head_dim=H, softmax_type="learnable", use_bias=False)
  mha = sa_nnx.MultiHeadAttention(N, D, rngs=nnx.Rngs(0), **kw)
  mha.attention.softmax_offset[...] = OFFSET
  params = nnx.to_pure_dict(nnx.state(mha, nnx.Param))
  linen = sa_linen.MultiHeadAttention(num_heads=N, **kw)
  mask = MASK[..., :T]
  got = linen.apply({"params": params}, x, mask=mask)
  np.testing.assert_allclose(np.asarray(got), np.asarray(mha(x, mask=mask)), atol=1e-6)
  assert float(jnp.abs(got - mha(x)).max()) > 1e-2


def test_te_class_reproduces_transformer_engines_convention():
  """sinkattn.te.DotProductAttention: attn_mask_type 'causal' by default (as TE), an array mask / sequence
  descriptor True = masked OUT (the op's mask inverted), window_size -1 for an unbounded side."""
  te = lambda **kw: sa_te.DotProductAttention(head_dim=H, num_attention_heads=N, num_gqa_groups=K, **kw)  # noqa: E731
  op = lambda **kw: sinkattn.dot_product_attention(Q, KEY, V, **kw)  # noqa: E731
  same = lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)  # noqa: E731
  same(te().apply({}, Q, KEY, V), op(is_causal=True))
  masked_out = ~MASK
  same(te(attn_mask_type="padding").apply({}, Q, KEY, V, masked_out), op(mask=MASK))
  same(te(attn_mask_type="padding").apply({}, Q, KEY, V, mask=masked_out), op(mask=MASK))
  same(te(attn_mask_type="padding_causal").apply({}, Q, KEY, V, masked_out), op(mask=MASK, is_causal=True))
  same(te(window_size=(3, -1)).apply({}, Q, KEY, V), op(is_causal=True, local_window_size=(3, None)))
  same(te(window_size=(-1, -1)).apply({}, Q, KEY, V), op(is_causal=True))
  out, lse = te(attn_mask_type="no_mask").apply({}, Q, KEY, V, return_residual=True)
  want_out, want_lse = op(return_residual=True)
  same(out, want_out)
  same(lse, want_lse)
  assert not any(hasattr(sa_linen, n) for n in ("SequenceDescriptor", "from_transformer_engine"))
  assert "attention_mask" not in inspect.signature(sa_te.DotProductAttention.__call__).parameters
  with pytest.raises(TypeError):
    sa_te.DotProductAttention(is_causal=True)  # TE's own fields only: attn_mask_type says it
