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
the workers with the malloc settings of `worker_environment()` and the
threads of `THREADS_PER_WORKER` below (they say why; a local cluster gets
them without asking):

    MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864 \
        dask worker --nthreads 2 tcp://SCHEDULER:8786

then:

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

import dask
import numpy as np
import zarr
from dask.distributed import Client, LocalCluster
from dask.utils import parse_bytes


def disk_mask(shape, center, radius):
    rows, cols = np.indices(shape, dtype=np.float64)
    d = np.hypot(rows - center[0], cols - center[1])
    # The edge belongs to the disk; 1e-9 absorbs the radius's rounding.
    return d <= radius + 1e-9


# glibc's largest mmap threshold on 64-bit Linux (half its 64 MiB heap).
HEAP_BUFFER_MAX = 32 << 20


def worker_environment() -> dict:
    """Environment variables for worker processes that read chunk after chunk.

    Dask starts its workers with MALLOC_TRIM_THRESHOLD_=65536, so that freed
    memory goes back to the system; setting it also stops glibc from raising
    its mmap threshold, so every chunk-sized buffer (the bytes zarr-python
    reads a 16 MiB chunk into, the array it copies them to) is a fresh mmap,
    faulted in page by page and unmapped when freed: about 4,400 page faults
    a chunk, and 1.5-2x a worker's CPU time for the same work. Buffers up
    to 32 MiB come from the heap instead and are reused (larger ones, such
    as a 64 MiB shard, are still mapped afresh); at most 64 MiB is
    kept free per heap (a worker's resident memory stays about 50 MB higher
    after a computation, its peak hardly changes). Variables already set in
    the environment of the process that starts the workers win.
    """
    return {"MALLOC_MMAP_THRESHOLD_": HEAP_BUFFER_MAX,
            "MALLOC_TRIM_THRESHOLD_": 2 * HEAP_BUFFER_MAX}


# Threads per worker process. A thread reading a chunk through the mount
# waits while the mount decodes it; a second thread meanwhile sums the chunk
# read before, so a core is not left idle (on 2 cores, 2 workers: the sum
# over the detector of a 537 MB acquisition 0.59 -> 0.52 s).
THREADS_PER_WORKER = 2


def local_cluster(workers: int, threads: int = THREADS_PER_WORKER) -> LocalCluster:
    """A LocalCluster of `workers` processes, `threads` threads each, started
    with `worker_environment()`. These variables must be set before a worker
    process starts, hence Dask's pre-spawn-environ and not the workers'
    `env`."""
    settings = {f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in worker_environment().items()}
    with dask.config.set(settings):
        return LocalCluster(n_workers=workers, threads_per_worker=threads, processes=True)


def exact_accumulator(dtype, count: int):
    """The narrowest dtype that holds a sum of `count` values of `dtype`
    exactly: uint32 when count * the dtype's maximum fits (a uint16 detector
    of up to 65,537 pixels; numpy adds into uint32 about twice as fast as
    into uint64), uint64 for larger unsigned sums, int64 for signed
    integers, float64 for floats."""
    if np.issubdtype(dtype, np.unsignedinteger):
        return np.uint32 if count * np.iinfo(dtype).max <= np.iinfo(np.uint32).max else np.uint64
    return np.int64 if np.issubdtype(dtype, np.integer) else np.float64


def wide(dtype):
    """The 64-bit type a sum of `dtype` values is kept in between tasks."""
    if np.issubdtype(dtype, np.unsignedinteger):
        return np.uint64
    return np.int64 if np.issubdtype(dtype, np.integer) else np.float64


def stored_as_bytes(source) -> bool:
    """Whether each tile of `source` is one chunk stored as its bytes, which
    `read_tile` reads itself: a Zarr v3 array whose only codec is `bytes`
    (no compression, no sharding: a mount's `data.zarr`), chunked by whole
    detector frames, in a store that reads synchronously (a local folder)."""
    from zarr.codecs import BytesCodec

    meta = source.metadata
    return (meta.zarr_format == 3
            and len(meta.codecs) == 1 and isinstance(meta.codecs[0], BytesCodec)
            and tuple(source.chunks[2:]) == tuple(source.shape[2:])
            and hasattr(source.store, "get_sync"))


