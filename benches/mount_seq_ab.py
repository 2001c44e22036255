#!/usr/bin/env python3
"""Cold reads through fresh mounts, builds alternated.

    .venv/bin/python benches/mount_seq_ab.py [--chunks] SRC_FOLDER ROUNDS QEMFS [QEMFS ...]

SRC_FOLDER holds `scan.qem` (e.g. the file `QEM_BENCH_FILE=/tmp/a.qem cargo
bench --bench qem_decode -- 128` writes, copied there). Each round mounts
SRC_FOLDER with every QEMFS binary in turn (`--cache-size 256`, an empty
block cache each time) and reads `scan.qem/data.npy` in 4 MiB reads, or
with --chunks every chunk of `scan.qem/data.zarr/data` by 2 processes
(alternate chunks, in grid order, as `benches/zarr_view.py` does), and
prints the wall time, the daemon's CPU time, its minor page faults (fresh
pages: a cold cache filling), its peak RSS, the blocks it decoded (the
`loads` counter of `user.qemfs.cache`) and, for `data.npy`, a second
read's time (from the page cache). Alternating the builds puts them in
the same minutes of a shared host. Needs root and /dev/fuse.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path


def read_all(path):
    with open(path, "rb", buffering=0) as f:
        while f.read(4 << 20):
            pass


def read_files(paths):
    for p in paths:
        read_all(p)


def read_chunks(array: Path):
    """Every chunk file of `array` read by 2 processes, alternate chunks
    each, in the grid's order ("10.0.0.0" after "2.0.0.0")."""
    chunks = sorted(array.glob("[0-9]*"), key=lambda c: tuple(int(i) for i in c.name.split(".")))
    with Pool(2) as pool:
        pool.map(read_files, [chunks[0::2], chunks[1::2]])


def one(binary, src, chunks):
    mnt = tempfile.mkdtemp(prefix="qemfs-seq-ab-")
    subprocess.run([binary, "mount", src, mnt, "--cache-size", "256"], check=True)
    try:
        pid = int(os.getxattr(mnt, "user.qemfs.pid"))

        def stat():
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()

        def cpu():
            fields = stat()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        def hwm_mib():
            for line in open(f"/proc/{pid}/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
            return float("nan")

        container = Path(mnt) / "scan.qem"
        data = container / "data.npy"
        if chunks:
            (container / "data.zarr" / "data").is_dir()  # listed before the clock starts
        c, faults, t = cpu(), int(stat()[7]), time.perf_counter()
        if chunks:
            read_chunks(container / "data.zarr" / "data")
        else:
            read_all(data)
        cold, daemon, faults = time.perf_counter() - t, cpu() - c, int(stat()[7]) - faults
        loads = json.loads(os.getxattr(mnt, "user.qemfs.cache"))["loads"]
        again = None
        if not chunks:
            t = time.perf_counter()
            read_all(data)
            again = time.perf_counter() - t
        rss = hwm_mib()
    finally:
        subprocess.run(["umount", mnt], check=False)
        os.rmdir(mnt)
    return cold, daemon, faults, rss, loads, again


def main():
    args = sys.argv[1:]
    chunks = "--chunks" in args
    args = [a for a in args if a != "--chunks"]
    if len(args) < 3:
        sys.exit(__doc__)
    src, rounds, binaries = args[0], int(args[1]), args[2:]
    for _ in range(rounds):
        for binary in binaries:
            cold, daemon, faults, rss, loads, again = one(binary, src, chunks)
            tail = "" if again is None else f"; again {again:.3f} s"
            print(f"{binary}: cold {cold:.3f} s, daemon {daemon:.2f} CPU-s, {faults} page faults, "
                  f"peak RSS {rss:.0f} MiB, {loads} blocks decoded{tail}  "
                  f"[load {os.getloadavg()[0]:.1f}]", flush=True)


if __name__ == "__main__":
    main()
