#!/usr/bin/env python3
"""Peer harness: e8kv (through its Python package, python/src: ctypes over its C ABI), NVIDIA
kvpress and NexusQuant's own package, each run from its own code on the same model, the same
token ids and the same protocol.

Protocol ("at rest", one for every row), per chunk of C + T tokens of a corpus:
  1. prefill the first C - 1 tokens with Hugging Face transformers (SmolLM2-135M loaded from the
     project's GGUF, fp32), keeping the untouched cache and the last 32 post-RoPE queries of every
     layer (e8kv's observation window);
  2. transform the cache once: e8kv compresses it (e8kv.Compressor.compress, then
     Cache.decompress gives the dense rows and the -inf mask of evicted tokens); NexusQuant's
     entry points rewrite it; a kvpress press prunes it during its own prefill (its hooks run
     inside the forward pass, so a press row prefills again with the press active);
  3. teacher-force the next T tokens in one forward pass over the transformed cache (those T
     tokens stay full precision, in every row) and score predictions of tokens C .. C + T - 1.
The scored tokens are those of e8kv-eval's chunks (same corpora, same slicing, e8kv's tokenizer
ids from `e8kv-llama --tokenize-file`). e8kv-eval's default protocol differs (it codes the
continuation tokens too); `e8kv-eval --at-rest` runs this one in e8kv's own engine. KL is KL(untouched ‖ row) of next-token distributions, averaged over the scored tokens;
dPPL is the change of continuation perplexity against the untouched cache with a 95 % interval
from the per-chunk paired differences (t with chunks - 1 degrees of freedom).

Attention is one function for every row (registered with transformers as "e8kv_peer"): eager
softmax attention in fp32, causal among the new tokens, with an additive per-KV-head bias over the
cached prefix where a row masks tokens (e8kv's per-head eviction: -inf; NexusQuant's 0/1 prefix
mask: -inf where 0). kvpress removes tokens, so its rows need no bias. Positions of the new tokens
are passed explicitly, so removed tokens do not shift RoPE.

Bits per element (K and V of every prefill token, fp16 = 16):
  e8kv      Cache.bits_per_element (e8kv_cache_bits_per_element): codes, gains, means,
            positions, fp16 window and sinks, descriptor; what a decoder needs.
  kvpress   16 x kept / original (kept rows in fp16; kvpress stores no positions, RoPE'd keys
            carry them).
  NexusQuant  "stored": what its cache holds after its call (dequantized fp16 rows of every
            token, evicted ones zeroed but kept): 16. "claimed": its own accounting,
            nexusquant.core.compression_accounting.measure_compression on this cache (E8
            coordinates through temporal delta + zstd-22 plus fp16 per-vector scales; K and V at
            one bit width per call, so a KxVy row shows the mean of its two calls), eviction
            presets: its documented ratio. Neither is a fixed-rate index.

Usage (scripts/peers.sh sets up the environment and calls this):
  peers.py --lib build/x/libe8kv_c.so --tokenizer build/x/examples/llama/e8kv-llama --out DIR
           [--ctx 1024] [--cont 128] [--chunks 8] [--only SUBSTRING,...]
e8kv is the package of this checkout (python/src, put first on sys.path); it loads the library
that --lib names (through E8KV_LIBRARY, which the package reads).
"""
import argparse
import contextlib
import csv
import json
import math
import os
import subprocess
import sys
import time

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# torch (the peers' venv) and e8kv are imported by main() once the arguments are parsed, so that
# --help and --report run under any Python 3.
torch = None
PACKAGE_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "src")

OBS_WINDOW = 32   # e8kv's default observation window (e8kv-eval's too)
CAPTURE = 64      # queries captured per layer: a row whose spec sets window=64 gets all of them
RATES = (0.35, 0.60, 0.80)
# NexusQuant's eviction presets as its documentation states them (nexusquant/integrations/
# huggingface.py, _EVICT_PRESETS comments and nexusquant_evict's docstring): compression ratios
# against fp16, shown as 16 / ratio in the "claimed" column.
NQ_DOCUMENTED_RATIO = {"high": 9.0, "balanced": 17.0, "max": 33.0, "asym": 14.0}


# ---- one attention for every row ------------------------------------------------------------

class AttentionState:
    bias = None      # per layer: [kv_heads, prefix] additive bias over the cached prefix, or None
    capture = None   # dict layer -> [window, q_heads, d] post-RoPE queries of the prefill's end
    decode = None    # (e8kv Cache, position): one decoded token appended to and attended on the codes


STATE = AttentionState()


