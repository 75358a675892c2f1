"""Context parallelism (ring attention with sinks) on 8 virtual CPU devices, against the single-device fused
dot_product_attention: out, lse and every gradient (q, k, v, sinks, with a loss that also uses lse), with a
logits soft-cap too (each block caps its own logits; the merge is unchanged).

The device checks run in one subprocess (XLA's device count is fixed when jax starts, and other test
modules may have started it with one device); this module then asserts on its JSON report, one test
per case. The schedule and zigzag helpers are pure and tested in-process.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 2e-5  # float32 throughout; observed max errors are ~1e-6

# name: (P, layout, B, T, S, N, K, options); sinks U(-10, 10) with heads 0 and 1 at +50 and -50.
CASES = {
  "contig_causal_gqa": (4, "contiguous", 2, 32, 32, 4, 2, dict(is_causal=True)),
  "contig_full": (4, "contiguous", 2, 32, 32, 4, 4, dict()),
  "contig_window": (4, "contiguous", 1, 32, 32, 4, 1, dict(local_window_size=(3, 9))),
  "contig_causal_lengths": (
    4,
    "contiguous",
    2,
    32,
    32,
    4,
    2,
    dict(is_causal=True, query_seq_lengths=[27, 9], key_value_seq_lengths=[27, 9]),
  ),
  "contig_segments": (4, "contiguous", 2, 32, 32, 4, 2, dict(is_causal=True, segments=True)),
  "contig_bottom_right_cross": (
    4,
    "contiguous",
    2,
    16,
    32,
    4,
    2,
    dict(is_causal=True, causal_alignment="bottom_right"),
  ),
  "zigzag_causal": (4, "zigzag", 2, 32, 32, 4, 2, dict(is_causal=True)),
  "zigzag_causal_window": (4, "zigzag", 1, 32, 32, 4, 2, dict(is_causal=True, local_window_size=(5, 0))),
  "zigzag_lengths_off_by_one": (
    4,
    "zigzag",
    2,
    32,
    32,
    4,
    2,
    dict(is_causal=True, softmax_type="off_by_one", query_seq_lengths=[21, 32], key_value_seq_lengths=[21, 32]),
  ),
  "zigzag_vanilla_p8": (8, "zigzag", 1, 32, 32, 2, 1, dict(is_causal=True, softmax_type="vanilla")),
  "mesh2d_batch": (4, "contiguous", 2, 32, 32, 4, 2, dict(is_causal=True, mesh2d="batch")),
  "mesh2d_heads": (4, "zigzag", 1, 32, 32, 4, 2, dict(is_causal=True, mesh2d="heads")),
  "contig_causal_softcap": (4, "contiguous", 2, 32, 32, 4, 2, dict(is_causal=True, logits_soft_cap=1.5)),
  "zigzag_window_lengths_softcap": (
    4,
    "zigzag",
    2,
    32,
    32,
    4,
    2,
    dict(is_causal=True, local_window_size=(9, 0), key_value_seq_lengths=[29, 13], logits_soft_cap=2.0),
  ),
  "contig_full_softcap_p8": (8, "contiguous", 1, 32, 32, 4, 1, dict(logits_soft_cap=1.0)),
}


def _worker():
  import jax
  import jax.numpy as jnp
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  import sinkattn

  report = {}
  for name, (n_dev, layout, B, T, S, N, K, opts) in CASES.items():
    opts = dict(opts)
    mesh2d, segments = opts.pop("mesh2d", None), opts.pop("segments", False)
    rng = np.random.default_rng(len(report))
    f32 = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
    q, k, v = f32(B, T, N, 8), f32(B, S, K, 8), f32(B, S, K, 8)
    do, dl = f32(B, T, N, 8), f32(B, T, N)
    sinks = np.asarray(rng.uniform(-10, 10, N), np.float32)
    sinks[:2] = (50, -50)[:N]
    learnable = opts.get("softmax_type") is None
    sinks = jnp.asarray(sinks) if learnable else None
    for key in ("query_seq_lengths", "key_value_seq_lengths"):
      if key in opts:
        opts[key] = jnp.asarray(opts[key], jnp.int32)
    if segments:  # three packed documents, boundaries off the shard boundaries
      ids = jnp.asarray(np.repeat([[0, 1, 2]], B, 0).repeat([11, 13, 8], axis=1), jnp.int32)
      opts.update(query_segment_ids=ids, key_value_segment_ids=ids)

    def loss(out, lse):  # uses lse too (finite entries only: vanilla empty rows have lse = -inf)
      return jnp.sum(out * do) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0) * dl)

    def single(q, k, v, s):
      out, lse = sinkattn.dot_product_attention(q, k, v, sinks=s, return_residual=True, **opts)
      return loss(out, lse), (out, lse)

    if mesh2d:  # batch or heads split 2 ways on a second mesh axis
      mesh = Mesh(np.array(jax.devices()[: 2 * n_dev]).reshape(2, n_dev), ("x", "sp"))
      extra = dict(batch_axes="x") if mesh2d == "batch" else dict(head_axes="x")
    else:
      mesh = Mesh(np.array(jax.devices()[:n_dev]), ("sp",))
      extra = {}
    zz = (lambda x, axis=1: sinkattn.zigzag_shard(x, n_dev, axis)) if layout == "zigzag" else (lambda x, axis=1: x)
    unzz = (lambda x, axis=1: sinkattn.zigzag_unshard(x, n_dev, axis)) if layout == "zigzag" else (lambda x, axis=1: x)
    ring_opts = {kk: (zz(vv) if kk.endswith("segment_ids") else vv) for kk, vv in opts.items()}

    def ring(q, k, v, s):
      out, lse = sinkattn.ring_attention_sharded(
        zz(q),
        zz(k),
        zz(v),
        sinks=s,
        mesh=mesh,
        axis_name="sp",
        layout=layout,
        return_residual=True,
        **extra,
        **ring_opts,
      )
      out, lse = unzz(out), unzz(lse, 1)
      return loss(out, lse), (out, lse)

    argnums = (0, 1, 2, 3) if learnable else (0, 1, 2)
    (_, (o1, l1)), g1 = jax.value_and_grad(single, argnums, has_aux=True)(q, k, v, sinks)
    if "logits_soft_cap" in opts:  # the same call without the cap, to show that the cap bites
      uncapped = {kk: vv for kk, vv in opts.items() if kk != "logits_soft_cap"}
      o0 = sinkattn.dot_product_attention(q, k, v, sinks=sinks, **uncapped)
    (_, (o2, l2)), g2 = jax.jit(jax.value_and_grad(ring, argnums, has_aux=True))(q, k, v, sinks)
    same_inf = bool(jnp.all(jnp.isfinite(l1) == jnp.isfinite(l2)))
    err = lambda a, b: float(jnp.max(jnp.abs(jnp.where(jnp.isfinite(a), a - b, 0.0))))
    scale = lambda a: float(jnp.max(jnp.abs(a)))
    report[name] = dict(
      out=err(o1, o2),
      lse=err(l1, l2),
      same_inf=same_inf,
      grads={n: (err(a, b) / max(scale(a), 1.0)) for n, a, b in zip("qkvs", g1, g2)},
      dsinks_scale=scale(g1[3]) if learnable else None,
      cap_effect=err(o0, o2) if "logits_soft_cap" in opts else None,
    )

  # The compiled program moves K/V with collective-permute only: no all-gather / all-to-all.
  mesh = Mesh(np.array(jax.devices()[:4]), ("sp",))
  sh = NamedSharding(mesh, P(None, "sp"))
  x = jax.device_put(jnp.ones((1, 64, 4, 8), jnp.float32), sh)
  s = jnp.ones((4,), jnp.float32)

  def grads(q, k, v, s):
    f = lambda q, k, v, s: jnp.sum(
      sinkattn.ring_attention_sharded(q, k, v, sinks=s, mesh=mesh, axis_name="sp", layout="zigzag", is_causal=True) ** 2
    )
    return jax.grad(f, (0, 1, 2, 3))(q, k, v, s)

  hlo = jax.jit(grads).lower(x, x, x, s).compile().as_text()
  report["hlo"] = {op: hlo.count(op) for op in ("all-gather", "all-to-all", "collective-permute")}
  print(json.dumps(report))


@pytest.fixture(scope="module")
def report():
  from conftest import run_on_cpu_devices

  return run_on_cpu_devices(__file__)


@pytest.mark.parametrize("name", sorted(CASES))
def test_ring_matches_single_device(report, name):
  r = report[name]
  assert r["same_inf"]
  assert r["out"] < TOL and r["lse"] < TOL, r
  for g, e in r["grads"].items():
    assert e < TOL, (g, r)
  if r["dsinks_scale"] is not None:  # the sink gradient is really exercised, not ~0
    assert r["dsinks_scale"] > 1e-3, r
  if r["cap_effect"] is not None:  # the ring is far from the uncapped result: the cap reached every block
    assert r["cap_effect"] > 1e-2, r


def test_ring_moves_kv_with_collective_permute_only(report):
  h = report["hlo"]
  assert h["collective-permute"] > 0 and h["all-gather"] == 0 and h["all-to-all"] == 0, h


def test_zigzag_roundtrip_and_order():
  from sinkattn import zigzag_shard, zigzag_unshard

  x = np.arange(2 * 16).reshape(2, 16)
  z = np.asarray(zigzag_shard(x, 4, axis=1))
  # 8 chunks of 2; device r holds chunks r and 7 - r.
  assert z[0].tolist() == [0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9]
  assert np.array_equal(np.asarray(zigzag_unshard(z, 4, axis=1)), x)
  with pytest.raises(ValueError, match="divide"):
    zigzag_shard(np.zeros((1, 12)), 4)


def _ring_cfg(size, zigzag, causal=True, window=(-1, -1)):
  from sinkattn._ring import Ring

  return Ring("sp", size, zigzag, 2, causal, window[0], window[1], 0, 1.0, False)


def _work(cfg, t, rows, cols):
  """Kernel calls per device at ring step t, and the diag_offsets of the partial blocks."""
  from sinkattn._ring import schedule

  n_chunks = 2 if cfg.zigzag else 1
  calls, offsets = [0] * cfg.size, set()
  for cq in range(n_chunks):
    for ck in range(n_chunks):
      branches, index, _, _ = schedule(cfg, t, cq, ck, rows, cols)
      for r in range(cfg.size):
        kind, d = branches[index[r]]
        calls[r] += kind != "empty"
        if kind == "partial":
          offsets.add(d)
  return calls, offsets


def test_schedule_skips_masked_steps_and_balances_zigzag():
  # Contiguous causal, P = 4, 8 tokens per device: at step t devices r < t meet future keys only.
  cfg = _ring_cfg(4, False)
  for t in range(4):
    calls, offsets = _work(cfg, t, 8, 8)
    assert calls == [int(r >= t) for r in range(4)]
    assert offsets == ({0} if t == 0 else set())  # only the diagonal block needs the causal mask
  # Zigzag: every device makes the same number of kernel calls at every step.
  cfg = _ring_cfg(4, True)
  for t in range(4):
    calls, _ = _work(cfg, t, 4, 4)
    assert len(set(calls)) == 1, (t, calls)
  # A causal window of 5 over 8-token blocks reaches one block back: later steps are all skipped.
  cfg = _ring_cfg(4, False, window=(5, 0))
  assert _work(cfg, 1, 8, 8)[0] == [0, 1, 1, 1] and _work(cfg, 1, 8, 8)[1] == {8}
  assert _work(cfg, 2, 8, 8)[0] == [0, 0, 0, 0]


def test_block_classification():
  from sinkattn._ring import classify

  causal = _ring_cfg(2, False)
  assert classify(0, 4, 4, causal) == "partial"
  assert classify(3, 4, 4, causal) == "full"  # row 0 sees keys 0..3
  assert classify(2, 4, 4, causal) == "partial"
  assert classify(-4, 4, 4, causal) == "empty"  # row 3 sees key -1 at most
  assert classify(-3, 4, 4, causal) == "partial"  # row 3 sees key 0
  window = _ring_cfg(2, False, causal=False, window=(1, 1))
  assert classify(6, 4, 4, window) == "empty"  # row 0 sees keys 5..7
  assert classify(4, 4, 4, window) == "partial"  # row 0 sees key 3
  assert classify(0, 1, 1, window) == "full"


def test_ring_bench_runs_on_cpu(tmp_path):
  out = tmp_path / "ring.json"
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
  bench = os.path.join(ROOT, "bench", "ring_bench.py")
  proc = subprocess.run(
    [sys.executable, bench, "--tiny", "--out", str(out)], env=env, capture_output=True, text=True, timeout=600
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  result = json.loads(out.read_text())
  assert [r["per_device_len"] for r in result["rows"]] == [32, 64]
  assert result["devices"] == 2 and result["reach"]["ring_max_global_len"] == 128
  assert all(r["ring_s"] > 0 and r["efficiency"] > 0 for r in result["rows"])


if __name__ == "__main__":
  _worker()
