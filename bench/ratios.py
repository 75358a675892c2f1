"""bench/ratios.py FILE.json [FILE.json ...]: the fused kernel against cuDNN (and fused_ab, the same kernel under
other switches, in result files written before the switches were read once per process) row by row, from
bench/jax_bench.py result files: TFLOP/s forward / forward+backward, and the ratios fused / cuDNN and
fused / fused_ab (> 1: fused is faster). With --rounds > 1 the files hold every timing;
then each ratio also gets its spread: the ratio of every round's own medians, min..max (rounds time the
contenders in turn, so a round's ratio compares timings taken seconds apart).
"""

import json
import statistics
import sys


def key(r):
  w = r.get("window")
  return (
    f"B{r['B']} T{r['T']} N{r['N']}/{r['K']} H{r['H']}"
    + (" causal" if r["causal"] else "")
    + (f" w{tuple(w)}" if w else "")
  )


def per_round(r, col, rounds):
  s = r.get(col + "_ms_samples")
  if not s or rounds < 2:
    return None
  n = len(s) // rounds
  return [statistics.median(s[i * n : (i + 1) * n]) for i in range(rounds)]


def ratio_text(a, b, col, rounds):
  """a's speed over b's: b ms / a ms, with the per-round spread when there is one."""
  txt = "%.3f" % (b[col + "_ms"] / a[col + "_ms"])
  ra, rb = per_round(a, col, rounds), per_round(b, col, rounds)
  if ra and rb:
    rr = [y / x for x, y in zip(ra, rb)]
    txt += " (%.2f..%.2f)" % (min(rr), max(rr))
  return txt


def main(paths):
  for path in paths:
    d = json.load(open(path))
    rounds = d["meta"].get("rounds", 1)
    print(
      f"# {path}: commit {d['meta']['commit'][:10]}, {d['meta']['device']}, rounds {rounds}"
      + (f", fused_ab: {d['meta']['ab_env']}" if d["meta"].get("ab_env") else "")
    )
    rows = {}
    for r in d["rows"]:
      rows.setdefault(key(r), {})[r["contender"]] = r
    print(
      "%-36s %13s %24s %24s %24s %24s" % ("row", "fused TF/s", "fwd vs cuDNN", "f+b vs cuDNN", "fwd vs ab", "f+b vs ab")
    )
    for k, c in rows.items():
      f = c.get("fused")
      if not f:
        continue
      cells = ["%6.0f/%6.0f" % (f["fwd_tflops"], f["fwdbwd_tflops"])]
      for other in ("cudnn_no_sink", "fused_ab"):
        o = c.get(other)
        cells += [ratio_text(f, o, "fwd", rounds), ratio_text(f, o, "fwdbwd", rounds)] if o else ["-", "-"]
      print("%-36s %13s %24s %24s %24s %24s" % (k, *cells))


if __name__ == "__main__":
  main(sys.argv[1:])
