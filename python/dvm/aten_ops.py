"""The ATen -> DVM op table, shared by both PyTorch fronts.

The torch.compile backend (``torch_backend/ops.py``: FX nodes -> ``dvm.GraphBuilder``) and lazy
mode (``lazy/_handlers.py``: dispatched ops -> the C++ lazy runtime) keep their own handler code,
but both take from here which ATen ops they handle and what DVM runs for each: every ATen
overload either front handles has an ``Entry`` in ``TABLE``, keyed ``"packet.overload"``
(``"prims::packet.overload"`` outside aten), so this module needs no torch; ``resolve(key)``
gives the ``OpOverload`` in the torch at hand (None where that torch lacks it).

An entry names the DVM op it maps to (``Entry.dvm``):

* a meta-op of ``include/dvm/ops.def`` (``UnaryOp``, ``BinaryOp``, ``ReduceOp``). With
  ``direct`` the ATen op *is* that meta-op on its operands (``unary(x)``, ``binary(a, b)``), and
  a front handles it with one generic handler driven by the op's kind, which comes from DVM
  itself: ``unary_kind`` (computes in any dtype, float-only, predicate) and ``binary_kind``
  (arithmetic, true division, comparison, logical);
* the name of a DVM composite or view op, as ``GraphBuilder`` and ``dvm.lazy`` spell it
  (``"softmax"``, ``"attention"``, ``"reshape"``, ...);
* a tuple of those for an ATen op built from several (``max.dim``: the value and its index;
  ``addmm``: ``("matmul", BinaryOp.ADD)``);
* None: no DVM op, for ops that are their operand's value (clone, detach) and for flip, which
  DVM cannot express (the backend's translator says why).

Attention, the one op the fronts once answered differently, has its rule here too:
``attention_refusal``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ._dvm import BinaryOp, DType, GraphBuilder, KernelBuilder, ReduceOp, UnaryOp, run_reference

U = UnaryOp
B = BinaryOp
R = ReduceOp

# ---------------------------------------------------------------------------------------------
# Kinds of DVM's meta-ops (the kind columns of ops.def), asked of DVM once.
#
# The Python module binds the op enums but not ops.def's kind columns; DVM's builders apply
# them (src/ops/dtype_rules.h), so the kinds are read off what the builders do: the result
# dtype of an op on i32 operands (i32: computes in any dtype; f32: float-only / true division;
# bool: predicate / comparison or logical), and for bool-valued binary ops whether the result
# depends only on the operands' truth (logical: operands are taken as bool).

SAME = "same"  # unary: computes natively in the input's dtype
FLOAT_ONLY = "float_only"  # unary: integer inputs are computed (and returned) as f32
PREDICATE = "predicate"  # unary: bool result, any input dtype
ARITH = "arith"  # binary: result in the operands' (promoted) dtype
DIV = "div"  # binary: arithmetic whose integer operands give a float (true division)
CMP = "cmp"  # binary: comparison, bool result
LOGIC = "logic"  # binary: operands taken as bool, bool result


def _result_dtype(build):
    gb = GraphBuilder("kind_probe")
    x = gb.input("x", DType.I32, [1])
    return gb.dtype(build(gb, x))


def _depends_on_truth_only(op):
    """Whether binary `op` gives the same results for (2, 3), (3, 2) and (0, 5) as for their
    truth values (1, 1), (1, 1) and (0, 1): true of a logical op, false of any comparison."""
    kb = KernelBuilder("kind_probe")
    a = kb.load("a", DType.I32, [3])
    b = kb.load("b", DType.I32, [3])
    kb.store("y", kb.binary(op, a, b))
    k = kb.build()
    out = []
    for xs, ys in (([2, 3, 0], [3, 2, 5]), ([1, 1, 0], [1, 1, 1])):
        y = np.empty(3, np.bool_)
        run_reference(k, [np.array(xs, np.int32), np.array(ys, np.int32)], [y])
        out.append(y)
    return bool((out[0] == out[1]).all())


@functools.cache
def _unary_kinds():
    kinds = {}
    for op in UnaryOp.__members__.values():
        d = _result_dtype(lambda gb, x, op=op: gb.unary(op, x))
        kinds[op] = {DType.I32: SAME, DType.F32: FLOAT_ONLY, DType.BOOL: PREDICATE}[d]
    return kinds


@functools.cache
def _binary_kinds():
    kinds = {}
    for op in BinaryOp.__members__.values():
        d = _result_dtype(lambda gb, x, op=op: gb.binary(op, x, x))
        if d == DType.BOOL:
            kinds[op] = LOGIC if _depends_on_truth_only(op) else CMP
        else:
            kinds[op] = {DType.I32: ARITH, DType.F32: DIV}[d]
    return kinds


def unary_kind(op):
    """SAME, FLOAT_ONLY or PREDICATE: ops.def's kind of a UnaryOp."""
    return _unary_kinds()[op]


