#!/usr/bin/env bash
# The package as a Python user installs it (CTest: python_venv_install,
# issue 53): a virtual environment with Debian's site packages (PyPI is not
# reachable here) gets `pip install --no-build-isolation --no-index
# client/python`; outside the source tree it imports lockstep with its
# version, its gRPC stubs and their type stubs, and runs a real job on a
# LocalCluster. `pip wheel` builds the same package. The repository's
# client/python and proto/ are copied first, so that the build leaves
# nothing in the source tree.
#   tests/python/venv_install_test.sh SOURCE_DIR BIN_DIR VERSION
set -euo pipefail
source_dir=$1
bin_dir=$2
version=$3
work=$(mktemp -d /tmp/lockstep-venv-test-XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/repo/client"
cp -r "$source_dir/client/python" "$work/repo/client/"
cp -r "$source_dir/proto" "$work/repo/"
rm -rf "$work/repo/client/python/build" "$work/repo/client/python/"*.egg-info
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --quiet --no-build-isolation --no-index \
  "$work/repo/client/python"
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
out=$(cd / && env -u PYTHONPATH PYTHONDONTWRITEBYTECODE=1 MPLBACKEND=Agg \
  LOCKSTEP_BIN_DIR="$bin_dir" "$work/venv/bin/python" - "$source_dir" <<'PY'
import os
import sys

import lockstep
from lockstep.v1 import coordinator_pb2, coordinator_pb2_grpc

package = os.path.dirname(lockstep.__file__)
print(lockstep.__file__)
print(lockstep.__version__)
print(hasattr(coordinator_pb2_grpc, "CoordinatorStub"))
print(os.path.isfile(os.path.join(package, "py.typed")),
      os.path.isfile(os.path.join(package, "v1", "coordinator_pb2.pyi")))
mlp = os.path.join(sys.argv[1], "examples", "fashion_mnist_mlp.json")
with lockstep.LocalCluster(workers=1, threads=1) as cluster:
    client = cluster.client()
    job = client.submit(mlp, {"max_steps": 5, "epochs": 1, "warmup_steps": 0})
    final = job.wait(timeout=180)
    print("job", lockstep.state_name(final.state), final.step)
    client.close()
PY
)
echo "$out"
fail() { echo "FAILED: $1"; exit 1; }
grep -qx "$site/lockstep/__init__.py" <<<"$out" || fail "lockstep was not imported from the venv ($site)"
grep -qx "$version" <<<"$out" || fail "lockstep.__version__ is not the project's $version"
grep -qx True <<<"$out" || fail "no CoordinatorStub"
grep -qx "True True" <<<"$out" || fail "py.typed or the .pyi stubs are missing"
grep -qx "job succeeded 5" <<<"$out" || fail "the round trip did not succeed"
# The wheel pip builds holds the same.
"$work/venv/bin/pip" wheel --quiet --no-build-isolation --no-index --no-deps \
  -w "$work/wheel" "$work/repo/client/python"
wheel=$(ls "$work/wheel"/lockstep-"$version"-*.whl)
listing=$(/usr/bin/python3 -m zipfile -l "$wheel")
for member in lockstep/py.typed lockstep/v1/coordinator_pb2_grpc.py \
              lockstep/v1/job_pb2.pyi lockstep/_version.py; do
  grep -q "$member" <<<"$listing" || fail "$member is not in $(basename "$wheel")"
done
echo "venv install: OK ($(basename "$wheel"))"
