#!/usr/bin/env python3
"""Compares the engine's logits with a reference implementation from PyPI on real text.

Reference: `transformers` loading the same GGUF file (its GGUF loader dequantizes the weights
with the `gguf` package and undoes llama.cpp's Q/K row permutation), run in fp32 with PyTorch.
The engine is run through its CLI (e8kv-llama --logits), both as one prefill and step by step
through DenseKvBackend (--decode). Reports top-1 agreement, max / mean absolute logit error and
the mean KL divergence of the next-token distributions.

Runs itself inside the project's pinned torch + transformers venv (scripts/python-venv.sh:
${E8KV_CACHE:-~/.cache/e8kv}/peers/venv from bench/peers/requirements.lock, which pins torch,
transformers, gguf, accelerate and numpy; ~6 GB, made on first use). Usage:
  scripts/check_logits.py --bin build/examples/llama/e8kv-llama [--tokens 512] [--text F ...]
Exit status 0 when top-1 agreement is at least 99% on every text."""
import os
import subprocess
import sys
import tempfile

from check_common import engine_arguments, reexec_in_pinned_venv


def engine_logits(binary, model, ids, vocab, decode):
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        ids_path, out_path = os.path.join(tmp, "ids.txt"), os.path.join(tmp, "logits.f32")
        with open(ids_path, "w") as f:
            f.write(" ".join(map(str, ids)))
        cmd = [binary, "--model", model, "--logits", ids_path, "--out", out_path] + (["--decode"] if decode else [])
        subprocess.run(cmd, check=True, capture_output=True)
        return np.fromfile(out_path, dtype="<f4").reshape(len(ids), vocab)


def engine_ids(binary, model, text):
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        out = subprocess.run([binary, "--model", model, "--tokenize-file", path], check=True,
                             capture_output=True).stdout.decode()
    finally:
        os.unlink(path)
    return [int(x) for x in out.split()]


def stats(ours, ref):
    import numpy as np

    top1 = float(np.mean(ours.argmax(-1) == ref.argmax(-1)))
    err = np.abs(ours.astype(np.float64) - ref.astype(np.float64))

    def log_softmax(x):
        x = x.astype(np.float64)
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lr, lo = log_softmax(ref), log_softmax(ours)
    kl = float(np.mean(np.sum(np.exp(lr) * (lr - lo), -1)))
    return top1, float(err.max()), float(err.mean()), kl, float(np.abs(ref).max())


def main():
    reexec_in_pinned_venv()
    ap = engine_arguments(__doc__)
    ap.add_argument("--tokens", type=int, default=512, help="tokens per text (from an offset into it)")
    ap.add_argument("--offset", type=int, default=20000, help="byte offset into each text")
    args = ap.parse_args()

    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    ref_model = AutoModelForCausalLM.from_pretrained(os.path.dirname(args.model),
                                                     gguf_file=os.path.basename(args.model), dtype=torch.float32)
    ref_model.eval()
    vocab = ref_model.config.vocab_size
    print(f"[check_logits] reference: transformers {__import__('transformers').__version__}, torch {torch.__version__}, "
          f"{type(ref_model).__name__}, vocab {vocab}, rope "
          f"{getattr(ref_model.config, 'rope_parameters', None) or getattr(ref_model.config, 'rope_theta', None)}")

    worst_top1 = 1.0
    for path in args.text:
        if not os.path.exists(path):
            print(f"[check_logits] {path} is absent (scripts/fetch-text.sh fetches it); skipped")
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()[args.offset:args.offset + 16 * args.tokens]
        ids = engine_ids(args.bin, args.model, text)[:args.tokens]
        with torch.no_grad():
            ref = ref_model(torch.tensor([ids])).logits[0].float().numpy()
        for mode, decode in (("prefill", False), ("decode", True)):
            ours = engine_logits(args.bin, args.model, ids, vocab, decode)
            top1, max_err, mean_err, kl, scale = stats(ours, ref)
            worst_top1 = min(worst_top1, top1)
            print(f"  {os.path.basename(path)} [{mode}] {len(ids)} tokens: top-1 agreement {100 * top1:.2f}%, "
                  f"max |Δlogit| {max_err:.3e}, mean |Δlogit| {mean_err:.3e} (max |logit| {scale:.1f}), "
                  f"mean KL(ref || engine) {kl:.3e} nats")
        # Next-token negative log-likelihood on this window, both sides (sanity).
        nll = lambda lg: float(np.mean([-(lg[i] - np.log(np.exp(lg[i] - lg[i].max()).sum()) - lg[i].max())[ids[i + 1]]
                                        for i in range(len(ids) - 1)]))
        print(f"  {os.path.basename(path)}: perplexity on the window: reference {np.exp(nll(ref.astype(np.float64))):.3f}, "
              f"engine {np.exp(nll(ours.astype(np.float64))):.3f}")
    print(f"check_logits: worst top-1 agreement {100 * worst_top1:.2f}% (target >= 99%)")
    return 0 if worst_top1 >= 0.99 else 1


if __name__ == "__main__":
    sys.exit(main())
