#!/usr/bin/env bash
# Builds e8kv (CUDA kernels too when nvcc exists) and runs the whole test suite.
# GPU tests report "Not Run" (skipped) on machines without a usable device; the real-model tests
# and the quality check (label model) likewise without the fetched model and corpora
# (scripts/fetch-data.sh; E8KV_REQUIRE_DATA=1 makes their absence a failure, as in CI).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
bash "$E8KV_ROOT/scripts/setup.sh"
if [ "${E8KV_REQUIRE_DATA:-}" = 1 ] && [ -z "$E8KV_LLAMA_CPP_SOURCE" ]; then
  echo "[test] error: E8KV_REQUIRE_DATA=1 and llama.cpp's source is not fetched (scripts/fetch-data.sh)" >&2
  exit 1
fi
E8KV_TARGETS=()
configure_and_build
cd "$E8KV_BUILD"
ctest --output-on-failure -j "$E8KV_JOBS" "$@"
