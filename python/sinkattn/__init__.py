"""sinkattn: fused attention with attention sinks for JAX (C kernels behind XLA FFI calls).

    out = sinkattn.dot_product_attention(q, k, v, sinks=sinks, is_causal=True, local_window_size=(127, 0))

dot_product_attention is a drop-in for jax.nn.dot_product_attention (its arguments in its order and meaning:
bias, mask True = attend, the residual lse [B,T,N]), with sinks and sinkattn's options as keywords.

Public submodules (imported on first use, so the core op does not import flax): `sinkattn.flax` (linen) and
`sinkattn.nnx` (modules with a learnable `softmax_offset`, one contract for both), `sinkattn.te` (Transformer
Engine's module, mask convention and checkpoints). The other modules are the implementation.
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

# The public submodules (the API reference documents these and the package itself: docs/api/build.py).
SUBMODULES = ("flax", "nnx", "te")


def __getattr__(name):
  """`sinkattn.flax` / `sinkattn.nnx` / `sinkattn.te` after a bare `import sinkattn` (the public API names them
  so), imported on first use so that the core op does not import flax."""
  if name in SUBMODULES:
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
