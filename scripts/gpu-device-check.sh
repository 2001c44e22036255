#!/usr/bin/env bash
# One prepared check for a machine with a real GPU (an H200 with the CUDA
# driver, no network). Builds offline in release (the target dir and the
# cargo registry come along; nothing is downloaded), runs the GPU tests on
# the hardware (a wgpu hardware adapter, then CUDA with the `cuda` feature;
# each fails rather than falls back to software), and runs the benchmark.
# Exit status: that of the test runs (0 when both passed).
set -uo pipefail
cd "$(dirname "$0")/.."
export CARGO_NET_OFFLINE=true
# HDF5 is built from its sources (.cargo/config.toml) with CMake 3.26 or
# newer: the one scripts/setup.sh put in .venv, run directly (the venv's
# Python is not there). Carry its binary and modules (39 MB):
#   .venv/lib/python3.11/site-packages/cmake/data/bin/cmake
#   .venv/lib/python3.11/site-packages/cmake/data/share
if [ -z "${CMAKE:-}" ]; then
  for c in .venv/lib/python3*/site-packages/cmake/data/bin/cmake; do
    if [ -x "$c" ]; then export CMAKE="$PWD/$c"; fi
  done
fi
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "$XDG_RUNTIME_DIR" ]; then
  XDG_RUNTIME_DIR="$(mktemp -d)"; chmod 700 "$XDG_RUNTIME_DIR"; export XDG_RUNTIME_DIR
fi
scan="${QEMFS_BENCH_SCAN:-128}"

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
  || echo "nvidia-smi: not found"
echo "vulkan ICDs: $(ls /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>/dev/null | tr '\n' ' ')"
echo "cores: $(nproc)"

echo "== build (release, offline, with the cuda feature)"
cargo build --offline --release -p qemfs-gpu --features cuda --tests --benches || exit 2

status=0
run_tests() { # $1: QEMFS_GPU_BACKENDS, rest: cargo arguments
  local backends="$1"; shift
  echo "== gpu tests: $backends"
  QEMFS_GPU_BACKENDS="$backends" cargo test --offline --release -p qemfs-gpu "$@" 2>&1 \
    | grep -E '^test |test result|panicked|adapter|device|skipping' | head -40
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
}
run_tests wgpu-hw
run_tests cuda --features cuda

echo "== benchmark (${scan}x${scan} scan, 128x128 uint16)"
QEMFS_BENCH_SCAN="$scan" cargo bench --offline -p qemfs-gpu --features cuda --bench gpu_reduce 2>&1 | tail -16
exit "$status"
