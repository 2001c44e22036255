"""EMD 1.0 / HDF5 export (`qem convert X.qem X.emd`, `.h5`, `.hdf5`), read by
the field's readers, and back through `qem convert`.

py4DSTEM (0.14.18) pins numpy < 2, so it cannot share .venv with zarr 3;
it has its own environment, `.venv-py4dstem/` (scripts/setup.sh,
scripts/requirements-py4dstem.txt; QEMFS_PY4DSTEM_PYTHON points elsewhere),
and `test_py4dstem_reads_a_calibrated_datacube` runs `py4DSTEM.read` there.
The layout it relies on is also checked with h5py here, item by item, as
emdfile (py4DSTEM's EMD layer) reads it:
- file attributes `emd_group_type` = "file", `version_major` 1, `version_minor` 0
  (`_is_EMD_file`), and one top-level group with `emd_group_type` = "root";
- data nodes are groups with `emd_group_type` in ("array", ...) and a
  `python_class` naming the class to build ("DataCube");
- an array group holds `data` and one vector `dim0`..`dim3` per axis (numbered
  from 0; two values for a linear axis), each with `name` and `units`;
- the root's `metadatabundle/calibration` (python_class "Calibration") holds
  `R_pixel_size`, `R_pixel_units`, `Q_pixel_size`, `Q_pixel_units` as scalar
  datasets with a `type` attribute ("number", "string"), Q units one of
  "A^-1", "mrad", "pixels"; `_target_paths` lists the nodes it calibrates.
rosettasciio (hyperspy's reader) loads the same file with all four axes
calibrated, scan row and column each with its own step, which its TIFF
reader cannot do (it has one stack step; see test_export_tiff.py).
"""

import json
import subprocess

import h5py
import numpy as np
import pytest

from conftest import py4dstem_python, run
from test_export_tiff import calibrated_qem


def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def qem_array(qem, tmp_path):
    """The decoded array, through `qem convert` to .npy."""
    out = tmp_path / f"{qem.stem}.decoded.npy"
    if not out.exists():
        run("qem", "convert", qem, out)
    return np.load(out)


def qem_hash(path):
    return run("qem", "hash", path).stdout.split()[0]


def test_the_layout_is_the_one_py4dstem_reads(examples, tmp_path):
    src = examples / "scan-u16.qem"
    out = tmp_path / "scan.emd"
    run("qem", "convert", src, out)
    want = qem_array(src, tmp_path)
    with h5py.File(out, "r") as f:
        assert text(f.attrs["emd_group_type"]) == "file"
        assert (f.attrs["version_major"], f.attrs["version_minor"]) == (1, 0)
        roots = [k for k in f if text(f[k].attrs.get("emd_group_type", "")) == "root"]
        assert roots == ["datacube_root"]
        root = f["datacube_root"]
        assert text(root.attrs["python_class"]) == "Root"
        cube = root["datacube"]
        assert text(cube.attrs["emd_group_type"]) == "array"
        assert text(cube.attrs["python_class"]) == "DataCube"
        data = cube["data"]
        assert data.dtype == np.uint16 and data.shape == want.shape
        # Chunked by scan block: 512 scans of 32 columns = 16 whole rows.
        assert data.chunks == (16, 32, 64, 64)
        assert data.compression is None
        np.testing.assert_array_equal(data[()], want)
        for i, (name, step, unit) in enumerate(
            [("Rx", 0.5, "A"), ("Ry", 0.5, "A"), ("Qx", 0.8, "mrad"), ("Qy", 0.8, "mrad")]
        ):
            dim = cube[f"dim{i}"]
            assert text(dim.attrs["name"]) == name
            assert text(dim.attrs["units"]) == unit
            np.testing.assert_allclose(dim[()], [0.0, step])
        cal = root["metadatabundle/calibration"]
        assert text(root["metadatabundle"].attrs["emd_group_type"]) == "metadatabundle"
        assert text(cal.attrs["emd_group_type"]) == "metadata"
        assert text(cal.attrs["python_class"]) == "Calibration"
        for key, kind, value in [
            ("R_pixel_size", "number", 0.5),
            ("R_pixel_units", "string", "A"),
            ("Q_pixel_size", "number", 0.8),
            ("Q_pixel_units", "string", "mrad"),
        ]:
            assert text(cal[key].attrs["type"]) == kind
            got = cal[key][()]
            assert (text(got) == value) if kind == "string" else got == pytest.approx(value)
        assert text(cal["_target_paths"].attrs["type"]) == "list_of_strings"
        assert text(cal["_target_paths/0"][()]) == "/datacube"
        # What py4DSTEM does not know, kept for the way back: the mask
        # (the example has two hot pixels) and the original metadata.
        qem = root["metadatabundle/qem"]
        mask = qem["valid_mask"][()]
        assert mask.dtype == np.bool_ and mask.shape == (64, 64) and (~mask).sum() == 2
        sm = json.loads(text(qem["scientific_metadata"][()]))
        assert sm["axes"][0]["sampling"]["value"] == 0.5


