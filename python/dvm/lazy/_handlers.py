"""Handlers: aten ops -> lazy ops. Each takes the aten op's arguments and returns torch tensors
(filled by the next flush) or raises _Unsupported (the op then runs in PyTorch).

Which aten ops are recorded, and what DVM runs for each, comes from the table shared with the
torch.compile backend (``dvm.aten_ops``): the elementwise meta-ops get one handler per kind of
DVM op (float-only, predicate, comparison, ...: DVM's own kinds); the rest are listed below by
their table key, with this front's handler. Imported when the first mode is entered (imports
torch).
"""

import math
import torch as _torch

from .. import aten_ops as T
from .._dvm import BinaryOp, DType, ReduceOp, UnaryOp
from .._dvm import lazy as _lz
from ._tensors import (_FLOAT_DTYPES, _T2D, _arg, _InPyTorch, _leaf, _out, _pending,
                       _Unsupported, _view_of)

_SLICE_END = (1 << 63) - 1


def _dvm_dtype(dtype):
    """DVM's dtype of a torch dtype; one DVM does not run (f64, complex) runs in PyTorch."""
    d = _T2D.get(dtype)
    if d is None:
        raise _Unsupported
    return d


def _dt(t):
    return _dvm_dtype(t.dtype)


def _as(h, dtype):
    return h if h.dtype == dtype else _lz.cast(h, dtype)


def _is_num(x):
    return isinstance(x, (int, float, bool)) and not isinstance(x, _torch.Tensor)


def _result_type(a, b):
    """torch.result_type(a, b) for a tensor `a`; the common cases without the call."""
    ad = a.dtype
    bt = type(b)
    if bt is float:
        if ad in _FLOAT_DTYPES:
            return ad
    elif bt is int:
        if ad is not _torch.bool:
            return ad
    elif isinstance(b, _torch.Tensor) and b.dtype is ad:
        return ad
    return _torch.result_type(a, b)


def _binary(op, kind=T.ARITH):
    """kind: arith (torch's result type), div (true division), cmp and logic (bool result)."""
    arith = kind in (T.ARITH, T.DIV)
    bool_out = kind in (T.CMP, T.LOGIC)
    same_dtype = kind in (T.ARITH, T.CMP)  # computes in its operands' dtype when they agree
    no_bool = op == BinaryOp.SUB  # torch rejects a bool operand
    lz_binary = _lz.binary

    def h(a, b, *, alpha=1):
        if not isinstance(a, _torch.Tensor):
            raise _Unsupported
        ad = a.dtype
        bt = type(b)
        # The common cases first: tensors of one dtype, a float tensor and a Python float.
        if alpha == 1 and same_dtype and (bt is float and ad in _FLOAT_DTYPES or
                                             isinstance(b, _torch.Tensor) and b.dtype is ad):
            if ad is _torch.bool and kind == T.ARITH:
                # bool * bool and bool + bool stay bool in torch: and / or
                logical = {BinaryOp.MUL: BinaryOp.LOGICAL_AND, BinaryOp.ADD: BinaryOp.LOGICAL_OR}
                if bt is float or op not in logical:
                    raise _Unsupported
                return _out(lz_binary(logical[op], _arg(a), _arg(b)), _torch.bool)
            y = float(b) if bt is float else _arg(b)
            return _out(lz_binary(op, _arg(a), y), _torch.bool if bool_out else ad)
        if no_bool and (ad is _torch.bool or bt is bool or
                        isinstance(b, _torch.Tensor) and b.dtype is _torch.bool):
            raise _Unsupported
        if kind == T.LOGIC:
            rt = _torch.bool
        else:
            rt = _result_type(a, b)
            if kind == T.DIV and rt not in _FLOAT_DTYPES:
                rt = _torch.get_default_dtype()
        d = _T2D.get(rt)
        if d is None or (rt is _torch.bool and arith):
            raise _Unsupported
        x = _arg(a) if ad is rt else _lz.cast(_arg(a), d)
        if isinstance(b, _torch.Tensor):
            y = _arg(b) if b.dtype is rt else _lz.cast(_arg(b), d)
        elif _is_num(b):
            y = float(b)
        else:
            raise _Unsupported
        if alpha != 1:
            y = lz_binary(BinaryOp.MUL, y, float(alpha)) if not _is_num(y) else y * alpha
        return _out(lz_binary(op, x, y), _torch.bool if bool_out else rt)

    return h


