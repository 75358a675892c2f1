"""Drop-in compatibility with Flax and Transformer Engine: sinkattn.dot_product_attention as the attention_fn of
Flax's own modules (outputs equal to Flax's attention with causal, padding and arbitrary masks; every argument
Flax passes is either honoured or refused), sinkattn's modules loading Flax's weights, sinkattn.te's
DotProductAttention (Transformer Engine's fields, defaults and inverted mask), and the TE checkpoint converters on
a TE-shaped parameter tree. Larger than 400 lines: one file per drop-in claim of the README."""

import functools
import inspect

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import sinkattn
import sinkattn.flax as sa_linen
import sinkattn.nnx as sa_nnx
import sinkattn.te as sa_te

pytestmark = pytest.mark.usefixtures("on_cpu")  # Flax's float32 products run in TF32 on a GPU

B, T, D, N = 2, 10, 32, 4


def _x(seed=0, t=T):
  return jax.random.normal(jax.random.key(seed), (B, t, D))


def _masks():
  """Flax-built masks (float 0/1, rank 4): causal, padding, and an arbitrary per-head one that keeps the
  diagonal (every row sees a key: Flax gives a row without keys the mean of the values, sinkattn 0)."""
  causal = nn.make_causal_mask(jnp.ones((B, T)))
  valid = jnp.arange(T)[None, :] < jnp.asarray([[T], [6]])
  padding = nn.make_attention_mask(valid, valid)
  padding = jnp.maximum(padding, jnp.eye(T)[None, None])  # padded rows see themselves
  rng = np.random.default_rng(0)
  arbitrary = jnp.asarray((rng.random((B, N, T, T)) < 0.5) | np.eye(T, dtype=bool))
  return {"causal": causal, "padding": padding, "arbitrary": arbitrary}


MASKS = _masks()


@pytest.mark.parametrize("mask", sorted(MASKS))
def test_linen_attention_fn_equals_flax(mask):
  x = _x()
  flax_mha = nn.MultiHeadDotProductAttention(num_heads=N, qkv_features=D)
  params = flax_mha.init(jax.random.key(1), x)
  ours = flax_mha.clone(attention_fn=sinkattn.dot_product_attention)
  want = jax.jit(flax_mha.apply)(params, x, mask=MASKS[mask])
  got = jax.jit(ours.apply)(params, x, mask=MASKS[mask])
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
  unmasked = jax.jit(flax_mha.apply)(params, x)
  assert float(jnp.abs(unmasked - got).max()) > 1e-2  # the mask reached the kernel


@pytest.mark.parametrize("mask", sorted(MASKS) + ["is_causal"])
def test_nnx_attention_fn_equals_flax(mask):
  x = _x(2)
  flax_mha = nnx.MultiHeadAttention(N, D, num_kv_heads=2, decode=False, rngs=nnx.Rngs(0))
  ours = nnx.MultiHeadAttention(
    N, D, num_kv_heads=2, decode=False, attention_fn=sinkattn.dot_product_attention, rngs=nnx.Rngs(0)
  )
  kw = dict(is_causal=True) if mask == "is_causal" else dict(mask=MASKS[mask])
  np.testing.assert_allclose(ours(x, **kw), flax_mha(x, **kw), atol=2e-5, rtol=2e-5)


def _recording():
  """sinkattn.dot_product_attention with the same signature (Flax filters keywords by it), recording the
  keywords each call receives."""
  seen = []

  @functools.wraps(sinkattn.dot_product_attention)
  def fn(*args, **kw):
    seen.append(dict(kw))
    return sinkattn.dot_product_attention(*args, **kw)

  return fn, seen


