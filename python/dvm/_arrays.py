"""DType <-> numpy / torch element types, and output allocation.

numpy has no bfloat16, so bf16 (and, by choice, nothing else) needs torch.
"""

import itertools
import sys

import numpy as np

from ._dvm import Constant, DType, DvmError, StatusCode

_NUMPY = {
    DType.F32: np.dtype(np.float32),
    DType.F16: np.dtype(np.float16),
    DType.I32: np.dtype(np.int32),
    DType.I64: np.dtype(np.int64),
    DType.BOOL: np.dtype(np.bool_),
}


def _torch():
    """torch if it is already imported (DVM never imports it on its own)."""
    return sys.modules.get("torch")


_torch_maps = None


def torch_dtype_maps():
    """``({torch dtype: DType}, {DType: torch dtype})``: the torch <-> DVM dtype map (every
    front uses this one), built once (imports torch)."""
    global _torch_maps
    if _torch_maps is None:
        import torch

        to_torch = {
            DType.F32: torch.float32,
            DType.F16: torch.float16,
            DType.BF16: torch.bfloat16,
            DType.I32: torch.int32,
            DType.I64: torch.int64,
            DType.BOOL: torch.bool,
        }
        _torch_maps = ({t: d for d, t in to_torch.items()}, to_torch)
    return _torch_maps


def _error(message):
    e = DvmError("InvalidArgument: " + message)
    e.code = StatusCode.INVALID_ARGUMENT
    e.message = message
    return e


def numpy_dtype(dtype):
    """The numpy dtype of a DType (bf16 has none: raises DvmError)."""
    try:
        return _NUMPY[dtype]
    except KeyError:
        raise _error(f"{dtype} has no numpy dtype; use torch tensors for bf16") from None


def torch_dtype(dtype):
    """The torch dtype of a DType (imports torch)."""
    return torch_dtype_maps()[1][dtype]


def dtype_of(x):
    """The DType of an array, a numpy/torch dtype, or a DType."""
    if isinstance(x, DType):
        return x
    torch = _torch()
    if torch is not None:
        if isinstance(x, torch.Tensor):
            x = x.dtype
        if isinstance(x, torch.dtype):
            d = torch_dtype_maps()[0].get(x)
            if d is None:
                raise _error(f"torch dtype {x} is not a DVM dtype")
            return d
    try:
        nd = np.dtype(getattr(x, "dtype", x))
    except TypeError:
        raise _error(f"{x!r} is not an array or dtype") from None
    for d, t in _NUMPY.items():
        if t == nd:
            return d
    raise _error(f"numpy dtype {nd} is not a DVM dtype")


def _is_torch(x):
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def empty(shape, dtype, like=()):
    """An uninitialised array: a torch tensor if any of `like` is one (or dtype is bf16),
    else a numpy array."""
    if dtype == DType.BF16 or any(_is_torch(a) for a in like):
        import torch

        return torch.empty(tuple(shape), dtype=torch_dtype_maps()[1][dtype])
    return np.empty(tuple(shape), dtype=numpy_dtype(dtype))


_tensor_ids = itertools.count(1)


def constant(x, version=None):
    """``dvm.Constant(x, version)``: marks an input that stays unchanged across calls (a
    weight), so DVM packs it once as a matmul operand and reuses the packed form.

    For a torch tensor the version may be omitted: it is derived from a process-unique id kept
    on the tensor and torch's in-place version counter (``x._version``), so writing the tensor
    in place (``copy_``, an optimizer step) makes DVM pack it again. Other arrays need an
    explicit nonzero version, changed by the caller whenever it writes them.
    """
    if version is None:
        if not _is_torch(x):
            raise _error("dvm.constant: pass a version for arrays that are not torch tensors")
        version = torch_version(x, x)
    return Constant(x, version)


def torch_version(t, owner):
    """The constant version of torch tensor `t` (or a view of it): a process-unique id kept on
    `owner` (t or the tensor t views) and torch's version counter, which views share."""
    d = owner.__dict__
    tid = d.get("_dvm_tid")
    if tid is None:
        tid = d["_dvm_tid"] = next(_tensor_ids)
    return (tid << 32) | (t._version & 0xFFFFFFFF)
