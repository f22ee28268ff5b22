"""Lazy mode: runtime fusion of eagerly issued PyTorch ops (and the lazy tensor API).

::

    import torch, dvm

    with torch.no_grad(), dvm.lazy():
        y = torch.nn.functional.gelu(x @ w.t() + b) * 0.5   # recorded, nothing runs
        print(y.sum().item())                               # flush: one fused graph

    @dvm.lazy()                 # or @dvm.lazy
    def step(x): ...

Inside the mode, supported aten ops on CPU tensors are recorded into the calling thread's DVM
trace (include/dvm/lazy.h) and return ordinary torch tensors whose memory DVM fills at the next
flush. A flush happens when a value is observed (``item()``, ``tolist()``, ``numpy()``,
``print``, data-dependent Python control flow), before an op DVM does not run (it then runs in
PyTorch on flushed inputs), before an in-place write to memory the trace reads or produces,
when the trace reaches its size bound, and when the mode exits. Only values some live tensor
refers to are stored; every other recorded value stays inside fused kernels or is never
computed.

Design: a ``TorchDispatchMode`` rather than a tensor subclass. Results stay plain
``torch.Tensor`` objects (nothing special escapes the ``with`` block), a recorded op costs one
``torch.empty`` instead of a Python wrapper-subclass allocation, and DVM writes the result
straight into that tensor's memory at the flush (zero-copy). The few ways to read memory that
bypass the dispatcher (``numpy``, ``tolist``, ``data_ptr``, ``__dlpack__``, printing, which
runs with modes disabled) are wrapped while
a mode is active so they flush first: a ``TorchFunctionMode`` would do the same at a cost on
every op.

Aliases: a view op (view, reshape, permute, transpose, slice, select, split, expand, squeeze,
unsqueeze, detach) of a pending tensor returns a real torch view of its (unfilled) storage and
records the same view lazily, held weakly, so later ops read the value exactly and nothing is
stored for the view itself; torch's ``_base`` keeps the viewed tensor, and so its pending
value, alive. In-place ops and ``out=`` ops flush first when they write memory the trace reads
or produces, then run in PyTorch.

Autograd is excluded: an op with an input that requires grad while grad mode is on runs
eagerly in PyTorch (after flushing its inputs), so backward sees real saved tensors. Use
``torch.no_grad()`` or ``torch.inference_mode()`` to fuse inference.
"""

import atexit
import functools
import sys
import threading
import types
import weakref

from ._dvm import BinaryOp, DType, DvmError, ReduceOp, UnaryOp
from ._dvm import lazy as _lz
from ._arrays import torch_version as _torch_version

Tensor = _lz.Tensor
WeakTensor = _lz.WeakTensor
FlushReason = _lz.FlushReason
Options = _lz.Options
Stats = _lz.Stats
sync = _lz.sync
pending_ops = _lz.pending_ops
stats = _lz.stats
set_options = _lz.set_options
options = _lz.options
clear_plan_cache = _lz.clear_plan_cache
plan_cache_size = _lz.plan_cache_size
# The lazy ops (same semantics as dvm.GraphBuilder's, on concrete shapes).
for _name in (
    "scalar unary binary select cast expand reshape permute transpose unsqueeze squeeze slice "
    "concat split reduce matmul index_select gather iota softmax log_softmax layer_norm "
    "rms_norm gelu silu swiglu linear embedding variance std_dev cross_entropy attention clamp"
).split():
    globals()[_name] = getattr(_lz, _name)

_SLICE_END = (1 << 63) - 1


class _Unsupported(Exception):
    """Raised by a handler: run the op in PyTorch instead (counted in handler_fallbacks())."""


class _InPyTorch(_Unsupported):
    """Raised by a handler when PyTorch is where the call belongs (nothing to fuse, e.g. a clone
    of a real tensor): it runs there, and is no fallback."""


# ---------------------------------------------------------------------------------------------
# Per-thread state of the torch mode


