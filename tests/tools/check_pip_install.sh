#!/usr/bin/env bash
# The ctest test pip_install: `pip install` of the source tree into a fresh
# virtual environment, then the Python tests against that installed copy.
#
#   check_pip_install.sh PYTHON SOURCE_DIR [BUILD_DIR]
#
# PYTHON makes a venv with --system-site-packages (numpy, torch and pytest
# come from the system) in a temporary directory, and installs SOURCE_DIR
# there with `pip install --no-build-isolation --no-deps --no-index`: the
# build requirements are the installed ones (Debian: python3-setuptools,
# python3-wheel, pybind11-dev), and nothing is downloaded. The build
# (setup.py, CMake) goes to BUILD_DIR (RDMABUF_PY_BUILD_DIR), default a
# temporary one; a kept one only recompiles what changed. Then, from a
# directory outside the tree and without PYTHONPATH, `import rdmabuf` must
# find the copy in the venv, with the version CMake gives the project, and
# its module must need no librdmabuf and have no run path; `python -m
# pytest SOURCE_DIR/tests/python` runs there (RDMABUF_TOOL,
# RDMABUF_TEST_CUDA_DRIVER and RDMABUF_TEST_STRICT pass through). Last,
# the install must have left no new file in the source tree (git status,
# ignored files included), when it is a git checkout.
set -euo pipefail

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: $0 PYTHON SOURCE_DIR [BUILD_DIR]" >&2
  exit 2
fi
python=$1
src=$(cd "$2" && pwd)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/rdmabuf-pip.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
build=${3:-$tmp/build}
venv=$tmp/venv

# New untracked or ignored paths are what a build leaves behind; tracked
# files may change under a developer's hands meanwhile, and other build
# directories (build-asan/, ...) come and go. setup.py's own default is
# build-python/; setuptools' would be build/lib.*, build/bdist.* and so on.
litter() {
  git -C "$src" status --porcelain --ignored | grep -E '^(\?\?|!!) ' |
    grep -vE '^!! build-[^/]*/$' || true
  (cd "$src" && ls -d build-python build/lib.* build/temp.* build/bdist.* 2>/dev/null) || true
}
in_git=0
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  in_git=1
  litter >"$tmp/before"
fi

echo "== venv: $python -m venv --system-site-packages $venv"
"$python" -m venv --system-site-packages "$venv"
py=$venv/bin/python

echo "== pip install --no-build-isolation $src (build in $build)"
start=$SECONDS
env -u PYTHONPATH RDMABUF_PY_BUILD_DIR="$build" PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
  "$py" -m pip install --no-build-isolation --no-deps --no-index "$src"
echo "== built and installed in $((SECONDS - start)) s"

cd "$tmp"
export PYTHONDONTWRITEBYTECODE=1
unset PYTHONPATH

echo "== import rdmabuf from $tmp"
want=$(sed -n 's/^project(rdmabuf VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
"$py" - "$venv" "$want" <<'EOF'
import importlib.metadata, os, subprocess, sys
import rdmabuf
venv, want = sys.argv[1], sys.argv[2]
where = os.path.realpath(rdmabuf.__file__)
print(f"rdmabuf {rdmabuf.__version__} from {where}")
assert where.startswith(os.path.realpath(venv) + os.sep), f"rdmabuf came from {where}, not {venv}"
have = {"rdmabuf.__version__": rdmabuf.__version__,
        "the installed metadata": importlib.metadata.version("rdmabuf")}
for what, version in have.items():
    assert version == want, f"{what} says {version}, CMakeLists.txt {want}"
module = rdmabuf._rdmabuf.__file__
libs = subprocess.run(["ldd", module], capture_output=True, text=True, check=True).stdout
print(libs, end="")
assert "librdmabuf" not in libs, f"{module} needs librdmabuf from outside the package"
assert "not found" not in libs, f"{module} needs a library that is missing"
dynamic = subprocess.run(["readelf", "-d", module], capture_output=True, text=True,
                         check=True).stdout
assert "PATH)" not in dynamic, f"{module} has a run path:\n{dynamic}"
EOF

echo "== python -m pytest $src/tests/python, against the installed copy"
"$py" -m pytest -q -rs -p no:cacheprovider "$src/tests/python"

if [ "$in_git" = 1 ]; then
  litter >"$tmp/after"
  new=$(comm -13 <(sort "$tmp/before") <(sort "$tmp/after"))
  if [ -n "$new" ]; then
    echo "FAIL: pip install left these in $src:" >&2
    echo "$new" >&2
    exit 1
  fi
  echo "== the source tree has no new files"
fi
