"""bench/prod_check.py: correctness at production shapes. Every row of the performance grid (sinkattn.bench's
GRIDS["h200"]: H64 / H128, T 1k-16k, causal and not, both gpt-oss layers), bf16, learnable sinks from U(-10, 10)
with heads 0 and 1 at +50 and -50, forward and forward+backward through the C API (libsinkattn.so, ctypes on
torch tensors), against the fp64 reference of bench/attn_ref.py computed blockwise on the same GPU. For each
shape: the default plan, and (--plans persistent, the default) every plan whose name says persistent or one-pass,
forced through the plan API; --plans all: every legal plan. Per plan: out and lse (forward), dq, dk, dv and dsinks
(backward from the default forward's out and lse) with the max-element error over the largest
reference magnitude and the relative (Frobenius) error; the backward runs three times and dq, dk, dv, dsinks
must agree bitwise. Outputs are NaN-poisoned before every call; a NaN left where the reference is finite fails.

--cpu: the same harness at small shapes on the REF and CPU backends (NumPy arrays, bf16 through ml_dtypes), so the
harness itself is checked where there is no GPU (tests/test_bench_harness.py runs it); --cpu --torch: on torch CPU
tensors, the array code of the GPU run.

    python3 bench/prod_check.py [--plans default|persistent|all] [--shapes 0,3,12] [--out FILE.json]
    python3 bench/prod_check.py --cpu [--torch]
Exit status 1 when any check fails. Prints one line per (shape, direction, plan), then the totals.
"""

import argparse
import ctypes
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attn_ref  # noqa: E402
import sa_capi  # noqa: E402

# Tolerances for bf16 inputs (u = 2^-8, bf16's unit roundoff), against the fp64 reference:
# - out: the kernels round P to bf16 before P.V and the output to bf16 once: ~u per element, averaging over keys;
#   test_cuda measures a relative error of 1.8-2.3e-3 at T, S <= 1408. rel 1e-2 (~5x), max element 2e-2 (~5u).
# - lse: fp32 throughout (scores of exact bf16 products summed in fp32, an fp32 log-sum-exp): max |err| over
#   max(1, |lse|) 1e-4, test_cuda's bound (it measures 1-3e-7).
# - dq, dk, dv: dS and P rounded to bf16 before their products, dq / dk / dv stored in bf16, sums over T * G rows in
#   fp32: test_cuda measures 2.4-2.8e-3 relative. rel 2e-2, max element 5e-2 (conftest's bf16 gradient budget).
# - dsinks: fp32 sums of exp(a - lse_i) D_i over B * T rows; D from the stored bf16 out on both sides (the
#   reference takes its own output rounded to bf16), so what differs is the rows' rounding, ~u / sqrt(rows):
#   rel 1e-2.
TOL = dict(
  out=(2e-2, 1e-2), lse=(1e-4, None), dq=(5e-2, 2e-2), dk=(5e-2, 2e-2), dv=(5e-2, 2e-2), dsinks=(1e-2, 1e-2)
)  # (max element over the largest magnitude, relative)
# The small shapes of --cpu (B, T, N, K, H, causal, window): GQA, H64 and H128, causal and not, a gpt-oss window.
CPU_GRID = [(2, 128, 4, 2, 64, False, None), (1, 256, 8, 2, 64, True, None), (1, 192, 4, 1, 128, True, (63, 0))]
PERSISTENT_WORDS = ("persistent", "onepass")


class _Host:
  """NumPy arrays for the REF / CPU backends (bf16 through ml_dtypes)."""

  stream = None

  def __init__(self):
    import ml_dtypes

    self.bf16 = ml_dtypes.bfloat16

  def reseed(self, seed):
    self.rng = np.random.default_rng(seed)

  def randn(self, shape, scale=1.0):
    return (scale * self.rng.standard_normal(shape)).astype(self.bf16)

  def uniform(self, n, lo, hi):
    return self.rng.uniform(lo, hi, n).astype(np.float32)

  def empty(self, shape, f32=False):
    return np.full(shape, np.nan, np.float32 if f32 else self.bf16)

  def poison(self, x):
    x[...] = np.nan

  def round16(self, x):
    return x.astype(self.bf16)

  def copy(self, x):
    return x.copy()

  def same(self, a, b):
    return a.tobytes() == b.tobytes()

  def sync(self):
    pass


