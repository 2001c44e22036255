#!/usr/bin/env bash
# Regenerates qem.ptx from qem.cu (commit both, and qem.sha256). The PTX targets sm_70 with
# PTX ISA 6.0 (CUDA 9 drivers and newer); the driver JIT-compiles it for the
# GPU at hand (sm_90 on an H200). Uses nvcc when present, else clang, which
# compiles CUDA device code without the toolkit (-nocudainc -nocudalib).
set -euo pipefail
cd "$(dirname "$0")"
if command -v nvcc >/dev/null 2>&1; then
  nvcc -ptx -arch=compute_70 -O3 -o qem.ptx qem.cu
else
  clang="$(command -v clang-14 || command -v clang)"
  "$clang" -x cuda --cuda-device-only -nocudainc -nocudalib --cuda-gpu-arch=sm_70 \
    -O3 -S -o qem.ptx qem.cu
fi
# The digests the test gpu/tests/ptx_fresh.rs checks: a qem.cu edited
# without running this script fails the suite (`sha256sum -c qem.sha256`).
sha256sum qem.cu qem.ptx >qem.sha256
echo "wrote $(pwd)/qem.ptx ($(wc -l < qem.ptx) lines) and qem.sha256"