def read_tile(source, rows, cols, as_bytes):
    """The scan positions (rows, cols) of `source`, all their frames.

    With `as_bytes` (see `stored_as_bytes`) the tile is one chunk: its
    stored bytes are read through the array's store and viewed as the
    array, the edge chunks' padding cut off, and a chunk never written holds
    the fill value, as the Zarr spec says. zarr-python's indexing decodes
    the same bytes and copies them into a new array: in the sum over the
    detector of `benches/zarr_view.py`'s acquisition through the mount,
    workers 0.29 -> 0.16 CPU-s and the sum 0.52 -> 0.45 s (medians of 9,
    fresh mounts)."""
    if not as_bytes:
        return np.asarray(source[rows, cols])
    from zarr.buffer import default_buffer_prototype

    step_r, step_c = source.chunks[:2]
    key = source.metadata.encode_chunk_key((rows.start // step_r, cols.start // step_c, 0, 0))
    stored = (source.store_path / key).get_sync(prototype=default_buffer_prototype())
    shape = (rows.stop - rows.start, cols.stop - cols.start) + tuple(source.shape[2:])
    if stored is None:
        return np.full(shape, source.fill_value, source.dtype)
    endian = source.metadata.codecs[0].endian
    order = ">" if endian is not None and endian.value == "big" else "<"
    chunk = np.frombuffer(stored.as_numpy_array(), source.dtype.newbyteorder(order))
    if chunk.size != np.prod(source.chunks):
        raise ValueError(f"chunk {key} of {source.store_path} holds {chunk.nbytes} bytes, "
                         f"not the {np.prod(source.chunks) * chunk.itemsize} of a whole chunk")
    return chunk.reshape(source.chunks)[: shape[0], : shape[1]]


def tile_products(source, tiles, invalid, bf_pixels, pattern):
    """One task's work: each tile of scan positions (rows, columns) in
    `tiles` (a Zarr chunk, or a shard) read in turn (`read_tile`), and
    reduced at once. Returns `([(rows, cols, sum, bf), ...], share)`: per
    tile, the exact sum over the detector's valid pixels of each frame and
    the sum over the flat pixels `bf_pixels` (None when not asked); and
    when `pattern`, the sum of all the tiles' frames (their share of the
    pattern; else None); each in `wide` of the data's type.

    Integers accumulate in `exact_accumulator` and widen after. The sum
    over valid pixels is every pixel's sum less that of the (usually few)
    `invalid` ones: exact in integers, and it reads only the invalid
    columns, not a masked copy of the tile. Floats are summed in float64
    with invalid pixels replaced by 0 (NaN and inf there must not reach
    the sum); the pattern keeps them (they are set to 0 at the end)."""
    out = wide(source.dtype)
    images, share = [], None
    as_bytes = stored_as_bytes(source)
    for rows, cols in tiles:
        block = read_tile(source, rows, cols, as_bytes)
        frames = block.reshape(block.shape[0], block.shape[1], -1)
        acc = exact_accumulator(block.dtype, frames.shape[2])
        if np.issubdtype(block.dtype, np.integer):
            total = frames.sum(axis=2, dtype=acc)
            if invalid.size:
                total -= frames[:, :, invalid].sum(axis=2, dtype=acc)
        else:
            keep = np.ones(frames.shape[2], bool)
            keep[invalid] = False
            total = np.where(keep, frames, 0).sum(axis=2, dtype=acc)
        bf = None
        if bf_pixels is not None:
            bf = frames[:, :, bf_pixels].sum(axis=2, dtype=acc).astype(out)
        images.append((rows, cols, total.astype(out), bf))
        if pattern:
            tile_acc = exact_accumulator(block.dtype, frames.shape[0] * frames.shape[1])
            tile = block.sum(axis=(0, 1), dtype=tile_acc).astype(out)
            share = tile if share is None else share + tile
    return images, share


def merge(parts):
    """A step of the tree that gathers the tiles' results: their images in
    one list, their pattern shares added."""
    images = [image for found, _ in parts for image in found]
    shares = [share for _, share in parts if share is not None]
    total = None
    if shares:
        total = shares[0].copy()
        for share in shares[1:]:
            total += share
    return images, total


# Results merged per task of the tree that gathers them on the workers: a
# large scan's thousands of detector-sized pattern shares never meet in
# one place, and the client receives one result.
FAN_IN = 8


def virtual_images(source, valid, bf_mask=None, pattern=True):
    """The sum over the valid detector pixels of every frame of the Zarr
    array `source` (scan_row, scan_column, detector_row, detector_column),
    computed on the current Dask scheduler; with `bf_mask` (detector-shaped,
    bool) the sum over its valid pixels too, and with `pattern` the sum of
    all frames. Returns a dict of numpy arrays in `wide` of the data's
    type: `sum` and `bf` (scan-shaped), `pattern` (detector-shaped).

    Each task reads whole chunks (shards in a sharded store), one after
    the other, as many as make up Dask's `array.chunk-size` (128 MiB by
    default, the size Dask chooses for its own chunks), and computes every
    product's share of them at once (`tile_products`): a chunk is read
    once, and Dask's cost per task (a few ms of CPU on a worker and on the
    scheduler) is paid once for several chunks, where a Dask array's
    reductions run two tasks for every chunk (the sum over the detector of
    `benches/zarr_view.py`'s acquisition took the workers, client and
    scheduler 0.43 CPU-s so, 0.29 CPU-s in 128 MiB tasks). A tree of
    `merge` tasks then gathers the shares."""
    rows, cols = source.shape[:2]
    step_r, step_c = (source.shards or source.chunks)[:2]
    invalid = np.flatnonzero(~np.asarray(valid).ravel())
    bf_pixels = None if bf_mask is None else np.flatnonzero((bf_mask & valid).ravel())
    tiles = [(slice(r, min(r + step_r, rows)), slice(c, min(c + step_c, cols)))
             for r in range(0, rows, step_r) for c in range(0, cols, step_c)]
    tile_bytes = step_r * step_c * int(np.prod(source.shape[2:])) * source.dtype.itemsize
    per_task = max(1, parse_bytes(dask.config.get("array.chunk-size")) // max(tile_bytes, 1))
    array = dask.delayed(source, pure=True)  # sent to each worker once, not with every task
    task = dask.delayed(tile_products, pure=True)
    level = [task(array, tiles[i:i + per_task], invalid, bf_pixels, pattern)
             for i in range(0, len(tiles), per_task)]
    while len(level) > 1:
        level = [dask.delayed(merge, pure=True)(level[i:i + FAN_IN])
                 for i in range(0, len(level), FAN_IN)]
    images, share = dask.compute(level[0])[0] if level else ([], None)
    kind = wide(source.dtype)
    results = {"sum": np.zeros((rows, cols), kind)}
    if bf_mask is not None:
        results["bf"] = np.zeros((rows, cols), kind)
    for r, c, total, bf in images:
        results["sum"][r, c] = total
        if bf is not None:
            results["bf"][r, c] = bf
    if pattern:
        results["pattern"] = np.zeros(source.shape[2:], kind) if share is None else share
    return results


def compute(zarr_path: Path, center, radius):
    group = zarr.open_group(str(zarr_path), mode="r", zarr_format=3)
    source = group["data"]
    detector = source.shape[2:]
    valid = np.asarray(group["mask"][:]) if "mask" in group else np.ones(detector, bool)
    found = virtual_images(source, valid, disk_mask(detector, center, radius))
    total, bf, pattern = found["sum"], found["bf"], found["pattern"]
    if not np.issubdtype(source.dtype, np.integer):
        # The mount's float products are float32 sums (an overflowing one,
        # such as two FLT_MAX, is inf) and its mean pattern that sum divided
        # by the frame count: the same rule here, on the float64 sums.
        with np.errstate(over="ignore"):
            total, bf, pattern = (x.astype(np.float32) for x in (total, bf, pattern))
    frames = source.shape[0] * source.shape[1]
    mean_dp = pattern.astype(np.float64) / frames
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
    p.add_argument("--threads", type=int, default=THREADS_PER_WORKER,
                   help=f"threads per local worker process (default {THREADS_PER_WORKER})")
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
        client = Client(local_cluster(args.workers, args.threads))
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