def _flax_calls():
  """Every keyword Flax's modules pass to an attention_fn, with the values they pass: linen with and
  without sow_weights and with a dropout rate, nnx likewise, and nnx's call-time is_causal."""
  fn, seen = _recording()
  x = _x(3)
  for kw in (dict(), dict(dropout_rate=0.25)):
    mha = nn.MultiHeadDotProductAttention(num_heads=N, attention_fn=fn, deterministic=True, **kw)
    params = mha.init(jax.random.key(0), x)
    mha.apply(params, x, mask=MASKS["causal"])
    mha.apply(params, x, mask=MASKS["causal"], sow_weights=True, mutable=["intermediates"])
    m = nnx.MultiHeadAttention(N, D, attention_fn=fn, decode=False, deterministic=True, rngs=nnx.Rngs(0), **kw)
    m(x, mask=MASKS["causal"])
    m(x, is_causal=True, sow_weights=True)
  return seen


# For every keyword Flax passes: how a changed value shows (a different result, or a clear refusal). A keyword
# that does not change the result by design (dropout's companions without dropout, a precision the kernels
# meet) shows through its validation.
def _differs(a, b):
  return float(jnp.max(jnp.abs(jnp.asarray(a, jnp.float32) - jnp.asarray(b, jnp.float32)))) > 1e-3


def _raises(exc, fn):
  try:
    fn()
  except exc:
    return True
  return False


Q, K, V = (jax.random.normal(jax.random.key(i), (B, T, N, 8)) for i in range(3))
_op = functools.partial(sinkattn.dot_product_attention, Q, K, V)
CHECKS = {
  "mask": lambda: _differs(_op(mask=MASKS["causal"]), _op(mask=None)),
  "bias": lambda: _differs(_op(bias=jnp.ones((1, 1, T, T)).at[..., 0].set(5.0)), _op(bias=None)),
  "is_causal": lambda: _differs(_op(is_causal=True), _op(is_causal=False)),
  "dtype": lambda: _op(dtype=jnp.bfloat16).dtype == jnp.bfloat16,
  "dropout_rate": lambda: _raises(NotImplementedError, lambda: _op(dropout_rate=0.1, deterministic=False)),
  "deterministic": lambda: (
    _raises(NotImplementedError, lambda: _op(dropout_rate=0.1, deterministic=False))
    and not _differs(_op(dropout_rate=0.1, deterministic=True), _op())
  ),
  "dropout_rng": lambda: _raises(NotImplementedError, lambda: _op(dropout_rate=0.1, dropout_rng=jax.random.key(0))),
  "broadcast_dropout": lambda: _raises(TypeError, lambda: _op(broadcast_dropout="yes")),
  "precision": lambda: _raises(TypeError, lambda: _op(precision=3.5)),
  "force_fp32_for_softmax": lambda: _raises(TypeError, lambda: _op(force_fp32_for_softmax="no")),
  "qk_attn_weights_einsum": lambda: _raises(NotImplementedError, lambda: _op(qk_attn_weights_einsum=jnp.einsum)),
  "attn_weights_value_einsum": lambda: _raises(NotImplementedError, lambda: _op(attn_weights_value_einsum=jnp.einsum)),
  "module": lambda: _module_sows(),
}


def _module_sows():
  class Probe(nn.Module):
    @nn.compact
    def __call__(self, q):
      return sinkattn.dot_product_attention(q, K, V, module=self, is_causal=True)

  _, state = Probe().apply({}, Q, mutable=["intermediates"])
  (w,) = state["intermediates"]["attention_weights"]
  return w.shape == (B, N, T, T) and bool(jnp.all(jnp.triu(w[0, 0], 1) == 0))


def test_no_argument_flax_passes_is_ignored():
  """Introspects the calls Flax's modules make: every keyword they pass is declared by
  sinkattn.dot_product_attention (Flax drops the undeclared ones without a word) and has a check above that
  sees its effect. A Flax version that passes a new keyword fails here until it is handled."""
  seen = _flax_calls()
  passed = set().union(*[set(kw) for kw in seen])
  declared = set(inspect.signature(sinkattn.dot_product_attention).parameters)
  assert passed <= declared, f"Flax passes {sorted(passed - declared)}, which sinkattn drops"
  assert passed <= set(CHECKS), f"no check for {sorted(passed - set(CHECKS))}"
  assert {"mask", "dropout_rate", "deterministic", "dtype", "precision", "module", "is_causal"} <= passed
  failed = [name for name in sorted(passed | {"bias"}) if not CHECKS[name]()]
  assert not failed, f"arguments whose change shows nowhere: {failed}"


