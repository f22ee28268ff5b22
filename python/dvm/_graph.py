"""Conveniences over the bound Executable: calling a compiled graph."""

from ._arrays import empty
from ._dvm import Executable


def _call(self, *inputs, out=None, stats=False):
    """Runs the graph, allocating outputs (numpy arrays, or torch tensors when any input is
    one) unless `out` provides them. Returns the list of outputs, and GraphRunStats after it
    when stats=True."""
    if out is None and not stats:
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
