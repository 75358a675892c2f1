#!/usr/bin/env python3
"""The rot gate (`make lint`): prose that no longer matches the tree. Larger than 400 lines: its extractors (the
comments of each language, docstrings, Markdown) and its rules share one pass over the tree, in one file.

  tests/rot_gate.py [ROOT]

Prose is every comment and docstring of the sources (C, C++, CUDA, Python, shell, CMake, Makefile, the `#` lines
of the text files under tests/ and bench/) and every page of documentation (README.md, docs/*.md, dev/README.md,
bench/results/README.md). It fails, printing `path:line: what`, when prose

- names an `sa_*` / `SA_*` identifier that no source uses in code (comments, docstrings and prose do not count),
  or, written as `sa_foo_*` / `sa_foo_`, a prefix that no such identifier has;
- names a repository path (`src/...`, `docs/...`, a Markdown link, `hopper/fwd.cu` relative to any folder, or a
  bare source file name such as `plan.c`) that does not exist; globs and `{a,b}` alternatives are expanded, and
  a `<placeholder>` component checks only the folder above it;
- under src/, include/, python/, tests/, bench/, fuzz/, examples/ or packaging/ carries a commit hash (7 to 40
  lower-case hex digits with a letter and a digit, or digits only that git resolves to a commit), a date
  (YYYY-MM or YYYY-MM-DD) or a phrase that narrates history instead of stating today's reason ("an earlier
  version", "old kernel", ...): history is in git, measurements in docs/performance.md and bench/results/.

CHANGELOG.md is not checked: its entries name what existed at their release. The names are checked against
the tree at lint time, so a rename on one branch shows up as rot wherever another branch still cites the old
name. It also warns (without failing) when the last commit's subject is longer than 72 characters.
"""

import ast
import io
import os
import re
import subprocess
import sys
import tokenize

C_EXT = (".c", ".h", ".cu", ".cuh", ".cpp")
CODE_DIRS = ("src", "include", "python", "tests", "bench", "fuzz", "examples", "packaging")
TOP = ("src", "include", "python", "tests", "bench", "docs", "dev", "fuzz", "examples", "packaging", ".ci")
FILE_EXT = ("c", "h", "cu", "cuh", "cpp", "py", "sh", "md", "txt", "json", "jsonl", "toml", "cmake", "log")
# Files outside the repository that prose names by their bare name.
EXTERNAL = {
  "c_api.h",  # XLA's FFI header, from the installed jaxlib
  "cuda.h",
  "cuda_runtime.h",
  "cuda_bf16.h",
  "cuda_fp16.h",
  "cudaTypedefs.h",
  "immintrin.h",
  "setup.py",
  "conftest.py",
  "llm.c",  # a project, named for its conventions
}
SKIP_DIRS = {".git", "corpus", "__pycache__", "node_modules"}
SUBJECT_MAX = 72
# This gate and its test name rot on purpose (the examples above, the planted names).
SELF = ("tests/rot_gate.py", "tests/test_rot_gate.py")

IDENT = re.compile(r"(?<![\w$])(?:sa|SA)_[A-Za-z0-9_]*(\*)?")
HASH = re.compile(r"(?<![\w.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")
DIGITS = re.compile(r"(?<![\w.,-])[0-9]{7,40}(?![\w.,-])")
DATE = re.compile(r"(?<![\w.-])(?:19|20)\d\d-(?:0[1-9]|1[0-2])(?:-(?:0[1-9]|[12]\d|3[01]))?(?![\w.-])")
HISTORY = re.compile(
  r"\b(?:an? earlier (?:standalone )?versions?|earlier versions?|old kernel|former switch|"
  r"the previous kernel|the port's form)\b",
  re.I,
)
PATH_TOKEN = re.compile(r"(?<![\w/.:@$-])(?:\.\.?/)*[\w.*{},<>-]+(?:/[\w.*{},<>-]*)+")
BARE_FILE = re.compile(r"(?<![\w/.:-])[\w-]+\.(?:c|h|cu|cuh|cpp|py|sh)(?![\w/])")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
URL = re.compile(r"\w+://\S+")
C_TOKEN = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|/\*.*?\*/|//[^\n]*', re.S)