class _State(threading.local):
    def __init__(self):
        self.read = set()  # storage addresses the trace reads
        self.produced = set()  # storage addresses the trace will write
        self.depth = 0  # active modes on this thread
        self.freeze = False  # the innermost mode's freeze_weights


_state = _State()


def _flush(reason):
    try:
        _lz.sync(reason)
    finally:
        _state.read.clear()
        _state.produced.clear()


# ---------------------------------------------------------------------------------------------
# torch glue (torch is imported only when a mode is created)

_torch = None
_T2D = {}  # torch dtype -> DType
_D2T = {}  # DType -> torch dtype
_HANDLERS = {}
_WRITES = {}  # aten op -> indices / names of arguments it writes
_OBSERVERS = set()
_graph_task_id = None  # torch._C._current_graph_task_id: -1 outside a backward pass
_grad_enabled = None  # torch.is_grad_enabled
_empty = None  # torch.empty
_Parameter = None  # torch.nn.Parameter
_data_ptr = None  # torch._C.TensorBase.data_ptr (Tensor.data_ptr is wrapped while a mode runs)
_wrap_strided = Tensor._wrap_strided
_FLOAT_DTYPES = ()  # torch's floating dtypes DVM runs


def _pending(t):
    """The lazy handle of a tensor whose value is pending, else None."""
    d = t.__dict__
    if not d:  # most tensors: nothing recorded
        return None
    h = d.get("_dvm_lazy")
    if h is not None and h.is_pending:
        return h
    w = d.get("_dvm_view")
    if w is not None:
        h = w.lock()
        if h is not None and h.is_pending:
            return h
    return None


def _eligible(t):
    return t.is_cpu and t.dtype in _T2D and t.layout == _torch.strided and not t.is_quantized


def _arg(t):
    """A lazy operand for a torch tensor: its pending value, or a leaf wrapping its memory."""
    h = _pending(t)
    return h if h is not None else _leaf(t, t.shape, t.stride())


def _leaf(t, shape, strides):
    """A lazy leaf over the memory of `t` seen with `shape` and `strides` (t's own, or its
    transpose), cached on t's base across flushes (a weight is wrapped once) by address, shape,
    strides and dtype. The leaf keeps the storage alive, not the tensor (no reference cycle)."""
    base = t._base  # None for views made inside a handler (autograd keys are excluded there)
    if base is None:
        base = t
    cache = base.__dict__.get("_dvm_leaves")
    # With freeze_weights, parameters (weights) are constants for DVM (packed once as matmul
    # operands); their version follows torch's in-place counter, so a written weight gets a new
    # leaf (writes through `.data` are not counted: hence opt-in).
    version = _torch_version(t, base) if _state.freeze and type(base) is _Parameter else 0
    key = (_data_ptr(t), shape, strides, t.dtype, version)
    if cache is None:
        cache = base.__dict__["_dvm_leaves"] = _LeafCache()
        _leaf_caches.add(cache)
    else:
        hit = cache.get(key)
        if hit is not None:
            if hit[1]:
                _state.read.add(hit[1])
            return hit[0]
    if not _eligible(t):
        raise _Unsupported
    storage = t.untyped_storage()
    sp = storage.data_ptr() if t.numel() else 0
    # Entries of another storage (set_, .data =) or of many views (a growing slice): dropped,
    # so a cache never pins memory its tensor no longer uses.
    if len(cache) >= 8 or any(v[1] != sp for v in cache.values()):
        cache.clear()
    h = _wrap_strided(key[0], _T2D[t.dtype], shape, strides, storage, version)
    cache[key] = (h, sp)
    if sp:
        _state.read.add(sp)
    return h


class _LeafCache(dict):
    """(data_ptr, shape, strides, dtype, version) -> (lazy leaf, storage address), on a base
    tensor."""

    __hash__ = object.__hash__  # identity (for the WeakSet below)
    __eq__ = object.__eq__


# Every leaf cache, emptied at exit: tensors alive at interpreter shutdown would otherwise keep
# lazy handles past the extension's teardown (nanobind reports them as leaks).
_leaf_caches = weakref.WeakSet()


