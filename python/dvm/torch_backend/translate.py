"""FX (core ATen) -> one DVM graph.

A ``Translator`` owns one ``dvm.GraphBuilder``. Graph inputs become DVM inputs with their
symbolic shapes (fake tensors' SymInt sizes converted by ``SymConverter``); every call_function
node is translated by its entry in the op table (``ops.OPS``), and each translated value is
checked against the node's fake tensor: the dtype is cast to PyTorch's when DVM's type rules
differ, and the shape must be provably the same (else the node is unsupported).

``check_node`` translates one node on its own (a scratch builder, its inputs as graph inputs)
and builds it: the partitioner's OperatorSupport uses it, so what is claimed supported really
translates, and every refusal has a reason.
"""

from __future__ import annotations

import ast

import operator

import torch
from torch.fx.node import Node, map_arg

import dvm
from dvm._arrays import torch_dtype_maps

from .symbolic import SymConverter, Unsupported, same_dim

TORCH_TO_DVM, DVM_TO_TORCH = torch_dtype_maps()  # the one torch <-> DVM dtype map


def dvm_dtype(dtype: torch.dtype):
    try:
        return TORCH_TO_DVM[dtype]
    except KeyError:
        raise Unsupported(f"dtype {dtype} is not supported by DVM") from None


def fake_value(node):
    """The fake value (tensor, SymInt, tuple of them) FX recorded for a node."""
    if not isinstance(node, Node):
        return node
    if "val" in node.meta:
        return node.meta["val"]
    if "example_value" in node.meta:
        return node.meta["example_value"]
    raise Unsupported(f"node {node.name} has no fake value (meta['val'])")


def check_fake_tensor(v, what):
    if not isinstance(v, torch.Tensor):
        raise Unsupported(f"{what} is not a tensor ({type(v).__name__})")
    if v.device.type != "cpu":
        raise Unsupported(f"{what} is on {v.device}; DVM runs CPU tensors")
    if v.layout != torch.strided:
        raise Unsupported(f"{what} has layout {v.layout}")
    dvm_dtype(v.dtype)
    if v.dim() > dvm.MAX_RANK:
        raise Unsupported(f"{what} has rank {v.dim()} > {dvm.MAX_RANK}")


# The most negative lower bound (or positive upper bound) sym_scalar pads by: an iota that long.
_SIZE_AS_DATA_BOUND = 1 << 20


