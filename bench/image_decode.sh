#!/usr/bin/env bash
# Decoded images per second per core: lockstep's JPEG decoder
# (libjpeg-turbo, worker/data/image_decode.h) against Pillow's
# (python3-pil, libjpeg-turbo too) on the same files, interleaved in one
# invocation; and a TFRecord split of the same images read in batches of 64
# through 1 and 2 data threads (--data-threads).
#
#   bench/image_decode.sh BUILD_DIR [COUNT] [SIZE] [SECONDS]
#
# Writes COUNT (default 200) SIZE x SIZE (default 224) RGB JPEGs (baseline,
# quality 90) with Pillow, as files and as TFRecords of the same JPEGs
# (tests/scripts/write_image_records.py), then runs each decoder for
# SECONDS (default 3) twice, alternating. Prints a table and a JSON line;
# the ratio is lockstep / Pillow (median of the runs).
set -euo pipefail
BUILD=${1:?usage: bench/image_decode.sh BUILD_DIR [COUNT] [SIZE] [SECONDS]}
COUNT=${2:-200}
SIZE=${3:-224}
SECONDS_EACH=${4:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(cd "$BUILD" && pwd)/bin
/usr/bin/python3 -c 'import PIL, numpy' 2>/dev/null || { echo "needs python3-pil and python3-numpy"; exit 77; }
WORK=$(mktemp -d /tmp/lockstep-image-decode-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
/usr/bin/python3 "$ROOT/tests/scripts/write_image_records.py" "$WORK/records" \
    --train "$COUNT" --test 10 --size "$SIZE" --files "$WORK/files" \
    --png-every 0 >&2

pillow() {
  /usr/bin/python3 - "$WORK/files" "$SECONDS_EACH" <<'PY'
import glob, sys, time
import numpy as np
from PIL import Image
files = [open(f, "rb").read() for f in sorted(glob.glob(sys.argv[1] + "/*.jpg"))]
import io
n, start = 0, time.perf_counter()
while time.perf_counter() - start < float(sys.argv[2]):
    for data in files:
        np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        n += 1
print(f"{n / (time.perf_counter() - start):.1f}")
PY
}

declare -a PIL_RUNS=() OURS=() OURS2=() REC1=() REC2=()
field() { /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
for _ in 1 2; do
  PIL_RUNS+=("$(OMP_NUM_THREADS=1 pillow)")
  line=$("$BIN/image_decode_bench" "$WORK/files" "$WORK/records" "$SIZE" "$SECONDS_EACH")
  OURS+=("$(echo "$line" | field decode_per_core)")
  OURS2+=("$(echo "$line" | field decode_2_threads)")
  REC1+=("$(echo "$line" | field records_1_thread)")
  REC2+=("$(echo "$line" | field records_2_threads)")
done
median() { /usr/bin/python3 -c 'import statistics,sys; print(round(statistics.median(float(x) for x in sys.argv[1:]), 1))' "$@"; }
M_PIL=$(median "${PIL_RUNS[@]}"); M_OURS=$(median "${OURS[@]}"); M_OURS2=$(median "${OURS2[@]}")
M_REC1=$(median "${REC1[@]}"); M_REC2=$(median "${REC2[@]}")
ratio() { /usr/bin/python3 -c "print(f'{$1 / $2:.2f}')"; }
RATIO=$(ratio "$M_OURS" "$M_PIL")
READ1=$(ratio "$M_REC1" "$M_OURS"); READ2=$(ratio "$M_REC2" "$M_OURS2")
cat <<EOT
| decoder | ${SIZE}x${SIZE} JPEGs decoded per second (runs) | median |
| --- | ---: | ---: |
| Pillow, one core | ${PIL_RUNS[*]} | $M_PIL |
| lockstep DecodeImage, one thread | ${OURS[*]} | $M_OURS |
| lockstep DecodeImage, two threads | ${OURS2[*]} | $M_OURS2 |
| lockstep TFRecord split, 1 data thread | ${REC1[*]} | $M_REC1 |
| lockstep TFRecord split, 2 data threads | ${REC2[*]} | $M_REC2 |

lockstep / Pillow per core: $RATIO; TFRecord split / DecodeImage alone: $READ1 on 1 thread, $READ2 on 2 ($(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-unset})
EOT
echo "{\"pillow_per_core\": $M_PIL, \"lockstep_per_core\": $M_OURS, \"lockstep_2_threads\": $M_OURS2, \"ratio\": $RATIO, \"records_1_thread\": $M_REC1, \"records_2_threads\": $M_REC2, \"records_vs_decode_1\": $READ1, \"records_vs_decode_2\": $READ2}"
