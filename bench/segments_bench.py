"""bench/segments_bench.py: packed sequences (segment ids) on the GPU, every legal plan of each direction forced
through the plan API and timed at kernel level against the same layer without segment ids, so that the plan
defaults can be decided from one run.

Shapes: the gpt-oss heads (B1, N64 / K8) at H64 and H128, T = S = 4096 and 16384, causal, learnable sinks, bf16,
with 1, 4 and 16 equal documents a row (ids = position // (T / docs)), plus the dense layer (no segment ids, the
default plans). For each shape and plan: forward alone, backward alone (from the default forward's out and lse),
checked first against the fp64 reference of bench/attn_ref.py on kv head 0 and its query heads (segment ids
included), then timed with bench/gpu_timing.py (rotated sets, gated batches, >= 5 rounds, median and range).
Useful FLOP/s count the causal pairs inside documents only (docs L (L + 1) / 2, L = T / docs), forward 4 N H pairs,
f+b 3.5x: docs_n at 80% of dense is issue 22's target. f+b of a backward plan = default forward + that backward.

    python3 bench/segments_bench.py [--rounds 5] [--docs 1,4,16] [--t 4096,16384] [--h 64,128] [--out F.json]
"""

import argparse
import ctypes
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attn_ref  # noqa: E402
import gpu_timing  # noqa: E402
import prod_check  # noqa: E402
import sa_capi  # noqa: E402

N_HEADS, KV_HEADS = 64, 8


def useful_pairs(T, docs):
  L = T // docs
  return docs * L * (L + 1) // 2


class Layer:
  """R sets of one shape (seg ids shared) and the calls of any plan on them."""

  def __init__(self, torch, lib, T, H, docs, sets, seed):
    self.t, self.lib, self.cuda = torch, lib, sa_capi.C["SA_BACKEND_CUDA"]
    self.stream = torch.cuda.current_stream().cuda_stream
    g = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *sh, sc=1.0: (sc * torch.randn(sh, generator=g, device="cuda")).to(torch.bfloat16)  # noqa: E731
    self.sink = (20 * torch.rand(N_HEADS, generator=g, device="cuda") - 10).float()
    self.sink[0], self.sink[1] = 50.0, -50.0
    self.seg = None if docs is None else (torch.arange(T, device="cuda", dtype=torch.int32) // (T // docs))[None]
    self.sets, self.a, self.g = [], [], []
    for _ in range(sets):
      s = dict(
        q=rnd(1, T, N_HEADS, H), k=rnd(1, T, KV_HEADS, H, sc=2.0), v=rnd(1, T, KV_HEADS, H), dO=rnd(1, T, N_HEADS, H)
      )
      s.update(
        out=torch.empty_like(s["q"]),
        lse=torch.empty(1, N_HEADS, T, device="cuda"),
        dq=torch.empty_like(s["q"]),
        dk=torch.empty_like(s["k"]),
        dv=torch.empty_like(s["v"]),
        ds=torch.empty(N_HEADS, device="cuda"),
      )
      a = sa_capi.make_attn(
        lib, s["q"], s["k"], s["v"], s["out"], s["lse"], sinks=self.sink, causal=1, q_seg=self.seg, kv_seg=self.seg
      )
      self.sets.append(s)
      self.a.append((a, ctypes.byref(a)))
      gr = sa_capi.make_grad(s["dO"], s["dq"], s["dk"], s["dv"], s["ds"])
      self.g.append((gr, ctypes.byref(gr)))
    self.ws, self.wsn = None, 0

  def plans(self, which):
    return self.lib.plans(self.a[0][0], which, self.cuda)

  def workspace(self, plan):
    self.lib.force(sa_capi.PLAN_BWD, plan)
    n = self.lib.lib.sa_attn_bwd_workspace_size(self.a[0][1], self.cuda)
    self.lib.force(sa_capi.PLAN_BWD, None)
    if n > self.wsn:
      self.ws, self.wsn = self.t.empty(n, dtype=self.t.uint8, device="cuda"), n

  def call(self, which, plan):
    lib, cuda, st = self.lib, self.cuda, self.stream

    def fwd(i):
      lib.force(sa_capi.PLAN_FWD, plan)
      s = lib.lib.sa_attn_fwd(self.a[i][1], cuda, st)
      if s:
        lib.check(s, "sa_attn_fwd plan %s" % plan)

    def bwd(i):
      lib.force(sa_capi.PLAN_BWD, plan)
      s = lib.lib.sa_attn_bwd(
        self.a[i][1], self.g[i][1], self.ws.data_ptr() if self.ws is not None else None, self.wsn, cuda, st
      )
      if s:
        lib.check(s, "sa_attn_bwd plan %s" % plan)

    return fwd if which == sa_capi.PLAN_FWD else bwd

  def check(self, which, ref):
    """Set 0's outputs of the last call of `which` against the reference slice (kv head 0, its G heads)."""
    s = self.sets[0]
    G, o = s["q"].shape[2] // s["k"].shape[2], attn_ref.ops_for(s["q"])
    if which == sa_capi.PLAN_FWD:
      e = dict(
        out=prod_check.errors(s["out"][:, :, :G], ref["out"], o),
        lse=prod_check.lse_error(s["lse"][:, :G], ref["lse"], o),
      )
    else:
      e = {
        key: prod_check.errors(x, ref[key], o)
        for key, x in (
          ("dq", s["dq"][:, :, :G]),
          ("dk", s["dk"][:, :, :1]),
          ("dv", s["dv"][:, :, :1]),
        )
      }
      own = prod_check.dsinks_of(s["out"][:, :, :G], s["dO"][:, :, :G], ref["lse"], self.sink[:G], o)
      e["dsinks"] = prod_check.errors(s["ds"][:G], own, o)
    return dict(errors=e, ok=all(prod_check.verdict(key, x) for key, x in e.items()))

  def reference(self):
    s, G, seg = self.sets[0], N_HEADS // KV_HEADS, self.seg
    q, k, v, do = s["q"][:, :, :G], s["k"][:, :, :1], s["v"][:, :, :1], s["dO"][:, :, :G]
    mask = dict(causal=1, q_seg=seg, kv_seg=seg)
    out, lse = attn_ref.forward(q, k, v, self.sink[:G], block_bytes=4 << 30, **mask)
    dq, dk, dv, ds = attn_ref.backward(
      q, k, v, self.sink[:G], out.to(self.t.bfloat16), lse, do, block_bytes=4 << 30, **mask
    )
    return dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv, dsinks=ds)


