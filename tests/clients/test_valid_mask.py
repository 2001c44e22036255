"""The detector validity mask is parsed strictly: hex digits only, exactly
ceil(pixels / 8) pairs. A file whose mask holds a sign (which a lenient
number parser takes: "+c" is 12) is refused by every command with exit 2,
the file and the member named."""

import hashlib
import json
import struct

import pytest

from conftest import conformance, run

NAME = "u16-invalid-mask-33x40"


def with_mask_prefix(dest, prefix):
    """The conformance file with the mask's first pair replaced by `prefix`
    (same length) and the header digest recomputed (spec §3)."""
    original = (conformance() / "qem" / f"{NAME}.qem").read_bytes()
    start = struct.unpack_from("<Q", original, 16)[0]
    text = original[56:start].decode()
    mask = json.loads(text)["valid"]
    at = text.index(json.dumps(mask))
    text = text[: at + 1] + prefix + text[at + 1 + len(prefix):]
    out = bytearray(original)
    out[56:start] = text.encode()
    out[24:56] = hashlib.sha256(out[56:start]).digest()
    dest.write_bytes(out)
    return dest


@pytest.mark.parametrize("prefix", ["+c", "-1", "0x", " e"])
def test_a_mask_with_anything_but_hex_digits_is_refused(prefix, tmp_path):
    bad = with_mask_prefix(tmp_path / "bad.qem", prefix)
    for command in (["validate"], ["show"], ["hash"], ["cat", "mask.npy"]):
        args = [command[0], bad, *command[1:]]
        out = run("qem", *args, check=False, timeout=60)
        said = (out.stdout + out.stderr).decode(errors="replace")
        assert out.returncode == 2, f"{command}: {said}"
        assert "bad.qem" in said and "validity mask" in said, f"{command}: {said}"


def test_the_same_edit_with_hex_digits_is_accepted(tmp_path):
    # Control: the same surgery writing the first pair back in upper case
    # (which the reference accepts, spec §15.7) gives a valid file.
    original = (conformance() / "qem" / f"{NAME}.qem").read_bytes()
    start = struct.unpack_from("<Q", original, 16)[0]
    first = json.loads(original[56:start])["valid"][:2]
    assert first.upper() != first, "pick a pair with a letter"
    good = with_mask_prefix(tmp_path / "good.qem", first.upper())
    run("qem", "validate", good)
