#!/usr/bin/env bash
# deploy/check.sh: checks deploy/ offline (run by `make test` through CTest,
# test deploy_check; needs what scripts/install-deps installs).
#
#  1. The Dockerfiles' builder stages install the same -dev packages as
#     scripts/install-deps (differences only as allowed below, with reasons).
#  2. Every kustomization (k8s/base, k8s/overlays/*) renders with Debian 12's
#     kubectl (kubernetes-client, kubectl 1.20 and its kustomize), and every
#     rendered object, and k8s/examples/*.yaml, passes validate.mjs: the
#     Kubernetes schema (npm kubernetes-models) and lockstep's rules.
#  3. The known-bad fixture testdata/bad is rejected, with every rule listed
#     in testdata/bad/EXPECTED named.
#  4. Every query of the Grafana dashboard (grafana/) parses (promtool).
#  5. podman-play.mjs translates the cpu overlay into what scripts/e2e plays
#     (podman_play_check.mjs: the pods, their ports, no $(VAR) left, the
#     Secrets written as files), and refuses what it does not translate.
#
# Prints one summary line; details only when something fails. Exit 0 or 1.
# LOCKSTEP_KUBECTL=PATH picks another kubectl (its kustomize must accept the
# same kustomization fields).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() {
  echo "deploy check: FAILED: $*"
  exit 1
}

# ---- tools -------------------------------------------------------------------
find_kubectl() {
  if [ -n "${LOCKSTEP_KUBECTL:-}" ]; then
    echo "$LOCKSTEP_KUBECTL"
    return
  fi
  if dpkg-query -W -f='${Status}' kubernetes-client 2>/dev/null | grep -q "install ok installed"; then
    dpkg-query -L kubernetes-client | grep -m1 '/bin/kubectl$'
    return
  fi
  # Where scripts/install-deps unpacks it when another package owns /usr/bin/kubectl.
  if [ -x /opt/lockstep/kubernetes-client/usr/bin/kubectl ]; then
    echo /opt/lockstep/kubernetes-client/usr/bin/kubectl
  fi
}
kubectl=$(find_kubectl)
if [ -z "$kubectl" ] || [ ! -x "$kubectl" ]; then
  fail "Debian's kubectl (package kubernetes-client) is missing; run scripts/install-deps as root"
fi
kubectl_version=$("$kubectl" version --client --short 2>/dev/null | awk '{print $NF}' || true)
command -v node >/dev/null || fail "node is missing; run scripts/install-deps as root"
if [ ! -d "$here/node_modules/kubernetes-models" ] || [ ! -d "$here/node_modules/yaml" ]; then
  fail "deploy/node_modules is missing; run scripts/install-deps (npm ci --prefix deploy)"
fi

# ---- 1. package lists in step ------------------------------------------------
# Packages in scripts/install-deps' `packages=( ... )` list.
install_deps_packages() {
  sed -n '/^packages=(/,/^)/p' "$root/scripts/install-deps" | sed '1d;$d' |
    sed 's/#.*//' | tr -s ' \t' '\n' | grep -v '^$' | sort -u
}
# Packages that `apt-get install` names in one stage of a Dockerfile.
stage_packages() {  # DOCKERFILE STAGE
  awk -v stage="$2" 'toupper($1) == "FROM" { in_stage = (tolower($NF) == stage); next }
                     in_stage' "$1" |
    sed -e ':a' -e '/\\$/{N;s/\\\n/ /;ba' -e '}' |
    grep -o 'apt-get install[^&;|]*' | sed 's/apt-get install//' |
    tr -s ' \t' '\n' | grep -v -e '^-' -e '^$' | sort -u
}
# In install-deps but not in a builder stage, and why:
#   ccache git clang   developer tools (compiler cache, sources, `make thread-safety`;
#                      Dockerfile.cpu's builder does install ccache, for its cache mount)
#   libfuzzer-14-dev   a developer tool too (`make sanitize`, `make fuzz`)
#   dataset-fashion-mnist  Dockerfile.gpu installs it in the runtime stage (WITH_DATASET);
#                      Dockerfile.cpu's builder installs it and copies it on
#   openssl            the CLI for scripts/lockstep-certs, run where certificates
#                      are made, not in the images
#   prometheus         promtool and the server the metrics tests scrape with
#   fortunes           the text examples/char_lm_fortunes.json is made from, on
#                      the machine that runs the example, not in the images
#   python3-pil        the tests' independent JPEG/PNG writer and
#                      bench/image_decode.sh's reference decoder
# and for Dockerfile.gpu also:
#   libtorch-dev       a CUDA LibTorch comes from LIBTORCH_URL instead
#   libopenblas0 libopenblas0-openmp  that LibTorch brings its own BLAS
#   python3-torch python3-numpy  the DDP reference of bench/ddp_compare.sh
#   python3            only Debian's libtorch-dev needs it
#   python3-grpcio python3-protobuf python3-pandas python3-matplotlib
#   python3-tqdm       the Python client (client/python) and its tests; the
#                      images ship the daemons and the CLI, not the package
#   python3-venv python3-pip python3-setuptools python3-wheel  the test that
#                      pip-installs that package into a virtual environment
#   chromium           the browser the web console's tests drive; `lockstep ui`
#                      serves it, the images need none
# shellcheck disable=SC2034  # read as ${!allowed} below
allowed_cpu="ccache git clang libfuzzer-14-dev dataset-fashion-mnist openssl prometheus python3-torch python3-numpy fortunes python3-pil python3-grpcio python3-protobuf python3-pandas python3-matplotlib python3-tqdm python3-venv python3-pip python3-setuptools python3-wheel chromium"
# shellcheck disable=SC2034
allowed_gpu="$allowed_cpu libtorch-dev libopenblas0 libopenblas0-openmp python3"
install_deps_packages >"$work/install-deps.txt"
[ -s "$work/install-deps.txt" ] || fail "no packages=( ... ) list found in scripts/install-deps"
for image in cpu gpu; do
  dockerfile="$here/docker/Dockerfile.$image"
  [ -f "$dockerfile" ] || fail "$dockerfile is missing"
  stage_packages "$dockerfile" builder >"$work/builder-$image.txt"
  [ -s "$work/builder-$image.txt" ] || fail "Dockerfile.$image: no apt-get install in stage builder"
  allowed=allowed_$image
  tr ' ' '\n' <<<"${!allowed}" | sort -u >"$work/allowed-$image.txt"
  missing=$(comm -23 "$work/install-deps.txt" "$work/builder-$image.txt" |
    comm -23 - "$work/allowed-$image.txt" | tr '\n' ' ')
  extra=$(comm -13 "$work/install-deps.txt" "$work/builder-$image.txt" | grep -- '-dev$' | tr '\n' ' ' || true)
  [ -z "$missing" ] ||
    fail "Dockerfile.$image's builder stage lacks packages that scripts/install-deps installs: ${missing% } (add them, or allow them in deploy/check.sh with a reason)"
  [ -z "$extra" ] ||
    fail "Dockerfile.$image's builder stage installs -dev packages that scripts/install-deps does not: ${extra% }"
