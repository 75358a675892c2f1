"""The package's version and jax requirement, both written once, in pyproject.toml.

A source tree (`PYTHONPATH=python`) reads pyproject.toml itself; an installed package reads the distribution
metadata that the build wrote from it. CMake reads the same file for the C library's version.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import tomllib

_PYPROJECT = os.path.join(
  os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "pyproject.toml"
)


def _read() -> tuple[str, list[str]]:
  if os.path.isfile(_PYPROJECT):
    with open(_PYPROJECT, "rb") as f:
      project = tomllib.load(f).get("project", {})
    if project.get("name") == "sinkattn":
      return project["version"], list(project.get("dependencies", []))
  try:
    md = importlib.metadata.metadata("sinkattn")
  except importlib.metadata.PackageNotFoundError:  # a copied package directory: nothing says its version
    return "0+unknown", []
  return md["Version"], [r for r in md.get_all("Requires-Dist") or [] if "extra ==" not in r]


VERSION, _DEPENDENCIES = _read()


def jax_requirement() -> str:
  """The jax requirement as declared (e.g. 'jax>=0.10.0,<0.13'), or 'jax' when it cannot be read."""
  return next((d.replace(" ", "") for d in _DEPENDENCIES if re.match(r"jax(?![\w.-])", d)), "jax")
