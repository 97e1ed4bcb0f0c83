"""e8kv inside Hugging Face transformers (>= 5.2): a Cache whose layers hold e8kv codes, and the
attention function that reads them.

    import e8kv.hf
    with e8kv.hf.compress(model, preset="high") as handle:
        out = model.generate(**inputs, max_new_tokens=200)
    handle.cache.nbytes, handle.cache.to_bytes()

or, explicitly: `cache = e8kv.hf.E8Cache(model, preset="high")`, `model.set_attn_implementation("e8kv")`
(after `e8kv.hf.register()`), `model.generate(..., past_key_values=cache)`.

What happens:
- Prefill (the first forward pass through an empty cache): attention is dense (transformers' own
  sdpa function, same mask), and each layer keeps its new K/V and its last `window` post-RoPE
  queries (32 by default) until every layer has run; then one e8kv compress per sequence of the
  batch codes all layers at once (the observation queries drive eviction and query-weighted keys).
  The dense K/V are freed.
- Every later token, in any forward pass (decoding, a chunk of a chunked prefill, a new turn):
  appended to its sequence's cache (e8kv_append) and its query attends the cache as it stands at
  that token (e8kv_attend_batch over the batch's sequences), one token after the other: exact
  decode semantics, never dense K/V. The attention function finds the cache layer through
  `update()` (which records the layer for the attention call that follows on the same thread) and
  returns what e8kv computed.
- Batch > 1: one e8kv cache per sequence; left padding is read from the padding mask (padded
  tokens never enter the cache; positions come from position_ids). GQA: as the model has it.
- Beam search and repeat / select of batch rows: supported (a row used twice is copied through
  the container). Refused with E8kvError: crop (assisted decoding, DoLa), sliding-window or chunked
  attention layers, attention logit soft-capping or sinks, non-CPU tensors, RoPE types e8kv
  cannot express (unless the spec says rope=post), training.

torch and transformers are imported when this module is, not by `import e8kv`; importing it
registers the attention function (register()). The model facts (shape, window, RoPE spec) are
e8kv.model_spec's, which needs neither; they stay importable from here.
"""
from __future__ import annotations

import contextlib
import json
import math
import struct
import threading
from typing import Dict, List, Optional

import numpy as np
import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from . import _core
from ._core import Compressor, E8kvError, ThreadPool, attend_batch
# The model facts live in e8kv.model_spec (no torch); these names stay importable from e8kv.hf.
from .model_spec import make_spec, model_shape, refuse_unsupported, rope_spec, sliding_window_of  # noqa: F401

ATTN_NAME = "e8kv"
_BLOB_MAGIC = b"E8KVHF01"

_current = threading.local()  # layer_idx -> the E8Layer whose update() ran last on this thread


# ---- the cache -----------------------------------------------------------------------------------