def peer_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """query [b, Hq, q, d]; key, value [b, Hkv, k, d] (the cache after this step's update)."""
    b, hq, q_len, d = query.shape
    hkv, k_len = key.shape[1], key.shape[2]
    groups = hq // hkv
    layer = module.layer_idx
    if STATE.decode is not None:
        # The e8kv protocol: transformers' own cache is empty at each step, so key/value are the
        # new token's; e8kv appends them (its window, flushed into codes) and attends over
        # everything it stores, reading the codes (e8kv_attend).
        assert b == 1 and q_len == 1 and k_len == 1, (b, q_len, k_len)
        cache, position = STATE.decode
        cache.append(layer, key[0, :, 0, :], value[0, :, 0, :], position)
        out = torch.from_numpy(cache.attend(layer, query[0, :, 0, :], position))
        return out[None, None].to(query.dtype), None
    if STATE.capture is not None:
        STATE.capture[layer] = query[0, :, -CAPTURE:, :].permute(1, 0, 2).float().contiguous()
    q = query.float().reshape(b, hkv, groups * q_len, d)
    s = torch.matmul(q, key.float().transpose(2, 3)) * scaling  # [b, hkv, groups*q, k]
    s = s.view(b, hkv, groups, q_len, k_len)
    prefix = k_len - q_len
    causal = torch.ones(q_len, q_len, dtype=torch.bool).triu(1)
    s[..., prefix:].masked_fill_(causal, float("-inf"))
    if prefix > 0 and STATE.bias is not None and STATE.bias[layer] is not None:
        bias = STATE.bias[layer]
        assert bias.shape == (hkv, prefix), (bias.shape, hkv, prefix)
        s[..., :prefix] += bias[None, :, None, None, :]
    p = torch.softmax(s, dim=-1).view(b, hkv, groups * q_len, k_len)
    out = torch.matmul(p, value.float()).view(b, hq, q_len, d)
    return out.transpose(1, 2).contiguous().to(query.dtype), None


# ---- helpers ----------------------------------------------------------------------------------

def tokenize(binary, model, path):
    out = subprocess.run([binary, "--model", model, "--tokenize-file", path], check=True,
                         capture_output=True).stdout.decode()
    return [int(x) for x in out.split()]


def clone_cache(cache):
    from transformers import DynamicCache
    c = DynamicCache()
    for i, layer in enumerate(cache.layers):
        c.update(layer.keys.clone(), layer.values.clone(), i)
    return c


def set_layer(cache, layer, keys, values):
    cache.layers[layer].keys = keys
    cache.layers[layer].values = values


def continuation_logits(model, cache, cont_ids, first_position, bias):
    STATE.bias = bias
    try:
        ids = torch.tensor([cont_ids])
        pos = torch.arange(first_position, first_position + len(cont_ids))[None]
        with torch.no_grad():
            out = model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
        return out.logits[0].float()
    finally:
        STATE.bias = None


def score(logits, ref_logp, targets):
    logp = torch.log_softmax(logits, dim=-1)
    kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1).clamp(min=0)
    nll = -logp[torch.arange(len(targets)), torch.tensor(targets)]
    top1 = (logits.argmax(-1) == ref_logp.argmax(-1)).float()
    return float(kl.sum()), float(nll.sum()), float(top1.sum())


# ---- rows -------------------------------------------------------------------------------------

class Row:
    def __init__(self, name, peer, kind, note=""):
        self.name, self.peer, self.kind, self.note = name, peer, kind, note
        self.kl = self.nll = self.top1 = self.tokens = 0.0
        self.chunk_nll = []
        self.chunk_kl = []    # mean KL of each chunk
        self.bits = []        # honest bits per element (e8kv, kvpress); NexusQuant: stored
        self.claimed = []     # NexusQuant's own figure
        self.container = []   # e8kv: its offload container (delta + zstd), bits per element
        self.kept = []        # kept fraction of prefill tokens (mean over layers and KV heads)
        self.seconds = 0.0
        self.error = None


def e8kv_compress(ctx, spec, at_rest):
    """The untouched prefill cache compressed by the e8kv package: (e8kv.Cache, shape). At rest (the
    continuation stays dense) a spec without `residual` codes the prefill's last tokens too, as
    Config::parse_at_rest does for e8kv-eval --at-rest and the llama.cpp state tools."""
    if at_rest and "residual=" not in spec:
        spec = f"{spec},residual=0"
    import e8kv
    from e8kv.model_spec import model_shape, rope_theta_field
    shape = model_shape(ctx["config"])
    ref = ctx["ref_cache"]
    keys = [l.keys[0].permute(1, 0, 2) for l in ref.layers]      # [tokens, kv_heads, d]
    values = [l.values[0].permute(1, 0, 2) for l in ref.layers]
    window = 64 if "window=64" in spec else OBS_WINDOW
    queries = [ctx["queries"][i][-window:] for i in range(shape[0])]
    full = f"{spec},{rope_theta_field(ctx['rope_theta'])}"
    # No pool: the calling thread does the work (results never depend on the pool).
    return e8kv.Compressor(shape, full).compress(keys, values, queries), shape


