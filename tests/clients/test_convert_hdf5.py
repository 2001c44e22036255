"""Any HDF5 dataset by path (`FILE.h5:/path`), compressed with the
library's filters or hdf5plugin's, and EMD 1.0 with its calibration,
written by h5py and compared with h5py's reading."""

import contextlib
import json

import h5py
import hdf5plugin
import numpy as np
import pytest

from conftest import address_space_limit, run

R, C, H, W = 3, 5, 6, 7


def convert(tmp_path, src, *flags):
    out = tmp_path / "out.qem"
    run("qem", "convert", src, out, *flags)
    run("qem", "validate", out)
    run("qem", "convert", out, tmp_path / "out.npy")
    return np.load(tmp_path / "out.npy"), json.loads(run("qem", "show", "--json", out).stdout)["header"]


@contextlib.contextmanager
def emd(path, array, **kwargs):
    """An EMD 1.0 file with `array` as its data, open for more members:
    yields the file and the data's group."""
    with h5py.File(path, "w") as f:
        f.attrs["version_major"] = 1
        f.attrs["version_minor"] = 0
        g = f.create_group("experimental/science_data")
        g.attrs["emd_group_type"] = 1
        g.create_dataset("data", data=array, **kwargs)
        yield f, g


def test_an_emd_dataset_converts_with_its_calibration(tmp_path):
    a = np.random.default_rng(1).integers(0, 5000, size=(R, C, H, W)).astype(np.int32)
    path = tmp_path / "scan.emd"
    with emd(path, a, chunks=(1, 2, H, W), compression="gzip") as (_, g):
        for i, (n, step, units) in enumerate(
            [(R, 0.5, "nm"), (C, 0.25, "nm"), (H, 0.8, "mrad"), (W, 0.8, "mrad")], start=1
        ):
            d = g.create_dataset(f"dim{i}", data=np.arange(n) * step)
            d.attrs["name"] = ["R_y", "R_x", "Q_y", "Q_x"][i - 1]
            d.attrs["units"] = units
    with h5py.File(path) as f:
        theirs = f["experimental/science_data/data"][()]
    ours, header = convert(tmp_path, f"{path}:/experimental/science_data/data")
    np.testing.assert_array_equal(ours, theirs)
    sm = header["scientific_metadata"]
    assert sm["source_format"] == "emd"
    assert [x["sampling"]["value"] for x in sm["axes"]] == pytest.approx([5.0, 2.5, 0.8, 0.8])
    assert [x["sampling"]["unit"] for x in sm["axes"]] == ["angstrom", "angstrom", "mrad", "mrad"]
    assert sm["processing"][0]["operation"] == "exact_integer_narrowing"


def test_a_3d_float_dataset_needs_a_scan_and_missing_paths_are_named(tmp_path):
    a = np.random.default_rng(2).normal(size=(R * C, H, W)).astype(np.float32)
    path = tmp_path / "stack.h5"
    with h5py.File(path, "w") as f:
        f["entry/frames"] = a
    out = run("qem", "convert", f"{path}:/entry/frames", tmp_path / "x.qem", check=False)
    assert out.returncode == 2 and b"--scan" in out.stderr
    ours, header = convert(tmp_path, f"{path}:/entry/frames", "--scan", f"{R},{C}")
    np.testing.assert_array_equal(ours, a.reshape(R, C, H, W))
    assert header["scientific_metadata"]["source_format"] == "hdf5"
    out = run("qem", "convert", f"{path}:/entry/nothing", tmp_path / "y.qem", check=False)
    assert out.returncode == 2 and out.stderr.decode().startswith(f"error: {path}: /entry/nothing")
    assert not (tmp_path / "x.qem").exists() and not (tmp_path / "y.qem").exists()


def test_an_emd_dim_vector_declared_huge_is_not_read_whole(tmp_path):
    # Only the first two entries give the step; the vector may declare any
    # length (here 4 GiB of float64, two entries stored).
    a = np.arange(R * C * H * W, dtype=np.uint16).reshape(R, C, H, W)
    path = tmp_path / "scan.emd"
    with emd(path, a) as (_, g):
        for i, (n, step, units) in enumerate([(R, 0.5, "nm"), (C, 0.25, "nm"), (H, 0.8, "mrad")], start=1):
            g.create_dataset(f"dim{i}", data=np.arange(n) * step).attrs["units"] = units
        d = g.create_dataset("dim4", shape=(1 << 29,), dtype=np.float64, chunks=(1024,))
        d[:2] = [0.0, 0.8]
        d.attrs["units"] = "mrad"
    out = tmp_path / "out.qem"
    run("qem", "convert", path, out, preexec_fn=address_space_limit(3))
    sm = json.loads(run("qem", "show", "--json", out).stdout)["header"]["scientific_metadata"]
    assert [x["sampling"]["value"] for x in sm["axes"]] == pytest.approx([5.0, 2.5, 0.8, 0.8])


