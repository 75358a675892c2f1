"""Masked means absent: a NaN or an infinity in a key or value that a mask hides (the mask array, lengths, causal,
window, segment ids, positions) cannot reach an output that jax.nn computes as finite. jax.nn selects its logits
(a hidden key's NaN never reaches the softmax) but multiplies each value row by its probability, so a NaN or an
infinity in a hidden VALUE row is NaN in jax.nn's every output of that head (0 * NaN): where jax.nn is finite,
sinkattn must be finite and equal, and with learnable sinks (which jax.nn lacks) the poisoned call must equal the
clean one there. The jnp twin and the fused CPU kernels both select (the kernels' kill tile, src/cpu/cpu_mask.h;
tests/sa_test_absent.h checks them on every CPU plan)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sinkattn
from conftest import OUT_TOL, make_inputs
from sinkattn import _lib

pytestmark = pytest.mark.usefixtures("on_cpu")

B, T, S, N, K, H = 2, 8, 12, 4, 2, 16
RNG = np.random.default_rng(50)
KEEP = (RNG.random((B, 1, T, S)) < 0.7) & (np.arange(S) < S - 3)  # batch rows' last 3 keys: padding, never seen
KEEP[..., 0] = True  # every row sees a key
SEG = np.asarray([[0] * 4 + [1] * 4, [0] * 8]), np.asarray([[0] * 5 + [1] * 5 + [2] * 2, [0] * 6 + [3] * 6])
POS = np.tile(np.arange(T), (B, 1)), np.tile(np.arange(S) - 2, (B, 1))  # keys 0, 1 sit before every query


def _kinds():
  """name -> (sinkattn keywords, the equal jax.nn keywords, the [B,T,S] validity)."""
  i, j = np.arange(T)[:, None], np.arange(S)[None, :]
  lens = jnp.asarray([S, 7], jnp.int32)
  seg_ok = SEG[0][:, :, None] == SEG[1][:, None, :]
  pos_ok = POS[1][:, None, :] <= POS[0][:, :, None]
  full = lambda ok: np.broadcast_to(ok, (B, T, S))  # noqa: E731
  return {
    "mask": (dict(mask=jnp.asarray(KEEP)), dict(mask=jnp.asarray(KEEP)), full(KEEP[:, 0])),
    "lengths": (
      dict(key_value_seq_lengths=lens),
      dict(key_value_seq_lengths=lens),
      full(j < np.asarray(lens)[:, None, None]),
    ),
    "causal": (dict(is_causal=True), dict(is_causal=True), full(j <= i)),
    "window": (dict(local_window_size=(2, 1)), dict(local_window_size=(2, 1)), full((j >= i - 2) & (j <= i + 1))),
    "segments": (
      dict(query_segment_ids=jnp.asarray(SEG[0]), key_value_segment_ids=jnp.asarray(SEG[1])),
      dict(mask=jnp.asarray(seg_ok)[:, None]),
      seg_ok,
    ),
    "positions": (
      dict(is_causal=True, query_positions=jnp.asarray(POS[0]), key_value_positions=jnp.asarray(POS[1])),
      dict(mask=jnp.asarray(pos_ok)[:, None]),
      pos_ok,
    ),
  }


KINDS = _kinds()


def _cases(kinds):
  """(kind, impl) for the jnp twin and the fused kernel of each kind."""
  out = []
  for kind in kinds:
    fused = [pytest.mark.skipif(not _lib.available(), reason="libsinkattn_jax.so is not built")]
    out += [
      pytest.param(kind, "reference", id=f"{kind}-reference"),
      pytest.param(kind, "fused", marks=fused, id=f"{kind}-fused"),
    ]
  return out


def _hidden(valid):
  """[B,S] bool: the keys no query row of the batch sees."""
  return ~valid.any(axis=1)


def _poison(x, hidden, value):
  return jnp.where(jnp.asarray(hidden)[:, :, None, None], jnp.asarray(value, x.dtype), x)


def _compare(got, want, what):
  """Finite wherever jax.nn's `want` is, and equal there."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  fin = np.isfinite(want)
  assert fin.any(), f"{what}: nothing to compare (jax.nn is non-finite everywhere)"
  assert np.all(np.isfinite(got[fin])), (
    f"{what}: {int((~np.isfinite(got[fin])).sum())} non-finite where jax.nn is finite"
  )
  err = float(np.max(np.abs(got[fin] - want[fin])))
  assert err <= OUT_TOL[np.dtype(np.float32)] * max(1.0, float(np.abs(want[fin]).max())), f"{what}: error {err:.3g}"


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "+inf", "-inf"])
@pytest.mark.parametrize("kind,impl", _cases(KINDS))
def test_hidden_keys_are_absent(kind, impl, value):
  """A poisoned key that no row sees: every output jax.nn computes as finite is finite and equal (vanilla);
  with learnable sinks the poisoned call equals the clean one there."""
  ours, theirs, valid = KINDS[kind]
  q, k, v, sinks = make_inputs(51, B=B, T=T, S=S, N=N, K=K, H=H)
  hidden = _hidden(valid)
  assert hidden.any(), kind
  bad = _poison(k, hidden, value)
  got = sinkattn.dot_product_attention(q, bad, v, implementation=impl, **ours)
  want = jax.nn.dot_product_attention(q, bad, v, **theirs)
  _compare(got, want, f"{kind} key {value}")
  clean = sinkattn.dot_product_attention(q, k, v, sinks=sinks, implementation=impl, **ours)
  poisoned = sinkattn.dot_product_attention(q, bad, v, sinks=sinks, implementation=impl, **ours)
  _compare(poisoned, np.where(np.isfinite(np.asarray(want)), clean, np.nan), f"{kind} key {value}, sinks")


