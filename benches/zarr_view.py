#!/usr/bin/env python3
"""The Zarr view and store against the plain decode, on one acquisition.

    .venv/bin/python benches/zarr_view.py [--scan 128] [--detector 128] [--cache-size 256] [--runs 3] [--rounds 0]

Makes a low-dose uint16 acquisition (scan x scan positions, detector x
detector pixels, a bright disk and sparse counts elsewhere), converts it to
.qem, then times, each from a cold start (a fresh mount, so an empty block
cache; the source file stays in the page cache) and --runs times, the
fastest run reported with all the runs' times (single runs on 2 shared
cores vary by 10-20%):

1. `qem cat FILE data.npy > /dev/null`: the whole array decoded and written
   out, the reference rate; and `qem validate FILE` (full) beside it;
2. every chunk of `data.zarr/data` read through the mount by 2 processes;
3. the sum over the detector with Dask on a LocalCluster of 2 worker
   processes reading `data.zarr` through the mount, with the
   daemon's peak RSS (VmHWM) while it runs, and the workers' CPU time and
   page faults: the fresh cluster's first computation (which also pays
   Dask's own start) and the same sum again on a fresh mount. Twice: the
   plain `data.sum(axis=(2, 3), dtype=np.uint64)` on workers with Dask's
   default environment, then on the cluster that
   `examples/dask_virtual_images.py` starts (its malloc settings: chunk
   buffers reused, not mapped afresh; 2 threads per worker, one summing
   while the other waits for the mount) both that plain sum and the example's
   exact sum (uint32 accumulation where pixels x the dtype's maximum fits,
   widened to uint64, each task reading and summing up to 128 MiB of
   whole chunks), which must equal it; and, on that cluster, Dask's
   floor: the exact sum over a plain copy of `data.zarr` in the page
   cache, no decoding and no FUSE (what Dask and zarr-python cost by
   themselves: about the least the sum through the mount could take, where
   the mount's own CPU shares the cores);
4. `qem convert FILE X.zarr` (blosc-zstd), in MB/s of dense output.

With --rounds N, then N rounds of issue 12's two ratios, each round's
`qem cat`, chunk read, the example's exact Dask sum and its floor run back
to back, and the ratios' medians: on shared cores whose speed drifts within
minutes, the steadier figure (the fastest runs above come from phases
minutes apart).

Needs root and /dev/fuse for 2 and 3. Prints one line per figure.
"""

import argparse
import json
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
sys.path.insert(0, str(REPO / "examples"))
# Dask's nanny writes its workers' pre-spawn variables (MALLOC_TRIM_THRESHOLD_)
# into this process's environment: each cluster, and each daemon, starts
# from the environment the bench was started with instead.
START_ENV = dict(os.environ)


def restore_environ():
    os.environ.clear()
    os.environ.update(START_ENV)


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


def grid_position(chunk: Path) -> tuple:
    """A chunk file's place in the chunk grid ("10.0.0.0" -> (10, 0, 0, 0)):
    the order in which zarr-python reads a whole array and Dask numbers its
    tasks, where sorting the names would read chunk 10 before chunk 2."""
    return tuple(int(i) for i in chunk.name.split("."))


def read_halves(chunks):
    """Every chunk file read by 2 processes, alternate chunks each: (bytes,
    seconds, readers' CPU seconds)."""
    t = time.perf_counter()
    with Pool(2) as pool:
        done = pool.map(read_files_cpu, [chunks[0::2], chunks[1::2]])
    return sum(n for n, _ in done), time.perf_counter() - t, sum(c for _, c in done)


def chunk_read(src: Path, cache_mib: int):
    """Every chunk of `data.zarr/data` of `src`'s scan.qem read by 2
    processes on a fresh mount: (bytes, seconds, chunks, daemon CPU
    seconds, daemon minor page faults, readers' CPU seconds, daemon peak
    RSS in MiB, blocks decoded)."""
    m = Mount(src, cache_mib)
    try:
        chunks = sorted((m.mnt / "scan.qem" / "data.zarr" / "data").glob("[0-9]*"),
                        key=grid_position)
        cpu, faults, loads = m.cpu_s(), m.minor_faults(), m.loads()
        n, s, readers = read_halves(chunks)
        return (n, s, len(chunks), m.cpu_s() - cpu, m.minor_faults() - faults, readers,
                m.hwm_mib(), m.loads() - loads)
    finally:
        m.close()


