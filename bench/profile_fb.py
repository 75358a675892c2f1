"""One forward+backward through jax, for a kernel-by-kernel timing under ncu, or its wall time per call.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
        python3 bench/profile_fb.py [--B 4 --T 4096 --N 16 --K 16 --H 128 --causal] [--contender cudnn]
    python3 bench/profile_fb.py --wall 20 [...]

The call runs three times (compile + warm-up, then two more); ncu lists every kernel launch in order with its
duration, so the last call's kernels, read off the end of the list, are what a forward+backward spends on the
GPU. --wall N instead dispatches N calls back to back (no loop, no barrier) and prints the wall time per call:
with the kernel sum it separates the kernels from whatever the benchmark's timing loop adds (bench/NOTES.md).
--contender cudnn: jax.nn.dot_product_attention(implementation="cudnn") without sinks, the reference vanilla
kernel, timed the same way.
"""
import argparse
import time

import jax
import jax.numpy as jnp

import sinkattn


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--B", type=int, default=4)
  ap.add_argument("--T", type=int, default=4096)
  ap.add_argument("--N", type=int, default=16)
  ap.add_argument("--K", type=int, default=16)
  ap.add_argument("--H", type=int, default=128)
  ap.add_argument("--causal", action="store_true")
  ap.add_argument("--contender", choices=["fused", "cudnn"], default="fused")
  ap.add_argument("--wall", type=int, default=0)
  a = ap.parse_args()
  ks = jax.random.split(jax.random.PRNGKey(0), 5)
  q = jax.random.normal(ks[0], (a.B, a.T, a.N, a.H), jnp.bfloat16)
  k = jax.random.normal(ks[1], (a.B, a.T, a.K, a.H), jnp.bfloat16)
  v = jax.random.normal(ks[2], (a.B, a.T, a.K, a.H), jnp.bfloat16)
  s = jax.random.uniform(ks[3], (a.N,), jnp.float32, -3, 3)
  dout = jax.random.normal(ks[4], q.shape, jnp.bfloat16)

  def fused(q, k, v, s):
    return sinkattn.dot_product_attention(q, k, v, s, softmax_type="learnable", is_causal=a.causal)

  def cudnn(q, k, v, s):
    return jax.nn.dot_product_attention(q, k, v, is_causal=a.causal, implementation="cudnn")

  def fb(q, k, v, s, dout):
    out, vjp = jax.vjp(fused if a.contender == "fused" else cudnn, q, k, v, s)
    return (out,) + tuple(vjp(dout))

  step = jax.jit(fb)
  for _ in range(3):
    jax.block_until_ready(step(q, k, v, s, dout))
  if a.wall:
    t0 = time.perf_counter()
    res = [step(q, k, v, s, dout) for _ in range(a.wall)]
    jax.block_until_ready(res)
    ms = (time.perf_counter() - t0) / a.wall * 1e3
    flops = 3.5 * 4 * a.B * a.N * a.T * a.T * a.H * (0.5 if a.causal else 1.0)
    print(f"wall {a.contender} B{a.B} T{a.T} N{a.N}/{a.K} H{a.H} causal={a.causal}: {ms:.3f} ms per f+b, "
          f"{flops / ms / 1e9:.0f} TFLOP/s")
  else:
    print("done", a)


if __name__ == "__main__":
  main()
