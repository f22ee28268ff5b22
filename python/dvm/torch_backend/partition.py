"""Partition a core-ATen FX graph into DVM partitions and PyTorch (ATen) code.

``DvmOperatorSupport`` asks the translator about every node (``translate.check_node``: the node
is translated on its own and built, so a "yes" is real and a "no" has a reason).
``CapabilityBasedPartitioner`` groups supported nodes into maximal acyclic partitions; each
partition becomes one DVM graph compiled once (``build_partition``) and called through a
``DvmPartition``; everything else stays ATen code in the outer GraphModule. Partitions made
only of views and copies stay in PyTorch (there, they cost nothing).
"""

from __future__ import annotations

import operator
import os

import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

import dvm

from . import ops  # noqa: F401  (fills the op table)
from .runtime import DvmPartition, bump, log_fallback
from .symbolic import Unsupported
from .translate import Translator, check_node, fake_value, set_shape_env

aten = torch.ops.aten

# Ops that only change metadata in PyTorch: a partition of nothing else stays in PyTorch.
FREE_OPS = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
    aten.transpose.int, aten.t.default, aten.expand.default, aten.unsqueeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.slice.Tensor,
    aten.select.int, aten.alias.default, aten.detach.default, aten.clone.default,
    aten.lift_fresh_copy.default, aten.split.Tensor, aten.split_with_sizes.default,
    aten.narrow.default, aten.unbind.int, operator.getitem,
}


# The reason given to views that must stay views (see _input_aliases_returned).
KEPT_VIEW = "a view of a graph input that the graph returns: kept a view (free in PyTorch)"


