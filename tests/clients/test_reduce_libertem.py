"""Our virtual detectors and masked centre of mass against LiberTEM 0.16
itself, run here on the same counts (a memory dataset, inline executor):
with `--mask-edges libertem` a ring and a disk whose edges pass exactly
through pixel centres give LiberTEM's images exactly, and the default
convention differs from it by precisely the pixels on the inner edge.
LiberTEM's `CoMUDF` with a mask radius agrees with `com-CY-CX-R_*` to
its float32 precision."""

import numpy as np
import pytest

from conftest import load, run

import libertem.api as libertem_api  # scripts/requirements-clients.txt
from libertem.executor.inline import InlineJobExecutor
from libertem.udf.com import CoMUDF

SR, SC, DR, DC = 4, 5, 24, 28
# A centre on a pixel and integer radii: 3-4-5 triangles put pixel centres
# exactly on both edges (distance 5 and 10).
CY, CX, RI, RO = 12, 14, 5, 10


@pytest.fixture(scope="module")
def acquisition(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("libertem")
    counts = np.random.default_rng(5).poisson(20, size=(SR, SC, DR, DC)).astype(np.uint16)
    np.save(tmp / "c.npy", counts)
    qem = tmp / "c.qem"
    run("qem", "convert", tmp / "c.npy", qem)
    ctx = libertem_api.Context(executor=InlineJobExecutor())
    return qem, counts, ctx, ctx.load("memory", data=counts, sig_dims=2)


def test_rings_and_disks_equal_libertem_with_its_edge_convention(acquisition):
    qem, counts, ctx, ds = acquisition
    ring = ctx.run(ctx.create_ring_analysis(dataset=ds, cx=CX, cy=CY, ri=RI, ro=RO)).intensity.raw_data
    disk = ctx.run(ctx.create_disk_analysis(dataset=ds, cx=CX, cy=CY, r=RO)).intensity.raw_data
    ours_ring = load(qem, f"virtual/annulus-{CY}-{CX}-{RI}-{RO}.npy", "--mask-edges", "libertem")
    ours_disk = load(qem, f"virtual/disk-{CY}-{CX}-{RO}.npy", "--mask-edges", "libertem")
    np.testing.assert_array_equal(ours_ring.astype(np.float64), ring.astype(np.float64))
    np.testing.assert_array_equal(ours_disk.astype(np.float64), disk.astype(np.float64))

    # The default includes the inner edge: exactly the pixels at distance RI more.
    rows, cols = np.indices((DR, DC))
    on_inner = (rows - CY) ** 2 + (cols - CX) ** 2 == RI**2
    assert on_inner.sum() == 12  # (±5, 0), (0, ±5), (±3, ±4), (±4, ±3)
    inclusive = load(qem, f"virtual/annulus-{CY}-{CX}-{RI}-{RO}.npy")
    extra = counts[:, :, on_inner].sum(axis=-1, dtype=np.uint64)
    np.testing.assert_array_equal(inclusive, ours_ring + extra)


def test_masked_centre_of_mass_agrees_with_libertem_com_udf(acquisition):
    qem, counts, ctx, ds = acquisition
    for cy, cx, r in [(11.5, 13.5, 7.5), (CY, CX, RO)]:
        shifts = ctx.run_udf(dataset=ds, udf=CoMUDF.with_params(cy=cy, cx=cx, r=r))["raw_shifts"].data
        row = load(qem, f"virtual/com-{cy}-{cx}-{r}_row.npy", "--mask-edges", "libertem")
        col = load(qem, f"virtual/com-{cy}-{cx}-{r}_col.npy", "--mask-edges", "libertem")
        # LiberTEM accumulates uint16 input in float32; ours is exact, then float64.
        np.testing.assert_allclose(row, shifts[..., 0], rtol=0, atol=2e-6)
        np.testing.assert_allclose(col, shifts[..., 1], rtol=0, atol=2e-6)
        assert np.abs(row).max() > 1e-3  # the shifts are not trivially zero
