"""Quantum Detectors Merlin .mib into .qem: files written to the published
layout (per-frame ASCII headers, big-endian pixels or the raw R64 packings,
of one chip or a 2x2 quad), first read by the field's readers to prove they
are real: rosettasciio's `quantumdetector` reader for the non-raw ones (it
flips frames vertically and reads no raw files), LiberTEM's MIB dataset for
the raw ones; then converted and compared value for value."""

import json

import numpy as np
import pytest

from conftest import run

ROWS, COLS, H, W = 3, 4, 8, 64
TYPES = {"U08": ">u1", "U16": ">u2", "U32": ">u4"}


def header(seq, pixel_type, depth, width=W, height=H, quad=False):
    size, chips, layout = (768, 4, "2x2") if quad else (384, 1, "1x1")
    text = (
        f"MQ1,{seq:06d},{size:05d},{chips:02d},{width:05d},{height:05d},{pixel_type},   {layout},01,"
        "2026-01-01 00:00:00.000000,0.001000,0,0,0,1.200000E+1,5.110000E+2,"
        "0.000000E+0,0.000000E+0,0.000000E+0,0.000000E+0,0.000000E+0,0.000000E+0,3RX,"
        f"MQ1A,2026-01-01T00:00:{seq % 60:02d}.000000000Z,1000000ns,{depth},"
    ).encode()
    return text + b"\0" * (size - len(text))


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


def quad_raw_pixels(frame, depth):
    """A 2x2 quad frame in the R64 layout: raw row y holds row y of chips
    4, 3, 2, 1 in that order, each packed as one chip's row; chips 1 and 2
    are the detector's top left and right, 3 and 4 its bottom left and
    right turned by 180 degrees (the Merlin quad's readout)."""
    r, c = frame.shape[0] // 2, frame.shape[1] // 2
    top_left, top_right = frame[:r, :c], frame[:r, c:]
    bottom_left, bottom_right = frame[r:, :c][::-1, ::-1], frame[r:, c:][::-1, ::-1]
    chips = (bottom_right, bottom_left, top_right, top_left)
    return b"".join(raw_pixels(chip[y], depth) for y in range(r) for chip in chips)


def write_mib(folder, data, pixel_type, depth, *, hdr=True, name="scan.mib", quad=False, per_trigger=None):
    rows, cols = data.shape[:2]
    path = folder / name
    width = data.shape[3] * (2 if (pixel_type, depth) == ("R64", 24) else 1)
    height = data.shape[2]
    if quad and pixel_type == "R64":
        width, height = 2 * width, height // 2  # the four chips side by side
    with open(path, "wb") as f:
        for i, frame in enumerate(data.reshape(-1, *data.shape[2:])):
            f.write(header(i + 1, pixel_type, depth, width=width, height=height, quad=quad))
            if pixel_type == "R64":
                f.write((quad_raw_pixels if quad else raw_pixels)(frame, depth))
            else:
                f.write(frame.astype(TYPES[pixel_type]).tobytes())
    if hdr:
        path.with_suffix(".hdr").write_text(
            "HDR,\t\n"
            "Time and Date Stamp (day, mnth, yr, hr, min, s):\t01/01/2026 00:00:00\n"
            f"Frames in Acquisition (Number):\t{rows * cols}\n"
            f"Frames per Trigger (Number):\t{cols if per_trigger is None else per_trigger}\n"
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


def libertem_frames(src, scan):
    """Every frame of `src` as LiberTEM's MIB dataset reads it."""
    import libertem.api as libertem_api  # scripts/requirements-clients.txt
    from libertem.executor.inline import InlineJobExecutor
    from libertem.io.dataset.base import BufferedBackend
    from libertem.udf.raw import PickUDF

    ctx = libertem_api.Context(executor=InlineJobExecutor())
    # LiberTEM reads every .mib beside `src` as one acquisition: each test
    # file has a folder of its own.
    ds = ctx.load("mib", path=str(src), nav_shape=scan, io_backend=BufferedBackend())
    picked = ctx.run_udf(dataset=ds, udf=PickUDF(), roi=np.ones(scan, bool))["intensity"].data
    return np.asarray(picked).reshape(*scan, *picked.shape[1:])


@pytest.mark.parametrize("depth,high", [(1, 1), (6, 63), (12, 4095), (24, 65535)])
def test_raw_mib_of_every_depth(tmp_path, depth, high):
    data = counts(high, seed=depth)
    src = write_mib(tmp_path, data, "R64", depth)
    theirs = libertem_frames(src, (ROWS, COLS))
    if depth == 24:
        # LiberTEM 0.16 steps from one 24-bit raw frame to the next by two
        # bytes a pixel where the frames hold four (its own frame count
        # takes four), so only its first frame is the file's.
        theirs, data = theirs[0, 0], data[0, 0]
    np.testing.assert_array_equal(theirs, data)
    ours, _ = converted(tmp_path, src)
    np.testing.assert_array_equal(ours, counts(high, seed=depth))


@pytest.mark.parametrize("depth,high", [(1, 1), (6, 63), (12, 4095)])
def test_raw_quad_mib_matches_libertem(tmp_path, depth, high):
    # Four 64x64 chips: the smallest quad whose chip rows are whole 1-bit words.
    data = np.random.default_rng(depth).integers(0, high + 1, size=(2, 3, 128, 128))
    src = write_mib(tmp_path, data, "R64", depth, quad=True)
    theirs = libertem_frames(src, (2, 3))
    np.testing.assert_array_equal(theirs, data)
    ours, header = converted(tmp_path, src)
    assert header["shape"] == [2, 3, 128, 128]
    np.testing.assert_array_equal(ours, theirs)


def test_24_bit_raw_quads_are_refused_saying_why(tmp_path):
    data = np.random.default_rng(4).integers(0, 1001, size=(2, 3, 16, 16))  # four 8x8 chips
    src = write_mib(tmp_path, data, "R64", 24, quad=True)
    out = run("qem", "convert", src, tmp_path / "bad.qem", check=False)
    assert out.returncode == 2
    assert "24-bit raw quad frames are not supported" in out.stderr.decode(), out.stderr
    assert not (tmp_path / "bad.qem").exists()


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


@pytest.mark.parametrize("per_trigger", [1, ROWS * COLS])
def test_a_hdr_that_states_no_scan_line_is_not_guessed_from(tmp_path, per_trigger):
    """One frame per trigger (a trigger at every position) or all frames on
    one trigger say nothing of the scan's shape: refused, saying what the
    .hdr holds, the frame count and that --scan is needed; not 12x1 or 1x12."""
    data = counts(4095)
    src = write_mib(tmp_path, data, "U16", 12, per_trigger=per_trigger)
    out = run("qem", "convert", src, tmp_path / "a.qem", check=False)
    err = out.stderr.decode()
    assert out.returncode == 2, err
    assert f"{ROWS * COLS} frames and no scan shape" in err and "give --scan ROWS,COLS" in err, err
    assert f"Frames per Trigger (Number) {per_trigger}" in err, err
    assert not (tmp_path / "a.qem").exists()
    ours, header = converted(tmp_path, src, "--scan", f"{ROWS},{COLS}")
    assert header["shape"] == [ROWS, COLS, H, W]
    np.testing.assert_array_equal(ours, data)


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
