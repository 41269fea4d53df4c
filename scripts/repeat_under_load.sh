#!/usr/bin/env bash
# Run a pytest selection N times while a training run keeps the CPUs busy (issue 61: the two-process
# FSDP test aborted once under load). Each round's pytest output goes to OUT/round-K.log; a summary line
# per round to OUT/summary.tsv (round, exit status, seconds, whether "terminate called" or SIGABRT
# appeared). Usage: scripts/repeat_under_load.sh OUT N PYTEST_ARGS...
set -uo pipefail
out=$1; rounds=$2; shift 2
mkdir -p "$out"
cd "$(dirname "$0")/.."
load() {  # a demo training run, restarted whenever it ends, as the CPU load
    while true; do
        python -m semrl train --config demo trainer.steps=1000 logging.report_to=[] logging.progress=false \
            "logging.output_dir=$out/load-run" >"$out/load.log" 2>&1
        rm -rf "$out/load-run"
    done
}
load & load_pid=$!
# stop the restarting loop first, then the run it started
trap 'kill "$load_pid" 2>/dev/null; pkill -f "$out/load-run"; wait "$load_pid" 2>/dev/null' EXIT
sleep 60  # let the load run reach its rollouts
printf 'round\trc\tseconds\tabort\tload1\n' >"$out/summary.tsv"
for k in $(seq 1 "$rounds"); do
    start=$(date +%s)
    python -m pytest -q -p no:cacheprovider "$@" >"$out/round-$k.log" 2>&1; rc=$?
    abort=$(grep -c -E "terminate called|SIGABRT|Aborted|core dumped" "$out/round-$k.log")
    printf '%s\t%s\t%s\t%s\t%s\n' "$k" "$rc" $(( $(date +%s) - start )) "$abort" "$(cut -d' ' -f1 /proc/loadavg)" \
        >>"$out/summary.tsv"
done
