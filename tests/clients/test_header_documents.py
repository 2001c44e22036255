"""`header.json`, `info.json` and `qem show --json` hold the stored header
exactly: the same members in the same order and the same values, as
Python's own JSON parser reads the header's bytes from the file (spec §2).
They are re-indented from the header's text as it is parsed, and their sizes
are found that way when the container opens, so the size a mount reports
must be the size read."""

import json
import shutil
import struct

import pytest

from conftest import cat, conformance, run

VALID = sorted(
    p for p in (conformance() / "qem").glob("*.qem") if not p.name.startswith("bad-")
)


def ordered(text):
    """The JSON document `text` with every object as its list of members,
    in order (a dict would hide a reordering)."""
    return json.loads(text, object_pairs_hook=lambda pairs: [(k, v) for k, v in pairs])


def stored_header(path):
    data = path.read_bytes()
    assert data[:8] == b"QEMDATA1"
    n, start = struct.unpack_from("<QQ", data, 8)
    assert start == 56 + n
    return ordered(data[56:start])


def members(doc):
    return dict(doc)


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_the_documents_hold_the_stored_header(path):
    header = stored_header(path)
    assert ordered(cat(path, "header.json")) == header
    info = members(ordered(cat(path, "info.json")))
    assert info["header"] == header
    shown = members(ordered(run("qem", "show", "--json", path).stdout))
    assert shown["header"] == header
    assert [k for k, _ in ordered(cat(path, "info.json"))] == [
        "header",
        "summary",
        "reductions_backend",
    ]


def test_a_mount_reports_the_size_it_serves(tmp_path, mount):
    src = tmp_path / "src"
    src.mkdir()
    for path in VALID:
        shutil.copy(path, src / path.name)
    mnt = mount(src)
    for path in VALID:
        for name in ("header.json", "info.json"):
            f = mnt / path.name / name
            body = f.read_bytes()
            assert f.stat().st_size == len(body), f
            assert body.endswith(b"}\n")