def globmatch(path, pattern):
  """fnmatch without crossing '/': `*` and `?` stay inside one path component."""
  rx = "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in pattern)
  return re.fullmatch(rx, path) is not None


def list_files(root):
  """Tracked and untracked-but-not-ignored files (git), else every file under ROOT but build outputs."""
  try:
    out = subprocess.run(
      ["git", "-C", root, "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True, check=True
    ).stdout
    if out:
      return sorted(p for p in out.decode().split("\0") if p and os.path.isfile(os.path.join(root, p)))
  except (OSError, subprocess.CalledProcessError):
    pass
  files = []
  for d, dirs, names in os.walk(root):
    dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith((".venv", "build", "dist"))]
    files += [os.path.relpath(os.path.join(d, n), root) for n in names]
  return sorted(files)


def _line_of(text, pos):
  return text.count("\n", 0, pos) + 1


def split_c(text):
  """(comments [(line, text)], string literals, code text) of a C / C++ / CUDA source."""
  prose, strings, code, pos = [], [], [], 0
  for m in C_TOKEN.finditer(text):
    tok = m.group(0)
    if tok.startswith(("/*", "//")):
      code.append(text[pos : m.start()])
      code.append("\n" * tok.count("\n"))
      prose.append((_line_of(text, m.start()), tok))
    elif re.fullmatch(r'"\w*"', tok):  # a symbol or variable name: code
      code.append(text[pos : m.end()])
    else:
      code.append(text[pos : m.start()])
      strings.append((_line_of(text, m.start()), tok))
    pos = m.end()
  code.append(text[pos:])
  return prose, strings, "".join(code)


def split_py(text):
  """(comments and docstrings, other string literals, code text) of a Python source. A literal that is one
  identifier (a symbol looked up through ctypes) is code."""
  prose, strings, cut = [], [], []
  try:
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
      if tok.type == tokenize.COMMENT:
        prose.append((tok.start[0], tok.string))
        cut.append((tok.start, tok.end))
    tree = ast.parse(text)
  except (SyntaxError, tokenize.TokenError):
    return [(1, text)], [], ""
  docs = set()
  for node in ast.walk(tree):
    body = getattr(node, "body", None)
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
      first = body[0]
      if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        docs.add(id(first.value))
        prose.append((first.lineno, first.value.value))
        cut.append(((first.lineno, first.col_offset), (first.end_lineno, first.end_col_offset)))
  for node in ast.walk(tree):
    if isinstance(node, ast.JoinedStr):  # an f-string's parts: positions only exact from Python 3.12 on
      docs.update(id(v) for v in node.values)
  for node in ast.walk(tree):
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
      if not re.fullmatch(r"\w*", node.value):
        strings.append((node.lineno, node.value))
        cut.append(((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)))
  lines = text.splitlines(keepends=True)
  for (l0, c0), (l1, c1) in cut:
    for ln in range(l0, l1 + 1):
      s = lines[ln - 1]
      a = c0 if ln == l0 else 0
      b = c1 if ln == l1 else len(s.rstrip("\n"))
      lines[ln - 1] = s[:a] + " " * (b - a) + s[b:]
  return prose, strings, "".join(lines)


def split_hash(text, shell):
  """(prose spans, code text) of a file with '#' comments (shell, CMake, Makefile, text data)."""
  prose, code = [], []
  for i, line in enumerate(text.splitlines(), 1):
    if i == 1 and line.startswith("#!"):
      code.append(line)
      continue
    m = re.search(r"(?:^|(?<=\s))#", line) if shell else re.match(r"\s*#", line)
    if m:
      prose.append((i, line[m.start() :]))
      code.append(line[: m.start()])
    else:
      code.append(line)
  return prose, "\n".join(code)


def kind_of(path):
  name = os.path.basename(path)
  if path.startswith("bench/results/") and name != "README.md":
    return None
  if path == "CHANGELOG.md" or path in SELF or path.startswith(("fuzz/corpus/", ".git")):
    return None
  if name.endswith(C_EXT):
    return "c"
  if name.endswith(".py"):
    return "py"
  if name.endswith(".md"):
    return "md"
  if name.endswith((".sh", ".cmake")) or name in ("CMakeLists.txt", "Makefile"):
    return "sh"
  if name.endswith(".txt") and path.startswith(("tests/", "bench/")):
    return "txt"
  return None


