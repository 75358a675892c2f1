"""The C library's enums and dtype codes (include/sinkattn.h), defined once for the whole package."""

from __future__ import annotations

import enum

import jax.numpy as jnp
import numpy as np


class Softmax(enum.IntEnum):
  """sa_softmax: the sink logit a_n is -inf, 0 or sinks[n]."""

  VANILLA = 0
  OFF_BY_ONE = 1
  LEARNABLE = 2


class Causal(enum.IntEnum):
  """sa_causal: no causal mask, j <= i (top-left) or j <= i + kv_len - q_len (bottom-right)."""

  NONE = 0
  TOP_LEFT = 1
  BOTTOM_RIGHT = 2


class Backend(enum.IntEnum):
  """sa_backend."""

  AUTO = 0
  REF = 1
  CPU = 2
  CUDA = 3


class PlanKind(enum.IntEnum):
  """The `which` argument of the plan queries (src/sa_plan.h)."""

  FWD = 0
  BWD = 1
  DECODE = 2


# softmax_type names accepted by the Python API (the TE spelling 'off_by_one' and the paper's 'off-by-one').
SOFTMAX_NAMES = {
  "vanilla": Softmax.VANILLA,
  "off_by_one": Softmax.OFF_BY_ONE,
  "off-by-one": Softmax.OFF_BY_ONE,
  "learnable": Softmax.LEARNABLE,
}

# sa_dtype of q/k/v (and of a bias, which may differ from q's).
DTYPE_CODES = {np.dtype(np.float32): 0, np.dtype(jnp.float16): 1, np.dtype(jnp.bfloat16): 2}
FLOAT_DTYPES = tuple(DTYPE_CODES)


def dtype_code(dtype) -> int:
  """sa_dtype of a float32 / float16 / bfloat16 dtype (KeyError for any other)."""
  return DTYPE_CODES[np.dtype(dtype)]
