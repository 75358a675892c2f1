"""bench/perf_tables.py: the GPU run's result files as Markdown tables, each stamped with the commit, device and
versions its file carries.

Reads what bench/gpu_verify.sh leaves in its output folder (or the files named on the command line):
- kernel_bench.json (bench/kernel_bench.py): the kernel-level grid, ours against cuDNN's SDPA with the sink token
  (forward, forward+backward), the JAX end-to-end rows (ours against jax.nn.dot_product_attention's cuDNN route),
  and decode against the device-to-device copy of the same run;
- segments.json (bench/segments_bench.py): useful TFLOP/s of packed sequences against the dense causal layer;
- progress.jsonl (bench/gpu_progress.sh over bench/gpu_progress.cu): whether each plan finished, and correctly,
  while another kernel holds SMs or inside a green context.
A file or a contender that is absent prints "not measured", so a run cut by its time limit still renders.

    python3 bench/perf_tables.py [DIR] [--kernel F.json] [--segments F.json] [--progress F.jsonl] [--out F.md]
"""

import argparse
import glob
import json
import os
import sys

NM = "not measured"


def load(path):
  """The parsed file, or None where it is absent or unreadable (a run cut mid-write leaves a partial file)."""
  if not path or not os.path.isfile(path):
    return None
  try:
    with open(path) as fh:
      if path.endswith(".jsonl"):
        return [json.loads(x) for x in fh if x.strip()]
      return json.load(fh)
  except (OSError, ValueError):
    return None


def find(d, name, pattern):
  """gpu_verify.sh's name in DIR, else the newest file the script's own default name matches."""
  p = os.path.join(d, name)
  if os.path.isfile(p):
    return p
  c = sorted(glob.glob(os.path.join(d, pattern)), key=os.path.getmtime)
  return c[-1] if c else None


def stamp(meta, what):
  """One line naming what the figures were measured on; a key the file lacks is left out, never guessed."""
  if not meta:
    return "_%s: no stamp in the file_" % what
  m = meta
  parts = ["commit %s" % str(m.get("commit", "unknown"))[:12]]
  gpus = m.get("gpus") or []
  dev = m.get("device") or (gpus[0].split(",")[0].strip() if gpus else None)
  if dev:
    parts.append(dev)
  if gpus and len(gpus[0].split(",")) > 1:
    parts.append("driver %s" % gpus[0].split(",")[1].strip())
  names = (
    ("torch", "torch"),
    ("torch_cuda", "CUDA"),
    ("cudnn_backend", "cuDNN"),
    ("cudnn", "cudnn-frontend"),
    ("jax", "jax"),
    ("jaxlib", "jaxlib"),
    ("numpy", "numpy"),
    ("python", "Python"),
  )
  parts += ["%s %s" % (label, m[k]) for k, label in names if m.get(k) is not None]
  if m.get("rounds"):
    parts.append("%s rounds" % m["rounds"])
  return "_%s: %s_" % (what, ", ".join(parts))


def ratio(r):
  """A paired ratio as median [min, max] of the rounds (bench/gpu_timing.py's paired())."""
  return "%.3f [%.3f, %.3f]" % (r["median"], r["min"], r["max"]) if r else NM


def tf(c):
  return "%.0f" % c["tflops"] if c and c.get("tflops") is not None else NM


def rowname(r):
  w = r.get("window")
  return "B%d T%d N%d/%d H%d%s%s" % (
    r["B"],
    r["T"],
    r["N"],
    r["K"],
    r["H"],
    " causal" if r.get("causal") else "",
    " window (%d, %d)" % tuple(w) if w else "",
  )


def checked(c):
  """ok, or the names of the comparisons that failed."""
  if not c:
    return NM
  bad = [k for k, v in c.items() if not v.get("ok")]
  return "ok" if not bad else "FAILED " + ", ".join(bad)


def table(head, rows):
  out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  out += ["| " + " | ".join(str(x).replace("|", "\\|") for x in r) + " |" for r in rows]  # a plan name may hold "|"
  return "\n".join(out)


