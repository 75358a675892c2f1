"""Partitioning of every fused attention call: batch- and head-parallel, without gathering q/k/v.

An XLA FFI call is opaque to the SPMD partitioner: left alone, XLA all-gathers every operand onto every
device and runs the whole problem everywhere. `attn_fwd` / `attn_bwd` here have the signatures of
`primitives.attn_fwd` / `primitives.attn_bwd` and wrap them in `jax.experimental.custom_partitioning`:

- Shardy rule (the default partitioner in jax 0.10 and 0.11): one factor per logical dim; the q head
  factor n is shared by q, sinks, out, lse, dq and the bias / mask heads; t, s, h, e (sequence and head
  dims) need replication, and so does every size-1 (broadcast) dim of a bias or mask, each its own factor.
  q heads and kv heads are separate factors, not the compound (k g): Shardy splits a mesh axis that does
  not divide K into sub-axes for (k g) (e.g. 4 devices, K = 2), and such a sharding cannot be named by
  a PartitionSpec, so the partition callback could not even be called.
- partition(): the final decision, which ties the two head factors together. Batch axes come from q's
  batch dim; head axes from q's head dim when their size m divides K (each shard keeps whole GQA
  groups, kv heads sharded the same way), or when K divides m (MQA / few kv heads under tensor
  parallelism: k/v stay replicated over the head axes, each shard slices the one kv head its q heads
  read, and dk/dv are psum-ed over the head axes, since m / K shards each hold part of a group);
  otherwise heads are replicated. Every shard runs the primitive on its block. A bias or mask follows q
  on its full b and n dims and is replicated on the rest.
- dsinks is a sum over batch rows, so each shard's partial sum is psum-ed over the batch axes inside
  the partition: always, with no mesh-resource setting (Transformer Engine skips this reduction unless
  one is configured, silently leaving a per-shard dsinks). dbias is psum-ed the same way over the batch
  axes when the bias is broadcast over the batch, and over the q head axes when it is shared by the heads.
- Inside shard_map (all axes manual) the call runs as is; its results are typed as varying over the
  axes its inputs vary over, and the gradient of an input that varies over fewer axes (replicated
  sinks or bias, or k/v replicated over a head axis) is psum-ed over the rest, so custom_vjp accepts it.
- Under jax.vmap the call goes to the primitive's own batching rule (custom_vmap): custom_partitioning
  has no batching rule of its own.
- Under an Explicit mesh (jax.sharding.AxisType.Explicit, set_mesh) the operands' types carry their
  shardings, so the same plan is made when tracing and the call runs under shard_map with the same
  per-shard body: results are typed sharded like q (custom_partitioning types them replicated, which
  made XLA all-gather the output and custom_vjp reject the gradients' types).
The GSPMD partitioner (jax_use_shardy_partitioner=False) gets the same decision through
infer_sharding_from_operands.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from . import primitives
from ._enums import Softmax
from ._inputs import GRAD_OF, Grads, Inputs

# Logical dims of every operand / result. A bias / mask entry names the array: its dims depend on its shape
# (`_broadcast_dims`), and dbias has bias's.
_FWD_IN = Inputs(
  q="b t n h",
  k="b s k h",
  v="b s k e",
  sinks="n",
  q_lens="b",
  kv_lens="b",
  q_seg="b t",
  kv_seg="b s",
  bias="bias",
  mask="mask",
  q_pos="b t",
  kv_pos="b s",
)
_FWD_OUT = ("b t n e", "b n t")  # out lse
_BWD_EXTRA = ("b t n e", "b n t", "b t n e", "b n t")  # the backward's inputs after Inputs: out lse dout dlse
_BWD_OUT = Grads(dq="b t n h", dk="b s k h", dv="b s k e", dsinks="n", dbias="bias")
_REPLICATED = ("t", "s", "h", "e")
_NIN = len(Inputs._fields)


def _broadcast_dims(name, shape, full):
  """Dims of a bias / mask of `shape` broadcast to `full` = (B, N, T, S): a full dim shares q's factor
  (b, n, t, s); a size-1 dim gets a factor of its own (bias_b, ...), which no mesh axis splits."""
  return " ".join(d if n == f else f"{name}_{d}" for d, n, f in zip("bnts", shape, full))


def _layout(kind, x: Inputs, extra, want_dbias):
  """(dims of each argument: Inputs' fields, then the backward's `extra` (out lse dout dlse), None where absent;
  dims of each result, None where not returned)."""
  B, T, N, _ = x.q.shape
  full = (B, N, T, x.k.shape[1])
  named = lambda d, a: _broadcast_dims(d, a.shape, full) if d in ("bias", "mask") else d  # noqa: E731
  dims = Inputs(*(None if a is None else named(d, a) for d, a in zip(_FWD_IN, x)))
  if kind == "fwd":
    return tuple(dims), _FWD_OUT
  extra_dims = tuple(None if a is None else d for d, a in zip(_BWD_EXTRA, extra))
  return tuple(dims) + extra_dims, tuple(_BWD_OUT._replace(dbias=dims.bias if want_dbias else None))


def _axes(entry):
  """A PartitionSpec entry as a tuple of mesh axis names."""
  if entry is None:
    return ()
  return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _size(mesh, axes):
  return math.prod(mesh.shape[a] for a in axes)


def _dim_axes(sharding, dim):
  if not isinstance(sharding, NamedSharding):
    return ()  # a sharding we cannot name (GSPMD device order): treat as replicated
  spec = tuple(sharding.spec)
  return _axes(spec[dim]) if dim < len(spec) else ()


def _plan(mesh, q, k):
  """(batch axes, q head axes, kv head axes) for operands shaped/sharded like q and k."""
  B, _, N, _ = q.shape
  K = k.shape[2]
  batch = _dim_axes(q.sharding, 0) or _dim_axes(k.sharding, 0)
  if B % _size(mesh, batch):
    batch = ()
  heads = tuple(a for a in (_dim_axes(q.sharding, 2) or _dim_axes(k.sharding, 2)) if a not in batch)
  m = _size(mesh, heads)
  if N % m == 0 and K % m == 0:
    return batch, heads, heads  # whole GQA groups per shard
  if N % m == 0 and m % K == 0:
    return batch, heads, ()  # a group spread over m / K shards: kv replicated, sliced per shard
  return batch, (), ()


def _spec(dims, batch, qheads, kvheads):
  """PartitionSpec of an array with logical dims `dims` (one word per dim, from the tables above)."""
  out = []
  for d in dims.split():
    axes = {"b": batch, "n": qheads, "k": kvheads}.get(d, ())
    out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return P(*out)


def _present(dims):
  return tuple(d for d in dims if d is not None)


def _shardings(mesh, plan, dims):
  return tuple(NamedSharding(mesh, _spec(d, *plan)) for d in _present(dims))


def _rule(dims_in, dims_out):
  """Shardy rule string and its need-replication factors (in order of first appearance: Shardy requires it)."""
  rule = "%s -> %s" % (", ".join(_present(dims_in)), ", ".join(_present(dims_out)))
  order = list(dict.fromkeys(f for f in rule.replace(",", " ").split() if f != "->"))
  return rule, tuple(f for f in order if f in _REPLICATED or "_" in f)


def _fill(dims, args):
  """Re-insert None for the absent arguments (or results)."""
  it = iter(args)
  return [None if d is None else next(it) for d in dims]


def _present_outs(outs):
  return tuple(o for o in outs if o is not None)


def _raw(kind, dims_in, statics, *args):
  """The primitive on the present arguments; -> its present results."""
  full = _fill(dims_in, args)
  x, extra = Inputs(*full[:_NIN]), full[_NIN:]
  if kind == "fwd":
    return _present_outs(primitives.attn_fwd(x, **dict(statics)))
  return _present_outs(primitives.attn_bwd(x, *extra, **dict(statics)))


def _local(kind, dims_in, dims_out, statics, mesh, plan, kv_heads, *args):
  """The call on one shard's block of a `plan` (under partition() or shard_map, axes manual)."""
  batch, qheads, kvheads = plan
  split = bool(qheads) and not kvheads
  full = _fill(dims_in, args)
  x = Inputs(*full[:_NIN])
  if split:  # this shard's q heads all read kv head `kvh`: run on that head alone
    shard = 0
    for a in qheads:
      shard = shard * mesh.shape[a] + jax.lax.axis_index(a)
    kvh = shard // (_size(mesh, qheads) // kv_heads)
    x = x._replace(k=jax.lax.dynamic_slice_in_dim(x.k, kvh, 1, 2), v=jax.lax.dynamic_slice_in_dim(x.v, kvh, 1, 2))
  args = [a for a in tuple(x) + tuple(full[_NIN:]) if a is not None]
  outs = _raw(kind, dims_in, statics, *args)
  if kind == "fwd":
    return outs
  g = Grads(*_fill(dims_out, outs))
  if split:  # put dk/dv back at kv head kvh, summed over the group's shards

    def home(d):
      whole = jnp.zeros(d.shape[:2] + (kv_heads,) + d.shape[3:], d.dtype)
      return jax.lax.psum(jax.lax.dynamic_update_slice_in_dim(whole, d, kvh, 2), qheads)

    g = g._replace(dk=home(g.dk), dv=home(g.dv))
  if dict(statics)["softmax"] == Softmax.LEARNABLE and batch:
    g = g._replace(dsinks=jax.lax.psum(g.dsinks, batch))
  if g.dbias is not None:  # summed over the mesh axes of the dims it is broadcast over
    words = Grads(*dims_out).dbias.split()
    axes = (batch if words[0] != "b" else ()) + (qheads if words[1] != "n" else ())
    g = g._replace(dbias=jax.lax.psum(g.dbias, axes) if axes else g.dbias)
  return _present_outs(g)


