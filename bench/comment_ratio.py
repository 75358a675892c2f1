#!/usr/bin/env python3
"""Comment characters over code characters of the C / CUDA sources under the given folders (default src/cuda).

  bench/comment_ratio.py [DIR ...]

Comments are /* ... */ and // ... outside string literals; whitespace counts for neither side. Prints one line a
file and the total.
"""

import os
import re
import sys

TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|/\*.*?\*/|//[^\n]*', re.S)


def split(text):
  comment = code = 0
  pos = 0
  for m in TOKEN.finditer(text):
    code += len(re.sub(r"\s", "", text[pos : m.start()]))
    tok = m.group(0)
    if tok.startswith("/*") or tok.startswith("//"):
      comment += len(re.sub(r"\s", "", tok))
    else:
      code += len(re.sub(r"\s", "", tok))
    pos = m.end()
  code += len(re.sub(r"\s", "", text[pos:]))
  return comment, code


def main():
  dirs = sys.argv[1:] or ["src/cuda"]
  tc = tk = 0
  for d in dirs:
    for root, _, files in sorted(os.walk(d)):
      for f in sorted(files):
        if not f.endswith((".c", ".h", ".cu", ".cuh", ".cpp")):
          continue
        p = os.path.join(root, f)
        c, k = split(open(p).read())
        tc, tk = tc + c, tk + k
        print(f"{c / max(k, 1):6.2f}  {p}")
  print(f"{tc / max(tk, 1):6.2f}  total ({tc} comment / {tk} code characters)")


if __name__ == "__main__":
  main()
