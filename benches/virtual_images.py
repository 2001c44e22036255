#!/usr/bin/env python3
"""Virtual images through the mount against numpy on the dense array (issue 18).

    .venv/bin/python benches/virtual_images.py [FILE.qem] [--runs 7] [--ceiling G]

FILE.qem is a uint16 counts acquisition, by default the issue-18 one
(128x128 scans x 128x128, 268 M samples) that
`QEM_BENCH_FILE=/tmp/a.qem cargo bench --bench qem_decode -- 128` writes.
In one run, on the same machine minutes:

1. the first `virtual/bf.npy` read after mounting (the container opened,
   the bright-field disk found, the image computed);
2. bright-field and annular images of new geometries (`disk-CY-CX-R.npy`,
   `annulus-CY-CX-RI-RO.npy`, each a name not read before, so each is
   computed on lookup) with the mount warm and the disk already found: the
   median over --runs geometries;
3. numpy over the dense `.npy` (written by `qem cat FILE data.npy`),
   memory-mapped from the page cache: the same bright-field disk as
   `a[:, :, mask].sum(-1)`, as `einsum` over the disk's bounding box, and
   as `tensordot` with float32 weights over it; the fastest is the
   baseline (each checked against the mount's image);
4. the centre of mass, mean and maximum patterns of a fresh mount (one
   pass over the decoded array), as a rate against the decode ceiling
   (`--ceiling`, G samples/s, from `bash ../shared/limit/run.sh` in the
   same minutes; without it no ratio is printed).

Needs root and /dev/fuse. Prints each figure with the load average.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from mount_read import load
from zarr_view import Mount

REPO = Path(__file__).resolve().parents[1]
BIN = Path(os.environ.get("QEMFS_BIN_DIR", REPO / "target" / "release"))


def timed(f):
    t = time.perf_counter()
    out = f()
    return time.perf_counter() - t, out


def disk(shape, cy, cx, r):
    """The mount's rule: pixel centres at distance <= r (1e-9 absorbs rounding)."""
    rows, cols = np.indices(shape, dtype=np.float64)
    return np.hypot(rows - cy, cols - cx) <= r + 1e-9


def numpy_disk(a, mask):
    """Each numpy formulation's (name, seconds, image), best of 3."""
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    r0, r1, c0, c1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
    box = a[:, :, r0:r1, c0:c1]
    sub = mask[r0:r1, c0:c1]
    ways = {
        "a[:, :, mask].sum(-1)": lambda: a[:, :, mask].sum(-1),
        # uint16 products, accumulated in uint64 by einsum's dtype.
        "einsum over the bounding box": lambda: np.einsum(
            "ijkl,kl->ij", box, sub.astype(np.uint16), dtype=np.uint64),
        "tensordot over the bounding box (float32 weights)": lambda: np.tensordot(
            box, sub.astype(np.float32), axes=2),
    }
    out = []
    for name, f in ways.items():
        best, image = min((timed(f) for _ in range(3)), key=lambda r: r[0])
        out.append((name, best, image))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("qem", type=Path, nargs="?", default=Path("/tmp/a.qem"))
    p.add_argument("--runs", type=int, default=7, help="new geometries timed (median)")
    p.add_argument("--cache-size", type=int, default=1024, help="daemon cache budget, MiB")
    p.add_argument("--ceiling", type=float, help="decode ceiling, G samples/s, same minutes")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="qemfs-virtual-bench-"))
    try:
        src = work / "src"
        src.mkdir()
        qem = src / "scan.qem"
        shutil.copy(args.qem, qem)
        dense = work / "dense.npy"
        with open(dense, "wb") as out:
            subprocess.run([BIN / "qem", "cat", qem, "data.npy"], stdout=out, check=True)
        a = np.load(dense, mmap_mode="r")
        a.sum(dtype=np.uint64)  # every page in the page cache
        samples = a.size
        print(f"acquisition {list(a.shape)} {a.dtype}, {samples / 1e6:.0f} M samples; "
              f"{os.cpu_count()} cores")

        m = Mount(src, args.cache_size)
        try:
            virtual = m.mnt / "scan.qem" / "virtual"
            first, bf = timed(lambda: np.load(virtual / "bf.npy"))
            print(f"first virtual/bf.npy after mounting (disk found): {first * 1e3:.1f} ms  [{load()}]")
            geometry = json.loads((virtual / "detectors.json").read_text())
            cy, cx = geometry["center"]
            r = round(geometry["bright_field_radius"], 3)
            # New geometries: the found disk moved by a quarter pixel each
            # time; annuli from just outside it. Each name is new.
            disks, annuli = [], []
            for i in range(1, args.runs + 1):
                dy = 0.25 * i
                name = f"disk-{cy + dy:g}-{cx:g}-{r:g}.npy"
                t, _ = timed(lambda: np.load(virtual / name))
                disks.append(t)
                name = f"annulus-{cy + dy:g}-{cx:g}-{r + 2:g}-{2 * r + 8:g}.npy"
                t, _ = timed(lambda: np.load(virtual / name))
                annuli.append(t)
            warm_bf = statistics.median(disks)
            print(f"new bright-field disk, warm: median {warm_bf * 1e3:.1f} ms "
                  f"(min {min(disks) * 1e3:.1f}, max {max(disks) * 1e3:.1f})  [{load()}]")
            print(f"new annulus, warm: median {statistics.median(annuli) * 1e3:.1f} ms "
                  f"(min {min(annuli) * 1e3:.1f}, max {max(annuli) * 1e3:.1f})  [{load()}]")
            # The last disk, by numpy, from the page cache.
            name = f"disk-{cy + dy:g}-{cx:g}-{r:g}.npy"
            ours = np.load(virtual / name)
            mask = disk(a.shape[2:], cy + dy, cx, r)
            results = numpy_disk(a, mask)
            for way, t, image in results:
                same = np.array_equal(np.asarray(image, dtype=np.float64), ours.astype(np.float64))
                print(f"numpy {way}: {t * 1e3:.1f} ms ({'equal to' if same else 'DIFFERS from'} "
                      f"the mount's image)  [{load()}]")
            fastest = min(t for _, t, _ in results)
            print(f"warm new disk vs fastest numpy: {fastest / warm_bf:.2f}x faster "
                  f"({warm_bf * 1e3:.1f} ms against {fastest * 1e3:.1f} ms)")
        finally:
            m.close()

        m = Mount(src, args.cache_size)
        try:
            virtual = m.mnt / "scan.qem" / "virtual"
            t, _ = timed(lambda: [np.load(virtual / f) for f in
                                  ("com_row.npy", "mean_dp.npy", "max_dp.npy")])
            rate = samples / t / 1e9
            ratio = f", {rate / args.ceiling * 100:.0f}% of the ceiling's {args.ceiling}" \
                if args.ceiling else ""
            print(f"centre of mass + mean + max patterns, fresh mount: {t * 1e3:.1f} ms, "
                  f"{rate:.2f} G samples/s{ratio}  [{load()}]")
        finally:
            m.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
