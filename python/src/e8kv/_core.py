"""Compressor, Cache, ThreadPool and the module functions: Python objects over the C ABI's handles.

Every call goes to libe8kv_c (nothing here computes attention or codes). Arguments are checked
and converted first (e8kv._arrays); a status other than E8KV_OK becomes E8kvError with the
library's own message. Each handle has a readers-writer guard that enforces c_api.h's thread
rules from Python: calls that only read it run concurrently (ctypes releases the GIL), a call that
modifies or closes it waits until they end and runs alone, and a call on a closed object raises.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading
from ctypes import POINTER, byref, c_double, c_float, c_int32, c_int64, c_size_t, c_uint64, c_void_p
from typing import Any, Iterator, List, NamedTuple, Optional, Sequence, Tuple, TypeVar

import numpy as np

from . import _arrays, _capi

_lib: Optional[ctypes.CDLL] = None
_lib_lock = threading.Lock()


def lib() -> ctypes.CDLL:
    """The loaded libe8kv_c (loaded on first use)."""
    global _lib
    if _lib is None:
        with _lib_lock:
            if _lib is None:
                _lib = _capi.load()
    return _lib


class E8kvError(RuntimeError):
    """A call e8kv refused. `status` is the C ABI's status name ("invalid argument", "unsupported",
    "corrupt data", "out of memory", "internal error"); the message is the library's, which names
    the function, the argument and the accepted values."""

    def __init__(self, message: str, status: str = "invalid argument"):
        super().__init__(message)
        self.status = status


def _check(status: int) -> None:
    if status != 0:
        name = lib().e8kv_status_name(status).decode()
        raise E8kvError(lib().e8kv_last_error().decode(errors="replace"), name)


@contextlib.contextmanager
def _arguments(where: str) -> Iterator[None]:
    """Argument errors found in Python, raised as E8kvError naming the method."""
    try:
        yield
    except _arrays.ArrayError as e:
        raise E8kvError(f"{where}: {e}") from None


def _f32p(a: Optional[np.ndarray]):
    return None if a is None else a.ctypes.data_as(POINTER(c_float))


def _i32p(a: Optional[np.ndarray]):
    return None if a is None else a.ctypes.data_as(POINTER(c_int32))


class _Guard:
    """Readers-writer guard of one handle. Readers never wait for a waiting writer, so a call that
    holds several read guards (attend_batch) cannot deadlock with one that writes one handle."""

    def __init__(self, kind: str):
        self.kind = kind
        self.handle: Optional[int] = None
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False

    def _closed(self, where: str) -> E8kvError:
        return E8kvError(f"{where}: the {self.kind} is closed")

    @contextlib.contextmanager
    def read(self, where: str) -> Iterator[int]:
        with self._cond:
            while self._writing:
                self._cond.wait()
            if self.handle is None:
                raise self._closed(where)
            self._readers += 1
        try:
            yield self.handle
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def write(self, where: str) -> Iterator[int]:
        with self._cond:
            while self._writing or self._readers:
                self._cond.wait()
            if self.handle is None:
                raise self._closed(where)
            self._writing = True
        try:
            yield self.handle
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()

    def close(self, destroy) -> None:
        with self._cond:
            while self._writing or self._readers:
                self._cond.wait()
            handle, self.handle = self.handle, None
        if handle:
            destroy(handle)


_Handle = TypeVar("_Handle", bound="_NativeHandle")


class _NativeHandle:
    """The lifetime of an object that owns one library handle (ThreadPool, Compressor, Cache),
    written once: the handle lives in a _Guard; close / closed / `with` / garbage collection free
    it through the subclass's C destroy function. A subclass names its kind (in "the cache is
    closed") and its destroy function, and calls _own(handle) as soon as the library made one, so
    that a later failure in its constructor still frees it."""

    _kind = ""     # "thread pool", "compressor", "cache"
    _destroy = ""  # the c_api.h function that frees the handle, e.g. "e8kv_cache_destroy"

    def _own(self, handle: int) -> None:
        self._guard = _Guard(self._kind)
        self._guard.handle = handle

    def close(self) -> None:
        """Frees the handle, after the calls running on it end; later use raises E8kvError."""
        self._guard.close(getattr(lib(), self._destroy))

    @property
    def closed(self) -> bool:
        return self._guard.handle is None

    def __enter__(self: _Handle) -> _Handle:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        # Not before the constructor owned a handle, nor once the interpreter dropped the library.
        if getattr(self, "_guard", None) is not None and _lib is not None:
            self.close()


@contextlib.contextmanager
def _pool_handle(pool: Optional["ThreadPool"], where: str) -> Iterator[Optional[int]]:
    if pool is None:
        yield None
        return
    if not isinstance(pool, ThreadPool):
        raise E8kvError(f"{where}: pool is a {type(pool).__name__}; expected e8kv.ThreadPool or None")
    with pool._guard.read(where) as handle:
        yield handle


# ---- presets, versions ---------------------------------------------------------------------------

def presets() -> List[str]:
    """The names `preset=NAME` accepts, from the library."""
    return [n.strip() for n in lib().e8kv_preset_names().decode().split(",") if n.strip()]


def library_version() -> str:
    """The C library's version ("major.minor.patch")."""
    return lib().e8kv_version_string().decode()


