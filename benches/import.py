"""Import throughput of `qem convert` from the detector formats (issue 17's
targets: DECTRIS ARINA bitshuffle-LZ4 >= 300 MB/s, EMPAD and Merlin MIB
>= 400 MB/s of dense data on 2 cores), and from generic HDF5 datasets
(`FILE.h5:/data`) compressed with hdf5plugin's Bitshuffle-LZ4, Zstd and
Blosc, with peak RSS.

The sources are written by the same field writers the client tests use
(h5py + hdf5plugin for the ARINA master and data files; EMPAD and MIB to
their published layouts by the tests' writers), in a temporary folder:

    .venv/bin/python benches/import.py [--frames-side 64] [--keep DIR]
                                       [--only arina|empad|mib|hdf5] [--runs 3]
                                       [--qem BINARY ...]

Each source is converted three times; the best wall time counts. Prints
one line per format: dense MB, best wall seconds, MB/s, that run's CPU
seconds and the largest peak RSS of the `qem` process (GNU time).
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "clients"))

import test_convert_dectris as dectris  # noqa: E402
import test_convert_empad as empad  # noqa: E402
import test_convert_mib as mib  # noqa: E402

QEM = ROOT / "target" / "release" / "qem"


def low_dose(n, h, w, seed):
    """Counts like a fast pixelated detector's: a bright disk, sparse elsewhere."""
    rng = np.random.default_rng(seed)
    y, x = np.indices((h, w))
    rate = np.where((y - h / 2) ** 2 + (x - w / 2) ** 2 < (h / 6) ** 2, 40.0, 0.05)
    return rng.poisson(rate, size=(n, h, w)).astype(np.uint16)


FORMATS = ("arina", "empad", "mib", "hdf5")


def sources(folder, side, only=FORMATS):
    n = side * side
    if "arina" in only:
        yield arina(folder, side, n)
    if "empad" in only:
        yield empad_source(folder, side)
    if "mib" in only:
        yield mib_source(folder, side, n)
    if "hdf5" in only:
        yield from hdf5_sources(folder, side, n)


def arina(folder, side, n):
    # ARINA: 192x192 uint16, one frame per bitshuffle-LZ4 chunk, 4 data files.
    dectris.H, dectris.W = 192, 192  # the writer's chunk shape follows them
    frames = low_dose(n, 192, 192, 1)
    (folder / "arina").mkdir()
    master = dectris.write_dectris(folder / "arina", np.array_split(frames, 4))
    return "DECTRIS ARINA (bitshuffle-LZ4)", master, frames.nbytes, ["--scan", f"{side},{side}"]


def empad_source(folder, side):
    # EMPAD: 128x130 float32 frames (the last two rows per-frame metadata).
    raw = np.random.default_rng(2).normal(50, 20, size=(side, side, 130, 128)).astype("<f4")
    (folder / "empad").mkdir()
    xml = empad.write_empad(folder / "empad", raw)
    return "EMPAD (float32)", xml, side * side * 128 * 128 * 4, []


def mib_source(folder, side, n):
    # Merlin: 256x256 12-bit counts, non-raw U16 (the common setting).
    counts = low_dose(n, 256, 256, 3).reshape(side, side, 256, 256)
    (folder / "mib").mkdir()
    src = mib.write_mib(folder / "mib", counts, "U16", 12)
    return "Merlin MIB (U16, 12-bit)", src, counts.nbytes, []


def hdf5_sources(folder, side, n):
    # 128x128 uint16 frames, chunks of one scan row, as h5py + hdf5plugin
    # write them; decoded by qem's in-process filters.
    import h5py
    import hdf5plugin

    frames = low_dose(n, 128, 128, 4).reshape(side, side, 128, 128)
    for name, compression in [("Bitshuffle-LZ4", hdf5plugin.Bitshuffle(cname="lz4")),
                              ("Zstd", hdf5plugin.Zstd()),
                              ("Blosc-LZ4", hdf5plugin.Blosc(cname="lz4", shuffle=hdf5plugin.Blosc.SHUFFLE))]:
        path = folder / f"{name}.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("data", data=frames, chunks=(1, side, 128, 128), **compression)
        yield f"HDF5 {name}", f"{path}:/data", frames.nbytes, []


def convert(src, out, flags, qem=QEM):
    """(wall s, CPU s, peak RSS MiB) of one `qem convert`, by GNU time."""
    report = out.with_suffix(".time")
    subprocess.run(
        ["/usr/bin/time", "-o", report, "-f", "%e %U %S %M", qem, "convert", src, out, *flags],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wall, user, system, rss_kb = report.read_text().split()[-4:]
    out.unlink()
    return float(wall), float(user) + float(system), int(rss_kb) / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames-side", type=int, default=64, help="scan is SIDE x SIDE frames")
    ap.add_argument("--keep", type=Path, help="write the sources here and keep them")
    ap.add_argument("--only", choices=FORMATS, action="append", help="this format only (repeatable)")
    ap.add_argument("--runs", type=int, default=3, help="conversions per source; the best counts")
    ap.add_argument("--qem", type=Path, action="append", help="binary to time (repeatable, to compare builds in the same minutes; default target/release/qem)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.keep) as tmp:
        folder = Path(tmp)
        binaries = args.qem or [QEM]
        for name, src, dense, flags in sources(folder, args.frames_side, args.only or FORMATS):
            runs = {qem: [] for qem in binaries}
            for _ in range(args.runs):
                # Binaries interleaved, so that they share the machine's load.
                for qem in binaries:
                    runs[qem].append(convert(src, folder / "out.qem", flags, qem))
            for qem, done in runs.items():
                wall, cpu, _ = min(done)
                peak = max(r[2] for r in done)
                label = name if len(binaries) == 1 else f"{name} [{qem.parent.name}/{qem.name}]"
                print(
                    f"{label:32s} {dense / 1e6:7.0f} MB  {wall:6.2f} s  {dense / 1e6 / wall:6.0f} MB/s"
                    f"  cpu {cpu:5.2f} s  peak RSS {peak:5.0f} MiB  load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
