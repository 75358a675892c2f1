"""The dense Hopper kernels through the JAX op, on a GPU: bf16, T = S >= 512 (multiples of 128, the sm_90a
kernels' scope), H 64 and 128, causal and not, GQA up to 8, windows (gpt-oss's (127, 0)), learnable sinks from
U(-10, 10) with heads 0 and 1 at +50 and -50; forward (out, lse) and the gradients of q, k, v and sinks against the
fp64 NumPy reference. On a compute capability 9.0 device each call must have run a Hopper plan (the plan's name,
the first word of the library's last-plan description, starts with "hopper."), read through sinkattn.last_plan;
without it the plan is not asserted. The other suites stay at T <= 24 in bf16 (f32 runs the jnp path on a GPU),
so these are the only pytest cases of the Hopper kernels."""

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
