"""Every virtual product of every accepted conformance fixture, mounted
twice (`--gpu off`, the CPU reference, and `--gpu wgpu`, Mesa's software
Vulkan in CI) and read with numpy: integer and scaled products are
identical byte for byte; float products are identical or, where the two
backends add in a different order, within spec §13's 1e-6 of the
product's scale."""

import json
import os
import shutil

import numpy as np
import pytest

from conftest import conformance


def accepted():
    manifest = json.loads((conformance() / "qem" / "manifest.json").read_text())
    return [e["name"] for e in manifest["entries"] if e["expected"] == "accepted"]


def test_cpu_and_wgpu_agree_on_every_product(tmp_path, mount):
    src = tmp_path / "src"
    src.mkdir()
    names = accepted()
    assert len(names) >= 20
    for name in names:
        shutil.copy(conformance() / "qem" / f"{name}.qem", src)
    cpu = mount(src, "--gpu", "off")
    gpu = mount(src, "--gpu", "wgpu")
    info = json.loads((gpu / f"{names[0]}.qem" / "info.json").read_text())
    if info["reductions_backend"] != "wgpu":
        if os.environ.get("CI"):
            pytest.fail("CI installs Mesa's Vulkan drivers: wgpu must be available")
        pytest.skip("no wgpu adapter")
    compared = differing = 0
    for name in names:
        products = sorted(p.name for p in (cpu / f"{name}.qem" / "virtual").iterdir() if p.suffix == ".npy")
        assert {"bf.npy", "sum.npy", "mean_dp.npy", "idpc.npy"} <= set(products), products
        float_source = name.startswith("f32")
        for product in products:
            a = (cpu / f"{name}.qem" / "virtual" / product).read_bytes()
            b = (gpu / f"{name}.qem" / "virtual" / product).read_bytes()
            compared += 1
            if a == b:
                continue
            assert float_source, f"{name}/{product}: integer products must be identical"
            differing += 1
            x = np.load((cpu / f"{name}.qem" / "virtual" / product)).astype(np.float64)
            y = np.load((gpu / f"{name}.qem" / "virtual" / product)).astype(np.float64)
            assert np.array_equal(np.isnan(x), np.isnan(y)), f"{name}/{product}: NaN positions"
            assert np.array_equal(np.isinf(x), np.isinf(y)) and (x[np.isinf(x)] == y[np.isinf(y)]).all()
            finite = np.isfinite(x)
            scale = np.abs(x[finite]).max(initial=0.0)
            diff = np.abs(x[finite] - y[finite]).max(initial=0.0)
            assert diff <= 1e-6 * scale + 1e-6, f"{name}/{product}: {diff} at scale {scale}"
    assert compared >= 20 * 13
    # Bit-identical except where the order of float additions shows.
    assert differing <= 3, differing
