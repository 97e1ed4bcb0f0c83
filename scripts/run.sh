#!/usr/bin/env bash
# The main job on its built-in default: builds e8kv and runs the micro-benchmarks.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
bash "$E8KV_ROOT/scripts/setup.sh"
E8KV_TARGETS=(e8kv-micro)
configure_and_build
"$E8KV_BUILD/bench/micro/e8kv-micro" --benchmark_min_time=0.2 "$@"