def test_an_emd_array_reached_by_many_links_is_found_once(tmp_path):
    a = np.arange(R * C * H * W, dtype=np.uint16).reshape(R, C, H, W)
    path = tmp_path / "scan.emd"
    with emd(path, a) as (f, g):
        # A second name for the array's group, and 120 links from the root
        # to itself: searched naively, exponential in the links.
        f["alias"] = g
        for i in range(120):
            f[f"loop{i}"] = f["/"]
            f[f"soft{i}"] = h5py.SoftLink("/")
    out = tmp_path / "out.qem"
    run("qem", "convert", path, out, timeout=30)
    run("qem", "convert", out, tmp_path / "out.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), a)


def test_virtual_datasets_are_read_and_one_that_leads_back_to_itself_is_refused(tmp_path):
    a = np.arange(4 * C * H * W, dtype=np.uint16).reshape(4, C, H, W)
    with h5py.File(tmp_path / "part.h5", "w") as f:
        f["data"] = a
    # Two slabs of one source file (the same source twice is no cycle).
    joined = tmp_path / "joined.h5"
    with h5py.File(joined, "w") as f:
        layout = h5py.VirtualLayout(shape=a.shape, dtype=a.dtype)
        source = h5py.VirtualSource("part.h5", "/data", shape=a.shape)
        layout[:2] = source[:2]
        layout[2:] = source[2:]
        f.create_virtual_dataset("data", layout, fillvalue=0)
    ours, _ = convert(tmp_path, f"{joined}:/data")
    np.testing.assert_array_equal(ours, a)

    # Its source is itself: the library recursed until the stack overflowed.
    loop = tmp_path / "loop.h5"
    with h5py.File(loop, "w") as f:
        layout = h5py.VirtualLayout(shape=(2, 2, 3, 4), dtype="u2")
        layout[:] = h5py.VirtualSource("loop.h5", "/data", shape=(2, 2, 3, 4))
        f.create_virtual_dataset("data", layout, fillvalue=0)
    out = run("qem", "convert", f"{loop}:/data", tmp_path / "loop.qem", check=False, timeout=30)
    err = out.stderr.decode()
    assert out.returncode == 2 and err.startswith(f"error: {loop}: "), err
    assert "virtual dataset whose sources lead back to" in err, err
    assert not (tmp_path / "loop.qem").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_a_detector_too_large_for_the_memory_allowed_is_refused_by_name(tmp_path):
    # One frame of 8000 × 8000 pixels, none of it stored (h5py's fill
    # value): a 3 KB file whose conversion needs about 1.3 GB. Under a
    # 1 GiB limit the process used to abort ("memory allocation of N bytes
    # failed", status 134) and leave its temporary behind.
    path = tmp_path / "big.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", shape=(1, 1, 8000, 8000), dtype="u2", chunks=(1, 1, 1000, 1000))
    out = run("qem", "convert", f"{path}:/data", tmp_path / "big.qem", check=False,
              preexec_fn=address_space_limit(1), timeout=120)
    err = out.stderr.decode()
    assert out.returncode == 2, (out.returncode, err)
    assert err.startswith(f"error: {path}:/data: out of memory: "), err
    assert "20 bytes per detector pixel" in err and "unfinished outputs were removed" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.h5"]
    # With the memory it needs, the same file converts.
    run("qem", "convert", f"{path}:/data", tmp_path / "big.qem", timeout=120)
    assert json.loads(run("qem", "show", "--json", tmp_path / "big.qem").stdout)["header"]["shape"] == [1, 1, 8000, 8000]


@pytest.mark.parametrize("shape, why", [
    # The validity mask alone would take 64 MiB of the header, which holds
    # 16: found after 37 s and 19 GB of memory before.
    ((1, 1, 16384, 16384), "a detector of 268435456 pixels needs a validity mask of 67108864 hex digits"),
    # 2^32 scan positions: the chunk list alone outgrows the header; before,
    # the conversion ran for hours first.
    ((65536, 65536, 1, 1), "4294967296 scan positions in chunks of 512 scans make 8388608 chunks"),
])
def test_a_shape_the_format_cannot_hold_is_refused_at_once(tmp_path, shape, why):
    # A 3 KB file: nothing stored, h5py's fill value everywhere.
    path = tmp_path / "declared.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", shape=shape, dtype="u2", chunks=tuple(min(n, 1024) for n in shape))
    out = run("qem", "convert", f"{path}:/data", tmp_path / "out.qem", check=False,
              preexec_fn=address_space_limit(1), timeout=30)
    err = out.stderr.decode()
    assert out.returncode == 2, (out.returncode, err)
    assert err.startswith(f"error: {path}:/data: "), err
    assert why in err and "more than the 16 MiB the format allows" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["declared.h5"]