def test_sow_weights_equal_flax():
  """sow_weights / module: the attention weights sinkattn stores equal Flax's (linen 'intermediates', nnx
  nnx.Intermediate), in Flax's modules with sinkattn as attention_fn and in sinkattn's modules."""
  x = _x(4)
  flax_mha = nn.MultiHeadDotProductAttention(num_heads=N)
  params = flax_mha.init(jax.random.key(1), x)
  weights = lambda m: m.apply(params, x, mask=MASKS["causal"], sow_weights=True, mutable=["intermediates"])[1]
  want = weights(flax_mha)["intermediates"]["attention_weights"][0]
  for ours in (flax_mha.clone(attention_fn=sinkattn.dot_product_attention), sa_linen.MultiHeadAttention(num_heads=N)):
    np.testing.assert_allclose(weights(ours)["intermediates"]["attention_weights"][0], want, atol=1e-6)
  mods = [
    nnx.MultiHeadAttention(N, D, decode=False, rngs=nnx.Rngs(0), **kw)
    for kw in ({}, dict(attention_fn=sinkattn.dot_product_attention))
  ] + [sa_nnx.MultiHeadAttention(N, D, rngs=nnx.Rngs(0))]
  got = []
  for m in mods:
    m(x, mask=MASKS["causal"], sow_weights=True)
    got.append(jax.tree.leaves(nnx.state(m, nnx.Intermediate))[0])
  np.testing.assert_allclose(got[1], got[0], atol=1e-6)
  np.testing.assert_allclose(got[2], got[0], atol=1e-6)


@pytest.mark.parametrize("mask", ["causal", "arbitrary"])
def test_linen_module_loads_flax_weights(mask):
  """sinkattn.flax.MultiHeadAttention with Flax's fields takes a Flax MultiHeadDotProductAttention checkpoint
  as is (normalize_qk, qkv_features != D, out_features) and gives Flax's output."""
  x = _x(5)
  kw = dict(num_heads=N, qkv_features=16, out_features=24, normalize_qk=True)
  flax_mha = nn.MultiHeadDotProductAttention(**kw)
  params = flax_mha.init(jax.random.key(1), x)
  ours = sa_linen.MultiHeadAttention(**kw)
  assert jax.tree.structure(nn.unbox(ours.init(jax.random.key(1), x))) == jax.tree.structure(params)
  want = jax.jit(flax_mha.apply)(params, x, mask=MASKS[mask])
  np.testing.assert_allclose(jax.jit(ours.apply)(params, x, mask=MASKS[mask]), want, atol=2e-5, rtol=2e-5)
  np.testing.assert_allclose(jax.jit(ours.apply)(params, x, x, x, mask=MASKS[mask]), want, atol=2e-5, rtol=2e-5)


def test_nnx_module_loads_flax_state():
  """sinkattn.nnx.MultiHeadAttention in flax.nnx.MultiHeadAttention's argument order takes its state (GQA,
  normalize_qk) and gives its output, masked and with init_cache as Flax's (input_shape)."""
  x = _x(6)
  args = (N, D, 16, 24, 2)  # num_heads, in_features, qkv_features, out_features, num_kv_heads
  flax_mha = nnx.MultiHeadAttention(*args, normalize_qk=True, decode=False, rngs=nnx.Rngs(0))
  ours = sa_nnx.MultiHeadAttention(*args, normalize_qk=True, rngs=nnx.Rngs(1))
  nnx.update(ours, nnx.state(flax_mha, nnx.Param))
  for mask in ("causal", "arbitrary"):
    np.testing.assert_allclose(ours(x, mask=MASKS[mask]), flax_mha(x, mask=MASKS[mask]), atol=2e-5, rtol=2e-5)
  ours.init_cache(x.shape)
  assert ours.cached_key.shape == (B, T, 2, 4)


