#!/usr/bin/env bash
# Installs what building and testing qemfs needs on a fresh Debian machine.
# Idempotent: each step is skipped when its result is already there.
set -euo pipefail

if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo not found; install Rust (https://rustup.rs) first" >&2
  exit 2
fi

# numpy is a real client of the mount in the tests (np.load, mmap_mode="r").
if ! python3 -c 'import numpy' >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check numpy
fi

# The GPU tests (gpu/) run their WGSL shaders on Mesa's software Vulkan
# (lavapipe) where there is no GPU: the Vulkan loader and Mesa's drivers.
# (grep reads all of ldconfig's output: with -q, ldconfig could die of
# SIGPIPE and pipefail would report the library missing.)
if ! ldconfig -p 2>/dev/null | grep 'libvulkan\.so\.1 ' >/dev/null \
  || ! ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    mesa-vulkan-drivers libvulkan1 >/dev/null
fi
