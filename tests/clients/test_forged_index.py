"""A forged spatial index (a counts file whose index words were edited and
whose checksums were recomputed as the specification defines them, so that
only a full `qem validate` or a decode can tell) is never served once a
decode has found it out, and never at all with `--verify-index`.
"""

import hashlib
import io
import json
import shutil
import struct

import numpy as np
import pytest

from conftest import conformance, run

NAME = "u8-mixed-13x7"


def forge(dest, source=None):
    """Flips the lowest bit of the first spatial-index word of chunk 0 of
    `source` (the conformance file by default) and recomputes the body
    checksum and the header digest (spec §3, §4)."""
    source = source or conformance() / "qem" / f"{NAME}.qem"
    original = source.read_bytes()
    start = struct.unpack_from("<Q", original, 16)[0]
    header = json.loads(original[56:start])
    words = header["chunks"][0]["arrays"][3]["offset"]
    forged = bytearray(original)
    forged[start + words] ^= 1
    old = hashlib.sha256(original[start:]).hexdigest()
    new = hashlib.sha256(forged[start:]).hexdigest()
    text = original[56:start].decode().replace(old, new)
    assert len(text) == start - 56 and new in text
    forged[56:start] = text.encode()
    forged[24:56] = hashlib.sha256(forged[56:start]).digest()
    dest.write_bytes(forged)
    return dest


def sums_of(qem):
    """Per-scan sums of the valid pixels, from data.npy and mask.npy."""
    data = np.load(io.BytesIO(run("qem", "cat", qem, "data.npy").stdout))
    mask = np.load(io.BytesIO(run("qem", "cat", qem, "mask.npy").stdout))
    return data.astype(np.uint64).sum(axis=(2, 3), where=mask)


def test_only_a_full_check_or_a_decode_finds_the_forgery(tmp_path):
    forged = forge(tmp_path / "forged.qem")
    run("qem", "validate", "--quick", forged)
    out = run("qem", "validate", forged, check=False)
    assert out.returncode == 2 and b"spatial index" in out.stdout + out.stderr


def test_verify_index_refuses_a_forged_index(tmp_path):
    forged = forge(tmp_path / "forged.qem")
    for product in ["virtual/sum.npy", "virtual/bf.npy"]:
        out = run("qem", "cat", "--verify-index", forged, product, check=False)
        err = out.stderr.decode(errors="replace")
        assert out.returncode == 2, err
        assert "forged.qem" in err and "spatial index" in err, err


def test_verify_index_serves_exact_sums_of_a_sound_file(tmp_path):
    good = tmp_path / f"{NAME}.qem"
    shutil.copy(conformance() / "qem" / f"{NAME}.qem", good)
    out = run("qem", "cat", "--verify-index", good, "virtual/sum.npy").stdout
    assert np.array_equal(np.load(io.BytesIO(out)), sums_of(good))


def test_the_mount_refuses_an_index_a_decode_found_forged(mount, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    forge(src / "forged.qem")
    shutil.copy(conformance() / "qem" / f"{NAME}.qem", src / "good.qem")
    mnt = mount(src)
    # Reading the whole array decodes every block, which checks its index.
    np.load(mnt / "forged.qem" / "data.npy")
    with pytest.raises(OSError) as raised:
        np.load(mnt / "forged.qem" / "virtual" / "sum.npy")
    assert raised.value.errno == 5  # EIO
    np.load(mnt / "good.qem" / "data.npy")
    assert np.array_equal(np.load(mnt / "good.qem" / "virtual" / "sum.npy"), sums_of(src / "good.qem"))


def test_the_mount_refuses_an_index_the_first_window_found_forged(mount, tmp_path):
    """A block decoded in windows (84 MB of frames, more than a 64 MiB
    window) whose first frame disagrees with its index: reading the first
    window is enough for index products to be refused, before any later
    window is decoded."""
    rng = np.random.default_rng(7)
    frames = rng.poisson(0.05, size=(1, 512, 256, 320)).astype(np.uint16)
    np.save(tmp_path / "big.npy", frames)
    run("qem", "convert", tmp_path / "big.npy", tmp_path / "big.qem")
    src = tmp_path / "src"
    src.mkdir()
    forge(src / "forged.qem", tmp_path / "big.qem")
    # The prefetcher's share (a quarter of 64 MiB) holds no window: nothing
    # but the read below decodes.
    mnt = mount(src, "--cache-size", 64, "--gpu", "off")
    with open(mnt / "forged.qem" / "data.npy", "rb") as f:
        head = f.read(4096)
    assert head.startswith(b"\x93NUMPY")
    with pytest.raises(OSError) as raised:
        np.load(mnt / "forged.qem" / "virtual" / "sum.npy")
    assert raised.value.errno == 5  # EIO
