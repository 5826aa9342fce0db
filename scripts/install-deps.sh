#!/bin/sh
# install-deps.sh - install what mgc needs to build and test, from Debian's
# packages.  Does nothing when everything is already there, so it is cheap to
# run before every build.  The CUDA toolkit is optional and never installed
# here (it lives under /usr/local/cuda where present).
set -eu
pkgs="build-essential cmake pkg-config libyaml-dev libopenblas-dev libopenmpi-dev openmpi-bin clang libclang-rt-dev python3 python3-pip python3-yaml python3-jsonschema python3-numpy"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "install-deps: installing:$missing"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
      echo "install-deps: need root (or sudo) to apt-get install:$missing" >&2
      exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # shellcheck disable=SC2086
  $SUDO apt-get install -y -qq --no-install-recommends $missing
fi
# jsonschema and PyYAML for the test that checks docs/mgc-config.schema.json,
# NumPy for the reference forward pass that checks mgc-export (Debian's packages
# serve Debian's python3; another python3 on PATH gets them from PyPI).  Without
# them those tests are skipped.
if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import jsonschema, yaml, numpy' 2>/dev/null; then
  echo "install-deps: installing jsonschema, PyYAML and NumPy from PyPI"
  python3 -m pip install --quiet jsonschema pyyaml numpy || echo "install-deps: pip failed; schema_validate and export_hf will be skipped" >&2
fi