# What h5py (LZF) and `hdf5plugin` write from Python, each filter with the
# options that change its chunk layout (block sizes, Blosc's compressors and
# shuffles).
PLUGIN_FILTERS = {
    "h5py-lzf": lambda: {"compression": "lzf"},
    "bitshuffle-lz4": lambda: hdf5plugin.Bitshuffle(cname="lz4"),
    "bitshuffle-zstd-blocks": lambda: hdf5plugin.Bitshuffle(nelems=64, cname="zstd"),
    "bitshuffle-none": lambda: hdf5plugin.Bitshuffle(cname="none"),
    "lz4-blocks": lambda: hdf5plugin.LZ4(nbytes=256),
    "zstd": lambda: hdf5plugin.Zstd(clevel=9),
    "blosc-lz4-shuffle": lambda: hdf5plugin.Blosc(cname="lz4", shuffle=hdf5plugin.Blosc.SHUFFLE),
    "blosc-zstd-bitshuffle": lambda: hdf5plugin.Blosc(cname="zstd", shuffle=hdf5plugin.Blosc.BITSHUFFLE),
    "blosc-zlib": lambda: hdf5plugin.Blosc(cname="zlib"),
    "blosc-snappy": lambda: hdf5plugin.Blosc(cname="snappy"),
}


@pytest.mark.parametrize("name", PLUGIN_FILTERS)
@pytest.mark.parametrize("dtype,values", [(np.uint16, "counts"), (np.float64, "counts"),
                                          (np.uint16, "zeros")])
def test_datasets_compressed_with_hdf5plugin_filters_convert(tmp_path, name, dtype, values):
    """No plugin is installed for the conversion: the filters are decoded
    in-process. Chunks of partial frames exercise short last blocks; zeros,
    each filter's largest expansion."""
    rng = np.random.default_rng(7)
    array = rng.poisson(0.4, (3, 4, 32, 24)).astype(dtype)
    array[:, :, 12:18, 9:15] += 700
    if values == "zeros":
        array[:] = 0
    src = tmp_path / "in.h5"
    with h5py.File(src, "w") as f:
        f.create_dataset("data", data=array, chunks=(1, 2, 32, 20), **PLUGIN_FILTERS[name]())
    with h5py.File(src, "r") as f:
        assert np.array_equal(f["data"][()], array)  # h5py with the plugin reads it
        # Every chunk went through the filter (an optional filter that
        # does not shrink a chunk leaves it stored as it is).
        chunks = f["data"].id
        assert all(chunks.get_chunk_info(i).filter_mask == 0 for i in range(chunks.get_num_chunks()))
    got, _ = convert(tmp_path, f"{src}:/data")
    expected = array.astype(np.float32) if dtype == np.float64 else array
    assert got.dtype == expected.dtype and np.array_equal(got, expected)


@pytest.mark.parametrize("name,why", [("bitshuffle-lz4", "bitshuffle chunk"), ("zstd", "zstd chunk"),
                                      ("blosc-lz4-shuffle", "blosc chunk"), ("h5py-lzf", "lzf chunk")])
def test_a_corrupt_plugin_chunk_is_refused_with_the_reason(tmp_path, name, why):
    array = np.arange(3 * 4 * 32 * 24, dtype=np.uint16).reshape(3, 4, 32, 24) % 300
    src = tmp_path / "in.h5"
    with h5py.File(src, "w") as f:
        f.create_dataset("data", data=array, chunks=(1, 4, 32, 24), **PLUGIN_FILTERS[name]())
    with h5py.File(src, "r") as f:
        info = f["data"].id.get_chunk_info(1)
    assert info.filter_mask == 0
    raw = bytearray(src.read_bytes())
    for at in range(info.byte_offset + 16, info.byte_offset + info.size, 5):
        raw[at] ^= 0x5A
    src.write_bytes(bytes(raw))
    out = tmp_path / "out.qem"
    r = run("qem", "convert", f"{src}:/data", out, check=False)
    err = r.stderr.decode()
    assert r.returncode == 2 and err.startswith(f"error: {src}: /data frames 4..8"), err
    assert why in err, err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["in.h5"]
