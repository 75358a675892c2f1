"""The arrays of one attention call as named structures, shared by ops, primitives, partitioning, reference and
the ring, and the one conversion of lse between the C API's layout and the public one.

`Inputs` lists the forward's inputs in the order of the FFI handlers' buffers (src/ffi/ffi_attn.c, ARG_Q ..
ARG_KVPOS), `Grads` the backward's results in the order of theirs (RET_DQ .. RET_DBIAS). Both are NamedTuples,
so pytrees: custom_vjp, lax.platform_dependent and vmap take them whole, an absent array (None) is an empty
subtree, and no code indexes them by position.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp


class Inputs(NamedTuple):
  """q [B,T,N,H], k [B,S,K,H], v [B,S,K,Hv]; the rest None or: sinks float32 [N] (learnable softmax only),
  q_lens / kv_lens int32 [B], q_seg [B,T] / kv_seg [B,S] int32, bias [B|1,N|1,T|1,S|1] float, mask bool like
  bias (True = attend), q_pos [B,T] / kv_pos [B,S] int32."""

  q: Any
  k: Any
  v: Any
  sinks: Any = None
  q_lens: Any = None
  kv_lens: Any = None
  q_seg: Any = None
  kv_seg: Any = None
  bias: Any = None
  mask: Any = None
  q_pos: Any = None
  kv_pos: Any = None


class Grads(NamedTuple):
  """The backward's results: dq, dk, dv like q, k, v; dsinks float32 [N] (zeros unless learnable); dbias float32
  in bias's shape, or None when not asked for."""

  dq: Any
  dk: Any
  dv: Any
  dsinks: Any
  dbias: Any = None


# The input each gradient belongs to.
GRAD_OF = Grads(dq="q", dk="k", dv="v", dsinks="sinks", dbias="bias")


def lse_public(lse):
  """lse as the public API returns it, jax.nn's residual layout [B,T,N], from the C API's [B,N,T] (the kernels
  write one row of T per head; a transpose of B*N*T floats costs nothing beside the attention)."""
  return jnp.swapaxes(lse, -1, -2)
