"""The layer logic shared by the linen modules (`sinkattn.flax`) and the nnx modules (`sinkattn.nnx`), free of
either framework: head sizes as Flax derives them, Flax's input defaults, RoPE, the projections' dot_general,
the KV-cache arithmetic and which kernel a cached call runs.

Shape letters: B batch, T query length, S key/value length, L cache length, N query heads, K kv heads,
H head dim, D model width.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp

from . import _validate
from ._enums import SOFTMAX_NAMES, Softmax
from ._validate import ArrayLike, Window
from .decode import decode_attention
from .ops import dot_product_attention

# A KV-cache call with at most this many new tokens runs `sinkattn.decode_attention` (split-KV: the cache is
# cut into chunks over threads / thread blocks); longer calls (prefill) keep `dot_product_attention`. On the
# 2-core CPU, decode vs fwd at T = 1 / 16 / 32 / 64: 0.26 vs 0.38, 0.98 vs 1.50, 1.77 vs 2.77, 3.5 vs 3.2 ms
# (B 1, S 4k, N/K 8/2, f32); 3.1 vs 6.5, 22 vs 29, 44 vs 52, 86 vs 99 ms (B 8, S 2k, N/K 64/8, bf16).
DECODE_MAX_TOKENS = 16

# The learnable sink: Transformer Engine's name `softmax_offset`, shape (1, N, 1, 1), fp32, zeros, and these
# logical axes (TE names the head axis 'nvte_head'; sinkattn.te.from_transformer_engine renames it).
SOFTMAX_OFFSET_AXES = (None, "heads", None, None)

__all__ = [
  "DECODE_MAX_TOKENS",
  "SOFTMAX_OFFSET_AXES",
  "Window",
  "apply_rope",
  "normalize_softmax_type",
  "projection_dot_general",
]


def normalize_softmax_type(softmax_type: Optional[str]) -> str:
  """The canonical softmax type name.

  Args:
    softmax_type: 'vanilla', 'off_by_one' (alias 'off-by-one') or 'learnable', any case; None reads as
      'vanilla' (a module is given no sinks, so None cannot mean 'learnable' here).

  Returns:
    'vanilla', 'off_by_one' or 'learnable'.

  Raises:
    ValueError: any other value.
  """
  if softmax_type is None:
    return "vanilla"
  if not isinstance(softmax_type, str) or softmax_type.lower() not in SOFTMAX_NAMES:
    raise ValueError(
      f"softmax_type {softmax_type!r} unknown: use 'vanilla', 'off_by_one' (or 'off-by-one') or 'learnable'"
    )
  return SOFTMAX_NAMES[softmax_type.lower()].name.lower()


def apply_rope(x: jax.Array, positions: ArrayLike, base: float = 10000.0) -> jax.Array:
  """Rotary position embedding, rotate-half convention (GPT-NeoX, gpt-oss).

  The rotation is computed in fp32: in bf16 the angle of position 4096 would already be off by ~16 rad * 2^-8.

  Args:
    x: [B,T,N,H] with H even.
    positions: [B,T] or [T] integer positions.
    base: the frequency base.

  Returns:
    [B,T,N,H] in x's dtype.

  Raises:
    ValueError: an odd head dim.
  """
  h = x.shape[-1]
  if h % 2:
    raise ValueError(f"apply_rope: head dim must be even, got x.shape={x.shape}")
  inv_freq = base ** (-jnp.arange(0, h // 2, dtype=jnp.float32) * 2.0 / h)  # [H/2]
  pos = jnp.asarray(positions, jnp.float32)
  if pos.ndim == 1:
    pos = pos[None, :]
  ang = pos[:, :, None, None] * inv_freq  # [B,T,1,H/2]
  cos, sin = jnp.cos(ang), jnp.sin(ang)
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _typed_spec(x):
  """(spec padded to x.ndim, sharding) of x's type: under an Explicit mesh the type names the mesh axes
  each dim is split over; elsewhere the spec is all None."""
  sharding = getattr(jax.typeof(x), "sharding", None)
  spec = tuple(getattr(sharding, "spec", None) or ())
  return spec + (None,) * (x.ndim - len(spec)), sharding


def projection_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, out_sharding=None):
  """`jax.lax.dot_general` for the q/k/v/out projections, naming the output sharding where JAX's
  explicit-sharding rule refuses to guess it.

  Under an Explicit mesh with heads on a mesh axis, the out projection contracts [B,T,N,H] with its
  kernel [N,H,D], both split over N on the same axis: each device holds a partial sum, and JAX raises
  ShardingTypeError ("contracting dimensions are sharded") rather than pick all-reduce or
  reduce-scatter. This picks all-reduce (Megatron's row-parallel layer): the output keeps the shardings of
  the dims that survive (batch dims, then lhs's free dims, then rhs's), as JAX types every unambiguous
  dot_general. Elsewhere (no mesh, Auto axes, a contraction split on one side only) out_sharding stays
  None and JAX decides.
  """
  if out_sharding is None:
    (l_con, r_con), (l_bat, r_bat) = dimension_numbers
    l_con, l_bat = [d % lhs.ndim for d in l_con], [d % lhs.ndim for d in l_bat]
    r_con, r_bat = [d % rhs.ndim for d in r_con], [d % rhs.ndim for d in r_bat]
    l_spec, l_sharding = _typed_spec(lhs)
    r_spec, _ = _typed_spec(rhs)
    if any(l_spec[i] is not None and r_spec[j] is not None for i, j in zip(l_con, r_con)):
      dims = (
        [l_spec[i] for i in l_bat]
        + [l_spec[i] for i in range(lhs.ndim) if i not in l_con and i not in l_bat]
        + [r_spec[i] for i in range(rhs.ndim) if i not in r_con and i not in r_bat]
      )
      used, out = set(), []
      for d in dims:  # a mesh axis may split one output dim only: the first keeps it
        axes = tuple(a for a in ((d,) if isinstance(d, str) else (d or ())) if a not in used)
        used.update(axes)
        out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
      out_sharding = jax.sharding.NamedSharding(l_sharding.mesh, jax.sharding.PartitionSpec(*out))
  kw = {} if preferred_element_type is None else dict(preferred_element_type=preferred_element_type)
  return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision, out_sharding=out_sharding, **kw)


def head_sizes(
  num_heads: int, num_kv_heads: Optional[int], qkv_features: Optional[int], head_dim: Optional[int], in_features: int
) -> Tuple[int, int]:
  """(K, H) as Flax derives them: H = qkv_features // N (qkv_features defaults to the input width D), or
  head_dim when given (then qkv_features, if given, must equal N * head_dim); K = num_kv_heads or N."""
  kvh = num_kv_heads or num_heads
  if num_heads % kvh:
    raise ValueError(f"num_kv_heads: {kvh} must divide num_heads {num_heads}")
  if head_dim is not None:
    if qkv_features is not None and qkv_features != num_heads * head_dim:
      raise ValueError(
        f"qkv_features: {qkv_features} != num_heads * head_dim = {num_heads} * {head_dim}: give one "
        "of them (qkv_features defines head_dim = qkv_features // num_heads, as in Flax)"
      )
    return kvh, head_dim
  features = qkv_features or in_features
  if features % num_heads:
    raise ValueError(f"qkv_features: {features} (default: the input width) must be divisible by num_heads {num_heads}")
  return kvh, features // num_heads


def key_value_inputs(inputs_q, inputs_k, inputs_v, inputs_kv, query_positions, key_value_positions):
  """Flax's defaults: inputs_k = inputs_q, inputs_v = inputs_k; inputs_kv (linen's older name) = both; in
  self-attention the keys' RoPE positions default to the queries'.

  Returns:
    (inputs_k, inputs_v, key_value_positions, whether this is self-attention).
  """
  self_attention = inputs_k is None and inputs_v is None and inputs_kv is None
  if inputs_kv is not None:
    if inputs_k is not None or inputs_v is not None:
      raise ValueError("inputs_kv: given together with inputs_k / inputs_v: pass inputs_k (and inputs_v) only")
    inputs_k = inputs_v = inputs_kv
  if inputs_k is None:
    if inputs_v is not None:
      raise ValueError("inputs_k: None while inputs_v is given: pass inputs_k (inputs_v defaults to it)")
    inputs_k = inputs_q
  if self_attention and key_value_positions is None:
    key_value_positions = query_positions
  return inputs_k, (inputs_k if inputs_v is None else inputs_v), key_value_positions, self_attention


def check_decode_inputs(self_attention: bool, **arrays) -> None:
  """A cached call takes its keys / values, lengths and segment ids from the cache."""
  given = [name for name, x in arrays.items() if x is not None]
  if given or not self_attention:
    raise ValueError(
      f"decode=True: {(given or ['inputs_k / inputs_v'])[0]} given, but keys / values, lengths and "
      "segment ids come from the cache: pass only inputs_q (and query_positions, mask)"
    )


def rotate(q, k, query_positions, key_value_positions, base: float, keys_cached: bool):
  """RoPE on q and on k (unless k is a cache, whose keys were rotated when stored); positions default to
  0..T-1 / 0..S-1."""
  q = apply_rope(q, jnp.arange(q.shape[1]) if query_positions is None else query_positions, base)
  if not keys_cached:
    k = apply_rope(k, jnp.arange(k.shape[1]) if key_value_positions is None else key_value_positions, base)
  return q, k


def flax_only_arguments(attention_fn: Any, qk_einsum: Any = None, value_einsum: Any = None) -> None:
  """Module arguments that plug other code into Flax's own attention: sinkattn's modules run the fused op."""
  for name, x in (
    ("attention_fn", attention_fn),
    ("qk_attn_weights_einsum_cls", qk_einsum),
    ("attn_weights_value_einsum_cls", value_einsum),
  ):
    if x is not None:
      raise NotImplementedError(
        f"{name}: {x!r} replaces part of Flax's own attention, but sinkattn's module always "
        "runs sinkattn.dot_product_attention: leave it None (or use Flax's module with "
        "attention_fn=sinkattn.dot_product_attention)"
      )


def check_dropout(dropout_rate: float, deterministic: Optional[bool]) -> None:
  """Dropout is not implemented: a rate > 0 is accepted only when deterministic is True."""
  _validate.flax_arguments(
    dropout_rate=dropout_rate,
    deterministic=deterministic,
    broadcast_dropout=True,
    precision=None,
    force_fp32_for_softmax=True,
    qk_attn_weights_einsum=None,
    attn_weights_value_einsum=None,
  )


def cache_update(cached_k, cached_v, index, k, v, query_positions, rope_base: Optional[float]):
  """Writes the T new keys / values [B,T,K,H] into caches [B,L,K,H] at `index` (RoPE-rotated at their
  positions when rope_base is given); -> (cached_k, cached_v, positions of the new tokens [B,T] int32)."""
  b, t = k.shape[0], k.shape[1]
  pos = index + jnp.arange(t, dtype=jnp.int32)
  pos = jnp.broadcast_to(pos if query_positions is None else query_positions, (b, t))
  if rope_base is not None:
    k = apply_rope(k, pos, rope_base)
  cached_k = jax.lax.dynamic_update_slice(cached_k, k.astype(cached_k.dtype), (0, index, 0, 0))
  cached_v = jax.lax.dynamic_update_slice(cached_v, v.astype(cached_v.dtype), (0, index, 0, 0))
  return cached_k, cached_v, pos


def cached_call(t: int, filled, batch: int, is_causal: bool, mask) -> dict:
  """The keywords of DotProductAttention's call for T new tokens over a cache filled up to `filled` (the new
  ones included): bottom-right alignment (the last query sees the last filled key), through
  decode_attention (cache_lengths) when T <= DECODE_MAX_TOKENS, the call is causal (or T = 1) and no mask
  is given (decode takes none), else dot_product_attention with key_value_seq_lengths."""
  lengths = jnp.full((batch,), filled, jnp.int32)
  if t <= DECODE_MAX_TOKENS and (is_causal or t == 1) and mask is None:
    return dict(cache_lengths=lengths, causal_alignment="bottom_right")
  return dict(key_value_seq_lengths=lengths, causal_alignment="bottom_right")


def attend(
  query,
  key,
  value,
  sinks,
  *,
  softmax_type: str,
  scale,
  is_causal: bool,
  causal_alignment: str,
  local_window_size: Window,
  implementation,
  cache_lengths=None,
  return_residual: bool = False,
  module: Any = None,
  logits_soft_cap: Optional[float] = None,
  **arrays,
):
  """The op a DotProductAttention module runs: decode_attention over a cache (cache_lengths given; causal,
  bottom-right, no other arrays), else dot_product_attention with `arrays` (bias, mask, lengths, segment ids,
  positions, precision); both with the soft-cap."""
  if cache_lengths is not None:
    given = [n for n, x in arrays.items() if x is not None and n != "precision"]
    if given or module is not None:
      raise ValueError(f"cache_lengths: decode_attention takes no {(given or ['module'])[0]}")
    return decode_attention(
      query,
      key,
      value,
      cache_lengths,
      sinks=sinks,
      softmax_type=softmax_type,
      local_window_size=local_window_size,
      scale=scale,
      return_residual=return_residual,
      implementation=implementation,
      logits_soft_cap=logits_soft_cap,
    )
  return dot_product_attention(
    query,
    key,
    value,
    sinks=sinks,
    softmax_type=softmax_type,
    scale=scale,
    is_causal=is_causal,
    causal_alignment=causal_alignment,
    local_window_size=local_window_size,
    return_residual=return_residual,
    implementation=implementation,
    module=module,
    logits_soft_cap=logits_soft_cap,
    **arrays,
  )


def module_call(
  m,
  sinks_of,
  query,
  key,
  value,
  bias,
  mask,
  *,
  is_causal: bool,
  causal_alignment: Optional[str],
  return_residual: bool,
  cache_lengths,
  precision,
  sow_module,
  **arrays,
):
  """The call of sinkattn.flax.DotProductAttention and sinkattn.nnx.DotProductAttention, one contract for both:
  m's fields (num_heads, softmax_type, scale, is_causal, causal_alignment, local_window_size, dtype,
  implementation, logits_soft_cap) with the call's arguments; sinks_of(N) gives m's softmax_offset (1, N, 1, 1),
  called with 'learnable' only."""
  if getattr(query, "ndim", None) != 4 or m.num_heads not in (None, query.shape[2]):
    want = "N" if m.num_heads is None else f"N={m.num_heads}"
    raise ValueError(f"query: expected shape [B,T,{want},H], got shape {getattr(query, 'shape', type(query))}")
  sinks = sinks_of(query.shape[2]) if learnable(m.softmax_type) else None
  if m.dtype is not None:
    query, key, value = (jnp.asarray(x, m.dtype) for x in (query, key, value))
  return attend(
    query,
    key,
    value,
    sinks,
    softmax_type=normalize_softmax_type(m.softmax_type),
    scale=m.scale,
    is_causal=m.is_causal or is_causal,
    causal_alignment=causal_alignment or m.causal_alignment,
    local_window_size=m.local_window_size,
    implementation=m.implementation,
    logits_soft_cap=m.logits_soft_cap,
    cache_lengths=cache_lengths,
    return_residual=return_residual,
    module=sow_module,
    bias=bias,
    mask=mask,
    precision=precision,
    **arrays,
  )


def learnable(softmax_type: Optional[str]) -> bool:
  return normalize_softmax_type(softmax_type) == Softmax.LEARNABLE.name.lower()