class Mount:
    def __init__(self, src: Path, cache_mib: int, qemfs: Path | None = None):
        """`src` mounted afresh by `qemfs` (the build under test unless
        given)."""
        self.qemfs = qemfs or BIN / "qemfs"
        self.mnt = Path(tempfile.mkdtemp(prefix="qemfs-bench-"))
        subprocess.run([self.qemfs, "mount", src, self.mnt, "--cache-size", str(cache_mib)],
                       check=True, env=START_ENV)
        self.pid = int(os.getxattr(self.mnt, "user.qemfs.pid"))  # the daemon names itself

    def hwm_mib(self) -> float:
        for line in open(f"/proc/{self.pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stat(self) -> list:
        """The daemon's /proc stat fields after its name (field 3 on)."""
        return open(f"/proc/{self.pid}/stat").read().rsplit(")", 1)[1].split()

    def cpu_s(self) -> float:
        """The daemon's CPU time so far (user + system): steadier than wall
        time on shared cores."""
        fields = self.stat()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def minor_faults(self) -> int:
        """The daemon's minor page faults so far: a fresh page each, most
        of them while a cold cache fills."""
        return int(self.stat()[7])

    def loads(self) -> int:
        """Values the daemon's budget has loaded so far: blocks decoded
        (and products computed, none here). More than the chunks read
        means blocks were evicted before all their reads were served."""
        return json.loads(os.getxattr(self.mnt, "user.qemfs.cache"))["loads"]

    def close(self):
        subprocess.run([self.qemfs, "unmount", self.mnt], check=False)
        shutil.rmtree(self.mnt, ignore_errors=True)


def worker_usage():
    """This worker's CPU time (user + system) and minor page faults so far."""
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def plain_sum(source):
    """The sum over the detector as a Dask array says it: `from_zarr`, then
    a uint64 sum."""
    import dask.array as da

    return da.from_zarr(source).sum(axis=(2, 3), dtype=np.uint64).compute()


def example_sum(source):
    """The example's exact sum over the detector (every pixel valid): one
    task per 128 MiB of whole chunks."""
    from dask_virtual_images import virtual_images

    return virtual_images(source, np.ones(source.shape[2:], bool), pattern=False)["sum"]


def dask_on(client, array_path: Path, reduce):
    """`reduce` (a function of the Zarr array that computes on the
    cluster, `plain_sum` or `example_sum`) computed once by the
    cluster's workers over the Zarr array at `array_path`: (result,
    seconds, workers' CPU seconds, workers' minor page faults, this
    process's CPU seconds (the client and a LocalCluster's scheduler))."""
    import zarr

    source = zarr.open_array(str(array_path), mode="r", zarr_format=3)
    before = client.run(worker_usage)
    here = os.times()
    t = time.perf_counter()
    total = reduce(source)
    s = time.perf_counter() - t
    here = sum(os.times()[:2]) - sum(here[:2])
    after = client.run(worker_usage)
    workers_cpu = sum(after[w][0] - before[w][0] for w in before)
    faults = sum(after[w][1] - before[w][1] for w in before)
    return total, s, workers_cpu, faults, here


def dask_once(client, src, cache_mib, reduce):
    """`reduce` computed once by the cluster's workers on a fresh mount
    (the block cache cold): (result, seconds, daemon CPU seconds, workers'
    CPU seconds, workers' minor page faults, this process's CPU seconds,
    daemon peak RSS in MiB, blocks decoded)."""
    m = Mount(src, cache_mib)
    try:
        cpu, loads = m.cpu_s(), m.loads()
        total, s, workers_cpu, faults, here = dask_on(
            client, m.mnt / "scan.qem" / "data.zarr" / "data", reduce)
        cpu = m.cpu_s() - cpu
        return total, s, cpu, workers_cpu, faults, here, m.hwm_mib(), m.loads() - loads
    finally:
        m.close()


def dask_floor(client, copy: Path, reduce, runs: int):
    """The fastest of `runs` computations of `reduce` over `copy`, a plain
    copy of `data.zarr` held in the page cache: Dask's and zarr-python's
    own cost with no decoding and no FUSE, about the least a computation
    through the mount can take (after one warming run). (result, seconds, all the
    runs' seconds, workers' CPU seconds of the fastest, client's CPU
    seconds)."""
    dask_on(client, copy / "data", reduce)
    runs = [dask_on(client, copy / "data", reduce) for _ in range(runs)]
    best = min(runs, key=lambda r: r[1])
    return best[0], best[1], [r[1] for r in runs], best[2], best[4]


def copy_view(src: Path, dest: Path):
    """`data.zarr` of `src`'s scan.qem copied out of a mount to `dest`."""
    m = Mount(src, 256)
    try:
        shutil.copytree(m.mnt / "scan.qem" / "data.zarr", dest)
    finally:
        m.close()


def dask_trials(client, src, cache_mib, label, sums, chunks_s, cat_s, scan, runs):
    """Each of `sums` (name, function of the Dask array) computed by the
    cluster's workers `runs` times, each time on a fresh mount (the block
    cache cold again), one line per sum with its fastest run. A fresh
    cluster's first computation also pays Dask's own start: it runs the
    first sum once more beforehand, timed apart. Returns the results by
    name."""
    first = None
    results = {}
    best = {}
    trials = [sums[0]] + [s for s in sums for _ in range(runs)]
    for i, (name, reduce) in enumerate(trials):
        total, s, cpu, workers_cpu, faults, here, rss, decoded = dask_once(
            client, src, cache_mib, reduce)
        assert total.shape == (scan, scan) and total.dtype == np.uint64
        if first is None:
            first = s
            continue
        results[name] = total
        times = best.setdefault(name, [])
        times.append(s)
        if s == min(times):
            # The fastest run's figures, printed after the last run.
            line = (f"({s / cat_s:.2f}x the qem cat time, {s / chunks_s:.2f}x the chunk read; "
                    f"the fresh cluster's first computation {first:.3f} s); CPU: daemon "
                    f"{cpu:.2f} s, workers {workers_cpu:.2f} s ({faults} minor page faults), "
                    f"client and scheduler {here:.2f} s; {decoded} blocks decoded; daemon peak RSS "
                    f"{rss:.0f} MiB (cache budget {cache_mib} MiB)")
        if i + 1 == len(trials) or trials[i + 1][0] != name:
            print(f"Dask {name}, {label}, 2 worker processes, cold blocks: fastest of "
                  f"{runs} {min(times):.3f} s (all: {', '.join(f'{x:.3f}' for x in times)}) "
                  + line)
    return results


def cat_once(qem: Path) -> float:
    """Seconds of `qem cat FILE data.npy > /dev/null`."""
    t = time.perf_counter()
    with open(os.devnull, "wb") as null:
        subprocess.run([BIN / "qem", "cat", qem, "data.npy"], stdout=null, check=True)
    return time.perf_counter() - t


def rounds(src: Path, copy: Path, cache_mib: int, n: int):
    """Issue 12's two ratios taken `n` times, each from three measurements
    made back to back: `qem cat`, the chunk read (2 processes, a fresh
    mount) and the example's exact Dask sum (a fresh mount, on a cluster
    of the example's started after the chunk read, so that its idle
    workers take no CPU from the read, and warmed by one computation). A
    shared host whose speed drifts within minutes biases ratios of figures
    taken in separate phases; the median of ratios taken within rounds is
    the steadier figure. Each round also takes Dask's floor (`dask_floor`
    over `copy`, once) on the same cluster: about the least the Dask sum
    could take with a mount that cost nothing."""
    from dask.distributed import Client

    from dask_virtual_images import local_cluster

    qem = src / "scan.qem"
    reads, dasks, floors = [], [], []
    for r in range(n):
        cat_s = cat_once(qem)
        chunks_s = chunk_read(src, cache_mib)[1]
        restore_environ()
        with local_cluster(2) as cluster, Client(cluster) as client:
            dask_once(client, src, cache_mib, example_sum)
            dask_s = dask_once(client, src, cache_mib, example_sum)[1]
            floor_s = dask_floor(client, copy, example_sum, 1)[1]
        restore_environ()
        reads.append(cat_s / chunks_s)
        dasks.append(dask_s / chunks_s)
        floors.append(floor_s / chunks_s)
        print(f"round {r + 1}: qem cat {cat_s:.3f} s, chunk read {chunks_s:.3f} s, Dask sum "
              f"{dask_s:.3f} s, its floor {floor_s:.3f} s; chunk read at {reads[-1] * 100:.0f}% "
              f"of qem cat's rate, Dask sum {dasks[-1]:.2f}x the chunk read (floor "
              f"{floors[-1]:.2f}x)  [load {load()}]")
    print(f"median of {n} rounds: chunk read at {np.median(reads) * 100:.0f}% of qem cat's rate "
          f"(target 80%), Dask sum {np.median(dasks):.2f}x the chunk read (target 1.5x; Dask's "
          f"floor over a page-cache copy {np.median(floors):.2f}x)")


def load() -> str:
    """The load average over 1, 5 and 15 minutes, as /proc/loadavg gives it."""
    return " ".join(open("/proc/loadavg").read().split()[:3])


def fuse_request_limit() -> str:
    """The largest FUSE request the kernel allows a mount made now
    (`fs.fuse.max_pages_limit`, Linux 6.13+; 1 MiB before): a chunk's
    direct read reaches the daemon in requests of this size."""
    try:
        pages = int(open("/proc/sys/fs/fuse/max_pages_limit").read())
    except OSError:
        return "FUSE requests up to 1 MiB (a kernel before 6.13)"
    kib = pages * os.sysconf("SC_PAGE_SIZE") // 1024
    return f"FUSE requests up to {kib} KiB (fs.fuse.max_pages_limit {pages})"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scan", type=int, default=128)
    p.add_argument("--detector", type=int, default=128)
    p.add_argument("--cache-size", type=int, default=256, help="daemon cache budget, MiB")
    p.add_argument("--runs", type=int, default=3,
                   help="runs of each figure, the fastest reported (default 3)")
    p.add_argument("--rounds", type=int, default=0,
                   help="then this many rounds of the chunk read's and the Dask sum's ratios, "
                        "each from back-to-back runs, and their medians (default 0)")
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
              f"{dense / 1e6:.0f} MB dense, {qem.stat().st_size / 1e6:.1f} MB as .qem; "
              f"{fuse_request_limit()}")

        cats = [cat_once(qem) for _ in range(args.runs)]
        cat_s = min(cats)
        print(f"qem cat data.npy > /dev/null: fastest of {args.runs} {cat_s:.3f} s "
              f"(all: {', '.join(f'{x:.3f}' for x in cats)}), {dense / cat_s / 1e6:.0f} MB/s")

        checks = []
        for _ in range(args.runs):
            t = time.perf_counter()
            subprocess.run([BIN / "qem", "validate", qem], stdout=subprocess.DEVNULL, check=True)
            checks.append(time.perf_counter() - t)
        print(f"qem validate: fastest of {args.runs} {min(checks):.3f} s "
              f"(all: {', '.join(f'{x:.3f}' for x in checks)})")

        if os.geteuid() == 0 and Path("/dev/fuse").exists():
            reads = []
            for _ in range(args.runs):
                n, s, chunks, cpu, faults, readers, rss, decoded = chunk_read(src, args.cache_size)
                reads.append(s)
                if s == min(reads):
                    line = (f"{n / s / 1e6:.0f} MB/s ({cat_s / s * 100:.0f}% of qem cat's rate), "
                            f"{chunks} chunks, {decoded} blocks decoded; "
                            f"CPU: daemon {cpu:.2f} s ({faults} page faults), "
                            f"readers {readers:.2f} s; peak RSS {rss:.0f} MiB")
            chunks_s = min(reads)
            print(f"every data.zarr chunk through the mount (a fresh mount each), 2 processes: "
                  f"fastest of {args.runs} {chunks_s:.3f} s (all: "
                  f"{', '.join(f'{x:.3f}' for x in reads)}), " + line)

            from dask.distributed import Client, LocalCluster

            from dask_virtual_images import local_cluster

            plain = ("sum over the detector (plain uint64, a Dask array's sum)", plain_sum)
            exact = ("sum over the detector (the example's: exact uint32 widened, 128 MiB tasks)",
                     example_sum)
            copy = work / "copy.zarr"
            copy_view(src, copy)
            results = {}
            for label, start, sums, floor in [
                ("Dask's default worker environment",
                 lambda: LocalCluster(n_workers=2, threads_per_worker=1, processes=True), [plain],
                 False),
                ("the example's cluster (chunk buffers reused, 2 threads per worker)",
                 lambda: local_cluster(2), [plain, exact], True),
            ]:
                restore_environ()
                with start() as cluster, Client(cluster) as client:
                    # Workers import their libraries before the clock starts.
                    client.run(lambda: __import__("zarr") and __import__("numpy"))
                    got = dask_trials(client, src, args.cache_size, label, sums, chunks_s, cat_s,
                                      args.scan, args.runs)
                    if floor:
                        total, s, all_s, workers_cpu, here = dask_floor(
                            client, copy, example_sum, args.runs)
                        got["floor"] = total
                        print(f"Dask's floor, the example's exact sum over a copy of data.zarr in "
                              f"the page cache (no decoding, no FUSE), {label}: fastest of "
                              f"{args.runs} {s:.3f} s (all: {', '.join(f'{x:.3f}' for x in all_s)})"
                              f" ({s / chunks_s:.2f}x the chunk read); CPU: workers "
                              f"{workers_cpu:.2f} s, client and scheduler {here:.2f} s")
                for total in got.values():
                    results.setdefault("reference", total)
                    assert np.array_equal(total, results["reference"])
                restore_environ()
            if args.rounds:
                rounds(src, copy, args.cache_size, args.rounds)
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
