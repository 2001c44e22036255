"""`NAME.qem/data.zarr`: zarr-python 3 and 2, tensorstore, xarray and a Dask
cluster read the Zarr view of an acquisition, through the mount and through
a copy made with `qem ls`/`qem cat`."""

import hashlib
import io
import json
import posixpath
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

from conftest import REPO, cat, conformance, load, qem_from_array, run

FIXTURES = [
    "u16-invalid-mask-33x40",  # counts with a valid mask, calibrated
    "u8-two-block-chunks",  # 300 columns: chunks of part of a row, blocks in two chunks
    "f32-special-13x7",  # float32 with NaN/inf/-0 values
    "scaled-three-regions-9x9",  # calibrated float32 from stored codes
]
DIMS = ("scan_row", "scan_column", "detector_row", "detector_column")


def copy_tree(container: Path, rel: str, dest: Path):
    """Copies a folder of the virtual tree with `qem ls` and `qem cat`."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in run("qem", "ls", container, rel).stdout.decode().split():
        if name.endswith("/"):
            copy_tree(container, f"{rel}/{name[:-1]}", dest / name[:-1])
        else:
            (dest / name).write_bytes(cat(container, f"{rel}/{name}"))


def valid_mask(header: dict, detector) -> np.ndarray | None:
    """The header's valid mask (spec §6.1: MSB first, 1 = valid), decoded here."""
    if "valid" not in header:
        return None
    bits = np.unpackbits(np.frombuffer(bytes.fromhex(header["valid"]), np.uint8))
    return bits[: detector[0] * detector[1]].reshape(detector).astype(bool)


def acquisition(rows, cols, det, seed=7) -> np.ndarray:
    """Low-dose counts with a bright disk, as a detector would see them."""
    rng = np.random.default_rng(seed)
    r, c = np.indices((det, det))
    disk = np.hypot(r - det / 2, c - det / 2) < det / 5
    lam = np.where(disk, 30.0, 0.05)
    return rng.poisson(lam, size=(rows, cols, det, det)).astype(np.uint16)


@pytest.fixture
def copied(tmp_path):
    def copy(container: Path) -> Path:
        dest = tmp_path / "copies" / container.name / "data.zarr"
        copy_tree(container, "data.zarr", dest)
        return dest

    return copy


@pytest.mark.parametrize("name", FIXTURES)
def test_zarr_copy_reads_back_the_decoded_array(name, copy_fixture, copied):
    container = copy_fixture(f"qem/{name}.qem")
    path = copied(container)
    expected = load(container, "data.npy")
    for fmt in (3, 2):
        group = zarr.open_group(str(path), mode="r", zarr_format=fmt)
        data = group["data"]
        assert data.shape == expected.shape and data.dtype == expected.dtype
        got = data[:]
        # Bit for bit, NaN payloads and -0.0 included.
        assert got.tobytes() == expected.tobytes(), f"zarr v{fmt}"
        if name.startswith("scaled"):
            assert np.array_equal(group["codes"][:], load(container, "codes.npy"))
        mask = valid_mask(json.loads(cat(container, "header.json")), expected.shape[2:])
        if mask is None:
            assert "mask" not in group
        else:
            assert np.array_equal(group["mask"][:], mask)
        # A slice decodes only what it touches and still agrees.
        assert np.array_equal(data[1:, -2:, 3, :], expected[1:, -2:, 3, :], equal_nan=True)


@pytest.mark.parametrize("name", FIXTURES)
def test_a_copy_of_the_view_converts_back_to_qem(name, tmp_path, copy_fixture, copied):
    """`qem convert` reads Zarr through zarrs: a copy of the view converts
    to a `.qem` holding the same values bit for bit (the calibrated float32
    ones for a scaled file) and the same valid mask."""
    container = copy_fixture(f"qem/{name}.qem")
    out = tmp_path / "back.qem"
    run("qem", "convert", copied(container), out)
    assert cat(out, "data.npy") == cat(container, "data.npy")
    expected = load(container, "data.npy")
    mask = valid_mask(json.loads(cat(container, "header.json")), expected.shape[2:])
    got = valid_mask(json.loads(cat(out, "header.json")), expected.shape[2:])
    assert (mask is None and got is None) or np.array_equal(got, mask)


