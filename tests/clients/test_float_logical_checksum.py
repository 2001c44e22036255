"""The float codec's `logical_sha256` is enforced wherever a whole float
array leaves: every conversion, `qem hash`, `qem cat data.npy` (and the
other whole-array files), and a full read of `data.npy` through the mount
fail on the conformance file whose checksum disagrees, and publish nothing;
the same commands on a sound float file succeed with the reference values.
"""

import io

import numpy as np
import pytest

from conftest import conformance, run

BAD = "qem/bad-float-logical-checksum.qem"
GOOD = "qem/f32-lanes-33x40.qem"


def refused(*args):
    out = run("qem", *args, check=False, timeout=120)
    err = out.stderr.decode(errors="replace")
    assert out.returncode == 2, f"exit {out.returncode}: {err}"
    return err


@pytest.mark.parametrize("output", ["out.npy", "out.tiff", "out.qem", "out.zarr"])
def test_convert_refuses_and_publishes_nothing(output, copy_fixture, tmp_path):
    bad = copy_fixture(BAD, tmp_path)
    err = refused("convert", bad, tmp_path / output)
    assert bad.name in err and "logical" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [bad.name]


@pytest.mark.parametrize("output", ["out.npy", "out.tiff", "out.qem", "out.zarr"])
def test_convert_of_a_sound_float_file_still_works(output, copy_fixture, tmp_path):
    good = copy_fixture(GOOD, tmp_path)
    run("qem", "convert", good, tmp_path / output)
    if output == "out.npy":
        want = np.load(conformance() / "qem/f32-lanes-33x40.npy")
        got = np.load(tmp_path / output)
        assert got.tobytes() == want.astype("<f4").tobytes()


def test_hash_refuses(copy_fixture, tmp_path):
    bad = copy_fixture(BAD, tmp_path)
    err = refused("hash", bad)
    assert bad.name in err and "logical" in err, err
    run("qem", "hash", conformance() / GOOD)


def test_diff_refuses_a_file_whose_values_fail_their_checksum(copy_fixture, tmp_path):
    bad = copy_fixture(BAD, tmp_path)
    err = refused("diff", bad, bad)
    assert err.startswith(f"error: {bad}: ") and "logical" in err, err
    assert run("qem", "diff", conformance() / GOOD, conformance() / GOOD).returncode == 0


@pytest.mark.parametrize("name", ["data.npy", "data.tiff", "logical_sha256"])
def test_cat_of_a_whole_array_file_refuses(name):
    err = refused("cat", conformance() / BAD, name)
    assert "logical" in err, err


def test_cat_data_npy_of_a_sound_file_is_the_reference():
    out = run("qem", "cat", conformance() / GOOD, "data.npy").stdout
    want = np.load(conformance() / "qem/f32-lanes-33x40.npy")
    assert np.load(io.BytesIO(out)).tobytes() == want.astype("<f4").tobytes()


def test_a_full_read_of_data_npy_through_the_mount_fails(mount, copy_fixture, tmp_path):
    src = tmp_path / "src"
    copy_fixture(BAD, src)
    copy_fixture(GOOD, src)
    mnt = mount(src)
    with pytest.raises(OSError) as raised:
        with open(mnt / "bad-float-logical-checksum.qem" / "data.npy", "rb") as f:
            while f.read(1 << 16):
                pass
    assert raised.value.errno == 5  # EIO
    a = np.load(mnt / "f32-lanes-33x40.qem" / "data.npy")
    want = np.load(conformance() / "qem/f32-lanes-33x40.npy")
    assert a.tobytes() == want.astype("<f4").tobytes()
