#!/usr/bin/env python3
"""Mount under load: parallel readers against a mounted folder while one
source file is truncated and replaced underneath them.

    python3 benches/stress.py [--seconds 600] [--readers 16] [--cache-mib 256]

Needs root (or fuse permissions), /dev/fuse and `cargo build --release`.
Readers pick, at random, a frame, a range of data.npy, or a virtual image
of the example files and compare the bytes with `qem cat` of the same
path. A mutator truncates `victim.qem` in place and replaces it (rename)
with one of two different files, over and over; readers of the victim must
get an error (EIO, or ENOENT while it shows ERROR.txt) or exactly one
version's bytes, never a mix. The daemon's resident memory must stay
within the cache budget + 200 MB. Exit status 0 when everything held.
"""

import argparse
import errno
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The binaries: target/release, or QEMFS_BIN_DIR (the tests point it at
# their own target folder).
BIN = os.environ.get("QEMFS_BIN_DIR") or os.path.join(ROOT, "target", "release")
EXAMPLES = os.path.join(ROOT, "examples", "data")
QEM_FILES = ["scan-u16.qem", "empad-f32.qem", "derived-scaled.qem"]
VERSIONS = ["scan-u16.qem", "derived-scaled.qem"]
VICTIM_PATHS = ["data.npy", "info.json", "virtual/sum.png", "virtual/mean_dp.npy"]


def qem_cat(src, path):
    out = subprocess.run([os.path.join(BIN, "qem"), "cat", src, path], capture_output=True)
    if out.returncode != 0:
        raise RuntimeError(f"qem cat {src} {path}: {out.stderr.decode()}")
    return out.stdout


class References:
    """`qem cat` bytes, computed once per (file, path)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.bytes = {}

    def get(self, src, path):
        key = (src, path)
        with self.lock:
            if key in self.bytes:
                return self.bytes[key]
        data = qem_cat(src, path)
        with self.lock:
            self.bytes[key] = data
        return data


def frame_names(mnt, name):
    rows = sorted(os.listdir(os.path.join(mnt, name, "frames")))
    cols = sorted(os.listdir(os.path.join(mnt, name, "frames", rows[0])))
    return [f"frames/{r}/{c[:-4]}" for r in rows for c in cols if c.endswith(".npy")]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--readers", type=int, default=16)
    ap.add_argument("--cache-mib", type=int, default=256)
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="qemfs-stress-")
    src, mnt = os.path.join(work, "src"), os.path.join(work, "mnt")
    os.makedirs(src)
    os.makedirs(mnt)
    for name in QEM_FILES:
        shutil.copy(os.path.join(EXAMPLES, name), os.path.join(src, name))
    victim = os.path.join(src, "victim.qem")
    shutil.copy(os.path.join(EXAMPLES, VERSIONS[0]), victim)
    subprocess.run(
        [os.path.join(BIN, "qemfs"), "mount", src, mnt, "--cache-size", str(args.cache_mib),
         "--log-file", os.path.join(work, "qemfs.log")],
        check=True,
    )
    # The daemon names itself on the mount's root.
    pid = int(os.getxattr(mnt, "user.qemfs.pid"))
    refs = References()
    frames = {name: frame_names(mnt, name) for name in QEM_FILES}
    deadline = time.monotonic() + args.seconds
    stats = {"reads": 0, "bytes": 0, "victim_ok": 0, "victim_errors": 0, "mutations": 0}
    failures = []
    lock = threading.Lock()
    max_rss = [rss_mib(pid)]

    def fail(message):
        with lock:
            if len(failures) < 20:
                failures.append(message)

    def one_read(rng):
        name = rng.choice(QEM_FILES)
        kind = rng.random()
        if kind < 0.5:
            rel = rng.choice(frames[name]) + rng.choice([".npy", ".tiff"])
            got = open(os.path.join(mnt, name, rel), "rb").read()
            want = refs.get(os.path.join(src, name), rel)
        elif kind < 0.8:
            rel = "data.npy"
            whole = refs.get(os.path.join(src, name), rel)
            start = rng.randrange(len(whole))
            length = min(rng.choice([4096, 65536, 1 << 20, 3 << 20]), len(whole) - start)
            fd = os.open(os.path.join(mnt, name, rel), os.O_RDONLY)
            try:
                got = os.pread(fd, length, start)
            finally:
                os.close(fd)
            want = whole[start:start + length]
        else:
            rel = rng.choice(["virtual/bf.npy", "virtual/com_row.npy", "virtual/mean_dp.npy",
                              "virtual/max_dp.png", "virtual/detectors.json",
                              "virtual/disk-20-30-5.npy", "logical_sha256"])
            got = open(os.path.join(mnt, name, rel), "rb").read()
            want = refs.get(os.path.join(src, name), rel)
        if got != want:
            fail(f"{name}/{rel}: {len(got)} bytes differ from qem cat ({len(want)})")
        with lock:
            stats["reads"] += 1
            stats["bytes"] += len(got)

    def victim_read(rng):
        rel = rng.choice(VICTIM_PATHS)
        try:
            got = open(os.path.join(mnt, "victim.qem", rel), "rb").read()
        except OSError as e:
            if e.errno in (errno.EIO, errno.ENOENT, errno.ENOTDIR):
                with lock:
                    stats["victim_errors"] += 1
                return
            fail(f"victim.qem/{rel}: unexpected error {e}")
            return
        if not any(got == refs.get(os.path.join(EXAMPLES, v), rel) for v in VERSIONS):
            fail(f"victim.qem/{rel}: {len(got)} bytes match no version (a stale mix?)")
        with lock:
            stats["victim_ok"] += 1

    def reader(seed):
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            try:
                if rng.random() < 0.15:
                    victim_read(rng)
                else:
                    one_read(rng)
            except Exception as e:  # noqa: BLE001 - every failure is reported
                fail(f"reader {seed}: {e!r} {getattr(e, 'filename', '')}")

    def mutator():
        rng = random.Random(7)
        k = 0
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.2, 1.0))
            size = os.path.getsize(victim)
            os.truncate(victim, rng.randrange(size // 8, size))
            time.sleep(rng.uniform(0.1, 0.5))
            k += 1
            tmp = os.path.join(src, ".victim.tmp")
            shutil.copy(os.path.join(EXAMPLES, VERSIONS[k % 2]), tmp)
            os.rename(tmp, victim)
            with lock:
                stats["mutations"] += 1

    def monitor():
        while time.monotonic() < deadline:
            max_rss[0] = max(max_rss[0], rss_mib(pid))
            time.sleep(0.2)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(args.readers)]
    threads += [threading.Thread(target=mutator), threading.Thread(target=monitor)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    alive = os.path.exists(f"/proc/{pid}")
    subprocess.run([os.path.join(BIN, "qemfs"), "unmount", mnt])
    budget = args.cache_mib + 200
    print(f"{elapsed:.0f} s, {args.readers} readers: {stats['reads']} reads "
          f"({stats['bytes'] / 1e6:.0f} MB, {stats['reads'] / elapsed:.0f}/s); victim: "
          f"{stats['victim_ok']} consistent reads, {stats['victim_errors']} errors, "
          f"{stats['mutations']} truncate+replace cycles; daemon max RSS {max_rss[0]:.0f} MiB "
          f"(budget {budget} MiB)")
    if not alive:
        failures.append("the daemon died")
    if max_rss[0] > budget:
        failures.append(f"resident memory {max_rss[0]:.0f} MiB over {budget} MiB")
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