def test_xarray_sees_named_calibrated_dimensions(copy_fixture, copied):
    container = copy_fixture("qem/u16-invalid-mask-33x40.qem")
    summary = json.loads(cat(container, "info.json"))["summary"]
    for fmt in (3, 2):
        ds = xr.open_zarr(str(copied(container)), zarr_format=fmt)
        assert ds["data"].dims == DIMS
        for axis, dim in zip(summary["axes"], DIMS):
            coord = ds[dim]
            step = axis["sampling"]["value"]
            assert coord.attrs["units"] == axis["sampling"]["unit"]
            assert np.allclose(coord.values, np.arange(axis["size"]) * step)
        assert ds["mask"].dims == DIMS[2:]
        # Zeros are values, not missing data.
        assert not np.isnan(ds["data"].values.astype(np.float64)).any()
        assert np.array_equal(ds["data"].values, load(container, "data.npy"))
        qem = ds.attrs["qem"]
        assert qem["codec"] == "runtime-column-rans-spatial-v2"
        assert qem["electron_microscope"]["electron_source/accelerating_voltage"]["value"] == 300.0
        assert qem["body_sha256"] == json.loads(cat(container, "header.json"))["sha256"]


@pytest.mark.parametrize("name", FIXTURES)
def test_a_store_names_the_acquisition_it_came_from(name, tmp_path, copy_fixture, copied):
    """A written store's attributes hold the decoded array's SHA-256 (what
    `qem hash` prints) and the file's (what sha256sum prints) for every
    codec; the view, which cannot hash a whole file to open, names the
    container's files that do."""
    container = copy_fixture(f"qem/{name}.qem")
    logical = hashlib.sha256(load(container, "data.npy").tobytes()).hexdigest()
    assert run("qem", "hash", container).stdout.decode().split()[0] == logical
    whole = hashlib.sha256(container.read_bytes()).hexdigest()
    store = tmp_path / "out.zarr"
    run("qem", "convert", container, store)
    qem = zarr.open_group(str(store), mode="r").attrs["qem"]
    assert qem["logical_sha256"] == logical
    assert qem["file_sha256"] == whole
    assert qem["body_sha256"] == json.loads(cat(container, "header.json"))["sha256"]
    view = zarr.open_group(str(copied(container)), mode="r").attrs["qem"]
    files = view["identity_files"]
    assert set(files) == {"file_sha256", "logical_sha256"}
    for key, expected in (("file_sha256", whole), ("logical_sha256", logical)):
        rel = posixpath.normpath(posixpath.join("data.zarr", files[key]))
        assert cat(container, rel).decode().strip() == expected


def test_a_store_of_many_objects_hashes_in_order(tmp_path):
    """Many objects written in parallel: the in-order digest still equals
    numpy's over the whole array."""
    data = acquisition(64, 48, 32)
    container = qem_from_array(tmp_path, data, "scan.qem")
    store = tmp_path / "out.zarr"
    run("qem", "convert", container, store, "--zarr-shard-mib", "1")
    group = zarr.open_group(str(store), mode="r")
    assert group["data"].nchunks >= 4  # shards, written in parallel
    qem = group.attrs["qem"]
    assert qem["logical_sha256"] == hashlib.sha256(data.tobytes()).hexdigest()
    assert qem["file_sha256"] == hashlib.sha256(container.read_bytes()).hexdigest()


def test_uncalibrated_axes_are_in_pixels(copied, examples):
    ds = xr.open_zarr(str(copied(examples / "empad-f32.qem")), zarr_format=3)
    for dim in DIMS:
        assert ds[dim].attrs["units"] == "pixel"
        assert np.array_equal(ds[dim].values, np.arange(ds.sizes[dim]))


