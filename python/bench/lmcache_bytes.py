"""Bytes per token that LMCache stores and moves for one KV chunk, per serde, with the KL beside:
LMCache's naive path (bf16 as is), its fp8 serde, its CacheGen serde (v1 storage backend; it runs on
the CPU through LMCache's torch fallback kernels), and e8kv's serde (quant-k4v4, quant-k3v2; every token coded, and with the first token of
each chunk in fp16, sinks=1).

SmolLM2-135M (the project's GGUF, float32 on the CPU), the technical corpus: a PREFIX-token prefill
(PREFIX / 256 LMCache chunks of 256 tokens, K and V rounded to bf16 as a vLLM cache holds them), each
chunk [2, layers, 256, kv_heads * head_dim] through the serde and back, then NEXT teacher-forced
tokens on the restored cache; KL(bf16 cache || restored cache) per token, averaged; rel.err is
||restored - chunk|| / ||chunk|| per chunk, averaged; ms/chunk: encode + decode, one CPU thread's call. Bytes: what
LMCache stores per chunk (the serde's fixed buffer for fp8 and e8kv — the Redis value's size, which
tests/test_lmcache.py checks; CacheGen's encoded bytes, which vary per chunk), over 256 tokens.

    E8KV_LIBRARY=build/cpu/libe8kv_c.so PYTHONPATH=python/src \\
      $(bash scripts/lmcache-venv.sh)/bin/python python/bench/lmcache_bytes.py [--prefix 1024] [--next 64]
"""
import argparse
import os
import time
import types

import torch

import e8kv
from e8kv import lmcache as e8lmc

CHUNK = 256


