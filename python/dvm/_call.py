"""Conveniences over the bound CompiledKernel: dvm.compile() and calling a compiled kernel."""

from ._arrays import empty
from ._dvm import CompiledKernel, CompileOptions


def compile(kernel, num_threads=0, cache_capacity=256):  # noqa: A001 (mirrors torch.compile)
    """CompiledKernel.create(kernel, CompileOptions(num_threads, cache_capacity))."""
    return CompiledKernel.create(kernel, CompileOptions(num_threads, cache_capacity))


def _call(self, *inputs, params=(), out=None, stats=False):
    """Runs the kernel, allocating outputs (shapes from infer_output_shapes; numpy arrays, or
    torch tensors when any input is one) unless `out` provides them. Returns the output (a
    tuple for several), and RunStats after it when stats=True."""
    if out is None:
        shapes = self.infer_output_shapes(inputs)
        outs = [empty(s, t, inputs) for s, t in zip(shapes, self.kernel.output_dtypes)]
    else:
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
    run_stats = self.run(inputs, outs, params)
    result = outs[0] if len(outs) == 1 else tuple(outs)
    return (result, run_stats) if stats else result


CompiledKernel.__call__ = _call