def test_emd_converts_back_to_the_same_qem(examples, tmp_path):
    for name in ["scan-u16", "empad-f32", "derived-scaled"]:
        src = examples / f"{name}.qem"
        emd = tmp_path / f"{name}.emd"
        back = tmp_path / f"{name}.back.qem"
        run("qem", "convert", src, emd)
        # No dataset path: the HDF5 import finds the EMD array itself.
        run("qem", "convert", emd, back)
        run("qem", "validate", back)
        assert qem_hash(back) == qem_hash(src), name
    # A counts file comes back whole: values, mask and metadata.
    diff = run("qem", "diff", examples / "scan-u16.qem", tmp_path / "scan-u16.back.qem", check=False)
    assert diff.returncode == 0, diff.stdout.decode()


def test_float_and_scaled_files_export_float32_values(examples, tmp_path):
    for name in ["empad-f32", "derived-scaled"]:
        src = examples / f"{name}.qem"
        out = tmp_path / f"{name}.h5"
        run("qem", "convert", src, out)
        with h5py.File(out, "r") as f:
            data = f["datacube_root/datacube/data"]
            assert data.dtype == np.float32
            np.testing.assert_array_equal(data[()], qem_array(src, tmp_path))


def test_any_source_converts_to_emd(tmp_path):
    a = np.random.default_rng(9).integers(0, 256, size=(6, 3, 2, 4)).astype(np.uint8)
    np.save(tmp_path / "a.npy", a)
    run("qem", "convert", tmp_path / "a.npy", tmp_path / "a.emd", "--scan-step", "2nm")
    with h5py.File(tmp_path / "a.emd", "r") as f:
        data = f["datacube_root/datacube/data"]
        assert data.dtype == np.uint8
        np.testing.assert_array_equal(data[()], a)
        assert f["datacube_root/metadatabundle/calibration/R_pixel_size"][()] == pytest.approx(20.0)
        assert text(f["datacube_root/metadatabundle/calibration/Q_pixel_units"][()]) == "pixels"
        assert "valid_mask" not in f["datacube_root/metadatabundle/qem"]


def test_gzip_compression_is_the_standard_filter(examples, tmp_path):
    src = examples / "scan-u16.qem"
    plain, packed = tmp_path / "plain.emd", tmp_path / "packed.hdf5"
    run("qem", "convert", src, plain)
    run("qem", "convert", src, packed, "--hdf5-compression", "gzip")
    with h5py.File(packed, "r") as f:
        data = f["datacube_root/datacube/data"]
        assert data.compression == "gzip" and data.shuffle
        np.testing.assert_array_equal(data[()], qem_array(src, tmp_path))
    assert packed.stat().st_size < plain.stat().st_size / 4
    run("qem", "convert", packed, tmp_path / "back.qem")
    assert qem_hash(tmp_path / "back.qem") == qem_hash(src)


def test_unequal_steps_reach_rosettasciio_and_hyperspy(tmp_path, monkeypatch):
    qem, data = calibrated_qem(tmp_path, [1.5, 2.0, 0.02, 0.025], "1/angstrom")
    out = tmp_path / "cal.emd"
    run("qem", "convert", qem, out)
    with h5py.File(out, "r") as f:
        cube = f["datacube_root/datacube"]
        steps = [cube[f"dim{i}"][1] for i in range(4)]
        assert steps == pytest.approx([1.5, 2.0, 0.02, 0.025])
        assert [text(cube[f"dim{i}"].attrs["units"]) for i in range(4)] == ["A", "A", "A^-1", "A^-1"]
        # py4DSTEM has one R and one Q pixel size: the row axes'.
        cal = f["datacube_root/metadatabundle/calibration"]
        assert cal["R_pixel_size"][()] == pytest.approx(1.5)
        assert cal["Q_pixel_size"][()] == pytest.approx(0.02)
        assert text(cal["Q_pixel_units"][()]) == "A^-1"
    rsciio_emd = pytest.importorskip("rsciio.emd")
    [signal] = rsciio_emd.file_reader(str(out))
    np.testing.assert_array_equal(signal["data"], data)
    axes = signal["axes"]
    assert [a["size"] for a in axes] == [3, 4, 6, 5]
    assert [a["scale"] for a in axes] == pytest.approx([1.5, 2.0, 0.02, 0.025])
    assert [a["units"] for a in axes] == ["Å", "Å", "1 / Å", "1 / Å"]
    monkeypatch.setenv("MPLBACKEND", "Agg")
    hs = pytest.importorskip("hyperspy.api")
    s = hs.load(out).as_signal2D((0, 1))
    am = s.axes_manager
    # hyperspy lists navigation axes fastest first: scan columns, then rows.
    assert [a.scale for a in am.navigation_axes] == pytest.approx([2.0, 1.5])
    assert [a.scale for a in am.signal_axes] == pytest.approx([0.025, 0.02])
    np.testing.assert_array_equal(s.data, data)
    # The TIFF export says so, as it cannot carry both steps to hyperspy.
    tiff = run("qem", "convert", qem, tmp_path / "cal.tiff")
    assert "convert to .emd for hyperspy" in tiff.stderr.decode()
    # And back: the dimension vectors give each axis its own step.
    run("qem", "convert", out, tmp_path / "back.qem")
    header = json.loads(run("qem", "show", "--json", tmp_path / "back.qem").stdout)["header"]
    axes = header["scientific_metadata"]["axes"]
    assert [a["sampling"]["value"] for a in axes] == pytest.approx([1.5, 2.0, 0.02, 0.025])