class _Torch:
  """torch tensors on `device`; on a GPU the library runs on torch's current stream."""

  def __init__(self, device="cuda"):
    import torch

    self.t, self.device = torch, device
    self.stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else None

  def reseed(self, seed):
    self.gen = self.t.Generator(device=self.device).manual_seed(seed)

  def randn(self, shape, scale=1.0):
    t = self.t
    return (scale * t.randn(shape, generator=self.gen, device=self.device, dtype=t.float32)).to(t.bfloat16)

  def uniform(self, n, lo, hi):
    t = self.t
    return lo + (hi - lo) * t.rand(n, generator=self.gen, device=self.device, dtype=t.float32)

  def empty(self, shape, f32=False):
    t = self.t
    return t.full(shape, float("nan"), device=self.device, dtype=t.float32 if f32 else t.bfloat16)

  def poison(self, x):
    x.fill_(float("nan"))

  def round16(self, x):
    return x.to(self.t.bfloat16)

  def copy(self, x):
    return x.clone()

  def same(self, a, b):
    return bool(
      self.t.equal(
        a.view(self.t.int16 if a.element_size() == 2 else self.t.int32),
        b.view(self.t.int16 if b.element_size() == 2 else self.t.int32),
      )
    )

  def sync(self):
    if self.device == "cuda":
      self.t.cuda.synchronize()


def errors(got, ref, o):
  """max |got - ref| over max |ref|, relative Frobenius error, and the number of non-finite elements of got
  where ref is finite (every element of ref is finite here)."""
  g = o.f64(got)
  bad = int((~o.isfinite(g)).sum())
  d = o.where(o.isfinite(g), g - ref, 0.0)
  mref = float(abs(ref).max())
  num, den = float((d * d).sum()), float((ref * ref).sum())
  return dict(
    max=float(abs(d).max()) / max(mref, 1e-30), rel=math.sqrt(num / den) if den > 0 else math.sqrt(num), nonfinite=bad
  )


def dsinks_of(out, dout, lse, sinks, o):
  """fp64 dsinks of the contract for a stored out: -sum_{b,i} exp(sink - lse_bi) D_bi per head, D = sum_d dout
  out. A backward reads the out its forward stored, so a kernel's dsinks is checked against this of its own out:
  one head's dsinks sums B * T terms, and where they cancel (kernel_bench's B4 T4096 H64 row) the two bf16
  roundings of out (the kernel's, the reference's) alone move it by 1.5%, cuDNN's and ours by the same digits.
  out, dout [B, T, N', Hv]; lse [B, N', T] (the reference's); sinks [N']."""
  D = o.einsum("bthd,bthd->bht", o.f64(dout), o.f64(out))
  l = o.f64(lse)
  w = o.where(o.isfinite(l), o.exp(o.f64(sinks).reshape(1, -1, 1) - o.where(o.isfinite(l), l, 0.0)), 0.0)
  return -(w * D).sum((0, 2))


def lse_error(got, ref, o):
  g = o.f64(got)
  bad = int((~o.isfinite(g)).sum())
  d = o.where(o.isfinite(g), abs(g - ref) / o.clamp_min(abs(ref), 1.0), 0.0)
  return dict(max=float(d.max()), rel=None, nonfinite=bad)


def verdict(kind, e):
  tmax, trel = TOL[kind]
  return e["nonfinite"] == 0 and e["max"] <= tmax and (trel is None or e["rel"] <= trel)


def pick(plans, mode):
  if mode == "all":
    return plans
  extra = [p for p in plans[1:] if any(w in p for w in PERSISTENT_WORDS)] if mode == "persistent" else []
  return plans[:1] + extra


