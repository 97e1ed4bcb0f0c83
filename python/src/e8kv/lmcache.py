"""e8kv as an LMCache serde: KV chunks stored in LMCache's L2 backends (Redis/Valkey, filesystem,
S3, Mooncake, ...) as e8kv codes instead of bf16, ~4-6x fewer bytes stored and moved.

LMCache (pinned 0.5.6: bench/lmcache/requirements.lock, scripts/lmcache-venv.sh) wraps an L2
adapter with a serde named in the adapter's JSON config; register "e8kv" first, in the process that
creates LMCache's storage manager:

    import e8kv.lmcache
    e8kv.lmcache.register()          # LMCache's register_serde_factory("e8kv", ...)
    # --l2-adapter '{"type": "resp", "host": "127.0.0.1", "port": 6379,
    #                "serde": {"type": "e8kv", "preset": "quant-k3v2", "head_dim": 128}}'

Serde kwargs: preset (a fixed-rate preset: quant-k4v4, quant-k3v3, quant-k4v2, quant-k3v2,
quant-k2v2; default quant-k3v2), head_dim (default 128; the chunk's hidden size must be a
multiple of it), rope_theta (the model's RoPE base, default e8kv's; keys come in post-RoPE and are
coded with RoPE removed), sinks (default 0: every token coded; N > 0 keeps the first N tokens of
every chunk in fp16 — the attention sink sits in a sequence's first chunk only, but the size is
fixed, so every chunk pays, and fp16 tokens are kept in blocks of 16: ~+1 bit per element on
SmolLM2 for a 2.7-4x lower KL at quant-k3v2/k4v4, bench/RESULTS.md), max_workers (LMCache's serde
threads, default 1).

LMCache stores the whole buffer estimate_serialized_size() asks for, for every chunk, so a serde must
have a fixed output size: e8kv's fixed-rate presets code every token of every layer at a fixed
number of bits (here every token: no fp16 window or sinks), and the buffer is sized by the
container's bound for the chunk's layout (16 bytes of header, the container, zeros): ~1 % above the
codes (Cache.serialized_size_bound). Eviction presets (high, asym, balanced, max) are refused: LMCache's
deserializer must fill every token of a dense [2, layers, tokens, hidden] chunk back. Tier presets
(tier-k3v2, tier-k2v2) are refused: their 4-bit tier is chosen with observation queries that a serde
never sees. Only the [2, layers, tokens, hidden] KV layout is accepted (not MLA's single plane).

A value that fails its checks (magic, lengths, the container's checksums, another configuration or
shape) raises e8kv.E8kvError in the deserializer; LMCache logs it and reports the chunk as not
loaded (a miss), never a wrong cache. Nothing here imports LMCache or torch until register() or a
serde call needs them.
"""
from __future__ import annotations

import struct
import threading
from typing import Any, Dict, Optional, Tuple

import numpy as np

from ._core import Compressor, E8kvError
from .model_spec import rope_theta_field

SERDE_TYPE = "e8kv"
FIXED_RATE_PRESETS = ("quant-k4v4", "quant-k3v3", "quant-k4v2", "quant-k3v2", "quant-k2v2")
EVICTION_PRESETS = ("high", "asym", "balanced", "max")
TIER_PRESETS = ("tier-k3v2", "tier-k2v2")
DEFAULT_PRESET = "quant-k3v2"
LMCACHE_VERSION = "0.5.6"  # the version tested (bench/lmcache/requirements.lock)

MAGIC = b"E8KVLMC1"
_HEADER = struct.Struct("<8sII")  # magic, container bytes, tokens
HEADER_BYTES = _HEADER.size  # 16
_KWARGS = ("preset", "head_dim", "rope_theta", "sinks", "max_workers")


