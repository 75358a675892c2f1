"""fp64 NumPy attention with sinks, forward and analytic backward: the oracle of the pytest suites.

Written independently of python/sinkattn/reference.py (a per-row key-range loop for the mask, a
log-sum-exp over [scores, sink] for the normaliser), from the formulas of include/sinkattn.h.
"""

import numpy as np


def mask(
  B,
  T,
  S,
  q_lens=None,
  kv_lens=None,
  q_seg=None,
  kv_seg=None,
  causal=0,
  window=(-1, -1),
  diag_offset=0,
  q_pos=None,
  kv_pos=None,
):
  """bool [B,T,S]: row i of batch b may see key j (positions, when given, place the causal / window masks)."""
  m = np.zeros((B, T, S), bool)
  for b in range(B):
    ql = T if q_lens is None else int(np.clip(q_lens[b], 0, T))
    kl = S if kv_lens is None else int(np.clip(kv_lens[b], 0, S))
    for i in range(ql):
      if q_pos is not None:  # key j by its position: kv_pos[j] against q_pos[i] + diag_offset
        p, kp = int(q_pos[b][i]) + diag_offset, np.asarray(kv_pos[b][:kl], np.int64)
        ok = np.ones(kl, bool)
        if causal:
          ok &= kp <= p
        if window[1] >= 0:
          ok &= kp <= p + window[1]
        if window[0] >= 0:
          ok &= kp >= p - window[0]
        m[b, i, :kl] = ok
        continue
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


