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

Modules (private): ``_mode`` (the dispatch mode and the flush policy: when an op is recorded,
when it runs in PyTorch and what it flushes first; ``LazyMode``; the fallback counters),
``_handlers`` (aten ops -> lazy ops; which DVM op each ATen op maps to comes from the table
shared with the torch.compile backend, ``dvm.aten_ops``), ``_tensors`` (torch tensors <->
lazy values: the trace's memory, leaves, results and views, and the ``torch.Tensor`` reads
patched to flush first).
"""

import sys
import types

from .._dvm import BinaryOp, DType, DvmError, ReduceOp, UnaryOp  # noqa: F401  (were importable)
from .._dvm import lazy as _lz

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

# Wraps torch memory as a lazy leaf. _tensors looks it up here on every call, so patching
# dvm.lazy._wrap_strided takes effect (tests count wraps).
_wrap_strided = Tensor._wrap_strided

from ._mode import LazyMode, handler_fallbacks, is_pending, reset_stats  # noqa: E402


class _CallableModule(types.ModuleType):
    """Makes the module callable: ``dvm.lazy()`` / ``dvm.lazy(fn)`` / ``@dvm.lazy``."""

    def __call__(self, fn=None, *, max_trace_ops=None, freeze_weights=False):
        if callable(fn):
            return LazyMode(max_trace_ops, freeze_weights)(fn)
        return LazyMode(max_trace_ops, freeze_weights)


sys.modules[__name__].__class__ = _CallableModule
