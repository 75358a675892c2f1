"""Sharded dot_product_attention (batch and heads over a Mesh) on 8 virtual CPU devices: results equal to
the unsharded run (out, lse, dq, dk, dv, dsinks, dbias) and the compiled program never gathers or shuffles
q/k/v. A bias / mask follows q on its full batch and head dims; dbias is summed over the mesh axes of the dims
it is broadcast over.

The device checks run in one subprocess (XLA's device count is fixed when jax starts, and other test
modules may have started it with one device); this module asserts on its JSON report, one test per case.
"""

import json

import numpy as np
import pytest

TOL = 1e-5  # float32; the per-shard kernel does the same arithmetic as the unsharded one
MOVES = ("all-gather", "all-to-all", "collective-permute")

# name: (mesh shape, mesh axes, batch axes, head axes, B, N, K, options)
CASES = {
  "data8": ((8,), ("data",), "data", None, 8, 8, 2, dict(is_causal=True)),
  "data2_model4": ((2, 4), ("data", "model"), "data", "model", 4, 8, 4, dict(local_window_size=(6, 2))),
  "fsdp4_tp2": ((4, 2), ("fsdp", "tp"), "fsdp", "tp", 4, 8, 2, dict(is_causal=True, lengths=True)),
  "fsdp_tp_both_batch": ((4, 2), ("fsdp", "tp"), ("fsdp", "tp"), None, 8, 4, 2, dict(is_causal=True)),
  "mqa_tp4": ((2, 4), ("data", "model"), "data", "model", 4, 8, 1, dict(is_causal=True)),
  "gqa_tp4_k2": ((2, 4), ("data", "model"), "data", "model", 4, 8, 2, dict(segments=True)),
  # bias / mask shapes by the dims they keep: b = batch, n = heads ("" = both broadcast)
  "bias_bn_mask_b": ((2, 4), ("data", "model"), "data", "model", 4, 8, 4, dict(is_causal=True, bias="bn", mask="b")),
  "bias_shared_mask_n": ((4, 2), ("fsdp", "tp"), "fsdp", "tp", 4, 8, 2, dict(bias="", mask="n", lengths=True)),
  "bias_n_mqa_positions": ((2, 4), ("data", "model"), "data", "model", 4, 8, 1, dict(bias="n", positions=True)),
}