@atexit.register
def _clear_leaf_caches():
    for c in list(_leaf_caches):
        c.clear()


def _out(h, want=None):
    """A torch tensor that the flush fills with the lazy value `h`; `want`: the torch dtype the
    op must produce (else _Unsupported: DVM's promotion differs)."""
    dt = _D2T[h.dtype]
    if want is not None and dt is not want:
        raise _Unsupported
    shape = h.shape
    t = _empty(*shape, dtype=dt) if shape else _empty((), dtype=dt)
    ptr = _data_ptr(t)
    if ptr:
        try:
            h._set_storage_ptr(ptr)
        except DvmError:
            if h.is_pending:
                raise
            # Recording h filled the trace to its size bound: the flush that followed already
            # computed it (into DVM's memory). Copy it out rather than run the op again, and
            # keep no handle (it would hold DVM's copy).
            h.copy_into(t)
            return t
        else:
            _state.produced.add(ptr)
    t.__dict__["_dvm_lazy"] = h
    return t


def _view_of(torch_view, h, src):
    """Marks a real torch view of a pending tensor `src` with the lazy value it shows (weakly),
    and keeps `src` (so its pending value, stored into the memory the view shows): a view made
    inside a handler has no _base (autograd keys are excluded there), and some never get one
    (_unsafe_view, detach, alias)."""
    d = torch_view.__dict__
    d["_dvm_view"] = WeakTensor(h)
    d["_dvm_src"] = src
    return torch_view


def _tensors(args, kwargs):
    for a in args:
        if isinstance(a, _torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, _torch.Tensor):
                    yield b
    for a in kwargs.values():
        if isinstance(a, _torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, _torch.Tensor):
                    yield b


def _writes(func):
    w = _WRITES.get(func)
    if w is None:
        w = tuple(
            (i, a.name)
            for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        )
        _WRITES[func] = w
    return w


def _storage(t):
    return t.untyped_storage().data_ptr() if t.numel() else 0


def _run_eagerly(func, args, kwargs):
    """Runs an op in PyTorch, flushing first when it reads a pending value or writes memory the
    trace reads or produces."""
    reason = None
    for t in _tensors(args, kwargs):
        if _pending(t) is not None:
            reason = FlushReason.OBSERVE if func in _OBSERVERS else FlushReason.UNSUPPORTED
            break
    if reason is None and (_state.read or _state.produced):
        for i, name in _writes(func):
            t = args[i] if i < len(args) else kwargs.get(name)
            ts = t if isinstance(t, (list, tuple)) else (t,)
            for x in ts:
                if isinstance(x, _torch.Tensor):
                    s = _storage(x)
                    if s in _state.read or s in _state.produced:
                        reason = FlushReason.WRITE
    if reason is not None:
        _flush(reason)
    return func(*args, **kwargs)


def _grad_blocks(args, kwargs):
    """Autograd is excluded: ops inside a backward pass, and ops with an input that requires
    grad while grad mode is on, run in PyTorch."""
    if _graph_task_id() != -1:
        return True
    if not _grad_enabled():
        return False
    return _needs_grad(args, kwargs)


def _needs_grad(args, kwargs):
    return any(t.requires_grad for t in _tensors(args, kwargs))


_FALLBACK = (_Unsupported, DvmError, TypeError, ValueError, IndexError)

# Handler fallbacks: aten op -> calls whose handler refused them (an argument form, dtype or
# promotion DVM does not run), which then ran in PyTorch. Counted on the fallback path only.
_handler_fallbacks = {}
_fallback_lock = threading.Lock()


def _handler_fell_back(func):
    with _fallback_lock:
        _handler_fallbacks[func] = _handler_fallbacks.get(func, 0) + 1


def handler_fallbacks():
    """{aten op name: calls} of ops that have a DVM handler which refused the call (raised
    _Unsupported or another fallback error), so the op ran in PyTorch: an argument form, dtype
    or promotion that lazy mode does not record. Since import or the last ``reset_stats()``.
    (Ops with no handler at all, ops excluded for autograd and calls a handler leaves to
    PyTorch by design, like a clone of a real tensor, are not counted.)"""
    with _fallback_lock:
        return {str(k): v for k, v in _handler_fallbacks.items()}


