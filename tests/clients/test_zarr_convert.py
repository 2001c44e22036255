"""`qem convert X.qem X.zarr` and back: stores that zarr-python and xarray
read, and any 4-D array zarr-python writes converted into `.qem`."""

import io
import json
import os
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
    assert any("blosc" in type(c).__name__.lower() for c in data.metadata.codecs), data.metadata.codecs
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

    empty = tmp_path / "empty.zarr"
    empty.mkdir()
    refused(tmp_path, empty)


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
