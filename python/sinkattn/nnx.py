"""flax.nnx modules around `sinkattn.dot_product_attention` (the twins of `sinkattn.flax`).

Shape letters as in DESIGN.md: B batch, T query length, S key/value length, N query heads, K kv heads,
H head dim, Hv value head dim, D model width.

- `DotProductAttention(num_heads, softmax_type=...)`: with 'learnable' it owns `softmax_offset`, an
  nnx.Param (1, N, 1, 1) fp32, zeros init, sharding metadata `out_sharding=(None, 'heads', None, None)`.
- `MultiHeadAttention(in_features, num_heads, head_dim, ...)`: LinearGeneral projections 'query', 'key',
  'value', 'out', the core as 'attention', GQA, optional RoPE, optional KV cache (`init_cache`).

Sharding metadata is always attached; it is applied eagerly (flax's `use_eager_sharding`) only when a mesh
is active, because flax raises for an eagerly sharded variable created without a mesh.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from . import decode_attention, dot_product_attention
from .flax import (DECODE_MAX_TOKENS, SOFTMAX_OFFSET_AXES, Window, apply_rope, normalize_softmax_type,
                    projection_dot_general)

__all__ = ["DotProductAttention", "MultiHeadAttention"]


def _partitioned(init: Callable, axes) -> Callable:
    """`init` with sharding metadata `axes`; eager sharding (flax >= 0.12) only under an active mesh."""
    if not hasattr(nnx, "using_eager_sharding"):      # flax < 0.12: metadata only, nothing eager
        return nnx.with_partitioning(init, axes)
    eager = nnx.using_eager_sharding() and not jax.sharding.get_abstract_mesh().empty
    return nnx.with_partitioning(init, axes, eager_sharding=eager)


# flax >= 0.12 makes an attribute first set to None static; nnx.data keeps the cache slots data.
_data = getattr(nnx, "data", lambda x: x)


class DotProductAttention(nnx.Module):
    """Fused attention with sinks: query [B,T,N,H], key [B,S,K,H], value [B,S,K,Hv] -> out [B,T,N,Hv],
    or (out, lse [B,N,T] fp32, including the sink) with return_residual=True.

    Args:
      num_heads: N (sizes `softmax_offset`): needed with 'learnable' only (an nnx parameter exists before
        the first call); when given, calls check query's heads against it.
      softmax_type: 'vanilla' (or None) | 'off_by_one' | 'off-by-one' | 'learnable'; only 'learnable'
        creates the parameter `softmax_offset` (1, N, 1, 1) fp32, zeros init.
      scale, is_causal, causal_alignment, local_window_size, implementation: passed through to
        `sinkattn.dot_product_attention`; dtype: cast q, k, v to it first (None keeps theirs).
      rngs: unused (the sink is zeros-initialised); accepted for symmetry with other nnx modules.
    """

    def __init__(self, num_heads: Optional[int] = None, *, softmax_type: Optional[str] = "vanilla",
                 scale: Optional[float] = None, is_causal: bool = False, causal_alignment: str = "top_left",
                 local_window_size: Window = None, dtype: Any = None, implementation: Optional[str] = None,
                 rngs: Optional[nnx.Rngs] = None):
        del rngs
        self.num_heads = num_heads
        self.softmax_type = normalize_softmax_type(softmax_type)
        self.scale, self.is_causal, self.causal_alignment = scale, is_causal, causal_alignment
        self.local_window_size, self.dtype, self.implementation = local_window_size, dtype, implementation
        if self.softmax_type == "learnable":
            if num_heads is None:
                raise ValueError("num_heads: None, but softmax_type='learnable' needs it to size softmax_offset "
                                 "(1, num_heads, 1, 1)")
            init = _partitioned(nnx.initializers.zeros_init(), SOFTMAX_OFFSET_AXES)
            self.softmax_offset = nnx.Param(init(jax.random.key(0), (1, num_heads, 1, 1), jnp.float32))
        else:
            self.softmax_offset = None

    def __call__(self, query, key, value, *, query_seq_lengths=None, key_value_seq_lengths=None,
                 query_segment_ids=None, key_value_segment_ids=None, causal_alignment=None,
                 return_residual: bool = False, cache_lengths=None):
        """Lengths [B] int32, segment ids [B,T] / [B,S] int32; `causal_alignment` overrides the
        attribute for this call. `cache_lengths` [B] int32: key/value are KV caches filled up to it, the
        T <= 64 queries being the last T entries; runs `sinkattn.decode_attention` (causal, bottom-right)."""
        if query.ndim != 4 or self.num_heads not in (None, query.shape[2]):
            raise ValueError(f"query: expected [B,T,N={self.num_heads},H], got shape {query.shape}")
        sinks = None if self.softmax_offset is None else self.softmax_offset[...]
        if self.dtype is not None:
            query, key, value = (jnp.asarray(x, self.dtype) for x in (query, key, value))
        if cache_lengths is not None:
            return decode_attention(query, key, value, cache_lengths, sinks, softmax_type=self.softmax_type,
                                    local_window_size=self.local_window_size, scale=self.scale,
                                    return_residual=return_residual, implementation=self.implementation)
        return dot_product_attention(
            query, key, value, sinks, softmax_type=self.softmax_type, scale=self.scale,
            is_causal=self.is_causal, causal_alignment=causal_alignment or self.causal_alignment,
            local_window_size=self.local_window_size, query_seq_lengths=query_seq_lengths,
            key_value_seq_lengths=key_value_seq_lengths, query_segment_ids=query_segment_ids,
            key_value_segment_ids=key_value_segment_ids, return_residual=return_residual,
            implementation=self.implementation)


class MultiHeadAttention(nnx.Module):
    """Projections + fused attention with sinks: inputs_q [B,T,D], inputs_kv [B,S,Dkv] -> [B,T,out_features].

    Args:
      in_features: D; num_heads: N; head_dim: H; num_kv_heads: K (default N; GQA when K < N);
      in_kv_features: Dkv (default D); out_features (default D).
      softmax_type, scale, is_causal, causal_alignment, local_window_size, implementation: as in
        `DotProductAttention`.
      use_rope, rope_base: rotary embedding on q and k.
      use_bias, dtype (computation), param_dtype, kernel_init: of the projections (kernels carry
        sharding metadata ('embed', 'heads' | 'kv_heads', 'head_dim') and ('heads', 'head_dim', 'embed')).
      rngs: for the projection kernels.

    Decoding: `init_cache(batch, max_len)` creates nnx.Cache variables; then calls with `decode=True`
    (a prefill of T tokens, then T = 1 steps) append keys/values and attend with bottom-right alignment,
    through `sinkattn.decode_attention` when T <= DECODE_MAX_TOKENS (and is_causal, or T = 1).
    """

    def __init__(self, in_features: int, num_heads: int, head_dim: int, *, num_kv_heads: Optional[int] = None,
                 in_kv_features: Optional[int] = None, out_features: Optional[int] = None,
                 softmax_type: Optional[str] = "vanilla", scale: Optional[float] = None, is_causal: bool = False,
                 causal_alignment: str = "top_left", local_window_size: Window = None, use_rope: bool = False,
                 rope_base: float = 10000.0, use_bias: bool = False, dtype: Any = None,
                 param_dtype: Any = jnp.float32, kernel_init: Callable = nnx.initializers.lecun_normal(),
                 implementation: Optional[str] = None, rngs: nnx.Rngs):
        kvh = num_kv_heads or num_heads
        if num_heads % kvh:
            raise ValueError(f"num_heads {num_heads} must be a multiple of num_kv_heads {kvh}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, kvh, head_dim
        self.use_rope, self.rope_base, self.dtype = use_rope, rope_base, dtype
        kv_in = in_kv_features or in_features

        def dense(fin, fout, axis, axes):
            return nnx.LinearGeneral(fin, fout, axis=axis, use_bias=use_bias, dtype=dtype,
                                     param_dtype=param_dtype, kernel_init=_partitioned(kernel_init, axes),
                                     dot_general=projection_dot_general, rngs=rngs)

        self.query = dense(in_features, (num_heads, head_dim), -1, ("embed", "heads", "head_dim"))
        self.key = dense(kv_in, (kvh, head_dim), -1, ("embed", "kv_heads", "head_dim"))
        self.value = dense(kv_in, (kvh, head_dim), -1, ("embed", "kv_heads", "head_dim"))
        self.out = dense((num_heads, head_dim), out_features or in_features, (-2, -1),
                         ("heads", "head_dim", "embed"))
        self.attention = DotProductAttention(
            num_heads, softmax_type=softmax_type, scale=scale, is_causal=is_causal,
            causal_alignment=causal_alignment, local_window_size=local_window_size, dtype=dtype,
            implementation=implementation)
        self.cached_key = self.cached_value = self.cache_index = _data(None)    # set by init_cache

    def init_cache(self, batch: int, max_len: int, dtype: Any = jnp.float32):
        """KV cache [B, max_len, K, H] (zeros) and its fill index."""
        shape = (batch, max_len, self.num_kv_heads, self.head_dim)
        self.cached_key = nnx.Cache(jnp.zeros(shape, dtype))
        self.cached_value = nnx.Cache(jnp.zeros(shape, dtype))
        self.cache_index = nnx.Cache(jnp.array(0, jnp.int32))

    def __call__(self, inputs_q, inputs_kv=None, *, query_positions=None, key_value_positions=None,
                 query_seq_lengths=None, key_value_seq_lengths=None, query_segment_ids=None,
                 key_value_segment_ids=None, decode: bool = False, return_residual: bool = False):
        """inputs_q [B,T,D], inputs_kv [B,S,Dkv] (default inputs_q); positions [B,T] / [B,S] int for RoPE;
        lengths [B], segment ids [B,T] / [B,S]. Returns [B,T,out_features] (and lse [B,N,T] fp32)."""
        if inputs_kv is None:
            inputs_kv = inputs_q
            if key_value_positions is None:
                key_value_positions = query_positions
        q, k, v = self.query(inputs_q), self.key(inputs_kv), self.value(inputs_kv)
        b, t = q.shape[0], q.shape[1]
        alignment = cache_lengths = None
        if decode:
            if self.cache_index is None:
                raise ValueError("decode=True needs init_cache(batch, max_len) first")
            if any(x is not None for x in (query_seq_lengths, key_value_seq_lengths, query_segment_ids,
                                           key_value_segment_ids, key_value_positions)):
                raise ValueError("decode=True: lengths, segment ids and key_value_positions come from the "
                                 "cache; pass only inputs_q (and query_positions)")
            index = self.cache_index[...]
            pos = index + jnp.arange(t, dtype=jnp.int32)
            query_positions = jnp.broadcast_to(pos if query_positions is None else query_positions, (b, t))
            if self.use_rope:
                k = apply_rope(k, query_positions, self.rope_base)
            dt = self.cached_key[...].dtype
            self.cached_key[...] = jax.lax.dynamic_update_slice(self.cached_key[...], k.astype(dt),
                                                                (0, index, 0, 0))
            self.cached_value[...] = jax.lax.dynamic_update_slice(self.cached_value[...], v.astype(dt),
                                                                  (0, index, 0, 0))
            self.cache_index[...] = index + t
            k, v = self.cached_key[...], self.cached_value[...]
            key_value_seq_lengths = jnp.full((b,), index + t, jnp.int32)
            alignment = "bottom_right"    # the last query sees the last filled key
            if t <= DECODE_MAX_TOKENS and (self.attention.is_causal or t == 1):   # decode is always causal
                cache_lengths, key_value_seq_lengths = key_value_seq_lengths, None
        elif self.use_rope:
            kp = jnp.arange(k.shape[1]) if key_value_positions is None else key_value_positions
            k = apply_rope(k, kp, self.rope_base)
        if self.use_rope:
            q = apply_rope(q, jnp.arange(t) if query_positions is None else query_positions, self.rope_base)
        res = self.attention(q, k, v, query_seq_lengths=query_seq_lengths,
                             key_value_seq_lengths=key_value_seq_lengths, query_segment_ids=query_segment_ids,
                             key_value_segment_ids=key_value_segment_ids, causal_alignment=alignment,
                             return_residual=return_residual, cache_lengths=cache_lengths)
        out, lse = res if return_residual else (res, None)
        y = self.out(out)
        return (y, lse) if return_residual else y
