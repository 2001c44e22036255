#!/usr/bin/env python3
"""The mount's one budget under many readers of large files: the daemon's
peak resident memory while 16 readers read, whole and at random, the
decoded arrays of large acquisitions, the `vectors.npy` of a large `.semq`
and the virtual images of many containers.

    .venv/bin/python benches/large_readers.py [--seconds 120] [--readers 16]
        [--cache-mib 256] [--acquisitions 3] [--containers 200]

Needs root (or fuse permissions), /dev/fuse, `cargo build --release` and
numpy. The sources are made first (numpy arrays converted with `qem
convert`, unit vectors encoded with `semq encode`); every byte read is
compared with what the source says it must be (the SHA-256 that `qem hash`
prints for a whole array, numpy's own array for `vectors.npy`, `qem cat`
for the rest). Prints the daemon's peak RSS (VmHWM) against the budget +
200 MB and exits 1 when it is over, or when any read was wrong.
"""

import argparse
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("QEMFS_BIN_DIR") or os.path.join(ROOT, "target", "release")
EXAMPLES = os.path.join(ROOT, "examples", "data")
SMALL = ["scan-u16.qem", "empad-f32.qem", "derived-scaled.qem"]
IMAGES = ["virtual/bf.npy", "virtual/adf.npy", "virtual/sum.npy", "virtual/mean_dp.npy",
          "virtual/com_row.npy", "virtual/max_dp.png", "virtual/disk-20-30-5.npy"]


def tool(name, *args, **kw):
    return subprocess.run([os.path.join(BIN, name), *map(str, args)], check=True,
                          capture_output=True, **kw).stdout


def low_dose(path, shape, seed):
    """A uint16 4-D .npy of Poisson counts (mean 0.3), written in pieces."""
    rng = np.random.default_rng(seed)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=shape)
    for r in range(shape[0]):
        out[r] = rng.poisson(0.3, size=shape[1:]).astype(np.uint16)
    out.flush()
    del out