@pytest.mark.parametrize("value", [np.nan, np.inf], ids=["nan", "+inf"])
@pytest.mark.parametrize("kind,impl", _cases(KINDS))
def test_hidden_values_are_absent_where_jax_nn_is_finite(kind, impl, value):
  """A poisoned value row that no row sees: jax.nn multiplies it by its probability 0 (NaN for every row of the
  kv head, except where lengths zero it first), so the comparison covers the heads that do not read it: the
  poisoned kv head is 0 here, its twin 1 is clean."""
  ours, theirs, valid = KINDS[kind]
  q, k, v, _ = make_inputs(52, B=B, T=T, S=S, N=N, K=K, H=H)
  hidden = _hidden(valid)
  bad = v.at[:, :, 0].set(_poison(v, hidden, value)[:, :, 0])
  got = sinkattn.dot_product_attention(q, k, bad, implementation=impl, **ours)
  want = jax.nn.dot_product_attention(q, k, bad, **theirs)
  _compare(got, want, f"{kind} value {value}")


@pytest.mark.parametrize("kind,impl", _cases(["lengths"]))
def test_padding_past_the_lengths_never_reaches_a_result(kind, impl):
  """Keys and values past key_value_seq_lengths hold NaN (padding left uninitialised): out, lse and every
  gradient are finite and equal to the clean call's (jax.nn: its output is NaN here, 0 * NaN in P V)."""
  q, k, v, sinks = make_inputs(53, B=B, T=T, S=S, N=N, K=K, H=H)
  lens = jnp.asarray([S - 2, 5], jnp.int32)
  pad = np.arange(S)[None, :] >= np.asarray(lens)[:, None]
  bad_k, bad_v = _poison(k, pad, np.nan), _poison(v, pad, np.inf)

  def f(q, k, v, s):
    out, lse = sinkattn.dot_product_attention(
      q, k, v, sinks=s, key_value_seq_lengths=lens, is_causal=True, return_residual=True, implementation=impl
    )
    return jnp.sum(out**2) + jnp.sum(lse), (out, lse)

  (_, clean), g_clean = jax.value_and_grad(f, argnums=(0, 1, 2, 3), has_aux=True)(q, k, v, sinks)
  (_, bad), g_bad = jax.value_and_grad(f, argnums=(0, 1, 2, 3), has_aux=True)(q, bad_k, bad_v, sinks)
  for name, a, b in zip(("out", "lse", "dq", "dk", "dv", "dsinks"), clean + g_clean, bad + g_bad):
    a, b = np.asarray(a), np.asarray(b)
    if name in ("dk", "dv"):  # the padding rows' own gradients are 0 in both
      a, b = np.where(pad[:, :, None, None], 0, a), np.where(pad[:, :, None, None], 0, b)
    np.testing.assert_array_equal(b, a, err_msg=name)
