"""The op table: core-ATen overloads -> DVM graph ops, one translator per op family.

Which ATen ops are translated and what DVM op each maps to come from the table shared with lazy
mode (``dvm.aten_ops``): translators are registered by its keys, its elementwise meta-ops get
one translator per kind of DVM op (DVM's own kinds), and its entries name the op family.

Each translator is ``fn(tr, *args, **kwargs)``: ``tr`` is the ``Translator`` (its ``gb`` is the
``dvm.GraphBuilder``; ``tr.node`` the FX node, whose fake value gives PyTorch's output dtype and
symbolic shape), args are the node's arguments with FX nodes replaced by their DVM values
(``dvm.Tensor``, ``int | dvm.SymExpr`` for SymInts, tuples for multi-output nodes). A
translator returns a ``dvm.Tensor`` or a tuple of them (None for outputs it does not compute)
and raises ``Unsupported`` with a reason for cases it does not handle; the Translator casts
results to PyTorch's dtype and checks their shapes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

import dvm
from dvm import aten_ops as T

from .symbolic import Unsupported, same_dim
from .translate import DVM_TO_TORCH, Translator, dvm_dtype, fake_value

aten = torch.ops.aten

U = dvm.UnaryOp
B = dvm.BinaryOp
R = dvm.ReduceOp

INT64_BIG = 1 << 62


@dataclass
class OpEntry:
    fn: Callable
    family: str
    inplace: bool = False  # mutates args[0]: translated only when nothing else reads it


OPS: dict[object, OpEntry] = {}


def register(*keys):
    """Registers a translator for aten_ops table keys (those this torch has)."""

    def deco(fn):
        for k in keys:
            o = T.resolve(k)
            if o is not None:
                e = T.TABLE[k]
                OPS[o] = OpEntry(fn, e.family, inplace=e.variant == "inplace")
        return fn

    return deco


def _dvm_op(tr: Translator):
    """The DVM op(s) the table maps the node's ATen op to."""
    return T.entry(tr.node.target).dvm


def _is_float(tdtype):
    return tdtype.is_floating_point


def _compute_dtype(tr: Translator, args):
    """PyTorch's common dtype of two operands (tensors or scalars; type promotion)."""
    vals = []
    for a in args:
        if isinstance(a, dvm.Tensor):
            d = DVM_TO_TORCH[tr.dtype(a)]
            # rank-0 tensors take part in promotion like scalars (torch's rule)
            vals.append(torch.empty((1,) if tr.rank(a) else (), dtype=d))
        elif isinstance(a, (bool, int, float)):
            vals.append(a)
        else:
            vals.append(1)  # a SymInt: an integer
    if len(vals) != 2 or not any(isinstance(v, torch.Tensor) for v in vals):
        raise Unsupported("comparison without a tensor operand")
    return torch.result_type(vals[0], vals[1])


def _operand(tr: Translator, a, dtype):
    """A binary operand cast to `dtype`; scalars stay Python numbers, SymExprs become tensors."""
    if isinstance(a, dvm.Tensor):
        return tr.cast(a, dtype)
    if isinstance(a, bool):
        return float(a)
    if isinstance(a, (int, float)):
        return a
    return tr.sym_scalar(a, dtype)


def _const(v, what):
    """A float argument DVM bakes into the op; a SymFloat (a dynamic float: a rank-0 input
    here) is refused with a reason instead of failing inside float()."""
    if isinstance(v, dvm.Tensor):
        raise Unsupported(f"{what} is a dynamic float (SymFloat) argument")
    return float(v)


def _binary(tr: Translator, op, a, b, compute_dtype):
    if any(isinstance(x, dvm.Tensor) and x.id in tr.float_scalars for x in (a, b)):
        # A SymFloat operand is a Python scalar to torch: it never changes the result dtype,
        # and torch computes with it in f32 (opmath) also for f16/bf16 tensors.
        d = compute_dtype if isinstance(compute_dtype, dvm.DType) else dvm_dtype(compute_dtype)
        if d not in (dvm.DType.F32, dvm.DType.F16, dvm.DType.BF16):
            raise Unsupported(f"a SymFloat operand with {d} compute")
        f32 = dvm.DType.F32
        r = tr.gb.binary(op, _operand(tr, a, f32), _operand(tr, b, f32))
        return tr.cast(r, d)
    a = _operand(tr, a, compute_dtype)
    b = _operand(tr, b, compute_dtype)
    if not isinstance(a, dvm.Tensor) and not isinstance(b, dvm.Tensor):
        raise Unsupported("binary op of two scalars")
    if not isinstance(a, dvm.Tensor) and math.isinf(float(a)) or (
        not isinstance(b, dvm.Tensor) and math.isinf(float(b))
    ):
        # infinite scalars: make them rank-0 constants (exact in every float dtype)
        a = a if isinstance(a, dvm.Tensor) else tr.constant(a, compute_dtype)
        b = b if isinstance(b, dvm.Tensor) else tr.constant(b, compute_dtype)
    return tr.gb.binary(op, a, b)


# ---- pointwise binary -------------------------------------------------------------------------

def _arith(op):
    true_div = T.binary_kind(op) == T.DIV

    def fn(tr: Translator, a, b, alpha=1, **_):
        out = tr.out_dtype()
        if alpha != 1:
            if op not in (B.ADD, B.SUB):
                raise Unsupported("alpha")
            b = _binary(tr, B.MUL, b, alpha, out)
        if true_div and not _is_float(out):
            raise Unsupported("integer true division")
        return _binary(tr, op, a, b, out)

    return fn


@register("pow.Scalar")
def _pow_scalar(tr: Translator, a, b):
    out = tr.out_dtype()
    return _binary(tr, B.POW, tr.constant(a, out), b, out)


@register("rsub.Tensor", "rsub.Scalar")
def _rsub(tr: Translator, a, b, alpha=1):
    out = tr.out_dtype()
    if alpha != 1:
        a = _binary(tr, B.MUL, a, alpha, out)
    return _binary(tr, B.SUB, b, a, out)


@register("div.Tensor_mode", "div.Scalar_mode")
def _div_mode(tr: Translator, a, b, rounding_mode=None):
    out = tr.out_dtype()
    if rounding_mode is None:
        return _arith(B.DIV)(tr, a, b)
    if rounding_mode == "floor":
        return _binary(tr, B.FLOOR_DIV, a, b, out)
    if rounding_mode == "trunc" and _is_float(out):
        return tr.gb.unary(U.TRUNC, _binary(tr, B.DIV, a, b, out))
    if rounding_mode == "trunc":
        return _int_trunc_div(tr, a, b, out)
    raise Unsupported(f"div rounding_mode={rounding_mode} on {out}")