def e8kv_decode_row(ctx, spec, model, cont, first_position):
    """The e8kv protocol through the package's Cache (peer_attention calls Cache.append and
    Cache.attend): the prefill compressed, then every continuation token decoded one at a time,
    appended to the cache and attended over its codes. Returns (logits, bits at the end of the
    chunk, the compressor's full spec)."""
    from transformers import DynamicCache
    c, _ = e8kv_compress(ctx, spec, at_rest=False)
    logits = []
    try:
        for t, token in enumerate(cont):
            STATE.decode = (c, first_position + t)
            with torch.no_grad():
                out = model(input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[first_position + t]]),
                            past_key_values=DynamicCache(), use_cache=True)
            logits.append(out.logits[0, -1].float())
    finally:
        STATE.decode = None
    return torch.stack(logits), c.bits_per_element, c.compressor.spec


def e8kv_hf_row(ctx, preset, model, cont):
    """The same protocol through the package's transformers integration (e8kv.hf): `with
    e8kv.hf.compress`, the prefill in one forward pass (compressed with its last 32 queries), then the continuation
    in one multi-token forward pass, which the package feeds token by token through the codes
    (exact decode semantics). Returns (logits, bits at the end of the chunk, spec)."""
    import e8kv.hf
    with torch.no_grad(), e8kv.hf.compress(model, preset=preset) as handle:
        model(input_ids=torch.tensor([ctx["prompt"]]), use_cache=True)
        cache = handle.cache
        out = model(input_ids=torch.tensor([cont]), past_key_values=cache, use_cache=True)
    logits = out.logits[0].float()
    bits, spec = cache.bits_per_element, cache.spec
    cache.close()
    return logits, bits, spec


def e8kv_row(ctx, spec):
    """Compresses the untouched prefill cache with the e8kv package and returns (cache, bias, bits,
    kept, the compressor's full spec, container bits)."""
    c, shape = e8kv_compress(ctx, spec, at_rest=True)
    ref = ctx["ref_cache"]
    from transformers import DynamicCache
    n = ref.layers[0].keys.shape[2]
    out, bias, kept = DynamicCache(), [], []
    for layer in range(shape[0]):
        pos, k, v, mask = (torch.from_numpy(a) for a in c.decompress(layer))
        # rows at every position 0 .. n-1 (the layer's extent can be shorter when every head
        # evicted the first or last positions: fill those as masked)
        kf = torch.zeros(n, shape[1], shape[3])
        vf = torch.zeros(n, shape[1], shape[3])
        mf = torch.full((shape[1], n), float("-inf"))
        idx = pos.long()
        kf[idx], vf[idx], mf[:, idx] = k, v, mask
        out.update(kf.permute(1, 0, 2)[None].contiguous(), vf.permute(1, 0, 2)[None].contiguous(), layer)
        bias.append(mf if bool(torch.isinf(mf).any()) else None)
        kept.append(float(torch.isfinite(mf).float().mean()))
    elements = 2.0 * shape[0] * shape[1] * shape[3] * n
    container = 8.0 * c.serialized_size() / elements
    return out, bias, c.bits_per_element, sum(kept) / len(kept), c.compressor.spec, container


def kvpress_row(ctx, model, press):
    from transformers import DynamicCache
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model(input_ids=torch.tensor([ctx["prompt"]]), past_key_values=cache, use_cache=True)
    n = len(ctx["prompt"])
    kept = [l.keys.shape[2] / n for l in cache.layers]
    k = sum(kept) / len(kept)
    return cache, None, 16.0 * k, k


def nq_measure(cache, bits, head_dim, theta):
    from nexusquant.core.compression_accounting import measure_compression
    # its DynamicCache branch calls to_legacy_cache, which transformers 5 removed; the legacy
    # tuple it also accepts holds the same tensors
    legacy = tuple((l.keys, l.values) for l in cache.layers)
    r = measure_compression(legacy, bits=bits, head_dim=head_dim, rope_base=theta)
    return float(r["bits_per_dim"])


