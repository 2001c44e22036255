"""TIFF stacks into .qem, written by tifffile: multi-page stacks with
--scan, tifffile's shaped 4-D series, BigTIFF, ImageJ hyperstacks and
Deflate-compressed pages, compared value for value with tifffile's reading."""

import json

import numpy as np
import pytest
import tifffile

from conftest import run

R, C, H, W = 3, 4, 9, 7


def data(dtype=np.uint16, seed=5):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.normal(0, 100, size=(R, C, H, W)).astype(dtype)
    return rng.integers(0, 4000, size=(R, C, H, W)).astype(dtype)


def convert(tmp_path, src, *flags):
    out = tmp_path / "out.qem"
    run("qem", "convert", src, out, *flags)
    run("qem", "validate", out)
    run("qem", "convert", out, tmp_path / "out.npy")
    header = json.loads(run("qem", "show", "--json", out).stdout)["header"]
    return np.load(tmp_path / "out.npy"), header


def test_a_plain_stack_needs_the_scan(tmp_path):
    a = data()
    src = tmp_path / "stack.tif"
    tifffile.imwrite(src, a.reshape(R * C, H, W), photometric="minisblack", metadata=None)
    assert tifffile.imread(src).shape == (R * C, H, W)
    out = run("qem", "convert", src, tmp_path / "x.qem", check=False)
    assert out.returncode == 2 and b"--scan" in out.stderr
    ours, header = convert(tmp_path, src, "--scan", f"{R},{C}")
    np.testing.assert_array_equal(ours, tifffile.imread(src).reshape(R, C, H, W))
    assert header["scientific_metadata"]["source_format"] == "tiff"


@pytest.mark.parametrize(
    "kwargs",
    [
        {},  # tifffile's shaped series: a JSON description with the 4-D shape
        {"bigtiff": True},
        {"compression": "zlib"},
        {"imagej": True, "metadata": {"axes": "TZYX"}},
    ],
    ids=["shaped", "bigtiff", "deflate", "imagej"],
)
def test_stacks_that_carry_their_shape(tmp_path, kwargs):
    a = data(np.float32 if kwargs.get("bigtiff") else np.uint16)
    src = tmp_path / "scan.tif"
    tifffile.imwrite(src, a, photometric="minisblack", **kwargs)
    theirs = tifffile.imread(src)
    assert theirs.size == a.size
    ours, header = convert(tmp_path, src)
    assert header["shape"] == [R, C, H, W]
    np.testing.assert_array_equal(ours, theirs.reshape(R, C, H, W))
    assert header["scientific_metadata"]["source_metadata"]["tiff_image_description"]


def test_wider_page_types_follow_the_exact_narrowing_rule(tmp_path):
    a = data(np.uint32)
    src = tmp_path / "u32.tif"
    tifffile.imwrite(src, a, photometric="minisblack")
    ours, header = convert(tmp_path, src)
    np.testing.assert_array_equal(ours, a)
    assert header["scientific_metadata"]["processing"][0]["operation"] == "exact_integer_narrowing"
    a[2, 1, 4, 3] = 1 << 20
    tifffile.imwrite(src, a, photometric="minisblack")
    out = run("qem", "convert", src, tmp_path / "bad.qem", check=False)
    assert out.returncode == 2 and b"element (2, 1, 4, 3) = 1048576" in out.stderr, out.stderr
    assert not (tmp_path / "bad.qem").exists()


def test_colour_pages_are_refused(tmp_path):
    src = tmp_path / "rgb.tif"
    tifffile.imwrite(src, np.zeros((4, H, W, 3), np.uint8), photometric="rgb")
    out = run("qem", "convert", src, tmp_path / "x.qem", "--scan", "2,2", check=False)
    assert out.returncode == 2 and b"single-channel" in out.stderr


def test_our_own_tiff_output_converts_back(tmp_path):
    a = data(np.float32)
    np.save(tmp_path / "a.npy", a)
    run("qem", "convert", tmp_path / "a.npy", tmp_path / "a.tiff")
    ours, _ = convert(tmp_path, tmp_path / "a.tiff")
    np.testing.assert_array_equal(ours.view(np.uint32), a.view(np.uint32))
