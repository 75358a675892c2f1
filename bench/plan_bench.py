"""bench/plan_bench.py: forced plans of one direction side by side at kernel level on the GPU, so that one run
decides a plan default by measurement (bench/gpu_verify.sh PART=perf33; bench/plan_decide.py reads the JSON).

For each shape (rows of bench/jax_bench.py's GRIDS, or --shapes B:T:N:K:H[:c][:wL_R]; bf16, learnable sinks):
- the plans: every legal plan of the direction whose name matches --plans (a regex), and the default, always, first;
- fwd: sa_attn_fwd under each plan; bwd: sa_attn_bwd under each plan, from the default forward's out and lse;
- each plan checked first on set 0 against the fp64 reference (bench/attn_ref.py) on kv head 0 and its query
  heads: out and lse, or dq, dk, dv and dsinks (against the fp64 dsinks of the plan's own out);
- then timed as bench/kernel_bench.py times (bench/gpu_timing.py: rotated input sets, gated batches between CUDA
  events, every plan twice for the A/A, interleaved rounds, medians with the per-round range): each plan's time
  over the default's, paired per round (> 1: the plan is slower).

    python3 bench/plan_bench.py --dir bwd --rows 0,1,2 --plans 'onepass\\.wait$' [--grid h200] [--rounds 7]
    python3 bench/plan_bench.py --dir fwd --shapes 1:32768:64:8:64:c:w127_0 --plans '^hopper\\.fwd\\.' --out F.json
"""

import argparse
import ctypes
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_timing  # noqa: E402
import kernel_bench  # noqa: E402
import sa_capi  # noqa: E402
import segments_bench  # noqa: E402


def parse_shape(spec):
  """B:T:N:K:H[:c][:wL_R] (T = S) -> the grid's tuple (B, T, N, K, H, causal, window)."""
  f = spec.split(":")
  if len(f) < 5:
    raise ValueError("shape %r: expected B:T:N:K:H[:c][:wL_R]" % spec)
  B, T, N, K, H = (int(x) for x in f[:5])
  causal, window = False, None
  for x in f[5:]:
    if x == "c":
      causal = True
    elif x.startswith("w") and "_" in x:
      window = tuple(int(v) for v in x[1:].split("_"))
    else:
      raise ValueError("shape %r: unknown field %r (c, or wL_R)" % (spec, x))
  return (B, T, N, K, H, causal, window)


def name_of(shape):
  B, T, N, K, H, causal, window = shape
  return "B%d T%d N%d/%d H%d%s%s" % (B, T, N, K, H, " c" if causal else "", " w%d,%d" % window if window else "")


class Calls(segments_bench.Layer):
  """segments_bench's calls of any plan (forced inside each call: call, plans, workspace) and its check against the
  reference, on the rotation sets of a shape without segment ids."""

  def __init__(self, torch, lib, sets, causal, window):  # the sets are given: Layer's own are not made
    self.t, self.lib, self.cuda = torch, lib, sa_capi.C["SA_BACKEND_CUDA"]
    self.stream = torch.cuda.current_stream().cuda_stream
    self.sets, self.sink, self.a, self.g = sets, sets[0]["sink"], [], []
    for s in sets:
      a, g = kernel_bench.attn_of(lib, s, causal, window)
      self.a.append((a, ctypes.byref(a)))
      self.g.append((g, ctypes.byref(g)))
    self.ws, self.wsn = None, 0


def reference(torch, s, shape, which):
  """fp64 out and lse (and the gradients for bwd) of kv head 0 and its G query heads of set s."""
  import attn_ref

  B, T, N, K, H, causal, window = shape
  G = N // K
  mask = dict(causal=1 if causal else 0, window=tuple(window) if window else (-1, -1))
  q, k, v, do, sk = s["q"][:, :, :G], s["k"][:, :, :1], s["v"][:, :, :1], s["dO"][:, :, :G], s["sink"][:G]
  out_r, lse_r = attn_ref.forward(q, k, v, sk, block_bytes=4 << 30, **mask)
  ref = dict(out=out_r, lse=lse_r)
  if which == sa_capi.PLAN_BWD:
    g = attn_ref.backward(q, k, v, sk, out_r.to(torch.bfloat16), lse_r, do, block_bytes=4 << 30, **mask)
    ref.update(dq=g[0], dk=g[1], dv=g[2])
  return ref


