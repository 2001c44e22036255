"""Shared fixtures of the client tests: the field's own Python readers and
writers (numpy, zarr, xarray, dask, tifffile, h5py) against our binaries.

Run by scripts/test.sh after `cargo test --release` has built the binaries,
with the virtual environment that scripts/setup.sh makes (.venv/).
"""

import io
import json
import os
import resource
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def bin_dir() -> Path:
    """Where the release binaries are (QEMFS_BIN_DIR overrides)."""
    if "QEMFS_BIN_DIR" in os.environ:
        return Path(os.environ["QEMFS_BIN_DIR"])
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return target / "release"


def binary(name: str) -> Path:
    path = bin_dir() / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `cargo build --release --workspace` first")
    return path


def run(name: str, *args, check=True, **kwargs) -> subprocess.CompletedProcess:
    """Runs one of our binaries (`qem`, `semq`, `qemfs`) and captures its output."""
    out = subprocess.run([str(binary(name)), *map(str, args)], capture_output=True, **kwargs)
    if check and out.returncode != 0:
        raise AssertionError(
            f"{name} {' '.join(map(str, args))} exited {out.returncode}: {out.stderr.decode(errors='replace')}"
        )
    return out


def address_space_limit(gib: float):
    """A `preexec_fn` capping a child's address space at `gib` GiB: a run
    that allocates what a hostile field declares fails there, where with
    enough memory it would only be slow."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (int(gib * 2**30),) * 2)
    return limit


def cat(qem, path, *flags) -> bytes:
    """One file of a container's virtual tree, through `qem cat`."""
    return run("qem", "cat", *flags, qem, path).stdout


def load(qem, path, *flags):
    """An `.npy` of a container's virtual tree, through `qem cat`."""
    import numpy as np

    return np.load(io.BytesIO(cat(qem, path, *flags)))


def qem_from_array(tmp_path: Path, array, name: str) -> Path:
    """`array` written as `tmp_path/src/NAME` by `qem convert` (through a
    temporary .npy): a source folder for a mount, or a file for `qem`."""
    import numpy as np

    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    npy = tmp_path / f"{name}.npy"
    np.save(npy, array)
    run("qem", "convert", npy, src / name)
    npy.unlink()
    return src / name


def backends(qem):
    """`--gpu off`, plus `--gpu wgpu` when an adapter serves it (CI installs
    Mesa's Vulkan drivers, so there it must)."""
    info = json.loads(cat(qem, "info.json", "--gpu", "wgpu"))
    if info["reductions_backend"] != "wgpu":
        if os.environ.get("CI"):
            pytest.fail("CI installs Mesa's Vulkan drivers: wgpu must be available")
        return [["--gpu", "off"]]
    return [["--gpu", "off"], ["--gpu", "wgpu"]]


def conformance() -> Path:
    return REPO / "tests" / "fixtures" / "conformance"


@pytest.fixture
def examples() -> Path:
    return REPO / "examples" / "data"


def _mounted(path: Path) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split(" ")[4] == str(path) for line in f)


def can_mount() -> bool:
    return os.geteuid() == 0 and Path("/dev/fuse").exists()


@pytest.fixture
def mount(tmp_path):
    """A factory: mount(src, *flags) mounts SRC with `qemfs mount` and returns
    the mountpoint; every mount is taken down when the test ends."""
    if not can_mount():
        pytest.skip("mounting needs root and /dev/fuse")
    mounts = []

    def make(src: Path, *flags) -> Path:
        mnt = tmp_path / f"mnt{len(mounts)}"
        mnt.mkdir()
        run("qemfs", "mount", src, mnt, "--log-file", tmp_path / f"log{len(mounts)}", *flags)
        assert _mounted(mnt), "qemfs mount returned 0, so the mount must be there"
        mounts.append(mnt)
        return mnt

    yield make
    for mnt in mounts:
        run("qemfs", "unmount", mnt, check=False)
        deadline = time.monotonic() + 10
        while _mounted(mnt) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _mounted(mnt):
            subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def copy_fixture(tmp_path):
    """copy_fixture("qem/NAME.qem", dest_dir=None) copies a conformance file."""

    def copy(rel: str, dest: Path | None = None) -> Path:
        dest = dest or tmp_path / "src"
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / Path(rel).name
        shutil.copy(conformance() / rel, target)
        return target

    return copy


def py4dstem_python():
    """The Python of py4DSTEM's own environment (it pins numpy < 2, so it
    cannot share .venv): `.venv-py4dstem/`, made by scripts/setup.sh, or
    QEMFS_PY4DSTEM_PYTHON. Missing fails under CI and skips elsewhere."""
    path = os.environ.get("QEMFS_PY4DSTEM_PYTHON", str(REPO / ".venv-py4dstem" / "bin" / "python"))
    if not os.path.exists(path):
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing: scripts/setup.sh makes the py4DSTEM environment")
        pytest.skip(f"no py4DSTEM environment at {path} (scripts/setup.sh makes it)")
    return path
