#!/usr/bin/env bash
# What the web console (`lockstep ui`, issue 55) costs: its page's weight
# (HTML, script and style, all it loads); the API's answer behind the jobs
# page with JOBS jobs against the same pool with 1 job (bytes and median
# time); and Debian's Chromium, headless, loading the jobs page and running
# its script to the first rendered table (--dump-dom after 0.5 s of the
# page's virtual time, which stands still while a fetch is under way: wall
# time including the browser's start, rows counted), with JOBS jobs
# against 1. The pool is
# `lockstep local --serve --workers 1 --ui`: one job runs, the rest queue.
# Reports ratios against the 1-job run of the same invocation.
#
#   bench/ui_bench.sh [BUILD_DIR] [JOBS] [REPEATS]
#   bench/ui_bench.sh build 10 1      a smoke run
# Exit 77 (skipped) when Chromium is not installed.
set -euo pipefail
build=${1:-build}
jobs=${2:-1000}
repeats=${3:-5}
chromium=/usr/bin/chromium
[ -x "$chromium" ] || { echo "ui_bench: no $chromium; skipped"; exit 77; }

work=$(mktemp -d)
pool_pid=
cleanup() {
  if [ -n "$pool_pid" ]; then
    kill -TERM "$pool_pid" 2>/dev/null || true
    wait "$pool_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

"$build/bin/lockstep" local --serve --workers 1 --ui --json --insecure \
  >"$work/pool.json" 2>"$work/pool.log" &
pool_pid=$!
for _ in $(seq 1 600); do
  grep -q ui_url "$work/pool.json" 2>/dev/null && break
  kill -0 "$pool_pid" 2>/dev/null || { cat "$work/pool.log"; exit 1; }
  sleep 0.1
done
field() { /usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$work/pool.json" "$1"; }
url=$(field ui_url)
export LOCKSTEP_COORDINATOR=$(field coordinator) LOCKSTEP_INSECURE=1
base=${url%%/?token=*}
token=${url##*token=}

submit() {  # COUNT: that many jobs of the MLP that would train for long
  for _ in $(seq 1 "$1"); do
    "$build/bin/lockstep" submit examples/fashion_mnist_mlp.json \
      --set max_steps=1000000 --set epochs=1000 >/dev/null
  done
}

# "SECONDS BYTES" of one GET of PATH (with the token header when asked).
get() {  # PATH [token]
  /usr/bin/python3 - "$base" "$1" "${2:+$token}" <<'PY'
import sys, time, urllib.request
base, path, token = sys.argv[1:4]
request = urllib.request.Request(base + path)
if token:
    request.add_header("X-Lockstep-Token", token)
start = time.perf_counter()
body = urllib.request.urlopen(request).read()
print(f"{time.perf_counter() - start:.6f} {len(body)}")
PY
}

# Median seconds and the bytes of GET /api/jobs over REPEATS tries.
api_jobs() {
  local times=() bytes=0 t b
  for _ in $(seq 1 "$repeats"); do
    read -r t b < <(get /api/jobs token)
    times+=("$t"); bytes=$b
  done
  printf '%s\n' "${times[@]}" | sort -n | awk -v b="$bytes" \
    '{a[NR]=$1} END {print a[int((NR+1)/2)], b}'
}

# Median wall seconds of Chromium rendering the jobs page, and its rows.
render_jobs() {
  local times=() rows=0
  for i in $(seq 1 "$repeats"); do
    local start end
    start=$(date +%s.%N)
    "$chromium" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
      --no-first-run --user-data-dir="$work/profile-$i-$1" \
      --virtual-time-budget=500 --dump-dom "$url#/jobs" \
      >"$work/dom.html" 2>/dev/null
    end=$(date +%s.%N)
    times+=("$(awk -v a="$start" -v b="$end" 'BEGIN {print b - a}')")
    rows=$(grep -o 'data-job="' "$work/dom.html" | wc -l)
  done
  printf '%s\n' "${times[@]}" | sort -n | awk -v r="$rows" \
    '{a[NR]=$1} END {print a[int((NR+1)/2)], r}'
}

page=0
for path in "/?token=$token" /app.js /app.css; do
  read -r _ n < <(get "$path")
  page=$((page + n))
done

echo "ui_bench: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'),"\
  "$(nproc) cores; $repeats repeats, medians"
echo "page weight: $page bytes (HTML, script and style; nothing else is loaded)"
submit 1
read -r api1 bytes1 < <(api_jobs)
read -r render1 rows1 < <(render_jobs one)
submit $((jobs - 1))
read -r apin bytesn < <(api_jobs)
read -r rendern rowsn < <(render_jobs many)
awk -v a1="$api1" -v b1="$bytes1" -v an="$apin" -v bn="$bytesn" \
  -v r1="$render1" -v rn="$rendern" -v w1="$rows1" -v wn="$rowsn" -v n="$jobs" '
BEGIN {
  printf "GET /api/jobs:   1 job %.1f ms %d bytes; %d jobs %.1f ms %d bytes (x%.1f time)\n",
         a1 * 1000, b1, n, an * 1000, bn, an / a1
  printf "jobs page in Chromium: 1 job %.2f s (%d rows); %d jobs %.2f s (%d rows) (x%.2f)\n",
         r1, w1, n, rn, wn, rn / r1
}'
if [ "$rowsn" -ne "$jobs" ]; then
  echo "ui_bench: the page shows $rowsn of $jobs jobs" >&2
  exit 1
fi
