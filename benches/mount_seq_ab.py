#!/usr/bin/env python3
"""A cold sequential read of `data.npy` through fresh mounts, builds alternated.

    .venv/bin/python benches/mount_seq_ab.py SRC_FOLDER ROUNDS QEMFS [QEMFS ...]

SRC_FOLDER holds `scan.qem` (e.g. the file `QEM_BENCH_FILE=/tmp/a.qem cargo
bench --bench qem_decode -- 128` writes, copied there). Each round mounts
SRC_FOLDER with every QEMFS binary in turn (`--cache-size 256`, an empty
block cache each time), reads `scan.qem/data.npy` in 4 MiB reads, and
prints the wall time, the daemon's CPU time, the blocks it decoded (the
`loads` counter of `user.qemfs.cache`) and a second read's time (from the
page cache). Alternating the builds puts them in the same minutes of a
shared host. Needs root and /dev/fuse.
"""

import json
import os
import subprocess
import sys
import tempfile
import time


def read_all(path):
    with open(path, "rb", buffering=0) as f:
        while f.read(4 << 20):
            pass


def one(binary, src):
    mnt = tempfile.mkdtemp(prefix="qemfs-seq-ab-")
    subprocess.run([binary, "mount", src, mnt, "--cache-size", "256"], check=True)
    try:
        pid = int(os.getxattr(mnt, "user.qemfs.pid"))

        def cpu():
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        data = f"{mnt}/scan.qem/data.npy"
        c, t = cpu(), time.perf_counter()
        read_all(data)
        cold, daemon = time.perf_counter() - t, cpu() - c
        loads = json.loads(os.getxattr(mnt, "user.qemfs.cache"))["loads"]
        t = time.perf_counter()
        read_all(data)
        again = time.perf_counter() - t
    finally:
        subprocess.run(["umount", mnt], check=False)
        os.rmdir(mnt)
    return cold, daemon, loads, again


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    src, rounds, binaries = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    for _ in range(rounds):
        for binary in binaries:
            cold, daemon, loads, again = one(binary, src)
            print(f"{binary}: cold {cold:.3f} s, daemon {daemon:.2f} CPU-s, {loads} blocks decoded; "
                  f"again {again:.3f} s  [load {os.getloadavg()[0]:.1f}]", flush=True)


if __name__ == "__main__":
    main()
