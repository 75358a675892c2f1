"""Bad input: the exception type and the words of its message, for dot_product_attention (trace time)
and for the C handlers reached directly through the primitives (FFI errors, never a crash)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sinkattn
from conftest import make_inputs
from sinkattn import _lib, primitives
from sinkattn._inputs import Inputs

Q, K, V, SINKS = make_inputs(0, B=2, T=8, S=6, N=4, K=2, H=16, Hv=8)
I32 = lambda *s: jnp.zeros(s, jnp.int32)

# (id, argument overrides, exception type, substrings that must all appear in the message)
BAD = [
  ("query_rank", dict(query=Q[None]), ValueError, ["query", "[B,T,N,H]", "[T,N,H]", "(1, 2, 8, 4, 16)"]),
  ("query_not_array", dict(query=[[1.0]]), TypeError, ["query", "list"]),
  ("query_int", dict(query=Q.astype(jnp.int32)), TypeError, ["query", "int32"]),
  ("query_f64_fused", dict(query=np.zeros((2, 8, 4, 16), np.float64)), TypeError, ["query", "float64"]),
  ("key_dtype", dict(key=K.astype(jnp.bfloat16)), TypeError, ["key", "bfloat16", "float32"]),
  ("key_head_dim", dict(key=K[..., :8]), ValueError, ["key", "(2, 6, 2, 8)", "16"]),
  ("key_batch", dict(key=K[:1]), ValueError, ["key", "(1, 6, 2, 16)"]),
  ("value_len", dict(value=V[:, :5]), ValueError, ["value", "(2, 5, 2, 8)", "(2, 6, 2, Hv)"]),
  ("gqa_divides", dict(key=jnp.zeros((2, 6, 3, 16)), value=jnp.zeros((2, 6, 3, 8))), ValueError, ["K = 3", "N = 4"]),
  ("sinks_shape", dict(sinks=SINKS[:3]), ValueError, ["sinks", "(3,)", "(4,)", "(1, 4, 1, 1)"]),
  ("sinks_int", dict(sinks=jnp.zeros(4, jnp.int32)), TypeError, ["sinks", "int32"]),
  ("sinks_list", dict(sinks=[0.0] * 4), TypeError, ["sinks", "list", "(4,)", "(1, 4, 1, 1)"]),
  ("sinks_with_vanilla", dict(softmax_type="vanilla"), ValueError, ["sinks", "vanilla", "learnable"]),
  ("learnable_without_sinks", dict(sinks=None, softmax_type="learnable"), ValueError, ["sinks", "None"]),
  ("softmax_type", dict(softmax_type="softmax1"), ValueError, ["softmax_type", "softmax1", "off_by_one"]),
  ("causal_alignment", dict(causal_alignment="bottom"), ValueError, ["causal_alignment", "bottom_right"]),
  ("is_causal_type", dict(is_causal=1), TypeError, ["is_causal", "bool"]),
  ("window_negative", dict(local_window_size=-2), ValueError, ["local_window_size", "-2"]),
  # jax.nn reads a negative side as a window shifted off the diagonal; sinkattn's unbounded side is None
  ("window_minus_one", dict(local_window_size=-1), ValueError, ["local_window_size", "-1", "shifted", "None"]),
  ("window_pair_negative", dict(local_window_size=(-1, 3)), ValueError, ["local_window_size", "(-1, 3)", "None"]),
  ("window_triple", dict(local_window_size=(1, 2, 3)), ValueError, ["local_window_size", "pair"]),
  ("window_float", dict(local_window_size=2.5), TypeError, ["local_window_size", "float"]),
  (
    "window_bottom_right_no_causal",
    dict(causal_alignment="bottom_right", local_window_size=4),
    ValueError,
    ["bottom_right", "is_causal=True"],
  ),
  ("scale_nan", dict(scale=float("nan")), ValueError, ["scale", "nan"]),
  ("scale_array", dict(scale=jnp.float32(0.5) + jnp.zeros(())), TypeError, ["scale", "static"]),
  ("q_lens_shape", dict(query_seq_lengths=I32(3)), ValueError, ["query_seq_lengths", "(3,)", "(2,)"]),
  (
    "kv_lens_float",
    dict(key_value_seq_lengths=jnp.zeros(2)),
    TypeError,
    ["key_value_seq_lengths", "float32", "integer"],
  ),
  (
    "q_seg_shape",
    dict(query_segment_ids=I32(2, 6), key_value_segment_ids=I32(2, 6)),
    ValueError,
    ["query_segment_ids", "(2, 6)", "(2, 8)"],
  ),
  (
    "kv_seg_shape",
    dict(query_segment_ids=I32(2, 8), key_value_segment_ids=I32(2, 8)),
    ValueError,
    ["key_value_segment_ids", "(2, 8)", "(2, 6)"],
  ),
  ("seg_only_one", dict(query_segment_ids=I32(2, 8)), ValueError, ["key_value_segment_ids", "both"]),
  ("implementation", dict(implementation="triton"), ValueError, ["implementation", "triton", "cudnn", "xla"]),
  ("return_residual_type", dict(return_residual="yes"), TypeError, ["return_residual", "bool"]),
  # bias / mask: rank 4, each dim 1 or the full [B,N,T,S] = (2, 4, 8, 6)
  (
    "bias_rank",
    dict(bias=jnp.zeros((1, 2, 4, 8, 6))),
    ValueError,
    ["bias", "rank 4", "(1, 2, 4, 8, 6)", "(2, 4, 8, 6)"],
  ),
  ("bias_dim", dict(bias=jnp.zeros((1, 4, 7, 6))), ValueError, ["bias", "dim 2 is 7", "T = 8", "(1, 4, 7, 6)"]),
  ("bias_kv_heads", dict(bias=jnp.zeros((1, 2, 8, 6))), ValueError, ["bias", "dim 1 is 2", "N = 4"]),
  ("bias_int", dict(bias=jnp.zeros((1, 1, 8, 6), jnp.int32)), TypeError, ["bias", "int32", "float32", "mask="]),
  ("bias_bool", dict(bias=jnp.zeros((1, 1, 8, 6), bool)), TypeError, ["bias", "bool", "mask="]),
  ("bias_complex", dict(bias=jnp.zeros((1, 1, 8, 6), jnp.complex64)), TypeError, ["bias", "complex64"]),
  ("bias_f64_fused", dict(bias=np.zeros((1, 1, 8, 6))), TypeError, ["bias", "float64"]),
  ("bias_list", dict(bias=[[0.0]]), TypeError, ["bias", "list", "(2, 4, 8, 6)"]),
  ("mask_rank", dict(mask=jnp.ones((1, 2, 1, 8, 6), bool)), ValueError, ["mask", "rank 4", "(1, 2, 1, 8, 6)"]),
  ("mask_low_rank_heads", dict(mask=jnp.ones((2, 8, 6), bool)), ValueError, ["mask", "dim 1 is 2", "N = 4"]),
  ("mask_dim", dict(mask=jnp.ones((2, 1, 1, 5), bool)), ValueError, ["mask", "dim 3 is 5", "S = 6"]),
  ("mask_complex", dict(mask=jnp.ones((1, 1, 8, 6), jnp.complex64)), TypeError, ["mask", "complex64"]),
  ("positions_one", dict(query_positions=I32(2, 8), is_causal=True), ValueError, ["key_value_positions", "both"]),
  (
    "positions_shape",
    dict(query_positions=I32(2, 6), key_value_positions=I32(2, 6), is_causal=True),
    ValueError,
    ["query_positions", "(2, 6)", "(2, 8)"],
  ),
  (
    "positions_float",
    dict(query_positions=jnp.zeros((2, 8)), key_value_positions=I32(2, 6), is_causal=True),
    TypeError,
    ["query_positions", "float32", "integer"],
  ),
  (
    "positions_no_mask",
    dict(query_positions=I32(2, 8), key_value_positions=I32(2, 6)),
    ValueError,
    ["query_positions", "is_causal", "local_window_size"],
  ),
  (
    "positions_bottom_right",
    dict(query_positions=I32(2, 8), key_value_positions=I32(2, 6), is_causal=True, causal_alignment="bottom_right"),
    ValueError,
    ["causal_alignment", "positions"],
  ),
  # Flax's attention_fn arguments
  ("dropout", dict(dropout_rate=0.1), NotImplementedError, ["dropout_rate", "deterministic=True"]),
  ("dropout_range", dict(dropout_rate=1.5, deterministic=True), ValueError, ["dropout_rate", "[0, 1)"]),
  ("einsum", dict(qk_attn_weights_einsum=jnp.einsum), NotImplementedError, ["qk_attn_weights_einsum", "None"]),
  ("precision", dict(precision=2.0), TypeError, ["precision", "Precision"]),
  ("precision_name", dict(precision="bogus"), ValueError, ["precision", "'bogus'", "'highest'"]),
  ("precision_pair", dict(precision=("foo", 3)), TypeError, ["precision", "('foo', 3)", "pair"]),
  ("precision_pair_name", dict(precision=("highest", "fast")), ValueError, ["precision", "'fast'"]),
  (
    "precision_algorithm",
    dict(precision=jax.lax.DotAlgorithmPreset.BF16_BF16_F32),
    TypeError,
    ["precision", "DotAlgorithmPreset"],
  ),
  ("cudnn_on_cpu", dict(implementation="cudnn"), RuntimeError, ["implementation='cudnn'", "GPU"]),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_arguments(case):
  name, over, exc, words = case
  if name == "cudnn_on_cpu" and jax.default_backend() == "gpu":
    pytest.skip("a GPU is present: implementation='cudnn' can run")
  args = dict(query=Q, key=K, value=V, sinks=SINKS)
  args.update(over)
  q, k, v, s = (args.pop(n) for n in ("query", "key", "value", "sinks"))
  with pytest.raises(exc) as info:
    sinkattn.dot_product_attention(q, k, v, sinks=s, **args)
  msg = str(info.value)
  for w in words:
    assert w in msg, f"{w!r} not in {msg!r}"


def test_window_none_side_is_unbounded():
  """None is an unbounded window side (the C API's -1), alone or in a pair."""
  want = sinkattn.dot_product_attention(Q, K, V, sinks=SINKS, is_causal=True)
  for w in ((None, None), (None, 0)):
    got = sinkattn.dot_product_attention(Q, K, V, sinks=SINKS, is_causal=True, local_window_size=w)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_errors_at_trace_time():
  """Under jit the error comes while tracing: nothing reaches the kernel."""
  with pytest.raises(ValueError, match="sinks"):
    jax.jit(lambda q: sinkattn.dot_product_attention(q, K, V, sinks=SINKS[:2])).lower(Q)


KW = dict(softmax=2, causal=0, window_left=-1, window_right=-1, diag_offset=0, scale=0.25)

# Inconsistent buffers handed straight to the C handler: an FFI error naming the buffer and shapes.
FFI_BAD = [
  (
    "key_head_dim",
    lambda: primitives.attn_fwd(Inputs(Q, K[..., :8], V, SINKS), **KW),
    ["INVALID_ARGUMENT", "key", "[2,6,2,8]", "[2,?,?,16]"],
  ),
  ("sinks_len", lambda: primitives.attn_fwd(Inputs(Q, K, V, SINKS[:3]), **KW), ["sinks", "[3]", "[4]"]),
  (
    "lens_dtype",
    lambda: primitives.attn_fwd(Inputs(Q, K, V, SINKS, q_lens=I32(3)), **KW),
    ["query_seq_lengths", "[3]", "[2]"],
  ),
  (
    "value_dtype",
    lambda: primitives.attn_fwd(Inputs(Q, K, V.astype(jnp.float16), SINKS), **KW),
    ["value", "float16", "float32"],
  ),
  (
    "gqa",
    lambda: primitives.attn_fwd(Inputs(Q, jnp.zeros((2, 6, 3, 16)), jnp.zeros((2, 6, 3, 8)), SINKS), **KW),
    ["q_heads", "kv_heads"],
  ),
  (
    "softmax_enum",
    lambda: primitives.attn_fwd(Inputs(Q, K, V), **dict(KW, softmax=7)),
    ["softmax"],
  ),
  (
    "window_enum",
    lambda: primitives.attn_fwd(Inputs(Q, K, V, SINKS), **dict(KW, window_left=-5)),
    ["window_left", "-5"],
  ),
  (
    "bwd_dout_shape",
    lambda: primitives.attn_bwd(
      Inputs(Q, K, V, SINKS), jnp.zeros((2, 8, 4, 8)), jnp.zeros((2, 4, 8)), jnp.zeros((2, 8, 4, 7)), None, **KW
    ),
    ["dout", "[2,8,4,7]", "[2,8,4,8]"],
  ),
]


# The bias / mask / positions buffers, checked by the C handler.
FFI_BAD_BIAS = [
  (
    "bias_dims",
    lambda: primitives.attn_fwd(Inputs(Q, K, V, SINKS, bias=jnp.zeros((1, 4, 7, 6))), **KW),
    ["INVALID_ARGUMENT", "bias", "[1,4,7,6]", "[2,4,8,6]"],
  ),
  (
    "bias_dtype",
    lambda: primitives.attn_fwd(Inputs(Q, K, V, SINKS, bias=I32(1, 4, 8, 6)), **KW),
    ["bias", "int32", "float32"],
  ),
  (
    "mask_dims",
    lambda: primitives.attn_fwd(Inputs(Q, K, V, SINKS, mask=jnp.ones((2, 1, 8, 5), bool)), **KW),
    ["mask", "[2,1,8,5]"],
  ),
  (
    "positions_bottom_right",
    lambda: primitives.attn_fwd(Inputs(Q, K, V, SINKS, q_pos=I32(2, 8), kv_pos=I32(2, 6)), **dict(KW, causal=2)),
    ["causal", "positions"],
  ),
]
FFI_BAD += FFI_BAD_BIAS


@pytest.mark.parametrize("case", FFI_BAD, ids=[(c.values[0] if hasattr(c, "values") else c)[0] for c in FFI_BAD])
def test_ffi_errors(case, on_cpu):
  _, call, words = case
  with pytest.raises(Exception) as info:
    jax.block_until_ready(call())
  msg = str(info.value)
  for w in words:
    assert w in msg, f"{w!r} not in {msg!r}"


def test_missing_library_message(monkeypatch, tmp_path):

  monkeypatch.setattr(_lib, "_lib", None)
  monkeypatch.setattr(_lib, "candidates", lambda: [str(tmp_path / "nope.so")])
  with pytest.raises(_lib.LibraryNotFoundError, match="cmake -S . -B build"):
    _lib.load()
