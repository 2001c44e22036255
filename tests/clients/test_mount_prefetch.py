"""Prefetch through a real mount: a sequential reader of `data.npy` gets the
next block decoded ahead of it, and a block that does not fit the
prefetchers' share of `--cache-size` (a quarter) is never prefetched.

The daemon's statfs reports the number of values its budget holds as the
file count (`f_files`), which is what is watched here. Readahead is turned
off on the reader's descriptor (POSIX_FADV_RANDOM), so the kernel asks for
exactly the bytes read and nothing beyond block 0: a second block in the
budget can only be the prefetcher's.
"""

import io
import os
import time

import numpy as np

from conftest import run

SHAPE = (6, 256, 64, 64)  # 1536 frames: three 512-frame blocks of 4 MiB


def acquisition(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    npy = tmp_path / "a.npy"
    rng = np.random.default_rng(3)
    a = rng.poisson(0.3, SHAPE).astype(np.uint16)
    np.save(npy, a)
    run("qem", "convert", npy, src / "a.qem")
    npy.unlink()
    return src, a


def held(mnt):
    return os.statvfs(mnt).f_files


def read_first_block(mnt):
    """Reads the npy header, then block 0 of data.npy in 256 KiB pieces, in
    order, without readahead; returns the bytes read."""
    path = mnt / "a.qem" / "data.npy"
    # Block 0, less its last page: the kernel reads whole pages, and the
    # page holding block 0's end holds block 1's start.
    block = 512 * 64 * 64 * 2 - 4096
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        head = io.BytesIO(os.pread(fd, 4096, 0))
        fmt = np.lib.format
        version = fmt.read_magic(head)
        header = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}[version]
        shape, _, dtype = header(head)
        assert (shape, dtype) == (SHAPE, np.dtype("<u2"))
        offset = head.tell()
        got = bytearray()
        while len(got) < block:
            got += os.pread(fd, min(256 << 10, block - len(got)), offset + len(got))
    finally:
        os.close(fd)
    return bytes(got)


def test_a_sequential_reader_gets_the_next_block_prefetched(tmp_path, mount):
    src, a = acquisition(tmp_path)
    mnt = mount(src, "--cache-size", 64, "--gpu", "off")
    got = read_first_block(mnt)
    assert got == a[:2].tobytes()[: len(got)]
    deadline = time.monotonic() + 20
    while held(mnt) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert held(mnt) == 2, f"{held(mnt)} values held: block 1 was not prefetched"
    # One block ahead, not the whole file.
    time.sleep(0.5)
    assert held(mnt) == 2, f"{held(mnt)} values held after reading one block"


def test_a_block_beyond_the_prefetch_share_is_not_prefetched(tmp_path, mount):
    src, _ = acquisition(tmp_path)
    # 8 MiB: a quarter (2 MiB) cannot hold a 4 MiB block.
    mnt = mount(src, "--cache-size", 8, "--gpu", "off")
    read_first_block(mnt)
    time.sleep(1.0)
    assert held(mnt) == 1, f"{held(mnt)} values held: a block beyond the share was prefetched"
