#!/bin/sh
# install-deps.sh - install what mgc needs to build and test, from Debian's
# packages.  Does nothing when everything is already there, so it is cheap to
# run before every build.  The CUDA toolkit is optional and never installed
# here (it lives under /usr/local/cuda where present).
set -eu
pkgs="build-essential cmake pkg-config libyaml-dev clang libclang-rt-dev"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
  exit 0
fi
echo "install-deps: installing:$missing"
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "install-deps: need root (or sudo) to apt-get install:$missing" >&2
    exit 1
  fi
else
  SUDO=""
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
