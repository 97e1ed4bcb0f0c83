#!/usr/bin/env bash
# Builds the CPU test suite with AddressSanitizer + UndefinedBehaviorSanitizer (the `asan`
# preset's settings) in its own build directory and runs it. Lean: no benchmarks, examples or
# CUDA; only what `ctest -LE "gpu|package"` runs is built.
#
#   scripts/sanitize.sh [extra ctest args]
#   E8KV_ASAN_BUILD=dir   build directory (default build/asan)
#   E8KV_JOBS=N           parallel jobs (default nproc)
#   E8KV_ASAN_TARGETS="a b"  build only these targets (default: all; pass ctest -R to match)
#   E8KV_ASAN_MATH=1      also the exhaustive header-math tests (ctest label math: codebooks,
#                         lattice, Hadamard, half, random; left out by default, see
#                         tests/CMakeLists.txt: a third of the suite's time for code the other
#                         tests run instrumented too)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${E8KV_ASAN_BUILD:-$ROOT/build/asan}"
JOBS="${E8KV_JOBS:-$(nproc 2>/dev/null || echo 2)}"
# -O1 -g1 instead of RelWithDebInfo's -O2 -g: with ASan + UBSan, compressed_kv.cpp alone takes
# 256 s of CPU at -O2 -g and 65 s at -O1 -g1 (gcc 12); the tests run about as fast.
cmake --preset asan -S "$ROOT" -B "$BUILD" -DE8KV_CUDA=OFF -DE8KV_BUILD_BENCH=OFF -DE8KV_BUILD_EXAMPLES=OFF -DE8KV_BUILD_TOOLS=OFF \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
      -DE8KV_MATH_TESTS="$([ "${E8KV_ASAN_MATH:-0}" = 1 ] && echo ON || echo OFF)" >/dev/null
targets=()
for t in ${E8KV_ASAN_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$BUILD" -j "$JOBS" "${targets[@]}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
cd "$BUILD"
ctest --output-on-failure -j "$JOBS" -LE "gpu|package" "$@"
