"""The op table: core-ATen overloads -> DVM graph ops, one translator per op family.

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

from .symbolic import Unsupported, same_dim
from .translate import DVM_TO_TORCH, Translator

aten = torch.ops.aten
prims = torch.ops.prims

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


def register(family: str, *overloads):
    def deco(fn):
        for o in overloads:
            OPS[o] = OpEntry(fn, family)
        return fn

    return deco


def _ovl(packet, *names):
    """Overloads of an op packet that exist in this torch (skips missing ones)."""
    out = []
    for n in names:
        o = getattr(packet, n, None)
        if o is not None:
            out.append(o)
    return out


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


def _binary(tr: Translator, op, a, b, compute_dtype):
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

ARITH = {
    "add": B.ADD,
    "sub": B.SUB,
    "mul": B.MUL,
    "div": B.DIV,
    "pow": B.POW,
    "maximum": B.MAXIMUM,
    "minimum": B.MINIMUM,
    "remainder": B.REMAINDER,
    "floor_divide": B.FLOOR_DIV,
    "fmax": B.MAXIMUM,
    "fmin": B.MINIMUM,
}


def _arith(op):
    def fn(tr: Translator, a, b, alpha=1, **_):
        out = tr.out_dtype()
        if alpha != 1:
            if op not in (B.ADD, B.SUB):
                raise Unsupported("alpha")
            b = _binary(tr, B.MUL, b, alpha, out)
        if op == B.DIV and not _is_float(out):
            raise Unsupported("integer true division")
        return _binary(tr, op, a, b, out)

    return fn


for _name, _op in ARITH.items():
    _packet = getattr(aten, _name)
    register(
        "pointwise",
        *_ovl(_packet, "Tensor", "Scalar", "default", "Tensor_Tensor", "Tensor_Scalar"),
    )(_arith(_op))
    # in-place forms (decompositions emit some, e.g. rms_norm's add_): functional when the
    # mutated value has no other reader (checked by translate.check_node)
    _ip = getattr(aten, _name + "_", None)
    if _ip is not None:
        for _o in _ovl(_ip, "Tensor", "Scalar"):
            OPS[_o] = OpEntry(_arith(_op), "pointwise", inplace=True)


@register("pointwise", aten.pow.Scalar)
def _pow_scalar(tr: Translator, a, b):
    out = tr.out_dtype()
    return _binary(tr, B.POW, tr.constant(a, out), b, out)


@register("pointwise", *_ovl(aten.rsub, "Tensor", "Scalar"))
def _rsub(tr: Translator, a, b, alpha=1):
    out = tr.out_dtype()
    if alpha != 1:
        a = _binary(tr, B.MUL, a, alpha, out)
    return _binary(tr, B.SUB, b, a, out)


@register("pointwise", *_ovl(aten.div, "Tensor_mode", "Scalar_mode"))
def _div_mode(tr: Translator, a, b, rounding_mode=None):
    out = tr.out_dtype()
    if rounding_mode is None:
        return _arith(B.DIV)(tr, a, b)
    if rounding_mode == "floor":
        return _binary(tr, B.FLOOR_DIV, a, b, out)
    if rounding_mode == "trunc" and _is_float(out):
        return tr.gb.unary(U.TRUNC, _binary(tr, B.DIV, a, b, out))
    raise Unsupported(f"div rounding_mode={rounding_mode} on {out}")


CMP = {"eq": B.EQ, "ne": B.NE, "lt": B.LT, "le": B.LE, "gt": B.GT, "ge": B.GE}


def _cmp(op):
    def fn(tr: Translator, a, b):
        return _binary(tr, op, a, b, _compute_dtype(tr, [a, b]))

    return fn


for _name, _op in CMP.items():
    register("comparison", *_ovl(getattr(aten, _name), "Tensor", "Scalar"))(_cmp(_op))


def _to_bool(tr: Translator, a):
    if isinstance(a, dvm.Tensor):
        return tr.cast(a, dvm.DType.BOOL)
    raise Unsupported("logical op on a scalar")


@register("logical", aten.logical_and.default, *_ovl(aten.bitwise_and, "Tensor"))
def _logical_and(tr: Translator, a, b):
    if tr.out_dtype() != torch.bool:
        raise Unsupported("bitwise and of integers")
    return tr.gb.binary(B.LOGICAL_AND, _to_bool(tr, a), _to_bool(tr, b))


@register("logical", aten.logical_or.default, *_ovl(aten.bitwise_or, "Tensor"))
def _logical_or(tr: Translator, a, b):
    if tr.out_dtype() != torch.bool:
        raise Unsupported("bitwise or of integers")
    return tr.gb.binary(B.LOGICAL_OR, _to_bool(tr, a), _to_bool(tr, b))


@register("logical", aten.logical_xor.default, *_ovl(aten.bitwise_xor, "Tensor"))
def _logical_xor(tr: Translator, a, b):
    if tr.out_dtype() != torch.bool:
        raise Unsupported("bitwise xor of integers")
    return tr.gb.binary(B.NE, _to_bool(tr, a), _to_bool(tr, b))


@register("logical", aten.logical_not.default, aten.bitwise_not.default)
def _logical_not(tr: Translator, a):
    if tr.node.target is aten.bitwise_not.default and tr.dtype(a) != dvm.DType.BOOL:
        raise Unsupported("bitwise_not of integers")
    return tr.gb.unary(U.LOGICAL_NOT, _to_bool(tr, a))


# ---- pointwise unary --------------------------------------------------------------------------

UNARY = {
    aten.neg.default: U.NEG,
    aten.abs.default: U.ABS,
    aten.exp.default: U.EXP,
    aten.log.default: U.LOG,
    aten.log1p.default: U.LOG1P,
    aten.expm1.default: U.EXPM1,
    aten.sqrt.default: U.SQRT,
    aten.rsqrt.default: U.RSQRT,
    aten.reciprocal.default: U.RECIPROCAL,
    aten.tanh.default: U.TANH,
    aten.sigmoid.default: U.SIGMOID,
    aten.relu.default: U.RELU,
    aten.silu.default: U.SILU,
    aten.erf.default: U.ERF,
    aten.sin.default: U.SIN,
    aten.cos.default: U.COS,
    aten.floor.default: U.FLOOR,
    aten.ceil.default: U.CEIL,
    aten.round.default: U.ROUND,
    aten.trunc.default: U.TRUNC,
    aten.sign.default: U.SIGN,
    aten.isnan.default: U.IS_NAN,
    aten.isfinite.default: U.IS_FINITE,
}


def _unary(op):
    def fn(tr: Translator, x):
        out = tr.out_dtype()
        if _is_float(out):
            x = tr.cast(x, out)
        return tr.gb.unary(op, x)

    return fn


for _o, _u in UNARY.items():
    register("pointwise", _o)(_unary(_u))


@register("pointwise", aten.gelu.default)
def _gelu(tr: Translator, x, approximate="none"):
    return tr.gb.gelu(tr.cast(x, tr.out_dtype()), tanh_approximation=(approximate == "tanh"))


@register("pointwise", aten.isinf.default)
def _isinf(tr: Translator, x):
    fin = tr.gb.unary(U.IS_FINITE, x)
    nan = tr.gb.unary(U.IS_NAN, x)
    return tr.gb.unary(U.LOGICAL_NOT, tr.gb.binary(B.LOGICAL_OR, fin, nan))


@register("pointwise", aten.erfc.default)
def _erfc(tr: Translator, x):
    return tr.gb.binary(B.SUB, 1.0, tr.gb.unary(U.ERF, tr.cast(x, tr.out_dtype())))


@register("pointwise", aten.tan.default)
def _tan(tr: Translator, x):
    x = tr.cast(x, tr.out_dtype())
    return tr.gb.binary(B.DIV, tr.gb.unary(U.SIN, x), tr.gb.unary(U.COS, x))


@register("pointwise", aten.log2.default, aten.log10.default)
def _log_base(tr: Translator, x):
    base = 2.0 if tr.node.target is aten.log2.default else 10.0
    x = tr.cast(x, tr.out_dtype())
    return tr.gb.binary(B.MUL, tr.gb.unary(U.LOG, x), 1.0 / math.log(base))


@register("pointwise", aten.exp2.default)
def _exp2(tr: Translator, x):
    x = tr.cast(x, tr.out_dtype())
    return tr.gb.unary(U.EXP, tr.gb.binary(B.MUL, x, math.log(2.0)))


@register("pointwise", aten.square.default)
def _square(tr: Translator, x):
    x = tr.cast(x, tr.out_dtype())
    return tr.gb.binary(B.MUL, x, x)


@register("pointwise", *_ovl(aten.hardtanh, "default"))
def _hardtanh(tr: Translator, x, lo=-1.0, hi=1.0):
    return tr.gb.clamp(x, lo=float(lo), hi=float(hi))


@register("pointwise", *_ovl(aten.leaky_relu, "default"))
def _leaky_relu(tr: Translator, x, slope=0.01):
    return tr.gb.select(tr.gb.binary(B.GT, x, 0.0), x, tr.gb.binary(B.MUL, x, float(slope)))


@register("pointwise", *_ovl(aten.clamp, "default"), *_ovl(aten.clamp_min, "default"),
          *_ovl(aten.clamp_max, "default"))
def _clamp(tr: Translator, x, lo=None, hi=None):
    t = tr.node.target
    if t is getattr(aten.clamp_max, "default", None):
        lo, hi = None, lo
    out = tr.out_dtype()
    x = tr.cast(x, out)
    if lo is not None and not isinstance(lo, (int, float)) or (
        hi is not None and not isinstance(hi, (int, float))
    ):
        raise Unsupported("symbolic clamp bounds")
    return tr.gb.clamp(x, lo=None if lo is None else float(lo), hi=None if hi is None else float(hi))


@register("pointwise", *_ovl(aten.clamp, "Tensor"))
def _clamp_tensor(tr: Translator, x, lo=None, hi=None):
    out = tr.out_dtype()
    x = tr.cast(x, out)
    if lo is not None:
        x = tr.gb.binary(B.MAXIMUM, x, _operand(tr, lo, out))
    if hi is not None:
        x = tr.gb.binary(B.MINIMUM, x, _operand(tr, hi, out))
    return x


@register("pointwise", aten.where.self, *_ovl(aten.where, "ScalarSelf", "ScalarOther", "Scalar"))
def _where(tr: Translator, cond, a, b):
    out = tr.out_dtype()

    def val(v):
        return tr.cast(v, out) if isinstance(v, dvm.Tensor) else tr.constant(v, out)

    return tr.gb.select(tr.cast(cond, dvm.DType.BOOL), val(a), val(b))


@register("pointwise", *_ovl(aten.masked_fill, "Scalar", "Tensor"))
def _masked_fill(tr: Translator, x, mask, value):
    out = tr.out_dtype()
    v = tr.cast(value, out) if isinstance(value, dvm.Tensor) else tr.constant(value, out)
    return tr.gb.select(tr.cast(mask, dvm.DType.BOOL), v, tr.cast(x, out))


@register("pointwise", aten.addcmul.default, aten.addcdiv.default)
def _addc(tr: Translator, x, a, b, value=1):
    out = tr.out_dtype()
    op = B.MUL if tr.node.target is aten.addcmul.default else B.DIV
    t = tr.gb.binary(op, tr.cast(a, out), tr.cast(b, out))
    if value != 1:
        t = tr.gb.binary(B.MUL, t, float(value))
    return tr.gb.binary(B.ADD, tr.cast(x, out), t)


@register("pointwise", *_ovl(aten.lerp, "Scalar", "Tensor"))
def _lerp(tr: Translator, x, end, weight):
    out = tr.out_dtype()
    x, end = tr.cast(x, out), tr.cast(end, out)
    w = _operand(tr, weight, out)
    return tr.gb.binary(B.ADD, x, tr.gb.binary(B.MUL, tr.gb.binary(B.SUB, end, x), w))


# ---- casts, copies, aliases -------------------------------------------------------------------


@register("cast", aten._to_copy.default)
def _to_copy(tr: Translator, x, dtype=None, layout=None, device=None, pin_memory=None,
             non_blocking=False, memory_format=None):
    if device is not None and torch.device(device).type != "cpu":
        raise Unsupported(f"_to_copy to {device}")
    return tr.cast(x, tr.out_dtype())


@register("cast", prims.convert_element_type.default)
def _convert(tr: Translator, x, dtype):
    return tr.cast(x, dtype)


@register("copy", aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default,
          aten.detach.default)
def _identity(tr: Translator, x, *_, **__):
    return x


@register("copy", *_ovl(aten.copy, "default"))
def _copy(tr: Translator, dst, src, non_blocking=False):
    return tr.gb.expand(tr.cast(src, tr.out_dtype()), tr.shape(dst))


# ---- views ------------------------------------------------------------------------------------


@register("view", aten.view.default, aten._unsafe_view.default, aten.reshape.default,
          *_ovl(aten.view_copy, "default"), *_ovl(aten._reshape_alias, "default"))
def _view(tr: Translator, x, *_, **__):
    return tr.gb.reshape(x, tr.out_shape())


@register("view", aten.permute.default, *_ovl(aten.permute_copy, "default"))
def _permute(tr: Translator, x, perm):
    r = tr.rank(x)
    return tr.gb.permute(x, [tr.axis(p, r) for p in perm])


@register("view", aten.transpose.int)
def _transpose(tr: Translator, x, a0, a1):
    r = tr.rank(x)
    if r < 2:
        return x
    return tr.gb.transpose(x, tr.axis(a0, r), tr.axis(a1, r))


@register("view", aten.t.default, *_ovl(aten.numpy_T, "default"))
def _t(tr: Translator, x):
    if tr.rank(x) < 2:
        return x
    return tr.gb.transpose(x, 0, 1)


@register("view", aten.expand.default, *_ovl(aten.expand_copy, "default"))
def _expand(tr: Translator, x, *_, **__):
    return tr.gb.expand(x, tr.out_shape())


@register("view", aten.unsqueeze.default, *_ovl(aten.unsqueeze_copy, "default"))
def _unsqueeze(tr: Translator, x, axis):
    return tr.gb.unsqueeze(x, tr.axis(axis, tr.rank(x) + 1))


@register("view", aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
          *_ovl(aten.squeeze_copy, "dim", "dims", "default"))
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


@register("view", aten.slice.Tensor, *_ovl(aten.slice_copy, "Tensor"))
def _slice(tr: Translator, x, dim=0, start=None, end=None, step=1):
    r = tr.rank(x)
    a = tr.axis(dim, r)
    start = _slice_bound(start)
    end = _slice_bound(end)
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


@register("view", aten.select.int, *_ovl(aten.select_copy, "int"))
def _select(tr: Translator, x, dim, index):
    r = tr.rank(x)
    a = tr.axis(dim, r)
    if isinstance(index, int) and index < 0:
        stop = dvm.SLICE_END if index == -1 else index + 1
    else:
        stop = index + 1
    return tr.gb.squeeze(tr.gb.slice(x, a, index, stop, 1), a)


@register("view", aten.narrow.default)
def _narrow(tr: Translator, x, dim, start, length):
    a = tr.axis(dim, tr.rank(x))
    if isinstance(start, int) and start < 0:
        raise Unsupported("narrow with a negative start")
    return tr.gb.slice(x, a, start, start + length, 1)


@register("view", aten.cat.default, *_ovl(aten.concat, "default"))
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


@register("view", aten.split_with_sizes.default, *_ovl(aten.split_with_sizes_copy, "default"))
def _split_with_sizes(tr: Translator, x, sizes, dim=0):
    return tuple(tr.gb.split(x, list(sizes), tr.axis(dim, tr.rank(x))))


@register("view", aten.split.Tensor, *_ovl(aten.split_copy, "Tensor"), aten.unbind.int,
          *_ovl(aten.chunk, "default"))
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


@register("view", aten.flip.default)
def _flip(tr: Translator, x, dims):
    raise Unsupported("flip (negative strides) is not in DVM's slice")


# ---- constants and generators -----------------------------------------------------------------


@register("creation", aten.full.default, *_ovl(aten.new_full, "default"))
def _full(tr: Translator, *args, **kwargs):
    value = args[1] if tr.node.target is aten.full.default else args[2]
    out = tr.out_dtype()
    if not isinstance(value, (int, float, bool)):
        value = tr.sym_scalar(value, out)
    return tr.fill(value, tr.out_shape(), out)


@register("creation", aten.full_like.default)
def _full_like(tr: Translator, x, value, **_):
    out = tr.out_dtype()
    if not isinstance(value, (int, float, bool)):
        value = tr.sym_scalar(value, out)
    return tr.fill(value, tr.out_shape(), out)


def _filled(value):
    def fn(tr: Translator, *_, **__):
        return tr.fill(value, tr.out_shape(), tr.out_dtype())

    return fn


register("creation", aten.zeros.default, aten.zeros_like.default, *_ovl(aten.new_zeros, "default"),
         aten.empty.memory_format, aten.empty_like.default, *_ovl(aten.new_empty, "default"),
         *_ovl(aten.empty_strided, "default"), *_ovl(aten.new_empty_strided, "default"))(
    _filled(0))
register("creation", aten.ones.default, aten.ones_like.default, *_ovl(aten.new_ones, "default"))(
    _filled(1))


@register("creation", aten.scalar_tensor.default)
def _scalar_tensor(tr: Translator, value, **_):
    out = tr.out_dtype()
    if isinstance(value, (int, float, bool)):
        return tr.constant(value, out)
    return tr.sym_scalar(value, out)


@register("creation", aten.arange.start_step, aten.arange.default, aten.arange.start)
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


@register("creation", *_ovl(prims.iota, "default"))
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


def _reduce(op, default_dims_all=True):
    def fn(tr: Translator, x, dims=None, keepdim=False, dtype=None, **_):
        out = tr.out_dtype()
        axes = _axes(tr, x, dims)
        if not axes:
            return tr.cast(x, out)
        if op in (R.SUM, R.PROD, R.MEAN):
            x = tr.cast(x, out)
        elif tr.dtype(x) == dvm.DType.BOOL:
            x = tr.cast(x, dvm.DType.I32)
        return tr.gb.reduce(op, x, axes, keepdims=bool(keepdim))

    return fn


register("reduction", aten.sum.dim_IntList, aten.sum.default)(_reduce(R.SUM))
register("reduction", aten.mean.dim, aten.mean.default)(_reduce(R.MEAN))
register("reduction", aten.amax.default)(_reduce(R.MAX))
register("reduction", aten.amin.default)(_reduce(R.MIN))
register("reduction", aten.prod.dim_int, aten.prod.default)(_reduce(R.PROD))


@register("reduction", aten.any.dim, aten.any.default, *_ovl(aten.any, "dims"))
def _any(tr: Translator, x, dims=None, keepdim=False):
    axes = _axes(tr, x, dims)
    b = tr.cast(tr.cast(x, dvm.DType.BOOL), dvm.DType.I32)
    if not axes:
        return tr.cast(b, dvm.DType.BOOL)
    return tr.cast(tr.gb.reduce(R.MAX, b, axes, keepdims=bool(keepdim)), dvm.DType.BOOL)


@register("reduction", aten.all.dim, aten.all.default, *_ovl(aten.all, "dims"))
def _all(tr: Translator, x, dims=None, keepdim=False):
    axes = _axes(tr, x, dims)
    b = tr.cast(tr.cast(x, dvm.DType.BOOL), dvm.DType.I32)
    if not axes:
        return tr.cast(b, dvm.DType.BOOL)
    return tr.cast(tr.gb.reduce(R.MIN, b, axes, keepdims=bool(keepdim)), dvm.DType.BOOL)


@register("reduction", aten.argmax.default, aten.argmin.default)
def _argmax(tr: Translator, x, dim=None, keepdim=False):
    op = R.ARG_MAX if tr.node.target is aten.argmax.default else R.ARG_MIN
    if dim is None:
        x = tr.gb.reshape(x, [-1])
        dim = 0
        if keepdim:
            raise Unsupported("argmax over all dims with keepdim")
    if tr.dtype(x) == dvm.DType.BOOL:
        x = tr.cast(x, dvm.DType.I32)
    return tr.gb.reduce(op, x, [tr.axis(dim, tr.rank(x))], keepdims=bool(keepdim))


@register("reduction", aten.max.dim, aten.min.dim)
def _max_dim(tr: Translator, x, dim, keepdim=False):
    is_max = tr.node.target is aten.max.dim
    a = [tr.axis(dim, tr.rank(x))]
    xi = tr.cast(x, dvm.DType.I32) if tr.dtype(x) == dvm.DType.BOOL else x
    v = tr.gb.reduce(R.MAX if is_max else R.MIN, xi, a, keepdims=bool(keepdim))
    i = tr.gb.reduce(R.ARG_MAX if is_max else R.ARG_MIN, xi, a, keepdims=bool(keepdim))
    return v, i


@register("reduction", aten.max.default, aten.min.default)
def _max_all(tr: Translator, x):
    op = R.MAX if tr.node.target is aten.max.default else R.MIN
    return tr.gb.reduce(op, x, list(range(tr.rank(x))))


def _correction(correction, unbiased=None):
    if correction is None:
        return 1.0 if unbiased is None or unbiased else 0.0
    return float(correction)


@register("reduction", aten.var.correction, *_ovl(aten.var, "dim", "default"))
def _var(tr: Translator, x, dims=None, *args, correction=None, keepdim=False, unbiased=None):
    if tr.node.target is not aten.var.correction and args:
        unbiased = args[0]
        keepdim = args[1] if len(args) > 1 else keepdim
    x = tr.cast(x, tr.out_dtype())
    return tr.gb.variance(x, _axes(tr, x, dims), correction=_correction(correction, unbiased),
                          keepdims=bool(keepdim))


@register("reduction", aten.std.correction, *_ovl(aten.std, "dim", "default"))
def _std(tr: Translator, x, dims=None, *args, correction=None, keepdim=False, unbiased=None):
    if tr.node.target is not aten.std.correction and args:
        unbiased = args[0]
        keepdim = args[1] if len(args) > 1 else keepdim
    x = tr.cast(x, tr.out_dtype())
    return tr.gb.std_dev(x, _axes(tr, x, dims), correction=_correction(correction, unbiased),
                         keepdims=bool(keepdim))


@register("reduction", aten.var_mean.correction, *_ovl(aten.std_mean, "correction"))
def _var_mean(tr: Translator, x, dims=None, *, correction=None, keepdim=False):
    x = tr.cast(x, tr.out_dtype(0))
    axes = _axes(tr, x, dims)
    fn = tr.gb.variance if tr.node.target is aten.var_mean.correction else tr.gb.std_dev
    v = fn(x, axes, correction=_correction(correction), keepdims=bool(keepdim))
    m = tr.gb.reduce(R.MEAN, x, axes, keepdims=bool(keepdim))
    return v, m


# ---- normalisation and softmax ----------------------------------------------------------------


@register("softmax", aten._softmax.default, *_ovl(aten.softmax, "int"))
def _softmax(tr: Translator, x, dim, half_to_float=False):
    if isinstance(half_to_float, bool) and half_to_float:
        x = tr.cast(x, torch.float32)
    elif not isinstance(half_to_float, bool) and half_to_float is not None:
        x = tr.cast(x, half_to_float)
    return tr.gb.softmax(x, tr.axis(dim, tr.rank(x)))


@register("softmax", aten._log_softmax.default, *_ovl(aten.log_softmax, "int"))
def _log_softmax(tr: Translator, x, dim, half_to_float=False):
    if isinstance(half_to_float, bool) and half_to_float:
        x = tr.cast(x, torch.float32)
    elif not isinstance(half_to_float, bool) and half_to_float is not None:
        x = tr.cast(x, half_to_float)
    return tr.gb.log_softmax(x, tr.axis(dim, tr.rank(x)))


@register("norm", aten.native_layer_norm.default)
def _native_layer_norm(tr: Translator, x, normalized_shape, weight, bias, eps):
    n = len(normalized_shape)
    y = tr.gb.layer_norm(x, weight, bias, eps=float(eps), num_axes=n)
    r = tr.rank(x)
    axes = list(range(r - n, r))
    stat = tr.out_dtype(1)
    xf = tr.cast(x, stat)
    mean = tr.gb.reduce(R.MEAN, xf, axes, keepdims=True)
    var = tr.gb.variance(xf, axes, correction=0.0, keepdims=True)
    rstd = tr.gb.unary(U.RSQRT, tr.gb.binary(B.ADD, var, float(eps)))
    return y, mean, rstd


@register("norm", *_ovl(aten._fused_rms_norm, "default"))
def _fused_rms_norm(tr: Translator, x, normalized_shape, weight=None, eps=None):
    n = len(normalized_shape)
    if eps is None:
        eps = torch.finfo(tr.out_dtype(0)).eps
    y = tr.gb.rms_norm(x, weight, eps=float(eps), num_axes=n)
    return y, None


@register("norm", *_ovl(aten.rms_norm, "default"))
def _rms_norm(tr: Translator, x, normalized_shape, weight=None, eps=None):
    if eps is None:
        eps = torch.finfo(tr.out_dtype()).eps
    return tr.gb.rms_norm(x, weight, eps=float(eps), num_axes=len(normalized_shape))


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


@register("matmul", aten.mm.default, aten.bmm.default, *_ovl(aten.matmul, "default"))
def _matmul(tr: Translator, a, b):
    if tr.rank(a) < 2 or tr.rank(b) < 2:
        raise Unsupported("matmul of vectors")
    return _mm(tr, a, b, 1)


@register("matmul", aten.addmm.default, *_ovl(aten.baddbmm, "default"))
def _addmm(tr: Translator, bias, a, b, *, beta=1, alpha=1):
    out = tr.out_dtype()
    y = _mm(tr, a, b, 2)
    if alpha != 1:
        y = tr.gb.binary(B.MUL, y, float(alpha))
    bias = tr.cast(bias, out)
    if beta == 0:
        return y
    if beta != 1:
        bias = tr.gb.binary(B.MUL, bias, float(beta))
    return tr.gb.binary(B.ADD, y, bias)


@register("matmul", *_ovl(aten.linear, "default"))
def _linear(tr: Translator, x, w, bias=None):
    out = tr.out_dtype()
    return tr.gb.linear(tr.cast(x, out), tr.cast(w, out), None if bias is None else tr.cast(bias,
                                                                                           out))


def _attention_check(tr: Translator, q, k, dropout_p):
    if dropout_p:
        raise Unsupported("attention with dropout")
    sq, sk = tr.shape(q), tr.shape(k)
    if len(sq) != 4 or len(sk) != 4:
        raise Unsupported("attention needs 4-D q/k/v")


@register("attention", *_ovl(aten._scaled_dot_product_flash_attention_for_cpu, "default"))
def _sdpa_flash_cpu(tr: Translator, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                    scale=None):
    _attention_check(tr, q, k, dropout_p)
    if is_causal and not same_dim(tr.shape(q)[2], tr.shape(k)[2]):
        raise Unsupported("causal attention with different query and key lengths")
    out = tr.gb.attention(q, k, v, mask=attn_mask, causal=bool(is_causal),
                          scale=0.0 if scale is None else float(scale))
    return out, None


@register("attention", *_ovl(aten.scaled_dot_product_attention, "default"))
def _sdpa(tr: Translator, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    _attention_check(tr, q, k, dropout_p)
    if enable_gqa:
        raise Unsupported("grouped-query attention")
    if is_causal and not same_dim(tr.shape(q)[2], tr.shape(k)[2]):
        raise Unsupported("causal attention with different query and key lengths")
    return tr.gb.attention(q, k, v, mask=attn_mask, causal=bool(is_causal),
                           scale=0.0 if scale is None else float(scale))


@register("gather", aten.embedding.default)
def _embedding(tr: Translator, weight, ids, padding_idx=-1, scale_grad_by_freq=False,
               sparse=False):
    return tr.gb.embedding(weight, tr.cast(ids, dvm.DType.I64) if tr.dtype(ids) not in (
        dvm.DType.I32, dvm.DType.I64) else ids)


@register("gather", aten.index_select.default)
def _index_select(tr: Translator, x, dim, index):
    return tr.gb.index_select(x, tr.axis(dim, tr.rank(x)), index)


@register("gather", aten.gather.default)
def _gather(tr: Translator, x, dim, index, sparse_grad=False):
    return tr.gb.gather(x, tr.axis(dim, tr.rank(x)), index)


@register("gather", aten.index.Tensor)
def _index(tr: Translator, x, indices):
    idx = [(i, t) for i, t in enumerate(indices) if t is not None]
    if len(idx) != 1:
        raise Unsupported("advanced indexing with more than one index tensor")
    axis, t = idx[0]
    if not isinstance(t, dvm.Tensor):
        raise Unsupported("index is not a tensor")
    if tr.dtype(t) == dvm.DType.BOOL:
        raise Unsupported("boolean mask indexing (data-dependent shape)")
    ishape = tr.shape(t)
    if len(ishape) == 1:
        return tr.gb.index_select(x, axis, t)
    flat = tr.gb.reshape(t, [-1])
    y = tr.gb.index_select(x, axis, flat)
    return tr.gb.reshape(y, tr.out_shape())


def op_table():
    """{overload: family} of every translated op."""
    return {o: e.family for o, e in OPS.items()}

