"""decode_attention: fused (CPU; CUDA under the gpu marker) vs the jnp reference, jit/vmap, bad inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sinkattn
from conftest import OUT_TOL
from sinkattn import _lib

pytestmark = pytest.mark.skipif(not _lib.available(), reason="libsinkattn_jax.so not built")


def _inputs(B, T, S, N, K, H, Hv, dtype, seed=0):
  ks = jax.random.split(jax.random.PRNGKey(seed), 5)
  q = jax.random.normal(ks[0], (B, T, N, H), jnp.float32).astype(dtype)
  kc = jax.random.normal(ks[1], (B, S, K, H), jnp.float32).astype(dtype)
  vc = jax.random.normal(ks[2], (B, S, K, Hv), jnp.float32).astype(dtype)
  sinks = jax.random.uniform(ks[3], (N,), minval=-10.0, maxval=10.0)
  sinks = sinks.at[0].set(50.0).at[N - 1].set(-50.0)  # a wrong sink must show
  lens = jax.random.randint(ks[4], (B,), 0, S + 1).at[0].set(0).at[B - 1].set(S).astype(jnp.int32)
  return q, kc, vc, sinks, lens


def _close(out, lse, rout, rlse, dtype):
  tol = OUT_TOL[np.dtype(dtype)]
  out, rout = np.asarray(out, np.float64), np.asarray(rout, np.float64)
  assert np.all(np.abs(out - rout) <= tol * (1 + np.abs(rout))), np.abs(out - rout).max()
  lse, rlse = np.asarray(lse), np.asarray(rlse)
  assert np.array_equal(np.isinf(lse), np.isinf(rlse))
  fin = np.isfinite(rlse)
  assert np.all(np.abs(lse[fin] - rlse[fin]) <= 1e-4 * (1 + np.abs(rlse[fin])))


CASES = [  # B, T, S, N, K, H, Hv, dtype, softmax, window
  (3, 1, 1500, 16, 2, 64, 64, jnp.bfloat16, "learnable", None),
  (2, 5, 700, 8, 8, 64, 32, jnp.float32, "off_by_one", (127, 0)),
  (4, 2, 1100, 4, 2, 40, 40, jnp.float16, "vanilla", (40, 0)),
  (2, 16, 900, 16, 2, 128, 128, jnp.bfloat16, "learnable", 63),
]


@pytest.mark.parametrize("case", CASES)
def test_fused_matches_reference(case):
  B, T, S, N, K, H, Hv, dtype, softmax, window = case
  q, kc, vc, sinks, lens = _inputs(B, T, S, N, K, H, Hv, dtype)
  s = sinks if softmax == "learnable" else None
  kw = dict(softmax_type=softmax, local_window_size=window, return_residual=True)
  out, lse = sinkattn.decode_attention(q, kc, vc, lens, sinks=s, **kw)
  rout, rlse = sinkattn.decode_attention(q, kc, vc, lens, sinks=s, implementation="reference", **kw)
  assert out.dtype == q.dtype and out.shape == (B, T, N, Hv) and lse.shape == (B, T, N)
  _close(out, lse, rout, rlse, dtype)
  # the same as dot_product_attention with bottom-right causal alignment and the cache lengths
  dout, dlse = sinkattn.dot_product_attention(
    q,
    kc,
    vc,
    sinks=s,
    is_causal=True,
    causal_alignment="bottom_right",
    key_value_seq_lengths=lens,
    implementation="reference",
    **kw,
  )
  _close(out, lse, dout, dlse, dtype)


def test_empty_rows_give_sink():
  q, kc, vc, sinks, _ = _inputs(2, 1, 64, 4, 2, 64, 64, jnp.float32)
  out, lse = sinkattn.decode_attention(q, kc, vc, jnp.zeros((2,), jnp.int32), sinks=sinks, return_residual=True)
  assert np.all(np.asarray(out) == 0)
  np.testing.assert_array_equal(np.asarray(lse)[:, 0, :], np.broadcast_to(np.asarray(sinks), (2, 4)))


def test_jit_and_vmap():
  q, kc, vc, sinks, lens = _inputs(2, 1, 600, 8, 2, 64, 64, jnp.bfloat16)
  f = jax.jit(lambda q, k, v, l, s: sinkattn.decode_attention(q, k, v, l, sinks=s, local_window_size=(127, 0)))
  ref = sinkattn.decode_attention(q, kc, vc, lens, sinks=sinks, local_window_size=(127, 0), implementation="reference")
  _close(f(q, kc, vc, lens, sinks), np.zeros(1), ref, np.zeros(1), jnp.bfloat16)
  # vmap over a leading axis of everything (two independent caches) and over q only
  qs, ks, vs, ls = (jnp.stack([x, x[::-1]]) for x in (q, kc, vc, lens))
  got = jax.vmap(lambda a, b, c, d: f(a, b, c, d, sinks))(qs, ks, vs, ls)
  for i in range(2):
    want = sinkattn.decode_attention(
      qs[i], ks[i], vs[i], ls[i], sinks=sinks, local_window_size=(127, 0), implementation="reference"
    )
    _close(got[i], np.zeros(1), want, np.zeros(1), jnp.bfloat16)
  got = jax.vmap(lambda a: f(a, kc, vc, lens, sinks))(jnp.stack([q, -q]))
  _close(
    got[1],
    np.zeros(1),
    sinkattn.decode_attention(-q, kc, vc, lens, sinks=sinks, local_window_size=(127, 0), implementation="reference"),
    np.zeros(1),
    jnp.bfloat16,
  )


def test_bad_inputs():
  q, kc, vc, sinks, lens = _inputs(2, 1, 32, 4, 2, 64, 64, jnp.float32)
  d = sinkattn.decode_attention
  with pytest.raises(ValueError, match="k_cache.*shape"):
    d(q, kc[..., :32], vc, lens)
  with pytest.raises(ValueError, match="v_cache.*shape"):
    d(q, kc, vc[:, :16], lens)
  with pytest.raises(ValueError, match="query.*rank 4"):
    d(q[0], kc, vc, lens)
  with pytest.raises(TypeError, match="v_cache: dtype"):
    d(q, kc, vc.astype(jnp.bfloat16), lens)
  with pytest.raises(ValueError, match="cache_lengths.*None"):
    d(q, kc, vc, None)
  with pytest.raises(ValueError, match=r"cache_lengths: expected shape \[B\]"):
    d(q, kc, vc, lens[:1])
  with pytest.raises(TypeError, match="cache_lengths: dtype"):
    d(q, kc, vc, lens.astype(jnp.float32))
  with pytest.raises(ValueError, match="T = 65"):
    d(jnp.zeros((2, 65, 4, 64)), kc, vc, lens)
  with pytest.raises(ValueError, match="local_window_size"):
    d(q, kc, vc, lens, local_window_size=(-1, 0))
  with pytest.raises(ValueError, match="sinks: expected shape"):
    d(q, kc, vc, lens, sinks=sinks[:3])
  with pytest.raises(ValueError, match="softmax_type"):
    d(q, kc, vc, lens, softmax_type="sparse")
  with pytest.raises(ValueError, match="implementation"):
    d(q, kc, vc, lens, implementation="triton")


@pytest.mark.gpu
@pytest.mark.skipif(not any(dv.platform == "gpu" for dv in jax.devices()), reason="no GPU visible to jax")
@pytest.mark.parametrize(
  "case",
  CASES
  + [
    (8, 1, 32768, 64, 8, 64, 64, jnp.bfloat16, "learnable", None),
    (2, 1, 4096, 64, 8, 64, 64, jnp.float16, "learnable", (127, 0)),
  ],
)
def test_cuda_matches_reference(case):
  """The default CUDA decode plan of each shape (every legal plan runs in the C test_cuda); the plan that ran is
  a CUDA decode plan when the library reports plans."""
  B, T, S, N, K, H, Hv, dtype, softmax, window = case
  with jax.default_device(jax.devices("gpu")[0]):
    q, kc, vc, sinks, lens = _inputs(B, T, S, N, K, H, Hv, dtype)
    s = sinks if softmax == "learnable" else None
    kw = dict(softmax_type=softmax, local_window_size=window, return_residual=True)
    out, lse = jax.jit(
      lambda q, k, v, l, s: sinkattn.decode_attention(q, k, v, l, sinks=s, implementation="fused", **kw)
    )(q, kc, vc, lens, s)
    jax.block_until_ready(out)
  plan = sinkattn.last_plan("decode")
  assert plan == "" or plan.startswith("cuda.decode."), plan
  with jax.default_device(jax.devices("cpu")[0]):
    cpu = [jax.device_put(x, jax.devices("cpu")[0]) for x in (q, kc, vc, lens)]
    rs = None if s is None else jax.device_put(s, jax.devices("cpu")[0])
    rout, rlse = sinkattn.decode_attention(*cpu, sinks=rs, implementation="reference", **kw)
  _close(out, lse, rout, rlse, dtype)


def _targets(f, *args):
  """The sinkattn FFI targets in the lowered HLO of jit(f)(*args)."""
  import re

  # the CUDA targets carry a platform suffix (sinkattn_decode_cuda): compare the names without it
  return {re.sub(r"_cuda$", "", t) for t in re.findall(r"sinkattn_\w+", jax.jit(f).lower(*args).as_text())}


def test_flax_kv_cache_calls_decode_for_short_steps():
  """linen and nnx MultiHeadAttention: a cached call of T <= 16 new tokens runs decode_attention, longer
  ones (prefill) and non-causal T > 1 calls dot_product_attention."""
  from flax import nnx

  from sinkattn.flax import MultiHeadAttention
  from sinkattn.nnx import MultiHeadAttention as NnxMHA

  # bf16 and head_dim 16: a shape the CUDA forward takes (f32 or head_dim 8 runs the jnp fallback on GPU, with
  # no sinkattn_fwd call to find)
  x = jnp.ones((2, 40, 16), jnp.bfloat16)
  for causal in (True, False):
    mha = MultiHeadAttention(
      num_heads=4,
      num_kv_heads=2,
      head_dim=16,
      softmax_type="learnable",
      is_causal=causal,
      decode=True,
      dtype=jnp.bfloat16,
    )
    v = mha.init(jax.random.key(0), x)
    step = lambda c, xt: mha.apply({"params": v["params"], "cache": c}, xt, mutable=["cache"])  # noqa: E731
    for t, want in (
      (1, "sinkattn_decode"),
      (16, "sinkattn_decode" if causal else "sinkattn_fwd"),
      (17, "sinkattn_fwd"),
    ):
      assert want in _targets(step, v["cache"], x[:, :t]), (causal, t)
      assert len(_targets(step, v["cache"], x[:, :t])) == 1

  m = NnxMHA(
    4, 16, num_kv_heads=2, head_dim=16, softmax_type="learnable", is_causal=True, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)
  )
  m.init_cache((2, 40, 16))
  graph, state = nnx.split(m)

  def nnx_step(state, xt):
    return nnx.merge(graph, state)(xt, decode=True)

  assert _targets(nnx_step, state, x[:, :1]) == {"sinkattn_decode"}
  assert _targets(nnx_step, state, x[:, :17]) == {"sinkattn_fwd"}


def test_the_query_limit_is_the_headers():
  """The decode limit is SA_DECODE_MAX_Q_LEN of include/sinkattn.h, which Python reads from the library; the jnp
  twin has no limit."""
  import os
  import re

  header = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "include", "sinkattn.h")
  with open(header) as f:
    limit = int(re.search(r"#define SA_DECODE_MAX_Q_LEN (\d+)", f.read()).group(1))
  assert _lib.decode_max_query_tokens() == limit
  q, kc, vc, sinks, lens = _inputs(2, limit + 1, 96, 4, 2, 16, 16, jnp.float32)
  with pytest.raises(ValueError, match=f"T = {limit + 1}"):
    sinkattn.decode_attention(q, kc, vc, lens, sinks=sinks)
  out = sinkattn.decode_attention(q, kc, vc, lens, sinks=sinks, implementation="reference")
  assert out.shape == q.shape
