"""ring_reach.py — the longest sequence ring attention fits in, on one device and on P devices (issue #7).

Shape: gpt-oss attention (B = 1, N/K = 64/8 heads, H = 64, bf16, learnable sinks), causal, zigzag layout,
sinkattn.ring_attention_sharded on a mesh over the first P devices (P = 1 is the same code on one device).

Fit criterion: the compiler's own accounting. The fused kernels need O(T) memory, so the bytes a device
needs double with each doubling of T while the attention time quadruples: at the gpt-oss shape a 1M-token
forward+backward is minutes on an H200 and the next doubling 4x that, so running every length until the
allocation fails (as ring_bench.py's reach column does) would cost hours of GPU time. Compiling costs the
same at every length, so step 1 compiles (never runs) the forward and the forward+backward of each doubled
length from ShapeDtypeStruct inputs (nothing allocated) and reads compiled.memory_analysis(): argument +
output + temp - alias bytes, per device (the program is the per-device SPMD partition; the CUDA backward's
workspace is an XLA result, so it is counted). The first length whose bytes exceed the device's memory
ends the doubling (for the forward+backward, and one or two doublings later for the forward alone); the
length before it "fits by the compiler's accounting".

Step 2 checks that claim where the time budget allows: it runs the forward once and the forward+backward
once at each length from --start upward, through the largest fitting one, skipping a run whose predicted
time (4x the previous length's: attention is O(T^2)) exceeds what is left of the budget (shared equally
between the device counts). Each run is synchronised with block_until_ready; the peak comes from
memory_stats() where the backend has it (GPU). memory_stats()'s peak is a process-wide high-water mark
that cannot be reset, so it is recorded only from a device whose mark this run raised (then it is this
run's peak, resident inputs included, comparable to the compiled bytes); P = 1 runs first, on device 0,
so the ring's runs meet fresh marks on devices 1..P-1. An allocation failure is recorded and ends that
device count's ladder (so does any other error, recorded as such: one GPU call must not lose the rest).

JAX's GPU allocator stops at XLA_PYTHON_CLIENT_MEM_FRACTION of the memory (0.75 by default, preallocated
or not); this script sets 0.95 unless the environment says otherwise, and fits against the allocator's
bytes_limit, which is what a run can actually get.

usage (two GPUs):  PYTHONPATH=python python bench/ring_reach.py --out bench/results/h200x2-reach.json
       (CPU smoke): XLA_FLAGS=--xla_force_host_platform_device_count=2 python bench/ring_reach.py \
                    --devices 2 --start 1024 --max-len 8192 --mem-gib 1 --time-budget 60 --out /tmp/reach.json
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")  # before jax starts a GPU client

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

try:
  import sinkattn
except ImportError:  # run from a checkout without PYTHONPATH=python
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
  import sinkattn

B, N, K, H = 1, 64, 8, 64  # gpt-oss: 64 query heads share 8 kv heads, head_dim 64
DTYPE = jnp.bfloat16


def parse():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--devices", type=int, default=None, help="P for the ring (default: all visible devices)")
  p.add_argument("--start", type=int, default=1 << 16, help="first global sequence length (doubled)")
  p.add_argument("--max-len", type=int, default=1 << 26, help="stop doubling past this global length")
  p.add_argument(
    "--mem-gib",
    type=float,
    default=None,
    help="device memory, GiB (needed where memory_stats() has no bytes_limit, e.g. CPU; "
    "given, it overrides bytes_limit)",
  )
  p.add_argument("--time-budget", type=float, default=240, help="seconds for the runs of step 2")
  p.add_argument("--out", default=None, help="JSON path (default bench/results/reach_<platform>_P<P>.json)")
  return p.parse_args()


def is_oom(e):
  s = str(e)
  return "RESOURCE_EXHAUSTED" in s or "out of memory" in s.lower()


def git_commit():
  if os.environ.get("SINKATTN_COMMIT"):
    return os.environ["SINKATTN_COMMIT"]
  try:
    return (
      subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__))
      ).stdout.strip()
      or None
    )
  except OSError:
    return None


def shardings(mesh):
  return NamedSharding(mesh, P(None, "sp")), NamedSharding(mesh, P())  # q/k/v split on T; sinks replicated


def functions(mesh):
  """Jitted forward and forward+backward (value_and_grad w.r.t. q, k, v, sinks) of the ring."""

  def attn(q, k, v, s):
    return sinkattn.ring_attention_sharded(q, k, v, sinks=s, mesh=mesh, axis_name="sp", layout="zigzag", is_causal=True)

  def loss(q, k, v, s):
    return jnp.sum(attn(q, k, v, s).astype(jnp.float32))

  return jax.jit(attn), jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))


def specs(mesh, T):
  seq, rep = shardings(mesh)
  return (
    jax.ShapeDtypeStruct((B, T, N, H), DTYPE, sharding=seq),
    jax.ShapeDtypeStruct((B, T, K, H), DTYPE, sharding=seq),
    jax.ShapeDtypeStruct((B, T, K, H), DTYPE, sharding=seq),
    jax.ShapeDtypeStruct((N,), jnp.float32, sharding=rep),
  )


def inputs(mesh, T):
  """Random q, k, v, sinks created on the devices, already sharded like specs() says."""
  seq, rep = shardings(mesh)

  def gen(key):
    kq, kk, kv, ks = jax.random.split(key, 4)
    return (
      jax.random.normal(kq, (B, T, N, H), DTYPE),
      jax.random.normal(kk, (B, T, K, H), DTYPE),
      jax.random.normal(kv, (B, T, K, H), DTYPE),
      jax.random.uniform(ks, (N,), jnp.float32, -10, 10),
    )

  return jax.jit(gen, out_shardings=(seq, seq, seq, rep))(jax.random.key(T))


def memory(compiled):
  m = compiled.memory_analysis()
  d = dict(
    argument=m.argument_size_in_bytes,
    output=m.output_size_in_bytes,
    temp=m.temp_size_in_bytes,
    alias=m.alias_size_in_bytes,
  )
  d["total"] = d["argument"] + d["output"] + d["temp"] - d["alias"]
  return d


def peaks(devs):
  return [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in devs]


def run_once(compiled, args, devs):
  """(seconds, peak bytes of this run or None): one synchronised call of an already compiled function."""
  before = peaks(devs)
  t0 = time.perf_counter()
  jax.block_until_ready(compiled(*args))
  seconds = time.perf_counter() - t0
  raised = [a for a, b in zip(peaks(devs), before) if a is not None and (b is None or a > b)]
  return seconds, max(raised) if raised else None


def tflops(T, seconds, fb):
  flops = 2 * 2 * B * N * T * T * H / 2  # causal: half of the T x T pairs
  return (3.5 if fb else 1.0) * flops / seconds / 1e12


def compile_ladder(nd, a, limit):
  """Step 1: rows for the doubled lengths, with per-device compiled bytes; stops after the first
  length whose forward does not fit (the forward+backward stops fitting first) or at --max-len.
  Returns the rows, the compiled (fwd, f+b) of each length whose f+b fits, and the mesh."""
  mesh = Mesh(np.array(jax.devices()[:nd]), ("sp",))
  fwd, fb = functions(mesh)
  rows, compiled, T = [], {}, a.start
  while T <= a.max_len:
    t0 = time.perf_counter()
    try:
      cf, cb = fwd.lower(*specs(mesh, T)).compile(), fb.lower(*specs(mesh, T)).compile()
    except Exception as e:  # noqa: BLE001 -- kept as a result: one device call must not lose the others
      rows.append(
        dict(
          devices=nd,
          global_len=T,
          per_device_len=T // nd,
          fits_fwd=False,
          fits_fb=False,
          ran=False,
          error=f"compile: {type(e).__name__}: {str(e).splitlines()[0][:300]}",
        )
      )
      print(f"P={nd} T={T:>9}  {rows[-1]['error']}", flush=True)
      break
    row = dict(
      devices=nd,
      global_len=T,
      per_device_len=T // nd,
      fwd_bytes=memory(cf),
      fb_bytes=memory(cb),
      compile_s=round(time.perf_counter() - t0, 2),
    )
    row["fits_fwd"], row["fits_fb"] = row["fwd_bytes"]["total"] <= limit, row["fb_bytes"]["total"] <= limit
    row["ran"] = False
    rows.append(row)
    print(
      f"P={nd} T={T:>9}  compiled bytes/device: fwd {row['fwd_bytes']['total'] / 2**30:7.2f} GiB  "
      f"f+b {row['fb_bytes']['total'] / 2**30:7.2f} GiB  fits f+b: {row['fits_fb']}",
      flush=True,
    )
    if not row["fits_fwd"]:
      break
    if row["fits_fb"]:
      compiled[T] = (cf, cb)
    T *= 2
  return rows, compiled, mesh


def run_ladder(rows, compiled, mesh, budget):
  """Step 2: runs fwd then f+b once per fitting length, ascending, while the budget allows."""
  devs, t_start, last = list(mesh.devices.flat), time.perf_counter(), None
  for row in rows:
    T = row["global_len"]
    if T not in compiled:
      break
    left = budget - (time.perf_counter() - t_start)
    if last is not None and 4 * last > left:  # attention time grows ~4x per doubling
      row["skipped"] = f"predicted {4 * last:.0f} s > {left:.0f} s left"
      print(f"P={row['devices']} T={T:>9}  skipped: {row['skipped']}", flush=True)
      break
    t0 = time.perf_counter()
    try:
      args = inputs(mesh, T)
      row["fwd_s"], row["fwd_peak_bytes"] = run_once(compiled[T][0], args, devs)
      row["fb_s"], row["fb_peak_bytes"] = run_once(compiled[T][1], args, devs)
    except Exception as e:  # noqa: BLE001 -- an allocation failure is a result; so is any other (recorded)
      row["oom" if is_oom(e) else "error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
      print(f"P={row['devices']} T={T:>9}  failed: {row.get('oom') or row['error']}", flush=True)
      break
    finally:
      args = None
    row["ran"] = True
    row["fwd_tflops"], row["fb_tflops"] = tflops(T, row["fwd_s"], False), tflops(T, row["fb_s"], True)
    last = time.perf_counter() - t0
    peak = "-" if row["fb_peak_bytes"] is None else f"{row['fb_peak_bytes'] / 2**30:.2f} GiB"
    print(
      f"P={row['devices']} T={T:>9}  fwd {row['fwd_s']:8.3f} s {row['fwd_tflops']:7.2f} TFLOP/s  "
      f"f+b {row['fb_s']:8.3f} s {row['fb_tflops']:7.2f} TFLOP/s  peak f+b {peak}",
      flush=True,
    )


def main():
  a = parse()
  ndev = a.devices or len(jax.devices())
  if len(jax.devices()) < ndev:
    sys.exit(
      f"ring_reach: {ndev} devices asked, {len(jax.devices())} present "
      "(on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N)"
    )
  if a.start % (2 * ndev):
    sys.exit(f"ring_reach: --start {a.start} must divide by 2 * P = {2 * ndev} (zigzag: 2 chunks per device)")
  stats = jax.devices()[0].memory_stats() or {}
  if a.mem_gib is not None:
    limit, source = int(a.mem_gib * 2**30), "--mem-gib"
  elif stats.get("bytes_limit"):
    limit, source = stats["bytes_limit"], "memory_stats bytes_limit"
  else:
    sys.exit("ring_reach: this backend reports no bytes_limit; give --mem-gib")
  print(f"{jax.devices()[0].device_kind}: fitting against {limit / 2**30:.2f} GiB per device ({source})")

  counts = sorted({1, ndev})  # P = 1 first: its peaks stay readable (see the docstring)
  ladders = [compile_ladder(nd, a, limit) for nd in counts]
  t_phase2 = time.perf_counter()
  for i, (rows, compiled, mesh) in enumerate(ladders):
    left = a.time_budget - (time.perf_counter() - t_phase2)
    run_ladder(rows, compiled, mesh, left / (len(ladders) - i))

  summary = {}
  for nd, (rows, _, _) in zip(counts, ladders):
    fit = [r["global_len"] for r in rows if r["fits_fb"]]
    fit_fwd = [r["global_len"] for r in rows if r["fits_fwd"]]
    ran = [r["global_len"] for r in rows if r["ran"]]
    summary[f"P{nd}"] = dict(
      longest_fits_fb_compiler=max(fit, default=None),
      longest_fits_fwd_compiler=max(fit_fwd, default=None),
      longest_run_fb=max(ran, default=None),
      stopped_by="memory" if rows and not rows[-1]["fits_fwd"] else "--max-len",
    )
  result = dict(
    bench="ring_attention reach: longest sequence that fits (compiler accounting) and runs",
    commit=git_commit(),
    date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    platform=jax.devices()[0].platform,
    device_kind=jax.devices()[0].device_kind,
    devices=ndev,
    jax=jax.__version__,
    jaxlib=jaxlib.__version__,
    sinkattn=sinkattn.__version__,
    mem_limit_bytes=limit,
    mem_limit_source=source,
    xla_mem_fraction=os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
    config=dict(
      batch=B,
      heads=N,
      kv_heads=K,
      head_dim=H,
      dtype="bfloat16",
      softmax="learnable",
      causal=True,
      layout="zigzag",
      start=a.start,
      max_len=a.max_len,
      time_budget_s=a.time_budget,
    ),
    rows=[r for rows, _, _ in ladders for r in rows],
    summary=summary,
    note="bytes are per device: argument + output + temp - alias of the compiled program; tflops count all "
    "devices together (causal fwd = 2*B*N*T^2*H, f+b = 3.5x); peak_bytes is memory_stats()' "
    "peak_bytes_in_use where this run raised it (None: not raised, or no memory_stats)",
  )
  out = a.out or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "results", f"reach_{result['platform']}_P{ndev}.json"
  )
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    json.dump(result, f, indent=1)
  print(json.dumps(summary))
  print("wrote", out)


if __name__ == "__main__":
  main()
