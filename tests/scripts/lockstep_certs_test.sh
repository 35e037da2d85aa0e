#!/usr/bin/env bash
# Checks scripts/lockstep-certs (CTest: lockstep_certs): the certificates of
# a cluster verify against their CA for both server and client use, carry
# exactly the SPIFFE ID of their identity (common/caller.h), keep their keys
# private, and a second run reuses the CA. Usage errors exit 2, a CA without
# its key exits 1, and `secret` prints the files as a kubernetes.io/tls
# Secret. With BIN_DIR (CTest: lockstep_certs_cluster), a real coordinator
# and worker run with the script's certificates: an operator's submits and
# trains a job through them, a viewer reads status and health but cannot
# submit, and a certificate of another CA is refused.
#
#   lockstep_certs_test.sh SOURCE_DIR [BIN_DIR]
set -euo pipefail

source_dir=${1:?usage: lockstep_certs_test.sh SOURCE_DIR [BIN_DIR]}
bin_dir=${2:-}
certs="$source_dir/scripts/lockstep-certs"
work=$(mktemp -d)
pids=()
cleanup() {
  local pid
  # SIGKILL: a worker given SIGTERM after its coordinator is gone waits out
  # its preemption grace for it (and was left running). A daemon's exit
  # status is not the test's.
  for pid in "${pids[@]+"${pids[@]}"}"; do
    kill -9 "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
checks=0

fail() {
  echo "FAILED: $*"
  failures=$((failures + 1))
}

check() {  # DESCRIPTION COMMAND...
  local what=$1
  shift
  checks=$((checks + 1))
  "$@" >/dev/null 2>&1 || fail "$what"
}

expect_eq() {  # DESCRIPTION GOT WANT
  checks=$((checks + 1))
  [ "$2" = "$3" ] || fail "$1: got \"$2\", want \"$3\""
}

uris() {  # CERT: its URI SANs, one a line
  openssl x509 -in "$1" -noout -ext subjectAltName | grep -o 'URI:[^,]*' | sed 's/^URI://'
}

# ---- a cluster -----------------------------------------------------------------
dir="$work/cluster"
"$certs" --dir "$dir" cluster --coordinator lockstep-coordinator,10.0.0.5,127.0.0.1 \
  --workers 2 --chief --spares 1 --operator alice --viewer grafana >"$work/out" ||
  { cat "$work/out"; echo "FAILED: lockstep-certs cluster exited $?"; exit 1; }

declare -A want=(
  [coordinator]=spiffe://lockstep/coordinator
  [worker-chief-0]=spiffe://lockstep/worker/chief/0
  [worker-worker-0]=spiffe://lockstep/worker/worker/0
  [worker-worker-1]=spiffe://lockstep/worker/worker/1
  [spare-spare-0]=spiffe://lockstep/spare/spare-0
  [operator-alice]=spiffe://lockstep/operator/alice
  [viewer-grafana]=spiffe://lockstep/viewer/grafana
)
for name in "${!want[@]}"; do
  crt="$dir/$name.crt"
  key="$dir/$name.key"
  check "$name: verifies against the CA as a server certificate" \
    openssl verify -CAfile "$dir/ca.crt" -purpose sslserver "$crt"
  check "$name: verifies against the CA as a client certificate" \
    openssl verify -CAfile "$dir/ca.crt" -purpose sslclient "$crt"
  expect_eq "$name: its one URI SAN" "$(uris "$crt")" "${want[$name]}"
  if [ "$name" != coordinator ]; then
    # Only the coordinator's certificate serves under a host name.
    expect_eq "$name: names no host" \
      "$(openssl x509 -in "$crt" -noout -ext subjectAltName | grep -c 'DNS:\|IP Address:')" 0
  fi
  usages=$(openssl x509 -in "$crt" -noout -ext extendedKeyUsage,keyUsage,basicConstraints)
  check "$name: extended key usage server and client auth" \
    grep -q 'TLS Web Server Authentication, TLS Web Client Authentication' <<<"$usages"
  check "$name: key usage digital signature" grep -q 'Digital Signature' <<<"$usages"
  check "$name: not a CA" grep -q 'CA:FALSE' <<<"$usages"
  expect_eq "$name: key mode" "$(stat -c %a "$key")" 600
  expect_eq "$name: the key is the certificate's" \
    "$(openssl pkey -in "$key" -pubout)" "$(openssl x509 -in "$crt" -noout -pubkey)"
done
expect_eq "CA key mode" "$(stat -c %a "$dir/ca.key")" 600
check "the coordinator names its DNS name" \
  grep -q 'DNS:lockstep-coordinator' <<<"$(openssl x509 -in "$dir/coordinator.crt" -noout -ext subjectAltName)"
check "the coordinator names its IP address" \
  grep -q 'IP Address:10.0.0.5' <<<"$(openssl x509 -in "$dir/coordinator.crt" -noout -ext subjectAltName)"
check "the CA is a CA" grep -q 'CA:TRUE' <<<"$(openssl x509 -in "$dir/ca.crt" -noout -ext basicConstraints)"

# ---- a second run reuses the CA and re-issues (rotation) ----------------------
ca_before=$(openssl x509 -in "$dir/ca.crt" -noout -fingerprint -sha256)
serial_before=$(openssl x509 -in "$dir/worker-worker-1.crt" -noout -serial)
"$certs" --dir "$dir" worker worker 1 >/dev/null
"$certs" --dir "$dir" ca >/dev/null
expect_eq "the CA after a second run" "$(openssl x509 -in "$dir/ca.crt" -noout -fingerprint -sha256)" "$ca_before"
checks=$((checks + 1))
[ "$(openssl x509 -in "$dir/worker-worker-1.crt" -noout -serial)" != "$serial_before" ] ||
  fail "worker-worker-1 was not issued again"
check "the re-issued certificate verifies" openssl verify -CAfile "$dir/ca.crt" "$dir/worker-worker-1.crt"

# ---- another CA's certificate does not verify ----------------------------------
"$certs" --dir "$work/other" --trust-domain other.example operator mallory >/dev/null
checks=$((checks + 1))
if openssl verify -CAfile "$dir/ca.crt" "$work/other/operator-mallory.crt" >/dev/null 2>&1; then
  fail "a certificate of another CA verified against this one"
fi
expect_eq "the trust domain is the flag's" "$(uris "$work/other/operator-mallory.crt")" \
  spiffe://other.example/operator/mallory

# ---- errors ------------------------------------------------------------------
expect_code() {  # DESCRIPTION CODE MESSAGE ARGS...
  local what=$1 code=$2 message=$3
  shift 3
  local got=0
  "$certs" "$@" >"$work/err" 2>&1 || got=$?
  expect_eq "$what: exit code" "$got" "$code"
  checks=$((checks + 1))
  grep -qF -- "$message" "$work/err" || fail "$what: \"$message\" not in: $(cat "$work/err")"
}
expect_code "no command" 2 "usage: lockstep-certs" --dir "$dir"
expect_code "unknown command" 2 'unknown command "bogus"' --dir "$dir" bogus
expect_code "a name with a slash" 2 'operator name "a/b" may use only' --dir "$dir" operator a/b
expect_code "a bad host" 2 '"bad_host!" is neither a DNS name nor an IP address' --dir "$dir" coordinator 'bad_host!'
expect_code "a task index that is not a number" 2 'task index "x" is not a number' --dir "$dir" worker worker x
expect_code "cluster without workers" 2 "cluster needs --workers N" --dir "$dir" cluster --coordinator a
mkdir "$work/keyless"
cp "$dir/ca.crt" "$work/keyless/"
expect_code "a CA without its key" 1 "ca.key does not: the CA cannot sign" --dir "$work/keyless" operator bob
check "the keyless CA's certificate is left alone" cmp "$dir/ca.crt" "$work/keyless/ca.crt"
expect_code "a Secret of a missing certificate" 1 "operator-bob.crt is missing" --dir "$dir" secret operator-bob lockstep-submit-tls

# ---- secret --------------------------------------------------------------------
"$certs" --dir "$dir" secret operator-alice lockstep-submit-tls --namespace ml >"$work/secret.yaml"
check "the Secret's type" grep -qx 'type: kubernetes.io/tls' "$work/secret.yaml"
check "the Secret's name" grep -qx '  name: lockstep-submit-tls' "$work/secret.yaml"
check "the Secret's namespace" grep -qx '  namespace: ml' "$work/secret.yaml"
for pair in tls.crt:operator-alice.crt tls.key:operator-alice.key ca.crt:ca.crt; do
  field=${pair%%:*}
  file=${pair#*:}
  sed -n "s/^  $field: //p" "$work/secret.yaml" | base64 -d >"$work/decoded"
  check "the Secret's $field is $file" cmp "$work/decoded" "$dir/$file"
done

# ---- a real cluster with these certificates --------------------------------------
# The CLI with identity NAME's certificate: as_identity NAME lockstep ARGS...
as_identity() {
  local name=$1
  shift
  LOCKSTEP_TLS_CERT="$dir/$name.crt" LOCKSTEP_TLS_KEY="$dir/$name.key" \
    LOCKSTEP_TLS_CA="$dir/ca.crt" LOCKSTEP_COORDINATOR="$address" "$@"
}

# Starts a coordinator holding certificate NAME (NAME.crt, NAME.key) with
# state in $work/NAME-state, logging to $work/NAME.log, and any further
# flags; sets $address to where it listens, or fails and returns 1.
start_coordinator() {  # NAME FLAGS...
  local name=$1 fifo="$work/$1.out" line
  shift
  mkfifo "$fifo"
  "$bin_dir/lockstep-coordinator" --listen 127.0.0.1:0 --state-dir "$work/$name-state" \
    --tls-cert "$dir/$name.crt" --tls-key "$dir/$name.key" \
    --tls-ca "$dir/ca.crt" "$@" >"$fifo" 2>"$work/$name.log" &
  pids+=($!)
  # Its first line ends with the address it listens on.
  exec {fd}<"$fifo"
  if ! read -r line <&"$fd"; then
    cat "$work/$name.log"
    fail "the coordinator did not start with $name's certificate"
    return 1
  fi
  cat <&"$fd" >/dev/null &
  pids+=($!)
  address=${line##* }
}

run_cluster() {
  start_coordinator coordinator --cluster '{"cluster": {"worker": ["127.0.0.1:1"]}}' || return
  "$bin_dir/lockstep-worker" --coordinator "$address" --task-type worker \
    --task-index 0 --threads 1 --device cpu \
    --tls-cert "$dir/worker-worker-0.crt" --tls-key "$dir/worker-worker-0.key" \
    --tls-ca "$dir/ca.crt" >"$work/worker.log" 2>&1 &
  pids+=($!)

  check "lockstep health with a viewer's certificate" \
    as_identity viewer-grafana "$bin_dir/lockstep" health "$address"
  checks=$((checks + 1))
  if ! as_identity operator-alice "$bin_dir/lockstep" submit \
    "$source_dir/examples/fashion_mnist_mlp.json" --set num_workers=1 \
    --set max_steps=3 --set global_batch_size=32 --watch >"$work/submit.out" 2>&1; then
    fail "an operator's job did not succeed on the worker: $(tail -5 "$work/submit.out"; tail -5 "$work/worker.log")"
  fi
  check "lockstep status with a viewer's certificate" \
    as_identity viewer-grafana "$bin_dir/lockstep" status
  checks=$((checks + 1))
  if as_identity viewer-grafana "$bin_dir/lockstep" submit \
    "$source_dir/examples/fashion_mnist_mlp.json" >"$work/refused.out" 2>&1; then
    fail "a viewer submitted a job"
  fi
  check "the refusal names the viewer" grep -q 'spiffe://lockstep/viewer/grafana' "$work/refused.out"
  checks=$((checks + 1))
  if LOCKSTEP_TLS_CERT="$work/other/operator-mallory.crt" LOCKSTEP_TLS_KEY="$work/other/operator-mallory.key" \
    LOCKSTEP_TLS_CA="$dir/ca.crt" LOCKSTEP_COORDINATOR="$address" \
    "$bin_dir/lockstep" status >"$work/foreign.out" 2>&1; then
    fail "an operator of another CA read the status"
  fi

  # Issue 27 #6: a task-less worker identity may not stand by as a spare of
  # this static cluster (a spare takes a failed task's rank and its secret).
  "$certs" --dir "$dir" free-worker pool-7 >/dev/null
  checks=$((checks + 1))
  if timeout 60 "$bin_dir/lockstep-worker" --coordinator "$address" --spare \
    --threads 1 --device cpu --connect-timeout 5 \
    --tls-cert "$dir/free-pool-7.crt" --tls-key "$dir/free-pool-7.key" \
    --tls-ca "$dir/ca.crt" >"$work/pool.log" 2>&1; then
    fail "a task-less worker identity stood by as a spare of a static cluster"
  fi
  check "the refusal asks for a spare identity" grep -q "spare/NAME" "$work/pool.log"
  # A spare's identity may.
  "$bin_dir/lockstep-worker" --coordinator "$address" --spare --threads 1 --device cpu \
    --tls-cert "$dir/spare-spare-0.crt" --tls-key "$dir/spare-spare-0.key" \
    --tls-ca "$dir/ca.crt" >"$work/spare.log" 2>&1 &
  pids+=($!)
  local waited=0
  until grep -q 'spare "spare-0"' "$work/coordinator.log"; do
    if [ "$waited" -ge 300 ]; then break; fi
    sleep 0.1
    waited=$((waited + 1))
  done
  check "a spare identity registers as a spare" grep -q 'spare "spare-0"' "$work/coordinator.log"
}

# A coordinator started with another identity's certificate (issue 27 #5: one
# started with a viewer's received an operator's job, and a worker trained it
# and got the data-plane secret). This worker certificate names 127.0.0.1, so
# only the role check can refuse it.
run_impostor() {
  "$certs" --dir "$dir" free-worker mallory 127.0.0.1 >/dev/null
  local impostor=free-mallory
  start_coordinator "$impostor" || return
  checks=$((checks + 1))
  if as_identity operator-alice "$bin_dir/lockstep" submit \
    "$source_dir/examples/fashion_mnist_mlp.json" >"$work/impostor-submit.out" 2>&1; then
    fail "an operator submitted a job to a coordinator holding $impostor's certificate"
  fi
  check "the refusal says whose certificate the server holds" \
    grep -q "not the coordinator's" "$work/impostor-submit.out"
  # A worker does not register with it: it exits with the reason.
  checks=$((checks + 1))
  if timeout 60 "$bin_dir/lockstep-worker" --coordinator "$address" --task-type worker \
    --task-index 0 --threads 1 --device cpu --connect-timeout 5 \
    --tls-cert "$dir/worker-worker-0.crt" --tls-key "$dir/worker-worker-0.key" \
    --tls-ca "$dir/ca.crt" >"$work/impostor-worker.log" 2>&1; then
    fail "a worker served a coordinator holding $impostor's certificate"
  fi
  check "the worker names the wrong identity" \
    grep -q "not the coordinator's" "$work/impostor-worker.log"
  check "the impostor saw no registration" \
    bash -c "! grep -q 'registered ' '$work/$impostor.log'"
}

if [ -n "$bin_dir" ]; then
  run_cluster
  run_impostor
fi

if [ "$failures" -gt 0 ]; then
  echo "lockstep-certs test: $failures of $checks checks failed"
  exit 1
fi
echo "lockstep-certs test: passed: $checks checks"
exit 0