class Tree:
  def __init__(self, root, files=None):
    self.root = root
    self.files = files if files is not None else list_files(root)
    self.fileset = set(self.files)
    self.dirs = {os.path.dirname(f) for f in self.files}
    for d in list(self.dirs):
      while d:
        d = os.path.dirname(d)
        self.dirs.add(d)
    self.basenames = {os.path.basename(f) for f in self.files}
    self.prose = {}  # path -> [(line, text)]: comments, docstrings, pages
    self.strings = {}  # path -> [(line, text)]: string literals (data: neither checked nor defining names)
    self.defined = set()
    for f in self.files:
      kind = kind_of(f)
      if kind is None:
        continue
      try:
        with open(os.path.join(root, f), encoding="utf-8") as fh:
          text = fh.read()
      except (UnicodeDecodeError, OSError):
        continue
      strings = []
      if kind == "c":
        prose, strings, code = split_c(text)
      elif kind == "py":
        prose, strings, code = split_py(text)
      elif kind == "md":
        prose, code = [(1, text)], ""
      else:
        prose, code = split_hash(text, shell=kind == "sh")
      self.prose[f] = prose
      self.strings[f] = strings
      for m in IDENT.finditer(code):
        self.defined.add(m.group(0).rstrip("*"))

  # ---- paths ----
  def _exists(self, rel):
    rel = os.path.normpath(rel)
    if rel in self.fileset or rel in self.dirs:
      return True
    if any(c in rel for c in "*?"):
      return any(globmatch(f, rel) for f in self.files) or any(globmatch(d, rel) for d in self.dirs)
    return os.path.exists(os.path.join(self.root, rel))

  def _suffix_exists(self, rel):
    rel = os.path.normpath(rel)
    if any(c in rel for c in "*?"):
      k = rel.count("/") + 1
      return any(globmatch("/".join(f.split("/")[-k:]), rel) for f in self.files)
    return any(f == rel or f.endswith("/" + rel) for f in self.files) or any(
      d == rel or d.endswith("/" + rel) for d in self.dirs
    )

  def path_ok(self, token, here):
    """Whether a path token of prose in file HERE names something in the tree (None: not a path)."""
    token = re.sub(r":\d+(?:-\d+)?$", "", token).rstrip(".,;:)]'\"`")
    if token.endswith("}") and "{" not in token:
      token = token.rstrip("}")
    token = token.lstrip("(`'\"[")
    if "{" in token and "," in token:  # src/sa_plan.{h,c}
      m = re.search(r"\{([^{}]*)\}", token)
      if m:
        alts = [token[: m.start()] + a + token[m.end() :] for a in m.group(1).split(",")]
        results = [self.path_ok(a, here) for a in alts]
        return None if all(r is None for r in results) else all(r is not False for r in results)
    if not token or "//" in token or token.endswith("/...") or "..." in token:
      return None
    parts = token.split("/")

    def placeholder(p):
      return re.search(r"[<>$]", p) or re.fullmatch(r"[A-Z][A-Z_]+", p)

    if os.path.basename(token) in EXTERNAL:
      return True
    if any(placeholder(p) for p in parts):  # a placeholder: check the folder above it
      keep = []
      for p in parts:
        if placeholder(p):
          break
        keep.append(p)
      if not keep or keep[0] not in TOP:
        return None
      return self._exists("/".join(keep))
    if token.startswith(("./", "../")):
      return self._exists(os.path.join(os.path.dirname(here), token))
    if parts[0] in TOP and len(parts) > 1 and parts[1] != "":
      if parts[:2] == ["bench", "results"] and not here.endswith(".md"):
        return self._exists("bench/results")  # a script's output file, named in its usage
      return self._exists(token)
    if parts[0] in TOP and len(parts) == 2 and parts[1] == "":
      return self._exists(parts[0])
    last = parts[-1] or (parts[-2] if len(parts) > 1 else "")
    ext = last.rsplit(".", 1)[1] if "." in last else ""
    if ext in FILE_EXT and "*" not in parts[0]:
      return self._suffix_exists(token)
    return None

  def bare_ok(self, name):
    if name in EXTERNAL or name in self.basenames:
      return True
    if "*" in name:
      return any(globmatch(b, name) for b in self.basenames)
    return False

  # ---- identifiers ----
  def ident_ok(self, tok):
    if tok.endswith("*") or tok.endswith("_"):
      prefix = tok.rstrip("*")
      return any(d.startswith(prefix) for d in self.defined)
    return tok in self.defined


