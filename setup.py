"""setuptools drives CMake to build the Python package `rdmabuf` for pip.

    pip install .                          # build isolation: build deps from PyPI
    pip install --no-build-isolation .     # build deps already installed (Debian:
                                           # python3-setuptools python3-wheel pybind11-dev)
    pip wheel . -w DIR

The metadata is in pyproject.toml; the version and description come from
`project()` in CMakeLists.txt. The extension `rdmabuf._rdmabuf` is
python/CMakeLists.txt's module, configured for the interpreter running this
build with librdmabuf linked in statically (BUILD_SHARED_LIBS=OFF) and its
symbols kept out of the module's dynamic symbol table, without the tests or
the `rdmabuf` command; the pure-Python files come from python/rdmabuf.
The module then needs only glibc, libstdc++ and libgcc at run time:
libibverbs and the CUDA driver are loaded when present (dlopen).

Everything the build writes goes to build-python/ (ignored by git), or to
the directory RDMABUF_PY_BUILD_DIR names: one CMake build directory per
interpreter version, kept, so a second build only compiles what changed.
CMake needs to be 3.20 or newer and on the PATH, with a C++20 compiler;
Ninja is used when found. CMAKE_ARGS adds arguments to the configure step,
CMAKE_BUILD_PARALLEL_LEVEL sets the build's jobs (default: every core).
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
BUILD_DIR = Path(os.environ.get("RDMABUF_PY_BUILD_DIR") or ROOT / "build-python").resolve()


def cmake_project():
    """(version, description) of `project(rdmabuf ...)` in CMakeLists.txt."""
    text = (ROOT / "CMakeLists.txt").read_text(encoding="utf-8")
    m = re.search(r'project\(\s*rdmabuf\s+VERSION\s+([0-9][0-9.]*)\s+DESCRIPTION\s+"([^"]*)"', text)
    if not m:
        sys.exit("setup.py: no `project(rdmabuf VERSION ... DESCRIPTION ...)` in CMakeLists.txt")
    return m.group(1), m.group(2)


def pybind11_cmake_dir():
    """pybind11's CMake package from the pybind11 Python package (PyPI's
    carries one) when it is importable; else CMake searches the system
    (Debian: pybind11-dev). Always given, so that a build directory
    configured in an isolated build (a temporary pybind11) still works
    without one."""
    try:
        import pybind11

        return pybind11.get_cmake_dir()
    except (ImportError, AttributeError):
        return "pybind11_DIR-NOTFOUND"


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        cmake = shutil.which("cmake")
        if not cmake:
            sys.exit("setup.py: cmake (3.20 or newer) is not on the PATH "
                     "(Debian: apt-get install cmake)")
        tag = sys.implementation.cache_tag + "-" + sysconfig.get_platform()
        build = BUILD_DIR / ("cmake-" + tag)
        build.mkdir(parents=True, exist_ok=True)
        ldflags = (os.environ.get("LDFLAGS", "") + " -Wl,--exclude-libs,ALL").strip()
        configure = [cmake, "-S", str(ROOT), "-B", str(build),
                     "-DCMAKE_BUILD_TYPE=Release",
                     "-DBUILD_SHARED_LIBS=OFF",
                     "-DRDMABUF_BUILD_TESTS=OFF",
                     "-DRDMABUF_BUILD_TOOLS=OFF",
                     "-DRDMABUF_BUILD_PYTHON=ON",
                     "-DPython3_EXECUTABLE=" + sys.executable,
                     "-Dpybind11_DIR=" + pybind11_cmake_dir(),
                     "-DCMAKE_MODULE_LINKER_FLAGS=" + ldflags]
        # A build directory keeps the generator it was made with.
        if (not (build / "CMakeCache.txt").exists() and not os.environ.get("CMAKE_GENERATOR")
                and shutil.which("ninja")):
            configure += ["-G", "Ninja"]
        configure += shlex.split(os.environ.get("CMAKE_ARGS", ""))
        subprocess.run(configure, check=True)

        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        subprocess.run([cmake, "--build", str(build), "--target", "rdmabuf_python",
                        "--parallel", jobs], check=True)

        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = build / "python" / "rdmabuf" / ("_rdmabuf" + suffix)
        if not built.exists():
            sys.exit(f"setup.py: CMake built no {built}: see its 'rdmabuf: Python package' "
                     "message above (python3-dev and pybind11-dev, or pybind11 from PyPI)")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)


version, description = cmake_project()
BUILD_DIR.mkdir(parents=True, exist_ok=True)
setup(
    version=version,
    description=description,
    ext_modules=[CMakeExtension("rdmabuf._rdmabuf")],
    cmdclass={"build_ext": CMakeBuild},
    # setuptools' own files (build/, rdmabuf.egg-info) go beside CMake's.
    options={"build": {"build_base": str(BUILD_DIR / "setuptools")},
             "egg_info": {"egg_base": str(BUILD_DIR)}},
)
