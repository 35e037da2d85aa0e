#!/usr/bin/env bash
# `make install`'s Python part (CTest: python_client_install): the package
# installed under a temporary prefix imports on Debian's python3 without the
# build tree, with its stubs, and finds the binaries under that prefix.
set -euo pipefail
build_dir=$1
prefix=$(mktemp -d /tmp/lockstep-install-test-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build_dir" --component python --prefix "$prefix" >/dev/null
package=$(find "$prefix" -name __init__.py -path '*/lockstep/__init__.py')
[ -n "$package" ] || { echo "FAILED: no lockstep/__init__.py under $prefix"; exit 1; }
site=$(dirname "$(dirname "$package")")
out=$(cd / && env -u PYTHONPATH PYTHONPATH="$site" PYTHONDONTWRITEBYTECODE=1 \
  /usr/bin/python3 -c '
import lockstep, lockstep._paths
from lockstep.v1 import coordinator_pb2_grpc
print(lockstep.__file__)
print(lockstep._paths.BIN_DIR)
print(hasattr(coordinator_pb2_grpc, "CoordinatorStub"))')
echo "$out"
grep -qx "$site/lockstep/__init__.py" <<<"$out" || { echo "FAILED: imported from elsewhere"; exit 1; }
grep -qx "$prefix/bin" <<<"$out" || { echo "FAILED: BIN_DIR is not $prefix/bin"; exit 1; }
grep -qx True <<<"$out" || { echo "FAILED: no CoordinatorStub"; exit 1; }
echo "python install: OK ($site)"