class E8Layer(CacheLayerMixin):
    """One model layer's view of an E8Cache. It stores nothing itself after the prefill: the codes
    of every layer live in the E8Cache's per-sequence e8kv caches."""

    is_sliding = False
    is_compileable = False

    def __init__(self, parent: "E8Cache", layer_idx: int):
        super().__init__()
        self.parent, self.layer_idx = parent, layer_idx
        self.seq_length = 0  # tokens seen, padding included (transformers' index space)

    def lazy_initialization(self, key_states, value_states=None) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.device.type != "cpu":
            raise E8kvError(f"e8kv.hf: keys are on {key_states.device}; e8kv's attention runs on the CPU")
        pending = getattr(_current, "layers", None)
        if pending is None:
            pending = _current.layers = {}
        if any(layer.parent is self.parent for layer in pending.values()):
            pending.clear()
            raise E8kvError("e8kv.hf: the model's attention did not read the e8kv cache (it must run with "
                            "attn_implementation='e8kv': call e8kv.hf.register() and model.set_attn_implementation"
                            "('e8kv'), or use `with e8kv.hf.compress(model)`)")
        pending[self.layer_idx] = self
        self.seq_length += key_states.shape[-2]
        return key_states, value_states

    def get_mask_sizes(self, cache_position_or_length, *args) -> tuple:
        q = cache_position_or_length if isinstance(cache_position_or_length, int) else \
            cache_position_or_length.shape[0]
        return self.seq_length + q, 0

    def get_seq_length(self, *args) -> int:
        return self.seq_length

    def get_max_cache_shape(self) -> int:
        return -1

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.seq_length = 0

    def reorder_cache(self, beam_idx) -> None:
        if self.layer_idx == 0:
            self.parent._select_rows(beam_idx)

    def batch_select_indices(self, indices) -> None:
        if self.layer_idx == 0:
            self.parent._select_rows(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.layer_idx == 0:
            self.parent._select_rows(torch.arange(self.parent.batch_size).repeat_interleave(repeats))

    def crop(self, max_length: int) -> None:
        if max_length < 0:
            max_length = self.seq_length + max_length
        if max_length < self.seq_length:
            raise E8kvError(f"e8kv.hf: crop to {max_length} of {self.seq_length} tokens: an e8kv cache cannot drop its "
                            f"latest tokens (assisted decoding and DoLa crop the cache; run them with a DynamicCache)")


class _Prefill:
    """A layer's prefill until every layer has run: per sequence K/V rows, queries, positions."""

    def __init__(self, keys, values, queries, positions, query_positions):
        self.keys, self.values, self.queries = keys, values, queries
        self.positions, self.query_positions = positions, query_positions


class E8Cache(Cache):
    """A transformers Cache of e8kv codes (see the module docstring).

    model: the model (or its config); preset: an e8kv preset (e8kv.presets()); spec: more
    Config::parse fields ("evict=0.5", "budget=2.5"...; the model's RoPE is added from its config);
    threads: the e8kv thread pool's size (default: torch.get_num_threads()).
    """

    def __init__(self, model_or_config, preset: Optional[str] = "high", spec: str = "",
                 threads: Optional[int] = None, *, _spec: Optional[str] = None):
        config = getattr(model_or_config, "config", model_or_config)
        refuse_unsupported(config)
        self.model_shape = model_shape(config)
        self.sliding_window = sliding_window_of(config)
        self.spec = _spec if _spec is not None else make_spec(config, preset, spec)
        self._compressor: Optional[Compressor] = None
        self._scaling: Optional[float] = None
        self._pool = ThreadPool(int(threads or max(1, torch.get_num_threads())))
        self._rows: List[_core.Cache] = []
        self._next: List[int] = []          # per sequence: next position when position_ids are absent
        self._prefill: Dict[int, _Prefill] = {}
        layers = [E8Layer(self, i) for i in range(self.model_shape.n_layers)]
        super().__init__(layers=layers)
        # A compressor now, so that a bad spec or shape is refused before any forward pass; the
        # one that codes is made at the prefill, once the attention's scaling is known. The
        # prefill keeps as many query rows as its observation window (spec key `window`).
        self._obs_window = Compressor(self.model_shape, self.spec).obs_window

    # -- sizes
    @property
    def batch_size(self) -> int:
        return len(self._rows)

    @property
    def compressed(self) -> bool:
        return bool(self._rows)

    @property
    def nbytes(self) -> int:
        """Every byte the e8kv caches of the batch hold (codes, gains, means, positions, fp16
        window and sinks, descriptors)."""
        return sum(r.nbytes for r in self._rows)

    @property
    def bits_per_element(self) -> float:
        """8 * nbytes / (K and V elements of every token given, all sequences)."""
        elements = sum(r.original_tokens for r in self._rows) * 2 * self.model_shape.n_layers * \
            self.model_shape.n_kv_heads * self.model_shape.head_dim
        return 8.0 * self.nbytes / elements if elements else 0.0

    @property
    def rows(self) -> List[_core.Cache]:
        """The per-sequence e8kv caches (e8kv.Cache), batch order."""
        return list(self._rows)

    def dense_nbytes(self, bytes_per_element: int = 2) -> int:
        """What a dense cache of the same tokens would hold (fp16: 2 bytes per element)."""
        s = self.model_shape
        return sum(r.original_tokens for r in self._rows) * 2 * s.n_layers * s.n_kv_heads * s.head_dim * \
            bytes_per_element

    # -- attention (called by e8kv_attention)
    def _validity(self, attention_mask, b: int, q_len: int) -> np.ndarray:
        padding = getattr(attention_mask, "e8kv_padding", None) if attention_mask is not None else None
        if padding is not None:
            return padding[:, -q_len:].to(torch.bool).cpu().numpy().reshape(b, q_len)
        if attention_mask is None:
            return np.ones((b, q_len), bool)
        m = attention_mask
        if m.dtype != torch.bool:
            m = m == 0
        return m[:, 0, -1, -q_len:].cpu().numpy().reshape(b, q_len)  # left padding: the last query sees them

    def _positions(self, kwargs, valid: np.ndarray, first: bool) -> np.ndarray:
        b, q_len = valid.shape
        pos = kwargs.get("position_ids")
        if pos is not None:
            p = pos.detach().cpu().numpy().astype(np.int64)
            return np.broadcast_to(p, (b, q_len)).copy()
        if first:
            self._next = [0] * b
        out = np.zeros((b, q_len), np.int64)
        for r in range(b):
            n = int(valid[r].sum())
            out[r, valid[r]] = np.arange(self._next[r], self._next[r] + n)
            self._next[r] += n
        return out

    def _attend(self, layer: E8Layer, module, query, key, value, attention_mask, scaling, kwargs):
        b, hq, q_len, d = query.shape
        if self._scaling is None:
            self._scaling = float(scaling if scaling is not None else d ** -0.5)
        valid = self._validity(attention_mask, b, q_len)
        if not self._rows:
            positions = self._positions(kwargs, valid, first=layer.layer_idx == 0 and not self._prefill)
            self._check_window(positions[valid])
            out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                                            scaling=scaling, **{k: v for k, v in kwargs.items()
                                                                if k not in ("position_ids",)})
            self._keep_prefill(layer.layer_idx, query, key, value, valid, positions)
            if len(self._prefill) == self.model_shape.n_layers:
                self._compress()
            return out
        if b != len(self._rows):
            raise E8kvError(f"e8kv.hf: a batch of {b} sequences reached a cache of {len(self._rows)}")
        positions = self._positions(kwargs, valid, first=False)
        self._check_window(positions[valid])
        out = torch.zeros((b, q_len, hq, d), dtype=torch.float32)
        idx = layer.layer_idx
        for t in range(q_len):
            requests, rows = [], []
            for r in range(b):
                if not valid[r, t]:
                    continue
                p = int(positions[r, t])
                self._rows[r].append(idx, key[r, :, t, :], value[r, :, t, :], p)
                requests.append((self._rows[r], idx, query[r, :, t, :][None], [p]))
                rows.append(r)
            if requests:
                for r, (o, _) in zip(rows, attend_batch(requests, pool=self._pool)):
                    out[r, t] = torch.from_numpy(o[0])
        return out.to(query.dtype)

    def _check_window(self, positions: np.ndarray) -> None:
        # Below the window, sliding-window attention is full attention; past it, it is not.
        if self.sliding_window and positions.size and int(positions.max()) >= self.sliding_window:
            raise E8kvError(f"e8kv.hf: position {int(positions.max())} reaches the model's sliding window "
                            f"({self.sliding_window} tokens); e8kv.hf attends every cached token (full attention), "
                            f"which equals the model's attention only below its window")

    def _keep_prefill(self, idx, query, key, value, valid, positions) -> None:
        keys, values, queries, pos, qpos = [], [], [], [], []
        for r in range(key.shape[0]):
            sel = torch.from_numpy(np.flatnonzero(valid[r]))
            keys.append(key[r][:, sel, :].transpose(0, 1).contiguous())
            values.append(value[r][:, sel, :].transpose(0, 1).contiguous())
            qsel = sel[-self._obs_window:]
            queries.append(query[r][:, qsel, :].transpose(0, 1).contiguous())
            pos.append(positions[r, valid[r]])
            qpos.append(positions[r, valid[r]][-self._obs_window:])
        self._prefill[idx] = _Prefill(keys, values, queries, pos, qpos)

    def _compress(self) -> None:
        spec = self.spec
        if self._scaling is not None and abs(self._scaling * math.sqrt(self.model_shape.head_dim) - 1) > 1e-6 \
                and "softmax_scale=" not in spec:
            spec = f"{spec},softmax_scale={self._scaling!r}"
        self._compressor = Compressor(self.model_shape, spec)
        layers = [self._prefill[i] for i in range(self.model_shape.n_layers)]
        rows = []
        try:
            for r in range(len(layers[0].keys)):
                queries = None
                if len(layers[0].queries[r]):
                    queries = [l.queries[r] for l in layers]
                rows.append(self._compressor.compress(
                    [l.keys[r] for l in layers], [l.values[r] for l in layers], queries,
                    positions=layers[0].positions[r], query_positions=layers[0].query_positions[r] if queries else None,
                    pool=self._pool))
        except Exception:
            for c in rows:
                c.close()
            raise
        self._rows = rows
        self._prefill = {}

    def _select_rows(self, indices) -> None:
        idx = [int(i) for i in (indices.tolist() if hasattr(indices, "tolist") else indices)]
        if not self._rows:
            if self._prefill:
                raise E8kvError("e8kv.hf: rows reordered in the middle of a prefill")
            return
        used, rows = set(), []
        for i in idx:
            if not 0 <= i < len(self._rows):
                raise E8kvError(f"e8kv.hf: row {i} is outside the batch of {len(self._rows)}")
            if i in used:  # a second use of a sequence: its own copy (beam search, repeats)
                rows.append(_core.Cache.from_bytes(self._rows[i].to_bytes(), self._compressor))
            else:
                rows.append(self._rows[i])
                used.add(i)
        for i, c in enumerate(self._rows):
            if i not in used:
                c.close()
        self._rows = rows
        if self._next:
            self._next = [self._next[i] for i in idx]

    def reset(self) -> None:
        for c in self._rows:
            c.close()
        self._rows, self._prefill, self._next = [], {}, []
        super().reset()

    # -- serialization
    def to_bytes(self) -> bytes:
        """The conversation's cache: a small header (spec, shape, tokens seen) and one e8kv
        container per sequence (checksummed; docs/format.md)."""
        if not self._rows:
            raise E8kvError("e8kv.hf: E8Cache.to_bytes before the prefill: there is nothing compressed yet")
        blobs = [r.to_bytes() for r in self._rows]
        header = json.dumps({"spec": self._compressor.spec, "config_spec": self.spec,
                             "shape": list(self.model_shape), "seq_length": self.layers[0].seq_length,
                             "next": self._next, "scaling": self._scaling,
                             "sizes": [len(b) for b in blobs]}).encode()
        return _BLOB_MAGIC + struct.pack("<I", len(header)) + header + b"".join(blobs)

    @classmethod
    def from_bytes(cls, data: bytes, model_or_config, threads: Optional[int] = None) -> "E8Cache":
        """A cache written by to_bytes, for a model of the same shape; generation continues from it
        (pass the whole conversation's ids: transformers feeds the tokens the cache lacks)."""
        data = bytes(data)
        if len(data) < 12 or data[:8] != _BLOB_MAGIC:
            raise E8kvError("e8kv.hf: E8Cache.from_bytes: not an e8kv.hf cache (bad magic)", "corrupt data")
        (n,) = struct.unpack("<I", data[8:12])
        try:
            header = json.loads(data[12:12 + n].decode())
            sizes = [int(s) for s in header["sizes"]]
        except (ValueError, KeyError, TypeError) as e:
            raise E8kvError(f"e8kv.hf: E8Cache.from_bytes: damaged header ({e})", "corrupt data") from None
        if 12 + n + sum(sizes) != len(data):
            raise E8kvError(f"e8kv.hf: E8Cache.from_bytes: damaged or truncated: {len(data)} bytes, the header describes {12 + n + sum(sizes)}",
                            "corrupt data")
        config = getattr(model_or_config, "config", model_or_config)
        shape = model_shape(config)
        if list(shape) != header.get("shape"):
            raise E8kvError(f"e8kv.hf: E8Cache.from_bytes: the cache is for a model of shape {header.get('shape')}, "
                            f"this model's is {list(shape)}")
        cache = cls(config, threads=threads, _spec=header["config_spec"])
        cache._compressor = Compressor(shape, header["spec"])
        cache._scaling = header.get("scaling")
        offset, rows = 12 + n, []
        for s in sizes:
            rows.append(_core.Cache.from_bytes(data[offset:offset + s], cache._compressor))
            offset += s
        cache._rows, cache._next = rows, list(header.get("next") or [])
        for layer in cache.layers:
            layer.seq_length = int(header["seq_length"])
            layer.is_initialized = True
            layer.dtype, layer.device = torch.float32, torch.device("cpu")
        return cache

    def close(self) -> None:
        """Frees the e8kv caches now (they are also freed with the object)."""
        self.reset()
        self._pool.close()


