"""CPU benchmark that names the limit (`make bench-cpu`). Larger than 400 lines: the peaks, the contenders
(the default plans, the tile and vector plans forced, PyTorch), the checks and the report of one run read best
together.

Measures this machine's limits in the same run (fp32 FMA peak, AMX bf16 tile peak when the CPU and OS have
it, memory read bandwidth; before and after the grid), then times sinkattn's CPU backend (learnable sinks)
for bf16 and f32: forward, forward+backward and decode, under the default plans (what a user gets), the AMX tile
plans forced (bf16, where the CPU and OS have AMX) and the vector plans of the CPU's level forced, and PyTorch's
CPU scaled_dot_product_attention on the same values when torch is importable. PyTorch has no sinks: it is timed
vanilla, in its own [B, N, T, H] layout, with the same threads. Contenders alternate within each round (the
order rotating); the figures are medians over rounds, each round the median of a few calls; ratios are taken
round by round. A forced plan that is the default is timed once.

    python bench/cpu_bench.py [--out results.json] [--lib build/libsinkattn_cpubench.so] [--threads N]
                              [--rounds 5] [--quick] [--no-torch] [--only fwd|fwd+bwd|decode]

FLOPs: forward 4 B N T S H (x 0.5 causal), forward+backward 3.5 x that; decode bytes: the K and V caches.
Before timing, each contender's output is checked against the fp64 reference on a cropped copy of the shape
(T, S <= 256; decode B = 1, S = 4096). Results (JSON) are stamped with the commit, the CPU model, the compiler
and the versions of Python, numpy, torch and jax.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
F32, F16, BF16 = 0, 1, 2
FWD, FWDBWD, DECODE = 0, 1, 2
KIND_NAMES = {FWD: "fwd", FWDBWD: "fwd+bwd", DECODE: "decode"}


class Problem(ctypes.Structure):
  """bench/cpu_bench_lib.c's sab_problem."""

  _fields_ = [(n, ctypes.c_int64) for n in ("dtype", "B", "T", "S", "N", "K", "H", "causal", "window_left")] + [
    (n, ctypes.c_void_p) for n in ("q", "k", "v", "out", "dout", "dq", "dk", "dv", "lse", "sinks", "dsinks")
  ]


