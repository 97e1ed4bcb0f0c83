"""A model's facts for e8kv, read from its transformers config object: the KV shape, its sliding
window, what e8kv refuses, and the spec fields of its RoPE.

Only attributes of the config are read (any object with transformers' field names will do), so
this module imports neither torch nor transformers: e8kv.hf, e8kv.kvpress and the peer harness
share it without one pulling in the other's dependencies or side effects.
"""
from __future__ import annotations

from typing import Optional

from ._core import E8kvError, ModelShape


def text_config(config):
    """The decoder's config of a multimodal model's config; any other config as it is."""
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def model_shape(config) -> ModelShape:
    c = text_config(config)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    n_kv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    return ModelShape(c.num_hidden_layers, n_kv, c.num_attention_heads, head_dim)


def sliding_window_of(config) -> Optional[int]:
    """The window of a model whose every layer attends a sliding window (Mistral, Qwen2 with
    use_sliding_window), or None for full attention. Mixed models (Gemma-3: some layers sliding,
    some full) are refused: e8kv.hf keeps one cache for all layers."""
    c = text_config(config)
    window = getattr(c, "sliding_window", None)
    layer_types = getattr(c, "layer_types", None)
    if layer_types:
        kinds = sorted(set(layer_types))
        if kinds == ["full_attention"]:
            return None
        if kinds == ["sliding_attention"] and window:
            return int(window)
        first = next(i for i, t in enumerate(layer_types) if t != layer_types[0])
        raise E8kvError(f"e8kv.hf: layer {first} is '{layer_types[first]}' and layer 0 '{layer_types[0]}' "
                        f"({', '.join(kinds)} in this model); e8kv.hf keeps one cache for every layer, so all "
                        f"layers must attend alike")
    if window and getattr(c, "use_sliding_window", True):
        return int(window)
    return None


def refuse_unsupported(config) -> None:
    """E8kvError when the model attends in a way e8kv's attention does not (mixed sliding and full
    layers, logit soft-capping, chunked attention)."""
    sliding_window_of(config)
    c = text_config(config)
    for field in ("attn_logit_softcapping", "attention_chunk_size"):
        if getattr(c, field, None):
            raise E8kvError(f"e8kv.hf: the model sets {field}={getattr(c, field)}, which e8kv's attention does not do")


def rope_theta_field(theta) -> str:
    """The spec field of a RoPE base (an int or a float: both print alike)."""
    return f"rope_theta={float(theta):g}"


def rope_spec(config) -> str:
    """The spec fields that tell e8kv the model's RoPE (split-half, as transformers applies it)."""
    c = text_config(config)
    p = dict(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {})
    theta = p.get("rope_theta", getattr(c, "rope_theta", None))
    kind = p.get("rope_type", p.get("type", "default")) or "default"
    items = [rope_theta_field(theta)] if theta else []
    if kind == "default":
        pass
    elif kind in ("linear", "dynamic", "llama3", "yarn"):
        items.append(f"rope_scaling={kind}")
        names = {"factor": "rope_factor", "low_freq_factor": "rope_low_freq_factor",
                 "high_freq_factor": "rope_high_freq_factor", "beta_fast": "rope_beta_fast",
                 "beta_slow": "rope_beta_slow", "attention_factor": "rope_attention_factor",
                 "original_max_position_embeddings": "rope_original_max_position"}
        for key, name in names.items():
            if p.get(key) is not None:
                value = p[key]
                items.append(f"{name}={int(value) if key.startswith('original') else float(value):g}"
                             if key != "original_max_position_embeddings" else f"{name}={int(value)}")
    else:
        raise E8kvError(f"e8kv.hf: RoPE type '{kind}' has no e8kv equivalent; add 'rope=post' to the spec to code "
                        f"keys as they are (post-RoPE)")
    partial = p.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", None))
    if partial not in (None, 1, 1.0):
        items.append(f"rope_dim={int(model_shape(config).head_dim * float(partial))}")
    return ",".join(items)


def make_spec(config, preset: Optional[str] = "high", spec: str = "") -> str:
    """preset + the model's RoPE + any extra fields (the extra spec wins)."""
    parts = []
    if preset:
        parts.append(f"preset={preset}")
    if "rope=post" not in spec.replace(" ", ""):
        parts.append(rope_spec(config))
    if spec:
        parts.append(spec)
    return ",".join(p for p in parts if p)
