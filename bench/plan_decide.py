"""bench/plan_decide.py: the decision table of a timing run (bench/gpu_verify.sh PART=perf33): what each
measurement says about a plan default, and the change in src/cuda/plan.c it implies.

Inputs (each optional; a missing one is reported as such):
  --wait F.json       bench/plan_bench.py --dir bwd: hopper.bwd.onepass.wait beside the default one pass
  --decode F.json     bench/kernel_bench.py's decode rows: cuda.decode.mma beside .half, .x2, .x4
  --anchors F.json    bench/kernel_bench.py --grid h200_gptoss: our forward against cuDNN 9.27's published figures
  --plans F.json ...  bench/plan_bench.py runs of every Hopper plan on the rows below cuDNN (information only)
  --stage DIR --gate NAME,... --decode-gate NAME,...  the steps (DIR/NAME.rc) that must have passed before the one
                      pass's / the decode's default flips

Rules. Noise of a comparison: the larger deviation from 1 of the two contenders' A/A medians. The one pass waits
always (SA_HOP_OP_WAIT_DEFAULT 1) when on EVERY row whose default is the one pass its cost, median(wait / default)
- 1, is below 1% + noise, its outputs passed, and the gate steps passed (synccheck, racecheck, test_cuda). A decode
variant with pct P becomes the default below a chunk C (SA_DEC_MMA_SHORT_SPLITS_PCT P, SA_DEC_MMA_SHORT_CHUNK C)
when it beats the default by more than 1% + noise at B8 S4k, and at no timed shape whose default chunk is <= C does
it lose more than 1% + noise; C is the largest default chunk for which that holds.
"""

import argparse
import json
import os
import statistics
import sys

PLAN_C = "src/cuda/plan.c"
VARIANT_PCT = {"cuda.decode.mma.half": 50, "cuda.decode.mma.x2": 200, "cuda.decode.mma.x4": 400}


def load(path):
  if not path or not os.path.exists(path):
    return None
  with open(path) as fh:
    return json.load(fh)


def paired(num, den):
  r = [a / b for a, b in zip(num, den)]
  return statistics.median(r) if r else float("nan")


def gates(stage, names):
  """[(name, rc)] of the gate steps; rc '?' when the step left no status."""
  out = []
  for n in [x for x in names.split(",") if x]:
    try:
      with open(os.path.join(stage, n + ".rc")) as fh:
        out.append((n, fh.read().strip()))
    except OSError:
      out.append((n, "?"))
  return out


def decide_wait(data, gate_rcs, lines):
  if not data:
    lines.append("1 one pass always waits: NO RESULT (plan_bench --dir bwd did not run)")
    return
  rows, worst, costs, ok = [], None, [], True
  for r in data["rows"]:
    w = r["plans"].get("hopper.bwd.onepass.wait")
    d = r["plans"].get(r["default"])
    if not r["default"].startswith("hopper.bwd.onepass") or not w:
      continue
    cost = w["over_default"]["median"] - 1
    noise = max(abs(d["aa"]["median"] - 1), abs(w["aa"]["median"] - 1))
    row_ok = cost < 0.01 + noise and w["check"]["ok"]
    ok = ok and row_ok
    costs.append(cost)
    if worst is None or cost - noise > worst[0]:
      worst = (cost - noise, r["name"], cost, noise)
    rows.append(
      "    %-30s wait / default %.4f [%.4f, %.4f]  noise %.2f%%  %s%s"
      % (
        r["name"],
        w["over_default"]["median"],
        w["over_default"]["min"],
        w["over_default"]["max"],
        100 * noise,
        "ok" if row_ok else "COSTS",
        "" if w["check"]["ok"] else " (CHECK FAILED)",
      )
    )
  bad_gates = [n for n, rc in gate_rcs if rc != "0"]
  if not rows:
    lines.append("1 one pass always waits: NO RESULT (no row whose default is the one pass)")
    return
  flip = ok and not bad_gates
  lines.append(
    "1 one pass always waits: %d rows, cost median %+.2f%%, worst %+.2f%% (%s, noise %.2f%%); gates %s -> %s"
    % (
      len(rows),
      100 * statistics.median(costs),
      100 * worst[2],
      worst[1],
      100 * worst[3],
      "all passed" if not bad_gates else "FAILED: " + ",".join(bad_gates),
      "FLIP: %s: #define SA_HOP_OP_WAIT_DEFAULT 1 (then remake tests/plan/golden.txt)" % PLAN_C
      if flip
      else "KEEP the skip (SA_HOP_OP_WAIT_DEFAULT 0)",
    )
  )
  lines.extend(rows)


def decode_groups(data):
  """{(B, S): {plan: row}} of kernel_bench's decode rows."""
  g = {}
  for d in data.get("decode", []):
    g.setdefault((d["B"], d["S"]), {})[d["plan"]] = d
  return g


def chunk_of(d):
  for f in d.get("ran", "").split():
    if f.startswith("chunk="):
      return int(f[6:])
  return None


