"""TIFF exports read by the field's own readers: tifffile (shape, axes, the
ImageJ hyperstack metadata that Fiji reads), rosettasciio (hyperspy's
reader: axes, scales and units) and hyperspy itself (a calibrated Signal2D).

Headless Fiji is not available; ImageJ's opener reads the first page's
ImageDescription (`ImageJ=`, `images=`, `slices=`, `frames=`,
`hyperstack=true`, `unit`, `spacing`) and XResolution/YResolution, then the
`images` planes stored contiguously after the first strip offset, which is
what these tests check through tifffile.
"""

import io
import json

import numpy as np
import pytest
import tifffile

from conftest import qem_from_array, run


def qem_array(qem, tmp_path):
    """The decoded array, through `qem convert` to .npy."""
    out = tmp_path / "decoded.npy"
    run("qem", "convert", qem, out)
    return np.load(out)


def calibrated_qem(tmp_path, steps, detector_unit):
    """A small uint16 acquisition with the given (scan row, scan column,
    detector row, detector column) sampling, made from a numpy array."""
    rng = np.random.default_rng(7)
    data = rng.integers(0, 900, size=(3, 4, 6, 5), dtype=np.uint16)
    np.save(tmp_path / "src.npy", data)
    names = ["scan_row", "scan_column", "detector_row", "detector_column"]
    units = ["angstrom", "angstrom", detector_unit, detector_unit]
    axes = [
        {"name": n, "size": s, "sampling": {"value": v, "unit": u, "provenance": "test"}}
        for n, s, v, u in zip(names, data.shape, steps, units)
    ]
    (tmp_path / "cal.json").write_text(json.dumps({"axes": axes}))
    qem = tmp_path / "cal.qem"
    run("qem", "convert", tmp_path / "src.npy", qem, "--metadata", tmp_path / "cal.json")
    return qem, data


def pixel_size(page, tag):
    num, den = page.tags[tag].value
    return den / num


def test_convert_writes_an_imagej_hyperstack(examples, tmp_path):
    src = examples / "scan-u16.qem"
    out = tmp_path / "scan.tiff"
    run("qem", "convert", src, out)
    want = qem_array(src, tmp_path)
    with tifffile.TiffFile(out) as tif:
        assert tif.is_imagej
        meta = tif.imagej_metadata
        assert meta["ImageJ"]
        assert meta["images"] == 24 * 32
        assert (meta["frames"], meta["slices"]) == (24, 32)  # T = scan rows, Z = scan columns
        assert meta["hyperstack"] is True
        assert meta.get("channels", 1) == 1
        assert meta["unit"] == "mrad"
        assert meta["spacing"] == pytest.approx(0.5)
        assert meta["zunit"] == "angstrom"
        assert meta["finterval"] == pytest.approx(0.5)
        assert meta["tunit"] == "angstrom"
        page = tif.pages.first
        assert pixel_size(page, "XResolution") == pytest.approx(0.8)
        assert pixel_size(page, "YResolution") == pytest.approx(0.8)
        series = tif.series[0]
        assert series.kind == "imagej"
        assert series.axes == "TZYX"
        assert series.shape == want.shape
        # ImageJ reads `images` planes one after another from the first
        # strip: the pixels must be contiguous there.
        start = page.dataoffsets[0]
        raw = np.fromfile(out, dtype="<u2", count=want.size, offset=start)
        np.testing.assert_array_equal(raw.reshape(want.shape), want)
        got = series.asarray()
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_tiff_round_trips_back_to_qem(examples, tmp_path):
    src = examples / "scan-u16.qem"
    run("qem", "convert", src, tmp_path / "scan.tiff")
    np.save(tmp_path / "back.npy", tifffile.imread(tmp_path / "scan.tiff"))
    run("qem", "convert", tmp_path / "back.npy", tmp_path / "back.qem")
    a = run("qem", "hash", src).stdout.split()[0]
    b = run("qem", "hash", tmp_path / "back.qem").stdout.split()[0]
    assert a == b


def test_tiff_converts_back_to_the_same_qem_array(examples, tmp_path):
    src = examples / "scan-u16.qem"
    run("qem", "convert", src, tmp_path / "scan.tiff")
    run("qem", "convert", tmp_path / "scan.tiff", tmp_path / "direct.qem")
    a = run("qem", "hash", src).stdout.split()[0]
    assert run("qem", "hash", tmp_path / "direct.qem").stdout.split()[0] == a