def test_an_emdfile_layout_written_by_h5py_converts_without_a_path(tmp_path):
    """A py4DSTEM-style file made by h5py (not by us): found, read, calibrated."""
    a = np.random.default_rng(3).integers(0, 4000, size=(2, 3, 4, 5)).astype(np.uint16)
    path = tmp_path / "theirs.h5"
    with h5py.File(path, "w") as f:
        f.attrs.update({"emd_group_type": "file", "version_major": 1, "version_minor": 0})
        root = f.create_group("experiment_root")
        root.attrs.update({"emd_group_type": "root", "python_class": "Root"})
        small = root.create_group("probe")
        small.attrs.update({"emd_group_type": "array", "python_class": "Array"})
        small.create_dataset("data", data=np.ones((4, 5)))
        cube = root.create_group("scan")
        cube.attrs.update({"emd_group_type": "array", "python_class": "DataCube"})
        cube.create_dataset("data", data=a, chunks=(1, 3, 4, 5), compression="gzip")
        for i, (step, unit) in enumerate([(2.0, "nm"), (2.0, "nm"), (0.1, "A^-1"), (0.1, "A^-1")]):
            d = cube.create_dataset(f"dim{i}", data=[0.0, step])
            d.attrs.update({"name": f"d{i}", "units": unit})
    out = tmp_path / "theirs.qem"
    run("qem", "convert", path, out)
    run("qem", "convert", out, tmp_path / "theirs.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "theirs.npy"), a)
    header = json.loads(run("qem", "show", "--json", out).stdout)["header"]
    axes = header["scientific_metadata"]["axes"]
    assert [a["sampling"]["value"] for a in axes] == pytest.approx([20.0, 20.0, 0.1, 0.1])
    assert [a["sampling"]["unit"] for a in axes][2:] == ["1/angstrom", "1/angstrom"]


def test_several_4d_arrays_must_be_named(tmp_path):
    path = tmp_path / "two.emd"
    with h5py.File(path, "w") as f:
        f.attrs.update({"emd_group_type": "file", "version_major": 1, "version_minor": 0})
        for name in ["a", "b"]:
            g = f.create_group(f"root/{name}")
            g.attrs.update({"emd_group_type": "array", "python_class": "Array"})
            g.create_dataset("data", data=np.zeros((1, 2, 3, 4), np.uint8))
    out = run("qem", "convert", path, tmp_path / "x.qem", check=False)
    assert out.returncode == 2
    err = out.stderr.decode()
    assert str(path) in err and "/root/a/data" in err and "/root/b/data" in err
    assert not (tmp_path / "x.qem").exists()
    run("qem", "convert", f"{path}:/root/b/data", tmp_path / "x.qem")


def test_a_plain_hdf5_file_needs_its_dataset_named(tmp_path):
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("scans/cube", data=np.arange(24, dtype=np.uint8).reshape(1, 2, 3, 4))
    out = run("qem", "convert", path, tmp_path / "x.qem", check=False)
    assert out.returncode == 2
    assert str(path) in out.stderr.decode() and "FILE:/path" in out.stderr.decode()
    run("qem", "convert", f"{path}:/scans/cube", tmp_path / "x.qem")
    # An EMD file whose arrays are all 2-D says so.
    emd = tmp_path / "images.emd"
    with h5py.File(emd, "w") as f:
        f.attrs.update({"emd_group_type": "file", "version_major": 1, "version_minor": 0})
        g = f.create_group("root/image")
        g.attrs.update({"emd_group_type": "array", "python_class": "Array"})
        g.create_dataset("data", data=np.zeros((3, 4)))
    out = run("qem", "convert", emd, tmp_path / "y.qem", check=False)
    assert out.returncode == 2 and "without a 4-D array" in out.stderr.decode()
    assert not (tmp_path / "y.qem").exists()


def test_masked_emd_zeroes_the_invalid_pixels(examples, tmp_path):
    src = examples / "scan-u16.qem"
    out = tmp_path / "masked.emd"
    run("qem", "convert", src, out, "--masked")
    want = qem_array(src, tmp_path)
    with h5py.File(out, "r") as f:
        mask = f["datacube_root/metadatabundle/qem/valid_mask"][()]
        got = f["datacube_root/datacube/data"][()]
    np.testing.assert_array_equal(got, np.where(mask, want, 0))
    assert (got != want).any()


def test_bad_outputs_and_inputs_exit_2_and_leave_nothing(examples, tmp_path):
    src = examples / "scan-u16.qem"
    missing = tmp_path / "no" / "such" / "dir" / "x.emd"
    out = run("qem", "convert", src, missing, check=False)
    assert out.returncode == 2 and str(missing.parent) in out.stderr.decode()
    existing = tmp_path / "there.emd"
    existing.write_bytes(b"keep")
    out = run("qem", "convert", src, existing, check=False)
    assert out.returncode == 2 and str(existing) in out.stderr.decode()
    assert existing.read_bytes() == b"keep"
    # A corrupt body is found mid-way: no output, no temporary left behind.
    bad = tmp_path / "bad.qem"
    raw = bytearray(src.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    bad.write_bytes(bytes(raw))
    work = tmp_path / "work"
    work.mkdir()
    out = run("qem", "convert", bad, work / "bad.emd", check=False)
    assert out.returncode == 2 and str(bad) in out.stderr.decode()
    assert list(work.iterdir()) == []


READ = """
import json, sys, warnings
import numpy as np
import py4DSTEM
warnings.simplefilter("ignore")
d = py4DSTEM.read(sys.argv[1])
c = d.calibration
np.save(sys.argv[2], d.data)
print(json.dumps({
    "class": type(d).__name__,
    "R": [c.get_R_pixel_size(), c.get_R_pixel_units()],
    "Q": [c.get_Q_pixel_size(), c.get_Q_pixel_units()],
    "dims": [[float(v) for v in d.dims[i][:2]] for i in range(4)],
    "dim_units": list(d.dim_units),
    "mask_invalid": int((~d.root.metadata["qem"]["valid_mask"]).sum()),
}))
"""


def test_py4dstem_reads_a_calibrated_datacube(examples, tmp_path):
    python = py4dstem_python()
    src = examples / "scan-u16.qem"
    out = tmp_path / "scan.emd"
    run("qem", "convert", src, out, "--hdf5-compression", "gzip")
    got = subprocess.run(
        [python, "-c", READ, str(out), str(tmp_path / "p4.npy")], capture_output=True, check=True
    )
    seen = json.loads(got.stdout.decode().strip().splitlines()[-1])
    assert seen["class"] == "DataCube"
    assert seen["R"] == [0.5, "A"] and seen["Q"] == [0.8, "mrad"]
    assert seen["dims"] == [[0.0, 0.5], [0.0, 0.5], [0.0, 0.8], [0.0, 0.8]]
    assert seen["dim_units"] == ["A", "A", "mrad", "mrad"]
    assert seen["mask_invalid"] == 2
    np.testing.assert_array_equal(np.load(tmp_path / "p4.npy"), qem_array(src, tmp_path))


WRITE = """
import sys, warnings
import numpy as np
import py4DSTEM
warnings.simplefilter("ignore")
a = np.load(sys.argv[2])
d = py4DSTEM.DataCube(a)
d.calibration.set_R_pixel_size(1.25)
d.calibration.set_R_pixel_units("nm")
d.calibration.set_Q_pixel_size(0.015)
d.calibration.set_Q_pixel_units("A^-1")
py4DSTEM.save(sys.argv[1], d, mode="o")
"""


def test_a_file_py4dstem_saved_converts_with_its_calibration(tmp_path):
    python = py4dstem_python()
    a = np.random.default_rng(5).integers(0, 60000, size=(3, 4, 5, 6)).astype(np.uint16)
    np.save(tmp_path / "a.npy", a)
    path = tmp_path / "saved.h5"
    subprocess.run([python, "-c", WRITE, str(path), str(tmp_path / "a.npy")], check=True, capture_output=True)
    out = tmp_path / "saved.qem"
    run("qem", "convert", path, out)
    run("qem", "convert", out, tmp_path / "back.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "back.npy"), a)
    header = json.loads(run("qem", "show", "--json", out).stdout)["header"]
    axes = header["scientific_metadata"]["axes"]
    assert [x["sampling"]["value"] for x in axes] == pytest.approx([12.5, 12.5, 0.015, 0.015])
    assert [x["sampling"]["unit"] for x in axes] == ["angstrom", "angstrom", "1/angstrom", "1/angstrom"]
