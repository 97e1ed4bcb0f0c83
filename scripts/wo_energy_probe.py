#!/usr/bin/env python3
"""How much could weighting the value codes by the attention output projection W_o win?

The attention output of a KV head's values goes through W_o (one d-column slice per query head),
so a value error e costs |W_o e|² = eᵀ·M·e with M = Σ_g W_gᵀ·W_g over the head's query heads.
The randomized Hadamard makes the quantization error white, so its cost is tr(M)/d per unit of
error energy; a code that shaped its error to M could at best divide that cost by the ratio of
the arithmetic to the geometric mean of
  - the diagonal of M (per-channel scales before the rotation, as query-weighted keys do), or
  - the eigenvalues of M (a per-head transform in place of the rotation's randomness),
the high-rate gain of weighted reverse water-filling. Ratios near 1 mean the lever is empty.

  python3 -m venv /tmp/gg && /tmp/gg/bin/pip install gguf numpy
  /tmp/gg/bin/python scripts/wo_energy_probe.py ~/.cache/e8kv/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import sys

import gguf
import numpy as np


def field(reader, key):
    f = reader.fields[key]
    return f.parts[f.data[0]][0]


def main(path):
    r = gguf.GGUFReader(path)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    n_head = int(field(r, f"{arch}.attention.head_count"))
    n_kv = int(field(r, f"{arch}.attention.head_count_kv"))
    n_layer = int(field(r, f"{arch}.block_count"))
    tensors = {t.name: t for t in r.tensors}
    G = n_head // n_kv
    diag, eig = [], []
    for layer in range(n_layer):
        t = tensors[f"blk.{layer}.attn_output.weight"]
        wo = gguf.quants.dequantize(t.data, t.tensor_type).reshape([int(v) for v in reversed(t.shape)])
        wo = wo.astype(np.float64)  # [n_embd, n_head·d]: column block h·d..(h+1)·d reads query head h
        d = wo.shape[1] // n_head
        for h in range(n_kv):
            M = np.zeros((d, d))
            for g in range(G):
                W = wo[:, (h * G + g) * d:(h * G + g + 1) * d]
                M += W.T @ W
            w = np.diag(M)
            ev = np.maximum(np.linalg.eigvalsh(M), 1e-30)
            diag.append(w.mean() / np.exp(np.log(w).mean()))
            eig.append(ev.mean() / np.exp(np.log(ev).mean()))
    diag = np.array(diag).reshape(n_layer, n_kv)
    eig = np.array(eig).reshape(n_layer, n_kv)
    print(f"{path}: {arch}, {n_layer} layers, {n_head} query heads, {n_kv} KV heads")
    print("AM/GM of diag(M), mean over KV heads, per layer:", " ".join(f"{x:.3f}" for x in diag.mean(axis=1)))
    print("AM/GM of eig(M), mean over KV heads, per layer: ", " ".join(f"{x:.3f}" for x in eig.mean(axis=1)))
    print(f"over all heads: diagonal mean {diag.mean():.3f} (max {diag.max():.3f}), "
          f"eigenvalues mean {eig.mean():.3f} (median {np.median(eig):.3f}, max {eig.max():.3f})")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: wo_energy_probe.py <model.gguf>")
    main(sys.argv[1])
