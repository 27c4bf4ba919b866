#!/usr/bin/env bash
# Installs the Debian packages named on the command line that are not
# installed yet (nothing is downloaded when all are), with apt-get, through
# sudo when not root. Used by scripts/setup.sh and scripts/fuzz.sh.
#
#   scripts/install-packages.sh PACKAGE...
#
# On a system without dpkg it only lists the packages to install by hand.
set -euo pipefail

packages=("$@")

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "setup: not a Debian system; make sure these (or equivalents) are installed:" \
    "${packages[*]}" >&2
  exit 0
fi
missing=()
for p in "${packages[@]}"; do
  installed "$p" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "setup: missing packages (${missing[*]}); run as root or install sudo" >&2
    exit 1
  fi
  sudo=(sudo)
fi
echo "setup: installing ${missing[*]}"
# noninteractive: iperf3 would otherwise ask whether to start a daemon.
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y --no-install-recommends "${missing[@]}"