def test_metadata_follows_the_zarr_specifications(copy_fixture, copied):
    container = copy_fixture("qem/u16-invalid-mask-33x40.qem")
    path = copied(container)
    assert json.loads((path / ".zgroup").read_text()) == {"zarr_format": 2}
    group = json.loads((path / "zarr.json").read_text())
    assert group["zarr_format"] == 3 and group["node_type"] == "group"
    consolidated_v2 = json.loads((path / ".zmetadata").read_text())
    assert consolidated_v2["zarr_consolidated_format"] == 1
    for name in ["data", "mask", *DIMS]:
        zarray = json.loads((path / name / ".zarray").read_text())
        # Zarr v2 spec: the required keys, with their allowed values.
        assert set(zarray) >= {"zarr_format", "shape", "chunks", "dtype", "compressor",
                               "fill_value", "order", "filters"}
        assert zarray["zarr_format"] == 2 and zarray["order"] == "C"
        assert zarray["compressor"] is None and zarray["filters"] is None
        assert zarray["dimension_separator"] == "."
        dtype = np.dtype(zarray["dtype"])
        assert zarray["dtype"][0] in "<|", "little-endian or single-byte"
        assert len(zarray["chunks"]) == len(zarray["shape"])
        zattrs = json.loads((path / name / ".zattrs").read_text())
        v3 = json.loads((path / name / "zarr.json").read_text())
        assert zattrs["_ARRAY_DIMENSIONS"] == v3["dimension_names"]
        assert v3["shape"] == zarray["shape"]
        assert v3["chunk_grid"]["configuration"]["chunk_shape"] == zarray["chunks"]
        assert v3["chunk_key_encoding"] == {"name": "v2", "configuration": {"separator": "."}}
        assert np.dtype(v3["data_type"]) == dtype
        # Consolidated metadata repeats each array's own documents exactly.
        assert group["consolidated_metadata"]["metadata"][name] == v3
        assert consolidated_v2["metadata"][f"{name}/.zarray"] == zarray
        assert consolidated_v2["metadata"][f"{name}/.zattrs"] == zattrs
        # Every chunk is there, full-size.
        grid = [-(-s // c) for s, c in zip(zarray["shape"], zarray["chunks"])]
        chunk_bytes = int(np.prod(zarray["chunks"])) * dtype.itemsize
        chunks = sorted(p.name for p in (path / name).iterdir() if not p.name.startswith((".", "zarr")))
        assert len(chunks) == int(np.prod(grid))
        for key in chunks:
            assert (path / name / key).stat().st_size == chunk_bytes, key


def test_chunks_follow_blocks_and_edges_are_padded(tmp_path, copied):
    # 40 columns: 12 rows (480 scans) a chunk, straddling 512-scan blocks;
    # 30 rows: the last chunk has 6 rows of padding.
    array = acquisition(30, 40, 6)
    container = qem_from_array(tmp_path, array, "edges.qem")
    path = copied(container)
    data = zarr.open_array(str(path / "data"), mode="r", zarr_format=3)
    assert data.chunks == (12, 40, 6, 6)
    assert np.array_equal(data[:], array)
    last = np.frombuffer((path / "data" / "2.0.0.0").read_bytes(), np.uint16).reshape(12, 40, 6, 6)
    assert np.array_equal(last[:6], array[24:])
    assert not last[6:].any(), "padding is the fill value"

    # 128 columns: one chunk is exactly one 512-scan block.
    container = qem_from_array(tmp_path, acquisition(8, 128, 4), "aligned.qem")
    data = zarr.open_array(str(copied(container) / "data"), mode="r", zarr_format=3)
    assert data.chunks == (4, 128, 4, 4)


@pytest.fixture
def mounted(tmp_path, mount, copy_fixture) -> dict:
    """The containers of FIXTURES in one mount, by name."""
    src = tmp_path / "src"
    for name in FIXTURES:
        copy_fixture(f"qem/{name}.qem", src)
    mnt = mount(src)
    return {name: mnt / f"{name}.qem" for name in FIXTURES}


def test_zarr_through_the_mount(mounted):
    for name, container in mounted.items():
        expected = np.load(container / "data.npy")
        group = zarr.open_group(str(container / "data.zarr"), mode="r", zarr_format=3)
        assert group["data"][:].tobytes() == expected.tobytes(), name
        ds = xr.open_zarr(str(container / "data.zarr"), zarr_format=3)
        assert ds["data"].dims == DIMS


def test_tensorstore_reads_the_view_by_either_metadata(mounted):
    """tensorstore, an independent implementation of both Zarr versions,
    reads every array of the view through the mount, by the v3 metadata
    (driver `zarr3`) and by the v2 metadata (driver `zarr`): the values,
    the stored codes and the mask, bit for bit, edge chunks cut to the
    array's shape."""
    import tensorstore as ts

    for name, container in mounted.items():
        expected = {"data": np.load(container / "data.npy")}
        if name.startswith("scaled"):
            expected["codes"] = np.load(container / "codes.npy")
        mask = valid_mask(json.loads((container / "header.json").read_text()),
                          expected["data"].shape[2:])
        if mask is not None:
            expected["mask"] = mask
        for array, want in expected.items():
            for driver in ("zarr3", "zarr"):
                spec = {"driver": driver,
                        "kvstore": {"driver": "file", "path": str(container / "data.zarr" / array)}}
                store = ts.open(spec, read=True, open=True).result()
                if driver == "zarr3":
                    # v2 has no dimension names (`_ARRAY_DIMENSIONS` is
                    # xarray's convention, checked above).
                    assert store.domain.labels == DIMS[4 - want.ndim:], (name, array, driver)
                got = store.read().result()
                assert got.dtype == want.dtype and got.shape == want.shape, (name, array, driver)
                assert got.tobytes() == want.tobytes(), (name, array, driver)


def resident_pages(path: Path) -> tuple[int, int]:
    """(pages of PATH in the kernel's page cache, pages in all), by mincore(2)
    over a mapping that touches none of them."""
    import ctypes
    import mmap
    import os

    libc = ctypes.CDLL(None, use_errno=True)
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        anchor = ctypes.c_char.from_buffer(mm)
        vec = (ctypes.c_ubyte * pages)()
        rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec)
        del anchor
        assert rc == 0, os.strerror(ctypes.get_errno())
        return sum(v & 1 for v in vec), pages
    finally:
        mm.close()


def test_chunks_go_around_the_page_cache_and_still_map(tmp_path, mount):
    """A chunk is read once, whole: the mount serves it with direct I/O, so
    reading every chunk leaves none of it in the page cache (unlike
    data.npy), and a chunk file still maps (numpy.memmap)."""
    import platform

    array = acquisition(8, 128, 32)
    qem_from_array(tmp_path, array, "scan.qem")
    container = mount(tmp_path / "src") / "scan.qem"
    chunk = container / "data.zarr" / "data" / "1.0.0.0"
    assert chunk.read_bytes() == array[4:8].tobytes()
    whole = container / "data.npy"
    assert np.array_equal(np.load(whole), array)
    release = tuple(int(x) for x in platform.release().split("-")[0].split(".")[:2])
    if release >= (6, 6):  # FUSE_DIRECT_IO_ALLOW_MMAP: direct I/O is offered
        assert resident_pages(chunk)[0] == 0, "a chunk read leaves no page-cache copy"
    held, pages = resident_pages(whole)
    assert held == pages, "data.npy stays in the page cache (FOPEN_KEEP_CACHE)"
    mapped = np.memmap(chunk, dtype=np.uint16, mode="r", shape=(4, 128, 32, 32))
    assert np.array_equal(mapped, array[4:8])
    del mapped
    group = zarr.open_group(str(container / "data.zarr"), mode="r", zarr_format=3)
    assert np.array_equal(group["data"][:], array)


def test_dask_cluster_computes_the_virtual_images(tmp_path, mount, copy_fixture):
    """The shipped example on a LocalCluster of 2 worker processes reading
    through the mount gives the mount's own sum, bf and mean_dp."""
    qem_from_array(tmp_path, acquisition(24, 64, 32), "scan.qem")
    copy_fixture("qem/u16-invalid-mask-33x40.qem", tmp_path / "src")
    mnt = mount(tmp_path / "src")
    for name in ["scan", "u16-invalid-mask-33x40"]:
        out = subprocess.run(
            [sys.executable, str(REPO / "examples" / "dask_virtual_images.py"),
             str(mnt / f"{name}.qem"), "--workers", "2", "--check", "--out", str(tmp_path / name)],
            capture_output=True, text=True, timeout=300,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        for product in ["sum", "bf", "mean_dp"]:
            assert f"{product}: equal to virtual/{product}.npy" in out.stdout
        # And against numpy on the dense array, independently of the mount's products.
        dense = np.load(mnt / f"{name}.qem" / "data.npy").astype(np.float64)
        header = json.loads((mnt / f"{name}.qem" / "header.json").read_text())
        valid = valid_mask(header, dense.shape[2:])
        valid = np.ones(dense.shape[2:], bool) if valid is None else valid
        total = np.load(tmp_path / name / "sum.npy")
        assert np.array_equal(total, (dense * valid).sum(axis=(2, 3)))


def test_dask_example_follows_the_float_products_rules(tmp_path, mount, copy_fixture):
    """A float acquisition holding NaN, infinities, FLT_MAX pairs and
    subnormals (a conformance fixture): the example's images agree with
    the mount's, an overflowing float32 sum (the mean pattern's) included."""
    copy_fixture("qem/f32-special-13x7.qem", tmp_path / "src")
    mnt = mount(tmp_path / "src")
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "dask_virtual_images.py"),
         str(mnt / "f32-special-13x7.qem"), "--workers", "2", "--check", "--out", str(tmp_path / "f")],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for product in ["sum", "bf", "mean_dp"]:
        assert f"{product}: equal to virtual/{product}.npy" in out.stdout
    # Two FLT_MAX at one pixel: the float32 sum overflows, as the mount's.
    mean_dp = np.load(tmp_path / "f" / "mean_dp.npy")
    assert np.isinf(mean_dp).any()


