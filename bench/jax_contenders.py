"""bench/jax_contenders.py: the end-to-end JAX contenders of bench/kernel_bench.py, timed with the host clock:
jax.nn.dot_product_attention's cuDNN route (vanilla: it has no sink) and our sinkattn.dot_product_attention
(learnable sinks) through its XLA FFI call. One jitted executable runs the call on each of R input sets in turn
(R as the kernel-level rotation, every result returned so that nothing is dropped); `reps` executables are queued
before one block_until_ready, so dispatch is paid once per R * reps calls. Figure: host time / (R * reps),
forward or forward+backward (jax.vjp with a fixed cotangent), per round in rotated order like gpu_timing.Timer.
"""

import math
import time


def _attn_fns(jax, sinkattn, causal, window):
  def cudnn(q, k, v, s):
    return jax.nn.dot_product_attention(q, k, v, is_causal=causal, local_window_size=window, implementation="cudnn")

  def ours(q, k, v, s):
    return sinkattn.dot_product_attention(q, k, v, sinks=s, is_causal=causal, local_window_size=window)

  return {"jax_cudnn_vanilla": cudnn, "jax_ours": ours}


def build(jax, jnp, sinkattn, shape, sets, seed=0):
  """{(name, mode): (compiled executable, args)} for mode in fwd / fb, on `sets` input sets of shape."""
  B, T, N, K, H, causal, window = shape
  keys = jax.random.split(jax.random.PRNGKey(seed), 5 * sets)
  args = []
  for i in range(sets):
    kq, kk, kv, kd, ks = keys[5 * i : 5 * i + 5]
    args += [
      jax.random.normal(kq, (B, T, N, H), jnp.bfloat16),
      jax.random.normal(kk, (B, T, K, H), jnp.bfloat16),
      jax.random.normal(kv, (B, T, K, H), jnp.bfloat16),
      jax.random.uniform(ks, (N,), jnp.float32, -10, 10),
      jax.random.normal(kd, (B, T, N, H), jnp.bfloat16),
    ]
  out = {}
  for name, fn in _attn_fns(jax, sinkattn, causal, window).items():

    def fwd(*a, fn=fn):
      return [fn(*a[5 * i : 5 * i + 4]) for i in range(sets)]

    def fb(*a, fn=fn):
      res = []
      for i in range(sets):
        o, vjp = jax.vjp(fn, *a[5 * i : 5 * i + 4])
        res.append((o, vjp(a[5 * i + 4])))
      return res

    for mode, f in (("fwd", fwd), ("fb", fb)):
      exe = jax.jit(f).lower(*args).compile()
      jax.block_until_ready(exe(*args))
      out[(name, mode)] = exe
  return out, args


def rounds(jax, exes, args, sets, mode, rounds_n=5, target_ms=20.0):
  """{name, name#2: [ms per call per round]}: each contender twice (A/A) in rotated order."""
  names = sorted({n for n, m in exes if m == mode})
  order = names + [n + "#2" for n in names]
  reps = {}
  for n in names:
    t0 = time.perf_counter()
    jax.block_until_ready(exes[(n, mode)](*args))
    reps[n] = max(2, min(50, math.ceil(target_ms * 1e-3 / max(time.perf_counter() - t0, 1e-5))))
  out = {n: [] for n in order}
  for r in range(rounds_n):
    j = r % len(order)
    for n in order[j:] + order[:j]:
      base = n.split("#")[0]
      exe = exes[(base, mode)]
      t0 = time.perf_counter()
      res = [exe(*args) for _ in range(reps[base])]
      jax.block_until_ready(res)
      out[n].append((time.perf_counter() - t0) * 1e3 / (reps[base] * sets))
  return out