def check_text(tree, path, line0, text, history):
  """Findings [(path, line, message)] of one prose span."""
  out = []
  text_nourl = URL.sub(lambda m: " " * len(m.group(0)), text)

  def at(pos):
    return line0 + text.count("\n", 0, pos)

  for m in IDENT.finditer(text_nourl):
    tok = m.group(0)
    end = m.end()
    if text_nourl[end : end + 1] == "." and re.match(r"\.(?:" + "|".join(FILE_EXT) + r")\b", text_nourl[end:]):
      continue  # a file name (sa_test.h): the path check's
    if not tree.ident_ok(tok):
      out.append((path, at(m.start()), f"names {tok}, which no source defines or uses"))
  for m in PATH_TOKEN.finditer(text_nourl):
    ok = tree.path_ok(m.group(0), path)
    if ok is False:
      out.append((path, at(m.start()), f"names the path {m.group(0).rstrip('.,;:)')}, which does not exist"))
  for m in BARE_FILE.finditer(text_nourl):
    if not tree.bare_ok(m.group(0)):
      out.append((path, at(m.start()), f"names the file {m.group(0)}, which does not exist"))
  if path.endswith(".md"):
    for m in MD_LINK.finditer(text):
      target = m.group(1).split("#")[0]
      if not target or re.match(r"\w+:", target):
        continue
      if not tree._exists(os.path.join(os.path.dirname(path), target)):
        out.append((path, at(m.start()), f"links to {target}, which does not exist"))
  if history:
    for rx, what in ((HASH, "a commit hash"), (DATE, "a date"), (HISTORY, "history")):
      for m in rx.finditer(text_nourl):
        out.append((path, at(m.start()), f"carries {what} ({m.group(0)}): history is in git"))
  return out


def git_commits(root, names):
  """The subset of NAMES that git resolves to a commit of the repository at ROOT (none without git)."""
  if not names:
    return set()
  try:
    out = subprocess.run(
      ["git", "-C", root, "cat-file", "--batch-check"],
      input="".join(n + "^{commit}\n" for n in names),
      capture_output=True,
      text=True,
      check=True,
    ).stdout.splitlines()
  except (OSError, subprocess.CalledProcessError):
    return set()
  return {n for n, line in zip(names, out) if line.split()[1:2] == ["commit"]}


def scan(root, files=None, stats=None):
  """Findings [(path, line, message)] of the tree at ROOT; stats (a dict) gets the number of files read."""
  tree = Tree(root, files)
  if stats is not None:
    stats["files"] = len(tree.prose)
  findings, digits = [], []
  for path in sorted(tree.prose):
    history = path.split("/", 1)[0] in CODE_DIRS and not path.endswith(".md")
    for line, text in tree.prose[path]:
      findings += check_text(tree, path, line, text, history)
      if history:
        digits += [(path, line + text.count("\n", 0, m.start()), m.group(0)) for m in DIGITS.finditer(text)]
  commits = git_commits(root, sorted({d[2] for d in digits}))
  findings += [(p, ln, f"carries a commit hash ({n}): history is in git") for p, ln, n in digits if n in commits]
  return findings


def subject_warning(root):
  try:
    subj = subprocess.run(
      ["git", "-C", root, "log", "-1", "--format=%s"], capture_output=True, text=True, check=True
    ).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None
  if len(subj) > SUBJECT_MAX:
    return (
      f"warning: the last commit's subject has {len(subj)} characters"
      f" (at most {SUBJECT_MAX}; measurements go in the body)"
    )
  return None


def main(argv):
  root = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
  stats = {}
  findings = scan(root, stats=stats)
  for path, line, msg in findings:
    print(f"{path}:{line}: {msg}")
  warn = subject_warning(root)
  if warn:
    print(warn)
  if findings:
    print(f"rot gate: {len(findings)} finding(s) in the prose of {stats['files']} files")
    return 1
  print(f"rot gate: the prose of {stats['files']} files matches the tree")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
