"""`qem convert` as a pipeline: inputs recognised by content, and memory
bounded by the window whatever the source size (inputs written by numpy)."""

import hashlib
import subprocess
import sys

import numpy as np

from conftest import binary, run


def test_a_npy_is_recognised_by_content_not_by_name(tmp_path):
    a = np.arange(2 * 3 * 4 * 5, dtype=np.uint16).reshape(2, 3, 4, 5) * 9
    src = tmp_path / "scan.dat"
    with open(src, "wb") as f:
        np.save(f, a)
    run("qem", "convert", src, tmp_path / "scan.qem")
    run("qem", "convert", tmp_path / "scan.qem", tmp_path / "back.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "back.npy"), a)


def test_any_source_converts_to_npy_and_tiff(tmp_path):
    import tifffile

    a = (np.arange(3 * 2 * 6 * 7, dtype=np.float32).reshape(3, 2, 6, 7) - 40) / 3
    np.save(tmp_path / "a.npy", a)
    run("qem", "convert", tmp_path / "a.npy", tmp_path / "b.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), a)
    run("qem", "convert", tmp_path / "a.npy", tmp_path / "b.tiff")
    pages = tifffile.imread(tmp_path / "b.tiff")
    np.testing.assert_array_equal(pages.reshape(a.shape), a)


def test_peak_memory_is_bounded_by_the_window_not_the_source(tmp_path):
    # 512 MiB of uint16 frames; the pipeline holds one 64 MiB window plus
    # the writer's chunk, so the resident set stays far below the source.
    rows, cols, det = 256, 256, 64
    src = tmp_path / "big.npy"
    a = np.lib.format.open_memmap(src, mode="w+", dtype=np.uint16, shape=(rows, cols, det, det))
    pattern = (np.arange(det * det, dtype=np.uint32).reshape(det, det) % 97).astype(np.uint16)
    for r in range(rows):
        a[r] = pattern + np.uint16(r % 13)
    a.flush()
    digest = hashlib.sha256()
    for r in range(rows):
        digest.update(memoryview(np.ascontiguousarray(a[r])).cast("B"))
    del a
    # A small parent process measures the child: a fork of this (large)
    # process would count our own pages as the child's before it execs.
    measure = (
        "import resource, subprocess, sys\n"
        "out = subprocess.run(sys.argv[1:])\n"
        "print(out.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", measure, str(binary("qem")), "convert", str(src), str(tmp_path / "big.qem")],
        capture_output=True,
        check=True,
    )
    status, peak_kib = map(int, out.stdout.split())
    assert status == 0, out.stderr.decode()
    assert peak_kib < 384 * 1024, f"peak RSS {peak_kib / 1024:.0f} MiB for a 512 MiB source"
    hashed = run("qem", "hash", tmp_path / "big.qem").stdout.decode().split()[0]
    assert hashed == digest.hexdigest()