def test_module_arguments_refused_clearly():
  x = _x(7)
  with pytest.raises(NotImplementedError, match="dropout_rate"):
    sa_linen.MultiHeadAttention(num_heads=N, dropout_rate=0.1).init(jax.random.key(0), x, deterministic=False)
  with pytest.raises(NotImplementedError, match="attention_fn"):
    sa_linen.MultiHeadAttention(num_heads=N, attention_fn=nn.dot_product_attention).init(jax.random.key(0), x)
  with pytest.raises(NotImplementedError, match="dropout_rate"):
    sa_nnx.MultiHeadAttention(N, D, dropout_rate=0.1, rngs=nnx.Rngs(0))(x)
  with pytest.raises(ValueError, match="qkv_features"):
    sa_nnx.MultiHeadAttention(N, D, qkv_features=30, rngs=nnx.Rngs(0))
  kept = sa_nnx.MultiHeadAttention(N, D, dropout_rate=0.1, deterministic=True, rngs=nnx.Rngs(0))
  assert kept(x).shape == (B, T, D)


# ---- Transformer Engine ---------------------------------------------------------------------------------

S = 12
TQ, TK, TV = (
  jax.random.normal(jax.random.key(10 + i), (B, n, h, 16)) for i, (n, h) in enumerate(((T, N), (S, 2), (S, 2)))
)
TE_SINKS = jax.random.uniform(jax.random.key(20), (1, N, 1, 1), minval=-5.0, maxval=5.0)
LENS = jnp.asarray([T, 7], jnp.int32), jnp.asarray([S, 9], jnp.int32)

TE_CASES = [  # id, module fields, call keywords (beside q, k, v), dot_product_attention keywords
  ("no_mask", dict(attn_mask_type="no_mask"), {}, {}),
  (
    "causal_window",
    dict(attn_mask_type="causal", window_size=(3, 0)),
    {},
    dict(is_causal=True, local_window_size=(3, 0)),
  ),
  (
    "padding_seqlens",
    dict(attn_mask_type="padding"),
    dict(sequence_descriptor=sa_te.SequenceDescriptor.from_seqlens(LENS)),
    dict(query_seq_lengths=LENS[0], key_value_seq_lengths=LENS[1]),
  ),
  (
    "padding_causal_bottom_right",
    dict(attn_mask_type="padding_causal_bottom_right"),
    dict(sequence_descriptor=sa_te.SequenceDescriptor.from_seqlens(LENS)),
    dict(is_causal=True, causal_alignment="bottom_right", query_seq_lengths=LENS[0], key_value_seq_lengths=LENS[1]),
  ),
  (
    "causal_bottom_right",
    dict(attn_mask_type="causal_bottom_right"),
    {},
    dict(is_causal=True, causal_alignment="bottom_right"),
  ),
  ("scale_factor", dict(attn_mask_type="no_mask", scale_factor=0.3), {}, dict(scale=0.3)),
]


@pytest.mark.parametrize("case", TE_CASES, ids=[c[0] for c in TE_CASES])
def test_te_dot_product_attention_equals_the_op(case):
  _, fields, call, want_kw = case
  mod = sa_te.DotProductAttention(
    head_dim=16, num_attention_heads=N, num_gqa_groups=2, softmax_type="learnable", **fields
  )
  params = {"params": {"softmax_offset": TE_SINKS}}
  got = jax.jit(lambda p, q, k, v, c: mod.apply(p, q, k, v, **c))(params, TQ, TK, TV, call)
  want = sinkattn.dot_product_attention(TQ, TK, TV, sinks=TE_SINKS, **want_kw)
  np.testing.assert_allclose(got, want, atol=1e-6)