def _pow(x, e):
    """x ** e; small integer and half exponents as products and roots, as PyTorch does."""
    if not x.dtype.is_floating_point or not _is_num(e):
        return _binary(BinaryOp.POW)(x, e)
    h = _arg(x)
    e = float(e)
    if e == 1.0:
        return _out(_identity(h))
    if e in (2.0, 3.0, 4.0):
        r = _lz.binary(BinaryOp.MUL, h, h)
        if e == 3.0:
            r = _lz.binary(BinaryOp.MUL, r, h)
        elif e == 4.0:
            r = _lz.binary(BinaryOp.MUL, r, r)
        return _out(r)
    if e in (0.5, -0.5, -1.0):
        op = {0.5: UnaryOp.SQRT, -0.5: UnaryOp.RSQRT, -1.0: UnaryOp.RECIPROCAL}[e]
        return _out(_lz.unary(op, h))
    return _binary(BinaryOp.POW)(x, e)


def _rsub(a, b, *, alpha=1):
    if not _is_num(b) or a.dtype == _torch.bool:
        raise _Unsupported
    rt = _torch.result_type(a, b)
    x = _as(_arg(a), _dvm_dtype(rt))
    if alpha != 1:
        x = _lz.binary(BinaryOp.MUL, x, float(alpha))
    return _out(_lz.binary(BinaryOp.SUB, float(b), x))


def _unary(entry):
    """A unary meta-op: float-only ops give torch's default float dtype for integer inputs,
    predicates a bool (DVM's kinds, aten_ops)."""
    op = entry.dvm
    float_only = T.is_float_only(op)
    keep_bool = T.is_predicate(op)
    float_inputs = entry.float_inputs

    def h(x):
        xd = x.dtype
        if xd is _torch.bool and not keep_bool:
            raise _Unsupported
        if float_inputs and xd not in _FLOAT_DTYPES:
            raise _Unsupported
        want = xd
        if keep_bool:
            want = _torch.bool
        elif float_only and xd not in _FLOAT_DTYPES:
            want = _torch.get_default_dtype()
        return _out(_lz.unary(op, _arg(x)), want)

    return h


def _bools_only(h):
    """torch's bitwise ops are logical on bool tensors only: on integers they are no DVM op and
    run in PyTorch."""

    def run(*ts):
        for t in ts:
            if t.dtype is not _torch.bool:
                raise _InPyTorch
        return h(*ts)

    return run


def _gelu(x, *, approximate="none"):
    if not x.dtype.is_floating_point:
        raise _Unsupported
    return _out(_lz.gelu(_arg(x), approximate == "tanh"))


def _where(cond, a, b):
    if not isinstance(a, _torch.Tensor) or not isinstance(b, _torch.Tensor):
        raise _Unsupported
    rt = _torch.result_type(a, b)
    if rt not in _T2D or cond.dtype != _torch.bool:
        raise _Unsupported
    d = _dvm_dtype(rt)
    return _out(_lz.select(_arg(cond), _as(_arg(a), d), _as(_arg(b), d)))


def _masked_fill(x, mask, value):
    if mask.dtype != _torch.bool:
        raise _Unsupported
    hx = _arg(x)
    if isinstance(value, _torch.Tensor):
        if value.dim() != 0:
            raise _Unsupported
        v = _as(_arg(value), hx.dtype)
    elif _is_num(value):
        if not x.dtype.is_floating_point and isinstance(value, float):
            raise _Unsupported
        v = _lz.scalar(float(value), hx.dtype)
    else:
        raise _Unsupported
    return _out(_lz.select(_arg(mask), v, hx))