def _input_aliases_returned(gm: torch.fx.GraphModule) -> set:
    """The view nodes whose value shares storage with a graph input and reaches the graph's
    outputs through views only. They must stay PyTorch views: AOTAutograd rebuilds an output
    that aliases an input from the compiled output's size, strides and storage offset (an
    as_strided of the input where the view's arguments are symbolic), so a DVM copy with other
    strides made it read the input with the wrong layout (HuggingFace's Longformer returned a
    permuted view of an input, then computed with a transposed copy of it)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    def storage(n):
        v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
        return StorageWeakRef(v.untyped_storage()) if isinstance(v, torch.Tensor) else None

    inputs = {storage(n) for n in gm.graph.nodes if n.op == "placeholder"} - {None}
    if not inputs:
        return set()
    views = FREE_OPS - {aten.clone.default, aten.lift_fresh_copy.default}
    kept, todo = set(), []
    outs = gm.graph.output_node().args[0]
    for o in outs if isinstance(outs, (tuple, list)) else [outs]:
        if isinstance(o, torch.fx.Node):
            todo.append(o)
    while todo:  # from each output up through views of input storage
        n = todo.pop()
        if n in kept or n.op != "call_function" or n.target not in views:
            continue
        if storage(n) not in inputs:
            continue
        kept.add(n)
        todo.extend(a for a in n.all_input_nodes)
    return kept


class DvmOperatorSupport(OperatorSupportBase):
    def __init__(self, kept_views=()):
        super().__init__()
        self.reasons: dict[torch.fx.Node, str | None] = {}
        self.kept_views = set(kept_views)

    def reason(self, node) -> str | None:
        if node in self.reasons:
            return self.reasons[node]
        r = self._reason(node)
        self.reasons[node] = r
        return r

    def _reason(self, node) -> str | None:
        if node.op != "call_function":
            return f"{node.op} node"
        if node in self.kept_views:
            return KEPT_VIEW
        if node.target is operator.getitem:
            src = node.args[0]
            if not isinstance(src, torch.fx.Node):
                return "getitem of a constant"
            r = self.reason(src)
            if r is not None:
                return f"its producer {src.name} runs in PyTorch"
            if node.args[1] in src.meta.get("dvm_none_outputs", ()):
                return f"output {node.args[1]} of {src.name} is not computed by DVM"
            return None
        v = fake_value(node) if ("val" in node.meta or "example_value" in node.meta) else None
        if not isinstance(v, (torch.Tensor, tuple, list)) or (
                isinstance(v, (tuple, list)) and not any(isinstance(x, torch.Tensor) for x in v)):
            # aten.size.default gives a list of SymInts
            return "not a tensor op (size arithmetic stays in Python)"
        r = check_node(node)
        if r is None:
            none = node.meta.get("dvm_none_outputs", ())
            for u in node.users:
                if u.target is operator.getitem and u.args[1] in none and u.users:
                    return (f"its output {u.args[1]} (used by {next(iter(u.users)).name}) is "
                            "not computed by DVM")
        return r

    def is_node_supported(self, submodules, node) -> bool:
        return self.reason(node) is None


def _shape_env(gm, example_inputs):
    from torch._guards import detect_fake_mode

    fm = detect_fake_mode(example_inputs)
    if fm is None:
        for n in gm.graph.nodes:
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor) and hasattr(v, "fake_mode"):
                fm = v.fake_mode
                break
    return getattr(fm, "shape_env", None) if fm is not None else None


def torch_threads() -> int:
    """DVM follows torch's intra-op thread count (torch.set_num_threads), so the two pools do
    not oversubscribe the cores between them; DVM_NUM_THREADS, when set, decides instead (0)."""
    if os.environ.get("DVM_NUM_THREADS", "").strip():
        return 0
    return torch.get_num_threads()


def _hint(v):
    if isinstance(v, torch.SymInt):
        return v.node.hint
    return int(v)


def dense_order(fake):
    """The dims of a dense, non-contiguous fake tensor from outermost to innermost in memory
    (a permuted layout, e.g. a transposed view's product: eager keeps the layout through
    elementwise ops), or None (contiguous, not dense, or sizes without hints)."""
    if not isinstance(fake, torch.Tensor) or fake.dim() < 2:
        return None
    try:
        sizes = [_hint(d) for d in fake.shape]
        strides = [_hint(d) for d in fake.stride()]
    except (TypeError, AttributeError):
        return None
    if any(v is None for v in sizes + strides):
        return None
    dims = [d for d in range(fake.dim()) if sizes[d] != 1]
    order = sorted(dims, key=lambda d: -strides[d])  # stable: ties keep the dims' order
    expect = 1
    for d in reversed(order):  # dense: each stride is the product of the sizes inside it
        if strides[d] != expect:
            return None
        expect *= sizes[d]
    order = [d for d in range(fake.dim()) if sizes[d] == 1] + order
    return None if order == list(range(fake.dim())) else tuple(order)


def build_partition(sub: torch.fx.GraphModule, name: str, shape_env, outer_symbols=()):
    """Translates one partition GraphModule into a DVM graph, compiles it once, and wraps it.

    Returns (DvmPartition, extra): `extra` lists symbols the caller must append to the
    partition's arguments (as ints, in order): symbols that none of the partition's own inputs
    binds but the outer graph knows (`outer_symbols`)."""
    tr = Translator(name, shape_env)
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    in_plan = []
    input_ids = {}
    sym_inputs = {}  # symbol name -> placeholder index of a SymInt that is exactly that symbol
    for i, ph in enumerate(placeholders):
        v = fake_value(ph)
        tr.bind_placeholder(ph, f"in{i}_{ph.name}")
        if isinstance(v, torch.Tensor):
            in_plan.append(("arg", i))
            input_ids[tr.env[ph].id] = i
        elif isinstance(v, torch.SymFloat):
            in_plan.append(("float", i))
        elif isinstance(v, torch.SymInt):
            e = tr.env[ph]
            if not isinstance(e, int) and e.is_symbol():
                sym_inputs.setdefault(e.symbol_name(), i)
    out_node = sub.graph.output_node()
    for node in sub.graph.nodes:
        if node.op == "call_function":
            tr.run_node(node)
    outs = out_node.args[0]
    tuple_out = isinstance(outs, (tuple, list))
    outs = list(outs) if tuple_out else [outs]
    out_plan = []
    out_dtypes = []
    out_orders = []  # per DVM output: eager's memory order of its dims, if not contiguous
    emitted = {}
    for o in outs:
        v = tr.env.get(o)
        if not isinstance(v, dvm.Tensor):
            raise Unsupported(f"partition output {o} is not a DVM tensor")
        if v.id in input_ids:
            out_plan.append(("clone", input_ids[v.id]))
            continue
        if v.id not in emitted:
            emitted[v.id] = len(emitted)
            tr.gb.output(f"out{len(emitted) - 1}", v)
            out_dtypes.append(fake_value(o).dtype)
            out_orders.append(dense_order(fake_value(o)))
        out_plan.append(("dvm", emitted[v.id]))
    if not emitted:
        raise Unsupported("partition computes nothing")
    # symbols that no tensor input binds as a plain dim: bind them through carrier inputs
    plain = set()
    for shape in tr.input_shapes:
        for d in shape:
            if not isinstance(d, int) and d.is_symbol():
                plain.add(d.symbol_name())
    extra = []
    for s in sorted(tr.sym.symbols):
        if s in plain:
            continue
        if s in sym_inputs:
            tr.add_symbol_carrier(s)
            in_plan.append(("carrier", sym_inputs[s]))
        elif s in outer_symbols:
            tr.add_symbol_carrier(s)
            in_plan.append(("carrier", len(placeholders) + len(extra)))
            extra.append(s)
        # else: DVM may still solve it from a dim like s0*4 (else run time falls back)
    graph = tr.gb.build()
    exe = dvm.Executable.compile(graph, num_threads=torch_threads())
    bump("dvm_partitions")
    bump("dvm_nodes", sum(1 for n in sub.graph.nodes if n.op == "call_function"))
    part = DvmPartition(name, exe, in_plan, out_plan, out_dtypes, tuple_out, sub, graph,
                        len(placeholders), out_orders)
    return part, extra


def _symbol_sources(gm, shape_env):
    """{symbol name: (placeholder, dim | None)}: where the outer graph can read each symbol's
    value at run time (a SymInt input, or a dim of a tensor input)."""
    import sympy

    def name_of(expr):
        if shape_env is not None:
            try:
                expr = shape_env.replace(expr)
            except Exception:  # noqa: BLE001
                pass
        return str(expr) if isinstance(expr, sympy.Symbol) else None

    out = {}
    for ph in gm.graph.nodes:
        if ph.op != "placeholder":
            continue
        v = ph.meta.get("val")
        if isinstance(v, torch.SymInt):
            n = name_of(v.node.expr)
            if n:
                out.setdefault(n, (ph, None))
        elif isinstance(v, torch.Tensor):
            for d, size in enumerate(v.shape):
                if isinstance(size, torch.SymInt):
                    n = name_of(size.node.expr)
                    if n and n not in out:
                        out[n] = (ph, d)
    return out


def single_partition_call(fused):
    """The compiled function of a graph that is one DVM partition fed by graph inputs and
    returning its one output: the partition's call with Dynamo's arguments, without the FX
    forward and the partition's own frame in between (about 1.5 us a call). None for any other
    graph. The first call, and any call the C++ path declines, go through the partition."""
    nodes = list(fused.graph.nodes)
    ph = [n for n in nodes if n.op == "placeholder"]
    body = [n for n in nodes if n.op not in ("placeholder", "output")]
    if len(body) != 1 or body[0].op != "call_module" or body[0].kwargs:
        return None
    call = body[0]
    part = getattr(fused, call.target)
    out = nodes[-1].args[0]
    if (not isinstance(part, DvmPartition) or not part._simple or part.tuple_out or
            part.freeze_weights or not isinstance(out, (tuple, list)) or len(out) != 1 or
            out[0] is not call or any(a not in ph for a in call.args)):
        return None
    idx = tuple(ph.index(a) for a in call.args)
    # DVM binds the tensors among the call's arguments (not the SymInts of dynamic shapes):
    # _arg_idx picks them from the call's, tensor_idx from the graph's.
    tensor_idx = tuple(idx[i] for i in part._arg_idx)
    counts, fast = part._counts, part._torch_call
    exe = part.exe

    def run(*args):
        if fast is not None and part.ran:
            try:
                outs = fast(exe, args, tensor_idx)
                counts[0] += 1
                return (outs[0],)
            except (NotImplementedError, dvm.DvmError):
                pass  # the partition's own call handles or reports it
        return (part(*[args[i] for i in idx]),)

    run.partition = part
    return run


_ALLOCATIONS = (torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default,
                torch.ops.aten.empty_like.default)


def _dead_float_read(n) -> bool:
    """Is n an unused `.item()` of a floating-point tensor (no side effect, and a float is
    never a symbol that shapes depend on)?"""
    if n.target is not aten._local_scalar_dense.default or n.users:
        return False
    src = n.args[0] if n.args else None
    v = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
    return isinstance(v, torch.Tensor) and v.dtype.is_floating_point


def partition_and_compile(gm: torch.fx.GraphModule, example_inputs, graph_name="graph",
                          freeze_weights=False):
    """Returns the GraphModule with DVM partitions (each compiled once) and ATen for the rest.
    freeze_weights: parameters are passed as DVM constants (see DvmPartition)."""
    shape_env = _shape_env(gm, example_inputs)
    set_shape_env(shape_env)
    # Unused outputs of multi-output ops (make_fx keeps e.g. attention's logsumexp getitem):
    # dead, and DVM may not compute them, so a partition holding one would fail to build.
    # Likewise unused allocations and views (batch norm's decomposition leaves an empty uint8
    # "reserve" tensor, max_pool1d a squeeze of the unused indices): nothing reads them, and
    # one DVM cannot run would count as a fallback.
    # And the scalar reads of float inputs nothing uses: under dynamic=True Dynamo passes each
    # float attribute a model reads (norm epsilons, dropout rates, attention scales) as a
    # rank-0 tensor and reads it with .item(); the trace keeps the reads whose values it
    # folded, ~1 us of dispatch each on every call (14 per GPT-2 decode step).
    for n in reversed(list(gm.graph.nodes)):
        if n.op == "call_function" and not n.users and (
                n.target is operator.getitem or n.target in _ALLOCATIONS or
                n.target in FREE_OPS or _dead_float_read(n)):
            gm.graph.erase_node(n)
    support = DvmOperatorSupport(_input_aliases_returned(gm))
    # the translator records which outputs of multi-output nodes it does not compute
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is not operator.getitem:
            support.reason(n)
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    partitions = partitioner.propose_partitions()
    kept = []
    for p in partitions:
        if all(n.op == "call_function" and n.target in FREE_OPS for n in p.nodes):
            continue
        kept.append(p)
    in_dvm = {n for p in kept for n in p.nodes}
    n_fallback = n_logged = 0
    for n in gm.graph.nodes:
        if n.op != "call_function" or n in in_dvm:
            continue
        r = support.reason(n)
        if r == "not a tensor op (size arithmetic stays in Python)":
            continue
        if r is None:
            r = "a view/copy with no DVM compute around it (free in PyTorch)"
        elif r != KEPT_VIEW:
            n_fallback += 1
        n_logged += 1
        log_fallback("dvm: %s: %s (%s) runs in PyTorch: %s", graph_name, n.name, n.target, r)
    bump("fallback_nodes", n_fallback)
    if not kept:
        if not n_logged:  # so that every graph DVM does not run says why
            log_fallback("dvm: %s: nothing for DVM: the graph has no tensor op (it returns its "
                         "inputs or constants)", graph_name)
        return gm
    fused = partitioner.fuse_partitions(kept, prefix="dvm_")
    sources = _symbol_sources(fused, shape_env)
    for node in list(fused.graph.nodes):
        if node.op != "call_module" or not str(node.target).startswith("dvm_"):
            continue
        sub = getattr(fused, node.target)
        name = f"{graph_name}_{node.target}"
        try:
            mod, extra = build_partition(sub, name, shape_env, set(sources))
        except (Unsupported, dvm.DvmError, TypeError, ValueError, KeyError) as e:
            bump("partition_fallbacks")
            log_fallback("dvm: partition %s (%d nodes) runs in PyTorch: %s", name,
                         sum(1 for n in sub.graph.nodes if n.op == "call_function"), e)
            continue
        mod.freeze_weights = freeze_weights
        setattr(fused, node.target, mod)
        # The generated forward reads `self.dvm_k` on every call; as a submodule that lookup
        # misses the instance dict and goes through nn.Module.__getattr__ (~0.5 us). An
        # instance-dict entry (the submodule registration stays) is found directly.
        fused.__dict__[node.target] = mod
        if extra:
            args = list(node.args)
            with fused.graph.inserting_before(node):
                for sname in extra:
                    ph, d = sources[sname]
                    args.append(ph if d is None else
                                fused.graph.call_function(aten.sym_size.int, (ph, d)))
            node.args = tuple(args)
    fused.recompile()
    return fused
