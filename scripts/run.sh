#!/usr/bin/env bash
# The main job on its built-in default: the rate-distortion bench e8kv-rd on i.i.d. Gaussian
# blocks (200,000, seed 1) and synthetic KV head vectors, writing CSV and SVG under build/results/.
# Extra arguments go to e8kv-rd (e.g. --source npy:keys.npy).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
bash "$E8KV_ROOT/scripts/setup.sh"
E8KV_TARGETS=(e8kv-rd)
configure_and_build
out="$E8KV_ROOT/build/results"
mkdir -p "$out"
if [ $# -eq 0 ]; then set -- --source gaussian --source kv-synthetic --samples 200000 --seed 1; fi
"$E8KV_BUILD/bench/rd/e8kv-rd" "$@" --csv "$out/rd.csv" --svg "$out/rd.svg"
echo "CSV: $out/rd.csv   SVG: $out/rd.svg"
