#!/usr/bin/env bash
# Fetches everything the real-model evaluation and tests need into ${E8KV_CACHE:-$HOME/.cache/e8kv}
# (models: scripts/fetch-model.sh, SmolLM2, Gemma-3-270M and Qwen2.5-Coder-0.5B (the llama.cpp
# memory's architecture tests: sliding-window layers; k_proj biases); text: scripts/fetch-text.sh;
# llama.cpp's source for the adapter's engine tests: scripts/fetch-llama-cpp.sh) and prints the paths.
# Idempotent: a second run only checks hashes.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$here/fetch-model.sh"
bash "$here/fetch-model.sh" gemma3   # the llama.cpp adapter's engine and architecture tests
bash "$here/fetch-model.sh" qwen2.5-coder-0.5b   # the architecture tests (qwen2, k_proj biases; 491 MB)
bash "$here/fetch-text.sh"
bash "$here/fetch-llama-cpp.sh"
