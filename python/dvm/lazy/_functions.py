"""Function-level handlers: torch functions and Tensor methods recorded where Python calls them,
before the dispatcher splits them into ATen ops.

Recording at the ATen level costs a trip from C++ back into Python for every ATen op, and one
call such as ``F.linear`` on a 3-D input is several ATen ops (a transpose, views, an addmm): a
GPT decode step issued ~240 ATen ops for ~150 Python-level calls, and recording took longer
than eager PyTorch's whole step. The hot functions of transformer-style eager code are taken one
level up instead, by a ``TorchFunctionMode`` entered beside the dispatch mode: a handled call
records the same lazy ops the ATen handlers would and returns its output tensor; any other call,
and any form a handler here refuses (it raises one of the fallback errors), goes on to the
dispatcher, where the ATen handlers see it as before. So a refusal here is never a fallback to
PyTorch, and every handler may leave the unusual cases (``out=``, mixed dtypes, ranks DVM's ops
do not take) to the ATen level.

Handlers run with the Python dispatch key excluded (the mode's job), so that the torch calls
they make themselves (the output's ``torch.empty``, real views of pending values) do not come
back through the dispatch mode. Imported when the first mode is entered (imports torch).
"""

import torch as _torch
import torch.nn.functional as _F

from .._dvm import BinaryOp
from .._dvm import lazy as _lz
from . import _handlers as H
from ._tensors import _FLOAT_DTYPES, _arg, _InPyTorch, _out, _pending, _Unsupported

_tb = _torch._C.TensorBase


def _same_float(*ts):
    """All tensors of one floating dtype (the functions below then compute in it, as torch)."""
    d = ts[0].dtype
    if d not in _FLOAT_DTYPES:
        raise _Unsupported
    for t in ts[1:]:
        if t.dtype is not d:
            raise _Unsupported


def _linear(x, weight, bias=None):
    """F.linear: x @ weight^T (+ bias), the weight read in its own [N, K] layout."""
    if x.dim() < 2 or weight.dim() != 2 or (bias is not None and bias.dim() > 1):
        raise _Unsupported
    if bias is None:
        _same_float(x, weight)
    else:
        _same_float(x, weight, bias)
    y = _lz.matmul(_arg(x), _arg(weight), False, True)
    if bias is not None:
        y = _lz.binary(BinaryOp.ADD, y, _arg(bias))
    return _out(y)


def _matmul(a, b, *, out=None):
    """torch.matmul / @ of two float tensors of rank 2 to 4 (DVM's matmul broadcasts their
    batch dims as torch does); vectors and other ranks take the ATen path."""
    if out is not None or not isinstance(b, _torch.Tensor):
        raise _Unsupported
    if not (2 <= a.dim() <= 4 and 2 <= b.dim() <= 4):
        raise _Unsupported
    _same_float(a, b)
    return _out(_lz.matmul(_arg(a), _arg(b)))


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    if isinstance(normalized_shape, int) or H._layer_norm_refusal(x, normalized_shape, weight,
                                                                   bias) is not None:
        raise _Unsupported
    for p in (weight, bias):
        if p is not None and p.dtype is not x.dtype:
            raise _Unsupported
    hw = None if weight is None else _arg(weight)
    hb = None if bias is None else _arg(bias)
    return _out(_lz.layer_norm(_arg(x), hw, hb, float(eps), len(normalized_shape)))


def _softmax(x, dim=None, _stacklevel=3, dtype=None):
    if dim is None or dtype is not None or not x.dtype.is_floating_point:
        raise _Unsupported
    return _out(_lz.softmax(_arg(x), dim))


def _binary(aten_handler):
    """A Tensor method or torch function taking the ATen op's arguments (self, other, alpha=)."""

    def h(a, b, *, alpha=1, out=None):
        if out is not None:
            raise _Unsupported
        return aten_handler(a, b) if alpha == 1 else aten_handler(a, b, alpha=alpha)

    return h


def _div(aten_handler):
    def h(a, b, *, rounding_mode=None, out=None):
        if rounding_mode is not None or out is not None:
            raise _Unsupported
        return aten_handler(a, b)

    return h


def _compare(aten_handler):
    def h(a, b):
        if not isinstance(b, _torch.Tensor) and not H._is_num(b):
            raise _Unsupported  # x == None and the like: torch's answer
        return aten_handler(a, b)

    return h


