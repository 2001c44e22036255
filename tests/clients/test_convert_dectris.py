"""DECTRIS ARINA/EIGER HDF5 into .qem: master and data files written by
h5py with hdf5plugin's bitshuffle-LZ4 (and LZ4, gzip, none), in the DECTRIS
layout (external links, pixel mask, NeXus quantities); converted without
any HDF5 plugin at run time and compared with h5py's reading."""

import json

import h5py
import hdf5plugin
import numpy as np
import pytest

from conftest import address_space_limit, run

H, W = 16, 24


def counts(n, high=3000, dtype=np.uint16, seed=11):
    return np.random.default_rng(seed).integers(0, high, size=(n, H, W)).astype(dtype)


def write_dectris(folder, parts, *, compression="bitshuffle", chunk=1, mask=None, name="scan"):
    master = folder / f"{name}_master.h5"
    with h5py.File(master, "w") as m:
        for i, frames in enumerate(parts, start=1):
            data_name = f"{name}_data_{i:06d}.h5"
            with h5py.File(folder / data_name, "w") as d:
                kwargs = {
                    "bitshuffle": dict(hdf5plugin.Bitshuffle(nelems=0, cname="lz4")),
                    "lz4": dict(hdf5plugin.LZ4()),
                    "gzip": {"compression": "gzip"},
                    "none": {},
                }[compression]
                d.create_dataset("entry/data/data", data=frames, chunks=(chunk, H, W), **kwargs)
            m[f"entry/data/data_{i:06d}"] = h5py.ExternalLink(data_name, "/entry/data/data")
        det = m.create_group("entry/instrument/detector")
        det["count_time"] = 0.001
        det["x_pixel_size"] = 75e-6
        det["y_pixel_size"] = 75e-6
        det["detector_distance"] = 0.15
        m["entry/instrument/beam/incident_wavelength"] = 0.0197
        if mask is not None:
            det["detectorSpecific/pixel_mask"] = mask.astype(np.uint32)
    return master


def convert(tmp_path, master, *flags):
    out = tmp_path / "out.qem"
    run("qem", "convert", master, out, *flags, cwd="/")
    run("qem", "validate", out)
    run("qem", "convert", out, tmp_path / "out.npy")
    return np.load(tmp_path / "out.npy"), json.loads(run("qem", "show", "--json", out).stdout)["header"]


def read_all(master):
    with h5py.File(master) as m:
        names = sorted(k for k in m["entry/data"] if k.startswith("data_"))
        return np.concatenate([m["entry/data"][k][()] for k in names])


@pytest.mark.parametrize("compression", ["bitshuffle", "lz4", "gzip", "none"])
def test_dectris_frames_match_h5py(tmp_path, compression):
    mask = np.zeros((H, W), np.uint32)
    mask[3, 5] = 1
    mask[7, 0] = 8
    master = write_dectris(tmp_path, [counts(6), counts(6, seed=2)], compression=compression, mask=mask)
    theirs = read_all(master)
    ours, header = convert(tmp_path, master, "--scan", "3,4")
    np.testing.assert_array_equal(ours, theirs.reshape(3, 4, H, W))
    sm = header["scientific_metadata"]
    assert sm["source_format"] == "dectris-hdf5"
    assert sm["source_metadata"]["count_time"] == {"value": 0.001, "unit": "s", "path": "/entry/instrument/detector/count_time"}
    mrad = np.arctan(75e-6 / 0.15) * 1e3
    assert [a["sampling"]["value"] for a in sm["axes"][2:]] == pytest.approx([mrad, mrad])
    valid = np.array(header["metadata"]["valid_pixels"])
    np.testing.assert_array_equal(valid, mask == 0)


def test_multi_frame_chunks_and_a_square_scan(tmp_path):
    master = write_dectris(tmp_path, [counts(10), counts(6, seed=4)], chunk=4)
    ours, header = convert(tmp_path, master)  # 16 frames: a 4×4 scan
    assert header["shape"] == [4, 4, H, W]
    np.testing.assert_array_equal(ours, read_all(master).reshape(4, 4, H, W))