def decide_decode(data, gate_rcs, lines):
  if not data or not data.get("decode"):
    lines.append("2 decode split count: NO RESULT (kernel_bench decode did not run)")
    return
  groups, shapes = decode_groups(data), []
  table = {}  # variant -> {(B, S): (gain, noise, the default's chunk, check ok, of copy)}
  for key, plans in sorted(groups.items()):
    dflt = next((d for d in plans.values() if d["default"]), None)
    if not dflt:
      continue
    for v in VARIANT_PCT:
      if v in plans:
        x = plans[v]
        gain = paired(dflt["ms"]["samples"], x["ms"]["samples"]) - 1  # > 0: the variant is faster
        noise = max(abs(dflt["aa"]["median"] - 1), abs(x["aa"]["median"] - 1))
        table.setdefault(v, {})[key] = (gain, noise, chunk_of(dflt), x["check"]["ok"], x["of_copy"])
    best = max(plans.values(), key=lambda d: d["of_copy"])
    gains = ["%s %+.1f%%" % (v.split(".")[-1], 100 * table[v][key][0]) for v in VARIANT_PCT if key in table.get(v, {})]
    shapes.append(
      "    B%-3d S%-7d default %5.1f%% of copy (chunk %s); best %s %5.1f%%; %s"
      % (key[0], key[1], 100 * dflt["of_copy"], chunk_of(dflt), best["plan"], 100 * best["of_copy"], "  ".join(gains))
    )
  target, picks = (8, 4096), []
  for v, per in table.items():
    if target not in per or not (per[target][0] > 0.01 + per[target][1] and per[target][3]):
      continue
    cut = None
    for c in sorted({x[2] for x in per.values() if x[2] is not None}):  # the largest chunk it never loses below
      if all(g > -(0.01 + n) and ok for (g, n, cc, ok, _) in per.values() if cc is not None and cc <= c):
        cut = c
      else:
        break
    if cut is not None and cut >= per[target][2]:
      picks.append((per[target][0], v, cut, per[target][4]))
  dflt_copy = next((d["of_copy"] for d in groups.get(target, {}).values() if d["default"]), None)
  head = "2 decode split count at B8 S4k: default %s of copy" % ("%.1f%%" % (100 * dflt_copy) if dflt_copy else "?")
  bad_gates = [n for n, rc in gate_rcs if rc != "0"]
  if bad_gates:
    lines.append(head + " -> KEEP: gate steps FAILED: " + ",".join(bad_gates))
  elif not picks:
    lines.append(head + " -> KEEP the one-wave rule (no variant wins by > 1% + noise)")
  else:
    gain, v, cut, copy = max(picks)
    change = "%s: #define SA_DEC_MMA_SHORT_SPLITS_PCT %d" % (PLAN_C, VARIANT_PCT[v])
    if cut != 1024:
      change += ", #define SA_DEC_MMA_SHORT_CHUNK %d" % cut
    lines.append(
      head + "; %s %+.1f%% (%.1f%% of copy, default chunks <= %d) -> FLIP: %s (then remake tests/plan/golden.txt, "
      "update tests/test_plan.c's decode rows)" % (v, 100 * gain, 100 * copy, cut, change)
    )
  lines.extend(shapes)


def decide_anchors(data, lines):
  rows = [r for r in (data or {}).get("rows", []) if r.get("anchor")]
  if not rows:
    lines.append("3 gpt-oss against cuDNN 9.27's figures: NO RESULT")
    return
  lines.append("3 gpt-oss forward against cuDNN 9.27's published H200 figures (ours / theirs, > 1: ours faster):")
  for r in rows:
    x, cd = r["anchor"], r["fwd"].get("cudnn_sink")
    lines.append(
      "    T%-6d %-12s ours %8.4f ms %5.0f TFLOP/s; anchor %g %s; ours / anchor %.3f; installed cuDNN / ours %s  %s"
      % (
        r["T"],
        "window 127,0" if r["window"] else "causal",
        r["fwd"]["ours"]["median"],
        r["fwd"]["ours"]["tflops"],
        x["anchor"],
        x["unit"],
        x["ours_over_anchor"],
        "%.3f" % r["fwd"]["cudnn_over_ours"]["median"] if cd else "-",
        "ok" if r["check"]["ours_vs_ref"]["ok"] else "CHECK FAILED",
      )
    )


def report_plans(runs, lines):
  for data in runs:
    if not data:
      continue
    label = data["meta"].get("label") or data["meta"].get("plans")
    lines.append("4 %s (plan / default time, > 1 slower; information, no default changes):" % label)
    for r in data["rows"]:
      alts = [(x["over_default"]["median"], p) for p, x in r["plans"].items() if p != r["default"]]
      best = min(alts) if alts else None
      fails = [p for p, x in r["plans"].items() if not x["check"]["ok"]]
      lines.append(
        "    %s %-28s default %-24s %8.4f ms; %s%s"
        % (
          r["direction"],
          r["name"],
          r["default"],
          r["plans"][r["default"]]["ms"]["median"],
          "  ".join("%s %.3f" % (p.replace("hopper.", ""), m) for m, p in sorted(alts)) if alts else "no other plan",
          "; CHECK FAILED: " + ",".join(fails) if fails else "",
        )
      )
      if best and best[0] < 0.99:
        lines.append("      %s is %.1f%% faster than the default here" % (best[1], 100 * (1 / best[0] - 1)))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--wait")
  ap.add_argument("--decode")
  ap.add_argument("--anchors")
  ap.add_argument("--plans", nargs="*", default=[])
  ap.add_argument("--stage", default=".")
  ap.add_argument("--gate", default="")
  ap.add_argument("--decode-gate", default="")
  ap.add_argument("--out", help="write the table here as well")
  a = ap.parse_args(argv)
  lines = ["decision table (item, measurement -> verdict and the one change it implies)"]
  decide_wait(load(a.wait), gates(a.stage, a.gate), lines)
  decide_decode(load(a.decode), gates(a.stage, a.decode_gate), lines)
  decide_anchors(load(a.anchors), lines)
  report_plans([load(p) for p in a.plans], lines)
  text = "\n".join(lines) + "\n"
  sys.stdout.write(text)
  if a.out:
    with open(a.out, "w") as fh:
      fh.write(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