@functools.lru_cache(maxsize=None)
def _build(kind, dims_in, dims_out, statics):
  """A custom-partitioned, vmap-able call of one primitive for one layout of arguments and attributes."""

  def fn(*args):
    return _raw(kind, dims_in, statics, *args)

  def q_and_k(arg_shapes):  # of the present arguments
    x = Inputs(*_fill(dims_in, arg_shapes)[:_NIN])
    return x.q, x.k

  def partition(mesh, arg_shapes, result_shape):
    q, k = q_and_k(arg_shapes)
    plan = _plan(mesh, q, k)
    lower = functools.partial(_local, kind, dims_in, dims_out, statics, mesh, plan, k.shape[2])
    return mesh, lower, _shardings(mesh, plan, dims_out), _shardings(mesh, plan, dims_in)

  def infer(mesh, arg_shapes, result_shape):
    return _shardings(mesh, _plan(mesh, *q_and_k(arg_shapes)), dims_out)

  rule, replicated = _rule(dims_in, dims_out)
  cp = custom_partitioning(fn)
  cp.def_partition(
    partition=partition, infer_sharding_from_operands=infer, sharding_rule=rule, need_replication_factors=replicated
  )

  @jax.custom_batching.custom_vmap
  def call(*args):
    return cp(*args)

  @call.def_vmap
  def call_vmap(axis_size, in_batched, *args):
    del axis_size
    outs = jax.vmap(fn, in_axes=[0 if b else None for b in in_batched])(*args)
    return outs, tuple(True for _ in outs)

  return call


