"""Products computed on lookup or from the full pass, against numpy
float64 references computed here from the counts numpy wrote: the masked
centre of mass (LiberTEM's CoM with a mask radius, relative to the given
centre), a point detector, the DPC magnitude and angle, the integrated
DPC (numpy's FFT) and the radial profile of the mean pattern; on
`--gpu off` and wgpu."""

import io
import json
import os

import numpy as np
import pytest

from conftest import backends, cat, load, run


@pytest.fixture
def acquisition(tmp_path):
    """Counts with a bright disk that moves with the scan (a DPC signal)."""
    rng = np.random.default_rng(5)
    sr, sc, dr, dc = 4, 5, 24, 28
    rows, cols = np.indices((dr, dc), dtype=np.float64)
    counts = np.empty((sr, sc, dr, dc), dtype=np.uint16)
    for i in range(sr):
        for j in range(sc):
            cy, cx = 11.5 + 0.7 * np.sin(i), 13.5 + 0.5 * np.cos(j)
            disk = np.hypot(rows - cy, cols - cx) <= 6
            counts[i, j] = rng.poisson(np.where(disk, 400.0, 3.0))
    src = tmp_path / "moving.npy"
    np.save(src, counts)
    qem = tmp_path / "moving.qem"
    run("qem", "convert", src, qem)
    return qem, counts.astype(np.float64)


def test_masked_centre_of_mass_and_point(acquisition):
    qem, counts = acquisition
    dr, dc = counts.shape[2:]
    rows, cols = np.indices((dr, dc), dtype=np.float64)
    cy, cx, r = 11.5, 13.5, 7.5
    inside = np.hypot(rows - cy, cols - cx) <= r
    total = (counts * inside).sum(axis=(2, 3))
    want_row = (counts * inside * (rows - cy)).sum(axis=(2, 3)) / total
    want_col = (counts * inside * (cols - cx)).sum(axis=(2, 3)) / total
    for flags in backends(qem):
        got_row = load(qem, "virtual/com-11.5-13.5-7.5_row.npy", *flags)
        got_col = load(qem, "virtual/com-11.5-13.5-7.5_col.npy", *flags)
        assert got_row.dtype == np.float64 and got_row.shape == (4, 5)
        np.testing.assert_allclose(got_row, want_row, rtol=0, atol=1e-12)
        np.testing.assert_allclose(got_col, want_col, rtol=0, atol=1e-12)
        point = load(qem, "virtual/point-9-20.npy", *flags)
        assert point.dtype == np.uint64
        np.testing.assert_array_equal(point, counts[:, :, 9, 20].astype(np.uint64))
    # Outside the detector: no such file.
    assert run("qem", "cat", qem, "virtual/point-24-0.npy", check=False).returncode != 0


@pytest.mark.parametrize("dtype", [np.uint16, np.float32])
def test_masked_centre_of_mass_on_a_detector_of_whole_tiles(tmp_path, dtype):
    """A 70×72 detector and a disk of radius 30: the mask's bit planes hold
    whole 8×8 and 32×32 tiles (their sums come from the spatial index for
    counts), and rows and columns need 7 bits each."""
    rng = np.random.default_rng(8)
    sr, sc, dr, dc = 3, 4, 70, 72
    rows, cols = np.indices((dr, dc), dtype=np.float64)
    data = rng.poisson(50.0, size=(sr, sc, dr, dc)).astype(np.float64)
    data[:, :, 40:, :20] += 900.0  # asymmetric, so the moments are not trivial
    if dtype == np.float32:
        data = data * 0.37 - 3.0  # negative values too
    data = data.astype(dtype)
    src = tmp_path / "wide.npy"
    np.save(src, data)
    qem = tmp_path / "wide.qem"
    run("qem", "convert", src, qem)
    cy, cx, r = 34.0, 36.5, 30.0
    inside = np.hypot(rows - cy, cols - cx) <= r
    d = data.astype(np.float64)
    total = (d * inside).sum(axis=(2, 3))
    want_row = (d * inside * (rows - cy)).sum(axis=(2, 3)) / total
    want_col = (d * inside * (cols - cx)).sum(axis=(2, 3)) / total
    for flags in backends(qem):
        got_row = load(qem, "virtual/com-34-36.5-30_row.npy", *flags)
        got_col = load(qem, "virtual/com-34-36.5-30_col.npy", *flags)
        if dtype == np.uint16:
            assert got_row.dtype == np.float64
            np.testing.assert_allclose(got_row, want_row, rtol=0, atol=1e-12)
            np.testing.assert_allclose(got_col, want_col, rtol=0, atol=1e-12)
        else:
            # Compensated float32 sums, combined in binary64, rounded once.
            assert got_row.dtype == np.float32
            np.testing.assert_allclose(got_row, want_row, rtol=0, atol=1e-4)
            np.testing.assert_allclose(got_col, want_col, rtol=0, atol=1e-4)


def test_dpc_and_radial_profile(acquisition):
    qem, counts = acquisition
    dr, dc = counts.shape[2:]
    rows, cols = np.indices((dr, dc), dtype=np.float64)
    total = counts.sum(axis=(2, 3))
    com_r = (counts * rows).sum(axis=(2, 3)) / total
    com_c = (counts * cols).sum(axis=(2, 3)) / total
    com_r, com_c = com_r - com_r.mean(), com_c - com_c.mean()
    doc = json.loads(cat(qem, "virtual/detectors.json"))
    cy, cx = doc["center"]
    mean = counts.mean(axis=(0, 1))
    ring = np.floor(np.hypot(rows - cy, cols - cx) + 1e-9).astype(int)
    bins = int(np.ceil(np.hypot(dr - 1, dc - 1))) + 1
    want_profile = np.array(
        [mean[ring == k].mean() if (ring == k).any() else np.nan for k in range(bins)]
    )
    for flags in backends(qem):
        mag = load(qem, "virtual/dpc_magnitude.npy", *flags)
        ang = load(qem, "virtual/dpc_angle.npy", *flags)
        np.testing.assert_allclose(mag, np.hypot(com_r, com_c), rtol=0, atol=1e-12)
        np.testing.assert_allclose(ang, np.arctan2(com_r, com_c), rtol=0, atol=1e-9)
        # iDPC: numpy's own Fourier integration of the numpy CoM field.
        ky = np.fft.fftfreq(com_r.shape[0])[:, None]
        kx = np.fft.fftfreq(com_r.shape[1])[None, :]
        k2 = kx**2 + ky**2
        k2[0, 0] = 1.0
        spectrum = (ky * np.fft.fft2(com_r) + kx * np.fft.fft2(com_c)) / (2j * np.pi * k2)
        spectrum[0, 0] = 0.0
        want_idpc = np.fft.ifft2(spectrum).real
        idpc = load(qem, "virtual/idpc.npy", *flags)
        assert idpc.dtype == np.float64
        np.testing.assert_allclose(idpc, want_idpc, rtol=0, atol=1e-10)
        profile = load(qem, "virtual/radial_profile.npy", *flags)
        assert profile.dtype == np.float64 and profile.shape == (bins,)
        np.testing.assert_allclose(profile, want_profile, rtol=1e-12, atol=0, equal_nan=True)
