"""Wider `.npy` inputs, written by numpy: every integer dtype is stored as
uint16 counts and float64 as float32 when each value is exactly
representable, either byte order, C or Fortran order, 3-D with --scan."""

import json

import numpy as np
import pytest

from conftest import run

SHAPE = (3, 4, 5, 6)


def counts(dtype):
    a = np.arange(np.prod(SHAPE), dtype=np.int64).reshape(SHAPE)
    return ((a * 601) % 65536).astype(dtype) if np.dtype(dtype).itemsize > 1 else (a % 128).astype(dtype)


def convert_back(tmp_path, a, *flags, name="in"):
    src = tmp_path / f"{name}.npy"
    np.save(src, a)
    qem = tmp_path / f"{name}.qem"
    run("qem", "convert", src, qem, *flags)
    run("qem", "validate", qem)
    back = tmp_path / f"{name}.back.npy"
    run("qem", "convert", qem, back)
    show = json.loads(run("qem", "show", "--json", qem).stdout)
    return np.load(back), show["header"]


def processing(header):
    return header["scientific_metadata"]["processing"]


@pytest.mark.parametrize("dtype", ["<u4", ">u4", "<i2", ">i2", "<i4", ">i4", "<u8", "<i8"])
def test_integers_in_range_become_uint16_counts(tmp_path, dtype):
    a = counts(dtype)
    if a.dtype.kind == "i" and a.dtype.itemsize == 2:
        a = (a.astype(np.int64) % 32768).astype(dtype)
    back, header = convert_back(tmp_path, a)
    assert back.dtype == np.uint16 and header["dtype"] == "uint16"
    np.testing.assert_array_equal(back, a.astype(np.int64))
    assert processing(header) == [
        {
            "changes_measurements": False,
            "operation": "exact_integer_narrowing",
            "source_dtype": np.dtype(dtype).newbyteorder("=").name,
            "stored_dtype": "uint16",
        }
    ]


@pytest.mark.parametrize("dtype", [">u2", ">f4"])
def test_big_endian_is_stored_as_its_values(tmp_path, dtype):
    a = counts(dtype) if dtype.endswith("u2") else (np.arange(np.prod(SHAPE)).reshape(SHAPE) / 7).astype(dtype)
    back, header = convert_back(tmp_path, a)
    assert back.dtype == a.dtype.newbyteorder("<")
    np.testing.assert_array_equal(back, a)
    assert processing(header)[0]["operation"] == "lossless_storage"


def test_fortran_order_arrays_keep_their_logical_layout(tmp_path):
    a = np.asfortranarray(counts("<u4"))
    assert a.flags.f_contiguous and not a.flags.c_contiguous
    back, _ = convert_back(tmp_path, a)
    np.testing.assert_array_equal(back, a)
    f3 = np.asfortranarray(counts("<u2").reshape(12, 5, 6))
    back, header = convert_back(tmp_path, f3, "--scan", "3,4", name="f3")
    np.testing.assert_array_equal(back, f3.reshape(SHAPE))


def test_three_d_input_needs_a_matching_scan(tmp_path):
    a = counts("<u2").reshape(12, 5, 6)
    back, header = convert_back(tmp_path, a, "--scan", "4,3")
    assert header["shape"] == [4, 3, 5, 6]
    np.testing.assert_array_equal(back, a.reshape(4, 3, 5, 6))
    np.save(tmp_path / "c.npy", a)
    out = run("qem", "convert", tmp_path / "c.npy", tmp_path / "c.qem", check=False)
    assert out.returncode == 2 and b"--scan" in out.stderr
    out = run("qem", "convert", tmp_path / "c.npy", tmp_path / "c.qem", "--scan", "5,3", check=False)
    assert out.returncode == 2 and b"holds 12" in out.stderr
    assert not (tmp_path / "c.qem").exists()


def test_exact_float64_is_stored_as_float32(tmp_path):
    a = (np.arange(np.prod(SHAPE)).reshape(SHAPE) / 8 - 20).astype(np.float64)
    a[0, 0, 0, 0] = -0.0
    a[0, 0, 0, 1] = np.inf
    back, header = convert_back(tmp_path, a)
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back.view(np.uint32), a.astype(np.float32).view(np.uint32))
    assert processing(header)[0]["operation"] == "exact_float_narrowing"
    assert processing(header)[0]["changes_measurements"] is False


@pytest.mark.parametrize(
    "dtype,value,fill", [("<u4", 70000, 5), (">i4", -1, 5), ("<i2", -3, 5), ("<f8", 0.1, 0.5)]
)
def test_the_first_value_that_does_not_fit_is_named(tmp_path, dtype, value, fill):
    a = np.full(SHAPE, fill, dtype=dtype)
    a[1, 2, 3, 4] = value
    a[2, 0, 0, 0] = value
    np.save(tmp_path / "bad.npy", a)
    out = run("qem", "convert", tmp_path / "bad.npy", tmp_path / "bad.qem", check=False)
    assert out.returncode == 2
    err = out.stderr.decode()
    assert err.startswith(f"error: {tmp_path / 'bad.npy'}: ")
    assert f"element (1, 2, 3, 4) = {value}" in err, err
    assert not (tmp_path / "bad.qem").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.npy"]


def test_float64_rounding_is_allowed_by_a_flag_and_recorded(tmp_path):
    a = np.linspace(0, 1, np.prod(SHAPE)).reshape(SHAPE)
    back, header = convert_back(tmp_path, a, "--allow-float-rounding")
    np.testing.assert_array_equal(back, a.astype(np.float32))
    (record,) = processing(header)
    assert record["operation"] == "float64_to_float32_rounding"
    assert record["changes_measurements"] is True
    assert (record["source_dtype"], record["stored_dtype"]) == ("float64", "float32")


def test_a_large_arrays_padded_header_is_plain_json_to_every_reader(tmp_path):
    # 64 MiB of float32: the body is written behind room left for the header,
    # whose canonical text is followed by spaces up to a 4 KiB boundary.
    a = np.random.default_rng(7).normal(50, 20, size=(32, 32, 128, 128)).astype("<f4")
    back, header = convert_back(tmp_path, a, name="large")
    assert back.dtype == a.dtype and np.array_equal(back.view("<u4"), a.view("<u4"))
    raw = (tmp_path / "large.qem").read_bytes()
    n = int.from_bytes(raw[8:16], "little")
    assert (56 + n) % 4096 == 0
    text = raw[56:56 + n]
    assert text.endswith(b" ") and not text.rstrip(b" ").endswith(b" ")
    # Python's own parser (the reference reader's) takes the padded header.
    parsed = json.loads(text)
    assert parsed == header
    assert parsed["bytes"] == len(raw) - 56 - n
    assert json.loads(run("qem", "cat", tmp_path / "large.qem", "header.json").stdout) == parsed