def bench_shape(torch, lib, timer, shape, which, a):
  from jax_bench import flops

  B, T, N, K, H, causal, window = shape
  R = gpu_timing.rotation(kernel_bench.set_bytes(shape), gpu_timing.l2_bytes(torch))
  sets = kernel_bench.make_sets(torch, shape, R, a.seed)
  c = Calls(torch, lib, sets, causal, window)
  listed = c.plans(which)
  plans = listed[:1] + [p for p in listed[1:] if re.search(a.plans, p)]
  row = dict(shape=list(shape), name=name_of(shape), sets=R, flops_fwd=flops(B, T, N, H, causal, window))
  row.update(direction="fwd" if which == sa_capi.PLAN_FWD else "bwd", listed=listed, default=listed[0], plans={})
  if which == sa_capi.PLAN_BWD:
    for p in plans:  # the largest need of any plan (a forced plan sizes its own)
      c.workspace(p)
    for i in range(R):  # every set's out and lse from the default forward
      c.call(sa_capi.PLAN_FWD, None)(i)
  torch.cuda.synchronize()
  ref = reference(torch, sets[0], shape, which)
  for p in plans:
    c.call(which, p)(0)
    torch.cuda.synchronize()
    ran = lib.last(which)
    row["plans"][p] = dict(ran=ran, check=c.check(which, ref))
    row["plans"][p]["check"]["ok"] &= ran.startswith(p + " ")  # and it was that plan that ran
  lib.force(sa_capi.PLAN_FWD, None)
  del ref
  cons = []
  for inst in ("", "#2"):
    cons += [gpu_timing.Contender(p + inst, c.call(which, p), R) for p in plans]
  samples = timer.rounds(cons, rounds=a.rounds, target_ms=a.target_ms)
  lib.force(sa_capi.PLAN_FWD, None), lib.force(sa_capi.PLAN_BWD, None)
  mult = 1.0 if which == sa_capi.PLAN_FWD else 2.5  # the backward's share of jax_bench's f+b 3.5x
  for p in plans:
    st = gpu_timing.stats(samples[p])
    row["plans"][p].update(
      ms=st,
      tflops=mult * row["flops_fwd"] / st["median"] * 1e-9,
      aa=gpu_timing.paired(samples[p + "#2"], samples[p]),
      over_default=gpu_timing.paired(samples[p], samples[plans[0]]),
      over_default_2=gpu_timing.paired(samples[p + "#2"], samples[plans[0] + "#2"]),
    )
  del sets, c
  torch.cuda.empty_cache()
  return row


def fmt(r):
  return "%.3f [%.3f, %.3f]" % (r["median"], r["min"], r["max"])


def report(row):
  print("%s %s (%d sets; default %s)" % (row["direction"], row["name"], row["sets"], row["default"]))
  for p, x in row["plans"].items():
    print(
      "  %-32s %9.4f ms %6.0f TF/s  / default %s  A/A %s  %s"
      % (p, x["ms"]["median"], x["tflops"], fmt(x["over_default"]), fmt(x["aa"]), "ok" if x["check"]["ok"] else "FAIL"),
      flush=True,
    )


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--dir", choices=("fwd", "bwd"), required=True)
  ap.add_argument("--grid", default="h200", help="a grid of bench/jax_bench.py's GRIDS, for --rows")
  ap.add_argument("--rows", default="", help="comma-separated indices into --grid")
  ap.add_argument("--shapes", default="", help="B:T:N:K:H[:c][:wL_R],... (T = S)")
  ap.add_argument("--plans", default=".", help="regex: the plans timed beside the default")
  ap.add_argument("--rounds", type=int, default=7)
  ap.add_argument("--target-ms", type=float, default=10.0)
  ap.add_argument("--seed", type=int, default=7)
  ap.add_argument("--lib", default=None)
  ap.add_argument("--label", default="", help="what this run decides (kept in the JSON)")
  ap.add_argument("--out", required=True)
  a = ap.parse_args(argv)
  if a.rounds < 5:
    ap.error("--rounds %d: at least 5" % a.rounds)
  try:
    re.compile(a.plans)
    shapes = [parse_shape(x) for x in a.shapes.split(",") if x.strip()]
  except (re.error, ValueError) as e:
    ap.error(str(e))
  if a.rows:
    from jax_bench import GRIDS

    shapes = [GRIDS[a.grid][int(i)] for i in a.rows.split(",") if i.strip()] + shapes
  if not shapes:
    ap.error("no shape: give --rows and / or --shapes")
  import torch

  lib = sa_capi.Lib(a.lib)
  timer = gpu_timing.Timer(torch)
  which = sa_capi.PLAN_FWD if a.dir == "fwd" else sa_capi.PLAN_BWD
  meta = dict(sa_capi.stamp(lib), label=a.label, rounds=a.rounds, target_ms=a.target_ms, plans=a.plans)
  meta.update(gated=timer.sleep is not None, timing=gpu_timing.__doc__.strip())
  rows, t0 = [], time.time()
  for sh in shapes:
    rows.append(bench_shape(torch, lib, timer, sh, which, a))
    report(rows[-1])
    with open(a.out, "w") as fh:  # after every shape: a run cut by its time limit keeps what it measured
      json.dump(dict(meta=meta, rows=rows), fh, indent=1)
  bad = sum(not x["check"]["ok"] for r in rows for x in r["plans"].values())
  print("plan_bench: %d shapes, %.0f s, checks failed %d (%s)" % (len(rows), time.time() - t0, bad, a.label or a.plans))
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
