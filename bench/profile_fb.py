"""One forward+backward (or forward, --fwd) through jax, for a kernel-by-kernel timing under ncu.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
        python3 bench/profile_fb.py [--B 4 --T 4096 --N 16 --K 16 --H 128 --causal] [--window 127] [--fwd] \
        [--contender cudnn]

The call runs three times (compile + warm-up, then two more); ncu lists every kernel launch in order with its
duration, so the last call's kernels, read off the end of the list, are what a forward+backward spends on the
GPU; against the bench's row for the same shape, the difference is what its timing loop adds (bench/NOTES.md).
--contender cudnn: jax.nn.dot_product_attention(implementation="cudnn") without sinks, the reference vanilla
kernel, timed the same way.
"""

import argparse

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
  ap.add_argument("--window", type=int, default=-1, help="a left window (local_window_size=(w, 0)); -1: none")
  ap.add_argument("--fwd", action="store_true", help="the forward alone")
  ap.add_argument("--contender", choices=["fused", "cudnn"], default="fused")
  a = ap.parse_args()
  ks = jax.random.split(jax.random.PRNGKey(0), 5)
  q = jax.random.normal(ks[0], (a.B, a.T, a.N, a.H), jnp.bfloat16)
  k = jax.random.normal(ks[1], (a.B, a.T, a.K, a.H), jnp.bfloat16)
  v = jax.random.normal(ks[2], (a.B, a.T, a.K, a.H), jnp.bfloat16)
  s = jax.random.uniform(ks[3], (a.N,), jnp.float32, -3, 3)
  dout = jax.random.normal(ks[4], q.shape, jnp.bfloat16)

  window = (a.window, 0) if a.window >= 0 else None

  def fused(q, k, v, s):
    return sinkattn.dot_product_attention(
      q, k, v, sinks=s, softmax_type="learnable", is_causal=a.causal, local_window_size=window
    )

  def cudnn(q, k, v, s):
    return jax.nn.dot_product_attention(q, k, v, is_causal=a.causal, local_window_size=window, implementation="cudnn")

  def fb(q, k, v, s, dout):
    f = fused if a.contender == "fused" else cudnn
    if a.fwd:
      return f(q, k, v, s)
    out, vjp = jax.vjp(f, q, k, v, s)
    return (out,) + tuple(vjp(dout))

  step = jax.jit(fb)
  for _ in range(3):
    jax.block_until_ready(step(q, k, v, s, dout))
  print("done", a)


if __name__ == "__main__":
  main()
