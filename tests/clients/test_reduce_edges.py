"""Mask edges: a pixel centre within 1e-9 of an edge is on it (the default
HAADF of a 7×7 detector reaches its corners), and `--mask-edges` reproduces
the conventions of LiberTEM (inner edge excluded) and py4DSTEM (both
excluded). References are numpy masks computed here from distances."""

import io
import json

import numpy as np

from conftest import cat, run


def convert(tmp_path, name, array):
    src = tmp_path / f"{name}.npy"
    np.save(src, array)
    out = tmp_path / f"{name}.qem"
    run("qem", "convert", src, out)
    return out


def distances(shape, cy, cx):
    rows, cols = np.indices(shape, dtype=np.float64)
    return np.hypot(rows - cy, cols - cx)


def test_default_haadf_of_a_7x7_detector_has_all_28_pixels(tmp_path):
    rng = np.random.default_rng(7)
    # Flat counts: no bright-field disk, so the documented fallback
    # geometry (centre (3, 3), radius 1) is used.
    counts = rng.integers(5, 9, size=(2, 3, 7, 7)).astype(np.uint16)
    qem = convert(tmp_path, "flat7", counts)
    doc = json.loads(cat(qem, "virtual/detectors.json"))
    assert doc["bright_field_disk"]["method"] == "fallback"
    assert doc["mask_edges"] == "inclusive"
    haadf = doc["detectors"]["haadf"]
    assert haadf["pixels"] == 28, haadf
    d = distances((7, 7), *doc["center"])
    # Every pixel at or beyond the inner radius: the outer radius is the
    # farthest centre itself.
    sel = d >= haadf["inner_radius"]
    assert sel.sum() == 28 and sel[0, 0] and sel[6, 6]
    got = np.load(io.BytesIO(cat(qem, "virtual/haadf.npy")))
    np.testing.assert_array_equal(got, (counts.astype(np.uint64) * sel).sum(axis=(2, 3)))


def test_mask_edge_conventions(tmp_path):
    rng = np.random.default_rng(9)
    counts = rng.integers(0, 1000, size=(2, 2, 9, 9)).astype(np.uint16)
    qem = convert(tmp_path, "edges9", counts)
    d = distances((9, 9), 4.0, 4.0)
    wide = counts.astype(np.uint64)
    rules = {
        "inclusive": ((d >= 1) & (d <= 3), d <= 2),
        "libertem": ((d > 1) & (d <= 3), d <= 2),
        "py4dstem": ((d > 1) & (d < 3), d < 2),
    }
    images = {}
    for name, (ring, disk) in rules.items():
        flags = [] if name == "inclusive" else ["--mask-edges", name]
        got = np.load(io.BytesIO(cat(qem, "virtual/annulus-4-4-1-3.npy", *flags)))
        np.testing.assert_array_equal(got, (wide * ring).sum(axis=(2, 3)), err_msg=name)
        got = np.load(io.BytesIO(cat(qem, "virtual/disk-4-4-2.npy", *flags)))
        np.testing.assert_array_equal(got, (wide * disk).sum(axis=(2, 3)), err_msg=name)
        doc = json.loads(cat(qem, "virtual/detectors.json", *flags))
        assert doc["mask_edges"] == name
        images[name] = got
    # The edges hold pixels, so the conventions really differ here.
    assert not np.array_equal(images["libertem"], images["py4dstem"])
    bad = run("qem", "cat", "--mask-edges", "both", qem, "virtual/bf.npy", check=False)
    assert bad.returncode == 2 and b"mask" in bad.stderr
