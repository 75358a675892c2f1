"""Sharding of the fused attention custom calls: batch- and head-parallel, without gathering q/k/v.

An XLA FFI call is opaque to the SPMD partitioner: left alone, XLA all-gathers every operand onto every
device and runs the whole problem everywhere. `attn_fwd` / `attn_bwd` here have the signatures of
`primitives.attn_fwd` / `primitives.attn_bwd` and wrap them in `jax.experimental.custom_partitioning`:

- Shardy rule (the default partitioner in jax 0.10 and 0.11): one factor per logical dim; the q head
  factor n is shared by q, sinks, out, lse and dq; t, s, h, e (sequence and head dims) need replication.
  q heads and kv heads are separate factors, not the compound (k g): Shardy splits a mesh axis that does
  not divide K into sub-axes for (k g) (e.g. 4 devices, K = 2), and such a sharding cannot be named by
  a PartitionSpec, so the partition callback could not even be called.
- partition(): the final decision, which ties the two head factors together. Batch axes come from q's
  batch dim; head axes from q's head dim when their size m divides K (each shard keeps whole GQA
  groups, kv heads sharded the same way), or when K divides m (MQA / few kv heads under tensor
  parallelism: k/v stay replicated over the head axes, each shard slices the one kv head its q heads
  read, and dk/dv are psum-ed over the head axes, since m / K shards each hold part of a group);
  otherwise heads are replicated. Every shard runs the primitive on its block.
- dsinks is a sum over batch rows, so each shard's partial sum is psum-ed over the batch axes inside
  the partition: always, with no mesh-resource setting (Transformer Engine skips this reduction unless
  one is configured, silently leaving a per-shard dsinks).
- Inside shard_map (all axes manual) the call runs as is; its results are typed as varying over the
  axes its inputs vary over, and the gradient of an input that varies over fewer axes (replicated
  sinks, or k/v replicated over a head axis) is psum-ed over the rest, so custom_vjp accepts it.
- Under jax.vmap the call goes to the primitive's own batching rule (custom_vmap): custom_partitioning
  has no batching rule of its own.
- Under an Explicit mesh (jax.sharding.AxisType.Explicit, set_mesh) the operands' types carry their
  shardings, so the same plan is made when tracing and the call runs under shard_map with the same
  per-shard body: results are typed sharded like q (custom_partitioning types them replicated, which
  made XLA all-gather the output and custom_vjp reject the gradients' types).
The GSPMD partitioner (jax_use_shardy_partitioner=False) gets the same decision through
infer_sharding_from_operands.
"""
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from . import primitives

# Logical dims of every operand / result, in primitive argument order (None arguments are dropped).
_FWD_IN = ('b t n h', 'b s k h', 'b s k e', 'n', 'b', 'b', 'b t', 'b s')
_FWD_OUT = ('b t n e', 'b n t')
_BWD_IN = _FWD_IN + ('b t n e', 'b n t', 'b t n e', 'b n t')  # out lse dout dlse
_BWD_OUT = ('b t n h', 'b s k h', 'b s k e', 'n')
_REPLICATED = ('t', 's', 'h', 'e')  # listed to Shardy in order of first appearance (it requires that)
_LEARNABLE = 2


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
    return batch, heads, heads   # whole GQA groups per shard
  if N % m == 0 and m % K == 0:
    return batch, heads, ()      # a group spread over m / K shards: kv replicated, sliced per shard
  return batch, (), ()


def _spec(dims, batch, qheads, kvheads):
  """PartitionSpec of an array with logical dims `dims` (one word per dim, from the tables above)."""
  out = []
  for d in dims.split():
    axes = {'b': batch, 'n': qheads, 'k': kvheads}.get(d, ())
    out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return P(*out)


def _shardings(mesh, plan, dims):
  return tuple(NamedSharding(mesh, _spec(d, *plan)) for d in dims)


def _rule(dims_in, dims_out):
  """Shardy rule string and its need-replication factors."""
  rule = '%s -> %s' % (', '.join(dims_in), ', '.join(dims_out))
  order = [f for f in rule.replace('(', ' ').replace(')', ' ').replace(',', ' ').split() if f != '->']
  replicated = tuple(sorted(_REPLICATED, key=order.index))
  return rule, replicated


