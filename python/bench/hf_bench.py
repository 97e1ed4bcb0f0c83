#!/usr/bin/env python3
"""e8kv.hf against transformers' own caches on SmolLM2-135M (loaded by transformers from the
project's GGUF, fp32, CPU). One row per process for memory (peak RSS is per process).

  hf_bench.py greedy  --tokens 1023 --new 128 --chunks 2      lossless greedy == DynamicCache?
  hf_bench.py memory  --row e8kv:quant-k3v2                   KL + bytes + peak RSS generating 4K
  hf_bench.py speed   --ctx 4096 --rows dynamic,e8kv:quant-k3v2 --steps 32
  hf_bench.py kl      --model qwen2.5-coder-0.5b --rows quanto4,e8kv:quant-k3v2   KL + bytes per row

--model picks a GGUF of scripts/fetch-model.sh (smollm2, the default; gemma3; qwen2.5-coder-0.5b).

Rows: dynamic (DynamicCache), e8kv:PRESET (e8kv.hf.compress), quanto2 / quanto4 / hqq2 / hqq4
(transformers' QuantizedCache, optimum-quanto / HQQ backend, q_group_size 64, residual 128), nexusquant3 (NexusQuant's
`with nexusquant(model, bits=3)`, its own package).

KL protocol (per chunk, 2 chunks: tech.txt then fiction.txt, HF tokenizer of the GGUF): prefill
1,023 tokens into the row's cache, then feed the next 128 tokens one at a time through it (every
row codes as it decodes, as its own code does), KL(DynamicCache ‖ row) of the next-token
distributions over those 128 predictions.
Memory protocol (first, in a fresh process): prompt = the first 3,584 tokens of tech.txt, generate
512 tokens greedily (4,095 in the cache at the end): the prefill through the row's cache first, then, with its dense
activations freed (gc, malloc_trim) and the peak RSS reset (clear_refs), generate; cache bytes =
what the row's cache object holds at the end (tensors, codes, scales; e8kv: Cache.nbytes); peak
RSS while decoding = VmHWM since the reset, beside the RSS at the reset (model, tokenizer,
runtime, the prefilled cache).
"""
import argparse
import contextlib
import json
import os
import resource
import statistics
import sys
import time

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

CACHE = os.environ.get("E8KV_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "e8kv")
MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf",
          "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"}
MODEL = os.path.join(CACHE, "models", MODELS["smollm2"])
TEXTS = [os.path.join(CACHE, "text", "tech.txt"), os.path.join(CACHE, "text", "fiction.txt")]


def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def reset_peak_rss():
    """Linux: writing 5 to clear_refs resets the process's peak RSS (VmHWM) to its current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmHWM in /proc/self/status")


def load():
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d, f = os.path.dirname(MODEL), os.path.basename(MODEL)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    return model, tok


def tokens(tok, path, n):
    with open(path) as f:
        text = f.read(n * 12)
    ids = tok(text, return_tensors="pt").input_ids[:, :n]
    assert ids.shape[1] == n, (path, ids.shape)
    return ids


def tensor_bytes(obj, seen=None):
    """Bytes of every tensor an object holds (quanto's wrapper tensors through __tensor_flatten__)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if hasattr(obj, "__tensor_flatten__") and type(obj) is not torch.Tensor:
            names, _ = obj.__tensor_flatten__()
            return sum(tensor_bytes(getattr(obj, n), seen) for n in names)
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(x, seen) for x in obj)
    if isinstance(obj, dict):
        return sum(tensor_bytes(x, seen) for x in obj.values())
    if hasattr(obj, "__dict__") and type(obj).__module__.startswith(("transformers", "optimum")):
        return sum(tensor_bytes(x, seen) for x in vars(obj).values())
    return 0