# ---- attention and mask functions ----------------------------------------------------------------

def e8kv_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers attention function "e8kv": with an E8Cache, reads the codes (see the module
    docstring); with any other cache (or none), it is transformers' sdpa attention."""
    layers = getattr(_current, "layers", None)
    layer = layers.pop(module.layer_idx, None) if layers else None
    if layer is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if module.training and dropout:
        raise E8kvError("e8kv.hf: attention with dropout (training) is not supported")
    if kwargs.get("sliding_window") not in (None, layer.parent.sliding_window):
        raise E8kvError(f"e8kv.hf: the attention call's sliding_window {kwargs['sliding_window']} is not the model "
                        f"config's ({layer.parent.sliding_window})")
    for name in ("softcap", "s_aux", "sinks"):
        if kwargs.get(name) is not None:
            raise E8kvError(f"e8kv.hf: the attention call sets {name}; e8kv's attention does not do it")
    return layer.parent._attend(layer, module, query, key, value, attention_mask, scaling, kwargs), None


def e8kv_mask(*args, attention_mask=None, **kwargs):
    """Mask function "e8kv": transformers' sdpa mask, with the 2-D padding mask attached (the
    attention function needs to know which tokens are padding, to keep them out of the cache)."""
    mask = sdpa_mask(*args, attention_mask=attention_mask, **kwargs)
    if mask is not None and attention_mask is not None:
        mask.e8kv_padding = attention_mask
    return mask


