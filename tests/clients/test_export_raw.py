"""Raw export (`qem convert X.qem X.raw`): headerless little-endian C-order
frames, read by numpy with the shape and dtype the command prints, and back
through the raw import with the command it prints."""

import io
import shlex

import numpy as np

from conftest import run


def printed(out):
    """(shape, dtype, read-back arguments) from the command's stdout."""
    lines = out.stdout.decode().strip().splitlines()
    assert len(lines) == 2, lines
    head, back = lines
    shape = head.split(" shape ")[1].split(" ")[0]
    dtype = head.split(" dtype ")[1].split(",")[0]
    assert back.startswith("read it back with: qem convert ")
    return tuple(int(n) for n in shape.split(",")), dtype, shlex.split(back.split(": qem ", 1)[1])


def test_raw_export_reads_back_with_what_it_prints(examples, tmp_path):
    for name, want_dtype in [("scan-u16", "uint16"), ("empad-f32", "float32"), ("derived-scaled", "float32")]:
        src = examples / f"{name}.qem"
        raw = tmp_path / f"{name}.raw"
        shape, dtype, back = printed(run("qem", "convert", src, raw))
        assert dtype == want_dtype
        run("qem", "convert", src, tmp_path / f"{name}.npy")
        want = np.load(tmp_path / f"{name}.npy")
        assert shape == want.shape
        got = np.fromfile(raw, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)
        np.testing.assert_array_equal(got, want)
        # The printed command, with OUT.qem replaced, is the way back.
        out = tmp_path / f"{name}.back.qem"
        back = [str(out) if a == "OUT.qem" else a for a in back]
        assert back[:2] == ["convert", str(raw)]
        run("qem", *back)
        a = run("qem", "hash", src).stdout.split()[0]
        assert run("qem", "hash", out).stdout.split()[0] == a, name


def test_masked_raw_zeroes_the_invalid_pixels(examples, tmp_path):
    src = examples / "scan-u16.qem"
    run("qem", "convert", src, tmp_path / "m.raw", "--masked")
    run("qem", "convert", src, tmp_path / "all.npy")
    want = np.load(tmp_path / "all.npy")
    mask = np.load(io.BytesIO(run("qem", "cat", src, "mask.npy").stdout))
    got = np.fromfile(tmp_path / "m.raw", dtype="<u2").reshape(want.shape)
    np.testing.assert_array_equal(got, np.where(mask, want, 0))


def test_raw_refuses_to_replace_and_names_the_file(examples, tmp_path):
    src = examples / "scan-u16.qem"
    there = tmp_path / "there.raw"
    there.write_bytes(b"keep")
    out = run("qem", "convert", src, there, check=False)
    assert out.returncode == 2 and str(there) in out.stderr.decode()
    assert out.stdout == b"" and there.read_bytes() == b"keep"
    missing = tmp_path / "nowhere" / "x.raw"
    out = run("qem", "convert", src, missing, check=False)
    assert out.returncode == 2 and str(missing.parent) in out.stderr.decode()
    assert not missing.parent.exists()
