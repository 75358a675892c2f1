"""bench/kernel_bench.py: our kernels against cuDNN's own sink attention, at kernel level, on the H200.
Larger than 400 lines: the grid, the decode rows, their checks and the report share one set of contenders.

Contenders, each twice (A/A, instances "#2"), interleaved in rotated rounds (bench/gpu_timing.py: L2-sized
rotation of input/output sets, CUDA events around a gated batch, medians of --rounds rounds with the per-round
range, ratios paired per round):
- ours: sa_attn_fwd / sa_attn_bwd of libsinkattn.so through ctypes on torch tensors (bench/sa_capi.py), learnable
  sinks, the default plan (its description recorded; every plan's backward is bitwise reproducible);
- cudnn_sink: cuDNN's SDPA with the sink token through cudnn-frontend's graph API (bench/cudnn_sink.py), default
  (non-deterministic) backward, dsink included;
- end to end in JAX (host clock, bench/jax_contenders.py): jax.nn.dot_product_attention's cuDNN route (vanilla)
  and our sinkattn.dot_product_attention.
Forward and forward+backward on the performance grid (bench/jax_bench.py's GRIDS["h200"]: both gpt-oss layers
included); TFLOP/s as jax_bench.flops counts them (fwd 4 B N pairs H, f+b 3.5x; bench/perf_tables.py
prints the tables). Outputs checked at every shape on set 0: ours against cudnn_sink (everything), and ours and
cudnn_sink against the fp64 reference (bench/attn_ref.py) on kv head 0 and its G query heads. Then decode
(sa_attn_decode_fwd, gpt-oss heads N64/8 H64, one token, learnable sinks, every legal plan), B = 1, 8, 64 and
S = 4k .. 128k, against the device-to-device copy bandwidth measured in the same run (--decode-plans: only the
plans matching a regex, the default always). --grid h200_gptoss: the gpt-oss layers at 2k-32k tokens, beside
cuDNN 9.27's published H200 figures for them (ANCHORS).

Budget (H200): ~2 min for the grid at kernel level (rounds 5, batches of ~10 ms, cuDNN's graphs built per row),
~20 s for decode, then the JAX rows (compiles of ~1-3 s each) while --budget (225 s) lasts.
    python3 bench/kernel_bench.py [--grid h200] [--rows 0,12] [--rounds 5] [--no-jax] [--no-cudnn] [--no-decode]
                                  [--decode-shapes 8:4096] [--decode-plans REGEX] [--out F.json]
    python3 bench/kernel_bench.py --dry-run     # the plan of work (rows, sets, contenders), no GPU
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
import sa_capi  # noqa: E402

sys.path.insert(0, os.path.join(sa_capi.ROOT, "python"))
DECODE = [(B, S) for B in (1, 8, 64) for S in (4096, 16384, 32768, 131072)]
DECODE_HEADS = (64, 8, 64)  # N, K, H: gpt-oss
# cuDNN 9.27's published inference benchmark on the H200, gpt-oss heads (N64 / K8, d64, with sinks), one sequence:
# causal prefill in TFLOP/s (our flops() counts the causal pairs, T (T + 1) / 2 per head) and the window-128
# layer's forward in ms. Rows of bench/jax_bench.py's GRIDS["h200_gptoss"].
ANCHORS = {
  (1, 2048, 64, 8, 64, True, None): ("TFLOP/s", 348.0),
  (1, 8192, 64, 8, 64, True, None): ("TFLOP/s", 457.0),
  (1, 32768, 64, 8, 64, True, None): ("TFLOP/s", 483.0),
  (1, 32768, 64, 8, 64, True, (127, 0)): ("ms", 0.517),
}
ANCHOR_SOURCE = "cuDNN 9.27 inference benchmark, H200 (published)"


def set_bytes(shape):
  """Bytes of one rotation set: q, k, v, dout, and both kernel contenders' outputs."""
  B, T, N, K, H = shape[:5]
  q, kv, lse = 2 * B * T * N * H, 2 * B * T * K * H, 4 * B * N * T
  return 2 * q + 2 * kv + 2 * (2 * q + 2 * kv + lse)


