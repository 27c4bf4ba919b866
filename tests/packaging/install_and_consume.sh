#!/usr/bin/env bash
# Installs a built rdmabuf into a temporary prefix, builds examples/consumer
# against it with find_package(rdmabuf), and runs the example's two
# processes (examples/consumer/run.sh). Proves that the installed headers,
# library, command and CMake package are complete on their own.
#
#   install_and_consume.sh [BUILD_DIR]     (default: build, under the repository root)
#
# The consumer is configured the CMake way from the environment: CXX,
# CXXFLAGS, LDFLAGS and CMAKE_GENERATOR are honoured (the CTest test sets
# them to match the build being tested).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/rdmabuf-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

echo "== install $build into $prefix"
cmake --install "$build" --prefix "$prefix"

if [ -e "$prefix/bin/rdmabuf" ]; then
  echo "== the installed rdmabuf command runs from $prefix/bin"
  "$prefix/bin/rdmabuf" --version ||
    { echo "FAIL: the installed rdmabuf command does not start (does it find librdmabuf?)" >&2; exit 1; }
fi

echo "== every public header compiles on its own"
for h in "$prefix"/include/rdmabuf/*.h; do
  echo "#include <rdmabuf/$(basename "$h")>" |
    ${CXX:-c++} -std=c++20 -fsyntax-only -I"$prefix/include" -x c++ - ||
    { echo "FAIL: <rdmabuf/$(basename "$h")> does not compile on its own" >&2; exit 1; }
done

echo "== build examples/consumer against the installed package"
cmake -S "$root/examples/consumer" -B "$tmp/consumer" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
found=$(sed -n 's/^rdmabuf_DIR:PATH=//p' "$tmp/consumer/CMakeCache.txt")
case "$found" in
  "$prefix"/*) ;;
  *) echo "FAIL: find_package(rdmabuf) used '$found', not the package in $prefix" >&2; exit 1 ;;
esac
cmake --build "$tmp/consumer"

echo "== run the example"
"$root/examples/consumer/run.sh" "$tmp/consumer/read_write"
