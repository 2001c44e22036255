#!/usr/bin/env bash
# Sets up a fresh machine and runs the whole test suite (mount tests run
# when the user is root and /dev/fuse exists, as in CI).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The tests' python3 is the virtual environment's, with the real clients.
export PATH="$PWD/.venv/bin:$PATH"
# Mesa's Vulkan drivers want a private runtime directory.
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "$XDG_RUNTIME_DIR" ]; then
  XDG_RUNTIME_DIR="$(mktemp -d)"
  chmod 700 "$XDG_RUNTIME_DIR"
  export XDG_RUNTIME_DIR
fi
# The house rules first, so that a failure is found in seconds, not after
# the suite. Release profile throughout: clippy and rustdoc then share the
# dependencies' check metadata, and all three the build scripts and proc
# macros that the tests' build needs anyway.
cargo fmt --all --check
cargo clippy --release --workspace --all-targets -- -D warnings
# The `qemfs` binary (fs/) and the core library share a crate name, and so a
# rustdoc output folder: one `cargo doc` of both warns of the collision.
# Document the binary first and the rest after, so the library's pages are
# the ones left in target/doc. The man page renderer of qemfs-args is a
# feature only the tests turn on: documented here too.
RUSTDOCFLAGS=-Dwarnings cargo doc --release --no-deps -p qemfs-fuse
RUSTDOCFLAGS=-Dwarnings cargo doc --release --no-deps --workspace --exclude qemfs-fuse --features qemfs-args/man
cargo test --workspace --release
# Randomised thread schedules (shuttle) for the single-flight computation and
# the filesystem's tables: their locks are shuttle's only in this build.
cargo test --release -p qemfs --features shuttle --lib shuttle
# The optional CUDA backend builds, and without a driver fails cleanly.
cargo test --release -p qemfs-gpu --features cuda
# The field's own Python clients against the binaries just built.
python -m pytest -q tests/clients