def attn_of(lib, s, causal, window):
  """The sa_attn and sa_attn_grad structs of one rotation set (make_sets)."""
  a = sa_capi.make_attn(
    lib,
    s["q"],
    s["k"],
    s["v"],
    s["out"],
    s["lse"],
    sinks=s["sink"],
    causal=1 if causal else 0,
    window=tuple(window) if window else (-1, -1),
  )
  return a, sa_capi.make_grad(s["dO"], s["dq"], s["dk"], s["dv"], s["ds"])


class Ours:
  """Our forward / forward+backward on R sets; the struct of each set built once (byref kept)."""

  def __init__(self, lib, torch, sets, causal, window):
    self.lib, self.cuda = lib, sa_capi.C["SA_BACKEND_CUDA"]
    self.stream = torch.cuda.current_stream().cuda_stream
    self.a, self.g = [], []
    for s in sets:
      a, g = attn_of(lib, s, causal, window)
      self.a.append(a)
      self.g.append(g)
    self.pa = [ctypes.byref(a) for a in self.a]
    self.pg = [ctypes.byref(g) for g in self.g]
    self.wsn = lib.lib.sa_attn_bwd_workspace_size(self.pa[0], self.cuda)
    self.ws = torch.empty(max(self.wsn, 16), dtype=torch.uint8, device="cuda")
    self.fwd(0)
    self.plan_fwd = lib.last(sa_capi.PLAN_FWD)
    self.bwd(0)
    self.plan_bwd = lib.last(sa_capi.PLAN_BWD)

  def fwd(self, i):
    st = self.lib.lib.sa_attn_fwd(self.pa[i], self.cuda, self.stream)
    if st:
      self.lib.check(st, "sa_attn_fwd")

  def bwd(self, i):
    st = self.lib.lib.sa_attn_bwd(self.pa[i], self.pg[i], self.ws.data_ptr(), self.wsn, self.cuda, self.stream)
    if st:
      self.lib.check(st, "sa_attn_bwd")

  def fb(self, i):
    self.fwd(i)
    self.bwd(i)


def make_sets(torch, shape, n, seed):
  B, T, N, K, H = shape[:5]
  g = torch.Generator(device="cuda").manual_seed(seed)
  bf = torch.bfloat16
  rnd = lambda *sh, sc=1.0: (sc * torch.randn(sh, generator=g, device="cuda")).to(bf)  # noqa: E731
  sink = (20 * torch.rand(N, generator=g, device="cuda") - 10).float()
  sink[0], sink[1] = 50.0, -50.0
  out = []
  for _ in range(n):
    s = dict(q=rnd(B, T, N, H), k=rnd(B, T, K, H, sc=2.0), v=rnd(B, T, K, H), dO=rnd(B, T, N, H), sink=sink)
    for o in ("out", "o", "dq", "dQ"):
      s[o] = torch.empty_like(s["q"])
    for o in ("dk", "dv", "dK", "dV"):
      s[o] = torch.empty_like(s["k"])
    s["lse"] = torch.empty(B, N, T, device="cuda")
    s["stats"] = torch.empty(B, N, T, 1, device="cuda")
    s["ds"], s["dSink"] = torch.empty(N, device="cuda"), torch.empty(1, N, 1, 1, device="cuda")
    out.append(s)
  return out


