"""DVM: a bytecode virtual machine for dynamic tensor programs.

Build a kernel once with symbolic dims, compile it, run it for any shapes::

    import numpy as np, dvm

    kb = dvm.KernelBuilder("bias_gelu")
    S = kb.symbol("S")
    x = kb.load("x", dvm.DType.F32, [S, 768])
    b = kb.load("b", dvm.DType.F32, [768])
    kb.store("y", kb.unary(dvm.UnaryOp.GELU_ERF, kb.add(x, b)))
    ck = dvm.compile(kb.build())

    y = ck(xs, bs)                    # allocates the output (numpy, or torch for torch inputs)
    stats = ck.run([xs, bs], [y])     # writes into caller-provided outputs, zero-copy

Arrays cross without copies (numpy arrays and torch CPU tensors, any strides). Errors that a
caller can cause raise ``dvm.DvmError``; ``e.code`` is a ``dvm.StatusCode``.
"""

from ._dvm import (
    MAX_RANK,
    SLICE_END,
    SYM_MAX,
    Executable,
    Graph,
    GraphBuilder,
    GraphCompileOptions,
    GraphRunStats,
    SymExpr,
    Tensor,
    models,
    parse_graph,
    parse_sym_expr,
    sym_max,
    sym_min,
    CompiledKernel,
    CompileOptions,
    Constant,
    WeightCacheStats,
    clear_weight_cache,
    set_weight_cache_capacity,
    weight_cache_stats,
    CType,
    Dim,
    DType,
    DvmError,
    BinaryOp,
    Kernel,
    KernelBuilder,
    ReduceOp,
    RunStats,
    StatusCode,
    UnaryOp,
    Value,
    binary_op_name,
    compute_type,
    dtype_name,
    dtype_size,
    is_float,
    is_integer,
    promote_types,
    reduce_op_name,
    run_reference,
    status_code_name,
    unary_op_name,
)
from ._arrays import constant, dtype_of, empty, numpy_dtype, torch_dtype
from ._call import compile
from . import _graph  # noqa: F401  (installs Executable.__call__)
from . import lazy  # dvm.lazy(): the PyTorch lazy mode; dvm.lazy.Tensor: lazy tensors

__version__ = "0.1.0"

__all__ = [
    "MAX_RANK",
    "SLICE_END",
    "SYM_MAX",
    "Executable",
    "Graph",
    "GraphBuilder",
    "GraphCompileOptions",
    "GraphRunStats",
    "SymExpr",
    "Tensor",
    "models",
    "parse_graph",
    "parse_sym_expr",
    "sym_max",
    "sym_min",
    "BinaryOp",
    "CType",
    "CompileOptions",
    "CompiledKernel",
    "Constant",
    "WeightCacheStats",
    "clear_weight_cache",
    "constant",
    "set_weight_cache_capacity",
    "weight_cache_stats",
    "DType",
    "Dim",
    "DvmError",
    "Kernel",
    "KernelBuilder",
    "ReduceOp",
    "RunStats",
    "StatusCode",
    "UnaryOp",
    "Value",
    "binary_op_name",
    # Not "compile": `from dvm import *` would shadow the builtin. Call it as dvm.compile
    # (like re.compile and torch.compile).
    "compute_type",
    "dtype_name",
    "dtype_of",
    "dtype_size",
    "empty",
    "is_float",
    "is_integer",
    "lazy",
    "numpy_dtype",
    "promote_types",
    "reduce_op_name",
    "run_reference",
    "status_code_name",
    "torch_dtype",
    "unary_op_name",
]
