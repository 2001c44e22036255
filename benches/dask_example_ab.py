#!/usr/bin/env python3
"""The Dask example's sum over the detector through fresh mounts, versions
of the example alternated.

    .venv/bin/python benches/dask_example_ab.py SRC_FOLDER ROUNDS EXAMPLE.py [EXAMPLE.py ...]

SRC_FOLDER holds `scan.qem` (e.g. the file `QEM_BENCH_FILE=/tmp/a.qem cargo
bench --bench qem_decode -- 128` writes, copied there). On one local cluster
of the example's (2 worker processes, `examples/dask_virtual_images.py`'s
settings), each round mounts SRC_FOLDER afresh (`--cache-size 256`, an
empty block cache) for every EXAMPLE file in turn and computes its
`virtual_images(data, every pixel valid, pattern=False)` over
`scan.qem/data.zarr/data`, as `benches/zarr_view.py` times the example's
sum. Prints per run the wall time, the daemon's CPU time and the workers'
and the client's CPU time, then each example's median and fastest, and
checks that every example gives the same sums. Give an older version with
`git show REV:examples/dask_virtual_images.py > /tmp/old.py`. One warming
computation per example runs first. Needs root and /dev/fuse.
"""

import importlib
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benches"))
sys.path.insert(0, str(REPO / "examples"))

import zarr_view  # noqa: E402  (after the path)


def main() -> int:
    if len(sys.argv) < 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    src, rounds = Path(sys.argv[1]), int(sys.argv[2])
    files = [Path(p).resolve() for p in sys.argv[3:]]
    # Each version under a name of its own in a folder on the path, set
    # before the workers start: they import the task functions by name.
    folder = Path(tempfile.mkdtemp(prefix="dask-example-ab-"))
    sys.path.insert(0, str(folder))
    names = []
    for k, f in enumerate(files):
        shutil.copy(f, folder / f"example_{k}.py")
        names.append(f"{k}:{f.name}")
    examples = [importlib.import_module(f"example_{k}") for k in range(len(files))]
    zarr_view.restore_environ()
    from dask.distributed import Client

    times = {n: [] for n in names}
    try:
        with examples[0].local_cluster(2) as cluster, Client(cluster) as client:
            reference = None
            for warming in (True,) + (False,) * rounds:
                for name, example in zip(names, examples):
                    def reduce(source, example=example):
                        valid = np.ones(source.shape[2:], bool)
                        return example.virtual_images(source, valid, pattern=False)["sum"]

                    total, s, daemon, workers, _, client_cpu, _, _ = zarr_view.dask_once(
                        client, src, 256, reduce)
                    if reference is None:
                        reference = total
                    if not np.array_equal(total, reference):
                        print(f"{name}: sums differ from {names[0]}'s")
                        return 1
                    if warming:
                        continue
                    times[name].append(s)
                    print(f"{name}: {s:.3f} s; CPU: daemon {daemon:.2f} s, workers {workers:.2f} s, "
                          f"client and scheduler {client_cpu:.2f} s", flush=True)
    finally:
        zarr_view.restore_environ()
        shutil.rmtree(folder, ignore_errors=True)
    for name, t in times.items():
        print(f"{name}: median of {len(t)} {np.median(t):.3f} s, fastest {min(t):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
