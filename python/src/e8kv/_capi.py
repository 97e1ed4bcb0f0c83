"""ctypes mirror of include/e8kv/c_api.h: its structs, enums and every exported function.

tests/test_capi_header.py parses the header and compares it with the tables below (names, field
order, argument and return types), so this file cannot drift from the C ABI. Nothing here holds
logic: the classes of e8kv/__init__.py call these functions and turn statuses into exceptions.
"""
from __future__ import annotations

import ctypes
import os
from ctypes import POINTER, c_char_p, c_double, c_float, c_int, c_int32, c_int64, c_size_t, c_uint64, c_void_p

# ---- enums ----------------------------------------------------------------------------------------

STATUS = {
    "E8KV_OK": 0,
    "E8KV_ERROR_INVALID_ARGUMENT": 1,
    "E8KV_ERROR_UNSUPPORTED": 2,
    "E8KV_ERROR_CORRUPT_DATA": 3,
    "E8KV_ERROR_OUT_OF_MEMORY": 4,
    "E8KV_ERROR_INTERNAL": 5,
}
DTYPE = {"E8KV_DTYPE_F32": 0, "E8KV_DTYPE_F16": 1, "E8KV_DTYPE_BF16": 2}
F32, F16, BF16 = DTYPE["E8KV_DTYPE_F32"], DTYPE["E8KV_DTYPE_F16"], DTYPE["E8KV_DTYPE_BF16"]


# ---- structs --------------------------------------------------------------------------------------

class ModelShape(ctypes.Structure):
    _fields_ = [("n_layers", c_int32), ("n_kv_heads", c_int32), ("n_q_heads", c_int32), ("head_dim", c_int32)]


class KvInput(ctypes.Structure):
    _fields_ = [("dtype", c_int32), ("n_tokens", c_int64), ("keys", POINTER(c_void_p)),
                ("values", POINTER(c_void_p)), ("positions", POINTER(c_int32)), ("first_position", c_int32)]


class QueryInput(ctypes.Structure):
    _fields_ = [("dtype", c_int32), ("n_queries", c_int64), ("queries", POINTER(c_void_p)),
                ("positions", POINTER(c_int32))]


class AttendRequest(ctypes.Structure):
    _fields_ = [("cache", c_void_p), ("layer", c_int32), ("n_tokens", c_int32), ("q", POINTER(c_float)),
                ("out", POINTER(c_float)), ("lse", POINTER(c_float)), ("positions", POINTER(c_int32))]


STRUCTS = {"e8kv_model_shape": ModelShape, "e8kv_kv_input": KvInput, "e8kv_query_input": QueryInput,
           "e8kv_attend_request": AttendRequest}

# ---- functions: name -> (restype, argtypes), in the header's order -------------------------------
# Handles (e8kv_compressor*, e8kv_cache*, e8kv_thread_pool*) are c_void_p; a handle returned
# through an out-parameter is POINTER(c_void_p); e8kv_status (a C enum) is c_int.

_status = c_int
_handle = c_void_p
_out_handle = POINTER(c_void_p)

FUNCTIONS = {
    "e8kv_status_name": (c_char_p, [c_int32]),
    "e8kv_last_error": (c_char_p, []),
    "e8kv_version": (c_int32, []),
    "e8kv_version_string": (c_char_p, []),
    "e8kv_format_version": (c_int32, []),
    "e8kv_thread_pool_create": (_status, [c_int32, _out_handle]),
    "e8kv_thread_pool_destroy": (None, [_handle]),
    "e8kv_compressor_create": (_status, [POINTER(ModelShape), c_char_p, _out_handle]),
    "e8kv_compressor_destroy": (None, [_handle]),
    "e8kv_compressor_describe": (_status, [_handle, c_char_p, c_size_t, POINTER(c_size_t)]),
    "e8kv_compress": (_status, [_handle, POINTER(KvInput), POINTER(QueryInput), _handle, _out_handle]),
    "e8kv_extend": (_status, [_handle, _handle, POINTER(KvInput), POINTER(QueryInput), _handle]),
    "e8kv_drop_before": (_status, [_handle, _handle, c_int32]),
    "e8kv_append": (_status, [_handle, _handle, c_int32, c_int32, c_void_p, c_void_p, c_int32]),
    "e8kv_cache_destroy": (None, [_handle]),
    "e8kv_attend": (_status, [_handle, c_int32, POINTER(c_float), c_int32, POINTER(c_float), POINTER(c_float),
                              _handle]),
    "e8kv_attend_batch": (_status, [POINTER(AttendRequest), c_size_t, _handle]),
    "e8kv_merge_attention": (_status, [POINTER(c_float), POINTER(c_float), POINTER(c_float), POINTER(c_float),
                                       c_int32, c_int32, POINTER(c_float), POINTER(c_float)]),
    "e8kv_cache_layer_extent": (_status, [_handle, c_int32, POINTER(c_int32), POINTER(c_int64)]),
    "e8kv_decompress_layer": (_status, [_handle, c_int32, c_int64, POINTER(c_int32), POINTER(c_float),
                                        POINTER(c_float), POINTER(c_float)]),
    "e8kv_serialized_size": (_status, [_handle, POINTER(c_size_t)]),
    "e8kv_serialized_size_bound": (_status, [_handle, POINTER(c_size_t)]),
    "e8kv_serialize": (_status, [_handle, c_void_p, c_size_t, POINTER(c_size_t)]),
    "e8kv_serialize_alloc": (_status, [_handle, POINTER(c_void_p), POINTER(c_size_t)]),
    "e8kv_free": (None, [c_void_p]),
    "e8kv_deserialize": (_status, [c_void_p, c_size_t, _handle, _out_handle]),
    "e8kv_cache_shape": (_status, [_handle, POINTER(ModelShape)]),
    "e8kv_cache_bytes": (_status, [_handle, POINTER(c_uint64)]),
    "e8kv_cache_bits_per_element": (_status, [_handle, POINTER(c_double)]),
    "e8kv_cache_compression_ratio": (_status, [_handle, POINTER(c_double)]),
    "e8kv_cache_original_tokens": (_status, [_handle, POINTER(c_int64)]),
    "e8kv_cache_stored_tokens": (_status, [_handle, c_int32, c_int32, POINTER(c_int64)]),
    "e8kv_preset_names": (c_char_p, []),
}


def library_path() -> str:
    """The libe8kv_c.so this package loads: $E8KV_LIBRARY when set (a development build), else the
    one `pip install ./python` built into the package folder."""
    override = os.environ.get("E8KV_LIBRARY")
    if override:
        return override
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libe8kv_c.so")


def load(path: str | None = None) -> ctypes.CDLL:
    """Loads the library and declares every function of FUNCTIONS on it."""
    path = path or library_path()
    if not os.path.exists(path):
        raise OSError(f"e8kv: the C library {path} does not exist; install the package with "
                      f"`pip install ./python` from the repository root (it builds libe8kv_c), or set "
                      f"E8KV_LIBRARY to a libe8kv_c.so")
    lib = ctypes.CDLL(path)
    for name, (restype, argtypes) in FUNCTIONS.items():
        try:
            function = getattr(lib, name)
        except AttributeError:
            raise OSError(f"e8kv: {path} does not export {name}: it is older than this package "
                          f"(rebuild it with `pip install ./python`)") from None
        function.restype = restype
        function.argtypes = argtypes
    return lib
