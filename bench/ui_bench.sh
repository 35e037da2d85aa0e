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
# Before that, a job of CURVE_STEPS steps (the MLP at batch 8): its page
# in Chromium while it runs past half way (the time to its loss chart, and
# the page's long tasks while it redraws each second; bench/ui_latency.mjs),
# then the job API's answer for its whole history once it ended; and, on
# the long job of the 1-job run, the time from the coordinator having a
# step to the page's chart showing it, for LATENCY_SECONDS.
#
#   bench/ui_bench.sh [BUILD_DIR] [JOBS] [REPEATS] [CURVE_STEPS] [LATENCY_SECONDS]
#   bench/ui_bench.sh build 5 1 2000 3     a smoke run
# Exit 77 (skipped) when Chromium is not installed.
set -euo pipefail
build=${1:-build}
jobs=${2:-1000}
repeats=${3:-5}
curve_steps=${4:-100000}
latency_seconds=${5:-20}
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
      --set max_steps=1000000 --set epochs=1000 --json >"$work/submitted.json"
  done
}
last_submitted() {
  /usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['job_id'])" \
    "$work/submitted.json"
}
# Waits until JOB's step reaches STEP, or it ended when STEP is "end".
wait_for() {  # JOB STEP
  /usr/bin/python3 - "$base" "$token" "$1" "$2" <<'PY'
import json, sys, time, urllib.request
base, token, job, until = sys.argv[1:5]
for _ in range(36000):
    request = urllib.request.Request(f"{base}/api/jobs")
    request.add_header("X-Lockstep-Token", token)
    rows = json.load(urllib.request.urlopen(request)).get("jobs", [])
    row = next((r for r in rows if r["job_id"] == job), {})
    state = row.get("state", "")
    if state in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_STOPPED"):
        if until == "end":
            sys.exit(0 if state == "JOB_STATE_SUCCEEDED" else 1)
        sys.exit(f"ui_bench: job {job} ended {state} before step {until}")
    if until != "end" and int(row.get("step", 0)) >= int(until):
        sys.exit(0)
    time.sleep(0.1)
sys.exit(f"ui_bench: job {job} did not reach {until}")
PY
}
node_flags=()
node -e "process.exit(typeof WebSocket === 'function' ? 0 : 1)" ||
  node_flags=(--experimental-websocket)
live() {  # JOB MODE SECONDS
  node "${node_flags[@]}" bench/ui_latency.mjs "$chromium" "$url" "$@"
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

# A long history: its page while it trains, its API answer once whole.
"$build/bin/lockstep" submit examples/fashion_mnist_mlp.json --json \
  --set max_steps="$curve_steps" --set epochs=1000 --set global_batch_size=8 \
  >"$work/submitted.json"
curve_job=$(last_submitted)
wait_for "$curve_job" $((curve_steps / 2))
echo "a job of $curve_steps steps, past half way: $(live "$curve_job" render "$latency_seconds")"
wait_for "$curve_job" end
read -r curve_time curve_bytes < <(get "/api/jobs/$curve_job" token)
echo "GET /api/jobs/ID of its $curve_steps steps: $(awk -v t="$curve_time" \
  'BEGIN {printf "%.1f", t * 1000}') ms, $curve_bytes bytes"
# Out of the jobs pages' count (and the console's Delete at work).
/usr/bin/python3 - "$base" "$token" "$curve_job" <<'PY'
import sys, urllib.request
base, token, job = sys.argv[1:4]
request = urllib.request.Request(f"{base}/api/jobs/{job}/delete", data=b"{}",
                                 method="POST")
request.add_header("X-Lockstep-Token", token)
request.add_header("Content-Type", "application/json")
urllib.request.urlopen(request).read()
PY

submit 1
wait_for "$(last_submitted)" 1
echo "$(live "$(last_submitted)" latency "$latency_seconds")"
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
