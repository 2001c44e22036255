#!/usr/bin/env python3
"""The Zarr view and store against the plain decode, on one acquisition.

    .venv/bin/python benches/zarr_view.py [--scan 128] [--detector 128] [--cache-size 256]

Makes a low-dose uint16 acquisition (scan x scan positions, detector x
detector pixels, a bright disk and sparse counts elsewhere), converts it to
.qem, then times, each from a cold start (a fresh mount, so an empty block
cache; the source file stays in the page cache):

1. `qem cat FILE data.npy > /dev/null`: the whole array decoded and written
   out, the reference rate;
2. every chunk of `data.zarr/data` read through the mount by 2 processes;
3. the sum over the detector with Dask on a LocalCluster of 2 worker
   processes reading `data.zarr` through the mount, with the daemon's peak
   RSS (VmHWM) while it runs: the fresh cluster's first computation (which
   also pays Dask's own start) and the same sum again on a fresh mount;
4. `qem convert FILE X.zarr` (blosc-zstd), in MB/s of dense output.

Needs root and /dev/fuse for 2 and 3. Prints one line per figure.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BIN = Path(os.environ.get("QEMFS_BIN_DIR", REPO / "target" / "release"))


def acquisition(scan: int, det: int) -> np.ndarray:
    rng = np.random.default_rng(1)
    r, c = np.indices((det, det))
    disk = np.hypot(r - det / 2, c - det / 2) < det / 6
    out = np.empty((scan, scan, det, det), np.uint16)
    for i in range(scan):  # row by row: bounded memory while generating
        out[i] = rng.poisson(np.where(disk, 20.0, 0.02), size=(scan, det, det))
    return out


def read_files(paths):
    n = 0
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(1 << 22):
                n += len(chunk)
    return n


def read_files_cpu(paths):
    """As read_files, with the CPU time (user + system) the reading took:
    on shared cores steadier than the wall time."""
    before = os.times()
    n = read_files(paths)
    after = os.times()
    return n, (after.user - before.user) + (after.system - before.system)


def read_halves(chunks):
    """Every chunk file read by 2 processes: (bytes, seconds, readers' CPU seconds)."""
    t = time.perf_counter()
    with Pool(2) as pool:
        done = pool.map(read_files_cpu, [chunks[0::2], chunks[1::2]])
    return sum(n for n, _ in done), time.perf_counter() - t, sum(c for _, c in done)


class Mount:
    def __init__(self, src: Path, cache_mib: int):
        self.mnt = Path(tempfile.mkdtemp(prefix="qemfs-bench-"))
        subprocess.run([BIN / "qemfs", "mount", src, self.mnt, "--cache-size", str(cache_mib)], check=True)
        self.pid = int(os.getxattr(self.mnt, "user.qemfs.pid"))  # the daemon names itself

    def hwm_mib(self) -> float:
        for line in open(f"/proc/{self.pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_s(self) -> float:
        """The daemon's CPU time so far (user + system): steadier than wall
        time on shared cores."""
        fields = open(f"/proc/{self.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self):
        subprocess.run([BIN / "qemfs", "unmount", self.mnt], check=False)
        shutil.rmtree(self.mnt, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scan", type=int, default=128)
    p.add_argument("--detector", type=int, default=128)
    p.add_argument("--cache-size", type=int, default=256, help="daemon cache budget, MiB")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="qemfs-zarr-bench-"))
    try:
        src = work / "src"
        src.mkdir()
        a = acquisition(args.scan, args.detector)
        dense = a.nbytes
        np.save(work / "scan.npy", a)
        del a
        qem = src / "scan.qem"
        subprocess.run([BIN / "qem", "convert", work / "scan.npy", qem], check=True)
        (work / "scan.npy").unlink()
        print(f"acquisition: {args.scan}x{args.scan} x {args.detector}x{args.detector} uint16, "
              f"{dense / 1e6:.0f} MB dense, {qem.stat().st_size / 1e6:.1f} MB as .qem")

        t = time.perf_counter()
        with open(os.devnull, "wb") as null:
            subprocess.run([BIN / "qem", "cat", qem, "data.npy"], stdout=null, check=True)
        cat_s = time.perf_counter() - t
        print(f"qem cat data.npy > /dev/null: {cat_s:.3f} s, {dense / cat_s / 1e6:.0f} MB/s")

        if os.geteuid() == 0 and Path("/dev/fuse").exists():
            m = Mount(src, args.cache_size)
            try:
                chunks = sorted((m.mnt / "scan.qem" / "data.zarr" / "data").glob("[0-9]*"))
                cpu = m.cpu_s()
                n, s, readers = read_halves(chunks)
                cpu = m.cpu_s() - cpu
                chunks_s = s
                print(f"every data.zarr chunk through the mount, 2 processes: {s:.3f} s, "
                      f"{n / s / 1e6:.0f} MB/s ({cat_s / s * 100:.0f}% of qem cat's rate), "
                      f"{len(chunks)} chunks; CPU: daemon {cpu:.2f} s, readers {readers:.2f} s; "
                      f"peak RSS {m.hwm_mib():.0f} MiB")
            finally:
                m.close()

            import dask.array as da
            import zarr
            from dask.distributed import Client, LocalCluster

            with LocalCluster(n_workers=2, threads_per_worker=1, processes=True) as cluster, \
                    Client(cluster) as client:
                # Workers import their libraries before the clock starts.
                client.run(lambda: __import__("zarr") and __import__("numpy"))
                # A fresh cluster's first computation also pays Dask's own
                # start: timed apart; the same sum on a fresh mount (the
                # block cache cold again) is the steady figure.
                first = None
                for trial in ("first", "steady"):
                    m = Mount(src, args.cache_size)
                    try:
                        array = zarr.open_array(str(m.mnt / "scan.qem" / "data.zarr" / "data"),
                                                mode="r", zarr_format=3)
                        data = da.from_zarr(array)
                        cpu = m.cpu_s()
                        t = time.perf_counter()
                        total = data.sum(axis=(2, 3), dtype=np.uint64).compute()
                        s = time.perf_counter() - t
                        cpu = m.cpu_s() - cpu
                        assert total.shape == (args.scan, args.scan)
                        if first is None:
                            first = s
                            continue
                        print(f"Dask sum over the detector, 2 worker processes, cold blocks: "
                              f"{s:.3f} s ({s / cat_s:.2f}x the qem cat time, {s / chunks_s:.2f}x "
                              f"the chunk read; the fresh cluster's first computation {first:.3f} s); "
                              f"daemon CPU {cpu:.2f} s, peak RSS {m.hwm_mib():.0f} MiB "
                              f"(cache budget {args.cache_size} MiB)")
                    finally:
                        m.close()
        else:
            print("mount figures skipped: they need root and /dev/fuse")

        t = time.perf_counter()
        subprocess.run([BIN / "qem", "convert", qem, work / "scan.zarr"], check=True)
        s = time.perf_counter() - t
        size = sum(f.stat().st_size for f in (work / "scan.zarr").rglob("*") if f.is_file())
        print(f"qem convert scan.qem scan.zarr: {s:.3f} s, {dense / s / 1e6:.0f} MB/s of dense output, "
              f"store {size / 1e6:.1f} MB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