def load_lib(path):
  if path is None:
    found = sorted(glob.glob(os.path.join(REPO, "build*", "libsinkattn_cpubench.so")))
    if not found:
      sys.exit("cpu_bench: no build*/libsinkattn_cpubench.so: build first (make build, or cmake --build build)")
    path = found[0]
  lib = ctypes.CDLL(path)
  lib.sab_fma_peak.restype = ctypes.c_double
  lib.sab_fma_peak.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
  lib.sab_amx_peak.restype = ctypes.c_double
  lib.sab_amx_peak.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
  lib.sab_read_bw.restype = ctypes.c_double
  lib.sab_read_bw.argtypes = [ctypes.c_int, ctypes.c_double, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
  lib.sab_time.restype = ctypes.c_double
  lib.sab_time.argtypes = [
    ctypes.POINTER(Problem),
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.POINTER(ctypes.c_int),
    ctypes.c_char_p,
    ctypes.POINTER(ctypes.c_double),
  ]
  lib.sab_check.restype = ctypes.c_double
  lib.sab_check.argtypes = [ctypes.POINTER(Problem), ctypes.c_int, ctypes.c_void_p]
  lib.sab_info.restype = ctypes.c_char_p
  return lib, path


def to_dtype(x, dt):
  """float32 array -> the dtype's storage (bf16 as round-to-nearest-even uint16)."""
  if dt == F32:
    return np.ascontiguousarray(x, np.float32)
  if dt == F16:
    return np.ascontiguousarray(x.astype(np.float16))
  u = np.ascontiguousarray(x, np.float32).view(np.uint32)
  return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


class Case:
  """One shape's buffers in sinkattn's layout ([B, T, N, H] and [B, S, K, H]) and its sab_problem."""

  def __init__(self, dt, B, T, S, N, K, H, causal, rng, grads=True):
    self.dt, self.B, self.T, self.S, self.N, self.K, self.H, self.causal = dt, B, T, S, N, K, H, causal
    f = lambda *shape: to_dtype(rng.random(shape, dtype=np.float32) * 2 - 1, dt)
    self.q, self.k, self.v, self.dout = f(B, T, N, H), f(B, S, K, H), f(B, S, K, H), f(B, T, N, H)
    self.out = np.zeros_like(self.q)
    g = (lambda a: np.zeros_like(a)) if grads else (lambda a: np.zeros(1, a.dtype))  # decode has no gradients
    self.dq, self.dk, self.dv = g(self.q), g(self.k), g(self.v)
    self.lse = np.zeros((B, N, T), np.float32)
    self.sinks = rng.uniform(-3, 3, N).astype(np.float32)
    self.dsinks = np.zeros(N, np.float32)
    p = lambda a: a.ctypes.data
    self.prob = Problem(
      dt,
      B,
      T,
      S,
      N,
      K,
      H,
      causal,
      -1,
      p(self.q),
      p(self.k),
      p(self.v),
      p(self.out),
      p(self.dout),
      p(self.dq),
      p(self.dk),
      p(self.dv),
      p(self.lse),
      p(self.sinks),
      p(self.dsinks),
    )


def flops(c, kind):
  f = 4.0 * c.B * c.N * c.T * c.S * c.H * (0.5 if c.causal == 1 else 1.0)
  return 3.5 * f if kind == FWDBWD else f


def cache_bytes(c):
  return 2.0 * c.k.nbytes


class TorchSdpa:
  """PyTorch's CPU SDPA on the case's values, in [B, N, T, H], vanilla softmax (it has no sinks)."""

  def __init__(self, torch, c, kind, threads):
    self.torch, self.kind = torch, kind
    torch.set_num_threads(threads)
    tdt = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}[c.dt]

    def t(a):
      x = torch.from_numpy(a.view(np.int16) if c.dt == BF16 else a)
      return (x.view(torch.bfloat16) if c.dt == BF16 else x).to(tdt).transpose(1, 2).contiguous()

    self.q, self.k, self.v, self.dout = t(c.q), t(c.k), t(c.v), t(c.dout)
    self.causal = c.causal == 1
    self.gqa = c.N != c.K
    self.kw = {}
    if kind == DECODE and c.T == 1:  # one token: a kv head's G query heads are G rows against its K and V
      self.q = self.q.reshape(c.B, c.K, c.N // c.K, c.H)
      self.gqa, self.gqa_mode = False, "G query heads as rows"
      return
    try:  # enable_gqa reads each kv head once; without it (torch < 2.5) K and V are expanded once, up front
      torch.nn.functional.scaled_dot_product_attention(
        self.q[:, :, :1], self.k[:, :, :1], self.v[:, :, :1], enable_gqa=self.gqa
      )
      self.kw = {"enable_gqa": self.gqa}
      self.gqa_mode = "enable_gqa" if self.gqa else "none"
    except TypeError:
      if self.gqa:
        self.k = self.k.repeat_interleave(c.N // c.K, dim=1)
        self.v = self.v.repeat_interleave(c.N // c.K, dim=1)
      self.gqa_mode = "expanded K/V" if self.gqa else "none"
    if kind == FWDBWD:
      for x in (self.q, self.k, self.v):
        x.requires_grad_(True)

  def call(self):
    F = self.torch.nn.functional.scaled_dot_product_attention
    if self.kind == FWDBWD:
      for x in (self.q, self.k, self.v):
        x.grad = None
      F(self.q, self.k, self.v, is_causal=self.causal, **self.kw).backward(self.dout)
    else:
      with self.torch.no_grad():
        F(self.q, self.k, self.v, is_causal=self.causal, **self.kw)

  def time(self, calls):
    self.call()
    ts = []
    for _ in range(calls):
      t0 = time.perf_counter()
      self.call()
      ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


AMX_PLANS = ("cpu.fwd.amx", "cpu.bwd.amx", "cpu.decode.amx")  # the tile kernels (docs/cpu.md)


def vector_plans(build, dt):
  """The vector plans of the library's SIMD level (forward, backward, decode) for dtype dt."""
  simd = build["simd"]
  if simd != "avx512":
    dec = "cpu.decode.portable"
  else:
    dec = "cpu.decode.avx512bf16" if dt == BF16 and build["avx512_bf16"] else "cpu.decode.avx512"
  return (f"cpu.fwd.{simd}", f"cpu.bwd.{simd}", dec)


def forced(lib, force, fn):
  """fn() with plans force (forward, backward, decode names; None: the defaults) forced for this thread."""
  if force is None:
    return fn()
  for which, name in enumerate(force):
    lib.sa_plan_force(which, name.encode())
  try:
    return fn()
  finally:
    for which in range(len(force)):
      lib.sa_plan_force(which, None)


def sinkattn_time(lib, c, kind, calls, threads, force=None):
  """(median wall seconds, median CPU seconds / threads, the plan's description) of calls calls; force: (fwd plan,
  bwd plan, decode plan) names forced for this thread's calls (sa_plan_force, kinds 0, 1, 2), None for the default
  plans."""
  st, plan, cpu = ctypes.c_int(0), ctypes.create_string_buffer(256), ctypes.c_double(0)
  t = forced(
    lib,
    force,
    lambda: lib.sab_time(ctypes.byref(c.prob), kind, calls, threads, ctypes.byref(st), plan, ctypes.byref(cpu)),
  )
  if t < 0:
    raise RuntimeError(f"sinkattn {KIND_NAMES[kind]} failed with status {st.value}")
  return t, cpu.value, plan.value.decode()


def check(lib, dt, B, T, S, N, K, H, causal, kind, rng, force=None):
  """sinkattn's output under plans force (None: the defaults) against the fp64 reference on a cropped copy of the
  shape: max |err| / max |ref|, -1 when the call fails."""
  c = Case(dt, B, T, S, N, K, H, causal, rng, grads=False)
  ref = np.zeros_like(c.out)
  return forced(
    lib, force, lambda: lib.sab_check(ctypes.byref(c.prob), DECODE if kind == DECODE else FWD, ref.ctypes.data)
  )


def machine_stamp(lib, threads, torch):
  def first(cmd):
    try:
      return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
      return "unknown"

  info = {}
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        k, _, v = line.partition(":")
        if k.strip() in ("model name", "cpu family", "model", "stepping") and k.strip() not in info:
          info[k.strip()] = v.strip()
  except OSError:
    pass
  model = (
    f"{info.get('model name', 'unknown')} (family {info.get('cpu family', '?')}, model {info.get('model', '?')}, "
    f"stepping {info.get('stepping', '?')})"
  )
  return {
    "benchmark": "bench/cpu_bench.py",
    "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
    "git_commit": first(["git", "rev-parse", "--short", "HEAD"]),
    "git_dirty": bool(first(["git", "status", "--porcelain", "--untracked-files=no"])),
    "cpu": model,
    "cores_online": os.cpu_count(),
    "threads": threads,
    "build": json.loads(lib.sab_info()),
    "python": platform.python_version(),
    "numpy": np.__version__,
    "torch": torch.__version__ if torch else None,
    "torch_cpu_capability": torch.backends.cpu.get_cpu_capability() if torch else None,
    "jax": package_version("jax"),
    "jaxlib": package_version("jaxlib"),
    "loadavg_start": os.getloadavg(),
  }


def package_version(name):
  """The installed distribution's version without importing it (None when absent)."""
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


def measure_peaks(lib, threads, read_bytes):
  """Each by wall clock and per CPU second x threads (what the cores do while they run: the machine's load
  from other processes does not dilute it)."""
  per_cpu, fma_cpu = ctypes.c_double(0), ctypes.c_double(0)
  read = lib.sab_read_bw(threads, read_bytes, 5, ctypes.byref(per_cpu))
  return {
    "fma_gflops": lib.sab_fma_peak(threads, 5, ctypes.byref(fma_cpu)),
    "fma_gflops_cpu_time": fma_cpu.value,
    "amx_gflops": lib.sab_amx_peak(threads, 5, 0),
    "amx_gflops_with_loads": lib.sab_amx_peak(threads, 5, 1),
    "read_gbps": read,
    "read_gbps_cpu_time": per_cpu.value,
  }


def grid(quick):
  """(dtype, B, T, S, N, K, H, causal, kinds) rows; causal 1 = top-left (T == S), 2 = bottom-right."""
  rows = []
  for dt in (BF16, F32):
    rows.append((dt, 1, 2048, 2048, 8, 8, 128, 0, (FWD, FWDBWD)))
    if not quick:
      rows.append((dt, 1, 2048, 2048, 8, 8, 128, 1, (FWD, FWDBWD)))
      rows.append((dt, 1, 4096, 4096, 64, 8, 64, 1, (FWD, FWDBWD)))
    for B in (1,) if quick else (1, 8):
      rows.append((dt, B, 1, 32768, 64, 8, 64, 2, (DECODE,)))
  return rows


def row_name(dt, B, T, S, N, K, H, causal):
  d = {F32: "f32", F16: "f16", BF16: "bf16"}[dt]
  if T == 1:
    return f"{d} B{B} S{S} N{N}/{K} H{H}"
  return f"{d} B{B} T{T} N{N}/{K} H{H}{' causal' if causal else ''}"


def contenders_of(lib, build, c, kind, threads):
  """({name: (forced plans or None, the plan that runs)}, {name: why it is not timed}) of sinkattn for case c: the
  default, then the AMX tile and the vector plans forced where they can run and are not the default."""
  out, why = {"default": (None, sinkattn_time(lib, c, kind, 1, threads)[2])}, {}
  for name, force in (("tile", AMX_PLANS if c.dt == BF16 else None), ("vector", vector_plans(build, c.dt))):
    if force is None:
      why[name] = "the tile plans take bf16 only"
      continue
    try:
      plan = sinkattn_time(lib, c, kind, 1, threads, force)[2]
    except RuntimeError as e:
      why[name] = f"refused here: {e}"
      continue
    if plan.split()[0] == out["default"][1].split()[0]:
      why[name] = "the default"
    else:
      out[name] = (force, plan)
  return out, why


def time_kind(lib, build, c, kind, args, torch):
  """One row: the contenders of a kind on case c, interleaved rounds (the order rotating), medians."""
  ours, why = contenders_of(lib, build, c, kind, args.threads)
  t_est = sinkattn_time(lib, c, kind, 1, args.threads)[0]
  calls = max(1, min(20, int(0.3 / max(t_est, 1e-6))))
  cpu_rounds = {n: [] for n in ours}

  def timer(n):
    def run(calls_):
      t, cpu, _ = sinkattn_time(lib, c, kind, calls_, args.threads, ours[n][0])
      cpu_rounds[n].append(cpu)
      return t

    return run

  contenders = {n: timer(n) for n in ours}
  read_bytes = max(cache_bytes(c), 256 * 2.0**20)
  if kind == DECODE:  # the read bandwidth beside each round's decode: a ratio that the machine's load moves less
    contenders["read"] = lambda n: read_bytes / (1e9 * lib.sab_read_bw(args.threads, read_bytes, 3, None))
  peak_rounds = []
  amx = c.dt == BF16 and lib.sab_amx_peak(args.threads, 1, 0) > 0  # -1: no AMX, or a build without the peak
  if kind != DECODE:  # likewise the AMX (bf16) or FMA (f32) peak beside each round's attention

    def peak(_calls):
      peak_rounds.append(lib.sab_amx_peak(args.threads, 1, 0) if amx else lib.sab_fma_peak(args.threads, 1, None))
      return 0.0

    contenders["peak"] = peak
  sdpa = TorchSdpa(torch, c, kind, args.threads) if torch is not None else None
  if sdpa is not None:
    contenders["torch"] = sdpa.time
  names = list(contenders)
  times = {n: [] for n in names}
  for r in range(args.rounds):
    for i in range(len(names)):
      n = names[(i + r) % len(names)]
      times[n].append(contenders[n](calls))
  row = {"calls_per_round": calls, "plans": {n: ours[n][1] for n in ours}, "not_timed": why}
  for n in names:
    if n in ("read", "peak"):
      continue
    med = statistics.median(times[n])
    row[n] = {
      "ms": 1e3 * med,
      "ms_min": 1e3 * min(times[n]),
      "ms_rounds": [1e3 * t for t in times[n]],
      "gflops": flops(c, kind) / med / 1e9,
    }
    if n in cpu_rounds:
      cpu_med = statistics.median(cpu_rounds[n])
      row[n].update(ms_cpu_time=1e3 * cpu_med, gflops_cpu_time=flops(c, kind) / cpu_med / 1e9)
    if peak_rounds:
      row[n]["of_peak_same_round"] = statistics.median(
        [flops(c, kind) / t / 1e9 / g for t, g in zip(times[n], peak_rounds)]
      )
    if kind == DECODE:
      row[n]["gbps"] = cache_bytes(c) / med / 1e9
      row[n]["of_read_same_round"] = statistics.median(
        [t / s * cache_bytes(c) / read_bytes for t, s in zip(times["read"], times[n])]
      )
    if sdpa is not None and n != "torch":  # > 1: sinkattn faster, round by round
      row[n]["torch_over"] = statistics.median([t / s for t, s in zip(times["torch"], times[n])])
  if kind == DECODE:
    row["read_gbps_rounds"] = [read_bytes / t / 1e9 for t in times["read"]]
  else:
    row["peak_rounds"] = {"kind": "amx_bf16" if amx else "fma_fp32", "gflops": peak_rounds}
  if sdpa is not None:
    row["torch"]["gqa"] = sdpa.gqa_mode
  return row


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--lib", help="libsinkattn_cpubench.so (default: the first build*/ that has it)")
  ap.add_argument("--out", help="results JSON (default bench/results/cpu-<date>.json)")
  ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for every contender")
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--quick", action="store_true", help="one attention shape and B = 1 decode per dtype")
  ap.add_argument("--no-torch", action="store_true", help="skip PyTorch even when importable")
  ap.add_argument(
    "--only", choices=list(KIND_NAMES.values()), action="append", help="time only these kinds (repeatable; default all)"
  )
  ap.add_argument("--read-mib", type=int, default=512, help="size of the read-bandwidth buffer")
  args = ap.parse_args()
  if args.threads < 1 or args.rounds < 1:
    sys.exit(f"cpu_bench: --threads {args.threads} and --rounds {args.rounds} must be >= 1")
  lib, lib_path = load_lib(args.lib)
  torch = None
  if not args.no_torch:
    try:
      import torch  # the optional contender
    except ImportError:
      torch = None
  out_path = args.out or os.path.join(REPO, "bench", "results", time.strftime("cpu-%Y%m%d-%H%M.json"))
  res = machine_stamp(lib, args.threads, torch)
  res["library"] = (
    os.path.relpath(lib_path, REPO)
    if os.path.abspath(lib_path).startswith(REPO + os.sep)
    else os.path.basename(lib_path)
  )
  b = res["build"]
  print(
    f"cpu_bench: {res['cpu']}, {args.threads} threads, SIMD {b['simd']}, AVX512-BF16 {b['avx512_bf16']}, "
    f"AMX-BF16 {b['amx_bf16']} (tile state {b['amx_os']}), commit {res['git_commit']}"
    f"{' (dirty)' if res['git_dirty'] else ''}, {b['compiler']}, torch {res['torch'] or 'not importable'}, "
    f"jax {res['jax'] or 'not installed'}, load average {res['loadavg_start'][0]:.1f}"
  )
  read_bytes = args.read_mib * 2.0**20
  p0 = measure_peaks(lib, args.threads, read_bytes)
  rng = np.random.default_rng(0)
  rows = []
  for dt, B, T, S, N, K, H, causal, kinds in grid(args.quick):
    kinds = tuple(k for k in kinds if not args.only or KIND_NAMES[k] in args.only)
    if not kinds:
      continue
    name = row_name(dt, B, T, S, N, K, H, causal)
    c = Case(dt, B, T, S, N, K, H, causal, rng, grads=FWDBWD in kinds)
    errs = {}
    for n, (force, _) in contenders_of(lib, b, c, kinds[0], args.threads)[0].items():
      if T == 1:
        errs[n] = check(lib, dt, 1, 1, 4096, N, K, H, causal, DECODE, rng, force)
      else:
        errs[n] = check(lib, dt, B, min(T, 256), min(S, 256), N, K, H, causal, FWD, rng, force)
    tol = 2e-2 if dt == BF16 else 1e-4
    bad = {n: e for n, e in errs.items() if not (0 <= e <= tol)}
    if bad:
      sys.exit(
        f"cpu_bench: {name}: disagrees with the fp64 reference (max |err| / max |ref| {bad} > {tol}); not timing"
      )
    for kind in kinds:
      row = time_kind(lib, b, c, kind, args, torch)
      row.update(
        name=name,
        kind=KIND_NAMES[kind],
        dtype=name.split()[0],
        B=B,
        T=T,
        S=S,
        N=N,
        K=K,
        H=H,
        causal=causal,
        check_rel_err=errs,
      )
      rows.append(row)
      print(
        f"  {name:28s} {KIND_NAMES[kind]:8s} "
        + "  ".join(f"{n} {row[n]['ms']:9.3f} ms" for n in ("default", "tile", "vector", "torch") if n in row),
        flush=True,
      )
  p1 = measure_peaks(lib, args.threads, read_bytes)
  peaks = {k: max(p0[k], p1[k]) for k in p0}
  res.update(
    peaks_before=p0,
    peaks_after=p1,
    peaks=peaks,
    rows=rows,
    loadavg_end=os.getloadavg(),
    rounds=args.rounds,
    flops="fwd 4BNTSH (x0.5 causal), fwd+bwd 3.5x fwd; decode GB/s of K+V cache bytes",
  )
  report(res)
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  with open(out_path, "w") as f:
    json.dump(res, f, indent=1)
  print(f"wrote {out_path}")


def report(res):
  """One table: per row the default plan's figure and its share of the peak, the tile and vector plans forced, and
  PyTorch, each as ms with its speed-up over PyTorch (x, > 1: faster); the peaks of the same run above it."""
  pk = res["peaks"]
  amx_peak = pk["amx_gflops"] if pk["amx_gflops"] > 0 else None
  print(
    f"\npeaks on {res['threads']} threads (the larger of before / after the grid): fp32 FMA {pk['fma_gflops']:.0f} "
    f"GFLOP/s; AMX bf16 "
    + (
      f"{pk['amx_gflops']:.0f} GFLOP/s ({pk['amx_gflops_with_loads']:.0f} with tile loads)"
      if amx_peak
      else "none (no AMX-BF16, or the OS did not grant the tile state)"
    )
    + f"; memory read {pk['read_gbps']:.1f} GB/s. Load average {res['loadavg_start'][0]:.1f} at the start, "
    f"{res['loadavg_end'][0]:.1f} at the end."
  )
  print(
    "sinkattn: learnable sinks; torch: PyTorch CPU scaled_dot_product_attention, vanilla (no sinks); medians of "
    f"{res['rounds']} interleaved rounds. default: the plan a call gets; tile / vector: the AMX tile / vector "
    "plans forced ('=': the default); %peak: of the AMX peak (bf16) or the FMA peak (f32) measured beside it in "
    "each round (decode: of the read bandwidth); x: PyTorch's time over ours."
  )
  print(
    f"{'shape':29s} {'kind':7s} {'default plan':22s} {'ms':>8s} {'GFLOP/s':>8s} {'GB/s':>5s} {'%peak':>5s} "
    f"{'x':>5s} | {'tile ms':>8s} {'x':>5s} | {'vector ms':>9s} {'x':>5s} | {'torch ms':>8s}"
  )

  def cell(r, n, width):
    if n not in r:
      return f"{'=' if r['not_timed'].get(n) == 'the default' else '-':>{width}s} {'':5s}"
    x = f"{r[n]['torch_over']:5.2f}" if "torch_over" in r[n] else f"{'-':>5s}"
    return f"{r[n]['ms']:{width}.2f} {x}"

  for r in res["rows"]:
    d = r["default"]
    dec = r["kind"] == "decode"
    share = 100 * (d["of_read_same_round"] if dec else d["of_peak_same_round"])
    print(
      f"{r['name']:29s} {r['kind']:7s} {r['plans']['default'].split()[0]:22s} {d['ms']:8.2f} "
      f"{'-' if dec else format(d['gflops'], '.0f'):>8s} {format(d['gbps'], '.1f') if dec else '-':>5s} "
      f"{share:5.1f} {format(d['torch_over'], '.2f') if 'torch_over' in d else '-':>5s} | {cell(r, 'tile', 8)} | "
      f"{cell(r, 'vector', 9)} | {format(r['torch']['ms'], '.2f') if 'torch' in r else '-':>8s}"
    )


if __name__ == "__main__":
  main()