def stored_bits(cache, n_tokens):
    """What a NexusQuant cache holds, at fp16 width: 16 x rows kept / prefill tokens (it writes
    dequantized rows back and zeroes evicted ones without removing them unless truncate=True)."""
    rows = sum(l.keys.shape[2] for l in cache.layers) / len(cache.layers)
    return 16.0 * rows / n_tokens


def nexusquant_quant_row(ctx, key_bits, value_bits):
    from nexusquant import compress_kv_cache
    ref = ctx["ref_cache"]
    c = clone_cache(ref)
    compress_kv_cache(c, mode="quant_only", head_dim=ctx["head_dim"], key_bits=key_bits, value_bits=value_bits,
                      rope_base=ctx["rope_theta"])
    stored = stored_bits(c, len(ctx["prompt"]))
    for i, l in enumerate(c.layers):
        set_layer(c, i, l.keys.float(), l.values.float())
    claimed = 0.5 * (nq_measure(ref, key_bits, ctx["head_dim"], ctx["rope_theta"]) +
                     nq_measure(ref, value_bits, ctx["head_dim"], ctx["rope_theta"]))
    return c, None, stored, 1.0, claimed


def prefix_mask_bias(mask, n_kv_heads, n_layers):
    """NexusQuant's 0/1 prefix mask (batch, tokens), one kept set for every layer and head, as the
    attention's per-layer bias (0 kept, -inf evicted), and the kept fraction."""
    m = mask[0].float()
    row = torch.where(m > 0, torch.zeros_like(m), torch.full_like(m, float("-inf")))
    bias = row[None].expand(n_kv_heads, -1).contiguous()
    return [bias] * n_layers, float(m.mean())


def nexusquant_evict_row(ctx, preset):
    from nexusquant import NexusQuantEvict
    from nexusquant.integrations.huggingface import _EVICT_PRESETS
    p = dict(_EVICT_PRESETS[preset])
    c = clone_cache(ctx["ref_cache"])
    nq = NexusQuantEvict(head_dim=ctx["head_dim"], bits=p["bits"], key_bits=p.get("key_bits"),
                         eviction_rate=p["eviction_rate"], rope_base=ctx["rope_theta"])
    c, mask = nq.compress(c)
    stored = stored_bits(c, len(ctx["prompt"]))
    for i, l in enumerate(c.layers):
        set_layer(c, i, l.keys.float(), l.values.float())
    bias, kept = prefix_mask_bias(mask, ctx["config"].num_key_value_heads, len(c.layers))
    return c, bias, stored, kept


def nexusquant_context_row(ctx, model, kind, arg):
    """NexusQuant's documented usage: its context manager around the prefill (its hooks rewrite
    each layer's cache update, so the prefill's own attention reads the rewritten K/V); the
    continuation runs outside it (inside, a 128-token teacher-forced pass would be compressed as
    a prefill)."""
    import nexusquant
    from transformers import DynamicCache
    cache = DynamicCache()
    ids = torch.tensor([ctx["prompt"]])
    if kind == "simple":
        cm = nexusquant.nexusquant(model, mode="simple", bits=arg, rope_base=ctx["rope_theta"], verbose=False)
    elif kind == "evict":
        cm = nexusquant.nexusquant_evict(model, quality=arg, verbose=False)  # RoPE from the model's config
    elif kind == "none":
        cm = contextlib.nullcontext()
    else:
        raise ValueError(kind)
    with torch.no_grad(), cm as handle:
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    stored = stored_bits(cache, len(ctx["prompt"]))
    bias, kept = None, 1.0
    if kind == "evict":
        mask = getattr(handle, "last_mask", None)
        if mask is None:
            raise RuntimeError("nexusquant_evict's handle has no last_mask after the prefill")
        n = cache.layers[0].keys.shape[2]
        if mask.shape[-1] != n:
            raise RuntimeError(f"last_mask covers {mask.shape[-1]} tokens, the cache holds {n}")
        bias, kept = prefix_mask_bias(mask, ctx["config"].num_key_value_heads, len(cache.layers))
    return cache, bias, stored, kept


def load_model(path, dtype):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path), dtype=dtype,
                                             attn_implementation="e8kv_peer")
    return m.eval()


# ---- main -------------------------------------------------------------------------------------

