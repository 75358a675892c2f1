"""bench/sa_capi.py: the C API of include/sinkattn.h through ctypes, for the checks and benchmarks that call
libsinkattn.so directly (no JAX): bench/prod_check.py, bench/kernel_bench.py, bench/segments_bench.py.

The sa_attn / sa_attn_grad structs and the enum constants are built from the header's own text when this module
is imported, so they follow every field the header gains; a field type the parser does not know raises an error
naming the field (a wrong layout would corrupt memory silently). The plan API (sa_plan_list, sa_plan_force,
sa_plan_last: internal, exported for tests and benchmarks; src/sa_plan.h) lists, forces and reports plans.

Buffers are NumPy arrays (host memory: the REF and CPU backends) or PyTorch tensors (device memory: CUDA).
"""

import ctypes
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(ROOT, "include", "sinkattn.h")

DEFAULT_PLAN = "default"  # "whatever the library picks": Lib.force clears the forced plan

_SCALARS = {
  "int64_t": ctypes.c_int64,
  "int32_t": ctypes.c_int32,
  "uint64_t": ctypes.c_uint64,
  "uint32_t": ctypes.c_uint32,
  "int": ctypes.c_int,
  "float": ctypes.c_float,
  "double": ctypes.c_double,
  "size_t": ctypes.c_size_t,
}


def _strip_comments(text):
  return re.sub(r"//[^\n]*", " ", re.sub(r"/\*.*?\*/", " ", text, flags=re.S))


def parse_header(path=HEADER):
  """(enum constants {name: value}, enum type names, {struct name: [(field, ctype)]}) of the header."""
  text = _strip_comments(open(path).read())
  consts, enum_types = {}, set()
  for body, name in re.findall(r"typedef\s+enum\s*\{([^}]*)\}\s*(\w+)\s*;", text):
    enum_types.add(name)
    value = -1
    for item in filter(None, (x.strip() for x in body.split(","))):
      key, _, val = item.partition("=")
      value = int(val.strip(), 0) if val.strip() else value + 1
      consts[key.strip()] = value
  structs = {}
  for name, body, alias in re.findall(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", text, flags=re.S):
    fields = []
    for decl in filter(None, (d.strip() for d in body.split(";"))):
      m = re.match(r"((?:const\s+)?\w+)\s+(.+)$", decl, flags=re.S)
      if not m:
        raise ValueError(f"{path}: struct {name}: cannot parse the declaration {decl!r}")
      base = m.group(1).replace("const", "").strip()
      for d in (x.strip() for x in m.group(2).split(",")):
        dm = re.match(r"(\**)\s*(\w+)\s*(?:\[(\d+)\])?$", d)
        if not dm:
          raise ValueError(f"{path}: struct {name}: cannot parse the declarator {d!r} of type {base}")
        stars, field, count = dm.groups()
        if stars:
          ct = ctypes.c_void_p
        elif base in _SCALARS:
          ct = _SCALARS[base]
        elif base in enum_types:
          ct = ctypes.c_int
        else:
          raise ValueError(
            f"{path}: struct {name}: field {field} has type {base}, which sa_capi.py does not "
            f"map to ctypes (known: {sorted(_SCALARS)} and the header's enums)"
          )
        fields.append((field, ct * int(count) if count else ct))
    structs[alias] = fields
  return consts, enum_types, structs


C, _ENUMS, _STRUCTS = parse_header()
# The plan API's kinds, from its internal header (src/sa_plan.h: enum { SA_PLAN_FWD = 0, ... }).
_KINDS = dict(
  re.findall(r"(SA_PLAN_[A-Z]+)\s*=\s*(\d+)", _strip_comments(open(os.path.join(ROOT, "src", "sa_plan.h")).read()))
)
PLAN_FWD, PLAN_BWD, PLAN_DECODE = (int(_KINDS["SA_PLAN_" + k]) for k in ("FWD", "BWD", "DECODE"))


class Attn(ctypes.Structure):
  _fields_ = _STRUCTS["sa_attn"]


class Grad(ctypes.Structure):
  _fields_ = _STRUCTS["sa_attn_grad"]


def find_library(path=None):
  """libsinkattn.so: `path`, env SINKATTN_C_LIBRARY, or the first build*/ of the repository that has one
  (build-gpu first: the device's Release build)."""
  tried = [p for p in (path, os.environ.get("SINKATTN_C_LIBRARY")) if p]
  tried += [os.path.join(ROOT, "build-gpu", "libsinkattn.so"), os.path.join(ROOT, "build", "libsinkattn.so")]
  tried += sorted(glob.glob(os.path.join(ROOT, "build*", "libsinkattn.so")))
  for p in tried:
    if os.path.isfile(p):
      return p
  raise FileNotFoundError(
    "libsinkattn.so not found (tried %s): build it with cmake -S . -B build && cmake --build "
    "build, or pass its path" % ", ".join(tried)
  )


def ptr(x):
  """The address of a NumPy array's or a torch tensor's data; None stays None (a NULL pointer)."""
  if x is None:
    return None
  if hasattr(x, "data_ptr"):
    return x.data_ptr()
  return x.ctypes.data


class Lib:
  """libsinkattn.so with argtypes declared (the plan API's too)."""

  def __init__(self, path=None):
    self.path = find_library(path)
    lib = self.lib = ctypes.CDLL(self.path)
    pa, pg, st, i32, vp, sz = (
      ctypes.POINTER(Attn),
      ctypes.POINTER(Grad),
      ctypes.c_int,
      ctypes.c_int,
      ctypes.c_void_p,
      ctypes.c_size_t,
    )
    for name, res, args in (
      ("sa_attn_init", None, [pa]),
      ("sa_attn_check", st, [pa, i32]),
      ("sa_attn_fwd", st, [pa, i32, vp]),
      ("sa_attn_bwd_workspace_size", sz, [pa, i32]),
      ("sa_attn_bwd", st, [pa, pg, vp, sz, i32, vp]),
      ("sa_attn_decode_workspace_size", sz, [pa, i32]),
      ("sa_attn_decode_fwd", st, [pa, vp, sz, i32, vp]),
      ("sa_last_error", ctypes.c_char_p, []),
      ("sa_has_cuda", i32, []),
    ):
      f = getattr(lib, name)
      f.restype, f.argtypes = res, args
    lib.sa_plan_list.restype = i32
    lib.sa_plan_list.argtypes = [pa, i32, i32, ctypes.POINTER(ctypes.c_char_p), i32]
    lib.sa_plan_force.restype = st
    lib.sa_plan_force.argtypes = [i32, ctypes.c_char_p]
    lib.sa_plan_last.restype = ctypes.c_char_p
    lib.sa_plan_last.argtypes = [i32]

  def error(self):
    return self.lib.sa_last_error().decode()

  def check(self, status, what):
    if status != 0:
      raise RuntimeError(f"{what}: status {status}: {self.error()}")

  def plans(self, a, which, backend):
    """Every legal plan of this problem, best (the default) first."""
    names = (ctypes.c_char_p * 64)()
    n = self.lib.sa_plan_list(ctypes.byref(a), which, backend, names, 64)
    return [names[i].decode() for i in range(min(n, 64))]

  def force(self, which, name):
    """Forces the calling thread's next calls of kind `which` to plan `name` (None or DEFAULT_PLAN: clears)."""
    self.check(
      self.lib.sa_plan_force(which, None if name in (None, DEFAULT_PLAN) else name.encode()),
      f"sa_plan_force({which}, {name})",
    )

  def last(self, which):
    """The description of the calling thread's last plan of kind `which`."""
    return self.lib.sa_plan_last(which).decode()


def make_attn(
  lib,
  q,
  k,
  v,
  out,
  lse,
  *,
  sinks=None,
  softmax="learnable",
  causal=0,
  window=(-1, -1),
  scale=0.0,
  q_seg=None,
  kv_seg=None,
  kv_lens=None,
  dtype="bf16",
):
  """An sa_attn over q [B,T,N,H], k [B,S,K,H], v [B,S,K,Hv], out, lse (arrays or tensors). causal: 0 none,
  1 top-left, 2 bottom-right; softmax: vanilla | off_by_one | learnable."""
  a = Attn()
  lib.lib.sa_attn_init(ctypes.byref(a))
  B, T, N, H = q.shape
  a.dtype = C["SA_" + dtype.upper()]
  a.batch, a.q_len, a.kv_len, a.q_heads, a.kv_heads = B, T, k.shape[1], N, k.shape[2]
  a.head_dim, a.v_head_dim = H, v.shape[3]
  a.q, a.k, a.v, a.out, a.lse = ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse)
  if (sinks is not None) != (softmax == "learnable"):
    raise ValueError(f"sinks given: {sinks is not None}, softmax {softmax}: sinks go with softmax='learnable' only")
  a.sinks = ptr(sinks)
  a.softmax = C["SA_SOFTMAX_" + softmax.upper()]
  a.causal = causal
  a.window_left, a.window_right = window
  a.scale = scale
  a.q_segment_ids, a.kv_segment_ids, a.kv_lens = ptr(q_seg), ptr(kv_seg), ptr(kv_lens)
  return a