def format_version() -> int:
    """The newest container format version the library reads and writes."""
    return int(lib().e8kv_format_version())


class ModelShape(NamedTuple):
    """The KV shape of a model: layers, KV heads, query heads (a multiple: GQA), head_dim."""
    n_layers: int
    n_kv_heads: int
    n_q_heads: int
    head_dim: int


def _shape(shape: Any, where: str) -> ModelShape:
    try:
        values = [int(x) for x in shape]
    except (TypeError, ValueError):
        raise E8kvError(f"{where}: shape must be (n_layers, n_kv_heads, n_q_heads, head_dim); got {shape!r}") from None
    if len(values) != 4 or any(not (0 <= v < 2**31) for v in values):
        raise E8kvError(f"{where}: shape must be 4 integers in [0, 2^31) (n_layers, n_kv_heads, n_q_heads, "
                        f"head_dim); got {shape!r}")
    return ModelShape(*values)


# ---- thread pool ---------------------------------------------------------------------------------

class ThreadPool(_NativeHandle):
    """A pool of `threads` workers (the calling thread is one of them) for compress, extend and
    attention calls (`pool=`). Results never depend on the pool or its size. close() waits for
    the calls using it."""

    _kind, _destroy = "thread pool", "e8kv_thread_pool_destroy"

    def __init__(self, threads: int):
        handle = c_void_p()
        if not isinstance(threads, int):
            raise E8kvError(f"ThreadPool: threads is a {type(threads).__name__}; expected an int in 1 .. 1024")
        _check(lib().e8kv_thread_pool_create(threads if -2**31 <= threads < 2**31 else -1, byref(handle)))
        self._own(handle.value)
        self.threads = threads


# ---- compressor ----------------------------------------------------------------------------------

