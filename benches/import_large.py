"""Import of a large acquisition with `qem convert`: throughput and peak RSS
on dense, non-zero data (issue 17: every import streams, peak RSS <= 1 GiB
for a 20 GB source).

    .venv/bin/python benches/import_large.py --gb 20 [--format npy|empad] [--dir DIR]

`npy` (the default) is a 4-D uint16 `.npy` of 256 x 256 low-dose frames
(Poisson counts, a bright disk on a sparse background, as benches/import.py
draws them), written with numpy through `np.lib.format.open_memmap` block by
block, so the source is never held in memory. `empad` is an EMPAD
`.xml` + `.raw` of the same dense size (128 x 130 float32 frames, the XML
by the client tests' writer). Drawing 20 GB of random numbers would take
longer than converting them: each block is assembled from a pool of frames
drawn once, picked at random and rolled by a random shift, so the data
stays varied.

The scan is the square nearest to the requested size. The source and the
output (the writer spools its body into the output's own temporary file)
need about 1.6 times the size on disk; the script refuses to start
without that much free space. It
converts once under GNU time (`/usr/bin/time -v`), prints dense MB, wall
seconds, MB/s, CPU seconds and peak RSS, and removes everything it wrote.
"""

import argparse
import importlib
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benches"))
sys.path.insert(0, str(ROOT / "tests" / "clients"))

bench = importlib.import_module("import")  # benches/import.py: the low-dose model
import test_convert_empad as empad  # noqa: E402

QEM = ROOT / "target" / "release" / "qem"
POOL = 256
BLOCK = 256  # frames written at a time


def pooled_blocks(frames, pool, seed):
    """`frames` frames in blocks of BLOCK: pool frames picked at random, each
    block rolled by a random shift."""
    rng = np.random.default_rng(seed)
    h, w = pool.shape[1:3]
    for start in range(0, frames, BLOCK):
        picks = rng.integers(0, len(pool), min(BLOCK, frames - start))
        shift = (int(rng.integers(0, h)), int(rng.integers(0, w)))
        yield start, np.roll(pool[picks], shift, axis=(1, 2))


def write_npy(folder, side):
    """A (side, side, 256, 256) uint16 .npy of low-dose counts, streamed."""
    path = folder / "large.npy"
    out = np.lib.format.open_memmap(path, mode="w+", dtype="<u2", shape=(side, side, 256, 256))
    flat = out.reshape(side * side, 256, 256)
    pool = bench.low_dose(POOL, 256, 256, 7)
    for start, block in pooled_blocks(side * side, pool, 8):
        flat[start : start + len(block)] = block
    out.flush()
    del flat, out
    return path, side * side * 256 * 256 * 2


class StreamedRaw:
    """What the tests' EMPAD writer needs of its `raw` argument (shape and
    tofile), writing the 130-row float32 frames block by block."""

    def __init__(self, side):
        self.shape = (side, side, 130, 128)

    def tofile(self, path):
        side = self.shape[0]
        raw = np.memmap(path, mode="w+", dtype="<f4", shape=(side * side, 130, 128))
        pool = np.random.default_rng(9).normal(50, 20, size=(POOL, 130, 128)).astype("<f4")
        for start, block in pooled_blocks(side * side, pool, 10):
            raw[start : start + len(block)] = block
        raw.flush()
        del raw


def write_empad(folder, side):
    return empad.write_empad(folder, StreamedRaw(side)), side * side * 128 * 128 * 4


def convert(src, out):
    """(wall s, CPU s, peak RSS MiB) of one `qem convert`, from GNU time -v."""
    done = subprocess.run(
        ["/usr/bin/time", "-v", QEM, "convert", src, out],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    report = done.stderr

    def field(name):
        return re.search(rf"{re.escape(name)}: (.+)", report).group(1).strip()

    parts = [float(p) for p in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")]
    wall = sum(p * 60**i for i, p in enumerate(reversed(parts)))
    cpu = float(field("User time (seconds)")) + float(field("System time (seconds)"))
    return wall, cpu, int(field("Maximum resident set size (kbytes)")) / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=20.0, help="dense size of the source in GB (1e9 bytes)")
    ap.add_argument("--format", choices=("npy", "empad"), default="npy")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: the system temp folder)")
    args = ap.parse_args()
    frame = 256 * 256 * 2 if args.format == "npy" else 128 * 128 * 4
    side = max(1, round(math.sqrt(args.gb * 1e9 / frame)))
    dense = side * side * frame
    where = args.dir or Path(tempfile.gettempdir())
    free = shutil.disk_usage(where).free
    if free < 1.6 * dense:
        sys.exit(f"{where}: {free / 1e9:.1f} GB free, {1.6 * dense / 1e9:.1f} GB needed; use --dir or a smaller --gb")
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        src, dense = (write_npy if args.format == "npy" else write_empad)(folder, side)
        print(f"wrote {src.name}: {side}x{side} frames, {dense / 1e9:.2f} GB dense, in {time.perf_counter() - t0:.0f} s", flush=True)
        wall, cpu, rss = convert(src, folder / "out.qem")
        ratio = (folder / "out.qem").stat().st_size / dense
        print(
            f"{args.format:5s} {dense / 1e6:8.0f} MB  {wall:7.2f} s  {dense / 1e6 / wall:6.0f} MB/s"
            f"  cpu {cpu:7.2f} s  peak RSS {rss:6.0f} MiB  output {ratio:.2f} x dense",
            flush=True,
        )


if __name__ == "__main__":
    main()
