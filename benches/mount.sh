#!/usr/bin/env bash
# Mount benchmark (not a test): sequential data.npy through the mount vs.
# in-process decoding, warm and cold frame reads, a virtual image from the
# spatial index vs. decoding everything, and `ls -lR` of 1000 containers.
# Needs root and /dev/fuse. Sizes: ROWS COLS DET (default 128 128 128,
# 512 MiB decoded uint16; use 256 256 128 for 2 GiB).
#
#   bash benches/mount.sh [ROWS COLS DET]     (LISTING=0 skips the 1000-container part)
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-128} cols=${2:-128} det=${3:-128}
cargo build --release --workspace --quiet
cargo build --release --example make_examples --quiet
bin=target/release
work=$(mktemp -d /tmp/qemfs-bench.XXXXXX)
mnt="$work/mnt"
mkdir -p "$work/src" "$mnt"
cleanup() { "$bin/qemfs" unmount "$mnt" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')"
target/release/examples/make_examples --acquisition "$work/src/big.qem" "$rows" "$cols" "$det" >/dev/null
size=$(stat -c %s "$work/src/big.qem")
dense=$((rows * cols * det * det * 2))
echo "acquisition: ${rows}x${cols} scans, ${det}x${det} detector, uint16: $dense bytes decoded, $size bytes on disk"

seconds() { python3 -c 'import sys,time; t=time.perf_counter(); import subprocess; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); print(f"{time.perf_counter()-t:.3f}")' "$@"; }
rate() { python3 -c "print(f'{$1/$2/1e9:.2f} GB/s')"; }

t=$(seconds "$bin/qem" cat "$work/src/big.qem" data.npy)
echo "in-process decode (qem cat data.npy > /dev/null): $t s, $(rate $dense $t)"

"$bin/qemfs" mount "$work/src" "$mnt" --cache-size 256
t=$(seconds cat "$mnt/big.qem/data.npy")
echo "mounted data.npy, sequential cat (cold): $t s, $(rate $dense $t)"
t=$(seconds cat "$mnt/big.qem/data.npy")
echo "mounted data.npy, again (page cache): $t s, $(rate $dense $t)"

python3 - "$mnt" "$rows" "$cols" <<'PY'
import os, sys, time
mnt, rows, cols = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
w = lambda n: len(str(n - 1))
frame = lambda r, c: f"{mnt}/big.qem/frames/{r:0{w(rows)}d}/{c:0{w(cols)}d}.npy"
# Cold: a block no one has read (the last scan row), after dropping caches.
try:
    open("/proc/sys/vm/drop_caches", "w").write("3\n")
except OSError:
    pass
t = time.perf_counter(); open(frame(rows - 1, 0), "rb").read(); cold = time.perf_counter() - t
path = frame(rows // 2, cols // 2)
open(path, "rb").read()
n = 2000
t = time.perf_counter()
for _ in range(n):
    with open(path, "rb") as f:
        f.read()
warm = (time.perf_counter() - t) / n
print(f"one frame, cold block: {cold*1e3:.1f} ms; warm (open+read+close): {warm*1e3:.3f} ms")
t = time.perf_counter(); open(f"{mnt}/big.qem/virtual/sum.npy", "rb").read(); s = time.perf_counter() - t
print(f"virtual/sum.npy from the spatial index: {s*1e3:.1f} ms")
PY
"$bin/qemfs" unmount "$mnt"

[ "${LISTING:-1}" = 0 ] && exit 0
# 1000 containers: listing must not open them; stat of each opens its header.
rm -f "$work/src/big.qem"
for i in $(seq -w 0 999); do cp examples/data/scan-u16.qem "$work/src/scan-$i.qem"; done
"$bin/qemfs" mount "$work/src" "$mnt"
t=$(seconds ls -l "$mnt")
echo "ls -l of 1000 containers: $t s"
t=$(seconds ls -lR "$mnt")
echo "ls -lR of 1000 containers (opens every header, lists every frame): $t s"