def _unary(aten_handler):
    def h(x, *, out=None):
        if out is not None:
            raise _Unsupported
        return aten_handler(x)

    return h


def _pow(x, e, *, out=None):
    if out is not None or not isinstance(x, _torch.Tensor):
        raise _Unsupported
    return H._pow(x, e)


# Views: the real torch view (no data is read) and, of a pending input, its lazy form: the ATen
# handlers' own view machinery (_handlers._view_handler), called with the methods' arguments.
_view_as = H._view_handler(_tb.view, H._lz_view)
_transpose = H._view_handler(_tb.transpose, H._lz_transpose)
_split_as = H._view_handler(_tb.split, H._lz_split)


def _view(x, *shape):
    if len(shape) == 1 and not isinstance(shape[0], int):
        shape = shape[0]
        if not isinstance(shape, (tuple, list)):
            raise _Unsupported  # view(dtype)
    return _view_as(x, list(shape))


def _contiguous(x, memory_format=_torch.contiguous_format):
    if memory_format is not _torch.contiguous_format:
        raise _Unsupported
    if _tb.is_contiguous(x):
        return x
    if _pending(x) is None:
        raise _InPyTorch  # a copy of real memory: nothing to record
    return _out(H._identity(_arg(x)))


def _split(x, split_size, dim=0):
    if not isinstance(split_size, int):
        raise _Unsupported  # split sizes: the ATen path
    return _split_as(x, split_size, dim)


def _embedding(indices, weight, padding_idx=None, max_norm=None, norm_type=2.0,
               scale_grad_by_freq=False, sparse=False):
    if max_norm is not None or not isinstance(indices, _torch.Tensor):
        raise _Unsupported  # max_norm renormalizes the weight in place
    return H._embedding(weight, indices)  # padding_idx and the rest only concern gradients


def _basic_index(i):
    return i is None or i is Ellipsis or type(i) is int or type(i) is slice


def _getitem(x, index):
    """Basic indexing (ints, slices, None, ...) of a tensor that is not pending: its real view,
    without a trip through the dispatch mode per slice (a causal mask's [:, :, :t, :t]). Of a
    pending tensor, and any advanced index, the ATen path."""
    if isinstance(index, tuple):
        if not all(_basic_index(i) for i in index):
            raise _Unsupported
    elif not _basic_index(index):
        raise _Unsupported
    if _pending(x) is not None:
        raise _Unsupported
    return _tb.__getitem__(x, index)


def _creation(func):
    """A factory (arange, zeros, ...) called without tensor arguments or out=: it reads no
    value, so it runs in PyTorch straight away, not through the dispatch mode."""

    def h(*args, **kwargs):
        if "out" in kwargs or any(isinstance(a, _torch.Tensor) for a in args):
            raise _Unsupported
        return func(*args, **kwargs)

    return h


def _build():
    aten = _torch.ops.aten
    ah = H.HANDLERS
    div = _div(ah[aten.div.Tensor])
    mul, add, sub = (_binary(ah[o]) for o in (aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor))
    tanh = _unary(ah[aten.tanh.default])
    compares = [((getattr(_tb, n), getattr(_tb, f"__{n}__"), getattr(_torch, n)),
                 getattr(aten, n).Tensor) for n in ("eq", "ne", "lt", "le", "gt", "ge")]
    return {
        _torch._C._nn.linear: _linear,
        _tb.matmul: _matmul, _tb.__matmul__: _matmul, _torch.matmul: _matmul,
        _F.layer_norm: _layer_norm,
        _F.softmax: _softmax, _tb.softmax: _softmax, _torch.softmax: _softmax,
        _tb.mul: mul, _torch.mul: mul, _tb.add: add, _torch.add: add,
        _tb.sub: sub, _torch.sub: sub, _tb.div: div, _torch.div: div,
        **{f: _compare(ah[o]) for fs, o in compares for f in fs},
        _tb.tanh: tanh, _torch.tanh: tanh, _tb.pow: _pow, _torch.pow: _pow,
        _tb.masked_fill: H._masked_fill,
        _tb.view: _view, _tb.transpose: _transpose, _tb.contiguous: _contiguous,
        _torch.Tensor.split: _split, _tb.__getitem__: _getitem,
        _F.embedding: _embedding,
        **{f: _creation(f) for f in (_torch.arange, _torch.zeros, _torch.ones, _torch.empty,
                                     _torch.full, _torch.eye)},
    }


FUNCTIONS = _build()