def _int_trunc_div(tr: Translator, a, b, out):
    """Integer division rounded toward zero (Longformer's chunk counts): the floor quotient,
    plus one where it was rounded down from a negative non-integer quotient (a nonzero
    remainder, operands of opposite signs)."""
    q = _binary(tr, B.FLOOR_DIV, a, b, out)
    r = _binary(tr, B.SUB, a, tr.gb.binary(B.MUL, q, _operand(tr, b, out)), out)

    def negative(v):  # a bool tensor, or a Python bool for a number
        v = _operand(tr, v, out)
        return tr.gb.binary(B.LT, v, 0) if isinstance(v, dvm.Tensor) else v < 0

    na, nb = negative(a), negative(b)  # not both numbers: _binary refused that above
    if not isinstance(nb, dvm.Tensor):
        opposite = tr.gb.unary(U.LOGICAL_NOT, na) if nb else na
    elif not isinstance(na, dvm.Tensor):
        opposite = tr.gb.unary(U.LOGICAL_NOT, nb) if na else nb
    else:
        opposite = tr.gb.binary(B.NE, na, nb)
    up = tr.gb.binary(B.LOGICAL_AND, tr.gb.binary(B.NE, r, 0), opposite)
    return tr.gb.select(up, tr.gb.binary(B.ADD, q, 1), q)


def _cmp(op):
    def fn(tr: Translator, a, b):
        return _binary(tr, op, a, b, _compute_dtype(tr, [a, b]))

    return fn


def _to_bool(tr: Translator, a):
    if isinstance(a, dvm.Tensor):
        return tr.cast(a, dvm.DType.BOOL)
    raise Unsupported("logical op on a scalar")


def _logical(op, bool_only):
    """A logical op: operands taken as bool (xor is NE of bools). torch's bitwise ops are
    logical on bools only (out dtype bool)."""

    def fn(tr: Translator, *args):
        if bool_only and tr.out_dtype() != torch.bool:
            raise Unsupported(f"{tr.node.target} of integers (bitwise)")
        xs = [_to_bool(tr, a) for a in args]
        return tr.gb.unary(op, *xs) if isinstance(op, U) else tr.gb.binary(op, *xs)

    return fn


# ---- pointwise unary --------------------------------------------------------------------------

def _unary(op):
    def fn(tr: Translator, x):
        out = tr.out_dtype()
        if _is_float(out):
            x = tr.cast(x, out)
        return tr.gb.unary(op, x)

    return fn


def _direct(e):
    """The translator of an elementwise meta-op of the table, by the family and DVM kind."""
    if e.family == "logical":
        return _logical(e.dvm, e.bool_only)
    if isinstance(e.dvm, U):
        return _unary(e.dvm)
    if e.family == "comparison":
        return _cmp(e.dvm)
    return _arith(e.dvm)


# in-place forms too (decompositions emit some, e.g. rms_norm's add_): functional when the
# mutated value has no other reader (checked by translate.check_node)
for _key, _e in T.entries(direct=True, variant=None):
    register(_key)(_direct(_e))


@register("gelu.default")
def _gelu(tr: Translator, x, approximate="none"):
    return tr.gb.gelu(tr.cast(x, tr.out_dtype()), tanh_approximation=(approximate == "tanh"))


@register("isinf.default")
def _isinf(tr: Translator, x):
    fin = tr.gb.unary(U.IS_FINITE, x)
    nan = tr.gb.unary(U.IS_NAN, x)
    return tr.gb.unary(U.LOGICAL_NOT, tr.gb.binary(B.LOGICAL_OR, fin, nan))


@register("erfc.default")
def _erfc(tr: Translator, x):
    return tr.gb.binary(B.SUB, 1.0, tr.gb.unary(U.ERF, tr.cast(x, tr.out_dtype())))


@register("tan.default")
def _tan(tr: Translator, x):
    x = tr.cast(x, tr.out_dtype())
    return tr.gb.binary(B.DIV, tr.gb.unary(U.SIN, x), tr.gb.unary(U.COS, x))


@register("log2.default", "log10.default")
def _log_base(tr: Translator, x):
    base = 2.0 if tr.node.target is aten.log2.default else 10.0
    x = tr.cast(x, tr.out_dtype())
    return tr.gb.binary(B.MUL, tr.gb.unary(U.LOG, x), 1.0 / math.log(base))


@register("exp2.default")
def _exp2(tr: Translator, x):
    x = tr.cast(x, tr.out_dtype())
    return tr.gb.unary(U.EXP, tr.gb.binary(B.MUL, x, math.log(2.0)))


@register("square.default")
def _square(tr: Translator, x):
    x = tr.cast(x, tr.out_dtype())
    return tr.gb.binary(B.MUL, x, x)


def _bounded(tr: Translator, x, lo, hi):
    """clamp(x, lo, hi) in the output dtype; a bound may be a SymFloat / SymInt argument
    (Dynamo makes model floats dynamic: MobileNet's ReLU6 bounds), then a maximum / minimum
    with it as a rank-0 operand (NaN propagates, as PyTorch's clamp)."""
    out = tr.out_dtype()
    x = tr.cast(x, out)
    if all(v is None or isinstance(v, (int, float)) for v in (lo, hi)):
        return tr.gb.clamp(x, lo=None if lo is None else float(lo),
                           hi=None if hi is None else float(hi))
    if lo is not None:
        x = tr.gb.binary(B.MAXIMUM, x, _operand(tr, lo, out))
    if hi is not None:
        x = tr.gb.binary(B.MINIMUM, x, _operand(tr, hi, out))
    return x


@register("hardtanh.default")
def _hardtanh(tr: Translator, x, lo=-1.0, hi=1.0):
    return _bounded(tr, x, lo, hi)


@register("leaky_relu.default")
def _leaky_relu(tr: Translator, x, slope=0.01):
    out = tr.out_dtype()
    x = tr.cast(x, out)
    return tr.gb.select(tr.gb.binary(B.GT, x, 0.0), x, _binary(tr, B.MUL, x, slope, out))


@register("clamp.default", "clamp_min.default", "clamp_max.default", "clamp.Tensor")
def _clamp(tr: Translator, x, lo=None, hi=None):
    t = tr.node.target
    if t is getattr(aten.clamp_max, "default", None):
        lo, hi = None, lo
    return _bounded(tr, x, lo, hi)


@register("fmax.default", "fmin.default")
def _fmax(tr: Translator, a, b):
    """NaN-ignoring maximum / minimum: DVM's propagate NaN, so where one operand is NaN the
    result is the other."""
    op, isnan = _dvm_op(tr)
    out = tr.out_dtype()
    a, b = tr.cast(a, out), tr.cast(b, out)
    m = tr.gb.binary(op, a, b)
    if not _is_float(out):
        return m
    return tr.gb.select(tr.gb.unary(isnan, b), a, tr.gb.select(tr.gb.unary(isnan, a), b, m))


