"""bench/segments_bench.py: what packed sequences (segment ids) cost on the GPU today, against the same layer
without them. The Hopper forward takes segment ids at H64 (mask kind 4, hopper_fwd.cu: only the key tiles of the
rows' documents, each element tested; at H128 under SINKATTN_HOP_FWD_SEG128=1 until it has run on a GPU); the
backward runs the portable mma.sync kernels over every (query, key) pair the position mask allows. --portable adds
every segment contender again under SINKATTN_CUDA_HOPPER=0 (the portable forward too: what the Hopper forward
gains, side by side).

Per shape, interleaved over --rounds (sinkattn.bench's loop and timing), forward and forward+backward:
  dense     no segment ids: the Hopper path
  one_doc   segment ids all 0: the same mask as dense, on the portable path (what the path itself costs)
  docs_n    n equal documents a row (what a packed batch costs; useful pairs 1/n of dense or less)
TFLOP/s count each contender's useful pairs only (causal within a document), so docs_n reads low by its
wasted work. The result file goes to $OUT (default bench/results) stamped like sinkattn.bench's.

    python3 bench/segments_bench.py [--rounds 3] [--docs 4,16] [--portable]
"""
import argparse
import json
import os
import statistics

import jax
import jax.numpy as jnp
import numpy as np

import sinkattn
from sinkattn import bench

SHAPES = [(1, 4096, 64, 8, 64), (4, 4096, 16, 16, 128), (1, 16384, 16, 16, 128)]  # (B, T, N, K, H), causal


def useful_pairs(T, docs):
  """Causal (query, key) pairs inside documents: docs equal documents of T / docs rows (docs = 1: dense)."""
  L = T // docs
  return docs * L * (L + 1) // 2


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--inner", type=int, default=10)
  ap.add_argument("--docs", default="4,16")
  ap.add_argument("--portable", action="store_true")
  a = ap.parse_args()
  rows = []
  for (B, T, N, K, H) in SHAPES:
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((B, T, N, H)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((B, T, K, H)), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((B, T, K, H)), jnp.bfloat16)
    s = jnp.asarray(rng.uniform(-3, 3, N), jnp.float32)
    dout = jnp.asarray(rng.standard_normal((B, T, N, H)), jnp.bfloat16)
    args = (q, k, v, s, dout)
    cons = {"dense": (None, 1, None), "one_doc": (jnp.zeros((B, T), jnp.int32), 1, None)}
    for n in map(int, a.docs.split(",")):
      cons[f"docs_{n}"] = (jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32) // (T // n), (B, T)), n, None)
    if a.portable:
      for name in [n for n in cons if n != "dense"]:
        cons[name + "_portable"] = cons[name][:2] + ("SINKATTN_CUDA_HOPPER=0",)
    loops, samples = {}, {name: ([], []) for name in cons}
    for name, (seg, _, env) in cons.items():
      f = lambda q, k, v, s, seg=seg: sinkattn.dot_product_attention(
          q, k, v, s, is_causal=True, query_segment_ids=seg, key_value_segment_ids=seg)
      with bench._env(env):
        loops[name] = [bench.compile_loop(f, args, a.inner, g)[0] for g in (False, True)]
    names = list(cons)
    for rnd in range(a.rounds):
      j = rnd % len(names)
      for name in names[j:] + names[:j]:
        with bench._env(cons[name][2]):
          for g in (0, 1):
            samples[name][g].extend(bench.time_loop(loops[name][g], args, a.inner, a.repeats))
    for name, (_, docs, _) in cons.items():
      fl = 4.0 * B * N * H * useful_pairs(T, docs)
      fwd, fb = statistics.median(samples[name][0]), statistics.median(samples[name][1])
      rows.append(dict(B=B, T=T, N=N, K=K, H=H, causal=True, contender=name, docs=docs, fwd_ms=fwd, fwdbwd_ms=fb,
                       fwd_tflops=fl / fwd * 1e-9, fwdbwd_tflops=3.5 * fl / fb * 1e-9,
                       fwd_ms_samples=samples[name][0], fwdbwd_ms_samples=samples[name][1]))
      print("B%d T%d N%d/%d H%d causal %-16s fwd %8.3f ms %6.1f TF/s  f+b %8.3f ms %6.1f TF/s" % (
          B, T, N, K, H, name, fwd, rows[-1]["fwd_tflops"], fb, rows[-1]["fwdbwd_tflops"]), flush=True)
  meta = dict(commit=bench._git_commit(), device=jax.devices()[0].device_kind, jax=jax.__version__,
              rounds=a.rounds, repeats=a.repeats, inner=a.inner)
  out = os.path.join(os.environ.get("OUT", "bench/results"), f"segments-{meta['commit'][:7]}.json")
  with open(out, "w") as fh:
    json.dump(dict(meta=meta, rows=rows), fh, indent=1)
  print("# wrote", out)


if __name__ == "__main__":
  main()
