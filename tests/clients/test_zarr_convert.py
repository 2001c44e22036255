"""`qem convert X.qem X.zarr` and back: stores that zarr-python and xarray
read, and any 4-D array zarr-python writes converted into `.qem`."""

import io
import json
import os
import struct
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import xarray as xr
import zarr
import zarr.codecs

from conftest import run

DIMS = ("scan_row", "scan_column", "detector_row", "detector_column")
FIXTURES = [
    "u16-invalid-mask-33x40",
    "u8-two-block-chunks",
    "f32-special-13x7",
    "scaled-three-regions-9x9",
]


def decoded(qem: Path) -> np.ndarray:
    return np.load(io.BytesIO(run("qem", "cat", qem, "data.npy").stdout))


def header(qem: Path) -> dict:
    return json.loads(run("qem", "cat", qem, "header.json").stdout)


def logical_hash(qem: Path) -> str:
    return run("qem", "hash", qem).stdout.split()[0].decode()


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name)


def inner_codecs(array) -> tuple:
    """The codecs applied to each chunk: a shard's inner codecs, or the array's."""
    codecs = array.metadata.codecs
    if len(codecs) == 1 and isinstance(codecs[0], zarr.codecs.ShardingCodec):
        return codecs[0].codecs
    return codecs


@pytest.mark.parametrize("name", FIXTURES)
def test_qem_to_zarr_and_back(name, tmp_path, copy_fixture):
    source = copy_fixture(f"qem/{name}.qem")
    store = tmp_path / f"{name}.zarr"
    run("qem", "convert", source, store)
    expected = decoded(source)

    group = zarr.open_group(str(store), mode="r")
    assert group.metadata.zarr_format == 3
    data = group["data"]
    assert data[:].tobytes() == expected.tobytes()
    assert data.metadata.dimension_names == DIMS
    assert any("blosc" in type(c).__name__.lower() for c in inner_codecs(data)), data.metadata.codecs
    # Consolidated metadata: xarray opens it without a fallback warning.
    ds = xr.open_zarr(str(store), consolidated=True)
    assert ds["data"].dims == DIMS
    summary = json.loads(run("qem", "cat", source, "info.json").stdout)["summary"]
    for axis, dim in zip(summary["axes"], DIMS):
        step = axis["sampling"]["value"] if axis["sampling"] else 1.0
        assert ds[dim].attrs["units"] == (axis["sampling"]["unit"] if axis["sampling"] else "pixel")
        assert np.allclose(ds[dim].values, np.arange(axis["size"]) * step)
    if name.startswith("scaled"):
        codes = np.load(io.BytesIO(run("qem", "cat", source, "codes.npy").stdout))
        assert np.array_equal(group["codes"][:], codes)

    back = tmp_path / f"{name}-back.qem"
    run("qem", "convert", store, back)
    run("qem", "validate", back)
    assert logical_hash(back) == logical_hash(source)
    assert decoded(back).tobytes() == expected.tobytes()
    h0, h1 = header(source), header(back)
    assert h1["scientific_metadata"] == h0["scientific_metadata"]
    assert h1.get("valid") == h0.get("valid")
    if h0["codec"] != "scaled-uint16-column-rans-v1":
        # The same file content; a scaled file comes back as float32 values.
        assert h1["codec"] == h0["codec"]
        assert h1.get("metadata") == h0.get("metadata")
        assert h1.get("empad") == h0.get("empad")
    assert leftovers(tmp_path) == []


def write_store(path: Path, array: np.ndarray, fmt: int, compressor: str, chunks, fill=0):
    """A store as zarr-python writes it, with one of the usual compressors."""
    if fmt == 2:
        comp = {
            "blosc": numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE),
            "zstd": numcodecs.Zstd(level=3),
            "gzip": numcodecs.GZip(level=5),
            "none": None,
        }[compressor]
        z = zarr.create_array(str(path), shape=array.shape, chunks=chunks, dtype=array.dtype,
                              zarr_format=2, compressors=comp, fill_value=fill)
    else:
        comp = {
            "blosc": zarr.codecs.BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle"),
            "zstd": zarr.codecs.ZstdCodec(level=3),
            "gzip": zarr.codecs.GzipCodec(level=5),
            "none": None,
        }[compressor]
        z = zarr.create_array(str(path), shape=array.shape, chunks=chunks, dtype=array.dtype,
                              zarr_format=3, compressors=comp, fill_value=fill)
    z[:] = array
    return z