def unit_vectors(path, n, dim, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    np.save(path, x)


def peak_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--readers", type=int, default=16)
    ap.add_argument("--cache-mib", type=int, default=256)
    ap.add_argument("--acquisitions", type=int, default=3,
                    help="128x128 x 128x128 uint16 files (537 MB decoded each)")
    ap.add_argument("--containers", type=int, default=200,
                    help="copies of the small example files")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="qemfs-large-")
    src, mnt = os.path.join(work, "src"), os.path.join(work, "mnt")
    os.makedirs(src)
    os.makedirs(mnt)
    try:
        t0 = time.monotonic()
        large = []
        for k in range(args.acquisitions):
            npy = os.path.join(work, "a.npy")
            low_dose(npy, (128, 128, 128, 128), seed=k)
            name = f"large-{k}.qem"
            tool("qem", "convert", npy, os.path.join(src, name))
            os.unlink(npy)
            digest = tool("qem", "hash", os.path.join(src, name)).split()[0].decode()
            large.append((name, digest))
        vectors = os.path.join(work, "v.npy")
        unit_vectors(vectors, 262144, 256, seed=1)
        ids = os.path.join(work, "ids.npy")
        np.save(ids, np.arange(262144, dtype=np.uint64) * 3)
        semq = os.path.join(src, "big.semq")
        tool("semq", "encode", "--op", "quant", "--dim", 256, "--bins", 2, "--vectors", vectors,
             "--ids", ids, semq)
        os.unlink(vectors)
        reference = os.path.join(work, "reference.npy")
        tool("semq", "convert", semq, reference, "--what", "vectors")
        with open(reference, "rb") as f:
            want_vectors = hashlib.file_digest(f, "sha256").hexdigest()
        os.unlink(reference)
        small = []
        for k in range(args.containers):
            name = f"c{k:04d}-{SMALL[k % len(SMALL)]}"
            shutil.copy(os.path.join(EXAMPLES, SMALL[k % len(SMALL)]), os.path.join(src, name))
            small.append(name)
        refs = {(s, p): tool("qem", "cat", os.path.join(EXAMPLES, s), p)
                for s in SMALL for p in IMAGES}
        print(f"sources made in {time.monotonic() - t0:.0f} s", flush=True)

        subprocess.run([os.path.join(BIN, "qemfs"), "mount", src, mnt, "--cache-size",
                        str(args.cache_mib), "--gpu", "off", "--log-file",
                        os.path.join(work, "qemfs.log")], check=True)
        pid = int(os.getxattr(mnt, "user.qemfs.pid"))
        deadline = time.monotonic() + args.seconds
        lock = threading.Lock()
        stats = {"whole arrays": 0, "ranges": 0, "vectors": 0, "images": 0, "bytes": 0}
        failures = []

        def count(kind, n):
            with lock:
                stats[kind] += 1
                stats["bytes"] += n

        def fail(message):
            with lock:
                if len(failures) < 20:
                    failures.append(message)

        def whole_array(rng):
            name, digest = rng.choice(large)
            with open(os.path.join(mnt, name, "data.npy"), "rb") as f:
                head = f.read(10)
                f.seek(10 + int.from_bytes(head[8:10], "little"))
                h, n = hashlib.sha256(), 0
                while block := f.read(4 << 20):
                    h.update(block)
                    n += len(block)
            if h.hexdigest() != digest:
                fail(f"{name}/data.npy: the array's SHA-256 is not qem hash's")
            count("whole arrays", n)

        def array_range(rng):
            name, _ = rng.choice(large)
            path = os.path.join(mnt, name, "data.npy")
            size = os.path.getsize(path)
            start = rng.randrange(size - (1 << 20))
            fd = os.open(path, os.O_RDONLY)
            try:
                got = os.pread(fd, 1 << 20, start)
            finally:
                os.close(fd)
            if len(got) != 1 << 20:
                fail(f"{name}/data.npy: short read at {start}")
            count("ranges", len(got))

        def whole_vectors(rng):
            h, n = hashlib.sha256(), 0
            with open(os.path.join(mnt, "big.semq", "vectors.npy"), "rb") as f:
                while block := f.read(4 << 20):
                    h.update(block)
                    n += len(block)
            if h.hexdigest() != want_vectors:
                fail("big.semq/vectors.npy differs from semq convert's")
            count("vectors", n)

        def image(rng):
            name = rng.choice(small)
            rel = rng.choice(IMAGES)
            got = open(os.path.join(mnt, name, rel), "rb").read()
            if got != refs[(name.split("-", 1)[1], rel)]:
                fail(f"{name}/{rel} differs from qem cat")
            count("images", len(got))

        kinds = [(0.25, whole_array), (0.25, array_range), (0.1, whole_vectors), (0.4, image)]

        def reader(seed):
            rng = random.Random(seed)
            while time.monotonic() < deadline:
                r, acc = rng.random(), 0.0
                for weight, read in kinds:
                    acc += weight
                    if r < acc:
                        break
                try:
                    read(rng)
                except Exception as e:  # noqa: BLE001 - every failure is reported
                    fail(f"reader {seed}: {e!r}")

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(args.readers)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
        peak = peak_mib(pid)
        subprocess.run([os.path.join(BIN, "qemfs"), "unmount", mnt])
        limit = args.cache_mib + 200
        print(f"{elapsed:.0f} s, {args.readers} readers, {args.acquisitions} acquisitions of "
              f"537 MB, a 256 MiB vectors.npy, {args.containers} small containers: "
              + ", ".join(f"{v} {k}" for k, v in stats.items() if k != "bytes")
              + f", {stats['bytes'] / 1e9:.1f} GB read")
        print(f"daemon peak RSS {peak:.0f} MiB (limit {limit} = budget {args.cache_mib} + 200); "
              f"load {os.getloadavg()[0]:.1f}")
        for f in failures:
            print("FAIL", f)
        return 0 if not failures and peak <= limit else 1
    finally:
        if os.path.ismount(mnt):
            subprocess.run([os.path.join(BIN, "qemfs"), "unmount", mnt])
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
