"""bench/feature_bench.py: the feature kernels (bias, mask array; plans hopper.fwd.features and
hopper.bwd.twopass.features, forced: they are override-only) against the plain kernels on the same problem, at kernel
level on the H200, in bench/kernel_bench.py's way (bench/gpu_timing.py: CUDA events around gated batches, rotated
input sets, contenders interleaved in rotated rounds, each twice for an A/A, ratios paired per round).

Per shape (B4 T4096 N32 at H64 and H128, gpt-oss's B1 T4096 N64/8 H64), forward and forward + backward:
- a mask array that is causal in content ([1, 1, T, S] and [B, 1, T, S], no is_causal) against is_causal=True
  (target: within 10%, ratio <= 1.10);
- a bias [1, N, T, S] and [B, N, T, S] (bf16, no dbias) against no bias (target: within 25%, ratio <= 1.25).
Before timing, each feature contender's output is checked against the plain one on the same inputs (the mask's
with is_causal's; the bias's with a zero bias against no bias): both kernels' outputs within 2e-2 (the fp64 checks
are test_cuda's). One line per comparison ("feature_bench: ..."), a verdict per target, a JSON file.
    python3 bench/feature_bench.py [--shapes 0,1,2] [--rounds 5] [--out F.json]
"""

import argparse
import ctypes
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_timing  # noqa: E402
import sa_capi  # noqa: E402

SHAPES = [(4, 4096, 32, 32, 64), (4, 4096, 32, 32, 128), (1, 4096, 64, 8, 64)]  # B T N K H
FWD_PLAN, BWD_PLAN = "hopper.fwd.features", "hopper.bwd.twopass.features"
TARGETS = dict(mask=1.10, bias=1.25)


class Call:
  """One configuration (plain or feature) over R rotated sets; bias / mask shared by the sets (each far larger
  than L2, so no call finds it there)."""

  def __init__(self, lib, torch, sets, causal, bias=None, mask=None, forced=False):
    self.lib, self.forced, self.cuda = lib, forced, sa_capi.C["SA_BACKEND_CUDA"]
    self.stream = torch.cuda.current_stream().cuda_stream
    self.a, self.g = [], []
    for s in sets:
      a = sa_capi.make_attn(lib, s["q"], s["k"], s["v"], s["out"], s["lse"], sinks=s["sink"], causal=causal)
      for name, x in (("bias", bias), ("mask", mask)):
        if x is not None:
          setattr(a, name, x.data_ptr())
          getattr(a, name + "_dims")[:] = list(x.shape)
      if bias is not None:
        a.bias_dtype = sa_capi.C["SA_BF16"]
      self.a.append(a)
      self.g.append(sa_capi.make_grad(s["dO"], s["dq"], s["dk"], s["dv"], s["ds"]))
    self.pa = [ctypes.byref(a) for a in self.a]
    self.pg = [ctypes.byref(g) for g in self.g]
    self._force()
    self.wsn = lib.lib.sa_attn_bwd_workspace_size(self.pa[0], self.cuda)
    self._force(clear=True)
    self.ws = torch.empty(max(self.wsn, 16), dtype=torch.uint8, device="cuda")

  def _force(self, clear=False):
    if self.forced:
      self.lib.force(sa_capi.PLAN_FWD, None if clear else FWD_PLAN)
      self.lib.force(sa_capi.PLAN_BWD, None if clear else BWD_PLAN)

  def fwd(self, i):
    self._force()
    st = self.lib.lib.sa_attn_fwd(self.pa[i], self.cuda, self.stream)
    self._force(clear=True)
    if st:
      self.lib.check(st, "sa_attn_fwd")

  def fb(self, i):
    self.fwd(i)
    self._force()
    st = self.lib.lib.sa_attn_bwd(self.pa[i], self.pg[i], self.ws.data_ptr(), self.wsn, self.cuda, self.stream)
    self._force(clear=True)
    if st:
      self.lib.check(st, "sa_attn_bwd")

  def plans(self):
    self.fb(0)
    return self.lib.last(sa_capi.PLAN_FWD), self.lib.last(sa_capi.PLAN_BWD)


def make_sets(torch, B, T, N, K, H, n, seed):
  g = torch.Generator(device="cuda").manual_seed(seed)
  rnd = lambda *sh, sc=1.0: (sc * torch.randn(sh, generator=g, device="cuda")).to(torch.bfloat16)  # noqa: E731
  sink = (20 * torch.rand(N, generator=g, device="cuda") - 10).float()
  out = []
  for _ in range(n):
    s = dict(q=rnd(B, T, N, H), k=rnd(B, T, K, H, sc=2.0), v=rnd(B, T, K, H), dO=rnd(B, T, N, H), sink=sink)
    s["out"], s["dq"] = torch.empty_like(s["q"]), torch.empty_like(s["q"])
    s["dk"], s["dv"] = torch.empty_like(s["k"]), torch.empty_like(s["k"])
    s["lse"], s["ds"] = torch.empty(B, N, T, device="cuda"), torch.empty(N, device="cuda")
    out.append(s)
  return out


