#!/usr/bin/env bash
# A tiny Fashion-MNIST for the benchmarks' smoke runs: the first TRAIN and
# TEST images and labels of the real set, as raw IDX files in OUT_DIR, so a
# job loads and evaluates in milliseconds. The scripts in bench/ train on it
# when BENCH_DATA_DIR names it.
#
#   bench/tiny_dataset.sh OUT_DIR [TRAIN] [TEST] [SOURCE_DIR]
set -euo pipefail
out=${1:?usage: bench/tiny_dataset.sh OUT_DIR [TRAIN] [TEST] [SOURCE_DIR]}
train=${2:-1024}
test=${3:-256}
source=${4:-/usr/share/datasets/fashion-mnist}
mkdir -p "$out"
python3 - "$source" "$out" "$train" "$test" <<'PY'
import gzip, os, struct, sys

source, out, counts = sys.argv[1], sys.argv[2], {"train": int(sys.argv[3]), "t10k": int(sys.argv[4])}

def open_idx(name):
    path = os.path.join(source, name)
    if os.path.exists(path + ".gz"):
        return gzip.open(path + ".gz", "rb")
    return open(path, "rb")

for split, count in counts.items():
    for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
        name = "%s-%s" % (split, kind)
        with open_idx(name) as f:
            magic, total = struct.unpack(">II", f.read(8))
            dims = [struct.unpack(">I", f.read(4))[0] for _ in range(magic % 256 - 1)]
            if count > total:
                sys.exit("%s holds %d items, fewer than %d" % (name, total, count))
            item = 1
            for d in dims:
                item *= d
            body = f.read(count * item)
        with open(os.path.join(out, name), "wb") as f:
            f.write(struct.pack(">II", magic, count))
            for d in dims:
                f.write(struct.pack(">I", d))
            f.write(body)
PY
