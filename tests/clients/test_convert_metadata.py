"""What a user adds to a conversion: a metadata file whose unknown keys are
named (or refused with --strict-metadata) and flags for the common
calibrated quantities with their units."""

import json

import numpy as np
import pytest

from conftest import run


@pytest.fixture
def scan(tmp_path):
    path = tmp_path / "scan.npy"
    np.save(path, np.arange(2 * 3 * 4 * 5, dtype=np.uint16).reshape(2, 3, 4, 5))
    return path


def metadata(out):
    return json.loads(run("qem", "show", "--json", out).stdout)["header"]["scientific_metadata"]


def test_unknown_metadata_keys_are_kept_and_named_in_a_warning(tmp_path, scan):
    meta = tmp_path / "m.json"
    meta.write_text(json.dumps({"calibraton": {"x": 1}, "source_metadata": {"rig": "A"}, "notes": "n"}))
    out = run("qem", "convert", scan, tmp_path / "a.qem", "--metadata", meta)
    err = out.stderr.decode()
    assert err.startswith("warning: ") and '"calibraton"' in err and '"notes"' in err, err
    assert '"source_metadata"' not in err
    sm = metadata(tmp_path / "a.qem")
    assert sm["calibraton"] == {"x": 1} and sm["source_metadata"]["rig"] == "A"
    # A file with only schema keys converts silently.
    meta.write_text(json.dumps({"source_metadata": {"rig": "A"}}))
    out = run("qem", "convert", scan, tmp_path / "b.qem", "--metadata", meta)
    assert out.stderr == b""


def test_strict_metadata_refuses_unknown_keys(tmp_path, scan):
    meta = tmp_path / "m.json"
    meta.write_text(json.dumps({"calibraton": {}}))
    out = run("qem", "convert", scan, tmp_path / "a.qem", "--metadata", meta, "--strict-metadata", check=False)
    assert out.returncode == 2
    assert out.stderr.decode().startswith(f"error: {meta}: unknown scientific_metadata key(s) \"calibraton\"")
    assert not (tmp_path / "a.qem").exists()


def test_flags_set_calibrated_quantities_in_canonical_units(tmp_path, scan):
    out = tmp_path / "a.qem"
    run(
        "qem", "convert", scan, out,
        "--voltage-kv", "300", "--scan-step", "0.5,0.25nm", "--detector-sampling", "0.02 1/nm",
    )
    run("qem", "validate", out)
    sm = metadata(out)
    em = sm["electron_microscope"]
    assert em["electron_source/accelerating_voltage"] == {"provenance": "user", "unit": "kV", "value": 300.0}
    assert em["scan_controller/regular_scan/pixel_size_row"]["value"] == pytest.approx(5.0)
    assert em["scan_controller/regular_scan/pixel_size_column"]["value"] == pytest.approx(2.5)
    assert [a["sampling"]["value"] for a in sm["axes"]] == pytest.approx([5.0, 2.5, 0.002, 0.002])
    assert [a["sampling"]["unit"] for a in sm["axes"]] == ["angstrom"] * 2 + ["1/angstrom"] * 2
    bad = run("qem", "convert", scan, tmp_path / "b.qem", "--scan-step", "3 furlongs", check=False)
    assert bad.returncode == 2 and b"furlongs" in bad.stderr