def test_uint32_counts_fit_or_are_refused_naming_frame_and_pixel(tmp_path):
    mask = np.zeros((H, W), np.uint32)
    mask[2, 2] = 1
    frames = counts(4, high=60000, dtype=np.uint32)
    frames[:, 2, 2] = 0xFFFFFFFF  # a defect marker in a masked pixel
    master = write_dectris(tmp_path, [frames], mask=mask)
    ours, header = convert(tmp_path, master)
    want = frames.copy()
    want[:, 2, 2] = 0
    np.testing.assert_array_equal(ours, want.reshape(2, 2, H, W))
    ops = [p["operation"] for p in header["scientific_metadata"]["processing"]]
    assert ops == ["exact_integer_narrowing", "flagged_marker_zeroing"]
    frames[3, 9, 10] = 70000
    master = write_dectris(tmp_path, [frames], mask=mask, name="bad")
    out = run("qem", "convert", master, tmp_path / "bad.qem", check=False)
    assert out.returncode == 2 and b"frame 3 pixel (9, 10): counts 70000" in out.stderr, out.stderr
    assert not (tmp_path / "bad.qem").exists()


def test_missing_data_files_and_corrupt_chunks_are_refused(tmp_path):
    master = write_dectris(tmp_path, [counts(2), counts(2, seed=3)])
    (tmp_path / "scan_data_000002.h5").unlink()
    out = run("qem", "convert", master, tmp_path / "a.qem", check=False)
    err = out.stderr.decode()
    assert out.returncode == 2, err
    assert "/entry/data/data_000002 cannot be opened: its linked data file" in err, err
    assert "scan_data_000002.h5 is missing" in err, err
    master = write_dectris(tmp_path, [counts(2), counts(2, seed=3)], name="corrupt")
    data = tmp_path / "corrupt_data_000002.h5"
    with h5py.File(data) as d:
        info = d["entry/data/data"].id.get_chunk_info(1)
    raw = bytearray(data.read_bytes())
    # LZ4 carries no checksum, so flipped literal bytes decode silently; what
    # is detectable is a broken structure: here the first block's length.
    at = info.byte_offset + 12
    raw[at : at + 4] = (0x7FFF0000).to_bytes(4, "big")
    data.write_bytes(bytes(raw))
    out = run("qem", "convert", master, tmp_path / "b.qem", "--scan", "2,2", check=False)
    err = out.stderr.decode()
    assert out.returncode == 2 and "/entry/data/data_000002 chunk at frame 1" in err, err
    assert not (tmp_path / "a.qem").exists() and not (tmp_path / "b.qem").exists()


@pytest.mark.parametrize("dtype,depth,marker", [(np.uint16, None, 0xFFFF), (np.uint16, 12, 4095), (np.uint32, None, 0xFFFFFFFF)])
def test_overflow_markers_are_refused_or_masked_as_the_user_chooses(tmp_path, dtype, depth, marker):
    mask = np.zeros((H, W), np.uint32)
    mask[1, 1] = 1
    frames = counts(4, high=min(marker, 3000), dtype=dtype)
    frames[:, 1, 1] = marker  # flagged: stored as 0 under either policy
    frames[2, 5, 6] = marker  # an overflow in an unflagged pixel
    frames[3, 0, 9] = marker
    master = write_dectris(tmp_path, [frames], mask=mask)
    if depth is not None:
        with h5py.File(master, "a") as m:
            m["entry/instrument/detector/bit_depth_image"] = np.uint32(depth)
    out = run("qem", "convert", master, tmp_path / "refused.qem", check=False)
    err = out.stderr.decode()
    assert out.returncode == 2, err
    assert f"frame 2 pixel (5, 6): the DECTRIS overflow/defect marker {marker}" in err, err
    assert "--dectris-markers mask" in err, err
    assert not (tmp_path / "refused.qem").exists()

    ours, header = convert(tmp_path, master, "--dectris-markers", "mask")
    invalid = mask != 0
    invalid[5, 6] = invalid[0, 9] = True
    # Markers become 0; the other counts of a pixel made invalid are kept,
    # as the format keeps every invalid pixel's counts.
    want = np.where(frames == marker, 0, frames).astype(np.uint64)
    np.testing.assert_array_equal(ours, want.reshape(2, 2, H, W))
    np.testing.assert_array_equal(np.array(header["metadata"]["valid_pixels"]), ~invalid)
    ops = {p["operation"]: p for p in header["scientific_metadata"]["processing"]}
    assert ops["marker_pixel_masking"]["changes_measurements"] is True
    assert ops["marker_pixel_masking"]["description"].startswith("2 pixels")
    assert "flagged_marker_zeroing" in ops
    # The valid total respects the mask: the markers never reach a sum.
    total = int(np.load(tmp_path / "out.npy")[..., ~invalid].sum())
    assert total == int(frames.astype(np.uint64)[:, ~invalid].sum())