def load_model():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = os.environ.get("E8KV_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "e8kv")
    path = os.path.join(cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    text = os.path.join(cache, "text", "tech.txt")
    for p in (path, text):
        if not os.path.exists(p):
            raise SystemExit(f"{p} is missing (scripts/fetch-data.sh)")
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    return model, tok(open(text).read()[:40000], return_tensors="pt").input_ids


def chunks_of(cache, n_layers):
    """The prefill cache as LMCache chunks [2, L, 256, H * D] bf16 (keys post-RoPE, as vLLM's)."""
    ks = [cache.layers[i].keys[0] for i in range(n_layers)]  # [H, T, D]
    vs = [cache.layers[i].values[0] for i in range(n_layers)]
    H, T, D = ks[0].shape
    kv = torch.stack([torch.stack(ks), torch.stack(vs)])  # [2, L, H, T, D]
    kv = kv.permute(0, 1, 3, 2, 4).reshape(2, n_layers, T, H * D).to(torch.bfloat16)
    return [kv[:, :, s:s + CHUNK].contiguous() for s in range(0, T, CHUNK)], (H, D)


def cache_from_chunks(chunks, H, D):
    from transformers import DynamicCache

    kv = torch.cat(chunks, dim=2).float()  # [2, L, T, H * D]
    L, T = kv.shape[1], kv.shape[2]
    kv = kv.reshape(2, L, T, H, D).permute(0, 1, 3, 2, 4)  # [2, L, H, T, D]
    c = DynamicCache()
    for layer in range(L):
        c.update(kv[0, layer][None].contiguous(), kv[1, layer][None].contiguous(), layer)
    return c


def obj(t):
    return types.SimpleNamespace(tensor=t)


def lay(t):
    return types.SimpleNamespace(shapes=[t.shape], dtypes=[t.dtype])


def sync_serde(ser, de):
    """encode(chunk) -> (stored bytes, decoded chunk) for LMCache's sync Serializer/Deserializer pair."""
    def run(c):
        size = ser.estimate_serialized_size(lay(c))
        buf = torch.zeros(size, dtype=torch.uint8)
        ser.serialize(obj(c), obj(buf), None)
        out = torch.empty_like(c)
        de.deserialize(obj(buf), obj(out), None)
        return size, out
    return run


def cachegen(L, H, D):
    """LMCache's CacheGen (v1 naive_serde) for this model: the quantization it picks for a model it does
    not list (CacheGenConfig.from_model_name's default branch: 32/16 key bins split at layer 10, 32/16
    value bins split at layer 2), fed the model's layer count directly (its lookup reads the HF hub)."""
    from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj
    from lmcache.v1.storage_backend.naive_serde import cachegen_basics as cgb
    from lmcache.v1.storage_backend.naive_serde.cachegen_decoder import CacheGenDeserializer
    from lmcache.v1.storage_backend.naive_serde.cachegen_encoder import CacheGenSerializer

    Q = cgb.QuantizationSpec
    cfg = cgb.CacheGenConfig(nlayers=L, kspecs=[Q(start_layer=0, end_layer=10, bins=32), Q(start_layer=10, end_layer=L,
                                                                                           bins=16)],
                             vspecs=[Q(start_layer=0, end_layer=2, bins=32), Q(start_layer=2, end_layer=L, bins=16)])
    cgb.CacheGenConfig.from_model_name = staticmethod(lambda name: cfg)
    engine = types.SimpleNamespace(chunk_size=CHUNK)
    meta = types.SimpleNamespace(model_name="SmolLM2-135M", kv_shape=(L, 2, CHUNK, H, D), kv_dtype=torch.bfloat16)
    ser, de = CacheGenSerializer(engine, meta), CacheGenDeserializer(engine, meta)

    def run(c):
        m = MemoryObjMetadata(shape=c.shape, dtype=c.dtype, address=0, phy_size=c.numel() * 2, ref_count=1,
                              fmt=MemoryFormat.KV_2LTD)
        enc = ser.serialize(TensorMemoryObj(c.view(-1).view(torch.uint8).clone(), m, None))
        return enc.get_size(), de.deserialize(enc).tensor.view(c.shape)
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prefix", type=int, default=1024, help="prefill tokens (a multiple of 256)")
    ap.add_argument("--next", type=int, default=64, help="teacher-forced tokens scored")
    a = ap.parse_args()
    assert a.prefix % CHUNK == 0, "--prefix must be a multiple of 256"
    torch.manual_seed(0)
    model, ids = load_model()
    x = ids[:, :a.prefix + a.next]
    L = model.config.num_hidden_layers
    from transformers import DynamicCache

    with torch.no_grad():
        dense = DynamicCache()
        model(x[:, :a.prefix], past_key_values=dense)
        chunks, (H, D) = chunks_of(dense, L)
        ref = torch.log_softmax(model(x[:, a.prefix:], past_key_values=cache_from_chunks(chunks, H, D)).logits[0], -1)

        rows = [("LMCache naive (bf16)", lambda c: (c.numel() * c.element_size(), c))]
        try:
            from lmcache.v1.distributed.serde import Fp8QuantizationDeserializer, Fp8QuantizationSerializer
            rows.append(("LMCache fp8 serde (e4m3)", sync_serde(Fp8QuantizationSerializer(),
                                                               Fp8QuantizationDeserializer())))
            rows.append(("LMCache CacheGen", cachegen(L, H, D)))
        except ImportError:
            print("(LMCache not importable: its fp8 and CacheGen rows are left out)")
        for sinks in (0, 1):
            for preset in ("quant-k4v4", "quant-k3v2"):
                s = e8lmc.E8kvSerde(e8lmc.SerdeConfig(preset=preset, head_dim=D, sinks=sinks))
                rows.append((f"e8kv serde {preset}" + (f" sinks={sinks}" if sinks else ""), sync_serde(s, s)))

        print(f"SmolLM2-135M ({L} layers, {H} KV heads, head_dim {D}), {a.prefix}-token prefix in "
              f"{len(chunks)} chunks of {CHUNK}, KL over the next {a.next} tokens; e8kv {e8kv.__version__}")
        print(f"{'serde':34s} {'bytes/token':>12s} {'vs bf16':>8s} {'KL':>10s} {'rel.err':>8s} "
              f"{'ms/chunk':>9s}")
        bf16 = None
        for name, run in rows:
            total, outs, t_enc = 0, [], 0.0
            for c in chunks:
                t = time.perf_counter()
                size, out = run(c)
                t_enc += time.perf_counter() - t
                total += size
                outs.append(out.to(torch.bfloat16))
            per_token = total / a.prefix
            bf16 = bf16 or per_token
            lp = torch.log_softmax(model(x[:, a.prefix:], past_key_values=cache_from_chunks(outs, H, D)).logits[0], -1)
            kl = float((ref.exp() * (ref - lp)).sum(-1).mean())
            err = float(torch.stack([(o.float() - c.float()).norm() / c.float().norm() for o, c in zip(outs, chunks)])
                        .mean())
            print(f"{name:34s} {per_token:12.0f} {bf16 / per_token:7.2f}x {kl:10.2e} {err:8.4f} "
                  f"{1e3 * t_enc / len(chunks):9.0f}")


if __name__ == "__main__":
    main()