class Compressor(_NativeHandle):
    """The pipeline for one model shape and configuration.

    shape: (n_layers, n_kv_heads, n_q_heads, head_dim); spec: a configuration string, e.g.
    "preset=high", "preset=quant-k3v2,evict=0.5,rope_theta=500000" ("" is the default; e8kv.presets()
    lists the presets). Immutable: any number of threads may use one at once. After close(), the
    caches it made stay usable for reads.
    """

    _kind, _destroy = "compressor", "e8kv_compressor_destroy"

    def __init__(self, shape: Sequence[int], spec: str = ""):
        where = "Compressor"
        self.shape = _shape(shape, where)
        if not isinstance(spec, str):
            raise E8kvError(f"{where}: spec is a {type(spec).__name__}; expected a string such as 'preset=high'")
        handle = c_void_p()
        _check(lib().e8kv_compressor_create(byref(_capi.ModelShape(*self.shape)), spec.encode(), byref(handle)))
        self._own(handle.value)
        self.spec = self.describe()

    def __repr__(self) -> str:
        return f"<e8kv.Compressor {tuple(self.shape)} {self.spec if not self.closed else 'closed'}>"

    @property
    def obs_window(self) -> int:
        """The observation window (spec key `window`): how many of a prefill's last queries score its
        tokens (the scorers, query-weighted keys)."""
        for item in self.spec.split(","):
            key, _, value = item.partition("=")
            if key == "window":
                return int(value)
        raise E8kvError("Compressor.obs_window: the configuration names no window")

    def describe(self) -> str:
        """Every field of the configuration as a spec string."""
        with self._guard.read("Compressor.describe") as h:
            n = c_size_t()
            _check(lib().e8kv_compressor_describe(h, None, 0, byref(n)))
            buf = ctypes.create_string_buffer(n.value + 1)
            _check(lib().e8kv_compressor_describe(h, buf, n.value + 1, byref(n)))
            return buf.value.decode()

    def _kv_input(self, keys, values, positions, first_position, where):
        n_layers, n_kv, _, d = self.shape
        ks = _arrays.per_layer(keys, "keys", n_layers)
        vs = _arrays.per_layer(values, "values", n_layers)
        k0, code = _arrays.as_tensor(ks[0], "keys[0]", (None, n_kv, d))
        n = k0.shape[0]
        arrays = []
        for name, items in (("keys", ks), ("values", vs)):
            for i, x in enumerate(items):
                a, c = _arrays.as_tensor(x, f"{name}[{i}]", (n, n_kv, d))
                if c != code:
                    raise _arrays.ArrayError(f"{name}[{i}] has another dtype than keys[0]; every layer's keys and "
                                             f"values must share one dtype")
                arrays.append(a)
        pos = None if positions is None else _arrays.as_int32(positions, "positions", n)
        if not isinstance(first_position, (int, np.integer)) or not (-2**31 <= first_position < 2**31):
            raise _arrays.ArrayError(f"first_position must be an int32; got {first_position!r}")
        kp = (c_void_p * n_layers)(*[a.ctypes.data for a in arrays[:n_layers]])
        vp = (c_void_p * n_layers)(*[a.ctypes.data for a in arrays[n_layers:]])
        kv = _capi.KvInput(code, n, kp, vp, _i32p(pos), int(first_position))
        return kv, (arrays, pos, kp, vp), n, pos

    def _query_input(self, queries, query_positions):
        if queries is None:
            return None, None
        n_layers, _, n_q, d = self.shape
        qs = _arrays.per_layer(queries, "queries", n_layers)
        q0, code = _arrays.as_tensor(qs[0], "queries[0]", (None, n_q, d))
        w = q0.shape[0]
        if w < 1:
            raise _arrays.ArrayError("queries hold no token; pass None, or at least one query per layer")
        arrays = []
        for i, x in enumerate(qs):
            a, c = _arrays.as_tensor(x, f"queries[{i}]", (w, n_q, d))
            if c != code:
                raise _arrays.ArrayError(f"queries[{i}] has another dtype than queries[0]")
            arrays.append(a)
        pos = None if query_positions is None else _arrays.as_int32(query_positions, "query_positions", w)
        qp = (c_void_p * n_layers)(*[a.ctypes.data for a in arrays])
        return _capi.QueryInput(code, w, qp, _i32p(pos)), (arrays, pos, qp)

    def compress(self, keys, values, queries=None, *, positions=None, first_position: int = 0,
                 query_positions=None, pool: Optional[ThreadPool] = None) -> "Cache":
        """Scores, evicts and codes a prefill into a new Cache.

        keys, values: per layer [tokens, n_kv_heads, head_dim] (a list of arrays, or one array
        [layers, tokens, n_kv_heads, head_dim]), keys post-RoPE; float32, float16 or bfloat16,
        numpy, torch or anything with DLPack / the buffer protocol. queries: the observation
        window, per layer [window, n_q_heads, head_dim] post-RoPE (the last queries of the
        prefill), or None (eviction then scores keys only; keys are coded without query
        weighting). positions: [tokens] strictly increasing, or None: first_position + t.
        query_positions: [window], or None: the last positions of the sequence.
        """
        where = "Compressor.compress"
        with _arguments(where):
            kv, keep_kv, n, pos = self._kv_input(keys, values, positions, first_position, where)
            qin, keep_q = self._query_input(queries, query_positions)
        with self._guard.read(where) as h, _pool_handle(pool, where) as p:
            handle = c_void_p()
            _check(lib().e8kv_compress(h, byref(kv), byref(qin) if qin is not None else None, p, byref(handle)))
        cache = Cache._adopt(handle.value, self)
        cache._next_position = _after(pos, first_position, n)
        return cache


