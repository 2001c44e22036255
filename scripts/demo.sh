#!/usr/bin/env bash
# The main job on the bundled examples: mount examples/data and read the
# decoded files with ordinary tools, then unmount. Without root or
# /dev/fuse it shows the same tree through `qem ls` / `qem cat`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --workspace --quiet
bin=target/release
data=examples/data

echo "== qem validate (full: every stream decoded, checksums and index checked)"
"$bin/qem" validate "$data"/*.qem
echo "== semq validate"
"$bin/semq" validate "$data"/*.semq
echo "== qem show $data/scan-u16.qem"
"$bin/qem" show "$data/scan-u16.qem"

if [ "$(id -u)" = 0 ] && [ -e /dev/fuse ]; then
  mnt=$(mktemp -d /tmp/qemfs-demo.XXXXXX)
  trap '"$bin/qemfs" unmount "$mnt" 2>/dev/null || true; rmdir "$mnt" 2>/dev/null || true' EXIT
  "$bin/qemfs" mount "$data" "$mnt"
  echo "== mounted $data at $mnt"
  ls -l "$mnt" "$mnt/scan-u16.qem" "$mnt/scan-u16.qem/virtual"
  echo "== logical_sha256 (decoded array) and sha256 (file bytes)"
  cat "$mnt/scan-u16.qem/logical_sha256" "$mnt/scan-u16.qem/sha256"
  "$PWD/.venv/bin/python" - "$mnt" <<'PY'
import sys, numpy as np
mnt = sys.argv[1]
a = np.load(f"{mnt}/scan-u16.qem/data.npy", mmap_mode="r")
# data.npy keeps what the detector stored, hot pixels too; mask.npy says which pixels are valid.
m = np.load(f"{mnt}/scan-u16.qem/mask.npy")
print("data.npy (memory-mapped):", a.shape, a.dtype, "total valid counts", int(a.sum(dtype=np.uint64, where=m)),
      f"(mask.npy leaves out {int((~m).sum())} invalid detector pixels)")
s = np.load(f"{mnt}/scan-u16.qem/virtual/sum.npy")
print("virtual/sum.npy (from the spatial index, no decoding):", s.shape, s.dtype, "min", s.min(), "max", s.max(),
      "total", int(s.sum()))
import json
d = json.load(open(f"{mnt}/scan-u16.qem/virtual/detectors.json"))
print("bright-field disk:", d["bright_field_disk"]["method"], "centre", [round(c, 2) for c in d["center"]],
      "radius", round(d["bright_field_radius"], 2))
bf = np.load(f"{mnt}/scan-u16.qem/virtual/bf.npy")
com = np.load(f"{mnt}/scan-u16.qem/virtual/com_row.npy")
print("virtual/bf.npy:", bf.shape, bf.dtype, "mean", float(bf.mean()), "| com_row.npy range",
      float(np.nanmin(com)), float(np.nanmax(com)))
f = np.load(f"{mnt}/scan-u16.qem/frames/12/16.npy")
print("frames/12/16.npy:", f.shape, f.dtype, "max", f.max())
import xarray as xr
ds = xr.open_zarr(f"{mnt}/scan-u16.qem/data.zarr", zarr_format=3)
print("data.zarr (xarray, lazy):", dict(ds["data"].sizes), "chunks", ds["data"].data.chunksize,
      "scan step", float(ds["scan_row"][1]), ds["scan_row"].attrs["units"])
v = np.load(f"{mnt}/embeddings.semq/vectors.npy")
print("embeddings.semq/vectors.npy:", v.shape, v.dtype)
PY
  head -3 "$mnt/embeddings.semq/ids.txt"
  "$bin/qemfs" unmount "$mnt"
  echo "== unmounted"
else
  echo "== not root or no /dev/fuse: the same tree through qem ls / qem cat"
  "$bin/qem" ls -l "$data/scan-u16.qem"
  "$bin/qem" cat "$data/scan-u16.qem" logical_sha256
  "$bin/qem" ls "$data/scan-u16.qem" virtual
fi
