"""e8kv as an NVIDIA kvpress press (kvpress 0.5.x, which pins transformers < 5.3).

    from e8kv.kvpress import E8Press
    press = E8Press("preset=quant-k3v2")                    # or base_press=SnapKVPress(0.5) to evict first
    with press(model):
        model(input_ids, past_key_values=cache)             # kvpress compresses at the prefill
    press.bits_per_element                                  # honest: every byte e8kv's codes need

kvpress calls a press once per layer at the prefill and keeps dense K/V in the model's cache, so
E8Press codes each layer with a one-layer e8kv compressor (the prefill's last `window` queries,
32 by default, as observation queries, recomputed from the layer's hidden states as kvpress's
SnapKV does) and
writes the decoded rows back: the model then attends what e8kv's codes hold, which is what
kvpress's benchmarks measure. The cache kvpress keeps stays dense, so the memory saving is what
`bits_per_element` / `nbytes` report for the codes, not what the dense cache holds (`e8kv.hf`
keeps the codes instead). Cross-layer features (budget=, shared=1, evict_layers=1, protect=) need
all layers in one call and are refused; eviction inside e8kv (evict=) needs a kept set shared by a
layer's heads (per_head=1 is refused) and removes rows as kvpress presses do.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import torch
from kvpress.presses.base_press import BasePress
from kvpress.utils import get_prerope_query_states
from transformers.models.llama.modeling_llama import rotate_half

from . import _core
# The model facts only: importing e8kv.hf would register its attention function with transformers.
from .model_spec import model_shape, rope_spec

_CROSS_LAYER = ("budget=", "shared=1", "evict_layers=1", "protect=", "layer_rates=", "per_head=1")


@dataclass
class E8Press(BasePress):
    """Codes each layer's prefill K/V with e8kv (spec: a Config::parse string such as
    "preset=quant-k3v2"); base_press, when given, evicts first (a kvpress ScorerPress, e.g.
    SnapKVPress(compression_ratio=0.5)) and e8kv codes what it kept."""

    spec: str = "preset=quant-k3v2"
    base_press: Optional[BasePress] = None
    layer_bytes: List[int] = field(default_factory=list, init=False, repr=False)
    layer_elements: List[int] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self):
        for item in _CROSS_LAYER:
            if item in self.spec.replace(" ", ""):
                raise _core.E8kvError(f"E8Press: '{item}' needs every layer in one compress call; kvpress presses "
                                      f"see one layer at a time (use e8kv.hf for it)")
        self._compressor = None

    def post_init_from_model(self, model):
        if self.base_press is not None:
            self.base_press.post_init_from_model(model)
        shape = model_shape(model.config)
        # Rows a base press kept lose their positions (kvpress keeps none): code keys post-RoPE then.
        frame = ",rope=post" if self.base_press is not None and "rope=" not in self.spec else ""
        self._compressor = _core.Compressor((1, shape.n_kv_heads, shape.n_q_heads, shape.head_dim),
                                            f"{self.spec},{rope_spec(model.config)}{frame}")
        self.layer_bytes, self.layer_elements = [], []

    @property
    def nbytes(self) -> int:
        """Bytes of e8kv's codes over the layers of the latest prefill (every sequence)."""
        return sum(self.layer_bytes)

    @property
    def bits_per_element(self) -> float:
        """8 * nbytes / the K and V elements of the prefill before any eviction."""
        return 8.0 * self.nbytes / sum(self.layer_elements) if self.layer_elements else 0.0

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        if self._compressor is None:
            raise _core.E8kvError("E8Press: use it as `with press(model):` (kvpress initialises it from the model)")
        b, hkv, n, d = keys.shape
        if module.layer_idx == 0:
            self.layer_bytes, self.layer_elements = [], []
        self.layer_elements.append(b * 2 * hkv * n * d)
        window = min(self._compressor.obs_window, n)
        q = get_prerope_query_states(module, hidden_states[:, -window:])
        cos, sin = kwargs["position_embeddings"]
        q = q * cos[:, -window:].unsqueeze(1) + rotate_half(q) * sin[:, -window:].unsqueeze(1)
        if self.base_press is not None:
            keys, values = self.base_press.compress(module, hidden_states, keys, values, attentions, kwargs)
            n = keys.shape[2]
        out_k, out_v, total = [], [], 0
        for r in range(b):
            cache = self._compressor.compress([keys[r].transpose(0, 1)], [values[r].transpose(0, 1)],
                                              [q[r].transpose(0, 1)])
            total += cache.nbytes
            _, k, v, mask = cache.decompress(0)
            if not (mask == 0).all():
                raise _core.E8kvError("E8Press: the spec evicts per KV head; kvpress caches keep one row set per layer")
            out_k.append(torch.from_numpy(k).transpose(0, 1))
            out_v.append(torch.from_numpy(v).transpose(0, 1))
            cache.close()
        self.layer_bytes.append(total)
        return torch.stack(out_k).to(keys.dtype), torch.stack(out_v).to(values.dtype)