def _after(pos: Optional[np.ndarray], first_position: int, n: int) -> Optional[int]:
    if n == 0:
        return None
    return int(pos[-1]) + 1 if pos is not None else int(first_position) + n


# ---- cache ---------------------------------------------------------------------------------------

class AttendRequest(NamedTuple):
    """One sequence's share of e8kv.attend_batch: q [n_tokens, n_q_heads, head_dim] attending to
    every token `layer` of `cache` stores; positions [n_tokens] (or None: unchecked)."""
    cache: "Cache"
    layer: int
    q: Any
    positions: Any = None


class Cache(_NativeHandle):
    """A compressed KV cache: what attention reads (codes, gains, positions, the fp16 window).

    Made by Compressor.compress or Cache.from_bytes. Reads (attend, decompress, to_bytes, sizes)
    may run concurrently from several threads; append / extend / drop_before / close wait for
    them and run alone.
    """

    _kind, _destroy = "cache", "e8kv_cache_destroy"

    def __init__(self) -> None:
        raise TypeError("a Cache is made by Compressor.compress or Cache.from_bytes")

    @classmethod
    def _adopt(cls, handle: int, compressor: Optional[Compressor]) -> "Cache":
        self = object.__new__(cls)
        self._own(handle)
        self.compressor = compressor
        s = _capi.ModelShape()
        _check(lib().e8kv_cache_shape(handle, byref(s)))
        self.shape = ModelShape(s.n_layers, s.n_kv_heads, s.n_q_heads, s.head_dim)
        self._next_position = None
        return self

    def _compressor(self, compressor: Optional[Compressor], where: str) -> Compressor:
        c = compressor if compressor is not None else self.compressor
        if c is None:
            raise E8kvError(f"{where}: this cache was read without a compressor; pass compressor= (one of the "
                            f"configuration and shape it was written with) here or to Cache.from_bytes")
        if not isinstance(c, Compressor):
            raise E8kvError(f"{where}: compressor is a {type(c).__name__}; expected e8kv.Compressor")
        return c

    # -- modify
    def extend(self, keys, values, queries=None, *, positions=None, first_position: Optional[int] = None,
               query_positions=None, compressor: Optional[Compressor] = None,
               pool: Optional[ThreadPool] = None) -> None:
        """Compresses a later chunk (multi-turn) into this cache; stored tokens are never re-coded.
        Arguments as Compressor.compress; first_position defaults to the position after the
        cache's last token."""
        where = "Cache.extend"
        c = self._compressor(compressor, where)
        if first_position is None:
            first_position = self.next_position if positions is None else 0
        with _arguments(where):
            kv, keep_kv, n, pos = c._kv_input(keys, values, positions, first_position, where)
            qin, keep_q = c._query_input(queries, query_positions)
        with c._guard.read(where) as ch, self._guard.write(where) as h, _pool_handle(pool, where) as p:
            _check(lib().e8kv_extend(ch, h, byref(kv), byref(qin) if qin is not None else None, p))
        after = _after(pos, first_position, n)
        if after is not None:
            self._next_position = after

    def append(self, layer: int, key, value, position: int, *, compressor: Optional[Compressor] = None) -> None:
        """Appends one decoded token to one layer: key (post-RoPE) and value [n_kv_heads, head_dim];
        position must follow every position the layer stores."""
        where = "Cache.append"
        c = self._compressor(compressor, where)
        _, n_kv, _, d = self.shape
        with _arguments(where):
            k, code = _arrays.as_tensor(key, "key", (n_kv, d))
            v, vcode = _arrays.as_tensor(value, "value", (n_kv, d))
            if vcode != code:
                raise _arrays.ArrayError("key and value have different dtypes")
            layer, position = _int32(layer, "layer"), _int32(position, "position")
        with c._guard.read(where) as ch, self._guard.write(where) as h:
            _check(lib().e8kv_append(ch, h, layer, code, k.ctypes.data, v.ctypes.data, position))
        if self._next_position is None or position + 1 > self._next_position:
            self._next_position = position + 1

    def drop_before(self, position: int, *, compressor: Optional[Compressor] = None) -> None:
        """Removes every token stored below `position` from every layer (a sliding window)."""
        where = "Cache.drop_before"
        c = self._compressor(compressor, where)
        with _arguments(where):
            position = _int32(position, "position")
        with c._guard.read(where) as ch, self._guard.write(where) as h:
            _check(lib().e8kv_drop_before(ch, h, position))

    # -- attention
    def attend(self, layer: int, q, position, *, return_lse: bool = False, pool: Optional[ThreadPool] = None):
        """Decode attention over everything `layer` stores, reading the codes.

        q: [n_q_heads, head_dim] (one token at `position`) or [n, n_q_heads, head_dim] with
        positions [n] (each token attends the whole cache). Returns out (float32, q's shape) or,
        with return_lse=True, (out, lse): lse [n_q_heads] (or [n, n_q_heads]) is the natural-log
        sum of exp(scale * q.k), for e8kv.merge_attention.
        """
        where = "Cache.attend"
        _, _, n_q, d = self.shape
        with _arguments(where):
            layer = _int32(layer, "layer")
            if getattr(q, "ndim", None) == 3 or (isinstance(q, (list, tuple)) and np.ndim(q) == 3):
                qa = _arrays.as_float32(q, "q", (None, n_q, d))
                out, lse = attend_batch([AttendRequest(self, layer, qa, position)], pool=pool)[0]
                return (out, lse) if return_lse else out
            qa = _arrays.as_float32(q, "q", (n_q, d))
            position = _int32(position, "position")
        out = np.empty((n_q, d), np.float32)
        lse = np.empty((n_q,), np.float32) if return_lse else None
        with self._guard.read(where) as h, _pool_handle(pool, where) as p:
            _check(lib().e8kv_attend(h, layer, _f32p(qa), position, _f32p(out), _f32p(lse), p))
        return (out, lse) if return_lse else out

    @staticmethod
    def attend_batch(requests: Sequence[AttendRequest], pool: Optional[ThreadPool] = None,
                     ) -> List[Tuple[np.ndarray, np.ndarray]]:
        """e8kv.attend_batch: several caches / layers / query tokens in one library call."""
        return attend_batch(requests, pool=pool)

    # -- read out
    def layer_extent(self, layer: int) -> Tuple[int, int]:
        """(first_position, rows) of the layer's dense view."""
        with _arguments("Cache.layer_extent"):
            layer = _int32(layer, "layer")
        first, n = c_int32(), c_int64()
        with self._guard.read("Cache.layer_extent") as h:
            _check(lib().e8kv_cache_layer_extent(h, layer, byref(first), byref(n)))
        return first.value, n.value

    def decompress(self, layer: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The layer decoded to dense float32 rows: (positions [n] int32, keys [n, n_kv_heads,
        head_dim] post-RoPE, values [n, n_kv_heads, head_dim], mask [n_kv_heads, n]: 0 where the head
        stores the row's position, -inf where it evicted it; keys and values are 0 there)."""
        where = "Cache.decompress"
        with _arguments(where):
            layer = _int32(layer, "layer")
        _, n_kv, _, d = self.shape
        with self._guard.read(where) as h:
            first, n = c_int32(), c_int64()
            _check(lib().e8kv_cache_layer_extent(h, layer, byref(first), byref(n)))
            rows = n.value
            pos = np.empty(rows, np.int32)
            k = np.empty((rows, n_kv, d), np.float32)
            v = np.empty((rows, n_kv, d), np.float32)
            mask = np.empty((n_kv, rows), np.float32)
            _check(lib().e8kv_decompress_layer(h, layer, rows, _i32p(pos), _f32p(k), _f32p(v), _f32p(mask)))
        return pos, k, v, mask

    def to_bytes(self) -> bytes:
        """The cache as an e8kv container (delta + zstd, checksummed; docs/format.md)."""
        with self._guard.read("Cache.to_bytes") as h:
            buf, size = c_void_p(), c_size_t()
            _check(lib().e8kv_serialize_alloc(h, byref(buf), byref(size)))
        try:
            return ctypes.string_at(buf.value, size.value) if size.value else b""
        finally:
            lib().e8kv_free(buf)

    @classmethod
    def from_bytes(cls, data, compressor: Optional[Compressor] = None) -> "Cache":
        """Reads a container written by to_bytes. Nothing in `data` is trusted (damage gives
        E8kvError "corrupt data"). With a compressor, the container's configuration and shape must
        equal its own, and append / extend use it; without one, pass compressor= to them."""
        where = "Cache.from_bytes"
        try:
            view = memoryview(data).cast("B")
        except TypeError:
            raise E8kvError(f"{where}: data is a {type(data).__name__}; expected bytes or a buffer") from None
        buf = (ctypes.c_char * len(view)).from_buffer_copy(view) if len(view) else None
        if compressor is not None and not isinstance(compressor, Compressor):
            raise E8kvError(f"{where}: compressor is a {type(compressor).__name__}; expected e8kv.Compressor")
        handle = c_void_p()
        if compressor is not None:
            with compressor._guard.read(where) as ch:
                _check(lib().e8kv_deserialize(buf, len(view), ch, byref(handle)))
        else:
            _check(lib().e8kv_deserialize(buf, len(view), None, byref(handle)))
        return cls._adopt(handle.value, compressor)

    # -- sizes
    def _query(self, function: str, ctype, *args):
        value = ctype()
        with self._guard.read(f"Cache.{function}") as h:
            _check(getattr(lib(), f"e8kv_cache_{function}")(h, *args, byref(value)))
        return value.value

    @property
    def nbytes(self) -> int:
        """Every byte a decoder needs: codes, gains, means, positions, fp16 window, descriptor."""
        return int(self._query("bytes", c_uint64))

    @property
    def bits_per_element(self) -> float:
        """8 * nbytes / (original tokens * layers * kv heads * head_dim * 2)."""
        return float(self._query("bits_per_element", c_double))

    @property
    def compression_ratio(self) -> float:
        """fp16 bytes of K and V of every original token / nbytes."""
        return float(self._query("compression_ratio", c_double))

    @property
    def original_tokens(self) -> int:
        """Tokens ever given (before eviction), the largest over layers."""
        return int(self._query("original_tokens", c_int64))

    def stored_tokens(self, layer: int, kv_head: int) -> int:
        """Tokens a (layer, kv_head) stores after eviction."""
        with _arguments("Cache.stored_tokens"):
            layer, kv_head = _int32(layer, "layer"), _int32(kv_head, "kv_head")
        return int(self._query("stored_tokens", c_int64, layer, kv_head))

    def serialized_size(self) -> int:
        """Bytes to_bytes would return (it compresses the cache to know)."""
        with self._guard.read("Cache.serialized_size") as h:
            n = c_size_t()
            _check(lib().e8kv_serialized_size(h, byref(n)))
        return n.value

    def serialized_size_bound(self) -> int:
        """An upper bound on serialized_size without compressing; it depends only on the layout and
        the stored token counts, so caches of one configuration and token count share it."""
        with self._guard.read("Cache.serialized_size_bound") as h:
            n = c_size_t()
            _check(lib().e8kv_serialized_size_bound(h, byref(n)))
        return n.value

    @property
    def next_position(self) -> int:
        """The position after the last token stored (what append / extend continue from)."""
        if self._next_position is None:
            last = -1
            for layer in range(self.shape.n_layers):
                first, rows = self.layer_extent(layer)
                if rows:
                    pos = self.decompress_positions(layer)
                    last = max(last, int(pos[-1]))
            self._next_position = last + 1
        return self._next_position

    def decompress_positions(self, layer: int) -> np.ndarray:
        """The positions of the layer's dense rows (decodes nothing else)."""
        with self._guard.read("Cache.decompress_positions") as h:
            first, n = c_int32(), c_int64()
            _check(lib().e8kv_cache_layer_extent(h, layer, byref(first), byref(n)))
            pos = np.empty(n.value, np.int32)
            _check(lib().e8kv_decompress_layer(h, layer, n.value, _i32p(pos), None, None, None))
        return pos

    def __repr__(self) -> str:
        if self.closed:
            return "<e8kv.Cache closed>"
        return (f"<e8kv.Cache {self.shape.n_layers} layers x {self.shape.n_kv_heads} kv heads x "
                f"{self.shape.head_dim}, {self.original_tokens} tokens, {self.nbytes} bytes, "
                f"{self.bits_per_element:.3f} bits/element>")


def _int32(x: Any, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise _arrays.ArrayError(f"{name} is a {type(x).__name__}; expected an int")
    if not -2**31 <= int(x) < 2**31:
        raise _arrays.ArrayError(f"{name} {int(x)} does not fit int32")
    return int(x)


def attend_batch(requests: Sequence[AttendRequest], pool: Optional[ThreadPool] = None,
                 ) -> List[Tuple[np.ndarray, np.ndarray]]:
    """Every request in one library call (e8kv_attend_batch), spread over the pool: the same
    results as Cache.attend token by token. Each request is an AttendRequest (or a tuple cache,
    layer, q [n, n_q_heads, head_dim], positions [n] or None). Returns [(out, lse)] per request:
    out [n, n_q_heads, head_dim], lse [n, n_q_heads], float32."""
    where = "attend_batch"
    reqs = (_capi.AttendRequest * max(1, len(requests)))()
    keep, results, caches = [], [], []
    with _arguments(where):
        for i, r in enumerate(requests):
            r = AttendRequest(*r)
            if not isinstance(r.cache, Cache):
                raise _arrays.ArrayError(f"requests[{i}].cache is a {type(r.cache).__name__}; expected e8kv.Cache")
            _, _, n_q, d = r.cache.shape
            layer = _int32(r.layer, f"requests[{i}].layer")
            q = _arrays.as_float32(r.q, f"requests[{i}].q", (None, n_q, d))
            n = q.shape[0]
            if n < 1 or n >= 2**31:
                raise _arrays.ArrayError(f"requests[{i}].q holds {n} tokens; accepted: 1 .. 2^31 - 1")
            pos = None if r.positions is None else _arrays.as_int32(np.atleast_1d(np.asarray(
                r.positions.detach().cpu().numpy() if _arrays._is_torch_tensor(r.positions) else r.positions)),
                f"requests[{i}].positions", n)
            out = np.empty((n, n_q, d), np.float32)
            lse = np.empty((n, n_q), np.float32)
            keep += [q, pos]
            results.append((out, lse))
            caches.append(r.cache)
            reqs[i].layer, reqs[i].n_tokens = layer, n
            reqs[i].q, reqs[i].out, reqs[i].lse, reqs[i].positions = _f32p(q), _f32p(out), _f32p(lse), _i32p(pos)
    with contextlib.ExitStack() as stack:
        for i, c in enumerate(caches):
            reqs[i].cache = stack.enter_context(c._guard.read(where))
        p = stack.enter_context(_pool_handle(pool, where))
        _check(lib().e8kv_attend_batch(reqs, len(caches), p))
    return results


def merge_attention(out_a, lse_a, out_b, lse_b) -> Tuple[np.ndarray, np.ndarray]:
    """The attention over the union of two disjoint key sets from each set's (out, lse):
    out_* [n_heads, head_dim], lse_* [n_heads]. Returns (out, lse), float32."""
    where = "merge_attention"
    with _arguments(where):
        oa = _arrays.as_float32(out_a, "out_a", (None, None))
        h, d = oa.shape
        ob = _arrays.as_float32(out_b, "out_b", (h, d))
        la = _arrays.as_float32(lse_a, "lse_a", (h,))
        lb = _arrays.as_float32(lse_b, "lse_b", (h,))
    out, lse = np.empty((h, d), np.float32), np.empty((h,), np.float32)
    _check(lib().e8kv_merge_attention(_f32p(oa), _f32p(la), _f32p(ob), _f32p(lb), h, d, _f32p(out), _f32p(lse)))
    return out, lse
