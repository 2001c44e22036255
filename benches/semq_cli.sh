#!/usr/bin/env bash
# Whole-process timing of `semq validate` and `semq diff --json` (issue
# targets: ≤ 0.10 s and ≤ 0.20 s on a 1M-row quant dim-384 pair, memory
# ≤ 1.2× the file sizes). Makes the pair with `semq encode` from vectors
# numpy writes (the candidate has 1% of its rows changed), then prints the
# best of five runs: wall, CPU (user+sys) and peak RSS.
#
#   bash benches/semq_cli.sh            # 1,000,000 rows
#   SEMQ_ROWS=200000 bash benches/semq_cli.sh
#
# On a shared machine the wall clock includes other processes; the CPU
# time does not. Needs target/release/semq and .venv (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${SEMQ_ROWS:-1000000}
semq=target/release/semq
py=.venv/bin/python
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$py" - "$work" "$rows" <<'PY'
import sys, numpy as np
work, n = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(1)
for name, changed in [("ref", 0.0), ("cand", 0.01)]:
    v = np.random.default_rng(1).standard_normal((n, 384), dtype=np.float32)
    if changed:
        rows = rng.choice(n, int(n * changed), replace=False)
        v[rows] = rng.standard_normal((len(rows), 384), dtype=np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    v.tofile(f"{work}/{name}.f32")
np.save(f"{work}/ids.npy", np.arange(n, dtype=np.uint64))
PY
for name in ref cand; do
  "$semq" encode --op quant --dim 384 --bins 4 --vectors "$work/$name.f32" \
    --ids "$work/ids.npy" "$work/$name.semq"
  rm "$work/$name.f32"
done
sizes=$(stat -c %s "$work/ref.semq" "$work/cand.semq" | paste -sd+ | bc)
echo "$rows rows, files $(stat -c %s "$work/ref.semq") + $(stat -c %s "$work/cand.semq") bytes; load $(cut -d' ' -f1-3 /proc/loadavg)"

# measure LABEL BYTES WHAT COMMAND...: best of five; RSS against BYTES.
measure() {
  local label=$1 bytes=$2 what=$3
  shift 3
  local best_wall=999 best_cpu=999 rss=0 wall user sys kb cpu
  for _ in 1 2 3 4 5; do
    /usr/bin/time -f "%e %U %S %M" -o "$work/t" "$@" >/dev/null
    read -r wall user sys kb <"$work/t"
    cpu=$(echo "$user + $sys" | bc)
    best_wall=$(echo "if ($wall < $best_wall) $wall else $best_wall" | bc)
    best_cpu=$(echo "if ($cpu < $best_cpu) $cpu else $best_cpu" | bc)
    if [ "$kb" -gt "$rss" ]; then rss=$kb; fi
  done
  printf '%-18s wall %5.2f s  cpu %5.2f s  peak RSS %5d MB = %.2f x %s\n' "$label" \
    "$best_wall" "$best_cpu" $((rss / 1024)) "$(echo "$rss * 1024 / $bytes" | bc -l)" "$what"
}
ref_size=$(stat -c %s "$work/ref.semq")
measure "semq validate" "$ref_size" "the file" "$semq" validate "$work/ref.semq"
measure "semq diff --json" "$sizes" "both files" "$semq" diff --json "$work/ref.semq" "$work/cand.semq"
