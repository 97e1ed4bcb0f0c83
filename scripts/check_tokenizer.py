#!/usr/bin/env python3
"""Compares the token ids of the engine's tokenizer (e8kv-llama --tokenize-file) with reference
tokenizers from PyPI on the corpus and on hand-made edge cases.

References:
  hf-tokenizers  `tokenizers` BPE built from the GGUF's vocabulary and merges with SmolLM2's
                 pre-tokenizer (Digits(individual_digits=True) then ByteLevel, no prefix space),
                 the pipeline of HuggingFaceTB/SmolLM2's tokenizer.json.
  transformers   `transformers` loading the tokenizer from the same GGUF file (its own GGUF
                 converter); reported, and a mismatch there is informative only when the first
                 reference agrees (its converter may not know the "smollm" pre-tokenizer).

Runs itself inside the project's pinned torch + transformers venv (scripts/python-venv.sh:
${E8KV_CACHE:-~/.cache/e8kv}/peers/venv from bench/peers/requirements.lock, which pins gguf,
tokenizers and transformers; ~6 GB, made on first use). Usage:
  scripts/check_tokenizer.py --bin build/examples/llama/e8kv-llama [--model F] [--text F ...]
Exit status 0 when every sample matches the hf-tokenizers reference exactly."""
import os
import subprocess
import sys
import tempfile

from check_common import engine_arguments, reexec_in_pinned_venv


EDGE_CASES = [
    "Hello world! It's 2024, isn't it?  The   end.",
    "I'm sure they'll say we'd've done it; you're right, THEY'RE wrong, it'S fine.",
    "Numbers: 3.14159, 1,000,000 and 2nd place; ٣ (Arabic-Indic) and Ⅻ (Roman numeral).",
    "tabs\tand\t\tnewlines\n\n\nand CRLF\r\nline  \n   indented\n\t\tmixed \u00a0nbsp\u2003em space",
    "trailing spaces   ",
    "   leading spaces",
    "Unicode: naïve café, Ünïcödé, Ελληνικά, русский, 日本語のテキスト, 한국어, עברית, العربية.",
    "Emoji 😀👍🏽 and symbols ∑∫√ ≠ ≤ → ← © ® ™ — – … «quotes» “curly” ‘single’",
    "code: for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; } // comment\n$ ls -la | grep '^d'",
    "URL https://example.com/path?a=1&b=2#frag and email someone@example.org",
    "a" * 300 + " " + "=" * 120 + " " + "ab" * 100,
    "'s 's 'S ''s '''' ' '",
    "\n",
    " ",
    "x",
]

SPECIAL_CASES = [
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text <|im_end|><|im_start|>",
]


def load_vocab(model):
    import gguf

    reader = gguf.GGUFReader(model)

    def strings(key):
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = strings("tokenizer.ggml.merges")
    field = reader.fields["tokenizer.ggml.token_type"]
    types = [int(field.parts[i][0]) for i in field.data]
    pre = bytes(reader.fields["tokenizer.ggml.pre"].parts[-1]).decode()
    return tokens, merges, types, pre


def hf_tokenizers_reference(model):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens, merges, types, pre = load_vocab(model)
    if pre != "smollm":
        print(f"[check_tokenizer] note: tokenizer.ggml.pre is '{pre}', the reference is SmolLM2's pipeline")
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty in (3, 4)]
    tok.add_special_tokens(specials)
    return lambda text, special: tok.encode(text, add_special_tokens=False).ids if special else \
        tok.encode(text, add_special_tokens=False, is_pretokenized=False).ids


def transformers_reference(model):
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(os.path.dirname(model), gguf_file=os.path.basename(model))
        return lambda text, special: tok.encode(text, add_special_tokens=False)
    except Exception as e:  # noqa: BLE001 - report and continue with the first reference
        print(f"[check_tokenizer] transformers GGUF tokenizer unavailable: {type(e).__name__}: {e}")
        return None


def engine_ids(binary, model, text, special):
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        cmd = [binary, "--model", model, "--tokenize-file", path] + (["--special"] if special else [])
        out = subprocess.run(cmd, check=True, capture_output=True).stdout.decode()
    finally:
        os.unlink(path)
    return [int(x) for x in out.split()]


def compare(name, ours, ref, text, decode):
    if ours == ref:
        return True
    i = next((k for k in range(min(len(ours), len(ref))) if ours[k] != ref[k]), min(len(ours), len(ref)))
    ctx = decode(ref[max(0, i - 5):i + 5])
    print(f"  MISMATCH {name}: first difference at token {i} (engine {ours[i:i + 5]}, reference {ref[i:i + 5]}); "
          f"reference context {ctx!r}")
    return False


def main():
    reexec_in_pinned_venv()
    ap = engine_arguments(__doc__)
    args = ap.parse_args()

    ref = hf_tokenizers_reference(args.model)
    trf = transformers_reference(args.model)
    from tokenizers import Tokenizer  # noqa: F401 (ensures the venv is complete)

    samples = [(f"edge case {k}", t, False) for k, t in enumerate(EDGE_CASES)]
    samples += [(f"special case {k}", t, True) for k, t in enumerate(SPECIAL_CASES)]
    for path in args.text:
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                samples.append((os.path.basename(path), f.read(), False))
        else:
            print(f"[check_tokenizer] {path} is absent (scripts/fetch-text.sh fetches it); skipped")

    tokens, _, _, _ = load_vocab(args.model)

    def decode(ids):
        return "".join(tokens[i] for i in ids)

    ok_ref = ok_trf = 0
    total_tokens = 0
    for name, text, special in samples:
        ours = engine_ids(args.bin, args.model, text, special)
        r = ref(text, special)
        total_tokens += len(r)
        good = compare(name + " vs hf-tokenizers", ours, r, text, decode)
        ok_ref += good
        if trf is not None:
            ok_trf += compare(name + " vs transformers", ours, trf(text, special), text, decode)
        print(f"  {name}: {len(text.encode())} bytes, {len(ours)} tokens, "
              f"{'identical' if good else 'DIFFERENT'} ids vs hf-tokenizers")
    print(f"check_tokenizer: {ok_ref}/{len(samples)} samples identical to hf-tokenizers ({total_tokens} tokens)"
          + (f"; {ok_trf}/{len(samples)} identical to transformers' GGUF tokenizer" if trf is not None else ""))
    return 0 if ok_ref == len(samples) else 1


if __name__ == "__main__":
    sys.exit(main())
