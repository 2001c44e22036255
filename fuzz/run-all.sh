#!/bin/sh
# Runs the given fuzz targets one after another (one fuzzer process at a
# time), each for $SECONDS_EACH seconds (default 600), nice'd, from the
# binaries `cargo +nightly fuzz build` left in fuzz/target. Logs go to
# fuzz/logs/<target>.log, crashes to fuzz/artifacts/<target>/.
set -u
cd "$(dirname "$0")"
secs=${SECONDS_EACH:-600}
bin=target/x86_64-unknown-linux-gnu/release
seeds() {
    case "$1" in
        qem_header | qem_decode | qem_decode_unbounded) echo seeds/qem ;;
        *) echo "seeds/$1" ;;
    esac
}
for t in "$@"; do
    mkdir -p "corpus/$t" "artifacts/$t" logs
    echo "== $t start $(date -u +%T)" >>logs/summary.txt
    nice -n 10 "$bin/$t" -max_total_time="$secs" -timeout=20 -print_final_stats=1 \
        -artifact_prefix="artifacts/$t/" "corpus/$t" "$(seeds "$t")" >"logs/$t.log" 2>&1
    echo "== $t exit $? end $(date -u +%T)" >>logs/summary.txt
done
