#!/usr/bin/env bash
# Listing a source folder through the mount: the time must grow with the
# folder, not with its square (issue 47: 40,000 entries in at most 2.5x
# the time of 20,000). Not a test: it makes folders of tens of thousands
# of files. Needs root and /dev/fuse.
#
#   bash benches/readdir_scale.sh [SMALL] [ROUNDS]    (default 20000, 5)
#
# Two folders of empty `.txt` files (passed through, so a listing stats
# each but opens nothing), SMALL and 2 x SMALL entries, one mount each.
# Each round lists both through fresh directory handles, by `os.listdir`
# (READDIR) and by `os.scandir` with a stat of each entry (what `ls -l`
# does); printed: the medians and the ratio large / small.
set -euo pipefail
cd "$(dirname "$0")/.."
small=${1:-20000}
rounds=${2:-5}
bin=target/release
[ -x "$bin/qemfs" ] || cargo build --release --workspace --quiet
py=${PYTHON:-python3}
work=$(mktemp -d /var/tmp/qemfs-readdir.XXXXXX)
pids=()
cleanup() {
    for m in "$work"/mnt-*; do "$bin/qemfs" unmount "$m" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

for n in "$small" $((2 * small)); do
    mkdir -p "$work/src-$n" "$work/mnt-$n"
    "$py" -c "import sys; [open(f'{sys.argv[1]}/entry-{i:07d}.txt', 'w').close() for i in range(int(sys.argv[2]))]" "$work/src-$n" "$n"
    "$bin/qemfs" mount -f "$work/src-$n" "$work/mnt-$n" --log-file "$work/log-$n" 2>"$work/stderr-$n" &
    pids+=($!)
done
for n in "$small" $((2 * small)); do
    for _ in $(seq 100); do mountpoint -q "$work/mnt-$n" && break; sleep 0.1; done
    mountpoint -q "$work/mnt-$n" || { cat "$work/stderr-$n"; exit 1; }
done

"$py" - "$work" "$small" "$rounds" <<'PY'
import os, statistics, sys, time
work, small, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sizes = (small, 2 * small)
def listdir(mnt, n):
    t = time.perf_counter()
    names = os.listdir(mnt)
    assert len(names) == n, (len(names), n)
    return time.perf_counter() - t
def scandir_stat(mnt, n):
    t = time.perf_counter()
    count = 0
    with os.scandir(mnt) as it:
        for entry in it:
            entry.stat()
            count += 1
    assert count == n, (count, n)
    return time.perf_counter() - t
for label, how in (("os.listdir", listdir), ("scandir + stat", scandir_stat)):
    times = {n: [] for n in sizes}
    for _ in range(rounds):
        for n in sizes:
            times[n].append(how(f"{work}/mnt-{n}", n))
    med = {n: statistics.median(times[n]) for n in sizes}
    print(f"{label}: {sizes[0]} entries {med[sizes[0]] * 1e3:.1f} ms, "
          f"{sizes[1]} entries {med[sizes[1]] * 1e3:.1f} ms, "
          f"ratio {med[sizes[1]] / med[sizes[0]]:.2f} (target <= 2.5; medians of {rounds})")
PY
