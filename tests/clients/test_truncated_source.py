"""A source truncated in place to the middle of its last page while the
mount holds it: the bytes past the new end read as zeros with no SIGBUS,
so the daemon checks the size on its descriptor, and a read that needs a
block not yet decoded fails with EIO instead of serving values computed
from zeros (issue 14's guard gap)."""

import errno
import os

import numpy as np
import pytest

from conftest import run


def test_a_block_read_after_a_cut_inside_the_last_page_is_eio(mount, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    # Four 512-scan blocks (2048 scans of 16x16 uint16, 1 MiB decoded),
    # written by numpy and converted by our writer.
    rng = np.random.default_rng(7)
    data = rng.poisson(3.0, size=(32, 64, 16, 16)).astype(np.uint16)
    np.save(tmp_path / "scan.npy", data)
    run("qem", "convert", tmp_path / "scan.npy", src / "scan.qem")
    size = os.path.getsize(src / "scan.qem")
    cut = size - 16
    assert cut // 4096 == (size - 1) // 4096 and cut % 4096, size
    mnt = mount(src, "--cache-size", "64")
    path = mnt / "scan.qem" / "data.npy"
    whole = path.stat().st_size
    with open(path, "rb", buffering=0) as f:
        head = f.read(4096)
        assert len(head) == 4096
        # In place (the same inode), as another process would do it.
        os.truncate(src / "scan.qem", cut)
        f.seek(whole - 4096)
        with pytest.raises(OSError) as raised:
            f.read(4096)
        assert raised.value.errno == errno.EIO
