"""fp64 NumPy attention with sinks, forward and analytic backward: the oracle of the pytest suites.

Written independently of python/sinkattn/reference.py (a per-row key-range loop for the mask, a
log-sum-exp over [scores, sink] for the normaliser), from the formulas of include/sinkattn.h.
"""
import numpy as np


def mask(B, T, S, q_lens=None, kv_lens=None, q_seg=None, kv_seg=None, causal=0, window=(-1, -1),
         diag_offset=0):
  """bool [B,T,S]: row i of batch b may see key j."""
  m = np.zeros((B, T, S), bool)
  for b in range(B):
    ql = T if q_lens is None else int(np.clip(q_lens[b], 0, T))
    kl = S if kv_lens is None else int(np.clip(kv_lens[b], 0, S))
    for i in range(ql):
      diag = i + diag_offset + (kl - ql if causal == 2 else 0)
      lo, hi = 0, kl
      if causal:
        hi = min(hi, diag + 1)
      if window[1] >= 0:
        hi = min(hi, diag + window[1] + 1)
      if window[0] >= 0:
        lo = max(lo, diag - window[0])
      if hi > lo:
        m[b, i, lo:hi] = True
  if q_seg is not None:
    m &= np.asarray(q_seg)[:, :, None] == np.asarray(kv_seg)[:, None, :]
  return m


def sink_logits(N, softmax, sinks):
  if softmax == 2:
    return np.asarray(sinks, np.float64).reshape(N)
  return np.full(N, -np.inf if softmax == 0 else 0.0)


def _scores(q, k, scale, valid):
  """s [B,N,T,S] fp64 with -inf where invalid; G query heads per kv head."""
  N, K = q.shape[2], k.shape[2]
  kk = np.repeat(np.asarray(k, np.float64), N // K, axis=2)
  s = np.einsum("btnh,bsnh->bnts", np.asarray(q, np.float64), kk) * scale
  return np.where(valid[:, None], s, -np.inf)


def forward(q, k, v, sinks=None, *, softmax=0, scale=None, causal=0, window=(-1, -1), q_lens=None,
            kv_lens=None, q_seg=None, kv_seg=None, diag_offset=0):
  """-> (out [B,T,N,Hv], lse [B,N,T]) in fp64."""
  B, T, N, H = q.shape
  S, K = k.shape[1], k.shape[2]
  scale = 1.0 / np.sqrt(H) if scale is None else scale
  valid = mask(B, T, S, q_lens, kv_lens, q_seg, kv_seg, causal, window, diag_offset)
  s = _scores(q, k, scale, valid)
  a = np.broadcast_to(sink_logits(N, softmax, sinks)[None, :, None, None], (B, N, T, 1))
  with np.errstate(divide="ignore", invalid="ignore"):
    both = np.concatenate([s, a], axis=-1)
    top = np.max(both, axis=-1, keepdims=True)
    top_safe = np.where(np.isfinite(top), top, 0.0)
    lse = (top_safe + np.log(np.sum(np.exp(both - top_safe), axis=-1, keepdims=True)))[..., 0]
    p = np.where(valid[:, None], np.exp(s - np.where(np.isfinite(lse), lse, 0.0)[..., None]), 0.0)
  vv = np.repeat(np.asarray(v, np.float64), N // K, axis=2)
  out = np.einsum("bnts,bsnd->btnd", p, vv)
  return out, lse


def backward(q, k, v, sinks, dout, dlse=None, *, softmax=0, scale=None, causal=0, window=(-1, -1),
             q_lens=None, kv_lens=None, q_seg=None, kv_seg=None, diag_offset=0):
  """-> (dq, dk, dv, dsinks) in fp64, from the formulas of sinkattn.h (dsinks zeros unless learnable)."""
  B, T, N, H = q.shape
  S, K = k.shape[1], k.shape[2]
  G = N // K
  scale = 1.0 / np.sqrt(H) if scale is None else scale
  kw = dict(softmax=softmax, scale=scale, causal=causal, window=window, q_lens=q_lens, kv_lens=kv_lens,
            q_seg=q_seg, kv_seg=kv_seg, diag_offset=diag_offset)
  out, lse = forward(q, k, v, sinks, **kw)
  valid = mask(B, T, S, q_lens, kv_lens, q_seg, kv_seg, causal, window, diag_offset)
  s = _scores(q, k, scale, valid)
  with np.errstate(invalid="ignore"):
    p = np.where(valid[:, None], np.exp(s - np.where(np.isfinite(lse), lse, 0.0)[..., None]), 0.0)
  do = np.asarray(dout, np.float64)
  D = np.einsum("btnd,btnd->bnt", do, out)
  if dlse is not None:
    D = D - np.asarray(dlse, np.float64)
  qq, kk, vv = (np.asarray(x, np.float64) for x in (q, k, v))
  kr, vr = np.repeat(kk, G, axis=2), np.repeat(vv, G, axis=2)
  dp = np.einsum("btnd,bsnd->bnts", do, vr)
  ds = p * (dp - D[..., None])
  dq = scale * np.einsum("bnts,bsnh->btnh", ds, kr)
  dk = (scale * np.einsum("bnts,btnh->bsnh", ds, qq)).reshape(B, S, K, G, H).sum(3)
  dv = np.einsum("bnts,btnd->bsnd", p, do).reshape(B, S, K, G, -1).sum(3)
  dsinks = np.zeros(N)
  if softmax == 2:
    a = sink_logits(N, softmax, sinks)[None, :, None]
    dsinks = -np.sum(np.exp(a - lse) * D, axis=(0, 2))
  return dq, dk, dv, dsinks