def binary_kind(op):
    """ARITH, DIV, CMP or LOGIC: ops.def's kind of a BinaryOp (DIV: ARITH whose integer
    operands give a float)."""
    return _binary_kinds()[op]


def is_float_only(op):
    return unary_kind(op) == FLOAT_ONLY


def is_predicate(op):
    return unary_kind(op) == PREDICATE


# ---------------------------------------------------------------------------------------------
# The table


@dataclass(frozen=True)
class Entry:
    """What DVM runs for one ATen overload."""

    family: str  # the op family (torch_backend.op_table() reports it)
    dvm: object  # a meta-op, a tuple of them, a composite's name, or None (see the module doc)
    direct: bool = False  # the ATen op is the meta-op itself: unary(x) / binary(a, b)
    variant: str = ""  # "inplace": writes its first argument; "copy": a view op's copying form
    bool_only: bool = False  # logical on bool tensors only (bitwise on integers: not DVM's)
    float_inputs: bool = False  # torch refuses integer inputs (activations) instead of promoting


TABLE: dict[str, Entry] = {}


def _add(family, dvm, *keys, **props):
    for k in keys:
        if k in TABLE:
            raise AssertionError(f"aten_ops: {k} listed twice")
        TABLE[k] = Entry(family, dvm, **props)


def _ovls(packet, *overloads):
    return [f"{packet}.{o}" for o in overloads]


# -- elementwise meta-ops (direct) --

UNARY = {
    "neg": U.NEG, "abs": U.ABS, "exp": U.EXP, "log": U.LOG, "log1p": U.LOG1P,
    "expm1": U.EXPM1, "sqrt": U.SQRT, "rsqrt": U.RSQRT, "reciprocal": U.RECIPROCAL,
    "tanh": U.TANH, "sigmoid": U.SIGMOID, "relu": U.RELU, "erf": U.ERF, "sin": U.SIN,
    "cos": U.COS, "floor": U.FLOOR, "ceil": U.CEIL, "round": U.ROUND, "trunc": U.TRUNC,
    "sign": U.SIGN, "isnan": U.IS_NAN, "isfinite": U.IS_FINITE,
}
for _p, _op in UNARY.items():
    _add("pointwise", _op, f"{_p}.default", direct=True)
_add("pointwise", U.SILU, "silu.default", direct=True, float_inputs=True)

# Binary ops: their (tensor, tensor | scalar) overloads; in-place forms for the backend
# (decompositions emit some; lazy mode runs in-place ops in PyTorch).
BINARY = {
    "add": B.ADD, "sub": B.SUB, "mul": B.MUL, "div": B.DIV, "pow": B.POW,
    "maximum": B.MAXIMUM, "minimum": B.MINIMUM, "remainder": B.REMAINDER,
    "floor_divide": B.FLOOR_DIV,
}
_FORMS = {"pow": ("Tensor_Tensor", "Tensor_Scalar"), "maximum": ("default",),
          "minimum": ("default",), "floor_divide": ("default", "Scalar")}
for _p, _op in BINARY.items():
    _add("pointwise", _op, *_ovls(_p, *_FORMS.get(_p, ("Tensor", "Scalar"))), direct=True)
    if _p not in ("maximum", "minimum"):
        _add("pointwise", _op, *_ovls(_p + "_", "Tensor", "Scalar"), direct=True,
             variant="inplace")
COMPARISON = {"eq": B.EQ, "ne": B.NE, "lt": B.LT, "le": B.LE, "gt": B.GT, "ge": B.GE}
for _p, _op in COMPARISON.items():
    _add("comparison", _op, *_ovls(_p, "Tensor", "Scalar"), direct=True)

# Logical ops take their operands as bool; torch's bitwise ops are logical on bools only.
for _p, _op in (("and", B.LOGICAL_AND), ("or", B.LOGICAL_OR), ("xor", B.NE)):
    _add("logical", _op, f"logical_{_p}.default", direct=True)
    _add("logical", _op, f"bitwise_{_p}.Tensor", direct=True, bool_only=True)
_add("logical", U.LOGICAL_NOT, "logical_not.default", direct=True)
_add("logical", U.LOGICAL_NOT, "bitwise_not.default", direct=True, bool_only=True)

# -- elementwise composites --

