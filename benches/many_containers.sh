#!/usr/bin/env bash
# 100,000 small containers through one mount (issue 16: listed and read
# with the daemon's RSS at most the cache budget + 200 MB). Not a test: it
# takes minutes. Needs root and /dev/fuse, and about 0.5 GB of disk.
#
#   bash benches/many_containers.sh [COUNT]      (default 100000)
#
# One 4x4-scan, 16x16 uint16 acquisition is written by `qem convert` from
# a numpy-made .npy and copied COUNT times into one folder. The daemon runs
# with --cache-size 256 and the default --open-containers (1024). Printed:
# the time of `ls -f` of the folder, of a stat of every container and
# of reading every container's data.npy (all in one Python process), and
# the daemon's VmHWM and VmRSS after each step.
#
# 2026-12-01, 2 shared cores (a fuzzer running at nice 10), 100,000 copies
# of a 5,077-byte file: listdir 0.83 s; stat of each container 51.7 s
# (VmHWM 238 MB); data.npy of each (8,320 bytes) 145.5 s; VmHWM at the end
# 264 MB (at start 68 MB). With 20,000: 225 MB after the stats, 232 MB at
# the end; with 2,000: 168 MB. The peak levels off instead of growing with
# the count: at most 1024 containers are open, and closing one drops its
# cached blocks.
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-100000}
bin=target/release
[ -x "$bin/qemfs" ] || cargo build --release --workspace --quiet
py=${PYTHON:-/work/main/.venv/bin/python}
work=$(mktemp -d /var/tmp/qemfs-many.XXXXXX)
mnt="$work/mnt"
mkdir -p "$work/src" "$mnt"
pid=
cleanup() {
    "$bin/qemfs" unmount "$mnt" 2>/dev/null || true
    [ -n "$pid" ] && wait "$pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

"$py" -c "import numpy as np, sys; np.save(sys.argv[1], (np.arange(4*4*16*16) % 7).astype(np.uint16).reshape(4, 4, 16, 16))" "$work/one.npy"
"$bin/qem" convert "$work/one.npy" "$work/one.qem" >/dev/null
size=$(stat -c %s "$work/one.qem")
t0=$(date +%s.%N)
"$py" - "$work/one.qem" "$work/src" "$count" <<'PY'
import shutil, sys
one, dest, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(n):
    shutil.copyfile(one, f"{dest}/scan-{i:06d}.qem")
PY
echo "$count copies of a $size-byte .qem: $(python3 -c "import time; print(f'{time.time()-$t0:.1f}')") s"

"$bin/qemfs" mount -f "$work/src" "$mnt" --cache-size 256 --log-file "$work/log" 2>"$work/stderr" &
pid=$!
for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
mountpoint -q "$mnt" || { cat "$work/stderr"; exit 1; }
mem() { sed -n 's/^\(VmHWM\|VmRSS\):\s*/\1 /p' "/proc/$pid/status" | tr '\n' ' '; }
echo "daemon at start: $(mem)"

"$py" - "$mnt" "$count" "/proc/$pid/status" <<'PY'
import os, sys, time
mnt, n, status = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def mem():
    fields = dict(l.split(":", 1) for l in open(status) if l.startswith(("VmHWM", "VmRSS")))
    return " ".join(f"{k} {v.strip()}" for k, v in fields.items())
t = time.perf_counter()
names = os.listdir(mnt)
assert len(names) == n, len(names)
print(f"listdir of {n} containers: {time.perf_counter() - t:.2f} s; {mem()}")
t = time.perf_counter()
for name in names:
    os.stat(f"{mnt}/{name}")
print(f"stat of every container: {time.perf_counter() - t:.2f} s; {mem()}")
t = time.perf_counter()
total = 0
for name in names:
    with open(f"{mnt}/{name}/data.npy", "rb") as f:
        total += len(f.read())
print(f"data.npy of every container ({total} bytes): {time.perf_counter() - t:.2f} s; {mem()}")
PY
echo "daemon at end: $(mem)"
grep -c . "$work/log" >/dev/null 2>&1 && echo "log lines: $(wc -l <"$work/log")" || true
