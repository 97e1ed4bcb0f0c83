"""e8kv: KV caches compressed onto the E8 lattice, that attention reads without decompressing.

    import e8kv
    c = e8kv.Compressor((n_layers, n_kv_heads, n_q_heads, head_dim), "preset=high")
    cache = c.compress(keys, values, queries)       # per layer [tokens, heads, head_dim], post-RoPE
    cache.append(layer, k, v, position)              # each decoded token
    out = cache.attend(layer, q, position)           # reads the codes
    blob = cache.to_bytes(); cache = e8kv.Cache.from_bytes(blob, c)

numpy is the only dependency; arrays may be numpy, torch (CPU) or anything with DLPack or the
buffer protocol, float32 / float16 / bfloat16. Hugging Face transformers: e8kv.hf. kvpress:
e8kv.kvpress. Every refusal raises e8kv.E8kvError with the library's message.
"""
from ._core import (AttendRequest, Cache, Compressor, E8kvError, ModelShape, ThreadPool, attend_batch,
                    format_version, library_version, merge_attention, presets)

try:
    from importlib.metadata import version as _version

    __version__ = _version("e8kv")
except Exception:  # running from a source tree without installing
    __version__ = "0+unknown"

__all__ = ["AttendRequest", "Cache", "Compressor", "E8kvError", "ModelShape", "ThreadPool", "attend_batch",
           "format_version", "library_version", "merge_attention", "presets", "__version__"]