_add("pointwise", B.POW, "pow.Scalar")  # scalar ** tensor
_add("pointwise", B.SUB, *_ovls("rsub", "Tensor", "Scalar"))  # other - self
_add("pointwise", (B.DIV, B.FLOOR_DIV, U.TRUNC), *_ovls("div", "Tensor_mode", "Scalar_mode"))
# NaN-ignoring maximum / minimum: DVM's propagate NaN, so a select around them.
_add("pointwise", (B.MAXIMUM, U.IS_NAN), "fmax.default")
_add("pointwise", (B.MINIMUM, U.IS_NAN), "fmin.default")
_add("pointwise", "gelu", "gelu.default")
_add("pointwise", (U.EXPM1, "select"), "elu.default", float_inputs=True)
_add("pointwise", (U.IS_FINITE, U.IS_NAN), "isinf.default")
_add("pointwise", U.ERF, "erfc.default")
_add("pointwise", (U.SIN, U.COS), "tan.default")
_add("pointwise", U.LOG, "log2.default", "log10.default")
_add("pointwise", U.EXP, "exp2.default")
_add("pointwise", B.MUL, "square.default")
_add("pointwise", "clamp", "hardtanh.default", "clamp.default", "clamp_min.default",
     "clamp_max.default")
_add("pointwise", (B.MAXIMUM, B.MINIMUM), "clamp.Tensor")
_add("pointwise", "select", "leaky_relu.default", "where.self", "where.ScalarSelf",
     "where.ScalarOther", "where.Scalar", "masked_fill.Scalar", "masked_fill.Tensor",
     "tril.default", "triu.default")
_add("pointwise", (B.MUL, B.ADD), "addcmul.default")
_add("pointwise", (B.SUB, B.MUL, B.ADD), "lerp.Scalar", "lerp.Tensor")
_add("pointwise", (B.DIV, B.ADD), "addcdiv.default")

# -- casts, copies, views --

_add("cast", "cast", "_to_copy.default", "prims::convert_element_type.default")
_add("copy", None, "clone.default", "alias.default", "lift_fresh_copy.default",
     "detach.default")  # the value itself
_add("copy", "expand", "copy.default")
_add("view", "reshape", "view.default", "_unsafe_view.default", "reshape.default")
_add("view", "reshape", "view_copy.default", "_reshape_alias.default", variant="copy")
_add("view", "permute", "permute.default")
_add("view", "permute", "permute_copy.default", variant="copy")
_add("view", "transpose", "transpose.int", "t.default", "numpy_T.default")
_add("view", "expand", "expand.default")
_add("view", "expand", "expand_copy.default", variant="copy")
_add("view", ("reshape", "expand"), "repeat.default")  # a copy: each dim tiled
_add("view", "unsqueeze", "unsqueeze.default")
_add("view", "unsqueeze", "unsqueeze_copy.default", variant="copy")
_add("view", "squeeze", *_ovls("squeeze", "dim", "dims", "default"))
_add("view", "squeeze", *_ovls("squeeze_copy", "dim", "dims", "default"), variant="copy")
_add("view", "slice", "slice.Tensor", "select.int", "narrow.default")
_add("view", "slice", "slice_copy.Tensor", "select_copy.int", variant="copy")
_add("view", "split", "split.Tensor", "split_with_sizes.default", "unbind.int", "chunk.default")
_add("view", "split", "split_copy.Tensor", "split_with_sizes_copy.default", variant="copy")
_add("view", "concat", "cat.default", "concat.default")
_add("view", None, "flip.default")
# x[..., a:b] = src / x[..., i] = src, functionalized: the slices of x around src, concatenated
_add("view", ("slice", "concat"), "slice_scatter.default", "select_scatter.default")  # negative strides: not in DVM's slice

# -- constants and generators (fills are built from an iota) --

_add("creation", "iota", "full.default", "new_full.default", "full_like.default",
     "zeros.default", "zeros_like.default", "new_zeros.default", "empty.memory_format",
     "empty_like.default", "new_empty.default", "empty_strided.default",
     "new_empty_strided.default", "ones.default", "ones_like.default", "new_ones.default",
     "scalar_tensor.default", "arange.start_step", "arange.default", "arange.start",
     "prims::iota.default")

# -- reductions --

_add("reduction", R.SUM, "sum.dim_IntList", "sum.default")
_add("reduction", R.MEAN, "mean.dim", "mean.default")
_add("reduction", R.MAX, "amax.default", "max.default")
_add("reduction", R.MIN, "amin.default", "min.default")
_add("reduction", R.PROD, "prod.dim_int", "prod.default")
_add("reduction", (R.MAX, R.ARG_MAX), "max.dim")
_add("reduction", (R.MIN, R.ARG_MIN), "min.dim")
_add("reduction", R.ARG_MAX, "argmax.default")
_add("reduction", R.ARG_MIN, "argmin.default")
_add("reduction", R.MAX, *_ovls("any", "dim", "default", "dims"))  # over the operand as bool
_add("reduction", R.MIN, *_ovls("all", "dim", "default", "dims"))
_add("reduction", (R.SUM, R.MAX, R.MIN, U.SQRT), "linalg_vector_norm.default")  # ord 2, 1, +-inf
_add("reduction", (B.SUB, R.SUM, R.MAX, R.MIN, U.SQRT), "dist.default")  # norm of a - b
_add("reduction", "variance", *_ovls("var", "correction", "dim", "default"))
_add("reduction", "std_dev", *_ovls("std", "correction", "dim", "default"))
_add("reduction", ("variance", R.MEAN), "var_mean.correction")
_add("reduction", ("std_dev", R.MEAN), "std_mean.correction")