@register("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def _where(tr: Translator, cond, a, b):
    out = tr.out_dtype()

    def val(v):
        return tr.cast(v, out) if isinstance(v, dvm.Tensor) else tr.constant(v, out)

    return tr.gb.select(tr.cast(cond, dvm.DType.BOOL), val(a), val(b))


@register("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(tr: Translator, x, mask, value):
    out = tr.out_dtype()
    v = tr.cast(value, out) if isinstance(value, dvm.Tensor) else tr.constant(value, out)
    return tr.gb.select(tr.cast(mask, dvm.DType.BOOL), v, tr.cast(x, out))


@register("addcmul.default", "addcdiv.default")
def _addc(tr: Translator, x, a, b, value=1):
    out = tr.out_dtype()
    op = _dvm_op(tr)[0]
    t = tr.gb.binary(op, tr.cast(a, out), tr.cast(b, out))
    if value != 1:
        t = tr.gb.binary(B.MUL, t, float(value))
    return tr.gb.binary(B.ADD, tr.cast(x, out), t)


@register("lerp.Scalar", "lerp.Tensor")
def _lerp(tr: Translator, x, end, weight):
    out = tr.out_dtype()
    x, end = tr.cast(x, out), tr.cast(end, out)
    w = _operand(tr, weight, out)
    return tr.gb.binary(B.ADD, x, tr.gb.binary(B.MUL, tr.gb.binary(B.SUB, end, x), w))


# ---- casts, copies, aliases -------------------------------------------------------------------


@register("_to_copy.default")
def _to_copy(tr: Translator, x, dtype=None, layout=None, device=None, pin_memory=None,
             non_blocking=False, memory_format=None):
    if device is not None and torch.device(device).type != "cpu":
        raise Unsupported(f"_to_copy to {device}")
    return tr.cast(x, tr.out_dtype())


@register("prims::convert_element_type.default")
def _convert(tr: Translator, x, dtype):
    return tr.cast(x, dtype)


@register("clone.default", "alias.default", "lift_fresh_copy.default", "detach.default")
def _identity(tr: Translator, x, *_, **__):
    return x


@register("copy.default")
def _copy(tr: Translator, dst, src, non_blocking=False):
    return tr.gb.expand(tr.cast(src, tr.out_dtype()), tr.shape(dst))


# ---- views ------------------------------------------------------------------------------------


@register("view.default", "_unsafe_view.default", "reshape.default", "view_copy.default",
          "_reshape_alias.default")
def _view(tr: Translator, x, *_, **__):
    return tr.gb.reshape(x, tr.out_shape())


@register("permute.default", "permute_copy.default")
def _permute(tr: Translator, x, perm):
    r = tr.rank(x)
    return tr.gb.permute(x, [tr.axis(p, r) for p in perm])


@register("transpose.int")
def _transpose(tr: Translator, x, a0, a1):
    r = tr.rank(x)
    if r < 2:
        return x
    return tr.gb.transpose(x, tr.axis(a0, r), tr.axis(a1, r))


@register("t.default", "numpy_T.default")
def _t(tr: Translator, x):
    if tr.rank(x) < 2:
        return x
    return tr.gb.transpose(x, 0, 1)


@register("expand.default", "expand_copy.default")
def _expand(tr: Translator, x, *_, **__):
    return tr.gb.expand(x, tr.out_shape())


@register("repeat.default")
def _repeat(tr: Translator, x, repeats):
    """x.repeat(r0, r1, ...): each dim s becomes a [r, s] pair (a size-1 dim before it,
    expanded to r), then each pair merges into r * s (BLOOM's alibi tensor)."""
    # sizes reach translators as ints or DVM SymExprs already
    reps = [r if isinstance(r, (int, dvm.SymExpr)) else tr.sym(r) for r in repeats]
    shape = tr.shape(x)
    if len(reps) < len(shape):
        raise Unsupported("repeat with fewer repeats than dims")
    shape = [1] * (len(reps) - len(shape)) + shape
    pairs = [d for s in shape for d in (1, s)]
    tiled = [d for r, s in zip(reps, shape) for d in (r, s)]
    y = tr.gb.expand(tr.gb.reshape(x, pairs), tiled)
    return tr.gb.reshape(y, tr.out_shape())


@register("unsqueeze.default", "unsqueeze_copy.default")
def _unsqueeze(tr: Translator, x, axis):
    return tr.gb.unsqueeze(x, tr.axis(axis, tr.rank(x) + 1))


@register("squeeze.dim", "squeeze.dims", "squeeze.default", "squeeze_copy.dim",
          "squeeze_copy.dims", "squeeze_copy.default")
def _squeeze(tr: Translator, x, dims=None):
    r = tr.rank(x)
    shape = tr.shape(x)
    if dims is None:
        dims = list(range(r))
    elif isinstance(dims, int):
        dims = [dims]
    axes = sorted({tr.axis(d, r) for d in dims} if r else set(), reverse=True)
    for a in axes:
        if same_dim(shape[a], 1):
            x = tr.gb.squeeze(x, a)
        elif not isinstance(shape[a], int) and not shape[a].is_constant():
            # a symbolic dim: PyTorch squeezes only if it is 1 at run time; Dynamo guards
            # backed dims >= 2, so the fake output says what happened
            pass
    return x


def _slice_bound(v):
    if v is None:
        return None
    if isinstance(v, int) and v >= dvm.SLICE_END:
        return dvm.SLICE_END
    if isinstance(v, int) and v <= -INT64_BIG:
        return 0
    return v


def _from_end(v, size):
    """A symbolic bound known to be negative counts from the end, as in Python (x[:, -(w+1):]):
    size + v. Integer bounds DVM's slice wraps itself."""
    if isinstance(v, dvm.SymExpr) and not v.is_constant() and v.range()[1] < 0:
        return v + size
    return v


@register("slice.Tensor", "slice_copy.Tensor")
def _slice(tr: Translator, x, dim=0, start=None, end=None, step=1):
    r = tr.rank(x)
    a = tr.axis(dim, r)
    start = _from_end(_slice_bound(start), tr.shape(x)[a])
    end = _from_end(_slice_bound(end), tr.shape(x)[a])
    if start is None:
        start = 0
    if end is None:
        end = dvm.SLICE_END
    if not isinstance(step, int) or step < 1:
        raise Unsupported(f"slice step {step}")
    if isinstance(start, int) and start == 0 and isinstance(end, int) and end >= dvm.SLICE_END \
            and step == 1:
        return x
    return tr.gb.slice(x, a, start, end, step)


@register("select.int", "select_copy.int")
def _select(tr: Translator, x, dim, index):
    r = tr.rank(x)
    a = tr.axis(dim, r)
    if isinstance(index, int) and index < 0:
        stop = dvm.SLICE_END if index == -1 else index + 1
    else:
        stop = index + 1
    return tr.gb.squeeze(tr.gb.slice(x, a, index, stop, 1), a)


@register("narrow.default")
def _narrow(tr: Translator, x, dim, start, length):
    a = tr.axis(dim, tr.rank(x))
    if isinstance(start, int) and start < 0:
        raise Unsupported("narrow with a negative start")
    return tr.gb.slice(x, a, start, start + length, 1)


@register("cat.default", "concat.default")
def _cat(tr: Translator, xs, dim=0):
    out = tr.out_dtype()
    rank = len(tr.out_shape())
    parts = []
    for x in xs:
        s = tr.shape(x)
        if len(s) == 1 and same_dim(s[0], 0) and rank != 1:
            continue  # legacy empty tensors are skipped by torch.cat
        parts.append(tr.cast(x, out))
    if len(parts) == 1:
        return parts[0]
    return tr.gb.concat(parts, tr.axis(dim, rank))


@register("split_with_sizes.default", "split_with_sizes_copy.default")
def _split_with_sizes(tr: Translator, x, sizes, dim=0):
    return tuple(tr.gb.split(x, list(sizes), tr.axis(dim, tr.rank(x))))


@register("split.Tensor", "split_copy.Tensor", "unbind.int", "chunk.default")
def _split(tr: Translator, x, *_, dim=None, **__):
    a = tr.node.args
    d = dim if dim is not None else (a[2] if len(a) > 2 else 0)
    if tr.node.target is aten.unbind.int:
        d = a[1] if len(a) > 1 else (dim or 0)
    axis = tr.axis(d, tr.rank(x))
    fakes = tr.out_fake()
    sizes = [tr.sym(f.shape[axis]) if tr.node.target is not aten.unbind.int else 1 for f in fakes]
    parts = tr.gb.split(x, sizes, axis)
    if tr.node.target is aten.unbind.int:
        parts = [tr.gb.squeeze(p, axis) for p in parts]
    return tuple(parts)


def _scatter_along(tr: Translator, base, src, dim, start, end):
    """base with base[start:end] along dim replaced by src (end - start elements): the parts
    of base before and after, concatenated around src. Where DVM cannot prove that the parts
    add up to base's extent (a symbolic dim whose bounds PyTorch's guards know), src is
    gathered to base's extent instead (index clamp(i - start)) and selected inside the range."""
    out = tr.out_dtype()
    base = tr.cast(base, out)
    src = tr.cast(src, out)
    parts = []
    if not (isinstance(start, int) and start == 0):
        parts.append(tr.gb.slice(base, dim, 0, start, 1))
    parts.append(src)
    if not (isinstance(end, int) and end >= dvm.SLICE_END):
        parts.append(tr.gb.slice(base, dim, end, dvm.SLICE_END, 1))
    x = parts[0] if len(parts) == 1 else tr.gb.concat(parts, dim)
    want = tr.shape(base)
    got = tr.shape(x)
    if len(got) == len(want) and all(same_dim(a, b) for a, b in zip(got, want)):
        return x
    b = dvm.BinaryOp
    i64 = dvm.DType.I64
    pos = tr.gb.iota([want[dim]], 0, i64)
    first = tr.sym_scalar(start, i64)
    last = tr.gb.binary(b.SUB, tr.sym_scalar(tr.shape(src)[dim], i64), 1)
    rel = tr.gb.binary(b.SUB, pos, first)
    idx = tr.gb.binary(b.MINIMUM, tr.gb.binary(b.MAXIMUM, rel, 0), last)
    inside = tr.gb.binary(b.LOGICAL_AND, tr.gb.binary(b.GE, rel, 0),
                          tr.gb.binary(b.LE, rel, last))
    placed = tr.gb.index_select(src, dim, idx)
    mask = tr.gb.reshape(inside, [want[dim]] + [1] * (len(want) - 1 - dim))
    return tr.gb.select(mask, placed, base)


@register("slice_scatter.default")
def _slice_scatter(tr: Translator, base, src, dim=0, start=None, end=None, step=1):
    """torch.slice_scatter (functionalized x[a:b] = src) with step 1; bounds as slice's
    (negative from the end, clamped)."""
    if step != 1:
        raise Unsupported(f"slice_scatter with step {step}")
    a = tr.axis(dim, tr.rank(base))
    start = _from_end(_slice_bound(start), tr.shape(base)[a])
    end = _from_end(_slice_bound(end), tr.shape(base)[a])
    start = 0 if start is None else start
    end = dvm.SLICE_END if end is None else end
    if isinstance(start, int) and start < 0 or isinstance(end, int) and end < 0:
        raise Unsupported("slice_scatter with negative bounds")
    for v in (start, end):
        # A bound DVM cannot place (s - w - 1: no relation between two symbols) makes a slice
        # whose clamped extent the graph passes re-infer in another form (an internal error
        # that sends the whole partition to PyTorch): this node alone runs there instead.
        if isinstance(v, dvm.SymExpr) and not v.is_constant() and v.range()[0] < 0:
            raise Unsupported(f"slice_scatter bound {v} of unknown sign")
    return _scatter_along(tr, base, src, a, start, end)


@register("select_scatter.default")
def _select_scatter(tr: Translator, base, src, dim, index):
    """torch.select_scatter (functionalized x[..., i] = src)."""
    a = tr.axis(dim, tr.rank(base))
    if not isinstance(index, int):
        raise Unsupported("select_scatter at a symbolic index")
    if index < 0:
        size = tr.shape(base)[a]
        if not size.is_constant():
            raise Unsupported("select_scatter at a negative index of a symbolic dim")
        index += int(size)
    return _scatter_along(tr, base, tr.gb.unsqueeze(src, a), a, index, index + 1)


@register("flip.default")
def _flip(tr: Translator, x, dims):
    """Each flipped axis gathered at n - 1 - i (DVM's slices have positive steps)."""
    i64 = dvm.DType.I64
    r = tr.rank(x)
    for d in sorted({tr.axis(d, r) for d in dims}):
        n = tr.shape(x)[d]
        if same_dim(n, 1):
            continue
        last = tr.gb.binary(B.SUB, tr.sym_scalar(n, i64), 1)
        x = tr.gb.index_select(x, d, tr.gb.binary(B.SUB, last, tr.gb.iota([n], 0, i64)))
    return x


# ---- constants and generators -----------------------------------------------------------------


@register("full.default", "new_full.default")
def _full(tr: Translator, *args, **kwargs):
    value = args[1] if tr.node.target is aten.full.default else args[2]
    out = tr.out_dtype()
    if not isinstance(value, (int, float, bool)):
        value = tr.sym_scalar(value, out)
    return tr.fill(value, tr.out_shape(), out)


@register("full_like.default")
def _full_like(tr: Translator, x, value, **_):
    out = tr.out_dtype()
    if not isinstance(value, (int, float, bool)):
        value = tr.sym_scalar(value, out)
    return tr.fill(value, tr.out_shape(), out)


def _filled(value):
    def fn(tr: Translator, *_, **__):
        return tr.fill(value, tr.out_shape(), tr.out_dtype())

    return fn


register("zeros.default", "zeros_like.default", "new_zeros.default", "empty.memory_format",
         "empty_like.default", "new_empty.default", "empty_strided.default",
         "new_empty_strided.default")(_filled(0))
register("ones.default", "ones_like.default", "new_ones.default")(_filled(1))


@register("scalar_tensor.default")
def _scalar_tensor(tr: Translator, value, **_):
    out = tr.out_dtype()
    if isinstance(value, (int, float, bool)):
        return tr.constant(value, out)
    return tr.sym_scalar(value, out)


@register("arange.start_step", "arange.default", "arange.start")
def _arange(tr: Translator, *args, **kwargs):
    t = tr.node.target
    if t is aten.arange.default:
        start, step = 0, 1
    elif t is aten.arange.start:
        start, step = args[0], 1
    else:
        start = args[0]
        step = args[2] if len(args) > 2 else kwargs.get("step", 1)
    out = tr.out_dtype()
    shape = tr.out_shape()
    for v in (start, step):
        if not isinstance(v, (int, float)):
            raise Unsupported("symbolic arange start/step")
    x = tr.gb.iota(shape, 0, dvm.DType.I64)
    x = tr.cast(x, out)
    if step != 1:
        x = tr.gb.binary(B.MUL, x, step)
    if start != 0:
        x = tr.gb.binary(B.ADD, x, start)
    return x


@register("prims::iota.default")
def _iota(tr: Translator, length, *, start, step, dtype, **_):
    x = tr.cast(tr.gb.iota(tr.out_shape(), 0, dvm.DType.I64), tr.out_dtype())
    if step != 1:
        x = tr.gb.binary(B.MUL, x, step)
    if start != 0:
        x = tr.gb.binary(B.ADD, x, start)
    return x


# ---- reductions -------------------------------------------------------------------------------


def _axes(tr: Translator, x, dims):
    r = tr.rank(x)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(r))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({tr.axis(d, r) for d in dims})


@register("sum.dim_IntList", "sum.default", "mean.dim", "mean.default", "amax.default",
          "amin.default", "prod.dim_int", "prod.default")
def _reduce(tr: Translator, x, dims=None, keepdim=False, dtype=None, **_):
    op = _dvm_op(tr)
    out = tr.out_dtype()
    axes = _axes(tr, x, dims)
    if not axes:
        return tr.cast(x, out)
    if op in (R.SUM, R.PROD, R.MEAN):
        x = tr.cast(x, out)
    elif tr.dtype(x) == dvm.DType.BOOL:
        x = tr.cast(x, dvm.DType.I32)
    return tr.gb.reduce(op, x, axes, keepdims=bool(keepdim))


@register("dist.default")
def _dist(tr: Translator, a, b, p=2):
    """torch.dist: the vector norm of a - b (broadcast) over all elements."""
    out = tr.out_dtype()
    f32 = dvm.DType.F32
    d = out if out not in (torch.float16, torch.bfloat16) else f32
    return _vector_norm(tr, tr.gb.binary(B.SUB, tr.cast(a, d), tr.cast(b, d)), p)


@register("linalg_vector_norm.default")
def _vector_norm(tr: Translator, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """torch.linalg.vector_norm for ord 2 (F.normalize, weight norm), 1 and +-inf: a sum of
    squares (absolute values) or a max (min) of absolute values, in f32 for f16/bf16."""
    if not isinstance(ord, (int, float)) or float(ord) not in (2.0, 1.0, math.inf, -math.inf):
        raise Unsupported(f"vector norm of order {ord}")
    out = tr.out_dtype()
    if not _is_float(out):
        raise Unsupported(f"vector norm in {out}")
    f32 = dvm.DType.F32
    x = tr.cast(x, f32 if out in (torch.float16, torch.bfloat16) else out)
    axes = _axes(tr, x, dim)
    keep = bool(keepdim)
    if float(ord) == 2.0:
        return tr.gb.unary(U.SQRT, tr.gb.reduce(R.SUM, tr.gb.binary(B.MUL, x, x), axes,
                                                keepdims=keep))
    a = tr.gb.unary(U.ABS, x)
    op = {1.0: R.SUM, math.inf: R.MAX, -math.inf: R.MIN}[float(ord)]
    return tr.gb.reduce(op, a, axes, keepdims=keep)


@register("any.dim", "any.default", "any.dims", "all.dim", "all.default", "all.dims")
def _any_all(tr: Translator, x, dims=None, keepdim=False):
    """any / all: max / min of the operand as bool (0 / 1)."""
    axes = _axes(tr, x, dims)
    b = tr.cast(tr.cast(x, dvm.DType.BOOL), dvm.DType.I32)
    if not axes:
        return tr.cast(b, dvm.DType.BOOL)
    return tr.cast(tr.gb.reduce(_dvm_op(tr), b, axes, keepdims=bool(keepdim)), dvm.DType.BOOL)


@register("argmax.default", "argmin.default")
def _argmax(tr: Translator, x, dim=None, keepdim=False):
    op = _dvm_op(tr)
    if dim is None:
        x = tr.gb.reshape(x, [-1])
        dim = 0
        if keepdim:
            raise Unsupported("argmax over all dims with keepdim")
    if tr.dtype(x) == dvm.DType.BOOL:
        x = tr.cast(x, dvm.DType.I32)
    return tr.gb.reduce(op, x, [tr.axis(dim, tr.rank(x))], keepdims=bool(keepdim))


@register("max.dim", "min.dim")
def _max_dim(tr: Translator, x, dim, keepdim=False):
    op, arg_op = _dvm_op(tr)
    a = [tr.axis(dim, tr.rank(x))]
    xi = tr.cast(x, dvm.DType.I32) if tr.dtype(x) == dvm.DType.BOOL else x
    v = tr.gb.reduce(op, xi, a, keepdims=bool(keepdim))
    i = tr.gb.reduce(arg_op, xi, a, keepdims=bool(keepdim))
    return v, i


@register("max.default", "min.default")
def _max_all(tr: Translator, x):
    return tr.gb.reduce(_dvm_op(tr), x, list(range(tr.rank(x))))


def _correction(correction, unbiased=None):
    if correction is None:
        return 1.0 if unbiased is None or unbiased else 0.0
    return float(correction)


@register("var.correction", "var.dim", "var.default", "std.correction", "std.dim", "std.default")
def _moments(tr: Translator, x, dims=None, *args, correction=None, keepdim=False,
             unbiased=None):
    """var / std (GraphBuilder.variance / std_dev); the older overloads take unbiased."""
    if tr.node.target._overloadname != "correction" and args:
        unbiased = args[0]
        keepdim = args[1] if len(args) > 1 else keepdim
    x = tr.cast(x, tr.out_dtype())
    return getattr(tr.gb, _dvm_op(tr))(x, _axes(tr, x, dims),
                                       correction=_correction(correction, unbiased),
                                       keepdims=bool(keepdim))


@register("var_mean.correction", "std_mean.correction")
def _var_mean(tr: Translator, x, dims=None, *, correction=None, keepdim=False):
    name, mean_op = _dvm_op(tr)
    x = tr.cast(x, tr.out_dtype(0))
    axes = _axes(tr, x, dims)
    v = getattr(tr.gb, name)(x, axes, correction=_correction(correction), keepdims=bool(keepdim))
    m = tr.gb.reduce(mean_op, x, axes, keepdims=bool(keepdim))
    return v, m


# ---- normalisation and softmax ----------------------------------------------------------------


@register("_softmax.default", "softmax.int", "_log_softmax.default", "log_softmax.int")
def _softmax(tr: Translator, x, dim, half_to_float=False):
    """softmax / log_softmax (GraphBuilder's); half_to_float: a bool, or softmax.int's dtype."""
    if isinstance(half_to_float, bool) and half_to_float:
        x = tr.cast(x, torch.float32)
    elif not isinstance(half_to_float, bool) and half_to_float is not None:
        x = tr.cast(x, half_to_float)
    return getattr(tr.gb, _dvm_op(tr))(x, tr.axis(dim, tr.rank(x)))


@register("native_layer_norm.default")
def _native_layer_norm(tr: Translator, x, normalized_shape, weight, bias, eps):
    n = len(normalized_shape)
    y = tr.gb.layer_norm(x, weight, bias, eps=_const(eps, "eps"), num_axes=n)
    r = tr.rank(x)
    axes = list(range(r - n, r))
    stat = tr.out_dtype(1)
    xf = tr.cast(x, stat)
    mean = tr.gb.reduce(R.MEAN, xf, axes, keepdims=True)
    var = tr.gb.variance(xf, axes, correction=0.0, keepdims=True)
    rstd = tr.gb.unary(U.RSQRT, _binary(tr, B.ADD, var, eps, stat))
    return y, mean, rstd


@register("_fused_rms_norm.default")
def _fused_rms_norm(tr: Translator, x, normalized_shape, weight=None, eps=None):
    n = len(normalized_shape)
    if eps is None:
        eps = torch.finfo(tr.out_dtype(0)).eps
    y = tr.gb.rms_norm(x, weight, eps=_const(eps, "eps"), num_axes=n)
    return y, None


@register("rms_norm.default")
def _rms_norm(tr: Translator, x, normalized_shape, weight=None, eps=None):
    if eps is None:
        eps = torch.finfo(tr.out_dtype()).eps
    return tr.gb.rms_norm(x, weight, eps=_const(eps, "eps"), num_axes=len(normalized_shape))


# ---- convolutional models: batch and group norm, padding, pooling, elu ----------------------


def _per_channel(tr: Translator, v, rank):
    """A [C] vector as [C, 1, ...]: broadcast along dim 1 of a rank-`rank` tensor."""
    return tr.gb.reshape(v, [tr.shape(v)[0]] + [1] * (rank - 2))


@register("_native_batch_norm_legit_no_training.default")
def _batch_norm_eval(tr: Translator, x, weight, bias, running_mean, running_var, momentum, eps):
    """Inference batch norm over dim 1, as PyTorch's CPU kernel computes it: a = w / sqrt(var +
    eps) and b = bias - mean * a per channel, then y = x * a + b, in f32 for f16/bf16. The saved
    statistics (empty tensors in inference) are not computed: a node whose saved statistics are
    read stays in PyTorch."""
    r = tr.rank(x)
    if r < 2:
        raise Unsupported("batch norm of a tensor of rank < 2")
    f32 = dvm.DType.F32
    invstd = tr.gb.unary(U.RSQRT, _binary(tr, B.ADD, tr.cast(running_var, f32), eps, f32))
    a = invstd if weight is None else tr.gb.binary(B.MUL, invstd, tr.cast(weight, f32))
    shift = tr.gb.binary(B.MUL, tr.cast(running_mean, f32), a)
    b = (tr.gb.unary(U.NEG, shift) if bias is None
         else tr.gb.binary(B.SUB, tr.cast(bias, f32), shift))
    xf = tr.cast(x, f32) if tr.dtype(x) in (dvm.DType.F16, dvm.DType.BF16) else x
    y = tr.gb.binary(B.ADD, tr.gb.binary(B.MUL, xf, _per_channel(tr, a, r)),
                     _per_channel(tr, b, r))
    return y, None, None


@register("native_group_norm.default")
def _group_norm(tr: Translator, x, weight, bias, n, c, hw, group, eps):
    """Group norm: x [N, C, *S] viewed as [N, G, C / G * prod(S)], normalised by each group's
    mean and biased variance, then the per-channel affine; mean and rstd ([N, G]) are the
    second and third outputs, in the statistics' dtype (f32 for f16/bf16 inputs)."""
    r = tr.rank(x)
    if r < 2 or not isinstance(group, int):
        raise Unsupported("group norm of a tensor of rank < 2 or a symbolic group count")
    shape = tr.shape(x)
    stat = tr.out_dtype(1)
    if not shape[1].is_constant() or int(shape[1]) % group:
        raise Unsupported(f"group norm of {shape[1]} channels in {group} groups")
    per_group = int(shape[1]) // group
    for d in shape[2:]:
        per_group = per_group * d
    g = tr.gb.reshape(tr.cast(x, stat), [shape[0], group, per_group])
    mean = tr.gb.reduce(R.MEAN, g, [2], keepdims=True)
    var = tr.gb.variance(g, [2], correction=0.0, keepdims=True)
    rstd = tr.gb.unary(U.RSQRT, _binary(tr, B.ADD, var, eps, stat))
    y = tr.gb.reshape(tr.gb.binary(B.MUL, tr.gb.binary(B.SUB, g, mean), rstd), shape)
    if weight is not None:
        y = tr.gb.binary(B.MUL, y, _per_channel(tr, tr.cast(weight, stat), r))
    if bias is not None:
        y = tr.gb.binary(B.ADD, y, _per_channel(tr, tr.cast(bias, stat), r))
    stats_shape = [shape[0], group]
    return y, tr.gb.reshape(mean, stats_shape), tr.gb.reshape(rstd, stats_shape)


def _pad(tr: Translator, x, pad, value, dtype):
    """torch.nn.functional.pad(x, pad, value=value): pad lists (before, after) pairs from the
    last dim backwards; a negative amount crops. Fills of `value` concatenated on each side."""
    if len(pad) % 2 or len(pad) // 2 > tr.rank(x):
        raise Unsupported(f"padding {list(pad)} for a tensor of rank {tr.rank(x)}")
    for p in pad:
        # A symbolic amount known to be >= 0 pads (Swin's and Longformer's padding up to a
        # multiple of the window, (w - n % w) % w: 0 at some lengths, an empty fill then);
        # one that may be negative would crop at some lengths only.
        if not isinstance(p, int) and not (isinstance(p, dvm.SymExpr) and p.range()[0] >= 0):
            raise Unsupported(f"symbolic padding {p} that may be negative")
    r = tr.rank(x)
    for i in range(len(pad) // 2):
        dim = r - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        if isinstance(lo, int) and lo < 0 or isinstance(hi, int) and hi < 0:
            x = tr.gb.slice(x, dim, max(-lo, 0), hi if hi < 0 else dvm.SLICE_END, 1)
        parts = [x]
        for amount, at in ((lo, 0), (hi, 1)):
            if not isinstance(amount, int) or amount > 0:
                s = tr.shape(x)
                s[dim] = amount
                parts.insert(at * len(parts), tr.fill(value, s, dtype))
        x = parts[0] if len(parts) == 1 else tr.gb.concat(parts, dim)
    return x


@register("constant_pad_nd.default")
def _constant_pad_nd(tr: Translator, x, pad, value=0):
    out = tr.out_dtype()
    if not isinstance(value, (int, float, bool)):
        raise Unsupported("a padding value that is not a number")
    return _pad(tr, tr.cast(x, out), list(pad), value, out)


def _pool_args(tr: Translator, kernel, stride, padding, dilation, ceil_mode):
    """Per-dim kernel, stride, padding and dilation lists of a pooling op (PyTorch's rules:
    one value for every dim, an empty stride meaning the kernel)."""
    nd = 3 if "3d" in tr.node.target._opname else 2

    def each(v, default):
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        v = v or list(default)
        return v * nd if len(v) == 1 else v

    kernel = each(kernel, [])
    stride = each(stride, kernel)
    padding = each(padding, [0])
    dilation = each(dilation, [1])
    if ceil_mode:
        raise Unsupported("pooling with ceil_mode (windows past the input)")
    if any(not isinstance(v, int) for v in kernel + stride + padding + dilation):
        raise Unsupported("pooling with symbolic window parameters")
    return kernel, stride, padding, dilation


def _windows(tr: Translator, x, kernel, stride, padding, dilation, value, dtype):
    """One slice of x per window offset: slice k holds, at every output position, the input
    element at offset k of that position's window (`value` where the window covers padding).

    Strided slices of symbolic extents would leave DVM to prove that the last window ends
    inside the input, which its simplifier cannot (floor divisions); instead each spatial dim
    is padded to exactly (out + q) * stride elements (q = ceil(span / stride), the window's
    reach past its start in strides: the right pad is never negative) and reshaped to
    [out + q, stride], where offset k is the rows [k // stride, k // stride + out) of column
    k % stride: extents whose bounds cancel to constants."""
    nd = len(kernel)
    first = tr.rank(x) - nd
    out_spatial = tr.out_shape(0)[-nd:]
    rows = []
    for i in range(nd):
        dim = first + i
        q = -(-((kernel[i] - 1) * dilation[i]) // stride[i])
        rows.append(out_spatial[i] + q)
        right = rows[-1] * stride[i] - tr.shape(x)[dim] - padding[i]
        before = tr.shape(x)
        before[dim] = padding[i]
        after = tr.shape(x)
        after[dim] = right
        parts = ([tr.fill(value, before, dtype)] if padding[i] else []) + [
            x, tr.fill(value, after, dtype)]
        x = tr.gb.concat(parts, dim)
    offsets = [[]]
    for k in kernel:
        offsets = [o + [j] for o in offsets for j in range(k)]
    for off in offsets:
        v = x
        for i, o in enumerate(off):
            start = o * dilation[i]
            v = tr.gb.slice(v, first + i, start, start + (out_spatial[i] - 1) * stride[i] + 1,
                            stride[i])
        yield v


@register("max_pool2d_with_indices.default", "max_pool3d_with_indices.default")
def _max_pool(tr: Translator, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    """Max pooling: the maximum of the window slices of x padded with -inf (NaN propagates,
    as PyTorch's). The indices output is not computed: a node whose indices are read stays in
    PyTorch."""
    kernel, stride, padding, dilation = _pool_args(tr, kernel, stride, padding, dilation,
                                                   ceil_mode)
    if not _is_float(tr.out_dtype(0)):
        raise Unsupported("max pooling of integers")
    y = None
    for v in _windows(tr, x, kernel, stride, padding, dilation, -math.inf, tr.out_dtype(0)):
        y = v if y is None else tr.gb.binary(B.MAXIMUM, y, v)
    return y, None


@register("avg_pool2d.default", "avg_pool3d.default")
def _avg_pool(tr: Translator, x, kernel, stride=(), padding=0, ceil_mode=False,
              count_include_pad=True, divisor_override=None):
    """Average pooling: the sum of the window slices of x (zero-padded; in f32 for f16/bf16)
    over the window size, divisor_override, or (count_include_pad=False) the number of the
    window's elements inside the input, counted the same way over ones."""
    kernel, stride, padding, _ = _pool_args(tr, kernel, stride, padding, 1, ceil_mode)
    out = tr.out_dtype()
    if not _is_float(out):
        raise Unsupported("average pooling of integers")
    nd = len(kernel)
    f32 = dvm.DType.F32

    def window_sum(t):
        s = None
        for v in _windows(tr, t, kernel, stride, padding, [1] * nd, 0.0, f32):
            s = v if s is None else tr.gb.binary(B.ADD, s, v)
        return s

    y = window_sum(tr.cast(x, f32))
    if divisor_override:
        return tr.gb.binary(B.DIV, y, float(divisor_override))
    if count_include_pad or not any(padding):
        return tr.gb.binary(B.DIV, y, float(math.prod(kernel)))
    return tr.gb.binary(B.DIV, y, window_sum(tr.fill(1.0, tr.shape(x)[-nd:], f32)))


@register("elu.default")
def _elu(tr: Translator, x, alpha=1.0, scale=1.0, input_scale=1.0):
    """elu / selu / celu: x <= 0 ? expm1(x * input_scale) * alpha * scale : x * scale (a NaN
    takes the second branch, as PyTorch's kernel). The coefficients may be SymFloats (rank-0
    tensors under dynamic=True)."""
    gb = tr.gb
    out = tr.out_dtype()

    def times(v, c):
        if isinstance(c, (int, float)) and c == 1:
            return v
        return _binary(tr, B.MUL, v, c, out)

    neg = times(times(gb.unary(U.EXPM1, times(x, input_scale)), alpha), scale)
    return gb.select(gb.binary(B.LE, x, 0.0), neg, times(x, scale))


# ---- matmul, attention, embedding, gathers ----------------------------------------------------


def _transposed_weight(tr: Translator, arg_index):
    """If the node's operand `arg_index` is permute(w, [1, 0]) / t(w) of a 2-D w that DVM has,
    returns w's DVM value (the matmul reads it transposed, no copy)."""
    src = tr.node.args[arg_index]
    if not isinstance(src, torch.fx.Node) or src.op != "call_function":
        return None
    if src.target is aten.permute.default and list(src.args[1]) in ([1, 0], [-1, -2], [1, -2],
                                                                     [-1, 0]):
        w = src.args[0]
    elif src.target in (aten.t.default,):
        w = src.args[0]
    else:
        return None
    v = tr.env.get(w)
    if isinstance(v, dvm.Tensor) and tr.rank(v) == 2:
        return v
    return None


def _mm(tr: Translator, a, b, b_index):
    out = tr.out_dtype()
    a = tr.cast(a, out)
    w = _transposed_weight(tr, b_index)
    if w is not None:
        return tr.gb.matmul(a, tr.cast(w, out), transpose_b=True)
    return tr.gb.matmul(a, tr.cast(b, out))


@register("mm.default", "bmm.default", "matmul.default")
def _matmul(tr: Translator, a, b):
    if tr.rank(a) < 2 or tr.rank(b) < 2:
        raise Unsupported("matmul of vectors")
    return _mm(tr, a, b, 1)


@register("addmm.default", "baddbmm.default")
def _addmm(tr: Translator, bias, a, b, *, beta=1, alpha=1):
    out = tr.out_dtype()
    y = _mm(tr, a, b, 2)
    if alpha != 1:
        y = _binary(tr, B.MUL, y, alpha, out)
    bias = tr.cast(bias, out)
    if beta == 0:
        return y
    if beta != 1:
        bias = _binary(tr, B.MUL, bias, beta, out)
    return tr.gb.binary(B.ADD, y, bias)


@register("linear.default")
def _linear(tr: Translator, x, w, bias=None):
    out = tr.out_dtype()
    return tr.gb.linear(tr.cast(x, out), tr.cast(w, out), None if bias is None else tr.cast(bias,
                                                                                           out))


@register("convolution.default")
def _convolution(tr: Translator, x, w, bias, stride, padding, dilation, transposed,
                 output_padding, groups):
    """A convolution whose windows tile its input without overlap or gaps (kernel == stride, no
    padding or dilation, one group: ViT's and Swin's patch embeddings, ConvNeXt's stem, 1 x 1
    convolutions) is a matmul over patches: x [N, C, *S] -> [N * prod(S / k), C * prod(k)]
    (input past the last whole window sliced off, as the convolution drops it) times
    W [O, C * prod(k)]^T (nn.Linear's layout: read in place), plus the bias, back to
    [N, O, *S / k]. Other convolutions run in PyTorch."""
    w_shape = [int(d) for d in fake_value(tr.node.args[1]).shape]
    kernel = w_shape[2:]
    nd = len(kernel)
    if transposed or groups != 1:
        raise Unsupported("convolution: transposed or grouped")
    if (list(stride) != kernel or any(p != 0 for p in padding) or
            any(d != 1 for d in dilation)):
        raise Unsupported("convolution with overlapping windows or padding (no im2col in DVM)")
    out = tr.out_dtype()
    if not _is_float(out):
        raise Unsupported(f"convolution of {out} (DVM's matmul is floating-point only)")
    x = tr.cast(x, out)
    n, c = tr.shape(x)[:2]
    spatial_out = tr.out_shape()[2:]
    for i, (so, k) in enumerate(zip(spatial_out, kernel)):
        if not (tr.shape(x)[2 + i] == so * k):  # a remainder past the last window
            x = tr.gb.slice(x, 2 + i, 0, so * k, 1)
    # [N, C, S0/k0, k0, S1/k1, k1, ...] -> [N, S0/k0, S1/k1, ..., C, k0, k1, ...]
    split = [n, c]
    for so, k in zip(spatial_out, kernel):
        split += [so, k]
    x = tr.gb.reshape(x, split)
    perm = [0] + [2 + 2 * i for i in range(nd)] + [1] + [3 + 2 * i for i in range(nd)]
    x = tr.gb.permute(x, perm)
    rows, patch = n, c
    for so, k in zip(spatial_out, kernel):
        rows = rows * so
        patch = patch * k
    x = tr.gb.reshape(x, [rows, patch])
    wm = tr.gb.reshape(tr.cast(w, out), [w_shape[0], patch])
    y = tr.gb.linear(x, wm, None if bias is None else tr.cast(bias, out))
    y = tr.gb.reshape(y, [n, *spatial_out, w_shape[0]])
    return tr.gb.permute(y, [0, nd + 1] + [1 + i for i in range(nd)])


def _attention(tr: Translator, q, k, v, attn_mask, dropout_p, is_causal, scale):
    """DVM's attention under the rule shared with lazy mode (aten_ops.attention_refusal):
    causal for any query and key lengths (top-left, as torch's is_causal), grouped-query heads
    as torch's enable_gqa groups them."""
    reason = T.attention_refusal(tr.rank(q), tr.rank(k), tr.rank(v), dropout_p)
    if reason is not None:
        raise Unsupported(reason)
    return tr.gb.attention(q, k, v, mask=attn_mask, causal=bool(is_causal),
                           scale=0.0 if scale is None else _const(scale, "scale"))


@register("_scaled_dot_product_flash_attention_for_cpu.default")
def _sdpa_flash_cpu(tr: Translator, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                    scale=None):
    # output 1, the logsumexp, is not an output of DVM's attention: a node whose logsumexp is
    # used stays in PyTorch (partition.py)
    return _attention(tr, q, k, v, attn_mask, dropout_p, is_causal, scale), None


@register("scaled_dot_product_attention.default")
def _sdpa(tr: Translator, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    return _attention(tr, q, k, v, attn_mask, dropout_p, is_causal, scale)


@register("embedding.default")
def _embedding(tr: Translator, weight, ids, padding_idx=-1, scale_grad_by_freq=False,
               sparse=False):
    return tr.gb.embedding(weight, tr.cast(ids, dvm.DType.I64) if tr.dtype(ids) not in (
        dvm.DType.I32, dvm.DType.I64) else ids)


@register("index_select.default")
def _index_select(tr: Translator, x, dim, index):
    return tr.gb.index_select(x, tr.axis(dim, tr.rank(x)), index)


@register("cumsum.default")
def _cumsum(tr: Translator, x, dim, dtype=None):
    """torch.cumsum: in the result's dtype (integers and bool promote to int64), by DVM's
    native scan (HuggingFace's masks number positions with a cumsum of the attention mask)."""
    x = tr.cast(x, tr.out_dtype())
    return tr.gb.cumsum(x, tr.axis(dim, max(tr.rank(x), 1)))


@register("gather.default")
def _gather(tr: Translator, x, dim, index, sparse_grad=False):
    return tr.gb.gather(x, tr.axis(dim, tr.rank(x)), index)


@register("index.Tensor")
def _index(tr: Translator, x, indices):
    idx = [(i, t) for i, t in enumerate(indices) if t is not None]
    if not idx:
        raise Unsupported("indexing without an index tensor")
    for _, t in idx:
        if not isinstance(t, dvm.Tensor):
            raise Unsupported("index is not a tensor")
        if tr.dtype(t) == dvm.DType.BOOL:
            raise Unsupported("boolean mask indexing (data-dependent shape)")
    if len(idx) > 1:
        return _index_many(tr, x, idx)
    axis, t = idx[0]
    # x[t] counts negative indices from the end (index_select and gather do not): t + n there.
    # An index below -n stays negative, so DVM reports it out of range as torch raises.
    n = tr.sym_scalar(tr.shape(x)[axis], tr.dtype(t))
    t = tr.gb.select(tr.gb.binary(dvm.BinaryOp.LT, t, 0), tr.gb.binary(dvm.BinaryOp.ADD, t, n), t)
    ishape = tr.shape(t)
    if len(ishape) == 1:
        return tr.gb.index_select(x, axis, t)
    flat = tr.gb.reshape(t, [-1])
    y = tr.gb.index_select(x, axis, flat)
    return tr.gb.reshape(y, tr.out_shape())


def _index_many(tr: Translator, x, idx):
    """x[i0, i1, ...] with several index tensors (HuggingFace's mask functions index a mask by
    batch, head, query and key positions): one index_select of the indexed dims merged into
    one, at the row-major flat index of the (broadcast) indices. Indexed dims next to each
    other keep their place (the broadcast index dims replace them); otherwise torch puts the
    index dims first, which a permute of x reproduces. An index outside [-n, n) along its own
    dim becomes -1, which index_select reports out of range, as torch raises, instead of
    landing in a neighbouring row of the merged dim."""
    gb, b = tr.gb, dvm.BinaryOp
    axes = [a for a, _ in idx]
    k = len(axes)
    if axes != list(range(axes[0], axes[0] + k)):
        rest = [d for d in range(tr.rank(x)) if d not in axes]
        x = gb.permute(x, axes + rest)
        axes = list(range(k))
    shape = tr.shape(x)
    flat = ok = None
    for a, (_, t) in zip(axes, idx):
        t = tr.cast(t, dvm.DType.I64)
        n = tr.sym_scalar(shape[a], dvm.DType.I64)
        t = gb.select(gb.binary(b.LT, t, 0), gb.binary(b.ADD, t, n), t)
        inside = gb.binary(b.LOGICAL_AND, gb.binary(b.GE, t, 0), gb.binary(b.LT, t, n))
        ok = inside if ok is None else gb.binary(b.LOGICAL_AND, ok, inside)
        flat = t if flat is None else gb.binary(b.ADD, gb.binary(b.MUL, flat, n), t)
    flat = gb.select(ok, flat, tr.constant(-1, dvm.DType.I64))
    a0 = axes[0]
    merged = gb.reshape(x, shape[:a0] + [-1] + shape[a0 + k:])
    y = gb.index_select(merged, a0, gb.reshape(flat, [-1]))
    return gb.reshape(y, tr.out_shape())


def op_table():
    """{overload: family} of every translated op."""
    return {o: e.family for o, e in OPS.items()}

