"""bench/attn_ref.py: fp64 attention with sinks, forward and backward, computed BLOCKWISE over query rows so a
production shape fits in memory (one block of scores [B, K, G, rows, keys] at a time, at most `block_bytes`),
on NumPy arrays (host) or PyTorch tensors (any device: the GPU when the inputs live there). The formulas are
include/sinkattn.h's; the masks are causal (top-left or bottom-right, with q_len == kv_len or not), a window
(left, right) and segment ids. Lengths and diag_offset are not modelled: they raise NotImplementedError.

fp64 throughout (the inputs' bf16 / f16 values are exact in it); a causal or windowed block reads only the keys
its rows can see, so the causal grid costs half of the full one. On an H200 fp64 matrix products run on the
tensor cores (DMMA) at about the fp32 rate, so the reference of the largest grid row (B1 T16384 N32 H64) takes
seconds, not minutes.
"""

import contextlib
import math

import numpy as np


class _NumpyOps:
  name = "numpy"

  def __init__(self, like):
    self.exp, self.log, self.where, self.maximum, self.isfinite = np.exp, np.log, np.where, np.maximum, np.isfinite
    self.einsum = np.einsum

  def f64(self, x):
    return np.asarray(x).astype(np.float64)

  def amax(self, x, axis):
    return np.max(x, axis=axis, keepdims=True)

  def sum(self, x, axis):
    return np.sum(x, axis=axis, keepdims=True)

  def zeros(self, shape):
    return np.zeros(shape, np.float64)

  def true(self, shape):
    return np.ones(shape, bool)

  def arange(self, n):
    return np.arange(n)

  def cpu(self, x):
    return np.asarray(x)

  def quiet(self):  # log(0) of a row without keys is -inf by design
    return np.errstate(divide="ignore", invalid="ignore")

  def clamp_min(self, x, v):
    return np.maximum(x, v)


class _TorchOps:
  name = "torch"

  def __init__(self, like):
    import torch

    self.t, self.device = torch, like.device
    self.exp, self.log, self.where, self.maximum, self.isfinite = (
      torch.exp,
      torch.log,
      torch.where,
      torch.maximum,
      torch.isfinite,
    )
    self.einsum = torch.einsum

  def f64(self, x):
    return x.to(self.t.float64)

  def amax(self, x, axis):
    return self.t.amax(x, dim=axis, keepdim=True)

  def sum(self, x, axis):
    return self.t.sum(x, dim=axis, keepdim=True)

  def zeros(self, shape):
    return self.t.zeros(shape, dtype=self.t.float64, device=self.device)

  def true(self, shape):
    return self.t.ones(shape, dtype=self.t.bool, device=self.device)

  def arange(self, n):
    return self.t.arange(n, device=self.device)

  def cpu(self, x):
    return x.cpu().numpy()

  def quiet(self):
    return contextlib.nullcontext()

  def clamp_min(self, x, v):
    return x.clamp_min(v)


def ops_for(x):
  return _TorchOps(x) if hasattr(x, "data_ptr") else _NumpyOps(x)


