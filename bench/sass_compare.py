#!/usr/bin/env python3
"""Per-kernel SASS comparison of two builds of the CUDA objects (e.g. a base commit and HEAD).

  bench/sass_compare.py OLD_DIR NEW_DIR [--expect bench/sass_expect.txt] [-o REPORT]

Every *.o under each directory is dumped with `cuobjdump --dump-sass` and `--dump-resource-usage`, split by
(architecture, demangled kernel name), and normalised: the address column (/*0a40*/) and the column padding go,
the instruction text, its branch targets (function-relative) and its encoding words stay, so "identical" means
byte-identical machine code. The resource line (registers, stack, shared, local, constant bank 0) is compared too.
Anonymous namespaces demangle without their per-file hash, so moving a kernel between files keeps its key.

The expectations file lists, one per line, `renamed OLD => NEW` (demangled names, exact), `deleted REGEX :
REASON` (a kernel of OLD_DIR that is gone on purpose), `changed REGEX : REASON` (a kept kernel whose code
changes on purpose) and `added REGEX : REASON` (a new kernel of NEW_DIR). Exit status 1 when a kept kernel
differs without a `changed` line, a kernel vanished without a `deleted` line, or a new kernel appeared without
an `added` line.

cuobjdump: $CUOBJDUMP, else on PATH, else from the pip package nvidia-cuda-cuobjdump; it runs nvdisasm, found
on PATH or beside it (the pip package nvidia-cuda-nvdisasm installs it there).
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys


def find_cuobjdump():
  cand = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
  if not cand:
    try:
      import nvidia.cu13  # the pip package nvidia-cuda-cuobjdump installs bin/ here

      found = [os.path.join(b, "bin", "cuobjdump") for b in nvidia.cu13.__path__]
      cand = next((p for p in found if os.path.exists(p)), None)
    except ImportError:
      pass
  if not cand:
    sys.exit("sass_compare: cuobjdump not found (set CUOBJDUMP or pip install nvidia-cuda-cuobjdump)")
  beside = os.path.join(os.path.dirname(cand), "nvdisasm")
  if not shutil.which("nvdisasm") and "NVDISASM_PATH" not in os.environ:
    if not os.path.exists(beside):
      sys.exit("sass_compare: nvdisasm not found (cuobjdump needs it: pip install nvidia-cuda-nvdisasm)")
    os.environ["NVDISASM_PATH"] = os.path.dirname(beside)
  return cand


def demangle(names):
  if not names:
    return {}
  out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
  return dict(zip(names, out.splitlines()))


ADDR = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s*")


def dump(cuobjdump, obj):
  """{(arch, mangled): (normalised sass, resource line)} of one object file."""
  run = subprocess.run([cuobjdump, "--dump-sass", obj], capture_output=True, text=True)
  if run.returncode != 0 and "does not contain device code" in run.stdout + run.stderr:
    return {}  # a host object (plan.c.o) among the CUDA ones
  run.check_returncode()
  sass = run.stdout
  res = subprocess.run([cuobjdump, "--dump-resource-usage", obj], capture_output=True, text=True, check=True).stdout
  kernels, arch, name, lines = {}, None, None, []

  def flush():
    if name is not None:
      kernels[(arch, name)] = ["\n".join(lines), ""]

  for line in sass.splitlines():
    m = re.match(r"\s*code for (sm_\w+)", line)
    if m:
      flush()
      arch, name, lines = m.group(1), None, []
      continue
    m = re.match(r"\s*Function : (\S+)", line)
    if m:
      flush()
      name, lines = m.group(1), []
      continue
    if line.startswith("Fatbin"):  # the next embedded image's header: not the function's code
      flush()
      name, lines = None, []
      continue
    if name is None or not line.strip():
      continue
    lines.append(" ".join(ADDR.sub("", line).split()))  # the column padding is formatting only
  flush()
  arch = None
  fn = None
  for line in res.splitlines():
    m = re.match(r"arch = (sm_\w+)", line)
    if m:
      arch = m.group(1)
    m = re.match(r"\s*Function (\S+):", line)
    if m:
      fn = m.group(1)
      continue
    if fn and line.strip().startswith("REG:"):
      if (arch, fn) in kernels:
        kernels[(arch, fn)][1] = line.strip()
      fn = None
  return kernels


def collect(cuobjdump, root):
  objs = sorted(glob.glob(os.path.join(root, "**", "*.o"), recursive=True))
  if not objs:
    sys.exit(f"sass_compare: no *.o under {root}")
  raw = {}
  for o in objs:
    for key, val in dump(cuobjdump, o).items():
      if key in raw and raw[key] != val:
        sys.exit(f"sass_compare: {key[1]} ({key[0]}) defined twice with different code under {root}")
      raw[key] = val
  names = demangle(sorted({k[1] for k in raw}))
  return {(a, names[m]): v for (a, m), v in raw.items()}


def read_expect(path):
  """(renames {old: new}, {'deleted' / 'changed' / 'added': [(regex, reason)]})."""
  renames, marks = {}, {"deleted": [], "changed": [], "added": []}
  if not path:
    return renames, marks
  with open(path) as f:
    for n, line in enumerate(f, 1):
      line = line.strip()
      if not line or line.startswith("#"):
        continue
      word = line.split(" ", 1)[0]
      if word == "renamed":
        old, new = line[len("renamed ") :].split(" => ")
        renames[old.strip()] = new.strip()
      elif word in marks and " : " in line:
        rx, reason = line[len(word) + 1 :].split(" : ", 1)
        marks[word].append((re.compile(rx.strip()), reason.strip()))
      else:
        sys.exit(f"sass_compare: {path}:{n}: expected 'renamed OLD => NEW' or 'deleted|changed|added REGEX : REASON'")
  return renames, marks


KINDS = ("identical", "deleted", "changed", "added", "CHANGED", "MISSING", "ADDED")  # the report's order


def reason_of(marks, name):
  return next((r for rx, r in marks if rx.search(name)), None)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("old")
  ap.add_argument("new")
  ap.add_argument("--expect", help="renamed / deleted kernels (see the module doc)")
  ap.add_argument("-o", "--output", help="write the report here as well as to stdout")
  ap.add_argument("--label-old", default="old")
  ap.add_argument("--label-new", default="new")
  args = ap.parse_args()
  cuobjdump = find_cuobjdump()
  old, new = collect(cuobjdump, args.old), collect(cuobjdump, args.new)
  renames, marks = read_expect(args.expect)
  rows, bad = [], 0
  matched_new = set()
  for arch, name in sorted(old):
    target = (arch, renames.get(name, name))
    if target in new:
      matched_new.add(target)
      same = old[(arch, name)] == new[target]
      why = None if same else reason_of(marks["changed"], target[1])
      kind = "identical" if same else "changed" if why else "CHANGED"
      bad += kind == "CHANGED"
      label = name if target[1] == name else f"{name} => {target[1]}"
      rows.append((arch, kind, label, why or old[(arch, name)][1]))
      continue
    why = reason_of(marks["deleted"], name)
    bad += why is None
    rows.append((arch, "deleted" if why else "MISSING", name, why or "no 'deleted' line in the expectations"))
  for key in sorted(set(new) - matched_new):
    why = reason_of(marks["added"], key[1])
    bad += why is None
    rows.append((key[0], "added" if why else "ADDED", key[1], why or new[key][1]))
  counts = {}
  for arch, kind, _, _ in rows:
    counts[(arch, kind)] = counts.get((arch, kind), 0) + 1
  lines = [f"SASS per kernel: {args.label_old} ({args.old}) vs {args.label_new} ({args.new})", ""]
  for arch in sorted({r[0] for r in rows}):
    summary = ", ".join(f"{k} {counts[(arch, k)]}" for k in KINDS if (arch, k) in counts)
    lines.append(f"{arch}: {summary}")
  lines.append("")
  for arch, kind, name, note in rows:
    lines.append(f"{arch}  {kind:9s}  {name}")
    if kind != "identical":
      lines.append(f"{'':17s}{note}")
  lines.append("")
  lines.append(
    "result: " + ("every kept kernel byte-identical" if bad == 0 else f"{bad} kernel(s) differ or unaccounted")
  )
  text = "\n".join(lines) + "\n"
  sys.stdout.write(text)
  if args.output:
    with open(args.output, "w") as f:
      f.write(text)
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