class Progress:
    """Progress on stderr, fit for a terminal and for a log (as bench/common/progress.hpp): a bar
    redrawn in place only when stderr is a terminal; otherwise one line per finished chunk with
    i/N, the elapsed time and an estimate of the time left; nothing with --quiet."""

    def __init__(self, total, quiet):
        self.total, self.done, self.start = total, 0, time.time()
        self.mode = "quiet" if quiet else ("bar" if sys.stderr.isatty() else "lines")
        self.last_draw, self.drawn = 0.0, False

    def _eta(self, frac):
        if frac <= 0 or frac >= 1:
            return ""
        return f", about {(time.time() - self.start) * (1 - frac) / frac:.0f} s left"

    def update(self, what, within):
        if self.mode != "bar" or (self.drawn and time.time() - self.last_draw < 0.125):
            return
        self.last_draw, self.drawn = time.time(), True
        frac = min(1.0, (self.done + max(0.0, min(1.0, within))) / max(1, self.total))
        filled = int(frac * 30)
        sys.stderr.write(f"\r[peers] {what[:26]:26s} [{'#' * filled}{'.' * (30 - filled)}] "
                         f"{min(self.done + 1, self.total)}/{self.total} {time.time() - self.start:5.0f} s"
                         f"{self._eta(frac):22s}")
        sys.stderr.flush()

    def unit_done(self, what):
        self.done += 1
        if self.mode == "lines":
            frac = self.done / max(1, self.total)
            print(f"[peers] {self.done}/{self.total} {what}: {time.time() - self.start:.0f} s elapsed"
                  f"{self._eta(frac)}", file=sys.stderr, flush=True)
        elif self.mode == "bar":
            self.drawn = False
            self.update(what, 0.0)

    def finish(self):
        if self.mode == "bar" and self.drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()
        self.drawn = False

    def log(self, text):
        """A detail line (per row): printed unless --quiet, never garbled by the bar."""
        if self.mode == "quiet":
            return
        if self.mode == "bar":
            self.finish()
        print(text, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cache_dir = os.environ.get("E8KV_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "e8kv")
    ap.add_argument("--lib", help="libe8kv_c.so (the e8kv package loads it: E8KV_LIBRARY is set to it)")
    ap.add_argument("--tokenizer", help="the e8kv-llama binary (its --tokenize-file)")
    ap.add_argument("--model", default=os.path.join(cache_dir, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--text", nargs="*", default=[os.path.join(cache_dir, "text", "tech.txt"),
                                                 os.path.join(cache_dir, "text", "fiction.txt")])
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--cont", type=int, default=128)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    ap.add_argument("--only", default="", help="comma-separated substrings of row names to run")
    ap.add_argument("--e8kv", action="append", default=[], metavar="NAME=SPEC",
                    help="an extra e8kv row (Config::parse spec, e.g. 'w64=preset=lossless,evict=0.35,window=64'); "
                         "eviction-only when the spec says preset=lossless")
    ap.add_argument("--out", required=True, help="output directory (peers.md, peers.csv, peers.json)")
    ap.add_argument("--report", metavar="JSON", help="only rewrite OUT/peers.md from a peers.json")
    ap.add_argument("--quiet", action="store_true",
                    help="no progress (a bar on a terminal, else one line per chunk) and no per-row lines")
    a = ap.parse_args()
    if a.report:
        with open(a.report) as f:
            data = json.load(f)
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "peers.md"), "w") as f:
            f.write(markdown(data["meta"], data["rows"]))
        return
    if not a.lib or not a.tokenizer:
        ap.error("--lib and --tokenizer are required (except with --report)")
    os.makedirs(a.out, exist_ok=True)
    global torch
    import torch
    # One e8kv for every row: this checkout's package, loading the library --lib names.
    os.environ["E8KV_LIBRARY"] = os.path.abspath(a.lib)
    sys.path.insert(0, PACKAGE_SRC)
    import e8kv
    from e8kv.model_spec import model_shape
    torch.manual_seed(0)
    torch.set_num_threads(a.threads or max(1, os.cpu_count() or 1))

    import importlib.metadata as md
    import kvpress
    from transformers import AttentionInterface, DynamicCache
    AttentionInterface.register("e8kv_peer", peer_attention)

    versions = {p: md.version(p) for p in ("torch", "transformers", "kvpress", "nexusquant-kv", "gguf")}
    versions["e8kv"] = e8kv.library_version()
    t0 = time.time()
    model, model_bf16 = load_model(a.model, torch.float32), None
    cfg = model.config
    head_dim = model_shape(cfg).head_dim
    rope_theta = float((getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 0) or
                       getattr(cfg, "rope_theta", 10000.0))
    print(f"[peers] model loaded in {time.time() - t0:.1f} s: {cfg.num_hidden_layers} layers, "
          f"{cfg.num_key_value_heads} KV heads, head_dim {head_dim}, rope_theta {rope_theta:g}", flush=True)

    rows = []
    for spec_name, spec in [("quant-k3v2", "preset=quant-k3v2"), ("quant-k2v2", "preset=quant-k2v2"),
                            ("quant-k4v4", "preset=quant-k4v4"), ("high", "preset=high"),
                            ("asym", "preset=asym"), ("balanced", "preset=balanced"), ("max", "preset=max"),
                            ("budget=2.5", "preset=quant-k3v2,index_budget=2.5"),
                            ("budget=2.25", "preset=quant-k3v2,index_budget=2.25")]:
        rows.append((Row(f"e8kv {spec_name}", "e8kv", "quant" if "quant" in spec_name or "budget" in spec_name
                         else "evict+quant"),
                     ("e8kv", spec)))
    for r in RATES:
        rows.append((Row(f"e8kv eviction-only {int(r * 100)} % (obs-window)", "e8kv", "evict"),
                     ("e8kv", f"preset=lossless,evict={r}")))
        rows.append((Row(f"e8kv eviction-only {int(r * 100)} % (obs-window, per head)", "e8kv", "evict"),
                     ("e8kv", f"preset=lossless,evict={r},per_head=1")))
        rows.append((Row(f"e8kv eviction-only {int(r * 100)} % (obs-window 64, per head)", "e8kv", "evict"),
                     ("e8kv", f"preset=lossless,evict={r},per_head=1,window=64")))
        rows.append((Row(f"e8kv eviction-only {int(r * 100)} % (key-norm)", "e8kv", "evict"),
                     ("e8kv", f"preset=lossless,evict={r},scorer=key-norm")))
    for press_name in ("ExpectedAttentionPress", "SnapKVPress", "TOVAPress", "StreamingLLMPress", "KnormPress"):
        for r in RATES:
            rows.append((Row(f"kvpress {press_name} {int(r * 100)} %", "kvpress", "evict"),
                         ("kvpress", press_name, r)))
    for kb, vb in ((3, 2), (2, 2), (3, 3), (4, 4)):
        rows.append((Row(f"NexusQuant quant_only K{kb}V{vb}", "nexusquant", "quant"), ("nq-quant", kb, vb)))
    for preset in ("high", "asym", "balanced", "max"):
        rows.append((Row(f"NexusQuant evict '{preset}'", "nexusquant", "evict+quant"), ("nq-evict", preset)))
    for spec_name in ("quant-k3v2", "quant-k2v2", "high"):
        rows.append((Row(f"e8kv {spec_name}, continuation coded (e8kv protocol)", "e8kv", "e8kv protocol"),
                     ("e8kv-decode", f"preset={spec_name}")))
    for spec_name in ("quant-k3v2", "quant-k2v2", "high"):
        rows.append((Row(f"e8kv.hf {spec_name} (Python package), continuation coded", "e8kv", "e8kv protocol"),
                     ("e8kv-hf", spec_name)))
    for b in (3, 2):
        rows.append((Row(f"NexusQuant `with nexusquant(bits={b})` (prefill inside)", "nexusquant", "quant"),
                     ("nq-context", "simple", b)))
    # nexusquant_evict refuses an fp32 model ("requires a float16 or bfloat16 model"): these rows
    # run a bfloat16 copy of the model for prefill and continuation, beside the untouched cache
    # of that copy, which shows what bfloat16 alone costs against the fp32 reference.
    rows.append((Row("bf16 model, untouched cache (floor of the bf16 rows)", "reference", "none"),
                 ("nq-context-bf16", "none", None)))
    for preset in ("high", "balanced"):
        rows.append((Row(f"NexusQuant `with nexusquant_evict('{preset}')` (prefill inside, bf16 model)",
                         "nexusquant", "evict+quant"), ("nq-context-bf16", "evict", preset)))
    for extra in a.e8kv:
        name, eq, spec = extra.partition("=")
        if not eq or not name or not spec:
            ap.error(f"--e8kv wants NAME=SPEC, got {extra!r}")
        kind = "evict" if "preset=lossless" in spec else ("evict+quant" if "evict=" in spec else "quant")
        rows.append((Row(f"e8kv {name}", "e8kv", kind), ("e8kv", spec)))
    if a.only:
        keys = [s.strip() for s in a.only.split(",") if s.strip()]
        rows = [(r, s) for r, s in rows if any(k in r.name for k in keys)]

    corpora = [tokenize(a.tokenizer, a.model, t) for t in a.text]
    C, T = a.ctx, a.cont
    ref_nll = []
    progress = Progress(a.chunks, a.quiet)
    for chunk in range(a.chunks):
        toks = corpora[chunk % len(corpora)]
        slot = chunk // len(corpora)
        per = C + T
        if (slot + 1) * per > len(toks):
            sys.exit(f"corpus {a.text[chunk % len(corpora)]} too short for {a.chunks} chunks of {per} tokens")
        seq = toks[slot * per:(slot + 1) * per]
        prompt, cont, targets = seq[:C - 1], seq[C - 1:C + T - 1], seq[C:C + T]
        t0 = time.time()
        ref_cache = DynamicCache()
        STATE.capture = {}
        with torch.no_grad():
            model(input_ids=torch.tensor([prompt]), past_key_values=ref_cache, use_cache=True)
        queries, STATE.capture = STATE.capture, None
        ctx = {"config": cfg, "head_dim": head_dim, "rope_theta": rope_theta, "ref_cache": ref_cache,
               "queries": queries, "prompt": prompt}
        ref_logits = continuation_logits(model, clone_cache(ref_cache), cont, C - 1, None)
        ref_logp = torch.log_softmax(ref_logits, dim=-1)
        _, nll, _ = score(ref_logits, ref_logp, targets)
        ref_nll.append(nll)
        progress.log(f"[peers] chunk {chunk + 1}/{a.chunks}: reference in {time.time() - t0:.1f} s")
        for row_index, (row, spec) in enumerate(rows):
            progress.update(f"chunk {chunk + 1}/{a.chunks} {row.name}", (row_index + 1) / (len(rows) + 1))
            if row.error:
                continue
            t1 = time.time()
            try:
                claimed, logits = None, None
                if spec[0] == "e8kv-hf":
                    logits, bits, desc = e8kv_hf_row(ctx, spec[1], model, cont)
                    bias, kept, row.note = None, None, desc
                elif spec[0] == "e8kv-decode":
                    logits, bits, desc = e8kv_decode_row(ctx, spec[1], model, cont, C - 1)
                    bias, kept, row.note = None, None, desc  # kept: not measured on this path
                elif spec[0] == "e8kv":
                    cache, bias, bits, kept, desc, container = e8kv_row(ctx, spec[1])
                    row.note = desc
                    row.container.append(container)
                elif spec[0] == "kvpress":
                    press = getattr(kvpress, spec[1])(compression_ratio=spec[2])
                    cache, bias, bits, kept = kvpress_row(ctx, model, press)
                elif spec[0] == "nq-quant":
                    cache, bias, bits, kept, claimed = nexusquant_quant_row(ctx, spec[1], spec[2])
                elif spec[0] in ("nq-context", "nq-context-bf16"):
                    m = model
                    if spec[0] == "nq-context-bf16":
                        if model_bf16 is None:
                            model_bf16 = load_model(a.model, torch.bfloat16)
                        m = model_bf16
                    cache, bias, bits, kept = nexusquant_context_row(ctx, m, spec[1], spec[2])
                    if spec[1] == "evict":
                        claimed = 16.0 / NQ_DOCUMENTED_RATIO[spec[2]]
                else:
                    cache, bias, bits, kept = nexusquant_evict_row(ctx, spec[1])
                    claimed = 16.0 / NQ_DOCUMENTED_RATIO[spec[1]]
                if logits is None:
                    logits = continuation_logits(model_bf16 if spec[0] == "nq-context-bf16" else model,
                                                 cache, cont, C - 1, bias)
            except Exception as e:  # a peer that fails is reported, not hidden
                row.error = f"{type(e).__name__}: {e}"
                progress.finish()
                print(f"[peers] {row.name}: FAILED {row.error}", flush=True)
                continue
            kl, nll, top1 = score(logits, ref_logp, targets)
            row.kl += kl
            row.nll += nll
            row.top1 += top1
            row.tokens += len(targets)
            row.chunk_nll.append(nll)
            row.chunk_kl.append(kl / len(targets))
            row.bits.append(bits)
            if kept is not None:
                row.kept.append(kept)
            if claimed is not None:
                row.claimed.append(claimed)
            row.seconds += time.time() - t1
            kept_text = f"{kept:.3f}" if kept is not None else "-"
            progress.log(f"[peers] chunk {chunk + 1}: {row.name:48s} KL {kl / len(targets):.4f} bits {bits:.3f} "
                         f"kept {kept_text} ({time.time() - t1:.1f} s)")
        progress.unit_done(f"chunk {chunk + 1}/{a.chunks}")
    progress.finish()

    write_outputs(a, rows, ref_nll, versions, C, T)