def _clamp(x, min=None, max=None):
    if (min is not None and not _is_num(min)) or (max is not None and not _is_num(max)):
        raise _Unsupported
    if not x.dtype.is_floating_point and any(isinstance(v, float) for v in (min, max)):
        raise _Unsupported
    if x.dtype == _torch.bool:
        raise _Unsupported
    lo = None if min is None else float(min)
    hi = None if max is None else float(max)
    return _out(_lz.clamp(_arg(x), lo, hi))


def _to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if device is not None and _torch.device(device).type != "cpu":
        raise _Unsupported
    if layout not in (None, _torch.strided) or pin_memory:
        raise _Unsupported
    if memory_format not in (None, _torch.preserve_format, _torch.contiguous_format):
        raise _Unsupported
    d = _dvm_dtype(dtype) if dtype is not None else _dt(x)
    h = _arg(x)
    r = _lz.cast(h, d)
    if r.same_as(h):
        r = _identity(h)
    return _out(r)


def _identity(h):
    """A new lazy value equal to h (for clone: a distinct tensor needs its own value)."""
    if h.dtype == DType.BOOL:
        return _lz.binary(BinaryOp.NE, h, 0.0)
    return _lz.binary(BinaryOp.ADD, h, 0.0) if h.dtype in (DType.F32, DType.F16, DType.BF16) \
        else _lz.binary(BinaryOp.ADD, h, 0)


def _clone(x, *, memory_format=None):
    if memory_format not in (None, _torch.preserve_format, _torch.contiguous_format):
        raise _Unsupported
    if _pending(x) is None:
        raise _InPyTorch  # nothing to fuse: copy in PyTorch
    return _out(_identity(_arg(x)))


def _dims(dim, rank):
    if dim is None:
        return []
    if isinstance(dim, int):
        dim = [dim]
    return [d + rank if d < 0 else d for d in dim]


def _reduce(op):
    def h(x, dim=None, keepdim=False, *, dtype=None):
        hx = _arg(x)
        if dtype is not None:
            hx = _as(hx, _dvm_dtype(dtype))
        elif op == ReduceOp.SUM and x.dtype in (_torch.bool, _torch.int32):
            hx = _as(hx, DType.I64)
        elif op == ReduceOp.MEAN and not x.dtype.is_floating_point:
            raise _Unsupported
        axes = _dims(dim, x.dim())
        if x.dim() == 0:
            raise _Unsupported
        return _out(_lz.reduce(op, hx, axes, bool(keepdim)))

    return h


def _any_all(op):
    """any / all (op MAX / MIN) over the operand's truth values, as int32 (DVM reduces no
    bools), back to bool."""
    def h(x, dim=None, keepdim=False):
        if x.dim() == 0 or x.numel() == 0:
            raise _Unsupported
        hx = _arg(x)
        if x.dtype is not _torch.bool:
            hx = _lz.binary(BinaryOp.NE, hx, 0.0)
        r = _lz.reduce(op, _as(hx, DType.I32), _dims(dim, x.dim()), bool(keepdim))
        return _out(_as(r, DType.BOOL), _torch.bool)

    return h


def _reduce_all(op):
    h = _reduce(op)
    return lambda x, *, dtype=None: h(x, None, False, dtype=dtype)


def _amax(op):
    def h(x, dim=(), keepdim=False):
        if x.dtype == _torch.bool or x.dim() == 0:
            raise _Unsupported
        return _out(_lz.reduce(op, _arg(x), _dims(list(dim) or None, x.dim()), bool(keepdim)))

    return h


def _max_dim(op, arg_op):
    def h(x, dim, keepdim=False):
        if x.dtype == _torch.bool or x.dim() == 0:
            raise _Unsupported
        hx = _arg(x)
        return (_out(_lz.reduce(op, hx, [dim], bool(keepdim))),
                _out(_lz.reduce(arg_op, hx, [dim], bool(keepdim))))

    return h


