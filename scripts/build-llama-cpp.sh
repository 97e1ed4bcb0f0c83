#!/usr/bin/env bash
# llama.cpp's own tools, patched with e8kv (its E8 ggml types and its compressed KV memory,
# --kv-e8kv SPEC), built from the pinned source (scripts/fetch-llama-cpp.sh: PyPI sdist, SHA-256
# checked, GGML_NATIVE=OFF). Prints the directory holding the binaries.
#
#   scripts/build-llama-cpp.sh [targets...]   default: llama-cli llama-server llama-perplexity llama-bench
#   E8KV_LLAMA_TOOLS_BUILD=dir                 build directory (default build/llama-tools)
#   E8KV_LLAMA_SANITIZE=address                the tools and every library under them (llama.cpp,
#                                              ggml, e8kv) built with -fsanitize=address,undefined
#                                              and frame pointers (use its own build directory)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
bash "$E8KV_ROOT/scripts/setup.sh" >&2
SRC="$(bash "$E8KV_ROOT/scripts/fetch-llama-cpp.sh")"
BUILD="${E8KV_LLAMA_TOOLS_BUILD:-$E8KV_ROOT/build/llama-tools}"
TARGETS=("$@")
# A build directory configured from another tree (other patches: another hash in its name) starts over.
if [ -f "$BUILD/CMakeCache.txt" ] && ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$SRC" "$BUILD/CMakeCache.txt"; then
  echo "[build-llama-cpp] $BUILD was configured from another llama.cpp tree: starting it over" >&2
  rm -rf "$BUILD"
fi
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(llama-cli llama-server llama-perplexity llama-bench)
SANITIZE=()
case "${E8KV_LLAMA_SANITIZE:-}" in
  "") ;;
  address)
    # One flag set for every target of the tree: e8kv's library and memory are built inside it.
    flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g1"
    SANITIZE=(-DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
              -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined") ;;
  *) echo "[build-llama-cpp] E8KV_LLAMA_SANITIZE=${E8KV_LLAMA_SANITIZE}: only 'address' is known" >&2; exit 2 ;;
esac
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF \
      -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF \
      -DLLAMA_USE_PREBUILT_UI=OFF \
      -DGGML_E8KV_SOURCE="$E8KV_ROOT/integrations/llama.cpp/ggml/ggml-e8kv.cpp" \
      -DGGML_E8KV_INCLUDE_DIR="$E8KV_ROOT/include" \
      -DLLAMA_E8KV_MEMORY_DIR="$E8KV_ROOT/integrations/llama.cpp/memory" ${SANITIZE[@]+"${SANITIZE[@]}"} >&2
echo "[build-llama-cpp] building ${TARGETS[*]} in $BUILD (a few minutes on 2 cores the first time)" >&2
cmake --build "$BUILD" -j "$E8KV_JOBS" --target "${TARGETS[@]}" >&2
echo "$BUILD/bin"