class Translator:
    def __init__(self, name: str, shape_env=None):
        self.gb = dvm.GraphBuilder(name)
        self.sym = SymConverter(self.gb, shape_env)
        self.env: dict[Node, object] = {}
        self.inputs: list[tuple[str, object]] = []  # (kind, payload) in DVM input order
        self.input_shapes: list[list] = []
        # ids of rank-0 f32 inputs that carry a SymFloat (a Python float Dynamo made dynamic:
        # an epsilon, a scale): binary ops take them as scalars (ops._binary)
        self.float_scalars: set[int] = set()
        self.node = None  # the node being translated (for error messages)

    # ---- inputs ---------------------------------------------------------------------------

    def add_tensor_input(self, name, fake):
        check_fake_tensor(fake, f"input {name}")
        shape = self.sym.shape(fake.shape)
        t = self.gb.input(name, dvm_dtype(fake.dtype), shape)
        self.input_shapes.append(shape)
        return t

    def add_symbol_carrier(self, symbol_name):
        """An input of shape [symbol] that binds a symbol no tensor input binds (fed with a
        stride-0 view at run time)."""
        s = self.sym.symbols[symbol_name]
        return self.gb.input(f"sym_{symbol_name}", dvm.DType.BOOL, [s])

    def bind_placeholder(self, node, name=None):
        v = fake_value(node)
        if isinstance(v, torch.Tensor):
            self.env[node] = self.add_tensor_input(name or node.name, v)
        elif isinstance(v, torch.SymInt):
            self.env[node] = self.sym(v)
        elif isinstance(v, (int, float, bool)):
            self.env[node] = v
        elif isinstance(v, torch.SymFloat):
            # Dynamo passes model floats (norm epsilons, rotary scales) as SymFloats under
            # dynamic=True; the partition feeds each as a rank-0 f32 tensor (runtime.py)
            t = self.gb.input(name or node.name, dvm.DType.F32, [])
            self.input_shapes.append([])
            self.float_scalars.add(t.id)
            self.env[node] = t
        else:
            raise Unsupported(f"input {node.name} of type {type(v).__name__}")

    # ---- helpers for op translators --------------------------------------------------------

    def shape(self, t):
        return list(self.gb.shape(t))

    def rank(self, t):
        return self.gb.rank(t)

    def dtype(self, t):
        return self.gb.dtype(t)

    def cast(self, t, dtype):
        """Casts a DVM tensor to a torch or DVM dtype (no-op when equal)."""
        d = dtype if isinstance(dtype, dvm.DType) else dvm_dtype(dtype)
        return t if self.gb.dtype(t) == d else self.gb.cast(t, d)

    def out_fake(self, index=None):
        v = fake_value(self.node)
        return v if index is None else v[index]

    def out_dtype(self, index=None):
        return self.out_fake(index).dtype

    def out_shape(self, index=None):
        return self.sym.shape(self.out_fake(index).shape)

    def constant(self, value, dtype):
        d = dtype if isinstance(dtype, dvm.DType) else dvm_dtype(dtype)
        return self.gb.constant(float(value), d)

    def fill(self, value, shape, dtype):
        """A tensor of `shape` filled with `value` (torch.full): a broadcast constant, inlined
        into the kernels that read it (the fuser fills it in memory where a kernel cannot)."""
        d = dtype if isinstance(dtype, dvm.DType) else dvm_dtype(dtype)
        if isinstance(value, (int, float, bool)):
            v = self.gb.constant(float(bool(value)) if d == dvm.DType.BOOL else float(value), d)
        else:  # a tensor (rank 0) value
            v = self.cast(value, d)
        return self.gb.expand(v, list(shape)) if shape else v

    def sym_scalar(self, value, dtype):
        """A rank-0 tensor holding an int | SymExpr value (a size used as data)."""
        if isinstance(value, (int, float, bool)):
            return self.constant(value, dtype)
        if isinstance(value, dvm.Tensor):  # a SymFloat argument (a rank-0 input)
            return self.cast(value, dtype)
        # A value is read from a shape: max(iota([value - lo + 1])) + lo == value for a value
        # known to be >= lo (the extent is >= 1). A value known only from above (a negative
        # index -s - 1) is the negation of one known from below.
        lo, hi = value.range()
        if lo > -_SIZE_AS_DATA_BOUND:
            i = self.gb.iota([value - lo + 1], 0, dvm.DType.I64)
            v = self.gb.binary(dvm.BinaryOp.ADD, self.gb.reduce(dvm.ReduceOp.MAX, i, [0]), lo)
            return self.cast(v, dtype)
        if hi < _SIZE_AS_DATA_BOUND:
            return self.cast(self.gb.unary(dvm.UnaryOp.NEG, self.sym_scalar(-value, dvm.DType.I64)),
                             dtype)
        # A bound on each symbol but none on the whole (4*(s//8)**2 - 4*(s//8) + 1, a
        # relative-position count): the expression evaluated as data, each symbol read as above.
        return self.cast(self._evaluate_as_data(value), dtype)

    def _evaluate_as_data(self, value):
        """An integer SymExpr computed by i64 ops from its symbols' values (its printed form is
        Python arithmetic: + - * // % and min / max)."""
        b = dvm.BinaryOp
        ops = {ast.Add: b.ADD, ast.Sub: b.SUB, ast.Mult: b.MUL, ast.FloorDiv: b.FLOOR_DIV,
               ast.Mod: b.REMAINDER}
        i64 = dvm.DType.I64

        def walk(n):
            if isinstance(n, ast.Constant) and isinstance(n.value, int):
                return self.constant(n.value, i64)
            if isinstance(n, ast.Name) and n.id in self.sym.symbols:
                return self.sym_scalar(self.sym.symbols[n.id], i64)
            if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
                return self.gb.unary(dvm.UnaryOp.NEG, walk(n.operand))
            if isinstance(n, ast.BinOp) and type(n.op) in ops:
                return self.gb.binary(ops[type(n.op)], walk(n.left), walk(n.right))
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.args
                    and n.func.id in ("min", "max") and not n.keywords):
                op = b.MINIMUM if n.func.id == "min" else b.MAXIMUM
                out = walk(n.args[0])
                for a in n.args[1:]:
                    out = self.gb.binary(op, out, walk(a))
                return out
            raise Unsupported(f"the value {value} used as data: {ast.dump(n)[:60]} unreadable")

        try:
            tree = ast.parse(str(value), mode="eval").body
        except SyntaxError as e:
            raise Unsupported(f"the value {value} used as data: unreadable") from e
        return walk(tree)

    def axis(self, a, rank):
        a = int(a)
        if a < 0:
            a += rank
        if not 0 <= a < max(rank, 1):
            raise Unsupported(f"axis {a} out of range for rank {rank}")
        return a

    def is_tensor(self, v):
        return isinstance(v, dvm.Tensor)

    # ---- the main loop ---------------------------------------------------------------------

    def run_node(self, node):
        from .ops import OPS

        self.node = node
        if node.op == "get_attr":
            raise Unsupported("get_attr nodes are bound as inputs")
        if node.op != "call_function":
            raise Unsupported(f"{node.op} nodes are not translated")
        if node.target is operator.getitem:
            src, idx = node.args
            val = self.env[src]
            if not isinstance(val, (tuple, list)):
                raise Unsupported(f"getitem on a non-tuple value of {src.name}")
            out = val[idx]
            if out is None:
                raise Unsupported(f"output {idx} of {src.name} is not computed by DVM")
            self.env[node] = out
            return out
        entry = OPS.get(node.target)
        if entry is None:
            raise Unsupported(f"no DVM translation for {node.target}")
        args = map_arg(node.args, lambda n: self.env[n])
        kwargs = map_arg(node.kwargs, lambda n: self.env[n])
        out = entry.fn(self, *args, **kwargs)
        out = self._conform(node, out)
        self.env[node] = out
        return out

    def _conform(self, node, out):
        """Casts results to PyTorch's dtypes and checks their shapes against the fake ones."""
        fake = fake_value(node)
        if isinstance(out, (tuple, list)):
            if not isinstance(fake, (tuple, list)) or len(fake) != len(out):
                raise Unsupported(f"{node.target}: output arity differs from PyTorch's")
            return tuple(
                None if o is None else self._conform_one(node, o, f) for o, f in zip(out, fake)
            )
        return self._conform_one(node, out, fake)

    def _conform_one(self, node, out, fake):
        if not isinstance(out, dvm.Tensor):
            raise Unsupported(f"{node.target}: translation returned {type(out).__name__}")
        check_fake_tensor(fake, f"output of {node.name}")
        out = self.cast(out, fake.dtype)
        got = self.shape(out)
        want = self.sym.shape(fake.shape)
        if len(got) != len(want) or not all(same_dim(a, b) for a, b in zip(got, want)):
            raise Unsupported(
                f"{node.target}: DVM shape {[str(g) for g in got]} is not provably PyTorch's "
                f"{[str(w) for w in want]}"
            )
        return out


