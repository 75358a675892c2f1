"""Flax linen modules around `sinkattn.dot_product_attention`.

Shape letters as in DESIGN.md: B batch, T query length, S key/value length, N query heads, K kv heads
(N % K == 0), H head dim of q/k, Hv head dim of v, D model width.

- `DotProductAttention`: the core op as a module. With softmax_type='learnable' it owns the sink logits,
  a parameter named `softmax_offset`, shape (1, N, 1, 1), fp32, zeros init, logical axes
  (None, 'heads', None, None): Transformer Engine's name, shape and sharding, so checkpoints move over.
- `MultiHeadAttention`: q/k/v/out projections (DenseGeneral, BTNH), GQA, optional RoPE, and an optional
  KV cache (`decode=True`, linen 'cache' collection) for autoregressive generation.

The helpers `normalize_softmax_type` and `apply_rope` are shared with `sinkattn.nnx`.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple, Union

import flax.linen as nn
import jax
import jax.numpy as jnp

from . import decode_attention, dot_product_attention

__all__ = ["DotProductAttention", "MultiHeadAttention", "apply_rope", "normalize_softmax_type",
           "SOFTMAX_OFFSET_AXES", "DECODE_MAX_TOKENS"]

# A KV-cache call with at most this many new tokens runs `sinkattn.decode_attention` (split-KV: the cache is
# cut into chunks over threads / thread blocks); longer calls (prefill) keep `dot_product_attention`. On the
# 2-core CPU, decode vs fwd at T = 1 / 16 / 32 / 64: 0.26 vs 0.38, 0.98 vs 1.50, 1.77 vs 2.77, 3.5 vs 3.2 ms
# (B 1, S 4k, N/K 8/2, f32); 3.1 vs 6.5, 22 vs 29, 44 vs 52, 86 vs 99 ms (B 8, S 2k, N/K 64/8, bf16).
DECODE_MAX_TOKENS = 16

SOFTMAX_OFFSET_AXES = (None, "heads", None, None)
_SOFTMAX_TYPES = {"vanilla": "vanilla", "off_by_one": "off_by_one", "off-by-one": "off_by_one",
                  "learnable": "learnable"}
Window = Optional[Union[int, Tuple[int, int]]]


def normalize_softmax_type(softmax_type: Optional[str]) -> str:
    """'vanilla' | 'off_by_one' (alias 'off-by-one') | 'learnable' (any case) -> canonical name; None ->
    'vanilla' (DESIGN.md section 3: None means 'learnable' only when sinks are given, and a module is given
    none); else ValueError."""
    if softmax_type is None:
        return "vanilla"
    try:
        return _SOFTMAX_TYPES[softmax_type.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"softmax_type {softmax_type!r} unknown: use 'vanilla', 'off_by_one' "
                         "(or 'off-by-one') or 'learnable'") from None


def apply_rope(x: jax.Array, positions: jax.Array, base: float = 10000.0) -> jax.Array:
    """Rotary position embedding, rotate-half convention (GPT-NeoX, gpt-oss).

    x [B,T,N,H] (H even), positions [B,T] or [T] integer -> [B,T,N,H] in x's dtype. The rotation is
    computed in fp32: in bf16 the angle of position 4096 would already be off by ~16 rad * 2^-8.
    """
    h = x.shape[-1]
    if h % 2:
        raise ValueError(f"apply_rope: head dim must be even, got x.shape={x.shape}")
    inv_freq = base ** (-jnp.arange(0, h // 2, dtype=jnp.float32) * 2.0 / h)      # [H/2]
    pos = jnp.asarray(positions, jnp.float32)
    if pos.ndim == 1:
        pos = pos[None, :]
    ang = pos[:, :, None, None] * inv_freq                                          # [B,T,1,H/2]
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _typed_spec(x):
    """(spec padded to x.ndim, sharding) of x's type: under an Explicit mesh the type names the mesh axes
    each dim is split over; elsewhere the spec is all None."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    spec = tuple(getattr(sharding, "spec", None) or ())
    return spec + (None,) * (x.ndim - len(spec)), sharding


