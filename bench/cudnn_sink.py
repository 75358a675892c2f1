"""bench/cudnn_sink.py: cuDNN's SDPA with a sink token (the backend Transformer Engine uses for sinks), called
directly through cudnn-frontend's Python graph API (package nvidia-cudnn-frontend; the sink token is in its
Python API from 1.19.0 on; it loads the libcudnn that PyTorch loaded), forward and backward, bf16, BSHD layout
(our BTNH) with GQA, causal top-left and a left window, on torch tensors.

cuDNN's conventions, mapped from ours: q [B,T,N,H] is the logical (B, N, T, H) with strides (T N H, H, N H, 1);
the sink token is (1, N, 1, 1) fp32 (our sinks [N]); stats (B, N, T, 1) fp32 are the natural-log log-sum-exp
including the sink (our lse); a window (left, 0) is diagonal_band_left_bound = left + 1 (cuDNN keeps keys
j > i - bound) with diagonal_band_right_bound = 0 (causal). Its dsink is documented as non-deterministic.
"""

import math

_UID = dict(q=1, k=2, v=3, sink=4, o=5, stats=6, dO=7, dQ=8, dK=9, dV=10, dSink=11)


def load(torch):
  """The cudnn module, after PyTorch has loaded its libcudnn (the frontend then dlopens the same one)."""
  torch.backends.cudnn.version()
  import cudnn

  return cudnn


class CudnnSink:
  """Forward and backward graphs of one shape; `fwd(i)` / `fb(i)` run them on buffer set i."""

  def __init__(self, torch, cudnn, sets, B, T, N, K, H, causal, window):
    self.t, self.c = torch, cudnn
    self.h = cudnn.create_handle()
    cudnn.set_stream(handle=self.h, stream=torch.cuda.current_stream().cuda_stream)
    S = T
    self.dims = dict(
      q=((B, N, T, H), (T * N * H, H, N * H, 1)),
      k=((B, K, S, H), (S * K * H, H, K * H, 1)),
      sink=((1, N, 1, 1), (N, 1, 1, 1)),
      stats=((B, N, T, 1), (N * T, T, 1, 1)),
    )
    self.dims.update(
      v=self.dims["k"],
      o=self.dims["q"],
      dO=self.dims["q"],
      dQ=self.dims["q"],
      dK=self.dims["k"],
      dV=self.dims["k"],
      dSink=self.dims["sink"],
    )
    self.mask = dict(
      diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT,
      diagonal_band_right_bound=0 if causal else None,
      diagonal_band_left_bound=window[0] + 1 if window else None,
    )
    if window and (not causal or window[1] != 0):
      raise NotImplementedError(f"cudnn_sink: window {window} without causal (left, 0) is not set up here")
    self.scale = 1.0 / math.sqrt(H)
    self.g_fwd, self.g_bwd = self._forward(), self._backward()
    ws = max(self.g_fwd.get_workspace_size(), self.g_bwd.get_workspace_size(), 16)
    self.ws = torch.empty(ws, dtype=torch.uint8, device="cuda")
    # one variant pack per set and graph: uid -> device address (the cheapest form the frontend's execute takes)
    pack = lambda s, names: {_UID[n]: s[n].data_ptr() for n in names}
    self.packs_fwd = [pack(s, ("q", "k", "v", "sink", "o", "stats")) for s in sets]
    self.packs_bwd = [pack(s, ("q", "k", "v", "o", "dO", "stats", "sink", "dQ", "dK", "dV", "dSink")) for s in sets]

  def _tensor(self, g, name, dtype):
    dim, stride = self.dims[name]
    return g.tensor(uid=_UID[name], dim=dim, stride=stride, data_type=dtype)

  def _graph(self):
    c = self.c
    return c.pygraph(
      io_data_type=c.data_type.BFLOAT16,
      intermediate_data_type=c.data_type.FLOAT,
      compute_data_type=c.data_type.FLOAT,
      handle=self.h,
    )

  def _finish(self, g):
    c = self.c
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([c.heur_mode.A, c.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return g

  def _out(self, x, name, f32=False):
    dim, stride = self.dims[name]
    x.set_uid(_UID[name]).set_output(True).set_dim(dim).set_stride(stride)
    if f32:
      x.set_data_type(self.c.data_type.FLOAT)

  def _forward(self):
    c, g = self.c, self._graph()
    bf, f = c.data_type.BFLOAT16, c.data_type.FLOAT
    q, k, v = (self._tensor(g, n, bf) for n in ("q", "k", "v"))
    o, stats = g.sdpa(
      name="sdpa_fwd",
      q=q,
      k=k,
      v=v,
      generate_stats=True,
      attn_scale=self.scale,
      sink_token=self._tensor(g, "sink", f),
      **self.mask,
    )
    self._out(o, "o")
    self._out(stats, "stats", f32=True)
    return self._finish(g)

  def _backward(self):
    c, g = self.c, self._graph()
    bf, f = c.data_type.BFLOAT16, c.data_type.FLOAT
    q, k, v, o, do = (self._tensor(g, n, bf) for n in ("q", "k", "v", "o", "dO"))
    dq, dk, dv = g.sdpa_backward(
      name="sdpa_bwd",
      q=q,
      k=k,
      v=v,
      o=o,
      dO=do,
      stats=self._tensor(g, "stats", f),
      attn_scale=self.scale,
      sink_token=self._tensor(g, "sink", f),
      dSink_token=self._tensor(g, "dSink", f),
      **self.mask,
    )
    for x, n in ((dq, "dQ"), (dk, "dK"), (dv, "dV")):
      self._out(x, n)
    return self._finish(g)

  def fwd(self, i):
    self.g_fwd.execute(self.packs_fwd[i], self.ws.data_ptr(), handle=self.h)

  def bwd(self, i):
    self.g_bwd.execute(self.packs_bwd[i], self.ws.data_ptr(), handle=self.h)

  def fb(self, i):
    self.fwd(i)
    self.bwd(i)
