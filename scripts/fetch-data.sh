#!/usr/bin/env bash
# Fetches everything the real-model evaluation and tests need into ${E8KV_CACHE:-$HOME/.cache/e8kv}
# (models: scripts/fetch-model.sh, SmolLM2 and Gemma-3-270M (the llama.cpp adapter's second
# architecture); text: scripts/fetch-text.sh; llama.cpp's source for the adapter's engine tests:
# scripts/fetch-llama-cpp.sh) and prints the paths.
# Idempotent: a second run only checks hashes.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$here/fetch-model.sh"
bash "$here/fetch-model.sh" gemma3   # the second architecture of the llama.cpp adapter's engine tests
bash "$here/fetch-text.sh"
bash "$here/fetch-llama-cpp.sh"