def sample(dtype, shape=(5, 7, 6, 9), seed=3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == np.float32:
        a = rng.normal(size=shape).astype(np.float32)
        a.flat[:4] = [np.nan, np.inf, -0.0, -np.inf]
        return a
    high = 255 if dtype == np.uint8 else 65535
    return rng.integers(0, high, size=shape, endpoint=True).astype(dtype)


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("compressor", ["blosc", "zstd", "gzip", "none"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
def test_zarr_python_stores_convert_to_qem(fmt, compressor, dtype, tmp_path):
    array = sample(dtype)
    store = tmp_path / "in.zarr"
    # Chunks that divide nothing: partial edge chunks and a split detector.
    write_store(store, array, fmt, compressor, chunks=(2, 3, 4, 5))
    out = tmp_path / "out.qem"
    run("qem", "convert", store, out)
    run("qem", "validate", out)
    assert decoded(out).tobytes() == array.tobytes()


def test_a_group_with_a_data_array_and_a_missing_chunk(tmp_path):
    array = sample(np.uint16, shape=(4, 4, 3, 3))
    store = tmp_path / "group.zarr"
    group = zarr.open_group(str(store), mode="w", zarr_format=3)
    z = group.create_array("data", shape=array.shape, chunks=(2, 2, 3, 3), dtype=np.uint16,
                           fill_value=7)
    z[:] = array
    os.remove(store / "data" / "c" / "1" / "1" / "0" / "0")
    out = tmp_path / "out.qem"
    run("qem", "convert", store, out)
    expected = array.copy()
    expected[2:, 2:] = 7  # a missing chunk is the fill value
    assert np.array_equal(decoded(out), expected)


def refused(tmp_path: Path, store: Path, *needles: str):
    out = tmp_path / "out.qem"
    r = run("qem", "convert", store, out, check=False)
    assert r.returncode == 2, r.stderr
    err = r.stderr.decode()
    assert err.startswith(f"error: {store}"), err
    for needle in needles:
        assert needle in err, err
    assert not out.exists() and leftovers(tmp_path) == []


def test_bad_stores_are_refused_with_the_store_named(tmp_path):
    int32 = tmp_path / "int32.zarr"
    write_store(int32, np.zeros((2, 2, 2, 2), np.int32), 3, "none", (1, 1, 2, 2))
    refused(tmp_path, int32, "int32", "uint8, uint16 or float32")

    flat = tmp_path / "3d.zarr"
    write_store(flat, np.zeros((4, 2, 2), np.uint16), 3, "none", (1, 2, 2))
    refused(tmp_path, flat, "3-D")

    corrupt = tmp_path / "corrupt.zarr"
    write_store(corrupt, sample(np.uint16), 2, "zstd", (2, 3, 6, 9))
    chunk = corrupt / "1.1.0.0"
    chunk.write_bytes(chunk.read_bytes()[:10])
    refused(tmp_path, corrupt, "chunk 1.1.0.0")

    short = tmp_path / "short.zarr"
    write_store(short, sample(np.uint16), 3, "none", (2, 3, 6, 9))
    chunk = short / "c" / "0" / "1" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:-2])
    refused(tmp_path, short, "chunk", "0.1.0.0".replace(".", "/"))

    # An edge chunk (rows 4-5 of 5, columns 6-8 of 7) cut within its
    # padding: no byte the array holds is missing, but the file is not a
    # whole chunk. zarrs reads only the bytes it needs and let it pass.
    for fmt, key in [(3, "c/2/2/0/0"), (2, "2.2.0.0")]:
        edge = tmp_path / f"edge{fmt}.zarr"
        write_store(edge, sample(np.uint16), fmt, "none", (2, 3, 6, 9))
        chunk = edge / key
        chunk.write_bytes(chunk.read_bytes()[:-2])
        refused(tmp_path, edge, f"chunk {key}", "bytes stored, where the uncompressed chunk holds 648")

    lzma = tmp_path / "lzma.zarr"  # a numcodecs compressor zarrs does not read
    z = zarr.open_array(str(lzma), mode="w", zarr_format=2, shape=(2, 2, 3, 3), chunks=(1, 1, 3, 3),
                        dtype=np.uint16, compressor=numcodecs.LZMA())
    z[:] = 1
    refused(tmp_path, lzma, "lzma")

    empty = tmp_path / "empty.zarr"
    empty.mkdir()
    refused(tmp_path, empty)

    # Metadata carries no checksum: a chunk shape edited to 2^63 - 1, whose
    # bytes overflow when a chunk is read.
    huge = tmp_path / "huge_chunk.zarr"
    write_store(huge, sample(np.uint16), 2, "blosc", (2, 3, 6, 9))
    meta = json.loads((huge / ".zarray").read_text())
    meta["chunks"][3] = (1 << 63) - 1
    (huge / ".zarray").write_text(json.dumps(meta))
    refused(tmp_path, huge, "chunk 0.0.0.0", "too large to read")

    # A shard index (its crc32c recomputed) placing an inner chunk past the
    # shard's end: at offset 2^64 - 1, or 2^63 bytes long.
    for name, entry in [("far", ((1 << 64) - 1, 16)), ("long", (0, 1 << 63))]:
        sharded = tmp_path / f"{name}_shard.zarr"
        z = zarr.create_array(str(sharded), shape=(4, 4, 6, 9), chunks=(1, 2, 6, 9), shards=(2, 4, 6, 9),
                              dtype=np.uint16, zarr_format=3)
        z[:] = sample(np.uint16, shape=(4, 4, 6, 9))
        shard = sharded / "c" / "1" / "0" / "0" / "0"
        raw = bytearray(shard.read_bytes())
        entries = 2 * 2  # inner chunks per shard
        index = len(raw) - (16 * entries + 4)
        raw[index + 16 : index + 32] = struct.pack("<QQ", *entry)
        raw[-4:] = struct.pack("<I", numcodecs.checksum32.crc32c_checksum(bytes(raw[index:-4])))
        shard.write_bytes(bytes(raw))
        refused(tmp_path, sharded, "shard c/1/0/0/0", "past the shard's")

    # The same, in shards compressed whole (zstd after `sharding_indexed`,
    # as zarr-python writes with `serializer=ShardingCodec(...)` and
    # `compressors`): the index is read only when the shard is decoded,
    # and an offset of 2^64 - 1 there once crashed the decoder itself.
    for name, entry, why in [("far", ((1 << 64) - 1, 16), "out of range"),
                             ("long", (8, 1 << 40), "out-of-bounds")]:
        outer = tmp_path / f"{name}_outer.zarr"
        z = zarr.create_array(str(outer), shape=(4, 4, 6, 9), chunks=(2, 4, 6, 9), dtype=np.uint16,
                              zarr_format=3, serializer=zarr.codecs.ShardingCodec(chunk_shape=(1, 2, 6, 9)),
                              compressors=[zarr.codecs.ZstdCodec(level=1)])
        values = sample(np.uint16, shape=(4, 4, 6, 9))
        z[:] = values
        assert np.array_equal(zarr.open_array(str(outer), mode="r")[:], values)
        shard = outer / "c" / "1" / "0" / "0" / "0"
        raw = bytearray(numcodecs.Zstd().decode(shard.read_bytes()))
        index = len(raw) - (16 * 4 + 4)
        raw[index + 16 : index + 32] = struct.pack("<QQ", *entry)
        raw[-4:] = struct.pack("<I", numcodecs.checksum32.crc32c_checksum(bytes(raw[index:-4])))
        shard.write_bytes(numcodecs.Zstd().encode(bytes(raw)))
        refused(tmp_path, outer, "shard c/1/0/0/0", why)

    # Valid Zarr, no chunk written (all fill value), but more scan rows
    # than a .qem axis holds, and a detector too large for the codec: the
    # store is at fault, and named, not the output.
    for name, shape in [("long", (1 << 24, 1, 2, 2)), ("wide", (1, 1, 1 << 20, 1 << 20))]:
        big = tmp_path / f"{name}.zarr"
        zarr.create_array(str(big), shape=shape, chunks=(1, 1, 2, 2), dtype=np.uint16,
                          zarr_format=3, compressors=None)
        refused(tmp_path, big, "cannot be written as", "out.qem")


def test_an_existing_store_is_never_replaced_without_force(tmp_path, copy_fixture):
    source = copy_fixture("qem/u8-two-block-chunks.qem")
    store = tmp_path / "kept.zarr"
    store.mkdir()
    (store / "precious").write_text("mine")
    r = run("qem", "convert", source, store, check=False)
    assert r.returncode == 2 and b"already exists" in r.stderr
    assert (store / "precious").read_text() == "mine"
    run("qem", "convert", source, store, "--force")
    assert not (store / "precious").exists()
    assert np.array_equal(zarr.open_array(str(store / "data"), mode="r")[:], decoded(source))
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("compression", ["blosc-lz4", "zstd", "none"])
def test_compression_choices_read_back(compression, tmp_path, copy_fixture):
    source = copy_fixture("qem/u16-invalid-mask-33x40.qem")
    store = tmp_path / "s.zarr"
    run("qem", "convert", source, store, "--zarr-compression", compression)
    assert np.array_equal(zarr.open_array(str(store / "data"), mode="r")[:], decoded(source))


def npy_to_qem(tmp_path: Path, array: np.ndarray, chunk_scans: int) -> Path:
    npy, qem = tmp_path / "src.npy", tmp_path / "src.qem"
    np.save(npy, array)
    run("qem", "convert", npy, qem, "--chunk-scans", str(chunk_scans))
    return qem


def stored_files(array_dir: Path) -> list[Path]:
    return sorted(p for p in (array_dir / "c").rglob("*") if p.is_file())


# (array shape, scans per .qem chunk, --zarr-shard-mib, zarr chunks, zarr shards):
# whole scan rows per shard; rows longer than a chunk with the columns padded
# to whole chunks; a row larger than a shard split into shards of one row.
SHARDINGS = [
    ((32, 32, 32, 32), 64, 1, (2, 32, 32, 32), (16, 32, 32, 32)),
    ((4, 100, 64, 64), 32, 2, (1, 32, 64, 64), (2, 128, 64, 64)),
    ((2, 300, 64, 64), 32, 1, (1, 32, 64, 64), (1, 128, 64, 64)),
]


@pytest.mark.parametrize("shape,scans,mib,chunks,shards", SHARDINGS)
def test_sharded_stores_read_in_zarr_python_and_round_trip(shape, scans, mib, chunks, shards,
                                                          tmp_path):
    rng = np.random.default_rng(sum(shape))
    array = rng.integers(0, 65535, size=shape, endpoint=True).astype(np.uint16)
    source = npy_to_qem(tmp_path, array, scans)
    store = tmp_path / "sharded.zarr"
    run("qem", "convert", source, store, "--zarr-shard-mib", str(mib))

    data = zarr.open_group(str(store), mode="r")["data"]
    assert data.chunks == chunks and data.shards == shards
    assert any("blosc" in type(c).__name__.lower() for c in inner_codecs(data))
    grid = [-(-n // s) for n, s in zip(shape, shards)]
    assert len(stored_files(store / "data")) == int(np.prod(grid))
    assert data[:].tobytes() == array.tobytes()
    # One inner chunk, read alone, at the far corner of the scan.
    corner = tuple(slice((n - 1) // c * c, n) for n, c in zip(shape, chunks))
    assert np.array_equal(data[corner], array[corner])

    unsharded = tmp_path / "plain.zarr"
    run("qem", "convert", source, unsharded, "--zarr-shard-mib", "0")
    plain = zarr.open_group(str(unsharded), mode="r")["data"]
    assert plain.chunks == chunks and plain.shards is None
    assert plain.metadata.attributes == data.metadata.attributes
    assert (zarr.open_group(str(unsharded), mode="r").attrs.asdict()
            == zarr.open_group(str(store), mode="r").attrs.asdict())

    back = tmp_path / "back.qem"
    run("qem", "convert", store, back)
    run("qem", "validate", back)
    assert logical_hash(back) == logical_hash(source)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("compressor", ["blosc", "zstd"])
@pytest.mark.parametrize("dtype", [np.uint16, np.float32])
def test_zarr_python_sharded_stores_convert_to_qem(compressor, dtype, tmp_path):
    array = sample(dtype, shape=(9, 10, 6, 8))
    store = tmp_path / "in.zarr"
    comp = {
        "blosc": zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
        "zstd": zarr.codecs.ZstdCodec(level=3),
    }[compressor]
    # Shards that divide neither the scan nor the detector; inner chunks split both.
    z = zarr.create_array(str(store), shape=array.shape, chunks=(2, 3, 3, 4),
                          shards=(4, 6, 6, 8), dtype=array.dtype, compressors=comp)
    z[:] = array
    assert z.shards == (4, 6, 6, 8)
    out = tmp_path / "out.qem"
    run("qem", "convert", store, out)
    run("qem", "validate", out)
    assert decoded(out).tobytes() == array.tobytes()


def test_a_truncated_shard_is_refused_naming_it(tmp_path):
    rng = np.random.default_rng(5)
    array = rng.integers(0, 4000, size=(32, 32, 32, 32)).astype(np.uint16)
    source = npy_to_qem(tmp_path, array, 64)
    store = tmp_path / "cut.zarr"
    run("qem", "convert", source, store, "--zarr-shard-mib", "1")
    shard = store / "data" / "c" / "1" / "0" / "0" / "0"
    shard.write_bytes(shard.read_bytes()[:-100])
    refused(tmp_path, store, "shard", "c/1/0/0/0")


def test_by_default_small_chunks_share_a_shard_file(tmp_path):
    rng = np.random.default_rng(9)
    array = rng.integers(0, 900, size=(32, 32, 32, 32)).astype(np.uint16)
    source = npy_to_qem(tmp_path, array, 64)  # 16 chunks of 128 KiB
    store = tmp_path / "default.zarr"
    run("qem", "convert", source, store)
    data = zarr.open_group(str(store), mode="r")["data"]
    assert data.chunks == (2, 32, 32, 32) and data.shards == (32, 32, 32, 32)
    assert len(stored_files(store / "data")) == 1
    assert data[:].tobytes() == array.tobytes()