def _fill(present, args):
  """Re-insert None for the absent optional arguments."""
  it = iter(args)
  return [next(it) if p else None for p in present]


def _raw(kind, present, statics, *args):
  full = _fill(present, args)
  kw = dict(statics)
  if kind == 'fwd':
    return tuple(primitives.attn_fwd(*full, **kw))
  return tuple(primitives.attn_bwd(*full, **kw))


def _dims(kind, present):
  """Logical dims of the present operands and of the results."""
  dims_in = tuple(d for d, p in zip(_FWD_IN if kind == 'fwd' else _BWD_IN, present) if p)
  return dims_in, (_FWD_OUT if kind == 'fwd' else _BWD_OUT)


def _local(kind, present, statics, mesh, plan, kv_heads, *args):
  """The call on one shard's block of a `plan` (under partition() or shard_map, axes manual)."""
  batch, qheads, kvheads = plan
  split = bool(qheads) and not kvheads
  if split:  # this shard's q heads all read kv head `kvh`: run on that head alone
    shard = 0
    for a in qheads:
      shard = shard * mesh.shape[a] + jax.lax.axis_index(a)
    kvh = shard // (_size(mesh, qheads) // kv_heads)
    args = (args[0],) + tuple(jax.lax.dynamic_slice_in_dim(x, kvh, 1, 2) for x in args[1:3]) + args[3:]
  outs = _raw(kind, present, statics, *args)
  if kind == 'bwd' and split:  # put dk/dv back at kv head kvh, summed over the group's shards
    full = [jax.lax.dynamic_update_slice_in_dim(jnp.zeros(x.shape[:2] + (kv_heads,) + x.shape[3:],
                                                          x.dtype), x, kvh, 2) for x in outs[1:3]]
    outs = (outs[0],) + tuple(jax.lax.psum(x, qheads) for x in full) + outs[3:]
  if kind == 'bwd' and dict(statics)['softmax'] == _LEARNABLE and batch:
    outs = outs[:3] + (jax.lax.psum(outs[3], batch),)
  return outs


@functools.lru_cache(maxsize=None)
def _build(kind, present, statics):
  """A custom-partitioned, vmap-able call of one primitive for one set of present arguments/attributes."""
  dims_in, dims_out = _dims(kind, present)

  def fn(*args):
    return _raw(kind, present, statics, *args)

  def partition(mesh, arg_shapes, result_shape):
    plan = _plan(mesh, arg_shapes[0], arg_shapes[1])
    lower = functools.partial(_local, kind, present, statics, mesh, plan, arg_shapes[1].shape[2])
    return (mesh, lower, _shardings(mesh, plan, dims_out)[:len(result_shape)],
            _shardings(mesh, plan, dims_in))

  def infer(mesh, arg_shapes, result_shape):
    plan = _plan(mesh, arg_shapes[0], arg_shapes[1])
    return _shardings(mesh, plan, dims_out)[:len(result_shape)]

  rule, replicated = _rule(dims_in, dims_out)
  cp = custom_partitioning(fn)
  cp.def_partition(partition=partition, infer_sharding_from_operands=infer, sharding_rule=rule,
                   need_replication_factors=replicated)

  @jax.custom_batching.custom_vmap
  def call(*args):
    return cp(*args)

  @call.def_vmap
  def call_vmap(axis_size, in_batched, *args):
    del axis_size
    axes = [0 if b else None for b in in_batched]
    outs = jax.vmap(fn, in_axes=axes)(*args)
    return outs, tuple(True for _ in outs)

  return call


def vma(x):
  """Mesh axes x varies over inside shard_map (jax 0.10: manual_axis_type.varying; else .vma)."""
  t = jax.typeof(x)
  manual = getattr(t, 'manual_axis_type', None)
  if manual is not None:
    return frozenset(manual.varying)
  return frozenset(getattr(t, 'vma', ()) or ())


def to_varying(x, axes):
  """x marked as varying over `axes` too (the transpose of that cast is a psum over them)."""
  axes = tuple(sorted(frozenset(axes) - vma(x), key=str))
  if not axes:
    return x
  if hasattr(jax.lax, 'pcast'):
    return jax.lax.pcast(x, axes, to='varying')
  return jax.lax.pvary(x, axes)


