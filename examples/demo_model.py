"""The demo's model (examples/demo.py, `make demo`): a small gpt-oss-style language model built on
`sinkattn.flax.MultiHeadAttention`, its text sampling through the KV cache, and the per-head report of the
attention mass on the sink.
"""

from __future__ import annotations

import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sinkattn.flax import MultiHeadAttention


class Block(nn.Module):
  """x [B,T,D] -> x + attn(norm(x)) -> + mlp(norm(.)). window=None: full causal attention."""

  d_model: int
  heads: int
  kv_heads: int
  window: int | None
  softmax_type: str
  implementation: str | None
  decode: bool = False
  collect_lse: bool = False

  @nn.compact
  def __call__(self, x):
    attn = MultiHeadAttention(
      num_heads=self.heads,
      num_kv_heads=self.kv_heads,
      head_dim=self.d_model // self.heads,
      softmax_type=self.softmax_type,
      is_causal=True,
      use_rope=True,
      local_window_size=None if self.window is None else (self.window - 1, 0),
      implementation=self.implementation,
      decode=self.decode,
      name="attn",
    )
    y = nn.RMSNorm(name="norm_attn")(x)
    if self.collect_lse:
      y, lse = attn(y, return_residual=True)
      self.sow("intermediates", "lse", lse)  # [B,T,N]
    else:
      y = attn(y)
    x = x + y
    y = nn.RMSNorm(name="norm_mlp")(x)
    # SwiGLU of width 2D (gpt-oss's experts use 1D): half the MLP time of the usual 4D on 2 CPU cores
    gate = nn.Dense(2 * self.d_model, use_bias=False, name="gate")(y)
    up = nn.Dense(2 * self.d_model, use_bias=False, name="up")(y)
    return x + nn.Dense(self.d_model, use_bias=False, name="down")(nn.silu(gate) * up)


class LanguageModel(nn.Module):
  """tokens [B,T] int32 -> logits [B,T,vocab] fp32."""

  vocab_size: int
  d_model: int = 64
  layers: int = 4
  heads: int = 4
  kv_heads: int = 2
  window: int = 32
  softmax_type: str = "learnable"
  implementation: str | None = None
  decode: bool = False
  collect_lse: bool = False

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(self.vocab_size, self.d_model, name="embed")(tokens)
    for i in range(self.layers):
      x = Block(
        self.d_model,
        self.heads,
        self.kv_heads,
        self.window if i % 2 == 0 else None,
        self.softmax_type,
        self.implementation,
        self.decode,
        self.collect_lse,
        name=f"block_{i}",
      )(x)
    x = nn.RMSNorm(name="norm_out")(x)
    return nn.Dense(self.vocab_size, use_bias=False, name="head")(x).astype(jnp.float32)


def sink_report(model, params, batch):
  """Per layer: sink logits [N] and mean attention mass on the sink [N] (exp(sink - lse) over b, i)."""
  _, state = model.clone(collect_lse=True).apply({"params": params}, batch, mutable=["intermediates"])
  rows = []
  for i in range(model.layers):
    lse = state["intermediates"][f"block_{i}"]["lse"][0]  # [B,T,N]
    core = params[f"block_{i}"]["attn"].get("attention", {})  # empty unless learnable
    if "softmax_offset" in core:
      sink = jnp.reshape(core["softmax_offset"], (-1,))
    else:
      sink = jnp.full((model.heads,), 0.0 if model.softmax_type.startswith("off") else -jnp.inf)
    mass = jnp.exp(sink[None, None, :] - lse).mean(axis=(0, 1))
    rows.append((np.asarray(sink), np.asarray(mass)))
  return rows


def generate(model, params, prompt, steps: int, key, temperature: float = 0.7, stats=None):
  """Sample `steps` tokens after prompt [B,T0] with a KV cache; returns [B, T0 + steps] int32.

  Each call appends to the cache of every MultiHeadAttention (decode=True): the prompt in one prefill
  call (`dot_product_attention` with bottom-right alignment when T0 > 16), then one token per call
  through `sinkattn.decode_attention` (split-KV over the filled cache). A dict `stats` receives
  "tokens_per_s": generated tokens (all B rows) per second of the one-token steps after the first
  (which compiles).
  """
  dec = model.clone(decode=True, collect_lse=False)
  total = prompt.shape[1] + steps
  shapes = jax.eval_shape(dec.init, jax.random.key(0), jnp.zeros((prompt.shape[0], total), jnp.int32))
  cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes["cache"])

  @jax.jit
  def step(cache, tokens, key):
    logits, state = dec.apply({"params": params, "cache": cache}, tokens, mutable=["cache"])
    nxt = jax.random.categorical(key, logits[:, -1] / temperature).astype(jnp.int32)
    return state["cache"], nxt

  out = [prompt]
  cache, nxt = step(cache, prompt, key)
  t0 = None
  for i in range(steps - 1):
    if i == 1:  # steps 0 (prefill) and 1 (first decode) compiled
      t0 = time.perf_counter()
    out.append(nxt[:, None])
    cache, nxt = step(cache, nxt[:, None], jax.random.fold_in(key, i))
  out.append(nxt[:, None])
  tokens = jnp.concatenate(out, axis=1).block_until_ready()
  if stats is not None and t0 is not None:
    stats["tokens_per_s"] = prompt.shape[0] * (steps - 2) / (time.perf_counter() - t0)
  return tokens
