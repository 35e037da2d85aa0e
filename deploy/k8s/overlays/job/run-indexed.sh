#!/bin/sh
# run-indexed.sh COMMAND...: runs lockstep-worker (COMMAND...) as one index of
# the run-to-completion Indexed Job, and ends the pod when the training job
# ends. lockstep-worker stays up between jobs, so without this the Job would
# never complete.
#
# Index 0 submits the job spec ($JOB_SPEC) once: the job id is kept on the
# shared volume under $RUN_STATE_DIR/$RUN_ID (RUN_ID: the Kubernetes Job's
# uid), so a replaced index 0 follows the same job instead of submitting it
# again. It follows the job with `lockstep watch` and records the result
# there; every index then stops its idle worker and exits with the result:
#   0  the job succeeded (the index completes)
#   1  the job failed, 2  the job spec is invalid (podFailurePolicy: FailJob)
#   3  the coordinator cannot be reached, 143  SIGTERM (eviction, preemption):
#      the Job starts the index again and the worker rejoins the job.
# A worker that exits on its own ends the pod with the worker's exit code.
#
# Submitting and following the job take an operator's certificate: with
# SUBMIT_TLS_DIR set, the CLI here uses its tls.crt, tls.key and ca.crt
# instead of the worker's LOCKSTEP_TLS_* (the daemon keeps its own).
# shellcheck disable=SC2317  # functions called through traps and beside_worker
set -u
: "${JOB_COMPLETION_INDEX:?set by the Indexed Job}" "${RUN_ID:?the Job uid}"
spec=${JOB_SPEC:-/etc/lockstep/job/job.json}
state=${RUN_STATE_DIR:-/backup/.lockstep-runs}/$RUN_ID
if ! mkdir -p "$state"; then
  echo "run-indexed: cannot create $state; the backup volume must be writable by uid $(id -u)" >&2
  exit 3
fi

"$@" &
worker=$!
helper=

# SIGTERM: the worker stops the job at an agreed step, saves it and exits 0;
# this pod then fails (143) so that the Job runs the index again.
on_term() {
  [ -n "$helper" ] && kill "$helper" 2>/dev/null
  kill -TERM "$worker" 2>/dev/null
  wait "$worker"
  exit 143
}
trap on_term TERM INT

# The training job ended with $1: stop the idle worker, exit with the result.
finish() {
  trap - TERM INT
  kill -TERM "$worker" 2>/dev/null
  wait "$worker"
  exit "$1"
}

# Whether process $1 still runs (a child that exited stays a zombie until
# waited for, and kill -0 still reaches a zombie).
running() {
  kill -0 "$1" 2>/dev/null && [ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]
}

# Runs "$@" in the background and returns its exit code; if the worker exits
# first, the pod ends with the worker's code (0 becomes 143: not a success).
beside_worker() {
  "$@" &
  helper=$!
  while running "$helper"; do
    if ! running "$worker"; then
      kill "$helper" 2>/dev/null
      wait "$worker"
      code=$?
      echo "run-indexed: lockstep-worker exited with code $code" >&2
      [ "$code" -eq 0 ] && code=143
      exit "$code"
    fi
    sleep 2 &
    wait $!
  done
  wait "$helper"
  code=$?
  helper=
  return "$code"
}

# The CLI as the operator (SUBMIT_TLS_DIR), or with the pod's settings.
cli() {
  if [ -n "${SUBMIT_TLS_DIR:-}" ]; then
    LOCKSTEP_TLS_CERT=$SUBMIT_TLS_DIR/tls.crt LOCKSTEP_TLS_KEY=$SUBMIT_TLS_DIR/tls.key \
      LOCKSTEP_TLS_CA=$SUBMIT_TLS_DIR/ca.crt lockstep "$@"
  else
    lockstep "$@"
  fi
}

submit() {
  cli submit "$spec" >"$state/job-id.tmp" && mv "$state/job-id.tmp" "$state/job-id"
}

if [ "$JOB_COMPLETION_INDEX" = 0 ]; then
  # 3: the coordinator is not reachable yet; the worker keeps trying for its
  # --connect-timeout and ends this pod if it gives up.
  while [ ! -s "$state/job-id" ]; do
    beside_worker submit
    code=$?
    if [ "$code" -ne 0 ] && [ "$code" -ne 3 ]; then
      echo "$code" >"$state/result"
      finish "$code"
    fi
    [ "$code" -eq 3 ] && beside_worker sleep 5
  done
  job=$(cat "$state/job-id")
  echo "run-indexed: following job $job"
  while :; do
    beside_worker cli watch "$job"
    code=$?
    [ "$code" -ne 3 ] && break
    beside_worker sleep 5
  done
  echo "$code" >"$state/result.tmp" && mv "$state/result.tmp" "$state/result"
  finish "$code"
else
  while [ ! -f "$state/result" ]; do
    beside_worker sleep 5
  done
  finish "$(cat "$state/result")"
fi
