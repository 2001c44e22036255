"""`qem convert` timed for two or more builds, alternated in the same
minutes (this host's speed drifts from one minute to the next, so builds
timed apart cannot be compared). Each job is a source and an output
suffix; every round runs every job with every binary in turn. Prints per
binary and job the median wall seconds, CPU seconds and minor page faults.

    .venv/bin/python benches/convert_ab.py --qem OLD/qem --qem NEW/qem \
        [--rounds 5] SOURCE:SUFFIX [SOURCE:SUFFIX ...]

e.g. `scan.npy:qem scan.qem:zarr`: npy -> .qem and .qem -> Zarr store.
Outputs go to a temporary folder and are removed after each run.
"""

import argparse
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def one(qem: Path, source: Path, out: Path):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    subprocess.run([str(qem), "convert", str(source), str(out)], check=True, capture_output=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, after.ru_minflt - before.ru_minflt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qem", type=Path, action="append", required=True, help="binary to time (repeatable)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("jobs", nargs="+", help="SOURCE:SUFFIX, e.g. scan.npy:qem")
    args = ap.parse_args()
    jobs = [(Path(j.rsplit(":", 1)[0]), j.rsplit(":", 1)[1]) for j in args.jobs]
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for _ in range(args.rounds):
            for qem in args.qem:
                for source, suffix in jobs:
                    out = Path(work) / f"out.{suffix}"
                    results.setdefault((str(qem), f"{source.name} -> .{suffix}"), []).append(one(qem, source, out))
                    if out.is_dir():
                        shutil.rmtree(out)
                    else:
                        out.unlink()
    for (qem, job), runs in results.items():
        wall, cpu, faults = (statistics.median(r[i] for r in runs) for i in range(3))
        print(f"{qem}  {job}: wall {wall:.3f} s, cpu {cpu:.3f} s, minor faults {faults:.0f} (median of {len(runs)})")


if __name__ == "__main__":
    main()
