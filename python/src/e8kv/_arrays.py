"""Arrays in, arrays out: whatever the caller passes (numpy, torch, anything with DLPack,
__array_interface__ or the buffer protocol) becomes a C-contiguous numpy array of a dtype the C
ABI reads, checked for shape first; nothing else is accepted silently.

bfloat16 has no numpy dtype: a torch bfloat16 tensor is read as its 16-bit patterns (int16 view,
then uint16), and so is a numpy array of ml_dtypes' "bfloat16"; such arrays travel as uint16 with
the element type E8KV_DTYPE_BF16 beside them.
"""
from __future__ import annotations

from typing import Any, Sequence, Tuple

import numpy as np

from . import _capi


class ArrayError(ValueError):
    """A bad argument (type, dtype, shape, device); e8kv.E8kvError wraps it."""


_DTYPE_NAMES = "float32, float16 or bfloat16"


def _is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach") and hasattr(x, "dtype")


def _from_torch(x: Any, name: str) -> Tuple[np.ndarray, int]:
    if x.device.type != "cpu":
        raise ArrayError(f"{name} is on {x.device}; e8kv's C library reads host memory: move it with .cpu()")
    t = x.detach()
    dtype = str(t.dtype)
    if dtype == "torch.bfloat16":
        import torch  # only reached with a torch tensor in hand
        return np.from_dlpack(t.contiguous().view(torch.int16)).view(np.uint16), _capi.BF16
    if dtype not in ("torch.float32", "torch.float16"):
        raise ArrayError(f"{name} has dtype {dtype}; accepted: {_DTYPE_NAMES}")
    return np.from_dlpack(t.contiguous()), _capi.F32 if dtype == "torch.float32" else _capi.F16


def _to_numpy(x: Any, name: str) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x)
        except (BufferError, TypeError, RuntimeError, ValueError) as e:
            raise ArrayError(f"{name} ({type(x).__name__}) cannot be read through DLPack: {e}") from None
    if hasattr(x, "__array_interface__") or hasattr(x, "__array__"):
        return np.asarray(x)
    try:
        return np.asarray(memoryview(x))
    except TypeError:
        pass
    if isinstance(x, (list, tuple)):
        return np.asarray(x)
    raise ArrayError(f"{name} is a {type(x).__name__}; accepted: a numpy array, a torch tensor, or any object "
                     f"with __dlpack__, __array_interface__ or the buffer protocol")


def as_tensor(x: Any, name: str, shape: Sequence[int | None]) -> Tuple[np.ndarray, int]:
    """x as a C-contiguous array of `shape` (None: any length) and its e8kv dtype code."""
    if _is_torch_tensor(x):
        a, code = _from_torch(x, name)
    else:
        a = _to_numpy(x, name)
        if a.dtype == np.float32:
            code = _capi.F32
        elif a.dtype == np.float16:
            code = _capi.F16
        elif a.dtype.name == "bfloat16" and a.dtype.itemsize == 2:  # ml_dtypes / jax
            a, code = a.view(np.uint16), _capi.BF16
        else:
            raise ArrayError(f"{name} has dtype {a.dtype}; accepted: {_DTYPE_NAMES} "
                             f"(convert first, e.g. .astype(numpy.float32))")
    _check_shape(a, name, shape)
    return np.ascontiguousarray(a), code


def as_float32(x: Any, name: str, shape: Sequence[int | None]) -> np.ndarray:
    """x as C-contiguous float32 (the attention functions read float32 queries)."""
    a, code = as_tensor(x, name, shape)
    return to_float32(a, code)


def to_float32(a: np.ndarray, code: int) -> np.ndarray:
    if code == _capi.F32:
        return a
    if code == _capi.F16:
        return a.astype(np.float32)
    return (a.astype(np.uint32) << 16).view(np.float32)  # bfloat16 bits are a float32's high half


def as_int32(x: Any, name: str, length: int) -> np.ndarray:
    """Positions: integers that fit int32, `length` of them."""
    a = np.asarray(x.detach().cpu().numpy() if _is_torch_tensor(x) else x)
    if a.ndim != 1 or a.shape[0] != length:
        raise ArrayError(f"{name} has shape {a.shape}; expected ({length},)")
    if a.dtype.kind not in "iu":
        raise ArrayError(f"{name} has dtype {a.dtype}; accepted: integers")
    if length and (a.min() < -2**31 or a.max() >= 2**31):
        raise ArrayError(f"{name} holds values outside int32")
    return np.ascontiguousarray(a, dtype=np.int32)


def _check_shape(a: np.ndarray, name: str, shape: Sequence[int | None]) -> None:
    ok = a.ndim == len(shape) and all(want is None or have == want for have, want in zip(a.shape, shape))
    if not ok:
        expected = "(" + ", ".join("n" if s is None else str(s) for s in shape) + ")"
        raise ArrayError(f"{name} has shape {tuple(a.shape)}; expected {expected}")


def per_layer(x: Any, name: str, n_layers: int) -> list:
    """A per-layer argument: a list/tuple of n_layers arrays, or one array whose first axis is the
    layer (a numpy array or tensor of one more dimension)."""
    if isinstance(x, (list, tuple)):
        items = list(x)
    else:
        ndim = getattr(x, "ndim", None)
        if ndim is None:
            raise ArrayError(f"{name} must be a list of {n_layers} per-layer arrays, or one array "
                             f"[layers, tokens, heads, head_dim]; got {type(x).__name__}")
        if ndim != 4:
            raise ArrayError(f"{name} has {ndim} dimensions; expected 4 [layers, tokens, heads, head_dim] "
                             f"(or a list of per-layer [tokens, heads, head_dim] arrays)")
        items = [x[i] for i in range(x.shape[0])]
    if len(items) != n_layers:
        raise ArrayError(f"{name} has {len(items)} layers; the model has {n_layers}")
    return items
