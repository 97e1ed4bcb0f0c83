#!/usr/bin/env bash
# Fetches llama.cpp's source into the cache (never into the repository) and prints the path of
# its source tree: the llama.cpp tree vendored by the PyPI source package llama-cpp-python==0.3.36
# (vendor/llama.cpp, llama.cpp commit 0c1e57098bba of 2026-10-01, ggml 0.25.3), pinned by the
# sdist's SHA-256. Only what libllama, ggml and llama.cpp's tools need is extracted (SUBSET below),
# then e8kv's patches are applied
# (integrations/llama.cpp/patches/*.patch: the E8 KV-cache types of ggml, and their -ctk/-ctv names). integrations/llama.cpp builds it (GGML_NATIVE=OFF).
# Idempotent: nothing is downloaded when the tree is there with the recorded hash.
# Cache: ${E8KV_CACHE:-$HOME/.cache/e8kv}/llama.cpp/llama.cpp-VERSION-PATCHHASH/
#   scripts/fetch-llama-cpp.sh --print-path   prints the tree's path if it is fetched (else nothing);
#                                             downloads nothing (scripts/env.sh uses it)
set -euo pipefail

PACKAGE="llama-cpp-python"
VERSION="0.3.36"
SDIST="llama_cpp_python-$VERSION.tar.gz"
# The sdist's address on PyPI's file host (from https://pypi.org/simple/llama-cpp-python/).
URL="https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/$SDIST"
SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PATCHES=("$HERE"/../integrations/llama.cpp/patches/*.patch)
# What is extracted from vendor/llama.cpp: libllama and ggml, and llama.cpp's tools (llama-server
# needs scripts/ for its UI assets step).
SUBSET=(CMakeLists.txt cmake ggml src include vendor common tools scripts LICENSE)
# The tree's stamp: the sdist's hash, the subset and the patches' hash (any change re-extracts).
STAMP_VALUE="$SHA256 ${SUBSET[*]} $(cat "${PATCHES[@]}" | sha256sum | cut -d' ' -f1)"

CACHE="${E8KV_CACHE:-$HOME/.cache/e8kv}"
ROOT="$CACHE/llama.cpp"
# One tree per set of patches (their hash in the name), so that checkouts with other patches
# (branches, worktrees) never re-extract a tree another build is reading.
PATCH_HASH="$(cat "${PATCHES[@]}" | sha256sum | cut -c1-12)"
DEST="$ROOT/llama.cpp-$VERSION-$PATCH_HASH"
STAMP="$DEST/.e8kv-stamp"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_VALUE" ] && [ -f "$DEST/CMakeLists.txt" ]; then
  echo "$DEST"
  exit 0
fi
[ "${1:-}" = "--print-path" ] && exit 0

mkdir -p "$ROOT"
hash_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]; }
archive="$ROOT/$SDIST"
if ! hash_ok "$archive"; then
  rm -f "$archive"
  echo "[fetch-llama-cpp] downloading $PACKAGE==$VERSION (sdist, 77 MB) from PyPI" >&2
  if command -v curl >/dev/null 2>&1 && curl -fsSL --retry 3 -o "$archive.part" "$URL"; then
    mv "$archive.part" "$archive"
  else
    # pip finds the same file through the index (slower: it prepares the package's metadata).
    rm -f "$archive.part"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download --no-deps --no-binary :all: --disable-pip-version-check -q \
      "$PACKAGE==$VERSION" -d "$tmp" >&2
    mv "$tmp/$SDIST" "$archive"
  fi
fi
if ! hash_ok "$archive"; then
  echo "[fetch-llama-cpp] error: SHA-256 of $archive is $(sha256sum "$archive" | cut -d' ' -f1)," \
       "expected $SHA256" >&2
  rm -f "$archive"
  exit 1
fi

rm -rf "$DEST.part" "$DEST"
mkdir -p "$DEST.part"
prefix="llama_cpp_python-$VERSION/vendor/llama.cpp"
tar xzf "$archive" -C "$DEST.part" --strip-components=3 "${SUBSET[@]/#/$prefix/}"
for p in "${PATCHES[@]}"; do
  patch -p1 --forward --silent -d "$DEST.part" < "$p" >&2 ||
    { echo "[fetch-llama-cpp] error: $p does not apply to llama.cpp $VERSION" >&2; exit 1; }
done
echo "$STAMP_VALUE" > "$DEST.part/.e8kv-stamp"
mv "$DEST.part" "$DEST"
echo "$DEST"
