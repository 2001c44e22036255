"""Our `--mask-edges py4dstem` against py4DSTEM 0.14.18 itself, run in its
own environment (.venv-py4dstem, numpy < 2) on the same counts: its
annular and circular virtual images equal ours exactly for a centre on a
pixel and integer radii, where pixel centres lie exactly on both edges;
and with the default convention ours differ by exactly the edge pixels."""

import subprocess

import numpy as np

from conftest import load, py4dstem_python, run

CY, CX, RI, RO = 12, 14, 5, 10

PY4DSTEM = """
import sys, warnings
import numpy as np
warnings.simplefilter("ignore")
import py4DSTEM
cy, cx, ri, ro = (float(v) for v in sys.argv[2:6])
d = py4DSTEM.DataCube(np.load(sys.argv[1]))
ring = d.get_virtual_image(mode="annulus", geometry=((cy, cx), (ri, ro)), name="ring", verbose=False)
disk = d.get_virtual_image(mode="circle", geometry=((cy, cx), ro), name="disk", verbose=False)
np.save(sys.argv[6], np.stack([np.asarray(ring.data), np.asarray(disk.data)]))
"""


def test_rings_and_disks_equal_py4dstem_with_its_edge_convention(tmp_path):
    counts = np.random.default_rng(7).poisson(20, size=(4, 5, 24, 28)).astype(np.uint16)
    np.save(tmp_path / "c.npy", counts)
    qem = tmp_path / "c.qem"
    run("qem", "convert", tmp_path / "c.npy", qem)
    out = tmp_path / "py4dstem.npy"
    subprocess.run(
        [py4dstem_python(), "-c", PY4DSTEM, tmp_path / "c.npy", str(CY), str(CX), str(RI), str(RO), out],
        check=True,
        timeout=300,
    )
    ring, disk = np.load(out)
    ours_ring = load(qem, f"virtual/annulus-{CY}-{CX}-{RI}-{RO}.npy", "--mask-edges", "py4dstem")
    ours_disk = load(qem, f"virtual/disk-{CY}-{CX}-{RO}.npy", "--mask-edges", "py4dstem")
    np.testing.assert_array_equal(ours_ring.astype(np.float64), ring)
    np.testing.assert_array_equal(ours_disk.astype(np.float64), disk)

    # Both edges excluded: the default (both included) adds exactly them.
    rows, cols = np.indices(counts.shape[2:])
    d2 = (rows - CY) ** 2 + (cols - CX) ** 2
    edges = (d2 == RI**2) | (d2 == RO**2)
    assert edges.sum() > 12
    inclusive = load(qem, f"virtual/annulus-{CY}-{CX}-{RI}-{RO}.npy")
    np.testing.assert_array_equal(inclusive, ours_ring + counts[:, :, edges].sum(axis=-1, dtype=np.uint64))