def projection_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                           out_sharding=None):
    """`jax.lax.dot_general` for the q/k/v/out projections, naming the output sharding where JAX's
    explicit-sharding rule refuses to guess it.

    Under an Explicit mesh with heads on a mesh axis, the out projection contracts [B,T,N,H] with its
    kernel [N,H,D], both split over N on the same axis: each device holds a partial sum, and JAX raises
    ShardingTypeError ("contracting dimensions are sharded") rather than pick all-reduce or
    reduce-scatter. We pick all-reduce (Megatron's row-parallel layer): the output keeps the shardings of
    the dims that survive (batch dims, then lhs's free dims, then rhs's), as JAX types every unambiguous
    dot_general. Elsewhere (no mesh, Auto axes, a contraction split on one side only) out_sharding stays
    None and JAX decides as it always did. (The fault first showed where the jnp reference ran, which
    keeps q's heads sharding: implementation='reference', or f32 on a GPU, which the CUDA kernels do not
    take. The fused op's output was typed replicated then; sharding.py now types it like q too.)
    """
    if out_sharding is None:
        (l_con, r_con), (l_bat, r_bat) = dimension_numbers
        l_con, l_bat = [d % lhs.ndim for d in l_con], [d % lhs.ndim for d in l_bat]
        r_con, r_bat = [d % rhs.ndim for d in r_con], [d % rhs.ndim for d in r_bat]
        l_spec, l_sharding = _typed_spec(lhs)
        r_spec, _ = _typed_spec(rhs)
        if any(l_spec[i] is not None and r_spec[j] is not None for i, j in zip(l_con, r_con)):
            dims = ([l_spec[i] for i in l_bat] +
                    [l_spec[i] for i in range(lhs.ndim) if i not in l_con and i not in l_bat] +
                    [r_spec[i] for i in range(rhs.ndim) if i not in r_con and i not in r_bat])
            used, out = set(), []
            for d in dims:            # a mesh axis may split one output dim only: the first keeps it
                axes = tuple(a for a in ((d,) if isinstance(d, str) else (d or ())) if a not in used)
                used.update(axes)
                out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
            out_sharding = jax.sharding.NamedSharding(l_sharding.mesh, jax.sharding.PartitionSpec(*out))
    kw = {} if preferred_element_type is None else dict(preferred_element_type=preferred_element_type)
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision, out_sharding=out_sharding,
                               **kw)


class DotProductAttention(nn.Module):
    """Fused attention with sinks: query [B,T,N,H], key [B,S,K,H], value [B,S,K,Hv] -> out [B,T,N,Hv].

    With `return_residual=True` the call returns `(out, lse)`, lse [B,N,T] fp32 including the sink
    (the attention mass on the sink of row i is exp(a_n - lse_i)).

    Attributes:
      softmax_type: 'vanilla' (or None) | 'off_by_one' | 'off-by-one' | 'learnable'. Only 'learnable'
        creates a parameter: `softmax_offset` (1, N, 1, 1) fp32, zeros init, logical axes (None, 'heads', None, None).
      scale: logit scale, default 1/sqrt(H) (the sink is not scaled).
      is_causal, causal_alignment ('top_left' | 'bottom_right'), local_window_size (w -> (w, w), or
        (left, right), -1 unbounded): the mask, exactly as `sinkattn.dot_product_attention` takes it.
        gpt-oss's 128-token sliding window is is_causal=True, local_window_size=(127, 0).
      dtype: cast q, k, v to this dtype before the op (None keeps theirs).
      implementation: None | 'fused' | 'reference', passed through.
    """
    softmax_type: Optional[str] = "vanilla"
    scale: Optional[float] = None
    is_causal: bool = False
    causal_alignment: str = "top_left"
    local_window_size: Window = None
    dtype: Any = None
    implementation: Optional[str] = None

    @nn.compact
    def __call__(self, query, key, value, *, query_seq_lengths=None, key_value_seq_lengths=None,
                 query_segment_ids=None, key_value_segment_ids=None, causal_alignment=None,
                 return_residual: bool = False, cache_lengths=None):
        """Lengths [B] int32 and segment ids [B,T] / [B,S] int32 as in `dot_product_attention`;
        `causal_alignment` overrides the attribute for this call (the KV-cache path uses it).
        `cache_lengths` [B] int32: key/value are KV caches filled up to it, the T <= 64 queries being the
        last T entries; runs `sinkattn.decode_attention` (causal, bottom-right; lengths and segment ids
        must then be None)."""
        softmax_type = normalize_softmax_type(self.softmax_type)
        sinks = None
        if softmax_type == "learnable":
            if query.ndim != 4:
                raise ValueError(f"query: expected [B,T,N,H], got shape {query.shape}")
            init = nn.with_logical_partitioning(nn.initializers.zeros_init(), SOFTMAX_OFFSET_AXES)
            sinks = self.param("softmax_offset", init, (1, query.shape[2], 1, 1), jnp.float32)
        if self.dtype is not None:
            query, key, value = (jnp.asarray(x, self.dtype) for x in (query, key, value))
        if cache_lengths is not None:
            return decode_attention(query, key, value, cache_lengths, sinks, softmax_type=softmax_type,
                                    local_window_size=self.local_window_size, scale=self.scale,
                                    return_residual=return_residual, implementation=self.implementation)
        return dot_product_attention(
            query, key, value, sinks, softmax_type=softmax_type, scale=self.scale,
            is_causal=self.is_causal, causal_alignment=causal_alignment or self.causal_alignment,
            local_window_size=self.local_window_size, query_seq_lengths=query_seq_lengths,
            key_value_seq_lengths=key_value_seq_lengths, query_segment_ids=query_segment_ids,
            key_value_segment_ids=key_value_segment_ids, return_residual=return_residual,
            implementation=self.implementation)