def _argmax(op):
    def h(x, dim=None, keepdim=False):
        if x.dtype == _torch.bool or x.dim() == 0:
            raise _Unsupported
        hx = _arg(x)
        if dim is None:
            if keepdim:
                raise _Unsupported
            return _out(_lz.reduce(op, _lz.reshape(hx, [-1]), [0], False))
        return _out(_lz.reduce(op, hx, [dim], bool(keepdim)))

    return h


def _moments(fn):
    def h(x, dim=None, *, correction=None, keepdim=False):
        if not x.dtype.is_floating_point or x.dim() == 0:
            raise _Unsupported
        c = 1.0 if correction is None else float(correction)
        return _out(fn(_arg(x), _dims(dim, x.dim()), c, bool(keepdim)))

    return h


def _softmax(fn):
    def h(x, dim, half_to_float):
        if half_to_float or not x.dtype.is_floating_point:
            raise _Unsupported
        return _out(fn(_arg(x), dim))

    return h


def _layer_norm_refusal(x, normalized_shape, weight, bias):
    """Why DVM does not record this layer norm (None: it does). Shapes torch rejects (not x's
    trailing dims, parameters of another shape) go to PyTorch, which reports them: its check
    is in the kernel this handler replaces."""
    if not x.dtype.is_floating_point:
        return "dtype"
    shape = tuple(normalized_shape)
    n = len(shape)
    if n == 0 or n > x.dim() or tuple(x.shape[x.dim() - n:]) != shape:
        return "shape"
    for p in (weight, bias):
        if p is not None and tuple(p.shape) != shape:
            return "parameter shape"
    if bias is not None and weight is None:
        return "bias without weight"
    return None


def _native_layer_norm(x, normalized_shape, weight, bias, eps):
    if _layer_norm_refusal(x, normalized_shape, weight, bias) is not None:
        raise _Unsupported
    n = len(normalized_shape)
    hx = _arg(x)
    hw = None if weight is None else _arg(weight)
    hb = None if bias is None else _arg(bias)
    out = _lz.layer_norm(hx, hw, hb, float(eps), n)
    # mean and rstd: recorded too, dropped by the flush unless someone keeps them.
    axes = list(range(x.dim() - n, x.dim()))
    xf = _as(hx, DType.F32)
    mean = _lz.reduce(ReduceOp.MEAN, xf, axes, True)
    var = _lz.variance(xf, axes, 0.0, True)
    rstd = _lz.unary(UnaryOp.RSQRT, _lz.binary(BinaryOp.ADD, var, float(eps)))
    return _out(out), _out(_as(mean, hx.dtype)), _out(_as(rstd, hx.dtype))


def _float_mm(*ts):
    d = ts[0].dtype
    if d not in _FLOAT_DTYPES:
        raise _Unsupported
    for t in ts:
        if t.dtype is not d:
            raise _Unsupported


def _matmul(a, b):
    """a @ b; a weight seen through .t() (F.linear) is read in its own layout."""
    if b.dim() == 2 and _pending(b) is None and b.stride(0) == 1 and b.stride(1) == b.shape[0] \
            and b.shape[0] > 1:
        return _lz.matmul(_arg(a), _leaf(b, (b.shape[1], b.shape[0]), (b.stride(1), 1)), False,
                          True)
    return _lz.matmul(_arg(a), _arg(b))


def _mm(a, b):
    _float_mm(a, b)
    return _out(_matmul(a, b))


def _addmm(bias, a, b, *, beta=1, alpha=1):
    _float_mm(bias, a, b)
    if beta != 1 or alpha != 1:
        raise _Unsupported
    return _out(_lz.binary(BinaryOp.ADD, _matmul(a, b), _arg(bias)))


def _cat(tensors, dim=0):
    ts = [t for t in tensors if not (t.dim() == 1 and t.numel() == 0)]
    if not ts:
        raise _Unsupported
    d = ts[0].dtype
    if any(t.dtype != d for t in ts):
        raise _Unsupported
    if len(ts) == 1:
        return _out(_identity(_arg(ts[0])))
    return _out(_lz.concat([_arg(t) for t in ts], dim))


