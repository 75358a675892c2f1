"""ring_bench.py — context parallelism (sinkattn.ring_attention) on P devices against one device.

Two questions, forward+backward, learnable sinks, bf16 by default:
1. Scaling: at the same per-device length L, the ring over P devices does P times the attention work of
   one device at length L (global length P*L; zigzag keeps causal work balanced), so
       efficiency = P * t_one_device(L) / t_ring(P*L)      (1.0 = communication fully hidden)
2. Reach: the longest global sequence that fits, doubling L until the allocation fails, for the ring and
   for one device (the fused kernels need O(T) memory, so the ring reaches about P times further).

Timing: jitted fwd+bwd (value_and_grad), warm-up, then the median of --iters calls, each synchronised with
block_until_ready (one call is milliseconds to seconds here, so dispatch is noise). Inputs are created on
the devices, already sharded, so host transfers are not timed. Writes one JSON (git commit, devices,
versions, one row per L) into bench/results/.

usage (two GPUs):  PYTHONPATH=python python bench/ring_bench.py --devices 2
       (CPU smoke): XLA_FLAGS=--xla_force_host_platform_device_count=2 PYTHONPATH=python \
                    python bench/ring_bench.py --tiny --out /tmp/ring.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import sinkattn


def parse():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--devices", type=int, default=2, help="P, devices on the ring")
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--heads", type=int, default=64)
  p.add_argument("--kv-heads", type=int, default=8)
  p.add_argument("--head-dim", type=int, default=64)
  p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
  p.add_argument("--no-causal", action="store_true", help="full attention (default: causal, zigzag layout)")
  p.add_argument("--start", type=int, default=4096, help="first per-device length L (doubled each row)")
  p.add_argument("--max-len", type=int, default=1 << 22, help="stop doubling past this per-device length")
  p.add_argument("--iters", type=int, default=10)
  p.add_argument("--tiny", action="store_true", help="CPU smoke run: 2 rows of small sizes, 2 iterations")
  p.add_argument("--out", default=None, help="JSON path (default bench/results/ring_<platform>_P<P>.json)")
  a = p.parse_args()
  if a.tiny:
    a.batch, a.heads, a.kv_heads, a.head_dim, a.dtype = 1, 4, 2, 16, "float32"
    a.start, a.max_len, a.iters = 32, 64, 2
  return a


def is_oom(e):
  s = str(e)
  return "RESOURCE_EXHAUSTED" in s or "Out of memory" in s or "out of memory" in s


def timed(fn, args, iters):
  """Median seconds of one synchronised call (after one compile+warm-up call)."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def make_inputs(a, T, mesh, spec):
  """q, k, v, sinks created on the devices with sharding `spec` for q/k/v (sinks replicated)."""
  dtype = jnp.dtype(a.dtype)
  qkv = NamedSharding(mesh, spec)
  rep = NamedSharding(mesh, P())

  @jax.jit
  def gen(key):
    kq, kk, kv, ks = jax.random.split(key, 4)
    q = jax.random.normal(kq, (a.batch, T, a.heads, a.head_dim), dtype)
    k = jax.random.normal(kk, (a.batch, T, a.kv_heads, a.head_dim), dtype)
    v = jax.random.normal(kv, (a.batch, T, a.kv_heads, a.head_dim), dtype)
    s = jax.random.uniform(ks, (a.heads,), jnp.float32, -10, 10)
    return (
      jax.lax.with_sharding_constraint(q, qkv),
      jax.lax.with_sharding_constraint(k, qkv),
      jax.lax.with_sharding_constraint(v, qkv),
      jax.lax.with_sharding_constraint(s, rep),
    )

  return gen(jax.random.key(T))


def fwd_bwd(attn):
  def loss(q, k, v, s):
    return jnp.sum(attn(q, k, v, s).astype(jnp.float32))

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))