def reset_stats():
    """Resets ``stats()`` and ``handler_fallbacks()``."""
    _lz.reset_stats()
    with _fallback_lock:
        _handler_fallbacks.clear()


def _dispatch(func, args, kwargs):
    handler = _HANDLERS.get(func)
    if handler is not None and not _grad_blocks(args, kwargs):
        try:
            return handler(*args, **kwargs)
        except _FALLBACK as e:
            if type(e) is not _InPyTorch:
                _handler_fell_back(func)
    return _run_eagerly(func, args, kwargs)


# ---------------------------------------------------------------------------------------------
# Handlers: aten op -> lazy ops. Each returns torch tensors or raises _Unsupported.


def _dt(t):
    return _T2D[t.dtype]


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


def _binary(op, kind="arith"):
    """kind: arith (torch's result type), div (true division), cmp and logic (bool result)."""
    arith = kind in ("arith", "div")
    bool_out = kind in ("cmp", "logic")
    same_dtype = kind in ("arith", "cmp")  # computes in its operands' dtype when they agree
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
            if ad is _torch.bool and kind == "arith":
                raise _Unsupported
            y = float(b) if bt is float else _arg(b)
            return _out(lz_binary(op, _arg(a), y), _torch.bool if bool_out else ad)
        if no_bool and (ad is _torch.bool or bt is bool or
                        isinstance(b, _torch.Tensor) and b.dtype is _torch.bool):
            raise _Unsupported
        if kind == "logic":
            rt = _torch.bool
        else:
            rt = _result_type(a, b)
            if kind == "div" and rt not in _FLOAT_DTYPES:
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
    x = _as(_arg(a), _T2D[rt])
    if alpha != 1:
        x = _lz.binary(BinaryOp.MUL, x, float(alpha))
    return _out(_lz.binary(BinaryOp.SUB, float(b), x))


def _unary(op, float_only=False, keep_bool=False):
    def h(x):
        xd = x.dtype
        if xd is _torch.bool and not keep_bool:
            raise _Unsupported
        want = xd
        if keep_bool:
            want = _torch.bool
        elif float_only and xd not in _FLOAT_DTYPES:
            want = _torch.get_default_dtype()
        return _out(_lz.unary(op, _arg(x)), want)

    return h


def _gelu(x, *, approximate="none"):
    if not x.dtype.is_floating_point:
        raise _Unsupported
    return _out(_lz.gelu(_arg(x), approximate == "tanh"))


def _silu(x):
    if not x.dtype.is_floating_point:
        raise _Unsupported
    return _out(_lz.silu(_arg(x)))


def _where(cond, a, b):
    if not isinstance(a, _torch.Tensor) or not isinstance(b, _torch.Tensor):
        raise _Unsupported
    rt = _torch.result_type(a, b)
    if rt not in _T2D or cond.dtype != _torch.bool:
        raise _Unsupported
    d = _T2D[rt]
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
    d = _T2D[dtype] if dtype is not None else _dt(x)
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
            hx = _as(hx, _T2D[dtype])
        elif op == ReduceOp.SUM and x.dtype in (_torch.bool, _torch.int32):
            hx = _as(hx, DType.I64)
        elif op == ReduceOp.MEAN and not x.dtype.is_floating_point:
            raise _Unsupported
        axes = _dims(dim, x.dim())
        if x.dim() == 0:
            raise _Unsupported
        return _out(_lz.reduce(op, hx, axes, bool(keepdim)))

    return h


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


def _softmax(log):
    def h(x, dim, half_to_float):
        if half_to_float or not x.dtype.is_floating_point:
            raise _Unsupported
        return _out((_lz.log_softmax if log else _lz.softmax)(_arg(x), dim))

    return h


