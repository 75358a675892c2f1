"""bench/jax_bench.py (`make bench`): fused sink attention vs the jnp alternatives on the current device.

Columns (ms and TFLOP/s, forward and forward+backward): the fused kernel, sinkattn's pure-jnp reference,
"jnp sinks" (what a JAX user writes today: fp32 logits, a sink column concatenated, softmax, column
dropped) and, on GPU, jax.nn.dot_product_attention(implementation='cudnn') without sinks. Each row then
prints the fused kernel's speed-up over the jnp sink attention, the reference and (GPU) cuDNN.
FLOPs follow the FlashAttention convention: forward 2*B*N*P*(H + Hv) for P valid (query, key) pairs
(4*B*N*T*S*H dense, half of it causal, in-window pairs only for a window), forward+backward 3.5x.
Timing: `--inner` calls chained inside one jitted lax.fori_loop (each call depends on the previous one, so
XLA cannot hoist it; `--loop`: see bench/jax_timing.py), median of `--repeats` x `--rounds` (each round
times every contender in turn: a clock drift reaches them alike); dispatch is amortised. The library reads
its SINKATTN_* switches once per process, so an A/B of two switch settings is two runs of this program, or
bench/cpu_ab.py on the CPU. Memory: the temp
bytes XLA reserves for the jitted forward+backward (compiled.memory_analysis()), which shows the fused path
linear in T and the jnp paths quadratic. A progress bar (tqdm, on a terminal) shows the ETA, the work
weighted by each row's FLOPs. Results go to `--out` (a JSON file, or a directory for the default name
<platform>-jax-<time>.json; default: the current directory) with the git commit, the device and the
jax/jaxlib versions.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
from jax_timing import compile_loop, time_loop

import sinkattn

# (B, T=S, N, K, H, causal, window): the performance grid on GPU; a 2-core-sized one on CPU.
# fmt: off
GRIDS = {
    "h200": [(16, 1024, 32, 32, 64, False, None), (16, 1024, 32, 32, 64, True, None),
             (4, 4096, 32, 32, 64, False, None), (4, 4096, 32, 32, 64, True, None),
             (1, 16384, 32, 32, 64, False, None), (1, 16384, 32, 32, 64, True, None),
             (16, 1024, 16, 16, 128, False, None), (16, 1024, 16, 16, 128, True, None),
             (4, 4096, 16, 16, 128, False, None), (4, 4096, 16, 16, 128, True, None),
             (1, 16384, 16, 16, 128, False, None), (1, 16384, 16, 16, 128, True, None),
             (1, 4096, 64, 8, 64, True, None), (1, 4096, 64, 8, 64, True, (127, 0))],
    "cpu": [(1, 512, 8, 8, 128, False, None), (1, 1024, 8, 8, 128, False, None),
            (1, 2048, 8, 8, 128, False, None), (1, 2048, 8, 8, 128, True, None),
            (1, 2048, 64, 8, 64, True, (127, 0))],
    # the other softmax types, on the rows the targets name (H=128 T=4096) and the gpt-oss layers
    "h200_types": [(4, 4096, 16, 16, 128, False, None), (4, 4096, 16, 16, 128, True, None),
                   (1, 4096, 64, 8, 64, True, None), (1, 4096, 64, 8, 64, True, (127, 0))],
    # the rows the issues' targets name: H128 T4096 (causal and not), H128 T16384 (600 TFLOP/s forward), H64,
    # the gpt-oss layers
    "h200_targets": [(4, 4096, 16, 16, 128, False, None), (4, 4096, 16, 16, 128, True, None),
                     (1, 16384, 16, 16, 128, False, None), (4, 4096, 32, 32, 64, True, None),
                     (16, 1024, 32, 32, 64, True, None), (1, 4096, 64, 8, 64, True, None),
                     (1, 4096, 64, 8, 64, True, (127, 0))],
    # gpt-oss (B1, N64 / K8, H64): causal prefill at 2k, 8k, 32k tokens and the window-128 layer at 32k, the rows of
    # cuDNN 9.27's published H200 figures (bench/kernel_bench.py's ANCHORS)
    "h200_gptoss": [(1, 2048, 64, 8, 64, True, None), (1, 8192, 64, 8, 64, True, None),
                    (1, 32768, 64, 8, 64, True, None), (1, 32768, 64, 8, 64, True, (127, 0))],
    # the H64 rows of h200 (an A/B of an H64-only kernel change)
    "h200_h64": [(16, 1024, 32, 32, 64, False, None), (16, 1024, 32, 32, 64, True, None),
                 (4, 4096, 32, 32, 64, False, None), (4, 4096, 32, 32, 64, True, None),
                 (1, 16384, 32, 32, 64, True, None),
                 (1, 4096, 64, 8, 64, True, None), (1, 4096, 64, 8, 64, True, (127, 0))],
    # the gpt-oss layers alone
    "gptoss": [(1, 4096, 64, 8, 64, True, None), (1, 4096, 64, 8, 64, True, (127, 0))],
    "tiny": [(1, 128, 4, 2, 64, False, None), (1, 256, 4, 2, 64, True, (31, 0))],
}
# fmt: on


def jnp_sinks(q, k, v, sinks, causal, window):
  """The unfused baseline: [B,N,T,S+1] fp32 logits with the sink as an extra column."""
  B, T, N, H = q.shape
  S, K = k.shape[1], k.shape[2]
  kk = jnp.repeat(k, N // K, axis=2).astype(jnp.float32)
  vv = jnp.repeat(v, N // K, axis=2).astype(jnp.float32)
  s = jnp.einsum("btnh,bsnh->bnts", q.astype(jnp.float32), kk) / np.sqrt(H)
  i, j = jnp.arange(T)[:, None], jnp.arange(S)[None, :]
  ok = jnp.ones((T, S), bool)
  if causal:
    ok &= j <= i
  if window is not None:
    ok &= (j >= i - window[0]) & (j <= i + window[1])
  s = jnp.where(ok, s, -1e30)
  col = jnp.broadcast_to(sinks.astype(jnp.float32)[None, :, None, None], (B, N, T, 1))
  p = jax.nn.softmax(jnp.concatenate([s, col], axis=-1), axis=-1)[..., :S]
  return jnp.einsum("bnts,bsnd->btnd", p, vv).astype(q.dtype)


def contenders(platform, softmax_type):
  learn = softmax_type == "learnable"

  def sink_fn(impl):
    def f(q, k, v, s, causal, window):
      return sinkattn.dot_product_attention(
        q,
        k,
        v,
        sinks=s if learn else None,
        softmax_type=softmax_type,
        is_causal=causal,
        local_window_size=window,
        implementation=impl,
      )

    return f

  out = {"fused": sink_fn("fused"), "reference": sink_fn("reference"), "jnp_sinks": jnp_sinks}
  if platform == "gpu":

    def cudnn(q, k, v, s, causal, window):
      return jax.nn.dot_product_attention(q, k, v, is_causal=causal, local_window_size=window, implementation="cudnn")

    out["cudnn_no_sink"] = cudnn
  return out


def flops(B, T, N, H, causal, window):
  """4 B N H times the (query, key) pairs a mask keeps, T = S: row i keeps keys lo_i..hi_i (O(T), so 32k rows
  need no T x T mask)."""
  i = np.arange(T, dtype=np.int64)
  lo, hi = np.zeros(T, np.int64), np.full(T, T - 1, np.int64)
  if causal:
    hi = np.minimum(hi, i)
  if window is not None:
    lo, hi = np.maximum(lo, i - window[0]), np.minimum(hi, i + window[1])
  return 2.0 * B * N * float(np.maximum(hi - lo + 1, 0).sum()) * (H + H)


def _git_commit():
  if os.environ.get("SINKATTN_COMMIT"):  # set by bench/gpu_verify.sh's caller: the device's tree copy has no .git
    return os.environ["SINKATTN_COMMIT"]
  try:
    return subprocess.run(
      ["git", "rev-parse", "HEAD"],
      capture_output=True,
      text=True,
      cwd=os.path.dirname(os.path.abspath(__file__)),
      check=True,
    ).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def _jaxlib_version():
  import jaxlib

  return getattr(jaxlib, "__version__", "unknown")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--grid", choices=sorted(GRIDS), help="default: h200 on GPU, cpu on CPU")
  p.add_argument("--softmax", default="learnable", help="comma list of vanilla, off_by_one, learnable")
  p.add_argument("--dtypes", default=None, help="comma list (default: bfloat16 on GPU, float32 on CPU)")
  p.add_argument("--contenders", default=None, help="comma list (default: all for the platform)")
  p.add_argument("--inner", type=int, default=None, help="calls per timed loop (default 20 GPU, 1 CPU)")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument(
    "--rounds",
    type=int,
    default=1,
    help="rounds per row: each times every contender `--repeats` times in turn (the order rotating by "
    "one a round), so a drift of the clocks reaches all alike; the row's figure is the median over all",
  )
  p.add_argument(
    "--loop",
    choices=("barrier", "sum"),
    default="barrier",
    help="how calls are chained and their results consumed (see bench/jax_timing.py); the same for every contender",
  )
  p.add_argument(
    "--max-ref-t",
    type=int,
    default=None,
    help="skip the jnp contenders above this T (they need O(T*S) memory; default 4096 on CPU, 16384 on GPU)",
  )
  p.add_argument(
    "--out",
    default=None,
    help="JSON file, or a directory for <platform>-jax-<time>.json there (default: the current directory)",
  )
  p.add_argument("--no-progress", action="store_true", help="no progress bar (default: one on a terminal)")
  a = p.parse_args(argv)
  platform = jax.default_backend()
  grid = GRIDS[a.grid or ("h200" if platform == "gpu" else "cpu")]
  dtypes = (a.dtypes or ("bfloat16" if platform == "gpu" else "float32")).split(",")
  inner = a.inner or (20 if platform == "gpu" else 1)
  max_ref_t = a.max_ref_t or (16384 if platform == "gpu" else 4096)
  device = str(jax.devices()[0].device_kind)
  print(
    f"# sinkattn bench on {platform} ({device}), jax {jax.__version__}, "
    f"CPU SIMD {sinkattn.simd_name()} x{sinkattn.get_num_threads()} threads"
  )
  rows = []
  stamp = datetime.datetime.now(datetime.timezone.utc)
  meta = dict(
    commit=_git_commit(),
    time=stamp.isoformat(),
    platform=platform,
    device=device,
    jax=jax.__version__,
    jaxlib=_jaxlib_version(),
    cpu_simd=sinkattn.simd_name(),
    cpu_threads=sinkattn.get_num_threads(),
    inner=inner,
    repeats=a.repeats,
    loop=a.loop,
    rounds=a.rounds,
    flop_convention="fwd 2*B*N*pairs*(H+Hv); fwd+bwd 3.5x fwd",
  )
  path = a.out or os.curdir
  if os.path.isdir(path) or path.endswith(os.sep):
    path = os.path.join(path, f"{platform}-jax-{stamp.strftime('%Y%m%d-%H%M%S')}.json")
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

  def save():  # after every row: a run cut short by a time limit keeps what it measured
    with open(path, "w") as fh:
      json.dump(dict(meta=meta, rows=rows), fh, indent=1)

  from tqdm import tqdm

  sets = {}
  for st in a.softmax.split(","):
    cons = contenders(platform, st)
    if a.contenders:
      cons = {k: v for k, v in cons.items() if k in a.contenders.split(",")}
    sets[st] = cons
  jobs = [(st, dt, row) for st in sets for dt in dtypes for row in grid]

  def names_of(st, T):
    return [n for n in sets[st] if n == "fused" or T <= max_ref_t]

  # ETA: each contender of a row costs in proportion to the row's FLOPs, half compiling, half timing
  work = sum(flops(B, T, N, H, c, w) * len(names_of(st, T)) for st, _, (B, T, N, K, H, c, w) in jobs)
  bar = tqdm(
    total=work,
    disable=True if a.no_progress else None,
    dynamic_ncols=True,
    bar_format="{desc} {percentage:3.0f}%|{bar}| {elapsed} elapsed, ETA {remaining}",
  )
  say = tqdm.write
  say(
    "%-34s %-14s %-10s %9s %8s %9s %8s %10s"
    % ("shape", "contender", "dtype", "fwd ms", "fwd TF/s", "f+b ms", "f+b TF/s", "f+b tempMB")
  )
  for st, dt, (B, T, N, K, H, causal, window) in jobs:
    cons = sets[st]
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((B, T, N, H)), dt)
    k = jnp.asarray(rng.standard_normal((B, T, K, H)), dt)
    v = jnp.asarray(rng.standard_normal((B, T, K, H)), dt)
    s = jnp.asarray(rng.uniform(-3, 3, N), jnp.float32)
    dout = jnp.asarray(rng.standard_normal((B, T, N, H)), dt)
    args = (q, k, v, s, dout)
    fl = flops(B, T, N, H, causal, window)
    shape = f"B{B} T{T} N{N}/{K} H{H}{' causal' if causal else ''}{' w' + str(window) if window else ''}"
    names = names_of(st, T)
    loops, samples = {}, {n: ([], []) for n in names}
    for name in names:  # compiled (and warmed up) once
      bar.set_description_str(f"{shape} {st} {dt}: compiling {name}")
      f = lambda q, k, v, s, fn=cons[name]: fn(q, k, v, s, causal, window)
      loops[name] = (compile_loop(f, args, inner, False, a.loop), compile_loop(f, args, inner, True, a.loop))
      bar.update(fl / 2)
    bar.set_description_str(f"{shape} {st} {dt}: timing")
    for rnd in range(a.rounds):
      # the order rotates by one a round: a contender timed right after another can read several percent
      # slow or fast with the same code (on the H200, a second fused contender, always after cuDNN, read 5%
      # slower than fused at H128 T4096 with identical kernels), so over len(names) rounds each takes every
      # position
      k = rnd % len(names)
      for name in names[k:] + names[:k]:
        samples[name][0].extend(time_loop(loops[name][0][0], args, inner, a.repeats))
        samples[name][1].extend(time_loop(loops[name][1][0], args, inner, a.repeats))
      bar.update(fl / 2 * len(names) / a.rounds)
    for name in names:
      fwd_ms, fb_ms = statistics.median(samples[name][0]), statistics.median(samples[name][1])
      temp = loops[name][1][1]
      row = dict(
        B=B,
        T=T,
        S=T,
        N=N,
        K=K,
        H=H,
        causal=causal,
        window=window,
        softmax=st,
        dtype=dt,
        contender=name,
        fwd_ms=fwd_ms,
        fwd_tflops=fl / fwd_ms * 1e-9,
        fwdbwd_ms=fb_ms,
        fwdbwd_tflops=3.5 * fl / fb_ms * 1e-9,
        fwdbwd_temp_bytes=temp,
        fwd_ms_samples=samples[name][0],
        fwdbwd_ms_samples=samples[name][1],
      )
      rows.append(row)
      save()
      say(
        "%-34s %-14s %-10s %9.2f %8.3f %9.2f %8.3f %10s"
        % (
          shape,
          name,
          dt,
          fwd_ms,
          row["fwd_tflops"],
          fb_ms,
          row["fwdbwd_tflops"],
          "-" if temp is None else "%.1f" % (temp / 2**20),
        )
      )
    del loops
    base = {r["contender"]: r for r in rows[-len(names) :]}
    for other in ("jnp_sinks", "reference", "cudnn_no_sink"):
      if "fused" in base and other in base:
        say(
          "%-34s fused vs %s: fwd %.3fx, fwd+bwd %.3fx"
          % (
            "",
            other,
            base[other]["fwd_ms"] / base["fused"]["fwd_ms"],
            base[other]["fwdbwd_ms"] / base["fused"]["fwdbwd_ms"],
          )
        )
  bar.close()
  save()
  print(f"# wrote {path}")


if __name__ == "__main__":
  main()
