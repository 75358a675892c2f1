"""Shared pytest set-up: the `gpu` and `slow` markers, the platform fixture (the same suite runs on CPU and, when
present, on a GPU, where "fused" means the CUDA kernels), input builders and dtype tolerances."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))


def pytest_configure(config):
  config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped when jax sees none)")
  config.addinivalue_line("markers", "slow: left out of `make check` (the inner loop); `make test` runs it")


# The tests `make check` leaves out (-m "not slow"), by role; every test file keeps tests in the fast tier.
# An entry names a test function (all its cases) or one case of it, relative to tests/.
SLOW = {
  # several virtual devices: one subprocess per module, since XLA fixes its device count when it starts
  # (test_sharding.py's subprocess stays in the fast tier: it is that file's role)
  "test_ring.py::test_ring_matches_single_device",
  "test_ring.py::test_ring_moves_kv_with_collective_permute_only",
  "test_nnx.py::test_explicit_mesh_heads_split_over_4_devices",
  # end to end: trains or samples a model (test_demo.py's other tests stay)
  "test_demo.py::test_demo_trains_both_models_and_writes_plot",
  "test_demo.py::test_vanilla_demo_has_no_twin",
  "test_demo.py::test_generate_matches_argmax_of_full_forward",
  # runs a benchmark script end to end
  "test_ring.py::test_ring_bench_runs_on_cpu",
  "test_bench_harness.py::test_jax_bench_tiny_grid",
  # an exhaustive matrix (Transformer Engine's layouts x bias types x masks); the file's other tests stay
  "test_flax_compat.py::test_te_layouts_bias_types_and_masks",
  # the jnp reference's variant of a test whose fused variant stays
  "test_ops.py::test_vmap[cpu-reference]",
  "test_flax.py::test_mha_under_an_explicit_mesh[reference]",
  "test_bias_mask.py::test_bias_every_broadcast_form_vs_jax_nn[reference]",
  # mask kinds whose C twins (test_attn against the fp64 reference) cover the kernels; the fast tier keeps one
  # case per Python-side feature: sinks +-50, segments with lengths, empty rows, the window, GQA, Hv != H
  "test_grads.py::test_fused_grads_f32[cpu-vanilla]",
  "test_grads.py::test_fused_grads_f32[cpu-learnable]",
  "test_grads.py::test_fused_grads_f32[cpu-off_by_one]",
  "test_grads.py::test_fused_grads_f32[cpu-causal_bottom_right]",
  "test_grads.py::test_fused_grads_f32[cpu-lengths]",
  "test_grads.py::test_fused_grads_f32[cpu-lengths_vanilla_empty]",
  # sweeps whose cheapest case stays in the fast tier: finite differences of the reference (segments, causal
  # and lengths together stay), the decode kernels against the reference (case3 stays)
  "test_grads.py::test_reference_check_grads[learnable]",
  "test_grads.py::test_reference_check_grads[causal_bottom_right]",
  "test_grads.py::test_reference_check_grads[window_gptoss]",
  "test_grads.py::test_reference_check_grads[lengths_vanilla_empty]",
  "test_decode.py::test_fused_matches_reference[case0]",
  "test_decode.py::test_fused_matches_reference[case1]",
  "test_decode.py::test_fused_matches_reference[case2]",
}


def pytest_collection_modifyitems(config, items):
  """Marks SLOW's tests, and refuses an entry that names nothing (a renamed test would otherwise join the fast
  tier silently): a function its module does not define or, when whole files were collected, a case no
  collected test has."""
  modules, used = {}, set()
  for item in items:
    rel = os.path.relpath(str(item.path), os.path.dirname(os.path.abspath(__file__)))
    modules[rel] = item.module
    key = f"{rel}::{item.name}"
    for entry in (key, key.split("[")[0]):
      if entry in SLOW:
        item.add_marker(pytest.mark.slow)
        used.add(entry)
  whole_files = not any("::" in str(a) for a in config.args)
  for entry in sorted(SLOW):
    rel, name = entry.split("::")
    if rel in modules and (not hasattr(modules[rel], name.split("[")[0]) or (whole_files and entry not in used)):
      raise pytest.UsageError(f"tests/conftest.py SLOW names {entry}, which no test of {rel} is")


def _gpu_devices():
  try:
    return jax.devices("gpu")
  except RuntimeError:
    return []


PLATFORMS = [
  "cpu",
  pytest.param("gpu", marks=[pytest.mark.gpu, pytest.mark.skipif(not _gpu_devices(), reason="no GPU visible to jax")]),
]


@pytest.fixture
def on_cpu():
  """Runs the test body with jax's default device on the CPU: for comparisons with jax.nn / Flax at float32,
  whose products run in TF32 on a GPU."""
  with jax.default_device(jax.devices("cpu")[0]):
    yield


@pytest.fixture(params=PLATFORMS)
def platform(request):
  """Runs the test body with jax's default device on the platform; yields its name."""
  with jax.default_device(jax.devices(request.param)[0]):
    yield request.param


