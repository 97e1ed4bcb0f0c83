"""ctypes binding of the part of e8kv's C ABI (include/e8kv/c_api.h) the peer harness uses:
compressor, compress with observation queries, decompression to dense rows with the -inf mask,
honest bits per element. Tensors are torch float32, row-major NHD, as the header states."""
import ctypes

import torch


class E8kvError(RuntimeError):
    pass


class _Shape(ctypes.Structure):
    _fields_ = [("n_layers", ctypes.c_int32), ("n_kv_heads", ctypes.c_int32),
                ("n_q_heads", ctypes.c_int32), ("head_dim", ctypes.c_int32)]


class _KvInput(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int32), ("n_tokens", ctypes.c_int64),
                ("keys", ctypes.POINTER(ctypes.c_void_p)), ("values", ctypes.POINTER(ctypes.c_void_p)),
                ("positions", ctypes.POINTER(ctypes.c_int32)), ("first_position", ctypes.c_int32)]


class _QueryInput(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int32), ("n_queries", ctypes.c_int64),
                ("queries", ctypes.POINTER(ctypes.c_void_p)), ("positions", ctypes.POINTER(ctypes.c_int32))]


_F32 = 0


class E8kv:
    """One loaded libe8kv_c.so."""

    def __init__(self, path):
        lib = ctypes.CDLL(path)
        vp, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
        lib.e8kv_last_error.restype = ctypes.c_char_p
        lib.e8kv_version_string.restype = ctypes.c_char_p
        lib.e8kv_compressor_create.argtypes = [ctypes.POINTER(_Shape), ctypes.c_char_p, ctypes.POINTER(vp)]
        lib.e8kv_compressor_destroy.argtypes = [vp]
        lib.e8kv_compressor_describe.argtypes = [vp, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
        lib.e8kv_compress.argtypes = [vp, ctypes.POINTER(_KvInput), ctypes.POINTER(_QueryInput), vp, ctypes.POINTER(vp)]
        lib.e8kv_cache_destroy.argtypes = [vp]
        lib.e8kv_cache_layer_extent.argtypes = [vp, i32, ctypes.POINTER(i32), ctypes.POINTER(i64)]
        lib.e8kv_decompress_layer.argtypes = [vp, i32, i64, vp, vp, vp, vp]
        lib.e8kv_cache_bits_per_element.argtypes = [vp, ctypes.POINTER(ctypes.c_double)]
        lib.e8kv_cache_bytes.argtypes = [vp, ctypes.POINTER(ctypes.c_uint64)]
        lib.e8kv_serialized_size.argtypes = [vp, ctypes.POINTER(ctypes.c_size_t)]
        lib.e8kv_append.argtypes = [vp, vp, i32, i32, vp, vp, i32]
        lib.e8kv_attend.argtypes = [vp, i32, vp, i32, vp, vp, vp]
        lib.e8kv_thread_pool_create.argtypes = [i32, ctypes.POINTER(vp)]
        lib.e8kv_thread_pool_destroy.argtypes = [vp]
        self.lib = lib
        self.version = lib.e8kv_version_string().decode()

    def _check(self, status, what):
        if status != 0:
            raise E8kvError(f"{what}: {self.lib.e8kv_last_error().decode()}")

    def describe(self, compressor):
        n = ctypes.c_size_t()
        self._check(self.lib.e8kv_compressor_describe(compressor, None, 0, ctypes.byref(n)), "describe")
        buf = ctypes.create_string_buffer(n.value + 1)
        self._check(self.lib.e8kv_compressor_describe(compressor, buf, n.value + 1, ctypes.byref(n)), "describe")
        return buf.value.decode()

    def compress(self, shape, spec, keys, values, queries, threads=1):
        """keys, values: per layer [tokens, kv_heads, head_dim]; queries: per layer [window, q_heads,
        head_dim] or None. Returns a Cache (owns its handle and the compressor's, which append needs)."""
        lib = self.lib
        sh = _Shape(*shape)
        comp = ctypes.c_void_p()
        self._check(lib.e8kv_compressor_create(ctypes.byref(sh), spec.encode(), ctypes.byref(comp)),
                    f"compressor '{spec}'")
        pool = ctypes.c_void_p()
        try:
            keys = [k.float().contiguous() for k in keys]
            values = [v.float().contiguous() for v in values]
            kp = (ctypes.c_void_p * len(keys))(*[k.data_ptr() for k in keys])
            vp = (ctypes.c_void_p * len(values))(*[v.data_ptr() for v in values])
            kv = _KvInput(_F32, keys[0].shape[0], kp, vp, None, 0)
            qin = None
            if queries is not None:
                queries = [q.float().contiguous() for q in queries]
                qp = (ctypes.c_void_p * len(queries))(*[q.data_ptr() for q in queries])
                qin = _QueryInput(_F32, queries[0].shape[0], qp, None)
            self._check(lib.e8kv_thread_pool_create(threads, ctypes.byref(pool)), "thread pool")
            cache = ctypes.c_void_p()
            self._check(lib.e8kv_compress(comp, ctypes.byref(kv), ctypes.byref(qin) if qin is not None else None,
                                          pool, ctypes.byref(cache)), f"compress '{spec}'")
            result = Cache(self, cache, comp, shape, self.describe(comp))
            comp = ctypes.c_void_p()  # the Cache owns it now
            return result
        finally:
            lib.e8kv_thread_pool_destroy(pool)
            lib.e8kv_compressor_destroy(comp)


class Cache:
    def __init__(self, e8kv, handle, compressor, shape, description):
        self.e8kv, self.handle, self.compressor = e8kv, handle, compressor
        self.shape, self.description = shape, description

    def __del__(self):
        if self.handle:
            self.e8kv.lib.e8kv_cache_destroy(self.handle)
            self.handle = None
        if self.compressor:
            self.e8kv.lib.e8kv_compressor_destroy(self.compressor)
            self.compressor = None

    def append(self, layer, key, value, position):
        """One token of one layer: key (post-RoPE) and value [kv_heads, head_dim] float32."""
        key, value = key.float().contiguous(), value.float().contiguous()
        self.e8kv._check(self.e8kv.lib.e8kv_append(self.compressor, self.handle, layer, _F32, key.data_ptr(),
                                                   value.data_ptr(), position), "append")

    def attend(self, layer, q, position):
        """Decode attention of one query token [q_heads, head_dim] over the codes: [q_heads, head_dim]."""
        q = q.float().contiguous()
        out = torch.empty_like(q)
        self.e8kv._check(self.e8kv.lib.e8kv_attend(self.handle, layer, q.data_ptr(), position, out.data_ptr(),
                                                   None, None), "attend")
        return out

    def bits_per_element(self):
        b = ctypes.c_double()
        self.e8kv._check(self.e8kv.lib.e8kv_cache_bits_per_element(self.handle, ctypes.byref(b)), "bits")
        return b.value

    def bytes(self):
        b = ctypes.c_uint64()
        self.e8kv._check(self.e8kv.lib.e8kv_cache_bytes(self.handle, ctypes.byref(b)), "bytes")
        return b.value

    def serialized_size(self):
        """Bytes of the offload container (delta + zstd, docs/format.md) of this cache."""
        n = ctypes.c_size_t()
        self.e8kv._check(self.e8kv.lib.e8kv_serialized_size(self.handle, ctypes.byref(n)), "serialized size")
        return n.value

    def decompress_layer(self, layer):
        """(positions [n], keys [n, kv_heads, d], values [n, kv_heads, d], mask [kv_heads, n]); the
        mask is 0 where the head stores the row's position and -inf where it was evicted."""
        lib = self.e8kv.lib
        first, n = ctypes.c_int32(), ctypes.c_int64()
        self.e8kv._check(lib.e8kv_cache_layer_extent(self.handle, layer, ctypes.byref(first), ctypes.byref(n)), "extent")
        _, hkv, _, d = self.shape
        pos = torch.empty(n.value, dtype=torch.int32)
        k = torch.empty(n.value, hkv, d, dtype=torch.float32)
        v = torch.empty(n.value, hkv, d, dtype=torch.float32)
        mask = torch.empty(hkv, n.value, dtype=torch.float32)
        self.e8kv._check(lib.e8kv_decompress_layer(self.handle, layer, n.value, pos.data_ptr(), k.data_ptr(),
                                                   v.data_ptr(), mask.data_ptr()), "decompress")
        return pos, k, v, mask