def one_device(a, L):
  dev = jax.devices()[:1]
  mesh = Mesh(np.array(dev), ("one",))
  args = make_inputs(a, L, mesh, P())
  fn = fwd_bwd(lambda q, k, v, s: sinkattn.dot_product_attention(q, k, v, sinks=s, is_causal=not a.no_causal))
  return timed(fn, args, a.iters)


def ring(a, L, layout):
  mesh = Mesh(np.array(jax.devices()[: a.devices]), ("sp",))
  args = make_inputs(a, a.devices * L, mesh, P(None, "sp"))  # inputs taken to be in `layout` order already
  fn = fwd_bwd(
    lambda q, k, v, s: sinkattn.ring_attention_sharded(
      q, k, v, sinks=s, mesh=mesh, axis_name="sp", layout=layout, is_causal=not a.no_causal
    )
  )
  return timed(fn, args, a.iters)


def tflops(a, T, seconds):
  pairs = T * T / (2 if not a.no_causal else 1)
  return 3.5 * 4.0 * a.batch * a.heads * pairs * a.head_dim / seconds / 1e12  # fwd + bwd = 3.5 x fwd


def git_commit():
  if os.environ.get("SINKATTN_COMMIT"):
    return os.environ["SINKATTN_COMMIT"]
  try:
    return subprocess.run(
      ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__))
    ).stdout.strip()
  except OSError:
    return None


def main():
  a = parse()
  if len(jax.devices()) < a.devices:
    sys.exit(
      f"ring_bench: {a.devices} devices asked, {len(jax.devices())} present "
      "(on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N)"
    )
  layout = "contiguous" if a.no_causal else "zigzag"
  rows, reach = [], {"ring_max_global_len": None, "one_device_max_len": None}
  L, one_ok = a.start, True
  while L <= a.max_len:
    row = {"per_device_len": L, "global_len": a.devices * L}
    if one_ok:
      try:
        row["one_device_s"] = one_device(a, L)
        row["one_device_tflops"] = tflops(a, L, row["one_device_s"])
        reach["one_device_max_len"] = L
      except Exception as e:  # noqa: BLE001 -- only an allocation failure ends the one-device column
        if not is_oom(e):
          raise
        one_ok = False
    try:
      row["ring_s"] = ring(a, L, layout)
    except Exception as e:  # noqa: BLE001
      if not is_oom(e):
        raise
      break
    row["ring_tflops_per_device"] = tflops(a, a.devices * L, row["ring_s"]) / a.devices
    if "one_device_s" in row:
      row["efficiency"] = a.devices * row["one_device_s"] / row["ring_s"]
    reach["ring_max_global_len"] = a.devices * L
    rows.append(row)
    print(json.dumps(row), flush=True)
    L *= 2
  result = {
    "bench": "ring_attention fwd+bwd vs one device",
    "commit": git_commit(),
    "platform": jax.devices()[0].platform,
    "device_kind": jax.devices()[0].device_kind,
    "devices": a.devices,
    "jax": jax.__version__,
    "sinkattn": sinkattn.__version__,
    "config": {
      "batch": a.batch,
      "heads": a.heads,
      "kv_heads": a.kv_heads,
      "head_dim": a.head_dim,
      "dtype": a.dtype,
      "causal": not a.no_causal,
      "layout": layout,
      "iters": a.iters,
    },
    "rows": rows,
    "reach": reach,
    "note": "reach stops at --max-len or the first failed allocation, whichever comes first",
  }
  out = a.out or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "results", f"ring_{result['platform']}_P{a.devices}.json"
  )
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    json.dump(result, f, indent=1)
  print("wrote", out)
  eff = [r["efficiency"] for r in rows if "efficiency" in r]
  print(
    "ring: P=%d, per-device length %s, %d iterations: efficiency %s"
    % (
      a.devices,
      ",".join(str(r["per_device_len"]) for r in rows),
      a.iters,
      "%.3f..%.3f" % (min(eff), max(eff)) if eff else "not measured (no one-device row)",
    )
  )


if __name__ == "__main__":
  main()
