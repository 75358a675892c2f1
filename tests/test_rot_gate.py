"""tests/rot_gate.py on a small planted tree: it passes a clean one and finds every kind of rot planted in it (a
stale sa_* name, a missing path or file, a commit hash, a date and a history phrase in a source comment), and it
reads code, not prose, for the names that exist."""

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rot_gate  # noqa: E402

CLEAN = {
  "src/attn.c": (
    "/* sa_attn_fwd runs the plan of src/plan.c (docs/guide.md); the tile table is hopper/tiles.h. */\n"
    "#include <stdio.h>\n"
    "int sa_attn_fwd(void) { return sa_plan_pick(); }\n"
    'static const char *msg = "sa_in_a_string is data";\n'
  ),
  "src/plan.c": (
    "/* sa_plan_* and sa_attn_ prefixes; 1255252 elements, 0x007f8000 */\nint sa_plan_pick(void) { return 0; }\n"
  ),
  "src/cuda/hopper/tiles.h": "#define SA_TILE_ROWS 64 /* 64 rows: 2 CTAs an SM */\n",
  "python/pkg/mod.py": (
    '"""Calls sa_attn_fwd through ctypes (src/attn.c)."""\n'
    "import ctypes\n\n"
    "# the symbol name below is code\n"
    'FN = "sa_attn_fwd"\n'
    'HELP = "see bench/results/out.json"  # an output path in a string: data\n'
  ),
  "bench/run.sh": "#!/bin/sh\n# runs tests/run_me.py; writes $OUT/NAME.log and bench/results/new.json\necho $# sa_x\n",
  "tests/run_me.py": '"""the test driver of src/attn.c"""\n',
  "bench/results/README.md": "| file | what it shows |\n",
  "docs/guide.md": (
    "# Guide\n\nsa_attn_fwd (src/attn.c, src/{attn,plan}.c, `src/*.c`) and [the tiles](../src/cuda/hopper/tiles.h);"
    " SA_TILE_ROWS; a placeholder tests/<file>.\n\nMeasured on 2026-12-02 at e1dfd22: docs may date a figure.\n"
  ),
  "README.md": "See docs/guide.md and llm.c's rule; `sa_<noun>_<verb>` names.\n",
  "CHANGELOG.md": "- sa_gone_long_ago was renamed (a changelog names what existed then)\n",
}

PLANTED = {
  "stale name in a C comment": ("src/attn.c", "/* sa_hop_in_scope decides */\n", "sa_hop_in_scope"),
  "stale name in a doc": ("docs/guide.md", "\nsa_hopper_bwd1_workspace bytes.\n", "sa_hopper_bwd1_workspace"),
  "stale name in a docstring": (
    "tests/run_me.py",
    '"""a"""\n\n\ndef f():\n  """uses sa_old_helper"""\n',
    "sa_old_helper",
  ),
  "name only in a comment": ("src/plan.c", "/* sa_only_here */\n", "sa_only_here"),
  "stale prefix": ("docs/guide.md", "\nthe sa_gone_* family\n", "sa_gone_"),
  "missing rooted path": ("README.md", "\nsrc/cuda/decode*.cu\n", "src/cuda/decode*.cu"),
  "missing relative path": ("src/attn.c", "/* helpers in hopper/fwd_parts.cuh */\n", "hopper/fwd_parts.cuh"),
  "missing bare file": ("src/attn.c", "/* hopper_ptx.cuh holds it */\n", "hopper_ptx.cuh"),
  "missing markdown link": ("docs/guide.md", "\n[log](../bench/NOTES.md)\n", "../bench/NOTES.md"),
  "commit hash in src": ("src/plan.c", "/* kept since f08c8da */\n", "f08c8da"),
  "date in src": ("src/plan.c", "/* measured 2026-12-04 */\n", "2026-12-04"),
  "month in python": ("python/pkg/mod.py", "# the 2026-12 wave\n", "2026-12"),
  "history phrase in src": (
    "src/attn.c",
    "/* an earlier standalone version's tiles */\n",
    "earlier standalone version",
  ),
  "hash in a shell comment": ("bench/run.sh", "# as at 3996aef\n", "3996aef"),
}


def make_tree(root, extra=None):
  files = dict(CLEAN)
  if extra:
    path, text, _ = extra
    files[path] = files.get(path, "") + text
  for path, text in files.items():
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as f:
      f.write(text)
  return str(root)


def test_clean_tree_passes(tmp_path):
  assert rot_gate.scan(make_tree(tmp_path)) == []


@pytest.mark.parametrize("what", sorted(PLANTED))
def test_planted_rot_is_found(tmp_path, what):
  path, _, token = PLANTED[what]
  findings = rot_gate.scan(make_tree(tmp_path, PLANTED[what]))
  assert findings, f"{what}: nothing found"
  assert all(p == path for p, _, _ in findings), f"{what}: {findings}"
  assert any(token in msg for _, _, msg in findings), f"{what}: {findings}"


def test_line_numbers(tmp_path):
  findings = rot_gate.scan(make_tree(tmp_path, PLANTED["stale name in a doc"]))
  with open(os.path.join(tmp_path, "docs/guide.md")) as f:
    lines = f.read().splitlines()
  ((path, line, _),) = findings
  assert "sa_hopper_bwd1_workspace" in lines[line - 1]


def git_tree(root, subject="short subject"):
  env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
  subprocess.run(["git", "init", "-q", root], check=True)
  subprocess.run(["git", "-C", root, "add", "-A"], check=True, env=env)
  subprocess.run(["git", "-C", root, "commit", "-q", "--allow-empty", "-m", subject], check=True, env=env)
  return env


def test_numeric_hash_only_when_git_knows_it(tmp_path):
  """Digits alone are a hash when git resolves them to a commit of the repository, a number otherwise."""
  root = make_tree(tmp_path, ("src/plan.c", "/* 1234567 elements */\n", ""))
  git_tree(root)
  head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
  assert rot_gate.git_commits(root, ["1234567", head, head[:7]]) == {head, head[:7]}
  assert rot_gate.scan(root) == []


def test_subject_warning(tmp_path):
  root = make_tree(tmp_path)
  env = git_tree(root)
  assert rot_gate.subject_warning(root) is None
  subprocess.run(["git", "-C", root, "commit", "-q", "--allow-empty", "-m", "x" * 73], check=True, env=env)
  assert "73 characters" in rot_gate.subject_warning(root)


def test_main_exit_status(tmp_path, capsys):
  assert rot_gate.main(["rot_gate.py", make_tree(tmp_path)]) == 0
  bad = tmp_path / "bad"
  bad.mkdir()
  assert rot_gate.main(["rot_gate.py", make_tree(bad, PLANTED["commit hash in src"])]) == 1
  assert "f08c8da" in capsys.readouterr().out
