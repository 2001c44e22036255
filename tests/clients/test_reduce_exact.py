"""Virtual images against numpy references computed here in float64 (or
exactly, with math.fsum), on files that numpy writes and `qem convert`
encodes, read back through `qem cat` on the CPU (`--gpu off`) and on wgpu
(`--gpu wgpu`, Mesa's software Vulkan in CI; skipped where no adapter
exists, unless CI is set)."""

import io
import json
import math
import os

import numpy as np
import pytest

from conftest import backends, cat, load, run

FLT_MAX = float(np.finfo(np.float32).max)


def convert(tmp_path, name, array):
    src = tmp_path / f"{name}.npy"
    np.save(src, array)
    out = tmp_path / f"{name}.qem"
    run("qem", "convert", src, out)
    return out


def disk_mask(shape, cy, cx, r):
    rows, cols = np.indices(shape, dtype=np.float64)
    return (rows - cy) ** 2 + (cols - cx) ** 2 <= r * r


def test_count_images_above_2_24_are_exact_uint64(tmp_path):
    rng = np.random.default_rng(24)
    counts = (60001 + 2 * rng.integers(0, 2000, size=(3, 4, 40, 36))).astype(np.uint16)
    qem = convert(tmp_path, "dense", counts)
    wide = counts.astype(np.uint64)
    disk = disk_mask((40, 36), 19.5, 17.5, 15.0)
    want_disk = (wide * disk).sum(axis=(2, 3))
    assert (want_disk > 2**24).all()
    assert (want_disk.astype(np.float32).astype(np.uint64) != want_disk).any()
    for flags in backends(qem):
        got = load(qem, "virtual/disk-19.5-17.5-15.npy", *flags)
        assert got.dtype == np.uint64 and got.shape == (3, 4)
        np.testing.assert_array_equal(got, want_disk)
        total = load(qem, "virtual/annulus-19.5-17.5-0-100.npy", *flags)
        np.testing.assert_array_equal(total, wide.sum(axis=(2, 3)))
        mean = load(qem, "virtual/mean_dp.npy", *flags)
        assert mean.dtype == np.float64
        np.testing.assert_array_equal(mean, wide.sum(axis=(0, 1)) / 12.0)
        com = load(qem, "virtual/com_row.npy", *flags)
        rows = np.arange(40, dtype=np.float64)[:, None]
        absolute = (wide * rows.astype(np.uint64)).sum(axis=(2, 3)) / wide.sum(axis=(2, 3))
        np.testing.assert_allclose(com, absolute - absolute.mean(), rtol=0, atol=1e-12)


def exact_sum(terms):
    """The exact sum rounded once to float32; NaN for a NaN or both
    infinities, else the infinity summed."""
    terms = [float(t) for t in terms]
    if any(math.isnan(t) for t in terms) or (math.inf in terms and -math.inf in terms):
        return math.nan
    if math.inf in terms or -math.inf in terms:
        return math.inf if math.inf in terms else -math.inf
    s = math.fsum(terms)
    with np.errstate(over="ignore"):
        return float(np.float32(s))


def test_float_extremes_match_an_exact_reference_on_every_backend(tmp_path):
    rng = np.random.default_rng(15)
    data = np.round(rng.uniform(-10, 10, size=(4, 6, 8, 8)), 2).astype(np.float32)
    frames = data.reshape(24, 64)
    for frame, pixel, value in [
        (0, 9, FLT_MAX), (0, 27, FLT_MAX),                      # overflow: +inf
        (1, 9, FLT_MAX), (1, 27, FLT_MAX), (1, 36, -FLT_MAX),   # back in range
        (2, 9, FLT_MAX), (2, 10, -6.03), (2, 54, -FLT_MAX),     # keeps -6.03
        (3, 20, math.inf), (4, 21, math.nan),
        (5, 9, math.inf), (5, 10, -math.inf),                   # NaN
        (6, 9, -FLT_MAX), (6, 27, -FLT_MAX),                    # -inf
    ]:
        frames[frame, pixel] = value
    qem = convert(tmp_path, "extreme", data)
    disk = disk_mask((8, 8), 3.5, 3.5, 3.6).reshape(64)
    results = []
    for flags in backends(qem):
        got = load(qem, "virtual/disk-3.5-3.5-3.6.npy", *flags).reshape(24)
        assert got.dtype == np.float32
        for f in range(24):
            terms = frames[f][disk]
            want = exact_sum(terms)
            small = sum(abs(float(t)) for t in terms if abs(t) < 2.0**126 and math.isfinite(t))
            if math.isnan(want):
                assert math.isnan(got[f]), (flags, f, got[f])
            elif math.isinf(want) or got[f] != want:
                assert got[f] == want or abs(float(got[f]) - want) <= 1e-6 * max(small, 1) + 1e-6 * abs(
                    want
                ), (flags, f, got[f], want)
        assert got[0] == np.inf and got[6] == -np.inf and math.isnan(got[5])
        assert got[1] == np.float32(FLT_MAX)
        results.append(got)
    if len(results) == 2:
        np.testing.assert_array_equal(results[0], results[1])