# Error budget of one comparison against the fp64 NumPy reference, relative to the largest reference
# magnitude (at least 1). Output: one rounding to the dtype (eps/2: f16 4.9e-4, bf16 3.9e-3) plus the
# rounding of q, k, v products accumulated in fp32 over S <= 128 keys, x4 margin. Gradients see two
# more roundings (out and dout in the dtype) and sums over T*G rows, hence the larger factors.
OUT_TOL = {np.dtype(np.float32): 2e-5, np.dtype(jnp.float16): 2e-3, np.dtype(jnp.bfloat16): 1.6e-2}
GRAD_TOL = {np.dtype(np.float32): 1e-4, np.dtype(jnp.float16): 1e-2, np.dtype(jnp.bfloat16): 6e-2}
LSE_TOL = {np.dtype(np.float32): 2e-5, np.dtype(jnp.float16): 2e-4, np.dtype(jnp.bfloat16): 2e-4}


def bnt(lse):
  """A public lse [B,T,N] (jax.nn's residual layout) in the C API's and numpy_ref's [B,N,T]."""
  return None if lse is None else jnp.swapaxes(lse, -1, -2)


def f64(x):
  return None if x is None else np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def assert_close(got, want, tol, what):
  got, want = f64(got), np.asarray(want, np.float64)
  assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
  assert not np.any(np.isnan(got)), f"{what}: NaN in result"
  fin = np.isfinite(want)
  assert np.array_equal(np.isfinite(got), fin), f"{what}: non-finite entries differ"
  assert np.array_equal(got[~fin], want[~fin]), f"{what}: infinities differ"
  scale = max(1.0, float(np.max(np.abs(want[fin]), initial=0.0)))
  err = float(np.max(np.abs(got[fin] - want[fin]), initial=0.0))
  assert err <= tol * scale, f"{what}: max abs error {err:.3g} > {tol:.3g} x {scale:.3g}"


def make_inputs(seed, B=2, T=16, S=16, N=4, K=2, H=16, Hv=None, dtype=jnp.float32, sink_range=10.0):
  """q, k, v in dtype from N(0, 1) (k scaled by 2 so softmax rows are peaked, not flat) and fp32 sinks
  from U(-sink_range, sink_range): a wrong or missing sink moves the output by O(1)."""
  rng = np.random.default_rng(seed)
  Hv = H if Hv is None else Hv
  q = jnp.asarray(rng.standard_normal((B, T, N, H)), dtype)
  k = jnp.asarray(2.0 * rng.standard_normal((B, S, K, H)), dtype)
  v = jnp.asarray(rng.standard_normal((B, S, K, Hv)), dtype)
  sinks = jnp.asarray(rng.uniform(-sink_range, sink_range, N), jnp.float32)
  return q, k, v, sinks


def run_on_cpu_devices(script, n=8, timeout=900):
  """Runs a test module as a script on n virtual CPU devices and returns the JSON report it prints last.
  XLA fixes its device count when it starts, so the sharded tests run in a subprocess: that keeps them
  right whichever test module the pytest process imported first, and on a GPU machine too."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}").strip()
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.path.join(root, "python") + os.pathsep + env.get("PYTHONPATH", "")
  proc = subprocess.run(
    [sys.executable, os.path.abspath(script)], env=env, capture_output=True, text=True, timeout=timeout
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])
