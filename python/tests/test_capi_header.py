"""e8kv/_capi.py against include/e8kv/c_api.h: every exported function, struct and enum of the
header is declared in Python with the same types, and nothing else is. A change of the C ABI
without the matching change of the ctypes mirror fails here (and the loaded library must export
every declared function: e8kv._capi.load checks that)."""
import ctypes
import os
import re

import pytest

from e8kv import _capi

HEADER = os.path.join(os.path.dirname(__file__), "..", "..", "include", "e8kv", "c_api.h")

SCALARS = {"int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64,
           "size_t": ctypes.c_size_t, "double": ctypes.c_double, "float": ctypes.c_float}
HANDLES = {"e8kv_compressor", "e8kv_cache", "e8kv_thread_pool"}


def header_text():
    if not os.path.exists(HEADER):
        pytest.skip(f"{HEADER} not found (the tests run from the repository checkout)")
    text = open(HEADER).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def ctype_of(c_type: str):
    """The ctypes type this package uses for a C type of the header (its stated convention)."""
    t = re.sub(r"\bconst\b", " ", c_type)
    t = re.sub(r"\s+", "", t)
    stars = t.count("*")
    base = t.replace("*", "")
    if base == "void" and stars == 0:
        return None
    if base == "e8kv_status" and stars == 0:
        return ctypes.c_int
    if base == "char" and stars == 1:
        return ctypes.c_char_p
    if stars == 0:
        return SCALARS[base]
    if base in HANDLES:
        return ctypes.c_void_p if stars == 1 else ctypes.POINTER(ctypes.c_void_p)
    if base == "void":
        return ctypes.c_void_p if stars == 1 else ctypes.POINTER(ctypes.c_void_p)
    if base in _capi.STRUCTS:
        assert stars == 1, c_type
        return ctypes.POINTER(_capi.STRUCTS[base])
    assert stars == 1, c_type
    return ctypes.POINTER(SCALARS[base])


def split_declaration(decl: str):
    """'const void* const* keys' -> ('const void* const*', 'keys')."""
    m = re.match(r"(.*?)([A-Za-z_]\w*)\s*$", decl.strip(), flags=re.S)
    return m.group(1).strip(), m.group(2)


def header_functions():
    pattern = re.compile(r"^E8KV_C_EXPORT[ \t]+([^()\n]*?)\b(e8kv_\w+)\s*\((.*?)\)\s*E8KV_NOEXCEPT\s*;", re.S | re.M)
    out = {}
    for ret, name, args in pattern.findall(header_text()):
        args = args.strip()
        params = [] if args in ("", "void") else [split_declaration(a)[0] for a in args.split(",")]
        out[name] = (ret.strip(), params)
    return out


def test_every_function_matches():
    functions = header_functions()
    assert len(functions) >= 30
    assert list(functions) == list(_capi.FUNCTIONS), "names or order differ from c_api.h"
    for name, (ret, params) in functions.items():
        restype, argtypes = _capi.FUNCTIONS[name]
        assert restype == ctype_of(ret), (name, ret)
        assert len(argtypes) == len(params), (name, params)
        for i, (declared, c_type) in enumerate(zip(argtypes, params)):
            assert declared == ctype_of(c_type), (name, i, c_type, declared)


def test_every_struct_matches():
    structs = re.findall(r"typedef struct (e8kv_\w+)\s*\{(.*?)\}\s*\1\s*;", header_text(), flags=re.S)
    assert {name for name, _ in structs} == set(_capi.STRUCTS)
    for name, body in structs:
        fields = [split_declaration(f) for f in body.split(";") if f.strip()]
        declared = _capi.STRUCTS[name]._fields_
        assert [f for _, f in fields] == [f for f, _ in declared], name
        for (c_type, field), (_, t) in zip(fields, declared):
            assert t == ctype_of(c_type), (name, field, c_type, t)


def test_every_enum_matches():
    text = header_text()
    for enum, table in (("e8kv_status", _capi.STATUS), ("e8kv_dtype", _capi.DTYPE)):
        body = re.search(r"typedef enum %s\s*\{(.*?)\}" % enum, text, flags=re.S).group(1)
        values = dict((k, int(v)) for k, v in re.findall(r"(E8KV_\w+)\s*=\s*(\d+)", body))
        assert values == table, enum


def test_the_library_exports_every_declared_function():
    from e8kv import _core
    lib = _core.lib()
    for name in _capi.FUNCTIONS:
        assert getattr(lib, name).argtypes is not None or _capi.FUNCTIONS[name][1] == []
