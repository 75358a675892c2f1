"""The timing machinery of bench/jax_bench.py: calls chained in one jitted loop so XLA can neither hoist nor drop
them, compiled once, timed per call.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp


def _loop(fn, n, grad, mode="barrier"):
  """n calls of fn (fwd) or of its forward+backward in one jitted fori_loop, each call tied to the previous
  one so XLA can neither hoist it out of the loop nor drop any part of its work.

  mode "barrier" (default): q passes through lax.optimization_barrier together with the loop carry (a
  loop-variant value, so the call cannot be hoisted, and no copy of q is made), the backward takes a fixed
  cotangent dout (an argument, as in training, where it comes from the layer above), and every result (the
  output included: without it XLA drops the jnp contenders' forward P V, which training needs) passes
  through a second barrier before one element of each feeds the carry: the barrier forces the whole result
  to exist, so even the jnp contenders must compute all of it. What is timed is the attention alone.
  mode "sum": q + carry * 0 and a full sum of every result per call: an
  elementwise pass over q and a reduction over each output per call, the same for every contender, but up to
  ~20% of a T=1024 call.
  """
  if mode == "sum":

    def one(q, k, v, s, dout):
      if not grad:
        return jnp.sum(fn(q, k, v, s).astype(jnp.float32))
      gs = jax.grad(lambda q, k, v, s: jnp.sum(fn(q, k, v, s).astype(jnp.float32)), argnums=(0, 1, 2, 3))(q, k, v, s)
      return sum(jnp.sum(g.astype(jnp.float32)) for g in gs)

    def body_of(q, k, v, s, dout):
      def body(_, carry):
        y = one(q + carry * 0.0, k, v, s, dout)  # a data dependence on the previous call; x*0.0 is not folded
        return y.astype(q.dtype)

      return body

    init = lambda q: jnp.zeros((), q.dtype)  # noqa: E731
  else:

    def one(q, k, v, s, dout):
      if not grad:
        return (fn(q, k, v, s),)
      out, vjp = jax.vjp(fn, q, k, v, s)
      return (out,) + tuple(vjp(dout))  # out too: training feeds it to the next layer

    def body_of(q, k, v, s, dout):
      def body(_, carry):
        qq, carry = jax.lax.optimization_barrier((q, carry))
        res = jax.lax.optimization_barrier(one(qq, k, v, s, dout))
        return carry + sum(x.reshape(-1)[0].astype(jnp.float32) for x in res)

      return body

    init = lambda q: jnp.zeros((), jnp.float32)  # noqa: E731

  def run(q, k, v, s, dout):
    return jax.lax.fori_loop(0, n, body_of(q, k, v, s, dout), init(q))

  return jax.jit(run)


def compile_loop(fn, args, inner, grad, mode="barrier"):
  """The jitted loop of `inner` calls (see _loop), compiled and run once (warm-up); with XLA's temp bytes."""
  compiled = _loop(fn, inner, grad, mode).lower(*args).compile()
  jax.block_until_ready(compiled(*args))
  mem = compiled.memory_analysis()
  return compiled, None if mem is None else int(mem.temp_size_in_bytes)


def time_loop(compiled, args, inner, repeats):
  """`repeats` timings of one compiled loop, ms per call."""
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append((time.perf_counter() - t0) / inner * 1e3)
  return times
