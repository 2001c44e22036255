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

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from zarr_view import Mount, grid_position, read_files, read_halves  # noqa: E402


def one(binary, src, chunks):
    m = Mount(Path(src), 256, Path(binary))
    try:
        container = m.mnt / "scan.qem"
        data = container / "data.npy"
        if chunks:
            # Listed before the clock starts.
            array = sorted((container / "data.zarr" / "data").glob("[0-9]*"), key=grid_position)
        c, faults, loads, t = m.cpu_s(), m.minor_faults(), m.loads(), time.perf_counter()
        if chunks:
            read_halves(array)
        else:
            read_files([data])
        cold = time.perf_counter() - t
        daemon, faults, loads = m.cpu_s() - c, m.minor_faults() - faults, m.loads() - loads
        again = None
        if not chunks:
            t = time.perf_counter()
            read_files([data])
            again = time.perf_counter() - t
        return cold, daemon, faults, m.hwm_mib(), loads, again
    finally:
        m.close()


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