def kernel_tables(kb):
  if kb is None:
    return ["## Kernel level\n\n%s (no kernel_bench.json)" % NM]
  meta, rows = kb.get("meta", {}), kb.get("rows", [])
  out = []
  for mode, title in (("fwd", "forward"), ("fb", "forward+backward")):
    body = []
    for r in rows:
      m = r.get(mode)
      if not m:
        body.append([rowname(r)] + [NM] * 7)
        continue
      refused = " (cuDNN refused the graph)" if r.get("cudnn_sink_error") else ""
      theirs = tf(m["cudnn_sink"]) if "cudnn_sink" in m else NM + refused
      body.append(
        [
          rowname(r),
          tf(m.get("ours")),
          theirs,
          ratio(m.get("cudnn_over_ours")),
          ratio(m.get("aa_ours")),
          ratio(m.get("aa_cudnn")),
          r.get("plan_fwd" if mode == "fwd" else "plan_bwd", NM),
          checked(r.get("check")),
        ]
      )
    out.append(
      "## Kernel level, %s\n\n%s\n\nTFLOP/s at the median of the rounds; cuDNN / ours: cuDNN's time over "
      "ours paired per round, median [range] (> 1: ours faster); A/A: the second instance of a contender "
      "over the first.\n\n%s"
      % (
        title,
        stamp(meta, "kernel_bench.json"),
        table(
          [
            "row",
            "ours TFLOP/s",
            "cuDNN SDPA+sink TFLOP/s",
            "cuDNN / ours",
            "A/A ours",
            "A/A cuDNN",
            "our plan",
            "check",
          ],
          body or [[NM] * 8],
        ),
      )
    )
  return out


def jax_table(kb):
  if kb is None:
    return "## JAX end to end\n\n%s (no kernel_bench.json)" % NM
  body = []
  for r in kb.get("rows", []):
    line = [rowname(r)]
    for mode in ("fwd", "fb"):
      j = r.get("jax_" + mode)
      if not j:
        line += [NM] * 3
        continue
      line += [tf(j.get("jax_ours")), tf(j.get("jax_cudnn_vanilla")), ratio(j.get("cudnn_vanilla_over_ours"))]
    line.append(r.get("jax_error", ""))
    body.append(line)
  return (
    "## JAX end to end (host clock)\n\n%s\n\nsinkattn.dot_product_attention against "
    "jax.nn.dot_product_attention(implementation='cudnn') without a sink; cuDNN / ours as above.\n\n%s"
    % (
      stamp(kb.get("meta"), "kernel_bench.json"),
      table(
        [
          "row",
          "fwd ours TFLOP/s",
          "fwd jax.nn cuDNN",
          "fwd cuDNN / ours",
          "f+b ours TFLOP/s",
          "f+b jax.nn cuDNN",
          "f+b cuDNN / ours",
          "note",
        ],
        body or [[NM] * 8],
      ),
    )
  )


def decode_table(kb):
  if kb is None or not kb.get("decode"):
    return "## Decode\n\n%s%s" % (NM, " (no kernel_bench.json)" if kb is None else " (no decode rows)")
  meta = kb.get("meta", {})
  copy = meta.get("copy_GBps")
  body = [
    [
      "B%d S%d N%d/%d H%d" % (d["B"], d["S"], d["N"], d["K"], d["H"]),
      d["plan"] + (" *" if d.get("default") else ""),
      "%.4f [%.4f, %.4f]" % (d["ms"]["median"], d["ms"]["min"], d["ms"]["max"]),
      "%.0f" % d["GBps"],
      "%.1f" % (100 * d["of_copy"]),
      ratio(d.get("aa")),
      "ok" if d["check"]["ok"] else "FAILED",
    ]
    for d in kb["decode"]
  ]
  return (
    "## Decode (one token, every legal plan; * the default)\n\n%s\n\nBytes read over the median time, against "
    "the device-to-device copy measured in the same run (%s GB/s, read + write).\n\n%s"
    % (
      stamp(meta, "kernel_bench.json"),
      "%.0f" % copy if copy else NM,
      table(["shape", "plan", "ms [range]", "GB/s", "% of copy", "A/A", "check"], body),
    )
  )


