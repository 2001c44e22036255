"""The detector validity mask as numpy sees it: `mask.npy` beside
`data.npy`, `valid_pixels` in info.json, and totals that respect it."""

import io
import json

import numpy as np

from conftest import run


def cat(qem, rel):
    return run("qem", "cat", qem, rel).stdout


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
