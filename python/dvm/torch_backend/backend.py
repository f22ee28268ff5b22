"""The ``dvm`` torch.compile backend: Dynamo graph -> core ATen -> DVM.

``dvm_backend(gm, example_inputs)`` is what Dynamo calls, once per captured graph. The graph is
lowered to core ATen with the core-ATen decompositions (minus a few ops DVM has composites for:
silu, rms_norm, CPU flash attention), then partitioned: supported nodes are compiled into DVM
graphs with symbolic shapes, once; the rest runs as ATen. Every later call with any sizes that
satisfy Dynamo's guards reuses the same DVM executables: each new shape costs a few
microseconds of bytecode encoding inside DVM, never a recompile.

Two ways down to ATen:
- inference graphs (no input needs a gradient, or grad mode is off) are traced once with
  ``make_fx`` over Dynamo's own fake tensors and called directly: no AOTAutograd trace at
  compile time and no AOTAutograd runtime wrappers on every call. In-place ops on values the
  graph made are functionalized (a second trace, only when the first shows a mutation); a
  graph that writes an input or returns an alias of one takes the AOTAutograd path instead,
  which handles both;
- everything else goes through AOTAutograd. Backward graphs (training) run in PyTorch
  (AOTAutograd's eager backward), logged.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import itertools
import operator
import sys

import torch
from functorch.compile import make_boxed_func
from torch._dispatch.python import enable_python_dispatcher
from torch._dynamo.backends.common import aot_autograd

from .partition import partition_and_compile, single_partition_call
from .runtime import STATS, bump, log, log_fallback

aten = torch.ops.aten

# Ops DVM translates as one composite: keep AOTAutograd from decomposing them.
_KEEP = (
    "_scaled_dot_product_flash_attention_for_cpu.default",
    "silu.default",
    "_fused_rms_norm.default",
)

_counter = itertools.count()
_exit_hook = []


def _release_at_exit():
    """Dynamo's code caches (C++ state on code objects) and AOTAutograd's wrappers keep the
    compiled partitions, and with them DVM's executables, alive past the teardown of DVM's
    extension module, which nanobind then reports as leaks. Drop them while Python still runs."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        try:
            dynamo.reset()
        except Exception:  # noqa: BLE001  (best effort at exit)
            pass
    gc.collect()


def _register_exit_hook():
    if not _exit_hook:
        _exit_hook.append(True)
        atexit.register(_release_at_exit)


@functools.lru_cache(maxsize=1)
def decompositions():
    """Core ATen's decompositions of the ops that run below autograd, minus _KEEP.

    Not torch's core_aten_decompositions(): that is torch.export's table, which adds an entry
    for every CompositeImplicitAutograd op of every namespace, found by walking all registered
    ops (0.13-0.14 s at a process's first compile). Tracing below autograd (make_fx, as here,
    and AOTAutograd) never sees such ops, the dispatcher decomposes them first, so the entries
    change nothing: HuggingFace GPT-2, BERT, T5 and Llama trace to the same ATen ops either way.
    """
    from torch._decomp import _core_aten_decompositions_post_autograd

    return without_kept(_core_aten_decompositions_post_autograd())


def without_kept(table) -> dict:
    """A copy of a decomposition table without the ops of _KEEP."""
    table = dict(table)
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


def _needs_autograd(gm, example_inputs) -> bool:
    """AOTAutograd's rule: some input (or parameter held by the graph) requires grad and grad
    mode is on."""
    if not torch.is_grad_enabled():
        return False
    return any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs) or any(
        p.requires_grad for p in gm.parameters())


def _fake_inputs(example_inputs):
    """Dynamo's example inputs as fake tensors of the backend's fake mode, with the symbolic
    sizes Dynamo chose (what AOTAutograd does before tracing); None without a tracing context."""
    from torch._guards import TracingContext

    ctx = TracingContext.try_get()
    if ctx is None or ctx.fake_mode is None:
        return None, None
    fm = ctx.fake_mode
    fakes = []
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            sc = ctx.tensor_to_context.get(x)
            fakes.append(fm.from_tensor(x, symbolic_context=sc,
                                        source=sc.tensor_source if sc is not None else None))
        else:
            fakes.append(x)
    return fm, fakes


