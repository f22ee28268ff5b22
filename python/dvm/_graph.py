"""Conveniences over the bound Executable: calling a compiled graph."""

import sys

from ._arrays import empty
from ._dvm import Executable

_TORCH = None  # (torch.Tensor, dvm._dvm_torch.call) once torch is imported, or False


def _torch_path():
    """torch.Tensor and dvm._dvm_torch.call, once torch has been imported by the user (dvm
    never imports torch itself) and when the extension was built; else None. Importing
    dvm._dvm_torch also puts DVM's parallel work on torch's intra-op threads (one pool for
    both: see torch_call.cc)."""
    global _TORCH
    if _TORCH is None:
        if "torch" not in sys.modules:
            return None
        try:
            from ._dvm_torch import call
        except ImportError:  # pragma: no cover (an install built without torch)
            _TORCH = False
        else:
            _TORCH = (sys.modules["torch"].Tensor, call)
    return _TORCH or None


_INDEX = [tuple(range(n)) for n in range(17)]


def _call(self, *inputs, out=None, stats=False):
    """Runs the graph, allocating outputs (numpy arrays, or torch tensors when any input is
    one) unless `out` provides them. Returns the list of outputs, and GraphRunStats after it
    when stats=True. Torch tensors are read, and outputs made, in C++ (dvm._dvm_torch: large
    outputs from blocks kept for reuse) when every input is one that path takes."""
    path = _torch_path()
    if out is None and not stats:
        if path is not None and inputs and isinstance(inputs[0], path[0]):
            n = len(inputs)
            try:
                return list(path[1](self, inputs, _INDEX[n] if n < 17 else tuple(range(n))))
            except NotImplementedError:  # an input only the general path takes
                pass
        return self.call(*inputs)
    inputs = list(inputs)
    if out is None:
        shapes = self.output_shapes(inputs)
        outs = [empty(s, t, inputs) for s, t in zip(shapes, self.output_dtypes())]
    else:
        outs = list(out)
    run_stats = self.run(inputs, outs)
    return (outs, run_stats) if stats else outs


Executable.__call__ = _call