def register() -> None:
    """Registers "e8kv" with transformers' AttentionInterface and AttentionMaskInterface (idempotent)."""
    AttentionInterface.register(ATTN_NAME, e8kv_attention)
    AttentionMaskInterface.register(ATTN_NAME, e8kv_mask)


register()


class CompressHandle:
    """What `compress` yields: the E8Cache of the latest generation (`cache`), and all of them."""

    def __init__(self, model, preset, spec, threads):
        self.model, self.preset, self.spec, self.threads = model, preset, spec, threads
        self.caches: List[E8Cache] = []

    @property
    def cache(self) -> Optional[E8Cache]:
        return self.caches[-1] if self.caches else None

    def _install(self, module, args, kwargs):
        if kwargs.get("use_cache") is False:
            return None
        pkv = kwargs.get("past_key_values")
        fresh = pkv is None or (type(pkv) is DynamicCache and pkv.get_seq_length() == 0)
        if not fresh:
            return None
        cache = E8Cache(self.model, preset=self.preset, spec=self.spec, threads=self.threads)
        self.caches.append(cache)
        kwargs = dict(kwargs)
        kwargs["past_key_values"] = cache
        return args, kwargs


@contextlib.contextmanager
def compress(model, preset: Optional[str] = "high", spec: str = "", threads: Optional[int] = None):
    """Within the block, every forward pass of `model` that starts a new cache (generate's first
    step, or a call without past_key_values) gets an E8Cache instead of a DynamicCache, and the
    model's attention is e8kv's. Through a forward pre-hook (torch's public API) and
    set_attn_implementation; nothing of transformers is replaced. Yields a CompressHandle."""
    register()
    refuse_unsupported(model.config)
    Compressor(model_shape(model.config), make_spec(model.config, preset, spec))  # refuse a bad spec now
    handle = CompressHandle(model, preset, spec, threads)
    previous = model.config._attn_implementation
    model.set_attn_implementation(ATTN_NAME)
    hook = model.register_forward_pre_hook(handle._install, with_kwargs=True)
    try:
        yield handle
    finally:
        hook.remove()
        model.set_attn_implementation(previous)