def check(torch, s, shape, have_cudnn):
  """Set 0 after one f+b of each contender: ours vs cudnn_sink, and both vs the fp64 reference on kv head 0."""
  import attn_ref
  import prod_check

  B, T, N, K, H, causal, window = shape
  G = N // K
  o = attn_ref.ops_for(s["q"])
  mask = dict(causal=1 if causal else 0, window=tuple(window) if window else (-1, -1))
  sl = lambda x: x[:, :, :G]  # noqa: E731
  q, k, v, do, sk = sl(s["q"]), s["k"][:, :, :1], s["v"][:, :, :1], sl(s["dO"]), s["sink"][:G]
  out_r, lse_r = attn_ref.forward(q, k, v, sk, block_bytes=4 << 30, **mask)
  grads = attn_ref.backward(q, k, v, sk, out_r.to(torch.bfloat16), lse_r, do, block_bytes=4 << 30, **mask)
  ref = dict(out=out_r, lse=lse_r, dq=grads[0], dk=grads[1], dv=grads[2], dsinks=grads[3])
  mine = dict(
    out=sl(s["out"]),
    lse=s["lse"][:, :G],
    dq=sl(s["dq"]),
    dk=s["dk"][:, :, :1],
    dv=s["dv"][:, :, :1],
    dsinks=s["ds"][:G],
  )
  theirs = dict(
    out=sl(s["o"]),
    lse=s["stats"][:, :G, :, 0],
    dq=sl(s["dQ"]),
    dk=s["dK"][:, :, :1],
    dv=s["dV"][:, :, :1],
    dsinks=s["dSink"].reshape(N)[:G],
  )
  res = {}
  for who, got in (("ours", mine), ("cudnn_sink", theirs)) if have_cudnn else (("ours", mine),):
    e = {key: (prod_check.lse_error if key == "lse" else prod_check.errors)(got[key], ref[key], o) for key in ref}
    e["dsinks"] = prod_check.errors(got["dsinks"], prod_check.dsinks_of(got["out"], do, lse_r, sk, o), o)
    res[who + "_vs_ref"] = dict(errors=e, ok=all(prod_check.verdict(key, x) for key, x in e.items()))
  if have_cudnn:
    full = dict(out=("out", "o"), dq=("dq", "dQ"), dk=("dk", "dK"), dv=("dv", "dV"))
    e = {key: prod_check.errors(s[a], o.f64(s[b]), o) for key, (a, b) in full.items()}
    e["lse"] = prod_check.lse_error(s["lse"], o.f64(s["stats"][..., 0]), o)
    e["dsinks"] = prod_check.errors(s["ds"], o.f64(s["dSink"].reshape(N)), o)
    res["ours_vs_cudnn_sink"] = dict(errors=e, ok=all(prod_check.verdict(key, x) for key, x in e.items()))
  return res


def bench_row(torch, lib, timer, shape, a):
  import cudnn_sink
  from jax_bench import flops

  B, T, N, K, H, causal, window = shape
  fl = flops(B, T, N, H, causal, window)
  R = gpu_timing.rotation(set_bytes(shape), gpu_timing.l2_bytes(torch))
  sets = make_sets(torch, shape, R, a.seed)
  ours = Ours(lib, torch, sets, causal, window)
  row = dict(
    B=B,
    T=T,
    N=N,
    K=K,
    H=H,
    causal=causal,
    window=window,
    sets=R,
    flops_fwd=fl,
    plan_fwd=ours.plan_fwd,
    plan_bwd=ours.plan_bwd,
  )
  cd = None
  if a.cudnn:
    try:
      cd = cudnn_sink.CudnnSink(torch, a.cudnn_mod, sets, B, T, N, K, H, causal, window)
      cd.fb(0)
    except Exception as e:  # noqa: BLE001 -- a graph cuDNN refuses is reported in the row, the rest runs
      row["cudnn_sink_error"] = "%s: %s" % (type(e).__name__, str(e)[:300])
      cd = None
  torch.cuda.synchronize()
  row["check"] = check(torch, sets[0], shape, cd is not None)
  for mode, mult in (("fwd", 1.0), ("fb", 3.5)) if a.fb else (("fwd", 1.0),):
    cons = []
    for inst in ("", "#2"):
      cons.append(gpu_timing.Contender("ours" + inst, getattr(ours, mode), R))
      if cd is not None:
        cons.append(gpu_timing.Contender("cudnn_sink" + inst, getattr(cd, mode), R))
    samples = timer.rounds(cons, rounds=a.rounds, target_ms=a.target_ms)
    res = {
      n: dict(gpu_timing.stats(x), tflops=mult * fl / gpu_timing.stats(x)["median"] * 1e-9) for n, x in samples.items()
    }
    res["aa_ours"] = gpu_timing.paired(samples["ours#2"], samples["ours"])
    if cd is not None:
      res["cudnn_over_ours"] = gpu_timing.paired(samples["cudnn_sink"], samples["ours"])
      res["aa_cudnn"] = gpu_timing.paired(samples["cudnn_sink#2"], samples["cudnn_sink"])
    row[mode] = res
  del sets, ours, cd
  torch.cuda.empty_cache()
  return row