def _native_layer_norm(x, normalized_shape, weight, bias, eps):
    if not x.dtype.is_floating_point:
        raise _Unsupported
    n = len(normalized_shape)
    hx = _arg(x)
    hw = None if weight is None else _arg(weight)
    hb = None if bias is None else _arg(bias)
    if hb is not None and hw is None:
        raise _Unsupported
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


def _sdpa_cpu(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    if dropout_p != 0.0:
        raise _Unsupported
    _float_mm(q, k, v)
    if q.dim() != k.dim() or q.dim() < 2:
        raise _Unsupported
    hq, hk, hv = _arg(q), _arg(k), _arg(v)
    hm = None if attn_mask is None else _arg(attn_mask)
    s = 0.0 if scale is None else float(scale)
    out = _lz.attention(hq, hk, hv, hm, bool(is_causal), s)
    # logsumexp of the scores ([..., L], f32): recorded, dropped unless kept.
    sc = s if s > 0 else q.shape[-1] ** -0.5
    scores = _lz.binary(BinaryOp.MUL, _as(_lz.matmul(hq, hk, False, True), DType.F32), sc)
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


def _install(torch):
    global _torch
    if _torch is not None:
        return
    _torch = torch
    global _graph_task_id, _grad_enabled, _empty, _data_ptr, _Parameter
    _graph_task_id = torch._C._current_graph_task_id
    _Parameter = torch.nn.Parameter
    _grad_enabled = torch.is_grad_enabled
    _empty = torch.empty
    _data_ptr = torch._C.TensorBase.data_ptr
    global _FLOAT_DTYPES
    _FLOAT_DTYPES = frozenset((torch.float32, torch.float16, torch.bfloat16))
    aten = torch.ops.aten
    _T2D.update({torch.float32: DType.F32, torch.float16: DType.F16,
                 torch.bfloat16: DType.BF16, torch.int32: DType.I32, torch.int64: DType.I64,
                 torch.bool: DType.BOOL})
    _D2T.update({v: k for k, v in _T2D.items()})
    H = _HANDLERS
    B = BinaryOp
    for name, op, kind in [
        ("add", B.ADD, "arith"), ("sub", B.SUB, "arith"), ("mul", B.MUL, "arith"),
        ("div", B.DIV, "div"), ("maximum", B.MAXIMUM, "arith"), ("minimum", B.MINIMUM, "arith"),
        ("pow", B.POW, "arith"), ("remainder", B.REMAINDER, "arith"),
        ("floor_divide", B.FLOOR_DIV, "arith"), ("eq", B.EQ, "cmp"), ("ne", B.NE, "cmp"),
        ("lt", B.LT, "cmp"), ("le", B.LE, "cmp"), ("gt", B.GT, "cmp"), ("ge", B.GE, "cmp"),
        ("logical_and", B.LOGICAL_AND, "logic"), ("logical_or", B.LOGICAL_OR, "logic"),
    ]:
        packet = getattr(aten, name)
        for overload in ("Tensor", "Scalar", "default", "Tensor_Tensor", "Tensor_Scalar"):
            if overload in packet.overloads():
                H[getattr(packet, overload)] = _binary(op, kind)
    H[aten.rsub.Scalar] = _rsub
    H[aten.pow.Tensor_Scalar] = _pow
    U = UnaryOp
    for name, op, fo in [
        ("neg", U.NEG, False), ("abs", U.ABS, False), ("exp", U.EXP, True), ("log", U.LOG, True),
        ("log1p", U.LOG1P, True), ("expm1", U.EXPM1, True), ("sqrt", U.SQRT, True),
        ("rsqrt", U.RSQRT, True), ("reciprocal", U.RECIPROCAL, True), ("tanh", U.TANH, True),
        ("sigmoid", U.SIGMOID, True), ("relu", U.RELU, False), ("erf", U.ERF, True),
        ("sin", U.SIN, True), ("cos", U.COS, True), ("floor", U.FLOOR, False),
        ("ceil", U.CEIL, False), ("round", U.ROUND, False), ("trunc", U.TRUNC, False),
        ("sign", U.SIGN, False),
    ]:
        H[getattr(aten, name).default] = _unary(op, fo)
    H[aten.isnan.default] = _unary(U.IS_NAN, keep_bool=True)
    H[aten.logical_not.default] = _unary(U.LOGICAL_NOT, keep_bool=True)
    H[aten.gelu.default] = _gelu
    H[aten.silu.default] = _silu
    H[aten.where.self] = _where
    H[aten.masked_fill.Scalar] = _masked_fill
    H[aten.masked_fill.Tensor] = _masked_fill
    H[aten.clamp.default] = _clamp
    H[aten.clamp_min.default] = lambda x, m: _clamp(x, m, None)
    H[aten.clamp_max.default] = lambda x, m: _clamp(x, None, m)
    H[aten._to_copy.default] = _to_copy
    H[aten.clone.default] = _clone
    H[aten.sum.dim_IntList] = _reduce(ReduceOp.SUM)
    H[aten.sum.default] = lambda x, *, dtype=None: _reduce(ReduceOp.SUM)(x, None, False,
                                                                          dtype=dtype)
    H[aten.mean.dim] = _reduce(ReduceOp.MEAN)
    H[aten.mean.default] = lambda x, *, dtype=None: _reduce(ReduceOp.MEAN)(x, None, False,
                                                                            dtype=dtype)
    H[aten.amax.default] = _amax(ReduceOp.MAX)
    H[aten.amin.default] = _amax(ReduceOp.MIN)
    H[aten.max.dim] = _max_dim(ReduceOp.MAX, ReduceOp.ARG_MAX)
    H[aten.min.dim] = _max_dim(ReduceOp.MIN, ReduceOp.ARG_MIN)
    H[aten.argmax.default] = _argmax(ReduceOp.ARG_MAX)
    H[aten.argmin.default] = _argmax(ReduceOp.ARG_MIN)
    H[aten.var.correction] = _moments(_lz.variance)
    H[aten.std.correction] = _moments(_lz.std_dev)
    H[aten._softmax.default] = _softmax(False)
    H[aten._log_softmax.default] = _softmax(True)
    H[aten.native_layer_norm.default] = _native_layer_norm
    H[aten.mm.default] = _mm
    H[aten.bmm.default] = _mm
    H[aten.addmm.default] = _addmm
    H[aten.cat.default] = _cat
    H[aten.embedding.default] = _embedding
    H[aten.index_select.default] = _index_select
    H[aten.gather.default] = _gather
    H[aten.tril.default] = _tri(True)
    H[aten.triu.default] = _tri(False)
    H[aten._scaled_dot_product_flash_attention_for_cpu.default] = _sdpa_cpu
    views = _torch_views(torch)
    for op, fn in [
        (aten.view.default, _lz_view), (aten._unsafe_view.default, _lz_view),
        (aten.reshape.default, _lz_view), (aten.permute.default, _lz_permute),
        (aten.transpose.int, _lz_transpose), (aten.t.default, _lz_t),
        (aten.expand.default, _lz_expand), (aten.unsqueeze.default, _lz_unsqueeze),
        (aten.squeeze.dim, _lz_squeeze), (aten.squeeze.dims, _lz_squeeze),
        (aten.squeeze.default, _lz_squeeze), (aten.slice.Tensor, _lz_slice),
        (aten.select.int, _lz_select), (aten.split.Tensor, _lz_split),
        (aten.split_with_sizes.default, _lz_split_sizes), (aten.unbind.int, _lz_unbind),
        (aten.alias.default, _lz_alias), (aten.detach.default, _lz_alias),
    ]:
        H[op] = _view_handler(views.get(op, op._op), fn)
    _OBSERVERS.update({aten._local_scalar_dense.default, aten.equal.default,
                       aten.is_nonzero.default})


# ---------------------------------------------------------------------------------------------
# Reads that bypass the dispatcher: flush first while a mode is active.

_PATCHED = ("numpy", "tolist", "data_ptr", "__dlpack__", "__repr__", "__format__", "__array__")
_originals = {}
_patch_lock = threading.Lock()
_patch_users = 0


def _observer(orig):
    @functools.wraps(orig)
    def read(self, *args, **kwargs):
        if isinstance(self, _torch.Tensor) and _pending(self) is not None:
            _flush(FlushReason.OBSERVE)
        return orig(self, *args, **kwargs)

    return read


def _patch(on):
    global _patch_users
    with _patch_lock:
        _patch_users += 1 if on else -1
        if on and _patch_users == 1:
            for name in _PATCHED:
                _originals[name] = _torch.Tensor.__dict__.get(name)
                setattr(_torch.Tensor, name, _observer(getattr(_torch.Tensor, name)))
        elif not on and _patch_users == 0:
            for name in _PATCHED:
                if _originals[name] is None:
                    delattr(_torch.Tensor, name)
                else:
                    setattr(_torch.Tensor, name, _originals[name])


# ---------------------------------------------------------------------------------------------
# The mode

_mode_class = None


def _make_mode_class(torch):
    from torch.utils._python_dispatch import TorchDispatchMode

    class DvmLazyMode(TorchDispatchMode):
        # TorchDispatchMode wraps __torch_dispatch__ in torch._dynamo.disable by default, which
        # imports dynamo on the first op (seconds) and costs microseconds on every op; this
        # mode never runs under torch.compile's tracing, so it opts out.
        @classmethod
        def _should_skip_dynamo(cls):
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            # _dispatch inlined (this runs for every aten op in the mode).
            handler = _HANDLERS.get(func)
            if handler is not None and (
                    _graph_task_id() == -1 and
                    (not _grad_enabled() or not _needs_grad(args, kwargs))):
                try:
                    return handler(*args, **kwargs) if kwargs else handler(*args)
                except _FALLBACK as e:
                    if type(e) is not _InPyTorch:
                        _handler_fell_back(func)
            return _run_eagerly(func, args, kwargs or {})

    return DvmLazyMode


class LazyMode:
    """``with dvm.lazy():`` / ``@dvm.lazy()``: records supported torch ops into DVM.

    max_trace_ops: flush when the thread's trace holds this many ops (process-wide option;
    None keeps the current one).
    freeze_weights: parameters change only through in-place ops on the parameter itself (never
    through ``.data`` or a numpy alias), so DVM may pack each weight once and reuse it.
    """

    def __init__(self, max_trace_ops=None, freeze_weights=False):
        self.max_trace_ops = max_trace_ops
        self.freeze_weights = freeze_weights
        self._modes = []
        self._outer_freeze = []

    def __enter__(self):
        global _mode_class
        import torch

        _install(torch)
        if _mode_class is None:
            _mode_class = _make_mode_class(torch)
        if self.max_trace_ops is not None:
            o = _lz.options()
            o.max_trace_ops = int(self.max_trace_ops)
            _lz.set_options(o)
        mode = _mode_class()
        mode.__enter__()
        self._modes.append(mode)
        _patch(True)
        _state.depth += 1
        self._outer_freeze.append(_state.freeze)
        _state.freeze = bool(self.freeze_weights)
        return self

    def __exit__(self, *exc):
        mode = self._modes.pop()
        try:
            _flush(FlushReason.SYNC)
        finally:
            _state.depth -= 1
            _state.freeze = self._outer_freeze.pop()
            _patch(False)
            mode.__exit__(*exc)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with LazyMode(self.max_trace_ops, self.freeze_weights):
                return fn(*args, **kwargs)

        return wrapped


def is_pending(t):
    """True when a torch tensor's value is recorded in a DVM trace and not computed yet."""
    return _pending(t) is not None


class _CallableModule(types.ModuleType):
    """Makes the module callable: ``dvm.lazy()`` / ``dvm.lazy(fn)`` / ``@dvm.lazy``."""

    def __call__(self, fn=None, *, max_trace_ops=None, freeze_weights=False):
        if callable(fn):
            return LazyMode(max_trace_ops, freeze_weights)(fn)
        return LazyMode(max_trace_ops, freeze_weights)


sys.modules[__name__].__class__ = _CallableModule