def t95(n):
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
             10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}
    if n in table:
        return table[n]
    return 1.96 if n > 30 else table[max(k for k in table if k <= n)]


def write_outputs(a, rows, ref_nll, versions, C, T):
    total_ref = sum(ref_nll)
    n_chunks = len(ref_nll)
    results = []
    for row, spec in rows:
        r = {"name": row.name, "peer": row.peer, "kind": row.kind, "note": row.note, "error": row.error}
        if row.tokens and len(row.chunk_nll) == n_chunks:
            ppl_ref = math.exp(total_ref / row.tokens)
            ppl = math.exp(row.nll / row.tokens)
            deltas = [100.0 * (math.exp((c - r0) / T) - 1) for c, r0 in zip(row.chunk_nll, ref_nll)]
            mean = sum(deltas) / len(deltas)
            sd = math.sqrt(sum((d - mean) ** 2 for d in deltas) / max(1, len(deltas) - 1))
            r.update({"kl": row.kl / row.tokens, "top1": row.top1 / row.tokens,
                      "dppl_pct": 100.0 * (ppl / ppl_ref - 1), "dppl_ci95": t95(len(deltas) - 1) * sd /
                      math.sqrt(len(deltas)) if len(deltas) > 1 else float("nan"),
                      "bits": sum(row.bits) / len(row.bits),
                      "kept": sum(row.kept) / len(row.kept) if row.kept else None,
                      "claimed_bits": sum(row.claimed) / len(row.claimed) if row.claimed else None,
                      "container_bits": sum(row.container) / len(row.container) if row.container else None,
                      "chunk_kl": row.chunk_kl, "seconds_per_chunk": row.seconds / n_chunks})
        results.append(r)
    meta = {"versions": versions, "ctx": C, "cont": T, "chunks": n_chunks, "texts": a.text, "model": a.model,
            "command": " ".join(sys.argv)}
    with open(os.path.join(a.out, "peers.json"), "w") as f:
        json.dump({"meta": meta, "rows": results}, f, indent=1)
    with open(os.path.join(a.out, "peers.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "peer", "kind", "bits_per_element", "claimed_bits", "kept", "kl", "top1", "dppl_pct",
                    "dppl_ci95", "error"])
        for r in results:
            w.writerow([r["name"], r["peer"], r["kind"], r.get("bits"), r.get("claimed_bits"), r.get("kept"),
                        r.get("kl"), r.get("top1"), r.get("dppl_pct"), r.get("dppl_ci95"), r.get("error")])
    text = markdown(meta, results)
    with open(os.path.join(a.out, "peers.md"), "w") as f:
        f.write(text)
    print(text)