def _explicit_mesh(x):
  """The mesh of x's type when it has Explicit axes and no Manual ones (not inside shard_map), else None."""
  mesh = getattr(getattr(jax.typeof(x), 'sharding', None), 'mesh', None)
  types = getattr(mesh, 'axis_types', ())
  if mesh is None or mesh.empty or jax.sharding.AxisType.Explicit not in types or \
     jax.sharding.AxisType.Manual in types:
    return None
  return mesh


def _call_explicit(kind, present, statics, mesh, args):
  """Under an Explicit mesh the operands' types name their shardings at trace time, so the plan is made
  here and the call runs under shard_map: results typed by the plan (custom_partitioning would type them
  from the unpartitioned call, replicated, and XLA would all-gather them), and no psum inside a
  partitioning callback (jax 0.11 lowers its reducer with a sharding annotation that XLA:CPU rejects:
  'Unsupported reduction computation')."""
  dims_in, dims_out = _dims(kind, present)
  q, k = jax.typeof(args[0]), jax.typeof(args[1])
  plan = _plan(mesh, q, k)
  in_specs = tuple(_spec(d, *plan) for d in dims_in)
  out_specs = tuple(_spec(d, *plan) for d in dims_out)
  args = [a if jax.typeof(a).sharding.spec == s else jax.sharding.reshard(a, NamedSharding(mesh, s))
          for a, s in zip(args, in_specs)]
  return _explicit_fn(kind, present, statics, mesh, plan, k.shape[2], in_specs, out_specs)(*args)


@functools.lru_cache(maxsize=None)
def _explicit_fn(kind, present, statics, mesh, plan, kv_heads, in_specs, out_specs):
  body = functools.partial(_local, kind, present, statics, mesh, plan, kv_heads)
  # check_vma=False: the primitives' results carry no varying-axes type; out_specs say what _local makes
  # (dk/dv psum-ed over the q head axes when split, dsinks over the batch axes). jit: called eagerly, a
  # shard_map runs op by op, and jax 0.11.2's Shardy crashes (SIGSEGV in ManualComputationUnusedInputs-
  # Pattern) compiling the lone FFI call; compiled whole it does not (and it is one dispatch, not many).
  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False))


def _call(kind, args, statics):
  present = tuple(a is not None for a in args)
  mesh = _explicit_mesh(args[0])
  if mesh is not None:
    return _call_explicit(kind, present, tuple(sorted(statics.items())), mesh,
                          [a for a in args if a is not None])
  fn = _build(kind, present, tuple(sorted(statics.items())))
  outs = fn(*[a for a in args if a is not None])
  # Inside shard_map an FFI call's results are typed as varying over no axis. Type them like their
  # inputs, so that custom_vjp and lax.switch accept them; a gradient of an input that varies over
  # fewer axes than the call (sinks, or k/v replicated over a head axis) is a partial sum: psum it.
  axes = frozenset().union(*[vma(a) for a in args if a is not None])
  if not axes:
    return outs
  outs = tuple(to_varying(o, axes) for o in outs)
  if kind == 'fwd':
    return outs
  sums = [axes - vma(x) if x is not None else frozenset() for x in (args[0], args[1], args[2], args[3])]
  return tuple(jax.lax.psum(o, tuple(sorted(a, key=str))) if a else o for o, a in zip(outs, sums))


def attn_fwd(q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, *, softmax, causal, window_left,
             window_right, diag_offset, scale):
  """primitives.attn_fwd, partitioned over batch and heads: -> (out [B,T,N,Hv], lse [B,N,T] fp32)."""
  statics = dict(softmax=softmax, causal=causal, window_left=window_left, window_right=window_right,
                 diag_offset=diag_offset, scale=scale)
  return _call('fwd', (q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg), statics)


def attn_bwd(q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, out, lse, dout, dlse, *, softmax, causal,
             window_left, window_right, diag_offset, scale, deterministic=True):
  """primitives.attn_bwd, partitioned over batch and heads: -> (dq, dk, dv, dsinks); dsinks summed over
  the batch-sharded mesh axes."""
  statics = dict(softmax=softmax, causal=causal, window_left=window_left, window_right=window_right,
                 diag_offset=diag_offset, scale=scale, deterministic=deterministic)
  args = (q, k, v, sinks, q_lens, kv_lens, q_seg, kv_seg, out, lse, dout, dlse)
  return _call('bwd', args, statics)
