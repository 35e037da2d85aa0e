#!/usr/bin/env bash
# Runs one libFuzzer target deterministically: every seed in SEEDS, then RUNS
# mutated inputs from -seed=1. New inputs go to WORK (emptied first), never
# into the checked-in corpus; a crash is written to WORK/crash-* and fails the
# run. Usage: run_fuzzer.sh FUZZER SEEDS WORK RUNS [libFuzzer flags...]
set -euo pipefail
fuzzer=$1 seeds=$2 work=$3 runs=$4
shift 4
rm -rf "$work"
mkdir -p "$work/corpus"
# -rss_limit_mb also caps a single allocation (malloc_limit_mb defaults to
# it): a header that makes a reader allocate gigabytes is a finding.
exec "$fuzzer" -seed=1 -runs="$runs" -timeout=30 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$work/" "$@" "$work/corpus" "$seeds"