class SerdeConfig:
    """The checked serde kwargs (LMCache passes the adapter config's "serde" dict less "type")."""

    def __init__(self, preset: str = DEFAULT_PRESET, head_dim: int = 128, rope_theta: Optional[float] = None,
                 sinks: int = 0, max_workers: int = 1):
        if not isinstance(preset, str):
            raise E8kvError(f"e8kv serde: preset is a {type(preset).__name__}; expected a string such as "
                            f"'{DEFAULT_PRESET}'")
        if preset in EVICTION_PRESETS:
            raise E8kvError(f"e8kv serde: preset '{preset}' evicts tokens; LMCache needs every token of a chunk "
                            f"back and a fixed-size output per chunk: use a fixed-rate preset "
                            f"({', '.join(FIXED_RATE_PRESETS)})")
        if preset in TIER_PRESETS:
            raise E8kvError(f"e8kv serde: preset '{preset}' chooses its 4-bit tier with observation queries, which "
                            f"an LMCache serde never sees: use a fixed-rate preset ({', '.join(FIXED_RATE_PRESETS)})")
        if preset not in FIXED_RATE_PRESETS:
            raise E8kvError(f"e8kv serde: preset '{preset}' is unknown here; accepted (fixed-rate): "
                            f"{', '.join(FIXED_RATE_PRESETS)}")
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 8:
            raise E8kvError(f"e8kv serde: head_dim must be a positive multiple of 8; got {head_dim!r}")
        if rope_theta is not None and (isinstance(rope_theta, bool) or not isinstance(rope_theta, (int, float))
                                       or not rope_theta > 0):
            raise E8kvError(f"e8kv serde: rope_theta must be a positive number; got {rope_theta!r}")
        if isinstance(sinks, bool) or not isinstance(sinks, int) or not 0 <= sinks <= 64:
            raise E8kvError(f"e8kv serde: sinks must be an integer in [0, 64]; got {sinks!r}")
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise E8kvError(f"e8kv serde: max_workers must be a positive integer; got {max_workers!r}")
        self.preset, self.head_dim, self.rope_theta, self.max_workers = preset, head_dim, rope_theta, max_workers
        self.sinks = sinks

    @classmethod
    def from_kwargs(cls, kwargs: Dict[str, Any]) -> "SerdeConfig":
        unknown = sorted(set(kwargs) - set(_KWARGS))
        if unknown:
            raise E8kvError(f"e8kv serde: unknown argument(s) {', '.join(unknown)}; accepted: {', '.join(_KWARGS)}")
        return cls(**kwargs)

    @property
    def spec(self) -> str:
        # Every token of the chunk coded: no fp16 recent window, sinks or residual (the chunk is a
        # stored block, not a cache that grows), so the size is the preset's rate for every token.
        spec = f"preset={self.preset},recent=0,residual=0,sinks={self.sinks}"
        return spec if self.rope_theta is None else f"{spec},{rope_theta_field(self.rope_theta)}"


def _kv_shape(shapes, dtypes, head_dim: int) -> Tuple[int, int, int, int]:
    """(layers, tokens, kv_heads, head_dim) of a layout [2, layers, tokens, hidden]; E8kvError otherwise."""
    if len(shapes) != 1 or len(dtypes) != 1:
        raise E8kvError(f"e8kv serde: the chunk has {len(shapes)} tensors; accepted: one KV tensor "
                        f"[2, layers, tokens, hidden]")
    shape = tuple(int(x) for x in shapes[0])
    if len(shape) != 4 or shape[0] != 2:
        raise E8kvError(f"e8kv serde: chunk shape {list(shape)}; accepted: [2, layers, tokens, hidden] "
                        f"(separate K and V; MLA's single plane is not supported)")
    _, layers, tokens, hidden = shape
    if layers < 1 or tokens < 1 or hidden < 1 or hidden % head_dim:
        raise E8kvError(f"e8kv serde: chunk shape {list(shape)}: hidden {hidden} is not a positive multiple of "
                        f"head_dim {head_dim} (set head_dim in the serde config), or the chunk is empty")
    if str(dtypes[0]) not in ("torch.bfloat16", "torch.float16", "torch.float32"):
        raise E8kvError(f"e8kv serde: chunk dtype {dtypes[0]}; accepted: bfloat16, float16, float32")
    return layers, tokens, hidden // head_dim, head_dim