def bench_shape(torch, lib, timer, T, H, docs, a):
  """Rows of one (T, H, docs): docs None is the dense layer (default plans only)."""
  B = 1
  set_bytes = 2 * (4 * B * T * N_HEADS * H + 4 * B * T * KV_HEADS * H)
  R = gpu_timing.rotation(set_bytes, gpu_timing.l2_bytes(torch))
  L = Layer(torch, lib, T, H, docs, R, a.seed + T + H + (docs or 0))
  ref = L.reference()
  fwd_plans = L.plans(sa_capi.PLAN_FWD) if docs else [sa_capi.DEFAULT_PLAN]
  bwd_plans = L.plans(sa_capi.PLAN_BWD) if docs else [sa_capi.DEFAULT_PLAN]
  for p in bwd_plans:
    L.workspace(p)
  cons, checks = [], {}
  for which, plans in ((sa_capi.PLAN_FWD, fwd_plans), (sa_capi.PLAN_BWD, bwd_plans)):
    for p in plans:
      if which == sa_capi.PLAN_BWD:  # every set's out and lse from the default forward
        for i in range(R):
          L.call(sa_capi.PLAN_FWD, None)(i)
      f = L.call(which, p)
      f(0)
      torch.cuda.synchronize()
      ran = lib.last(which)
      key = ("fwd " if which == sa_capi.PLAN_FWD else "bwd ") + p
      checks[key] = dict(L.check(which, ref), ran=ran)
      cons.append(gpu_timing.Contender(key, f, R))
  samples = timer.rounds(cons, rounds=a.rounds, target_ms=a.target_ms)
  lib.force(sa_capi.PLAN_FWD, None)
  lib.force(sa_capi.PLAN_BWD, None)
  pairs = useful_pairs(T, docs or 1)
  fl = 4.0 * B * N_HEADS * H * pairs
  st = {k: gpu_timing.stats(v) for k, v in samples.items()}
  fwd_default = st["fwd " + fwd_plans[0]]["median"]
  rows = []
  for key, s in st.items():
    is_fwd = key.startswith("fwd ")
    fb = None if is_fwd else fwd_default + s["median"]
    rows.append(
      dict(
        T=T,
        H=H,
        N=N_HEADS,
        K=KV_HEADS,
        docs=docs or "dense",
        plan=key,
        ran=checks[key]["ran"],
        ms=s,
        tflops=fl / s["median"] * 1e-9 if is_fwd else None,
        fb_ms=fb,
        fb_tflops=None if is_fwd else 3.5 * fl / fb * 1e-9,
        useful_pairs=pairs,
        check=checks[key],
      )
    )
    print(
      "T%-6d H%-3d docs %-5s %-44s %8.3f ms [%.3f, %.3f] %s  %s"
      % (
        T,
        H,
        docs or "dense",
        key,
        s["median"],
        s["min"],
        s["max"],
        "%6.1f TF/s" % rows[-1]["tflops"] if is_fwd else "f+b %6.1f TF/s" % rows[-1]["fb_tflops"],
        "ok" if checks[key]["ok"] else "CHECK FAILED",
      ),
      flush=True,
    )
  del L
  torch.cuda.empty_cache()
  return rows


