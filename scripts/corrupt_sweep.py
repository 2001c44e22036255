#!/usr/bin/env python3
"""Corrupts inputs written by the field's own writers and converts each one:
`qem convert` must end with exit 0 or 2 (never a panic, an abort or a hang).

    .venv/bin/python scripts/corrupt_sweep.py [--format zarr|tiff|hdf5] [-n 400] [--seed 1] [--qem BIN]

Seeds: Zarr v2 (blosc, zlib) and v3 (zstd, blosc, sharded) stores written by
zarr-python, TIFF stacks (plain, deflate, tiled) by tifffile, HDF5 datasets
(plain, gzip) by h5py. Each case flips, sets or truncates a few bytes of one
file (for Zarr, a chunk or, one time in five, its metadata), then converts
with a 20 s limit. Prints the count of each exit status and keeps every
input that ended otherwise (as bad_*) in the work folder, which it names.
"""

import argparse
import collections
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def seeds(kind, folder):
    """(path to corrupt, extra convert flags, dataset suffix) per seed."""
    a = (np.arange(4 * 4 * 16 * 16) % 300).astype(np.uint16).reshape(4, 4, 16, 16)
    out = []
    if kind == "zarr":
        import numcodecs
        import zarr

        for name, kw in [("v2blosc", dict(compressor=numcodecs.Blosc(cname="lz4", shuffle=2))),
                         ("v2zlib", dict(compressor=numcodecs.Zlib()))]:
            z = zarr.open_array(str(folder / f"{name}.zarr"), mode="w", zarr_format=2, shape=a.shape,
                                chunks=(2, 2, 16, 16), dtype=a.dtype, **kw)
            z[:] = a
            out.append((folder / f"{name}.zarr", [], ""))
        for name, kw in [("v3zstd", dict(chunks=(2, 2, 16, 16))),
                         ("v3blosc", dict(chunks=(2, 2, 16, 16), compressors=[zarr.codecs.BloscCodec()])),
                         ("v3shard", dict(chunks=(1, 2, 16, 16), shards=(2, 4, 16, 16)))]:
            z = zarr.create_array(str(folder / f"{name}.zarr"), shape=a.shape, dtype=a.dtype, zarr_format=3, **kw)
            z[:] = a
            out.append((folder / f"{name}.zarr", [], ""))
    elif kind == "tiff":
        import tifffile

        frames = a.reshape(16, 16, 16)
        for name, kw in [("plain", {}), ("deflate", dict(compression="zlib")),
                         ("tiled", dict(tile=(16, 16), compression="zlib"))]:
            tifffile.imwrite(folder / f"{name}.tif", frames, **kw)
            out.append((folder / f"{name}.tif", ["--scan", "4,4"], ""))
    else:
        import h5py

        for name, kw in [("plain", {}), ("gzip", dict(chunks=(1, 1, 16, 16), compression="gzip"))]:
            with h5py.File(folder / f"{name}.h5", "w") as f:
                f.create_dataset("data", data=a, **kw)
            out.append((folder / f"{name}.h5", [], ":/data"))
    return out


def corrupt(path, rng):
    """Flips, sets or truncates a few bytes of one file under `path`."""
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    meta = [p for p in files if p.name in ("zarr.json", ".zarray")]
    pick = meta if meta and rng.random() < 0.2 else [p for p in files if p not in meta] or files
    target = rng.choice(sorted(pick))
    b = bytearray(target.read_bytes())
    for _ in range(rng.choice([1, 2, 4, 8, 32]) if b else 0):
        k = rng.randrange(len(b))
        r = rng.random()
        if r < 0.5:
            b[k] = rng.randrange(256)
        elif r < 0.8:
            b[k] ^= 1 << rng.randrange(8)
        else:
            b[k] = rng.choice([0, 0xFF, 0x7F, 0x80])
    if b and rng.random() < 0.1:
        b = b[: rng.randrange(len(b))]
    target.write_bytes(bytes(b))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", choices=["zarr", "tiff", "hdf5"], default="zarr")
    ap.add_argument("-n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--qem", type=Path, default=ROOT / "target" / "release" / "qem")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    folder = Path(tempfile.mkdtemp(prefix=f"corrupt-{args.format}-"))
    cases = seeds(args.format, folder)
    counts = collections.Counter()
    for i in range(args.n):
        src, flags, suffix = rng.choice(cases)
        work = folder / f"case{src.suffix}"
        shutil.rmtree(work, ignore_errors=True) if work.is_dir() else work.unlink(missing_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, work)
        corrupt(work, rng)
        out = folder / "out.qem"
        try:
            rc = subprocess.run([args.qem, "convert", f"{work}{suffix}", out, *flags],
                                capture_output=True, timeout=20).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        out.unlink(missing_ok=True)
        counts[rc] += 1
        if rc not in (0, 2):
            (shutil.copytree if work.is_dir() else shutil.copy)(work, folder / f"bad_{i}_{rc}{src.suffix}")
    print(f"{args.format}: {args.n} corrupted inputs, exit statuses {dict(counts)}; work folder {folder}")
    if set(counts) - {0, 2}:
        raise SystemExit(1)
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