def test_rosettasciio_loads_axes_and_scales(examples, tmp_path):
    rsciio_tiff = pytest.importorskip("rsciio.tiff")
    src = examples / "scan-u16.qem"
    out = tmp_path / "scan.tiff"
    run("qem", "convert", src, out)
    [signal] = rsciio_tiff.file_reader(str(out))
    np.testing.assert_array_equal(signal["data"], qem_array(src, tmp_path))
    axes = signal["axes"]
    assert [a["size"] for a in axes] == [24, 32, 64, 64]
    assert [a["navigate"] for a in axes] == [True, True, False, False]
    assert [a["units"] for a in axes] == ["angstrom", "angstrom", "mrad", "mrad"]
    assert [a["scale"] for a in axes] == pytest.approx([0.5, 0.5, 0.8, 0.8])


def test_hyperspy_loads_a_calibrated_signal2d(examples, tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")  # hyperspy imports matplotlib; no display here
    hs = pytest.importorskip("hyperspy.api")
    src = examples / "scan-u16.qem"
    out = tmp_path / "scan.tiff"
    run("qem", "convert", src, out)
    signal = hs.load(out)
    assert type(signal).__name__ == "Signal2D"
    np.testing.assert_array_equal(signal.data, qem_array(src, tmp_path))
    am = signal.axes_manager
    # hyperspy lists navigation axes fastest first: scan columns, then rows.
    assert [a.size for a in am.navigation_axes] == [32, 24]
    assert [a.size for a in am.signal_axes] == [64, 64]
    assert [a.scale for a in am.navigation_axes] == pytest.approx([0.5, 0.5])
    assert [a.units for a in am.navigation_axes] == ["angstrom", "angstrom"]
    assert [a.scale for a in am.signal_axes] == pytest.approx([0.8, 0.8])
    assert [a.units for a in am.signal_axes] == ["mrad", "mrad"]


def test_unequal_steps_and_reciprocal_units(tmp_path):
    qem, data = calibrated_qem(tmp_path, [1.5, 2.0, 0.02, 0.025], "1/angstrom")
    out = tmp_path / "cal.tiff"
    run("qem", "convert", qem, out)
    with tifffile.TiffFile(out) as tif:
        meta = tif.imagej_metadata
        assert (meta["frames"], meta["slices"], meta["images"]) == (3, 4, 12)
        assert meta["unit"] == "1/angstrom"
        assert meta["spacing"] == pytest.approx(2.0)
        assert meta["finterval"] == pytest.approx(1.5)
        page = tif.pages.first
        assert pixel_size(page, "XResolution") == pytest.approx(0.025)
        assert pixel_size(page, "YResolution") == pytest.approx(0.02)
        np.testing.assert_array_equal(tif.series[0].asarray(), data)
    rsciio_tiff = pytest.importorskip("rsciio.tiff")
    [signal] = rsciio_tiff.file_reader(str(out))
    axes = signal["axes"]
    # rosettasciio has one stack scale (ImageJ's `spacing`, for Z, the scan
    # columns); it gives it to the T axis too, so only square scan steps
    # reach hyperspy intact. The detector axes keep their own.
    assert axes[1]["scale"] == pytest.approx(2.0)
    assert axes[1]["units"] == "angstrom"
    assert [a["scale"] for a in axes[2:]] == pytest.approx([0.02, 0.025])
    assert [a["units"] for a in axes[2:]] == ["1/angstrom", "1/angstrom"]


def test_uncalibrated_float_file_has_no_units(examples, tmp_path):
    src = examples / "empad-f32.qem"
    out = tmp_path / "empad.tiff"
    run("qem", "convert", src, out)
    with tifffile.TiffFile(out) as tif:
        meta = tif.imagej_metadata
        assert meta["hyperstack"] is True
        assert "unit" not in meta and "spacing" not in meta
        assert "XResolution" not in tif.pages.first.tags
        got = tif.series[0].asarray()
    want = qem_array(src, tmp_path)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_frame_tiff_carries_the_detector_calibration(examples, tmp_path):
    src = examples / "scan-u16.qem"
    tiff = tmp_path / "frame.tiff"
    tiff.write_bytes(run("qem", "cat", src, "frames/12/16.tiff").stdout)
    with tifffile.TiffFile(tiff) as tif:
        assert tif.imagej_metadata["unit"] == "mrad"
        assert pixel_size(tif.pages.first, "XResolution") == pytest.approx(0.8)
        frame = tif.asarray()
    np.testing.assert_array_equal(frame, qem_array(src, tmp_path)[12, 16])


def test_mounted_frame_tiff_reads_like_its_npy(examples, mount):
    mnt = mount(examples)
    frame = mnt / "scan-u16.qem" / "frames" / "12" / "16"
    with tifffile.TiffFile(frame.with_suffix(".tiff")) as tif:
        assert tif.imagej_metadata["unit"] == "mrad"
        got = tif.asarray()
    np.testing.assert_array_equal(got, np.load(frame.with_suffix(".npy")))


def test_virtual_image_tiffs_carry_the_scan_step(examples, tmp_path):
    src = examples / "scan-u16.qem"
    for name, step, unit in [("bf", 0.5, "angstrom"), ("mean_dp", 0.8, "mrad")]:
        tiff = tmp_path / f"{name}.tiff"
        tiff.write_bytes(run("qem", "cat", src, f"virtual/{name}.tiff").stdout)
        want = np.load(io.BytesIO(run("qem", "cat", src, f"virtual/{name}.npy").stdout))
        with tifffile.TiffFile(tiff) as tif:
            assert tif.imagej_metadata["unit"] == unit
            page = tif.pages.first
            assert pixel_size(page, "XResolution") == pytest.approx(step)
            assert pixel_size(page, "YResolution") == pytest.approx(step)
            got = tif.asarray()
        # The TIFF holds the .npy's values exactly (uint64 sums as uint32).
        assert got.dtype == {"bf": np.uint32, "mean_dp": np.float64}[name]
        np.testing.assert_array_equal(got, want)
        rsciio_tiff = pytest.importorskip("rsciio.tiff")
        [signal] = rsciio_tiff.file_reader(str(tiff))
        assert [a["units"] for a in signal["axes"]] == [unit, unit]
        assert [a["scale"] for a in signal["axes"]] == pytest.approx([step, step])


@pytest.mark.parametrize("detector,expected", [((64, 64), np.uint32), ((260, 256), np.float64)])
def test_virtual_tiffs_of_counts_are_exact_past_2_to_the_24(tmp_path, detector, expected):
    """Sums of counts past 2^24 (where float32 skips integers): uint32 when
    every pixel at uint16's maximum would fit, else float64; detectors.json
    says which."""
    rng = np.random.default_rng(5)
    data = rng.integers(4000, 6000, size=(2, 3, *detector), dtype=np.uint16)
    data[0, 0, 0, 0] = 65535
    src = qem_from_array(tmp_path, data, "bright.qem")
    sums = data.reshape(2, 3, -1).sum(axis=-1, dtype=np.uint64)
    assert sums.max() > 2**24 and np.any(sums.astype(np.float32).astype(np.uint64) != sums)
    want = np.load(io.BytesIO(run("qem", "cat", src, "virtual/sum.npy").stdout))
    np.testing.assert_array_equal(want, sums)
    tiff = tmp_path / "sum.tiff"
    tiff.write_bytes(run("qem", "cat", src, "virtual/sum.tiff").stdout)
    got = tifffile.imread(tiff)
    assert got.dtype == expected
    np.testing.assert_array_equal(got, sums)
    said = json.loads(run("qem", "cat", src, "virtual/detectors.json").stdout)["tiff"]
    assert said["images"] == np.dtype(expected).name
    assert said["com_row, com_col, dpc_magnitude, dpc_angle, idpc, mean_dp"] == "float64"


def test_mounted_virtual_tiff_is_the_cat_bytes(examples, mount):
    mnt = mount(examples)
    mounted = (mnt / "scan-u16.qem" / "virtual" / "haadf.tiff").read_bytes()
    assert mounted == run("qem", "cat", examples / "scan-u16.qem", "virtual/haadf.tiff").stdout


def test_cat_data_tiff_is_the_converted_file(examples, tmp_path):
    src = examples / "scan-u16.qem"
    run("qem", "convert", src, tmp_path / "scan.tiff")
    assert run("qem", "cat", src, "data.tiff").stdout == (tmp_path / "scan.tiff").read_bytes()


def test_mounted_data_tiff_opens_as_the_hyperstack(examples, tmp_path, mount):
    src = examples / "scan-u16.qem"
    run("qem", "convert", src, tmp_path / "scan.tiff")
    converted = (tmp_path / "scan.tiff").read_bytes()
    mnt = mount(examples)
    mounted = mnt / "scan-u16.qem" / "data.tiff"
    assert mounted.stat().st_size == len(converted)
    with tifffile.TiffFile(mounted) as tif:
        assert tif.imagej_metadata["images"] == 24 * 32
        assert tif.series[0].axes == "TZYX"
        got = tif.series[0].asarray()
    np.testing.assert_array_equal(got, qem_array(src, tmp_path))
    assert mounted.read_bytes() == converted
