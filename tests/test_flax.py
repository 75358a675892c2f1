"""sinkattn.flax (linen): parameters, equality with the functional op, gradients, GQA/RoPE, KV cache."""

import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import sinkattn
from sinkattn.flax import DotProductAttention, MultiHeadAttention, apply_rope, normalize_softmax_type

B, T, N, K, H = 2, 12, 4, 2, 8


def _qkv(seed=0, t=T, s=T):
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(kq, (B, t, N, H)), jax.random.normal(kk, (B, s, K, H)), jax.random.normal(kv, (B, s, K, H)))


def _wide_sinks(seed=1):
  # U(-5, 5): a zero sink changes the output by too little to see a wrong one (DESIGN.md section 1)
  return jax.random.uniform(jax.random.key(seed), (1, N, 1, 1), jnp.float32, -5.0, 5.0)


def test_submodules_reachable_from_bare_import():
  """DESIGN.md section 3 writes sinkattn.flax.DotProductAttention / sinkattn.nnx: a fresh interpreter
  (this process has imported them already) must reach both after `import sinkattn` alone."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(sinkattn.__file__)))
  env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
  code = "import sinkattn; print(sinkattn.flax.DotProductAttention.__name__, sinkattn.nnx.MultiHeadAttention.__name__)"
  done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  assert done.stdout.split() == ["DotProductAttention", "MultiHeadAttention"]


def test_learnable_param_name_shape_dtype_axes():
  q, k, v = _qkv()
  variables = DotProductAttention(softmax_type="learnable").init(jax.random.key(0), q, k, v)
  box = variables["params"]["softmax_offset"]
  assert list(variables["params"]) == ["softmax_offset"]
  assert isinstance(box, nn.LogicallyPartitioned)
  assert box.names == (None, "heads", None, None)
  assert box.value.shape == (1, N, 1, 1) and box.value.dtype == jnp.float32
  assert np.all(np.asarray(box.value) == 0.0)
  spec = nn.get_partition_spec(variables)["params"]["softmax_offset"]
  assert tuple(spec) == (None, "heads", None, None)


@pytest.mark.parametrize("softmax_type", [None, "vanilla", "off_by_one", "off-by-one"])
def test_no_param_without_learnable(softmax_type):
  q, k, v = _qkv()
  variables = DotProductAttention(softmax_type=softmax_type).init(jax.random.key(0), q, k, v)
  assert not jax.tree.leaves(variables)


def test_softmax_type_names():
  assert normalize_softmax_type("off-by-one") == "off_by_one"
  # DESIGN.md section 3: None means 'learnable' only when sinks are given; a module is given none
  assert normalize_softmax_type(None) == "vanilla"
  assert normalize_softmax_type("Learnable") == "learnable"  # as dot_product_attention accepts it
  with pytest.raises(ValueError, match="softmax_type"):
    normalize_softmax_type(2)
  with pytest.raises(ValueError, match="softmax_type"):
    normalize_softmax_type("sigmoid")
  q, k, v = _qkv()
  with pytest.raises(ValueError, match="softmax_type"):
    DotProductAttention(softmax_type="offbyone").init(jax.random.key(0), q, k, v)


@pytest.mark.parametrize("softmax_type", ["vanilla", "off-by-one", "learnable"])
def test_apply_equals_functional(softmax_type):
  q, k, v = _qkv()
  q_lens, kv_lens = jnp.array([T, 7], jnp.int32), jnp.array([T, 9], jnp.int32)
  mod = DotProductAttention(softmax_type=softmax_type, is_causal=True, local_window_size=(4, 0))
  sinks = _wide_sinks()
  params = {"params": {"softmax_offset": sinks}} if softmax_type == "learnable" else {}
  out, lse = mod.apply(params, q, k, v, query_seq_lengths=q_lens, key_value_seq_lengths=kv_lens, return_residual=True)
  want_out, want_lse = sinkattn.dot_product_attention(
    q,
    k,
    v,
    sinks=sinks if softmax_type == "learnable" else None,
    softmax_type=softmax_type,
    is_causal=True,
    local_window_size=(4, 0),
    query_seq_lengths=q_lens,
    key_value_seq_lengths=kv_lens,
    return_residual=True,
  )
  np.testing.assert_array_equal(out, want_out)
  np.testing.assert_array_equal(lse, want_lse)
  assert out.shape == (B, T, N, H) and lse.shape == (B, T, N) and lse.dtype == jnp.float32
  # the reference twin agrees, and the sink matters: vanilla differs from off-by-one / learnable
  ref = mod.clone(implementation="reference").apply(
    params, q, k, v, query_seq_lengths=q_lens, key_value_seq_lengths=kv_lens
  )
  np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)
  if softmax_type != "vanilla":
    plain = DotProductAttention(is_causal=True, local_window_size=(4, 0)).apply({}, q, k, v)
    assert float(jnp.abs(plain - out)[0].max()) > 1e-2


def test_grad_reaches_softmax_offset():
  q, k, v = _qkv()
  mod = DotProductAttention(softmax_type="learnable", is_causal=True)
  params = {"params": {"softmax_offset": _wide_sinks()}}
  w = jax.random.normal(jax.random.key(5), (B, T, N, H))
  grads = jax.grad(lambda p: jnp.sum(mod.apply(p, q, k, v) * w))(params)
  g = grads["params"]["softmax_offset"]
  assert g.shape == (1, N, 1, 1) and g.dtype == jnp.float32
  assert np.all(np.abs(np.asarray(g)) > 1e-6)
  ref = jax.grad(lambda p: jnp.sum(mod.clone(implementation="reference").apply(p, q, k, v) * w))(params)
  np.testing.assert_allclose(g, ref["params"]["softmax_offset"], rtol=1e-4, atol=1e-5)


def _mha(**kw):
  args = dict(num_heads=N, num_kv_heads=K, head_dim=H, softmax_type="learnable", use_rope=True, use_bias=False)
  args.update(kw)
  return MultiHeadAttention(**args)


def test_mha_params_gqa_shapes_and_lse():
  x = jax.random.normal(jax.random.key(0), (B, T, 16))
  mha = _mha(out_features=24)
  variables = mha.init(jax.random.key(1), x)
  params = nn.unbox(variables["params"])
  shapes = jax.tree.map(lambda a: a.shape, params)
  assert shapes == {
    "query": {"kernel": (16, N, H)},
    "key": {"kernel": (16, K, H)},
    "value": {"kernel": (16, K, H)},
    "out": {"kernel": (N, H, 24)},
    "attention": {"softmax_offset": (1, N, 1, 1)},
  }
  assert variables["params"]["query"]["kernel"].names == ("embed", "heads", "head_dim")
  y, lse = mha.apply(variables, x, return_residual=True)
  assert y.shape == (B, T, 24) and lse.shape == (B, T, N)
  with pytest.raises(ValueError, match="num_kv_heads"):
    _mha(num_kv_heads=3).init(jax.random.key(1), x)


def test_mha_equals_manual_composition():
  """Projections, RoPE and the lengths / segment ids reach the op unchanged."""
  x = jax.random.normal(jax.random.key(0), (B, T, 16))
  mha = _mha(is_causal=True, rope_base=500.0)
  params = nn.unbox(mha.init(jax.random.key(1), x)["params"])
  params["attention"]["softmax_offset"] = _wide_sinks()
  seg = jnp.array([[0] * 5 + [1] * 7, [0] * 12], jnp.int32)
  pos = jnp.array([list(range(5)) + list(range(7)), list(range(12))], jnp.int32)
  kv_lens = jnp.array([T, 10], jnp.int32)
  y = mha.apply(
    {"params": params},
    x,
    query_positions=pos,
    query_segment_ids=seg,
    key_value_segment_ids=seg,
    key_value_seq_lengths=kv_lens,
  )
  q = apply_rope(jnp.einsum("btd,dnh->btnh", x, params["query"]["kernel"]), pos, 500.0)
  k = apply_rope(jnp.einsum("btd,dnh->btnh", x, params["key"]["kernel"]), pos, 500.0)
  v = jnp.einsum("btd,dnh->btnh", x, params["value"]["kernel"])
  o = sinkattn.dot_product_attention(
    q,
    k,
    v,
    sinks=params["attention"]["softmax_offset"],
    is_causal=True,
    query_segment_ids=seg,
    key_value_segment_ids=seg,
    key_value_seq_lengths=kv_lens,
    implementation="reference",
  )
  want = jnp.einsum("btnh,nhd->btd", o, params["out"]["kernel"])
  np.testing.assert_allclose(y, want, atol=3e-5, rtol=3e-5)


def test_rope_is_relative():
  """q.k after RoPE depends on the position difference only, and the norm is kept."""
  kq, kk = jax.random.split(jax.random.key(3))
  q, k = jax.random.normal(kq, (1, 1, 1, 16)), jax.random.normal(kk, (1, 1, 1, 16))

  def score(pq, pk):
    return float(jnp.sum(apply_rope(q, jnp.array([[pq]])) * apply_rope(k, jnp.array([[pk]]))))

  assert score(7, 3) == pytest.approx(score(104, 100), rel=1e-4)
  assert score(7, 3) != pytest.approx(score(7, 5), rel=1e-2)
  np.testing.assert_allclose(jnp.linalg.norm(apply_rope(q, jnp.array([[41]]))), jnp.linalg.norm(q), rtol=1e-5)
  with pytest.raises(ValueError, match="even"):
    apply_rope(jnp.ones((1, 1, 1, 3)), jnp.array([[0]]))


def test_mha_kv_cache_decode_matches_full_forward():
  x = jax.random.normal(jax.random.key(0), (B, T, 16))
  mha = _mha(is_causal=True, local_window_size=(3, 0))
  params = nn.unbox(mha.init(jax.random.key(1), x)["params"])
  params["attention"]["softmax_offset"] = _wide_sinks()
  full = mha.apply({"params": params}, x)
  dec = mha.clone(decode=True)
  cache = dec.init(jax.random.key(1), x)["cache"]
  step = jax.jit(lambda c, xt: dec.apply({"params": params, "cache": c}, xt, mutable=["cache"]))
  y, state = step(cache, x[:, :5])  # prefill 5 tokens
  ys = [y]
  for t in range(5, T):  # then one token per call
    y, state = step(state["cache"], x[:, t : t + 1])
    ys.append(y)
  np.testing.assert_allclose(jnp.concatenate(ys, axis=1), full, atol=2e-5, rtol=2e-5)
  assert int(state["cache"]["cache_index"]) == T
  with pytest.raises(ValueError, match="decode=True"):
    dec.apply(
      {"params": params, "cache": cache}, x[:, :1], key_value_seq_lengths=jnp.ones((B,), jnp.int32), mutable=["cache"]
    )


def test_mha_dtype_and_param_dtype():
  x = jax.random.normal(jax.random.key(0), (B, T, 16))
  mha = _mha(dtype=jnp.bfloat16)
  variables = mha.init(jax.random.key(1), x)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nn.unbox(variables)))
  assert mha.apply(variables, x).dtype == jnp.bfloat16


def test_optax_steps_reduce_loss_and_move_sinks():
  x = jax.random.normal(jax.random.key(0), (B, T, 16))
  target = jax.random.normal(jax.random.key(9), (B, T, 16))
  mha = _mha(is_causal=True)
  params = nn.unbox(mha.init(jax.random.key(1), x)["params"])
  opt = optax.adam(3e-2)
  state = opt.init(params)

  @jax.jit
  def step(params, state):
    loss, g = jax.value_and_grad(lambda p: jnp.mean((mha.apply({"params": p}, x) - target) ** 2))(params)
    upd, state = opt.update(g, state, params)
    return optax.apply_updates(params, upd), state, loss

  losses = []
  for _ in range(15):
    params, state, loss = step(params, state)
    losses.append(float(loss))
  assert losses[-1] < 0.8 * losses[0], losses
  assert float(jnp.abs(params["attention"]["softmax_offset"]).max()) > 0.05


@pytest.mark.parametrize("implementation", [None, "reference"])
def test_mha_under_an_explicit_mesh(implementation):
  """Parameters sharded by their logical axes under an Explicit mesh: the out projection contracts N
  split on 'model' in both operands (the reference keeps q's heads sharding; the fused op's output is
  typed like q), which JAX refuses without a named out_sharding. Same numbers as without a mesh."""
  x = jax.random.normal(jax.random.key(0), (B, T, 16))
  mha = _mha(is_causal=True, implementation=implementation)
  variables = mha.init(jax.random.key(1), x)
  params = nn.unbox(variables["params"])
  params["attention"]["softmax_offset"] = _wide_sinks()
  loss = lambda p, x: jnp.sum(mha.apply({"params": p}, x) ** 2)
  want, want_g = mha.apply({"params": params}, x), jax.grad(loss)(params, x)
  mesh = jax.make_mesh((1,), ("model",), axis_types=(jax.sharding.AxisType.Explicit,))
  rules = (("heads", "model"), ("kv_heads", "model"), ("embed", None), ("head_dim", None))
  shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(variables), mesh, rules)["params"]
  with jax.sharding.set_mesh(mesh):
    params = jax.device_put(params, shardings)
    assert params["out"]["kernel"].sharding.spec == jax.sharding.PartitionSpec("model", None, None)
    got = mha.apply({"params": params}, x)
    got_jit = jax.jit(mha.apply)({"params": params}, x)
    got_g = jax.jit(jax.grad(loss))(params, x)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(got_jit, want, atol=1e-5, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4), got_g, want_g)