GROUPS = [("quant", "Quantization only (every token kept)"),
          ("e8kv protocol", "e8kv's protocol: continuation tokens appended and attended through the codes "
           "(e8kv_append, e8kv_attend); bits at the end of the chunk"),
          ("evict", "Eviction only (kept tokens in full precision)"),
          ("evict+quant", "Eviction and quantization"),
          ("none", "Reference rows")]


def markdown(meta, results):
    """The report: one table per kind of row, in the order rows ran."""
    v = meta["versions"]
    lines = [f"Peers at rest: SmolLM2-135M, prefill {meta['ctx'] - 1} tokens, transform the cache once, "
             f"{meta['cont']} teacher-forced tokens scored per chunk, {meta['chunks']} chunks; "
             + ", ".join(f"{k} {v[k]}" for k in v) + ".", "",
             "bits/elem: e8kv = every byte its decoder needs; kvpress = 16 x kept; NexusQuant = what its "
             "cache holds (fp16 rows of every token). container: e8kv's offload container (delta + zstd) "
             "of the same cache. claimed: NexusQuant's own accounting (measure_compression: its E8 "
             "coordinates through delta + zstd-22 plus fp16 scales, a size it never stores; for eviction "
             "presets its documented ratio).", ""]
    for kind, title in GROUPS:
        rs = [r for r in results if r["kind"] == kind]
        if not rs:
            continue
        lines += [f"**{title}**", "",
                  "| row | bits/elem | container | claimed | kept | KL | top-1 | dPPL % (95 % CI) |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rs:
            if r.get("error") or "kl" not in r:
                lines.append(f"| {r['name']} | failed: {r.get('error')} | | | | | | |")
                continue
            claimed = f"{r['claimed_bits']:.3f}" if r.get("claimed_bits") else ""
            container = f"{r['container_bits']:.3f}" if r.get("container_bits") else ""
            kept = f"{r['kept']:.3f}" if r.get("kept") is not None else ""
            lines.append(f"| {r['name']} | {r['bits']:.3f} | {container} | {claimed} | {kept} | {r['kl']:.4f} | "
                         f"{r['top1']:.3f} | {r['dppl_pct']:+.2f} ± {r['dppl_ci95']:.2f} |")
        lines.append("")
    return "\n".join(lines)

if __name__ == "__main__":
    main()
