#!/usr/bin/env python3
"""Virtual images of a .qem acquisition on a Dask cluster, from its Zarr view.

Every container of a qemfs mount holds `data.zarr/`, a chunked Zarr group:
each chunk is a run of scan positions (one of the file's 512-scan blocks
where the scan shape allows) with whole detector frames, decoded by the
mount when a worker reads it. Dask splits the work by those chunks, so each
worker decodes only the blocks of its own chunks.

On one machine (a local cluster of worker processes):

    qemfs mount data/ /mnt/qem
    python3 examples/dask_virtual_images.py /mnt/qem/scan.qem --workers 2 --out results/

On a cluster, mount the same shared folder at the same path on every node
(`qemfs mount /shared/data /mnt/qem` on each), start `dask scheduler` and
`dask worker tcp://SCHEDULER:8786` as usual, then:

    python3 examples/dask_virtual_images.py /mnt/qem/scan.qem --scheduler tcp://SCHEDULER:8786

It computes the total valid counts per scan position (`sum`), a bright-field
disk image (`bf`, the disk of `virtual/detectors.json` unless --center and
--radius are given) and the mean diffraction pattern (`mean_dp`, 0 at invalid
pixels; invalid pixels count in no product), writes them
as .npy files to --out, and with --check compares them with the mount's own
`virtual/sum.npy`, `virtual/bf.npy` and `virtual/mean_dp.npy` (exit 1 when
they differ). A pixel belongs to the disk when its centre (integer row,
column) is within the radius, edge included, as in `detectors.json`.
Without a mount (a cluster node, a container without /dev/fuse), convert
the file to a Zarr store once, where FUSE is available or not, and point the
example at the store, with the bright-field disk from `qem cat`:

    qem convert scan.qem scan.zarr --zarr-shard-mib 64
    qem cat scan.qem virtual/detectors.json > detectors.json
    python3 examples/dask_virtual_images.py scan.zarr --detectors detectors.json

(or --center/--radius). A copy of a mount's `data.zarr` works the same way.
Dask's unit of work is one Zarr chunk, or one shard for a sharded store: a
worker then reads a shard's file once instead of once per inner chunk.
"""

import argparse
import json
import sys
from pathlib import Path

import dask.array as da
import numpy as np
import zarr
from dask.distributed import Client, LocalCluster


def disk_mask(shape, center, radius):
    rows, cols = np.indices(shape, dtype=np.float64)
    d = np.hypot(rows - center[0], cols - center[1])
    # The edge belongs to the disk; 1e-9 absorbs the radius's rounding.
    return d <= radius + 1e-9


def compute(zarr_path: Path, center, radius):
    group = zarr.open_group(str(zarr_path), mode="r", zarr_format=3)
    source = group["data"]
    # A sharded store is read shard by shard: one task per file.
    data = da.from_zarr(source, chunks=source.shards or source.chunks)
    detector = source.shape[2:]
    valid = np.asarray(group["mask"][:]) if "mask" in group else np.ones(detector, bool)
    integer = np.issubdtype(source.dtype, np.integer)
    acc = np.uint64 if integer else np.float64
    # Reductions over the detector, chunk by chunk on the workers.
    total = da.sum(da.where(valid, data, 0), axis=(2, 3), dtype=acc)
    bf_mask = disk_mask(detector, center, radius) & valid
    bf = da.sum(da.where(bf_mask, data, 0), axis=(2, 3), dtype=acc)
    frames = source.shape[0] * source.shape[1]
    mean_dp = da.sum(data, axis=(0, 1), dtype=np.float64) / frames
    total, bf, mean_dp = da.compute(total, bf, mean_dp)
    # Invalid pixels read 0 in the mount's mean pattern, as in every product.
    mean_dp = np.where(valid, mean_dp, 0).astype(np.float32)
    return {"sum": total, "bf": bf, "mean_dp": mean_dp}


def compare(results, virtual: Path) -> bool:
    same = True
    for name, ours in results.items():
        theirs = np.load(virtual / f"{name}.npy")
        if name == "mean_dp" or not np.issubdtype(ours.dtype, np.integer):
            ok = np.allclose(ours, theirs, rtol=1e-6, atol=1e-6, equal_nan=True)
        else:
            # Counts are exact: the mount's image must hold the same integers.
            ok = np.array_equal(ours.astype(np.float64), theirs.astype(np.float64))
        print(f"{name}: {'equal to' if ok else 'DIFFERS from'} virtual/{name}.npy")
        same &= ok
    return same


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", type=Path, help="a mounted NAME.qem folder, or a data.zarr folder")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--scheduler", help="address of a running Dask scheduler")
    where.add_argument("--workers", type=int, default=2, help="local worker processes (default 2)")
    p.add_argument("--center", type=float, nargs=2, metavar=("ROW", "COLUMN"))
    p.add_argument("--radius", type=float)
    p.add_argument("--detectors", type=Path, metavar="JSON",
                   help="take the disk from this detectors.json "
                        "(`qem cat FILE virtual/detectors.json`) when PATH is a store")
    p.add_argument("--out", type=Path, help="write sum.npy, bf.npy, mean_dp.npy here")
    p.add_argument("--check", action="store_true", help="compare with the mount's virtual/ images")
    args = p.parse_args()

    container = args.path if (args.path / "data.zarr").is_dir() else None
    zarr_path = container / "data.zarr" if container else args.path
    center, radius = args.center, args.radius
    if center is None or radius is None:
        geometry_file = args.detectors or (container / "virtual" / "detectors.json"
                                           if container else None)
        if geometry_file is None:
            p.error("give --detectors, or --center and --radius, when PATH is not a mounted container")
        geometry = json.loads(geometry_file.read_text())
        center = center or geometry["center"]
        radius = radius if radius is not None else geometry["bright_field_radius"]
    if args.check and container is None:
        p.error("--check needs a mounted container")

    if args.scheduler:
        client = Client(args.scheduler)
    else:
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True)
        client = Client(cluster)
    with client:
        results = compute(zarr_path, center, radius)
    for name, values in results.items():
        print(f"{name}: shape {values.shape} {values.dtype}")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            np.save(args.out / f"{name}.npy", values)
    if args.check:
        return 0 if compare(results, container / "virtual") else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
