#!/usr/bin/env bash
# examples/python/compare_workers.py headless (CTest: python_example): the
# CNN on 1 and 2 workers of a LocalCluster, 40 steps each; the plot is
# written as a PNG, the comparison says the runs are the same function, and
# the first run's model comes back through the coordinator into PyTorch.
set -euo pipefail
source_dir=$1
work=$(mktemp -d /tmp/lockstep-python-example-XXXXXX)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 "$source_dir/examples/python/compare_workers.py" --steps 40 \
  --plot "$work/compare.png" >"$work/out" 2>"$work/err" || {
  echo "FAILED: the example exited $?"; tail -20 "$work/err"; cat "$work/out"; exit 1; }
cat "$work/out"
grep -q "same function" "$work/out" || { echo "FAILED: no \"same function\""; exit 1; }
grep -q "^model: .* parameters" "$work/out" ||
  { echo "FAILED: the model did not come back through the coordinator"; exit 1; }
[ "$(head -c 8 "$work/compare.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
  { echo "FAILED: $work/compare.png is not a PNG"; exit 1; }
echo "python example: OK"