def _embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if indices.dtype not in (_torch.int64, _torch.int32):
        raise _Unsupported
    return _out(_lz.embedding(_arg(weight), _arg(indices)))


def _index_select(x, dim, index):
    if index.dim() != 1:
        raise _Unsupported
    return _out(_lz.index_select(_arg(x), dim, _arg(index)))


def _gather(x, dim, index, *, sparse_grad=False):
    return _out(_lz.gather(_arg(x), dim, _arg(index)))


def _cumsum(x, dim, *, dtype=None):
    # torch promotes integers and bool to int64 unless a dtype is given
    d = _dvm_dtype(dtype) if dtype is not None else (_dt(x) if x.dtype in _FLOAT_DTYPES
                                               else DType.I64)
    return _out(_lz.cumsum(_as(_arg(x), d), dim))


def _tri(lower):
    def h(x, diagonal=0):
        if x.dim() < 2:
            raise _Unsupported
        hx = _arg(x)
        shape = list(x.shape)
        row = _lz.iota(shape, x.dim() - 2)
        col = _lz.iota(shape, x.dim() - 1)
        diff = _lz.binary(BinaryOp.SUB, col, row)
        keep = _lz.binary(BinaryOp.LE if lower else BinaryOp.GE, diff, int(diagonal))
        zero = _lz.scalar(0.0, hx.dtype)
        return _out(_lz.select(keep, hx, zero))

    return h


