#!/bin/sh
# gpu-debs.sh - fetch the Debian packages the GPU machine's image lacks into
# .deb/ (git-ignored), for scripts/gpu.sh to unpack there: libyaml (the
# compiler) and OpenBLAS with its Fortran runtime (the CPU reference backend).
set -eu
cd "$(dirname "$0")/.."
mkdir -p .deb
cd .deb
apt-get download libyaml-0-2 libyaml-dev libopenblas0-pthread libopenblas-pthread-dev \
    libopenblas-dev libgfortran5 libquadmath0
ls -l
