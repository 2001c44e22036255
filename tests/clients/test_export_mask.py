"""The detector validity mask as numpy sees it: `mask.npy` beside
`data.npy`, `valid_pixels` in info.json, and totals that respect it."""

import io
import json

import numpy as np

from conftest import cat, run


def test_mask_npy_leaves_out_the_invalid_pixels(examples):
    src = examples / "scan-u16.qem"
    mask = np.load(io.BytesIO(cat(src, "mask.npy")))
    data = np.load(io.BytesIO(cat(src, "data.npy")))
    assert mask.dtype == np.bool_
    assert mask.shape == data.shape[2:]
    info = json.loads(cat(src, "info.json"))["summary"]
    assert info["valid_pixels"] == int(mask.sum())
    assert info["invalid_pixels"] == int((~mask).sum()) > 0
    # The spatial index sums valid pixels only; so does data.npy under the mask.
    sums = np.load(io.BytesIO(cat(src, "virtual/sum.npy")))
    np.testing.assert_array_equal(data.sum(axis=(2, 3), dtype=np.uint64, where=mask), sums)
    assert data.sum(dtype=np.uint64) > sums.sum()


def test_codecs_without_a_mask_have_no_mask_npy(examples):
    for name in ["empad-f32.qem", "derived-scaled.qem"]:
        listing = run("qem", "ls", examples / name).stdout.decode().split()
        assert "data.npy" in listing and "mask.npy" not in listing
        assert json.loads(cat(examples / name, "info.json"))["summary"]["valid_pixels"] is None


def test_mounted_mask_npy(examples, mount):
    mnt = mount(examples)
    mask = np.load(mnt / "scan-u16.qem" / "mask.npy")
    data = np.load(mnt / "scan-u16.qem" / "data.npy", mmap_mode="r")
    sums = np.load(mnt / "scan-u16.qem" / "virtual" / "sum.npy")
    assert int(data.sum(dtype=np.uint64, where=mask)) == int(sums.sum())


def test_masked_exports_zero_the_invalid_pixels(examples, tmp_path):
    import tifffile

    src = examples / "scan-u16.qem"
    mask = np.load(io.BytesIO(cat(src, "mask.npy")))
    data = np.load(io.BytesIO(cat(src, "data.npy")))
    sums = np.load(io.BytesIO(cat(src, "virtual/sum.npy")))
    run("qem", "convert", src, tmp_path / "m.npy", "--masked")
    run("qem", "convert", src, tmp_path / "m.tiff", "--masked")
    for got in [np.load(tmp_path / "m.npy"), tifffile.imread(tmp_path / "m.tiff")]:
        assert got.dtype == data.dtype and got.shape == data.shape
        assert not got[..., ~mask].any()
        np.testing.assert_array_equal(got[..., mask], data[..., mask])
        np.testing.assert_array_equal(got.sum(axis=(2, 3), dtype=np.uint64), sums)


def test_masked_is_refused_where_it_cannot_apply(examples, tmp_path):
    no_mask = run("qem", "convert", examples / "empad-f32.qem", tmp_path / "e.npy", "--masked", check=False)
    assert no_mask.returncode == 2
    assert b"empad-f32.qem" in no_mask.stderr and b"no validity mask" in no_mask.stderr
    to_qem = run("qem", "convert", examples / "scan-u16.qem", tmp_path / "s.qem", "--masked", check=False)
    assert to_qem.returncode == 2
    assert list(tmp_path.iterdir()) == []
