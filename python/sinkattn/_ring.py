"""The ring of sinkattn.ring_attention (context_parallel.py): its schedule, forward and backward.

Each of the P devices of `axis_name` holds a slice of the sequence of q, k and v. K/V blocks travel
around the ring with `jax.lax.ppermute` (the next transfer is issued before the current block is
computed, so XLA can overlap them). Each (query block, key block) pair runs the fused kernel with the
VANILLA softmax, so no block sees the sink; the partial (out, lse) pairs are merged in float32 and the
sink enters exactly once, at the end:  lse = logaddexp(lse, a_n),  out *= exp(lse_blocks - lse).
(Transformer Engine's context-parallel paths reject sinks; an earlier one silently dropped them.)

A soft-cap acts on each (query, key) logit alone, so every block caps its own logits (the same static cap) and
the merge is unchanged; the backward's blocks apply the cap's derivative with the global lse.

Positions reach the kernel as a static `diag_offset` per block and per-block lengths. Which blocks a
device meets at ring step t depends on its axis index r, a traced value, so for every step the
schedule is computed for all r at trace time: each block pair is classified 'empty' (skipped: causal
or window masks everything), 'full' (no position mask needed) or 'partial' (one static diag_offset),
and a lax.switch on a table indexed by r picks the branch.

Layouts: 'contiguous' (device r holds tokens [r*T/P, (r+1)*T/P)), or 'zigzag' for causal load balance:
device r holds chunks r and 2P-1-r of 2P equal chunks, so every device does the same work at every
step (with contiguous, device 0 skips all but one step while device P-1 computes all P).
`zigzag_shard` / `zigzag_unshard` reorder a global sequence into / out of that layout (apply them to
the tokens and positions once, before the model; the ring itself never gathers the sequence).

Backward (custom_vjp): a second ring pass in which dk/dv accumulators travel with their K/V block and
arrive home after P transfers; each block calls the fused backward with the VANILLA softmax and the
GLOBAL out and lse (which includes the sink), so its probabilities are the global ones. The sink
gradient dsinks = -sum_{b,i} exp(a_n - lse_i) * D_i (D_i = dout_i . out_i - dlse_i) is computed once
in jnp from the local rows; sinks enter the custom_vjp marked varying over every axis that q varies
over, so JAX's transpose of that cast sums the partial dsinks over the ring axis and any batch-sharded
axes, with no configuration.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import primitives
from ._enums import Causal, Softmax
from ._inputs import Inputs
from .partitioning import to_varying as _to_varying
from .partitioning import vma as _vma

_BIG = 1 << 60  # an unbounded window side, in block-classification arithmetic


class Ring(NamedTuple):
  """Static configuration of one ring call (hashable: a custom_vjp nondiff argument)."""

  axis_name: object
  size: int  # P, devices on the ring
  zigzag: bool
  softmax: int
  causal: bool  # top-left after folding a bottom-right offset into `shift`
  window_left: int
  window_right: int
  shift: int  # added to every block's diag_offset (S - T for bottom-right alignment)
  scale: float
  return_residual: bool
  logits_soft_cap: float = 0.0  # capped per pair in every block: a block's partial needs nothing else


def _chunk_ids(cfg, r):
  """Global chunk indices held by device r, in local order."""
  return (r, 2 * cfg.size - 1 - r) if cfg.zigzag else (r,)


def classify(d, rows, cols, cfg):
  """'empty', 'full' or 'partial' for a rows x cols block whose row i sits at key column i + d."""
  right = min(0 if cfg.causal else _BIG, cfg.window_right if cfg.window_right >= 0 else _BIG)
  left = cfg.window_left if cfg.window_left >= 0 else _BIG
  # Row i sees columns [i + d - left, i + d + right]; both ends grow with i.
  if max(0, -d - right) > min(rows - 1, cols - 1 - d + left):
    return "empty"
  if rows - 1 + d - left <= 0 and d + right >= cols - 1:
    return "full"
  return "partial"


def schedule(cfg, t, cq, ck, rows, cols):
  """For local q chunk cq and the k chunk ck met at step t: (branch keys, branch index per device,
  global q start per device, global k start per device)."""
  keys, q0, k0 = [], [], []
  for r in range(cfg.size):
    qi, kj = _chunk_ids(cfg, r)[cq], _chunk_ids(cfg, (r - t) % cfg.size)[ck]
    d = qi * rows - kj * cols + cfg.shift
    kind = classify(d, rows, cols, cfg)
    keys.append(("partial", d) if kind == "partial" else (kind, 0))
    q0.append(qi * rows)
    k0.append(kj * cols)
  branches = sorted(set(keys))
  return branches, [branches.index(key) for key in keys], q0, k0


def _block_statics(cfg, key):
  kind, d = key
  cap = cfg.logits_soft_cap
  if kind == "full":
    return dict(
      softmax=Softmax.VANILLA,
      causal=Causal.NONE,
      window_left=-1,
      window_right=-1,
      diag_offset=0,
      scale=cfg.scale,
      logits_soft_cap=cap,
    )
  return dict(
    softmax=Softmax.VANILLA,
    causal=int(cfg.causal),
    window_left=cfg.window_left,
    window_right=cfg.window_right,
    diag_offset=d,
    scale=cfg.scale,
    logits_soft_cap=cap,
  )


def _blocks(cfg, t, rows, cols, n_chunks):
  """Static schedule of step t: (cq, ck, branches, dynamic branch index, q start, k start) for every
  pair that is not empty on every device."""
  r = jax.lax.axis_index(cfg.axis_name)
  pick = lambda table: jnp.asarray(np.array(table, np.int32))[r]
  out = []
  for cq in range(n_chunks):
    for ck in range(n_chunks):
      branches, index, q0, k0 = schedule(cfg, t, cq, ck, rows, cols)
      if branches != [("empty", 0)]:
        out.append((cq, ck, branches, pick(index), pick(q0), pick(k0)))
  return out


def _lens(lens, start, size):
  return None if lens is None else jnp.clip(lens - start, 0, size)


def _sl(x, c, size, axis):
  return None if x is None else jax.lax.slice_in_dim(x, c * size, (c + 1) * size, axis=axis)


def _dispatch(branches, index, compute, empty, operands):
  """Runs compute(key, *operands) for the branch of this device (empty() for an 'empty' block).

  An FFI call's results carry no varying-axes type inside shard_map, so every branch's results are
  cast to the axes its operands vary over: lax.switch needs equal types, autodiff needs the truth."""
  axes = frozenset().union(*[_vma(x) for x in jax.tree_util.tree_leaves(operands)])

  def branch(key):
    fn = empty if key[0] == "empty" else functools.partial(compute, key)
    return lambda ops: jax.tree_util.tree_map(lambda x: _to_varying(x, axes), fn(*ops))

  fns = [branch(key) for key in branches]
  if len(fns) == 1:
    return fns[0](operands)
  return jax.lax.switch(index, fns, operands)


def _merge(acc, part):
  """(out fp32 [B,T,N,Hv], lse [B,N,T]) of two disjoint key sets -> that of their union."""
  (o1, l1), (o2, l2) = acc, part
  lse = jnp.logaddexp(l1, l2)
  w = lambda l: jnp.where(jnp.isneginf(lse), 0.0, jnp.exp(l - lse)).transpose(0, 2, 1)[..., None]
  return o1 * w(l1) + o2.astype(jnp.float32) * w(l2), lse


def _sink_logits(cfg, sinks, n):
  if cfg.softmax == Softmax.LEARNABLE:
    return sinks
  return jnp.full((n,), -jnp.inf if cfg.softmax == Softmax.VANILLA else 0.0, jnp.float32)


def _ring_forward(cfg, x: Inputs):
  q, k, v = x.q, x.k, x.v
  B, T, N, _ = q.shape
  nc = 2 if cfg.zigzag else 1
  rows, cols = T // nc, k.shape[1] // nc
  Hv = v.shape[3]
  acc = [(jnp.zeros((B, rows, N, Hv), jnp.float32), jnp.full((B, N, rows), -jnp.inf, jnp.float32)) for _ in range(nc)]
  ring = [(i, (i + 1) % cfg.size) for i in range(cfg.size)]
  kv = (k, v, x.kv_seg)
  for t in range(cfg.size):
    nxt = jax.lax.ppermute(kv, cfg.axis_name, ring) if t + 1 < cfg.size else None  # overlaps compute
    kc_all, vc_all, ks_all = kv
    for cq, ck, branches, index, q0, k0 in _blocks(cfg, t, rows, cols, nc):

      def compute(key, qc, kc, vc, ql, kl, qs, ks):
        block = Inputs(qc, kc, vc, q_lens=ql, kv_lens=kl, q_seg=qs, kv_seg=ks)
        return primitives.attn_fwd(block, **_block_statics(cfg, key))

      def empty(*_):
        return (jnp.zeros((B, rows, N, Hv), q.dtype), jnp.full((B, N, rows), -jnp.inf, jnp.float32))

      ops = (
        _sl(q, cq, rows, 1),
        _sl(kc_all, ck, cols, 1),
        _sl(vc_all, ck, cols, 1),
        _lens(x.q_lens, q0, rows),
        _lens(x.kv_lens, k0, cols),
        _sl(x.q_seg, cq, rows, 1),
        _sl(ks_all, ck, cols, 1),
      )
      acc[cq] = _merge(acc[cq], _dispatch(branches, index, compute, empty, ops))
    kv = nxt
  a = _sink_logits(cfg, x.sinks, N)[None, :, None]
  o = jnp.concatenate([o for o, _ in acc], axis=1)
  lse_blocks = jnp.concatenate([l for _, l in acc], axis=2)
  lse = jnp.logaddexp(lse_blocks, a)  # the sink, exactly once
  scale = jnp.where(jnp.isneginf(lse), 0.0, jnp.exp(lse_blocks - lse)).transpose(0, 2, 1)[..., None]
  return (o * scale).astype(q.dtype), lse


def _ring_backward(cfg, res, dout, dlse):
  x, out, lse = res
  q, k, v = x.q, x.k, x.v
  B, T, N, H = q.shape
  nc = 2 if cfg.zigzag else 1
  rows, cols = T // nc, k.shape[1] // nc
  f32 = jnp.float32
  dq = [jnp.zeros((B, rows, N, H), f32) for _ in range(nc)]
  dkv = (jnp.zeros(k.shape, f32), jnp.zeros(v.shape, f32))
  ring = [(i, (i + 1) % cfg.size) for i in range(cfg.size)]
  kv = (k, v, x.kv_seg)
  for t in range(cfg.size):
    nxt = jax.lax.ppermute(kv, cfg.axis_name, ring) if t + 1 < cfg.size else None
    kc_all, vc_all, ks_all = kv
    dk, dv = dkv
    for cq, ck, branches, index, q0, k0 in _blocks(cfg, t, rows, cols, nc):

      def compute(key, qc, kc, vc, ql, kl, qs, ks, oc, lc, doc, dlc):
        block = Inputs(qc, kc, vc, q_lens=ql, kv_lens=kl, q_seg=qs, kv_seg=ks)
        g = primitives.attn_bwd(block, oc, lc, doc, dlc, **_block_statics(cfg, key))
        return g.dq, g.dk, g.dv

      def empty(qc, kc, vc, *_):
        return jnp.zeros_like(qc), jnp.zeros_like(kc), jnp.zeros_like(vc)

      ops = (
        _sl(q, cq, rows, 1),
        _sl(kc_all, ck, cols, 1),
        _sl(vc_all, ck, cols, 1),
        _lens(x.q_lens, q0, rows),
        _lens(x.kv_lens, k0, cols),
        _sl(x.q_seg, cq, rows, 1),
        _sl(ks_all, ck, cols, 1),
        _sl(out, cq, rows, 1),
        _sl(lse, cq, rows, 2),
        _sl(dout, cq, rows, 1),
        _sl(dlse, cq, rows, 2),
      )
      dqb, dkb, dvb = _dispatch(branches, index, compute, empty, ops)
      dq[cq] = dq[cq] + dqb.astype(f32)
      dk = jax.lax.dynamic_update_slice_in_dim(dk, _sl(dk, ck, cols, 1) + dkb.astype(f32), ck * cols, 1)
      dv = jax.lax.dynamic_update_slice_in_dim(dv, _sl(dv, ck, cols, 1) + dvb.astype(f32), ck * cols, 1)
    dkv = jax.lax.ppermute((dk, dv), cfg.axis_name, ring)  # after P sends it is back home
    kv = nxt
  dsinks = None
  if cfg.softmax == Softmax.LEARNABLE:
    D = jnp.einsum("btnh,btnh->bnt", dout.astype(f32), out.astype(f32), precision=jax.lax.Precision.HIGHEST)
    if dlse is not None:
      D = D - dlse
    dsinks = -jnp.sum(jnp.exp(x.sinks[None, :, None] - lse) * D, axis=(0, 2))
  dq = jnp.concatenate(dq, axis=1).astype(q.dtype)
  return dq, dkv[0].astype(k.dtype), dkv[1].astype(v.dtype), dsinks


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def ring(cfg, x: Inputs):
  """The ring on this device's block of the inputs x (sinks float32 [N] or None, lengths, segment ids; no
  bias, mask or positions) -> out, or (out, lse [B,N,T/P]) with cfg.return_residual."""
  out, lse = _ring_forward(cfg, x)
  return (out, lse) if cfg.return_residual else out


def _ring_fwd(cfg, x):
  out, lse = _ring_forward(cfg, x)
  return ((out, lse) if cfg.return_residual else out), (x, out, lse)


def _ring_bwd(cfg, res, ct):
  dout, dlse = ct if cfg.return_residual else (ct, None)
  dq, dk, dv, dsinks = _ring_backward(cfg, res, dout, dlse)
  return (Inputs(q=dq, k=dk, v=dv, sinks=dsinks),)  # None for the integer arrays: no cotangent


ring.defvjp(_ring_fwd, _ring_bwd)