def bench_jax(row, shape, a, jax_mods):
  """The end-to-end JAX figures of one row, into the row (on the same number of sets)."""
  import jax_contenders

  jax, jnp, sinkattn = jax_mods
  try:
    exes, args = jax_contenders.build(jax, jnp, sinkattn, shape, row["sets"], a.seed)
    for mode, mult in (("fwd", 1.0), ("fb", 3.5)):
      js = jax_contenders.rounds(jax, exes, args, row["sets"], mode, a.rounds)
      row["jax_" + mode] = {
        n: dict(gpu_timing.stats(x), tflops=mult * row["flops_fwd"] / gpu_timing.stats(x)["median"] * 1e-9)
        for n, x in js.items()
      }
      row["jax_" + mode]["cudnn_vanilla_over_ours"] = gpu_timing.paired(js["jax_cudnn_vanilla"], js["jax_ours"])
  except Exception as e:  # noqa: BLE001 -- reported in the row, the rest runs
    row["jax_error"] = "%s: %s" % (type(e).__name__, str(e)[:300])


def bench_decode(torch, lib, timer, a, copy_bps):
  import attn_ref
  import prod_check

  N, K, H = DECODE_HEADS
  rows, cuda = [], sa_capi.C["SA_BACKEND_CUDA"]
  stream = torch.cuda.current_stream().cuda_stream
  for B, S in a.decode_shapes:
    nbytes = 2 * B * S * K * H * 2 + 2 * 2 * B * N * H
    R = gpu_timing.rotation(nbytes, gpu_timing.l2_bytes(torch))
    g = torch.Generator(device="cuda").manual_seed(a.seed + B + S)
    rnd = lambda *sh: torch.randn(sh, generator=g, device="cuda").to(torch.bfloat16)  # noqa: E731
    sink = (20 * torch.rand(N, generator=g, device="cuda") - 10).float()
    lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    sets = [dict(q=rnd(B, 1, N, H), k=rnd(B, S, K, H), v=rnd(B, S, K, H)) for _ in range(R)]
    calls = []
    for s in sets:
      s["out"], s["lse"] = torch.empty_like(s["q"]), torch.empty(B, N, 1, device="cuda")
      at = sa_capi.make_attn(lib, s["q"], s["k"], s["v"], s["out"], s["lse"], sinks=sink, causal=2, kv_lens=lens)
      calls.append((at, ctypes.byref(at)))
    plans = lib.plans(calls[0][0], sa_capi.PLAN_DECODE, cuda)
    if a.decode_plans:  # the default and the plans the regex names
      plans = plans[:1] + [p for p in plans[1:] if re.search(a.decode_plans, p)]
    wsn = 16
    for p in plans:  # the largest workspace of any plan (a forced plan sizes its own)
      lib.force(sa_capi.PLAN_DECODE, p)
      wsn = max(wsn, lib.lib.sa_attn_decode_workspace_size(calls[0][1], cuda))
    lib.force(sa_capi.PLAN_DECODE, None)
    ws = torch.empty(wsn, dtype=torch.uint8, device="cuda")

    def runner(plan):
      def run(i):
        lib.force(sa_capi.PLAN_DECODE, plan)
        st = lib.lib.sa_attn_decode_fwd(calls[i][1], ws.data_ptr(), wsn, cuda, stream)
        if st:
          lib.check(st, "sa_attn_decode_fwd plan %s" % plan)

      return run

    s0, G = sets[0], N // K
    out_r, lse_r = attn_ref.forward(s0["q"][:, :, :G], s0["k"][:, :, :1], s0["v"][:, :, :1], sink[:G], causal=2)
    o = attn_ref.ops_for(out_r)
    cons, checks, ran = [], {}, {}
    for p in plans:  # every legal decode plan, checked on set 0, then timed twice (A/A)
      runner(p)(0)
      torch.cuda.synchronize()
      ran[p] = lib.last(sa_capi.PLAN_DECODE)
      e = dict(
        out=prod_check.errors(s0["out"][:, :, :G], out_r, o), lse=prod_check.lse_error(s0["lse"][:, :G], lse_r, o)
      )
      checks[p] = dict(errors=e, ok=all(prod_check.verdict(key, x) for key, x in e.items()))
      cons += [gpu_timing.Contender(p, runner(p), R), gpu_timing.Contender(p + "#2", runner(p), R)]
    samples = timer.rounds(cons, rounds=a.rounds, target_ms=a.target_ms)
    lib.force(sa_capi.PLAN_DECODE, None)
    for p in plans:
      st = gpu_timing.stats(samples[p])
      bps = nbytes / (st["median"] * 1e-3)
      rows.append(
        dict(
          B=B,
          S=S,
          N=N,
          K=K,
          H=H,
          sets=R,
          bytes=nbytes,
          plan=p,
          default=p == plans[0],
          ran=ran[p],
          ms=st,
          GBps=bps * 1e-9,
          of_copy=bps / copy_bps,
          aa=gpu_timing.paired(samples[p + "#2"], samples[p]),
          check=checks[p],
        )
      )
      print(
        "decode B%-3d S%-7d %-22s %8.4f ms [%.4f, %.4f] %6.0f GB/s %5.1f%% of copy  %s"
        % (
          B,
          S,
          p,
          st["median"],
          st["min"],
          st["max"],
          bps * 1e-9,
          100 * bps / copy_bps,
          "ok" if checks[p]["ok"] else "CHECK FAILED",
        ),
        flush=True,
      )
    sets = calls = ws = None  # the rotated sets leave the GPU before the next shape
    torch.cuda.empty_cache()
  return rows


