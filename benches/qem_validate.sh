#!/usr/bin/env bash
# Whole-process `qem validate` against the machine's decode ceiling
# (issue 18: ≥ 80% of the ceiling's best full-array rate on 2 threads).
# Runs the ceiling (`../shared/limit/run.sh`, when it is there), writes the
# issue-18 acquisition if FILE is missing (128×128 scans × 128² uint16,
# 268 M samples, by `cargo bench --bench qem_decode -- 128`), then times
# `qem validate FILE` best of N with the kernel chosen at run time and again
# with the AVX2 kernel forced (QEMFS_KERNEL=avx2: every SIMD loop at AVX2
# width, the paths of an AVX2-only machine), each against the
# ceiling's figure for that kind of kernel. Prints the load average with
# each figure: on a shared machine compare runs made in the same minutes.
#
#   bash benches/qem_validate.sh [FILE] [N]      (defaults /tmp/a.qem, 5)
#   LIMIT_OUT=saved.txt bash benches/qem_validate.sh   (reuse a saved
#   run.sh output: the ceiling takes about a minute on a quiet machine)
#   ROUNDS=5 bash benches/qem_validate.sh [FILE] [N]   (then 5 rounds, each
#   the ceiling's two kernels measured again, about 15 s, right before the
#   two validations: each round's ratios and their medians. A shared machine
#   whose speed drifts within a minute gives ratios of 75-130% from single
#   runs; a ratio taken within one round is the steadier figure)
set -euo pipefail
cd "$(dirname "$0")/.."
file=${1:-/tmp/a.qem}
runs=${2:-5}
cargo build --release --quiet -p qemfs-cmds
qem=target/release/qem
load() { cut -d' ' -f1-3 /proc/loadavg; }

if [ ! -f "$file" ]; then
  echo "writing $file (qem_decode -- 128)"
  QEM_BENCH_FILE="$file" QEM_BENCH_ONLY=whole cargo bench --quiet --bench qem_decode -- 128 >/dev/null
fi

limit=../shared/limit/run.sh
ceiling="" ceiling_avx2="" kernel="" kernel_avx2=""
if [ -n "${LIMIT_OUT:-}" ] || [ -f "$limit" ]; then
  if [ -n "${LIMIT_OUT:-}" ]; then out=$(cat "$LIMIT_OUT"); else out=$(bash "$limit"); fi
  printf '%s\n' "$out" | grep -E '^(cpu|ceiling)' || true
  ceiling=$(printf '%s\n' "$out" | sed -n 's/^ceiling: \([0-9.]*\) G.*/\1/p')
  # The kernel that set the ceiling.
  kernel=$(printf '%s\n' "$out" | sed -n 's/^ceiling: .*(kernel \([^,]*\),.*/\1/p')
  # The best AVX2 kernel's full-array rate on 2 threads, if one ran.
  read -r ceiling_avx2 kernel_avx2 < <(printf '%s\n' "$out" | awk '/^RESULT/ && /full threads=2/ && $3 ~ /avx2/ {
      r = $(NF-3); if (r + 0 > best + 0) { best = r; k = $3 } } END { if (best != "") print best, k }') || true
else
  echo "no $limit: ratios to the ceiling skipped"
fi

# Samples in FILE: the product of its shape.
samples=$("$qem" show --json "$file" | python3 -c '
import json, sys
n = 1
for s in json.load(sys.stdin)["summary"]["shape"]:
    n *= int(s)
print(n)')

# Best wall time of $runs runs of `qem validate FILE`, in seconds.
best_of() {
  python3 - "$runs" "$@" <<'PY'
import subprocess, sys, time
runs, cmd = int(sys.argv[1]), sys.argv[2:]
best = None
for _ in range(runs):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    s = time.perf_counter() - t
    best = s if best is None else min(best, s)
print(f"{best:.4f}")
PY
}

report() { # label seconds ceiling
  python3 - "$1" "$2" "$samples" "${3:-}" "$(load)" <<'PY'
import sys
label, s, n, ceiling, load = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
rate = n / s / 1e9
line = f"{label}: {s:.3f} s, {rate:.2f} G samples/s"
if ceiling:
    line += f", {rate / float(ceiling) * 100:.0f}% of the ceiling's {float(ceiling):.2f}"
print(f"{line}  [load {load}]")
PY
}

report "qem validate (kernel chosen at run time, best of $runs)" "$(best_of "$qem" validate "$file")" "$ceiling"
report "qem validate, QEMFS_KERNEL=avx2 (best of $runs)" \
  "$(QEMFS_KERNEL=avx2 best_of "$qem" validate "$file")" "$ceiling_avx2"

rounds=${ROUNDS:-1}
[ "$rounds" -gt 1 ] || exit 0
if [ -n "${LIMIT_OUT:-}" ] || [ -z "$kernel" ]; then
  echo "ROUNDS needs the ceiling measured here (../shared/limit, not LIMIT_OUT)"
  exit 0
fi
# The ceiling's own program, as run.sh built it, on just its best kernel and
# the best AVX2 one.
qemlimit=${LIMIT_TARGET_DIR:-${TMPDIR:-/tmp}/qem-limit-target}/release/qemlimit
kernels=$kernel${kernel_avx2:+,$kernel_avx2}
# The full-array rate on 2 threads of kernel $1 in limit output $2.
rate_of() { printf '%s\n' "$2" | awk -v k="$1" '/^RESULT/ && /full threads=2/ && $3 == k { print $(NF-3) }'; }
# FILE validated in $1 seconds against a ceiling of $2 G samples/s, in
# percent ("-" without a ceiling).
ratio() { if [ -n "$2" ]; then python3 -c "print(f'{$samples / $1 / 1e9 / $2 * 100:.1f}')"; else echo -; fi; }
ratios=()
for r in $(seq "$rounds"); do
  out=$("$qemlimit" bench A --blocks 32 --reps 5 --enc-reps 1 --dec "$kernels" 2>&1)
  c=$(rate_of "$kernel" "$out")
  c2=$([ -z "$kernel_avx2" ] || rate_of "$kernel_avx2" "$out")
  v=$(best_of "$qem" validate "$file")
  v2=$(QEMFS_KERNEL=avx2 best_of "$qem" validate "$file")
  ratios+=("$(ratio "$v" "$c") $(ratio "$v2" "$c2")")
  echo "round $r: ceiling $c (avx2 ${c2:--}) G samples/s; validate $v s, avx2 $v2 s;" \
    "ratios ${ratios[-1]// /% and }%  [load $(load)]"
done
printf '%s\n' "${ratios[@]}" | python3 -c '
import statistics, sys
rows = [line.split() for line in sys.stdin]
med = lambda i: statistics.median(float(r[i]) for r in rows if r[i] != "-")
print(f"median of {len(rows)} rounds: qem validate {med(0):.0f}% of the ceiling,", end=" ")
print(f"QEMFS_KERNEL=avx2 {med(1):.0f}% of the AVX2 ceiling" if any(r[1] != "-" for r in rows) else "no AVX2 ceiling")'