done
package_count=$(wc -l <"$work/install-deps.txt")

# ---- 2. render and validate --------------------------------------------------
renders=()
for dir in "$here"/k8s/base "$here"/k8s/overlays/*/; do
  dir=${dir%/}
  name=${dir#"$here/"}
  out="$work/$(tr / - <<<"$name").yaml"
  if ! "$kubectl" kustomize "$dir" >"$out" 2>"$work/kustomize.err"; then
    cat "$work/kustomize.err"
    fail "kubectl kustomize $name failed"
  fi
  renders+=("$name=$out")
done
for example in "$here"/k8s/examples/*.yaml; do
  renders+=("${example#"$here/"}=$example")
done
if ! node "$here/validate.mjs" "${renders[@]}" >"$work/good.txt" 2>&1; then
  grep -v '^ok ' "$work/good.txt"
  fail "deploy/k8s does not validate (above)"
fi
objects=$(awk '/^ok / {n += $3} END {print n + 0}' "$work/good.txt")

# ---- 3. the known-bad fixture must be rejected -------------------------------
bad="$here/testdata/bad"
"$kubectl" kustomize "$bad" >"$work/bad.yaml" 2>"$work/kustomize.err" || {
  cat "$work/kustomize.err"
  fail "kubectl kustomize testdata/bad failed (it must render and then be rejected)"
}
if node "$here/validate.mjs" "testdata/bad=$work/bad.yaml" >"$work/bad.txt" 2>&1; then
  cat "$work/bad.txt"
  fail "the known-bad fixture deploy/testdata/bad was accepted"
fi
grep -q '^FAILED testdata/bad' "$work/bad.txt" || {
  cat "$work/bad.txt"
  fail "the validator crashed on deploy/testdata/bad instead of rejecting it"
}
unnamed=()
rules=0
while read -r rule; do
  [ -n "$rule" ] || continue
  rules=$((rules + 1))
  grep -q -- "\[$rule\]" "$work/bad.txt" || unnamed+=("$rule")
done <"$bad/EXPECTED"
if [ ${#unnamed[@]} -gt 0 ]; then
  cat "$work/bad.txt"
  fail "deploy/testdata/bad was rejected, but these rules were not reported: ${unnamed[*]}"
fi

# ---- 4. the Grafana dashboard's queries parse ---------------------------------
# Each panel's PromQL, as recording rules, through `promtool check rules`.
command -v promtool >/dev/null || fail "promtool is missing; run scripts/install-deps as root (package prometheus)"
dashboard="$here/grafana/lockstep-dashboard.json"
node -e '
const d = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
const exprs = d.panels.flatMap((p) => p.targets.map((t) => t.expr));
if (exprs.length === 0) throw new Error("the dashboard has no queries");
console.log("groups:\n  - name: dashboard\n    rules:");
exprs.forEach((e, i) => console.log(`      - record: lockstep:dashboard_${i}\n        expr: ${JSON.stringify(e.replaceAll("$job", ".*"))}`));
' "$dashboard" >"$work/dashboard-rules.yml" || fail "cannot read the queries of $dashboard"
promtool check rules "$work/dashboard-rules.yml" >"$work/promtool.txt" 2>&1 || {
  cat "$work/promtool.txt"
  fail "deploy/grafana/lockstep-dashboard.json has a query promtool rejects (above)"
}
queries=$(grep -c 'record:' "$work/dashboard-rules.yml")

# ---- 5. the podman translation that scripts/e2e plays --------------------------
if ! node "$here/podman_play_check.mjs" "$work/k8s-overlays-cpu.yaml" "$work/podman-secrets" \
  >"$work/podman.txt" 2>&1; then
  cat "$work/podman.txt"
  fail "deploy/podman-play.mjs does not translate the cpu overlay as scripts/e2e needs (above)"
fi
podman_pods=$(awk '/^ok podman-play/ {print $3}' "$work/podman.txt")

echo "deploy check: passed: ${#renders[@]} renderings (kubectl ${kubectl_version:-?} kustomize), $objects objects valid; Dockerfile builders in step with install-deps ($package_count packages); bad fixture rejected on all $rules rules; $queries dashboard queries parse; cpu overlay translated for podman ($podman_pods pods)"
