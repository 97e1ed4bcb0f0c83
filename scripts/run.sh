#!/usr/bin/env bash
# The main job on its built-in default: the real-model evaluation `e8kv-eval --powered`
# (SmolLM2-135M-Instruct and two corpora, fetched on first use into ~/.cache/e8kv; ctx 1024,
# 8 chunks x 128 scored tokens = 1,024, the protocol docs/accuracy.md ranks configurations on),
# which prints the ranked table and draws KL against bits, then the rate-distortion bench `e8kv-rd`
# on Gaussian blocks and synthetic KV. Results under build/results/: eval.md / eval.csv (the
# table), quality-vs-bits.svg (the picture; docs/quality-vs-bits.svg is a copy of it), rd.csv, rd.svg.
#   scripts/run.sh                  powered evaluation + rate-distortion (~10 min on 2 cores, fresh clone)
#   scripts/run.sh eval [ARGS...]   e8kv-eval with ARGS (e.g. --quick: a 1-minute smoke run that ranks nothing)
#   scripts/run.sh rd [ARGS...]     e8kv-rd with ARGS (e.g. --source npy:keys.npy)
# Progress goes to stderr: a bar on a terminal, one line per chunk in a log; `eval --quiet` silences it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
bash "$E8KV_ROOT/scripts/setup.sh"
out="$E8KV_ROOT/build/results"
mkdir -p "$out"
mode="${1:-default}"
[ $# -gt 0 ] && shift
case "$mode" in
  default|eval|rd) ;;
  *) echo "usage: scripts/run.sh [eval|rd] [ARGS...]" >&2; exit 2 ;;
esac
E8KV_TARGETS=(e8kv-rd e8kv-eval)
configure_and_build -DE8KV_BUILD_EXAMPLES=ON
if [ "$mode" = default ] || [ "$mode" = eval ]; then
  bash "$E8KV_ROOT/scripts/fetch-data.sh" >&2
  if [ "$mode" = default ]; then set -- --powered; fi
  "$E8KV_BUILD/bench/eval/e8kv-eval" "$@" --csv "$out/eval.csv" --md "$out/eval.md" --svg "$out/quality-vs-bits.svg"
  echo "eval CSV: $out/eval.csv   markdown: $out/eval.md   picture: $out/quality-vs-bits.svg"
fi
if [ "$mode" = default ] || [ "$mode" = rd ]; then
  if [ "$mode" = default ]; then set -- --source gaussian --source kv-synthetic --samples 200000 --seed 1; fi
  "$E8KV_BUILD/bench/rd/e8kv-rd" "$@" --csv "$out/rd.csv" --svg "$out/rd.svg"
  echo "rd CSV: $out/rd.csv   SVG: $out/rd.svg"
fi
