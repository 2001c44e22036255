"""EMPAD (.xml + .raw) into .qem: files written to the published layout,
first read by rosettasciio's `empad` reader to prove they are real, then
converted and compared bit for bit, with the XML's calibration carried."""

import hashlib
import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from conftest import run

ROWS, COLS = 3, 4
TO_ANGSTROM = {"m": 1e10, "mm": 1e7, "µm": 1e4, "um": 1e4, "nm": 10.0, "pm": 0.01, "Å": 1.0}


def frames(rows=ROWS, cols=COLS, seed=7):
    rng = np.random.default_rng(seed)
    raw = rng.normal(50, 20, size=(rows, cols, 130, 128)).astype("<f4")
    # Bit patterns a float pipeline could lose: signed zero, NaN payloads, subnormals, infinities.
    bits = raw.view("<u4")
    bits[0, 0, 0, :4] = [0x80000000, 0x7FC00001, 0x00000001, 0x7F800000]
    raw[..., 128:, :] = np.arange(2 * 128, dtype="<f4").reshape(2, 128)  # per-frame metadata rows
    return raw


def write_empad(folder, raw, *, raw_name=None, scan_in_xml=True, fov=(2.4e-8, 3.2e-8), pixelsize="1.5e-10"):
    rows, cols = raw.shape[:2]
    raw_name = raw_name or f"scan_x{cols}_y{rows}.raw"
    root = ET.Element("root")
    ET.SubElement(root, "timestamp", isoformat="2026-03-04T05:06:07.000000")
    if scan_in_xml:
        ET.SubElement(root, "pix_x").text = str(cols)
        ET.SubElement(root, "pix_y").text = str(rows)
    ET.SubElement(root, "raw_file", filename=raw_name)
    iom = ET.SubElement(root, "iom_measurements")
    ET.SubElement(ET.SubElement(iom, "optics"), "get_full_scan_field_of_view").text = str(fov)
    ET.SubElement(iom, "calibrated_pixelsize").text = pixelsize
    xml = folder / "acquisition.xml"
    # rosettasciio reads element text as values, so no pretty-printing whitespace.
    xml.write_bytes(b'<?xml version="1.0" encoding="utf-8"?>' + ET.tostring(root))
    raw.tofile(folder / raw_name)
    return xml


def test_empad_converts_bit_exactly_with_its_calibration(tmp_path):
    from rsciio.empad import file_reader

    raw = frames()
    xml = write_empad(tmp_path, raw)
    (read,) = file_reader(str(xml))
    np.testing.assert_array_equal(read["data"].view("<u4"), raw[..., :128, :].view("<u4"))

    out = tmp_path / "scan.qem"
    run("qem", "convert", xml, out)
    run("qem", "validate", out)
    run("qem", "convert", out, tmp_path / "back.npy")
    back = np.load(tmp_path / "back.npy")
    assert back.shape == (ROWS, COLS, 128, 128) and back.dtype == np.float32
    np.testing.assert_array_equal(back.view("<u4"), np.asarray(read["data"]).view("<u4"))

    header = json.loads(run("qem", "show", "--json", out).stdout)["header"]
    assert header["codec"] == "float32-bit-lanes-rans-v1"
    assert header["empad"]["format_name"] == "EMPAD (.xml + .raw)"
    assert header["empad"]["acquisition_date"] == "2026-03-04T05:06:07.000000"
    sm = header["scientific_metadata"]
    assert sm["source_format"] == "empad"
    # The same calibration rosettasciio derives, in canonical units.
    axes = {a["name"]: a for a in read["axes"]}
    for ours, theirs in zip(sm["axes"][:2], [axes["scan_y"], axes["scan_x"]]):
        assert ours["sampling"]["unit"] == "angstrom"
        assert ours["sampling"]["provenance"] == "source file"
        assert ours["sampling"]["value"] == pytest.approx(theirs["scale"] * TO_ANGSTROM[theirs["units"]])
    for ours in sm["axes"][2:]:
        assert ours["sampling"]["unit"] == "1/angstrom"
        assert ours["sampling"]["value"] == pytest.approx(axes["width"]["scale"] / 10)  # 1/nm → 1/Å
    (doc,) = sm["source_documents"]
    assert doc["mediaType"] == "application/xml" and doc["filename"] == "acquisition.xml"
    assert doc["content"] == xml.read_text()
    assert doc["sha256"] == hashlib.sha256(xml.read_bytes()).hexdigest()


def test_an_xml_without_a_scan_needs_one_on_the_command_line(tmp_path):
    raw = frames(2, 6)
    xml = write_empad(tmp_path, raw, raw_name="data.raw", scan_in_xml=False)
    out = run("qem", "convert", xml, tmp_path / "a.qem", check=False)
    assert out.returncode == 2 and b"--scan" in out.stderr
    run("qem", "convert", xml, tmp_path / "a.qem", "--scan", "2,6")
    run("qem", "convert", tmp_path / "a.qem", tmp_path / "a.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy").view("<u4"), raw[..., :128, :].view("<u4"))
    # A --scan that contradicts the XML is refused.
    xml = write_empad(tmp_path, frames())
    out = run("qem", "convert", xml, tmp_path / "b.qem", "--scan", "4,3", check=False)
    assert out.returncode == 2 and b"--scan" in out.stderr


def test_a_raw_file_whose_size_does_not_match_its_xml_is_refused(tmp_path):
    raw = frames()
    xml = write_empad(tmp_path, raw)
    raw_path = tmp_path / f"scan_x{COLS}_y{ROWS}.raw"
    raw_path.write_bytes(raw_path.read_bytes()[: -130 * 128 * 4])
    out = run("qem", "convert", xml, tmp_path / "bad.qem", check=False)
    assert out.returncode == 2
    err = out.stderr.decode()
    assert err.startswith(f"error: {raw_path}: holds ") and "3×4 scan" in err, err
    assert not (tmp_path / "bad.qem").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["acquisition.xml", raw_path.name]