def _scores(q, k, scale, valid, bias=None, cap=0.0):
  """s [B,N,T,S] fp64 (+ bias, broadcast; soft-capped to cap * tanh(s / cap) when cap) with -inf where invalid;
  G query heads per kv head. valid: [B,N|1,T,S]."""
  N, K = q.shape[2], k.shape[2]
  kk = np.repeat(np.asarray(k, np.float64), N // K, axis=2)
  s = np.einsum("btnh,bsnh->bnts", np.asarray(q, np.float64), kk) * scale
  if bias is not None:
    s = s + np.asarray(bias, np.float64)
  if cap:
    s = cap * np.tanh(s / cap)
  return np.where(valid, s, -np.inf)


def _valid(B, T, S, N, q_lens, kv_lens, q_seg, kv_seg, causal, window, diag_offset, q_pos, kv_pos, attn_mask):
  """bool [B,N,T,S]: the index / position masks AND the caller's mask (nonzero = attend)."""
  m = mask(B, T, S, q_lens, kv_lens, q_seg, kv_seg, causal, window, diag_offset, q_pos, kv_pos)[:, None]
  if attn_mask is not None:
    m = m & (np.asarray(attn_mask) != 0)
  return np.broadcast_to(m, (B, N, T, S))


def forward(
  q,
  k,
  v,
  sinks=None,
  *,
  softmax=0,
  scale=None,
  causal=0,
  window=(-1, -1),
  q_lens=None,
  kv_lens=None,
  q_seg=None,
  kv_seg=None,
  diag_offset=0,
  bias=None,
  attn_mask=None,
  q_pos=None,
  kv_pos=None,
  logits_soft_cap=0.0,
):
  """-> (out [B,T,N,Hv], lse [B,N,T]) in fp64. bias / attn_mask: broadcastable to [B,N,T,S]; logits_soft_cap: the
  cap (0 = none), the sink not capped."""
  B, T, N, H = q.shape
  S, K = k.shape[1], k.shape[2]
  scale = 1.0 / np.sqrt(H) if scale is None else scale
  valid = _valid(B, T, S, N, q_lens, kv_lens, q_seg, kv_seg, causal, window, diag_offset, q_pos, kv_pos, attn_mask)
  s = _scores(q, k, scale, valid, bias, logits_soft_cap)
  a = np.broadcast_to(sink_logits(N, softmax, sinks)[None, :, None, None], (B, N, T, 1))
  with np.errstate(divide="ignore", invalid="ignore"):
    both = np.concatenate([s, a], axis=-1)
    top = np.max(both, axis=-1, keepdims=True)
    top_safe = np.where(np.isfinite(top), top, 0.0)
    lse = (top_safe + np.log(np.sum(np.exp(both - top_safe), axis=-1, keepdims=True)))[..., 0]
    p = np.where(valid & np.isfinite(s), np.exp(s - np.where(np.isfinite(lse), lse, 0.0)[..., None]), 0.0)
  vv = np.repeat(np.asarray(v, np.float64), N // K, axis=2)
  out = np.einsum("bnts,bsnd->btnd", p, vv)
  return out, lse


def backward(
  q,
  k,
  v,
  sinks,
  dout,
  dlse=None,
  *,
  softmax=0,
  scale=None,
  causal=0,
  window=(-1, -1),
  q_lens=None,
  kv_lens=None,
  q_seg=None,
  kv_seg=None,
  diag_offset=0,
  bias=None,
  attn_mask=None,
  q_pos=None,
  kv_pos=None,
  logits_soft_cap=0.0,
):
  """-> (dq, dk, dv, dsinks[, dbias]) in fp64, from the formulas of sinkattn.h (dsinks zeros unless learnable;
  dbias, in bias's shape, the sum of ds over the axes the bias is broadcast over, only when bias is given; under a
  soft-cap the gradient of the logit is ds times 1 - tanh^2)."""
  B, T, N, H = q.shape
  S, K = k.shape[1], k.shape[2]
  G = N // K
  scale = 1.0 / np.sqrt(H) if scale is None else scale
  kw = dict(
    softmax=softmax,
    scale=scale,
    causal=causal,
    window=window,
    q_lens=q_lens,
    kv_lens=kv_lens,
    q_seg=q_seg,
    kv_seg=kv_seg,
    diag_offset=diag_offset,
    bias=bias,
    attn_mask=attn_mask,
    q_pos=q_pos,
    kv_pos=kv_pos,
    logits_soft_cap=logits_soft_cap,
  )
  out, lse = forward(q, k, v, sinks, **kw)
  valid = _valid(B, T, S, N, q_lens, kv_lens, q_seg, kv_seg, causal, window, diag_offset, q_pos, kv_pos, attn_mask)
  s = _scores(q, k, scale, valid, bias, logits_soft_cap)
  with np.errstate(invalid="ignore"):
    p = np.where(valid & np.isfinite(s), np.exp(s - np.where(np.isfinite(lse), lse, 0.0)[..., None]), 0.0)
  do = np.asarray(dout, np.float64)
  D = np.einsum("btnd,btnd->bnt", do, out)
  if dlse is not None:
    D = D - np.asarray(dlse, np.float64)
  qq, kk, vv = (np.asarray(x, np.float64) for x in (q, k, v))
  kr, vr = np.repeat(kk, G, axis=2), np.repeat(vv, G, axis=2)
  dp = np.einsum("btnd,bsnd->bnts", do, vr)
  ds = p * (dp - D[..., None])
  if logits_soft_cap:  # d s / d l = 1 - tanh(l / cap)^2 = 1 - (s / cap)^2 (0 where masked: p is 0 there)
    ds = ds * (1.0 - np.where(valid, s / logits_soft_cap, 0.0) ** 2)
  dq = scale * np.einsum("bnts,bsnh->btnh", ds, kr)
  dk = (scale * np.einsum("bnts,btnh->bsnh", ds, qq)).reshape(B, S, K, G, H).sum(3)
  dv = np.einsum("bnts,btnd->bsnd", p, do).reshape(B, S, K, G, -1).sum(3)
  dsinks = np.zeros(N)
  if softmax == 2:
    a = sink_logits(N, softmax, sinks)[None, :, None]
    dsinks = -np.sum(np.exp(a - lse) * D, axis=(0, 2))
  if bias is None:
    return dq, dk, dv, dsinks
  shape = np.shape(bias)
  dbias = ds.sum(axis=tuple(d for d in range(4) if shape[d] == 1), keepdims=True)
  return dq, dk, dv, dsinks, dbias