def _grouped_scores(q, k, hq, hk):
    """q @ k^T, with grouped-query attention (fewer k heads than q heads, as HF Llama, Mistral
    and Qwen2 pass them): query head h reads k head h // G, so q's heads are split as
    [Hk, G] against k broadcast over G, and the scores merged back to q's heads."""
    nq, nk = (q.shape[-3], k.shape[-3]) if q.dim() >= 3 else (1, 1)
    if nq == nk or nk == 0 or nq % nk:
        return _lz.matmul(hq, hk, False, True)
    lead, (L, D), S = list(q.shape[:-3]), q.shape[-2:], k.shape[-2]
    n = nk * math.prod(lead)  # lazy matmul takes rank <= 4: batch and k heads as one dim
    sg = _lz.matmul(_lz.reshape(hq, [n, nq // nk, L, D]), _lz.reshape(hk, [n, 1, S, D]), False,
                    True)
    return _lz.reshape(sg, lead + [nq, L, S])


def _sdpa_cpu(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    # The attention rule shared with the backend (aten_ops.attention_refusal); DVM's attention
    # has no logsumexp output, but this op returns one: recorded from reductions below.
    if T.attention_refusal(q.dim(), k.dim(), v.dim(), dropout_p) is not None:
        raise _Unsupported
    _float_mm(q, k, v)
    hq, hk, hv = _arg(q), _arg(k), _arg(v)
    hm = None if attn_mask is None else _arg(attn_mask)
    s = 0.0 if scale is None else float(scale)
    out = _lz.attention(hq, hk, hv, hm, bool(is_causal), s)
    # logsumexp of the scores ([..., L], f32): recorded, dropped unless kept.
    sc = s if s > 0 else q.shape[-1] ** -0.5
    scores = _lz.binary(BinaryOp.MUL, _as(_grouped_scores(q, k, hq, hk), DType.F32), sc)
    if hm is not None:
        if attn_mask.dtype == _torch.bool:
            scores = _lz.select(hm, scores, _lz.scalar(float("-inf")))
        else:
            scores = _lz.binary(BinaryOp.ADD, scores, _as(hm, DType.F32))
    if is_causal:
        shp = scores.shape
        tri = _lz.binary(BinaryOp.LE, _lz.iota(shp, len(shp) - 1), _lz.iota(shp, len(shp) - 2))
        scores = _lz.select(tri, scores, _lz.scalar(float("-inf")))
    m = _lz.reduce(ReduceOp.MAX, scores, [-1], True)
    e = _lz.unary(UnaryOp.EXP, _lz.binary(BinaryOp.SUB, scores, m))
    lse = _lz.binary(BinaryOp.ADD, _lz.unary(UnaryOp.LOG, _lz.reduce(ReduceOp.SUM, e, [-1], True)),
                     m)
    lse = _lz.squeeze(lse, -1)
    return _out(out), _out(lse)


# View ops: a real torch view when the input is not pending (no data is read); for a pending
# input, the same view recorded lazily and a real torch view of its storage.


def _view_handler(real, lazy_fn):
    """`real(x, *args, **kwargs)` makes the torch view (the aten op's arguments)."""

    def run(x, *args, **kwargs):
        hx = _pending(x)
        out = real(x, *args, **kwargs)
        if hx is None:
            return out
        if isinstance(out, (list, tuple)):
            hs = lazy_fn(hx, x, *args, **kwargs)
            return type(out)(_view_of(o, r, x) for o, r in zip(out, hs))
        return _view_of(out, lazy_fn(hx, x, *args, **kwargs), x)

    return run


def _torch_views(torch):
    """aten view op -> a function making its torch view. Tensor methods where one takes the
    schema's arguments: an OpOverload's own C++ entry point (`_op`) matches arguments against
    the schema and costs ~2 us a call, a method ~0.9 us, and a GPT step makes ~130 views."""
    aten = torch.ops.aten
    tb = torch._C.TensorBase

    def sized(method):
        # view(*size) parses faster than view(size); a rank-0 target needs the list form.
        return lambda x, size, *, implicit=False: method(x, *size) if size else method(x, size)

    return {
        aten.view.default: sized(tb.view), aten._unsafe_view.default: sized(tb.view),
        aten.reshape.default: sized(tb.reshape), aten.permute.default: sized(tb.permute),
        aten.expand.default: sized(tb.expand), aten.transpose.int: tb.transpose,
        aten.t.default: tb.t, aten.unsqueeze.default: tb.unsqueeze,
        aten.squeeze.dim: tb.squeeze, aten.squeeze.dims: tb.squeeze,
        aten.squeeze.default: tb.squeeze, aten.select.int: tb.select,
        aten.detach.default: tb.detach,
    }


def _lz_view(hx, x, size):
    return _lz.reshape(hx, size)


def _lz_permute(hx, x, dims):
    return _lz.permute(hx, list(dims))


def _lz_transpose(hx, x, d0, d1):
    return _lz.transpose(hx, d0, d1)


def _lz_t(hx, x):
    return hx if x.dim() < 2 else _lz.transpose(hx, 0, 1)


def _lz_expand(hx, x, size, *, implicit=False):
    return _lz.expand(hx, size)


def _lz_unsqueeze(hx, x, dim):
    return _lz.unsqueeze(hx, dim)


def _lz_squeeze(hx, x, dim=None):
    if dim is None:
        return _lz.reshape(hx, [s for s in x.shape if s != 1])
    dims = sorted(_dims(dim, x.dim()), reverse=True)
    for d in dims:
        hx = _lz.squeeze(hx, d)
    return hx


def _lz_slice(hx, x, dim=0, start=None, end=None, step=1):
    start = 0 if start is None else start
    end = _SLICE_END if end is None or end >= _SLICE_END else end
    return _lz.slice(hx, dim, start, end, step)


def _lz_select(hx, x, dim, index):
    # Negative indices stay negative (x[:, -1] is the same op for every length: one plan).
    stop = index + 1 if index != -1 else _SLICE_END
    return _lz.squeeze(_lz.slice(hx, dim, index, stop), dim)


def _lz_split(hx, x, split_size, dim=0):
    n = x.shape[dim]
    sizes = [min(split_size, n - s) for s in range(0, n, split_size)] if split_size else [n]
    return _lz.split(hx, sizes, dim)


def _lz_split_sizes(hx, x, split_sizes, dim=0):
    return _lz.split(hx, list(split_sizes), dim)


def _lz_unbind(hx, x, dim=0):
    return [_lz_select(hx, x, dim, i) for i in range(x.shape[dim])]


def _lz_alias(hx, x, *args, **kwargs):
    return hx



# ---------------------------------------------------------------------------------------------
# The handler table. Keys are aten_ops.TABLE's: every op recorded here is in the shared table
# (aten_ops.resolve refuses a key that is not), which also gives the DVM op of the handlers
# built from one.

# Handlers made from the DVM op the table maps the key to.
_FROM_OP = {
    "sum.dim_IntList": _reduce, "mean.dim": _reduce,
    "sum.default": _reduce_all, "mean.default": _reduce_all,
    "amax.default": _amax, "amin.default": _amax,
    "max.dim": lambda ops: _max_dim(*ops), "min.dim": lambda ops: _max_dim(*ops),
    "argmax.default": _argmax, "argmin.default": _argmax,
    "any.default": _any_all, "any.dim": _any_all, "any.dims": _any_all,
    "all.default": _any_all, "all.dim": _any_all, "all.dims": _any_all,
    "var.correction": lambda name: _moments(getattr(_lz, name)),
    "std.correction": lambda name: _moments(getattr(_lz, name)),
    "_softmax.default": lambda name: _softmax(getattr(_lz, name)),
    "_log_softmax.default": lambda name: _softmax(getattr(_lz, name)),
}

# Handlers of composites and special forms.
_OWN = {
    "pow.Tensor_Scalar": _pow, "rsub.Scalar": _rsub, "gelu.default": _gelu,
    "where.self": _where, "masked_fill.Scalar": _masked_fill, "masked_fill.Tensor": _masked_fill,
    "clamp.default": _clamp, "clamp_min.default": lambda x, m: _clamp(x, m, None),
    "clamp_max.default": lambda x, m: _clamp(x, None, m),
    "_to_copy.default": _to_copy, "clone.default": _clone,
    "native_layer_norm.default": _native_layer_norm,
    "mm.default": _mm, "bmm.default": _mm, "addmm.default": _addmm, "cat.default": _cat,
    "embedding.default": _embedding, "index_select.default": _index_select,
    "gather.default": _gather, "cumsum.default": _cumsum, "tril.default": _tri(True),
    "triu.default": _tri(False),
    "_scaled_dot_product_flash_attention_for_cpu.default": _sdpa_cpu,
}

# View ops: key -> the lazy form of the view.
_VIEWS = {
    "view.default": _lz_view, "_unsafe_view.default": _lz_view, "reshape.default": _lz_view,
    "permute.default": _lz_permute, "transpose.int": _lz_transpose, "t.default": _lz_t,
    "expand.default": _lz_expand, "unsqueeze.default": _lz_unsqueeze,
    "squeeze.dim": _lz_squeeze, "squeeze.dims": _lz_squeeze, "squeeze.default": _lz_squeeze,
    "slice.Tensor": _lz_slice, "select.int": _lz_select, "split.Tensor": _lz_split,
    "split_with_sizes.default": _lz_split_sizes, "unbind.int": _lz_unbind,
    "alias.default": _lz_alias, "detach.default": _lz_alias,
}


def _build():
    H = {}
    # The elementwise meta-ops: one handler per DVM kind. In-place forms are not recorded
    # (they run in PyTorch, after a flush when they write memory the trace uses).
    for key, e in T.entries(direct=True):
        o = T.resolve(key)
        if o is None:
            continue
        if isinstance(e.dvm, UnaryOp):
            h = _unary(e)
        else:
            h = _binary(e.dvm, T.LOGIC if e.family == "logical" else T.binary_kind(e.dvm))
        H[o] = _bools_only(h) if e.bool_only else h
    for key, make in _FROM_OP.items():
        H[T.resolve(key)] = make(T.TABLE[key].dvm)
    for key, h in _OWN.items():
        H[T.resolve(key)] = h
    views = _torch_views(_torch)
    for key, fn in _VIEWS.items():
        o = T.resolve(key)
        if o is not None:
            H[o] = _view_handler(views.get(o, o._op), fn)
    H.pop(None, None)  # keys this torch lacks
    return H


HANDLERS = _build()
