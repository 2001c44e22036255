#!/usr/bin/env bash
# Sets up a fresh machine and runs the whole test suite (mount tests run
# when the user is root and /dev/fuse exists, as in CI).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo test --workspace --release