def segments_table(sg):
  if sg is None:
    return "## Packed sequences (segment ids)\n\n%s (no segments.json)" % NM
  rows = sg.get("rows", [])
  dense = {(r["T"], r["H"]): r["fb_tflops"] for r in rows if r["docs"] == "dense" and r.get("fb_tflops")}
  body = []
  for key in dict.fromkeys((r["T"], r["H"], r["docs"]) for r in rows):
    rs = [r for r in rows if (r["T"], r["H"], r["docs"]) == key]
    line = ["T%d H%d" % key[:2], key[2]]
    for d in ("fwd ", "bwd "):
      mine = [r for r in rs if r["plan"].startswith(d)]
      if not mine:
        line += [NM, NM]
        continue
      best = min(mine, key=lambda r: r["ms"]["median"])
      line += ["%.3f" % mine[0]["ms"]["median"], "%.3f (%s)" % (best["ms"]["median"], best["plan"][4:])]
    fbs = [r["fb_tflops"] for r in rs if r.get("fb_tflops")]
    fb = max(fbs) if fbs else None
    ref = dense.get(key[:2])
    line += [
      "%.0f" % fb if fb else NM,
      "%.0f" % (100 * fb / ref) if fb and ref else NM,
      "ok" if all(r["check"]["ok"] for r in rs) else "FAILED",
    ]
    body.append(line)
  return (
    "## Packed sequences (segment ids)\n\n%s\n\nms of the default plan and of the fastest one; f+b useful "
    "TFLOP/s (pairs inside documents only; the default forward plus the fastest backward) and its share of the "
    "dense causal layer at the same T and H.\n\n%s"
    % (
      stamp(sg.get("meta"), "segments.json"),
      table(
        [
          "shape",
          "documents",
          "fwd default ms",
          "fwd fastest ms (plan)",
          "bwd default ms",
          "bwd fastest ms (plan)",
          "f+b useful TFLOP/s",
          "% of dense",
          "check",
        ],
        body or [[NM] * 9],
      ),
    )
  )


def progress_table(pg):
  if pg is None:
    return "## Progress under contention\n\n%s (no progress.jsonl)" % NM
  body, coop = [], []
  for p in pg:
    if "fatal" in p:
      body.append(["fatal", "", "", "", "no", "no", p["fatal"]])
      continue
    mode, st = p.get("mode"), p.get("status")
    if mode == "coop":
      coop.append(
        [
          p.get("ctx"),
          p.get("launch"),
          p.get("grid"),
          p.get("hog_k"),
          p.get("launch_status"),
          p.get("sync_status"),
          p.get("barrier_timeouts"),
        ]
      )
      continue
    if st == "KILLED":  # a process gpu_progress.sh's time limit ended: its args are all it left
      body.append(["(process)", p.get("args", ""), "", "", "no (killed, rc %s)" % p.get("rc"), "-", ""])
      continue
    if mode == "hog":
      where = "alone" if p.get("k") == 0 else "hog on %s SMs" % p.get("k")
    else:
      where = "green, %s SMs" % p.get("sms")
    if st == "refused":
      fin, ok = "refused by name", "-"
    elif st in ("HANG", "ERROR"):
      fin, ok = "no (%s)" % st.lower(), "-"  # it never returned a result to judge
    else:
      fin = {"before_hog_deadline": "yes", "after_hog": "only after the hog"}.get(p.get("finished"), "yes")
      ok = "yes" if st == "ok" else "no"
    body.append(
      [
        mode,
        "%s %s" % (p.get("shape", ""), p.get("kind", "")),
        p.get("plan", ""),
        where,
        fin,
        ok,
        p.get("ran_under_hog") or p.get("ran") or p.get("error", ""),
      ]
    )
  n_ok = sum(1 for p in pg if p.get("status") in ("ok", "refused"))
  out = (
    "## Progress under contention\n\n_progress.jsonl: its records carry no commit or device; gpu_verify.sh's "
    "summary.txt of the same run names them_\n\n%d of %d records ok or refused by name.\n\n%s"
    % (
      n_ok,
      len(pg),
      table(["mode", "case", "plan", "where", "finished", "correct", "ran / error"], body or [[NM] * 7]),
    )
  )
  if coop:
    out += "\n\nCooperative launch:\n\n" + table(
      ["context", "launch", "grid", "hog SMs", "launch", "sync", "barrier timeouts"], coop
    )
  return out


def render(kb, sg, pg):
  return (
    "\n\n".join(kernel_tables(kb) + [jax_table(kb), decode_table(kb), segments_table(sg), progress_table(pg)]) + "\n"
  )


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("dir", nargs="?", default=".", help="gpu_verify.sh's output folder (default: here)")
  ap.add_argument("--kernel", help="kernel_bench JSON (default DIR/kernel_bench.json)")
  ap.add_argument("--segments", help="segments_bench JSON (default DIR/segments.json)")
  ap.add_argument("--progress", help="gpu_progress.sh JSONL (default DIR/progress.jsonl)")
  ap.add_argument("--out", help="write the Markdown here instead of stdout")
  a = ap.parse_args(argv)
  kb = load(a.kernel or find(a.dir, "kernel_bench.json", "kernel_bench-*.json"))
  sg = load(a.segments or find(a.dir, "segments.json", "segments-*.json"))
  pg = load(a.progress or find(a.dir, "progress.jsonl", "progress*.jsonl"))
  text = render(kb, sg, pg)
  if a.out:
    with open(a.out, "w") as fh:
      fh.write(text)
  else:
    sys.stdout.write(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