# -- normalisation, softmax, matmul, attention, gathers --

_add("softmax", "softmax", "_softmax.default", "softmax.int")
_add("softmax", "log_softmax", "_log_softmax.default", "log_softmax.int")
_add("norm", "layer_norm", "native_layer_norm.default")
_add("norm", "rms_norm", "_fused_rms_norm.default", "rms_norm.default")
_add("matmul", "matmul", "mm.default", "bmm.default", "matmul.default")
_add("matmul", ("matmul", B.ADD), "addmm.default", "baddbmm.default")
_add("matmul", "linear", "linear.default")
# non-overlapping windows only (patch embeddings, 1 x 1): patches reshaped and permuted into rows
_add("matmul", ("reshape", "permute", "linear"), "convolution.default")
_add("attention", "attention", "_scaled_dot_product_flash_attention_for_cpu.default",
     "scaled_dot_product_attention.default")
# convolutional models' ops: inference batch norm and group norm as per-channel arithmetic,
# constant padding as a concat with fills (negative pads slice), pooling as the maximum or sum
# of strided slices of the padded input, one per window offset
_add("norm", (B.SUB, B.MUL, B.ADD), "_native_batch_norm_legit_no_training.default")
_add("norm", ("reshape", R.MEAN, "variance"), "native_group_norm.default")
_add("view", ("concat", "slice"), "constant_pad_nd.default")
_add("pooling", ("slice", B.MAXIMUM), "max_pool2d_with_indices.default",
     "max_pool3d_with_indices.default")
_add("pooling", ("slice", B.ADD), "avg_pool2d.default", "avg_pool3d.default")
_add("gather", "embedding", "embedding.default")
_add("gather", "index_select", "index_select.default", "index.Tensor")
_add("gather", "gather", "gather.default")
_add("scan", "cumsum", "cumsum.default")


def entries(family=None, *, direct=None, variant=""):
    """(key, Entry) pairs of the table, filtered (variant None: any)."""
    for k, e in TABLE.items():
        if family is not None and e.family != family:
            continue
        if direct is not None and e.direct != direct:
            continue
        if variant is not None and e.variant != variant:
            continue
        yield k, e


@functools.cache
def resolve(key):
    """The torch OpOverload of a table key, or None where this torch lacks it (imports
    torch)."""
    if key not in TABLE:
        raise KeyError(f"{key} is not in the ATen -> DVM table (dvm/aten_ops.py)")
    import torch

    ns, _, name = key.rpartition("::")
    packet, overload = name.rsplit(".", 1)
    return getattr(getattr(getattr(torch.ops, ns or "aten"), packet, None), overload, None)


def overloads(*keys):
    """The OpOverloads of table keys that exist in this torch."""
    return [o for o in map(resolve, keys) if o is not None]


@functools.cache
def _by_overload():
    return {o: e for o, e in ((resolve(k), e) for k, e in TABLE.items()) if o is not None}


def entry(overload):
    """The Entry of a torch OpOverload (KeyError if the table has none)."""
    return _by_overload()[overload]


# ---------------------------------------------------------------------------------------------
# Attention
#
# scaled_dot_product_attention -> DVM's attention, one rule for both fronts. DVM's contract
# (src/graph/shape_infer.cc, src/passes/decompose.cc): q, k, v of one rank >= 2; causal masks
# col <= row, top-left aligned, which is what torch's is_causal means for any query and key
# lengths; grouped-query attention when q's head axis (-3) is a multiple of k's, grouping
# consecutive query heads onto one k/v head as torch's enable_gqa does. DVM's attention has
# no logsumexp output (the CPU flash-attention op's output 1): the backend leaves a node whose
# logsumexp is used to PyTorch; lazy mode, which must return every output of the op it
# records, records it from DVM's reductions (dropped by the flush unless something keeps it).


def attention_refusal(q_rank, k_rank, v_rank, dropout_p=0.0):
    """Why DVM does not run this attention (a reason), or None."""
    if dropout_p:
        return "attention with dropout"
    if not q_rank == k_rank == v_rank or q_rank < 2:
        return f"attention needs q, k, v of one rank >= 2 (got {q_rank}, {k_rank}, {v_rank})"
    return None
