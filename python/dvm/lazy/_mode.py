"""The lazy torch modes and their flush policy.

Hot torch functions (``F.linear``, ``@``, ``F.layer_norm``, elementwise methods, views: see
``_functions``) are recorded by a function mode where Python calls them. Every aten op issued in
a mode (those functions' forms that the function level leaves alone, and everything else)
reaches ``__torch_dispatch__``: an op with a handler (``_handlers``) is recorded unless autograd
needs it; a handler may refuse the call (counted in ``handler_fallbacks()``). Everything else
runs in PyTorch (``_run_eagerly``), after a flush when it reads a pending value or writes memory
the trace reads or produces.
"""

import functools
import os
import threading
import types

from .._dvm import DvmError
from .._dvm import lazy as _lz
from . import _tensors
from ._tensors import FlushReason, _flush, _InPyTorch, _pending, _state, _Unsupported

_torch = None
_HANDLERS = {}  # aten op -> handler (filled by _install)
_WRITES = {}  # aten op -> indices / names of arguments it writes
_OBSERVERS = set()  # aten ops that read a value (a flush before them is an observation)
_graph_task_id = None  # torch._C._current_graph_task_id: -1 outside a backward pass
_grad_enabled = None  # torch.is_grad_enabled


def _tensor_args(args, kwargs):
    """The torch tensors among an op's arguments (and in its list arguments)."""
    T = _torch.Tensor
    for group in (args, kwargs.values()):
        for a in group:
            if isinstance(a, T):
                yield a
            elif isinstance(a, (list, tuple)):
                for b in a:
                    if isinstance(b, T):
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
    # torch's own untyped_storage: the patched one flushes pending values first.
    return _tensors._untyped_storage(t).data_ptr() if t.numel() else 0


def _run_eagerly(func, args, kwargs):
    """Runs an op in PyTorch, flushing first when it reads a pending value or writes memory the
    trace reads or produces."""
    reason = None
    for t in _tensor_args(args, kwargs):
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


def _needs_grad(args, kwargs):
    return any(t.requires_grad for t in _tensor_args(args, kwargs))


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


def _install(torch):
    global _torch, _graph_task_id, _grad_enabled, _HANDLERS
    if _torch is not None:
        return
    _tensors._bind(torch)
    from ._handlers import HANDLERS  # imports torch's op namespaces: only once a mode runs
    from .._graph import _torch_path

    _torch_path()  # flushes run on torch's intra-op threads, as the ops around them

    _HANDLERS = HANDLERS
    _graph_task_id = torch._C._current_graph_task_id
    _grad_enabled = torch.is_grad_enabled
    aten = torch.ops.aten
    _OBSERVERS.update({aten._local_scalar_dense.default, aten.equal.default,
                       aten.is_nonzero.default})
    _torch = torch


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
            # Autograd is excluded: ops inside a backward pass, and ops with an input that
            # requires grad while grad mode is on, run in PyTorch.
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


_fn_mode_class = None
_FUNCTIONS = {}  # torch function / Tensor method -> handler (_functions, filled by the class)


def _make_fn_mode_class(torch):
    """The function-level front (``_functions``): hot torch functions recorded where Python
    calls them, one lazy op per call instead of one Python dispatch per ATen op."""
    from torch.overrides import TorchFunctionMode

    global _FUNCTIONS
    from ._functions import FUNCTIONS

    _FUNCTIONS = FUNCTIONS
    # The argument types of calls on plain tensors (torch lists each overloaded type once):
    # Tensor subclasses keep their own __torch_function__.
    T, P = torch.Tensor, torch.nn.Parameter
    plain = frozenset([(), (T,), (P,), (T, P), (P, T)])
    no_python_key = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)
    exclude = torch._C._ExcludeDispatchKeyGuard
    dispatch_modes = torch._C._len_torch_dispatch_stack

    class DvmLazyFunctionMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            # The Python form of _dvm_torch.lazy_torch_function, which replaces it below
            # where the extension was built (the same checks, ~1.5 us less per call).
            handler = _FUNCTIONS.get(func)
            # Autograd as in the dispatch mode. Handlers bypass the Python dispatch key: only
            # while lazy mode's own dispatch modes are all there is on it (another mode, say a
            # FakeTensorMode, must see every op). A refusal is no fallback: the dispatcher's
            # ATen handlers take the call.
            if handler is not None and types in plain and dispatch_modes() == _state.depth and \
                    _graph_task_id() == -1 and (
                    not _grad_enabled() or not _needs_grad(args, kwargs or {})):
                try:
                    with exclude(no_python_key):
                        return handler(*args, **kwargs) if kwargs else handler(*args)
                except _FALLBACK:
                    pass
            return func(*args, **kwargs) if kwargs else func(*args)

    native = _native_front()
    if native is not None:
        native.lazy_configure(_FUNCTIONS, T, P, _state, _FALLBACK)
        prologue = native.lazy_torch_function

        class DvmLazyNativeFunctionMode(DvmLazyFunctionMode):
            def __init__(self):
                super().__init__()
                # torch takes a mode's __torch_function__ only as a method bound to the mode.
                self.__torch_function__ = types.MethodType(prologue, self)

        return DvmLazyNativeFunctionMode
    return DvmLazyFunctionMode


def _native_front():
    """dvm._dvm_torch where it was built and DVM_LAZY_NATIVE is not 0, else None."""
    if os.environ.get("DVM_LAZY_NATIVE", "1").strip() == "0":
        return None
    try:
        from .. import _dvm_torch
    except ImportError:  # pragma: no cover (an install built without torch)
        return None
    return _dvm_torch


def _functions_on():
    """DVM_LAZY_FUNCTIONS=0 records at the ATen level only (for comparisons and diagnosis)."""
    return os.environ.get("DVM_LAZY_FUNCTIONS", "1").strip() != "0"


_auto_threads = [None]  # the thread count lazy mode last took from torch (None: never)


def _follow_torch_threads(torch, o):
    """Flushes run on torch's intra-op thread count (torch.set_num_threads) unless the caller
    chose a count (lazy options) or DVM_NUM_THREADS is set: the two pools then never
    oversubscribe the cores between them."""
    if os.environ.get("DVM_NUM_THREADS", "").strip():
        return
    if o.num_threads not in (0, _auto_threads[0]):
        return  # set by the caller
    o.num_threads = _auto_threads[0] = torch.get_num_threads()


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
        self._fn_modes = []
        self._outer_freeze = []

    def __enter__(self):
        global _mode_class, _fn_mode_class
        import torch

        _install(torch)
        if _mode_class is None:
            _mode_class = _make_mode_class(torch)
        o = _lz.options()
        if self.max_trace_ops is not None:
            o.max_trace_ops = int(self.max_trace_ops)
        _follow_torch_threads(torch, o)
        _lz.set_options(o)
        mode = _mode_class()
        mode.__enter__()
        self._modes.append(mode)
        fmode = None
        if _functions_on():
            if _fn_mode_class is None:
                _fn_mode_class = _make_fn_mode_class(torch)
            fmode = _fn_mode_class()
            fmode.__enter__()
        self._fn_modes.append(fmode)
        _tensors._patch(True)
        _state.depth += 1
        self._outer_freeze.append(_state.freeze)
        _state.freeze = bool(self.freeze_weights)
        return self

    def __exit__(self, *exc):
        mode = self._modes.pop()
        fmode = self._fn_modes.pop()
        if fmode is not None:
            fmode.__exit__(*exc)
        try:
            _flush(FlushReason.SYNC)
        finally:
            _state.depth -= 1
            _state.freeze = self._outer_freeze.pop()
            _tensors._patch(False)
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
