#!/usr/bin/env bash
# The documents that hold a large header (issue 16): `qem show --json` and,
# through a mount, the first stat of a container (which sizes header.json
# and info.json) and the reading of both, with time and peak memory. The
# file: a 10 M-row scan (10,000,000 × 1 scans of a 1×2 uint8 detector,
# zeros, written by numpy and `qem convert`), whose header is megabytes of
# chunk table. Needs root and /dev/fuse for the mount part.
#
#   bash benches/header_documents.sh [BIN_DIR]    (default target/release)
#
# Give the folder of other binaries (an older build) to compare.
#
# 2026-12-02, 2-core Intel Xeon, load 1.0, the build before (5a071bf)
# against the one after, same minute: `qem show --json` 0.34 -> 0.20 s,
# peak RSS 167 -> 87 MB; first stat of the container 553 -> 146 ms, daemon
# VmHWM 171 -> 74 MB; reading both documents (21 MB) 415 -> 78 ms, VmHWM
# 180 -> 94 MB (they are then held in the budget).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release}
[ -n "${1:-}" ] || cargo build --release --quiet -p qemfs-cmds -p qemfs-fuse
py=${PYTHON:-.venv/bin/python}
work=$(mktemp -d /var/tmp/qemfs-header.XXXXXX)
trap 'grep -q " $work/mnt " /proc/mounts && "$bin/qemfs" unmount "$work/mnt"; rm -rf "$work"' EXIT
mkdir -p "$work/src" "$work/mnt"
"$py" -c "import numpy as np, sys; np.save(sys.argv[1], np.zeros((10_000_000, 1, 1, 2), np.uint8))" "$work/tall.npy"
"$bin/qem" convert "$work/tall.npy" "$work/src/tall.qem" >/dev/null
rm "$work/tall.npy"
echo "file: $(stat -c %s "$work/src/tall.qem") bytes; binaries: $bin; load $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/time -f "qem show --json: %e s, peak RSS %M KB" "$bin/qem" show --json "$work/src/tall.qem" >/dev/null
"$bin/qemfs" mount --cache-size 256 "$work/src" "$work/mnt"
pid=$(pgrep -f "\"mountpoint\":\"$work/mnt\"" | head -1)
s=$(date +%s%N)
stat -c "%n %s" "$work/mnt/tall.qem/header.json" "$work/mnt/tall.qem/info.json" | sed "s#$work/mnt/##"
e=$(date +%s%N)
echo "first stat of the container: $(( (e - s) / 1000000 )) ms; daemon $(grep VmHWM /proc/"$pid"/status)"
s=$(date +%s%N)
cat "$work/mnt/tall.qem/header.json" "$work/mnt/tall.qem/info.json" >/dev/null
e=$(date +%s%N)
echo "reading both: $(( (e - s) / 1000000 )) ms; daemon $(grep VmHWM /proc/"$pid"/status)"