class MultiHeadAttention(nn.Module):
    """Projections + fused attention with sinks: inputs_q [B,T,D], inputs_kv [B,S,Dkv] -> [B,T,out_features].

    q = inputs_q W_q [B,T,N,H]; k, v = inputs_kv W_k, W_v [B,S,K,H]; out = attn(q, k, v) W_o.
    Submodules: 'query', 'key', 'value', 'out' (DenseGeneral) and 'attention' (`DotProductAttention`,
    which holds `softmax_offset` when softmax_type='learnable').

    Attributes:
      num_heads (N), head_dim (H), num_kv_heads (K, default N; GQA when K < N), out_features (default D).
      softmax_type, scale, is_causal, causal_alignment, local_window_size, implementation: as in
        `DotProductAttention`.
      use_rope, rope_base: rotary embedding on q and k (positions default to 0..T-1, or to the cache
        index onwards when decoding).
      use_bias, dtype (computation), param_dtype, kernel_init: of the projections.
      decode: keep a KV cache in the 'cache' collection. `init` with a full-length input [B,L,D] sizes
        it (L = the longest sequence); each later call (prefill of T tokens, then T = 1 steps) appends
        its keys/values and attends to the filled part with bottom-right causal alignment: through
        `sinkattn.decode_attention` when T <= DECODE_MAX_TOKENS (and is_causal, or T = 1), else through
        `dot_product_attention` with key_value_seq_lengths = the filled length.
    """
    num_heads: int
    head_dim: int
    num_kv_heads: Optional[int] = None
    out_features: Optional[int] = None
    softmax_type: Optional[str] = "vanilla"
    scale: Optional[float] = None
    is_causal: bool = False
    causal_alignment: str = "top_left"
    local_window_size: Window = None
    use_rope: bool = False
    rope_base: float = 10000.0
    use_bias: bool = False
    dtype: Any = None
    param_dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.lecun_normal()
    implementation: Optional[str] = None
    decode: bool = False

    def _dense(self, features: Sequence[int], axis, axes: Tuple[str, ...], name: str):
        return nn.DenseGeneral(
            features=tuple(features), axis=axis, use_bias=self.use_bias, dtype=self.dtype,
            param_dtype=self.param_dtype, name=name, dot_general=projection_dot_general,
            kernel_init=nn.with_logical_partitioning(self.kernel_init, axes))

    @nn.compact
    def __call__(self, inputs_q, inputs_kv=None, *, query_positions=None, key_value_positions=None,
                 query_seq_lengths=None, key_value_seq_lengths=None, query_segment_ids=None,
                 key_value_segment_ids=None, return_residual: bool = False):
        """inputs_q [B,T,D], inputs_kv [B,S,Dkv] (default inputs_q: self-attention); positions [B,T] /
        [B,S] int for RoPE; lengths [B], segment ids [B,T] / [B,S]. Returns [B,T,out_features], and
        lse [B,N,T] fp32 too with return_residual=True."""
        n, kvh = self.num_heads, self.num_kv_heads or self.num_heads
        if n % kvh:
            raise ValueError(f"num_heads {n} must be a multiple of num_kv_heads {kvh}")
        if inputs_kv is None:
            inputs_kv = inputs_q
            if key_value_positions is None:
                key_value_positions = query_positions
        q = self._dense((n, self.head_dim), -1, ("embed", "heads", "head_dim"), "query")(inputs_q)
        k = self._dense((kvh, self.head_dim), -1, ("embed", "kv_heads", "head_dim"), "key")(inputs_kv)
        v = self._dense((kvh, self.head_dim), -1, ("embed", "kv_heads", "head_dim"), "value")(inputs_kv)
        b, t = q.shape[0], q.shape[1]
        alignment = cache_lengths = None
        if self.decode:
            if any(x is not None for x in (query_seq_lengths, key_value_seq_lengths, query_segment_ids,
                                           key_value_segment_ids, key_value_positions)):
                raise ValueError("decode=True: lengths, segment ids and key_value_positions come from the "
                                 "cache; pass only inputs_q (and query_positions)")
            k, v, index, q_pos = self._cache_update(k, v, query_positions)
            key_value_seq_lengths = jnp.full((b,), index + t, jnp.int32)
            alignment = "bottom_right"    # the last query sees the last filled key
            query_positions = key_value_positions = q_pos
            if t <= DECODE_MAX_TOKENS and (self.is_causal or t == 1):   # decode_attention is always causal
                cache_lengths, key_value_seq_lengths = key_value_seq_lengths, None
        if self.use_rope:
            qp = jnp.arange(t) if query_positions is None else query_positions
            kp = jnp.arange(k.shape[1]) if key_value_positions is None else key_value_positions
            q = apply_rope(q, qp, self.rope_base)
            if not self.decode:           # cached keys were rotated before they were stored
                k = apply_rope(k, kp, self.rope_base)
        attn = DotProductAttention(
            softmax_type=self.softmax_type, scale=self.scale, is_causal=self.is_causal,
            causal_alignment=self.causal_alignment, local_window_size=self.local_window_size,
            dtype=self.dtype, implementation=self.implementation, name="attention")
        res = attn(q, k, v, query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
                   query_segment_ids=query_segment_ids, key_value_segment_ids=key_value_segment_ids,
                   causal_alignment=alignment, return_residual=return_residual, cache_lengths=cache_lengths)
        out, lse = res if return_residual else (res, None)
        features = self.out_features or inputs_q.shape[-1]
        y = self._dense((features,), (-2, -1), ("heads", "head_dim", "embed"), "out")(out)
        return (y, lse) if return_residual else y

    def _cache_update(self, k, v, query_positions):
        """Append k, v [B,T,K,H] at the cache index; returns the whole cache [B,L,K,H] (valid up to
        index + T), the old index and the positions of the new tokens [B,T]."""
        initialized = self.has_variable("cache", "cached_key")
        ck = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
        cv = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
        ci = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
        b, t = k.shape[0], k.shape[1]
        index = ci.value
        pos = index + jnp.arange(t, dtype=jnp.int32)
        pos = jnp.broadcast_to(pos if query_positions is None else query_positions, (b, t))
        if not initialized:               # init call: size the cache only
            return k, v, index, pos
        if self.use_rope:
            k = apply_rope(k, pos, self.rope_base)
        ck.value = jax.lax.dynamic_update_slice(ck.value, k.astype(ck.value.dtype), (0, index, 0, 0))
        cv.value = jax.lax.dynamic_update_slice(cv.value, v.astype(cv.value.dtype), (0, index, 0, 0))
        ci.value = index + t
        return ck.value, cv.value, index, pos