def vma(x):
  """Mesh axes x varies over inside shard_map (jax 0.10: manual_axis_type.varying; else .vma)."""
  t = jax.typeof(x)
  manual = getattr(t, "manual_axis_type", None)
  if manual is not None:
    return frozenset(manual.varying)
  return frozenset(getattr(t, "vma", ()) or ())


def to_varying(x, axes):
  """x marked as varying over `axes` too (the transpose of that cast is a psum over them)."""
  axes = tuple(sorted(frozenset(axes) - vma(x), key=str))
  if not axes:
    return x
  if hasattr(jax.lax, "pcast"):
    return jax.lax.pcast(x, axes, to="varying")
  return jax.lax.pvary(x, axes)


def _explicit_mesh(x):
  """The mesh of x's type when it has Explicit axes and no Manual ones (not inside shard_map), else None."""
  mesh = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
  types = getattr(mesh, "axis_types", ())
  if mesh is None or mesh.empty or jax.sharding.AxisType.Explicit not in types or jax.sharding.AxisType.Manual in types:
    return None
  return mesh


def _call_explicit(kind, dims_in, dims_out, statics, mesh, x: Inputs, args):
  """Under an Explicit mesh the operands' types name their shardings at trace time, so the plan is made
  here and the call runs under shard_map: results typed by the plan (custom_partitioning would type them
  from the unpartitioned call, replicated, and XLA would all-gather them), and no psum inside a
  partitioning callback (jax 0.11 lowers its reducer with a sharding annotation that XLA:CPU rejects:
  'Unsupported reduction computation')."""
  q, k = jax.typeof(x.q), jax.typeof(x.k)
  plan = _plan(mesh, q, k)
  in_specs = tuple(_spec(d, *plan) for d in _present(dims_in))
  out_specs = tuple(_spec(d, *plan) for d in _present(dims_out))
  args = [
    a if jax.typeof(a).sharding.spec == s else jax.sharding.reshard(a, NamedSharding(mesh, s))
    for a, s in zip(args, in_specs)
  ]
  return _explicit_fn(kind, dims_in, dims_out, statics, mesh, plan, k.shape[2], in_specs, out_specs)(*args)


