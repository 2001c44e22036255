"""Quantum Detectors Merlin .mib into .qem: files written to the published
layout (per-frame ASCII headers, big-endian pixels or the raw R64 packings),
the non-raw ones first read by rosettasciio's `quantumdetector` reader to
prove they are real (it flips frames vertically and reads no raw files),
then converted and compared value for value."""

import json

import numpy as np
import pytest

from conftest import run

ROWS, COLS, H, W = 3, 4, 8, 64
TYPES = {"U08": ">u1", "U16": ">u2", "U32": ">u4"}


def header(seq, pixel_type, depth, width=W, height=H):
    text = (
        f"MQ1,{seq:06d},00384,01,{width:05d},{height:05d},{pixel_type},   1x1,01,"
        "2026-01-01 00:00:00.000000,0.001000,0,0,0,1.200000E+1,5.110000E+2,"
        "0.000000E+0,0.000000E+0,0.000000E+0,0.000000E+0,0.000000E+0,0.000000E+0,3RX,"
        f"MQ1A,2026-01-01T00:00:{seq % 60:02d}.000000000Z,1000000ns,{depth},"
    ).encode()
    return text + b"\0" * (384 - len(text))


def raw_pixels(frame, depth):
    """A frame's bytes in the R64 layout of a single chip."""
    flat = frame.reshape(-1)
    if depth == 1:
        bits = flat.reshape(-1, 8, 8).astype(np.uint8)  # (words, bytes, bits)
        packed = np.packbits(bits, axis=-1, bitorder="little")[..., 0]
        return packed[:, ::-1].tobytes()  # the 8 bytes of each 64-bit word reversed
    if depth == 6:
        return flat.astype(np.uint8).reshape(-1, 8)[:, ::-1].tobytes()
    if depth == 12:
        return flat.astype(">u2").reshape(-1, 4)[:, ::-1].tobytes()
    if depth == 24:
        high, low = (flat >> 12).astype(">u2"), (flat & 0xFFF).astype(">u2")
        return high.reshape(-1, 4)[:, ::-1].tobytes() + low.reshape(-1, 4)[:, ::-1].tobytes()
    raise ValueError(depth)


def write_mib(folder, data, pixel_type, depth, *, hdr=True, name="scan.mib"):
    rows, cols = data.shape[:2]
    path = folder / name
    width = data.shape[3] * (2 if (pixel_type, depth) == ("R64", 24) else 1)
    with open(path, "wb") as f:
        for i, frame in enumerate(data.reshape(-1, *data.shape[2:])):
            f.write(header(i + 1, pixel_type, depth, width=width, height=data.shape[2]))
            if pixel_type == "R64":
                f.write(raw_pixels(frame, depth))
            else:
                f.write(frame.astype(TYPES[pixel_type]).tobytes())
    if hdr:
        path.with_suffix(".hdr").write_text(
            "HDR,\t\n"
            "Time and Date Stamp (day, mnth, yr, hr, min, s):\t01/01/2026 00:00:00\n"
            f"Frames in Acquisition (Number):\t{rows * cols}\n"
            f"Frames per Trigger (Number):\t{cols}\n"
            "Counter Depth (number):\t12\n"
            "End\t\n"
        )
    return path


def counts(high, seed=3):
    return np.random.default_rng(seed).integers(0, high + 1, size=(ROWS, COLS, H, W))


def converted(tmp_path, src, *flags):
    out = tmp_path / "out.qem"
    run("qem", "convert", src, out, *flags)
    run("qem", "validate", out)
    run("qem", "convert", out, tmp_path / "out.npy")
    return np.load(tmp_path / "out.npy"), json.loads(run("qem", "show", "--json", out).stdout)["header"]


@pytest.mark.parametrize("pixel_type,depth,high", [("U08", 1, 1), ("U08", 6, 63), ("U16", 12, 4095), ("U32", 24, 65535)])
def test_non_raw_mib_matches_rosettasciio(tmp_path, pixel_type, depth, high):
    from rsciio.quantumdetector import file_reader

    data = counts(high)
    src = write_mib(tmp_path, data, pixel_type, depth)
    (read,) = file_reader(str(src))
    theirs = np.flip(np.asarray(read["data"]), axis=-2)  # back to file order
    np.testing.assert_array_equal(theirs, data)
    ours, header = converted(tmp_path, src)
    assert ours.dtype == (np.uint8 if pixel_type == "U08" else np.uint16)
    np.testing.assert_array_equal(ours, theirs)
    sm = header["scientific_metadata"]
    assert sm["source_format"] == "merlin-mib"
    assert sm["source_metadata"]["hdr"]["Frames per Trigger (Number)"] == str(COLS)
    (doc,) = sm["source_documents"]
    assert doc["mediaType"] == "application/json"
    assert json.loads(doc["content"])["mib_counter_depth"] == depth
    ops = [p["operation"] for p in sm["processing"]]
    assert ops == (["exact_integer_narrowing"] if pixel_type == "U32" else ["lossless_storage"])


@pytest.mark.parametrize("depth,high", [(1, 1), (6, 63), (12, 4095), (24, 65535)])
def test_raw_mib_of_every_depth(tmp_path, depth, high):
    data = counts(high, seed=depth)
    src = write_mib(tmp_path, data, "R64", depth)
    ours, _ = converted(tmp_path, src)
    np.testing.assert_array_equal(ours, data)


def test_24_bit_counts_beyond_uint16_are_refused_naming_frame_and_pixel(tmp_path):
    data = counts(1000)
    data[1, 2, 5, 17] = 70000
    for pixel_type in ("U32", "R64"):
        src = write_mib(tmp_path, data, pixel_type, 24)
        out = run("qem", "convert", src, tmp_path / "bad.qem", check=False)
        assert out.returncode == 2
        assert "frame 6 pixel (5, 17) counts 70000" in out.stderr.decode(), out.stderr
        assert not (tmp_path / "bad.qem").exists()


def test_the_scan_comes_from_the_hdr_or_the_command_line(tmp_path):
    data = counts(4095)
    src = write_mib(tmp_path, data, "U16", 12, hdr=False)
    out = run("qem", "convert", src, tmp_path / "a.qem", check=False)
    assert out.returncode == 2 and b"--scan" in out.stderr
    ours, header = converted(tmp_path, src, "--scan", "4,3")
    assert header["shape"] == [4, 3, H, W]
    np.testing.assert_array_equal(ours, data.reshape(4, 3, H, W))


def test_inconsistent_frame_headers_are_refused_naming_the_frame(tmp_path):
    data = counts(4095)
    src = write_mib(tmp_path, data, "U16", 12)
    frame = 384 + H * W * 2
    good = src.read_bytes()
    cases = {
        "type": header(3, "U08", 12),  # same length, another pixel type
        "sequence": header(9, "U16", 12),  # a frame missing
    }
    for what, bad_header in cases.items():
        b = bytearray(good)
        b[2 * frame : 2 * frame + 384] = bad_header
        src.write_bytes(bytes(b))
        out = run("qem", "convert", src, tmp_path / "bad.qem", check=False)
        err = out.stderr.decode()
        assert out.returncode == 2 and err.startswith(f"error: {src}: frame 2: "), (what, err)
        assert not (tmp_path / "bad.qem").exists()
    src.write_bytes(good[:-10])
    out = run("qem", "convert", src, tmp_path / "bad.qem", check=False)
    assert out.returncode == 2 and b"not a whole number" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scan.hdr", "scan.mib"]
