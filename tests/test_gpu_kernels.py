"""The dense Hopper kernels through the JAX op, on a GPU: bf16, T = S >= 512 (multiples of 128, the sm_90a
kernels' scope), H 64 and 128, causal and not, GQA up to 8, windows (gpt-oss's (127, 0)), learnable sinks from
U(-10, 10) with heads 0 and 1 at +50 and -50; forward (out, lse) and the gradients of q, k, v and sinks against the
fp64 NumPy reference. On a compute capability 9.0 device each call must have run a Hopper plan (the plan's name,
the first word of the library's last-plan description, starts with "hopper."), read through sinkattn.last_plan;
without it the plan is not asserted. Then calls with a bias, a mask array, positions or a soft-cap in the feature
plans' scope, routed by default (no fallback warning; hopper.fwd.features / hopper.bwd.twopass.features on CC 9.0),
against the same reference. The other suites stay at T <= 24 in bf16 (f32 runs the jnp path on a GPU), so these are
the only pytest cases of the Hopper kernels."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numpy_ref
import sinkattn
from conftest import GRAD_TOL, LSE_TOL, OUT_TOL, _gpu_devices, assert_close, bnt, f64, make_inputs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _gpu_devices(), reason="no GPU visible to jax")]

BF16 = np.dtype(jnp.bfloat16)
# (id, B, T, N, K, H, causal, window)
CASES = [
  ("h64_gqa2", 1, 512, 4, 2, 64, False, None),
  ("h128_causal", 1, 512, 4, 4, 128, True, None),
  ("h64_gqa8_causal_b2", 2, 512, 8, 1, 64, True, None),
  ("h128_gqa2_t1024", 1, 1024, 4, 2, 128, False, None),
  ("h64_gptoss_window", 1, 768, 16, 2, 64, True, (127, 0)),
  ("h128_window_64_0", 1, 640, 4, 2, 128, True, (64, 0)),
]


def _plan_ran(kind):
  """The name of the last plan of `kind` ('fwd' / 'bwd') the library ran in this process; None without
  sinkattn.last_plan (then the plan is not asserted)."""
  fn = getattr(sinkattn, "last_plan", None)
  desc = fn(kind) if fn is not None else ""
  return desc.split()[0] if desc else None


def _assert_hopper(kind):
  dev = jax.devices("gpu")[0]
  if getattr(dev, "compute_capability", None) != "9.0":
    return
  name = _plan_ran(kind)
  if name is not None:
    assert name.startswith("hopper."), f"{kind}: plan {name} ran, expected a Hopper plan (hopper.*)"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hopper_forward_and_gradients(case):
  _, B, T, N, K, H, causal, window = case
  with jax.default_device(jax.devices("gpu")[0]):
    q, k, v, sinks = make_inputs(100 + CASES.index(case), B=B, T=T, S=T, N=N, K=K, H=H, dtype=jnp.bfloat16)
    sinks = sinks.at[0].set(50.0).at[1].set(-50.0)
    dout = jnp.asarray(np.random.default_rng(3).standard_normal((B, T, N, H)), jnp.bfloat16)
    kw = dict(is_causal=causal, local_window_size=window)

    def f(q, k, v, s):
      return sinkattn.dot_product_attention(q, k, v, sinks=s, return_residual=True, **kw)

    (out, lse), vjp = jax.vjp(f, q, k, v, sinks)
    jax.block_until_ready(out)
    _assert_hopper("fwd")
    dq, dk, dv, ds = vjp((dout, jnp.zeros_like(lse)))
    jax.block_until_ready(dq)
    _assert_hopper("bwd")
  rk = dict(softmax=2, causal=1 if causal else 0, window=window or (-1, -1))
  out_r, lse_r = numpy_ref.forward(f64(q), f64(k), f64(v), f64(sinks), **rk)
  assert_close(out, out_r, OUT_TOL[BF16], "out")
  assert_close(bnt(lse), lse_r, LSE_TOL[BF16], "lse")
  g_r = numpy_ref.backward(f64(q), f64(k), f64(v), f64(sinks), f64(dout), **rk)
  for name, got, want in zip(("dq", "dk", "dv", "dsinks"), (dq, dk, dv, ds), g_r):
    assert_close(got, want, GRAD_TOL[BF16], name)


# (id, B, T, N, K, H, what): calls with a bias, a mask array, positions or a soft-cap, in the verified feature
# plans' scope (bf16, H 64 / 128, T and S multiples of 128)
FEATURES = [
  ("bias_1nts_h64", 1, 256, 4, 2, 64, "bias"),
  ("mask_b1ts_causal_content_h128", 2, 256, 4, 4, 128, "mask"),
  ("mask_b11s_key_padding_h64", 2, 256, 4, 2, 64, "padding"),
  ("positions_causal_gqa4_h64", 1, 384, 8, 2, 64, "positions"),
  ("soft_cap_causal_h128", 1, 256, 4, 2, 128, "cap"),
]


@pytest.mark.parametrize("case", FEATURES, ids=[c[0] for c in FEATURES])
def test_feature_calls_run_the_feature_kernels(case):
  """A call with a bias, a mask array, positions or a soft-cap runs the CUDA feature kernels by the default routing:
  no fallback warning, the plans hopper.fwd.features / hopper.bwd.twopass.features on a CC 9.0 device, and out,
  lse, dq, dk, dv, dsinks (and dbias) against the fp64 NumPy reference."""
  import warnings

  _, B, T, N, K, H, what = case
  rng = np.random.default_rng(7)
  with jax.default_device(jax.devices("gpu")[0]):
    q, k, v, sinks = make_inputs(200 + FEATURES.index(case), B=B, T=T, S=T, N=N, K=K, H=H, dtype=jnp.bfloat16)
    sinks = sinks.at[0].set(50.0).at[1].set(-50.0)
    dout = jnp.asarray(rng.standard_normal((B, T, N, H)), jnp.bfloat16)
    kw, rk, bias = {}, dict(softmax=2), None
    if what == "bias":
      bias = jnp.asarray(rng.uniform(-3, 3, (1, N, T, T)), jnp.bfloat16)
    elif what == "mask":
      m = np.tril(np.ones((T, T), bool))[None, None] & (rng.uniform(size=(B, 1, T, T)) < 0.9)
      m[:, :, 5, :] = False  # a row with no valid key
      kw["mask"], rk["attn_mask"] = jnp.asarray(m), m
    elif what == "padding":  # [B, 1, 1, S]: broadcast to [B, 1, T, S] for the kernels (primitives.py)
      m = (np.arange(T) < np.array([[T], [T - 77]]))[:, None, None, :]
      kw["mask"], rk["attn_mask"] = jnp.asarray(m), m
    elif what == "positions":
      pos = np.tile(np.arange(T, dtype=np.int32) * 2, (B, 1))
      kw.update(is_causal=True, query_positions=jnp.asarray(pos), key_value_positions=jnp.asarray(pos))
      rk.update(causal=1, q_pos=pos, kv_pos=pos)
    else:
      kw.update(is_causal=True, logits_soft_cap=20.0)
      rk.update(causal=1, logits_soft_cap=20.0)

    def f(q, k, v, s, b):
      return sinkattn.dot_product_attention(q, k, v, b, sinks=s, return_residual=True, **kw)

    with warnings.catch_warnings():
      warnings.simplefilter("error", RuntimeWarning)  # a fallback to the reference warns
      (out, lse), vjp = jax.vjp(f, q, k, v, sinks, bias)
      jax.block_until_ready(out)
      fwd_plan = _plan_ran("fwd")
      grads = vjp((dout, jnp.zeros_like(lse)))
      jax.block_until_ready(grads[0])
      bwd_plan = _plan_ran("bwd")
  if getattr(jax.devices("gpu")[0], "compute_capability", None) == "9.0" and fwd_plan is not None:
    assert (fwd_plan, bwd_plan) == ("hopper.fwd.features", "hopper.bwd.twopass.features"), (fwd_plan, bwd_plan)
  rk["bias"] = None if bias is None else f64(bias)
  out_r, lse_r = numpy_ref.forward(f64(q), f64(k), f64(v), f64(sinks), **rk)
  assert_close(out, out_r, OUT_TOL[BF16], "out")
  assert_close(bnt(lse), lse_r, LSE_TOL[BF16], "lse")
  g_r = numpy_ref.backward(f64(q), f64(k), f64(v), f64(sinks), f64(dout), **rk)
  for name, got, want in zip(("dq", "dk", "dv", "dsinks", "dbias"), grads, g_r):
    assert_close(got, want, GRAD_TOL[BF16], name)