def test_a_truncated_data_file_is_named_as_such(tmp_path):
    master = write_dectris(tmp_path, [counts(4), counts(4, seed=5)])
    data = tmp_path / "scan_data_000002.h5"
    data.write_bytes(data.read_bytes()[:-100])
    out = run("qem", "convert", master, tmp_path / "cut.qem", "--scan", "2,4", check=False)
    err = out.stderr.decode()
    assert out.returncode == 2, err
    assert "scan_master.h5" in err and "/entry/data/data_000002" in err, err
    # The library's own reason, not only the test's folder name.
    assert "truncated file: eof" in err, err
    assert not (tmp_path / "cut.qem").exists()


# Not plain LZ4: its filter stores incompressible blocks verbatim and
# carries no checksum, so zeros in place of such a block's bytes are
# indistinguishable from counts of zero.
@pytest.mark.parametrize("compression", ["bitshuffle", "gzip"])
def test_a_chunk_cut_short_is_refused_naming_the_chunk(tmp_path, compression):
    master = write_dectris(tmp_path, [counts(4), counts(4, seed=5)], compression=compression)
    data = tmp_path / "scan_data_000002.h5"
    with h5py.File(data) as d:
        info = d["entry/data/data"].id.get_chunk_info(2)
    raw = bytearray(data.read_bytes())
    # The file keeps its length; the chunk's second half is gone (zeros),
    # as a copy interrupted mid-chunk onto a preallocated file leaves it.
    half = info.byte_offset + info.size // 2
    raw[half : info.byte_offset + info.size] = bytes(info.byte_offset + info.size - half)
    data.write_bytes(bytes(raw))
    out = run("qem", "convert", master, tmp_path / "cut.qem", "--scan", "2,4", check=False)
    err = out.stderr.decode()
    assert out.returncode == 2, err
    assert "scan_master.h5" in err and "/entry/data/data_000002 chunk at frame 2" in err, err
    assert "panicked" not in err
    assert not (tmp_path / "cut.qem").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["scan_master.h5", "scan_data_000001.h5", "scan_data_000002.h5"])


def test_a_pixel_mask_declared_huge_is_refused_before_it_is_read(tmp_path):
    master = write_dectris(tmp_path, [counts(4)])
    with h5py.File(master, "a") as m:
        # 64 GiB declared, nothing stored: a few KB on disk.
        m.create_dataset("entry/instrument/detector/detectorSpecific/pixel_mask",
                         shape=(1 << 17, 1 << 17), dtype=np.uint32, chunks=(64, 64))
    out = run("qem", "convert", master, tmp_path / "a.qem", "--scan", "2,2", check=False,
              preexec_fn=address_space_limit(3))
    err = out.stderr.decode()
    assert out.returncode == 2, err
    assert err.startswith(f"error: {master}: ") and f"has {1 << 34} pixels, the frames {H * W}" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scan_data_000001.h5", master.name]