def _functional_without_input_aliases(g: torch.fx.GraphModule) -> str | None:
    """Why the traced graph needs AOTAutograd (None if it does not): an op that mutates, or an
    output sharing storage with an input."""
    from torch.multiprocessing.reductions import StorageWeakRef

    inputs = set()
    for n in g.graph.nodes:
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor):
            inputs.add(StorageWeakRef(n.meta["val"].untyped_storage()))
        elif n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            if n.target._schema.is_mutable:
                return f"{n.target} mutates"
        elif n.op == "output":
            outs = n.args[0] if isinstance(n.args[0], (tuple, list)) else [n.args[0]]
            for o in outs:
                v = o.meta.get("val") if isinstance(o, torch.fx.Node) else None
                if isinstance(v, torch.Tensor) and StorageWeakRef(v.untyped_storage()) in inputs:
                    return f"output {o.name} aliases an input"
    return None


def _compile_inference(gm, example_inputs, name, freeze):
    """The AOTAutograd-free path: make_fx over Dynamo's fake inputs, then partition. None when
    the graph needs AOTAutograd (see _functional_without_input_aliases)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    fm, fakes = _fake_inputs(example_inputs)
    if fm is None:
        return None
    # As AOTAutograd traces with symbolic shapes: under the Python dispatcher, so that meta
    # functions written in Python (meta_addbmm's expand of SymInt sizes) run instead of C++
    # kernels that require concrete sizes.
    dispatch = enable_python_dispatcher if fm.shape_env is not None else contextlib.nullcontext
    with fm, dispatch():
        g = make_fx(gm, decomposition_table=decompositions())(*fakes)
    why = _functional_without_input_aliases(g)
    if why is not None and why.endswith("mutates") and _rewrite_inplace_ops(g, fm):
        why = _functional_without_input_aliases(g)
    if why is not None and why.endswith("mutates"):
        # In-place ops on intermediates (T5's `scores += position_bias`) are functionalized
        # away; a write to an input survives as a copy_ into it and keeps AOTAutograd's path.
        # The ATen graph is functionalized, not Dynamo's: functorch's functionalize runs torch
        # functions' C++ decompositions (F.linear of a 3-D input), which read sizes through
        # aten.size and so made every symbolic size a constant guard (a recompile per
        # length: DeBERTa-v2, BEiT, Swin).
        with fm, dispatch():
            g = make_fx(torch.func.functionalize(g, remove="mutations"),
                        decomposition_table=decompositions())(*fakes)
        why = _functional_without_input_aliases(g)
    if why is not None:
        log.debug("dvm: %s: AOTAutograd path: %s", name, why)
        return None
    bump("aot_graphs")
    bump("direct_graphs")
    fused = partition_and_compile(g, fakes, name, freeze)
    return single_partition_call(fused) or fused.forward


def _functional_form(target):
    """The out-of-place overload of an in-place ATen op that writes its first argument only
    (aten.add_.Tensor -> aten.add.Tensor), else None."""
    if not isinstance(target, torch._ops.OpOverload) or not target._schema.is_mutable:
        return None
    args = target._schema.arguments
    written = [a.alias_info is not None and a.alias_info.is_write for a in args]
    if not args or not written[0] or any(written[1:]):
        return None
    name = target._schema.name.split("::")[-1]
    if not name.endswith("_") or name.startswith("_"):
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    op = getattr(packet, target._overloadname, None) if packet is not None else None
    if not isinstance(op, torch._ops.OpOverload) or op._schema.is_mutable:
        return None
    if [a.name for a in op._schema.arguments] != [a.name for a in args]:
        return None
    return op


def _rewrite_inplace_ops(g: torch.fx.GraphModule, fm) -> bool:
    """Replaces in-place ops on values the graph made (T5's `scores += position_bias`) by their
    out-of-place forms, in the traced graph: the value's later readers read the new node. Only
    where nothing else can see the write: the written value is no input, constant or view of
    one, and no other node sharing its storage is read after the write. All or nothing: False
    (the graph untouched) when any write does not qualify; the caller then functionalizes by
    tracing again (~0.2 s for T5's encoder), which handles every case."""
    from torch.multiprocessing.reductions import StorageWeakRef

    nodes = list(g.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}

    def storage(n):
        v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
        return StorageWeakRef(v.untyped_storage()) if isinstance(v, torch.Tensor) else None

    def fake(a):
        return a.meta.get("val") if isinstance(a, torch.fx.Node) else a

    plan = []  # (mutation node, functional op, fake value of its result)
    chain = set()  # nodes naming a value that is written: itself and its planned writes
    by_storage = {}
    for n in nodes:
        st = storage(n)
        if st is not None:
            by_storage.setdefault(st, []).append(n)
    for n in nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload) or \
                not n.target._schema.is_mutable:
            continue
        op = _functional_form(n.target)
        written = n.args[0] if n.args else None
        if op is None or not isinstance(written, torch.fx.Node):
            return False
        st = storage(written)
        if st is None or st != storage(n):
            return False
        for other in by_storage.get(st, []):
            if other.op in ("placeholder", "get_attr"):
                return False  # an input's or a constant's memory: the write must happen
            if other is n or other is written or other in chain or order[other] > order[n]:
                continue
            if any(order[u] > order[n] for u in other.users):
                return False  # an alias (a view) read after the write would miss it
        args = [fake(a) for a in n.args]
        kwargs = {k: fake(v) for k, v in n.kwargs.items()}
        try:
            with fm, enable_python_dispatcher():
                val = op(*args, **kwargs)
        except Exception:  # noqa: BLE001 (any refusal: trace again instead)
            return False
        want = n.meta.get("val")
        if not isinstance(val, torch.Tensor) or not isinstance(want, torch.Tensor) or \
                val.dtype != want.dtype or val.shape != want.shape:
            return False
        plan.append((n, op, val))
        chain.update((written, n))
    if not plan:
        return False
    for n, op, val in plan:
        written = n.args[0]
        with g.graph.inserting_before(n):
            f = g.graph.call_function(op, n.args, dict(n.kwargs))
        f.meta = dict(n.meta)
        f.meta["val"] = val
        for u in list(written.users):
            if u is not n and u is not f and order[u] > order[n]:
                u.replace_input_with(written, f)
        n.replace_all_uses_with(f)
        order[f] = order[n]
        g.graph.erase_node(n)
    g.graph.lint()
    g.recompile()
    return True


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic collector off while a graph compiles, and what the compile made collected
    alone at its end. Tracing a model allocates hundreds of thousands of objects (fake tensors,
    sympy expressions, FX nodes), which trigger full collections, each a walk over every object
    of a process holding torch and transformers (0.2-0.3 s each on HuggingFace GPT-2 / Llama, 2
    layers). Paused, the allocations still count toward the next one, which then came right
    after the compile, in Dynamo's part of the first call: so the objects older than the
    compile are frozen meanwhile (gc.freeze), and one collection over the compile's own objects
    clears its cycles and the counters (3 ms on Llama; its first call 2.1-2.2 -> 1.9 s). A
    program that froze objects itself keeps them frozen: then (and with the collector off) the
    collection is left to Python."""
    was_enabled = gc.isenabled()
    gc.disable()
    freeze = was_enabled and gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            try:
                gc.collect()
            finally:
                gc.unfreeze()
        if was_enabled:
            gc.enable()


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
    _register_exit_hook()
    with _collector_paused():
        return _compile(gm, example_inputs, freeze)


def _compile(gm, example_inputs, freeze):
    name = f"g{next(_counter)}"
    if not _needs_autograd(gm, example_inputs):
        compiled = _compile_inference(gm, example_inputs, name, freeze)
        if compiled is not None:
            bump("dynamo_graphs")
            return compiled
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
    backend_restarts instead), aot_graphs (core-ATen graphs made
    from them), direct_graphs (of those, inference graphs traced without AOTAutograd),
    dvm_partitions (partitions compiled), dvm_nodes,
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