def _input_nodes(node):
    seen = []
    for n in node.all_input_nodes:
        if n not in seen:
            seen.append(n)
    return seen


def check_node(node) -> str | None:
    """None if DVM translates this node on its own, else the reason it does not."""
    if node.op != "call_function":
        return f"{node.op} node"
    from .ops import OPS

    entry = OPS.get(node.target)
    if entry is not None and entry.inplace:
        dst = node.args[0]
        if not isinstance(dst, Node) or dst.op == "placeholder" or len(dst.users) != 1:
            return "in-place op on a value that is read elsewhere (or a graph input)"
    try:
        t = Translator(f"check_{node.name}", _shape_env_of(node))
        for i, inp in enumerate(_input_nodes(node)):
            if node.target is operator.getitem:
                # the producer's value: a tuple of inputs
                v = fake_value(inp)
                if not isinstance(v, (tuple, list)):
                    return "getitem on a non-tuple"
                t.env[inp] = tuple(
                    t.add_tensor_input(f"in{i}_{k}", f) if isinstance(f, torch.Tensor) else None
                    for k, f in enumerate(v)
                )
            else:
                t.bind_placeholder(inp, f"in{i}")
        out = t.run_node(node)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if isinstance(out, (tuple, list)):
            # outputs DVM does not compute (e.g. attention's logsumexp): a getitem of one of
            # them must stay out of DVM, and so must this node if such a getitem is used
            node.meta["dvm_none_outputs"] = frozenset(
                k for k, o in enumerate(outs) if o is None)
        n = 0
        for k, o in enumerate(outs):
            if o is not None:
                t.gb.output(f"out{k}", o)
                n += 1
        if n == 0:
            return "no outputs"
        t.gb.build()
        return None
    except Unsupported as e:
        return str(e)
    except dvm.DvmError as e:
        return f"DVM rejects it: {getattr(e, 'message', e)}"
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, NotImplementedError) as e:
        return f"{type(e).__name__}: {e}"


_SHAPE_ENV = {"env": None}


def _shape_env_of(node):
    return _SHAPE_ENV["env"]


def set_shape_env(env):
    _SHAPE_ENV["env"] = env
