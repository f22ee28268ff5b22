"""The ``dvm`` torch.compile backend: Dynamo graph -> AOTAutograd (core ATen) -> DVM.

``dvm_backend(gm, example_inputs)`` is what Dynamo calls, once per captured graph. It runs
AOTAutograd with the core-ATen decompositions (minus a few ops DVM has composites for:
silu, rms_norm, CPU flash attention), then partitions the inference graph: supported nodes are
compiled into DVM graphs with symbolic shapes, once; the rest runs as ATen. Every later call with
any sizes that satisfy Dynamo's guards reuses the same DVM executables: each new shape costs a
few microseconds of bytecode encoding inside DVM, never a recompile.

Backward graphs (training) run in PyTorch (AOTAutograd's eager backward), logged.
"""

from __future__ import annotations

import functools
import itertools

import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from .partition import partition_and_compile
from .runtime import STATS, bump, log, log_fallback

aten = torch.ops.aten

# Ops DVM translates as one composite: keep AOTAutograd from decomposing them.
_KEEP = (
    "_scaled_dot_product_flash_attention_for_cpu.default",
    "silu.default",
    "_fused_rms_norm.default",
)

_counter = itertools.count()


@functools.lru_cache(maxsize=1)
def decompositions():
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    for name in _KEEP:
        packet, overload = name.split(".")
        op = getattr(getattr(aten, packet, None), overload, None)
        if op is not None:
            table.pop(op, None)
    return table


def _fw_compiler(gm: torch.fx.GraphModule, example_inputs, *, graph_name, freeze_weights):
    bump("aot_graphs")
    compiled = partition_and_compile(gm, example_inputs, graph_name, freeze_weights)
    return make_boxed_func(compiled.forward)


def _bw_compiler(gm: torch.fx.GraphModule, example_inputs, *, graph_name):
    bump("backward_graphs")
    log_fallback("dvm: %s: backward graph runs in PyTorch (eager ATen): DVM compiles "
                 "inference graphs only", graph_name)
    return make_boxed_func(gm.forward)


OPTIONS = ("freeze_weights",)


def dvm_backend(gm: torch.fx.GraphModule, example_inputs, options=None, **kwargs):
    """torch.compile(model, backend="dvm", options={...}).

    options["freeze_weights"] (default False): the caller promises that parameters change only
    through in-place ops on the parameter itself (optimizer steps, ``p.copy_()``), never through
    ``p.data`` or a numpy alias; DVM then packs each weight once as a matmul operand and reuses
    it across calls (faster for small batches; costs the packed copy's memory, bounded by
    DVM_WEIGHT_CACHE_MB). Without it every call reads the weights as they are."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS)) + sorted(kwargs)
    if unknown:
        log.warning("dvm backend ignores options %s (known: %s)", unknown, list(OPTIONS))
    freeze = bool(options.get("freeze_weights", False))
    name = f"g{next(_counter)}"
    backend = aot_autograd(
        fw_compiler=functools.partial(_fw_compiler, graph_name=name, freeze_weights=freeze),
        bw_compiler=functools.partial(_bw_compiler, graph_name=name + "_bw"),
        decompositions=decompositions(),
    )
    try:
        compiled = backend(gm, example_inputs)
    except Exception as e:
        # e.g. TensorifyScalarRestartAnalysis: Dynamo re-traces and calls again (no recompile)
        bump("backend_restarts")
        log.debug("dvm: %s: backend call ended by %s", name, type(e).__name__)
        raise
    bump("dynamo_graphs")
    return compiled


def stats() -> dict[str, int]:
    """Counters since import (or reset_stats()): dynamo_graphs (graphs Dynamo compiled with
    this backend; a call that Dynamo restarts, e.g. to tensorify a float, is counted in
    backend_restarts instead), aot_graphs, dvm_partitions (partitions compiled), dvm_nodes,
    partitions_run (partitions that ran in DVM: each counted at its first successful call),
    fallback_nodes (compute nodes left to PyTorch), partition_fallbacks (partitions whose DVM
    build failed: they run in PyTorch), runtime_fallbacks (partition calls that failed in DVM and
    ran in PyTorch), backward_graphs."""
    return dict(STATS)


def reset_stats() -> None:
    STATS.clear()


def register() -> None:
    """Registers the backend by name (the entry point does this for installed packages)."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "dvm" not in _BACKENDS:
        register_backend(name="dvm")(dvm_backend)
