"""Builds the API reference of the sinkattn package from its docstrings with pdoc (Google-style sections),
into the directory given as the only argument (`make docs`: build/docs/api). It documents the public API
only: the package itself (the names its __all__ lists) and the public submodules it names in SUBMODULES
(sinkattn.flax, sinkattn.nnx, sinkattn.te), so a new public module is added there, once. Any warning pdoc
gives while reading or rendering (an unparsable annotation, a docstring it cannot read, a module that fails
to import) fails the build, and so `make test`.
"""

import importlib
import pathlib
import sys
import warnings

import pdoc
import pdoc.render


def public_modules(package: str) -> list[str]:
  pkg = importlib.import_module(package)
  names = [package] + [f"{package}.{m}" for m in pkg.SUBMODULES]
  for name in names:  # imported before recording, so third-party import-time notices are not counted
    importlib.import_module(name)
  return names


def main(out: str, package: str = "sinkattn") -> int:
  modules = public_modules(package)
  pdoc.render.configure(
    docformat="google",
    show_source=False,
    footer_text=package + " " + getattr(importlib.import_module(package), "__version__", ""),
  )
  with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    pdoc.pdoc(*modules, output_directory=pathlib.Path(out))
  for w in seen:
    print(f"docs: {w.category.__name__}: {w.message}", file=sys.stderr)
  print(f"docs: {len(modules)} modules into {out}, {len(seen)} warnings")
  return 1 if seen else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1]))