def anchor_of(row):
  """Our forward against ANCHORS' figure for the row's shape (> 1: ours faster), or None."""
  key = (
    row["B"],
    row["T"],
    row["N"],
    row["K"],
    row["H"],
    row["causal"],
    tuple(row["window"]) if row["window"] else None,
  )
  if key not in ANCHORS:
    return None
  unit, value = ANCHORS[key]
  ours = row["fwd"]["ours"]
  mine = ours["tflops"] if unit == "TFLOP/s" else ours["median"]
  return dict(unit=unit, anchor=value, ours=mine, ours_over_anchor=mine / value if unit == "TFLOP/s" else value / mine)


def fmt_ratio(r):
  return "%.3f [%.3f,%.3f]" % (r["median"], r["min"], r["max"]) if r else "-"


def table(rows, decode, copy_bps):
  """The printed summary: ms and TFLOP/s of ours, cuDNN-sink over ours at kernel level (> 1: ours faster) with
  the per-round range, the A/A spreads, the JAX end-to-end figures, and each row's output check."""
  print(
    "\nkernel level, ms per call (median of rounds); cudnn/ours: cuDNN-sink ms over ours, paired per round, median "
    "[min, max] (> 1: ours faster); A/A: instance #2 over #1; jax: end to end, host clock"
  )
  print(
    "%-34s %-4s %9s %6s %9s %22s %22s %22s %9s %9s  %s"
    % (
      "row",
      "mode",
      "ours ms",
      "TF/s",
      "cudnn ms",
      "cudnn/ours [range]",
      "A/A ours",
      "A/A cudnn",
      "jax ours",
      "jax cuDNN",
      "check",
    )
  )
  for r in rows:
    name = "B%d T%d N%d/%d H%d%s%s" % (
      r["B"],
      r["T"],
      r["N"],
      r["K"],
      r["H"],
      " c" if r["causal"] else "",
      " w%s" % (tuple(r["window"]),) if r["window"] else "",
    )
    ok = all(c["ok"] for c in r["check"].values())
    for mode in [m for m in ("fwd", "fb") if m in r]:
      m, j = r[mode], r.get("jax_" + mode, {})
      print(
        "%-34s %-4s %9.4f %6.0f %9s %22s %22s %22s %9s %9s  %s"
        % (
          name,
          mode,
          m["ours"]["median"],
          m["ours"]["tflops"],
          "%.4f" % m["cudnn_sink"]["median"] if "cudnn_sink" in m else "-",
          fmt_ratio(m.get("cudnn_over_ours")),
          fmt_ratio(m["aa_ours"]),
          fmt_ratio(m.get("aa_cudnn")),
          "%.4f" % j["jax_ours"]["median"] if j else "-",
          "%.4f" % j["jax_cudnn_vanilla"]["median"] if j else "-",
          "ok" if ok else "FAILED " + ",".join(k for k, c in r["check"].items() if not c["ok"]),
        )
      )
  anchored = [r for r in rows if r.get("anchor")]
  if anchored:
    print("\nforward against %s (speed ours / theirs: > 1 ours faster; cuDNN here: the installed one)" % ANCHOR_SOURCE)
    for r in anchored:
      x, cd = r["anchor"], r["fwd"].get("cudnn_sink")
      print(
        "anchor B%d T%d N%d/%d H%d%s: ours %.4f ms %.0f TFLOP/s; anchor %g %s; ours / anchor %.3f; cuDNN here %s"
        % (
          r["B"],
          r["T"],
          r["N"],
          r["K"],
          r["H"],
          " window %s" % (tuple(r["window"]),) if r["window"] else " causal",
          r["fwd"]["ours"]["median"],
          r["fwd"]["ours"]["tflops"],
          x["anchor"],
          x["unit"],
          x["ours_over_anchor"],
          "%.4f ms %.0f TFLOP/s" % (cd["median"], cd["tflops"]) if cd else "-",
        )
      )
  if decode:
    print(
      "\ndecode (N/K %d/%d H%d, one token, every legal plan, * the default): copy bandwidth %.0f GB/s "
      "(read + write)" % (DECODE_HEADS + (copy_bps * 1e-9,))
    )
    for d in decode:
      print(
        "  B%-3d S%-7d %-22s %8.4f ms %6.0f GB/s %5.1f%% of copy  A/A %s  %s"
        % (
          d["B"],
          d["S"],
          d["plan"] + ("*" if d["default"] else ""),
          d["ms"]["median"],
          d["GBps"],
          100 * d["of_copy"],
          fmt_ratio(d["aa"]),
          "ok" if d["check"]["ok"] else "CHECK FAILED",
        )
      )


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument(
    "--grid", dest="grid_name", default="h200", help="a grid of bench/jax_bench.py's GRIDS (h200_gptoss: ANCHORS' rows)"
  )
  ap.add_argument("--rows", default="", help="comma-separated indices into the grid (default: all)")
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--target-ms", type=float, default=10.0, help="length of one timed batch")
  ap.add_argument("--no-jax", dest="jax", action="store_false")
  ap.add_argument("--no-cudnn", dest="cudnn", action="store_false")
  ap.add_argument("--no-decode", dest="decode", action="store_false")
  ap.add_argument("--no-fb", dest="fb", action="store_false", help="time the forward only")
  ap.add_argument("--no-grid", dest="grid", action="store_false")
  ap.add_argument("--decode-shapes", default="", help="B:S,... of the decode rows (default: B 1, 8, 64 x S 4k..128k)")
  ap.add_argument("--decode-plans", default="", help="regex: time only the decode plans it matches (and the default)")
  ap.add_argument("--lib", default=None)
  ap.add_argument("--seed", type=int, default=7)
  ap.add_argument("--out", default=None, help="result JSON (default $OUT/kernel_bench.json or bench/results/)")
  ap.add_argument("--budget", type=float, default=225.0, help="seconds after which no JAX row starts")
  ap.add_argument("--dry-run", action="store_true", help="print the work without touching a GPU")
  a = ap.parse_args(argv)
  try:
    a.decode_shapes = [tuple(int(v) for v in x.split(":")) for x in a.decode_shapes.split(",") if x.strip()] or DECODE
  except ValueError:
    ap.error("--decode-shapes %r: expected B:S pairs such as 1:32768,8:4096" % a.decode_shapes)
  if any(len(x) != 2 or min(x) < 1 for x in a.decode_shapes):
    ap.error("--decode-shapes %r: expected B:S pairs of positive integers" % a.decode_shapes)
  if a.rounds < 5:
    ap.error("--rounds %d: at least 5 (each figure is a median of >= 5 rounds)" % a.rounds)
  from jax_bench import GRIDS

  if a.grid_name not in GRIDS:
    ap.error("--grid %r: one of %s" % (a.grid_name, ", ".join(sorted(GRIDS))))
  grid = GRIDS[a.grid_name]
  idx = [int(x) for x in a.rows.split(",") if x.strip()] or list(range(len(grid)))
  if a.dry_run:
    for i in idx if a.grid else []:
      sh = grid[i]
      print(
        "row %2d %-40s sets %2d  contenders %s"
        % (
          i,
          sh,
          gpu_timing.rotation(set_bytes(sh), gpu_timing.L2_FALLBACK),
          ", ".join(
            (["ours", "cudnn_sink"] if a.cudnn else ["ours"]) + (["jax_ours", "jax_cudnn_vanilla"] if a.jax else [])
          ),
        )
      )
    for B, S in a.decode_shapes if a.decode else []:
      N, K, H = DECODE_HEADS
      print("decode B%d S%d sets %d" % (B, S, gpu_timing.rotation(2 * B * S * K * H * 2, gpu_timing.L2_FALLBACK)))
    return 0
  import torch

  torch.backends.cuda.matmul.allow_tf32 = False
  lib = sa_capi.Lib(a.lib)
  if a.cudnn:
    try:
      import cudnn_sink

      a.cudnn_mod = cudnn_sink.load(torch)
    except Exception as e:  # noqa: BLE001 -- no frontend wheel: the run says so and times the rest
      print("cudnn_sink unavailable: %s: %s" % (type(e).__name__, e), flush=True)
      a.cudnn = False
  jax_mods = None
  if a.jax:
    import jax
    import jax.numpy as jnp

    import sinkattn

    jax_mods = (jax, jnp, sinkattn)
  t_start = time.time()
  timer = gpu_timing.Timer(torch)
  meta = dict(
    sa_capi.stamp(lib),
    grid=a.grid_name,
    rounds=a.rounds,
    target_ms=a.target_ms,
    gated=timer.sleep is not None,
    timing=gpu_timing.__doc__.strip(),
    ours="learnable sinks, default plan",
    cudnn_sink="cudnn-frontend graph API, default (non-deterministic) backward",
  )
  out = a.out or os.path.join(
    os.environ.get("OUT", os.path.join(sa_capi.ROOT, "bench", "results")), "kernel_bench-%s.json" % meta["commit"][:7]
  )
  rows, decode = [], []

  def save():  # after every row: a run cut by its time limit keeps what it measured
    with open(out, "w") as fh:
      json.dump(dict(meta=meta, rows=rows, decode=decode), fh, indent=1)

  # Kernel level first, then decode, then JAX end to end, so that a run cut by --budget loses the least of it.
  for i in idx if a.grid else []:
    rows.append(bench_row(torch, lib, timer, grid[i], a))
    rows[-1]["anchor"] = anchor_of(rows[-1])
    save()
    r = rows[-1]
    print(
      "row %2d done (%.0f s): fwd ours %.4f ms, f+b %s ms, cudnn/ours fwd %s f+b %s"
      % (
        i,
        time.time() - t_start,
        r["fwd"]["ours"]["median"],
        "%.4f" % r["fb"]["ours"]["median"] if "fb" in r else "-",
        fmt_ratio(r["fwd"].get("cudnn_over_ours")),
        fmt_ratio(r.get("fb", {}).get("cudnn_over_ours")),
      ),
      flush=True,
    )
  copy_bps = gpu_timing.copy_bandwidth(torch)
  meta["copy_GBps"] = copy_bps * 1e-9
  if a.decode:
    decode.extend(bench_decode(torch, lib, timer, a, copy_bps))
  save()
  for i, r in zip(idx, rows) if jax_mods else []:
    if time.time() - t_start > a.budget:
      r["jax_error"] = "not run: --budget %g s spent" % a.budget
      continue
    bench_jax(r, grid[i], a, jax_mods)
    save()
  save()
  table(rows, decode, copy_bps)
  print("wrote", out)
  # the exit status: our outputs against the reference (a cuDNN-sink disagreement is in the table and the JSON)
  bad = [r for r in rows if not r["check"]["ours_vs_ref"]["ok"]] + [d for d in decode if not d["check"]["ok"]]
  print("kernel_bench: %s" % digest(rows, decode))
  return 1 if bad else 0


def digest(rows, decode):
  """One line: how many rows and checks, and the range over rows of cuDNN-sink / ours (> 1: ours faster)."""
  parts = [
    "%d rows, checks failed: ours %d, cuDNN-sink %d"
    % (
      len(rows),
      sum(not r["check"]["ours_vs_ref"]["ok"] for r in rows),
      sum(not c["ok"] for r in rows for k, c in r["check"].items() if k != "ours_vs_ref"),
    )
  ]
  for mode in ("fwd", "fb"):
    x = [r[mode]["cudnn_over_ours"]["median"] for r in rows if "cudnn_over_ours" in r.get(mode, {})]
    if x:
      parts.append(
        "%s cudnn/ours %.3f..%.3f (%d of %d rows >= 1)" % (mode, min(x), max(x), sum(v >= 1 for v in x), len(x))
      )
  dd = [d for d in decode if d["default"]]
  if dd:
    parts.append(
      "decode (default plans) %.0f..%.0f%% of copy, checks failed %d"
      % (
        100 * min(d["of_copy"] for d in dd),
        100 * max(d["of_copy"] for d in dd),
        sum(not d["check"]["ok"] for d in decode),
      )
    )
  return "; ".join(parts)


if __name__ == "__main__":
  sys.exit(main())