def make_grad(dout, dq, dk, dv, dsinks):
  g = Grad()
  g.dout, g.dq, g.dk, g.dv, g.dsinks = ptr(dout), ptr(dq), ptr(dk), ptr(dv), ptr(dsinks)
  return g


def stamp(lib=None):
  """What every result file records: the commit (env SINKATTN_COMMIT where the tree has no .git, as on the
  device's copy), the library, the GPU, its driver, and the versions."""
  import platform
  import subprocess

  commit = os.environ.get("SINKATTN_COMMIT")
  if not commit:
    try:
      commit = (
        subprocess.run(
          ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        or "unknown"
      )
    except OSError:
      commit = "unknown"
  out = dict(commit=commit, host=platform.node(), python=platform.python_version())
  if lib is not None:
    out["library"] = lib.path
  try:
    q = (
      subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=20,
      )
      .stdout.strip()
      .splitlines()
    )
    out["gpus"] = q
  except OSError:
    out["gpus"] = []
  for mod in ("numpy", "torch", "jax", "jaxlib", "cudnn"):  # the versions of what this run imported
    if mod in sys.modules:
      out[mod] = getattr(sys.modules[mod], "__version__", "?")
  if "torch" in sys.modules:
    torch = sys.modules["torch"]
    out["torch_cuda"] = torch.version.cuda
    if torch.cuda.is_available():
      out["cudnn_backend"] = torch.backends.cudnn.version()
      out["device"] = torch.cuda.get_device_name()
  return out
