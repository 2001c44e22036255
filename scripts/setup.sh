#!/usr/bin/env bash
# Installs what building and testing qemfs needs on a fresh Debian machine.
# Idempotent: each step is skipped when its result is already there.
set -euo pipefail

if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo not found; install Rust (https://rustup.rs) first" >&2
  exit 2
fi

# scripts/test.sh checks formatting and lints before it tests.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy
fi

# The field's own Python readers and writers are real clients in the tests
# (numpy, zarr, xarray, dask, tifffile, h5py): a virtual environment in
# .venv/, remade whenever scripts/requirements-clients.txt changes.
venv=.venv
want=$(sha256sum scripts/requirements-clients.txt | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r scripts/requirements-clients.txt
  echo "$want" >"$venv/.requirements.sha256"
fi

# py4DSTEM reads the EMD export back in the tests, but pins numpy < 2:
# its own environment, .venv-py4dstem/, from scripts/requirements-py4dstem.txt.
p4=.venv-py4dstem
want=$(sha256sum scripts/requirements-py4dstem.txt | cut -d' ' -f1)
if [ ! -x "$p4/bin/python" ] || [ "$(cat "$p4/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
  python3 -m venv "$p4"
  "$p4/bin/pip" install --quiet --disable-pip-version-check -r scripts/requirements-py4dstem.txt
  echo "$want" >"$p4/.requirements.sha256"
fi

# The GPU tests (gpu/) run their WGSL shaders on Mesa's software Vulkan
# (lavapipe) where there is no GPU: the Vulkan loader and Mesa's drivers.
# (grep reads all of ldconfig's output: with -q, ldconfig could die of
# SIGPIPE and pipefail would report the library missing.) HDF5 itself is
# built from its sources by cargo (with the CMake in .venv/).
# fuse3 gives the setuid fusermount3 that users other than root mount and
# unmount with (fs/tests/lifecycle.rs mounts as such a user).
if ! ldconfig -p 2>/dev/null | grep 'libvulkan\.so\.1 ' >/dev/null \
  || ! command -v fusermount3 >/dev/null \
  || ! ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 \
  || ! command -v pkg-config >/dev/null; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
    mesa-vulkan-drivers libvulkan1 pkg-config fuse3 >/dev/null
fi