def same_output(torch, plain, feat, sets):
  """Relative L2 difference of out after one forward of each on set 0 (the two write the same buffer in turn)."""
  plain.fwd(0)
  torch.cuda.synchronize()
  ref = sets[0]["out"].float().clone()
  feat.fwd(0)
  torch.cuda.synchronize()
  got = sets[0]["out"].float()
  return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def bench_shape(torch, lib, timer, shape, a):
  B, T, N, K, H = shape
  set_bytes = 2 * (2 * B * T * N * H + 2 * B * T * K * H) * 2
  R = gpu_timing.rotation(set_bytes, gpu_timing.l2_bytes(torch))
  sets = make_sets(torch, B, T, N, K, H, R, a.seed)
  causal_mask = torch.ones(T, T, dtype=torch.bool, device="cuda").tril_().to(torch.uint8)
  mask11 = causal_mask.view(1, 1, T, T).contiguous()
  maskb1 = causal_mask.view(1, 1, T, T).expand(B, 1, T, T).contiguous()
  g = torch.Generator(device="cuda").manual_seed(a.seed + 1)
  bias1n = (torch.randn(1, N, T, T, generator=g, device="cuda")).to(torch.bfloat16)
  biasbn = (torch.randn(B, N, T, T, generator=g, device="cuda")).to(torch.bfloat16)
  zero1n = torch.zeros_like(bias1n)
  calls = dict(
    causal=Call(lib, torch, sets, causal=1),
    mask_11TS=Call(lib, torch, sets, causal=0, mask=mask11, forced=True),
    mask_B1TS=Call(lib, torch, sets, causal=0, mask=maskb1, forced=True),
    nobias=Call(lib, torch, sets, causal=0),
    bias_1NTS=Call(lib, torch, sets, causal=0, bias=bias1n, forced=True),
    bias_BNTS=Call(lib, torch, sets, causal=0, bias=biasbn, forced=True),
  )
  row = dict(B=B, T=T, N=N, K=K, H=H, sets=R, plans={k: c.plans() for k, c in calls.items()})
  zero = Call(lib, torch, sets, causal=0, bias=zero1n, forced=True)
  row["check"] = dict(
    mask_11TS=same_output(torch, calls["causal"], calls["mask_11TS"], sets),
    mask_B1TS=same_output(torch, calls["causal"], calls["mask_B1TS"], sets),
    bias_zero=same_output(torch, calls["nobias"], zero, sets),
  )
  del zero
  pairs = dict(mask_11TS="causal", mask_B1TS="causal", bias_1NTS="nobias", bias_BNTS="nobias")
  for mode in ("fwd", "fb"):
    cons = []
    for inst in ("", "#2"):
      for name, c in calls.items():
        cons.append(gpu_timing.Contender(name + inst, getattr(c, mode), R))
    samples = timer.rounds(cons, rounds=a.rounds, target_ms=a.target_ms)
    res = {n: gpu_timing.stats(x) for n, x in samples.items()}
    for feat, base in pairs.items():
      res[feat + "_over_" + base] = gpu_timing.paired(samples[feat], samples[base])
    res["aa_" + "causal"] = gpu_timing.paired(samples["causal#2"], samples["causal"])
    res["aa_" + "mask_11TS"] = gpu_timing.paired(samples["mask_11TS#2"], samples["mask_11TS"])
    row[mode] = res
  del calls, sets
  torch.cuda.empty_cache()
  return row


def report(rows):
  """One line per (shape, mode, comparison) and a verdict per target; returns whether every check and target held."""
  ok = True
  for r in rows:
    name = "B%d T%d N%d/%d H%d" % (r["B"], r["T"], r["N"], r["K"], r["H"])
    for k, e in r["check"].items():
      good = e <= 2e-2
      ok &= good
      print("feature_bench: %s check %s rel diff %.2e %s" % (name, k, e, "ok" if good else "FAILED"))
    for mode in ("fwd", "fb"):
      for key, x in r[mode].items():
        if "_over_" not in key:
          continue
        target = TARGETS["mask" if key.startswith("mask") else "bias"]
        met = x["median"] <= target
        ok &= met
        print(
          "feature_bench: %s %-3s %-24s %.3f [%.3f, %.3f] target <= %.2f: %s (A/A %.3f)"
          % (
            name,
            mode,
            key,
            x["median"],
            x["min"],
            x["max"],
            target,
            "met" if met else "MISSED",
            r[mode]["aa_causal"]["median"],
          )
        )
  return ok


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--shapes", default="", help="comma-separated indices into SHAPES (default: all)")
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--target-ms", type=float, default=10.0)
  ap.add_argument("--seed", type=int, default=11)
  ap.add_argument("--lib", default=None)
  ap.add_argument("--out", default=None)
  a = ap.parse_args(argv)
  if a.rounds < 5:
    ap.error("--rounds %d: at least 5 (each figure is a median of >= 5 rounds)" % a.rounds)
  idx = [int(x) for x in a.shapes.split(",") if x.strip()] or list(range(len(SHAPES)))
  import torch

  lib = sa_capi.Lib(a.lib)
  timer = gpu_timing.Timer(torch)
  meta = dict(sa_capi.stamp(lib), rounds=a.rounds, target_ms=a.target_ms, targets=TARGETS)
  out = a.out or os.path.join(os.environ.get("OUT", "."), "feature_bench.json")
  rows = []
  for i in idx:
    rows.append(bench_shape(torch, lib, timer, SHAPES[i], a))
    with open(out, "w") as fh:
      json.dump(dict(meta=meta, rows=rows), fh, indent=1)
  ok = report(rows)
  print("wrote", out)
  print("feature_bench: %s" % ("every check and target met" if ok else "SOME CHECKS OR TARGETS MISSED"))
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
