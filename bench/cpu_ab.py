"""bench/cpu_ab.py: two or more builds of the CPU library side by side in one process, on the rows of
bench/cpu_bench.py, with the same plans forced in each: the A/B of a change (and its A/A: list the first build
again). Rounds are interleaved, the order rotating per round; each figure is the median of --rounds with the range.

  python3 bench/cpu_ab.py --lib base=/tmp/base/build/libsinkattn_cpubench.so --lib head=build/libsinkattn_cpubench.so \
      --lib base --plans amx --out bench/results/cpu-ab.json

--plans: default (each build's own choice), amx (cpu.fwd.amx / cpu.bwd.amx / cpu.decode.amx: an AMX CPU), emulated
(the tile code over emulated instructions: a correctness vehicle, slow), or three comma-separated plan names (forward,
backward, decode). A library built with the emulated TDPBF16PS made a no-op (bench/tile_proxy.sh) under
--plans emulated times the tile path's work besides its products on a CPU without AMX.
"""

import argparse
import json
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_bench as cb  # noqa: E402

PLANS = {
  "default": None,
  "amx": cb.AMX_PLANS,
  "emulated": ("cpu.fwd.amx.emulated", "cpu.bwd.amx.emulated", "cpu.decode.amx.emulated"),
}


def parse_libs(specs):
  """[(label, path)] from NAME=PATH entries; a bare NAME repeats an earlier entry (the A/A)."""
  paths, out = {}, []
  for s in specs:
    name, eq, path = s.partition("=")
    if eq:
      paths[name] = path
    elif name not in paths:
      sys.exit(f"cpu_ab: --lib {name}: no path given for it earlier (NAME=PATH first, then NAME to repeat it)")
    out.append((name, paths[name]))
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--lib", action="append", required=True, help="NAME=libsinkattn_cpubench.so, or NAME again")
  ap.add_argument("--plans", default="default", help="default, amx, emulated or fwd,bwd,decode plan names")
  ap.add_argument("--threads", type=int, default=2)
  ap.add_argument("--rounds", type=int, default=7)
  ap.add_argument("--only", action="append", choices=["fwd", "fwd+bwd", "decode"], help="kinds (repeatable)")
  ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
  ap.add_argument("--out", help="results JSON")
  args = ap.parse_args()
  libs = parse_libs(args.lib)
  if len(libs) < 2:
    sys.exit("cpu_ab: --lib at least twice")
  force = PLANS[args.plans] if args.plans in PLANS else tuple(args.plans.split(","))
  if force is not None and len(force) != 3:
    sys.exit(f"cpu_ab: --plans {args.plans}: three plan names (forward, backward, decode), got {len(force)}")
  loaded = {}
  for _, path in libs:
    if path not in loaded:
      loaded[path] = cb.load_lib(path)[0]
  kinds = {"fwd": cb.FWD, "fwd+bwd": cb.FWDBWD, "decode": cb.DECODE}
  want = {kinds[k] for k in (args.only or kinds)}
  dt = cb.BF16 if args.dtype == "bf16" else cb.F32
  rng = np.random.default_rng(0)
  stamp = cb.machine_stamp(loaded[libs[0][1]], args.threads, None)
  stamp.update(benchmark="bench/cpu_ab.py", libs=[{"name": n, "path": p} for n, p in libs], plans=force)
  rows = []
  print(f"cpu_ab: {stamp['cpu']}, {args.threads} threads, plans {args.plans}, medians of {args.rounds} rounds")
  for g in cb.grid(False):
    if g[0] != dt:
      continue
    B, T, S, N, K, H, causal = g[1:8]
    for kind in (k for k in g[8] if k in want):
      c = cb.Case(dt, B, T, S, N, K, H, causal, rng, grads=kind != cb.DECODE)
      t_est = cb.sinkattn_time(loaded[libs[0][1]], c, kind, 1, args.threads, force)[0]
      calls = max(1, min(20, int(0.3 / max(t_est, 1e-6))))
      times = [[] for _ in libs]
      plans = [""] * len(libs)
      for r in range(args.rounds):
        for i in [(r + j) % len(libs) for j in range(len(libs))]:
          t, _, plans[i] = cb.sinkattn_time(loaded[libs[i][1]], c, kind, calls, args.threads, force)
          times[i].append(t)
      med = [statistics.median(t) for t in times]
      name = f"{cb.row_name(dt, B, T, S, N, K, H, causal)} {cb.KIND_NAMES[kind]}"
      cells = "  ".join(
        f"{n} {1e3 * m:8.3f} ms [{1e3 * min(t):.3f}-{1e3 * max(t):.3f}]" for (n, _), m, t in zip(libs, med, times)
      )
      ratios = " ".join(f"{m / med[0]:.3f}" for m in med[1:])
      print(f"{name:36s} {cells}  / {libs[0][0]}: {ratios}", flush=True)
      rows.append(
        {
          "row": name,
          "calls_per_round": calls,
          "seconds": {f"{i}:{n}": t for i, ((n, _), t) in enumerate(zip(libs, times))},
          "median_ratio_to_first": [m / med[0] for m in med[1:]],
          "plans": plans,
        }
      )
  if args.out:
    with open(args.out, "w") as f:
      json.dump({"stamp": stamp, "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