@contextlib.contextmanager
def row_context(model, row):
    """(cache to pass or None, handle) for the row."""
    from transformers import DynamicCache, QuantizedCache
    if row == "dynamic":
        yield lambda: DynamicCache(config=model.config)
    elif row.startswith("e8kv:"):
        import e8kv.hf
        with e8kv.hf.compress(model, preset=row[5:], threads=torch.get_num_threads()):
            yield lambda: None  # the context installs an E8Cache for each new sequence
    elif row.startswith(("quanto", "hqq")):
        backend = "quanto" if row.startswith("quanto") else "hqq"
        nbits = int(row[len(backend):])
        yield lambda: QuantizedCache(backend=backend, config=model.config, nbits=nbits)
    elif row == "nexusquant3":
        import nexusquant
        theta = float((getattr(model.config, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
        with nexusquant.nexusquant(model, mode="simple", bits=3, rope_base=theta, verbose=False):
            yield lambda: DynamicCache(config=model.config)
    else:
        raise SystemExit(f"unknown row {row}")


def decode_logits(model, make_cache, ids, prefill):
    """Prefill ids[:, :prefill], then feed the rest one token at a time; logits of those steps."""
    cache = make_cache()
    with torch.no_grad():
        out = model(ids[:, :prefill], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logits = []
        for t in range(prefill, ids.shape[1]):
            out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits.append(out.logits[0, -1].float())
    return torch.stack(logits), cache


def kl_of(model, tok, row, ctx=1024, cont=128, sizes=None):
    """Mean KL(DynamicCache ‖ row) over both texts; `sizes` (a list) receives each chunk's cache
    bytes and bits per element at its end."""
    kls = []
    for path in TEXTS:
        ids = tokens(tok, path, ctx - 1 + cont)
        with row_context(model, "dynamic") as make:
            ref, _ = decode_logits(model, make, ids, ctx - 1)
        with row_context(model, row) as make:
            got, cache = decode_logits(model, make, ids, ctx - 1)
        lr, lg = torch.log_softmax(ref, -1), torch.log_softmax(got, -1)
        kls.append(float((lr.exp() * (lr - lg)).sum(-1).clamp(min=0).mean()))
        if sizes is not None:
            s = model.config
            head_dim = getattr(s, "head_dim", None) or s.hidden_size // s.num_attention_heads
            elements = (ids.shape[1] - 1) * 2 * s.num_hidden_layers * s.num_key_value_heads * head_dim
            nbytes = cache.nbytes if row.startswith("e8kv:") else tensor_bytes(cache)
            sizes.append({"bytes": nbytes, "bits_per_element": 8.0 * nbytes / elements})
    return sum(kls) / len(kls), kls


def cmd_kl(a):
    torch.set_num_threads(a.threads)
    model, tok = load()
    for row in a.rows.split(","):
        sizes = []
        kl, chunks = kl_of(model, tok, row, sizes=sizes)
        print(json.dumps({"model": a.model, "row": row, "kl": kl, "kl_chunks": chunks,
                          "bytes": [x["bytes"] for x in sizes],
                          "bits_per_element": sum(x["bits_per_element"] for x in sizes) / len(sizes)}), flush=True)


def cmd_memory(a):
    torch.set_num_threads(a.threads)
    model, tok = load()
    loaded = rss_mib()
    result = {"row": a.row, "threads": a.threads}
    prompt = tokens(tok, TEXTS[0], a.prompt)
    import ctypes
    import gc
    with row_context(model, a.row) as make:
        cache = make()
        kw = {} if cache is None else {"past_key_values": cache}
        with torch.no_grad():
            t0 = time.time()
            cache = model(prompt[:, :-1], use_cache=True, **kw).past_key_values  # the prefill
            prefill_seconds = time.time() - t0
            # The decode phase alone: the prefill's dense activations freed and handed back to the
            # system, then the peak RSS reset (Linux clear_refs), so the peak is what decoding holds.
            gc.collect()
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            reset_peak_rss()
            before = current_rss_mib()
            t0 = time.time()
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), past_key_values=cache,
                                 max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False,
                                 return_dict_in_generate=True)
    seconds = time.time() - t0
    cache = out.past_key_values
    if a.row.startswith("e8kv:"):
        nbytes = cache.nbytes
        result["bits_per_element"] = cache.bits_per_element
    else:
        nbytes = tensor_bytes(cache)
    s = model.config
    head_dim = getattr(s, "head_dim", None) or s.hidden_size // s.num_attention_heads
    fp16 = (a.prompt + a.new - 1) * 2 * s.num_hidden_layers * s.num_key_value_heads * head_dim * 2
    result.update({"tokens_in_cache": cache.get_seq_length(), "cache_bytes": nbytes, "fp16_bytes": fp16,
                   "ratio_vs_fp16": fp16 / nbytes, "peak_rss_at_load_mib": loaded, "prefill_seconds": prefill_seconds, "rss_before_decode_mib": before,
                   "peak_rss_decoding_mib": peak_rss_mib(), "rss_after_decode_mib": current_rss_mib(), "generate_seconds": seconds,
                   "ms_per_token": 1000 * seconds / a.new})
    del out, cache
    if not a.no_kl:
        result["kl"], result["kl_chunks"] = kl_of(model, tok, a.row)
    print(json.dumps(result))


def cmd_speed(a):
    torch.set_num_threads(a.threads)
    model, tok = load()
    text = open(TEXTS[1]).read()
    ids = tok(text[: a.ctx * 8], return_tensors="pt").input_ids[:, : a.ctx + a.steps]
    assert ids.shape[1] == a.ctx + a.steps
    for rep in range(a.repeats):
        for row in a.rows.split(","):
            with row_context(model, row) as make:
                cache = make()
                with torch.no_grad():
                    t0 = time.time()
                    out = model(ids[:, : a.ctx], past_key_values=cache, use_cache=True)
                    prefill = time.time() - t0
                    cache = out.past_key_values
                    times = []
                    for t in range(a.ctx, a.ctx + a.steps):
                        t1 = time.perf_counter()
                        out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
                        times.append(time.perf_counter() - t1)
                        cache = out.past_key_values
            print(json.dumps({"row": row, "ctx": a.ctx, "repeat": rep, "threads": a.threads,
                              "prefill_s": prefill, "median_ms_per_token": 1000 * statistics.median(times),
                              "mean_ms_per_token": 1000 * statistics.mean(times)}), flush=True)
            del cache, out


def cmd_greedy(a):
    torch.set_num_threads(a.threads)
    model, tok = load()
    from transformers import DynamicCache
    import e8kv.hf
    for i in range(a.chunks):
        prompt = tokens(tok, TEXTS[i % 2], a.tokens)
        kw = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False)
        with torch.no_grad():
            ref = model.generate(prompt, past_key_values=DynamicCache(config=model.config), **kw)[0, a.tokens:]
            with e8kv.hf.compress(model, preset="lossless"):
                got = model.generate(prompt, **kw)[0, a.tokens:]
        same = int((ref == got).sum())
        first = next((j for j in range(a.new) if ref[j] != got[j]), None)
        print(json.dumps({"chunk": i, "text": os.path.basename(TEXTS[i % 2]), "prompt": a.tokens, "new": a.new,
                          "equal_tokens": same, "first_difference": first}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("memory")
    m.add_argument("--row", required=True)
    m.add_argument("--prompt", type=int, default=3584)
    m.add_argument("--new", type=int, default=512)
    m.add_argument("--no-kl", action="store_true")
    s = sub.add_parser("speed")
    s.add_argument("--ctx", type=int, default=4096)
    s.add_argument("--rows", default="dynamic,e8kv:quant-k3v2")
    s.add_argument("--steps", type=int, default=32)
    s.add_argument("--repeats", type=int, default=1)
    g = sub.add_parser("greedy")
    g.add_argument("--tokens", type=int, default=1023)
    g.add_argument("--new", type=int, default=128)
    g.add_argument("--chunks", type=int, default=2)
    k = sub.add_parser("kl")
    k.add_argument("--rows", default="quanto4,e8kv:quant-k4v4,e8kv:quant-k3v2,e8kv:tier-k3v2")
    for p in (m, s, g, k):
        p.add_argument("--threads", type=int, default=2)
        p.add_argument("--model", default="smollm2", choices=sorted(MODELS))
    a = ap.parse_args()
    global MODEL
    MODEL = os.path.join(CACHE, "models", MODELS[a.model])
    {"memory": cmd_memory, "speed": cmd_speed, "greedy": cmd_greedy, "kl": cmd_kl}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