def test_dask_sums_stay_exact_at_the_accumulators_limit(tmp_path, mount):
    """The example accumulates in uint32 where pixels x 65535 fits: every
    pixel at 65535 on a 256x256 detector (the largest sum uint32 holds) and
    on a 257x256 one (one that overflows it, so uint64) gives numpy's
    uint64 sums and the mount's images."""
    for rows in (256, 257):
        qem_from_array(tmp_path, np.full((2, 3, rows, 256), 65535, np.uint16), f"full{rows}.qem")
    mnt = mount(tmp_path / "src")
    for rows in (256, 257):
        name = f"full{rows}"
        out = subprocess.run(
            [sys.executable, str(REPO / "examples" / "dask_virtual_images.py"),
             str(mnt / f"{name}.qem"), "--workers", "2", "--check", "--out", str(tmp_path / name)],
            capture_output=True, text=True, timeout=300,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        dense = np.load(mnt / f"{name}.qem" / "data.npy")
        total = np.load(tmp_path / name / "sum.npy")
        assert total.dtype == np.uint64
        assert np.array_equal(total, dense.sum(axis=(2, 3), dtype=np.uint64)), name
        mean_dp = np.load(tmp_path / name / "mean_dp.npy")
        assert np.array_equal(mean_dp, dense.mean(axis=(0, 1), dtype=np.float64).astype(np.float32))


def test_dask_cluster_computes_the_virtual_images_from_a_sharded_store(tmp_path, copy_fixture):
    """Without FUSE: `qem convert X.qem X.zarr --zarr-shard-mib N`, then the
    shipped example on a LocalCluster of 2 worker processes reading the
    store, gives `qem cat`'s own sum, bf (exactly) and mean_dp."""
    np.save(tmp_path / "scan.npy", acquisition(24, 64, 32))
    made = tmp_path / "src" / "scan.qem"
    made.parent.mkdir()
    # Blocks of 64 scans: Zarr chunks of one scan row, 8 rows to a 1 MiB shard.
    run("qem", "convert", tmp_path / "scan.npy", made, "--chunk-scans", "64")
    # A valid mask, in one chunk (too small to shard): the store's `mask` array.
    masked = copy_fixture("qem/u16-invalid-mask-33x40.qem", tmp_path / "src")
    for container, shards in [(made, (8, 64, 32, 32)), (masked, None)]:
        store = tmp_path / f"{container.stem}.zarr"
        run("qem", "convert", container, store, "--zarr-shard-mib", "1")
        data = zarr.open_group(str(store), mode="r")["data"]
        assert data.shards == shards, container.name
        detectors = tmp_path / f"{container.stem}-detectors.json"
        detectors.write_bytes(cat(container, "virtual/detectors.json"))
        out_dir = tmp_path / f"{container.stem}-out"
        out = subprocess.run(
            [sys.executable, str(REPO / "examples" / "dask_virtual_images.py"), str(store),
             "--workers", "2", "--detectors", str(detectors), "--out", str(out_dir)],
            capture_output=True, text=True, timeout=300,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        for product in ["sum", "bf"]:
            ours = np.load(out_dir / f"{product}.npy")
            theirs = load(container, f"virtual/{product}.npy")
            # Counts: the same integers.
            assert ours.shape == theirs.shape, product
            assert np.array_equal(ours.astype(np.float64), theirs.astype(np.float64)), product
        mean_dp = np.load(out_dir / "mean_dp.npy")
        expected = load(container, "virtual/mean_dp.npy")
        assert mean_dp.shape == expected.shape
        assert np.allclose(mean_dp, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layout", ["bytes-little", "bytes-big", "v2-plain", "detector-chunks"])
def test_dask_example_reads_uncompressed_stores_as_zarr_python_does(tmp_path, layout):
    """The example reads a tile that is one chunk stored as its bytes (a
    mount's `data.zarr`) from the store itself. Stores that zarr-python
    writes uncompressed, with edge chunks, chunks never written (their
    fill value) and either byte order, and those it must read through
    zarr-python (Zarr v2, chunks smaller than a frame) give numpy's sums,
    bright field and pattern of the same array."""
    sys.path.insert(0, str(REPO / "examples"))
    from dask_virtual_images import stored_as_bytes, virtual_images

    rng = np.random.default_rng(11)
    array = rng.integers(0, 900, size=(10, 7, 5, 6), dtype=np.uint16)
    array[4:8] = 3  # two chunks of rows, all fill value: never written
    store = tmp_path / "plain.zarr"
    if layout == "v2-plain":
        z = zarr.open_array(str(store), mode="w", zarr_format=2, shape=array.shape,
                            chunks=(4, 3, 5, 6), dtype=array.dtype, compressor=None, fill_value=3)
    else:
        z = zarr.create_array(
            str(store), shape=array.shape, dtype=array.dtype, fill_value=3, compressors=None,
            chunks=(4, 3, 5, 3) if layout == "detector-chunks" else (4, 3, 5, 6),
            serializer=zarr.codecs.BytesCodec(endian="big" if layout == "bytes-big" else "little"))
    z[:] = array
    source = zarr.open_array(str(store), mode="r")
    assert stored_as_bytes(source) == layout.startswith("bytes"), layout
    if layout.startswith("bytes"):
        # 3 x 3 chunks, of which the 3 of rows 4-7 hold only the fill value.
        assert sum(p.is_file() for p in (store / "c").rglob("*")) == 6
    valid = np.ones(array.shape[2:], bool)
    valid[0, 1] = False
    bf = np.zeros(array.shape[2:], bool)
    bf[1:4, 2:5] = True
    found = virtual_images(source, valid, bf, pattern=True)
    wide = array.astype(np.uint64)
    assert np.array_equal(found["sum"], (wide * valid).sum(axis=(2, 3)))
    assert np.array_equal(found["bf"], (wide * (bf & valid)).sum(axis=(2, 3)))
    assert np.array_equal(found["pattern"], wide.sum(axis=(0, 1)))