class E8kvSerde:
    """The serializer and deserializer of LMCache's sync serde interface (serialize(src, dst, key),
    estimate_serialized_size(layout), deserialize(src, dst, key)), on objects with a .tensor (torch,
    CPU) and layouts with .shapes / .dtypes. register() subclasses it with LMCache's ABCs."""

    def __init__(self, config: SerdeConfig):
        self.config = config
        self._lock = threading.Lock()
        self._compressors: Dict[Tuple[int, int, int], Compressor] = {}
        self._sizes: Dict[Tuple[int, int, int, int], int] = {}

    def compressor(self, layers: int, kv_heads: int, head_dim: int) -> Compressor:
        key = (layers, kv_heads, head_dim)
        with self._lock:
            c = self._compressors.get(key)
            if c is None:
                c = self._compressors[key] = Compressor((layers, kv_heads, kv_heads, head_dim), self.config.spec)
            return c

    def serialized_size(self, shapes, dtypes) -> int:
        """The fixed buffer size of one chunk of this layout: header + the container's bound."""
        L, T, H, D = _kv_shape(shapes, dtypes, self.config.head_dim)
        with self._lock:
            size = self._sizes.get((L, T, H, D))
        if size is None:
            # The bound depends on the layout and the token counts only (fixed-rate: every token coded).
            probe = np.random.default_rng(0).standard_normal((L, T, H, D), dtype=np.float32)
            with self.compressor(L, H, D).compress(probe, probe) as cache:
                size = HEADER_BYTES + cache.serialized_size_bound()
            with self._lock:
                self._sizes[(L, T, H, D)] = size
        return size

    # -- LMCache's Serializer
    def estimate_serialized_size(self, layout_desc) -> int:
        return self.serialized_size(layout_desc.shapes, layout_desc.dtypes)

    def serialize(self, src, dst, key=None) -> int:
        s, d = _tensor(src, "src"), _tensor(dst, "dst")
        size = self.serialized_size([s.shape], [s.dtype])
        L, T, H, D = _kv_shape([s.shape], [s.dtype], self.config.head_dim)
        out = _bytes_view(d, "dst")
        if out.size < size:
            raise E8kvError(f"e8kv serde: dst holds {out.size} bytes; the chunk needs {size}")
        kv = s.reshape(2, L, T, H, D)
        with self.compressor(L, H, D).compress(kv[0], kv[1]) as cache:
            blob = cache.to_bytes()
        if HEADER_BYTES + len(blob) > size:  # cannot happen: the bound holds for every cache of the layout
            raise E8kvError(f"e8kv serde: container of {len(blob)} bytes exceeds the chunk's fixed size {size}")
        out[:HEADER_BYTES] = np.frombuffer(_HEADER.pack(MAGIC, len(blob), T), np.uint8)
        out[HEADER_BYTES:HEADER_BYTES + len(blob)] = np.frombuffer(blob, np.uint8)
        out[HEADER_BYTES + len(blob):size] = 0  # no stale bytes of the buffer leave the host
        return size

    # -- LMCache's Deserializer
    def deserialize(self, src, dst, key=None) -> None:
        s, d = _tensor(src, "src"), _tensor(dst, "dst")
        L, T, H, D = _kv_shape([d.shape], [d.dtype], self.config.head_dim)
        data = _bytes_view(s, "src")
        if data.size < HEADER_BYTES:
            raise E8kvError(f"e8kv serde: value of {data.size} bytes is shorter than the {HEADER_BYTES}-byte header")
        magic, n, tokens = _HEADER.unpack(data[:HEADER_BYTES].tobytes())
        if magic != MAGIC:
            raise E8kvError("e8kv serde: the value is not an e8kv chunk (bad magic); another serde wrote it?")
        if n > data.size - HEADER_BYTES:
            raise E8kvError(f"e8kv serde: the header names {n} container bytes; the value holds "
                            f"{data.size - HEADER_BYTES} (truncated)")
        if tokens != T:
            raise E8kvError(f"e8kv serde: the value holds {tokens} tokens; the chunk has {T}")
        import torch  # dst is a torch tensor: torch is there

        from ._core import Cache
        with Cache.from_bytes(data[HEADER_BYTES:HEADER_BYTES + n], self.compressor(L, H, D)) as cache:
            for layer in range(L):
                pos, k, v, mask = cache.decompress(layer)
                if pos.shape[0] != T or not np.array_equal(pos, np.arange(T, dtype=np.int32)) or mask.any():
                    raise E8kvError(f"e8kv serde: layer {layer} of the value does not hold tokens 0..{T - 1}")
                d[0, layer].copy_(torch.from_numpy(k.reshape(T, H * D)))
                d[1, layer].copy_(torch.from_numpy(v.reshape(T, H * D)))


def _tensor(obj, name: str):
    t = getattr(obj, "tensor", None)
    if t is None:
        raise E8kvError(f"e8kv serde: {name} has no tensor (a MemoryObj with a CPU tensor is needed)")
    if getattr(t, "device", None) is not None and str(t.device) != "cpu":
        raise E8kvError(f"e8kv serde: {name} is on {t.device}; e8kv's serde runs on CPU tensors")
    return t


def _bytes_view(t, name: str) -> np.ndarray:
    """A flat uint8 numpy view of a contiguous CPU torch tensor (no copy)."""
    import torch

    if not t.is_contiguous():
        raise E8kvError(f"e8kv serde: {name} is not contiguous")
    return t.view(-1).view(torch.uint8).numpy()


_registered: Optional[str] = None
_register_lock = threading.Lock()


def _create(kwargs: Dict[str, Any]):
    """LMCache's serde factory: kwargs -> an AsyncSerdeProcessor around E8kvSerde."""
    from lmcache.v1.distributed.serde import AsyncSerdeProcessor, Deserializer, Serializer

    config = SerdeConfig.from_kwargs(dict(kwargs))
    core = E8kvSerde(config)

    class E8kvSerializer(Serializer):
        def serialize(self, src, dst, key):
            return core.serialize(src, dst, key)

        def estimate_serialized_size(self, layout_desc):
            return core.estimate_serialized_size(layout_desc)

    class E8kvDeserializer(Deserializer):
        def deserialize(self, src, dst, key):
            core.deserialize(src, dst, key)

    return AsyncSerdeProcessor(E8kvSerializer(), E8kvDeserializer(), max_workers=config.max_workers)


def register(name: str = SERDE_TYPE) -> str:
    """Registers the e8kv serde in LMCache's serde registry under `name` (default "e8kv"); a second
    call is a no-op. Returns the name. E8kvError when LMCache is not importable or the name is taken."""
    global _registered
    with _register_lock:
        if _registered is not None:
            if name != _registered:
                raise E8kvError(f"e8kv serde: already registered as '{_registered}'")
            return name
        try:
            from lmcache.v1.distributed.serde import get_registered_serde_types, register_serde_factory
        except ImportError as e:
            raise E8kvError(f"e8kv.lmcache.register: LMCache is not importable ({e}); tested with lmcache=="
                            f"{LMCACHE_VERSION} (scripts/lmcache-venv.sh)") from None
        if name in get_registered_serde_types():
            raise E8kvError(f"e8kv.lmcache.register: LMCache already has a serde named '{name}'")
        register_serde_factory(name, _create)
        _registered = name
        return name