def _worker():
  import jax
  import jax.numpy as jnp
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  import sinkattn
  from sinkattn import primitives
  from sinkattn._inputs import Inputs

  report = {}
  T, H = 16, 8
  for i, (name, (shape, axes, b_ax, h_ax, B, N, K, opts)) in enumerate(CASES.items()):
    opts = dict(opts)
    rng = np.random.default_rng(i)
    f32 = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)
    q, k, v, do, dl = f32(B, T, N, H), f32(B, T, K, H), f32(B, T, K, H), f32(B, T, N, H), f32(B, T, N)
    sinks = np.asarray(rng.uniform(-10, 10, N), np.float32)
    sinks[:2] = (50, -50)
    sinks = jnp.asarray(sinks)
    extra = {}
    if opts.pop("lengths", False):
      lens = jnp.asarray(rng.integers(0, T + 1, B), jnp.int32)
      extra.update(query_seq_lengths=lens, key_value_seq_lengths=lens)
    if opts.pop("segments", False):
      ids = jnp.asarray(np.sort(rng.integers(0, 3, (B, T)), axis=1), jnp.int32)
      extra.update(query_segment_ids=ids, key_value_segment_ids=ids)
    keeps = lambda tag: (B if "b" in tag else 1, N if "n" in tag else 1, T, T)
    bias_tag, mask_tag = opts.pop("bias", None), opts.pop("mask", None)
    bias = None if bias_tag is None else f32(*keeps(bias_tag))
    if mask_tag is not None:
      extra["mask"] = jnp.asarray(rng.random(keeps(mask_tag)) < 0.8).at[..., 0].set(True)
    if opts.pop("positions", False):
      pos = jnp.asarray(np.sort(rng.integers(0, 2 * T, (B, T)), axis=1), jnp.int32)
      extra.update(query_positions=pos, key_value_positions=pos)
      opts["is_causal"] = True

    def run(q, k, v, s, b, do, dl, extra):
      f = lambda q, k, v, s, b: sinkattn.dot_product_attention(
        q, k, v, sinks=s, bias=b, return_residual=True, **extra, **opts
      )
      (out, lse), vjp = jax.vjp(f, q, k, v, s, b)
      return tuple(x for x in (out, lse) + vjp((do, dl)) if x is not None)

    mesh = Mesh(np.array(jax.devices()).reshape(shape), axes)
    m = int(np.prod([mesh.shape[a] for a in ((h_ax,) if h_ax else ())]))
    kv_h = h_ax if K % m == 0 else None
    put = lambda x, *spec: jax.device_put(x, NamedSharding(mesh, P(*spec)))
    # a bias / mask is sharded like q on the dims it keeps
    bn = lambda x: (b_ax if x.shape[0] == B else None, h_ax if x.shape[1] == N else None, None, None)
    args = (
      put(q, b_ax, None, h_ax, None),
      put(k, b_ax, None, kv_h, None),
      put(v, b_ax, None, kv_h, None),
      put(sinks, h_ax),
      None if bias is None else put(bias, *bn(bias)),
      put(do, b_ax, None, h_ax, None),
      put(dl, b_ax, None, h_ax),
      {n: put(x, *bn(x)) if n == "mask" else put(x, b_ax, *([None] * (x.ndim - 1))) for n, x in extra.items()},
    )
    want = jax.jit(run)(q, k, v, sinks, bias, do, dl, extra)
    fn = jax.jit(run)
    got = fn(*args)
    hlo = fn.lower(*args).compile().as_text()
    names = ("out", "lse", "dq", "dk", "dv", "dsinks", "dbias")
    report[name] = dict(
      err={n: float(jnp.max(jnp.abs(a - b))) for n, a, b in zip(names, want, got)},
      dsinks_scale=float(jnp.max(jnp.abs(want[5]))),
      moves={op: hlo.count(op) for op in MOVES},
      out_batch_axes=got[0].sharding.spec[0],
    )
    # The same under an Explicit mesh (jax.sharding.set_mesh): partitioning.py plans when tracing and runs
    # shard_map; results are typed sharded (custom_partitioning typed them replicated: XLA gathered them,
    # and custom_vjp rejected the gradients' types).
    explicit = jax.sharding.AxisType.Explicit
    emesh = Mesh(np.array(jax.devices()).reshape(shape), axes, axis_types=(explicit,) * len(axes))
    try:  # an error here is reported by test_explicit_mesh, not by every test of this module
      with jax.sharding.set_mesh(emesh):
        eargs = jax.tree.map(lambda x: jax.device_put(x, NamedSharding(emesh, x.sharding.spec)), args)
        efn = jax.jit(run)
        egot, eager = efn(*eargs), run(*eargs)
        ehlo = efn.lower(*eargs).compile().as_text()
      err = lambda got: {n: float(jnp.max(jnp.abs(a - b))) for n, a, b in zip(names, want, got)}
      report[name + "/explicit"] = dict(
        err=err(egot),
        err_eager=err(eager),
        moves={op: ehlo.count(op) for op in MOVES},
        types=[str(jax.typeof(x).sharding.spec) for x in egot],
        want_types=[str(x.sharding.spec) for x in eargs[:5] if x is not None],
      )
    except Exception as e:  # noqa: BLE001
      report[name + "/explicit"] = dict(error=repr(e)[:2000])
    if name == "data2_model4":  # control: the bare FFI call is opaque to XLA, which gathers q/k/v
      bare = lambda q, k, v, s: primitives.attn_fwd(
        Inputs(q, k, v, s),
        softmax=2,
        causal=1,
        window_left=-1,
        window_right=-1,
        diag_offset=0,
        scale=0.3,
      )
      hlo = jax.jit(bare).lower(*args[:4]).compile().as_text()
      report["control_bare_ffi"] = {op: hlo.count(op) for op in MOVES}
  # dot_product_attention inside shard_map, differentiated outside it: q heads split over 'd' with one kv
  # head replicated (MQA tensor parallelism by hand), so dk, dv and dsinks are partial sums per device.
  mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
  rng = np.random.default_rng(99)
  f32 = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)
  q, k, v, do, dl = f32(2, T, 8, H), f32(2, T, 1, H), f32(2, T, 1, H), f32(2, T, 8, H), f32(2, T, 8)
  sinks = jnp.asarray(rng.uniform(-10, 10, 8), jnp.float32)
  attn = lambda q, k, v, s: sinkattn.dot_product_attention(q, k, v, sinks=s, is_causal=True, return_residual=True)
  manual = jax.shard_map(
    attn, mesh=mesh, in_specs=(P(None, None, "d"), P(), P(), P("d")), out_specs=(P(None, None, "d"), P(None, None, "d"))
  )
  loss = lambda f: lambda *a: jnp.sum(f(*a)[0] * do) + jnp.sum(f(*a)[1] * dl)
  want = jax.grad(loss(attn), (0, 1, 2, 3))(q, k, v, sinks)
  got = jax.jit(jax.grad(loss(manual), (0, 1, 2, 3)))(q, k, v, sinks)
  report["inside_shard_map"] = {n: float(jnp.max(jnp.abs(a - b))) for n, a, b in zip("qkvs", want, got)}
  print(json.dumps(report))


