"""Context parallelism with attention sinks: ring attention over a mesh axis that shards the sequence.

Each of the P devices of `axis_name` holds a slice of the sequence of q, k and v. K/V blocks travel
around the ring with `jax.lax.ppermute` (the next transfer is issued before the current block is
computed, so XLA can overlap them). Each (query block, key block) pair runs the fused kernel with the
VANILLA softmax, so no block sees the sink; the partial (out, lse) pairs are merged in float32 and the
sink enters exactly once, at the end:  lse = logaddexp(lse, a_n),  out *= exp(lse_blocks - lse).
(Transformer Engine's context-parallel paths reject sinks; an earlier one silently dropped them.)

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
from jax.sharding import PartitionSpec as P

from . import _validate, primitives
from ._enums import Causal, Softmax
from .partitioning import to_varying as _to_varying
from .partitioning import vma as _vma

_BIG = 1 << 60  # an unbounded window side, in block-classification arithmetic


class _Ring(NamedTuple):
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


def zigzag_shard(x, num_shards, axis=1):
  """Reorders the sequence axis so that splitting it into `num_shards` equal slices gives slice r the
  chunks r and 2P-1-r of the original order (P = num_shards; the length must divide by 2P)."""
  return _zigzag(x, num_shards, axis, inverse=False)


def zigzag_unshard(x, num_shards, axis=1):
  """Inverse of zigzag_shard: back to the original token order."""
  return _zigzag(x, num_shards, axis, inverse=True)


def _zigzag(x, n, axis, inverse):
  axis = axis % x.ndim
  length = x.shape[axis]
  if length % (2 * n):
    raise ValueError(
      f"zigzag: sequence length {length} (axis {axis} of shape {x.shape}) must divide by 2 * num_shards = {2 * n}"
    )
  order = np.array([c for r in range(n) for c in (r, 2 * n - 1 - r)])
  if inverse:
    order = np.argsort(order)
  chunks = x.reshape(x.shape[:axis] + (2 * n, length // (2 * n)) + x.shape[axis + 1 :])
  return jnp.take(chunks, order, axis=axis).reshape(x.shape)


def _chunk_ids(cfg, r):
  """Global chunk indices held by device r, in local order."""
  return (r, 2 * cfg.size - 1 - r) if cfg.zigzag else (r,)


def _classify(d, rows, cols, cfg):
  """'empty', 'full' or 'partial' for a rows x cols block whose row i sits at key column i + d."""
  right = min(0 if cfg.causal else _BIG, cfg.window_right if cfg.window_right >= 0 else _BIG)
  left = cfg.window_left if cfg.window_left >= 0 else _BIG
  # Row i sees columns [i + d - left, i + d + right]; both ends grow with i.
  if max(0, -d - right) > min(rows - 1, cols - 1 - d + left):
    return "empty"
  if rows - 1 + d - left <= 0 and d + right >= cols - 1:
    return "full"
  return "partial"


def _schedule(cfg, t, cq, ck, rows, cols):
  """For local q chunk cq and the k chunk ck met at step t: (branch keys, branch index per device,
  global q start per device, global k start per device)."""
  keys, q0, k0 = [], [], []
  for r in range(cfg.size):
    qi, kj = _chunk_ids(cfg, r)[cq], _chunk_ids(cfg, (r - t) % cfg.size)[ck]
    d = qi * rows - kj * cols + cfg.shift
    kind = _classify(d, rows, cols, cfg)
    keys.append(("partial", d) if kind == "partial" else (kind, 0))
    q0.append(qi * rows)
    k0.append(kj * cols)
  branches = sorted(set(keys))
  return branches, [branches.index(key) for key in keys], q0, k0


def _block_statics(cfg, key):
  kind, d = key
  if kind == "full":
    return dict(
      softmax=Softmax.VANILLA, causal=Causal.NONE, window_left=-1, window_right=-1, diag_offset=0, scale=cfg.scale
    )
  return dict(
    softmax=Softmax.VANILLA,
    causal=int(cfg.causal),
    window_left=cfg.window_left,
    window_right=cfg.window_right,
    diag_offset=d,
    scale=cfg.scale,
  )


def _blocks(cfg, t, rows, cols, n_chunks):
  """Static schedule of step t: (cq, ck, branches, dynamic branch index, q start, k start) for every
  pair that is not empty on every device."""
  r = jax.lax.axis_index(cfg.axis_name)
  pick = lambda table: jnp.asarray(np.array(table, np.int32))[r]
  out = []
  for cq in range(n_chunks):
    for ck in range(n_chunks):
      branches, index, q0, k0 = _schedule(cfg, t, cq, ck, rows, cols)
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


def _ring_forward(cfg, q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg):
  B, T, N, _ = q.shape
  nc = 2 if cfg.zigzag else 1
  rows, cols = T // nc, k.shape[1] // nc
  Hv = v.shape[3]
  acc = [(jnp.zeros((B, rows, N, Hv), jnp.float32), jnp.full((B, N, rows), -jnp.inf, jnp.float32)) for _ in range(nc)]
  ring = [(i, (i + 1) % cfg.size) for i in range(cfg.size)]
  kv = (k, v, kv_seg)
  for t in range(cfg.size):
    nxt = jax.lax.ppermute(kv, cfg.axis_name, ring) if t + 1 < cfg.size else None  # overlaps compute
    kc_all, vc_all, ks_all = kv
    for cq, ck, branches, index, q0, k0 in _blocks(cfg, t, rows, cols, nc):

      def compute(key, qc, kc, vc, ql, kl, qs, ks):
        return primitives.attn_fwd(qc, kc, vc, None, ql, kl, qs, ks, **_block_statics(cfg, key))

      def empty(*_):
        return (jnp.zeros((B, rows, N, Hv), q.dtype), jnp.full((B, N, rows), -jnp.inf, jnp.float32))

      ops = (
        _sl(q, cq, rows, 1),
        _sl(kc_all, ck, cols, 1),
        _sl(vc_all, ck, cols, 1),
        _lens(q_lens, q0, rows),
        _lens(kv_lens, k0, cols),
        _sl(q_seg, cq, rows, 1),
        _sl(ks_all, ck, cols, 1),
      )
      acc[cq] = _merge(acc[cq], _dispatch(branches, index, compute, empty, ops))
    kv = nxt
  a = _sink_logits(cfg, sinks, N)[None, :, None]
  o = jnp.concatenate([o for o, _ in acc], axis=1)
  lse_blocks = jnp.concatenate([l for _, l in acc], axis=2)
  lse = jnp.logaddexp(lse_blocks, a)  # the sink, exactly once
  scale = jnp.where(jnp.isneginf(lse), 0.0, jnp.exp(lse_blocks - lse)).transpose(0, 2, 1)[..., None]
  return (o * scale).astype(q.dtype), lse


def _ring_backward(cfg, res, dout, dlse):
  q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, out, lse = res
  B, T, N, H = q.shape
  nc = 2 if cfg.zigzag else 1
  rows, cols = T // nc, k.shape[1] // nc
  f32 = jnp.float32
  dq = [jnp.zeros((B, rows, N, H), f32) for _ in range(nc)]
  dkv = (jnp.zeros(k.shape, f32), jnp.zeros(v.shape, f32))
  ring = [(i, (i + 1) % cfg.size) for i in range(cfg.size)]
  kv = (k, v, kv_seg)
  for t in range(cfg.size):
    nxt = jax.lax.ppermute(kv, cfg.axis_name, ring) if t + 1 < cfg.size else None
    kc_all, vc_all, ks_all = kv
    dk, dv = dkv
    for cq, ck, branches, index, q0, k0 in _blocks(cfg, t, rows, cols, nc):

      def compute(key, qc, kc, vc, ql, kl, qs, ks, oc, lc, doc, dlc):
        dqb, dkb, dvb, _, _ = primitives.attn_bwd(
          qc, kc, vc, None, ql, kl, qs, ks, None, None, None, None, oc, lc, doc, dlc, **_block_statics(cfg, key)
        )
        return dqb, dkb, dvb

      def empty(qc, kc, vc, *_):
        return jnp.zeros_like(qc), jnp.zeros_like(kc), jnp.zeros_like(vc)

      ops = (
        _sl(q, cq, rows, 1),
        _sl(kc_all, ck, cols, 1),
        _sl(vc_all, ck, cols, 1),
        _lens(q_lens, q0, rows),
        _lens(kv_lens, k0, cols),
        _sl(q_seg, cq, rows, 1),
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
    dsinks = -jnp.sum(jnp.exp(sinks[None, :, None] - lse) * D, axis=(0, 2))
  dq = jnp.concatenate(dq, axis=1).astype(q.dtype)
  return dq, dkv[0].astype(k.dtype), dkv[1].astype(v.dtype), dsinks


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ring(cfg, q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg):
  out, lse = _ring_forward(cfg, q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg)
  return (out, lse) if cfg.return_residual else out


def _ring_fwd(cfg, q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg):
  out, lse = _ring_forward(cfg, q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg)
  res = (q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, out, lse)
  return ((out, lse) if cfg.return_residual else out), res


def _ring_bwd(cfg, res, ct):
  dout, dlse = ct if cfg.return_residual else (ct, None)
  dq, dk, dv, dsinks = _ring_backward(cfg, res, dout, dlse)
  return dq, dk, dv, dsinks, None, None, None, None


_ring.defvjp(_ring_fwd, _ring_bwd)


def ring_attention(
  query,
  key,
  value,
  sinks=None,
  *,
  axis_name,
  layout="contiguous",
  softmax_type=None,
  scale=None,
  is_causal=False,
  causal_alignment="top_left",
  local_window_size=None,
  query_seq_lengths=None,
  key_value_seq_lengths=None,
  query_segment_ids=None,
  key_value_segment_ids=None,
  return_residual=False,
):
  """dot_product_attention over a sequence sharded on mesh axis `axis_name`; call it inside shard_map.

  query [B,T/P,N,H], key [B,S/P,K,H], value [B,S/P,K,Hv]: this device's slice of the sequence, in the
  `layout` 'contiguous' (slice r of the natural order) or 'zigzag' (chunks r and 2P-1-r of 2P: see
  zigzag_shard; balances causal work). query_seq_lengths / key_value_seq_lengths [B] are the GLOBAL
  lengths (replicated); query_segment_ids [B,T/P] / key_value_segment_ids [B,S/P] are sharded like the
  sequence. sinks [N] or [1,N,1,1]. Other options as in sinkattn.dot_product_attention; bottom-right
  causal alignment is supported without sequence lengths (its offset S - T is then static).
  Returns this device's rows of out [B,T/P,N,Hv] (and lse [B,N,T/P] with return_residual=True).
  Differentiable in query, key, value and sinks, and through lse.
  """
  o, sinks, q_lens, kv_lens, q_seg, kv_seg, *_ = _validate.arguments(
    query,
    key,
    value,
    sinks,
    softmax_type=softmax_type,
    scale=scale,
    is_causal=is_causal,
    causal_alignment=causal_alignment,
    local_window_size=local_window_size,
    query_seq_lengths=query_seq_lengths,
    key_value_seq_lengths=key_value_seq_lengths,
    query_segment_ids=query_segment_ids,
    key_value_segment_ids=key_value_segment_ids,
    return_residual=return_residual,
  )
  if layout not in ("contiguous", "zigzag"):
    raise ValueError(f"layout: expected 'contiguous' or 'zigzag', got {layout!r}")
  size = jax.lax.axis_size(axis_name)
  T, S = query.shape[1], key.shape[1]
  if layout == "zigzag" and (T % 2 or S % 2):
    raise ValueError(
      f"layout='zigzag': local query/key lengths must be even (two chunks per device), "
      f"got query {tuple(query.shape)}, key {tuple(key.shape)}"
    )
  shift = 0
  if o.causal == Causal.BOTTOM_RIGHT:
    if q_lens is not None or kv_lens is not None:
      raise NotImplementedError(
        "ring_attention: causal_alignment='bottom_right' with sequence lengths "
        "has a per-batch diagonal; use 'top_left' or no lengths"
      )
    shift = size * (S - T)
  cfg = _Ring(
    axis_name,
    size,
    layout == "zigzag",
    o.softmax,
    o.causal != 0,
    o.window_left,
    o.window_right,
    shift,
    o.scale,
    o.return_residual,
  )
  N = query.shape[2]
  s32 = None if sinks is None else sinks.reshape(N).astype(jnp.float32)
  if s32 is not None:  # partial dsinks of each device are summed by the transpose of this cast
    s32 = _to_varying(s32, _vma(query))
  return _ring(cfg, query, key, value, s32, q_lens, kv_lens, q_seg, kv_seg)


def _entry(axes):
  axes = tuple(a for a in (axes if isinstance(axes, (tuple, list)) else (axes,)) if a is not None)
  return None if not axes else axes[0] if len(axes) == 1 else axes


def ring_attention_sharded(
  query,
  key,
  value,
  sinks=None,
  *,
  mesh,
  axis_name,
  batch_axes=None,
  head_axes=None,
  query_seq_lengths=None,
  key_value_seq_lengths=None,
  query_segment_ids=None,
  key_value_segment_ids=None,
  **options,
):
  """ring_attention on global arrays: runs the shard_map for the caller.

  query [B,T,N,H], key [B,S,K,H], value [B,S,K,Hv] (global, in `layout` order: zigzag_shard them first
  for layout='zigzag') are split over the sequence on mesh axis `axis_name`, over the batch on
  `batch_axes` and over heads (q and kv alike: the head mesh size must divide K) on `head_axes`.
  Lengths [B] and segment ids [B,T] / [B,S] are global too. Returns global out [B,T,N,Hv] (and lse).
  """
  b, h = _entry(batch_axes), _entry(head_axes)
  m = int(np.prod([mesh.shape[a] for a in ((h,) if isinstance(h, str) else h or ())]))
  if key.shape[2] % m:
    raise ValueError(
      f"head_axes={head_axes!r}: {m} shards do not divide the K = {key.shape[2]} kv heads of key {tuple(key.shape)}"
    )
  seq = P(b, axis_name, h, None)
  lse_spec = P(b, h, axis_name)
  arrays = dict(
    query_seq_lengths=query_seq_lengths,
    key_value_seq_lengths=key_value_seq_lengths,
    query_segment_ids=query_segment_ids,
    key_value_segment_ids=key_value_segment_ids,
  )
  specs = dict(
    query_seq_lengths=P(b),
    key_value_seq_lengths=P(b),
    query_segment_ids=P(b, axis_name),
    key_value_segment_ids=P(b, axis_name),
  )
  given = {n: x for n, x in arrays.items() if x is not None}
  sink_spec = None if sinks is None else P(None, h, None, None) if sinks.ndim == 4 else P(h)

  def body(q, k, v, s, extra):
    return ring_attention(q, k, v, s, axis_name=axis_name, **extra, **options)

  out_specs = (seq, lse_spec) if options.get("return_residual", False) else seq
  fn = jax.shard_map(
    body, mesh=mesh, in_specs=(seq, seq, seq, sink_spec, {n: specs[n] for n in given}), out_specs=out_specs
  )
  return fn(query, key, value, sinks, given)
