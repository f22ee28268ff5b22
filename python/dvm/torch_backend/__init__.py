"""torch.compile(model, backend="dvm"): compile each captured graph once, symbolically, and run
every shape without recompiling.

    import torch, dvm.torch_backend  # the import is optional once the package is installed
    model = torch.compile(model, backend="dvm", dynamic=True)

Modules: ``backend`` (the entry point: AOTAutograd with core-ATen decompositions), ``ops`` (the
op table, one translator per op family, registered against the ATen -> DVM table that lazy mode
shares: ``dvm.aten_ops``), ``translate`` (FX -> dvm.GraphBuilder), ``symbolic``
(sympy sizes -> dvm.SymExpr), ``partition`` (DVM partitions vs ATen), ``runtime`` (the
per-partition callable). ``DVM_LOG_FALLBACK=1`` (or logger "dvm" at DEBUG) logs every node
that runs in PyTorch and why.
"""

from .backend import decompositions, dvm_backend, register, reset_stats, stats
from .ops import OPS, op_table
from .runtime import output_cache_stats, release_output_cache

__all__ = ["OPS", "decompositions", "dvm_backend", "op_table", "output_cache_stats", "register",
           "release_output_cache", "reset_stats", "stats"]