def _positions(ids):
  """Each token's position within its run of equal segment ids."""
  out = []
  for r in np.asarray(ids):
    starts = np.where(np.r_[True, r[1:] != r[:-1]], np.arange(len(r)), 0)
    out.append(np.arange(len(r)) - np.maximum.accumulate(starts))
  return jnp.asarray(np.stack(out), jnp.int32)


def test_te_layouts_bias_types_and_masks():
  """SBHD input (transpose_batch_sequence), pre- and post-scale bias, TE's mask (True = masked out), and
  packed documents from segment ids (0 = padding) and positions measuring the causal window."""
  te = functools.partial(sa_te.DotProductAttention, head_dim=16, num_attention_heads=N)
  bias = jax.random.normal(jax.random.key(30), (1, N, T, S))
  masked_out = jax.random.bernoulli(jax.random.key(31), 0.3, (B, 1, T, S)).at[..., 0].set(False)
  q_ids = jnp.asarray([[1] * 4 + [2] * 6, [1] * 8 + [0] * 2], jnp.int32)
  kv_ids = jnp.asarray([[1] * 5 + [2] * 7, [1] * 9 + [0] * 3], jnp.int32)
  q_pos, kv_pos = _positions(q_ids), _positions(kv_ids)
  desc = sa_te.SequenceDescriptor.from_segment_ids_and_pos((q_ids, kv_ids), (q_pos, kv_pos))
  op = functools.partial(sinkattn.dot_product_attention, TQ, TK, TV)
  cases = [  # (module, call arguments, the equal op call)
    (
      te(attn_mask_type="causal", transpose_batch_sequence=True),
      tuple(jnp.swapaxes(x, 0, 1) for x in (TQ, TK, TV)),
      {},
      lambda: jnp.swapaxes(op(is_causal=True), 0, 1),
    ),
    (
      te(attn_mask_type="no_mask", attn_bias_type="post_scale_bias"),
      (TQ, TK, TV),
      dict(bias=bias),
      lambda: op(bias=bias),
    ),
    (
      te(attn_mask_type="no_mask", attn_bias_type="pre_scale_bias"),
      (TQ, TK, TV),
      dict(bias=bias),
      lambda: op(bias=0.25 * bias),
    ),
    (te(attn_mask_type="padding"), (TQ, TK, TV, masked_out), {}, lambda: op(mask=~masked_out)),
    (
      te(attn_mask_type="padding_causal", window_size=(2, 0)),
      (TQ, TK, TV, desc),
      {},
      lambda: op(
        is_causal=True,
        local_window_size=(2, 0),
        query_segment_ids=jnp.where(q_ids == 0, -1, q_ids),
        key_value_segment_ids=jnp.where(kv_ids == 0, -2, kv_ids),
        query_positions=q_pos,
        key_value_positions=kv_pos,
      ),
    ),
  ]
  got = jax.jit(lambda: [m.apply({}, *a, **kw) for m, a, kw, _ in cases])()
  want = jax.jit(lambda: [fn() for *_, fn in cases])()
  for i, (g, w) in enumerate(zip(got, want)):
    np.testing.assert_allclose(g, w, atol=1e-6, err_msg=f"case {i}")
  assert np.all(np.asarray(got[-1])[1, 8:] == 0), "padding queries (segment id 0) see no key"
  assert float(jnp.abs(got[-1] - op(is_causal=True, local_window_size=(2, 0))).max()) > 1e-2


