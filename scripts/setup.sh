#!/usr/bin/env bash
# Prepares a machine to build and test rdmabuf, then builds it.
#
# On Debian 12: installs the packages the build, the tests and the benchmark
# peers need (only the missing ones; nothing is downloaded when all are
# present), then configures and builds with warnings as errors.
#
#   scripts/setup.sh                      build into ./build
#   RDMABUF_BUILD_DIR=build-asan RDMABUF_CMAKE_ARGS=-DRDMABUF_SANITIZE=address scripts/setup.sh
#
# Safe to run again: a second run installs nothing and rebuilds only what
# changed. Works from any directory.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
build_dir=${RDMABUF_BUILD_DIR:-build}

# Build: cmake ninja-build g++ make pkg-config; tests: googletest libgtest-dev;
# format check: clang-format; benchmark peers: iperf3 qperf ucx-utils; the ibverbs
# backend's header (it loads libibverbs at run time): libibverbs-dev; the Python
# package (python/) and its tests: pybind11-dev python3-dev python3-numpy
# python3-torch python3-pytest, for Debian's /usr/bin/python3; `pip install .`
# into a venv without build isolation (the pip_install test): python3-venv
# python3-pip python3-setuptools python3-wheel; jobs across hosts (tests/hosts,
# the MPI example): iproute2 (namespaces' links), openmpi-bin libopenmpi-dev
# python3-mpi4py.
packages=(cmake ninja-build g++ make pkg-config googletest libgtest-dev clang-format iperf3 qperf
  ucx-utils
  libibverbs-dev
  pybind11-dev python3-dev python3-numpy python3-torch python3-pytest
  python3-venv python3-pip python3-setuptools python3-wheel
  iproute2 openmpi-bin libopenmpi-dev python3-mpi4py)

scripts/install-packages.sh "${packages[@]}"

configure=(cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRDMABUF_WERROR=ON)
# An existing build directory keeps the generator it was made with.
[ -f "$build_dir/CMakeCache.txt" ] || configure+=(-G Ninja)
# The Python package is built for (and tested with) the interpreter that has
# the Debian packages above, not whichever python3 comes first on the PATH.
[ -x /usr/bin/python3 ] && configure+=(-DPython3_EXECUTABLE=/usr/bin/python3)
# shellcheck disable=SC2206  # word splitting of extra arguments is intended
configure+=(${RDMABUF_CMAKE_ARGS:-})
"${configure[@]}"
cmake --build "$build_dir"