@pytest.fixture(scope="module")
def report():
  from conftest import run_on_cpu_devices

  return run_on_cpu_devices(__file__)


def _case(report, key):
  r = report[key]
  if "skipped" in r:
    pytest.skip(r["skipped"])
  return r


@pytest.mark.parametrize("name", sorted(CASES))
def test_sharded_equals_unsharded(report, name):
  r = _case(report, name)
  for n, e in r["err"].items():
    assert e < TOL, (n, r)
  assert r["dsinks_scale"] > 1e-3, r  # dsinks is exercised (a missing batch psum would show)


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_gather_of_qkv(report, name):
  r = _case(report, name)
  assert all(c == 0 for c in r["moves"].values()), r
  b_ax = CASES[name][2]
  assert r["out_batch_axes"] == (b_ax if isinstance(b_ax, str) else list(b_ax)), r  # out stays sharded


@pytest.mark.parametrize("name", sorted(CASES))
def test_explicit_mesh(report, name):
  """Under an Explicit mesh: the same numbers, no gather or shuffle, and out/lse/dq/dk/dv/dsinks typed
  like the sharded operands (dq like q, ... dsinks like sinks, dbias like bias; out like q)."""
  r = _case(report, name + "/explicit")
  assert "error" not in r, r["error"]
  for n, e in list(r["err"].items()) + list(r["err_eager"].items()):
    assert e < TOL, (n, r)
  assert all(c == 0 for c in r["moves"].values()), r
  assert r["types"][2:] == r["want_types"], r
  assert r["types"][0] == r["want_types"][0], r


def test_control_bare_ffi_call_is_gathered(report):
  # Without partitioning.py XLA all-gathers the operands of the opaque call: the check above can fail.
  assert report["control_bare_ffi"]["all-gather"] > 0, report["control_bare_ffi"]


def test_inside_shard_map_gradients(report):
  # FFI results are typed like their inputs and partial gradients are summed (custom_vjp accepts them).
  for n, e in report["inside_shard_map"].items():
    assert e < TOL, (n, report["inside_shard_map"])


if __name__ == "__main__":
  _worker()
