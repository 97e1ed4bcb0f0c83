#!/usr/bin/env bash
# The memory table of docs/accuracy.md ("Python and transformers"): one process per row.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${PYTHON:-python3}"
out="${1:-$here/../../build/results/python/memory.jsonl}"
: > "$out"
for row in dynamic e8kv:quant-k3v2 e8kv:tier-k3v2 e8kv:quant-k2v2 quanto4 quanto2 nexusquant3; do
  "$py" "$here/hf_bench.py" memory --row "$row" 2>/dev/null | tail -1 | tee -a "$out"
done