@functools.lru_cache(maxsize=None)
def _explicit_fn(kind, dims_in, dims_out, statics, mesh, plan, kv_heads, in_specs, out_specs):
  body = functools.partial(_local, kind, dims_in, dims_out, statics, mesh, plan, kv_heads)
  # check_vma=False: the primitives' results carry no varying-axes type; out_specs say what _local makes
  # (dk/dv psum-ed over the q head axes when split, dsinks / dbias over the axes they are summed over). jit:
  # called eagerly, a shard_map runs op by op, and jax 0.11.2's Shardy crashes (SIGSEGV in
  # ManualComputationUnusedInputsPattern) compiling the lone FFI call; compiled whole it does not (and it is
  # one dispatch, not many).
  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False))


def _call(kind, x: Inputs, extra, statics):
  """The partitioned call of primitive `kind` on its inputs x and, for the backward, extra = (out, lse, dout,
  dlse) (None = absent); -> its results (None where not returned)."""
  dims_in, dims_out = _layout(kind, x, extra, dict(statics).get("want_dbias", False))
  statics = tuple(sorted(statics.items()))
  present = [a for a in tuple(x) + tuple(extra) if a is not None]
  mesh = _explicit_mesh(x.q)
  if mesh is not None:
    return tuple(_fill(dims_out, _call_explicit(kind, dims_in, dims_out, statics, mesh, x, present)))
  outs = _build(kind, dims_in, dims_out, statics)(*present)
  # Inside shard_map an FFI call's results are typed as varying over no axis. Type them like their
  # inputs, so that custom_vjp and lax.switch accept them; a gradient of an input that varies over
  # fewer axes than the call (sinks, a bias, or k/v replicated over a head axis) is a partial sum: psum it.
  axes = frozenset().union(*[vma(a) for a in present])
  if axes:
    outs = tuple(to_varying(o, axes) for o in outs)
    if kind == "bwd":
      owners = [getattr(x, name) for name, d in zip(GRAD_OF, dims_out) if d is not None]
      sums = [axes - vma(x) if x is not None else frozenset() for x in owners]
      outs = tuple(jax.lax.psum(o, tuple(sorted(a, key=str))) if a else o for o, a in zip(outs, sums))
  return tuple(_fill(dims_out, outs))


def attn_fwd(x: Inputs, *, softmax, causal, window_left, window_right, diag_offset, scale, logits_soft_cap):
  """primitives.attn_fwd, partitioned over batch and heads: -> (out [B,T,N,Hv], lse [B,N,T] fp32)."""
  statics = dict(
    softmax=softmax,
    causal=causal,
    window_left=window_left,
    window_right=window_right,
    diag_offset=diag_offset,
    scale=scale,
    logits_soft_cap=logits_soft_cap,
  )
  return _call("fwd", x, (), statics)


def attn_bwd(
  x: Inputs,
  out,
  lse,
  dout,
  dlse,
  *,
  softmax,
  causal,
  window_left,
  window_right,
  diag_offset,
  scale,
  logits_soft_cap,
  want_dbias=False,
) -> Grads:
  """primitives.attn_bwd, partitioned over batch and heads: -> Grads (dbias None unless want_dbias); dsinks (and
  dbias over its broadcast dims) summed over the sharded mesh axes."""
  statics = dict(
    softmax=softmax,
    causal=causal,
    window_left=window_left,
    window_right=window_right,
    diag_offset=diag_offset,
    scale=scale,
    logits_soft_cap=logits_soft_cap,
    want_dbias=bool(want_dbias),
  )
  return Grads(*_call("bwd", x, (out, lse, dout, dlse), statics))