def check_shape(lib, arr, shape, backend, mode, seed):
  """Result rows of one shape: the reference once, then every picked plan forward and backward."""
  B, T, N, K, H, causal, window = shape
  arr.reseed(seed)
  q, k, v = arr.randn((B, T, N, H)), arr.randn((B, T, K, H), 2.0), arr.randn((B, T, K, H))
  dout = arr.randn((B, T, N, H))
  sinks = arr.uniform(N, -10.0, 10.0)
  sinks[0], sinks[1] = 50.0, -50.0
  mask = dict(causal=1 if causal else 0, window=tuple(window) if window else (-1, -1))
  t0 = time.time()
  out_r, lse_r = attn_ref.forward(q, k, v, sinks, block_bytes=4 << 30, **mask)
  grads_r = attn_ref.backward(q, k, v, sinks, arr.round16(out_r), lse_r, dout, block_bytes=4 << 30, **mask)
  arr.sync()
  t_ref = time.time() - t0
  o = attn_ref.ops_for(q)
  out, lse = arr.empty(q.shape), arr.empty((B, N, T), f32=True)
  a = sa_capi.make_attn(lib, q, k, v, out, lse, sinks=sinks, **mask)
  name = "B%d T%d N%d/%d H%d%s%s" % (
    B,
    T,
    N,
    K,
    H,
    " causal" if causal else "",
    " window %s" % (window,) if window else "",
  )
  rows = []

  def row(kind, plan, res, ok, extra=None):
    r = dict(
      shape=name,
      kind=kind,
      plan=plan,
      plan_ran=lib.last(sa_capi.PLAN_FWD if kind == "fwd" else sa_capi.PLAN_BWD),
      ok=ok,
      errors=res,
      ref_seconds=round(t_ref, 2),
    )
    r.update(extra or {})
    rows.append(r)
    print(
      "%-4s %-40s %-34s %s %s"
      % (
        kind,
        name,
        plan,
        "PASS" if ok else "FAIL",
        " ".join(
          "%s %.2e/%s" % (key, e["max"], "-" if e["rel"] is None else "%.2e" % e["rel"])
          + (" NONFINITE %d" % e["nonfinite"] if e["nonfinite"] else "")
          for key, e in res.items()
        ),
      ),
      flush=True,
    )

  def fwd(plan):
    lib.force(sa_capi.PLAN_FWD, plan)
    arr.poison(out)
    arr.poison(lse)
    lib.check(lib.lib.sa_attn_fwd(ctypes.byref(a), backend, arr.stream), "sa_attn_fwd plan %s" % plan)
    arr.sync()

  for plan in pick(lib.plans(a, sa_capi.PLAN_FWD, backend), mode):
    fwd(plan)
    res = dict(out=errors(out, out_r, o), lse=lse_error(lse, lse_r, o))
    row("fwd", plan, res, all(verdict(key, e) for key, e in res.items()))
  fwd(None)  # the default forward's out and lse feed every backward
  dq, dk, dv, ds = arr.empty(q.shape), arr.empty(k.shape), arr.empty(v.shape), arr.empty((N,), f32=True)
  g = sa_capi.make_grad(dout, dq, dk, dv, ds)
  for plan in pick(lib.plans(a, sa_capi.PLAN_BWD, backend), mode):
    lib.force(sa_capi.PLAN_BWD, plan)
    wsn = lib.lib.sa_attn_bwd_workspace_size(ctypes.byref(a), backend)
    ws = arr.empty((max(wsn, 16) // 4 + 1,), f32=True)
    runs = []
    for _ in range(3):
      for x in (dq, dk, dv, ds):
        arr.poison(x)
      lib.check(
        lib.lib.sa_attn_bwd(ctypes.byref(a), ctypes.byref(g), sa_capi.ptr(ws), wsn, backend, arr.stream),
        "sa_attn_bwd plan %s" % plan,
      )
      arr.sync()
      runs.append([arr.copy(x) for x in (dq, dk, dv, ds)])
    res = {key: errors(x, r, o) for key, x, r in zip(("dq", "dk", "dv", "dsinks"), runs[0], grads_r)}
    same = {
      key: all(arr.same(runs[0][i], runs[j][i]) for j in (1, 2)) for i, key in enumerate(("dq", "dk", "dv", "dsinks"))
    }
    row(
      "bwd",
      plan,
      res,
      all(verdict(key, e) for key, e in res.items()) and all(same.values()),
      dict(bitwise_3_runs=same, workspace_bytes=wsn),
    )
    if not all(same.values()):
      print("     not bitwise over 3 runs:", [key for key, s in same.items() if not s], flush=True)
  lib.force(sa_capi.PLAN_BWD, None)
  return rows


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--cpu", action="store_true", help="small shapes on the REF and CPU backends (no GPU)")
  ap.add_argument("--torch", action="store_true", help="with --cpu: torch CPU tensors (the GPU run's array code)")
  ap.add_argument("--plans", default="persistent", choices=("default", "persistent", "all"))
  ap.add_argument("--shapes", default="", help="comma-separated indices into the grid (default: all)")
  ap.add_argument("--lib", default=None, help="libsinkattn.so (default: sa_capi.find_library)")
  ap.add_argument("--out", default=None, help="result JSON")
  ap.add_argument("--seed", type=int, default=20261202)
  a = ap.parse_args(argv)
  lib = sa_capi.Lib(a.lib)
  if a.cpu:
    grid, arr = CPU_GRID, _Torch("cpu") if a.torch else _Host()
    backends = [("ref", sa_capi.C["SA_BACKEND_REF"]), ("cpu", sa_capi.C["SA_BACKEND_CPU"])]
  else:
    sys.path.insert(0, os.path.join(sa_capi.ROOT, "python"))
    from jax_bench import GRIDS

    grid, arr = GRIDS["h200"], _Torch("cuda")
    arr.t.backends.cuda.matmul.allow_tf32 = False  # the reference's products stay fp64 (no tf32 anywhere)
    backends = [("cuda", sa_capi.C["SA_BACKEND_CUDA"])]
  idx = [int(x) for x in a.shapes.split(",") if x.strip()] or range(len(grid))
  print("library:", lib.path, flush=True)
  rows, meta = [], dict(sa_capi.stamp(lib), tolerances=TOL, plans=a.plans, seed=a.seed)
  for bname, be in backends:
    for i in idx:
      for r in check_shape(lib, arr, grid[i], be, a.plans, a.seed + i):
        r["backend"] = bname
        rows.append(r)
      if a.out:  # after every shape: a run cut by its time limit keeps what it checked
        with open(a.out, "w") as fh:
          json.dump(dict(meta=meta, rows=rows), fh, indent=1)
  nfail = sum(not r["ok"] for r in rows)
  print("prod_check: %d passed, %d failed" % (len(rows) - nfail, nfail), flush=True)
  return 1 if nfail else 0


if __name__ == "__main__":
  sys.exit(main())
