"""virtual/sum.npy for every codec: float32 acquisitions (decoded,
compensated float32, against math.fsum) and scaled codes (exact code sums
calibrated once, against numpy on codes.npy and the header's regions), on
`--gpu off` and wgpu."""

import io
import json
import math
import os

import numpy as np
import pytest

from conftest import REPO, backends, cat, load, run


def test_sum_of_a_float32_acquisition_is_compensated(tmp_path):
    rng = np.random.default_rng(4)
    # Large values beside small ones: plain float32 summation loses the
    # small ones, the compensated sum keeps them.
    data = rng.uniform(-1, 1, size=(3, 5, 24, 24)).astype(np.float32)
    data[:, :, 0, 0] = 3.0e7
    data[:, :, 23, 23] = -3.0e7
    src = tmp_path / "f.npy"
    np.save(src, data)
    qem = tmp_path / "f.qem"
    run("qem", "convert", src, qem)
    doc = json.loads(cat(qem, "virtual/detectors.json"))
    assert doc["sum"]["file"] == "sum.npy" and "compensated" in doc["sum"]["how"]
    frames = data.reshape(15, -1)
    want = np.array([np.float32(math.fsum(map(float, f))) for f in frames]).reshape(3, 5)
    plain = frames.sum(axis=1, dtype=np.float32).reshape(3, 5)
    assert np.abs(plain - want).max() > 1e-2
    for flags in backends(qem):
        got = load(qem, "virtual/sum.npy", *flags)
        assert got.dtype == np.float32 and got.shape == (3, 5)
        scale = np.abs(frames.astype(np.float64)).sum(axis=1).reshape(3, 5)
        assert (np.abs(got.astype(np.float64) - want) <= 1e-6 * scale).all(), (flags, got - want)


def test_sum_of_scaled_codes_is_calibrated_once():
    qem = REPO / "examples" / "data" / "derived-scaled.qem"
    header = json.loads(cat(qem, "header.json"))
    assert header.get("valid") is None
    codes = load(qem, "codes.npy").astype(np.uint64)
    rows, cols, dr, dc = codes.shape
    per_frame = codes.reshape(rows * cols, -1).sum(axis=1)
    want = np.empty(rows * cols)
    for r in header["intensity_calibration"]["regions"]:
        f = slice(r["first_frame"], r["stop_frame"])
        want[f] = r["scale"] * per_frame[f].astype(np.float64) + r["offset"] * (dr * dc)
    doc = json.loads(cat(qem, "virtual/detectors.json"))
    assert "calibrated once" in doc["sum"]["how"]
    for flags in backends(qem):
        got = load(qem, "virtual/sum.npy", *flags)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got.reshape(-1), want, rtol=1e-12, atol=0)