class Problem:
  """The mask and sizes of one call: causal 0 none, 1 top-left, 2 bottom-right; window (left, right), -1 =
  unbounded; q_seg [B,T] / kv_seg [B,S] or None."""

  def __init__(
    self,
    q,
    k,
    v,
    sinks,
    *,
    causal=0,
    window=(-1, -1),
    scale=None,
    q_seg=None,
    kv_seg=None,
    q_lens=None,
    kv_lens=None,
    diag_offset=0,
  ):
    if q_lens is not None or kv_lens is not None or diag_offset:
      raise NotImplementedError(
        "attn_ref: lengths and diag_offset are not modelled (q_lens / kv_lens / diag_offset given)"
      )
    if (q_seg is None) != (kv_seg is None):
      raise ValueError("attn_ref: q_seg and kv_seg go together")
    self.B, self.T, self.N, self.H = q.shape
    self.S, self.K, self.Hv = k.shape[1], k.shape[2], v.shape[3]
    if self.N % self.K:
      raise ValueError(f"attn_ref: q heads {self.N} not a multiple of kv heads {self.K}")
    self.G = self.N // self.K
    self.causal, self.window = causal, window
    self.scale = 1.0 / math.sqrt(self.H) if scale is None else scale
    self.q_seg, self.kv_seg = q_seg, kv_seg
    self.o = ops_for(q)
    self.sinks = sinks  # [N] fp32, or None (vanilla)

  def key_range(self, t0, t1):
    """Keys [lo, hi) that rows [t0, t1) may see (before segments)."""
    shift = self.S - self.T if self.causal == 2 else 0
    lo, hi = 0, self.S
    if self.causal:
      hi = min(hi, t1 - 1 + shift + 1)
    if self.window[1] >= 0:
      hi = min(hi, t1 - 1 + shift + self.window[1] + 1)
    if self.window[0] >= 0:
      lo = max(lo, t0 + shift - self.window[0])
    return max(lo, 0), max(hi, lo, 0)

  def valid(self, t0, t1, lo, hi):
    """bool [B or 1, 1, 1, rows, keys]."""
    o = self.o
    i = o.arange(t1 - t0)[:, None] + t0 + (self.S - self.T if self.causal == 2 else 0)
    j = o.arange(hi - lo)[None, :] + lo
    ok = o.true((t1 - t0, hi - lo))
    if self.causal:
      ok = ok & (j <= i)
    if self.window[1] >= 0:
      ok = ok & (j <= i + self.window[1])
    if self.window[0] >= 0:
      ok = ok & (j >= i - self.window[0])
    ok = ok[None, None, None]
    if self.q_seg is not None:
      ok = ok & (self.q_seg[:, None, None, t0:t1, None] == self.kv_seg[:, None, None, None, lo:hi])
    return ok

  def sink_logit(self):
    """[1, K, G, 1, 1] fp64 (-inf for vanilla)."""
    o = self.o
    if self.sinks is None:
      return o.zeros((1, self.K, self.G, 1, 1)) - float("inf")
    return o.f64(self.sinks).reshape(1, self.K, self.G, 1, 1)

  def rows_per_block(self, block_bytes):
    per_row = 8 * self.B * self.N * max(self.S, 1) * 3  # scores, P and one temporary
    return max(16, min(self.T, block_bytes // per_row))

  def scores(self, q, k, t0, t1):
    """s [B,K,G,rows,keys] fp64 of rows [t0, t1) with -inf where invalid, and the key range."""
    o = self.o
    lo, hi = self.key_range(t0, t1)
    qb = o.f64(q[:, t0:t1]).reshape(self.B, t1 - t0, self.K, self.G, self.H)
    s = o.einsum("btkgh,bskh->bkgts", qb, o.f64(k[:, lo:hi])) * self.scale
    return o.where(self.valid(t0, t1, lo, hi), s, -float("inf")), lo, hi


def forward(q, k, v, sinks=None, block_bytes=512 << 20, **mask):
  """-> (out [B,T,N,Hv], lse [B,N,T]) fp64, on q's device."""
  P = Problem(q, k, v, sinks, **mask)
  o, a = P.o, P.sink_logit()
  out, lse = o.zeros((P.B, P.T, P.N, P.Hv)), o.zeros((P.B, P.N, P.T))
  step = P.rows_per_block(block_bytes)
  for t0 in range(0, P.T, step):
    with o.quiet():
      _forward_block(P, q, k, v, a, out, lse, t0, min(P.T, t0 + step))
  return out, lse


def _forward_block(P, q, k, v, a, out, lse, t0, t1):
  o = P.o
  s, lo, hi = P.scores(q, k, t0, t1)
  if hi <= lo:  # no key for these rows: out 0, lse = the sink logit
    lse[:, :, t0:t1] = a.reshape(1, P.N, 1)
    return
  m = o.maximum(o.amax(s, -1), a)
  msafe = o.where(o.isfinite(m), m, 0.0)
  l = msafe + o.log(o.sum(o.exp(s - msafe), -1) + o.exp(a - msafe))  # [B,K,G,rows,1]
  p = o.exp(s - o.where(o.isfinite(l), l, 0.0))
  out[:, t0:t1] = o.einsum("bkgts,bskd->btkgd", p, o.f64(v[:, lo:hi])).reshape(P.B, t1 - t0, P.N, P.Hv)
  lse[:, :, t0:t1] = l[..., 0].reshape(P.B, P.N, t1 - t0)


def backward(q, k, v, sinks, out, lse, dout, block_bytes=512 << 20, **mask):
  """-> (dq, dk, dv, dsinks) fp64 of the contract's formulas, with D_i = sum_d dout_id out_id taken from `out`
  as the forward stores it (pass the reference output rounded to the kernels' dtype: a backward reads the
  stored out) and lse the reference's. dsinks is zeros for vanilla (sinks None)."""
  P = Problem(q, k, v, sinks, **mask)
  o, a = P.o, P.sink_logit()
  dq, dk, dv = o.zeros(q.shape), o.zeros(k.shape), o.zeros(v.shape)
  dsink = o.zeros((1, P.K, P.G, 1, 1))
  step = P.rows_per_block(block_bytes)
  for t0 in range(0, P.T, step):
    t1 = min(P.T, t0 + step)
    rows = t1 - t0
    s, lo, hi = P.scores(q, k, t0, t1)
    if hi <= lo:  # rows without keys: out 0, so D = 0 and they add nothing
      continue
    l = o.f64(lse[:, :, t0:t1]).reshape(P.B, P.K, P.G, rows, 1)
    p = o.exp(s - o.where(o.isfinite(l), l, 0.0))
    do = o.f64(dout[:, t0:t1]).reshape(P.B, rows, P.K, P.G, P.Hv)
    D = o.einsum("btkgd,btkgd->bkgt", do, o.f64(out[:, t0:t1]).reshape(P.B, rows, P.K, P.G, P.Hv))[..., None]
    dp = o.einsum("btkgd,bskd->bkgts", do, o.f64(v[:, lo:hi]))
    ds = p * (dp - D)
    dq[:, t0:t1] = (o.einsum("bkgts,bskh->btkgh", ds, o.f64(k[:, lo:hi])) * P.scale).reshape(P.B, rows, P.N, P.H)
    qb = o.f64(q[:, t0:t1]).reshape(P.B, rows, P.K, P.G, P.H)
    dk[:, lo:hi] += o.einsum("bkgts,btkgh->bskh", ds, qb) * P.scale
    dv[:, lo:hi] += o.einsum("bkgts,btkgd->bskd", p, do)
    if sinks is not None:
      w = o.where(o.isfinite(l), o.exp(a - o.where(o.isfinite(l), l, 0.0)), 0.0)
      dsink = dsink - o.sum(o.sum(w * D, -2), 0)
  return dq, dk, dv, dsink.reshape(P.N)
