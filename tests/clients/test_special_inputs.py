"""Inputs that are not regular files (FIFOs, devices, directories, sockets)
and inputs that change while a command reads them: every command refuses
them at once with exit 2 and the path named, and writes nothing.

Each command runs under a timeout, so a command that blocks on a FIFO or
reads an endless device fails the test instead of hanging it.
"""

import os
import shutil
import socket
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from conftest import binary, conformance, run

TIMEOUT = 10


def refused(name, *args, cwd=None, env=None):
    try:
        out = run(name, *args, check=False, timeout=TIMEOUT, cwd=cwd, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} {' '.join(map(str, args))} still running after {TIMEOUT} s")
    # Diagnostics go to stderr; `validate` prints its per-file verdicts
    # (the upstream format) on stdout.
    said = (out.stdout + out.stderr).decode(errors="replace")
    assert out.returncode == 2, said
    return said


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "input.fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["semq", "show"],
        ["semq", "validate"],
        ["semq", "hash"],
        ["qem", "validate"],
        ["qem", "show"],
        ["qem", "hash"],
        ["qem", "ls"],
    ],
)
def test_a_fifo_is_refused_at_once(command, fifo):
    err = refused(*command, fifo)
    # (`qem ls` goes through the tree's container lookup, which says
    # "not a regular file" without the kind.)
    assert str(fifo) in err and ("FIFO" in err or "not a regular file" in err), err


@pytest.mark.parametrize("output", ["out.qem", "out.npy", "out.tiff", "out.zarr"])
def test_convert_refuses_a_fifo_and_writes_nothing(output, fifo, tmp_path):
    err = refused("qem", "convert", fifo, tmp_path / output)
    assert str(fifo) in err and "FIFO" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["input.fifo"]


def test_convert_refuses_a_fifo_as_the_raw_file_of_an_empad_description(tmp_path):
    raw = tmp_path / "scan_x2_y2.raw"
    os.mkfifo(raw)
    xml = tmp_path / "acquisition.xml"
    xml.write_bytes(
        b'<?xml version="1.0" encoding="utf-8"?><root><pix_x>2</pix_x><pix_y>2</pix_y>'
        b'<raw_file filename="scan_x2_y2.raw"/></root>'
    )
    err = refused("qem", "convert", xml, tmp_path / "out.qem")
    assert str(raw) in err and "FIFO" in err, err
    assert not (tmp_path / "out.qem").exists()


def test_an_hdf5_external_link_to_a_fifo_is_refused_at_once(tmp_path):
    # The HDF5 library opens a linked file by name and would wait on a FIFO
    # for ever: the link's file is checked as any input is.
    os.mkfifo(tmp_path / "pipe.h5")
    master = tmp_path / "scan_master.h5"
    with h5py.File(master, "w") as m:
        m["entry/data/data_000001"] = h5py.ExternalLink("pipe.h5", "/entry/data/data")
    err = refused("qem", "convert", master, tmp_path / "a.qem", "--scan", "1,1")
    assert str(master) in err and "/entry/data/data_000001 links to" in err and "FIFO" in err, err

    plain = tmp_path / "plain.h5"
    with h5py.File(plain, "w") as f:
        f["group/data"] = h5py.ExternalLink("pipe.h5", "/data")
    err = refused("qem", "convert", f"{plain}:/group/data", tmp_path / "b.qem")
    assert str(plain) in err and "/group/data links to" in err and "FIFO" in err, err

    # An EMD file's search for its array passes such a link by.
    emd = tmp_path / "scan.emd"
    a = np.arange(2 * 3 * 4 * 5, dtype=np.uint16).reshape(2, 3, 4, 5)
    with h5py.File(emd, "w") as f:
        f.attrs["version_major"] = 1
        g = f.create_group("experimental/science_data")
        g.attrs["emd_group_type"] = 1
        g["data"] = a
        f["elsewhere"] = h5py.ExternalLink("pipe.h5", "/")
    run("qem", "convert", emd, tmp_path / "c.qem", timeout=TIMEOUT)
    run("qem", "convert", tmp_path / "c.qem", tmp_path / "c.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), a)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "c.npy", "c.qem", "pipe.h5", "plain.h5", "scan.emd", "scan_master.h5"]


@pytest.mark.parametrize("where", ["working directory", "HDF5_EXT_PREFIX", "HDF5_VDS_PREFIX",
                                   "folder of a symbolic link's file"])
def test_a_fifo_the_library_would_find_elsewhere_is_refused_at_once(tmp_path, where):
    # The library looks for a linked or source file in more places than
    # beside the file that names it: first in the folders of a prefix
    # variable, last in the working directory and in the folder of the
    # file a symbolic link leads to.
    (tmp_path / "src").mkdir()
    other = tmp_path / "other"
    other.mkdir()
    os.mkfifo(other / "pipe.h5")
    path = tmp_path / "src" / "scan.h5"
    written = other / "real.h5" if where.startswith("folder") else path
    with h5py.File(written, "w") as f:
        if where == "HDF5_VDS_PREFIX":
            layout = h5py.VirtualLayout(shape=(1, 1, 2, 2), dtype="u2")
            layout[:] = h5py.VirtualSource("pipe.h5", "/data", shape=(1, 1, 2, 2))
            f.create_virtual_dataset("data", layout, fillvalue=0)
        else:
            f["data"] = h5py.ExternalLink("pipe.h5", "/data")
    if written != path:
        path.symlink_to(written)
    env = dict(os.environ)
    if where.startswith("HDF5"):
        env[where] = str(other)
    err = refused("qem", "convert", f"{path}:/data", tmp_path / "out.qem",
                  cwd=other if where == "working directory" else tmp_path, env=env)
    assert "pipe.h5, which cannot be read" in err and "FIFO" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "src"]