TE_BAD = [
  ("packed_layout", dict(qkv_layout="bs3hd"), {}, NotImplementedError, "bs3hd"),
  ("dropout", dict(attention_dropout=0.1), {}, NotImplementedError, "attention_dropout"),
  ("score_mod", dict(score_mod=lambda s: s), {}, NotImplementedError, "score_mod"),
  ("context_parallel", dict(context_parallel_axis="cp"), {}, NotImplementedError, "ring_attention"),
  ("mask_with_causal", dict(attn_mask_type="causal"), dict(mask=jnp.zeros((B, 1, T, S), bool)), ValueError, "mask"),
  ("no_bias_with_bias", dict(attn_bias_type="no_bias"), dict(bias=jnp.zeros((1, 1, T, S))), ValueError, "no_bias"),
  ("head_dim", dict(head_dim=32), {}, ValueError, "head_dim"),
  ("gqa_groups", dict(num_gqa_groups=4), {}, ValueError, "num_gqa_groups"),
  ("window_size", dict(window_size=(-2, 0)), {}, ValueError, "window_size"),
  ("mask_type", dict(attn_mask_type="sliding"), {}, ValueError, "attn_mask_type"),
  (
    "thd",
    dict(attn_mask_type="padding"),
    dict(
      sequence_descriptor=sa_te.SequenceDescriptor.from_seqlens_and_offsets(LENS, (jnp.zeros((B, 2), jnp.int32),) * 2)
    ),
    NotImplementedError,
    "seq_offsets",
  ),
]


@pytest.mark.parametrize("case", TE_BAD, ids=[c[0] for c in TE_BAD])
def test_te_refusals(case):
  _, fields, call, exc, word = case
  with pytest.raises(exc, match=word):
    sa_te.DotProductAttention(**fields).apply({}, TQ, TK, TV, **call)


def _te_tree(value, scope="_FusedDotProductAttention_0"):
  """A parameter tree as Transformer Engine writes it (transformer_engine.jax.flax.DotProductAttention inside a
  user's layer): the sink one scope below the DotProductAttention, head axis 'nvte_head'."""
  box = nn.LogicallyPartitioned(value, names=(None, "nvte_head", None, None))
  return {
    "params": {
      "layer_0": {"DotProductAttention_0": {scope: {"softmax_offset": box}}, "mlp": {"kernel": jnp.ones((D, D))}}
    }
  }


class _Layer(nn.Module):
  @nn.compact
  def __call__(self, q, k, v):
    return sa_linen.DotProductAttention(softmax_type="learnable", name="DotProductAttention_0")(q, k, v)


def test_te_checkpoint_converters():
  for scope, fused in (("_FusedDotProductAttention_0", True), ("_UnfusedDotProductAttention_0", False)):
    te = _te_tree(TE_SINKS, scope)
    ours = sa_te.from_transformer_engine(te)
    box = ours["params"]["layer_0"]["DotProductAttention_0"]["softmax_offset"]
    assert box.names == (None, "heads", None, None) and box.value is TE_SINKS
    assert set(ours["params"]["layer_0"]["DotProductAttention_0"]) == {"softmax_offset"}
    assert ours["params"]["layer_0"]["mlp"] == te["params"]["layer_0"]["mlp"]
    layer = {"params": ours["params"]["layer_0"]}
    got = _Layer().apply(layer, TQ, TK, TV)
    np.testing.assert_array_equal(got, sinkattn.dot_product_attention(TQ, TK, TV, sinks=TE_SINKS))
    back = sa_te.to_transformer_engine(ours, fused=fused)
    assert jax.tree.structure(back) == jax.tree.structure(te)
    assert back["params"]["layer_0"]["DotProductAttention_0"][scope]["softmax_offset"].names == (
      None,
      "nvte_head",
      None,
      None,
    )
  frozen = sa_te.from_transformer_engine(jax.tree.map(lambda x: x, nn.FrozenDict(_te_tree(TE_SINKS))))
  assert isinstance(frozen, nn.FrozenDict)
  with pytest.raises(ValueError, match="softmax_offset"):
    sa_te.to_transformer_engine({"softmax_offset": TE_SINKS, "_FusedDotProductAttention_0": {}})