def summary(rows):
  """One line per shape: the default and the fastest plan of each direction, and f+b useful TFLOP/s (default
  forward + the fastest backward) as a share of the dense layer's at the same T and H."""
  print("segments summary: ms of the default plan / the fastest (its name); f+b useful TF/s, % of dense")
  dense = {(r["T"], r["H"]): r["fb_tflops"] for r in rows if r["docs"] == "dense" and r["fb_tflops"]}
  for key in dict.fromkeys((r["T"], r["H"], r["docs"]) for r in rows):
    rs = [r for r in rows if (r["T"], r["H"], r["docs"]) == key]
    line = "T%-6d H%-4d docs %-6s" % key
    for d in ("fwd ", "bwd "):
      mine = [r for r in rs if r["plan"].startswith(d)]
      best = min(mine, key=lambda r: r["ms"]["median"])
      line += " %s %.3f / %.3f (%s)" % (d.strip(), mine[0]["ms"]["median"], best["ms"]["median"], best["plan"][4:])
    fb = max(r["fb_tflops"] for r in rs if r["fb_tflops"])
    ref = dense.get(key[:2])
    line += "  f+b %.0f TF/s%s" % (fb, " = %.0f%% of dense" % (100 * fb / ref) if ref else "")
    print(line + ("" if all(r["check"]["ok"] for r in rs) else "  CHECK FAILED"))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--target-ms", type=float, default=10.0)
  ap.add_argument("--docs", default="1,4,16")
  ap.add_argument("--t", default="4096,16384")
  ap.add_argument("--h", default="64,128")
  ap.add_argument("--lib", default=None)
  ap.add_argument("--seed", type=int, default=11)
  ap.add_argument("--out", default=None)
  a = ap.parse_args(argv)
  if a.rounds < 5:
    ap.error("--rounds %d: at least 5" % a.rounds)
  import torch

  torch.backends.cuda.matmul.allow_tf32 = False
  lib = sa_capi.Lib(a.lib)
  print("library:", lib.path, flush=True)
  timer = gpu_timing.Timer(torch)
  meta = dict(sa_capi.stamp(lib), rounds=a.rounds, target_ms=a.target_ms, gated=timer.sleep is not None)
  out = a.out or os.path.join(
    os.environ.get("OUT", os.path.join(sa_capi.ROOT, "bench", "results")), "segments-%s.json" % meta["commit"][:7]
  )
  rows = []
  for T in map(int, a.t.split(",")):
    for H in map(int, a.h.split(",")):
      for docs in [None] + [int(d) for d in a.docs.split(",")]:
        rows += bench_shape(torch, lib, timer, T, H, docs, a)
        with open(out, "w") as fh:  # after every shape: a run cut by its time limit keeps what it measured
          json.dump(dict(meta=meta, rows=rows), fh, indent=1)
  print("wrote", out)
  summary(rows)
  nbad = sum(not r["check"]["ok"] for r in rows)
  print(
    "segments_bench: %d plan rows over %d shapes, checks failed %d"
    % (len(rows), len({(r["T"], r["H"], r["docs"]) for r in rows}), nbad)
  )
  return 1 if nbad else 0


if __name__ == "__main__":
  sys.exit(main())
