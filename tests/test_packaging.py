"""What installing sinkattn relies on: the FFI API version check at the first load (faked mismatches, and the
real library against the running jaxlib), the version written in one place, and a package that is the library
alone (no demo or benchmark), documented by its public modules."""

import os
import re
import tomllib

import jax
import pytest

import sinkattn
from sinkattn import _lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _header_version():
  with open(os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")) as f:
    text = f.read()
  return tuple(int(re.search(r"#define XLA_FFI_API_%s (\d+)" % w, text).group(1)) for w in ("MAJOR", "MINOR"))


def test_running_jaxlib_ffi_version_is_read_from_its_header():
  running = _lib.jaxlib_ffi_api_version()
  assert running == _header_version()
  assert running[0] == 0 and running[1] >= 1


@pytest.mark.parametrize("declared,running", [((0, 1), (0, 1)), ((0, 1), (0, 5)), ((0, 3), (0, 3))])
def test_accepted_versions_pass(declared, running):
  _lib.check_ffi_api_version("lib.so", declared, running)


@pytest.mark.parametrize("declared,running", [((0, 6), (0, 5)), ((1, 0), (0, 5)), ((0, 1), (1, 2)), ((0, 0), (0, 5))])
def test_mismatch_raises_import_error_naming_both_versions_and_the_fix(declared, running):
  with pytest.raises(ImportError) as info:
    _lib.check_ffi_api_version("/x/libsinkattn_jax.so", declared, running)
  assert isinstance(info.value, sinkattn.FFIVersionError)
  msg = str(info.value)
  for word in [
    "/x/libsinkattn_jax.so",
    "declares XLA FFI API %d.%d" % declared,
    "FFI API %d.%d" % running,
    "pip install 'jax",
    "--no-build-isolation",
  ]:
    assert word in msg, (word, msg)


def test_unreadable_header_is_left_to_xla():
  _lib.check_ffi_api_version("lib.so", (0, 9), None)


@pytest.mark.skipif(not _lib.available(), reason="libsinkattn_jax.so not built")
def test_library_declares_ffi_0_1_and_the_running_jaxlib_accepts_it():
  lib = _lib.load()
  assert divmod(lib.sa_jax_ffi_api_version(), 1000) == (0, 1)
  _lib.check_ffi_api_version("lib.so", (0, 1), _lib.jaxlib_ffi_api_version())


@pytest.mark.skipif(not _lib.available(), reason="libsinkattn_jax.so not built")
def test_first_load_raises_before_registering_on_a_faked_newer_jaxlib_major(monkeypatch):
  monkeypatch.setattr(_lib, "_lib", None)
  monkeypatch.setattr(_lib, "jaxlib_ffi_api_version", lambda: (1, 0))
  registered = []
  monkeypatch.setattr(_lib, "_register", registered.append)
  with pytest.raises(sinkattn.FFIVersionError, match=r"declares XLA FFI API 0\.1, which jaxlib .* \(FFI API 1\.0"):
    _lib.load()
  assert registered == [] and _lib._lib is None


@pytest.mark.skipif(not _lib.available(), reason="libsinkattn_jax.so not built")
def test_library_takes_the_buffer_layout_the_package_passes():
  assert _lib._attn_abi_version(_lib.load()) == _lib.ATTN_ABI


@pytest.mark.skipif(not _lib.available(), reason="libsinkattn_jax.so not built")
def test_first_load_refuses_a_library_of_another_buffer_layout(monkeypatch):
  monkeypatch.setattr(_lib, "_lib", None)
  monkeypatch.setattr(_lib, "_attn_abi_version", lambda lib: 1)
  registered = []
  monkeypatch.setattr(_lib, "_register", registered.append)
  want = rf"handlers take buffer layout 1, this package passes layout {_lib.ATTN_ABI}"
  with pytest.raises(_lib.StaleLibraryError, match=want):
    _lib.load()
  assert registered == [] and _lib._lib is None
  assert not _lib.available()  # a stale library counts as no library: the jnp twin still runs


def test_a_library_without_the_layout_symbol_has_layout_1():
  assert _lib._attn_abi_version(object()) == 1


def test_c_header_version_matches_pyproject():
  with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    version = tomllib.load(f)["project"]["version"]
  with open(os.path.join(REPO, "include", "sinkattn.h")) as f:
    header = f.read()
  macros = {
    w: re.search(r"#define SINKATTN_VERSION_%s\s+(\S+)" % w, header).group(1)
    for w in ("MAJOR", "MINOR", "PATCH", "STRING")
  }
  assert sinkattn.__version__ == version
  assert macros["STRING"] == '"%s"' % version
  assert "%s.%s.%s" % (macros["MAJOR"], macros["MINOR"], macros["PATCH"]) == version


def test_the_package_is_the_library():
  """The demo and the benchmarks live in examples/ and bench/, not in the installed package; its public
  submodules (sinkattn.SUBMODULES) are modules of it."""
  import pkgutil

  names = {m.name for m in pkgutil.iter_modules(sinkattn.__path__)}
  assert not {n for n in names if n.startswith(("demo", "bench", "_bench"))}, names
  assert set(sinkattn.SUBMODULES) == {"flax", "nnx", "te"} and set(sinkattn.SUBMODULES) <= names


def test_the_api_reference_documents_the_public_modules():
  """docs/api/build.py documents the package and sinkattn.SUBMODULES, nothing else."""
  import importlib.util

  pytest.importorskip("pdoc")  # in .venv (make docs); .venv-newest has no pdoc
  spec = importlib.util.spec_from_file_location("api_build", os.path.join(REPO, "docs", "api", "build.py"))
  build = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(build)
  assert build.public_modules("sinkattn") == ["sinkattn", "sinkattn.flax", "sinkattn.nnx", "sinkattn.te"]
