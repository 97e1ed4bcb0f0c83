#!/usr/bin/env bash
# Peer harness (issue 17 part 2; optional, never in CI): e8kv through its C ABI, NVIDIA kvpress
# and NexusQuant's own package on SmolLM2-135M under one protocol (bench/peers/peers.py says which).
#   scripts/peers.sh                     the full run: ctx 1024, 128 scored tokens, 8 chunks, 53 rows
#   scripts/peers.sh --chunks 1 --only kvpress     any peers.py arguments after the defaults
# Needs: ~6 GB of disk for the virtual environment in ${E8KV_CACHE:-~/.cache/e8kv}/peers/venv
# (bench/peers/requirements.lock: torch 2.15.0, transformers 5.2.0, kvpress 0.5.5, nexusquant-kv
# 0.6.3, gguf 0.19.0, accelerate 1.15.0; ~2.5 min to install here), the model and corpora
# (scripts/fetch-data.sh), and libe8kv_c.so + e8kv-llama (built here). Time on 2 cores: 35 min
# for the full run on 2026-12-04, venv install and build included (~3 s per row and chunk: each
# row re-runs the 128-token continuation; kvpress rows re-run the prefill with the press active;
# NexusQuant's measure_compression takes ~20 s per quant row and chunk).
# Output: build/results/peers/{peers.md,csv,json}; `peers.py --report peers.json` regroups it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
bash "$E8KV_ROOT/scripts/setup.sh"
bash "$E8KV_ROOT/scripts/fetch-data.sh" >&2
E8KV_TARGETS=(e8kv_c e8kv-llama)
configure_and_build -DE8KV_BUILD_EXAMPLES=ON
venv="$(bash "$E8KV_ROOT/scripts/python-venv.sh")"  # shared with scripts/test-python.sh
out="$E8KV_ROOT/build/results/peers"
mkdir -p "$out"
"$venv/bin/python" "$E8KV_ROOT/bench/peers/peers.py" --lib "$E8KV_BUILD/libe8kv_c.so" \
  --tokenizer "$E8KV_BUILD/examples/llama/e8kv-llama" --out "$out" "$@"
echo "peers: $out/peers.md  $out/peers.csv  $out/peers.json"
