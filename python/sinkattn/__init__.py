"""sinkattn: fused attention with attention sinks for JAX (C kernels behind XLA FFI calls).

    out = sinkattn.dot_product_attention(q, k, v, sinks, is_causal=True, local_window_size=(127, 0))

Submodules: ops (dot_product_attention), primitives (the raw FFI calls), reference (pure jnp twin),
flax / nnx (modules with a learnable `softmax_offset`), partitioning (sharded calls), context_parallel (ring
attention), bench.
"""

from ._lib import (
  FFIVersionError,
  LibraryNotFoundError,
  get_num_threads,
  has_cuda,
  last_plan,
  set_num_threads,
  simd_name,
)
from ._version import VERSION as __version__
from .context_parallel import ring_attention, ring_attention_sharded, zigzag_shard, zigzag_unshard
from .decode import decode_attention
from .ops import dot_product_attention


def __getattr__(name):
  """`sinkattn.flax` / `sinkattn.nnx` after a bare `import sinkattn` (the public API names them so),
  imported on first use so that the core op does not import flax."""
  if name in ("flax", "nnx"):
    import importlib

    return importlib.import_module(f"{__name__}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
  "dot_product_attention",
  "decode_attention",
  "ring_attention",
  "ring_attention_sharded",
  "zigzag_shard",
  "zigzag_unshard",
  "LibraryNotFoundError",
  "FFIVersionError",
  "has_cuda",
  "set_num_threads",
  "get_num_threads",
  "last_plan",
  "simd_name",
  "__version__",
]
