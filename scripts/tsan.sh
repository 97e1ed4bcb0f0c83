#!/usr/bin/env bash
# The tests that run e8kv on several threads, built with ThreadSanitizer in their own build
# directory and run on their threaded cases only: a ThreadPool inside compress, extend and
# attend_batch, several user threads calling attend on one const cache, and the lazily built
# shared tables. A data race fails the run (halt_on_error). The rest of the suite is
# single-threaded and runs under AddressSanitizer + UBSan instead (scripts/sanitize.sh).
#
#   scripts/tsan.sh
#   E8KV_TSAN_BUILD=dir   build directory (default build/tsan)
#   E8KV_JOBS=N           parallel jobs (default nproc)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${E8KV_TSAN_BUILD:-$ROOT/build/tsan}"
JOBS="${E8KV_JOBS:-$(nproc 2>/dev/null || echo 2)}"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
      -DE8KV_CUDA=OFF -DE8KV_BUILD_BENCH=OFF -DE8KV_BUILD_EXAMPLES=OFF -DE8KV_BUILD_TOOLS=OFF -DE8KV_MATH_TESTS=ON -DE8KV_SANITIZE=thread >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target attend_test compressor_test compressor_tiers_test rate_allocation_test \
      shells_test
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
# One gtest binary with a filter; fails when the filter selects nothing (a renamed test must not
# turn this check into a silent pass).
run() {
  local bin="$1" filter="$2" log
  echo "[tsan] $bin --gtest_filter=$filter"
  log="$("$BUILD/tests/$bin" --gtest_filter="$filter" 2>&1)" || { echo "$log"; exit 1; }
  echo "$log" | tail -n 1
  echo "$log" | grep -Eq '^\[  PASSED  \] [1-9][0-9]* tests?\.' || { echo "$log"; echo "[tsan] $bin: no test ran" >&2; exit 1; }
}
run attend_test 'Attend.BatchThreadsAndIsaGiveIdenticalBits'
run compressor_test 'Compressor.ConcurrentAttendIsDeterministic'
run compressor_tiers_test 'Compressor.SharedSelection*:Compressor.EvictionSpread*:Compressor.Fp16Tier*'
run rate_allocation_test 'RateAllocation.EvictionSpreadOverLayersWeighsEachLayerByItsCodedTokens'
run shells_test 'E8Shells.CachedTableIsSharedAcrossThreads'
echo "[tsan] no data race in the threaded tests"
