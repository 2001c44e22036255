"""The mount's one byte budget (`--cache-size`): large derived files are
served in windows, never held whole, and huge folders are listed without
being materialised. The daemon's peak resident memory (VmHWM, from
/proc/PID/status; the daemon names its PID on the mount root) is held to
the budget plus a stated margin for the daemon itself (code, threads,
mapped pages of the source).
"""

import errno
import json
import os
import threading
import time

import numpy as np

from conftest import qem_from_array, run

# What the daemon needs besides the budget: its code and libraries, thread
# stacks in use, the mapped pages of a source, a read's buffers (measured:
# 43 MiB peak in all for the vectors.npy read below).
MARGIN_MIB = 96


def daemon_peak_mib(mnt):
    pid = int(os.getxattr(mnt, "user.qemfs.pid"))
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in the daemon's status")


def big_semq(path, n=262144, dim=256):
    """A .semq whose vectors.npy is n × dim float32 (256 MiB by default),
    made with `semq encode` from unit vectors written by numpy."""
    vectors = path.parent / "v.npy"
    out = np.lib.format.open_memmap(vectors, mode="w+", dtype=np.float32, shape=(n, dim))
    rng = np.random.default_rng(7)
    step = 32768
    for i in range(0, n, step):
        x = rng.standard_normal((min(step, n - i), dim), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out[i : i + step] = x
    out.flush()
    del out
    ids = path.parent / "ids.npy"
    np.save(ids, np.arange(n, dtype=np.uint64) * 3)
    run("semq", "encode", "--op", "quant", "--dim", dim, "--bins", 2, "--vectors", vectors, "--ids", ids, path)
    vectors.unlink()
    ids.unlink()
    return path


def test_vectors_npy_is_read_within_the_budget(tmp_path, mount):
    src = tmp_path / "src"
    src.mkdir()
    semq = big_semq(src / "big.semq")
    reference = tmp_path / "reference.npy"
    run("semq", "convert", semq, reference, "--what", "vectors")
    budget = 64
    mnt = mount(src, "--cache-size", budget, "--gpu", "off")
    got = np.load(mnt / "big.semq" / "vectors.npy", mmap_mode="r")
    want = np.load(reference, mmap_mode="r")
    assert got.shape == want.shape == (262144, 256)
    for i in range(0, got.shape[0], 16384):
        assert np.array_equal(got[i : i + 16384], want[i : i + 16384]), f"rows {i}.."
    # symbols.npy and rows.bin are made per read the same way.
    with open(mnt / "big.semq" / "rows.bin", "rb") as f:
        rows = sum(len(b) for b in iter(lambda: f.read(1 << 20), b""))
    assert rows == 262144 * 64
    peak = daemon_peak_mib(mnt)
    # Built whole (twice) the vectors alone were 512 MiB.
    assert peak <= budget + MARGIN_MIB, f"daemon peak {peak:.0f} MiB, budget {budget} MiB"


def test_a_huge_frames_folder_is_listed_page_by_page(tmp_path, mount):
    rows = 2_000_000
    src = qem_from_array(tmp_path, np.zeros((rows, 1, 1, 1), dtype=np.uint8), "tall.qem").parent
    budget = 64
    mnt = mount(src, "--cache-size", budget, "--gpu", "off")
    frames = mnt / "tall.qem" / "frames"
    assert (frames / "0").is_dir(), "an unpadded index finds its row"
    before = daemon_peak_mib(mnt)
    start = time.monotonic()
    count, first, last = 0, None, None
    with os.scandir(frames) as entries:
        for e in entries:
            count += 1
            first = first or e.name
            last = e.name
    took = time.monotonic() - start
    assert count == rows
    assert (first, last) == ("0000000", "1999999")
    grown = daemon_peak_mib(mnt) - before
    # Made whole, the listing of 2 M names and nodes took hundreds of MiB.
    assert grown <= 32, f"listing {rows} rows grew the daemon by {grown:.0f} MiB in {took:.1f} s"


def test_a_computed_file_larger_than_the_budget_is_served_whole(tmp_path, mount):
    # A 1100 × 1000 scan: the PNG preview of its sum image is 1.1 MB, more
    # than a 1 MiB budget can hold. It is computed once and served from a
    # spilled copy (not computed again for every request, nor held in
    # memory), byte for byte what a mount whose budget holds it serves.
    rng = np.random.default_rng(11)
    data = rng.integers(0, 4000, size=(1100, 1000, 2, 2), dtype=np.uint16)
    src = qem_from_array(tmp_path, data, "wide.qem").parent
    small = mount(src, "--cache-size", 1, "--gpu", "off")
    large = mount(src, "--cache-size", 1024, "--gpu", "off")
    png = "wide.qem/virtual/sum.png"
    want = (large / png).read_bytes()
    assert len(want) > 1 << 20 and want[:8] == b"\x89PNG\r\n\x1a\n"
    for _ in range(2):
        assert (small / png).read_bytes() == want
    # Range reads in the middle and at the end, as a seeking reader makes.
    with open(small / png, "rb") as f:
        f.seek(700_000)
        assert f.read(4096) == want[700_000:704_096]
        f.seek(len(want) - 10)
        assert f.read() == want[-10:]
    got = np.load(small / "wide.qem" / "virtual" / "sum.npy")
    assert np.array_equal(got, data.sum(axis=(2, 3), dtype=np.uint64))
    peak = daemon_peak_mib(small)
    assert peak <= 1 + MARGIN_MIB, f"daemon peak {peak:.0f} MiB, budget 1 MiB"


def cache_counters(mnt):
    return json.loads(os.getxattr(mnt, "user.qemfs.cache"))


def test_the_budgets_counters_are_on_the_root(tmp_path, mount):
    # A 32 × 32 scan of 32 × 32 uint16 frames: two 512-scan blocks of
    # 1 MiB, which are data.zarr's two chunks. A 2 MiB budget holds both
    # (and lets the prefetcher, a quarter of it, take neither).
    rng = np.random.default_rng(5)
    data = rng.integers(0, 50, size=(32, 32, 32, 32), dtype=np.uint16)
    src = qem_from_array(tmp_path, data, "scan.qem").parent
    mnt = mount(src, "--cache-size", 2, "--gpu", "off")
    chunks = sorted((mnt / "scan.qem" / "data.zarr" / "data").glob("[0-9]*"))
    assert [c.name for c in chunks] == ["0.0.0.0", "1.0.0.0"]
    start = cache_counters(mnt)
    assert start["budget_bytes"] == 2 << 20
    assert start["loads"] == 0 and start["held_bytes"] == 0

    def read(chunk):
        got = np.frombuffer(chunk.read_bytes(), np.uint16).reshape(16, 32, 32, 32)
        row = 16 * int(chunk.name.split(".")[0])
        assert np.array_equal(got, data[row : row + 16])
        return cache_counters(mnt)

    first = read(chunks[0])
    assert first["loads"] == 1, first
    assert first["held_bytes"] == 1 << 20 and first["entries"] == 1
    again = read(chunks[0])
    # Answered from the held block: no decode, at least one hit.
    assert again["loads"] == 1 and again["hits"] > first["hits"], again
    other = read(chunks[1])
    assert other["loads"] == 2 and other["evictions"] == 0, other
    assert other["held_bytes"] == 2 << 20


def test_chunks_of_an_array_larger_than_the_budget_go_once_read_whole(tmp_path, mount):
    # Sixteen 1 MiB chunks (one block each) under a 4 MiB budget: a chunk
    # read whole is evicted at once, its buffer taking the next decode,
    # instead of the cache filling the budget with fresh memory that a read
    # through an array it cannot hold never finds again; each block is
    # decoded about once.
    rng = np.random.default_rng(6)
    data = rng.integers(0, 50, size=(128, 64, 32, 32), dtype=np.uint16)
    src = qem_from_array(tmp_path, data, "scan.qem").parent
    mnt = mount(src, "--cache-size", 4, "--gpu", "off")
    chunks = sorted((mnt / "scan.qem" / "data.zarr" / "data").glob("[0-9]*"),
                    key=lambda c: int(c.name.split(".")[0]))
    assert len(chunks) == 16
    for i, chunk in enumerate(chunks):
        got = np.frombuffer(chunk.read_bytes(), np.uint16).reshape(8, 64, 32, 32)
        assert np.array_equal(got, data[8 * i : 8 * i + 8])
        counters = cache_counters(mnt)
        # Whatever the prefetcher decoded ahead is held; the chunks read are not.
        assert counters["evictions"] >= i + 1, counters
        assert counters["held_bytes"] <= 2 << 20, counters
    assert counters["loads"] <= 17, counters


def test_a_chunk_read_again_is_held_until_read_through_again(tmp_path, mount):
    # Eight 1 MiB chunks under a 4 MiB budget. A chunk read whole is let
    # go; read again at once, it is taken back and held while the second
    # reader is part way through it, then let go once that reader has had
    # it all. The last chunk: no block after it for the prefetcher to
    # decode into its buffer meanwhile. Unbuffered, because Python's
    # buffered reader asks for a whole st_blksize (1 MiB here) at a time.
    rng = np.random.default_rng(7)
    data = rng.integers(0, 50, size=(64, 64, 32, 32), dtype=np.uint16)
    src = qem_from_array(tmp_path, data, "scan.qem").parent
    mnt = mount(src, "--cache-size", 4, "--gpu", "off")
    chunk = mnt / "scan.qem" / "data.zarr" / "data" / "7.0.0.0"
    expected = data[56:64].tobytes()
    half = len(expected) // 2
    assert chunk.read_bytes() == expected
    before = cache_counters(mnt)
    with open(chunk, "rb", buffering=0) as f:
        assert f.read(half) == expected[:half]
        partway = cache_counters(mnt)
        assert partway["evictions"] == before["evictions"], (before, partway)
        assert partway["held_bytes"] == len(expected), partway
        assert f.read(half) == expected[half:]
    after = cache_counters(mnt)
    assert after["evictions"] == before["evictions"] + 1, (before, after)
    assert after["loads"] == before["loads"] == 1, (before, after)


def test_concurrent_chunk_readers_under_a_small_budget_decode_each_block_about_once(
        tmp_path, mount):
    # Four readers at once, each reading all eight 4 MiB chunks (one block
    # each) under a 4 MiB budget: a chunk's read reaches the daemon as four
    # 1 MiB requests, between which the other readers' decodes evict its
    # block. A block evicted while still in memory is taken back; before,
    # nearly every request decoded it again (141-155 decodes for the 32
    # chunk reads, against 27-33 since).
    rng = np.random.default_rng(3)
    data = rng.integers(0, 9, size=(64, 64, 64, 64), dtype=np.uint16)
    src = qem_from_array(tmp_path, data, "scan.qem").parent
    mnt = mount(src, "--cache-size", 4, "--gpu", "off")
    chunks = sorted((mnt / "scan.qem" / "data.zarr" / "data").glob("[0-9]*"))
    assert len(chunks) == 8
    failures = []

    def reader(start):
        try:
            for c in chunks[start:] + chunks[:start]:
                with open(c, "rb") as f:
                    got = np.frombuffer(f.read(), np.uint16).reshape(8, 64, 64, 64)
                row = 8 * int(c.name.split(".")[0])
                assert np.array_equal(got, data[row : row + 8]), c.name
        except Exception as e:  # reported by the test's thread
            failures.append(e)

    threads = [threading.Thread(target=reader, args=(2 * k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    counters = cache_counters(mnt)
    reads = 4 * len(chunks)
    assert counters["loads"] <= 1.5 * reads, counters
    assert counters["held_bytes"] <= counters["budget_bytes"], counters


def vm_size_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmSize in the daemon's status")


def test_a_block_the_system_refuses_memory_for_fails_that_read_not_the_mount(tmp_path, mount):
    """Under a limit on the daemon's address space (`ulimit -v`, a batch
    system's memory limit), a 64 MiB block that cannot be allocated fails
    the read that needed it with ENOMEM and a log line naming the file; the
    mount goes on, and so do reads that need no block (a frame decoded
    alone, listings, metadata). Before, the daemon aborted and the mount
    was gone (ENOTCONN)."""
    array = np.zeros((1, 512, 256, 256), np.uint16)
    array[0, :, 100:110, 50:60] = np.arange(512, dtype=np.uint16)[:, None, None]
    src = qem_from_array(tmp_path, array, "big_block.qem").parent
    # The daemon's own address space once it has served a frame (its
    # threads started), measured on a mount without a limit.
    mnt = mount(src)
    frame = np.load(mnt / "big_block.qem" / "frames" / "0" / "007.npy")
    assert np.array_equal(frame, array[0, 7])
    baseline = vm_size_mib(int(os.getxattr(mnt, "user.qemfs.pid")))
    run("qemfs", "unmount", mnt)
    # Room for a frame, none for a 64 MiB block.
    limited = tmp_path / "limited"
    limited.mkdir()
    log = tmp_path / "limited.log"
    limit = int((baseline + 32) * 2**20)

    def cap():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    run("qemfs", "mount", src, limited, "--log-file", log, preexec_fn=cap)
    try:
        container = limited / "big_block.qem"
        assert np.array_equal(np.load(container / "frames" / "0" / "007.npy"), frame)
        with open(container / "data.npy", "rb") as f:
            try:
                f.read()
                raise AssertionError("a 64 MiB block was allocated under the limit")
            except OSError as e:
                assert e.errno == errno.ENOMEM, e
        text = log.read_text()
        assert "out of memory" in text and "big_block.qem" in text, text
        # The mount is alive.
        assert "data.npy" in os.listdir(container)
        assert os.getxattr(container, "user.qem.shape") == b"1,512,256,256"
        assert int(os.getxattr(limited, "user.qemfs.pid")) > 0
    finally:
        run("qemfs", "unmount", limited, check=False)