def test_a_linked_file_is_taken_where_the_library_finds_it_first(tmp_path):
    # HDF5_EXT_PREFIX's folder comes first: the library reads the data file
    # there and never opens the FIFO of the same name in the working
    # directory, so neither does the check.
    a = np.arange(2 * 3 * 4 * 5, dtype=np.uint16).reshape(2, 3, 4, 5)
    (tmp_path / "src").mkdir()
    (tmp_path / "elsewhere").mkdir()
    with h5py.File(tmp_path / "elsewhere" / "data.h5", "w") as f:
        f["data"] = a
    os.mkfifo(tmp_path / "data.h5")
    path = tmp_path / "src" / "scan.h5"
    with h5py.File(path, "w") as f:
        f["data"] = h5py.ExternalLink("data.h5", "/data")
    env = {**os.environ, "HDF5_EXT_PREFIX": str(tmp_path / "elsewhere")}
    run("qem", "convert", f"{path}:/data", tmp_path / "out.qem", cwd=tmp_path, env=env, timeout=TIMEOUT)
    run("qem", "convert", tmp_path / "out.qem", tmp_path / "out.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), a)


def test_semq_show_dev_zero_exits_without_reading():
    start = time.monotonic()
    err = refused("semq", "show", "/dev/zero")
    assert time.monotonic() - start < 2, "refused by kind, not after reading"
    assert "/dev/zero" in err and "character device" in err, err


def test_qem_validate_dev_zero_and_a_socket(tmp_path):
    err = refused("qem", "validate", "/dev/zero")
    assert "character device" in err, err
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "s.qem"))
    try:
        err = refused("qem", "validate", tmp_path / "s.qem")
        assert "socket" in err and "No such device" not in err, err
    finally:
        sock.close()


def test_a_directory_is_named_as_one(tmp_path):
    d = tmp_path / "scan.qem"
    d.mkdir()
    for command in (["qem", "validate"], ["qem", "hash"], ["semq", "show"]):
        err = refused(*command, d)
        assert "directory" in err and "No such device" not in err, err


def test_semq_encode_refuses_fifo_vectors(fifo, tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text("a\n")
    err = refused(
        "semq", "encode", "--op", "quant", "--dim", "4", "--bins", "4",
        "--vectors", fifo, "--ids", ids, tmp_path / "out.semq",
    )
    assert str(fifo) in err and "FIFO" in err, err
    assert not (tmp_path / "out.semq").exists()


def test_convert_exits_2_when_its_input_is_truncated_while_read(tmp_path):
    """A Fortran-order .npy is read through a memory map (the gather needs
    random access): truncating it mid-conversion must end the command with
    exit 2 naming the input, and leave no temporary behind."""
    src = tmp_path / "scan.npy"
    data = np.asfortranarray(
        np.random.default_rng(1).integers(0, 40, size=(16, 32, 64, 64), dtype=np.uint16)
    )
    np.save(src, data)
    size = src.stat().st_size
    out = tmp_path / "scan.qem"
    proc = subprocess.Popen(
        [str(binary("qem")), "convert", str(src), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        # Wait until the conversion is writing (its temporary exists).
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None:
            if any(p.name.startswith(".scan.qem.tmp") for p in tmp_path.iterdir()):
                break
            time.sleep(0.002)
        assert proc.poll() is None, "converted before the truncation: make the input larger"
        os.truncate(src, size // 8)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = stderr.decode(errors="replace")
    assert proc.returncode == 2, f"exit {proc.returncode}: {err}"
    assert str(src) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scan.npy"]


def peak_rss_kib(args):
    """Exit code, stderr and peak resident set (KiB) of one command, run
    from a fresh interpreter so no earlier child's peak is counted."""
    probe = (
        "import resource, subprocess, sys\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True)\n"
        "sys.stderr.buffer.write(p.stderr)\n"
        "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, *map(str, args)], capture_output=True, timeout=60
    )
    code, rss = out.stdout.split()
    return int(code), out.stderr.decode(errors="replace"), int(rss)


@pytest.mark.parametrize("command", ["show", "validate", "hash"])
def test_semq_refuses_a_huge_file_after_reading_its_header(command, tmp_path):
    """A real state file grown (sparsely) to 3 GiB: its header declares far
    fewer bytes, so it is refused from the first pages, without reading
    (or mapping in) the rest."""
    big = tmp_path / "big.semq"
    shutil.copy(conformance() / "semq" / "files" / "empty-orbit-u64.semq", big)
    os.truncate(big, 3 << 30)
    start = time.monotonic()
    code, err, rss = peak_rss_kib([binary("semq"), command, big])
    assert code == 2, err
    assert rss < 100 * 1024, f"peak RSS {rss} KiB"
    assert time.monotonic() - start < 5
