"""Torch tensors <-> lazy values: the calling thread's trace memory (the storage it reads and
will write), leaves over torch memory, torch tensors that a flush fills, views of pending
values, and the ``torch.Tensor`` reads that bypass the dispatcher, patched to flush first.

torch is bound by ``_bind`` when the first mode is entered (DVM never imports it on its own).
"""

import atexit
import functools
import sys
import threading
import weakref

from .._arrays import torch_dtype_maps
from .._arrays import torch_version as _torch_version
from .._dvm import DvmError, is_float
from .._dvm import lazy as _lz

FlushReason = _lz.FlushReason
WeakTensor = _lz.WeakTensor
_pkg = sys.modules[__package__]  # dvm.lazy (for its patchable _wrap_strided)


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
# torch glue

_torch = None
_T2D = {}  # torch dtype -> DType
_D2T = {}  # DType -> torch dtype
_FLOAT_DTYPES = set()  # torch's floating dtypes DVM runs
_empty = None  # torch.empty
_Parameter = None  # torch.nn.Parameter
_data_ptr = None  # torch._C.TensorBase.data_ptr (Tensor.data_ptr is wrapped while a mode runs)
_untyped_storage = None  # torch._C.TensorBase.untyped_storage (likewise)
# _dvm_torch.lazy_empty where the extension was built: (tensor, data address) of a new output,
# allocated past the dispatcher (torch.empty under the handlers' exclude guard cost ~1 us).
_alloc = None


def _bind(torch):
    global _torch, _empty, _Parameter, _data_ptr, _untyped_storage, _alloc
    t2d, d2t = torch_dtype_maps()
    _T2D.update(t2d)
    _D2T.update(d2t)
    _FLOAT_DTYPES.update(t for t, d in t2d.items() if is_float(d))
    _empty = torch.empty
    _Parameter = torch.nn.Parameter
    _data_ptr = torch._C.TensorBase.data_ptr
    _untyped_storage = torch._C.TensorBase.untyped_storage
    from ._mode import _native_front

    native = _native_front()
    _alloc = None if native is None else native.lazy_empty
    _torch = torch
    _forget_handles_when_serialized(torch)


_KEYS = ("_dvm_lazy", "_dvm_view", "_dvm_src", "_dvm_leaves")


def _forget_handles_when_serialized(torch):
    """Pickling, torch.save and copy.deepcopy of a tensor carry its __dict__, where lazy mode
    keeps its handles (which cannot be pickled, and mean nothing in another process or copy).
    torch clears non-serializable state through _clear_non_serializable_cached_data before it
    reads the dict; the handles of a tensor whose value is no longer pending go there too (its
    memory holds the value; inside a mode, the patched __reduce_ex__/__deepcopy__ flush
    first)."""
    orig = torch.Tensor.__dict__.get("_clear_non_serializable_cached_data")
    if orig is None or getattr(orig, "_dvm_wrapped", False):
        return

    @functools.wraps(orig)
    def clear(self):
        orig(self)
        d = self.__dict__
        if d and _pending(self) is None:
            for k in _KEYS:
                d.pop(k, None)

    clear._dvm_wrapped = True
    torch.Tensor._clear_non_serializable_cached_data = clear


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
    storage = _untyped_storage(t)
    sp = storage.data_ptr() if t.numel() else 0
    # Entries of another storage (set_, .data =) or of many views (a growing slice): dropped,
    # so a cache never pins memory its tensor no longer uses.
    if len(cache) >= 8 or any(v[1] != sp for v in cache.values()):
        cache.clear()
    h = _pkg._wrap_strided(key[0], _T2D[t.dtype], shape, strides, storage, version)
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
    if _alloc is not None:
        t, ptr = _alloc(h.shape, dt)
    else:
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


# ---------------------------------------------------------------------------------------------
# Reads that bypass the dispatcher: flush first while a mode is active.

# untyped_storage (its bytes), __deepcopy__ (copies the storage), __reduce_ex__ (pickle,
# torch.save) read the memory too.
_PATCHED = ("numpy", "tolist", "data_ptr", "__dlpack__", "__repr__", "__format__", "__array__",
            "untyped_storage", "__deepcopy__", "__reduce_ex__")
_originals = {}
_patch_lock = threading.Lock()
_patch_users = 0


def _observer(orig):
    @functools.wraps(orig)
    def read(self, *args, **kwargs):
        if isinstance(self, _torch.Tensor) and _pending(self) is not None:
            if _state.depth:
                _flush(FlushReason.OBSERVE)
            h = _pending(self)
            if h is not None:  # pending in another thread's trace: flush that one
                h.wait()
        return orig(self, *args, **kwargs)

    return read


# Handing values to another thread: starting a thread flushes the starting thread's trace
# first (while it is in a mode), so the new thread reads filled memory even through ATen ops,
# which no mode intercepts on a thread outside lazy mode.
_thread_start = threading.Thread.start


def _start_after_flush(self, *args, **kwargs):
    if _state.depth:
        _flush(FlushReason.OBSERVE)
    return _thread_start(self, *args, **kwargs)


_wrappers = {}  # name -> (the attribute it wraps, the wrapper): made once, not per mode entry


def _wrapper(name):
    current = getattr(_torch.Tensor, name)
    made = _wrappers.get(name)
    if made is None or made[0] is not current:  # first use, or someone re-patched torch
        made = _wrappers[name] = (current, _observer(current))
    return made[1]


def _patch(on):
    global _patch_users
    with _patch_lock:
        _patch_users += 1 if on else -1
        if on and _patch_users == 1:
            for name in _PATCHED:
                _originals[name] = _torch.Tensor.__dict__.get(name)
                setattr(_torch.Tensor, name, _wrapper(name))
            threading.Thread.start = _start_after_flush
        elif not on and _patch_users == 0:
            threading.Thread.start = _thread_start
            for name in _PATCHED:
                if _originals[name] is None:
                    delattr(_torch.Tensor, name)
                else:
                    setattr(_torch.Tensor, name, _originals[name])
